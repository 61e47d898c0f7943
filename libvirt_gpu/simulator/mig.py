"""NVIDIA's driver rules for MIG-backed and mixed-size vGPUs and the vGPU
scheduler (vGPU 17+ vendor interface), as pure functions over a GPU's
driver state.

``kernel.SimKernel`` holds the state (one ``GpuState`` per physical GPU
that has a ``gpu`` section in its profile, plus where each VF's vGPU sits)
and calls these rules under its lock; ``nvml`` answers NVML's calls from
the same state.  The rules, as NVIDIA documents them or others measured
them (what is an assumption says so):

MIG mode
    Per GPU; ``set_mig_mode`` is refused (``IN_USE``) while the GPU's VFs
    are enabled, and turning it off while GPU instances exist is refused
    too.  It survives a reboot (``restore`` keeps it); GPU instances,
    compute instances, VFs and vGPUs do not.
GPU instances (GIs)
    Made from the GPU's GI profile table (``GiTable``): a profile has a
    slice count, a memory size, how many of it may exist at once
    (``instances``) and where it may start (``placements``, in memory
    slices, each ``placement_size`` long).  A GI is made at the lowest free
    start its profile allows (or the one asked for); one that overlaps
    nothing else fits, as long as the GIs' compute slices add up to no more
    than the GPU has.  Else ``INSUFFICIENT_RESOURCES`` (no room) or
    ``INVALID_ARGUMENT`` (a start the profile does not allow).  A GI's id
    follows from where it sits (``gi_id``), as the driver's do.
Enabling VFs (``sriov_numvfs`` 0 -> n)
    Destroys every GI (and compute instance) and clears mixed-size mode;
    with MIG on, the creatable list then stays empty and a type write
    fails with EIO until GIs are made again.
Creatable types (``creatable``)
    MIG on: only MIG-backed types (those with a ``gi_profile_id``), each
    while a GI of its profile has room: a GI holds vGPUs of one
    framebuffer size, at most ``max_per_gi`` of them.  The driver picks the
    GI (``pick_gi``: the lowest id with room), the caller cannot.  A type's
    maximum is ``max_per_gi`` x the GIs of its profile (``max_instances``).
    MIG off: only time-sliced types; in equal-size mode the rule of
    ``capacity.vf_creatable``; in mixed-size mode every type with a
    ``placement_size`` that has a creatable placement.
Placements (time-sliced vGPUs)
    The GPU has ``mixed_slots`` slots; a type of ``placement_size`` slots
    may sit at the multiples of its size (``supported_placements``); the
    driver picks the lowest free one (``place``).  In equal-size mode the
    slots are shared out evenly among ``max_instance`` vGPUs and no vGPU's
    placement is reported (an assumption).
Mixed-size mode
    Set only while no vGPU exists on the GPU (``IN_USE``, "In use by
    another client"), ``NOT_SUPPORTED`` with MIG on or on a GPU without
    ``mixed_slots``, and not with the fixed-share scheduler.
Scheduler (time-sliced vGPUs only)
    Changed only while no guest runs on the GPU (``IN_USE``); fixed share
    is refused in mixed-size mode (``NOT_SUPPORTED``); a policy the GPU
    does not list, or a frequency out of range: ``INVALID_ARGUMENT``.
"""

from __future__ import annotations

from libvirt_gpu.util import records

# NVML's return codes (nvmlReturn_t), as nvidia-ml-py names them; the
# simulator's answers are these numbers (tests/unit/simulator/test_nvml.py
# keeps them equal to the installed binding's).
NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_IN_USE = 19
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_ERROR_UNKNOWN = 999        # an injected failure's default answer

NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
NVML_VGPU_PGPU_HETEROGENEOUS_MODE = 0
NVML_VGPU_PGPU_HOMOGENEOUS_MODE = 1
NVML_VGPU_SCHEDULER_POLICY_BEST_EFFORT = 1
NVML_VGPU_SCHEDULER_POLICY_EQUAL_SHARE = 2
NVML_VGPU_SCHEDULER_POLICY_FIXED_SHARE = 3
POLICIES = (NVML_VGPU_SCHEDULER_POLICY_BEST_EFFORT,
            NVML_VGPU_SCHEDULER_POLICY_EQUAL_SHARE,
            NVML_VGPU_SCHEDULER_POLICY_FIXED_SHARE)
POLICY_NAMES = {NVML_VGPU_SCHEDULER_POLICY_BEST_EFFORT: 'best_effort',
                NVML_VGPU_SCHEDULER_POLICY_EQUAL_SHARE: 'equal_share',
                NVML_VGPU_SCHEDULER_POLICY_FIXED_SHARE: 'fixed_share'}

# The time slice: 1 to 30 ms, as the nvidia module's RmPVMRL takes it
# (0x00TT0001, TT from 0x01 to 0x1E, the range NVIDIA's vGPU software
# documentation gives for RmPVMRL's time slice).  NVML's v2 calls set it as an
# Adaptive Round Robin frequency (``nvmlVgpuSchedulerState_v2_t.frequency``;
# 0 is the driver's default) and report it in ns
# (``nvmlVgpuSchedulerStateInfo_v2_t.timeslice``), within the bounds
# ``nvmlDeviceGetVgpuSchedulerCapabilities`` gives
# (``nvmlVgpuSchedulerCapabilities_t``: minTimeslice/maxTimeslice in ns,
# min/maxFrequencyForARR, min/maxAvgFactorForARR; NVML API Reference
# Guide, "vGPU Structs").  The product sends 1000 // TT per second for TT
# ms, so the frequencies taken are those of the 1 to 30 ms slices: from
# 1000 // 30 = 33 (a 30.3 ms slice, read back as 30 ms) to 1000 per
# second.  The figures of a real GPU are its own (the NVML reference gives
# none); the default slice and the averaging factor's range are
# assumptions.
NS_PER_S = 1000000000
MIN_TIMESLICE_NS = 1000000
MAX_TIMESLICE_NS = 30000000
DEFAULT_TIMESLICE_NS = 2000000
MIN_FREQUENCY = NS_PER_S // MAX_TIMESLICE_NS         # 33 per second
MAX_FREQUENCY = NS_PER_S // MIN_TIMESLICE_NS         # 1000 per second
MIN_AVG_FACTOR = 1
MAX_AVG_FACTOR = 60

# Compute-instance profiles (NVML_COMPUTE_INSTANCE_PROFILE_*) by the slice
# count of the one compute instance that fills a GI.
CI_PROFILE_BY_SLICES = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}


class DriverError(Exception):
    """The driver refused: ``code`` is NVML's return code, ``reason`` one
    line saying why."""

    def __init__(self, code, reason):
        super().__init__(reason)
        self.code = code
        self.reason = reason


# --- what a profile says about a GPU ----------------------------------------

@records.record
class GiProfile:
    """One row of ``nvidia-smi mig -lgip`` (and ``-lgipp``)."""

    id: int                  # the profile id (-cgi <id>; GetGpuInstances)
    nvml_profile: int        # NVML_GPU_INSTANCE_PROFILE_* (GetProfileInfo)
    name: str                # '1g.10gb', '1g.10gb+me', '1g.24gb+gfx'
    slices: int              # compute slices
    memory_mb: int
    instances: int           # how many may exist at once
    placements: tuple        # allowed starts, in memory slices
    placement_size: int      # memory slices it spans
    sm: int = 0
    ce: int = 0
    dec: int = 0
    enc: int = 0
    jpeg: int = 0
    ofa: int = 0
    p2p: bool = False


@records.record
class GiTable:
    """A GPU's GI profiles and its slices."""

    compute_slices: int
    memory_slices: int
    profiles: tuple          # GiProfile

    def profile(self, profile_id):
        for found in self.profiles:
            if found.id == profile_id:
                return found
        return None

    def by_nvml_profile(self, index):
        for found in self.profiles:
            if found.nvml_profile == index:
                return found
        return None


@records.record
class SimGpu:
    """What the driver knows of a physical GPU beyond sysfs (a profile's
    ``gpu`` section on the PF)."""

    name: str
    memory_mib: int
    gi_table: GiTable | None = None     # None: no MIG
    mig_mode: int = 0                   # at boot (it persists)
    mixed_slots: int = 0                # 0: no mixed-size mode
    policies: tuple = POLICIES          # scheduler policies it offers


# --- the driver's state of one GPU ------------------------------------------

@records.record(frozen=False)
class Gi:
    """A GPU instance: where it sits, its compute instance, if any, and
    the scheduler of the vGPUs sharing it in time."""

    id: int
    profile_id: int
    start: int
    size: int
    ci: int | None = None        # compute instance id (one, filling it)
    policy: int = NVML_VGPU_SCHEDULER_POLICY_BEST_EFFORT
    avg_factor: int = 0
    frequency: int = 0

    def timeslice_ns(self):
        return timeslice_ns(self.policy, self.frequency)


@records.record(frozen=False)
class GpuState:
    """What the driver holds for one GPU.  ``to_json``/``from_json`` keep
    it in a file next to a static tree (``sysfs_tree.DRIVER_STATE``)."""

    mig_mode: int = 0
    gis: dict = records.field(default_factory=dict)      # id -> Gi
    heterogeneous: bool = False
    policy: int = NVML_VGPU_SCHEDULER_POLICY_BEST_EFFORT
    avg_factor: int = 0
    frequency: int = 0

    def to_json(self):
        return {'mig_mode': self.mig_mode,
                'gis': [[g.id, g.profile_id, g.start, g.size, g.ci,
                         g.policy, g.avg_factor, g.frequency]
                        for _, g in sorted(self.gis.items())],
                'heterogeneous': self.heterogeneous,
                'policy': self.policy, 'avg_factor': self.avg_factor,
                'frequency': self.frequency}

    @classmethod
    def from_json(cls, data):
        return cls(mig_mode=int(data['mig_mode']),
                   gis={int(g[0]): Gi(*g) for g in data['gis']},
                   heterogeneous=bool(data['heterogeneous']),
                   policy=int(data['policy']),
                   avg_factor=int(data['avg_factor']),
                   frequency=int(data['frequency']))

    def timeslice_ns(self):
        return timeslice_ns(self.policy, self.frequency)


def timeslice_ns(policy, frequency):
    """The time slice NVML reports: none (0) under best effort (an
    assumption: NVML says 0 without active scheduling), else the one the
    frequency gives, or the driver's default."""
    if policy == NVML_VGPU_SCHEDULER_POLICY_BEST_EFFORT:
        return 0
    return NS_PER_S // frequency if frequency else DEFAULT_TIMESLICE_NS


@records.record
class Placed:
    """Where the driver put a VF's vGPU: its GI (MIG-backed) or its
    placement (time-sliced)."""

    type_id: str
    gi: int | None = None
    placement: int | None = None


# --- GPU instances -----------------------------------------------------------

def gi_id(start, size, memory_slices):
    """The GI id the driver gives a GI at ``start`` spanning ``size``
    memory slices: ids count the possible positions from the whole GPU
    down (8 slices: 7g -> 0; 4-slice halves 1, 2; 2-slice quarters 3-6;
    single slices 7-14), as ``nvidia-smi mig -lgi`` shows them."""
    base, span = 0, memory_slices
    while span > size and span > 1:
        base += memory_slices // span
        span //= 2
    return base + start // max(size, 1)


def _overlaps(start, size, gis):
    return any(start < g.start + g.size and g.start < start + size
               for g in gis)


def free_starts(table, state, profile):
    """The starts at which a GI of ``profile`` could be made now."""
    gis = list(state.gis.values())
    if sum(1 for g in gis if g.profile_id == profile.id) >= \
            profile.instances:
        return ()
    used = sum(table.profile(g.profile_id).slices for g in gis)
    if used + profile.slices > table.compute_slices:
        return ()
    return tuple(s for s in profile.placements
                 if not _overlaps(s, profile.placement_size, gis))


def create_gi(gpu, state, profile_id, start=None):
    """Make a GI of ``profile_id`` (at ``start``, else the lowest free
    one) in ``state``; returns it or raises ``DriverError``."""
    table = gpu.gi_table
    if table is None:
        raise DriverError(NVML_ERROR_NOT_SUPPORTED,
                          '%s has no MIG GPU instances' % gpu.name)
    if state.mig_mode != NVML_DEVICE_MIG_ENABLE:
        raise DriverError(NVML_ERROR_NOT_SUPPORTED,
                          'MIG mode is off on %s: turn it on first'
                          % gpu.name)
    profile = table.profile(profile_id)
    if profile is None:
        raise DriverError(NVML_ERROR_INVALID_ARGUMENT,
                          '%s has no GPU instance profile %r'
                          % (gpu.name, profile_id))
    if start is not None and start not in profile.placements:
        raise DriverError(NVML_ERROR_INVALID_ARGUMENT,
                          'profile %s cannot start at slice %d (it may at '
                          '%s)' % (profile.name, start, ', '.join(
                              str(p) for p in profile.placements)))
    free = free_starts(table, state, profile)
    if start is not None:
        free = tuple(s for s in free if s == start)
    if not free:
        raise DriverError(NVML_ERROR_INSUFFICIENT_RESOURCES,
                          'no room for a %s GPU instance on %s next to %s'
                          % (profile.name, gpu.name, describe_gis(
                              table, state) or 'nothing'))
    gi = Gi(id=gi_id(free[0], profile.placement_size,
                     table.memory_slices),
            profile_id=profile.id, start=free[0],
            size=profile.placement_size)
    state.gis[gi.id] = gi
    return gi


def describe_gis(table, state):
    return ', '.join('%s at %d' % (table.profile(g.profile_id).name,
                                   g.start)
                     for _, g in sorted(state.gis.items()))


# --- vGPUs -------------------------------------------------------------------

def is_mig_backed(mtype):
    return mtype.gi_profile_id is not None


def _on_gi(gi_id_, placed, types):
    return [types[p.type_id] for p in placed if p.gi == gi_id_]


def gi_room(gi, mtype, placed, types):
    """Whether ``gi`` can take one more vGPU of ``mtype``: its profile,
    one framebuffer size per GI, ``max_per_gi``."""
    if gi.profile_id != mtype.gi_profile_id:
        return False
    there = _on_gi(gi.id, placed, types)
    if any(t.framebuffer != mtype.framebuffer for t in there):
        return False
    return len(there) < (mtype.max_per_gi or 1)


def pick_gi(state, mtype, placed, types):
    """The GI the driver puts a new vGPU of ``mtype`` in (the lowest id
    with room), or None."""
    for gid, gi in sorted(state.gis.items()):
        if gi_room(gi, mtype, placed, types):
            return gid
    return None


def max_instances(gpu, state, mtype):
    """``nvmlVgpuTypeGetMaxInstances``: a MIG-backed type's is max per GI x
    the GIs of its profile now; a time-sliced type's its own (0 while MIG
    is on, as it cannot be made)."""
    if is_mig_backed(mtype):
        return (mtype.max_per_gi or 1) * sum(
            1 for g in state.gis.values()
            if g.profile_id == mtype.gi_profile_id)
    if state.mig_mode == NVML_DEVICE_MIG_ENABLE:
        return 0
    return mtype.max_instance


def placement_size(gpu, mtype, heterogeneous):
    """Slots a time-sliced vGPU of ``mtype`` occupies (None: it has no
    placement in this mode)."""
    if heterogeneous:
        return mtype.placement_size
    slots = gpu.mixed_slots or mtype.max_instance
    return max(1, slots // mtype.max_instance)


def supported_placements(gpu, mtype, heterogeneous):
    """The placement ids a vGPU of ``mtype`` may have in this mode."""
    size = placement_size(gpu, mtype, heterogeneous)
    if size is None or is_mig_backed(mtype):
        return ()
    slots = gpu.mixed_slots or mtype.max_instance
    if heterogeneous:
        return tuple(range(0, slots - size + 1, size))
    return tuple(i * size for i in range(mtype.max_instance))


def creatable_placements(gpu, state, mtype, placed, types):
    """The placement ids free for ``mtype`` now (time-sliced types; MIG
    off).  In equal-size mode the driver reports no vGPU's placement (an
    assumption: the GI and placement files are for MIG-backed and
    mixed-size vGPUs), so the free ones are the type's placements past
    those the vGPUs of its size fill, while the type fits the GPU's size."""
    if state.mig_mode == NVML_DEVICE_MIG_ENABLE or is_mig_backed(mtype):
        return ()
    size = placement_size(gpu, mtype, state.heterogeneous)
    if size is None:
        return ()
    supported = supported_placements(gpu, mtype, state.heterogeneous)
    if not state.heterogeneous:
        sizes = {types[p.type_id].framebuffer for p in placed}
        if sizes and sizes != {mtype.framebuffer}:
            return ()
        return supported[len(placed):]
    taken = [(p.placement, placement_size(gpu, types[p.type_id], True))
             for p in placed if p.placement is not None]
    return tuple(s for s in supported
                 if not any(s < t + n and t < s + size for t, n in taken))


def creatable(gpu, state, vf_types, placed, equal_size_rule):
    """The types a free VF lists as creatable now.

    ``vf_types``: the VF's SimTypes; ``placed``: the GPU's vGPUs
    (``Placed``); ``equal_size_rule()``: ``capacity.vf_creatable`` over
    the time-sliced types, for a GPU in equal-size mode.
    """
    types = {t.id: t for t in vf_types}
    if state.mig_mode == NVML_DEVICE_MIG_ENABLE:
        # gi_room: a GI takes types of its own profile only, so never a
        # time-sliced one
        return tuple(t for t in vf_types
                     if pick_gi(state, t, placed, types) is not None)
    if state.heterogeneous:
        return tuple(t for t in vf_types if not is_mig_backed(t)
                     and creatable_placements(gpu, state, t, placed, types))
    return tuple(t for t in equal_size_rule() if not is_mig_backed(t))


def place(gpu, state, mtype, placed, types):
    """Where the driver puts a new vGPU of ``mtype`` (a ``Placed``), or
    None when it does not fit."""
    if state.mig_mode == NVML_DEVICE_MIG_ENABLE:
        gid = pick_gi(state, mtype, placed, types)
        return None if gid is None else Placed(mtype.id, gi=gid)
    if is_mig_backed(mtype):
        return None
    free = creatable_placements(gpu, state, mtype, placed, types)
    if not free:
        return None
    return Placed(mtype.id, placement=free[0] if state.heterogeneous
                  else None)


# --- modes and the scheduler -------------------------------------------------

def set_mig_mode(gpu, state, mode, vfs_enabled):
    if gpu.gi_table is None:
        raise DriverError(NVML_ERROR_NOT_SUPPORTED,
                          '%s does not support MIG' % gpu.name)
    if mode not in (NVML_DEVICE_MIG_DISABLE, NVML_DEVICE_MIG_ENABLE):
        raise DriverError(NVML_ERROR_INVALID_ARGUMENT,
                          'MIG mode %r is neither 0 nor 1' % (mode,))
    if mode == state.mig_mode:
        return
    if vfs_enabled:
        raise DriverError(NVML_ERROR_IN_USE,
                          'MIG mode of %s cannot change while its VFs are '
                          'enabled: disable them (sriov_numvfs 0) first'
                          % gpu.name)
    if state.gis:
        raise DriverError(NVML_ERROR_IN_USE,
                          'MIG mode of %s cannot change while GPU instances '
                          'exist: destroy them first' % gpu.name)
    state.mig_mode = mode
    state.heterogeneous = False


def set_heterogeneous(gpu, state, mode, placed):
    if mode not in (NVML_VGPU_PGPU_HETEROGENEOUS_MODE,
                    NVML_VGPU_PGPU_HOMOGENEOUS_MODE):
        raise DriverError(NVML_ERROR_INVALID_ARGUMENT,
                          'vGPU heterogeneous mode %r is neither 0 nor 1'
                          % (mode,))
    if state.mig_mode == NVML_DEVICE_MIG_ENABLE or not gpu.mixed_slots:
        raise DriverError(NVML_ERROR_NOT_SUPPORTED,
                          'mixed-size mode is not available on %s%s'
                          % (gpu.name, ' with MIG on' if state.mig_mode
                             else ''))
    wanted = mode == NVML_VGPU_PGPU_HETEROGENEOUS_MODE
    if wanted == state.heterogeneous:
        return
    if placed:
        raise DriverError(NVML_ERROR_IN_USE,
                          'In use by another client: %s holds vGPUs; '
                          'destroy them before changing its vGPU mode'
                          % gpu.name)
    if wanted and state.policy == NVML_VGPU_SCHEDULER_POLICY_FIXED_SHARE:
        raise DriverError(NVML_ERROR_NOT_SUPPORTED,
                          'mixed-size mode does not work with the fixed-'
                          'share scheduler on %s: choose best effort or '
                          'equal share first' % gpu.name)
    state.heterogeneous = wanted


def set_scheduler(gpu, state, policy, avg_factor, frequency, running,
                  gi=None):
    """The GPU's scheduler, or with ``gi`` (a ``Gi``) that GPU
    instance's (the vGPUs sharing it in time; MIG on)."""
    if (state.mig_mode == NVML_DEVICE_MIG_ENABLE) != (gi is not None):
        raise DriverError(NVML_ERROR_NOT_SUPPORTED,
                          'the vGPU scheduler of %s is for time-sliced '
                          'vGPUs: %s' % (gpu.name, 'set it per GPU instance '
                                         'with MIG on' if gi is None else
                                         'MIG is off'))
    if policy not in gpu.policies:
        raise DriverError(NVML_ERROR_INVALID_ARGUMENT,
                          'scheduler policy %r is not one of %s on %s'
                          % (policy, ', '.join(str(p) for p in gpu.policies),
                             gpu.name))
    if frequency and not MIN_FREQUENCY <= frequency <= MAX_FREQUENCY:
        raise DriverError(NVML_ERROR_INVALID_ARGUMENT,
                          'frequency %d is outside %d-%d per second'
                          % (frequency, MIN_FREQUENCY, MAX_FREQUENCY))
    if avg_factor and not MIN_AVG_FACTOR <= avg_factor <= MAX_AVG_FACTOR:
        raise DriverError(NVML_ERROR_INVALID_ARGUMENT,
                          'average factor %d is outside %d-%d'
                          % (avg_factor, MIN_AVG_FACTOR, MAX_AVG_FACTOR))
    if policy == NVML_VGPU_SCHEDULER_POLICY_FIXED_SHARE and \
            state.heterogeneous:
        raise DriverError(NVML_ERROR_NOT_SUPPORTED,
                          'fixed share is refused in mixed-size mode on %s'
                          % gpu.name)
    if running:
        raise DriverError(NVML_ERROR_IN_USE,
                          'the scheduler of %s changes only while no VM '
                          'runs on it (%s)' % (gpu.name, ', '.join(running)))
    target = gi if gi is not None else state
    target.policy = policy
    target.avg_factor = avg_factor
    target.frequency = frequency
