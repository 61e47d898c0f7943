"""What NVIDIA's migration calls of devices/nvml.py say when NVML fails,
that the rest of the unit layer left open (docs/dev/mutation.md): the
one-line reason the hook logs is NVML's own, whole -- a driver that
cannot be loaded, a GPU that does not answer ``nvmlDeviceGetVgpuMetadata``,
a call that fails while every GPU is asked -- and a vGPU whose metadata
cannot be read is logged with the call and the GPU.  On the simulated
H100 (tests/doubles/h100_nvml.py) with its injected failures."""

import logging

import pynvml

from libvirt_gpu import objects
from libvirt_gpu.devices import nvml
from libvirt_gpu.simulator import nvml as sim_nvml
from tests.doubles import nvml_fake
from tests.doubles.h100_nvml import PF
from tests.doubles.h100_nvml import VF
from tests.doubles.h100_nvml import h100
from tests.doubles.h100_nvml import host
from tests.doubles.h100_nvml import product

GPU = objects.PciAddress.parse(PF)


def source_meta():
    vf = objects.PciAddress.parse(VF)
    return nvml.read_vgpu_metadata(product(h100()), [vf])[vf]


def test_a_driver_that_cannot_be_loaded_is_said_in_nvml_s_words():
    meta = source_meta()
    fake = nvml_fake.module({'gpus': [], 'init_error':
                             pynvml.NVML_ERROR_DRIVER_NOT_LOADED})
    why = str(pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    for found in (nvml.compatibility(nvml.Nvml(fake), meta, GPU),
                  nvml.best_compatibility(nvml.Nvml(fake), meta)):
        assert found.verdict == nvml.UNKNOWN
        # the first clause: the layouts' advice is not the hook's
        assert found.reason == 'NVML cannot be used: %s' % why


def test_a_gpu_that_does_not_answer_for_its_metadata_is_said_whole():
    meta = source_meta()
    kernel, lib = host(h100(), vgpu=False)
    sim_nvml.inject('nvmlDeviceGetVgpuMetadata', 1,
                    pynvml.NVML_ERROR_NOT_SUPPORTED, kernel=kernel)
    found = nvml.compatibility(nvml.Nvml(lib), meta, GPU)
    assert (found.verdict, found.reason) == (
        nvml.UNKNOWN, 'NVML here does not answer nvmlDeviceGetVgpuMetadata '
        'for GPU %s (not supported)' % PF)


def test_a_failure_while_every_gpu_is_asked_gives_nvml_s_error():
    meta = source_meta()
    kernel, lib = host(h100(), vgpu=False)
    sim_nvml.inject('nvmlDeviceGetVgpuMetadata', 1,
                    pynvml.NVML_ERROR_UNKNOWN, kernel=kernel)
    found = nvml.best_compatibility(nvml.Nvml(lib), meta)
    assert (found.verdict, found.reason) == (
        nvml.UNKNOWN, 'NVML nvmlDeviceGetVgpuMetadata on GPU %s: %s'
        % (PF, pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)))


def test_a_vgpu_whose_metadata_fails_is_logged_with_the_call_and_gpu(
        caplog):
    kernel, lib = host(h100())
    sim_nvml.inject('nvmlVgpuInstanceGetMetadata', 1,
                    pynvml.NVML_ERROR_UNKNOWN, kernel=kernel)
    vf = objects.PciAddress.parse(VF)
    with caplog.at_level(logging.WARNING, logger=nvml.LOG.name):
        assert nvml.read_vgpu_metadata(nvml.Nvml(lib), [vf]) == {vf: None}
    (said,) = [r.getMessage() for r in caplog.records
               if r.name == nvml.LOG.name]
    assert said == ('NVML: no vGPU metadata of %s: NVML '
                    'nvmlVgpuInstanceGetMetadata on GPU %s: %s'
                    % (VF, PF, pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)))
