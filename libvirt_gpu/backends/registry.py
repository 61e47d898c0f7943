"""One vGPU backend for the callers: the device kind is a backend, not a
special case in the allocator, the hook, the API or reconcile.

``VgpuBackend`` has the interface of ``mdev.MdevBackend`` (``lookup``,
``exists``, ``prepare``, ``release``, ``remove``, ``is_parent``,
``check_type``, ``available``, ``hostdev_xml``, ``definition``, ``sysfs``)
and hands each call to the backend of the PCI function it is about:

* a VF with NVIDIA's vGPU 17+ vendor interface (``<VF>/nvidia/``):
  ``nvidia_vgpu.NvidiaVgpuBackend`` (``<hostdev type='pci' managed='no'>``
  of the VF);
* anything else (a T4, an Ampere VF that is an mdev parent):
  ``mdev.MdevBackend``.

A vGPU is found by UUID in the vendor state first (a cheap read of one
JSON file, absent on hosts that never used the vendor interface), then
among the mdevs.

SR-IOV GPUs are configured, reported and counted per physical GPU (the PF);
their vGPUs live on VFs, one each.  ``parents_of(gpu)`` lists the functions
vGPUs are made on; ``gpu_view`` reads one physical GPU with its VFs the way
discovery does, so that the allocator counts its capacity with the same
function Placement's inventory uses (``placement.model.vgpu_total``).
"""

import dataclasses

from libvirt_gpu.backends import mdev as mdev_backend
from libvirt_gpu.backends import nvidia_vgpu
from libvirt_gpu import objects


class VgpuBackend(object):
    """:param sysfs: the host's ``Sysfs``.
    :param state_dir: ``[DEFAULT]/state_dir`` (vendor-interface state).
    :param host: a ``host.Host`` for the mdev backend, or None (the hook).
    :param mdevctl_dir: where mdevctl keeps definitions.
    Other keyword arguments go to ``MdevBackend`` (timeouts).
    """

    kind = 'vgpu'

    def __init__(self, sysfs, state_dir, host=None,
                 mdevctl_dir=mdev_backend.MDEVCTL_DIR, mdev=None, **kwargs):
        self.sysfs = sysfs
        self.mdev = mdev or mdev_backend.MdevBackend(
            sysfs, host=host, mdevctl_dir=mdevctl_dir, **kwargs)
        self.vendor = nvidia_vgpu.NvidiaVgpuBackend(
            sysfs, state_dir,
            remove_timeout=kwargs.get('remove_timeout', 10.0),
            retry_stop=kwargs.get('retry_stop', 5.0))

    # -- which backend -----------------------------------------------------

    def is_vendor(self, address):
        """Whether ``address`` is a VF with the vendor interface."""
        return self.vendor.is_parent(objects.PciAddress.parse(address))

    def backend_for(self, parent):
        return self.vendor if self.is_vendor(parent) else self.mdev

    def _vendor_entry(self, uuid):
        return self.vendor.vgpus().get(objects.validate_uuid(uuid))

    # -- the DeviceBackend interface -----------------------------------------

    def hostdev_xml(self, device):
        return self.backend_for(device.parent).hostdev_xml(device)

    def exists(self, device):
        return self.backend_for(device.parent).exists(device)

    def prepare(self, device):
        return self.backend_for(device.parent).prepare(device)

    def release(self, device):
        return self.remove(device.uuid)

    def lookup(self, uuid):
        if self._vendor_entry(uuid) is not None:
            return self.vendor.lookup(uuid)
        return self.mdev.lookup(uuid)

    def remove(self, uuid):
        if self._vendor_entry(uuid) is not None:
            return self.vendor.remove(uuid)
        return self.mdev.remove(uuid)

    def is_parent(self, address):
        return self.mdev.is_parent(address) or self.is_vendor(address)

    def check_type(self, parent, type_id):
        return self.backend_for(parent).check_type(parent, type_id)

    def available(self, parent, type_id):
        return self.backend_for(parent).available(parent, type_id)

    def definition(self, uuid):
        """The mdevctl definition of ``uuid``, else our vendor-interface
        definition (a persistent state entry, which has the same fields
        that matter: uuid, parent, type_id, start), else None."""
        found = self.mdev.definition(uuid)
        if found is not None:
            return found
        entry = self._vendor_entry(uuid)
        if entry is not None and entry.persistent:
            return mdev_backend.MdevDefinition(
                uuid=entry.uuid, parent=entry.vf, type_id=entry.type_id,
                start=entry.start)
        return None

    def vendor_vgpus(self):
        """``{uuid: (VF, type_id)}`` of our vendor-interface vGPUs that
        exist now (what ``sysfs.mdevs_by_parent`` is for mdevs)."""
        found = {}
        for uuid, entry in self.vendor.vgpus().items():
            if self.vendor.lookup(uuid) is not None:
                found[uuid] = (entry.vf, entry.type_id)
        return found

    # -- physical GPUs -------------------------------------------------------

    def physical(self, address):
        """The physical GPU (PF) of a VF, else ``address`` itself."""
        address = objects.PciAddress.parse(address)
        return self.sysfs.physfn(address) or address

    def parents_of(self, gpu):
        """The PCI functions vGPUs of the physical GPU ``gpu`` are made on:
        its VFs when it has any, else the GPU itself."""
        gpu = objects.PciAddress.parse(gpu)
        return self.sysfs.virtfns(gpu) or (gpu,)

    def gpu_view(self, gpu, mdevs_by_parent=None):
        return gpu_view(self.sysfs, gpu, mdevs_by_parent)


def gpu_view(sysfs, gpu, mdevs_by_parent=None):
    """The ``objects.Gpu`` of the physical GPU ``gpu`` with its VFs
    (``vf_gpus``, vendor state and completed types), as discovery builds
    it, read from ``sysfs`` alone."""
    gpu = objects.PciAddress.parse(gpu)
    if mdevs_by_parent is None:
        mdevs_by_parent = sysfs.mdevs_by_parent()
    pf = sysfs.read_gpu(gpu, mdevs_by_parent=mdevs_by_parent)
    vfs = []
    for vf in sysfs.virtfns(gpu):
        record = sysfs.read_gpu(vf, mdevs_by_parent=mdevs_by_parent)
        if not record.mdev_types:
            state = sysfs.read_vendor_vf(vf)
            if state is not None:
                record = dataclasses.replace(record, vendor_vf=state)
        vfs.append(record)
    supported = ()
    if any(v.vendor_vf is not None for v in vfs):
        vfs = nvidia_vgpu.complete_types(pf, vfs)
        supported = nvidia_vgpu.supported_types(pf.product_id)
    return dataclasses.replace(pf, vf_gpus=tuple(vfs),
                               supported_types=supported)
