"""The vendor interface's simulated L40S host (NVIDIA vGPU 17+; the
``host`` fixture of tests/unit/devices/backends/nvidia_vgpu/conftest.py):
its GPUs and VFs, and a vGPU of it as the hook hands it to the kind
(``vgpu``: on the free VF ``VF_FREE`` by default)."""

from libvirt_gpu.devices.backends import base
from libvirt_gpu import objects

# holds two L40S-1B (1145) on 3d:00.4, 3d:00.5
GPU1 = objects.PciAddress.parse('0000:3d:00.0')
GPU2 = objects.PciAddress.parse('0000:bd:00.0')          # empty
VF_BUSY = objects.PciAddress.parse('0000:3d:00.4')
VF_FREE = objects.PciAddress.parse('0000:3d:00.6')
VF2 = objects.PciAddress.parse('0000:bd:00.4')


def new_uuid():
    return objects.Uuid.new()


def vgpu(vf=VF_FREE, type_id=objects.TypeId.parse('nvidia-1145'), uuid=None):
    return base.VgpuDevice(uuid=uuid or new_uuid(),
                           parent=objects.PciAddress.parse(vf),
                           type_id=type_id)
