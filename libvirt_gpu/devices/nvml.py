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
# simulator (tests/unit/test_architecture.py names this door).
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

    def _unanswered(self, lib, error):
        codes = {getattr(lib, name, None) for name in _UNANSWERED}
        return getattr(error, 'value', None) in codes

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
