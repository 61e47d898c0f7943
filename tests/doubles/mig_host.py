"""The simulated hosts whose GPU layout a test sets (``Host``: the
tree, the kernel double writing it, the simulated NVML over the same tree
and the vendor kind; MIG mode and its GPU instances, mixed-size mode),
the GPUs and types of the H100 and L40S profiles, the ``h100`` and
``l40s`` fixtures (a ``Host`` under ``fast_tmp``), and ``_Env`` (what
``Vgpus.rooms`` is given of an Environment).  A test module takes the
fixtures by name::

    h100 = mig_host.h100
    l40s = mig_host.l40s
"""

import os
import uuid as uuid_mod

import pytest

from libvirt_gpu.devices.backends import base
from libvirt_gpu.devices import nvml
from libvirt_gpu.devices.backends import nvidia_vgpu
from libvirt_gpu.devices.backends import registry
from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu import simulator
from libvirt_gpu.simulator import nvml as sim_nvml
from tests.doubles import kernel_sysfs

H100 = objects.PciAddress.parse('0000:4e:00.0')
L40S = objects.PciAddress.parse('0000:bd:00.0')
H100_1_10C = objects.TypeId.parse('nvidia-1308')   # 1g.10gb, 1 per GI
H100_1_20C = objects.TypeId.parse('nvidia-1310')   # 1g.20gb
H100_40C = objects.TypeId.parse('nvidia-1306')     # time-sliced
L40S_12Q = objects.TypeId.parse('nvidia-1153')     # 4 per GPU
GI_1G_10GB, GI_1G_20GB, GI_3G_40GB = 19, 15, 9
L40S_1B = objects.TypeId.parse('nvidia-1145')      # 1 slot of 32


class Host(object):
    """A simulated host: its tree, the kernel double writing it, the
    simulated NVML over the same tree, and the vendor kind."""

    def __init__(self, root, profile, state_dir):
        self.state_dir = state_dir
        simulator.write_sysfs(simulator.load_profile(profile), root)
        self.sysfs = kernel_sysfs.KernelSysfs(root, profile)
        self.nvml = nvml.Nvml(sim_nvml.module(sysfs_root=root))
        self.backend = nvidia_vgpu.NvidiaVgpuBackend(
            self.sysfs, state_dir, remove_timeout=1.0, retry_stop=0.5,
            nvml=self.nvml)

    def vfs(self, gpu, count):
        path = os.path.join(self.sysfs.pci_dir(gpu), 'sriov_numvfs')
        self.sysfs.write(path, '0')
        if count:
            self.sysfs.write(path, str(count))

    def mig(self, gpu, gis):
        """MIG mode on, the VFs, then the GIs (the driver's order)."""
        self.vfs(gpu, 0)
        with self.nvml.session() as session:
            session.set_mig_mode(gpu, True)
        self.vfs(gpu, 16)
        with self.nvml.session() as session:
            profiles = {p.id: p for p in session.gi_profiles(gpu)}
            for profile in gis:
                session.create_gpu_instance(gpu, profiles[profile])
        self.refresh(gpu)

    def refresh(self, gpu):
        """Rewrite the VFs' creatable lists from the driver's state (a
        static tree; the real driver computes them on each read)."""
        with self.sysfs.kernel._write(str(gpu)):
            pass

    def mixed(self, gpu):
        self.vfs(gpu, 0)
        self.vfs(gpu, 16)
        with self.nvml.session() as session:
            session.set_mixed_size(gpu, True)
        self.refresh(gpu)

    def fill(self, gpu, type_id):
        """Make vGPUs of ``type_id`` on ``gpu`` as the hook does (a free VF
        that lists the type, then prepare) until the kind refuses;
        returns how many it made and the refusal."""
        made = 0
        while True:
            try:
                vf = self.backend.choose_vf(gpu, type_id)
                self.backend.prepare(base.VgpuDevice(
                    uuid=objects.Uuid.parse(str(uuid_mod.uuid4())),
                    parent=vf, type_id=type_id))
            except exception.NoCapacity as e:
                return made, e
            made += 1


@pytest.fixture
def h100(fast_tmp):
    return Host(os.path.join(fast_tmp, 'sys'), 'h100-80gb',
                os.path.join(fast_tmp, 'state'))


@pytest.fixture
def l40s(fast_tmp):
    return Host(os.path.join(fast_tmp, 'sys'), 'l40s',
                os.path.join(fast_tmp, 'state'))


class _Env(object):
    """What ``Vgpus.rooms`` is given of an Environment."""

    def __init__(self, host, enabled):
        self.enabled = enabled
        self.vgpus = registry.Vgpus(host.sysfs, [host.backend])
