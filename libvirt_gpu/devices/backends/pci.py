"""Whole GPUs by PCI passthrough (``<hostdev type='pci' managed='yes'>``).

With ``managed='yes'`` libvirt itself unbinds the GPU from its host driver
and binds it to vfio-pci when the guest starts, and gives it back when the
guest stops, so there is nothing to create or remove.  What this backend
adds is the check libvirt cannot make: the device is a GPU of this host
(PCI class 0x03xxxx, read from ``bus/pci/devices/<address>/class``) and
holds no vGPUs (``bus/mdev/devices/*`` whose parent it is) - passing
through a GPU that slices vGPUs for other guests would take theirs away.

VFIO hands a guest a whole IOMMU group or nothing, so the GPU must have a
group, and no other member of it may be a device the host uses (a NIC, a
disk controller): ``capacity.pgpu_refusal`` says why not.  The other
functions of the GPU's own device in that group (its HDMI audio ``.1``)
are its companions: they go to the guest with it (``companions``).

A GPU carved for OpenStack Nova (its PF and VFs in the record
``store.carved.CarveRecord`` of the state directory) is Nova's: never
passed through whole.
"""

from __future__ import annotations

from libvirt_gpu.devices.backends import base
from libvirt_gpu.devices import capacity
from libvirt_gpu.virt import config_xml
from libvirt_gpu import exception
from libvirt_gpu import objects

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from libvirt_gpu.devices.sysfs import Sysfs

GPU_CLASS_PREFIX = objects.GPU_CLASS_PREFIX


class PciBackend(base.DeviceBackend[base.PgpuDevice]):

    kind = 'pci'

    def __init__(self, sysfs: Sysfs, state_dir: str | None = None,
                 foreign: Mapping[objects.PciAddress, str] | None = None
                 ) -> None:
        self.sysfs = sysfs
        self.state_dir = state_dir
        # {physical GPU: label} of the GPUs another route owns
        # (``routes.Routes.foreign``)
        self.foreign = dict(foreign or {})

    def _carved(self) -> frozenset[objects.PciAddress]:
        """The PFs and VFs carved for Nova (read when asked: a start of
        another guest may have carved meanwhile)."""
        if self.state_dir is None:
            return frozenset()
        from libvirt_gpu.devices.backends import registry
        from libvirt_gpu.devices import carving
        carved = carving.on_host(self.state_dir, self.sysfs,
                                 registry.kind_classes())
        return carved.held_gpus | carved.vfs

    def hostdev_xml(self, device: base.PgpuDevice) -> str:
        return config_xml.pci_hostdev(device.address)

    def check(self, device: base.PgpuDevice) -> objects.Gpu:
        """Raise DeviceNotFound or GpuInUse unless ``device`` can be passed
        through whole; return the GPU (``objects.Gpu``) with its IOMMU
        group's members judged."""
        address = device.address
        if address in self._carved():
            raise exception.GpuInUse(
                address=address, reason='it is carved for Nova '
                '([nova]/carved): its VFs go to Nova\'s instances only')
        if address in self.foreign:
            raise exception.GpuInUse(
                address=address, reason='it is %s, not offered to '
                'libvirt-gpu\'s own guests' % self.foreign[address])
        class_code = self.sysfs.read(
            self.sysfs.pci_dir(address) + '/class', optional=True)
        if not objects.is_gpu_class(class_code):
            raise exception.DeviceNotFound(address=address)
        mdevs = self.sysfs.mdevs_by_parent().get(address, ())
        if mdevs:
            raise exception.GpuInUse(
                address=address,
                reason='it holds %d vGPU(s) (%s); a GPU that is sliced into '
                       'vGPUs cannot also be passed through whole'
                       % (len(mdevs), ', '.join(m.uuid for m in mdevs)))
        gpu = self._read_gpu(address)
        refusal = capacity.pgpu_refusal(gpu)
        if refusal is not None:
            raise exception.GpuInUse(address=address, reason=refusal)
        return gpu

    def _read_gpu(self, address: objects.PciAddress) -> objects.Gpu:
        from libvirt_gpu.devices import (  # not on the vGPU hook path
            discovery)
        gpu: objects.Gpu = self.sysfs.read_gpu(address)
        if gpu.iommu_group is None:
            return gpu
        return discovery.with_iommu_members(gpu, [
            self.sysfs.pci_function(a)
            for a in self.sysfs.iommu_group_addresses(gpu.iommu_group)])

    def companions(self, device: base.PgpuDevice) -> tuple[Any, ...]:
        """The functions that go to the guest with the GPU ``device`` (see
        the module doc); raises what ``check`` raises."""
        return capacity.pgpu_companions(self.check(device))

    def exists(self, device: base.PgpuDevice) -> bool:
        try:
            self.check(device)
        except (exception.DeviceNotFound, exception.GpuInUse):
            return False
        return True

    def prepare(self, device: base.PgpuDevice) -> bool:
        self.check(device)
        return False    # libvirt (managed='yes') does the binding

    def release(self, device: base.PgpuDevice) -> bool:
        return False    # libvirt gives the GPU back to its driver
