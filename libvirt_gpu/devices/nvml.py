"""NVML, NVIDIA's management library, as an optional source.

Read through NVIDIA's own binding, ``nvidia-ml-py`` (module ``pynvml``),
where the driver provides ``libnvidia-ml.so``.  It adds what sysfs does
not say: the GPU's marketing name and memory, its virtualization mode
(passthrough, vGPU host), MIG mode, and on a vGPU host the vGPU types the
GPU supports and those it can create now, with names, framebuffer and
maximum instances.

NVML functions used (all through ``pynvml``): ``nvmlInit``,
``nvmlShutdown``, ``nvmlDeviceGetCount``, ``nvmlDeviceGetHandleByIndex``,
``nvmlDeviceGetPciInfo`` (``busId``), ``nvmlDeviceGetName``,
``nvmlDeviceGetMemoryInfo`` (``total``), ``nvmlDeviceGetVirtualizationMode``,
``nvmlDeviceGetMigMode``, ``nvmlDeviceGetSupportedVgpus``,
``nvmlDeviceGetCreatableVgpus``, ``nvmlVgpuTypeGetName``,
``nvmlVgpuTypeGetFramebufferSize``, ``nvmlVgpuTypeGetMaxInstances``;
for ``libvirt-gpu exporter`` (``usage``): ``nvmlDeviceGetUtilizationRates``
(``gpu``), ``nvmlDeviceGetMemoryInfo`` (``used``),
``nvmlDeviceGetActiveVgpus``, ``nvmlDeviceGetVgpuUtilization`` (``smUtil``
of each instance's latest sample), ``nvmlVgpuInstanceGetMdevUUID``,
``nvmlVgpuInstanceGetGpuPciId`` (the VF of a vGPU 17+ vendor-interface
vGPU) and ``nvmlVgpuInstanceGetFbUsage``.

No binding, no library, no driver, no GPU: ``query`` returns ``{}`` and
callers go on with sysfs, silently (a debug log line).  A query a GPU
answers with "Not Supported" (the vGPU queries on a GPU that is not on a
vGPU host driver) leaves that field None or empty.
"""

from __future__ import annotations


from libvirt_gpu import exception
from libvirt_gpu.util import logs
from libvirt_gpu import objects
from libvirt_gpu.util import records
from libvirt_gpu.devices import sysfs as sysfs_mod

LOG = logs.getLogger(__name__)

AUTO = 'auto'
OFF = 'off'
SIMULATED = 'simulated'
CHOICES = (AUTO, OFF, SIMULATED)
# ``simulated``: the simulator's NVML (nvidia-ml-py over a simulated
# driver), imported by name so that nothing of the product imports the
# simulator (tests/unit/project/test_architecture.py names this door).
SIMULATED_BINDING = 'libvirt_gpu.simulator.nvml'

# nvmlGpuVirtualizationMode_t
VIRTUALIZATION_MODES = {
    0: 'none',            # NVML_GPU_VIRTUALIZATION_MODE_NONE (bare metal)
    1: 'passthrough',     # NVML_GPU_VIRTUALIZATION_MODE_PASSTHROUGH
    2: 'vgpu',            # NVML_GPU_VIRTUALIZATION_MODE_VGPU (a guest's)
    3: 'vgpu_host',       # NVML_GPU_VIRTUALIZATION_MODE_HOST_VGPU
    4: 'vsga_host',       # NVML_GPU_VIRTUALIZATION_MODE_HOST_VSGA
}
NVML_DEVICE_MIG_ENABLE = 1
_MIB = 1024 * 1024
# Answers that mean "this GPU or driver cannot tell", not "broken".
_UNANSWERED = ('NVML_ERROR_NOT_SUPPORTED', 'NVML_ERROR_FUNCTION_NOT_FOUND',
               'NVML_ERROR_NO_PERMISSION')


def _layout():
    """devices/layout.py, imported where a layout is read: the hook's
    prepare builds an Nvml source and never reads one."""
    from libvirt_gpu.devices import layout
    return layout


def _text(value):
    if isinstance(value, bytes):
        value = value.decode('utf-8', 'replace')
    return value.strip() if isinstance(value, str) and value.strip() \
        else None


@records.record
class VgpuUsage:
    """One active vGPU instance as NVML sees it (None: not answered)."""

    mdev_uuid: str | None             # the mdev's UUID (classic mdev)
    vf: objects.PciAddress | None     # its VF (vGPU 17+ vendor interface)
    utilization: float | None         # 3D/compute engine share, 0 to 1
    fb_used: int | None               # bytes of frame buffer in use


@records.record
class GpuUsage:
    """How busy one GPU is (None: not answered)."""

    utilization: float | None         # busy share of the last period, 0-1
    memory_used: int | None           # bytes
    memory_total: int | None          # bytes
    vgpus: tuple = ()                 # VgpuUsage of its active vGPUs


class Nvml(object):
    """Queries NVML once per ``query``.  ``module``: a ``pynvml``-like
    module (tests pass a fake); None imports ``pynvml`` when first used."""

    def __init__(self, module=None):
        self._module = module

    def _binding(self):
        if self._module is None:
            try:
                import pynvml
            except ImportError:
                LOG.debug('NVML not used: nvidia-ml-py is not installed')
                return None
            self._module = pynvml
        return self._module

    def session(self) -> Session:
        """A ``Session`` (NVML initialised; a ``with`` block shuts it
        down); NvmlUnavailable when there is no binding or driver."""
        lib = self._binding()
        if lib is None:
            raise NvmlUnavailable(reason='nvidia-ml-py is not installed')
        try:
            lib.nvmlInit()
        except lib.NVMLError as e:
            raise NvmlUnavailable(reason=e)
        return Session(lib)

    def _unanswered(self, lib, error):
        return _unanswered(lib, error)

    def _ask(self, lib, function, *args):
        """``function(*args)``, or None where the GPU cannot answer."""
        try:
            return function(*args)
        except lib.NVMLError as e:
            if self._unanswered(lib, e):
                return None
            raise

    def query(self):
        """``{PciAddress: NvmlGpu}`` for every GPU NVML sees; ``{}`` when
        NVML is not there."""
        return self._each_gpu(self._gpu)

    def usage(self):
        """``{PciAddress: GpuUsage}`` of every GPU NVML sees now; ``{}``
        without NVML."""
        return self._each_gpu(self._usage)

    def _each_gpu(self, read):
        """``{PciAddress: read(lib, handle)}`` over every GPU NVML lists,
        between one init and one shutdown; a GPU that cannot answer is
        skipped with a warning; ``{}`` when NVML is not there."""
        lib = self._binding()
        if lib is None:
            return {}
        try:
            lib.nvmlInit()
        except lib.NVMLError as e:
            LOG.debug('NVML not used: %s', e)
            return {}
        found = {}
        try:
            for index in range(lib.nvmlDeviceGetCount()):
                try:
                    handle = lib.nvmlDeviceGetHandleByIndex(index)
                    address = objects.PciAddress.parse(
                        _text(lib.nvmlDeviceGetPciInfo(handle).busId))
                    found[address] = read(lib, handle)
                except (lib.NVMLError, exception.InvalidPciAddress) as e:
                    LOG.warning('NVML: GPU %d skipped: %s', index, e)
        except lib.NVMLError as e:
            LOG.warning('NVML: cannot list GPUs: %s', e)
        finally:
            try:
                lib.nvmlShutdown()
            except lib.NVMLError as e:
                LOG.debug('NVML shutdown: %s', e)
        return found

    def _usage(self, lib, handle):
        rates = self._ask(lib, lib.nvmlDeviceGetUtilizationRates, handle)
        memory = self._ask(lib, lib.nvmlDeviceGetMemoryInfo, handle)
        samples = {}
        for sample in self._ask(lib, lib.nvmlDeviceGetVgpuUtilization,
                                handle, 0) or ():
            samples[sample.vgpuInstance] = sample.smUtil.uiVal / 100.0
        vgpus = []
        for instance in self._ask(lib, lib.nvmlDeviceGetActiveVgpus,
                                  handle) or ():
            vgpus.append(VgpuUsage(
                mdev_uuid=_uuid(self._ask(
                    lib, lib.nvmlVgpuInstanceGetMdevUUID, instance)),
                vf=_address(self._ask(
                    lib, lib.nvmlVgpuInstanceGetGpuPciId, instance)),
                utilization=samples.get(instance),
                fb_used=self._ask(lib, lib.nvmlVgpuInstanceGetFbUsage,
                                  instance)))
        return GpuUsage(
            utilization=rates.gpu / 100.0 if rates is not None else None,
            memory_used=memory.used if memory is not None else None,
            memory_total=memory.total if memory is not None else None,
            vgpus=tuple(vgpus))

    def _gpu(self, lib, handle):
        memory = self._ask(lib, lib.nvmlDeviceGetMemoryInfo, handle)
        mode = self._ask(lib, lib.nvmlDeviceGetVirtualizationMode, handle)
        mig = self._ask(lib, lib.nvmlDeviceGetMigMode, handle)
        return objects.NvmlGpu(
            name=_text(self._ask(lib, lib.nvmlDeviceGetName, handle)),
            memory_total_mib=(memory.total // _MIB
                              if memory is not None else None),
            virtualization_mode=(VIRTUALIZATION_MODES.get(mode, str(mode))
                                 if mode is not None else None),
            mig_enabled=(mig[0] == NVML_DEVICE_MIG_ENABLE
                         if mig is not None else None),
            vgpu_types=self._vgpu_types(lib, handle))

    def _vgpu_types(self, lib, handle):
        supported = self._ask(lib, lib.nvmlDeviceGetSupportedVgpus,
                              handle) or []
        creatable = set(self._ask(lib, lib.nvmlDeviceGetCreatableVgpus,
                                  handle) or [])
        types = []
        for type_id in list(supported) + sorted(creatable - set(supported)):
            framebuffer = lib.nvmlVgpuTypeGetFramebufferSize(type_id)
            types.append(objects.NvmlVgpuType(
                id=int(type_id),
                name=_text(lib.nvmlVgpuTypeGetName(type_id)),
                framebuffer_mib=framebuffer // _MIB,
                max_instances=lib.nvmlVgpuTypeGetMaxInstances(handle,
                                                              type_id),
                creatable=type_id in creatable))
        return tuple(types)


def _unanswered(lib, error):
    """Whether ``error`` means "this GPU or driver cannot tell"."""
    codes = {getattr(lib, name, None) for name in _UNANSWERED}
    return getattr(error, 'value', None) in codes


def _uuid(value):
    """An mdev UUID NVML gives (parsed at this edge), or None."""
    try:
        return objects.Uuid.parse(_text(value)) if _text(value) else None
    except exception.InvalidUuid:
        return None


def _address(value):
    """A PCI address NVML gives (``00000000:41:00.4``), or None."""
    try:
        return objects.PciAddress.parse(_text(value)) if _text(value) \
            else None
    except exception.InvalidPciAddress:
        return None


HOST_SYSFS = sysfs_mod.HOST_ROOT


def source(setting, module=None, sysfs_root=HOST_SYSFS):
    """The NVML source for ``[gpu]/nvml`` (``auto``: use it where it is
    there; ``off``: never; ``simulated``: the simulated host's at
    ``sysfs_root``), or None.  NVML describes this host's GPUs, so with
    ``auto`` it is asked only when the GPUs are read from this host's
    sysfs: a ``sysfs_root`` other than ``/sys`` (a simulated or captured
    tree) gets None, and no ``pynvml`` import or ``nvmlInit`` is paid."""
    if setting == OFF:
        return None
    if setting == SIMULATED:
        if module is None:
            if sysfs_root is None or sysfs_mod.Sysfs.is_host_sysfs(
                    sysfs_root):
                raise exception.ConfigError(
                    reason='[gpu]/nvml = simulated needs a simulated '
                    'sysfs root ([DEFAULT]/sysfs_root or --sysfs-root), '
                    'not this host\'s /sys')
            import importlib
            module = importlib.import_module(SIMULATED_BINDING).module(
                sysfs_root=sysfs_root)
        return Nvml(module)
    if setting != AUTO:
        raise exception.ConfigError(
            reason='[gpu]/nvml must be one of %s, not %r'
            % (', '.join(CHOICES), setting))
    if module is None and sysfs_root is not None and \
            not sysfs_mod.Sysfs.is_host_sysfs(sysfs_root):
        return None
    return Nvml(module)


# --- layouts: MIG, GPU instances, mixed sizes, the scheduler -----------------
#
# NVML functions used (all through ``pynvml``, with its arguments):
# ``nvmlDeviceGetMigMode``, ``nvmlDeviceSetMigMode``,
# ``nvmlDeviceGetGpuInstanceProfileInfo`` (v2: its ``name``),
# ``nvmlDeviceGetGpuInstances``, ``nvmlGpuInstanceGetInfo``,
# ``nvmlDeviceCreateGpuInstance``, ``nvmlDeviceGetGpuInstanceById``,
# ``nvmlGpuInstanceDestroy``, ``nvmlGpuInstanceGetComputeInstanceProfileInfo``,
# ``nvmlGpuInstanceCreateComputeInstance``,
# ``nvmlGpuInstanceGetComputeInstances``, ``nvmlComputeInstanceDestroy``,
# ``nvmlDeviceGetSupportedVgpus``, ``nvmlVgpuTypeGetName``,
# ``nvmlVgpuTypeGetFramebufferSize``, ``nvmlVgpuTypeGetGpuInstanceProfileId``,
# ``nvmlVgpuTypeGetMaxInstancesPerGpuInstance``,
# ``nvmlDeviceGetVgpuHeterogeneousMode``,
# ``nvmlDeviceSetVgpuHeterogeneousMode``,
# ``nvmlDeviceGetVgpuTypeCreatablePlacements``,
# ``nvmlDeviceGetVgpuSchedulerState_v2``,
# ``nvmlDeviceSetVgpuSchedulerState_v2``,
# ``nvmlGpuInstanceGetVgpuSchedulerState_v2``,
# ``nvmlGpuInstanceSetVgpuSchedulerState_v2``; for the exporter's layout
# part: ``nvmlDeviceGetActiveVgpus``, ``nvmlVgpuInstanceGetType``,
# ``nvmlVgpuInstanceGetGpuInstanceId``, ``nvmlVgpuInstanceGetPlacementId``,
# ``nvmlDeviceGetVgpuTypeCreatablePlacements``.

# nvmlVgpuTypeGetGpuInstanceProfileId of a time-sliced type
INVALID_GI_PROFILE_ID = 0xFFFFFFFF
# compute instance profile (NVML_COMPUTE_INSTANCE_PROFILE_<n>_SLICE) that
# spans a whole GPU instance of n slices (``nvidia-smi mig -cgi ... -C``)
_FULL_CI_PROFILE = {1: 0x0, 2: 0x1, 3: 0x2, 4: 0x3, 7: 0x4, 8: 0x5, 6: 0x6}
_MAX_GPU_INSTANCES = 32
_NS_PER_MS = 1000000


def _no_such_profile(lib, error):
    """NVML's answer for a profile index the GPU (or GI) does not have."""
    return getattr(error, 'value', None) in (
        lib.NVML_ERROR_NOT_SUPPORTED, lib.NVML_ERROR_INVALID_ARGUMENT)


@records.record
class ActiveVgpu:
    """A vGPU that exists on a GPU, as its driver places it (None: not
    answered, or not of its mode)."""

    type_id: objects.TypeId | None
    gi_id: int | None             # the GPU instance it lives in (MIG)
    placement: int | None         # its placement id (mixed-size mode)


class NvmlError(exception.LibvirtGpuError):
    msg_fmt = 'NVML %(call)s on GPU %(address)s: %(reason)s'


class NvmlUnavailable(exception.LibvirtGpuError):
    msg_fmt = ('NVML cannot be used: %(reason)s; layouts need NVIDIA\'s '
               'driver and the nvidia-ml-py package ([gpu]/nvml = auto)')


def _profile_name(info):
    """``MIG 1g.10gb+me`` (NVML's v2 name) -> ``1g.10gb+me``."""
    name = _text(getattr(info, 'name', None)) or ''
    if name.lower().startswith('mig '):
        name = name[4:].strip()
    return name.lower() or '%dg.%dgb' % (
        info.sliceCount, round(info.memorySizeMB / 1024))


class Session(object):
    """NVML between one ``nvmlInit`` and its ``nvmlShutdown`` (a ``with``
    block): one GPU's layout facts and state read, and changed.  Every
    failure of a call is an ``NvmlError`` naming the call and the GPU.

    GPU-instance profiles are named by NVML's profile id (the ``ID``
    column of ``nvidia-smi mig -lgip``: 19 for an H100's 1g.10gb), which
    is what ``nvmlVgpuTypeGetGpuInstanceProfileId`` answers and what
    ``nvmlDeviceCreateGpuInstance`` takes."""

    def __init__(self, lib):
        self.lib = lib
        self._handles = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            self.lib.nvmlShutdown()
        except self.lib.NVMLError as e:
            LOG.debug('NVML shutdown: %s', e)

    def _call(self, address, function, *args, unanswered=False):
        try:
            return getattr(self.lib, function)(*args)
        except self.lib.NVMLError as e:
            if unanswered and _unanswered(self.lib, e):
                return None
            raise NvmlError(call=function, address=address, reason=e)

    def handle(self, address):
        self._read_handles()
        if address not in self._handles:
            raise NvmlUnavailable(reason='NVML lists no GPU %s' % address)
        return self._handles[address]

    def _read_handles(self):
        if self._handles is None:
            self._handles = {}
            for index in range(self._call('all', 'nvmlDeviceGetCount')):
                handle = self._call('#%d' % index,
                                    'nvmlDeviceGetHandleByIndex', index)
                bus_id = _address(self._call(
                    '#%d' % index, 'nvmlDeviceGetPciInfo', handle).busId)
                if bus_id is not None:
                    self._handles[bus_id] = handle
        return self._handles

    # -- reading ---------------------------------------------------------

    def mig_mode(self, address):
        """Whether MIG mode is on (its current mode); None: the GPU has no
        MIG."""
        mode = self._call(address, 'nvmlDeviceGetMigMode',
                          self.handle(address), unanswered=True)
        return None if mode is None else \
            mode[0] == self.lib.NVML_DEVICE_MIG_ENABLE

    def gi_profiles(self, address):
        """The GPU's GPU-instance profiles (``layout.GiProfile``)."""
        handle = self.handle(address)
        found = []
        for index in range(self.lib.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = self.lib.nvmlDeviceGetGpuInstanceProfileInfo(
                    handle, index)
            except self.lib.NVMLError as e:
                if _no_such_profile(self.lib, e):
                    continue      # a profile this GPU does not have
                raise NvmlError(call='nvmlDeviceGetGpuInstanceProfileInfo',
                                address=address, reason=e)
            if not info.instanceCount:
                continue
            found.append(_layout().GiProfile(
                id=int(info.id), name=_profile_name(info),
                slices=int(info.sliceCount),
                instances=int(info.instanceCount),
                memory_mib=int(info.memorySizeMB),
                placements=self._gi_placements(address, int(info.id))))
        return tuple(found)

    def _gi_placements(self, address, profile_id):
        """``((start, size), ...)``: where a GPU instance of the profile
        can sit on the GPU, occupied or not
        (``nvmlDeviceGetGpuInstancePossiblePlacements_v2``); () where the
        GPU cannot say."""
        import ctypes
        places = (self.lib.c_nvmlGpuInstancePlacement_t *
                  _MAX_GPU_INSTANCES)()
        count = ctypes.c_uint(_MAX_GPU_INSTANCES)
        done = self._call(address,
                          'nvmlDeviceGetGpuInstancePossiblePlacements',
                          self.handle(address), profile_id, places,
                          ctypes.byref(count), unanswered=True)
        if done is None:
            return ()
        return tuple((int(places[i].start), int(places[i].size))
                     for i in range(min(count.value, _MAX_GPU_INSTANCES)))

    def vgpu_types(self, address, placements=False):
        """The vGPU types the GPU supports (``layout.TypeFacts``);
        ``placements``: with the mixed-size placements of each time-sliced
        one (what ``layout.check`` needs of several mixed-size types: a
        call per type that the hook's capacity read does without)."""
        handle = self.handle(address)
        found = []
        for type_id in self._call(address, 'nvmlDeviceGetSupportedVgpus',
                                  handle, unanswered=True) or ():
            profile = self._call(address,
                                 'nvmlVgpuTypeGetGpuInstanceProfileId',
                                 type_id, unanswered=True)
            mig_backed = profile is not None and \
                profile != INVALID_GI_PROFILE_ID
            per_gi = self._call(
                address, 'nvmlVgpuTypeGetMaxInstancesPerGpuInstance',
                type_id, unanswered=True) if mig_backed else None
            framebuffer = self._call(address,
                                     'nvmlVgpuTypeGetFramebufferSize',
                                     type_id, unanswered=True)
            size, where = (None, ()) if mig_backed or not placements \
                else self._mixed_placements(address, handle, type_id)
            found.append(_layout().TypeFacts(
                type_id=objects.vendor_type_id(int(type_id)),
                name=_text(self._call(address, 'nvmlVgpuTypeGetName',
                                      type_id, unanswered=True)),
                framebuffer_mib=(framebuffer // _MIB
                                 if framebuffer is not None else None),
                gi_profile_id=int(profile) if mig_backed else None,
                max_per_gi=per_gi, placement_size=size, placements=where))
        return tuple(found)

    def _mixed_placements(self, address, handle, type_id):
        """``(placement size, placement ids)`` a time-sliced type may have
        in mixed-size mode, whatever mode the GPU is in now
        (``nvmlDeviceGetVgpuTypeSupportedPlacements``, version 2 with the
        heterogeneous mode); ``(None, ())`` where the GPU cannot say,
        or lists more placements than the type's maximum instances (the
        binding's buffer: NVML_ERROR_INSUFFICIENT_SIZE)."""
        try:
            found = self._call(address,
                               'nvmlDeviceGetVgpuTypeSupportedPlacements',
                               handle, type_id,
                               self.lib.NVML_VGPU_PGPU_HETEROGENEOUS_MODE, 2,
                               unanswered=True)
        except NvmlError as e:
            if getattr(e.kwargs.get('reason'), 'value', None) != \
                    self.lib.NVML_ERROR_INSUFFICIENT_SIZE:
                raise
            LOG.debug('%s: no mixed-size placements of type %s: %s',
                      address, type_id, e)
            return None, ()
        if found is None:
            return None, ()
        return (int(found.placementSize),
                tuple(int(found.placementIds[i])
                      for i in range(int(found.count))))

    def _gpu_instance_handles(self, address, profile_id):
        import ctypes
        handles = (self.lib.c_nvmlGpuInstance_t * _MAX_GPU_INSTANCES)()
        count = ctypes.c_uint(0)
        self._call(address, 'nvmlDeviceGetGpuInstances',
                   self.handle(address), profile_id, handles,
                   ctypes.byref(count))
        return [handles[i] for i in range(count.value)]

    def gpu_instances(self, address, profiles, schedulers=False,
                      computes=False):
        """The GPU instances that exist (``layout.GpuInstance``), of the
        ``profiles`` (``layout.GiProfile``); ``schedulers``: with each
        one's vGPU scheduler state; ``computes``: with whether it has its
        compute instance."""
        found = []
        for profile in profiles:
            for gi in self._gpu_instance_handles(address, profile.id):
                info = self._call(address, 'nvmlGpuInstanceGetInfo', gi)
                found.append(_layout().GpuInstance(
                    id=int(info.id), profile_id=int(info.profileId),
                    start=int(info.placement.start),
                    size=int(info.placement.size),
                    scheduler=(self._scheduler(
                        address, 'nvmlGpuInstanceGetVgpuSchedulerState_v2',
                        gi) if schedulers else None),
                    compute=(self._has_compute(address, gi, profile)
                             if computes else None)))
        return tuple(sorted(found, key=lambda g: g.id))

    def _has_compute(self, address, gi, profile):
        """Whether the GPU instance ``gi`` has the compute instance
        spanning it that ``create_gpu_instance`` makes; None where NVML
        cannot say."""
        import ctypes
        ci_profile = _FULL_CI_PROFILE.get(profile.slices)
        if ci_profile is None:
            return None
        info = self._call(
            address, 'nvmlGpuInstanceGetComputeInstanceProfileInfo', gi,
            ci_profile, self.lib.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
            unanswered=True)
        if info is None:
            return None
        handles = (self.lib.c_nvmlComputeInstance_t * _MAX_GPU_INSTANCES)()
        count = ctypes.c_uint(0)
        self._call(address, 'nvmlGpuInstanceGetComputeInstances', gi,
                   info.id, handles, ctypes.byref(count))
        return count.value > 0

    def mixed_size(self, address):
        """Whether mixed-size (heterogeneous) mode is on; None: N/A."""
        mode = self._call(address, 'nvmlDeviceGetVgpuHeterogeneousMode',
                          self.handle(address), unanswered=True)
        return None if mode is None else \
            mode == self.lib.NVML_VGPU_PGPU_HETEROGENEOUS_MODE

    def creatable_placements(self, address, type_number):
        """``(placement size, placement ids free now)`` of the time-sliced
        vGPU type ``type_number``
        (``nvmlDeviceGetVgpuTypeCreatablePlacements``); None where the GPU
        cannot answer."""
        found = self._call(address,
                           'nvmlDeviceGetVgpuTypeCreatablePlacements',
                           self.handle(address), type_number,
                           unanswered=True)
        if found is None:
            return None
        return (int(found.placementSize),
                tuple(int(found.placementIds[i])
                      for i in range(int(found.count))))

    def _scheduler(self, address, function, target):
        info = self.lib.c_nvmlVgpuSchedulerStateInfo_v2_t()
        info.engineId = self.lib.NVML_VGPU_SCHEDULER_ENGINE_TYPE_GRAPHICS
        state = self._call(address, function, target, info,
                           unanswered=True)
        if state is None:
            return None
        policy = _layout().POLICY_NAMES.get(int(state.schedulerPolicy))
        if policy is None:
            return None
        slice_ms = int(state.timeslice) // _NS_PER_MS
        return _layout().Scheduler(policy=policy,
                                   time_slice_ms=slice_ms or None)

    def scheduler(self, address):
        """The GPU's vGPU scheduler (``layout.Scheduler``), or None."""
        return self._scheduler(address, 'nvmlDeviceGetVgpuSchedulerState_v2',
                               self.handle(address))

    def active_vgpus(self, address, mig):
        """The vGPUs on the GPU (``ActiveVgpu``): with ``mig``, each one's
        GPU instance; without, its placement."""
        found = []
        for instance in self._call(address, 'nvmlDeviceGetActiveVgpus',
                                   self.handle(address),
                                   unanswered=True) or ():
            number = self._call(address, 'nvmlVgpuInstanceGetType',
                                instance, unanswered=True)
            if mig:
                gi_id = self._call(address,
                                   'nvmlVgpuInstanceGetGpuInstanceId',
                                   instance, unanswered=True)
                placement = None
            else:
                gi_id = None
                placement = self._call(address,
                                       'nvmlVgpuInstanceGetPlacementId',
                                       instance, unanswered=True)
            found.append(ActiveVgpu(
                type_id=objects.vendor_type_id(int(number)) if number
                else None,
                gi_id=int(gi_id) if gi_id is not None else None,
                placement=(int(placement) if placement is not None
                           else None)))
        return tuple(found)

    # -- changing --------------------------------------------------------

    def set_mig_mode(self, address, on):
        self._call(address, 'nvmlDeviceSetMigMode', self.handle(address),
                   self.lib.NVML_DEVICE_MIG_ENABLE if on
                   else self.lib.NVML_DEVICE_MIG_DISABLE)

    def create_gpu_instance(self, address, profile, start=None):
        """Make a GPU instance of ``profile`` (a ``layout.GiProfile``),
        at memory slice ``start`` when given (else where the driver
        chooses), and its compute instance spanning it; returns its id.
        When its id cannot be read or its compute instance cannot be made
        the GPU instance is destroyed again (nothing is left half made)."""
        if start is None:
            gi = self._call(address, 'nvmlDeviceCreateGpuInstance',
                            self.handle(address), profile.id)
        else:
            import ctypes
            place = self.lib.c_nvmlGpuInstancePlacement_t()
            place.start = start
            place.size = dict(profile.placements)[start]
            gi = self._call(address,
                            'nvmlDeviceCreateGpuInstanceWithPlacement',
                            self.handle(address), profile.id,
                            ctypes.byref(place))
        try:
            gi_id = int(self._call(address, 'nvmlGpuInstanceGetInfo',
                                   gi).id)
            info = self._call(
                address, 'nvmlGpuInstanceGetComputeInstanceProfileInfo', gi,
                _FULL_CI_PROFILE[profile.slices],
                self.lib.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
            self._call(address, 'nvmlGpuInstanceCreateComputeInstance', gi,
                       info.id)
        except (NvmlError, KeyError) as e:
            if isinstance(e, KeyError):
                e = NvmlError(call='nvmlGpuInstanceCreateComputeInstance',
                              address=address,
                              reason='no compute instance profile spans %d '
                                     'slices' % profile.slices)
            try:
                self._call(address, 'nvmlGpuInstanceDestroy', gi)
            except NvmlError as undone:
                # the first failure is the one to fix; the GPU instance
                # left without a compute instance is the next plan's
                raise NvmlError(
                    call=e.kwargs['call'], address=address,
                    reason='%s; destroying the GPU instance again failed '
                           'too (%s): the next apply destroys and makes it '
                           'again' % (e.kwargs['reason'],
                                      undone.kwargs['reason']))
            raise e
        return gi_id

    def destroy_gpu_instance(self, address, gi_id):
        """Destroy a GPU instance and its compute instances."""
        import ctypes
        gi = self._call(address, 'nvmlDeviceGetGpuInstanceById',
                        self.handle(address), gi_id)
        for ci_profile in sorted(set(_FULL_CI_PROFILE.values())):
            try:
                info = self.lib.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gi, ci_profile,
                    self.lib.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
            except self.lib.NVMLError as e:
                if _no_such_profile(self.lib, e):
                    continue      # a size this GPU instance cannot have
                raise NvmlError(
                    call='nvmlGpuInstanceGetComputeInstanceProfileInfo',
                    address=address, reason=e)
            handles = (self.lib.c_nvmlComputeInstance_t
                       * _MAX_GPU_INSTANCES)()
            count = ctypes.c_uint(0)
            self._call(address, 'nvmlGpuInstanceGetComputeInstances', gi,
                       info.id, handles, ctypes.byref(count))
            for i in range(count.value):
                self._call(address, 'nvmlComputeInstanceDestroy', handles[i])
        self._call(address, 'nvmlGpuInstanceDestroy', gi)

    def set_mixed_size(self, address, on):
        self._call(address, 'nvmlDeviceSetVgpuHeterogeneousMode',
                   self.handle(address),
                   self.lib.NVML_VGPU_PGPU_HETEROGENEOUS_MODE if on
                   else self.lib.NVML_VGPU_PGPU_HOMOGENEOUS_MODE)

    def _scheduler_state(self, scheduler):
        """``nvmlVgpuSchedulerState_v2_t`` of a ``layout.Scheduler``: the
        policy, and a time slice of TT ms as the round-robin frequency
        1000/TT Hz (0: the driver's default)."""
        state = self.lib.c_nvmlVgpuSchedulerState_v2_t()
        state.engineId = self.lib.NVML_VGPU_SCHEDULER_ENGINE_TYPE_GRAPHICS
        state.schedulerPolicy = _layout().SCHEDULERS[scheduler.policy]
        state.avgFactor = 0
        state.frequency = (1000 // scheduler.time_slice_ms
                           if scheduler.time_slice_ms else 0)
        return state

    def set_scheduler(self, address, scheduler):
        self._call(address, 'nvmlDeviceSetVgpuSchedulerState_v2',
                   self.handle(address), self._scheduler_state(scheduler))

    def set_gpu_instances_scheduler(self, address, profiles, scheduler):
        """The scheduler of every GPU instance of ``profiles``."""
        for profile in profiles:
            for gi in self._gpu_instance_handles(address, profile.id):
                self._call(address, 'nvmlGpuInstanceSetVgpuSchedulerState_v2',
                           gi, self._scheduler_state(scheduler))


# --- vGPU migration: NVIDIA's own compatibility check ------------------------
#
# NVML functions used (through ``pynvml``): ``nvmlDeviceGetActiveVgpus``,
# ``nvmlVgpuInstanceGetGpuPciId`` / ``nvmlVgpuInstanceGetMdevUUID`` (which
# instance is the vGPU), ``nvmlVgpuInstanceGetMetadata`` (the source vGPU's
# ``nvmlVgpuMetadata_t``), ``nvmlDeviceGetVgpuMetadata`` (this GPU's
# ``nvmlVgpuPgpuMetadata_t``) and ``nvmlGetVgpuCompatibility`` (NVML API
# reference, "vGPU Migration").  The vGPU's metadata travels as bytes: the
# structure up to the end of its opaque data, which only NVIDIA's driver
# reads.

# Most bytes of a vGPU's metadata taken from a domain's XML (the binding's
# structure is 468 bytes).
MAX_METADATA_BYTES = 4096
# nvmlVgpuVmCompatibility_t (bits) and nvmlVgpuPgpuCompatibilityLimitCode_t
VM_KINDS = ((0x1, 'cold'), (0x2, 'hibernate'), (0x4, 'sleep'),
            (0x8, 'live'))
LIMITS = ((0x1, 'the host driver'), (0x2, 'the guest driver'),
          (0x4, 'the GPU'), (0x80000000, 'another factor'))
LIVE = 'live'
NOT_LIVE = 'not live'
UNKNOWN = 'unknown'


@records.record
class VgpuMetadata:
    """NVIDIA's metadata of one vGPU: ``raw`` (``nvmlVgpuMetadata_t`` up
    to the end of its opaque data) and the host driver it names."""

    raw: bytes
    host_driver: str | None = None


@records.record
class Compatibility:
    """``nvmlGetVgpuCompatibility``'s answer for one vGPU and one GPU:
    ``verdict`` LIVE (a live migration is allowed), NOT_LIVE (NVIDIA's
    driver refuses it: ``kinds`` it allows instead, ``limits`` why), or
    UNKNOWN (nothing asked or answered: ``reason``); ``reason`` is one
    line either way."""

    verdict: str
    reason: str
    kinds: tuple = ()
    limits: tuple = ()

    @property
    def live(self):
        return self.verdict == LIVE

    @property
    def known(self):
        return self.verdict != UNKNOWN


def unknown(reason: str) -> Compatibility:
    return Compatibility(verdict=UNKNOWN, reason=reason)


def _names(value, table):
    return tuple(name for bit, name in table if value & bit)


def answer_of(vm, limit, gpu, source_driver=None, here_driver=None):
    """The ``Compatibility`` of NVML's two numbers for GPU ``gpu``."""
    kinds = _names(vm, VM_KINDS)
    limits = _names(limit, LIMITS)
    if 'live' in kinds:
        return Compatibility(verdict=LIVE, kinds=kinds, limits=limits,
                             reason='NVIDIA\'s driver allows a live '
                             'migration to GPU %s' % gpu)
    drivers = ''
    if 'the host driver' in limits and source_driver and here_driver:
        drivers = ' (the source runs %s, this host %s)' % (
            source_driver, here_driver)
    return Compatibility(
        verdict=NOT_LIVE, kinds=kinds, limits=limits,
        reason='NVIDIA\'s driver allows no live migration to GPU %s (%s): '
        'limited by %s%s' % (
            gpu, 'only %s' % ', '.join(kinds) if kinds else 'no kind at all',
            ' and '.join(limits) or 'an unnamed factor', drivers))


def _vgpu_struct(lib, raw):
    """``raw`` as the binding's ``nvmlVgpuMetadata_t``, or None when it
    cannot be one."""
    import ctypes
    structure = lib.c_nvmlVgpuMetadata_t
    size = ctypes.sizeof(structure)
    if not raw or len(raw) > size:
        return None
    return structure.from_buffer_copy(raw.ljust(size, b'\0'))


def _raw_of(found):
    """The bytes of an ``nvmlVgpuMetadata_t`` up to its opaque data's
    end."""
    import ctypes
    offset = type(found).opaqueData.offset
    length = min(int(found.opaqueDataSize), ctypes.sizeof(found) - offset)
    return bytes(found)[:offset + length]


class MigrationSession(Session):
    """A ``Session`` that also answers NVIDIA's vGPU migration calls."""

    def vgpu_metadata(self, vgpu):
        """``VgpuMetadata`` of the vGPU ``vgpu`` (its VF, a PciAddress, or
        its mdev UUID, a Uuid); None where no instance is it or the driver
        cannot tell."""
        vf = isinstance(vgpu, objects.PciAddress)
        for address, handle in sorted(self._read_handles().items()):
            for instance in self._call(address, 'nvmlDeviceGetActiveVgpus',
                                       handle, unanswered=True) or ():
                if vf:
                    found = _address(self._call(
                        address, 'nvmlVgpuInstanceGetGpuPciId', instance,
                        unanswered=True))
                else:
                    found = _uuid(self._call(
                        address, 'nvmlVgpuInstanceGetMdevUUID', instance,
                        unanswered=True))
                if found != vgpu:
                    continue
                meta = self._call(address, 'nvmlVgpuInstanceGetMetadata',
                                  instance, unanswered=True)
                if meta is None:
                    return None
                return VgpuMetadata(raw=_raw_of(meta),
                                    host_driver=_text(meta.hostDriverVersion))
        return None

    def compatibility(self, meta, address):
        """``Compatibility`` of the vGPU metadata ``meta`` (VgpuMetadata)
        with the GPU ``address`` of this host."""
        import ctypes
        found = _vgpu_struct(self.lib, meta.raw)
        if found is None:
            return Compatibility(
                verdict=NOT_LIVE,
                reason='the source\'s NVIDIA metadata of it (%d bytes) is '
                'not an nvmlVgpuMetadata_t this host\'s nvidia-ml-py can '
                'hold (%d bytes at most)' % (
                    len(meta.raw),
                    ctypes.sizeof(self.lib.c_nvmlVgpuMetadata_t)))
        handle = self.handle(address)
        pgpu = self._call(address, 'nvmlDeviceGetVgpuMetadata', handle,
                          unanswered=True)
        if pgpu is None:
            return unknown('NVML here does not answer '
                           'nvmlDeviceGetVgpuMetadata for GPU %s (not '
                           'supported)' % address)
        try:
            answer = self.lib.nvmlGetVgpuCompatibility(found, pgpu)
        except self.lib.NVMLError as e:
            if _unanswered(self.lib, e):
                return unknown('NVML here does not answer '
                               'nvmlGetVgpuCompatibility (%s)' % e)
            return Compatibility(
                verdict=NOT_LIVE,
                reason='NVIDIA\'s driver here cannot judge the source\'s '
                'metadata of it against GPU %s: %s' % (address, e))
        return answer_of(int(answer.vgpuVmCompatibility),
                         int(answer.compatibilityLimitCode), address,
                         _text(found.hostDriverVersion),
                         _text(pgpu.hostDriverVersion))


def _migration_session(nvml):
    """A ``MigrationSession`` of ``nvml`` (an ``Nvml`` or None); or the
    one-line reason there is none."""
    if nvml is None:
        return None, 'NVML is not used on this host ([gpu]/nvml)'
    try:
        session = nvml.session()
    except NvmlUnavailable as e:
        return None, str(e).split(';')[0]
    return MigrationSession(session.lib), None


def read_vgpu_metadata(nvml, vgpus):
    """``{vgpu: VgpuMetadata or None}`` for the vGPUs ``vgpus`` (VFs or
    mdev UUIDs) of this host; ``{}`` without NVML."""
    session, _ = _migration_session(nvml)
    if session is None:
        return {}
    with session:
        found = {}
        for vgpu in vgpus:
            try:
                found[vgpu] = session.vgpu_metadata(vgpu)
            except NvmlError as e:
                LOG.warning('NVML: no vGPU metadata of %s: %s', vgpu, e)
                found[vgpu] = None
        return found


def compatibility(nvml: Nvml | None, meta: VgpuMetadata,
                  address: objects.PciAddress) -> Compatibility:
    """``Compatibility`` of the vGPU metadata ``meta`` with the GPU
    ``address`` of this host; UNKNOWN where NVML is not there or does not
    answer."""
    session, why = _migration_session(nvml)
    if session is None:
        return unknown(why)
    with session:
        try:
            return session.compatibility(meta, address)
        except NvmlUnavailable as e:
            return unknown(str(e).split(';')[0])
        except NvmlError as e:
            return unknown(str(e))


def best_compatibility(nvml: Nvml | None,
                       meta: VgpuMetadata) -> Compatibility:
    """The best ``Compatibility`` of ``meta`` over every GPU of this host
    (a live one if any GPU allows it, else the first refusal, else
    UNKNOWN): for a vGPU that is not given a GPU here."""
    session, why = _migration_session(nvml)
    if session is None:
        return unknown(why)
    with session:
        answers = []
        try:
            for address in sorted(session._read_handles()):
                answer = session.compatibility(meta, address)
                if answer.live:
                    return answer
                answers.append(answer)
        except NvmlError as e:
            return unknown(str(e))
    refused = [a for a in answers if a.verdict == NOT_LIVE]
    if refused:
        return refused[0]
    return answers[0] if answers else unknown('NVML lists no GPU here')
