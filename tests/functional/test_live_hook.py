"""Our qemu hook, run by a real libvirtd, on the live simulated host.

The lifecycle tests (test_lifecycle.py) emulate the kernel with an inotify
watcher; here the kernel is the FUSE simulator: the hook's ``create`` and
``remove`` writes get the kernel's answers (capacity, a parent going away),
and libvirtd itself sees the same tree as /sys.  The host has no VFIO, so a
guest with a vGPU runs ``prepare``, fails to start ("Mediated host device
assignment requires VFIO support"), then runs ``stopped`` and ``release``.
"""

import uuid as uuidlib

import pytest

from tests.functional import hook_guests as hg
from tests.functional import live_sysfs as ls

A = '0000:3b:00.0'
B = '0000:af:00.0'
PRE = ['4b20d080-1b54-4048-85b3-a6a62d165c01',
       'b1ae8bf6-38b0-4c81-9d44-78ce3f520496']
VFIO_ERROR = 'Mediated host device assignment requires VFIO support'

missing = ls.live_host_requirements()
pytestmark = pytest.mark.skipif(bool(missing), reason='; '.join(missing))


@pytest.fixture(scope='module')
def host(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp('live-hook'))
    setup = hg.HookSetup(workdir, 'nvidia-223')
    with ls.LiveHost(workdir, hooks=setup.hooks) as h:
        h.setup = setup
        yield h


@pytest.fixture(autouse=True)
def restored(host):
    yield
    live = host.live
    for address, st in live.state()['parents'].items():
        if st == 'unbound':
            live.sysfs.write(live.path('bus', 'pci', 'drivers', 'nvidia',
                                       'bind'), address)
    for m in live.state()['mdevs']:
        if m['uuid'] not in PRE:
            live.sysfs.write(live.path('bus', 'mdev', 'devices', m['uuid'],
                                       'remove'), '1')
    for u in PRE:
        if u not in kernel_mdevs(host):
            live.sysfs.write(live.type_path(B, 'nvidia-223', 'create'), u)


def new_uuid():
    return str(uuidlib.uuid4())


def kernel_mdevs(host):
    return sorted(m['uuid'] for m in host.live.state()['mdevs'])


def events_of(host, u):
    return [(e['ACTION'], e['MDEV_TYPE']) for e in host.live.sent()
            if e['DEVPATH'].endswith('/' + u)]


def test_vgpu_created_at_prepare_removed_at_release(host):
    import libvirt
    u = new_uuid()
    code, message = hg.start(host, 'vgpu1', [(u, 'nvidia-223', None)])
    assert code == libvirt.VIR_ERR_CONFIG_UNSUPPORTED
    assert VFIO_ERROR in message
    # the simulated kernel made it at prepare, on the GPU with most room,
    # and removed it at release
    assert ls.wait_for(lambda: len(events_of(host, u)) == 2)
    assert events_of(host, u) == [('add', 'nvidia-223'),
                                  ('remove', 'nvidia-223')]
    adds = [e for e in host.live.sent() if e['DEVPATH'].endswith(u)]
    assert '/0000:3b:00.0/' in adds[0]['DEVPATH']
    assert kernel_mdevs(host) == PRE
    assert hg.leases(host) == []
    log = hg.hook_log(host)
    assert log.index('created vGPU %s' % u) < log.index('removed vGPU %s'
                                                        % u)


def test_start_refused_when_the_gpus_are_full(host):
    import libvirt
    live = host.live
    for address, free in ((A, 8), (B, 6)):
        for _ in range(free):
            live.sysfs.write(live.type_path(address, 'nvidia-223',
                                            'create'), new_uuid())
    full = kernel_mdevs(host)
    assert len(full) == 16
    u = new_uuid()
    code, message = hg.start(host, 'full', [(u, 'nvidia-223', None)])
    assert code == libvirt.VIR_ERR_HOOK_SCRIPT_FAILED
    assert 'libvirt-gpu: cannot start domain' in message
    assert 'No capacity left for vGPU type nvidia-223' in message
    assert kernel_mdevs(host) == full
    assert events_of(host, u) == []
    assert hg.leases(host) == []


def test_start_refused_when_its_gpu_went_away(host):
    import libvirt
    live = host.live
    live.sysfs.write(live.path('bus', 'pci', 'drivers', 'nvidia', 'unbind'),
                     B)
    u = new_uuid()
    code, message = hg.start(host, 'orphan', [(u, 'nvidia-223', B)])
    assert code == libvirt.VIR_ERR_HOOK_SCRIPT_FAILED
    assert B in message
    assert 'is not an mdev parent' in message
    assert u not in kernel_mdevs(host)
    assert hg.leases(host) == []
