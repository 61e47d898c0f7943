"""Plain records passed between the layers.

Frozen records (``records.record``), no I/O and no policy: ``sysfs`` and
``nodedev`` build them, ``discovery`` returns them, ``placement`` and the
CLI read them.
"""

from __future__ import annotations

from libvirt_gpu.util import bounds
from libvirt_gpu import exception
from libvirt_gpu.util import records

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Protocol, TypeVar

    _Value = TypeVar('_Value', 'Uuid', 'TypeId', 'PciAddress')

    class _Addressed(Protocol):
        @property
        def address(self) -> PciAddress: ...
        @property
        def vendor_id(self) -> str | None: ...
        @property
        def product_id(self) -> str | None: ...

# The accepted languages, checked by hand (``_pci_fields``, ``_is_uuid``
# ...) rather than by ``re``: the qemu hook parses UUIDs and addresses on
# every guest start, and importing ``re`` costs it more than all of its
# parsing.  tests/unit/test_objects_hand_validators.py holds the equivalent
# patterns and compares the two over many strings:
#   PCI address  ([0-9a-f]{4,8}):([0-9a-f]{2}):([01][0-9a-f])\.([0-7])
#   UUID         [0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}
#   type id      [A-Za-z0-9][A-Za-z0-9_.-]{0,63}
#   PCI id       (?:0x)?([0-9a-fA-F]{4})
_HEX = frozenset('0123456789abcdef')
_HEX_ANY_CASE = frozenset('0123456789abcdefABCDEF')
_ALNUM = frozenset('0123456789abcdefghijklmnopqrstuvwxyz'
                   'ABCDEFGHIJKLMNOPQRSTUVWXYZ')
_TYPE_CHARS = _ALNUM | frozenset('_.-')

_PARSED_PCI: dict[str, PciAddress] = {}  # text -> PciAddress.parse
_MAX_PARSED_PCI = 4096
# text -> Uuid (Uuid.parse): one process meets a vGPU's UUID at several
# edges (the domain XML, our metadata, its lease row); values are immutable
_PARSED_UUID: dict[str, Uuid] = {}
_MAX_PARSED = 4096


def _pci_fields(text: str) -> tuple[str, str, str, str] | None:
    """The four fields of a lowercase ``DDDD:BB:SS.F`` (domain of 4 to 8
    hex digits, slot 00-1f, function 0-7), or None."""
    parts = text.split(':')
    if len(parts) != 3:
        return None
    domain, bus, rest = parts
    if not (4 <= len(domain) <= 8 and len(bus) == 2 and len(rest) == 4
            and rest[2] == '.' and rest[0] in '01'
            and rest[3] in '01234567' and rest[1] in _HEX
            and _HEX.issuperset(domain) and _HEX.issuperset(bus)):
        return None
    return domain, bus, rest[:2], rest[3]


def _is_uuid(text: str) -> bool:
    """Whether ``text`` is a lowercase 8-4-4-4-12 hex UUID."""
    return (len(text) == 36 and text[8] == text[13] == text[18]
            == text[23] == '-'
            and _HEX.issuperset(text.replace('-', '', 4)))


def _is_type_id(text: str) -> bool:
    """Whether ``text`` is 1 to 64 of ``[A-Za-z0-9_.-]``, the first
    alphanumeric."""
    return (0 < len(text) <= 64 and text[0] in _ALNUM
            and _TYPE_CHARS.issuperset(text))


# ``key=value`` pairs of an NVIDIA type description, e.g.
# "num_heads=4, frl_config=60, framebuffer=2048M, max_resolution=5120x2880,
#  max_instance=8"
_DESC_PAIR_RE = r'([a-z_]+)=([^,\s]+)'


@records.record(order=True)
class PciAddress:
    """A PCI address, e.g. ``0000:af:00.0``."""

    domain: int
    bus: int
    slot: int
    function: int

    @classmethod
    def parse(cls, value: object) -> PciAddress:
        """Parse ``DDDD:BB:SS.F``; uppercase hex is accepted and lowered.

        Discovery meets each address two or three times (the device list,
        the IOMMU group, a VF link), ~1,700 parses on a 256-parent host:
        addresses parsed are kept (they are immutable), up to a bound."""
        if isinstance(value, cls):
            return value
        found = (_PARSED_PCI.get(value)
                 if cls is PciAddress and isinstance(value, str) else None)
        if found is not None:
            return found
        if not isinstance(value, str) or len(value) > 16:
            raise exception.InvalidPciAddress(value=value)
        fields = _pci_fields(value.lower())
        if fields is None:
            raise exception.InvalidPciAddress(value=value)
        domain, bus, slot, function = fields
        found = cls(int(domain, 16), int(bus, 16), int(slot, 16),
                    int(function, 16))
        if cls is PciAddress and len(_PARSED_PCI) < _MAX_PARSED_PCI:
            _PARSED_PCI[value] = found
        return found

    @classmethod
    def from_libvirt_name(cls, name: object) -> PciAddress:
        """``pci_0000_af_00_0`` -> ``0000:af:00.0``."""
        parts = name.split('_') if isinstance(name, str) else []
        if len(parts) != 5 or parts[0] != 'pci':
            raise exception.InvalidPciAddress(value=name)
        return cls.parse('%s:%s:%s.%s' % tuple(parts[1:]))

    def __str__(self) -> str:
        return '%04x:%02x:%02x.%x' % (self.domain, self.bus, self.slot,
                                      self.function)

    @property
    def libvirt_name(self) -> str:
        return 'pci_%04x_%02x_%02x_%x' % (self.domain, self.bus, self.slot,
                                          self.function)


class _Parsed(str):
    """A ``str`` made only by its class's ``parse`` (which validates it),
    and pickled back through it."""

    __slots__ = ()

    def __new__(cls, *args: object, **kwargs: object) -> _Parsed:
        raise TypeError('%s is made by %s.parse(text), which validates it'
                        % (cls.__name__, cls.__name__))

    @classmethod
    def parse(cls, value: object) -> _Parsed:
        raise NotImplementedError

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (type(self).parse, (str(self),))


class Uuid(_Parsed):
    """A UUID, canonical (lowercase): a ``str`` that was validated once,
    where it entered the program (domain XML, sysfs, the lease store, the
    CLI, the API, NVML ...).  Made only by ``Uuid.parse``; the layers below
    the edge take a ``Uuid`` and never parse it again."""

    __slots__ = ()

    @classmethod
    def parse(cls, value: object) -> Uuid:
        """``value`` as a Uuid, lowercased; a Uuid is returned as it is
        (no cost).  Raises ``InvalidUuid`` for anything else."""
        if type(value) is cls:
            return value
        found = _PARSED_UUID.get(value) if type(value) is str else None
        if found is not None:
            return found
        if not isinstance(value, str) or len(value) != 36:
            raise exception.InvalidUuid(value=value)
        lowered = value.lower()
        if not _is_uuid(lowered):
            raise exception.InvalidUuid(value=value)
        found = str.__new__(cls, lowered)
        if type(value) is str and len(_PARSED_UUID) < _MAX_PARSED:
            _PARSED_UUID[value] = found
        return found

    @classmethod
    def new(cls) -> Uuid:
        """A new random UUID (version 4): made here, so already canonical
        (nothing to parse)."""
        import uuid as uuidlib     # only here: the hook's prepare makes none
        return str.__new__(cls, str(uuidlib.uuid4()))


class TypeId(_Parsed):
    """A vGPU type id (``nvidia-223``), validated once where it entered
    the program (configuration, sysfs, domain XML, the lease store ...).
    Made only by ``TypeId.parse``; like ``Uuid``, a ``str`` to every
    reader."""

    __slots__ = ()

    @classmethod
    def parse(cls, value: object) -> TypeId:
        """``value`` as a TypeId; a TypeId is returned as it is (no
        cost).  Raises ``InvalidTypeId`` for anything else."""
        if type(value) is cls:
            return value
        if (not isinstance(value, str)
                or not _is_type_id(value)):
            raise exception.InvalidTypeId(value=value)
        return str.__new__(cls, value)


def typed(value: object, kind: type[_Value], what: str) -> _Value:
    """``value`` when it is of ``kind`` (``Uuid``, ``TypeId``,
    ``PciAddress``), else TypeError: the layers below the edge take values
    parsed where they entered the program, never raw text.  A type check,
    not a parse: it costs no pattern match."""
    if type(value) is kind:
        return value
    raise TypeError(
        '%s must be an objects.%s, not %s %r: parse it with '
        'objects.%s.parse where it enters the program (CLI, API, hook '
        'input, domain XML, sysfs, the lease store) and pass the result'
        % (what, kind.__name__, type(value).__name__, value, kind.__name__))


def normalize_hex_id(value: object) -> str:
    """``0x10DE`` / ``10de`` -> ``10de``."""
    text = value.strip() if isinstance(value, str) else ''
    if text[:2] == '0x':
        text = text[2:]
    if len(text) != 4 or not _HEX_ANY_CASE.issuperset(text):
        raise exception.InvalidInput(
            reason='%r is not a 4-digit hex PCI id' % (value,))
    return text.lower()


@records.record
class GpuSelector:
    """Which GPUs a configuration entry names: one GPU by its PCI address
    (``0000:41:00.0``), or every GPU of a model by its PCI ids
    (``10de:2331``).  Parsed once where the configuration enters
    (``GpuSelector.parse``, ``parse_list``); ``matches`` is the only test
    of a GPU."""

    address: PciAddress | None = None
    vendor_id: str | None = None     # '10de', with product_id
    product_id: str | None = None    # '2331'

    @classmethod
    def parse(cls, value: object) -> GpuSelector:
        """``0000:41:00.0`` or ``10de:2331`` (``0x`` prefixes and upper
        case accepted); InvalidInput naming both forms otherwise."""
        if isinstance(value, cls):
            return value
        text = value.strip() if isinstance(value, str) else None
        if text and len(text) <= 32 and text.count(':') == 1:
            vendor, _, product = text.partition(':')
            try:
                return cls(vendor_id=normalize_hex_id(vendor),
                           product_id=normalize_hex_id(product))
            except exception.InvalidInput:
                pass
        elif text and len(text) <= 32:
            try:
                return cls(address=PciAddress.parse(text))
            except exception.InvalidPciAddress:
                pass
        raise exception.InvalidInput(
            reason='%r names no GPU: give a PCI address (0000:41:00.0) or '
                   'the vendor:product ids of a model (10de:2331)'
                   % (value,))

    @classmethod
    def parse_list(cls, values: Iterable[object]
                   ) -> tuple[GpuSelector, ...]:
        """The selectors of a configuration list, in its order, as a
        tuple (each entry as ``parse``); InvalidInput naming the first
        entry that names no GPU."""
        return tuple(cls.parse(value) for value in values)

    @property
    def by_model(self) -> bool:
        return self.address is None

    def matches(self, gpu: _Addressed) -> bool:
        """Whether ``gpu`` (anything with ``address``, ``vendor_id`` and
        ``product_id``) is one this selector names."""
        if self.address is not None:
            return gpu.address == self.address
        return (gpu.vendor_id == self.vendor_id
                and gpu.product_id == self.product_id)

    def __str__(self) -> str:
        if self.address is not None:
            return str(self.address)
        return '%s:%s' % (self.vendor_id, self.product_id)


def parse_description(description: str | None) -> dict[str, str]:
    """NVIDIA type description -> ``{key: value}`` (empty when absent)."""
    if not description:
        return {}
    import re      # only here: the qemu hook parses no description
    return dict(re.findall(_DESC_PAIR_RE, description))


@records.record
class VgpuType:
    """A vGPU type a PCI function offers: one entry of a parent's
    ``mdev_supported_types`` (the classic mdev kind), or one of the vendor
    interface's (``nvidia/CREATABLE_TYPES``, see ``VendorVf``)."""

    id: TypeId
    name: str | None
    description: str | None
    device_api: str | None          # 'vfio-pci'
    available_instances: int
    # NVIDIA's published per-GPU maximum of this type, for types whose
    # interface has no description to carry ``max_instance`` (the vGPU 17+
    # vendor interface); filled by discovery from NVML or, by the type's
    # name, the vendor backend's table.  None: unknown.
    published_max: int | None = None

    @property
    def max_instance(self) -> int | None:
        """``max_instance`` from NVIDIA's description, else the published
        per-GPU maximum, else None."""
        value = parse_description(self.description).get('max_instance')
        if value and value.isdigit():
            return int(value)
        return self.published_max


@records.record(order=True)
class Mdev:
    """An existing mediated device."""

    uuid: Uuid
    type_id: TypeId


@records.record(order=True)
class IommuMember:
    """One PCI function of a GPU's IOMMU group (the GPU itself included).

    ``companion``: another function of the GPU's own PCI device (its HDMI
    audio ``.1``), which goes to a guest with it.  ``host_uses``: a device
    the host works with (a NIC, a disk controller with its driver bound),
    which a passthrough of this group would take away from the host (see
    ``pci_classes``).
    """

    address: PciAddress
    vendor_id: str | None
    product_id: str | None
    class_code: str | None
    driver: str | None
    companion: bool = False
    host_uses: bool = False
    # What kind of host device it is ('network controller'), set with
    # ``host_uses`` for messages.
    host_class: str | None = None


@records.record
class NvmlVgpuType:
    """A vGPU type as NVML names it on a vGPU host."""

    id: int                        # nvmlVgpuTypeId_t
    name: str                      # 'NVIDIA L40S-1B'
    framebuffer_mib: int
    max_instances: int
    creatable: bool                # in nvmlDeviceGetCreatableVgpus now


@records.record
class NvmlGpu:
    """What NVML says about one GPU (None: NVML did not answer that)."""

    name: str | None                  # 'NVIDIA H100 80GB HBM3'
    memory_total_mib: int | None
    virtualization_mode: str | None   # 'passthrough', 'vgpu_host'
    mig_enabled: bool | None
    vgpu_types: tuple[NvmlVgpuType, ...] = ()


@records.record
class Gpu:
    """A PCI display controller (class 0x03xxxx) as discovery saw it."""

    address: PciAddress
    vendor_id: str                 # '10de'
    product_id: str                # '1eb8'
    class_code: str | None         # '0x030200'; libvirt may omit it
    driver: str | None   # 'nvidia', 'vfio-pci', None
    numa_node: int | None
    iommu_group: int | None
    vendor_name: str | None = None    # libvirt only
    product_name: str | None = None   # libvirt only
    physfn: PciAddress | None = None  # set on an SR-IOV VF
    virtfns: tuple[PciAddress, ...] = ()  # set on an SR-IOV PF
    mdev_types: tuple[VgpuType, ...] = ()
    mdevs: tuple[Mdev, ...] = ()
    # NVIDIA vGPU 17+ vendor interface of an SR-IOV VF (``<VF>/nvidia/``),
    # None when the function has none.  sysfs-only knowledge (libvirt's
    # node devices do not show it), so, like a type's description, it is
    # left out of equality: a libvirt-only view compares equal to a sysfs
    # view.  tests/unit/devices/test_discovery_sriov.py compares it explicitly.
    vendor_vf: VendorVf | None = records.field(
        default=None, compare=False)
    # On an SR-IOV PF: the Gpu records of its enabled VFs (the same records
    # discovery lists on their own), so that one physical GPU can be judged
    # as a whole.  Derived from ``virtfns``; not compared.
    vf_gpus: tuple[Gpu, ...] = records.field(
        default=(), compare=False, repr=False)
    # Every function of the GPU's IOMMU group (empty without a group).
    iommu_members: tuple[IommuMember, ...] = ()
    # ``local_cpulist`` of the GPU (``0-15``): the CPUs of its NUMA node.
    # sysfs only (libvirt does not report it); not compared.
    local_cpulist: str | None = records.field(
        default=None, compare=False)
    # What NVML adds where the driver provides it (``nvml``); not compared.
    nvml: NvmlGpu | None = records.field(
        default=None, compare=False, repr=False)

    def mdev_type(self, type_id: str) -> VgpuType | None:
        for mtype in self.mdev_types:
            if mtype.id == type_id:
                return mtype
        return None

    @property
    def is_vf(self) -> bool:
        return self.physfn is not None

    # -- one view of every device kind (classic mdev, vendor interface) --

    @property
    def vgpu_types(self) -> tuple[VgpuType, ...]:
        """The vGPU types this PCI function offers now: its mdev types, or
        the vendor interface's (creatable ones, then the type it holds)."""
        if self.vendor_vf is None:
            return self.mdev_types
        return self.vendor_vf.types

    @property
    def used_type_ids(self) -> tuple[TypeId, ...]:
        """Type ids of the vGPUs this PCI function holds now."""
        used = [m.type_id for m in self.mdevs]
        if self.vendor_vf is not None and self.vendor_vf.current is not None:
            used.append(self.vendor_vf.current.id)
        return tuple(used)

    @property
    def functions(self) -> tuple[Gpu, ...]:
        """This function and, on an SR-IOV PF, its VFs."""
        return (self,) + tuple(self.vf_gpus)

    @property
    def vgpu_interface(self) -> str | None:
        """How vGPUs are made on this physical GPU: the vendor interface of
        its VFs (``'nvidia'``: vGPU 17+; another kind's name), ``'mdev'``
        (classic mdev, on the GPU or on its VFs), or None."""
        functions = self.functions
        for f in functions:
            if f.vendor_vf is not None:
                return f.vendor_vf.interface
        if any(f.mdev_types for f in functions):
            return MDEV_INTERFACE
        return None

    def offered_types(self) -> tuple[VgpuType, ...]:
        """Every vGPU type of this GPU and its VFs, one record per id.

        The record kept for an id is the most informative one seen (with a
        name and a maximum), in the order first seen.
        """
        found: dict[TypeId, VgpuType] = {}
        for function in self.functions:
            for mtype in function.vgpu_types:
                best = found.get(mtype.id)
                if best is None or _richer(mtype, best):
                    found[mtype.id] = mtype
        return tuple(found.values())

    def offered_type(self, type_id: str) -> VgpuType | None:
        """The record of ``type_id`` on this GPU or its VFs, or None."""
        for mtype in self.offered_types():
            if mtype.id == type_id:
                return mtype
        return None


# PCI vendor id of NVIDIA, and the class of every display controller
# (VGA, XGA, 3D controller, ...): what makes a PCI function a GPU here.
NVIDIA_VENDOR_ID = '10de'
GPU_CLASS_PREFIX = '0x03'


def is_gpu_class(class_code: str | None) -> bool:
    """Whether a PCI ``class`` (``0x030200``) is a display controller's."""
    return class_code is not None and class_code.lower().startswith(
        GPU_CLASS_PREFIX)


# The words NVIDIA puts before a type's size ("GRID T4-2B", "NVIDIA
# L40S-12Q"); the rest of the name is the type's own (``type_word``).
TYPE_NAME_VENDOR_WORDS = ('NVIDIA', 'GRID')


def type_word(name: str | None) -> str:
    """``GRID T4-2B`` -> ``T4-2B``; ``NVIDIA L40S-12Q`` -> ``L40S-12Q``: a
    vGPU type's name without its leading vendor word (the one rule the
    traits and Nova's default alias follow), stripped; a name of the
    word alone, or without it, stripped as it is."""
    name = (name or '').strip()
    first, _, rest = name.partition(' ')
    if first.upper() in TYPE_NAME_VENDOR_WORDS and rest.strip():
        return rest.strip()
    return name


# Placement's custom names (traits, resource classes): ``CUSTOM_`` then
# upper-case ASCII letters, digits and "_", at most 255 characters in all,
# i.e. CUSTOM_[A-Z0-9_]{1,248}; checked by hand, as above.
CUSTOM_PREFIX = 'CUSTOM_'
MAX_CUSTOM_NAME = 255
_CUSTOM_CHARS = frozenset('ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_')


def is_custom_name(value: object) -> bool:
    """Whether ``value`` is a Placement custom name (a trait's or a
    resource class's): the one check."""
    return (isinstance(value, str) and value.startswith(CUSTOM_PREFIX)
            and len(CUSTOM_PREFIX) < len(value) <= MAX_CUSTOM_NAME
            and _CUSTOM_CHARS.issuperset(value[len(CUSTOM_PREFIX):]))


def custom_name(text: str) -> str:
    """``NVIDIA L40S-12Q`` -> ``CUSTOM_NVIDIA_L40S_12Q``: the one
    normalizer, what ``os_traits.normalize_name`` and
    ``os_resource_classes.normalize_name`` make of ``text`` (every run of
    characters other than ASCII letters and digits one "_", upper-cased,
    after ``CUSTOM_``), cut to Placement's 255 characters."""
    out: list[str] = []
    run = False
    for char in text:
        if char in _ALNUM:
            out.append(char.upper())
            run = False
        elif not run:
            out.append('_')
            run = True
    return (CUSTOM_PREFIX + ''.join(out))[:MAX_CUSTOM_NAME]


MDEV_INTERFACE = 'mdev'
VENDOR_INTERFACE = 'nvidia'
# The vendor interface numbers types (``1145``); the mdev interface of the
# same driver family names the same type ``nvidia-1145``.  We use the mdev
# form everywhere (configuration, traits, leases), so a configuration
# survives the move from mdev to the vendor interface.
VENDOR_TYPE_PREFIX = 'nvidia-'


def vendor_type_id(number: object) -> TypeId:
    """``1145`` -> ``'nvidia-1145'``."""
    if isinstance(number, bool) or not isinstance(number, int) \
            or number < 1:
        raise exception.InvalidTypeId(value=number)
    return TypeId.parse('%s%d' % (VENDOR_TYPE_PREFIX, number))


def vendor_type_number(type_id: object) -> int:
    """``'nvidia-1145'`` (a ``TypeId``) -> ``1145`` (what
    ``CURRENT_TYPE`` takes)."""
    if not isinstance(type_id, str):
        raise exception.InvalidTypeId(value=type_id)
    digits = type_id[len(VENDOR_TYPE_PREFIX):]
    if not type_id.startswith(VENDOR_TYPE_PREFIX) or not digits.isdigit() \
            or digits.startswith('0') or len(digits) > 9:
        raise exception.InvalidTypeId(value=type_id)
    return int(digits)


def _richer(candidate: VgpuType, best: VgpuType) -> bool:
    score = (candidate.name is not None, candidate.max_instance is not None)
    return score > (best.name is not None, best.max_instance is not None)


@records.record
class VendorVf:
    """A vendor interface of one SR-IOV VF, read by the vGPU kind whose
    interface it is (``VendorFunctions.read_function``): NVIDIA's vGPU 17+ one
    (``interface`` ``'nvidia'``, ``backends/nvidia_vgpu``) or another
    kind's.  The VF holds at most one vGPU and goes to the guest whole.

    ``creatable``: the types that can be created on this VF now (as
    VgpuType records, available_instances 1).
    ``current``: the type of the vGPU the VF holds, or None.
    """

    creatable: tuple[VgpuType, ...] = ()
    current: VgpuType | None = None
    interface: str = VENDOR_INTERFACE

    @property
    def types(self) -> tuple[VgpuType, ...]:
        if self.current is None or any(t.id == self.current.id
                                       for t in self.creatable):
            return self.creatable
        return self.creatable + (self.current,)


@records.record
class DiscoveryResult:
    """GPUs found and the source that found them (``libvirt`` / ``sysfs``)."""

    source: str
    gpus: tuple[Gpu, ...]

    def gpu(self, address: PciAddress) -> Gpu:
        typed(address, PciAddress, 'address')
        for gpu in self.gpus:
            if gpu.address == address:
                return gpu
        raise exception.DeviceNotFound(address=address)


@records.record
class EnabledType:
    """What configuration enables on one GPU (``[vgpu_<type>]`` resolved):
    its type; ``others``: the further types of a GPU that offers several
    (a layout listing several ``vgpu_types``, ``devices.layout``), each an
    ``EnabledType`` without ``others``.  ``max_instances``: the most of
    the type the GPU may hold (``[vgpu_<type>]/max_instances``, or the
    count a mixed-size layout gives the type)."""

    type_id: TypeId
    resource_class: str = 'VGPU'
    max_instances: int | None = None
    others: tuple[EnabledType, ...] = ()

    @property
    def types(self) -> tuple[EnabledType, ...]:
        """Every type the GPU offers, this one first."""
        return (self,) + self.others

    @property
    def type_ids(self) -> tuple[TypeId, ...]:
        return tuple(t.type_id for t in self.types)

    def of(self, type_id: str) -> EnabledType | None:
        """The ``EnabledType`` of ``type_id`` on this GPU, or None."""
        for setting in self.types:
            if setting.type_id == type_id:
                return setting
        return None


# --- NUMA ---------------------------------------------------------------

MAX_CPU = bounds.MAX_CPU
# Judged by their largest member and length, never expanded (bounds).
parse_cpulist = bounds.parse_cpulist


@records.record
class NumaPinning:
    """Where a guest is pinned on the host: the NUMA nodes of its memory
    (``<numatune><memory nodeset=.../>``) and the CPUs of its vCPUs
    (``<vcpu cpuset=...>``); both empty for a guest pinned nowhere."""

    nodes: bounds.CpuList = bounds.EMPTY
    cpus: bounds.CpuList = bounds.EMPTY

    @property
    def pinned(self) -> bool:
        return bool(self.nodes or self.cpus)

    def is_near(self, numa_node: int | None,
                local_cpus: bounds.CpuList | set[int]) -> bool:
        """Whether a GPU on ``numa_node`` (None: unknown) whose local CPUs
        are ``local_cpus`` (a ``bounds.CpuList`` or a set, empty: unknown)
        is on the guest's nodes: its node is one of them, or one of its
        CPUs runs a vCPU (answered on ranges: nothing is expanded)."""
        if numa_node is not None and numa_node in self.nodes:
            return True
        if isinstance(self.cpus, bounds.CpuList):
            return self.cpus.intersects(local_cpus)
        if isinstance(local_cpus, bounds.CpuList):
            return local_cpus.intersects(self.cpus)
        return bool(set(self.cpus) & set(local_cpus))


UNPINNED = NumaPinning()
