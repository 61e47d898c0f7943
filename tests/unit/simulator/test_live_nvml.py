"""The live simulated sysfs's side of NVML (libvirt_gpu/simulator/live.py):
its NVML channel answers from the FUSE server's kernel, the one state of
its sysfs, and its GI / placement files read as the kernel says (ENXIO
without a vGPU).  Driven through ``LiveTree`` without mounting (the
mounted channel: tests/functional/test_sim_nvml_live.py)."""

import errno
import json

import pynvml
import pytest

from libvirt_gpu.devices.backends.nvidia_vgpu import names as vendor_names
from libvirt_gpu.simulator import live
from libvirt_gpu.simulator import nvml as sim_nvml
from tests.doubles import live_channel

H100_PF = '0000:4e:00.0'
H100_VF = '0000:4e:00.4'


@pytest.fixture
def tree(tmp_path):
    found = live.LiveTree('h100-80gb', uevents=False, workdir=str(tmp_path),
                          probe_delay=0)
    yield found
    found.close()


def _vf_path(tree, vf, name):
    return '/%s/%s/%s' % (tree.dirs[vf], vendor_names.VENDOR_DIR, name)


def test_nvml_through_the_channel_changes_the_server_s_kernel(tree):
    lib = sim_nvml.module(backend=live_channel.TreeChannel(tree))
    lib.nvmlInit()
    handle = lib.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_InUse):      # its VFs are enabled
        lib.nvmlDeviceSetMigMode(handle, 1)
    tree.write('/%s/sriov_numvfs' % tree.dirs[H100_PF], b'0')
    lib.nvmlDeviceSetMigMode(handle, 1)
    tree.write('/%s/sriov_numvfs' % tree.dirs[H100_PF], b'4')
    gi = lib.nvmlDeviceCreateGpuInstance(handle, 19)
    assert lib.nvmlGpuInstanceGetInfo(gi).id == 7
    assert tree.state()['driver']['gpus'][H100_PF]['gis'] == [
        [7, 19, 0, 1, None, 1, 0, 0]]
    path = _vf_path(tree, H100_VF, vendor_names.GPU_INSTANCE_ID)
    with pytest.raises(OSError) as raised:
        tree.content(path)
    assert raised.value.errno == errno.ENXIO
    tree.write('/%s/%s/%s' % (tree.dirs[H100_VF], vendor_names.VENDOR_DIR,
                              vendor_names.CURRENT_TYPE), b'1308')
    assert tree.content(path) == b'7\n'
    with pytest.raises(OSError) as raised:
        tree.content(_vf_path(tree, H100_VF, vendor_names.PLACEMENT_ID))
    assert raised.value.errno == errno.ENXIO


def test_a_bad_request_is_answered_not_raised(tree):
    fh = tree.nvml_open()
    tree.nvml_request(fh, b'{"op": "no_such_op", "args": []}')
    assert json.loads(tree.replies[fh])['error'] == \
        pynvml.NVML_ERROR_INVALID_ARGUMENT
    tree.nvml_request(fh, b'\xff')
    assert json.loads(tree.replies[fh])['error'] == \
        pynvml.NVML_ERROR_INVALID_ARGUMENT
    tree.nvml_release(fh)
    assert tree.replies == {}


def test_reboot_keeps_mig_mode_only(tree):
    lib = sim_nvml.module(backend=live_channel.TreeChannel(tree))
    lib.nvmlInit()
    handle = lib.nvmlDeviceGetHandleByIndex(0)
    tree.write('/%s/sriov_numvfs' % tree.dirs[H100_PF], b'0')
    lib.nvmlDeviceSetMigMode(handle, 1)
    tree.write('/%s/sriov_numvfs' % tree.dirs[H100_PF], b'2')
    lib.nvmlDeviceCreateGpuInstance(handle, 0)
    assert tree.command('reboot') == 'ok'
    assert tree.content('/%s/sriov_numvfs' % tree.dirs[H100_PF]) == b'0\n'
    assert lib.nvmlDeviceGetMigMode(handle) == [1, 1]
    assert lib.nvmlDeviceGetGpuInstanceRemainingCapacity(handle, 0) == 1
