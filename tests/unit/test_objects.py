import pytest

from libvirt_gpu import exception
from libvirt_gpu import objects


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
