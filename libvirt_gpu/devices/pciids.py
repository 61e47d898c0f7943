"""Names from the system's PCI ID database (``pci.ids``).

libvirt names PCI devices from this database; sysfs has only numbers.
Reading sysfs, we look the numbers up in the same file so that ``list``
shows the names libvirt would.  The file (Debian package ``pci.ids``)::

    10de  NVIDIA Corporation                     vendor: 4 hex, 2 spaces
    \t2330  GH100 [H100 SXM5 80GB]               device: one tab
    \t\t10de 16c1  H100 SXM5 80GB                subsystem: two tabs

It is 1.3 MB and we need a handful of names per command, so nothing is
parsed up front: the file is mapped, a vendor's block is found with one
byte search (vendor lines are the only lines starting with 4 hex digits
and two spaces), and a device or subsystem line with one more search
inside that block.  Found blocks are cached per ``PciIds`` instance.
A missing or unreadable file gives no names (numbers only), never an
error.
"""

import mmap
import re

DEFAULT_PATH = '/usr/share/misc/pci.ids'

_HEX4 = re.compile(rb'[0-9a-f]{4}')
# The start of the next top-level line (next vendor, or the class list).
_TOP_LEVEL = re.compile(rb'\n[^\t#\n]')


def _key(value):
    """``'0x10DE'`` / ``'10de'`` -> ``b'10de'``, or None if not 4 hex."""
    if not isinstance(value, str):
        return None
    text = value.strip().lower()
    if text.startswith('0x'):
        text = text[2:]
    data = text.encode('ascii', 'replace')
    return data if _HEX4.fullmatch(data) else None


class PciIds(object):
    """Lazy lookups in one pci.ids file."""

    def __init__(self, path=DEFAULT_PATH):
        self.path = path
        self._map = None
        self._blocks = {}
        self._devices = {}    # (vendor, device) -> name: one search each

    def __repr__(self):
        return 'PciIds(%r)' % self.path

    def _data(self):
        if self._map is None:
            try:
                with open(self.path, 'rb') as f:
                    self._map = mmap.mmap(f.fileno(), 0,
                                          access=mmap.ACCESS_READ)
            except (OSError, ValueError):   # missing, unreadable, empty
                self._map = b''
        return self._map

    def close(self):
        if isinstance(self._map, mmap.mmap):
            self._map.close()
        self._map = None
        self._blocks = {}
        self._devices = {}

    @property
    def available(self):
        return len(self._data()) > 0

    @staticmethod
    def _line(data, needle, start, end):
        """The name on the line starting with ``needle`` (which begins
        with ``\\n``) in ``data[start:end]``, and where that line ends."""
        at = data.find(needle, start, end)
        if at < 0:
            return None, None
        stop = data.find(b'\n', at + len(needle))
        stop = len(data) if stop < 0 else stop
        name = data[at + len(needle):stop].decode('utf-8', 'replace').strip()
        return name or None, stop

    def _vendor_block(self, vendor):
        """``(name, start, end)`` of a vendor's block, or None."""
        if vendor not in self._blocks:
            data = self._data()
            name, start = self._line(data, b'\n' + vendor + b'  ', 0,
                                     len(data))
            if name is None:
                self._blocks[vendor] = None
            else:
                nxt = _TOP_LEVEL.search(data, start)
                self._blocks[vendor] = (name, start,
                                        nxt.start() if nxt else len(data))
        return self._blocks[vendor]

    def vendor(self, vendor_id):
        """``'10de'`` -> ``'NVIDIA Corporation'``, or None."""
        vendor = _key(vendor_id)
        block = self._vendor_block(vendor) if vendor else None
        return block[0] if block else None

    def _device_line(self, vendor_id, device_id):
        vendor, device = _key(vendor_id), _key(device_id)
        block = self._vendor_block(vendor) if vendor and device else None
        if block is None:
            return None, None, None
        _name, start, end = block
        name, stop = self._line(self._data(), b'\n\t' + device + b'  ',
                                start, end)
        return name, stop, end

    def device(self, vendor_id, device_id):
        """``('10de', '2330')`` -> ``'GH100 [H100 SXM5 80GB]'`` (the
        database's exact text), or None.  A host's GPUs are mostly of one
        model, so each pair is searched for once."""
        key = (vendor_id, device_id)
        if key not in self._devices:
            self._devices[key] = self._device_line(vendor_id, device_id)[0]
        return self._devices[key]

    def subsystem(self, vendor_id, device_id, subvendor_id, subdevice_id):
        """The name of a subsystem of a device, or None."""
        sub_v, sub_d = _key(subvendor_id), _key(subdevice_id)
        name, start, end = self._device_line(vendor_id, device_id)
        if name is None or sub_v is None or sub_d is None:
            return None
        data = self._data()
        # The device's subsystems run until the next device line.
        nxt = re.compile(rb'\n\t[^\t]').search(data, start, end)
        stop = nxt.start() if nxt else end
        found, _ = self._line(data, b'\n\t\t' + sub_v + b' ' + sub_d + b'  ',
                              start, stop)
        return found
