"""The vendor interface's files, read and written through the one safe
reader (``sysfs.Sysfs``: containment under the root, file types, sizes,
errnos kept) and parsed here.  See ``names`` for the layout."""

from __future__ import annotations

import os

from libvirt_gpu.devices.backends.nvidia_vgpu import names
from libvirt_gpu import exception
from libvirt_gpu import objects

TYPE_CHECKING = False
if TYPE_CHECKING:
    from libvirt_gpu.devices.sysfs import Sysfs

_MAX_VENDOR_TYPE = 10 ** 9


class VendorFiles(object):
    """The vendor interface of the host ``sysfs`` (a ``Sysfs``)."""

    def __init__(self, sysfs: Sysfs) -> None:
        self.sysfs = sysfs

    def vendor_dir(self, address: objects.PciAddress) -> str:
        """``<root>/bus/pci/devices/<VF>/nvidia``"""
        return os.path.join(self.sysfs.pci_dir(address), names.VENDOR_DIR)

    def has_interface(self, address: objects.PciAddress) -> bool:
        return self.sysfs.isdir(self.vendor_dir(address))

    def vf_names(self) -> list[str]:
        """Names of the PCI functions that have the interface now, sorted
        (the hook's settings snapshot and ``restore`` ask this)."""
        return self.sysfs.functions_with(names.VENDOR_DIR)

    def vf_addresses(self) -> list[objects.PciAddress]:
        """``vf_names`` parsed, where they enter the program: the
        ``objects.PciAddress`` of each, sorted; a name that is no PCI
        address is skipped."""
        found = []
        for name in self.vf_names():
            try:
                found.append(objects.PciAddress.parse(name))
            except exception.InvalidPciAddress:
                continue
        return sorted(found)

    def creatable_types(self, address: objects.PciAddress
                        ) -> tuple[tuple[int, str], ...]:
        """``((1145, 'NVIDIA L40S-1B'), ...)`` creatable on a VF now; empty
        when the GPU is full (see ``parse_creatable_types``)."""
        path = os.path.join(self.vendor_dir(address), names.CREATABLE_TYPES)
        return parse_creatable_types(self.sysfs.read(path), path)

    def current_type(self, address: objects.PciAddress) -> int:
        """The type number of the vGPU on a VF, 0 when it holds none."""
        return self.sysfs.read_int(os.path.join(self.vendor_dir(address),
                                                names.CURRENT_TYPE))

    def set_current_type(self, address: objects.PciAddress,
                         number: int) -> None:
        """Write a type number (create a vGPU) or 0 (destroy it) to the
        VF's type file; SysfsWriteError carries the kernel's errno."""
        if isinstance(number, bool) or not isinstance(number, int) \
                or number < 0:
            raise exception.InvalidInput(
                reason='%s takes a type number, not %r'
                % (names.CURRENT_TYPE, number))
        self.sysfs.write(os.path.join(self.vendor_dir(address),
                                      names.CURRENT_TYPE), str(number))

    def where(self, address: objects.PciAddress
              ) -> tuple[int | None, int | None]:
        """``(gpu_instance_id, placement_id)`` of the vGPU on a VF: where
        the driver put it (a MIG GPU instance; a mixed-size placement).
        Each None where the VF has no such file (a driver before MIG-backed
        and mixed-size vGPUs) or the driver does not answer it (ENXIO: no
        vGPU on the VF).  A file that is no number, or one refused as
        hostile, is its SysfsError."""
        found: list[int | None] = []
        for name in (names.GPU_INSTANCE_ID, names.PLACEMENT_ID):
            path = os.path.join(self.vendor_dir(address), name)
            try:
                found.append(self.sysfs.read_int(path, optional=True))
            except exception.SysfsReadError as e:
                if type(e) is not exception.SysfsReadError:
                    raise
                found.append(None)      # the driver's read error (ENXIO)
        return found[0], found[1]

    def write_params(self, address: objects.PciAddress,
                     params: str) -> None:
        """Write plugin parameters (``key=value, ...``); a single space
        clears them (NVIDIA's convention)."""
        if not isinstance(params, str) or '\n' in params or '\0' in params \
                or len(params) > 4096:
            raise exception.InvalidInput(
                reason='%s must be one line of key=value pairs'
                % names.VGPU_PARAMS)
        self.sysfs.write(os.path.join(self.vendor_dir(address),
                                      names.VGPU_PARAMS), params or ' ')

    def read_vf(self, address: objects.PciAddress
                ) -> objects.VendorVf | None:
        """``objects.VendorVf`` of a VF, or None when it has no vendor
        directory (no vendor interface).

        Each creatable type becomes an VgpuType ``nvidia-<n>`` with
        available_instances 1 (a VF holds one vGPU).  The type the VF holds
        is named from its own list when it is there, else left unnamed:
        discovery names it from the other VFs or the vendor's table.
        """
        if not self.has_interface(address):
            return None
        current = self.current_type(address)
        creatable = tuple(
            objects.VgpuType(id=objects.vendor_type_id(number), name=name,
                             description=None, device_api='vfio-pci',
                             available_instances=0 if current else 1)
            for number, name in self.creatable_types(address))
        held = None
        if current:
            type_id = objects.vendor_type_id(current)
            named = [t.name for t in creatable if t.id == type_id]
            held = objects.VgpuType(id=type_id,
                                    name=named[0] if named else None,
                                    description=None, device_api='vfio-pci',
                                    available_instances=0)
        return objects.VendorVf(creatable=creatable, current=held)


def parse_creatable_types(text: str | None,
                          path: str) -> tuple[tuple[int, str], ...]:
    """Parse a VF's list of creatable types::

        ID    : vGPU Name
        1145  : NVIDIA L40S-1B
        1155  : NVIDIA L40S-24Q

    Returns ``((1145, 'NVIDIA L40S-1B'), ...)`` in file order.  Blank lines
    and the header (a first line ``ID : ...``) are skipped; an empty file
    (the GPU is full) gives ``()``.  Names keep their inner spaces.  Any
    other line, a repeated id or an unnamed id is a SysfsReadError naming
    ``path`` and the line: a driver that changed its format must be noticed,
    not half-read.
    """
    rows: list[tuple[int, str]] = []
    seen: set[int] = set()
    first = True
    for lineno, raw in enumerate((text or '').splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        number, sep, name = line.partition(':')
        number, name = number.strip(), ' '.join(name.split())
        if first and sep and number.upper() == 'ID':
            first = False
            continue      # the header
        first = False
        if not sep or not number.isdigit() or not name \
                or int(number) < 1 or int(number) >= _MAX_VENDOR_TYPE:
            raise exception.SysfsReadError(
                path=path, reason='line %d is not "<type id> : <name>": %r'
                % (lineno, raw[:80]))
        value = int(number)
        if value in seen:
            raise exception.SysfsReadError(
                path=path, reason='line %d repeats type %d' % (lineno, value))
        seen.add(value)
        rows.append((value, name))
    return tuple(rows)
