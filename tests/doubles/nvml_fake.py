"""NVML as a test describes it: the simulated binding
(``libvirt_gpu.simulator.nvml``: nvidia-ml-py's own ``pynvml`` over a
simulated ``libnvidia-ml``) answering from a description of GPUs instead
of a simulated host, so that there is one NVML stand-in and it offers only
what the installed binding has (tests/unit/simulator/test_nvml.py):

- ``nvmlInit`` fails with the spec's ``init_error`` (e.g.
  ``NVML_ERROR_LIBRARY_NOT_FOUND``, ``NVML_ERROR_DRIVER_NOT_LOADED``);
- a field whose value is the string ``"NVMLError: Not Supported"`` (as
  recorded in tests/data/h100-passthrough/nvml.json), or that is missing,
  makes its query raise ``NVMLError_NotSupported``;
- sizes are in bytes, strings as the binding returns them (``str``).

``module(spec).state``: ``calls``, the binding's functions the caller
called (not those they call in turn), and ``initialised``, the library's
init count now.
"""

import functools
import inspect
import json
import threading

import pynvml

from libvirt_gpu.simulator import mig
from libvirt_gpu.simulator import nvml as sim_nvml

NOT_SUPPORTED = 'NVMLError: Not Supported'
MIB = 1024 * 1024


def h100_spec(path):
    """The GPUs of an nvml.json capture as this fake's spec."""
    with open(path) as f:
        capture = json.load(f)
    return {'gpus': capture['gpus']}


def _known(value):
    return None if value == NOT_SUPPORTED else value


class SpecBackend(object):
    """The driver's answers (``simulator.nvml.OPS``) from ``spec``:
    ``{'init_error': code or None, 'gpus': [gpu, ...]}``, each gpu with
    the keys of nvml.json (``name``, ``bus_id``, ``memory_total_mib``,
    ``virtualization_mode``, ``mig_mode``, ``supported_vgpus``,
    ``creatable_vgpus``) and, for vGPU hosts, ``vgpu_types``: ``{id:
    {'name', 'framebuffer_mib', 'max_instances'}}``; for usage,
    ``utilization_gpu`` (percent), ``memory_used_mib`` and
    ``vgpu_instances``: ``[{'id', 'mdev_uuid', 'pci_id', 'fb_usage_mib',
    'sm_util'}]``."""

    def __init__(self, spec):
        self.described = spec.get('gpus', [])
        self.init_error = spec.get('init_error')

    def call(self, op, *args):
        return getattr(self, op)(*args)

    def _gpu(self, key):
        return self.described[int(key)]

    def _list(self, key, field):
        value = _known(self._gpu(key).get(field, NOT_SUPPORTED))
        if value is None:
            raise mig.DriverError(mig.NVML_ERROR_NOT_SUPPORTED, field)
        return value

    def gpus(self):
        return [str(i) for i in range(len(self.described))]

    def device(self, key):
        gpu = self._gpu(key)
        mode = _known(gpu.get('mig_mode', NOT_SUPPORTED))
        return {'name': _known(gpu['name']), 'bus_id': gpu['bus_id'],
                'memory_mib': _known(gpu['memory_total_mib']),
                'memory_used_mib': gpu.get('memory_used_mib', 0),
                'pci_device_id': 0, 'pci_subsystem_id': 0,
                'virtualization_mode': _known(gpu['virtualization_mode']),
                'mig_mode': list(mode) if mode is not None else None}

    def utilization(self, key):
        return [self._list(key, 'utilization_gpu'), 0]

    def supported_types(self, key):
        return list(self._list(key, 'supported_vgpus'))

    def creatable_types(self, key):
        return list(self._list(key, 'creatable_vgpus'))

    def _type(self, number):
        for gpu in self.described:
            found = gpu.get('vgpu_types', {}).get(number)
            if found is not None:
                return found
        raise mig.DriverError(mig.NVML_ERROR_INVALID_ARGUMENT,
                              'no vGPU type %r' % (number,))

    def type_info(self, number):
        found = self._type(number)
        return {'name': found['name'],
                'framebuffer_mb': found['framebuffer_mib'],
                'gi_profile_id': sim_nvml.INVALID_GPU_INSTANCE_PROFILE_ID,
                'max_per_gi': 0}

    def max_instances(self, key, number):
        return self._type(number)['max_instances']

    def active_vgpus(self, key):
        return [i['id'] for i in self._list(key, 'vgpu_instances')]

    def vgpu_samples(self, key):
        return [[i['id'], i['sm_util']]
                for i in self._list(key, 'vgpu_instances') if 'sm_util' in i]

    def vgpu_instance(self, number):
        for gpu in self.described:
            for found in gpu.get('vgpu_instances', ()):
                if found['id'] == number:
                    return {'type': found.get('type', 0),
                            'vf': None, 'bus_id': found.get('pci_id'),
                            'gi': None, 'placement': None,
                            'mdev_uuid': found.get('mdev_uuid'),
                            'fb_usage_mib': found.get('fb_usage_mib')}
        raise mig.DriverError(mig.NVML_ERROR_INVALID_ARGUMENT,
                              'no vGPU instance %r' % (number,))


def module(spec):
    """The simulated binding answering from ``spec`` (``SpecBackend``),
    recording the calls made to it in ``.state``."""
    lib = sim_nvml.module(backend=SpecBackend(spec))
    state = {'initialised': 0, 'calls': []}
    depth = threading.local()

    def recorded(name, function):
        @functools.wraps(function)
        def call(*args, **kwargs):
            outer = not getattr(depth, 'n', 0)
            if outer:
                state['calls'].append(name)
            depth.n = getattr(depth, 'n', 0) + 1
            try:
                return function(*args, **kwargs)
            finally:
                depth.n -= 1
                state['initialised'] = lib.nvmlLib._initialised
        return call

    for name, value in list(vars(lib).items()):
        if name.startswith('nvml') and inspect.isfunction(value):
            setattr(lib, name, recorded(name, value))
    lib.state = state
    lib.pynvml = pynvml
    return lib
