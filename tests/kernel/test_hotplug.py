"""Hot-plug and unplug of vGPUs into a running guest OS, through the API and
the CLI, in the VM's real kernel (VFIO) and libvirt; and SIGKILL of a live
attach at each of its steps, then ``reconcile``.

The guest OS (conftest.os_guest: Debian's kernel + a busybox init that
prints its PCI devices on every change) answers the ACPI eject, so an
unplug completes.
"""

import json
import time

import pytest

from tests.kernel import conftest
from tests.kernel import lab as lab_mod
from tests.kernel import product

A, B = lab_mod.GPUS


@pytest.fixture(scope='module', autouse=True)
def _guest_os_off_afterwards(lab):
    """The guest OS rereads its PCI devices every second, which costs
    CPU that the migration tests want (a lot where it runs under TCG): off
    once these tests are done."""
    yield
    lab.destroy(conftest.OS_GUEST)


T4 = '0x10de:0x1eb8'


@pytest.fixture(autouse=True)
def _guest_os_gives_back_its_vgpus(lab):
    """A test that fails half-way leaves its vGPU in the guest; the next
    test would then fail on it, not on its own fault.  Every test asserts
    it left nothing, so this gives back only what a failure left."""
    yield
    if not lab.is_running(conftest.OS_GUEST):
        return
    left = hostdev_uuids(lab, conftest.OS_GUEST)
    for uuid in left:
        product.cli(lab.vm, 'detach', conftest.OS_GUEST, '--uuid', uuid,
                    '--live')
    if left:        # an mdev the guest never held is the test's to report
        lab.wait(lambda: lab.mdevs() == {}, 120)


def t4_slots(lab):
    return {slot for slot, ids in conftest.guest_pci(lab).items()
            if ids == T4}


def hostdev_uuids(lab, name):
    xml = lab.domain_xml(name)
    return {part.split("'")[1] for part in xml.split('<address uuid=')[1:]}


def not_seen(lab, name):
    """What a failure says: the guest's last PCI list and console lines,
    and the PCI devices QEMU has for it."""
    qemu = lab.virsh('qemu-monitor-command', name, '--hmp', 'info pci')
    return ('guest PCI: %s\nguest console:\n%s\nQEMU (info pci):\n%s'
            % (conftest.guest_pci(lab), conftest.guest_serial_tail(lab),
               qemu.stdout[-3000:] or qemu.stderr))


def _plug_unplug(lab, name, attach, detach, label):
    before = t4_slots(lab)
    assert before == set()
    t0 = time.monotonic()
    uuid = attach()
    conftest.record('hot-plug (%s)' % label, time.monotonic() - t0)
    assert uuid in lab.mdevs()
    assert uuid in hostdev_uuids(lab, name)
    seen = lab.wait(lambda: t4_slots(lab), timeout=300, interval=2)
    conftest.record('guest sees it (%s)' % label, time.monotonic() - t0)
    assert len(seen) == 1, not_seen(lab, name)
    t0 = time.monotonic()
    detach(uuid)
    conftest.record('unplug (%s)' % label, time.monotonic() - t0)
    assert lab.wait(lambda: not t4_slots(lab), timeout=300, interval=2), \
        not_seen(lab, name)
    assert uuid not in hostdev_uuids(lab, name)
    assert lab.wait(lambda: uuid not in lab.mdevs(), 60)
    assert lab.is_running(name)
    return uuid


def test_api_attach_and_detach_live(lab, os_guest):
    def attach():
        done = product.api(lab.vm, 'attach', os_guest,
                           vgpu_type='nvidia-223', live=True)
        assert 'error' not in done, done
        assert done['live'] is True and done['kind'] == 'vgpu'
        return done['uuid']

    def detach(uuid):
        done = product.api(lab.vm, 'detach', os_guest, uuid=uuid, live=True)
        assert 'error' not in done, done

    _plug_unplug(lab, os_guest, attach, detach, 'api')
    assert lab.available(A, 'nvidia-223') == 8
    assert lab.available(B, 'nvidia-223') == 8


def test_cli_attach_and_detach_live(lab, os_guest):
    def attach():
        r = product.cli(lab.vm, 'attach', os_guest, '--vgpu-type',
                        'nvidia-223', '--live', '--json')
        r.check('libvirt-gpu attach --live')
        return json.loads(r.stdout)['uuid']

    def detach(uuid):
        product.cli(lab.vm, 'detach', os_guest, '--uuid', uuid,
                    '--live').check('libvirt-gpu detach --live')

    _plug_unplug(lab, os_guest, attach, detach, 'cli')


def test_attach_killed_at_each_step_then_reconcile(lab, os_guest):
    for step in ('attach:reserved', 'attach:created', 'attach:marked',
                 'attach:attached'):
        r = product.python(
            lab.vm, 'import libvirt\nfrom libvirt_gpu.guests import api\n'
            'api.attach(libvirt.open("qemu:///system"), P["d"], '
            'vgpu_type="nvidia-223", live=True)\n', d=os_guest,
            env={product.CRASH_ENV: step})
        assert r.rc == -9, (step, r)
        rec = product.cli(lab.vm, 'reconcile', '--json')
        assert rec.rc in (0, 3), rec
        if step == 'attach:attached':
            # the guest holds it: reconcile keeps it; detach gives it back
            held = hostdev_uuids(lab, os_guest)
            assert len(held) == 1 and held <= set(lab.mdevs()), step
            product.cli(lab.vm, 'detach', os_guest, '--uuid', held.pop(),
                        '--live').check('detach after crash')
            assert lab.wait(lambda: lab.mdevs() == {}, 120)
        assert lab.mdevs() == {}, (step, rec.stdout)
        assert lab.available(A, 'nvidia-223') == 8, step
        assert lab.available(B, 'nvidia-223') == 8, step
