"""The fields of Cyborg's driver objects (``openstack.cyborg_objects``),
each pinned whole: PCI and mdev info, traits in order, model and
controller names, the deployables and attach handles of a whole GPU and
of its vGPUs.  Each test fails on a change ``make mutation`` made that
the rest of the unit tests stayed green on (docs/dev/mutation.md);
test_cyborg_driver_golden.py compares the objects with Cyborg's own."""

import uuid as uuidlib

import pytest

from libvirt_gpu import objects
from libvirt_gpu.openstack import cyborg_objects
from libvirt_gpu.openstack.placement import model
from libvirt_gpu.util import records
from tests.doubles import fakes


# -- cyborg_objects: the fields of Cyborg's driver objects -----------------

def _type(type_id='nvidia-223'):
    return objects.EnabledType(objects.TypeId.parse(type_id))


def _addr(text):
    return objects.PciAddress.parse(text)


def test_pci_and_mdev_info_write_every_part_of_the_address():
    address = _addr('00ab:3b:1f.7')
    assert cyborg_objects.pci_info(address) == (
        '{"bus": "3b", "device": "1f", "domain": "00ab", "function": "7"}')
    assert cyborg_objects.mdev_info(address, 'nvidia-223', 12) == (
        '{"asked_type": "nvidia-223", "bus": "3b", "device": "1f", '
        '"domain": "00ab", "function": "7", "vgpu_mark": "nvidia-223_12"}')


@pytest.mark.parametrize('given,ordered', [
    ({'HW_X', 'CUSTOM_B', 'OWNER_CYBORG', 'CUSTOM_A', 'A_Y'},
     ['OWNER_CYBORG', 'CUSTOM_A', 'CUSTOM_B', 'A_Y', 'HW_X']),
    ({'HW_X', 'CUSTOM_B'}, ['CUSTOM_B', 'HW_X']),
    (set(), []),
])
def test_ordered_traits(given, ordered):
    assert cyborg_objects.ordered_traits(frozenset(given)) == ordered


@pytest.mark.parametrize('vendor,product,name', [
    ('NVIDIA Corporation', 'TU104GL [Tesla T4]',
     'NVIDIA Corporation TU104GL [Tesla T4]'),
    ('NVIDIA Corporation', None, 'NVIDIA Corporation Device'),
    (None, 'TU104GL', 'TU104GL'),
    (None, None, 'Device'),
])
def test_model_name(vendor, product, name):
    gpu = records.replace(fakes.gpu(), vendor_name=vendor,
                          product_name=product)
    assert cyborg_objects.model_name(gpu) == name


@pytest.mark.parametrize('class_code,name', [
    ('0x030000', 'VGA compatible controller'),
    ('0x030100', 'XGA compatible controller'),
    ('0x030200', '3D controller'),
    ('0x0302A0', '3D controller'),
    ('0x038000', 'Display controller'),
    ('0x030900', 'Display controller'),
])
def test_controller(class_code, name):
    gpu = records.replace(fakes.gpu(), class_code=class_code)
    assert cyborg_objects.controller(gpu) == name


def _with_vfs(vfs, types=()):
    pf = fakes.gpu('0000:3d:00.0', types=types)
    made = tuple(records.replace(
        fakes.gpu(address, types=vf_types, mdevs=mdevs),
        physfn=pf.address) for address, vf_types, mdevs in vfs)
    return records.replace(pf, vf_gpus=made,
                           virtfns=tuple(v.address for v in made))


def _mdev(type_id):
    return objects.Mdev(str(uuidlib.uuid4()), objects.TypeId.parse(type_id))


def test_mdev_parents_on_vfs_used_ones_of_the_type_then_free_ones():
    other = fakes.t4_type(225, '1A', 1, 60, 1024, '1280x1024')
    gpu = _with_vfs([
        ('0000:3d:00.7', (fakes.T4_2B,), ()),
        ('0000:3d:00.5', (fakes.T4_2B,), (_mdev('nvidia-223'),)),
        ('0000:3d:00.6', (fakes.T4_2B,), (_mdev('nvidia-225'),)),
        ('0000:3d:00.4', (other,), ()),
        ('0000:3d:01.0', (fakes.T4_2B,), ()),
    ])
    t = objects.TypeId.parse('nvidia-223')
    assert [str(a) for a in cyborg_objects.mdev_parents(gpu, t, 9)] == [
        '0000:3d:00.5', '0000:3d:00.7', '0000:3d:01.0']
    assert [str(a) for a in cyborg_objects.mdev_parents(gpu, t, 2)] == [
        '0000:3d:00.5', '0000:3d:00.7']
    assert cyborg_objects.mdev_parents(gpu, t, 0) == []
    plain = fakes.gpu()
    assert cyborg_objects.mdev_parents(plain, t, 3) == [plain.address] * 3


def test_reported_gpus():
    gpu = fakes.gpu()
    amd = records.replace(gpu, vendor_id='1002')
    vf = records.replace(gpu, physfn=_addr('0000:af:00.0'))
    assert cyborg_objects.reported(gpu, None)
    assert not cyborg_objects.reported(amd, None)
    assert cyborg_objects.reported(amd, _type())
    assert cyborg_objects.reported(amd, None, pgpu_vendors=('1002',))
    assert not cyborg_objects.reported(vf, _type())
    assert not cyborg_objects.reported(vf, None)


def test_withheld_says_why():
    gpu = fakes.gpu()
    assert cyborg_objects.withheld(gpu, None) is None
    assert cyborg_objects.withheld(gpu, _type()) is None
    no_group = records.replace(gpu, iommu_group=None)
    assert cyborg_objects.withheld(no_group, None) == (
        'not offered whole: %s' % model.NO_IOMMU_GROUP)
    busy = records.replace(gpu, mdevs=(_mdev('nvidia-223'),))
    assert cyborg_objects.withheld(busy, None) == (
        'not offered whole: it holds vGPUs now (Cyborg could not reserve '
        'it)')
    full = records.replace(gpu, mdev_types=(records.replace(
        fakes.T4_2B, available_instances=0),))
    assert cyborg_objects.withheld(full, _type()) == (
        'vGPU type nvidia-223: no room left')
    # one room left: offered
    room = records.replace(gpu, mdev_types=(records.replace(
        fakes.T4_2B, available_instances=1),))
    assert cyborg_objects.withheld(room, _type()) is None


def test_vendor_interface_refusal():
    t = objects.VgpuType('nvidia-1145', 'NVIDIA L40S-1B', None, 'vfio-pci',
                         1)
    vf = records.replace(fakes.gpu('0000:3d:00.4', types=()),
                         physfn=_addr('0000:3d:00.0'),
                         vendor_vf=objects.VendorVf(creatable=(t,)))
    pf = records.replace(fakes.gpu('0000:3d:00.0', types=()),
                         vf_gpus=(vf,), virtfns=(vf.address,))
    setting = _type('nvidia-1145')
    why = cyborg_objects.vendor_interface_refusal(pf, setting)
    assert why == (
        'vGPU type nvidia-1145 is made through the nvidia vendor interface '
        'of the GPU\'s SR-IOV VFs (NVIDIA\'s is vGPU 17+): Cyborg binds '
        'vGPUs only as mdevs, and Nova would pass a VF from Cyborg with '
        'managed=yes, taking it from the vendor\'s driver; the GPU is '
        'reported to Cyborg with nothing to offer (give its VFs to Nova '
        'as PCI devices with "managed": "no", or use libvirt-gpu agent)')
    assert cyborg_objects.withheld(pf, setting) == why
    assert cyborg_objects.vendor_interface_refusal(pf, None) is None
    assert cyborg_objects.vendor_interface_refusal(
        fakes.gpu(), _type()) is None
    bare = fakes.gpu(types=())
    assert bare.vgpu_interface is None
    assert cyborg_objects.vendor_interface_refusal(bare, _type()) is None


def test_a_whole_gpu_s_deployable():
    gpu = records.replace(fakes.gpu('0000:3b:00.0'), vendor_name='NVIDIA',
                          product_name='T4')
    (device,) = cyborg_objects.driver_devices('h', [gpu], {})
    assert cyborg_objects.to_primitive(device) == {
        'vendor': '10de', 'model': 'NVIDIA T4', 'type': 'GPU',
        'std_board_info': '{"product_id": "1eb8", "controller": '
                          '"3D controller"}',
        'vendor_board_info': '{"vendor_info": "gpu_vb_info"}',
        'controlpath_id': {
            'cpid_type': 'PCI',
            'cpid_info': cyborg_objects.pci_info(gpu.address)},
        'deployable_list': [{
            'name': 'h_0000:3b:00.0', 'num_accelerators': 1,
            'attribute_list': [
                {'key': 'rc', 'value': 'PGPU'},
                {'key': 'trait0', 'value': 'OWNER_CYBORG'},
                {'key': 'trait1', 'value': 'CUSTOM_NVIDIA_1EB8'}],
            'attach_handle_list': [{
                'attach_type': 'PCI',
                'attach_info': cyborg_objects.pci_info(gpu.address),
                'in_use': False}],
            'driver_name': 'NVIDIA'}],
        'stub': False}


def test_a_vgpu_deployable_with_and_without_display_traits():
    gpu = fakes.gpu()
    enabled = {gpu.address: records.replace(_type(), resource_class='VGPU',
                                            max_instances=2)}
    (device,) = cyborg_objects.driver_devices('h', [gpu], enabled)
    (dep,) = device.deployable_list
    assert dep.num_accelerators == 2
    assert [(a.key, a.value) for a in dep.attribute_list] == [
        ('rc', 'VGPU'), ('trait0', 'OWNER_CYBORG'),
        ('trait1', 'CUSTOM_NVIDIA_1EB8_T4_2B'),
        ('trait2', 'HW_GPU_MAX_DISPLAY_HEADS_4')]
    assert [h.attach_info for h in dep.attach_handle_list] == [
        cyborg_objects.mdev_info(gpu.address, 'nvidia-223', i)
        for i in (0, 1)]
    assert {h.attach_type for h in dep.attach_handle_list} == {'MDEV'}
    (plain,) = cyborg_objects.driver_devices('h', [gpu], enabled,
                                             gpu_traits=False)
    assert [a.value for a in plain.deployable_list[0].attribute_list] == [
        'VGPU', 'OWNER_CYBORG', 'CUSTOM_NVIDIA_1EB8_T4_2B']


def test_driver_name_of_another_vendor():
    amd = records.replace(fakes.gpu(), vendor_id='1002')
    other = records.replace(fakes.gpu('0000:3b:00.0'), vendor_id='1af4')
    devices = cyborg_objects.driver_devices(
        'h', [amd, other], {}, pgpu_vendors=('1002', '1af4'))
    assert [d.deployable_list[0].driver_name for d in devices] == [
        '1af4', 'AMD']


def test_driver_devices_by_address_reported_only():
    a, b = fakes.gpu('0000:af:00.0'), fakes.gpu('0000:3b:00.0')
    amd = records.replace(fakes.gpu('0000:5e:00.0'), vendor_id='1002')
    devices = cyborg_objects.driver_devices('h', [a, amd, b], {})
    assert [d.controlpath_id.cpid_info for d in devices] == [
        cyborg_objects.pci_info(b.address),
        cyborg_objects.pci_info(a.address)]


def test_withheld_gpus_names_the_reported_ones_without_deployable():
    busy = fakes.gpu('0000:af:00.0', mdevs=(_mdev('nvidia-223'),))
    free = fakes.gpu('0000:3b:00.0')
    amd = records.replace(fakes.gpu('0000:5e:00.0', mdevs=(
        _mdev('nvidia-223'),)), vendor_id='1002')
    found = cyborg_objects.withheld_gpus([busy, amd, free], {})
    assert list(found) == [busy.address]
    assert found[busy.address].startswith('not offered whole: it holds')
    assert cyborg_objects.withheld_gpus(
        [busy, free], {busy.address: _type()}) == {}


class GpuOptions:
    report_gpu_traits = False
    pgpu_vendor_ids = ('10de',)


def test_host_devices_withholds_carved_gpus_and_says_why():
    a, b = fakes.gpu('0000:af:00.0'), fakes.gpu('0000:3b:00.0')
    vf = records.replace(fakes.gpu('0000:5e:00.4'),
                         physfn=_addr('0000:5e:00.0'))
    busy = fakes.gpu('0000:d8:00.0', mdevs=(_mdev('nvidia-223'),))
    devices, why = cyborg_objects.host_devices(
        'h', [a, busy, vf, b], {a.address: _type()}, GpuOptions,
        carved=frozenset({b.address, vf.address}))
    assert [(d.controlpath_id.cpid_info, len(d.deployable_list))
            for d in devices] == [
        (cyborg_objects.pci_info(b.address), 0),
        (cyborg_objects.pci_info(a.address), 1),
        (cyborg_objects.pci_info(busy.address), 0)]
    assert list(why) == [b.address, busy.address]
    assert why[b.address] == cyborg_objects.CARVED == (
        'carved for Nova ([nova]/carved): its VFs and the capacity they '
        'use are Nova\'s PCI devices')
    # [gpu] options reach the objects: display traits, vendors

    class Traits(GpuOptions):
        report_gpu_traits = True
        pgpu_vendor_ids = ()
    devices, why = cyborg_objects.host_devices(
        'h', [a, busy, b], {a.address: _type()}, Traits)
    assert [d.controlpath_id.cpid_info for d in devices] == [
        cyborg_objects.pci_info(a.address)]
    assert 'HW_GPU_MAX_DISPLAY_HEADS_4' in [
        x.value for x in devices[0].deployable_list[0].attribute_list]
    assert why == {}


def test_to_primitive_of_plain_values_and_tuples():
    assert cyborg_objects.to_primitive(3) == 3
    assert cyborg_objects.to_primitive(('a', ('b',))) == ['a', ['b']]
    handle = cyborg_objects.DriverAttachHandle('PCI', '{}')
    assert cyborg_objects.to_primitive((handle,)) == [
        {'attach_type': 'PCI', 'attach_info': '{}', 'in_use': False}]
