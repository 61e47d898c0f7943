"""Fixtures shared by unit and functional tests: the real H100 capture
(see tests/doubles/h100.py)."""

import pytest

from tests.doubles import h100

# Captured sysfs trees hold the kernel's link cycles (a device's
# ``driver`` links to the driver, whose entry links back to the device):
# never walk them looking for tests.
collect_ignore = ['data']


@pytest.fixture(autouse=True)
def settings_snapshot_dir(tmp_path, monkeypatch):
    """The CLI's settings snapshots (``confcache``) of each test in its own
    directory, never in the machine's /var/cache."""
    path = tmp_path / 'snapshot-cache'
    monkeypatch.setenv('LIBVIRT_GPU_CACHE_DIR', str(path))
    return path


@pytest.fixture
def h100_sysfs(tmp_path):
    """The H100 capture as captured: no IOMMU group."""
    return h100.copy_capture(tmp_path / 'sys')


@pytest.fixture
def h100_audio_sysfs(tmp_path):
    """The capture with the GPU and an HDMI audio function in one group."""
    return h100.with_audio_group(tmp_path / 'sys')


@pytest.fixture
def h100_nic_sysfs(tmp_path):
    """The capture with the host's NIC in the GPU's IOMMU group."""
    return h100.with_nic_group(tmp_path / 'sys')
