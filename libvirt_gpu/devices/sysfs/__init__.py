"""The host's sysfs (``/sys`` or a simulated tree), in three parts:

* ``reader``: ``Reader(root)``, the only code that opens, lists, reads or
  writes files under the root (a vGPU kind's own files too, through the
  ``Sysfs`` it is given): containment, file types, sizes, errnos;
* ``parsers``: what a file's text says (numbers, hex ids), pure;
* ``devices``: ``Sysfs``, the reader plus what its files mean (GPUs,
  mdev types and mdevs, SR-IOV VFs as ``objects`` records).

The names below are the package's interface.
"""

from libvirt_gpu.devices.sysfs.devices import Sysfs  # noqa: F401
from libvirt_gpu.devices.sysfs.parsers import parse_hex_id  # noqa: F401
from libvirt_gpu.devices.sysfs.parsers import parse_number  # noqa: F401
from libvirt_gpu.devices.sysfs.reader import HOST_ROOT  # noqa: F401
from libvirt_gpu.devices.sysfs.reader import is_inside  # noqa: F401
from libvirt_gpu.devices.sysfs.reader import MAX_ATTRIBUTE_BYTES  # noqa: F401
from libvirt_gpu.devices.sysfs.reader import MDEV_BUS  # noqa: F401
from libvirt_gpu.devices.sysfs.reader import MDEV_DEVICES  # noqa: F401
from libvirt_gpu.devices.sysfs.reader import PCI_DEVICES  # noqa: F401
from libvirt_gpu.devices.sysfs.reader import Reader  # noqa: F401
from libvirt_gpu.devices.sysfs.reader import TYPES_DIR  # noqa: F401
