import pytest

from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.util import bounds


@pytest.mark.parametrize('text,expected', [
    ('0000:af:00.0', '0000:af:00.0'),
    ('0000:AF:00.0', '0000:af:00.0'),
    ('0002:3b:1f.7', '0002:3b:1f.7'),
    ('10000:01:00.0', '10000:01:00.0'),
])
def test_pci_address_parse(text, expected):
    assert str(objects.PciAddress.parse(text)) == expected


@pytest.mark.parametrize('text', [
    '', '0000:af:00', 'af:00.0', '0000:af:20.0', '0000:af:00.8',
    '../../etc', '0000:af:00.0\n', '0000:af:00.0/..', None, 42,
    '123456789:af:00.0',
])
def test_pci_address_refuses(text):
    with pytest.raises(exception.InvalidPciAddress):
        objects.PciAddress.parse(text)


def test_pci_address_libvirt_name_round_trip():
    address = objects.PciAddress.parse('0001:3b:00.1')
    assert address.libvirt_name == 'pci_0001_3b_00_1'
    assert objects.PciAddress.from_libvirt_name('pci_0001_3b_00_1') == \
        address


@pytest.mark.parametrize('value', [
    'not-a-uuid', '../' * 12, 'c1f6b2f0-1b2c-4f8e-9d3a-2e5b7c8d9e0f\n',
    'c1f6b2f0-1b2c-4f8e-9d3a-2e5b7c8d9e0',
    'c1f6b2f0/1b2c-4f8e-9d3a-2e5b7c8d9e0f',
])
def test_uuid_refuses(value):
    with pytest.raises(exception.InvalidUuid):
        objects.Uuid.parse(value)


def test_uuid_lowercases():
    assert objects.Uuid.parse('C1F6B2F0-1B2C-4F8E-9D3A-2E5B7C8D9E0F') == \
        'c1f6b2f0-1b2c-4f8e-9d3a-2e5b7c8d9e0f'


@pytest.mark.parametrize('value', ['../x', 'nvidia 223', 'a/b', '', '.x',
                                   'n\nv'])
def test_type_id_refuses(value):
    with pytest.raises(exception.InvalidTypeId):
        objects.TypeId.parse(value)


def test_max_instance_from_description():
    t = objects.VgpuType('nvidia-223', 'GRID T4-2B',
                         'num_heads=4, max_instance=8', 'vfio-pci', 8)
    assert t.max_instance == 8
    assert objects.VgpuType('x', None, None, 'vfio-pci', 1).max_instance \
        is None


class _Gpu:
    def __init__(self, address, vendor_id='10de', product_id='2331'):
        self.address = objects.PciAddress.parse(address)
        self.vendor_id = vendor_id
        self.product_id = product_id


def test_gpu_selector_by_address_names_that_gpu_only():
    selector = objects.GpuSelector.parse('0000:41:00.0')
    assert not selector.by_model
    assert str(selector) == '0000:41:00.0'
    assert selector.matches(_Gpu('0000:41:00.0'))
    assert not selector.matches(_Gpu('0000:41:00.1'))
    assert not selector.matches(_Gpu('0000:c1:00.0'))


def test_gpu_selector_by_model_names_every_gpu_of_the_ids():
    selector = objects.GpuSelector.parse(' 0x10DE:2331 ')
    assert selector.by_model
    assert str(selector) == '10de:2331'
    assert selector.matches(_Gpu('0000:41:00.0'))
    assert selector.matches(_Gpu('0000:c1:00.0'))
    assert not selector.matches(_Gpu('0000:41:00.0', product_id='2330'))
    assert not selector.matches(_Gpu('0000:41:00.0', vendor_id='10df'))


@pytest.mark.parametrize('text', [
    '', 'nvidia', '10de:zz', '10de:2331:1', '0000:41:00.8', None, 5,
    '10de:' + '1' * 40, 'g0de:2331'])
def test_gpu_selector_refuses_what_names_no_gpu(text):
    with pytest.raises(exception.InvalidInput,
                       match='0000:41:00.0.*10de:2331'):
        objects.GpuSelector.parse(text)


def test_gpu_selector_list_keeps_its_order_and_names_the_bad_entry():
    assert objects.GpuSelector.parse_list(
        ['10de:2331', '0000:41:00.0']) == (
        objects.GpuSelector.parse('10de:2331'),
        objects.GpuSelector.parse('0000:41:00.0'))
    with pytest.raises(exception.InvalidInput, match="'nvidia' names no GPU"):
        objects.GpuSelector.parse_list(['0000:41:00.0', 'nvidia', '5'])


# --- What ``make mutation`` found open (docs/dev/mutation.md) ---
# What the typed values and records of ``objects`` promise that test_objects,
# test_typed_values and test_hand_validators left open: each test here fails
# on a change ``make mutation`` made to objects.py that the rest stayed green
# on (docs/dev/mutation.md): the whole refusal a user reads, the bounds of
# each form, and the answers the layers above rely on. ``PciAddress.parse``
# and ``Uuid.parse`` keep what they parsed (an address or UUID is met at
# several edges of one process); the ``fresh`` fixture empties those
# memories, so that each test parses its text itself and sees what a first
# parse does.

UUID = '9b2f7c1e-8a59-4f0e-b3c2-1d4e5f6a7b8c'


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setattr(objects, '_PARSED_PCI', {})
    monkeypatch.setattr(objects, '_PARSED_UUID', {})


def _message(error, call, *args):
    with pytest.raises(error) as caught:
        call(*args)
    return str(caught.value)


# --- vendor type ids ----------------------------------------------------

@pytest.mark.parametrize('number,expected', [
    (1, 'nvidia-1'), (1145, 'nvidia-1145'), (999999999, 'nvidia-999999999')])
def test_vendor_type_id_of_a_number(number, expected):
    made = objects.vendor_type_id(number)
    assert made == expected and type(made) is objects.TypeId


@pytest.mark.parametrize('number', [0, -1, True, False, '1145', 1.0, None])
def test_vendor_type_id_refuses_what_is_no_type_number(number):
    assert _message(exception.InvalidTypeId, objects.vendor_type_id,
                    number) == (
        "%r is not a valid vGPU type id (1 to 64 letters, digits, '-', '_' "
        "or '.', starting with a letter or digit, e.g. nvidia-223)"
        % (number,))


@pytest.mark.parametrize('type_id,expected', [
    ('nvidia-1', 1), ('nvidia-1145', 1145), ('nvidia-999999999', 999999999)])
def test_vendor_type_number_of_a_type_id(type_id, expected):
    assert objects.vendor_type_number(objects.TypeId.parse(type_id)) == \
        expected
    assert objects.vendor_type_number(type_id) == expected


@pytest.mark.parametrize('type_id', [
    'nvidia-', 'nvidia-0', 'nvidia-01', 'nvidia-1000000000', 'nvidia-1a',
    'nvidia-+1', 'nvidia--1', 'nvidia-1 ', 'nvidiax1', 'Nvidia-1', 'i915-1',
    'xnvidia-1', '1145', None, 1145])
def test_vendor_type_number_refuses_what_the_vendor_interface_has_not(
        type_id):
    assert _message(exception.InvalidTypeId, objects.vendor_type_number,
                    type_id).startswith('%r is not a valid vGPU type id ('
                                        % (type_id,))


def test_vendor_type_number_and_id_round_trip():
    for number in (1, 9, 10, 1145, 123456789):
        assert objects.vendor_type_number(
            objects.vendor_type_id(number)) == number


# --- typed --------------------------------------------------------------

def test_typed_passes_the_kind_itself():
    uuid = objects.Uuid.parse(UUID)
    assert objects.typed(uuid, objects.Uuid, 'uuid') is uuid
    address = objects.PciAddress.parse('0000:41:00.0')
    assert objects.typed(address, objects.PciAddress, 'address') is address


def test_typed_refuses_text_saying_where_to_parse_it():
    assert _message(TypeError, objects.typed, UUID, objects.Uuid,
                    'domain uuid') == (
        "domain uuid must be an objects.Uuid, not str '%s': parse it with "
        'objects.Uuid.parse where it enters the program (CLI, API, hook '
        'input, domain XML, sysfs, the lease store) and pass the result'
        % UUID)
    # a TypeId is a str, but not a Uuid
    with pytest.raises(TypeError, match='not TypeId'):
        objects.typed(objects.TypeId.parse('nvidia-1'), objects.Uuid, 'x')


# --- DiscoveryResult.gpu ------------------------------------------------

def _gpu(address, **changes):
    values = dict(address=objects.PciAddress.parse(address),
                  vendor_id='10de', product_id='2331',
                  class_code='0x030200', driver='nvidia', numa_node=0,
                  iommu_group=1)
    values.update(changes)
    return objects.Gpu(**values)


def test_discovery_result_finds_a_gpu_by_its_address():
    first, second = _gpu('0000:41:00.0'), _gpu('0000:c1:00.0')
    result = objects.DiscoveryResult('sysfs', (first, second))
    assert result.gpu(objects.PciAddress.parse('0000:c1:00.0')) is second
    assert result.gpu(objects.PciAddress.parse('0000:41:00.0')) is first
    assert _message(exception.DeviceNotFound, result.gpu,
                    objects.PciAddress.parse('0000:41:00.1')) == (
        'No GPU at 0000:41:00.1 on this host; `libvirt-gpu list` shows the '
        'GPUs that were found')
    with pytest.raises(TypeError, match='address must be an '
                                        'objects.PciAddress, not str'):
        result.gpu('0000:41:00.0')


# --- EnabledType --------------------------------------------------------

def _enabled(type_id, *others, **values):
    return objects.EnabledType(
        objects.TypeId.parse(type_id),
        others=tuple(objects.EnabledType(objects.TypeId.parse(o))
                     for o in others), **values)


def test_enabled_type_defaults():
    enabled = objects.EnabledType(objects.TypeId.parse('nvidia-1'))
    assert (enabled.resource_class, enabled.max_instances, enabled.others,
            enabled.types, enabled.type_ids) == (
        'VGPU', None, (), (enabled,), ('nvidia-1',))


def test_enabled_type_lists_its_own_type_first_then_the_others():
    enabled = _enabled('nvidia-3', 'nvidia-1', 'nvidia-2')
    assert enabled.type_ids == ('nvidia-3', 'nvidia-1', 'nvidia-2')
    assert enabled.types[0] is enabled
    assert enabled.of('nvidia-3') is enabled
    assert enabled.of('nvidia-2') is enabled.others[1]
    assert enabled.of('nvidia-1') is enabled.others[0]
    assert enabled.of('nvidia-4') is None


# --- NumaPinning --------------------------------------------------------

def test_unpinned_is_near_nothing_and_pinned_says_so():
    assert not objects.UNPINNED.pinned
    assert not objects.UNPINNED.is_near(0, bounds.parse_cpulist('0-15'))
    assert objects.NumaPinning(nodes=bounds.parse_cpulist('1')).pinned
    assert objects.NumaPinning(cpus=bounds.parse_cpulist('3')).pinned


def test_near_by_the_gpus_node():
    pinning = objects.NumaPinning(nodes=bounds.parse_cpulist('1,3'))
    assert pinning.is_near(1, bounds.EMPTY)
    assert pinning.is_near(3, set())
    assert not pinning.is_near(2, bounds.EMPTY)
    assert not pinning.is_near(None, bounds.parse_cpulist('0-63'))


def test_near_by_a_vcpu_on_the_gpus_local_cpus():
    pinning = objects.NumaPinning(cpus=bounds.parse_cpulist('8-11'))
    assert pinning.is_near(None, bounds.parse_cpulist('11-15'))
    assert pinning.is_near(0, {4, 8})
    assert not pinning.is_near(None, bounds.parse_cpulist('0-7,12-15'))
    assert not pinning.is_near(None, set())
    # a GPU's node outside the guest's nodes does not make it far
    both = objects.NumaPinning(nodes=bounds.parse_cpulist('0'),
                               cpus=bounds.parse_cpulist('8-11'))
    assert both.is_near(1, {9}) and both.is_near(0, set())
    assert not both.is_near(1, {12})


def test_near_with_cpus_held_as_a_set():
    pinning = objects.NumaPinning(cpus=frozenset({2, 5}))
    assert pinning.is_near(None, {5, 6, 7})
    assert pinning.is_near(None, {2})
    assert not pinning.is_near(None, {3, 4, 6})
    # against the local CPUs as sysfs gives them (a CpuList, never
    # expanded)
    assert pinning.is_near(None, bounds.parse_cpulist('4-5'))
    assert not pinning.is_near(None, bounds.parse_cpulist('3,6-9'))
    assert not pinning.is_near(None, bounds.EMPTY)


# --- Gpu ----------------------------------------------------------------

def _type(type_id, name=None, description=None, published_max=None):
    return objects.VgpuType(objects.TypeId.parse(type_id), name,
                            description, 'vfio-pci', 1,
                            published_max=published_max)


def test_gpu_mdev_type_by_id():
    a, b = _type('nvidia-1'), _type('nvidia-2')
    gpu = _gpu('0000:41:00.0', mdev_types=(a, b))
    assert gpu.mdev_type('nvidia-2') is b and gpu.mdev_type('nvidia-1') is a
    assert gpu.mdev_type('nvidia-3') is None


def test_offered_types_keep_the_most_informative_record_in_first_order():
    bare1, bare2 = _type('nvidia-1'), _type('nvidia-2')
    named1 = _type('nvidia-1', name='A')
    full1 = _type('nvidia-1', name='A', published_max=4)
    max_only2 = _type('nvidia-2', published_max=2)
    described2 = _type('nvidia-2', description='max_instance=3')
    vf1 = _gpu('0000:41:00.4', physfn=objects.PciAddress.parse(
        '0000:41:00.0'), mdev_types=(named1, max_only2))
    vf2 = _gpu('0000:41:00.5', physfn=objects.PciAddress.parse(
        '0000:41:00.0'), mdev_types=(full1, described2, _type('nvidia-9')))
    vf3 = _gpu('0000:41:00.6', physfn=objects.PciAddress.parse(
        '0000:41:00.0'), mdev_types=(bare1, named1))
    pf = _gpu('0000:41:00.0', mdev_types=(bare2, bare1),
              vf_gpus=(vf1, vf2, vf3))
    offered = pf.offered_types()
    assert [t.id for t in offered] == ['nvidia-2', 'nvidia-1', 'nvidia-9']
    assert offered[1] is full1          # name and maximum
    assert offered[0] is max_only2      # a maximum beats none, first seen
    assert pf.offered_type('nvidia-1') is full1
    assert pf.offered_type('nvidia-9').id == 'nvidia-9'
    assert pf.offered_type('nvidia-5') is None
    # a name without a maximum beats a maximum without a name
    gpu = _gpu('0000:41:00.0', mdev_types=(max_only2,), vf_gpus=(_gpu(
        '0000:41:00.4', mdev_types=(_type('nvidia-2', name='B'),)),))
    assert gpu.offered_type('nvidia-2').name == 'B'


@pytest.mark.parametrize('code,expected', [
    ('0x030000', True), ('0x030200', True), ('0X0302AB', True),
    ('0x038000', True), ('0x020000', False), ('030200', False),
    ('', False), (None, False)])
def test_is_gpu_class(code, expected):
    assert objects.is_gpu_class(code) is expected


# --- PciAddress ---------------------------------------------------------

PCI_REFUSAL = ("%r is not a PCI address; expected the form DDDD:BB:SS.F in "
               "hex digits, e.g. 0000:af:00.0")


@pytest.mark.parametrize('text,fields', [
    ('0000:af:1f.7', (0, 0xaf, 0x1f, 7)),
    ('0a0b:c0:0d.6', (0xa0b, 0xc0, 0x0d, 6)),
    ('ABCDEF12:Ff:1A.3', (0xabcdef12, 0xff, 0x1a, 3)),    # 16 characters
    ('00000000:00:00.0', (0, 0, 0, 0)),
    ('fedc:ba:19.5', (0xfedc, 0xba, 0x19, 5)),
])
def test_pci_address_fields(text, fields):
    address = objects.PciAddress.parse(text)
    assert (address.domain, address.bus, address.slot,
            address.function) == fields
    assert type(address) is objects.PciAddress


@pytest.mark.parametrize('text', [
    '000:af:00.0',            # a domain of 3 digits
    '000000000:af:00.0',      # of 9
    '0000:af:00:0', '0000:af:00.0:0', '0000:af.00.0', '0000:af:000.0',
    '0000:af:0.00', '0000:af:0g.0', '0000:a:00.0', '0000:af:00.a',
    '0000:af:00.', '0000:af:2f.0', '0000 af 00.0'])
def test_pci_address_refusal_names_the_text(text):
    assert _message(exception.InvalidPciAddress, objects.PciAddress.parse,
                    text) == PCI_REFUSAL % (text,)


@pytest.mark.parametrize('value', [None, 42, ['0000:af:00.0'],
                                   {'a': 1}, b'0000:af:00.0'])
def test_pci_address_refuses_what_is_no_text(value):
    assert _message(exception.InvalidPciAddress, objects.PciAddress.parse,
                    value) == PCI_REFUSAL % (value,)


def test_pci_address_parsed_once_is_kept():
    first = objects.PciAddress.parse('0000:41:00.0')
    assert objects.PciAddress.parse('0000:41:00.0') is first
    assert objects.PciAddress.parse(first) is first


def test_pci_addresses_kept_are_bounded(monkeypatch):
    monkeypatch.setattr(objects, '_MAX_PARSED_PCI', 2)
    texts = ['0000:41:00.0', '0000:41:00.1', '0000:41:00.2']
    first = [objects.PciAddress.parse(t) for t in texts]
    again = [objects.PciAddress.parse(t) for t in texts]
    assert [a is b for a, b in zip(first, again)] == [True, True, False]
    assert again == first


def test_a_subclass_parses_its_own_and_keeps_none():
    class Sub(objects.PciAddress):
        pass
    assert type(Sub.parse('0000:41:00.0')) is Sub
    assert type(objects.PciAddress.parse('0000:41:00.0')) is \
        objects.PciAddress
    assert type(Sub.parse('0000:41:00.0')) is Sub


@pytest.mark.parametrize('name', [
    'pcx_0000_af_00_0', 'pci_0000_af_00', 'pci_0000_af_00_0_1', None, 42])
def test_from_libvirt_name_refusal_names_the_name(name):
    assert _message(exception.InvalidPciAddress,
                    objects.PciAddress.from_libvirt_name, name) == \
        PCI_REFUSAL % (name,)


def test_from_libvirt_name_of_a_bad_function_names_the_address():
    assert _message(exception.InvalidPciAddress,
                    objects.PciAddress.from_libvirt_name,
                    'pci_0000_af_00_8') == PCI_REFUSAL % ('0000:af:00.8',)


# --- Uuid and TypeId ----------------------------------------------------

UUID_REFUSAL = ("%r is not a UUID; expected the form "
                "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx")


@pytest.mark.parametrize('value', [
    None, 42, [UUID], {UUID: 1}, UUID[:-1], UUID + '0', UUID.replace('-', '_'),
    'g' + UUID[1:]])
def test_uuid_refusal_names_the_value(value):
    assert _message(exception.InvalidUuid, objects.Uuid.parse, value) == \
        UUID_REFUSAL % (value,)


def test_uuid_parsed_once_is_kept():
    first = objects.Uuid.parse(UUID.upper())
    assert first == UUID and type(first) is objects.Uuid
    assert objects.Uuid.parse(UUID.upper()) is first
    assert objects.Uuid.parse(first) is first


def test_uuids_kept_are_bounded(monkeypatch):
    monkeypatch.setattr(objects, '_MAX_PARSED', 2)
    texts = [UUID[:-1] + digit for digit in '123']
    first = [objects.Uuid.parse(t) for t in texts]
    again = [objects.Uuid.parse(t) for t in texts]
    assert [a is b for a, b in zip(first, again)] == [True, True, False]
    assert again == first == texts


def test_uuid_of_a_str_subclass_is_parsed_not_kept():
    class Text(str):
        pass
    value = Text(UUID.upper())
    first = objects.Uuid.parse(value)
    assert first == UUID and type(first) is objects.Uuid
    assert objects.Uuid.parse(value) is not first
    # and what it parsed is not found for the plain text either
    assert objects.Uuid.parse(UUID.upper()) is not first


@pytest.mark.parametrize('value', [None, 5, '', 'a b', '-a', 'x' * 65])
def test_type_id_refusal_names_the_value(value):
    assert _message(exception.InvalidTypeId, objects.TypeId.parse,
                    value) == (
        "%r is not a valid vGPU type id (1 to 64 letters, digits, '-', '_' "
        "or '.', starting with a letter or digit, e.g. nvidia-223)"
        % (value,))


# --- PCI ids and GPU selectors ------------------------------------------

@pytest.mark.parametrize('value', [None, 10, '10d', '10dee', 'xyzw', '0x',
                                   '0X10de'])
def test_pci_id_refusal_names_the_value(value):
    assert _message(exception.InvalidInput, objects.normalize_hex_id,
                    value) == (
        'Invalid input: %r is not a 4-digit hex PCI id' % (value,))


def test_selector_refusal_is_the_whole_sentence():
    assert _message(exception.InvalidInput, objects.GpuSelector.parse,
                    'nvidia') == (
        "Invalid input: 'nvidia' names no GPU: give a PCI address "
        '(0000:41:00.0) or the vendor:product ids of a model (10de:2331)')


def test_selector_by_model_up_to_32_characters():
    fits = '0x10de' + ' ' * 19 + ':0x2331'
    assert len(fits) == 32
    assert str(objects.GpuSelector.parse(fits)) == '10de:2331'
    with pytest.raises(exception.InvalidInput, match='names no GPU'):
        objects.GpuSelector.parse(fits.replace(':', ' :'))
