"""Plain records passed between the layers.

Frozen dataclasses, no I/O and no policy: ``sysfs`` and ``nodedev`` build
them, ``discovery`` returns them, ``placement`` and the CLI read them.
"""

import dataclasses
import re
import typing

from libvirt_gpu import exception

_PCI_RE = re.compile(r'([0-9a-f]{4,8}):([0-9a-f]{2}):([01][0-9a-f])\.([0-7])')
_UUID_RE = re.compile(r'[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}')
_TYPE_RE = re.compile(r'[A-Za-z0-9][A-Za-z0-9_.-]{0,63}')
_HEX_ID_RE = re.compile(r'(?:0x)?([0-9a-fA-F]{4})')

# ``key=value`` pairs of an NVIDIA type description, e.g.
# "num_heads=4, frl_config=60, framebuffer=2048M, max_resolution=5120x2880,
#  max_instance=8"
_DESC_PAIR_RE = re.compile(r'([a-z_]+)=([^,\s]+)')


@dataclasses.dataclass(frozen=True, order=True)
class PciAddress:
    """A PCI address, e.g. ``0000:af:00.0``."""

    domain: int
    bus: int
    slot: int
    function: int

    @classmethod
    def parse(cls, value):
        """Parse ``DDDD:BB:SS.F``; uppercase hex is accepted and lowered."""
        if isinstance(value, cls):
            return value
        if not isinstance(value, str) or len(value) > 16:
            raise exception.InvalidPciAddress(value=value)
        m = _PCI_RE.fullmatch(value.lower())
        if m is None:
            raise exception.InvalidPciAddress(value=value)
        return cls(*(int(g, 16) for g in m.groups()))

    @classmethod
    def from_libvirt_name(cls, name):
        """``pci_0000_af_00_0`` -> ``0000:af:00.0``."""
        parts = name.split('_') if isinstance(name, str) else []
        if len(parts) != 5 or parts[0] != 'pci':
            raise exception.InvalidPciAddress(value=name)
        return cls.parse('%s:%s:%s.%s' % tuple(parts[1:]))

    def __str__(self):
        return '%04x:%02x:%02x.%x' % (self.domain, self.bus, self.slot,
                                      self.function)

    @property
    def libvirt_name(self):
        return 'pci_%04x_%02x_%02x_%x' % (self.domain, self.bus, self.slot,
                                          self.function)


def validate_uuid(value):
    """Return ``value`` lowercased if it is a UUID, else raise."""
    if not isinstance(value, str) or len(value) != 36:
        raise exception.InvalidUuid(value=value)
    lowered = value.lower()
    if _UUID_RE.fullmatch(lowered) is None:
        raise exception.InvalidUuid(value=value)
    return lowered


def validate_type_id(value):
    """Return ``value`` if it can be a vGPU type id (``nvidia-223``)."""
    if not isinstance(value, str) or _TYPE_RE.fullmatch(value) is None:
        raise exception.InvalidTypeId(value=value)
    return value


def normalize_hex_id(value):
    """``0x10DE`` / ``10de`` -> ``10de``."""
    m = _HEX_ID_RE.fullmatch(value.strip()) if isinstance(value, str) else None
    if m is None:
        raise exception.InvalidInput(
            reason='%r is not a 4-digit hex PCI id' % (value,))
    return m.group(1).lower()


def parse_description(description):
    """NVIDIA type description -> ``{key: value}`` (empty when absent)."""
    if not description:
        return {}
    return dict(_DESC_PAIR_RE.findall(description))


@dataclasses.dataclass(frozen=True)
class MdevType:
    """One entry of a parent's ``mdev_supported_types``."""

    id: str
    name: typing.Optional[str]
    description: typing.Optional[str]
    device_api: str
    available_instances: int

    @property
    def max_instance(self):
        """``max_instance`` from NVIDIA's description, or None."""
        value = parse_description(self.description).get('max_instance')
        return int(value) if value and value.isdigit() else None


@dataclasses.dataclass(frozen=True, order=True)
class Mdev:
    """An existing mediated device."""

    uuid: str
    type_id: str


@dataclasses.dataclass(frozen=True)
class Gpu:
    """A PCI display controller (class 0x03xxxx) as discovery saw it."""

    address: PciAddress
    vendor_id: str                 # '10de'
    product_id: str                # '1eb8'
    class_code: str                # '0x030200'
    driver: typing.Optional[str]   # 'nvidia', 'vfio-pci', None
    numa_node: typing.Optional[int]
    iommu_group: typing.Optional[int]
    vendor_name: typing.Optional[str] = None    # libvirt only
    product_name: typing.Optional[str] = None   # libvirt only
    physfn: typing.Optional[PciAddress] = None  # set on an SR-IOV VF
    virtfns: typing.Tuple[PciAddress, ...] = ()  # set on an SR-IOV PF
    mdev_types: typing.Tuple[MdevType, ...] = ()
    mdevs: typing.Tuple[Mdev, ...] = ()

    def mdev_type(self, type_id):
        for mtype in self.mdev_types:
            if mtype.id == type_id:
                return mtype
        return None

    @property
    def is_vf(self):
        return self.physfn is not None


@dataclasses.dataclass(frozen=True)
class DiscoveryResult:
    """GPUs found and the source that found them (``libvirt`` / ``sysfs``)."""

    source: str
    gpus: typing.Tuple[Gpu, ...]

    def gpu(self, address):
        address = PciAddress.parse(address)
        for gpu in self.gpus:
            if gpu.address == address:
                return gpu
        raise exception.DeviceNotFound(address=address)


@dataclasses.dataclass(frozen=True)
class EnabledType:
    """What configuration enables on one GPU (``[vgpu_<type>]`` resolved)."""

    type_id: str
    resource_class: str = 'VGPU'
    max_instances: typing.Optional[int] = None
