"""The simulated L40S host of the vendor interface's tests (NVIDIA vGPU
17+): ``host`` (the L40S tree written in ``fast_tmp``, its kernel
answering writes in-process as the driver would,
``kernel_sysfs.KernelSysfs``) and ``backend``
(``nvidia_vgpu.NvidiaVgpuBackend`` over it, its state directory
``<fast_tmp>/state``)."""

import os

import pytest

from libvirt_gpu.devices.backends import nvidia_vgpu
from libvirt_gpu import simulator
from tests.doubles import kernel_sysfs


@pytest.fixture
def host(fast_tmp):
    root = os.path.join(fast_tmp, 'sys')
    simulator.write_sysfs(simulator.load_profile('l40s'), root)
    return kernel_sysfs.KernelSysfs(root, 'l40s')


@pytest.fixture
def backend(host, fast_tmp):
    return nvidia_vgpu.NvidiaVgpuBackend(
        host, os.path.join(fast_tmp, 'state'), remove_timeout=1.0,
        retry_stop=1.0)
