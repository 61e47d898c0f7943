"""The simulated L40S and A100 hosts of the vendor-interface tests, as
one world each (sysfs whose writes act like the driver, a config file, a
state dir and a fake libvirt), and the domain XML of a vGPU on a VF or an
mdev: shared by the kind's, the allocator's, the hook's and migration's
tests."""

import io
import os

from libvirt_gpu.host import allocator as allocator_mod
from libvirt_gpu import environment
from libvirt_gpu import conf as conf_mod
from libvirt_gpu.guests import hook
from libvirt_gpu import objects
from libvirt_gpu import simulator
from libvirt_gpu.store import state
from libvirt_gpu.devices.backends.nvidia_vgpu.files import (  # noqa: F401
    VendorFiles as vendor)
from tests.doubles import fake_libvirt
from tests.doubles import kernel_sysfs
from tests.doubles import layouts

T_NVIDIA_1145 = objects.TypeId.parse('nvidia-1145')
T_NVIDIA_472 = objects.TypeId.parse('nvidia-472')

DOM = objects.Uuid.parse('c7a5fdbd-cdaf-9455-926a-d65c16db1809')
L1 = objects.PciAddress.parse('0000:3d:00.0')     # 2 x L40S-1B not ours
L2 = objects.PciAddress.parse('0000:bd:00.0')     # empty
A = objects.PciAddress.parse('0000:41:00.0')      # A100, 1 x A100-20C


def new_uuid():
    return objects.Uuid.new()


class World(object):
    """A simulated host, its config file, state dir and a fake libvirt."""

    def __init__(self, name, tmp, types, addresses):
        self.root = os.path.join(tmp, 'sys')
        simulator.write_sysfs(simulator.load_profile(name), self.root)
        self.sysfs = kernel_sysfs.KernelSysfs(self.root, name)
        self.state_dir = os.path.join(tmp, 'state')
        self.config = os.path.join(tmp, 'libvirt-gpu.conf')
        with open(self.config, 'w') as f:
            f.write('[DEFAULT]\nsysfs_root = %s\nstate_dir = %s\n'
                    '[gpu]\nenabled_vgpu_types = %s\n[vgpu_%s]\n'
                    'device_addresses = %s\n' % (
                        self.root, self.state_dir, types, types,
                        addresses))
        self.conf = conf_mod.load(self.config)
        self.conn = fake_libvirt.FakeConnection(os.path.join(tmp, 'doms'))
        self.mdevctl = os.path.join(tmp, 'mdevctl.d')

    def backend(self):
        return environment.Environment(
            self.state_dir, sysfs=self.sysfs,
            mdevctl_dir=self.mdevctl).vgpus

    def allocator(self):
        from libvirt_gpu.devices import discovery
        from tests.doubles import kinds
        enabled = layouts.enabled(self.conf, discovery.from_sysfs(
            self.sysfs, kinds=kinds.registered()).gpus)
        return allocator_mod.Allocator(self.backend(),
                                       state.LeaseStore(self.state_dir),
                                       enabled)

    def hook(self, op, xml):
        err = io.StringIO()
        rc = hook.run(['qemu', 'vm1', op, 'begin', '-'], xml,
                      config_file=self.config, sysfs=self.sysfs, stderr=err,
                      mdevctl_dir=self.mdevctl)
        return rc, err.getvalue()

    def call(self, func, *args, **kwargs):
        return func(self.conn, *args, conf=self.conf, sysfs=self.sysfs,
                    **kwargs)

    def leases(self):
        return state.LeaseStore(self.state_dir).leases()


def vf_domain_xml(uuid, vf, type_id=T_NVIDIA_1145, dom=DOM):
    """A domain with one vendor-interface vGPU: metadata naming its VF and
    the VF as an unmanaged PCI hostdev."""
    pci = objects.PciAddress.parse(vf)
    return ((
        "<domain type='kvm'><name>vm1</name><uuid>%s</uuid><metadata>"
        "<gpu:gpus xmlns:gpu='urn:libvirt-gpu:1'><gpu:vgpu uuid='%s' "
        "type='%s' parent='%s'/></gpu:gpus></metadata>"
        "<memory unit='KiB'>65536</memory><devices>"
        "<hostdev mode='subsystem' type='pci' managed='no'><source>"
        "<address domain='0x%04x' bus='0x%02x' slot='0x%02x' "
        "function='0x%x'/></source></hostdev></devices></domain>")
        % (dom, uuid, type_id, vf, pci.domain, pci.bus, pci.slot,
           pci.function)).encode()


def mdev_domain_xml(uuid, dom=DOM, type_id=objects.TypeId.parse('nvidia-472')):
    return ((
        "<domain type='kvm'><name>vm</name><uuid>%s</uuid><metadata>"
        "<gpu:gpus xmlns:gpu='urn:libvirt-gpu:1'><gpu:vgpu uuid='%s' "
        "type='%s'/></gpu:gpus></metadata><memory unit='KiB'>65536</memory>"
        "<devices><hostdev mode='subsystem' type='mdev' managed='no' "
        "model='vfio-pci'><source><address uuid='%s'/></source></hostdev>"
        "</devices></domain>") % (dom, uuid, type_id, uuid)).encode()
