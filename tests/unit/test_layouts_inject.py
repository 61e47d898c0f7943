"""Failures injected into the simulated hosts (simulator/kernel.py,
simulator/nvml.py): the nth call of an NVML C function, or the nth write
of ``sriov_numvfs`` or a VF's vGPU type, fails once and changes nothing;
a call counts once however many questions it asks the driver; the fault
is the host's (every process on a static tree, a live tree's channel);
a point that does not exist is refused.
"""

import errno
import os

import pynvml
import pytest

from libvirt_gpu import exception
from libvirt_gpu import simulator
from libvirt_gpu.devices.backends.nvidia_vgpu import names as vendor_names
from libvirt_gpu.simulator import kernel as kernel_mod
from libvirt_gpu.simulator import live
from libvirt_gpu.simulator import nvml as sim_nvml
from tests.doubles import kernel_sysfs


# --- the injection itself ----------------------------------------------------

H100_PF = '0000:4e:00.0'


def _lib(kernel=None, root=None):
    lib = sim_nvml.module(kernel=kernel, sysfs_root=root)
    lib.nvmlInit()
    return lib, lib.nvmlDeviceGetHandleByIndex(0)


def test_the_nth_call_fails_once_and_changes_nothing():
    kernel = kernel_mod.SimKernel('h100-80gb')
    kernel.set_numvfs(H100_PF, '0')
    lib, handle = _lib(kernel=kernel)
    sim_nvml.inject('nvmlDeviceGetMigMode', 2, kernel=kernel)
    sim_nvml.inject('nvmlDeviceSetMigMode', 1,
                    pynvml.NVML_ERROR_GPU_IS_LOST, kernel=kernel)
    assert sim_nvml.faults(kernel=kernel) == {
        'nvmlDeviceGetMigMode': [2, pynvml.NVML_ERROR_UNKNOWN],
        'nvmlDeviceSetMigMode': [1, pynvml.NVML_ERROR_GPU_IS_LOST]}
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        lib.nvmlDeviceSetMigMode(handle, 1)
    assert lib.nvmlDeviceGetMigMode(handle) == [0, 0]    # 1st: answered
    with pytest.raises(pynvml.NVMLError_Unknown):        # 2nd: fails
        lib.nvmlDeviceGetMigMode(handle)
    assert sim_nvml.faults(kernel=kernel) == {}
    lib.nvmlDeviceSetMigMode(handle, 1)                  # once only
    assert lib.nvmlDeviceGetMigMode(handle) == [1, 1]


def test_a_call_counts_once_however_many_questions_it_asks():
    kernel = kernel_mod.SimKernel('h100-80gb')
    lib, handle = _lib(kernel=kernel)
    # nvmlDeviceGetMemoryInfo asks the driver about the device twice
    sim_nvml.inject('nvmlDeviceGetMemoryInfo', 2, kernel=kernel)
    lib.nvmlDeviceGetMemoryInfo(handle)
    assert sim_nvml.faults(kernel=kernel) == {
        'nvmlDeviceGetMemoryInfo': [1, pynvml.NVML_ERROR_UNKNOWN]}
    with pytest.raises(pynvml.NVMLError_Unknown):
        lib.nvmlDeviceGetMemoryInfo(handle)


def test_a_fault_can_be_disarmed():
    kernel = kernel_mod.SimKernel('h100-80gb')
    lib, handle = _lib(kernel=kernel)
    sim_nvml.inject('nvmlDeviceGetMigMode', 1, kernel=kernel)
    sim_nvml.inject('nvmlDeviceGetMigMode', 0, kernel=kernel)
    assert sim_nvml.faults(kernel=kernel) == {}
    assert lib.nvmlDeviceGetMigMode(handle) == [0, 0]


def test_a_sysfs_write_fails_with_its_errno_and_changes_nothing(tmp_path):
    root = str(tmp_path / 'sys')
    simulator.write_sysfs(simulator.load_profile('h100-80gb'), root)
    tree = kernel_sysfs.KernelSysfs(root, 'h100-80gb')
    numvfs = os.path.join(root, 'bus/pci/devices', H100_PF, 'sriov_numvfs')
    sim_nvml.inject('sriov_numvfs', 1, sysfs_root=root)
    sim_nvml.inject(vendor_names.CURRENT_TYPE, 1, errno.EBUSY,
                    sysfs_root=root)
    with pytest.raises(exception.SysfsWriteError):
        tree.write(numvfs, '0')
    assert tree.writes[-1].errno == errno.EIO
    assert tree.kernel.state().numvfs == ((H100_PF, 32),)
    tree.write(numvfs, '0')
    assert tree.kernel.state().numvfs == ((H100_PF, 0),)
    assert sim_nvml.faults(sysfs_root=root) == {
        vendor_names.CURRENT_TYPE: [1, errno.EBUSY]}


def test_a_static_tree_s_fault_strikes_whichever_process_calls(tmp_path):
    """Each ``module(sysfs_root=...)`` reads the host from the tree as
    another process does: the fault and its count are the tree's."""
    root = str(tmp_path / 'sys')
    simulator.write_sysfs(simulator.load_profile('h100-80gb'), root)
    sim_nvml.inject('nvmlDeviceGetMigMode', 2, sysfs_root=root)
    first, handle = _lib(root=root)
    assert first.nvmlDeviceGetMigMode(handle) == [0, 0]
    second, handle = _lib(root=root)
    with pytest.raises(pynvml.NVMLError_Unknown):
        second.nvmlDeviceGetMigMode(handle)
    assert first.nvmlDeviceGetMigMode(
        first.nvmlDeviceGetHandleByIndex(0)) == [0, 0]


class TreeChannel(sim_nvml.LiveBackend):
    """A live tree's NVML channel without the mount (its FUSE
    operations' methods: open, write, read, release)."""

    def __init__(self, tree):
        self.tree = tree

    def exchange(self, request):
        fh = self.tree.nvml_open()
        try:
            self.tree.nvml_request(fh, request)
            return self.tree.replies[fh]
        finally:
            self.tree.nvml_release(fh)


def test_a_live_tree_takes_faults_through_its_channel(tmp_path):
    tree = live.LiveTree('h100-80gb', uevents=False, workdir=str(tmp_path),
                         probe_delay=0)
    try:
        channel = TreeChannel(tree)
        channel.call('inject', 'nvmlDeviceSetMigMode', 1, None)
        channel.call('inject', 'sriov_numvfs', 1, None)
        assert tree.state()['driver']['faults'] == {
            'nvmlDeviceSetMigMode': [1, pynvml.NVML_ERROR_UNKNOWN],
            'sriov_numvfs': [1, errno.EIO]}
        lib = sim_nvml.module(backend=channel)
        lib.nvmlInit()
        with pytest.raises(pynvml.NVMLError_Unknown):
            lib.nvmlDeviceSetMigMode(lib.nvmlDeviceGetHandleByIndex(0), 1)
        with pytest.raises(OSError) as raised:
            tree.write('/%s/sriov_numvfs' % tree.dirs[H100_PF], b'0')
        assert raised.value.errno == errno.EIO
        assert channel.call('faults') == {}
        assert 'faults' not in tree.state()['driver']
    finally:
        tree.close()


@pytest.mark.parametrize('point, nth, error', [
    ('nvmlNoSuchFunction', 1, None),
    ('nvmlShutdown', 1, None),            # asks the driver nothing
    ('sriov_totalvfs', 1, None),          # not a write the kernel answers
    ('nvmlDeviceSetMigMode', -1, None),
    ('nvmlDeviceSetMigMode', 1, 'EIO'),
])
def test_a_fault_that_cannot_strike_is_refused(point, nth, error):
    kernel = kernel_mod.SimKernel('h100-80gb')
    with pytest.raises(exception.SimulatorError):
        sim_nvml.inject(point, nth, error, kernel=kernel)
    assert kernel.faults() == {}
