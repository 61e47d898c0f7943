"""A GPU's layout: what the configuration declares, what a GPU offers and
is, and the rules that join them.  Pure: no I/O, no oslo.config (``conf``
is anything that reads like a ConfigOpts, the CLI's snapshot included).

The configuration (options declared in ``libvirt_gpu.conf.layout``)::

    [gpu]
    layouts = h100_mig

    [layout_h100_mig]
    gpus = 10de:2331                  # addresses or vendor:product ids
    mode = mig                        # time-sliced | mixed-size | mig |
                                      # mig-time-sliced
    gpu_instances = 1g.10gb:4, 3g.40gb:1
    vgpu_types = nvidia-1150, nvidia-1152   # <type>[:<count>]
    scheduler = equal-share           # time-sliced modes only
    time_slice_ms = 4

Three kinds of rule, each an error naming the option:

* ``read_layouts`` (the configuration alone): a mode's own rules (GPU
  instances only in MIG modes, and needed there; a scheduler only in the
  time-sliced modes; fixed share not with mixed sizes; a time slice only
  with equal or fixed share; one type in time-sliced mode; a count for
  each type of a mixed-size layout offering several);
* ``claims`` (against the host's GPUs): a GPU matched by two layouts, an
  address that names no GPU or a VF;
* ``check`` (against what the GPU reports through NVML, a ``GpuFacts``):
  a GI profile it does not have, a GI layout its slices or memory cannot
  hold, a type it does not support, a time-sliced type on a MIG GPU or a
  MIG-backed type on a time-sliced one, a type whose GI profile the
  layout makes no GI of, time-sliced types of several sizes without
  ``mixed-size``, two types of one GI profile, the counts of a mixed-size
  layout that do not fit together (``placements_fit``).

Several types on one GPU: each type is its own Placement provider, so
what Placement accepts of one type must never take the room of another.
In the MIG modes each type lives in the GIs of its own profile (two types
of one profile would share them: refused), so their capacities are apart.
In mixed-size mode the types share the GPU's placement slots and the
driver picks where each vGPU sits, so each type gets a count (its
Placement total) and the counts must fit together whatever placements the
driver picks (``placements_fit``).
"""

from __future__ import annotations

from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.devices import selectors as selectors_mod
from libvirt_gpu.util import records

TIME_SLICED = 'time-sliced'
MIXED_SIZE = 'mixed-size'
MIG = 'mig'
MIG_TIME_SLICED = 'mig-time-sliced'
MODES = (TIME_SLICED, MIXED_SIZE, MIG, MIG_TIME_SLICED)
MIG_MODES = (MIG, MIG_TIME_SLICED)
TIME_SLICED_MODES = (TIME_SLICED, MIXED_SIZE, MIG_TIME_SLICED)

BEST_EFFORT = 'best-effort'
EQUAL_SHARE = 'equal-share'
FIXED_SHARE = 'fixed-share'
# nvmlVgpuSchedulerPolicy (NVML_VGPU_SCHEDULER_POLICY_*)
SCHEDULERS = {BEST_EFFORT: 1, EQUAL_SHARE: 2, FIXED_SHARE: 3}
POLICY_NAMES = {number: name for name, number in SCHEDULERS.items()}
# RmPVMRL, the nvidia module's registry key for the scheduler
RMPVMRL = {BEST_EFFORT: 0x00, EQUAL_SHARE: 0x01, FIXED_SHARE: 0x11}
TIME_SLICE_MS = (1, 30)

SECTION_PREFIX = 'layout_'


def section(name):
    return SECTION_PREFIX + name


class LayoutError(exception.LibvirtGpuError):
    msg_fmt = 'layout %(layout)s, GPU %(address)s: %(reason)s'


class GpuBusy(LayoutError):
    msg_fmt = ('layout %(layout)s, GPU %(address)s: not changed, it holds '
               'vGPUs of %(domains)s; %(what)s needs the GPU without vGPUs: '
               'stop or move those guests first')


class StepFailed(LayoutError):
    msg_fmt = ('layout %(layout)s, GPU %(address)s: %(step)s failed: '
               '%(reason)s; done: %(done)s; left: %(left)s (run `libvirt-gpu '
               'layout apply` again once the cause is fixed: it goes on '
               'from here)')


@records.record
class GiCount:
    """``3g.40gb:1`` of ``gpu_instances``."""

    profile: str
    count: int

    def __str__(self):
        return '%s:%d' % (self.profile, self.count)


@records.record
class Layout:
    """One ``[layout_<name>]`` section, read and checked on its own."""

    name: str
    gpus: tuple                   # objects.GpuSelector
    mode: str
    vgpu_types: tuple             # objects.TypeId, in the order given
    gpu_instances: tuple = ()     # GiCount
    # the count given to each of vgpu_types (None: none given), same order
    type_counts: tuple = ()
    scheduler: str | None = None
    time_slice_ms: int | None = None

    @property
    def section(self):
        return section(self.name)

    @property
    def mig(self):
        return self.mode in MIG_MODES

    def count(self, type_id):
        """The count the layout gives ``type_id`` (None: none)."""
        for listed, count in zip(self.vgpu_types, self.type_counts):
            if listed == type_id:
                return count
        return None

    def option(self, name):
        return '[%s]/%s' % (self.section, name)


@records.record
class GiProfile:
    """One row of a GPU's GPU-instance profile table (NVML
    ``nvmlDeviceGetGpuInstanceProfileInfo``; ``nvidia-smi mig -lgip``)."""

    id: int                 # NVML's profile id (19: 1g.10gb on an H100)
    name: str               # '1g.10gb', '1g.10gb+me', '1g.24gb+gfx'
    slices: int             # compute slices (sliceCount)
    instances: int          # how many fit on the empty GPU (instanceCount)
    memory_mib: int         # memorySizeMB
    # where one may sit: (start, size) in memory slices
    # (nvmlDeviceGetGpuInstancePossiblePlacements); () when not read
    placements: tuple = ()


@records.record
class TypeFacts:
    """A vGPU type the GPU supports, as NVML describes it."""

    type_id: objects.TypeId
    name: str | None
    framebuffer_mib: int | None
    gi_profile_id: int | None = None   # None: time-sliced (not MIG-backed)
    max_per_gi: int | None = None
    # time-sliced types in mixed-size mode: the slots one vGPU spans and
    # where it may start (nvmlDeviceGetVgpuTypeSupportedPlacements); None
    # and () when not read
    placement_size: int | None = None
    placements: tuple = ()

    @property
    def mig_backed(self):
        return self.gi_profile_id is not None


@records.record
class GpuFacts:
    """What a GPU offers, whatever its state now: its GI profiles (empty
    without MIG) and the vGPU types it supports in any mode."""

    address: objects.PciAddress
    mig: bool | None = None   # MIG mode when read (None: the GPU has none)
    profiles: tuple = ()      # GiProfile
    types: tuple = ()         # TypeFacts
    vfs_total: int = 0

    def profile(self, name):
        for profile in self.profiles:
            if profile.name == name:
                return profile
        return None

    def profile_by_id(self, profile_id):
        for profile in self.profiles:
            if profile.id == profile_id:
                return profile
        return None

    def type(self, type_id):
        for facts in self.types:
            if facts.type_id == type_id:
                return facts
        return None

    @property
    def slices(self):
        """The GPU's compute slices: those of its largest profile."""
        return max((p.slices for p in self.profiles), default=0)

    @property
    def memory_mib(self):
        return max((p.memory_mib for p in self.profiles), default=0)

    @property
    def memory_slice_mib(self):
        """The smallest profile's memory: one memory slice."""
        return min((p.memory_mib for p in self.profiles), default=0)


@records.record
class Scheduler:
    """A vGPU scheduler state: policy name, time slice in ms (None: the
    driver's default)."""

    policy: str
    time_slice_ms: int | None = None

    def __str__(self):
        if self.time_slice_ms:
            return '%s, %d ms' % (self.policy, self.time_slice_ms)
        return self.policy


@records.record
class GpuInstance:
    """A MIG GPU instance that exists."""

    id: int
    profile_id: int
    scheduler: Scheduler | None = None   # mig-time-sliced GIs
    start: int | None = None     # its placement: first memory slice
    size: int | None = None      # and how many
    # whether it has its compute instance (None: not read); without one
    # (a failed apply that could not destroy it again) it holds no vGPU
    compute: bool | None = None


@records.record
class GpuState:
    """A GPU as it is now (NVML and sysfs).  None: not answered."""

    address: objects.PciAddress
    mig: bool | None
    vfs: int                          # sriov_numvfs
    vfs_total: int                    # sriov_totalvfs
    gpu_instances: tuple = ()         # GpuInstance
    mixed_size: bool | None = None    # heterogeneous mode (None: N/A)
    scheduler: Scheduler | None = None
    vgpus: tuple = ()                 # VFs (PciAddress) that hold a vGPU


# --- the configuration alone ------------------------------------------------

def _error(layout_name, option, reason):
    return exception.ConfigError(
        reason='[%s]/%s: %s' % (section(layout_name), option, reason))


def _count(text, low, high):
    """``text`` as a count from ``low`` to ``high``, or None: ASCII digits
    only (``str.isdigit`` takes ``²``, which ``int`` refuses, and ``٣``,
    which ``int`` reads as 3)."""
    text = text.strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 6:
        return None
    value = int(text)
    return value if low <= value <= high else None


def parse_gi_count(layout_name, text):
    """``1g.10gb:4`` -> GiCount; ConfigError naming the option."""
    profile, sep, count = text.strip().rpartition(':')
    if not sep:
        profile, count = count, '1'
    profile = profile.strip().lower()
    if profile.startswith('mig '):
        profile = profile[4:].strip()
    count = _count(count, 1, 64)
    if not profile or count is None or len(profile) > 32:
        raise _error(layout_name, 'gpu_instances',
                     '%r is not <profile>:<count> with a count from 1 to '
                     '64 in ASCII digits (e.g. 1g.10gb:4)' % text)
    return GiCount(profile=profile, count=count)


def parse_type_count(layout_name, text):
    """``nvidia-1153:2`` -> ``(TypeId, 2)``, ``nvidia-1153`` -> ``(TypeId,
    None)``; ConfigError naming the option."""
    raw, sep, count = text.strip().partition(':')
    try:
        type_id = objects.TypeId.parse(raw.strip())
    except exception.InvalidTypeId as e:
        raise _error(layout_name, 'vgpu_types', e)
    if not sep:
        return type_id, None
    value = _count(count, 1, 1024)
    if value is None:
        raise _error(layout_name, 'vgpu_types', '%r is not <type>:<count> '
                     'with a count from 1 to 1024 in ASCII digits (e.g. '
                     'nvidia-1153:2)' % text)
    return type_id, value


def read_layout(conf, name):
    """The ``[layout_<name>]`` section as a ``Layout``, checked on its
    own (rules that need no GPU)."""
    group = conf[section(name)]
    selectors = selectors_mod.parse('[%s]/gpus' % section(name), group.gpus,
                                    required=True)
    mode = group.mode
    if mode not in MODES:
        raise _error(name, 'mode', '%r is none of %s' % (mode,
                                                         ', '.join(MODES)))
    types = []
    type_counts = []
    for raw in group.vgpu_types:
        type_id, count = parse_type_count(name, raw)
        if type_id in types:
            raise _error(name, 'vgpu_types', 'lists %s twice' % type_id)
        types.append(type_id)
        type_counts.append(count)
    if not types:
        raise _error(name, 'vgpu_types', 'names no vGPU type: list the '
                     'types the GPU offers (`libvirt-gpu layout plan` lists '
                     'those it supports)')
    if mode == TIME_SLICED and len(types) > 1:
        raise _error(name, 'vgpu_types', 'lists %s; in mode time-sliced a '
                     'GPU holds vGPUs of one type at a time: list one, or '
                     'use mode mixed-size (several sizes, a count each)'
                     % ', '.join(types))
    if mode == MIXED_SIZE and len(types) > 1 and None in type_counts:
        raise _error(name, 'vgpu_types', 'lists several types in mode '
                     'mixed-size; give each a count (%s): each type is its '
                     'own Placement provider with that total, and `layout '
                     'plan` checks that the counts fit on the GPU together'
                     % ', '.join('%s:<count>' % t for t in types))
    counts = [parse_gi_count(name, raw) for raw in group.gpu_instances]
    seen = set()
    for gi in counts:
        if gi.profile in seen:
            raise _error(name, 'gpu_instances', 'lists %s twice: give one '
                         'count per profile' % gi.profile)
        seen.add(gi.profile)
    if mode in MIG_MODES and not counts:
        raise _error(name, 'gpu_instances', 'mode %s needs GPU instances '
                     '(e.g. 1g.10gb:4, 3g.40gb:1)' % mode)
    if mode not in MIG_MODES and counts:
        raise _error(name, 'gpu_instances', 'GPU instances exist only in '
                     'the MIG modes (mig, mig-time-sliced), not %s' % mode)
    scheduler = group.scheduler
    if scheduler is not None and scheduler not in SCHEDULERS:
        raise _error(name, 'scheduler', '%r is none of %s'
                     % (scheduler, ', '.join(SCHEDULERS)))
    if scheduler is not None and mode not in TIME_SLICED_MODES:
        raise _error(name, 'scheduler', 'the vGPU scheduler shares a GPU '
                     'in time; mode %s gives each vGPU a GPU instance of its '
                     'own: remove the option, or use mode mig-time-sliced'
                     % mode)
    if scheduler == FIXED_SHARE and mode == MIXED_SIZE:
        raise _error(name, 'scheduler', 'fixed-share does not work with '
                     'mixed sizes (the driver refuses it): use equal-share '
                     'or best-effort, or mode time-sliced')
    time_slice = group.time_slice_ms
    if time_slice is not None:
        low, high = TIME_SLICE_MS
        if not low <= time_slice <= high:
            raise _error(name, 'time_slice_ms', '%d is outside %d..%d'
                         % (time_slice, low, high))
        if scheduler not in (EQUAL_SHARE, FIXED_SHARE):
            raise _error(name, 'time_slice_ms', 'a time slice needs '
                         'scheduler = equal-share or fixed-share')
    return Layout(name=name, gpus=selectors, mode=mode,
                  vgpu_types=tuple(types), gpu_instances=tuple(counts),
                  type_counts=tuple(type_counts), scheduler=scheduler,
                  time_slice_ms=time_slice)


def read_layouts(conf):
    """Every layout ``[gpu]/layouts`` names, in order."""
    names = list(getattr(conf.gpu, 'layouts', None) or ())
    if len(set(names)) != len(names):
        raise exception.ConfigError(
            reason='[gpu]/layouts lists a layout twice: %s'
            % ', '.join(names))
    return tuple(read_layout(conf, name) for name in names)


# --- against the host's GPUs ------------------------------------------------

def claims(layouts, gpus):
    """``{PciAddress: Layout}``: the physical GPUs each layout names.
    ConfigError for an address with no GPU, the address of a VF, a GPU
    matched by two layouts."""
    found = {}
    for layout in layouts:
        for _selector, named in selectors_mod.resolve(
                '[%s]/gpus' % layout.section, layout.gpus, gpus):
            for gpu in named:
                other = found.get(gpu.address)
                if other is not None and other.name != layout.name:
                    raise exception.ConfigError(
                        reason='GPU %s is matched by two layouts, [%s] and '
                               '[%s]; give each GPU one layout (name it by '
                               'address in one, or split the model)'
                               % (gpu.address, other.section, layout.section))
                found[gpu.address] = layout
    return found


# --- against what the GPU reports -------------------------------------------

def _offered(facts, mig_backed):
    names = ['%s (%s)' % (t.type_id, t.name) if t.name else str(t.type_id)
             for t in facts.types if t.mig_backed == mig_backed]
    return ', '.join(names) or 'none'


def _check_profiles(layout, facts):
    if not facts.profiles:
        raise LayoutError(layout=layout.name, address=facts.address,
                          reason='mode %s needs MIG, and this GPU reports no '
                                 'GPU-instance profiles; use mode '
                                 'time-sliced or mixed-size' % layout.mode)
    slices = memory = 0
    unit = facts.memory_slice_mib
    for gi in layout.gpu_instances:
        profile = facts.profile(gi.profile)
        if profile is None:
            raise LayoutError(
                layout=layout.name, address=facts.address,
                reason='%s: the GPU has no GI profile %s (it has: %s)'
                % (layout.option('gpu_instances'), gi.profile,
                   ', '.join(p.name for p in facts.profiles)))
        if gi.count > profile.instances:
            raise LayoutError(
                layout=layout.name, address=facts.address,
                reason='%s: %d x %s, but the GPU holds at most %d of them'
                % (layout.option('gpu_instances'), gi.count, gi.profile,
                   profile.instances))
        slices += profile.slices * gi.count
        memory += _memory_slices(profile.memory_mib, unit) * gi.count
    total = _memory_slices(facts.memory_mib, unit)
    if slices > facts.slices or memory > total:
        raise LayoutError(
            layout=layout.name, address=facts.address,
            reason='%s: %s needs %d compute slices and %d memory slices; '
                   'the GPU has %d and %d (profiles: %s)'
            % (layout.option('gpu_instances'),
               ', '.join(str(gi) for gi in layout.gpu_instances), slices,
               memory, facts.slices, total,
               ', '.join('%s %d slice(s)' % (p.name, p.slices)
                         for p in facts.profiles)))


def _memory_slices(memory_mib, unit):
    """How many of the smallest profile's memory ``memory_mib`` is (the
    profiles' figures are rounded: 9.75 GiB x 8 = 78 < 79.25)."""
    return int(memory_mib // unit) if unit else 0


def check(layout, facts):
    """Whether the GPU of ``facts`` can take ``layout``; LayoutError naming
    the option, the GPU and what it offers.  Returns ``layout``."""
    if layout.mig:
        _check_profiles(layout, facts)
    wanted = set(wanted_gpu_instances(layout, facts))
    sizes = set()
    for type_id in layout.vgpu_types:
        vtype = facts.type(type_id)
        if vtype is None:
            raise LayoutError(
                layout=layout.name, address=facts.address,
                reason='%s: the GPU does not support %s (it supports: %s)'
                % (layout.option('vgpu_types'), type_id,
                   _offered(facts, layout.mig)))
        if layout.mig and not vtype.mig_backed:
            raise LayoutError(
                layout=layout.name, address=facts.address,
                reason='%s: %s is time-sliced, and with MIG on the GPU '
                       'offers only MIG-backed types (%s)'
                % (layout.option('vgpu_types'), type_id,
                   _offered(facts, True)))
        if not layout.mig and vtype.mig_backed:
            raise LayoutError(
                layout=layout.name, address=facts.address,
                reason='%s: %s is MIG-backed; mode %s offers time-sliced '
                       'types (%s), or use mode mig'
                % (layout.option('vgpu_types'), type_id, layout.mode,
                   _offered(facts, False)))
        if layout.mig and vtype.gi_profile_id not in wanted:
            profile = facts.profile_by_id(vtype.gi_profile_id)
            raise LayoutError(
                layout=layout.name, address=facts.address,
                reason='%s: %s lives in %s GPU instances, and %s makes none'
                % (layout.option('vgpu_types'), type_id,
                   profile.name if profile else 'profile %d'
                   % vtype.gi_profile_id, layout.option('gpu_instances')))
        sizes.add(vtype.framebuffer_mib)
    if layout.mig:
        _check_one_type_per_profile(layout, facts)
    if layout.mode == MIXED_SIZE and len(layout.vgpu_types) > 1:
        _check_counts_fit(layout, facts)
    if layout.mode == TIME_SLICED and len(sizes) > 1:
        raise LayoutError(
            layout=layout.name, address=facts.address,
            reason='%s: %s have different frame buffer sizes; time-sliced '
                   'holds one size per GPU: use mode mixed-size'
            % (layout.option('vgpu_types'),
               ', '.join(str(t) for t in layout.vgpu_types)))
    return layout


def _check_one_type_per_profile(layout, facts):
    """Two types living in GIs of one profile would share those GIs, so
    Placement, told each type's total apart, could promise both."""
    by_profile = {}
    for type_id in layout.vgpu_types:
        vtype = facts.type(type_id)
        other = by_profile.setdefault(vtype.gi_profile_id, type_id)
        if other != type_id:
            profile = facts.profile_by_id(vtype.gi_profile_id)
            raise LayoutError(
                layout=layout.name, address=facts.address,
                reason='%s: %s and %s both live in %s GPU instances, which '
                       'they would share (each is told to Placement apart); '
                       'list one type per GI profile'
                % (layout.option('vgpu_types'), other, type_id,
                   profile.name if profile else 'the same'))


def blocked(placement, size, placements, placement_size):
    """How many of ``placements`` (starts, each ``placement_size`` slots)
    a vGPU at ``placement`` spanning ``size`` slots overlaps."""
    end = placement + size
    return sum(1 for start in placements
               if start < end and placement < start + placement_size)


def worst_block(mine, theirs):
    """The most placements of ``theirs`` one vGPU of ``mine`` can take
    (both ``TypeFacts`` with ``placement_size`` and ``placements``),
    wherever the driver puts it."""
    return max((blocked(p, mine.placement_size, theirs.placements,
                        theirs.placement_size) for p in mine.placements),
               default=0)


def placements_fit(counts):
    """Whether ``counts`` (``[(TypeFacts, count)]``, the types of one
    mixed-size GPU) always fit together, whatever placements the driver
    picks and in whatever order vGPUs come and go: for each type, its
    count less one and every other type's count, each vGPU taking the
    most of the type's placements it can (``worst_block``), still leave
    one of its placements free.  Returns None, or the first type (its
    ``TypeFacts``) that may find no room."""
    for mine, count in counts:
        taken = (count - 1) * worst_block(mine, mine) + sum(
            other_count * worst_block(other, mine)
            for other, other_count in counts if other is not mine)
        if taken >= len(mine.placements):
            return mine
    return None


def _check_counts_fit(layout, facts):
    counts = []
    for type_id in layout.vgpu_types:
        vtype = facts.type(type_id)
        if not vtype.placements or not vtype.placement_size:
            raise LayoutError(
                layout=layout.name, address=facts.address,
                reason='%s: the GPU reports no mixed-size placements for %s, '
                       'so the counts cannot be checked to fit; list one '
                       'type' % (layout.option('vgpu_types'), type_id))
        counts.append((vtype, layout.count(type_id)))
    short = placements_fit(counts)
    if short is not None:
        raise LayoutError(
            layout=layout.name, address=facts.address,
            reason='%s: %s do not always fit together: the driver picks '
                   'where each vGPU sits, and %s (%d slots, %d placements) '
                   'may then find none free; lower the counts'
            % (layout.option('vgpu_types'),
               ', '.join('%s:%d' % (t.type_id, c) for t, c in counts),
               short.type_id, short.placement_size, len(short.placements)))


def check_before_steps(layout, facts):
    """Every check of ``layout`` that the GPU of ``facts`` (as it is now)
    allows before the first step, as ``layout plan`` makes them:
    LayoutError for a MIG layout on a GPU without MIG, then ``check``
    wherever the GPU says enough (its MIG mode is the layout's, or
    ``reports_for``).  Returns ``layout``."""
    if layout.mig and facts.mig is None:
        raise LayoutError(
            layout=layout.name, address=facts.address,
            reason='mode %s needs MIG, and this GPU has no MIG mode; use '
                   'mode time-sliced or mixed-size' % layout.mode)
    if bool(facts.mig) == layout.mig or reports_for(layout, facts):
        check(layout, facts)
    return layout


def reports_for(layout, facts):
    """Whether what the GPU reports in the MIG mode it has now is enough to
    ``check`` ``layout``, a layout of the other mode: its GI profiles
    (a MIG layout) and vGPU types of the layout's kind (MIG-backed or
    time-sliced).  A GPU that reports them whatever its mode (as the
    simulated driver does) has the layout checked before the first step;
    one that does not is checked once MIG mode changed."""
    if layout.mig and not facts.profiles:
        return False
    return any(t.mig_backed == layout.mig for t in facts.types)


def wanted_gpu_instances(layout, facts):
    """``{profile_id: count}`` the layout asks of the GPU; LayoutError
    naming the option for a profile the GPU does not report."""
    if not layout.mig:
        return {}
    wanted = {}
    for gi in layout.gpu_instances:
        profile = facts.profile(gi.profile)
        if profile is None:
            raise LayoutError(
                layout=layout.name, address=facts.address,
                reason='%s: the GPU reports no GI profile %s (it reports: '
                       '%s)' % (layout.option('gpu_instances'), gi.profile,
                                ', '.join(p.name for p in facts.profiles)
                                or 'none'))
        wanted[profile.id] = gi.count
    return wanted


def wanted_scheduler(layout):
    if layout.scheduler is None:
        return None
    return Scheduler(policy=layout.scheduler,
                     time_slice_ms=layout.time_slice_ms)


def rmpvmrl(scheduler):
    """The value of the nvidia module's ``RmPVMRL`` registry key for a
    ``Scheduler``: 0x00 best effort, 0x01 equal share, 0x11 fixed share,
    with a time slice TT ms in bits 16-23 (0x00TT0001)."""
    value = RMPVMRL[scheduler.policy]
    if scheduler.time_slice_ms:
        value |= scheduler.time_slice_ms << 16
    return value


def module_option(schedulers, every_gpu=False):
    """The ``options nvidia ...`` line (for ``/etc/modprobe.d``) that sets
    ``{PciAddress: Scheduler}`` at module load: ``NVreg_RegistryDwords``
    when the schedulers cover ``every_gpu`` of the host with one value,
    ``NVreg_RegistryDwordsPerDevice`` otherwise; None for none."""
    if not schedulers:
        return None
    values = {address: rmpvmrl(s) for address, s in schedulers.items()}
    if every_gpu and len(set(values.values())) == 1:
        return 'options nvidia NVreg_RegistryDwords="RmPVMRL=0x%x"' % (
            next(iter(values.values())))
    return 'options nvidia NVreg_RegistryDwordsPerDevice="%s"' % ';'.join(
        'pci=%s;RmPVMRL=0x%x' % (address, value)
        for address, value in sorted(values.items()))
