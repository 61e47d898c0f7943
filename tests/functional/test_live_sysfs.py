"""The live simulated sysfs (FUSE): layout, the kernel's answers, udev
events, the error paths only a live tree allows, and cleanup.

Each test mounts its own tree (``live_sysfs`` fixture, ~0.3 s) and drives
it through our ``Sysfs`` and the mdev backend, as the product does on a real
host.
"""

import ctypes
import errno
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time

import pytest

from libvirt_gpu.devices.backends import base
from libvirt_gpu.devices.backends import mdev as mdev_backend
from libvirt_gpu.devices import discovery
from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu import simulator
from libvirt_gpu.simulator import loading
from libvirt_gpu.simulator import uevent
from tests.doubles import kinds
from tests.doubles import trees
from tests.functional import live_sysfs as ls
from libvirt_gpu.devices.backends.nvidia_vgpu.files import (
    VendorFiles as vendor)
from libvirt_gpu.devices.backends.nvidia_vgpu import names as vendor_names


@pytest.fixture(scope='session')
def live_requirements():
    missing = ls.missing_requirements()
    if missing:
        pytest.skip('live simulated sysfs not available: '
                    + '; '.join(missing))


@pytest.fixture
def live_sysfs_factory(live_requirements):
    made = []

    def make(profile='t4', **kwargs):
        live = ls.LiveSysfs(profile, **kwargs)
        made.append(live)
        return live.start()

    try:
        yield make
    finally:
        for live in made:
            live.close()


@pytest.fixture
def live_sysfs(live_sysfs_factory):
    return live_sysfs_factory('t4')


A = '0000:3b:00.0'          # empty T4
B = '0000:af:00.0'          # T4 holding two nvidia-223
EXISTING = objects.Uuid.parse('4b20d080-1b54-4048-85b3-a6a62d165c01')
OTHER = 'b1ae8bf6-38b0-4c81-9d44-78ce3f520496'
B_DEVPATH = '/devices/pci0000:ae/0000:ae:00.0/0000:af:00.0'


def new_uuid():
    return objects.Uuid.new()


def vgpu_device(uuid, parent, type_id):
    """A VgpuDevice as the product builds one: the parent parsed."""
    return base.VgpuDevice(objects.Uuid.parse(uuid),
                           objects.PciAddress.parse(parent),
                           objects.TypeId.parse(type_id))


def backend(live, **kwargs):
    kwargs.setdefault('appear_timeout', 5.0)
    return mdev_backend.MdevBackend(live.sysfs, host=None, **kwargs)


def kernel_mdevs(live):
    return sorted(m['uuid'] for m in live.state()['mdevs'])


def listed_mdevs(live):
    return sorted(os.listdir(live.path('bus', 'mdev', 'devices')))


def assert_consistent(live, expected):
    """The kernel and every place of the tree agree on ``expected``."""
    assert kernel_mdevs(live) == sorted(expected)
    assert listed_mdevs(live) == sorted(expected)
    found = discovery.from_sysfs(live.sysfs, kinds=kinds.registered())
    assert sorted(m.uuid for g in found.gpus for m in g.mdevs) == \
        sorted(expected)


def write_errno(live, path, data):
    with pytest.raises(exception.SysfsWriteError) as e:
        live.sysfs.write(path, data)
    return e.value.kwargs['errno']


# --- layout ------------------------------------------------------------------

snapshot = trees.snapshot


def static_tree(tmp_path, extra_mdevs=()):
    """The static writer's tree of t4 (plus mdevs appended on B)."""
    with open(os.path.join(loading.profile_dir(), 't4.json')) as f:
        data = json.load(f)
    for uuid, type_id in extra_mdevs:
        data['devices'][1]['mdevs'].append({'uuid': uuid,
                                            'type_id': type_id})
    root = str(tmp_path / ('static-%d' % len(extra_mdevs)))
    simulator.write_sysfs(loading.profile_from_dict(data), root)
    return root


def test_same_layout_as_the_static_writer(live_sysfs, tmp_path):
    assert snapshot(live_sysfs.root) == snapshot(static_tree(tmp_path))
    u = new_uuid()
    live_sysfs.sysfs.write(live_sysfs.type_path(B, 'nvidia-223', 'create'),
                           u)
    after = snapshot(live_sysfs.root)
    assert after == snapshot(static_tree(tmp_path, [(u, 'nvidia-223')]))
    assert after['bus/mdev/devices/' + u][0] == 'link'


def test_reads_and_stat_are_sysfs_like(live_sysfs):
    avail = live_sysfs.type_path(B, 'nvidia-223', 'available_instances')
    with open(avail, 'rb') as f:
        assert f.read() == b'6\n'
    with open(live_sysfs.path('bus', 'pci', 'devices', B, 'vendor')) as f:
        assert f.read() == '0x10de\n'
    assert os.stat(avail).st_size == 4096
    assert os.lstat(live_sysfs.path('bus', 'pci', 'devices', B)).st_size \
        == 0
    # kernfs: no reading a store-only attribute, no writing a show-only
    # one, even as root
    with pytest.raises(PermissionError):
        open(live_sysfs.type_path(B, 'nvidia-223', 'create')).read()
    assert write_errno(live_sysfs, avail, '3') == errno.EACCES
    with pytest.raises(OSError) as e:
        os.mkdir(live_sysfs.path('bus', 'mdev', 'devices', 'x'))
    assert e.value.errno == errno.EPERM
    # the PCI config space libvirt reads: ids, class, header type
    with open(live_sysfs.path('bus', 'pci', 'devices', B, 'config'),
              'rb') as f:
        config = f.read()
    assert len(config) == 256
    assert config[:4] == bytes.fromhex('de10b81e')
    assert config[0x09:0x0c] == bytes.fromhex('000203')
    with open(live_sysfs.path('bus', 'pci', 'devices', '0000:ae:00.0',
                              'config'), 'rb') as f:
        assert f.read()[0x0e] == 1          # a bridge


# --- the kernel's answers ----------------------------------------------------

def test_create_appears_everywhere_and_remove_returns_capacity(live_sysfs):
    live = live_sysfs
    sysfs = live.sysfs
    before = {t.id: t.available_instances for t in sysfs.mdev_types(A)}
    u = new_uuid()
    sysfs.write(live.type_path(A, 'nvidia-231', 'create'), u.upper() + '\n')
    # lowercase, at once, in every place, with real links
    assert os.path.realpath(live.path('bus', 'mdev', 'devices', u)) == \
        os.path.realpath(live.path('class', 'mdev_bus', A, u))
    assert os.path.islink(live.type_path(A, 'nvidia-231', 'devices') + '/'
                          + u)
    assert sysfs.link_name(live.path('bus', 'mdev', 'devices', u,
                                     'mdev_type')) == 'nvidia-231'
    group = sysfs.link_name(live.path('bus', 'mdev', 'devices', u,
                                      'iommu_group'))
    assert os.path.islink(live.path('kernel', 'iommu_groups', group,
                                    'devices', u))
    after = {t.id: t.available_instances for t in sysfs.mdev_types(A)}
    assert after['nvidia-231'] == before['nvidia-231'] - 1
    assert all(n == 0 for t, n in after.items() if t != 'nvidia-231')
    assert {t.id: t.available_instances for t in sysfs.mdev_types(B)}[
        'nvidia-223'] == 6
    sysfs.write(live.path('bus', 'mdev', 'devices', u, 'remove'), '1')
    assert not os.path.lexists(live.path('bus', 'mdev', 'devices', u))
    assert not os.path.lexists(live.path('kernel', 'iommu_groups', group))
    assert {t.id: t.available_instances
            for t in sysfs.mdev_types(A)} == before
    assert_consistent(live, [EXISTING, OTHER])


def test_malformed_uuid_is_einval(live_sysfs):
    create = live_sysfs.type_path(A, 'nvidia-223', 'create')
    for bad in ('not-a-uuid', new_uuid()[:-1], new_uuid() + '\n\n',
                'g' * 36):
        assert write_errno(live_sysfs, create, bad) == errno.EINVAL
    assert_consistent(live_sysfs, [EXISTING, OTHER])


def test_duplicate_uuid(live_sysfs):
    live = live_sysfs
    # on another parent than the one holding it: the kernel says EEXIST
    assert write_errno(live, live.type_path(A, 'nvidia-223', 'create'),
                       EXISTING) == errno.EEXIST
    # the backend sees it exists elsewhere: a typed conflict
    with pytest.raises(exception.MdevConflict) as e:
        backend(live).prepare(vgpu_device(EXISTING, A, 'nvidia-223'))
    assert e.value.kwargs['existing_parent'] == objects.PciAddress.parse(B)
    # same parent and type: already there, nothing to do
    assert backend(live).prepare(vgpu_device(EXISTING, B,
                                             'nvidia-223')) is False
    assert_consistent(live, [EXISTING, OTHER])


def test_mixed_types_refused(live_sysfs):
    live = live_sysfs
    u = new_uuid()
    assert write_errno(live, live.type_path(B, 'nvidia-231', 'create'),
                       u) == errno.EINVAL
    with pytest.raises(exception.NoCapacity):
        backend(live).prepare(vgpu_device(u, B, 'nvidia-231'))
    assert_consistent(live, [EXISTING, OTHER])


def test_capacity_exhausted_mid_way_by_racing_creators(live_sysfs):
    live = live_sysfs
    # kernel level: two writers, one instance left (T4-16Q: one per GPU)
    create = live.type_path(A, 'nvidia-234', 'create')
    go = threading.Barrier(2)
    results = {}

    def writer(u):
        go.wait()
        try:
            live.sysfs.write(create, u)
            results[u] = 0
        except exception.SysfsWriteError as e:
            results[u] = e.kwargs['errno']

    racers = [new_uuid(), new_uuid()]
    threads = [threading.Thread(target=writer, args=(u,)) for u in racers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(results.values()) == [0, errno.EINVAL]
    winner = [u for u, code in results.items() if code == 0]
    assert_consistent(live, [EXISTING, OTHER] + winner)
    live.sysfs.write(live.path('bus', 'mdev', 'devices', winner[0],
                               'remove'), '1')

    # through the backend: six guests, two T4-8Q instances
    go = threading.Barrier(6)
    outcome = {}

    def guest(u):
        go.wait()
        try:
            outcome[u] = backend(live).prepare(
                vgpu_device(u, A, 'nvidia-233'))
        except exception.LibvirtGpuError as e:
            outcome[u] = type(e).__name__

    guests = [new_uuid() for _ in range(6)]
    threads = [threading.Thread(target=guest, args=(u,)) for u in guests]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    winners = sorted(u for u, r in outcome.items() if r is True)
    assert len(winners) == 2
    assert sorted(r for r in outcome.values() if r is not True) == \
        ['NoCapacity'] * 4
    assert_consistent(live, [EXISTING, OTHER] + winners)


def test_busy_remove_answers_ebusy(live_sysfs_factory):
    live = live_sysfs_factory('t4', busy_remove='ebusy')
    live.busy(EXISTING)
    remover = backend(live, remove_timeout=0.5, retry_stop=0.5)
    t0 = time.monotonic()
    with pytest.raises(exception.MdevRemoveFailed) as e:
        remover.remove(EXISTING)
    assert 'EBUSY' in str(e.value)
    assert time.monotonic() - t0 >= 0.4        # EBUSY is retried first
    assert_consistent(live, [EXISTING, OTHER])
    live.idle(EXISTING)
    assert remover.remove(EXISTING) is True
    assert_consistent(live, [OTHER])


def test_busy_remove_blocks_until_the_guest_lets_go(live_sysfs):
    live = live_sysfs
    live.busy(EXISTING)
    done = []
    t0 = time.monotonic()
    t = threading.Thread(target=lambda: done.append(
        (backend(live).remove(EXISTING), time.monotonic() - t0)))
    t.start()
    time.sleep(0.5)
    assert done == []
    assert EXISTING in kernel_mdevs(live)
    # the tree keeps answering while a writer is blocked
    assert backend(live).prepare(vgpu_device(new_uuid(), A,
                                             'nvidia-223')) is True
    live.idle(EXISTING)
    t.join(10)
    assert done and done[0][0] is True and done[0][1] >= 0.5
    assert EXISTING not in listed_mdevs(live)


def test_parent_removed_while_in_use(live_sysfs):
    live = live_sysfs
    live.busy(EXISTING)
    unbind = live.path('bus', 'pci', 'drivers', 'nvidia', 'unbind')
    finished = []
    t = threading.Thread(target=lambda: (live.sysfs.write(unbind, B),
                                         finished.append(True)))
    t.start()
    assert ls.wait_for(lambda: not os.path.lexists(
        live.path('class', 'mdev_bus', B)))
    # the idle vGPU went, the busy one holds the unbind
    assert ls.wait_for(lambda: kernel_mdevs(live) == [EXISTING])
    assert finished == []
    assert live.state()['parents'][B] == 'going'
    u = new_uuid()
    with pytest.raises(exception.ParentGone):
        backend(live).prepare(vgpu_device(u, B, 'nvidia-223'))
    assert write_errno(live, live.path('bus', 'pci', 'devices', B,
                                       'mdev_supported_types', 'nvidia-223',
                                       'create'), u) == errno.ENODEV
    live.idle(EXISTING)
    t.join(10)
    assert finished == [True]
    assert_consistent(live, [])
    gpu = discovery.from_sysfs(live.sysfs, kinds=kinds.registered()).gpu(
        objects.PciAddress.parse(B))
    assert (gpu.driver, gpu.mdev_types, gpu.mdevs) == (None, (), ())
    with pytest.raises(exception.ParentGone):
        backend(live).prepare(vgpu_device(u, B, 'nvidia-223'))
    # the driver binds again: full capacity, nothing survived
    live.sysfs.write(live.path('bus', 'pci', 'drivers', 'nvidia', 'bind'),
                     B + '\n')
    gpu = discovery.from_sysfs(live.sysfs, kinds=kinds.registered()).gpu(
        objects.PciAddress.parse(B))
    assert gpu.driver == 'nvidia' and gpu.mdevs == ()
    assert gpu.mdev_type('nvidia-223').available_instances == 8


# --- udev events ------------------------------------------------------------

def test_every_add_and_remove_is_a_udev_message(live_sysfs):
    live = live_sysfs
    u = new_uuid()
    with uevent.UeventListener() as listener:
        live.sysfs.write(live.type_path(B, 'nvidia-223', 'create'), u)
        live.sysfs.write(live.path('bus', 'mdev', 'devices', u, 'remove'),
                         '1')
        got = []
        while len(got) < 2:
            message = listener.receive(timeout=5)
            assert message is not None, got
            props, uid = message
            if u in props['DEVPATH']:
                got.append((props, uid))
    (add, uid1), (remove, uid2) = got
    assert (uid1, uid2) == (0, 0)          # libudev drops anything else
    assert add['ACTION'] == 'add' and remove['ACTION'] == 'remove'
    for props in (add, remove):
        assert props['DEVPATH'] == '%s/%s' % (B_DEVPATH, u)
        assert props['SUBSYSTEM'] == 'mdev'
        assert props['MDEV_TYPE'] == 'nvidia-223'
    assert int(remove['SEQNUM']) == int(add['SEQNUM']) + 1


def _libudev():
    lib = ctypes.CDLL('libudev.so.1')
    for name, res, args in (
            ('udev_new', ctypes.c_void_p, []),
            ('udev_monitor_new_from_netlink', ctypes.c_void_p,
             [ctypes.c_void_p, ctypes.c_char_p]),
            ('udev_monitor_filter_add_match_subsystem_devtype', ctypes.c_int,
             [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p]),
            ('udev_monitor_enable_receiving', ctypes.c_int,
             [ctypes.c_void_p]),
            ('udev_monitor_get_fd', ctypes.c_int, [ctypes.c_void_p]),
            ('udev_monitor_receive_device', ctypes.c_void_p,
             [ctypes.c_void_p]),
            ('udev_device_get_action', ctypes.c_char_p, [ctypes.c_void_p]),
            ('udev_device_get_devpath', ctypes.c_char_p, [ctypes.c_void_p]),
            ('udev_device_get_property_value', ctypes.c_char_p,
             [ctypes.c_void_p, ctypes.c_char_p]),
            ('udev_device_unref', ctypes.c_void_p, [ctypes.c_void_p]),
            ('udev_monitor_unref', ctypes.c_void_p, [ctypes.c_void_p]),
            ('udev_unref', ctypes.c_void_p, [ctypes.c_void_p])):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


def test_libudev_accepts_the_messages_through_its_filters(live_sysfs):
    """libudev itself (what libvirtd links) receives them: its in-kernel
    socket filter checks the magic and the subsystem hash."""
    try:
        lib = _libudev()
    except OSError as e:
        pytest.fail('libudev.so.1 (Debian libudev1, a libvirt dependency) '
                    'cannot be loaded: %s' % e)
    udev = lib.udev_new()
    monitors = {}
    for subsystem in (b'mdev', b'pci'):
        mon = lib.udev_monitor_new_from_netlink(udev, b'udev')
        assert lib.udev_monitor_filter_add_match_subsystem_devtype(
            mon, subsystem, None) == 0
        assert lib.udev_monitor_enable_receiving(mon) == 0
        monitors[subsystem] = mon
    try:
        u = new_uuid()
        live_sysfs.sysfs.write(live_sysfs.type_path(B, 'nvidia-223',
                                                    'create'), u)
        mon = monitors[b'mdev']
        fd = lib.udev_monitor_get_fd(mon)
        seen = None
        deadline = time.monotonic() + 5
        while seen is None and time.monotonic() < deadline:
            if not select.select([fd], [], [], 0.5)[0]:
                continue
            dev = lib.udev_monitor_receive_device(mon)
            if not dev:
                continue
            devpath = lib.udev_device_get_devpath(dev).decode()
            if devpath.endswith(u):
                seen = (lib.udev_device_get_action(dev).decode(), devpath,
                        lib.udev_device_get_property_value(
                            dev, b'MDEV_TYPE').decode())
            lib.udev_device_unref(dev)
        assert seen == ('add', '%s/%s' % (B_DEVPATH, u), 'nvidia-223')
        # the pci-filtered monitor got nothing of it
        pci_fd = lib.udev_monitor_get_fd(monitors[b'pci'])
        while select.select([pci_fd], [], [], 0.2)[0]:
            dev = lib.udev_monitor_receive_device(monitors[b'pci'])
            if dev:
                assert not lib.udev_device_get_devpath(dev).decode() \
                    .endswith(u)
                lib.udev_device_unref(dev)
    finally:
        for mon in monitors.values():
            lib.udev_monitor_unref(mon)
        lib.udev_unref(udev)


def test_writing_uevent_replays_it(live_sysfs):
    live = live_sysfs
    with uevent.UeventListener() as listener:
        live.sysfs.write(live.path('bus', 'pci', 'devices', B, 'uevent'),
                         'change')
        while True:
            message = listener.receive(timeout=5)
            assert message is not None
            if message[0]['DEVPATH'] == B_DEVPATH:
                break
    props = message[0]
    assert (props['ACTION'], props['SUBSYSTEM'], props['DRIVER'],
            props['PCI_SLOT_NAME']) == ('change', 'pci', 'nvidia', B)
    assert write_errno(live, live.path('bus', 'pci', 'devices', B,
                                       'uevent'), 'explode') == errno.EINVAL


# --- cleanup -----------------------------------------------------------------

def assert_gone(live):
    assert live.mountpoint not in ls.mounts()
    assert not ls._pid_alive(live.pid) or _is_zombie(live.pid)
    assert not os.path.exists(live.tmpdir)
    assert not os.path.exists(os.path.dirname(live.backing))


def _is_zombie(pid):
    try:
        with open('/proc/%d/stat' % pid) as f:
            return f.read().rsplit(')', 1)[1].split()[0] in 'ZX'
    except OSError:
        return True


def test_close_leaves_no_mount_no_process_no_files(live_requirements):
    live = ls.LiveSysfs('t4').start()
    assert live.is_mounted() and live.server_alive()
    live.close()
    assert_gone(live)
    live.close()                      # idempotent


def test_failure_inside_still_cleans_up(live_requirements):
    with pytest.raises(RuntimeError):
        with ls.LiveSysfs('t4') as live:
            live.busy(EXISTING)
            # a writer blocked on a busy mdev must not keep it mounted
            threading.Thread(target=lambda: _quiet_write(
                live.path('bus', 'mdev', 'devices', EXISTING, 'remove')),
                daemon=True).start()
            time.sleep(0.2)
            raise RuntimeError('the test failed')
    assert_gone(live)


def _quiet_write(path):
    try:
        with open(path, 'w') as f:
            f.write('1')
    except OSError:
        pass


HELPER = '''
import json, sys, time
sys.path.insert(0, %r)
from tests.functional import live_sysfs
live = live_sysfs.LiveSysfs('t4').start()
print(json.dumps({'mnt': live.mountpoint, 'pid': live.pid,
                  'tmpdir': live.tmpdir, 'backing': live.backing}),
      flush=True)
time.sleep(600)
'''


def test_killed_test_process_leaves_no_mount_or_process(live_requirements):
    helper = subprocess.Popen([sys.executable, '-c', HELPER % ls.REPO],
                              stdout=subprocess.PIPE, text=True)
    try:
        info = json.loads(helper.stdout.readline())
        assert info['mnt'] in ls.mounts()
    finally:
        helper.send_signal(signal.SIGKILL)
        helper.wait()
        helper.stdout.close()
    assert ls.wait_for(lambda: info['mnt'] not in ls.mounts(), 10)
    assert ls.wait_for(lambda: not ls._pid_alive(info['pid']), 10)
    assert not os.path.exists(os.path.dirname(info['backing']))
    ls.sweep_stale_dirs()             # what the next start() does
    assert not os.path.exists(info['tmpdir'])


def test_run_live_serves_until_sigterm(live_requirements, tmp_path):
    mnt = tmp_path / 'mnt'
    work = tmp_path / 'work'
    mnt.mkdir()
    work.mkdir()
    proc = subprocess.Popen(
        [sys.executable, '-m', 'libvirt_gpu.cmd.simulate_live',
         '--workdir', str(work), 't4', str(mnt)],
        cwd=ls.REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert ls.wait_for(lambda: str(mnt) in ls.mounts(), 20), \
            proc.stdout.read1(10000) if proc.poll() is not None else ''
        assert sorted(os.listdir(mnt / 'class' / 'mdev_bus')) == [A, B]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        if str(mnt) in ls.mounts():
            ls._lazy_unmount(str(mnt))
    assert str(mnt) not in ls.mounts()
    assert os.listdir(work) == []      # its backing tree is gone too


def test_run_live_refuses_a_bad_mountpoint(tmp_path):
    from libvirt_gpu.cmd import simulate_live
    assert simulate_live.run_live('t4', str(tmp_path / 'missing')) == 1
    assert simulate_live.run_live('no-such-profile', str(tmp_path)) == 1
    assert os.listdir(tmp_path) == []


def test_sweep_skips_live_processes(live_sysfs):
    ls.sweep_stale_dirs()
    assert live_sysfs.is_mounted() and os.path.isdir(live_sysfs.tmpdir)
    assert kernel_mdevs(live_sysfs) == sorted([EXISTING, OTHER])


# --- SR-IOV GPUs -------------------------------------------------------------

A100_VFS = ls.A100_VFS
L40S_VFS = ls.L40S_VFS


def test_vfs_share_their_gpus_capacity(live_sysfs_factory, tmp_path):
    live = live_sysfs_factory(ls.sriov_profile_file(tmp_path))
    vf0, vf1 = A100_VFS

    def avail(vf):
        return {t.id: t.available_instances
                for t in live.sysfs.mdev_types(vf)}

    assert avail(vf0) == avail(vf1) == {'nvidia-692': 1, 'nvidia-693': 1}
    u = new_uuid()
    backend(live).prepare(vgpu_device(u, vf0, 'nvidia-692'))
    # one vGPU per VF; the other VF may take the second A100-20C only
    assert avail(vf0) == {'nvidia-692': 0, 'nvidia-693': 0}
    assert avail(vf1) == {'nvidia-692': 1, 'nvidia-693': 0}
    assert write_errno(live, live.type_path(vf1, 'nvidia-693', 'create'),
                       new_uuid()) == errno.EINVAL
    live.sysfs.write(live.type_path(vf1, 'nvidia-692', 'create'),
                     new_uuid())
    assert avail(vf1) == {'nvidia-692': 0, 'nvidia-693': 0}
    assert len(kernel_mdevs(live)) == 2
    backend(live).remove(u)
    assert avail(vf0) == {'nvidia-692': 1, 'nvidia-693': 0}


def test_vendor_interface_vfs(live_sysfs_factory, tmp_path):
    live = live_sysfs_factory(ls.sriov_profile_file(tmp_path))
    sysfs = live.sysfs
    vf0, vf1, vf2 = L40S_VFS
    everything = ((1145, 'NVIDIA L40S-1B'), (1154, 'NVIDIA L40S-24A'),
                  (1155, 'NVIDIA L40S-24Q'))
    assert vendor(sysfs).creatable_types(vf0) == everything
    with open(os.path.join(vendor(sysfs).vendor_dir(vf0),
                           vendor_names.CREATABLE_TYPES)) as f:
        assert f.readline() == 'ID    : vGPU Name\n'
    vendor(sysfs).set_current_type(vf0, 1155)
    assert vendor(sysfs).current_type(vf0) == 1155
    assert vendor(sysfs).creatable_types(vf0) == ()      # it holds one
    # equal-size mode: only the 24 GB types fit next to it, mixed or not
    assert vendor(sysfs).creatable_types(vf1) == everything[1:]
    assert _vendor_errno(sysfs, vf1, 1145) == errno.EINVAL
    assert _vendor_errno(sysfs, vf0, 1154) == errno.EBUSY
    vendor(sysfs).set_current_type(vf1, 1154)
    assert vendor(sysfs).creatable_types(vf2) == ()      # the GPU is full
    assert _vendor_errno(sysfs, vf2, 1155) == errno.EINVAL
    assert live.state()['vgpus'] == {vf0: 'nvidia-1155',
                                     vf1: 'nvidia-1154', vf2: None}
    # a guest holds vf1's vGPU: destroying it waits for the guest
    live.busy(vf1)
    done = []
    t = threading.Thread(target=lambda: done.append(
        vendor(sysfs).set_current_type(vf1, 0)))
    t.start()
    time.sleep(0.3)
    assert done == [] and vendor(sysfs).current_type(vf1) == 1154
    live.idle(vf1)
    t.join(10)
    assert done == [None] and vendor(sysfs).current_type(vf1) == 0
    vendor(sysfs).set_current_type(vf0, 0)
    assert vendor(sysfs).creatable_types(vf2) == everything
    assert _vendor_errno(sysfs, vf2, 'x') == errno.EINVAL


def _vendor_errno(sysfs, vf, number):
    path = vendor(sysfs).vendor_dir(vf) + '/' + vendor_names.CURRENT_TYPE
    with pytest.raises(exception.SysfsWriteError) as e:
        sysfs.write(path, str(number))
    return e.value.kwargs['errno']


# --- the bundled SR-IOV profiles on the live tree ----------------------------

A100_PF = '0000:41:00.0'
A100_HELD = 'aa618089-8b16-4d01-a136-25a0f3c73123'
L40S_EMPTY = '0000:bd:00.0'
L40S_BUSY = '0000:3d:00.0'


def _bundled(name):
    with open(os.path.join(loading.profile_dir(), name + '.json')) as f:
        return json.load(f)


def _static(tmp_path, name, data, tag):
    root = str(tmp_path / ('static-%s-%s' % (name, tag)))
    simulator.write_sysfs(loading.profile_from_dict(data), root)
    return snapshot(root)


def _device_entry(data, address):
    (entry,) = [d for d in data['devices'] if d['address'] == address]
    return entry


def _vfs_of(live, pf):
    return [str(a) for a in live.sysfs.virtfns(pf)]


@pytest.mark.parametrize('name', ['a100', 'l40s'])
def test_same_layout_as_the_static_writer_sriov(live_sysfs_factory,
                                                tmp_path, name):
    """The live tree of each SR-IOV profile, before and after a vGPU is
    made on a VF, is what ``write_sysfs`` writes for that state: every
    VF's available_instances / CREATABLE_TYPES follow capacity.py."""
    live = live_sysfs_factory(name)
    data = _bundled(name)
    assert snapshot(live.root) == _static(tmp_path, name, data, 'before')
    if name == 'a100':
        vf = _vfs_of(live, A100_PF)[5]
        u = new_uuid()
        live.sysfs.write(live.type_path(vf, 'nvidia-472', 'create'), u)
        _device_entry(data, vf)['mdevs'] = [{'uuid': u,
                                             'type_id': 'nvidia-472'}]
    else:
        vf = _vfs_of(live, L40S_EMPTY)[2]
        vendor(live.sysfs).set_current_type(vf, 1155)
        _device_entry(data, vf)['held_type'] = 'nvidia-1155'
    after = snapshot(live.root)
    assert after == _static(tmp_path, name, data, 'after')
    if name == 'l40s':
        # the GPU's VFs now list only the 24 GB types; the other GPU's
        # are unchanged
        other = _vfs_of(live, L40S_EMPTY)[0]
        assert [n for n, _ in vendor(live.sysfs).creatable_types(other)] == [
            1155, 1165]


def test_a100_vfs_share_the_gpu_on_the_live_tree(live_sysfs_factory):
    live = live_sysfs_factory('a100')
    vfs = _vfs_of(live, A100_PF)
    assert len(vfs) == 16
    # 0000:c1:00.0 has not enabled its VFs: none is served
    assert live.sysfs.virtfns('0000:c1:00.0') == ()
    assert sorted(os.listdir(live.path('class', 'mdev_bus'))) == vfs

    def avail(type_id):
        return {vf: live.sysfs.read_int(live.type_path(
            vf, type_id, 'available_instances')) for vf in vfs}

    held = [m['parent'] for m in live.state()['mdevs']]
    assert held == [vfs[0]]
    assert avail('nvidia-472') == {vf: int(vf != vfs[0]) for vf in vfs}
    assert set(avail('nvidia-473').values()) == {0}
    # two racing creators, on two different VFs, for the GPU's last
    # A100-20C: exactly one wins
    go = threading.Barrier(2)
    results = {}

    def writer(vf):
        go.wait()
        try:
            live.sysfs.write(live.type_path(vf, 'nvidia-472', 'create'),
                             new_uuid())
            results[vf] = 0
        except exception.SysfsWriteError as e:
            results[vf] = e.kwargs['errno']

    threads = [threading.Thread(target=writer, args=(vf,))
               for vf in (vfs[3], vfs[11])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(results.values()) == [0, errno.EINVAL]
    mdevs = live.state()['mdevs']
    assert len(mdevs) == 2                 # max_instance of A100-20C
    assert {m['type_id'] for m in mdevs} == {'nvidia-472'}
    assert set(avail('nvidia-472').values()) == {0}
    # every other free VF is refused too; removing one frees a slot for
    # every free VF again
    for vf in vfs[1:3]:
        assert write_errno(live, live.type_path(vf, 'nvidia-472', 'create'),
                           new_uuid()) == errno.EINVAL
    live.sysfs.write(live.path('bus', 'mdev', 'devices', A100_HELD,
                               'remove'), '1')
    winner = [vf for vf, code in results.items() if code == 0][0]
    assert avail('nvidia-472') == {vf: int(vf != winner) for vf in vfs}
    found = discovery.from_sysfs(live.sysfs, kinds=kinds.registered())
    (gpu,) = [g for g in found.gpus if str(g.address) == A100_PF]
    assert len(gpu.vf_gpus) == 16


def test_l40s_gpu_full_through_the_vf_type_file(live_sysfs_factory):
    live = live_sysfs_factory('l40s')
    sysfs = live.sysfs
    gpu = _vfs_of(live, L40S_EMPTY)
    other = _vfs_of(live, L40S_BUSY)
    assert len(gpu) == 32
    assert len(vendor(sysfs).creatable_types(gpu[0])) == 23
    vendor(sysfs).set_current_type(gpu[0], 1155)          # L40S-24Q: two
    vendor(sysfs).set_current_type(gpu[1], 1155)
    for vf in gpu:
        assert vendor(sysfs).creatable_types(vf) == ()
        with open(os.path.join(vendor(sysfs).vendor_dir(vf),
                               vendor_names.CREATABLE_TYPES)) as f:
            assert f.read() == ''                      # empty when full
    assert _vendor_errno(sysfs, gpu[2], 1155) == errno.EINVAL
    assert _vendor_errno(sysfs, gpu[2], 1145) == errno.EINVAL
    # the other L40S keeps offering its 1 GB types
    assert [n for n, _ in vendor(sysfs).creatable_types(other[2])] == [
        1145, 1147, 1157]
    vendor(sysfs).set_current_type(gpu[1], 0)
    assert [n for n, _ in vendor(sysfs).creatable_types(gpu[5])] == [
        1155, 1165]


@pytest.mark.parametrize('mode', ['ebusy', 'block'])
def test_busy_remove_is_a_profile_setting(live_sysfs_factory, tmp_path,
                                          mode):
    data = _bundled('t4')
    data['busy_remove'] = mode
    path = str(tmp_path / ('t4-%s.json' % mode))
    with open(path, 'w') as f:
        json.dump(data, f)
    live = live_sysfs_factory(path)            # no --busy-remove
    assert live.state()['busy_remove'] == mode
    live.busy(EXISTING)
    remove = live.path('bus', 'mdev', 'devices', EXISTING, 'remove')
    if mode == 'ebusy':
        # EBUSY at once (block mode would wait for idle, then succeed)
        assert write_errno(live, remove, '1') == errno.EBUSY
        assert EXISTING in kernel_mdevs(live)
        live.idle(EXISTING)
        live.sysfs.write(remove, '1')
    else:
        done = []
        t = threading.Thread(target=lambda: done.append(
            live.sysfs.write(remove, '1')))
        t.start()
        time.sleep(0.5)
        assert done == [] and EXISTING in kernel_mdevs(live)
        live.idle(EXISTING)
        t.join(10)
        assert len(done) == 1
    assert EXISTING not in kernel_mdevs(live)


def test_sriov_numvfs_on_the_live_tree(live_sysfs_factory, tmp_path):
    """Enabling VFs through ``sriov_numvfs`` (SimKernel's rules) makes
    the tree ``write_sysfs`` writes for that state, with an ``add``
    uevent per VF; disabling takes them away again."""
    live = live_sysfs_factory('a100')
    off = '0000:c1:00.0'
    before = snapshot(live.root)
    assert write_errno(live, live.sysfs.pci_dir(off) + '/sriov_numvfs',
                       '17') == errno.ERANGE
    live.sysfs.set_sriov_numvfs(off, 16)
    vfs = _vfs_of(live, off)
    assert len(vfs) == 16 and live.sysfs.sriov_numvfs(off) == 16
    data = _bundled('a100')
    _device_entry(data, off)['sriov_numvfs'] = 16
    assert snapshot(live.root) == _static(tmp_path, 'a100', data, 'vfs')
    adds = [e['DEVPATH'].rsplit('/', 1)[1] for e in live.sent()
            if e['ACTION'] == 'add' and e['SUBSYSTEM'] == 'pci']
    assert adds[-16:] == vfs
    u = new_uuid()
    live.sysfs.write(live.type_path(vfs[3], 'nvidia-472', 'create'), u)
    assert write_errno(live, live.sysfs.pci_dir(off) + '/sriov_numvfs',
                       '0') == errno.EBUSY          # a VF holds a vGPU
    live.sysfs.write(live.sysfs.mdev_dir(u) + '/remove', '1')
    live.sysfs.set_sriov_numvfs(off, 0)
    assert live.sysfs.virtfns(off) == ()
    assert snapshot(live.root) == before
