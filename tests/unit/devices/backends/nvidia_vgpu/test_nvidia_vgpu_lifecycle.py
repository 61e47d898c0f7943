"""The vendor interface (and mdev on VFs) through the same allocator, hook,
API and reconcile as classic mdevs, on simulated L40S and A100 hosts whose
writes act like the driver (kernel_sysfs.KernelSysfs), with libvirt
stood in for by tests/doubles/fake_libvirt."""

import io
import json
import os
import shutil

import pytest

from libvirt_gpu.host import allocator as allocator_mod
from libvirt_gpu.guests import api
from libvirt_gpu import environment
from libvirt_gpu import exception
from libvirt_gpu.guests import hook
from libvirt_gpu import objects
from libvirt_gpu.guests import reconcile
from libvirt_gpu import simulator
from libvirt_gpu.store import state
from libvirt_gpu.util import xmlutil
from tests.doubles import domains
from tests.doubles import kernel_sysfs
from libvirt_gpu.devices.backends.nvidia_vgpu.files import (
    VendorFiles as vendor)
from tests.doubles.vendor_world import (
    A, DOM, L1, L2, T_NVIDIA_472, World, mdev_domain_xml, new_uuid,
    vf_domain_xml)


@pytest.fixture
def l40s(fast_tmp):
    return World('l40s', fast_tmp, 'nvidia-1145', '%s, %s' % (L1, L2))


@pytest.fixture
def a100(fast_tmp):
    return World('a100', fast_tmp, 'nvidia-472', str(A))


# --- the allocator counts the whole GPU -------------------------------------

def test_allocator_picks_a_free_vf_and_counts_the_gpu(a100):
    alloc = a100.allocator()
    # A100-20C: 2 per GPU; one exists on 0000:41:00.4, so one more fits,
    # although 15 VFs are free
    assert alloc.capacity('nvidia-472') == {A: 1}
    (grant,) = alloc.reserve(DOM, [allocator_mod.VgpuClaim(
        new_uuid(), objects.TypeId.parse('nvidia-472'))])
    assert str(grant.device.parent) == '0000:41:00.5'   # first free VF
    assert grant.lease.parent == grant.device.parent
    # the lease (not created yet) takes the last instance
    assert alloc.capacity('nvidia-472') == {A: 0}
    with pytest.raises(exception.NoCapacity):
        alloc.reserve(DOM, [allocator_mod.VgpuClaim(new_uuid(),
                                                    T_NVIDIA_472)])


def test_allocator_vendor_interface(l40s):
    alloc = l40s.allocator()
    assert alloc.capacity('nvidia-1145') == {L1: 30, L2: 32}
    (grant,) = alloc.reserve(DOM, [allocator_mod.VgpuClaim(
        new_uuid(), objects.TypeId.parse('nvidia-1145'))])
    # the GPU with most room, its first free VF
    assert str(grant.device.parent) == '0000:bd:00.4'
    # a claim naming a busy VF (someone else's vGPU) is refused
    with pytest.raises(exception.NoCapacity, match='VF 0000:3d:00.4'):
        alloc.reserve(DOM, [allocator_mod.VgpuClaim(
            new_uuid(), objects.TypeId.parse('nvidia-1145'),
            parent=objects.PciAddress.parse('0000:3d:00.4'))])


# --- the hook ----------------------------------------------------------------

def test_hook_prepare_and_release_on_a_vf(l40s):
    uuid = new_uuid()
    xml = vf_domain_xml(uuid, '0000:bd:00.6')
    rc, err = l40s.hook('prepare', xml)
    assert (rc, err) == (0, '')
    assert vendor(l40s.sysfs).current_type('0000:bd:00.6') == 1145
    (lease,) = l40s.leases()
    assert (lease.vgpu_uuid, str(lease.parent), lease.state) == (
        uuid, '0000:bd:00.6', state.CREATED)
    # equal-size mode: the GPU now offers only 1 GB types
    assert [n for n, _ in vendor(l40s.sysfs).creatable_types(
        '0000:bd:00.7')] == [1145, 1147, 1157]
    assert l40s.hook('reconnect', xml)[0] == 0
    assert l40s.hook('prepare', xml) == (0, '')          # idempotent
    assert l40s.hook('release', xml)[0] == 0
    assert vendor(l40s.sysfs).current_type('0000:bd:00.6') == 0
    assert l40s.leases() == []
    assert l40s.backend().kind('nvidia').vgpus() == {}


def test_hook_refuses_a_vf_that_holds_someone_elses_vgpu(l40s):
    rc, err = l40s.hook('prepare', vf_domain_xml(new_uuid(),
                                                 '0000:3d:00.4'))
    assert rc == 1 and 'cannot start' in err
    assert l40s.leases() == []
    assert vendor(l40s.sysfs).current_type('0000:3d:00.4') == 1145  # untouched


def test_hook_rolls_back_when_the_gpu_is_full(l40s):
    # two 48 GB vGPUs asked on an L40S that holds one at most
    uuids = [new_uuid(), new_uuid()]
    xml = vf_domain_xml(uuids[0], '0000:bd:00.4', 'nvidia-1156')
    xml = xml.replace(b'</gpu:gpus>', (
        "<gpu:vgpu uuid='%s' type='nvidia-1156' parent='0000:bd:00.5'/>"
        "</gpu:gpus>" % uuids[1]).encode()).replace(
        b'</devices>', b"<hostdev mode='subsystem' type='pci' managed='no'>"
        b"<source><address domain='0x0000' bus='0xbd' slot='0x00' "
        b"function='0x5'/></source></hostdev></devices>")
    with open(l40s.config, 'a') as f:
        f.write('[vgpu_nvidia-1156]\ndevice_addresses = %s\n' % L2)
    with open(l40s.config) as f:
        text = f.read().replace('enabled_vgpu_types = nvidia-1145',
                                'enabled_vgpu_types = nvidia-1145, '
                                'nvidia-1156').replace(
            'device_addresses = 0000:3d:00.0, 0000:bd:00.0',
            'device_addresses = 0000:3d:00.0')
    with open(l40s.config, 'w') as f:
        f.write(text)
    rc, err = l40s.hook('prepare', xml)
    assert rc == 1 and 'No capacity' in err
    assert vendor(l40s.sysfs).current_type('0000:bd:00.4') == 0
    assert l40s.leases() == []


# --- the hook's settings snapshot on a host without mdevs --------------------

def _l40s_vfs_off(tmp):
    """An l40s host whose second GPU (L2) has its VFs disabled, as a boot
    leaves it, with the hook configured for nvidia-1145 on every GPU."""
    with open(os.path.join(simulator.loading.profile_dir(),
                           'l40s.json')) as f:
        data = json.load(f)
    for dev in data['devices']:
        if dev['address'] == str(L2):
            dev['sriov_numvfs'] = 0
    profile = simulator.loading.profile_from_dict(data)
    world = World('l40s', tmp, 'nvidia-1145', '%s, %s' % (L1, L2))
    shutil.rmtree(world.root)
    simulator.write_sysfs(profile, world.root)
    world.sysfs = kernel_sysfs.KernelSysfs(world.root, profile)
    world.settings_file = os.path.join(world.state_dir,
                                       hook.SETTINGS_NAME)
    with open(world.config, 'w') as f:
        f.write('[DEFAULT]\nsysfs_root = %s\nstate_dir = %s\n[gpu]\n'
                'enabled_vgpu_types = nvidia-1145\n'
                % (world.root, world.state_dir))
    return world


def _hook_with_snapshot(world, op, xml):
    err = io.StringIO()
    rc = hook.run(['qemu', 'vm1', op, 'begin', '-'], xml,
                  config_file=world.config,
                  settings_file=world.settings_file, sysfs=world.sysfs,
                  stderr=err, mdevctl_dir=world.mdevctl)
    return rc, err.getvalue()


def test_snapshot_follows_vfs_enabled_after_it_was_taken(fast_tmp):
    world = _l40s_vfs_off(fast_tmp)
    # the snapshot is taken while L2 has no VFs: vGPU 17+ has no mdev
    # parents, so the mdev_bus listing is empty before and after
    settings, note = hook.load_settings(world.config, world.settings_file)
    assert 'refreshed' in note
    assert sorted(settings.enabled) == [L1]
    assert hook.load_settings(world.config, world.settings_file)[1] is None
    assert not os.path.isdir(os.path.join(world.root, 'class', 'mdev_bus'))
    world.sysfs.set_sriov_numvfs(str(L2), 32)        # sriov-manage -e
    uuid = new_uuid()
    xml = vf_domain_xml(uuid, '0000:bd:00.6')
    rc, err = _hook_with_snapshot(world, 'prepare', xml)
    assert (rc, err) == (0, '')
    assert vendor(world.sysfs).current_type('0000:bd:00.6') == 1145
    with open(os.path.join(world.state_dir, hook.LOG_NAME)) as f:
        assert 'snapshot %s refreshed' % world.settings_file in f.read()
    settings, note = hook.load_settings(world.config, world.settings_file)
    assert note is None and sorted(settings.enabled) == [L1, L2]
    with open(world.settings_file) as f:
        key = json.load(f)['extra']['sysfs_key']
    assert key['mdev_parents'] == []
    assert len(key['vendor_vfs']) == 64 and '0000:bd:00.6' in \
        key['vendor_vfs']
    assert _hook_with_snapshot(world, 'release', xml)[0] == 0
    assert vendor(world.sysfs).current_type('0000:bd:00.6') == 0
    # and disabling them again is noticed too
    world.sysfs.set_sriov_numvfs(str(L2), 0)
    settings, note = hook.load_settings(world.config, world.settings_file)
    assert note is not None and sorted(settings.enabled) == [L1]


def test_vfs_enabled_while_the_snapshot_is_built(fast_tmp, monkeypatch):
    # The keys are taken before discovery reads sysfs: VFs that appear
    # after discovery looked leave a snapshot that the next call refreshes.
    from libvirt_gpu.devices import discovery
    world = _l40s_vfs_off(fast_tmp)
    real = discovery.from_sysfs

    def racing(sysfs, *args, **kwargs):
        found = real(sysfs, *args, **kwargs)
        if not world.sysfs.sriov_numvfs(str(L2)):
            world.sysfs.set_sriov_numvfs(str(L2), 32)
        return found

    monkeypatch.setattr(discovery, 'from_sysfs', racing)
    settings, note = hook.load_settings(world.config, world.settings_file)
    assert note is not None and sorted(settings.enabled) == [L1]
    monkeypatch.setattr(discovery, 'from_sysfs', real)
    settings, note = hook.load_settings(world.config, world.settings_file)
    assert note is not None and sorted(settings.enabled) == [L1, L2]


def test_snapshot_of_an_older_version_is_rebuilt(fast_tmp):
    world = _l40s_vfs_off(fast_tmp)
    hook.load_settings(world.config, world.settings_file)
    with open(world.settings_file) as f:
        data = json.load(f)
    # an older snapshot's form: version 1 of the key
    data['key']['version'] = 1
    with open(world.settings_file, 'w') as f:
        json.dump(data, f)
    _, note = hook.load_settings(world.config, world.settings_file)
    assert note is not None and 'refreshed' in note


# --- the API -----------------------------------------------------------------

def _hostdev_vfs(world, dom, inactive=False):
    import libvirt
    root = xmlutil.parse(dom.XMLDesc(
        libvirt.VIR_DOMAIN_XML_INACTIVE if inactive else 0))
    return ['%s:%s:%s.%s' % tuple(a.get(k)[2:] for k in (
        'domain', 'bus', 'slot', 'function')) for a in root.iterfind(
        "devices/hostdev[@type='pci'][@managed='no']/source/address")]


def test_api_live_attach_and_detach(l40s):
    dom = l40s.conn.define(domains.tiny_domain_xml('vm1'), active=True)
    done = l40s.call(api.attach, 'vm1', vgpu_type='nvidia-1145', live=True)
    assert str(done.parent) == '0000:bd:00.4'
    assert vendor(l40s.sysfs).current_type('0000:bd:00.4') == 1145
    assert _hostdev_vfs(l40s, dom) == ['0000:bd:00.4']
    got = l40s.call(api.list_devices, 'vm1')
    assert [(v.uuid, v.exists, v.in_devices) for v in got.vgpus] == [
        (done.uuid, True, True)]
    assert got.pgpus == ()                 # the VF is no whole GPU
    l40s.call(api.detach, 'vm1', uuid=done.uuid, live=True)
    assert _hostdev_vfs(l40s, dom) == []
    assert vendor(l40s.sysfs).current_type('0000:bd:00.4') == 0
    assert l40s.leases() == []


def test_api_config_attach_records_the_vf_and_hook_creates_it(l40s):
    dom = l40s.conn.define(domains.tiny_domain_xml('vm1'), active=False)
    done = l40s.call(api.attach, 'vm1', vgpu_type='nvidia-1145',
                     config=True)
    vf = done.parent
    assert _hostdev_vfs(l40s, dom, inactive=True) == [str(vf)]
    entry = l40s.backend().kind('nvidia').vgpus()[done.uuid]
    assert (entry.vf, entry.start) == (vf, 'manual')
    # a second config attach gets another VF
    other = l40s.call(api.attach, 'vm1', vgpu_type='nvidia-1145',
                      config=True)
    assert other.parent != vf
    import libvirt
    xml = dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE).encode()
    assert l40s.hook('prepare', xml) == (0, '')
    assert vendor(l40s.sysfs).current_type(vf) == 1145
    assert l40s.hook('release', xml)[0] == 0
    assert vendor(l40s.sysfs).current_type(vf) == 0
    # still recorded
    assert done.uuid in l40s.backend().kind('nvidia').vgpus()
    l40s.call(api.detach, 'vm1', uuid=done.uuid, config=True)
    assert done.uuid not in l40s.backend().kind('nvidia').vgpus()
    assert _hostdev_vfs(l40s, dom, inactive=True) == [str(other.parent)]


# --- reconcile ------------------------------------------------------------

def test_reconcile_removes_an_orphaned_vendor_vgpu(l40s):
    from libvirt_gpu.virt import host as host_mod
    uuid = new_uuid()
    assert l40s.hook('prepare', vf_domain_xml(uuid, '0000:bd:00.4'))[0] == 0
    # the guest is gone (libvirt never heard of it); the lease's holder
    # (this process) works on nothing any more
    store = state.LeaseStore(l40s.state_dir)
    report = reconcile.reconcile(environment.Environment(
        store.state_dir, sysfs=l40s.sysfs,
        host=host_mod.Host.from_connection(l40s.conn),
        mdevctl_dir=l40s.mdevctl))
    assert [(f.action, f.uuid) for f in report.findings] == [
        (reconcile.REMOVED, uuid)]
    assert vendor(l40s.sysfs).current_type('0000:bd:00.4') == 0
    assert l40s.leases() == []
    # someone else's vGPUs (no lease, no state entry) are left alone
    assert vendor(l40s.sysfs).current_type('0000:3d:00.4') == 1145


def test_hook_mdev_on_vfs_counts_the_whole_gpu(a100):
    first, second = new_uuid(), new_uuid()
    assert a100.hook('prepare', mdev_domain_xml(first)) == (0, '')
    parents = {str(p): [m.uuid for m in ms]
               for p, ms in a100.sysfs.mdevs_by_parent().items()}
    assert parents['0000:41:00.5'] == [first]      # a free VF of the GPU
    # A100-20C: 2 per GPU and both exist now, though 14 VFs are free
    rc, err = a100.hook('prepare', mdev_domain_xml(
        second, dom='d7a5fdbd-cdaf-9455-926a-d65c16db1809'))
    assert rc == 1 and 'No capacity' in err
    assert a100.hook('release', mdev_domain_xml(first))[0] == 0
    assert '0000:41:00.5' not in {
        str(p) for p in a100.sysfs.mdevs_by_parent()}


def test_a_vf_holding_a_vgpu_is_never_chosen_even_if_it_lists_the_type(a100):
    # 0000:41:00.4, the GPU's first VF, holds an A100-20C.  A driver (or a
    # race with its removal) may still list the type as available there;
    # the allocator must go by what the VF holds, not by that number.
    held = os.path.join(a100.root, 'bus', 'pci', 'devices', '0000:41:00.4',
                        'mdev_supported_types', 'nvidia-472',
                        'available_instances')
    with open(held, 'w') as f:
        f.write('1\n')
    (grant,) = a100.allocator().reserve(DOM, [allocator_mod.VgpuClaim(
        new_uuid(), objects.TypeId.parse('nvidia-472'),
        parent=objects.PciAddress.parse(A))])
    assert str(grant.device.parent) == '0000:41:00.5'


def test_vfs_enabled_are_resolved_from_the_snapshot_without_oslo(
        fast_tmp, monkeypatch):
    # Only the host's vGPU parents changed: the configuration's values
    # come from the snapshot; oslo.config is not read again.
    from libvirt_gpu.guests.hook import settings as settings_mod
    world = _l40s_vfs_off(fast_tmp)
    hook.load_settings(world.config, world.settings_file)
    world.sysfs.set_sriov_numvfs(str(L2), 32)

    def no_oslo(config_file):
        raise AssertionError('oslo.config read for a change of parents')
    monkeypatch.setattr(settings_mod, '_load_conf', no_oslo)
    settings, note = hook.load_settings(world.config, world.settings_file)
    assert 'resolved again' in note and 'refreshed' in note
    assert sorted(settings.enabled) == [L1, L2]
    assert hook.load_settings(world.config, world.settings_file)[1] is None
    # a change of the file itself still reads it
    with open(world.config, 'a') as f:
        f.write('\n')
    with pytest.raises(AssertionError, match='oslo.config read'):
        hook.load_settings(world.config, world.settings_file)
