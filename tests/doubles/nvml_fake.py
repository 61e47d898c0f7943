"""A stand-in for NVIDIA's ``pynvml`` module (nvidia-ml-py) that answers
from a description of GPUs, the way NVML does:

- ``nvmlInit`` fails with ``NVML_ERROR_LIBRARY_NOT_FOUND`` when the spec
  says the library is missing, ``NVML_ERROR_DRIVER_NOT_LOADED`` when no
  driver is loaded;
- a query whose answer is the string ``"NVMLError: Not Supported"`` (as
  recorded in tests/data/h100-passthrough/nvml.json) raises
  ``NVMLError(NVML_ERROR_NOT_SUPPORTED)``;
- sizes are in bytes (``nvmlDeviceGetMemoryInfo().total``,
  ``nvmlVgpuTypeGetFramebufferSize``), strings as ``bytes`` (the binding
  returns ``create_string_buffer(...).value``).

Error codes and mode numbers are the binding's own constants.
"""

import json
import types

import pynvml

NOT_SUPPORTED = 'NVMLError: Not Supported'
MIB = 1024 * 1024


class NVMLError(Exception):
    def __init__(self, value):
        super().__init__(value)
        self.value = value

    def __str__(self):
        return {pynvml.NVML_ERROR_NOT_SUPPORTED: 'Not Supported',
                pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: 'NVML Shared Library '
                'Not Found',
                pynvml.NVML_ERROR_DRIVER_NOT_LOADED: 'Driver Not Loaded',
                pynvml.NVML_ERROR_UNINITIALIZED: 'Uninitialized'}.get(
                    self.value, 'Unknown Error %s' % self.value)


def h100_spec(path):
    """The GPUs of an nvml.json capture as this fake's spec."""
    with open(path) as f:
        capture = json.load(f)
    return {'gpus': capture['gpus']}


def module(spec):
    """A ``pynvml``-like module answering from ``spec``:
    ``{'init_error': code or None, 'gpus': [gpu, ...]}``, each gpu with
    the keys of nvml.json (``name``, ``bus_id``, ``memory_total_mib``,
    ``virtualization_mode``, ``mig_mode``, ``supported_vgpus``,
    ``creatable_vgpus``) and, for vGPU hosts, ``vgpu_types``:
    ``{id: {'name', 'framebuffer_mib', 'max_instances'}}``; for usage,
    ``utilization_gpu`` (percent), ``memory_used_mib`` and
    ``vgpu_instances``: ``[{'id', 'mdev_uuid', 'pci_id', 'fb_usage_mib',
    'sm_util'}]`` (a missing key answers Not Supported, as NVML does for
    what a GPU or driver cannot tell)."""
    state = {'initialised': 0, 'calls': []}
    gpus = spec.get('gpus', [])
    fake = types.SimpleNamespace(state=state, NVMLError=NVMLError)
    for name in dir(pynvml):
        if name.startswith(('NVML_ERROR_', 'NVML_GPU_VIRTUALIZATION_MODE',
                            'NVML_SUCCESS')):
            setattr(fake, name, getattr(pynvml, name))

    def answer(value):
        if value == NOT_SUPPORTED:
            raise NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return value

    def live(function):
        def call(*args):
            state['calls'].append(function.__name__)
            if not state['initialised']:
                raise NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
            return function(*args)
        call.__name__ = function.__name__
        return call

    def nvmlInit():
        state['calls'].append('nvmlInit')
        if spec.get('init_error') is not None:
            raise NVMLError(spec['init_error'])
        state['initialised'] += 1

    def nvmlShutdown():
        state['calls'].append('nvmlShutdown')
        state['initialised'] -= 1

    def nvmlDeviceGetCount():
        return len(gpus)

    def nvmlDeviceGetHandleByIndex(index):
        return gpus[index]

    def nvmlDeviceGetPciInfo(gpu):
        return types.SimpleNamespace(busId=gpu['bus_id'].encode())

    def nvmlDeviceGetName(gpu):
        return answer(gpu['name']).encode()

    def nvmlDeviceGetMemoryInfo(gpu):
        total = answer(gpu['memory_total_mib'])
        used = gpu.get('memory_used_mib', 0)
        return types.SimpleNamespace(total=total * MIB,
                                     free=(total - used) * MIB,
                                     used=used * MIB)

    def nvmlDeviceGetUtilizationRates(gpu):
        percent = answer(gpu.get('utilization_gpu', NOT_SUPPORTED))
        return types.SimpleNamespace(gpu=percent, memory=0)

    def _instances(gpu):
        return answer(gpu.get('vgpu_instances', NOT_SUPPORTED))

    def _instance(number):
        for gpu in gpus:
            for found in gpu.get('vgpu_instances', ()):
                if found['id'] == number:
                    return found
        raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetActiveVgpus(gpu):
        return [i['id'] for i in _instances(gpu)]

    def nvmlDeviceGetVgpuUtilization(gpu, last_seen):
        return [types.SimpleNamespace(
            vgpuInstance=i['id'], timeStamp=1,
            smUtil=types.SimpleNamespace(uiVal=i['sm_util']))
            for i in _instances(gpu) if 'sm_util' in i]

    def nvmlVgpuInstanceGetMdevUUID(number):
        return answer(_instance(number).get('mdev_uuid',
                                            NOT_SUPPORTED)).encode()

    def nvmlVgpuInstanceGetGpuPciId(number):
        return answer(_instance(number).get('pci_id', NOT_SUPPORTED))

    def nvmlVgpuInstanceGetFbUsage(number):
        return answer(_instance(number).get('fb_usage_mib',
                                            NOT_SUPPORTED)) * MIB

    def nvmlDeviceGetVirtualizationMode(gpu):
        return answer(gpu['virtualization_mode'])

    def nvmlDeviceGetMigMode(gpu):
        return answer(gpu['mig_mode'])

    def nvmlDeviceGetSupportedVgpus(gpu):
        return answer(gpu['supported_vgpus'])

    def nvmlDeviceGetCreatableVgpus(gpu):
        return answer(gpu['creatable_vgpus'])

    def _type(type_id):
        for gpu in gpus:
            found = gpu.get('vgpu_types', {}).get(type_id)
            if found is not None:
                return found
        raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlVgpuTypeGetName(type_id):
        return _type(type_id)['name'].encode()

    def nvmlVgpuTypeGetFramebufferSize(type_id):
        return _type(type_id)['framebuffer_mib'] * MIB

    def nvmlVgpuTypeGetMaxInstances(gpu, type_id):
        return _type(type_id)['max_instances']

    fake.nvmlInit = nvmlInit
    fake.nvmlShutdown = nvmlShutdown
    for function in (nvmlDeviceGetCount, nvmlDeviceGetHandleByIndex,
                     nvmlDeviceGetPciInfo, nvmlDeviceGetName,
                     nvmlDeviceGetMemoryInfo,
                     nvmlDeviceGetVirtualizationMode, nvmlDeviceGetMigMode,
                     nvmlDeviceGetSupportedVgpus, nvmlDeviceGetCreatableVgpus,
                     nvmlVgpuTypeGetName, nvmlVgpuTypeGetFramebufferSize,
                     nvmlVgpuTypeGetMaxInstances,
                     nvmlDeviceGetUtilizationRates, nvmlDeviceGetActiveVgpus,
                     nvmlDeviceGetVgpuUtilization,
                     nvmlVgpuInstanceGetMdevUUID,
                     nvmlVgpuInstanceGetGpuPciId,
                     nvmlVgpuInstanceGetFbUsage):
        setattr(fake, function.__name__, live(function))
    return fake
