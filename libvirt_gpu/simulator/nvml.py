"""NVML on a simulated host: NVIDIA's own binding over a simulated driver.

``module(...)`` returns a module object that IS ``nvidia-ml-py``'s
``pynvml`` (a private copy of the installed one: every function, argument,
default, ctypes structure and constant is the binding's own), whose
``libnvidia-ml.so`` is replaced by ``SimLibrary``: the C functions the
binding looks up, answering from the same simulated GPU state as the
simulated sysfs (``kernel.SimKernel`` and ``mig``'s rules).  Its
classes (``NVMLError_*``, the ctypes structures and handle types) are the
installed binding's, so ``except pynvml.NVMLError_InUse`` catches what the
simulator raises and a structure built from ``pynvml`` may be passed in.

What cannot lie: a call the product makes that the binding does not have
fails as it would on a host (``AttributeError``); a C function the
simulator does not implement answers ``NVML_ERROR_FUNCTION_NOT_FOUND``, as
an older driver's library does; argument counts and shapes are checked by
the binding's own wrappers before the simulator sees them
(tests/unit/simulator/test_nvml.py lists what ``SimLibrary`` offers against the
names the binding looks up).

Failures a test injects: ``inject(point, nth, error, kernel=... |
sysfs_root=...)`` makes the simulated host fail the ``nth`` call of
``point`` from now on, once: an NVML C function this library offers
(``EXPORTED`` but ``UNFAILING``; the call answers ``error``, an NVML
return code, default ``NVML_ERROR_UNKNOWN``, before it changes anything)
or a sysfs write the kernel answers (``kernel.SYSFS_POINTS``: a PF's
``sriov_numvfs``, a VF's vGPU type file; default EIO).  The fault is the
host's (``SimKernel``: a live tree's server, a static tree's driver
file), so it strikes whichever process makes the call, the product's
included; it is asked for through the same channel as NVML (the
``inject`` and ``faults`` requests).  A call counts once however many
questions it asks the driver (its first one carries its name,
``op_function``).

The GPUs NVML lists are the physical GPUs whose profile entry has a
``gpu`` section, by PCI address.  Where the state lives:

``module(kernel=SimKernel)``
    in this process (tests of the rules);
``module(sysfs_root=ROOT)``
    the host's sysfs root: a live FUSE tree (``simulator.live``, the
    state in its server process) is asked through its control file
    ``CONTROL_NAME`` at the root; a static tree (``write_sysfs``, the
    tests' in-process kernel) keeps the driver's state in a file next to
    it and is changed under the kernel's lock, as the tests' kernel double
    changes it.  This is what ``[gpu]/nvml = simulated`` binds to the
    configured sysfs root (``devices.nvml.source``).

vGPU migration (``nvmlVgpuInstanceGetMetadata``,
``nvmlDeviceGetVgpuMetadata``, ``nvmlDeviceGetPgpuMetadataString``,
``nvmlGetVgpuCompatibility``): the host's driver version is the profile's
``driver_version``; the compatibility answer follows NVIDIA's documented
rules (no live migration between boards such as the H100 80GB PCIe and
94GB NVL, between H200/H800/H100 boards, or between host driver versions
NVIDIA's vGPU manager does not pair), with what is documented and what is
assumed, and the sources, listed at the section "vGPU migration" below.
"""

import contextlib
import ctypes
import fcntl
import importlib.util
import json
import os
import re
import sys
import threading

from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.simulator import kernel as kernel_mod
from libvirt_gpu.simulator import loading
from libvirt_gpu.simulator import mig
from libvirt_gpu.simulator import sysfs_tree

# The live tree's request/reply file (one JSON request written, its reply
# read back on the same open file).
CONTROL_NAME = '.libvirt-gpu-simulator-nvml'
MAX_REQUEST = 65536

# NVML's ``INVALID_GPU_INSTANCE_PROFILE_ID`` (nvml.h; the binding does not
# name it): what a time-sliced type's GI profile id reads.
INVALID_GPU_INSTANCE_PROFILE_ID = 0xFFFFFFFF
# C functions that ask the driver nothing: no failure can be injected there.
UNFAILING = ('nvmlInitWithFlags', 'nvmlShutdown', 'nvmlErrorString')
NVML_GPU_VIRTUALIZATION_MODE_HOST_VGPU = 3
# nvmlErrorString's text for the codes the simulated driver answers that the
# binding's table lacks.
ERROR_STRINGS = {mig.NVML_ERROR_IN_USE: 'In use by another client',
                 mig.NVML_ERROR_INSUFFICIENT_RESOURCES:
                 'Ran out of critical resources, other than memory'}
_CARG = type(ctypes.byref(ctypes.c_int()))
_POINTER_SIZE = ctypes.sizeof(ctypes.c_void_p)


def _binding():
    try:
        import pynvml
    except ImportError:
        raise exception.SimulatorError(
            reason='the simulated NVML is NVIDIA\'s binding over a '
                   'simulated driver: install nvidia-ml-py (pip install '
                   'nvidia-ml-py)')
    return pynvml


def _private_copy():
    """A fresh copy of the installed ``pynvml`` module (its own globals:
    library, function cache, reference count), sharing the installed
    module's error classes."""
    real = _binding()
    spec = importlib.util.spec_from_file_location(
        'libvirt_gpu_simulated_pynvml', real.__file__)
    copy = importlib.util.module_from_spec(spec)
    # the binding looks itself up in sys.modules while it loads
    sys.modules[spec.name] = copy
    try:
        spec.loader.exec_module(copy)
    finally:
        del sys.modules[spec.name]
    # The installed module's classes (its errors, ctypes structures and
    # handle types): what the copy's functions take and return is what a
    # caller of the installed module knows.
    for name in dir(real):
        if isinstance(getattr(real, name), type):
            setattr(copy, name, getattr(real, name))
    for code, text in ERROR_STRINGS.items():
        real.NVMLError._errcode_to_string.setdefault(code, text)
    return copy


def module(kernel=None, sysfs_root=None, profile=None, backend=None):
    """A ``pynvml`` module answering from a simulated host: ``kernel`` (a
    ``SimKernel`` in this process) or the simulated tree at
    ``sysfs_root`` (its profile read from the tree's marker unless
    ``profile`` is given); or from ``backend``, an object whose
    ``call(op, *args)`` answers the driver's questions (``OPS``) as a
    test wants them answered (tests/doubles/nvml_fake.py)."""
    if [kernel, sysfs_root, backend].count(None) != 2:
        raise exception.SimulatorError(
            reason='the simulated NVML needs one of a kernel, a sysfs root '
                   'or a backend')
    if backend is None:
        backend = _backend(kernel, sysfs_root, profile)
    lib = _private_copy()
    lib.nvmlLib = SimLibrary(backend)
    lib.simulated = backend
    return lib


def _backend(kernel=None, sysfs_root=None, profile=None):
    if kernel is not None:
        return KernelBackend(kernel)
    if sysfs_root is None:
        raise exception.SimulatorError(
            reason='a simulated host is a kernel or a sysfs root')
    if os.path.exists(os.path.join(sysfs_root, CONTROL_NAME)):
        return LiveBackend(sysfs_root)
    return TreeBackend(sysfs_root, profile)


def _control(op, *args, kernel=None, sysfs_root=None):
    try:
        return _backend(kernel, sysfs_root).call(op, *args)
    except mig.DriverError as e:
        raise exception.SimulatorError(reason=e.reason)


def inject(point, nth=1, error=None, kernel=None, sysfs_root=None):
    """Make the simulated host (``kernel``, or the tree at ``sysfs_root``,
    live or static) fail the ``nth`` call of ``point`` from now on, once,
    with ``error`` (see the module doc); ``nth`` 0 disarms ``point``.
    SimulatorError: a point it has not, a bad count or error."""
    _control('inject', point, nth, error, kernel=kernel,
             sysfs_root=sysfs_root)


def faults(kernel=None, sysfs_root=None):
    """``{point: [calls until the failing one, error]}``: the faults of
    the simulated host that have not struck yet."""
    return _control('faults', kernel=kernel, sysfs_root=sysfs_root)


# --- where the state is ------------------------------------------------------

class KernelBackend(object):
    """The driver's state in this process."""

    # its calls carry their C function's name (``op_function``): the
    # simulated host's injected failures strike them
    takes_faults = True

    def __init__(self, kernel):
        self.kernel = kernel

    def call(self, op, *args):
        return OPS[op](self.kernel, *args)


class TreeBackend(object):
    """A static tree: the kernel's state read back from it (and the
    driver's file) before each call, under the kernel's lock; changes
    written back as the kernel double writes them."""

    takes_faults = True

    def __init__(self, root, profile=None):
        self.root = os.path.realpath(os.fspath(root))
        if profile is None:
            try:
                with open(os.path.join(self.root, sysfs_tree.MARKER)) as f:
                    profile = json.load(f)['profile']
            except (OSError, ValueError, KeyError):
                raise exception.SimulatorError(
                    reason='%s is not a simulated sysfs tree (no %s): '
                    'write one with libvirt-gpu simulate' % (
                        self.root, sysfs_tree.MARKER))
        self.profile = loading.load_profile(profile)
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def _locked(self):
        fd = os.open(os.path.join(self.root, sysfs_tree.LOCK_NAME),
                     os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def call(self, op, *args):
        with self._lock, self._locked():
            kernel = kernel_mod.SimKernel(self.profile)
            kernel.restore(sysfs_tree.read_state(self.root, self.profile))
            changed = []
            kernel.subscribe(changed.append)
            try:
                return OPS[op](kernel, *args)
            finally:
                for event in changed:
                    if isinstance(event, kernel_mod.DriverChanged):
                        sysfs_tree.write_driver_state(self.root,
                                                      event.state)


class LiveBackend(object):
    """A live FUSE tree: each call is a request to its server, whose
    kernel holds the state (``live.LiveTree.nvml_request``)."""

    takes_faults = True

    def __init__(self, root):
        self.path = os.path.join(os.fspath(root), CONTROL_NAME)

    def call(self, op, *args):
        request = json.dumps({'op': op, 'args': list(args)}).encode()
        answer = json.loads(self.exchange(request).decode())
        if 'error' in answer:
            raise mig.DriverError(answer['error'], answer['reason'])
        return answer['ok']

    def exchange(self, request):
        """Write ``request`` to the channel, read the reply back on the
        same open file."""
        fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        try:
            os.write(fd, request)
            reply = b''
            while True:
                chunk = os.pread(fd, 65536, len(reply))
                if not chunk:
                    return reply
                reply += chunk
        finally:
            os.close(fd)


def serve_request(kernel, data):
    """The live tree's side of ``LiveBackend``: the reply (bytes) to the
    request ``data``."""
    try:
        request = json.loads(data.decode())
        op = OPS[request['op']]
        result = {'ok': op(kernel, *request['args'])}
    except mig.DriverError as e:
        result = {'error': e.code, 'reason': e.reason}
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        result = {'error': mig.NVML_ERROR_INVALID_ARGUMENT,
                  'reason': 'bad request: %s' % e}
    return json.dumps(result).encode()


# --- the driver's answers (JSON in, JSON out) --------------------------------

def _gpu(kernel, pf):
    try:
        return kernel.gpu(pf)
    except KeyError:
        raise mig.DriverError(mig.NVML_ERROR_INVALID_ARGUMENT,
                              'no simulated GPU %s' % pf)


def _types(kernel, pf):
    return {t.number: t for t in kernel.gpu_types(pf)}


def _type(kernel, number):
    for pf in kernel.driver_gpus():
        found = _types(kernel, pf).get(number)
        if found is not None:
            return found
    raise mig.DriverError(mig.NVML_ERROR_INVALID_ARGUMENT,
                          'no vGPU type %r' % (number,))


def _gi_profile(gpu, profile_id):
    table = gpu.gi_table
    found = table.profile(profile_id) if table is not None else None
    if found is None:
        raise mig.DriverError(mig.NVML_ERROR_INVALID_ARGUMENT,
                              '%s has no GI profile id %r'
                              % (gpu.name, profile_id))
    return found


def _profile_info(gpu, found):
    return {'id': found.id, 'isP2pSupported': int(found.p2p),
            'sliceCount': found.slices, 'instanceCount': found.instances,
            'multiprocessorCount': found.sm, 'copyEngineCount': found.ce,
            'decoderCount': found.dec, 'encoderCount': found.enc,
            'jpegCount': found.jpeg, 'ofaCount': found.ofa,
            'memorySizeMB': found.memory_mb,
            'name': 'MIG ' + found.name}


def op_function(kernel, function, op, *args):
    """The first question ``op`` of one call of the C function
    ``function``: when a failure injected at ``function`` strikes this
    call, its error answers instead (nothing is changed)."""
    code = kernel.strike(function)
    if code is not None:
        raise mig.DriverError(code, '%s failed: an injected failure'
                              % function)
    return OPS[op](kernel, *args)


def op_inject(kernel, point, nth=1, error=None):
    """``SimKernel.inject`` for a C function of this library or a sysfs
    write (``kernel.SYSFS_POINTS``)."""
    nvml_call = point in _FUNCTIONS and point not in UNFAILING
    if not nvml_call and point not in kernel_mod.SYSFS_POINTS:
        raise mig.DriverError(
            mig.NVML_ERROR_INVALID_ARGUMENT,
            'no injection point %r: a C function of the simulated NVML '
            'that asks the driver (simulator.nvml.EXPORTED, not %s) or one '
            'of %s' % (point, ', '.join(UNFAILING),
                       ', '.join(kernel_mod.SYSFS_POINTS)))
    if error is None and nvml_call:
        error = mig.NVML_ERROR_UNKNOWN
    try:
        kernel.inject(point, nth, error)
    except exception.SimulatorError as e:
        raise mig.DriverError(mig.NVML_ERROR_INVALID_ARGUMENT,
                              str(e))


def op_faults(kernel):
    return kernel.faults()


def op_gpus(kernel):
    return kernel.driver_gpus()


def op_device(kernel, pf):
    """What NVML says of the GPU itself; a field None: "Not Supported"
    (MIG mode on a GPU without MIG)."""
    gpu, state = _gpu(kernel, pf)
    dev = kernel.profile.device(pf)
    types = {t.id: t for t in kernel.gpu_types(pf)}
    used = sum(types[p.type_id].framebuffer
               for p in kernel.gpu_vgpus(pf).values())
    return {'name': gpu.name, 'bus_id': _bus_id(pf),
            'memory_mib': gpu.memory_mib, 'memory_used_mib': used,
            'pci_device_id': int(dev.product_id + dev.vendor_id, 16),
            'pci_subsystem_id': int(dev.subsystem_device_id +
                                    dev.subsystem_vendor_id, 16),
            'virtualization_mode': NVML_GPU_VIRTUALIZATION_MODE_HOST_VGPU,
            'mig_mode': (state.mig_mode if gpu.gi_table is not None
                         else None)}


def op_utilization(kernel, pf):
    """``[gpu %, memory %]``: a simulated GPU computes nothing."""
    _gpu(kernel, pf)
    return [0, 0]


def op_vgpu_samples(kernel, pf):
    """``[[instance, sm %], ...]``: no samples on a simulated GPU."""
    _gpu(kernel, pf)
    return []


def op_set_mig_mode(kernel, pf, mode):
    _gpu(kernel, pf)
    enabled = kernel.vfs_enabled(pf)
    kernel.driver(pf, lambda gpu, state, placed, running:
                  mig.set_mig_mode(gpu, state, mode, enabled))


def op_gi_profile_info(kernel, pf, nvml_profile):
    gpu, _ = _gpu(kernel, pf)
    table = gpu.gi_table
    found = table.by_nvml_profile(nvml_profile) if table else None
    if found is None:
        raise mig.DriverError(mig.NVML_ERROR_NOT_SUPPORTED,
                              '%s has no GI profile %r'
                              % (gpu.name, nvml_profile))
    return _profile_info(gpu, found)


def op_gi_profile_info_by_id(kernel, pf, profile_id):
    gpu, _ = _gpu(kernel, pf)
    return _profile_info(gpu, _gi_profile(gpu, profile_id))


def op_gi_possible_placements(kernel, pf, profile_id):
    gpu, _ = _gpu(kernel, pf)
    found = _gi_profile(gpu, profile_id)
    return [[s, found.placement_size] for s in found.placements]


def op_gi_remaining(kernel, pf, profile_id):
    gpu, state = _gpu(kernel, pf)
    found = _gi_profile(gpu, profile_id)
    if state.mig_mode != mig.NVML_DEVICE_MIG_ENABLE:
        return 0
    # How many more could be made now, one after the other.
    trial = mig.GpuState.from_json(state.to_json())
    count = 0
    while True:
        try:
            mig.create_gi(gpu, trial, found.id)
        except mig.DriverError:
            return count
        count += 1


def op_create_gi(kernel, pf, profile_id, start=None):
    return kernel.driver(pf, lambda gpu, state, placed, running:
                         mig.create_gi(gpu, state, profile_id, start).id)


def op_destroy_gi(kernel, pf, gi):
    def destroy(gpu, state, placed, running):
        found = state.gis.get(gi)
        if found is None:
            raise mig.DriverError(mig.NVML_ERROR_INVALID_ARGUMENT,
                                  'no GPU instance %r on %s' % (gi, gpu.name))
        if any(p.gi == gi for p in placed):
            raise mig.DriverError(mig.NVML_ERROR_IN_USE,
                                  'GPU instance %d on %s holds vGPUs'
                                  % (gi, gpu.name))
        if found.ci is not None:
            raise mig.DriverError(mig.NVML_ERROR_IN_USE,
                                  'GPU instance %d on %s has a compute '
                                  'instance: destroy it first'
                                  % (gi, gpu.name))
        del state.gis[gi]
    kernel.driver(pf, destroy)


def _gi(state, gi, code=mig.NVML_ERROR_INVALID_ARGUMENT):
    """The GPU instance ``gi`` of a GPU's ``state``; DriverError ``code``
    when there is none."""
    found = state.gis.get(gi)
    if found is None:
        raise mig.DriverError(code, 'no GPU instance %r' % (gi,))
    return found


def op_gis(kernel, pf, profile_id):
    _, state = _gpu(kernel, pf)
    return [g.id for _, g in sorted(state.gis.items())
            if g.profile_id == profile_id]


def op_gi_info(kernel, pf, gi):
    _, state = _gpu(kernel, pf)
    found = _gi(state, gi, mig.NVML_ERROR_NOT_FOUND)
    return [found.id, found.profile_id, found.start, found.size, found.ci]


def op_ci_profile_info(kernel, pf, gi, ci_profile):
    """The one compute-instance profile a GI offers: the one filling it
    (its id is its NVML_COMPUTE_INSTANCE_PROFILE_* index)."""
    gpu, state = _gpu(kernel, pf)
    found = _gi(state, gi)
    profile = gpu.gi_table.profile(found.profile_id)
    if mig.CI_PROFILE_BY_SLICES.get(profile.slices) != ci_profile:
        raise mig.DriverError(mig.NVML_ERROR_NOT_SUPPORTED,
                              'GPU instance %d offers only the compute '
                              'instance that fills it' % gi)
    return {'id': ci_profile, 'sliceCount': profile.slices,
            'instanceCount': 1, 'multiprocessorCount': profile.sm,
            'sharedCopyEngineCount': profile.ce,
            'sharedDecoderCount': profile.dec,
            'sharedEncoderCount': profile.enc,
            'sharedJpegCount': profile.jpeg, 'sharedOfaCount': profile.ofa,
            'name': '%dc.%s' % (profile.slices, profile.name)}


def op_gi_scheduler(kernel, pf, gi):
    _, state = _gpu(kernel, pf)
    found = _gi(state, gi)
    return [found.policy, found.avg_factor, found.timeslice_ns()]


def op_set_gi_scheduler(kernel, pf, gi, policy, avg_factor, frequency):
    def change(gpu, state, placed, running):
        found = _gi(state, gi)
        on_gi = {vf for vf, p in kernel.gpu_vgpus(pf).items()
                 if p.gi == gi}
        mig.set_scheduler(gpu, state, policy, avg_factor, frequency,
                          [vf for vf in running if vf in on_gi], gi=found)
    kernel.driver(pf, change)


def op_create_ci(kernel, pf, gi, ci_profile):
    def create(gpu, state, placed, running):
        found = _gi(state, gi)
        slices = gpu.gi_table.profile(found.profile_id).slices
        if mig.CI_PROFILE_BY_SLICES.get(slices) != ci_profile:
            raise mig.DriverError(mig.NVML_ERROR_NOT_SUPPORTED,
                                  'the simulated driver makes only the '
                                  'compute instance that fills a GPU '
                                  'instance (profile %r)'
                                  % mig.CI_PROFILE_BY_SLICES.get(slices))
        if found.ci is not None:
            raise mig.DriverError(mig.NVML_ERROR_INSUFFICIENT_RESOURCES,
                                  'GPU instance %d has its compute '
                                  'instance' % gi)
        found.ci = 0
        return found.ci
    return kernel.driver(pf, create)


def op_destroy_ci(kernel, pf, gi, ci):
    def destroy(gpu, state, placed, running):
        found = state.gis.get(gi)
        if found is None or found.ci != ci:
            raise mig.DriverError(mig.NVML_ERROR_INVALID_ARGUMENT,
                                  'no compute instance %r in GPU instance '
                                  '%r' % (ci, gi))
        found.ci = None
    kernel.driver(pf, destroy)


def op_heterogeneous(kernel, pf):
    gpu, state = _gpu(kernel, pf)
    if state.mig_mode == mig.NVML_DEVICE_MIG_ENABLE or not gpu.mixed_slots:
        raise mig.DriverError(mig.NVML_ERROR_NOT_SUPPORTED,
                              'mixed-size mode is N/A on %s' % gpu.name)
    return (mig.NVML_VGPU_PGPU_HETEROGENEOUS_MODE if state.heterogeneous
            else mig.NVML_VGPU_PGPU_HOMOGENEOUS_MODE)


def op_set_heterogeneous(kernel, pf, mode):
    kernel.driver(pf, lambda gpu, state, placed, running:
                  mig.set_heterogeneous(gpu, state, mode, placed))


def op_scheduler(kernel, pf):
    gpu, state = _gpu(kernel, pf)
    if state.mig_mode == mig.NVML_DEVICE_MIG_ENABLE:
        raise mig.DriverError(mig.NVML_ERROR_NOT_SUPPORTED,
                              'no time-sliced scheduler with MIG on')
    return [state.policy, state.avg_factor, state.timeslice_ns()]


def op_set_scheduler(kernel, pf, policy, avg_factor, frequency):
    kernel.driver(pf, lambda gpu, state, placed, running:
                  mig.set_scheduler(gpu, state, policy, avg_factor,
                                    frequency, running))


def op_scheduler_caps(kernel, pf):
    gpu, _ = _gpu(kernel, pf)
    return list(gpu.policies)


def op_supported_types(kernel, pf):
    _gpu(kernel, pf)
    return [t.number for t in kernel.gpu_types(pf)]


def op_creatable_types(kernel, pf):
    """The types some free enabled VF of ``pf`` lists now."""
    _gpu(kernel, pf)
    found = []
    for vf in kernel.vendor_vfs():
        if kernel.profile.device(vf).physfn != pf or kernel.vf_type(vf):
            continue
        found.extend(t.number for t in kernel.vf_creatable(vf)
                     if t.number not in found)
    return sorted(found)


def op_type_info(kernel, number):
    found = _type(kernel, number)
    return {'name': found.name or '', 'framebuffer_mb': found.framebuffer,
            'gi_profile_id': (found.gi_profile_id
                              if found.gi_profile_id is not None
                              else INVALID_GPU_INSTANCE_PROFILE_ID),
            'max_per_gi': found.max_per_gi or 0}


def _offered(kernel, pf, number):
    """``(gpu, state, type)`` of the vGPU type ``number`` the GPU ``pf``
    offers; INVALID_ARGUMENT for one it does not."""
    gpu, state = _gpu(kernel, pf)
    found = _types(kernel, pf).get(number)
    if found is None:
        raise mig.DriverError(mig.NVML_ERROR_INVALID_ARGUMENT,
                              '%s does not offer vGPU type %r'
                              % (gpu.name, number))
    return gpu, state, found


def op_max_instances(kernel, pf, number):
    return mig.max_instances(*_offered(kernel, pf, number))


def _placements(kernel, pf, number):
    gpu, state, found = _offered(kernel, pf, number)
    if mig.is_mig_backed(found):
        raise mig.DriverError(mig.NVML_ERROR_NOT_SUPPORTED,
                              'placements are for time-sliced vGPUs; %s '
                              'is MIG-backed' % found.name)
    return gpu, state, found


def op_supported_placements(kernel, pf, number, mode):
    gpu, state, found = _placements(kernel, pf, number)
    heterogeneous = mode == mig.NVML_VGPU_PGPU_HETEROGENEOUS_MODE
    size = mig.placement_size(gpu, found, heterogeneous)
    return [size or 0, list(mig.supported_placements(gpu, found,
                                                     heterogeneous))]


def op_creatable_placements(kernel, pf, number):
    gpu, state, found = _placements(kernel, pf, number)
    placed = list(kernel.gpu_vgpus(pf).values())
    types = {t.id: t for t in kernel.gpu_types(pf)}
    size = mig.placement_size(gpu, found, state.heterogeneous)
    return [size or 0, list(mig.creatable_placements(
        gpu, state, found, placed, types))]


def op_gi_creatable_types(kernel, pf, gi):
    gpu, state = _gpu(kernel, pf)
    found = _gi(state, gi)
    placed = list(kernel.gpu_vgpus(pf).values())
    types = {t.id: t for t in kernel.gpu_types(pf)}
    return [t.number for t in kernel.gpu_types(pf)
            if mig.is_mig_backed(t) and mig.gi_room(found, t, placed, types)]


def _instances(kernel):
    """``{instance id: VF}``: a vGPU's NVML instance id is its VF's
    position in the profile (stable across processes), from 1."""
    return {i + 1: dev.address
            for i, dev in enumerate(kernel.profile.devices)}


def op_active_vgpus(kernel, pf):
    _gpu(kernel, pf)
    vgpus = kernel.gpu_vgpus(pf)
    return [i for i, vf in _instances(kernel).items() if vf in vgpus]


def op_gi_active_vgpus(kernel, pf, gi):
    _gpu(kernel, pf)
    vgpus = kernel.gpu_vgpus(pf)
    return [i for i, vf in _instances(kernel).items()
            if vf in vgpus and vgpus[vf].gi == gi]


def op_vgpu_instance(kernel, instance):
    vf = _instances(kernel).get(instance)
    dev = kernel.profile.device(vf) if vf is not None else None
    placed = None
    if dev is not None and dev.physfn in kernel.driver_gpus():
        placed = kernel.gpu_vgpus(dev.physfn).get(vf)
    if placed is None:
        raise mig.DriverError(mig.NVML_ERROR_INVALID_ARGUMENT,
                              'no vGPU instance %r' % (instance,))
    return {'type': objects.vendor_type_number(placed.type_id), 'vf': vf,
            'bus_id': _bus_id(vf), 'gi': placed.gi,
            'placement': placed.placement, 'mdev_uuid': None,
            'fb_usage_mib': 0}


OPS = {name[3:]: function for name, function in dict(globals()).items()
       if name.startswith('op_')}


# --- libnvidia-ml's C functions over the driver ------------------------------

def _obj(value):
    """The ctypes object behind ``byref(x)`` (or ``value`` itself)."""
    return value._obj if isinstance(value, _CArgType) else value


_CArgType = _CARG


def _int(value):
    value = _obj(value)
    return value.value if hasattr(value, 'value') else int(value)


def _address_of(handle):
    return ctypes.cast(_obj(handle), ctypes.c_void_p).value


def _store_pointer(slot, value):
    ctypes.c_void_p.from_address(slot).value = value


def _bus_id(address):
    """``0000:4e:00.0`` -> ``00000000:4E:00.0`` (NVML's form)."""
    domain, bus, rest = address.split(':')
    return ('%08X:%s:%s' % (int(domain, 16), bus.upper(), rest.upper()))


class SimLibrary(object):
    """The C functions of ``libnvidia-ml.so.1`` that the binding calls,
    answering from ``backend`` (``KernelBackend``, ``TreeBackend`` or
    ``LiveBackend``).  Each takes what the binding's wrapper passes and
    returns an ``nvmlReturn_t``."""

    def __init__(self, backend):
        self._backend = backend
        self._handles = {}        # address -> ('gpu', pf) | ('gi', pf, id)
        self._keys = {}           # key -> (address, buffer kept alive)
        self._initialised = 0
        self._lock = threading.Lock()
        # the C function being called, until it asks its first question
        self._calling = threading.local()

    # -- plumbing -------------------------------------------------------

    def _handle(self, *key):
        with self._lock:
            if key not in self._keys:
                buffer = ctypes.create_string_buffer(8)
                address = ctypes.addressof(buffer)
                self._keys[key] = (address, buffer)
                self._handles[address] = key
            return self._keys[key][0]

    def _key(self, handle, kind):
        key = self._handles.get(_address_of(handle))
        if key is None or key[0] != kind:
            raise mig.DriverError(mig.NVML_ERROR_INVALID_ARGUMENT,
                                  'not a %s handle' % kind)
        return key

    def _pf(self, handle):
        return self._key(handle, 'gpu')[1]

    def _call(self, op, *args):
        if not self._initialised:
            raise mig.DriverError(mig.NVML_ERROR_UNINITIALIZED,
                                  'nvmlInit first')
        function = getattr(self._calling, 'name', None)
        if function is not None and getattr(self._backend, 'takes_faults',
                                            False):
            self._calling.name = None
            return self._backend.call('function', function, op, *args)
        return self._backend.call(op, *args)

    def __getattr__(self, name):
        function = _FUNCTIONS.get(name)
        if function is None:
            raise AttributeError(name)

        def call(*args):
            self._calling.name = name
            try:
                result = function(self, *args)
            except mig.DriverError as e:
                return e.code
            finally:
                self._calling.name = None
            return mig.NVML_SUCCESS if result is None else result
        call.__name__ = name
        return call


_FUNCTIONS: dict[str, object] = {}


def _c(function):
    """Register ``function`` as the C function of its name."""
    _FUNCTIONS[function.__name__] = function
    return function


@_c
def nvmlInitWithFlags(lib, flags):
    refused = getattr(lib._backend, 'init_error', None)
    if refused:
        return refused
    lib._initialised += 1


@_c
def nvmlShutdown(lib):
    if not lib._initialised:
        return mig.NVML_ERROR_UNINITIALIZED
    lib._initialised -= 1


@_c
def nvmlErrorString(lib, code):
    return ERROR_STRINGS.get(_int(code), 'Unknown Error').encode()


@_c
def nvmlDeviceGetCount_v2(lib, count):
    _obj(count).value = len(lib._call('gpus'))


@_c
def nvmlDeviceGetHandleByIndex_v2(lib, index, device):
    gpus = lib._call('gpus')
    index = _int(index)
    if not 0 <= index < len(gpus):
        return mig.NVML_ERROR_INVALID_ARGUMENT
    _store_pointer(ctypes.addressof(_obj(device)),
                   lib._handle('gpu', gpus[index]))


@_c
def nvmlDeviceGetHandleByPciBusId_v2(lib, bus_id, device):
    bus_id = getattr(bus_id, 'value', bus_id)       # c_char_p
    text = bus_id.decode() if isinstance(bus_id, bytes) else str(bus_id)
    for pf in lib._call('gpus'):
        # NVML takes its own form and the short one (0000:4e:00.0)
        if text.upper() in (_bus_id(pf), pf.upper()):
            _store_pointer(ctypes.addressof(_obj(device)),
                           lib._handle('gpu', pf))
            return mig.NVML_SUCCESS
    return mig.NVML_ERROR_NOT_FOUND


def _about(lib, device, field):
    """``field`` of what NVML says of ``device``; None: Not Supported."""
    value = lib._call('device', lib._pf(device))[field]
    if value is None:
        raise mig.DriverError(mig.NVML_ERROR_NOT_SUPPORTED,
                              '%s: not supported' % field)
    return value


@_c
def nvmlDeviceGetPciInfo_v3(lib, device, info):
    about = lib._call('device', lib._pf(device))
    info = _obj(info)
    info.busId = info.busIdLegacy = about['bus_id'].encode()
    parts = about['bus_id'].replace('.', ':').split(':')
    if len(parts) == 4 and all(re.fullmatch('[0-9A-Fa-f]+', p)
                               for p in parts):
        info.domain, info.bus, info.device = (int(p, 16)
                                              for p in parts[:3])
    info.pciDeviceId = about['pci_device_id']
    info.pciSubSystemId = about['pci_subsystem_id']


@_c
def nvmlDeviceGetName(lib, device, name, length):
    text = _about(lib, device, 'name').encode()
    if len(text) >= _int(length):
        return mig.NVML_ERROR_INSUFFICIENT_SIZE
    name.value = text


@_c
def nvmlDeviceGetMemoryInfo(lib, device, memory):
    total = _about(lib, device, 'memory_mib') << 20
    used = _about(lib, device, 'memory_used_mib') << 20
    memory = _obj(memory)
    memory.total, memory.free, memory.used = total, total - used, used


@_c
def nvmlDeviceGetVirtualizationMode(lib, device, mode):
    _obj(mode).value = _about(lib, device, 'virtualization_mode')


@_c
def nvmlDeviceGetUtilizationRates(lib, device, rates):
    rates = _obj(rates)
    rates.gpu, rates.memory = lib._call('utilization', lib._pf(device))


@_c
def nvmlDeviceGetVgpuUtilization(lib, device, since, value_type, count,
                                 samples):
    found = lib._call('vgpu_samples', lib._pf(device))
    count = _obj(count)
    if samples is None or count.value < len(found):
        short = bool(found)
        count.value = len(found)
        return mig.NVML_ERROR_INSUFFICIENT_SIZE if short \
            else mig.NVML_SUCCESS
    _obj(value_type).value = 1                  # NVML_VALUE_TYPE_UNSIGNED_INT
    samples = _obj(samples)
    for i, (instance, sm) in enumerate(found):
        samples[i].vgpuInstance = instance
        samples[i].timeStamp = _int(since) + 1
        samples[i].smUtil.uiVal = sm
    count.value = len(found)


@_c
def nvmlDeviceGetMigMode(lib, device, current, pending):
    mode = _about(lib, device, 'mig_mode')
    current_mode, pending_mode = mode if isinstance(mode, list) else (
        mode, mode)
    _obj(current).value = current_mode
    _obj(pending).value = pending_mode


@_c
def nvmlDeviceSetMigMode(lib, device, mode, status):
    lib._call('set_mig_mode', lib._pf(device), _int(mode))
    _obj(status).value = mig.NVML_SUCCESS


def _fill_profile(target, info):
    for field, value in info.items():
        if field == 'name':
            if hasattr(target, 'name'):
                target.name = value.encode()
        else:
            setattr(target, field, value)


@_c
def nvmlDeviceGetGpuInstanceProfileInfo(lib, device, profile, info):
    _fill_profile(_obj(info), lib._call('gi_profile_info', lib._pf(device),
                                        _int(profile)))


@_c
def nvmlDeviceGetGpuInstanceProfileInfoV(lib, device, profile, info):
    # the versioned struct: the same fields and a name
    return nvmlDeviceGetGpuInstanceProfileInfo(lib, device, profile, info)


@_c
def nvmlDeviceGetGpuInstanceProfileInfoByIdV(lib, device, profile_id,
                                             info):
    _fill_profile(_obj(info), lib._call('gi_profile_info_by_id',
                                        lib._pf(device), _int(profile_id)))


@_c
def nvmlDeviceGetGpuInstanceRemainingCapacity(lib, device, profile_id,
                                              count):
    _obj(count).value = lib._call('gi_remaining', lib._pf(device),
                                  _int(profile_id))


def _fill_array(array, count, values, store, sized=True):
    """A listing into the caller's ``array``.  ``sized``: NVML's two-step
    form (``count`` in: the array's length; a NULL array or one too short
    gets ``INSUFFICIENT_SIZE`` and the count needed); else ``count`` is
    only out and the array is as long as the profile allows (a NULL array
    asks for the count)."""
    count = _obj(count)
    if array is None or (sized and count.value < len(values)):
        short = sized and count.value < len(values)
        count.value = len(values)
        return mig.NVML_ERROR_INSUFFICIENT_SIZE if short \
            else mig.NVML_SUCCESS
    for i, value in enumerate(values):
        store(_obj(array), i, value)
    count.value = len(values)
    return mig.NVML_SUCCESS


def _store_placement(array, i, value):
    array[i].start, array[i].size = value


@_c
def nvmlDeviceGetGpuInstancePossiblePlacements_v2(lib, device, profile_id,
                                                  placements, count):
    values = lib._call('gi_possible_placements', lib._pf(device),
                       _int(profile_id))
    return _fill_array(placements, count, values, _store_placement,
                       sized=False)


@_c
def nvmlDeviceCreateGpuInstance(lib, device, profile_id, instance):
    pf = lib._pf(device)
    gi = lib._call('create_gi', pf, _int(profile_id))
    _store_pointer(ctypes.addressof(_obj(instance)),
                   lib._handle('gi', pf, gi))


@_c
def nvmlDeviceCreateGpuInstanceWithPlacement(lib, device, profile_id,
                                             placement, instance):
    pf = lib._pf(device)
    gi = lib._call('create_gi', pf, _int(profile_id), _obj(placement).start)
    _store_pointer(ctypes.addressof(_obj(instance)),
                   lib._handle('gi', pf, gi))


@_c
def nvmlGpuInstanceDestroy(lib, instance):
    _, pf, gi = lib._key(instance, 'gi')
    lib._call('destroy_gi', pf, gi)


def _store_handle(array, i, value):
    _store_pointer(ctypes.addressof(array) + i * _POINTER_SIZE, value)


@_c
def nvmlDeviceGetGpuInstances(lib, device, profile_id, instances, count):
    pf = lib._pf(device)
    values = [lib._handle('gi', pf, gi)
              for gi in lib._call('gis', pf, _int(profile_id))]
    return _fill_array(instances, count, values, _store_handle,
                       sized=False)


@_c
def nvmlDeviceGetGpuInstanceById(lib, device, gi, instance):
    pf = lib._pf(device)
    lib._call('gi_info', pf, _int(gi))
    _store_pointer(ctypes.addressof(_obj(instance)),
                   lib._handle('gi', pf, _int(gi)))


@_c
def nvmlGpuInstanceGetInfo(lib, instance, info):
    _, pf, gi = lib._key(instance, 'gi')
    gid, profile_id, start, size, _ = lib._call('gi_info', pf, gi)
    info = _obj(info)
    _store_pointer(ctypes.addressof(info), lib._handle('gpu', pf))
    info.id, info.profileId = gid, profile_id
    info.placement.start, info.placement.size = start, size


@_c
def nvmlGpuInstanceGetComputeInstanceProfileInfoV(lib, instance, profile,
                                                  engine_profile, info):
    _, pf, gi = lib._key(instance, 'gi')
    _fill_profile(_obj(info), lib._call('ci_profile_info', pf, gi,
                                        _int(profile)))


def _fill_scheduler(state, found):
    """A ``nvmlVgpuSchedulerGetState_t`` (v2) from ``(policy, avg_factor,
    timeslice)``."""
    state = _obj(state)
    state.schedulerPolicy, state.avgFactor, state.timeslice = found


def _scheduler_wanted(state):
    """``(policy, avg_factor, frequency)`` of a ``nvmlVgpuSchedulerSetState_t``
    (v2)."""
    state = _obj(state)
    return state.schedulerPolicy, state.avgFactor, state.frequency


@_c
def nvmlGpuInstanceGetVgpuSchedulerState_v2(lib, instance, state):
    _, pf, gi = lib._key(instance, 'gi')
    _fill_scheduler(state, lib._call('gi_scheduler', pf, gi))


@_c
def nvmlGpuInstanceSetVgpuSchedulerState_v2(lib, instance, state):
    _, pf, gi = lib._key(instance, 'gi')
    lib._call('set_gi_scheduler', pf, gi, *_scheduler_wanted(state))


@_c
def nvmlGpuInstanceCreateComputeInstance(lib, instance, profile_id,
                                         compute):
    _, pf, gi = lib._key(instance, 'gi')
    ci = lib._call('create_ci', pf, gi, _int(profile_id))
    _store_pointer(ctypes.addressof(_obj(compute)),
                   lib._handle('ci', pf, gi, ci))


@_c
def nvmlGpuInstanceGetComputeInstances(lib, instance, profile_id, computes,
                                       count):
    _, pf, gi = lib._key(instance, 'gi')
    _, _, _, _, ci = lib._call('gi_info', pf, gi)
    values = [] if ci is None else [lib._handle('ci', pf, gi, ci)]
    return _fill_array(computes, count, values, _store_handle,
                       sized=False)


@_c
def nvmlComputeInstanceDestroy(lib, compute):
    _, pf, gi, ci = lib._key(compute, 'ci')
    lib._call('destroy_ci', pf, gi, ci)


@_c
def nvmlComputeInstanceGetInfo_v2(lib, compute, info):
    _, pf, gi, ci = lib._key(compute, 'ci')
    _, profile_id, _, _, now = lib._call('gi_info', pf, gi)
    if now != ci:
        return mig.NVML_ERROR_INVALID_ARGUMENT
    info = _obj(info)
    _store_pointer(ctypes.addressof(info), lib._handle('gpu', pf))
    _store_pointer(ctypes.addressof(info) + _POINTER_SIZE,
                   lib._handle('gi', pf, gi))
    info.id = ci


@_c
def nvmlDeviceGetVgpuHeterogeneousMode(lib, device, mode):
    _obj(mode).mode = lib._call('heterogeneous', lib._pf(device))


@_c
def nvmlDeviceSetVgpuHeterogeneousMode(lib, device, mode):
    lib._call('set_heterogeneous', lib._pf(device), _obj(mode).mode)


@_c
def nvmlDeviceGetVgpuSchedulerState_v2(lib, device, state):
    _fill_scheduler(state, lib._call('scheduler', lib._pf(device)))


@_c
def nvmlDeviceSetVgpuSchedulerState_v2(lib, device, state):
    lib._call('set_scheduler', lib._pf(device), *_scheduler_wanted(state))


@_c
def nvmlDeviceGetVgpuSchedulerCapabilities(lib, device, caps):
    policies = lib._call('scheduler_caps', lib._pf(device))
    caps = _obj(caps)
    for i, policy in enumerate(policies):
        caps.supportedSchedulers[i] = policy
    caps.minTimeslice = mig.MIN_TIMESLICE_NS
    caps.maxTimeslice = mig.MAX_TIMESLICE_NS
    caps.isArrModeSupported = 1
    caps.minFrequencyForARR = mig.MIN_FREQUENCY
    caps.maxFrequencyForARR = mig.MAX_FREQUENCY
    caps.minAvgFactorForARR = mig.MIN_AVG_FACTOR
    caps.maxAvgFactorForARR = mig.MAX_AVG_FACTOR


def _store_uint(array, i, value):
    array[i] = value


@_c
def nvmlDeviceGetSupportedVgpus(lib, device, count, ids):
    values = lib._call('supported_types', lib._pf(device))
    return _fill_array(ids, count, values, _store_uint)


@_c
def nvmlDeviceGetCreatableVgpus(lib, device, count, ids):
    values = lib._call('creatable_types', lib._pf(device))
    return _fill_array(ids, count, values, _store_uint)


@_c
def nvmlVgpuTypeGetName(lib, number, name, size):
    text = lib._call('type_info', _int(number))['name'].encode()
    if len(text) >= _int(size):
        _obj(size).value = len(text) + 1
        return mig.NVML_ERROR_INSUFFICIENT_SIZE
    name.value = text
    _obj(size).value = len(text) + 1


@_c
def nvmlVgpuTypeGetFramebufferSize(lib, number, size):
    _obj(size).value = lib._call('type_info', _int(number))[
        'framebuffer_mb'] << 20


@_c
def nvmlVgpuTypeGetMaxInstances(lib, device, number, count):
    _obj(count).value = lib._call('max_instances', lib._pf(device),
                                  _int(number))


@_c
def nvmlVgpuTypeGetGpuInstanceProfileId(lib, number, profile_id):
    _obj(profile_id).value = lib._call('type_info', _int(number))[
        'gi_profile_id']


@_c
def nvmlVgpuTypeGetMaxInstancesPerGpuInstance(lib, info):
    info = _obj(info)
    found = lib._call('type_info', info.vgpuTypeId)
    if not found['max_per_gi']:
        return mig.NVML_ERROR_NOT_SUPPORTED
    info.maxInstancePerGI = found['max_per_gi']


def _fill_placements(target, size, ids):
    target = _obj(target)
    capacity = target.count
    if len(ids) > capacity:
        target.count = len(ids)
        return mig.NVML_ERROR_INSUFFICIENT_SIZE
    target.placementSize = size
    for i, placement in enumerate(ids):
        target.placementIds[i] = placement
    target.count = len(ids)
    return mig.NVML_SUCCESS


@_c
def nvmlDeviceGetVgpuTypeSupportedPlacements(lib, device, number, target):
    # v1 has no mode (the GPU's current one); v2 asks for one
    pf = lib._pf(device)
    obj = _obj(target)
    if hasattr(obj, 'mode'):
        mode = obj.mode
    else:
        mode = lib._call('heterogeneous_or_homogeneous', pf)
    size, ids = lib._call('supported_placements', pf, _int(number), mode)
    if not hasattr(obj, 'mode'):
        obj.count = lib._call('max_instances', pf, _int(number))
    return _fill_placements(target, size, ids)


@_c
def nvmlDeviceGetVgpuTypeCreatablePlacements(lib, device, number, target):
    pf = lib._pf(device)
    obj = _obj(target)
    if not hasattr(obj, 'mode'):
        obj.count = lib._call('max_instances', pf, _int(number))
    size, ids = lib._call('creatable_placements', pf, _int(number))
    return _fill_placements(target, size, ids)


def _fill_gi_vgpus(lib, instance, info, op, field):
    """A GPU instance's list (``op``) into ``info``'s array ``field`` and
    ``vgpuCount`` (in: the array's length): a NULL array or one too short
    gets ``INSUFFICIENT_SIZE`` (none needed: success) and the count."""
    _, pf, gi = lib._key(instance, 'gi')
    values = lib._call(op, pf, gi)
    info = _obj(info)
    array = getattr(info, field)
    if not array or info.vgpuCount < len(values):
        info.vgpuCount = len(values)
        return (mig.NVML_ERROR_INSUFFICIENT_SIZE if values
                else mig.NVML_SUCCESS)
    for i, value in enumerate(values):
        array[i] = value
    info.vgpuCount = len(values)


@_c
def nvmlGpuInstanceGetCreatableVgpus(lib, instance, info):
    return _fill_gi_vgpus(lib, instance, info, 'gi_creatable_types',
                          'vgpuTypeIds')


@_c
def nvmlGpuInstanceGetActiveVgpus(lib, instance, info):
    return _fill_gi_vgpus(lib, instance, info, 'gi_active_vgpus',
                          'vgpuInstances')


@_c
def nvmlDeviceGetActiveVgpus(lib, device, count, instances):
    values = lib._call('active_vgpus', lib._pf(device))
    return _fill_array(instances, count, values, _store_uint)


@_c
def nvmlVgpuInstanceGetType(lib, instance, number):
    _obj(number).value = lib._call('vgpu_instance', _int(instance))['type']


def _instance(lib, instance, field):
    value = lib._call('vgpu_instance', _int(instance))[field]
    if value is None:
        raise mig.DriverError(mig.NVML_ERROR_NOT_SUPPORTED,
                              '%s: not supported' % field)
    return value


@_c
def nvmlVgpuInstanceGetMdevUUID(lib, instance, uuid, length):
    text = _instance(lib, instance, 'mdev_uuid').encode()
    if len(text) >= _int(length):
        return mig.NVML_ERROR_INSUFFICIENT_SIZE
    _obj(uuid).value = text


@_c
def nvmlVgpuInstanceGetFbUsage(lib, instance, usage):
    _obj(usage).value = _instance(lib, instance, 'fb_usage_mib') << 20


@_c
def nvmlVgpuInstanceGetGpuPciId(lib, instance, bus_id, length):
    text = _instance(lib, instance, 'bus_id').encode()
    if len(text) >= _int(length):
        _obj(length).value = len(text) + 1
        return mig.NVML_ERROR_INSUFFICIENT_SIZE
    bus_id.value = text


@_c
def nvmlVgpuInstanceGetGpuInstanceId(lib, instance, gi):
    _obj(gi).value = _instance(lib, instance, 'gi')


@_c
def nvmlVgpuInstanceGetPlacementId(lib, instance, placement):
    _obj(placement).placementId = _instance(lib, instance, 'placement')


# --- vGPU migration: NVIDIA's metadata and its compatibility rules -----------
#
# What NVML documents (NVML API reference, "vGPU Migration",
# https://docs.nvidia.com/deploy/nvml-api/api/group__nvmlVgpuMigration.html):
# ``nvmlVgpuInstanceGetMetadata`` fills an ``nvmlVgpuMetadata_t`` of a vGPU
# instance (version, revision, guest info state, guest and host driver
# versions, opaque data and its size), ``nvmlDeviceGetVgpuMetadata`` an
# ``nvmlVgpuPgpuMetadata_t`` of a physical GPU (host driver version, the vGPU
# versions it supports, opaque data), ``nvmlDeviceGetPgpuMetadataString`` the
# physical GPU's properties as an ASCII string; ``nvmlGetVgpuCompatibility``
# takes the two structures and answers an ``nvmlVgpuPgpuCompatibility_t``:
# ``vgpuVmCompatibility`` (NONE 0x0, COLD 0x1, HIBERNATE 0x2, SLEEP 0x4, LIVE
# 0x8) and ``compatibilityLimitCode`` (NONE 0x0, HOST_DRIVER 0x1,
# GUEST_DRIVER 0x2, GPU 0x4, OTHER 0x80000000).  The two metadata calls
# answer INSUFFICIENT_SIZE with the size needed in ``*bufferSize`` when it
# is too small (the binding's wrappers call twice for that reason).
#
# NVIDIA's rules the simulated driver applies (documented):
# * no live migration between the 80 GB PCIe and 94 GB NVL boards of a GPU,
#   nor between H200, H800 and H100 boards (NVIDIA AI Enterprise, "Live
#   Migration", https://docs.nvidia.com/ai-enterprise/release-8/latest/
#   infra-software/vgpu/features/live-migration.html): modelled as "the
#   PCI device ids differ" -> NONE, limited by GPU;
# * vGPU live migration fails when the vGPU driver version differs on the
#   source and destination hosts (Red Hat, "Live migrating a virtual machine
#   with an attached NVIDIA vGPU", https://docs.redhat.com/en/documentation/
#   red_hat_enterprise_linux/10/html/configuring_and_managing_windows_
#   virtual_machines/live-migrating-a-virtual-machine-with-an-attached-
#   nvidia-vgpu).
# Assumed (not documented as such): the driver refuses only between
# different branches (the first number: 550 vs 580; within one branch any
# two versions are compatible), limited by HOST_DRIVER; a vGPU type the
# destination GPU does not support -> NONE, limited by GPU; a compatible
# pair answers every kind (COLD|HIBERNATE|SLEEP|LIVE, as a bit mask); the
# guest driver is not modelled (no guest runs one: guest info state
# UNINITIALIZED, GUEST_DRIVER never the limit).  The opaque data are this
# simulator's own (NVIDIA's are undocumented): compact JSON, no NUL byte,
# naming the host driver, the board (PCI device id, NVML name) and, for a
# vGPU, its type number; for a GPU, its bus id.

VGPU_VM_LIVE_OR_LESS = (0x1 | 0x2 | 0x4 | 0x8)
COMPATIBILITY_LIMIT_HOST_DRIVER = 0x1
COMPATIBILITY_LIMIT_GPU = 0x4
_METADATA_VERSION = 1
_OPAQUE_TAG = 'libvirt-gpu-sim'


def _board(kernel, pf):
    gpu, _ = _gpu(kernel, pf)
    dev = kernel.profile.device(pf)
    return {'device': '0x%s%s' % (dev.product_id, dev.vendor_id),
            'board': gpu.name}


def op_vgpu_metadata(kernel, instance):
    """``{'host_driver', 'opaque'}`` of a vGPU instance."""
    found = op_vgpu_instance(kernel, instance)
    pf = kernel.profile.device(found['vf']).physfn
    opaque = dict(_board(kernel, pf), tag=_OPAQUE_TAG,
                  driver=kernel.profile.driver_version, type=found['type'])
    return {'host_driver': kernel.profile.driver_version,
            'opaque': json.dumps(opaque, separators=(',', ':'),
                                 sort_keys=True)}


def op_pgpu_metadata(kernel, pf):
    """``{'host_driver', 'opaque'}`` of the physical GPU ``pf``."""
    opaque = dict(_board(kernel, pf), tag=_OPAQUE_TAG,
                  driver=kernel.profile.driver_version, gpu=pf)
    return {'host_driver': kernel.profile.driver_version,
            'opaque': json.dumps(opaque, separators=(',', ':'),
                                 sort_keys=True)}


def _opaque(text, keys, what):
    try:
        found = json.loads(text)
    except ValueError:
        found = None
    if not isinstance(found, dict) or found.get('tag') != _OPAQUE_TAG or \
            any(not isinstance(found.get(k), t) for k, t in keys):
        raise mig.DriverError(mig.NVML_ERROR_INVALID_ARGUMENT,
                              'not the %s metadata of this driver' % what)
    return found


def _branch(version):
    return version.split('.', 1)[0]


def op_vgpu_compatibility(kernel, vgpu_opaque, pgpu_opaque):
    """``[vgpuVmCompatibility, compatibilityLimitCode]`` of a vGPU's
    opaque metadata against a GPU of this host's (the rules above)."""
    vgpu = _opaque(vgpu_opaque, (('driver', str), ('device', str),
                                 ('type', int)), 'vGPU')
    pgpu = _opaque(pgpu_opaque, (('driver', str), ('device', str),
                                 ('gpu', str)), 'GPU')
    if pgpu['gpu'] not in kernel.driver_gpus():
        raise mig.DriverError(mig.NVML_ERROR_INVALID_ARGUMENT,
                              'no GPU %s on this host' % pgpu['gpu'])
    here = op_pgpu_metadata(kernel, pgpu['gpu'])['opaque']
    if json.loads(here) != pgpu:
        raise mig.DriverError(mig.NVML_ERROR_INVALID_ARGUMENT,
                              'GPU metadata not of this host now')
    if _branch(vgpu['driver']) != _branch(pgpu['driver']):
        return [0, COMPATIBILITY_LIMIT_HOST_DRIVER]
    if vgpu['device'] != pgpu['device'] or \
            vgpu['type'] not in op_supported_types(kernel, pgpu['gpu']):
        return [0, COMPATIBILITY_LIMIT_GPU]
    return [VGPU_VM_LIVE_OR_LESS, 0]


for _name in ('vgpu_metadata', 'pgpu_metadata', 'vgpu_compatibility'):
    OPS[_name] = globals()['op_' + _name]


def _fill_metadata(target, size, answer, caps_field):
    """Fill an ``nvmlVgpuMetadata_t`` / ``nvmlVgpuPgpuMetadata_t``
    ``target`` from ``answer``; INSUFFICIENT_SIZE (the size needed in
    ``size``) when ``*size`` is smaller than the structure."""
    target, size = _obj(target), _obj(size)
    opaque = answer['opaque'].encode()
    needed = type(target).opaqueData.offset + len(opaque)
    if size.value < needed:
        size.value = needed
        return mig.NVML_ERROR_INSUFFICIENT_SIZE
    target.version = _METADATA_VERSION
    target.revision = _METADATA_VERSION
    target.hostDriverVersion = answer['host_driver'].encode()
    setattr(target, caps_field, 0)
    target.opaqueDataSize = len(opaque)
    target.opaqueData = opaque
    size.value = needed


@_c
def nvmlVgpuInstanceGetMetadata(lib, instance, metadata, size):
    answer = lib._call('vgpu_metadata', _int(instance))
    result = _fill_metadata(metadata, size, answer, 'vgpuVirtualizationCaps')
    if result is None:
        found = _obj(metadata)
        found.guestInfoState = 0      # UNINITIALIZED: no guest driver
        found.guestDriverVersion = b''
        found.guestVgpuVersion = 0
    return result


@_c
def nvmlDeviceGetVgpuMetadata(lib, device, metadata, size):
    answer = lib._call('pgpu_metadata', lib._pf(device))
    return _fill_metadata(metadata, size, answer, 'pgpuVirtualizationCaps')


@_c
def nvmlDeviceGetPgpuMetadataString(lib, device, text, size):
    opaque = lib._call('pgpu_metadata', lib._pf(device))['opaque'].encode()
    size = _obj(size)
    if size.value <= len(opaque):
        size.value = len(opaque) + 1
        return mig.NVML_ERROR_INSUFFICIENT_SIZE
    _obj(text).value = opaque
    size.value = len(opaque) + 1


def _opaque_of(structure):
    structure = _obj(structure)
    offset = type(structure).opaqueData.offset
    length = min(structure.opaqueDataSize,
                 ctypes.sizeof(structure) - offset)
    return ctypes.string_at(ctypes.addressof(structure) + offset,
                            length).decode('utf-8', 'replace')


@_c
def nvmlGetVgpuCompatibility(lib, vgpu, pgpu, info):
    vm, limit = lib._call('vgpu_compatibility', _opaque_of(vgpu),
                          _opaque_of(pgpu))
    info = _obj(info)
    info.vgpuVmCompatibility = vm
    info.compatibilityLimitCode = limit


def op_heterogeneous_or_homogeneous(kernel, pf):
    _, state = _gpu(kernel, pf)
    return (mig.NVML_VGPU_PGPU_HETEROGENEOUS_MODE if state.heterogeneous
            else mig.NVML_VGPU_PGPU_HOMOGENEOUS_MODE)


OPS['heterogeneous_or_homogeneous'] = op_heterogeneous_or_homogeneous
EXPORTED = tuple(sorted(_FUNCTIONS))
