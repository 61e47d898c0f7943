"""Whole GPUs by PCI passthrough (``<hostdev type='pci' managed='yes'>``).

With ``managed='yes'`` libvirt itself unbinds the GPU from its host driver
and binds it to vfio-pci when the guest starts, and gives it back when the
guest stops, so there is nothing to create or remove.  What this backend
adds is the check libvirt cannot make: the device is a GPU of this host
(PCI class 0x03xxxx, read from ``bus/pci/devices/<address>/class``) and
holds no vGPUs (``bus/mdev/devices/*`` whose parent it is) - passing
through a GPU that slices vGPUs for other guests would take theirs away.
"""

from libvirt_gpu.backends import base
from libvirt_gpu import config_xml
from libvirt_gpu import exception
from libvirt_gpu import objects

GPU_CLASS_PREFIX = objects.GPU_CLASS_PREFIX


class PciBackend(base.DeviceBackend):

    kind = 'pci'

    def __init__(self, sysfs):
        self.sysfs = sysfs

    def hostdev_xml(self, device):
        return config_xml.pci_hostdev(device.address)

    def check(self, device):
        """Raise DeviceNotFound or GpuInUse unless ``device`` can be passed
        through whole."""
        address = objects.PciAddress.parse(device.address)
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

    def exists(self, device):
        try:
            self.check(device)
        except (exception.DeviceNotFound, exception.GpuInUse):
            return False
        return True

    def prepare(self, device):
        self.check(device)
        return False    # libvirt (managed='yes') does the binding

    def release(self, device):
        return False    # libvirt gives the GPU back to its driver
