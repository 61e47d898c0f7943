"""The real H100 capture (tests/data/h100-passthrough) as sysfs roots.

``copy_capture(dest)`` copies the capture as it is (no IOMMU group).
``with_audio_group(dest)`` and ``with_nic_group(dest)`` are copies with
IOMMU groups added, as the kernel makes them with the IOMMU on
(``iommu_group`` links, ``kernel/iommu_groups/<n>/devices/`` links):

- audio: the GPU in group ``GPU_GROUP`` with an HDMI audio function added
  beside it at ``AUDIO`` (a consumer GPU's layout: ``.1`` of the same
  device, class 0x040300, bound to snd_hda_intel); every other function
  in a group of its own;
- nic: the host's network device (``NIC``, virtio-net, bound to
  virtio-pci, from the capture) in the GPU's group as well.
"""

import os
import shutil

CAPTURE = os.path.join(os.path.dirname(os.path.dirname(__file__)), 'data',
                       'h100-passthrough')
SYSFS = os.path.join(CAPTURE, 'sysfs')
NVML_JSON = os.path.join(CAPTURE, 'nvml.json')

GPU = '0000:00:06.0'
AUDIO = '0000:00:06.1'
NIC = '0000:00:03.0'
DISK = '0000:00:01.0'
GPU_GROUP = 6
BUS_DIR = os.path.join('devices', 'pci0000:00')


def copy_capture(dest):
    """A copy of the capture's sysfs tree at ``dest``; returns ``dest``."""
    shutil.copytree(SYSFS, dest, symlinks=True)
    return str(dest)


def _write(path, text):
    with open(path, 'w') as f:
        f.write(text + '\n')


def add_function(root, address, vendor, device, class_code, driver,
                 numa_node=-1, local_cpulist='0-15'):
    """Add a PCI function to the tree the way the kernel shows one."""
    devdir = os.path.join(root, BUS_DIR, address)
    os.makedirs(devdir)
    for name, text in (('vendor', vendor), ('device', device),
                       ('class', class_code), ('numa_node', str(numa_node)),
                       ('local_cpulist', local_cpulist)):
        _write(os.path.join(devdir, name), text)
    os.symlink(os.path.join('..', '..', '..', BUS_DIR, address),
               os.path.join(root, 'bus', 'pci', 'devices', address))
    if driver:
        drvdir = os.path.join(root, 'bus', 'pci', 'drivers', driver)
        os.makedirs(drvdir, exist_ok=True)
        os.symlink(os.path.join('..', '..', '..', '..', BUS_DIR, address),
                   os.path.join(drvdir, address))
        os.symlink(os.path.join('..', '..', '..', 'bus', 'pci', 'drivers',
                                driver), os.path.join(devdir, 'driver'))


def put_in_group(root, group, addresses):
    """Make ``addresses`` the members of IOMMU group ``group``."""
    devices = os.path.join(root, 'kernel', 'iommu_groups', str(group),
                           'devices')
    os.makedirs(devices)
    for address in addresses:
        os.symlink(os.path.join('..', '..', '..', '..', BUS_DIR, address),
                   os.path.join(devices, address))
        os.symlink(os.path.join('..', '..', '..', 'kernel', 'iommu_groups',
                                str(group)),
                   os.path.join(root, BUS_DIR, address, 'iommu_group'))


def _group_all(root, gpu_group_members):
    """The GPU's group as given; every other function alone in one."""
    put_in_group(root, GPU_GROUP, gpu_group_members)
    others = sorted(set(os.listdir(os.path.join(root, BUS_DIR)))
                    - set(gpu_group_members))
    for number, address in enumerate(others, start=GPU_GROUP + 1):
        put_in_group(root, number, [address])


def with_audio_group(dest):
    root = copy_capture(dest)
    add_function(root, AUDIO, '0x10de', '0x22ba', '0x040300',
                 'snd_hda_intel')
    _group_all(root, [GPU, AUDIO])
    return root


def with_nic_group(dest):
    root = copy_capture(dest)
    _group_all(root, [GPU, NIC])
    return root
