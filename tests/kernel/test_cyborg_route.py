"""A Cyborg-bound vGPU on the real kernel, from the bind to the next bind.

GPU B (0000:00:06.0) is given to Cyborg by ``[routes]/cyborg`` in the
product's configuration.  Cyborg's agent makes the vGPU of a bound ARQ by
writing the handle's UUID to the type's ``create`` (not persistent);
Nova 34's spawn puts the hostdev it writes for an ``MDEV`` ARQ into the
guest; our hook, ``reconcile`` and ``restore`` must leave the vGPU alone
while an instance may come, and clean up Nova's persistent definition of it
once the ARQ is gone.  The "reboot" is a real power-off (as
test_reboot.py): conftest runs this module after the others, with
test_reboot.
"""

import json
import time
import uuid as uuidlib

import pytest

from libvirt_gpu.guests import reconcile as reconcile_mod
from libvirt_gpu.host import restore as restore_mod
from tests.kernel import conftest
from tests.kernel import lab as lab_mod
from tests.kernel import product

A, B = lab_mod.GPUS
TYPE = 'nvidia-223'
INSTANCE = 'instance-0000002a'
HOOK_LOG = product.STATE_DIR + '/hook.log'

# The hostdev Nova 34 writes for the UUID of an MDEV ARQ
# (LibvirtDriver._allocate_cyborg_mdevs -> _get_guest_xml): printed by
# .venv-nova's nova.virt.libvirt.config.LibvirtConfigGuestHostdevMDEV
# (uuid set) .to_xml(), nova 34.0.0.
NOVA_HOSTDEV = '''<hostdev mode="subsystem" type="mdev" managed="no" \
model="vfio-pci">
  <source>
    <address uuid="%s"/>
  </source>
</hostdev>'''

# The node device Nova 34 defines for a vGPU it finds missing at spawn
# (LibvirtDriver._create_mdev: nodeDeviceCreateXML, nodeDeviceDefineXML,
# then setAutostart(True)): .venv-nova's
# nova.virt.libvirt.config.LibvirtConfigNodeDevice .to_xml().
NOVA_NODEDEV = '''<device>
  <parent>pci_0000_00_06_0</parent>
  <capability type="mdev">
    <type id="%s"/>
    <uuid>%s</uuid>
  </capability>
</device>'''


def nova_guest_xml(uuid):
    """An instance's domain as Nova names it, with Nova's metadata (not
    ours) and Nova's hostdev for the vGPU; qemu sits in the firmware."""
    return '''<domain type='qemu'>
  <name>%s</name>
  <memory unit='MiB'>96</memory>
  <vcpu>1</vcpu>
  <metadata><nova:instance xmlns:nova="http://openstack.org/xmlns/libvirt/\
nova/1.1"><nova:name>cyborg-vm</nova:name></nova:instance></metadata>
  <os><type arch='x86_64' machine='pc'>hvm</type></os>
  <features><acpi/></features>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    %s
    <video><model type='none'/></video>
    <memballoon model='none'/>
  </devices>
</domain>''' % (INSTANCE, NOVA_HOSTDEV % uuid)


def nodedev_name(uuid):
    """libvirt's name of the mdev, as Nova computes it
    (libvirt_utils.mdev_uuid2name and the parent's address)."""
    return 'mdev_%s_0000_00_06_0' % uuid.replace('-', '_')


def cyborg_create(lab, uuid):
    """What Cyborg's agent does for a bound ARQ: the handle's UUID to the
    type's create."""
    return lab.vm.run(['sh', '-c', 'echo "$1" > "$2"', 'sh', uuid,
                       '/sys/class/mdev_bus/%s/mdev_supported_types/%s/'
                       'create' % (B, TYPE)])


def cyborg_unbind(lab, uuid):
    """What Cyborg's unbind does: the live device's remove, nothing
    else."""
    return lab.vm.run(['sh', '-c', 'echo 1 > "$1"', 'sh',
                       '/sys/bus/mdev/devices/%s/remove' % uuid])


def definition_file(uuid):
    return '/etc/mdevctl.d/%s/%s' % (B, uuid)


def findings_of(report, uuid):
    return [f for f in report['findings'] if f['uuid'] == uuid]


def actions_on(report, uuid):
    return [a for a in report['actions'] if a['target'] == uuid]


def leased(lab, uuid):
    return [lease for lease in product.leases(lab.vm)
            if lease['uuid'] == uuid]


def reconcile(lab):
    r = product.cli(lab.vm, 'reconcile', '--json')
    assert r.rc == 0, r
    return json.loads(r.stdout)


def cyborg_config():
    return product.config(cyborg=(B,))


@pytest.fixture
def cyborg_host(lab):
    """GPU B is Cyborg's for this test; afterwards the session's own
    configuration again, and nothing of the test's left on the host."""
    lab.vm.write_file(product.CONFIG, cyborg_config())
    made = []
    yield made
    lab.vm.write_file(product.CONFIG, product.config())
    for uuid in made:
        if uuid in lab.mdevs():
            cyborg_unbind(lab, uuid)
        lab.vm.run(['mdevctl', 'undefine', '-u', uuid])
    lab.destroy(INSTANCE)
    lab.undefine(INSTANCE)


def test_cyborg_vgpu_from_bind_to_the_next_bind_of_its_handle(
        lab, cyborg_host):
    u = str(uuidlib.uuid4())
    cyborg_host.append(u)

    # -- the ARQ is bound: Cyborg's agent makes the vGPU
    cyborg_create(lab, u).check('writing the handle to create')
    assert lab.mdevs() == {u: (B, TYPE)}

    # -- reconcile between the bind and Nova's spawn keeps it
    report = reconcile(lab)
    kept = findings_of(report, u)
    assert [(f['action'], f['what']) for f in kept] == [
        (reconcile_mod.KEPT, 'mdev')], report
    assert 'Cyborg' in kept[0]['reason'], kept
    assert lab.mdevs() == {u: (B, TYPE)}

    # -- Nova's spawn: the guest with Nova's hostdev starts with the vGPU
    lab.define(nova_guest_xml(u))
    t0 = time.monotonic()
    lab.start(INSTANCE).check('starting the instance')
    conftest.record('Cyborg vGPU guest start', time.monotonic() - t0)
    assert lab.is_running(INSTANCE)
    assert ('/sys/bus/mdev/devices/%s' % u) in ' '.join(
        lab.qemu_cmdline(INSTANCE))
    # the hook was called and left it to libvirt: no lease, nothing made
    hook_lines = [line for line in lab.vm.read(HOOK_LOG).splitlines()
                  if u in line]
    assert hook_lines and all('left to libvirt' in line
                              for line in hook_lines), hook_lines
    assert not leased(lab, u)
    assert lab.mdevs() == {u: (B, TYPE)}
    # the instance stops; the vGPU stays (Cyborg's, until the unbind)
    lab.destroy(INSTANCE).check('stopping the instance')
    assert not lab.is_running(INSTANCE)
    assert lab.mdevs() == {u: (B, TYPE)}
    assert not leased(lab, u)

    # -- Nova's definition of it (as when Nova found it missing at spawn)
    lab.vm.run(['virsh', '-c', lab_mod.URI, 'nodedev-define', '/dev/stdin'],
               input=NOVA_NODEDEV % (TYPE, u)).check('nodedev-define')
    lab.virsh('nodedev-autostart', nodedev_name(u)).check(
        'nodedev-autostart')
    assert json.loads(lab.vm.read(definition_file(u)))['start'] == 'auto'

    # -- the instance is deleted: Nova undefines it; reconcile in the
    # window before Cyborg's unbind keeps the live, defined vGPU
    lab.undefine(INSTANCE).check('undefining the instance')
    report = reconcile(lab)
    kept = findings_of(report, u)
    assert [(f['action'], f['what']) for f in kept] == [
        (reconcile_mod.KEPT, 'mdev+definition')], report
    assert lab.mdevs() == {u: (B, TYPE)}
    assert lab.exists(definition_file(u))

    # -- the ARQ is deleted: Cyborg's unbind removes the live device only
    cyborg_unbind(lab, u).check('writing remove')
    assert u not in lab.mdevs()
    assert lab.exists(definition_file(u)), "Nova's definition went too"

    # -- the host reboots: restore --no-libvirt (before libvirtd), then
    # libvirtd, then restore with libvirt (before nova-compute)
    t0 = time.monotonic()
    lab.stop_libvirtd()
    lab.vm.poweroff()
    conftest.record('Cyborg reboot: boot', lab.vm.boot())
    # the VM's /etc/libvirt-gpu and the hook are not on its disk
    lab.vm.write_file(product.CONFIG, cyborg_config())
    product.hook_install(lab.vm)
    assert lab.exists(definition_file(u)), 'the definition did not ' \
        'survive the power-off'
    early = product.cli_json(lab.vm, 'restore', '--no-libvirt')
    # never started by us: the definition is Nova's
    assert [a['action'] for a in actions_on(early, u)] == [
        restore_mod.SKIPPED], early
    assert u not in lab.mdevs()
    conftest.record('Cyborg reboot: libvirtd ready', lab.start_libvirtd())
    conftest.OBSERVED['Nova\'s autostart definition after a boot, '
                      'libvirtd up'] = (
        'started by libvirt' if u in lab.mdevs() else 'not started')
    # On a host, mdevctl's udev rule (masked in the VM) starts a GPU's
    # autostart definitions when the GPU registers at boot: what it runs.
    lab.vm.run(['mdevctl', 'start-parent-mdevs', B]).check(
        'mdevctl start-parent-mdevs')
    assert lab.mdevs().get(u) == (B, TYPE)
    late = product.cli_json(lab.vm, 'restore')
    done = [a['action'] for a in actions_on(late, u)]
    assert restore_mod.UNDEFINED in done, late
    assert restore_mod.CREATED not in done, late
    conftest.record('Cyborg reboot: total', time.monotonic() - t0)
    assert u not in lab.mdevs()
    assert not lab.exists(definition_file(u))
    # libvirt follows mdevctl's files (inotify): it forgets it too
    assert lab.wait(lambda: lab.virsh(
        'nodedev-info', nodedev_name(u)).rc != 0, 60)

    # -- the next bind of the same handle finds its UUID free
    cyborg_create(lab, u).check('writing the same handle to create again')
    assert lab.mdevs().get(u) == (B, TYPE)
    cyborg_unbind(lab, u).check('writing remove')
    assert u not in lab.mdevs()
