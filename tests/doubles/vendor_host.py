"""Fixtures of a simulated L40S host for the vendor interface (NVIDIA vGPU
17+): ``fast_tmp`` (a private directory of its own: a state directory
below one anyone can write is refused, ``statedir.check_dir``), ``host``
(the L40S tree written there, its kernel answering writes in-process as
the driver would, ``kernel_sysfs.KernelSysfs``) and ``backend``
(``nvidia_vgpu.NvidiaVgpuBackend`` over it, its state directory
``<fast_tmp>/state``).  A test module takes them by name::

    fast_tmp = vendor_host.fast_tmp
    host = vendor_host.host
    backend = vendor_host.backend
"""

import os
import shutil
import tempfile

import pytest

from libvirt_gpu.devices.backends import nvidia_vgpu
from libvirt_gpu import simulator
from tests.doubles import kernel_sysfs


@pytest.fixture
def fast_tmp():
    path = tempfile.mkdtemp(prefix='lgpu-nv-')
    yield path
    shutil.rmtree(path, ignore_errors=True)


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
