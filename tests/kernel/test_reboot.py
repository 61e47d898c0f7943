"""Reboot persistence for real: define vGPUs, power the VM off, boot it
again (same disk: mdevctl's definitions, libvirt's domain configs and the
product's state_dir survive; the kernel's mdevs do not), run
``libvirt-gpu restore``.  Runs last (conftest orders it): it takes the
session VM down and up.

mdevctl's own udev rule (start-parent-mdevs when a parent appears) is
masked in the VM, so what comes back is restore's doing.
"""

import json
import time
import uuid as uuidlib

from tests.kernel import conftest
from tests.kernel import lab as lab_mod
from tests.kernel import product

A, B = lab_mod.GPUS


def test_restore_brings_back_defined_vgpus_after_a_reboot(lab):
    wanted = {str(uuidlib.uuid4()): (A, 'nvidia-223'),
              str(uuidlib.uuid4()): (A, 'nvidia-223'),
              str(uuidlib.uuid4()): (B, 'nvidia-231')}
    # defined, then started now, through the product (they exist until the
    # power-off)
    calls = [product.mdev_call(op, uuid, parent, type_id, start='auto')
             for op in ('define', 'create')
             for uuid, (parent, type_id) in wanted.items()]
    assert product.mdevs(lab.vm, calls) == [{'result': True}] * 6
    assert lab.mdevs() == wanted
    lab.define(lab_mod.guest_xml('keeper', [
        (u, t, p) for u, (p, t) in wanted.items()]))

    t0 = time.monotonic()
    lab.stop_libvirtd()
    lab.vm.poweroff()
    conftest.record('reboot: boot', lab.vm.boot())
    conftest.record('reboot: libvirtd ready', lab.start_libvirtd())
    conftest.record('reboot: total', time.monotonic() - t0)

    assert lab.mdevs() == {}, 'the kernel kept mdevs across a power-off?'
    # libvirt kept the guest's config; mdevctl its definitions
    assert 'keeper' in lab.virsh('list', '--all', '--name').stdout
    r = product.cli(lab.vm, 'restore', '--json')
    assert r.rc == 0, r
    first = json.loads(r.stdout)
    assert first['changed'] >= len(wanted), first
    assert lab.mdevs() == wanted
    r = product.cli(lab.vm, 'restore', '--json')
    assert r.rc == 0, r
    second = json.loads(r.stdout)
    assert second['changed'] == 0, second
    assert lab.mdevs() == wanted
    # the guest defined before the reboot starts with them
    lab.start('keeper').check('starting keeper after the reboot')
    assert set(lab.mdevs()) == set(wanted)
    lab.destroy('keeper').check()
