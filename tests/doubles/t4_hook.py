"""The simulated T4 host the hook tests run on (``Env``: its tree with
the kernel answering in-process, a configuration file, the hook's state
directory; the ``env`` fixture of tests/unit/conftest.py), and the domain
XML libvirt hands the hook (``domain_xml``)."""

import io
import os

from libvirt_gpu.guests import hook
from libvirt_gpu import objects
from libvirt_gpu.store import state
from tests.doubles import kernel_sysfs

DOM = objects.Uuid.parse('c7a5fdbd-cdaf-9455-926a-d65c16db1809')
A = '0000:3b:00.0'
B = '0000:af:00.0'
EXISTING = objects.Uuid.parse('4b20d080-1b54-4048-85b3-a6a62d165c01')


def new_uuid():
    return objects.Uuid.new()


def domain_xml(vgpus=(), pgpus=(), hostdevs=None, extra_meta='',
               uuid=DOM, name='vm1'):
    """Domain XML as libvirt hands it to the hook.  ``vgpus``: (uuid, type,
    parent or None); hostdevs default to one per vGPU."""
    entries = ''.join(
        '<gpu:vgpu uuid="%s" type="%s"%s/>' % (
            u, t, ' parent="%s"' % p if p else '') for u, t, p in vgpus)
    entries += ''.join('<gpu:pgpu address="%s"/>' % a for a in pgpus)
    meta = ('<metadata><gpu:gpus xmlns:gpu="urn:libvirt-gpu:1">%s</gpu:gpus>'
            '%s</metadata>' % (entries, extra_meta)
            if entries or extra_meta else '')
    if hostdevs is None:
        hostdevs = [u for u, _, _ in vgpus]
    # Written out by hand (not by config_xml, which validates): hostile
    # values must reach the hook.
    devices = ''.join(
        "<hostdev mode='subsystem' type='mdev' managed='no' model='vfio-pci'>"
        "<source><address uuid='%s'/></source></hostdev>" % u
        for u in hostdevs)
    for a in pgpus:
        dom, bus, rest = (a.split(':') + ['', ''])[:3]
        slot, _, fn = rest.partition('.')
        devices += ("<hostdev mode='subsystem' type='pci' managed='yes'>"
                    "<source><address domain='0x%s' bus='0x%s' slot='0x%s' "
                    "function='0x%s'/></source></hostdev>"
                    % (dom, bus, slot, fn))
    return ("<domain type='kvm'><name>%s</name><uuid>%s</uuid>%s"
            "<memory unit='KiB'>65536</memory><devices>%s</devices>"
            "</domain>" % (name, uuid, meta, devices)).encode()


class Env(object):
    """A simulated T4 host, a config file and the hook's state dir."""

    def __init__(self, root, profile, tmp_path, types='nvidia-223'):
        self.root = root
        self.sysfs = kernel_sysfs.KernelSysfs(root, profile)
        self.state_dir = str(tmp_path / 'state')
        self.mdevctl_dir = str(tmp_path / 'mdevctl.d')
        self.config = str(tmp_path / 'libvirt-gpu.conf')
        self.settings_file = os.path.join(self.state_dir, 'hook-'
                                          'settings.json')
        with open(self.config, 'w') as f:
            f.write('[DEFAULT]\nsysfs_root = %s\nstate_dir = %s\n'
                    '[gpu]\nenabled_vgpu_types = %s\n'
                    % (root, self.state_dir, types))

    def run(self, op, xml, settings=True):
        err = io.StringIO()
        rc = hook.run(['qemu', 'vm1', op, 'begin', '-'], xml,
                      config_file=self.config,
                      settings_file=self.settings_file if settings else None,
                      sysfs=self.sysfs, stderr=err,
                      mdevctl_dir=self.mdevctl_dir)
        return rc, err.getvalue()

    def mdevs(self):
        return sorted(self.sysfs.kernel.mdevs())

    def leases(self):
        return state.LeaseStore(self.state_dir).leases()

    def log(self):
        try:
            with open(os.path.join(self.state_dir, hook.LOG_NAME)) as f:
                return f.read()
        except FileNotFoundError:
            return ''
