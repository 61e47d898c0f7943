"""How many vGPUs a GPU can hold: the rules, in one place, without I/O.

Placement's inventory (``placement.model``) and the allocator's free count
(``allocator.Allocator.free``) both come from here, so what Placement is
told a GPU can hold and what the allocator lets it hold cannot drift apart.

``vgpu_total(gpu, enabled)`` is the capacity of one physical GPU
(``objects.Gpu``, read with its VFs) for its enabled type:

* a GPU without VFs (T4): ``available_instances`` of the type plus the
  vGPUs of the type it holds (``parent_total``);
* a GPU whose vGPUs live on VFs, one each (Ampere mdev on VFs, NVIDIA's
  vGPU 17+ vendor interface): the vGPUs of the type on all its functions
  plus the free functions that can take one now.

* a GPU in MIG mode or mixed-size mode (``room``, a ``DriverRoom``): the
  driver's numbers (see "the driver's room" below).

Either way never above the limit (``limit``), never below what exists.
Without any limit a VF-based GPU reports what exists plus one: summing free
VFs would over-report (16 VFs of an A100 are not 16 vGPUs), and an
under-report is the safe mistake.

``offered_types(gpu, setting, rooms)``: which of the types of a GPU that
offers several (a layout's) it offers now: all where the driver counts
each one's room (MIG, mixed sizes), one in equal-size mode (a layout
drifted from).

``free(total, used, pending, other_types)`` is what the allocator can still
give once it knows the GPU's leases, and ``free_after`` what is left of it
once one more lease lands there; ``exceeds`` whether a count passes a
GPU's maximum (a carving's).
"""

from __future__ import annotations

# What the rules read of ``objects``' records, as the checker sees them
# (this module imports none of ours: it sits at the floor).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from typing import Any, Protocol

    class _Type(Protocol):          # objects.VgpuType
        @property
        def id(self) -> str: ...
        @property
        def available_instances(self) -> int: ...
        @property
        def max_instance(self) -> int | None: ...

    class _Setting(Protocol):       # objects.EnabledType
        @property
        def type_id(self) -> str: ...
        @property
        def max_instances(self) -> int | None: ...

    class _Mdev(Protocol):          # objects.Mdev
        @property
        def type_id(self) -> str: ...

    class _Gpu(Protocol):           # objects.Gpu
        @property
        def address(self) -> object: ...
        @property
        def mdevs(self) -> Sequence[_Mdev]: ...
        @property
        def vf_gpus(self) -> Sequence[_Gpu]: ...
        @property
        def functions(self) -> Sequence[_Gpu]: ...
        @property
        def is_vf(self) -> bool: ...
        @property
        def used_type_ids(self) -> Sequence[str]: ...
        @property
        def vgpu_types(self) -> Sequence[_Type]: ...
        def mdev_type(self, type_id: str) -> _Type | None: ...
        def offered_type(self, type_id: str) -> _Type | None: ...

    class _Member(Protocol):        # objects.IommuMember
        @property
        def address(self) -> Any: ...
        @property
        def host_uses(self) -> bool: ...
        @property
        def companion(self) -> bool: ...
        @property
        def host_class(self) -> str | None: ...
        @property
        def class_code(self) -> str | None: ...
        @property
        def driver(self) -> str | None: ...

    class _GroupedGpu(Protocol):    # objects.Gpu, its IOMMU group
        @property
        def iommu_group(self) -> int | None: ...
        @property
        def iommu_members(self) -> Sequence[_Member]: ...

    class _Gi(Protocol):            # nvml's GPU instance
        @property
        def id(self) -> int: ...
        @property
        def profile_id(self) -> int: ...

NO_IOMMU_GROUP = (
    'no IOMMU group, so VFIO cannot hand it to a guest: turn the IOMMU on '
    '(VT-d / AMD-Vi in the firmware, intel_iommu=on on Intel hosts) and '
    'reboot')


def pgpu_refusal(gpu: _GroupedGpu) -> str | None:
    """Why ``gpu`` cannot be given whole to a guest (its whole-GPU capacity
    is then 0), or None: it has no IOMMU group, or its group also holds a
    device the host uses (VFIO hands a guest the whole group, so that
    device would be taken from the host).  vGPUs need no group of their
    parent: each mdev or VF gets its own."""
    if gpu.iommu_group is None:
        return NO_IOMMU_GROUP
    used = [m for m in gpu.iommu_members if m.host_uses]
    if used:
        return ('its IOMMU group %d also holds %s, which the host uses; VFIO '
                'hands a guest the whole group: put the GPU in a slot with a '
                'group of its own' % (gpu.iommu_group, ', '.join(
                    '%s (%s, driver %s)' % (
                        m.address, m.host_class or m.class_code, m.driver)
                    for m in used)))
    return None


def pgpu_companions(gpu: _GroupedGpu) -> tuple[Any, ...]:
    """The functions of ``gpu``'s IOMMU group that go to a guest with it
    (its HDMI audio function), sorted."""
    return tuple(sorted(m.address for m in gpu.iommu_members
                        if m.companion))


def limit(mtype: _Type, enabled: _Setting | None = None) -> int | None:
    """The smaller of NVIDIA's per-GPU maximum (``max_instance`` of the
    description, or the published one) and ``[vgpu_<type>]/max_instances``
    (``enabled``; None: the driver's maximum alone); None when neither is
    known.  The setting can lower the maximum, never raise it above the
    driver's."""
    limits = [v for v in (mtype.max_instance,
                          enabled.max_instances if enabled else None)
              if v is not None]
    return min(limits) if limits else None


def exceeds(mtype, wanted, held=0, enabled=None):
    """Whether ``wanted`` vGPUs of ``mtype`` beside the ``held`` ones a GPU
    has pass its maximum (``limit``); False when no maximum is known (a
    carving's count checked against the GPU)."""
    cap = limit(mtype, enabled)
    return cap is not None and wanted + held > cap


def parent_total(mtype: _Type | None, used: int,
                 enabled: _Setting | None) -> int:
    """Capacity of one mdev parent without VFs for the type ``mtype``
    (``objects.VgpuType`` as the parent lists it, or None when it does not)
    of which it holds ``used`` vGPUs."""
    if mtype is None:
        return 0
    total = mtype.available_instances + used
    cap = limit(mtype, enabled)
    if cap is not None:
        total = min(total, max(cap, used))
    return total


def vgpu_total(gpu: _Gpu, enabled: _Setting,
               room: DriverRoom | None = None, warn: bool = True) -> int:
    """Capacity of ``enabled`` (``objects.EnabledType``) on the physical GPU
    ``gpu`` (see the module doc); ``room`` (``DriverRoom``): the driver's
    numbers for a GPU in MIG or mixed-size mode, which then decide.
    ``warn``: say when no maximum is known and only the vGPUs that exist
    plus one are counted (what a report of the total should say; not the
    allocator, which asks only whether one more fits, and whose refusal
    is the one line a guest start shows)."""
    if room is not None:
        return room_total(room, enabled)
    type_id = enabled.type_id
    if not gpu.vf_gpus:
        used = sum(1 for m in gpu.mdevs if m.type_id == type_id)
        return parent_total(gpu.mdev_type(type_id), used, enabled)
    mtype = gpu.offered_type(type_id)
    if mtype is None:
        return 0
    used = 0
    offering = 0
    for function in gpu.functions:
        held = function.used_type_ids
        used += sum(1 for t in held if t == type_id)
        if function.is_vf and held:
            continue                     # a VF holds one vGPU
        for candidate in function.vgpu_types:
            if candidate.id == type_id and candidate.available_instances > 0:
                offering += (1 if function.is_vf
                             else candidate.available_instances)
                break
    cap = limit(mtype, enabled)
    if cap is None:
        if not warn:
            return used + min(offering, 1)
        import logging      # not on the qemu hook's path otherwise
        logging.getLogger(__name__).warning(
            'no maximum known for vGPU type %s on GPU %s (no max_instance in '
            'its description, no published one): reporting %d; set '
            '[vgpu_%s]/max_instances', type_id, gpu.address,
            used + min(offering, 1), type_id)
        return used + min(offering, 1)
    return min(used + offering, max(cap, used))


def offered_types(gpu, setting, rooms):
    """The types of ``setting`` (``objects.EnabledType``) that the
    physical GPU ``gpu`` offers now, each its own Placement provider.

    A GPU offering several (a layout's, ``setting.others``) in MIG or
    mixed-size mode has the driver count each one's room (``rooms``:
    ``{(PciAddress, TypeId): DriverRoom}``, ``Vgpus.rooms``), which the
    layout keeps apart: all of them.  Without a room for each (equal-size
    mode: mixed-size mode turned off by hand, a drift from the layout;
    MIG turned off; NVML unable to say), the driver holds vGPUs of one
    type at a time, so a total for each type would promise vGPUs of
    several sizes of which it takes one: only one type is offered until
    the layout is applied again, the one whose vGPUs the GPU holds, else
    the first."""
    types = setting.types
    if len(types) < 2 or all((gpu.address, one.type_id) in rooms
                             for one in types):
        return types
    held = {type_id for function in gpu.functions
            for type_id in function.used_type_ids}
    for one in types:
        if one.type_id in held:
            return (one,)
    return types[:1]


def free(total: int, used: int, pending: int = 0,
         other_types: bool = False) -> int:
    """What a GPU of capacity ``total`` can still give: less the vGPUs it
    holds (``used``) and the leases not created yet (``pending``); 0 while
    a vGPU of another type blocks it (``other_types``: NVIDIA's time-sliced
    vGPUs share one type per GPU).  On a GPU without VFs any vGPU or lease
    of another type blocks it; on a GPU whose vGPUs live on VFs only a
    lease not created yet does, since each VF lists what the driver still
    lets it make."""
    if other_types:
        return 0
    return max(0, total - used - pending)


def free_after(free_now: int, type_id: str, taken: str) -> int:
    """What a GPU without VFs that can give ``free_now`` more vGPUs of
    ``type_id`` can give once a lease of the type ``taken`` is added there:
    one less of the same type, none of another (one type per GPU, as
    ``free``'s ``other_types``): the allocator's count within one
    transaction."""
    if taken != type_id:
        return 0
    return max(0, free_now - 1)


# --- MIG-backed and mixed-size GPUs: the driver's room ----------------------
#
# On a GPU in MIG mode or in mixed-size mode a free VF lists a type while
# the driver has room for one more anywhere, so counting free VFs would
# promise more than the driver makes.  The room is then the driver's own
# numbers, read through NVML by the vendor kind (``room`` of
# ``backends.nvidia_vgpu``) into these records:
#
# * MIG-backed: max instances per GI (``nvmlVgpuTypeGetMaxInstancesPerGpu
#   Instance``) x the GIs of the type's GI profile that exist; a GI holds
#   vGPUs of one framebuffer size, so a GI holding another size gives none;
# * mixed sizes: the vGPUs of the type plus its creatable placements
#   (``nvmlDeviceGetVgpuTypeCreatablePlacements``, each ``placement_size``
#   slots long).

MODE_EQUAL = 'time-sliced'
MODE_MIXED = 'mixed-size'
MODE_MIG = 'mig-backed'


class _Value(object):
    """An immutable record of ``_fields`` (keyword arguments, with the
    defaults of ``_defaults``), compared by value.  Not a dataclass: the
    qemu hook imports this module and must not pay for ``dataclasses``."""

    __slots__: tuple[str, ...] = ()
    _fields: tuple[str, ...] = ()
    _defaults: dict[str, object] = {}

    def __init__(self, **values: object) -> None:
        unknown = set(values) - set(self._fields)
        if unknown:
            raise TypeError('%s has no field %s' % (
                type(self).__name__, ', '.join(sorted(unknown))))
        for name in self._fields:
            if name in values:
                value = values[name]
            elif name in self._defaults:
                value = self._defaults[name]
            else:
                raise TypeError('%s needs %s' % (type(self).__name__, name))
            object.__setattr__(self, name, value)

    def __setattr__(self, name, value):
        raise AttributeError('%s is immutable' % type(self).__name__)

    def _values(self):
        return tuple(getattr(self, n) for n in self._fields)

    def __eq__(self, other):
        return type(other) is type(self) and other._values() == self._values()

    def __hash__(self):
        return hash(self._values())

    def __repr__(self):
        return '%s(%s)' % (type(self).__name__, ', '.join(
            '%s=%r' % (n, getattr(self, n)) for n in self._fields))


class GiRoom(_Value):
    """One MIG GPU instance as capacity sees it, for one vGPU type:
    ``id``, ``profile_id``, ``profile`` ('1g.10gb'), ``used`` (vGPUs in it,
    any type) and ``capacity`` (vGPUs of the type it can hold in all: 0
    for a GI of another profile or one holding another framebuffer
    size)."""

    __slots__ = _fields = ('id', 'profile_id', 'profile', 'used',
                           'capacity')
    id: int
    profile_id: int
    profile: str
    used: int
    capacity: int

    @property
    def free(self) -> int:
        return max(0, self.capacity - self.used) if self.capacity else 0


class DriverRoom(_Value):
    """What the driver lets one GPU hold of one vGPU type: its ``mode``
    (MODE_MIG or MODE_MIXED), ``type_id``, ``used`` (vGPUs of the type on
    the GPU), its ``gis`` (``GiRoom``, MIG-backed) or its
    ``placement_size`` and ``placements`` (the creatable placement ids,
    free now; mixed sizes)."""

    __slots__ = _fields = ('mode', 'type_id', 'used', 'gis',
                           'placement_size', 'placements')
    _defaults = {'gis': (), 'placement_size': None, 'placements': ()}
    mode: str
    type_id: str
    used: int
    gis: tuple[GiRoom, ...]
    placement_size: int | None
    placements: tuple[int, ...]

    @property
    def total(self) -> int:
        if self.mode == MODE_MIG:
            return sum(g.capacity for g in self.gis)
        return self.used + len(self.placements)


def gi_rooms(gis: Iterable[_Gi], profiles: Mapping[int, str],
             gi_profile_id: int | None, max_per_gi: int,
             framebuffer_mib: int | None,
             held: Sequence[tuple[int | None, int | None]]
             ) -> tuple[GiRoom, ...]:
    """``GiRoom`` of each GI for a MIG-backed type of GI profile
    ``gi_profile_id``, ``max_per_gi`` vGPUs per GI and ``framebuffer_mib``.

    ``gis``: the GPU instances that exist (id, profile_id); ``profiles``:
    ``{profile id: name}``; ``held``: ``(gi id, framebuffer MiB)`` of each
    vGPU that exists.  A GI of another profile holds none of the type; a
    GI holding a vGPU of another framebuffer size holds none either."""
    rooms = []
    for gi in sorted(gis, key=lambda g: g.id):
        sizes = [size for gid, size in held if gid == gi.id]
        if gi.profile_id != gi_profile_id or any(
                size != framebuffer_mib for size in sizes):
            room = 0
        else:
            room = max(max_per_gi or 1, len(sizes))
        rooms.append(GiRoom(id=gi.id, profile_id=gi.profile_id,
                            profile=profiles.get(gi.profile_id,
                                                 str(gi.profile_id)),
                            used=len(sizes), capacity=room))
    return tuple(rooms)


def room_total(room: DriverRoom, enabled: _Setting) -> int:
    """The capacity of ``room`` (``DriverRoom``), lowered by
    ``[vgpu_<type>]/max_instances`` (never below what exists)."""
    total = room.total
    if enabled.max_instances is not None:
        total = min(total, max(enabled.max_instances, room.used))
    return total
