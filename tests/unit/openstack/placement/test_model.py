import json

import pytest

from libvirt_gpu import objects
from libvirt_gpu.openstack import cyborg_objects
from libvirt_gpu.openstack.placement import model
from libvirt_gpu.openstack.placement import traits
from libvirt_gpu.openstack.placement import tree
from tests.doubles import fakes

AF = objects.PciAddress.parse('0000:af:00.0')
B3 = objects.PciAddress.parse('0000:3b:00.0')


@pytest.mark.parametrize('name,expected', [
    ('GRID T4-2B', 'CUSTOM_NVIDIA_1EB8_T4_2B'),
    ('NVIDIA L40S-1B', 'CUSTOM_NVIDIA_1EB8_L40S_1B'),
    ('NVIDIA RTX Pro 6000 Blackwell DC-48C',
     'CUSTOM_NVIDIA_1EB8_RTX_PRO_6000_BLACKWELL_DC_48C'),
    ('A40-8Q', 'CUSTOM_NVIDIA_1EB8_A40_8Q'),
    (None, 'CUSTOM_NVIDIA_1EB8_NVIDIA_223'),
])
def test_vgpu_custom_trait(name, expected):
    mtype = objects.VgpuType('nvidia-223', name, None, 'vfio-pci', 8)
    assert expected in traits.vgpu_traits(fakes.gpu(), mtype)


def test_description_traits_only_known_names():
    # 5120x2880 has no os-traits trait: left out, never invented.
    assert traits.description_traits(fakes.T4_2B) == {
        'HW_GPU_MAX_DISPLAY_HEADS_4'}
    assert traits.description_traits(fakes.T4_1A) == {
        'HW_GPU_MAX_DISPLAY_HEADS_1', 'HW_GPU_RESOLUTION_W1280H1024'}


def test_gpu_traits_switch():
    assert traits.vgpu_traits(fakes.gpu(), fakes.T4_2B, gpu_traits=False) \
        == {'OWNER_CYBORG', 'CUSTOM_NVIDIA_1EB8_T4_2B'}


def test_long_trait_is_capped():
    mtype = objects.VgpuType('x', 'GRID ' + 'A' * 400, None, 'vfio-pci', 1)
    names = traits.vgpu_traits(fakes.gpu(), mtype, gpu_traits=False)
    assert all(len(n) <= 255 for n in names)


def test_tree_vgpu_and_pgpu():
    used = objects.Mdev('11111111-2222-3333-4444-555555555555', 'nvidia-223')
    t2b = objects.VgpuType('nvidia-223', 'GRID T4-2B', fakes.T4_2B.description,
                           'vfio-pci', 7)
    gpus = [fakes.gpu('0000:af:00.0', types=(t2b,), mdevs=(used,)),
            fakes.gpu('0000:3b:00.0')]
    enabled = {AF: objects.EnabledType('nvidia-223')}
    result = model.build_tree('host1', gpus, enabled)
    assert result.root.name == 'host1'
    assert result.root.uuid == tree.provider_uuid('host1')
    by_name = {p.name: p for p in result.children}
    vgpu = by_name['host1_0000:af:00.0']
    assert vgpu.parent_provider_uuid == result.root.uuid
    assert vgpu.inventories_api() == {'VGPU': {
        'total': 8, 'reserved': 0, 'min_unit': 1, 'max_unit': 8,
        'step_size': 1, 'allocation_ratio': 1.0}}
    assert vgpu.traits == {'OWNER_CYBORG', 'CUSTOM_NVIDIA_1EB8_T4_2B',
                           'HW_GPU_MAX_DISPLAY_HEADS_4'}
    pgpu = by_name['host1_0000:3b:00.0']
    assert pgpu.inventories_api()['PGPU']['total'] == 1
    assert pgpu.traits == {'OWNER_CYBORG', 'CUSTOM_NVIDIA_1EB8'}


def test_max_instances_caps_total_but_keeps_used():
    mdevs = tuple(objects.Mdev('%08d-0000-0000-0000-000000000000' % i,
                               'nvidia-223') for i in range(3))
    t2b = objects.VgpuType('nvidia-223', 'GRID T4-2B', None, 'vfio-pci', 5)
    gpu = fakes.gpu(types=(t2b,), mdevs=mdevs)
    assert model.vgpu_total(gpu, objects.EnabledType('nvidia-223')) == 8
    assert model.vgpu_total(
        gpu, objects.EnabledType('nvidia-223', max_instances=4)) == 4
    assert model.vgpu_total(
        gpu, objects.EnabledType('nvidia-223', max_instances=1)) == 3


def test_no_capacity_no_provider_never_total_zero():
    full = objects.VgpuType('nvidia-223', 'GRID T4-2B', None, 'vfio-pci', 0)
    other = objects.Mdev('11111111-2222-3333-4444-555555555555', 'nvidia-319')
    gpu = fakes.gpu(types=(full, fakes.T4_4C), mdevs=(other,))
    result = model.build_tree('h', [gpu],
                              {AF: objects.EnabledType('nvidia-223')})
    assert result.children == ()
    with pytest.raises(ValueError):
        tree.Inventory('VGPU', total=0)


def test_pgpu_holding_mdevs_is_reserved():
    other = objects.Mdev('11111111-2222-3333-4444-555555555555', 'nvidia-319')
    result = model.build_tree('h', [fakes.gpu(mdevs=(other,))], {})
    inv = result.children[0].inventories_api()['PGPU']
    assert (inv['total'], inv['reserved']) == (1, 1)


def test_cyborg_report_and_objects():
    gpus = [fakes.gpu('0000:af:00.0'), fakes.gpu('0000:3b:00.0')]
    enabled = {AF: objects.EnabledType('nvidia-223')}
    devices = {json.loads(d.controlpath_id.cpid_info)['bus']: d for d in
               cyborg_objects.driver_devices('h', gpus, enabled)}
    assert {d.vendor for d in devices.values()} == {'10de'}
    vdep = devices['af'].deployable_list[0]
    assert vdep.num_accelerators == 8
    assert [json.loads(h.attach_info)['vgpu_mark']
            for h in vdep.attach_handle_list][:2] == [
                'nvidia-223_0', 'nvidia-223_1']
    assert {h.attach_type for h in vdep.attach_handle_list} == {'MDEV'}
    attrs = {a.key: a.value for a in vdep.attribute_list}
    assert attrs['rc'] == 'VGPU'
    assert 'CUSTOM_NVIDIA_1EB8_T4_2B' in attrs.values()
    pdep = devices['3b'].deployable_list[0]
    assert [h.attach_type for h in pdep.attach_handle_list] == ['PCI']
    assert devices['3b'].controlpath_id.cpid_type == 'PCI'
    assert devices['3b'].controlpath_id.cpid_info == (
        '{"bus": "3b", "device": "00", "domain": "0000", "function": "0"}')
