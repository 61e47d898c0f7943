"""NVML on a mounted live simulated host (FUSE): the simulated binding
bound to the mount point, as ``[gpu]/nvml = simulated`` binds it in any
process (the hook run by libvirtd, the CLI), talks to the FUSE server
whose kernel also answers the sysfs writes: one state."""

import errno
import os
import subprocess
import sys

import pytest

from libvirt_gpu.devices import nvml
from libvirt_gpu.devices.backends.nvidia_vgpu import names as vendor_names
from tests.functional import live_sysfs as ls

PF = '0000:4e:00.0'
VF = '0000:4e:00.4'
REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


@pytest.fixture
def h100_live():
    missing = ls.missing_requirements()
    if missing:
        pytest.skip('live simulated sysfs not available: '
                    + '; '.join(missing))
    with ls.LiveSysfs('h100-80gb', uevents=False) as live:
        yield live


def _vf(live, name):
    return live.path('bus', 'pci', 'devices', VF, vendor_names.VENDOR_DIR,
                     name)


def test_nvml_and_sysfs_share_the_server_s_state(h100_live):
    live = h100_live
    lib = nvml.source('simulated', sysfs_root=live.root)._binding()
    lib.nvmlInit()
    handle = lib.nvmlDeviceGetHandleByIndex(0)
    with open(live.path('bus', 'pci', 'devices', PF, 'sriov_numvfs'),
              'w') as f:
        f.write('0')
    lib.nvmlDeviceSetMigMode(handle, 1)
    with open(live.path('bus', 'pci', 'devices', PF, 'sriov_numvfs'),
              'w') as f:
        f.write('4')
    with pytest.raises(OSError) as raised:
        open(_vf(live, vendor_names.GPU_INSTANCE_ID)).read()
    assert raised.value.errno == errno.ENXIO
    # another process (as the hook is) makes the GI through NVML
    code = ('from libvirt_gpu.simulator import nvml\n'
            'lib = nvml.module(sysfs_root=%r)\n'
            'lib.nvmlInit()\n'
            'h = lib.nvmlDeviceGetHandleByIndex(0)\n'
            'print(lib.nvmlGpuInstanceGetInfo('
            'lib.nvmlDeviceCreateGpuInstance(h, 9)).id)\n' % live.root)
    done = subprocess.run([sys.executable, '-c', code], cwd=REPO,
                          capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=REPO))
    assert done.stdout.strip() == '1', done.stderr
    with open(_vf(live, vendor_names.CURRENT_TYPE), 'w') as f:
        f.write('1312')                      # H100-3-40C
    with open(_vf(live, vendor_names.GPU_INSTANCE_ID)) as f:
        assert f.read() == '1\n'
    (instance,) = lib.nvmlDeviceGetActiveVgpus(handle)
    assert lib.nvmlVgpuInstanceGetGpuInstanceId(instance) == 1
    assert live.state()['driver']['placed'] == {VF: ['nvidia-1312', 1,
                                                     None]}
