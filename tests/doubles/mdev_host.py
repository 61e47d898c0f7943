"""Fixtures of a simulated T4 host for the mdev backend: ``tree`` (a fresh
tree, ``trees.simulated_tree('t4')``: ``(root, profile)``), ``sysfs`` (its
kernel answering in-process, ``kernel_sysfs.KernelSysfs``) and ``backend``
(``mdev.MdevBackend`` over it, its mdevctl directory under ``tmp_path``,
every wait half a second).  A test module takes them by name::

    tree = mdev_host.tree
    sysfs = mdev_host.sysfs
    backend = mdev_host.backend
"""

import pytest

from libvirt_gpu.devices.backends import mdev
from tests.doubles import kernel_sysfs
from tests.doubles import trees


@pytest.fixture
def tree():
    with trees.simulated_tree('t4') as (root, profile):
        yield root, profile


@pytest.fixture
def sysfs(tree):
    return kernel_sysfs.KernelSysfs(*tree)


@pytest.fixture
def backend(sysfs, tmp_path):
    return mdev.MdevBackend(sysfs, mdevctl_dir=str(tmp_path / 'mdevctl.d'),
                            appear_timeout=0.5, remove_timeout=0.5,
                            retry_stop=0.5)
