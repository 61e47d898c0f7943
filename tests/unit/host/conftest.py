"""The host-level tests' simulated T4 host, as an mdev backend, and its
lease store (test_allocator and test_allocator_incoming)."""

import pytest

from libvirt_gpu.devices.backends import mdev
from libvirt_gpu.store import state
from tests.doubles import kernel_sysfs
from tests.doubles import trees


@pytest.fixture
def backend():
    with trees.simulated_tree('t4') as tree:
        yield mdev.MdevBackend(kernel_sysfs.KernelSysfs(*tree))


@pytest.fixture
def store(tmp_path):
    return state.LeaseStore(tmp_path / 'state')
