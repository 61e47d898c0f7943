"""Guests starting with their vGPUs through the installed qemu hook, and
what the real kernel does when qemu holds an mdev or a process is killed.

The hook is the one ``libvirt-gpu hook install`` put into the VM's
/etc/libvirt/hooks/qemu.d; these guests have no OS (qemu sits in the
firmware), which is all a start, a destroy and a crash need.
"""

import json
import re
import threading
import time
import uuid as uuidlib

import pytest

from tests.kernel import lab as lab_mod
from tests.kernel import product

A, B = lab_mod.GPUS


def new_uuid():
    return str(uuidlib.uuid4())


def sysfsdevs(cmdline):
    """The sysfsdev of each -device: libvirt 9 writes them as JSON
    (``{"driver":"vfio-pci","sysfsdev":"/sys/bus/mdev/devices/<uuid>"}``),
    older libvirt as ``vfio-pci,sysfsdev=...``."""
    return sorted(m.group(1) for a in cmdline
                  for m in re.finditer(r'sysfsdev(?:=|":")([^",]+)', a))


@pytest.fixture
def guest(lab):
    """Define guests from XML; destroyed and undefined after the test."""
    names = []

    def make(name, vgpus):
        lab.define(lab_mod.guest_xml(name, vgpus))
        names.append(name)
        return name
    yield make
    for name in names:
        lab.destroy(name)
        lab.undefine(name)


def test_guest_with_two_vgpus_in_its_metadata_starts_and_releases(lab, guest):
    u1, u2 = new_uuid(), new_uuid()
    name = guest('two', [(u1, 'nvidia-223', A), (u2, 'nvidia-223', None)])
    assert lab.mdevs() == {}
    t0 = time.monotonic()
    lab.start(name).check('starting %s' % name)
    from tests.kernel import conftest
    conftest.record('guest start (2 vGPUs)', time.monotonic() - t0)
    # only the hook created them, in the real kernel; qemu opened both
    mdevs = lab.mdevs()
    assert set(mdevs) == {u1, u2}
    assert mdevs[u1] == (A, 'nvidia-223')
    assert mdevs[u2][1] == 'nvidia-223' and mdevs[u2][0] in (A, B)
    assert sysfsdevs(lab.qemu_cmdline(name)) == sorted(
        '/sys/bus/mdev/devices/%s' % u for u in (u1, u2))
    listed = product.cli_json(lab.vm, 'domgpus', name)
    assert sorted(v['uuid'] for v in listed['vgpus']) == sorted([u1, u2])
    lab.destroy(name).check('destroying %s' % name)
    assert lab.wait(lambda: lab.mdevs() == {}, 30), lab.mdevs()
    assert lab.available(A, 'nvidia-223') == 8
    assert lab.available(B, 'nvidia-223') == 8


def test_start_refused_when_a_vgpu_cannot_be_made_leaves_nothing(lab, guest):
    # nvidia-231 on A first: then A cannot take nvidia-223
    blocker = new_uuid()
    assert product.mdev(lab.vm, 'create', blocker, A, 'nvidia-231',
                        libvirt=False) == {'result': True}
    try:
        u1, u2 = new_uuid(), new_uuid()
        name = guest('refused', [(u1, 'nvidia-223', B),
                                 (u2, 'nvidia-223', A)])
        r = lab.start(name)
        assert r.rc != 0
        assert 'nvidia-223' in r.stderr or 'capacity' in r.stderr, r.stderr
        assert not lab.is_running(name)
        assert set(lab.mdevs()) == {blocker}
    finally:
        product.mdev(lab.vm, 'remove', blocker, libvirt=False)
    assert lab.mdevs() == {}


def _blocked_in_vfio(lab):
    """True when a process of ours sits in the kernel waiting for VFIO to
    release a device (its kernel stack shows vfio_unregister_group_dev)."""
    r = lab.vm.sh('for p in $(pgrep -f MdevBackend); do '
                  'cat /proc/$p/task/*/stack; done 2>/dev/null')
    return 'vfio_unregister_group_dev' in r.stdout


def test_kernel_blocks_a_remove_while_qemu_holds_the_mdev(lab, guest):
    u = new_uuid()
    name = guest('held', [(u, 'nvidia-223', A)])
    lab.start(name).check()
    assert u in lab.mdevs()
    # The product's remove while qemu has the VFIO device open: the
    # kernel does not answer EBUSY, its remove waits for qemu to let go
    # (no request callback in the driver), so the product's write blocks.
    result = {}
    t0 = time.monotonic()
    remover = threading.Thread(target=lambda: result.update(
        r=product.mdev(lab.vm, 'remove', u, libvirt=False)))
    remover.start()
    assert lab.wait(lambda: _blocked_in_vfio(lab), 120)
    # Meanwhile the kernel has already taken the mdev off the bus
    # (device_del unlinks /sys/bus/mdev/devices/<uuid> before the driver's
    # remove waits), but its capacity is not back: qemu still holds it.
    assert u not in lab.mdevs()
    assert lab.available(A, 'nvidia-223') == 7
    assert lab.is_running(name)
    assert 'r' not in result
    # it completes once qemu exits
    lab.destroy(name).check()
    remover.join(300)
    assert result.get('r') == {'result': True}, result
    assert u not in lab.mdevs()
    from tests.kernel import conftest
    conftest.OBSERVED['remove while qemu holds it'] = (
        'the write blocked %.0f s, until qemu exited (no EBUSY)'
        % (time.monotonic() - t0))
    assert lab.available(A, 'nvidia-223') == 8


def _kill_when(lab, pattern, sig='KILL'):
    """Kill (in the VM, in the background) the first process whose command
    line matches ``pattern`` as soon as it shows up."""
    lab.vm.run(['sh', '-c', 'setsid -f sh -c \'for i in $(seq 1 600); do '
                'p=$(pgrep -f -n "%s") && { kill -%s $p; exit 0; }; '
                'sleep 0.05; done\' >/dev/null 2>&1' % (pattern, sig)])


def _reconcile(lab):
    r = product.cli(lab.vm, 'reconcile', '--json')
    assert r.rc in (0, 3), r
    return json.loads(r.stdout)


def test_qemu_killed_then_reconcile_leaves_nothing(lab, guest):
    u1, u2 = new_uuid(), new_uuid()
    name = guest('crash-qemu', [(u1, 'nvidia-223', A),
                                (u2, 'nvidia-223', B)])
    lab.start(name).check()
    pid = lab.qemu_pid(name)
    assert pid
    lab.vm.run(['kill', '-KILL', str(pid)]).check()
    assert lab.wait(lambda: not lab.is_running(name), 60)
    # libvirt ran the release hook for the dead qemu: gone already, or
    # reconcile removes them
    _reconcile(lab)
    assert lab.mdevs() == {}
    assert lab.available(A, 'nvidia-223') == 8
    assert lab.available(B, 'nvidia-223') == 8
    again = _reconcile(lab)
    assert not [a for a in again.get('actions', []) if a.get('done')], again


def test_hook_killed_during_prepare_then_reconcile_leaves_nothing(lab, guest):
    u1, u2 = new_uuid(), new_uuid()
    name = guest('crash-hook', [(u1, 'nvidia-223', A),
                                (u2, 'nvidia-223', B)])
    product.hook_install_crashing(lab.vm)
    try:
        for step in ('prepare:reserved', 'prepare:created',
                     'prepare:marked'):
            product.crash_at(lab.vm, step)
            r = lab.start(name)
            assert r.rc != 0, 'started although its hook was killed (%s)' \
                % step
            assert not lab.is_running(name)
            report = _reconcile(lab)
            assert lab.mdevs() == {}, (step, report)
            assert lab.available(A, 'nvidia-223') == 8, step
            assert lab.available(B, 'nvidia-223') == 8, step
    finally:
        product.crash_at(lab.vm, None)
        product.hook_install(lab.vm)
    # and the guest starts normally afterwards
    lab.start(name).check()
    assert set(lab.mdevs()) == {u1, u2}
    lab.destroy(name).check()
    assert lab.wait(lambda: lab.mdevs() == {}, 30)


def test_hook_killed_during_release_then_reconcile_leaves_nothing(lab, guest):
    u = new_uuid()
    name = guest('crash-release', [(u, 'nvidia-223', A)])
    lab.start(name).check()
    _kill_when(lab, 'qemu.d/libvirt-gpu crash-release release')
    lab.destroy(name).check()
    assert not lab.is_running(name)
    _reconcile(lab)
    assert lab.mdevs() == {}
    assert lab.available(A, 'nvidia-223') == 8
