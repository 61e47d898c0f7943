"""SR-IOV GPUs: VFs grouped under their physical GPU in discovery, config,
the Placement/Cyborg model and the CLI; the simulator's VFs share their
GPU like NVIDIA's driver."""

import json
import os
import shutil
import tempfile
import xml.etree.ElementTree as ET

import pytest

from libvirt_gpu.devices import discovery
from libvirt_gpu import exception
from libvirt_gpu.virt import host as host_mod
from libvirt_gpu import objects
from libvirt_gpu import simulator
from libvirt_gpu.devices import sysfs as sysfs_mod
from libvirt_gpu.cmd import main as cli
from libvirt_gpu.openstack import cyborg_objects
from libvirt_gpu.openstack.placement import model
from tests.doubles import kernel_sysfs
from tests.doubles import kinds
from tests.doubles import tables
from tests.doubles import layouts

A = objects.PciAddress.parse('0000:41:00.0')       # A100, 16 VFs, 1 vGPU
B = objects.PciAddress.parse('0000:c1:00.0')       # A100, VFs not enabled
L1 = objects.PciAddress.parse('0000:3d:00.0')      # L40S, 2 vGPUs


@pytest.fixture(scope='module')
def fast_dir():
    # not /dev/shm: a state directory below a directory anyone can write
    # (sticky) is refused (statedir.check_dir)
    path = tempfile.mkdtemp(prefix='lgpu-sriov-')
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope='module')
def a100(fast_dir):
    root = os.path.join(fast_dir, 'a100')
    node_xml = simulator.write_host(simulator.load_profile('a100'), root)
    return root, 'test://' + node_xml


@pytest.fixture(scope='module')
def l40s(fast_dir):
    root = os.path.join(fast_dir, 'l40s')
    node_xml = simulator.write_host(simulator.load_profile('l40s'), root)
    return root, 'test://' + node_xml


def _gpus(root):
    return discovery.from_sysfs(sysfs_mod.Sysfs(root),
                                kinds=kinds.registered())


def _conf(tmp_path, text):
    from libvirt_gpu import conf as conf_mod
    path = tmp_path / 'c.conf'
    path.write_text(text)
    return str(path), conf_mod.load(str(path))


# --- discovery ---------------------------------------------------------------

def test_vfs_grouped_under_their_pf(a100):
    result = _gpus(a100[0])
    pf = result.gpu(A)
    assert len(pf.virtfns) == 16 and len(pf.vf_gpus) == 16
    assert [vf.address for vf in pf.vf_gpus] == list(pf.virtfns)
    assert all(vf.physfn == A for vf in pf.vf_gpus)
    assert pf.vgpu_interface == 'mdev'
    # the VFs are listed too, each pointing at its PF
    vfs = [g for g in result.gpus if g.physfn == A]
    assert len(vfs) == 16
    # 0000:c1:00.0 has its VFs off: no VF, no type
    assert result.gpu(B).vf_gpus == () and result.gpu(B).offered_types() == ()


def test_vendor_interface_read_and_completed(l40s):
    pf = _gpus(l40s[0]).gpu(L1)
    assert pf.vgpu_interface == 'nvidia'
    held = [vf.vendor_vf.current for vf in pf.vf_gpus
            if vf.vendor_vf.current is not None]
    # named and given NVIDIA's maximum although their VFs list nothing
    assert [(t.id, t.name, t.max_instance) for t in held] == [
        ('nvidia-1145', 'NVIDIA L40S-1B', 32)] * 2
    # only the types the host lists (its VFs' creatable types, the types
    # they hold): a 48 GB type does not fit beside 1 GB vGPUs, so it is not
    # listed and not invented from a table
    assert pf.offered_type('nvidia-1156') is None
    listed = {t.id for vf in pf.vf_gpus for t in vf.vendor_vf.creatable}
    assert listed and {t.id for t in pf.offered_types()} == listed | {
        'nvidia-1145'}


def test_vendor_state_parity_libvirt_with_sysfs(l40s):
    root, uri = l40s
    by_sysfs = _gpus(root)
    with host_mod.Host(uri, read_only=True) as h:
        by_libvirt = discovery.from_libvirt(h, sysfs_mod.Sysfs(root),
                                            kinds=kinds.registered())
        alone = discovery.from_libvirt(h, kinds=kinds.registered())
    # vendor_vf is not part of Gpu equality: compare it explicitly
    assert [g.vendor_vf for g in by_libvirt.gpus] == \
        [g.vendor_vf for g in by_sysfs.gpus]
    assert sum(1 for g in by_sysfs.gpus if g.vendor_vf) == 64
    pfs = [g for g in by_libvirt.gpus if g.virtfns]
    assert [len(p.vf_gpus) for p in pfs] == [32, 32]
    # libvirt alone cannot see NVIDIA's nvidia/ directory
    assert all(g.vendor_vf is None for g in alone.gpus)


# --- configuration -----------------------------------------------------------

def test_config_names_the_pf_not_a_vf(a100, tmp_path):
    gpus = _gpus(a100[0]).gpus
    _, conf = _conf(tmp_path, '[gpu]\nenabled_vgpu_types = nvidia-472\n'
                    '[vgpu_nvidia-472]\ndevice_addresses = 0000:41:00.0\n')
    assert layouts.enabled(conf, gpus) == {
        A: objects.EnabledType('nvidia-472')}
    _, conf = _conf(tmp_path, '[gpu]\nenabled_vgpu_types = nvidia-472\n'
                    '[vgpu_nvidia-472]\ndevice_addresses = 0000:41:00.5\n')
    with pytest.raises(exception.ConfigError,
                       match='a VF of the GPU 0000:41:00.0'):
        layouts.enabled(conf, gpus)
    _, conf = _conf(tmp_path, '[gpu]\nenabled_vgpu_types = nvidia-472\n'
                    '[vgpu_nvidia-472]\ndevice_addresses = 0000:c1:00.0\n')
    with pytest.raises(exception.ConfigError, match='VFs enabled'):
        layouts.enabled(conf, gpus)
    # without addresses: physical GPUs offering the type, never VFs
    _, conf = _conf(tmp_path, '[gpu]\nenabled_vgpu_types = nvidia-472\n')
    assert list(layouts.enabled(conf, gpus)) == [A]


# --- model ----------------------------------------------------------------

def test_one_provider_per_physical_gpu(a100):
    gpus = _gpus(a100[0]).gpus
    tree = model.build_tree('h', gpus, {})
    # no configuration: each PF offered whole, never a VF; the one whose
    # VF holds a vGPU is reserved
    by_name = {p.name: p.inventories_api()['PGPU'] for p in tree.children}
    assert sorted(by_name) == ['h_0000:41:00.0', 'h_0000:c1:00.0']
    assert by_name['h_0000:41:00.0']['reserved'] == 1
    assert by_name['h_0000:c1:00.0']['reserved'] == 0


def test_capacity_without_any_maximum_never_sums_vfs():
    # VFs whose type has no description and no published maximum: report
    # what exists plus one, not one per free VF
    bare = objects.VgpuType('nvidia-9', None, None, 'vfio-pci', 1)
    vfs = tuple(objects.Gpu(
        address=objects.PciAddress(0, 0x41, 0, 4 + i), vendor_id='10de',
        product_id='ffff', class_code='0x030200', driver='nvidia',
        numa_node=0, iommu_group=None, physfn=A, mdev_types=(bare,))
        for i in range(4))
    pf = objects.Gpu(address=A, vendor_id='10de', product_id='ffff',
                     class_code='0x030200', driver='nvidia', numa_node=0,
                     iommu_group=None, virtfns=tuple(v.address for v in vfs),
                     vf_gpus=vfs)
    assert model.vgpu_total(pf, objects.EnabledType('nvidia-9')) == 1
    assert model.vgpu_total(
        pf, objects.EnabledType('nvidia-9', max_instances=3)) == 3


def test_cyborg_sees_one_device_per_gpu(a100, l40s):
    gpus = _gpus(l40s[0]).gpus
    enabled = {L1: objects.EnabledType('nvidia-1145')}
    devices = cyborg_objects.driver_devices('h', gpus, enabled)
    assert len(devices) == 2                      # two L40S, no VF devices
    # the vendor interface's vGPUs cannot go through Cyborg (see
    # cyborg_objects): the GPU is reported with nothing to offer
    assert devices[0].deployable_list == ()
    assert 'vendor interface' in cyborg_objects.withheld_gpus(
        gpus, enabled)[L1]
    a100_devices = cyborg_objects.driver_devices(
        'h', _gpus(a100[0]).gpus, {A: objects.EnabledType('nvidia-472')})
    handles = a100_devices[0].deployable_list[0].attach_handle_list
    assert [h.attach_type for h in handles] == ['MDEV', 'MDEV']


# --- simulator: VFs share their GPU ------------------------------------------

def test_simulated_vfs_share_the_gpu(fast_dir):
    root = os.path.join(fast_dir, 'share')
    simulator.write_sysfs(simulator.load_profile('a100'), root)
    sysfs = kernel_sysfs.KernelSysfs(root, 'a100')

    def avail(vf, type_id=objects.TypeId.parse('nvidia-472')):
        return sysfs.read_int(os.path.join(sysfs.types_dir(vf), type_id,
                                           'available_instances'))
    # A100-20C: 2 per GPU, one exists on 0000:41:00.4
    assert avail('0000:41:00.4') == 0          # holds one: one per VF
    assert avail('0000:41:00.5') == 1 and avail('0000:41:02.3') == 1
    assert avail('0000:41:00.5', 'nvidia-468') == 0   # one type per GPU
    uuid = '5b2b1d6a-1c2e-4c3e-9c1f-3f1a7c0e6d21'
    sysfs.write(os.path.join(sysfs.types_dir('0000:41:00.5'), 'nvidia-472',
                             'create'), uuid)
    # the GPU is full: every other VF shows 0 now
    assert {avail(vf) for vf in sysfs.virtfns(A)} == {0}
    with pytest.raises(exception.SysfsWriteError) as info:
        sysfs.write(os.path.join(sysfs.types_dir('0000:41:00.6'),
                                 'nvidia-472', 'create'),
                    '6b2b1d6a-1c2e-4c3e-9c1f-3f1a7c0e6d21')
    assert info.value.kwargs['errno'] == 22        # NVIDIA's EINVAL
    sysfs.write(os.path.join(sysfs.mdev_dir(uuid), 'remove'), '1')
    assert avail('0000:41:00.6') == 1
    assert uuid not in {str(m.uuid) for ms in sysfs.mdevs_by_parent().values()
                        for m in ms}


def test_sriov_numvfs_follows_the_kernel(fast_dir):
    root = os.path.join(fast_dir, 'numvfs')
    simulator.write_sysfs(simulator.load_profile('a100'), root)
    sysfs = kernel_sysfs.KernelSysfs(root, 'a100')
    assert sysfs.sriov_numvfs(B) == 0 and sysfs.virtfns(B) == ()
    with pytest.raises(exception.SysfsWriteError) as info:
        sysfs.set_sriov_numvfs(B, 17)
    assert info.value.kwargs['errno'] == 34        # ERANGE: above totalvfs
    sysfs.set_sriov_numvfs(B, 16)
    assert len(sysfs.virtfns(B)) == 16
    assert sysfs.physfn('0000:c1:00.4') == B
    assert discovery.from_sysfs(sysfs, kinds=kinds.registered()).gpu(
        B).offered_type('nvidia-472')
    with pytest.raises(exception.SysfsWriteError) as info:
        sysfs.set_sriov_numvfs(B, 8)               # VFs on: change is EBUSY
    assert info.value.kwargs['errno'] == 16
    with pytest.raises(exception.SysfsWriteError):
        sysfs.set_sriov_numvfs(A, 0)               # a VF holds a vGPU
    sysfs.set_sriov_numvfs(B, 0)
    assert sysfs.virtfns(B) == () and not os.path.exists(
        sysfs.pci_dir('0000:c1:00.4'))


def test_node_xml_lists_only_enabled_vfs():
    doc = ET.fromstring(simulator.node_xml(simulator.load_profile('a100')))
    names = {d.findtext('name') for d in doc.iter('device')}
    assert 'pci_0000_41_00_4' in names and 'pci_0000_c1_00_4' not in names
    pf = [d for d in doc.iter('device')
          if d.findtext('name') == 'pci_0000_c1_00_0'][0]
    vfs = pf.find("capability/capability[@type='virt_functions']")
    assert vfs.get('maxCount') == '16' and vfs.findall('address') == []


# --- CLI ---------------------------------------------------------------------

def test_list_groups_vfs(a100, tmp_path, capsys):
    path, _ = _conf(tmp_path, '[gpu]\nenabled_vgpu_types = nvidia-472\n')
    root = a100[0]
    assert cli.main(['--config-file', path, '--sysfs-root', root, 'list']) \
        == 0
    out = capsys.readouterr().out
    rows = tables.rows(out)
    assert [r['ADDRESS'] for r in rows] == ['0000:41:00.0', '0000:c1:00.0']
    assert [rows[0][c] for c in ('MODE', 'ENABLED TYPE', 'CAPACITY', 'TYPES',
                                 'VGPUS', 'VFS')] == [
        'vgpu', 'nvidia-472', '2', '6', '1', '16 (1 used)']
    assert cli.main(['--config-file', path, '--sysfs-root', root, 'list',
                     '--json']) == 0
    doc = {g['address']: g for g in json.loads(capsys.readouterr().out)}
    assert len(doc) == 18           # 2 PFs, the 16 enabled VFs
    vf = doc['0000:41:00.4']
    assert (vf['physfn'], vf['mode'], vf['enabled_type']) == (
        '0000:41:00.0', 'vgpu', 'nvidia-472')
    assert len(doc['0000:41:00.0']['virtfns']) == 16


def test_types_shows_vendor_types(l40s, capsys):
    root = l40s[0]
    assert cli.main(['--sysfs-root', root, 'types', '0000:bd:00.4',
                     '--json']) == 0
    types = json.loads(capsys.readouterr().out)['0000:bd:00.4']
    assert len(types) == 23
    assert types[0] == {'id': 'nvidia-1145', 'name': 'NVIDIA L40S-1B',
                        'description': None, 'device_api': 'vfio-pci',
                        'available_instances': 1}


def test_placement_show_l40s(l40s, tmp_path, capsys):
    path, _ = _conf(tmp_path, '[gpu]\nenabled_vgpu_types = nvidia-1145\n')
    assert cli.main(['--config-file', path, '--hostname', 'h',
                     '--sysfs-root', l40s[0], 'placement', 'show',
                     '--json']) == 0
    providers = json.loads(capsys.readouterr().out)['resource_providers']
    assert [p['name'] for p in providers] == [
        'h', 'h_0000:3d:00.0', 'h_0000:bd:00.0']
    assert providers[1]['traits'] == ['CUSTOM_NVIDIA_26B9_L40S_1B',
                                      'OWNER_CYBORG']
    assert providers[1]['inventories']['VGPU']['total'] == 32


@pytest.mark.parametrize('name', ['a100', 'l40s', 'a16'])
def test_node_xml_of_new_profiles_valid_per_nodedev_rng(name):
    etree = pytest.importorskip('lxml.etree')
    rng = '/usr/share/libvirt/schemas/nodedev.rng'
    if not os.path.exists(rng):
        pytest.skip('libvirt schemas not installed')
    schema = etree.RelaxNG(etree.parse(rng))
    node = etree.fromstring(
        simulator.node_xml(simulator.load_profile(name)).encode())
    for device in node:
        assert schema.validate(device), (device.findtext('name'),
                                         schema.error_log)


def test_a16_board_behind_one_switch(fast_dir):
    profile = simulator.load_profile('a16')
    gpus = [d for d in profile.devices if d.product_id == '25b6'
            and d.physfn is None]
    assert len(gpus) == 4
    # each GPU behind its own downstream port, all under one upstream port
    ports = {profile.device(g.parent_bridge) for g in gpus}
    assert len(ports) == 4
    assert {p.parent_bridge for p in ports} == {'0000:21:00.0'}
    root = os.path.join(fast_dir, 'a16')
    simulator.write_sysfs(profile, root)
    real = os.path.realpath(os.path.join(root, 'bus/pci/devices/0000:25:00.0'))
    assert '/0000:21:00.0/0000:22:02.0/0000:25:00.0' in real


def test_types_of_a_physical_gpu_count_the_whole_gpu(a100, capsys):
    assert cli.main(['--sysfs-root', a100[0], 'types', '--json']) == 0
    doc = json.loads(capsys.readouterr().out)
    assert list(doc) == ['0000:41:00.0']          # PFs only, VFs folded in
    available = {t['id']: t['available_instances']
                 for t in doc['0000:41:00.0']}
    # A100-20C: 2 per GPU, 1 exists -> 1 more (not the 15 free VFs); the
    # other types cannot join the A100-20C on this GPU
    assert available == {'nvidia-468': 0, 'nvidia-469': 0, 'nvidia-470': 0,
                         'nvidia-471': 0, 'nvidia-472': 1, 'nvidia-473': 0}
