"""Fresh simulated sysfs trees and the profile files that describe them.

``simulated_tree('t4')`` is a tree under /dev/shm (where there is one:
on ext4 every mkdir, symlink and truncate costs about a millisecond) and
the path of its profile as a JSON file, which worker processes load with
``simulator.load_profile(path)``.
"""

import contextlib
import json
import os
import shutil
import tempfile

from libvirt_gpu import simulator
from libvirt_gpu.devices.backends.nvidia_vgpu import names as vendor_names
from libvirt_gpu.simulator import loading
from libvirt_gpu.simulator import nvml as sim_nvml

FAST_TMP = '/dev/shm'


def profile_file(name, path, without_mdevs=False):
    """Write bundled profile ``name`` as a JSON file at ``path`` (optionally
    without its pre-existing mdevs) and return ``path``."""
    with open(os.path.join(loading.profile_dir(), name + '.json')) as f:
        data = json.load(f)
    if without_mdevs:
        for device in data['devices']:
            device.pop('mdevs', None)
    with open(path, 'w') as f:
        json.dump(data, f)
    return os.fspath(path)


@contextlib.contextmanager
def simulated_tree(profile='t4', without_mdevs=False, base=None):
    """A fresh simulated sysfs tree: ``(root, profile path)``, removed
    afterwards."""
    if base is None and os.access(FAST_TMP, os.W_OK):
        base = FAST_TMP
    top = tempfile.mkdtemp(prefix='libvirt-gpu-sim-', dir=base)
    try:
        profile_path = profile_file(profile, os.path.join(top, 'profile.json'),
                                    without_mdevs=without_mdevs)
        root = os.path.join(top, 'sys')
        simulator.write_sysfs(simulator.load_profile(profile_path), root)
        yield root, profile_path
    finally:
        shutil.rmtree(top, ignore_errors=True)


# --- a small SR-IOV host -----------------------------------------------------

A100_VFS = ('0000:3d:00.4', '0000:3d:00.5')
L40S_VFS = ('0000:5e:00.4', '0000:5e:00.5', '0000:5e:00.6')


def sriov_profile_file(directory):
    """Write (in ``directory``) and return the path of a profile with an
    A100 whose two VFs are mdev parents sharing the GPU, and an L40S whose
    three VFs have NVIDIA's vGPU 17+ vendor interface."""
    desc = ('num_heads=1, frl_config=60, framebuffer=%dM, '
            'max_resolution=4096x2160, max_instance=%d')
    gpu = {'vendor_id': '10de', 'class_code': '0x030200',
           'driver': 'nvidia', 'numa_node': 0}
    devices = [
        dict(gpu, address='0000:3d:00.0', product_id='20f1', iommu_group=30,
             parent_bridge='0000:3c:00.0', sriov_totalvfs=16,
             virtfns=list(A100_VFS)),
        dict(gpu, address='0000:5e:00.0', product_id='26b9', iommu_group=40,
             parent_bridge='0000:5d:00.0', sriov_totalvfs=32,
             virtfns=list(L40S_VFS))]
    devices += [dict(gpu, address=vf, product_id='20f1', iommu_group=31 + i,
                     parent_bridge='0000:3c:00.0', physfn='0000:3d:00.0',
                     mdev_types='a100') for i, vf in enumerate(A100_VFS)]
    devices += [dict(gpu, address=vf, product_id='26b9', iommu_group=41 + i,
                     parent_bridge='0000:5d:00.0', physfn='0000:5e:00.0',
                     vgpu_types='l40s') for i, vf in enumerate(L40S_VFS)]
    data = {
        'name': 'sriov', 'no_capacity_errno': 'EINVAL', 'devices': devices,
        'type_catalogues': {
            'a100': [
                {'id': 'nvidia-692', 'name': 'GRID A100-20C',
                 'description': desc % (20480, 2), 'max_instance': 2},
                {'id': 'nvidia-693', 'name': 'GRID A100-40C',
                 'description': desc % (40960, 1), 'max_instance': 1}],
            'l40s': [
                {'id': 'nvidia-1145', 'name': 'NVIDIA L40S-1B',
                 'max_instance': 32, 'framebuffer_mb': 1024},
                {'id': 'nvidia-1154', 'name': 'NVIDIA L40S-24A',
                 'max_instance': 2, 'framebuffer_mb': 24576},
                {'id': 'nvidia-1155', 'name': 'NVIDIA L40S-24Q',
                 'max_instance': 2, 'framebuffer_mb': 24576}]}}
    path = os.path.join(os.fspath(directory), 'sriov.json')
    with open(path, 'w') as f:
        json.dump(data, f)
    return path


# What only a live tree has: its NVML channel, and a vendor VF's GI and
# placement files, which answer ENXIO without a vGPU (a static tree cannot:
# it has them only while a vGPU has a GI or placement).
LIVE_ONLY = (sim_nvml.CONTROL_NAME, vendor_names.GPU_INSTANCE_ID,
             vendor_names.PLACEMENT_ID)


def snapshot(root, skip=('config',) + LIVE_ONLY):
    """``{relative path: what it is}`` of a whole tree (links not
    followed); write-only files are compared by mode only."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            if name in skip:
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            st = os.lstat(path)
            if os.path.islink(path):
                found[rel] = ('link', os.readlink(path))
            elif os.path.isdir(path):
                found[rel] = ('dir',)
            elif st.st_mode & 0o444:
                with open(path, 'rb') as f:
                    found[rel] = ('file', st.st_mode & 0o777, f.read())
            else:
                found[rel] = ('file', st.st_mode & 0o777)
    return found
