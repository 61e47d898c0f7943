"""The records and names of our Placement provider tree
(``placement.tree``, ``traits``, ``model``): provider names and addresses,
traits of each vendor and type, inventories Placement accepts, the tree
built from a host's environment.  Each test fails on a change ``make
mutation`` made that the rest of the unit tests stayed green on
(docs/dev/mutation.md)."""

import uuid as uuidlib

import pytest

from libvirt_gpu.cmd import openstack_cmds
from libvirt_gpu.devices import capacity
from libvirt_gpu import objects
from libvirt_gpu.openstack.placement import model
from libvirt_gpu.openstack.placement import traits as traits_mod
from libvirt_gpu.openstack.placement import tree as tree_mod
from libvirt_gpu.util import records
from tests.doubles import fakes
from tests.doubles.placement_fake import gpu_tree, TWO, uuid_of


def _type(type_id='nvidia-223'):
    return objects.EnabledType(objects.TypeId.parse(type_id))


def _addr(text):
    return objects.PciAddress.parse(text)


def _with_vfs(vfs, types=()):
    pf = fakes.gpu('0000:3d:00.0', types=types)
    made = tuple(records.replace(
        fakes.gpu(address, types=vf_types, mdevs=mdevs),
        physfn=pf.address) for address, vf_types, mdevs in vfs)
    return records.replace(pf, vf_gpus=made,
                           virtfns=tuple(v.address for v in made))


def _mdev(type_id):
    return objects.Mdev(str(uuidlib.uuid4()), objects.TypeId.parse(type_id))


AF = uuid_of('h_0000:af:00.0')


ROOT = uuid_of('h')


# -- tree, traits, model: the records and names of the provider tree -------

def test_provider_uuids_of_a_name():
    assert tree_mod.provider_uuid('h') == str(
        uuidlib.uuid3(uuidlib.NAMESPACE_DNS, 'h'))
    assert tree_mod.legacy_provider_uuid('h') == str(uuidlib.uuid5(
        uuidlib.UUID('2f5b6a4e-8f57-4b4e-9c53-3f1a7c0e6d21'), 'h'))


@pytest.mark.parametrize('kwargs,why', [
    ({'total': 0}, 'Placement refuses an inventory of total 0'),
    ({'total': -1}, 'Placement refuses an inventory of total -1'),
    ({'total': 2, 'reserved': 3}, 'reserved 3 outside 0..2'),
    ({'total': 2, 'reserved': -1}, 'reserved -1 outside 0..2'),
])
def test_an_inventory_placement_refuses_is_refused(kwargs, why):
    with pytest.raises(ValueError) as e:
        tree_mod.Inventory('VGPU', **kwargs)
    assert str(e.value) == why


def test_the_smallest_and_fully_reserved_inventories_are_fine():
    assert tree_mod.Inventory('PGPU', 1).to_api() == {
        'total': 1, 'reserved': 0, 'min_unit': 1, 'max_unit': 1,
        'step_size': 1, 'allocation_ratio': 1.0}
    assert tree_mod.Inventory('VGPU', 4, reserved=4, min_unit=2,
                              max_unit=2, step_size=2,
                              allocation_ratio=1.5).to_api() == {
        'total': 4, 'reserved': 4, 'min_unit': 2, 'max_unit': 2,
        'step_size': 2, 'allocation_ratio': 1.5}


def test_a_tree_as_a_dict():
    found = gpu_tree('h', {'af': TWO['af']})
    assert found.providers == (found.root,) + found.children
    assert found.to_dict() == {'resource_providers': [
        {'name': 'h', 'uuid': ROOT, 'parent_provider_uuid': None,
         'inventories': {}, 'traits': []},
        {'name': 'h_0000:af:00.0', 'uuid': AF, 'parent_provider_uuid': ROOT,
         'inventories': {'VGPU': tree_mod.Inventory('VGPU', 8).to_api()},
         'traits': ['CUSTOM_T4_2B', 'OWNER_CYBORG']}]}
    assert tree_mod.ProviderTree(found.root).providers == (found.root,)


def _vtype(name, type_id='nvidia-223', description=None):
    return objects.VgpuType(type_id, name, description, 'vfio-pci', 1)


@pytest.mark.parametrize('name,word', [
    ('GRID T4-2B', 'T4-2B'),
    ('grid T4-2B', 'T4-2B'),
    ('NVIDIA  L40S-1B ', 'L40S-1B'),
    ('Quadro RTX-1Q', 'Quadro RTX-1Q'),
    ('NVIDIA', 'NVIDIA'),
    ('NVIDIA ', 'NVIDIA'),
    ('GRID   ', 'GRID'),
    ('  ', 'nvidia-223'),
    (None, 'nvidia-223'),
])
def test_vgpu_type_word(name, word):
    assert traits_mod.vgpu_type_word(_vtype(name)) == word


def test_custom_traits_are_capped_at_255():
    assert traits_mod.custom('NVIDIA', '1eb8', 'T4-2B') == \
        'CUSTOM_NVIDIA_1EB8_T4_2B'
    long = traits_mod.custom('A' * 300)
    assert long == ('CUSTOM_' + 'A' * 300)[:255]
    assert len(traits_mod.custom('A' * 248)) == 255


@pytest.mark.parametrize('vendor,word', [
    ('10de', 'NVIDIA'), ('1002', 'AMD'), ('8086', 'INTEL'), ('1af4', '1af4')])
def test_vendor_word(vendor, word):
    assert traits_mod.vendor_word(vendor) == word


def test_pgpu_traits_of_another_vendor():
    amd = records.replace(fakes.gpu(), vendor_id='1002', product_id='74a1')
    assert traits_mod.pgpu_traits(amd) == {'OWNER_CYBORG',
                                           'CUSTOM_AMD_74A1'}


@pytest.mark.parametrize('description,found', [
    ('num_heads=2, max_resolution=1280x1024',
     {'HW_GPU_MAX_DISPLAY_HEADS_2', 'HW_GPU_RESOLUTION_W1280H1024'}),
    ('num_heads=x2, max_resolution=1280x', set()),
    ('num_heads=, max_resolution=x1024', set()),
    ('num_heads=0004, max_resolution=01280x01024',
     {'HW_GPU_MAX_DISPLAY_HEADS_4', 'HW_GPU_RESOLUTION_W1280H1024'}),
    ('num_heads=99', set()),
    (None, set()),
])
def test_description_traits(description, found):
    assert traits_mod.description_traits(
        _vtype('x', description=description)) == found


def test_vgpu_traits_of_another_vendor():
    amd = records.replace(fakes.gpu(), vendor_id='1002', product_id='74a1')
    assert traits_mod.vgpu_traits(amd, _vtype(
        'MxGPU 4', description='num_heads=1')) == {
        'OWNER_CYBORG', 'CUSTOM_AMD_74A1_MXGPU_4',
        'HW_GPU_MAX_DISPLAY_HEADS_1'}


@pytest.mark.parametrize('name,address', [
    ('h_0000:af:00.0', '0000:af:00.0'),
    ('h_0000:af:00.0_nvidia-223', '0000:af:00.0'),
    ('h_0000:af:00.0_', None),
    ('h_0000:af:00.0_bad type', None),
    ('h_0000:zz:00.0', None),
    ('hx_0000:af:00.0', None),
    ('h0000:af:00.0', None),
    ('g_0000:af:00.0', None),
])
def test_gpu_provider_address(name, address):
    got = model.gpu_provider_address('h', name)
    assert (None if got is None else str(got)) == address


def test_provider_names():
    assert model.gpu_provider_name('c1', _addr('0000:af:00.0')) == \
        'c1_0000:af:00.0'
    assert model.type_provider_name('c1', _addr('0000:af:00.0'),
                                    'nvidia-1155') == \
        'c1_0000:af:00.0_nvidia-1155'
    assert model.nova_pci_provider_name('c1', _addr('0000:af:00.0')) == \
        'c1_0000:AF:00.0'


def test_holds_vgpus_counts_the_vfs_too():
    gpu = _with_vfs([('0000:3d:00.4', (fakes.T4_2B,), ())])
    assert not model.holds_vgpus(gpu)
    busy = _with_vfs([('0000:3d:00.4', (fakes.T4_2B,),
                       (_mdev('nvidia-223'),))])
    assert model.holds_vgpus(busy)
    assert model.holds_vgpus(fakes.gpu(mdevs=(_mdev('nvidia-223'),)))


def test_a_vgpu_provider_s_total_is_capped_for_placement():
    huge = records.replace(fakes.T4_2B, description=None,
                           available_instances=2 ** 31 + 5)
    gpu = fakes.gpu(types=(huge,))
    provider = model.gpu_provider('h', ROOT, gpu, _type())
    assert provider.inventories[0].total == 2 ** 31 - 1
    exact = records.replace(huge, available_instances=2 ** 31 - 1)
    provider = model.gpu_provider('h', ROOT, fakes.gpu(types=(exact,)),
                                  _type())
    assert provider.inventories[0].total == 2 ** 31 - 1
    one = records.replace(huge, available_instances=1)
    provider = model.gpu_provider('h', ROOT, fakes.gpu(types=(one,)),
                                  _type(), name='other')
    assert (provider.name, provider.uuid, provider.parent_provider_uuid,
            provider.inventories) == (
        'other', tree_mod.provider_uuid('other'), ROOT,
        (tree_mod.Inventory('VGPU', 1),))


def test_offered():
    gpu = fakes.gpu()
    assert model.offered(gpu, None)
    assert model.offered(gpu, _type())
    assert not model.offered(records.replace(gpu, iommu_group=None), None)
    assert model.offered(records.replace(gpu, iommu_group=None), _type())
    assert not model.offered(records.replace(gpu, vendor_id='1002'), None)
    assert model.offered(records.replace(gpu, vendor_id='1002'), None,
                         pgpu_vendors=('1002',))
    vf = records.replace(gpu, physfn=_addr('0000:af:00.0'))
    assert not model.offered(vf, _type())


def _tree_of(*children, host='h'):
    root = tree_mod.ResourceProvider(host, tree_mod.provider_uuid(host),
                                     None)
    return tree_mod.ProviderTree(root, tuple(
        tree_mod.ResourceProvider(name, tree_mod.provider_uuid(name),
                                  root.uuid, traits=frozenset(t))
        for name, t in children))


def test_check_not_novas_refusals():
    with pytest.raises(model.NovaProviderClash) as e:
        model.check_not_novas(_tree_of(('h_pci_0000_af_00_0', ())))
    assert str(e.value) == (
        'refusing to report h_pci_0000_af_00_0 to Placement: Nova names '
        'its vGPU providers <host>_pci_<address>; this is a bug of '
        'libvirt-gpu, please report it')
    with pytest.raises(model.NovaProviderClash) as e:
        model.check_not_novas(_tree_of(('h_0000:af:00.0', ('OWNER_NOVA',))))
    assert ("h_0000:af:00.0 to Placement: the trait OWNER_NOVA marks "
            "Nova's own providers;") in str(e.value)
    with pytest.raises(model.NovaProviderClash) as e:
        model.check_not_novas(_tree_of(('h_0000:af:00.0', ())),
                              carved=[_addr('0000:af:00.0')])
    assert ("h_0000:af:00.0 to Placement: its GPU is carved for Nova, "
            "whose PCI provider of it has that name;") in str(e.value)
    # the root is Nova's compute node's name: never refused
    model.check_not_novas(_tree_of(('h_0000:3b:00.0', ('OWNER_CYBORG',)),
                                   host='h_pci_x'))
    model.check_not_novas(_tree_of(('h_0000:af:00.0', ())),
                          carved=[_addr('0000:3b:00.0')])


def test_build_tree_leaves_carved_gpus_out_and_names_further_types():
    a, b = fakes.gpu('0000:af:00.0'), fakes.gpu('0000:3b:00.0')
    setting = records.replace(_type(), others=(_type('nvidia-319'),))
    # where the driver counts each type's room (mixed sizes): one
    # provider per type
    both = {(a.address, t.type_id): capacity.DriverRoom(
        mode=capacity.MODE_MIXED, type_id=t.type_id, used=0,
        placement_size=1, placements=tuple(range(n)))
        for t, n in zip(setting.types, (8, 4))}
    found = model.build_tree('h', [a, b], {a.address: setting},
                             carved=frozenset({b.address}), rooms=both)
    assert [(p.name, p.inventories[0].total) for p in found.children] == [
        ('h_0000:af:00.0', 8), ('h_0000:af:00.0_nvidia-319', 4)]
    # without (equal-size mode: one type at a time): the first only
    found = model.build_tree('h', [a, b], {a.address: setting},
                             carved=frozenset({b.address}))
    assert [(p.name, p.inventories[0].total) for p in found.children] == [
        ('h_0000:af:00.0', 8)]
    rooms = {(a.address, setting.type_id): capacity.DriverRoom(
        mode=capacity.MODE_MIXED, type_id=setting.type_id, used=1,
        placement_size=2, placements=(0, 2))}
    (room,) = model.build_tree('h', [a], {a.address: _type()},
                               rooms=rooms).children
    assert room.inventories[0].total == 3
    # a vGPU type enabled on a GPU not offered whole still gets its provider
    amd = records.replace(fakes.gpu('0000:5e:00.0'), vendor_id='1002',
                          iommu_group=None)
    (vgpus,) = model.build_tree('h', [amd], {amd.address: _type()}).children
    assert vgpus.name == 'h_0000:5e:00.0'


class HostEnv:
    """What the CLI's ``provider_tree`` reads of an
    ``environment.Environment`` to hand ``model.host_tree`` its parts."""

    def __init__(self, gpus, enabled, carved, rooms, gpu_traits=False,
                 owners=None):
        from libvirt_gpu.devices import routes as routes_mod
        self.routes = routes_mod.Routes(owners=owners or {})
        self.discovered = type('Discovered', (), {'gpus': tuple(gpus)})
        self.enabled = enabled
        self.carved = type('Carved', (), {'gpus': frozenset(carved)})
        self.conf = type('Conf', (), {'gpu': type('Gpu', (), {
            'report_gpu_traits': gpu_traits,
            'pgpu_vendor_ids': ('1002',)})})
        self.vgpus = type('Vgpus', (), {
            'rooms': staticmethod(lambda asked: rooms if asked is enabled
                                  else {})})


def test_host_tree_takes_everything_from_the_environment():
    a, b = fakes.gpu('0000:af:00.0'), fakes.gpu('0000:3b:00.0')
    amd = records.replace(fakes.gpu('0000:5e:00.0'), vendor_id='1002')
    carved = records.replace(fakes.gpu('0000:5f:00.0'), vendor_id='1002')
    nvidia = fakes.gpu('0000:d8:00.0')
    enabled = {a.address: _type()}
    rooms = {(a.address, enabled[a.address].type_id): capacity.DriverRoom(
        mode=capacity.MODE_MIXED, type_id=enabled[a.address].type_id,
        used=0, placement_size=2, placements=(0, 2))}
    cyborgs = records.replace(fakes.gpu('0000:60:00.0'), vendor_id='1002')
    gpus = [a, b, amd, carved, nvidia, cyborgs]
    found = openstack_cmds.provider_tree(HostEnv(
        gpus, enabled, {carved.address}, rooms,
        owners={cyborgs.address: 'cyborg'}), 'c1')
    assert found.root.name == 'c1'
    # another route's GPU is left out, and its provider left alone
    assert found.foreign == {cyborgs.address}
    assert [(p.name, p.inventories[0].total, sorted(p.traits))
            for p in found.children] == [
        ('c1_0000:5e:00.0', 1, ['CUSTOM_AMD_1EB8', 'OWNER_CYBORG']),
        ('c1_0000:af:00.0', 2, ['CUSTOM_NVIDIA_1EB8_T4_2B',
                                'OWNER_CYBORG'])]
    displayed = openstack_cmds.provider_tree(HostEnv(
        gpus, enabled, {carved.address}, rooms, gpu_traits=True,
        owners={cyborgs.address: 'cyborg'}), 'c1')
    assert 'HW_GPU_MAX_DISPLAY_HEADS_4' in displayed.children[1].traits
