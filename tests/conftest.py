"""Fixtures shared by unit and functional tests: the real H100 capture
(see tests/doubles/h100.py)."""

import os

import pytest

from tests.doubles import h100
from tests import private_tmp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Captured sysfs trees hold the kernel's link cycles (a device's
# ``driver`` links to the driver, whose entry links back to the device):
# never walk them looking for tests.
collect_ignore = ['data']


def pytest_configure(config):
    """Every temporary file of the tests (``tmp_path``, ``tempfile``, and
    those of the processes they start) in a private directory: see
    tests/private_tmp.py."""
    private_tmp.use_private_tmp(ROOT)


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


# tests/<layer>/... -> seconds spent in its tests (setup, call and
# teardown, so a session fixture counts where it is first set up); printed
# at the end of the run beside the install and lint phases that
# tests/phases.sh times.
LAYER_SECONDS = {}


def pytest_runtest_logreport(report):
    parts = report.nodeid.split('/')
    layer = parts[1] if len(parts) > 2 and parts[0] == 'tests' else 'other'
    LAYER_SECONDS[layer] = LAYER_SECONDS.get(layer, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    if not LAYER_SECONDS:
        return
    tr = terminalreporter
    tr.section('test layers (seconds)')
    for layer, seconds in sorted(LAYER_SECONDS.items()):
        tr.write_line('%-28s %7.1f' % (layer, seconds))
