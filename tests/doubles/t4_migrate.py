"""The destination's ``migrate`` hook on the simulated T4 host
(``t4_hook.Env``): one ``migrate begin -`` (``migrate``), the domain XML
libvirt hands it from a source (``incoming_xml``: an mdev vGPU;
``_vf_xml``: a VF on the source), and a reservation whose migrate hook
has exited (``_holder_gone``)."""

import io

from libvirt_gpu.guests import hook
from libvirt_gpu.store import state
from tests.doubles import t4_hook as th

DOM = th.DOM
SOURCE_GPU = '0000:65:00.0'          # the source host's GPU: not here
SOURCE_VF = '0000:65:00.5'
GONE_PID = 2 ** 22 + 7               # above pid_max's default


def migrate(env, xml):
    """The hook's ``migrate begin -``: ``(rc, stdout bytes, stderr)``."""
    out, err = io.BytesIO(), io.StringIO()
    rc = hook.run(['qemu', 'vm1', 'migrate', 'begin', '-'], xml,
                  config_file=env.config, settings_file=env.settings_file,
                  sysfs=env.sysfs, stderr=err, mdevctl_dir=env.mdevctl_dir,
                  stdout=out)
    return rc, out.getvalue(), err.getvalue()


def incoming_xml(uuid, parent=SOURCE_GPU, pgpu=''):
    """What libvirt hands the destination's hook: nova's metadata, a
    comment, odd spacing and quotes around ours, one mdev hostdev with a
    guest-side address."""
    return (
        "<domain type='kvm' id='3'>\n  <name>vm1</name><uuid>%s</uuid>\n"
        "  <metadata>\n    <nova:instance xmlns:nova='http://openstack.org/"
        "xmlns/libvirt/nova/1.1'><nova:name>a &amp; b</nova:name>"
        "<nova:flavor name=\"vgpu\"/></nova:instance>\n"
        "    <!-- ours below -->\n"
        "    <g:gpus xmlns:g='urn:libvirt-gpu:1'><g:vgpu  uuid='%s' "
        "type=\"nvidia-223\"%s />%s</g:gpus>\n  </metadata>\n"
        "  <memory unit='KiB'>65536</memory>\n"
        "  <devices>\n    <hostdev mode='subsystem' type='mdev' "
        "managed='no' model='vfio-pci' display='off'>\n      <source>"
        "<address  uuid='%s' /></source>\n      <address type='pci' "
        "domain='0x0000' bus='0x00' slot='0x05' function='0x0'/>\n"
        "    </hostdev>\n  </devices>\n</domain>\n"
        % (DOM, uuid, " parent='%s'" % parent if parent else '', pgpu,
           uuid)).encode()


def _vf_xml(uuid):
    """A domain whose vGPU is a VF on the source (NVIDIA's vendor
    interface): a PCI hostdev at the entry's parent."""
    return (
        "<domain type='kvm'><name>vm1</name><uuid>%s</uuid><metadata>"
        "<g:gpus xmlns:g='urn:libvirt-gpu:1'><g:vgpu uuid='%s' "
        "type='nvidia-223' parent='%s'/></g:gpus></metadata>"
        "<memory unit='KiB'>65536</memory><devices>"
        "<hostdev mode='subsystem' type='pci' managed='no'><source>"
        "<address domain='0x0000' bus='0x65' slot='0x00' function='0x5'/>"
        "</source></hostdev></devices></domain>" % (DOM, uuid, SOURCE_VF)
    ).encode()


def _holder_gone(env, uuid, expires_at=None):
    with state.LeaseStore(env.state_dir).transaction() as txn:
        txn._db.execute('UPDATE leases SET pid = ?, pid_start = NULL, '
                        'updated_at = updated_at - 1 WHERE mdev_uuid = ?',
                        (GONE_PID, uuid))
        if expires_at is not None:
            txn._db.execute('UPDATE leases SET expires_at = ? WHERE '
                            'mdev_uuid = ?', (expires_at, uuid))
