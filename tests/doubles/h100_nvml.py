"""The simulated H100 host of NVIDIA's vGPU migration calls: its profile
with the driver version or the board changed (``h100``), its kernel and
pynvml over it (``host``: a time-sliced vGPU on ``VF``), and the
product's ``nvml.Nvml`` over that (``product``)."""

from libvirt_gpu.devices import nvml
from libvirt_gpu.simulator import kernel as kernel_mod
from libvirt_gpu.simulator import loading
from libvirt_gpu.simulator import nvml as sim_nvml
from libvirt_gpu.util import records

PF = '0000:4e:00.0'
VF = '0000:4e:00.4'
TIME_SLICED = 1300           # H100-80C... the first time-sliced H100 type


def h100(**changes):
    """The simulated H100 host's profile, ``driver_version`` or the PF's
    ``product_id`` changed."""
    profile = loading.load_profile('h100-80gb')
    product = changes.pop('product_id', None)
    if product is not None:
        profile = records.replace(profile, devices=tuple(
            records.replace(d, product_id=product)
            if d.address == PF else d for d in profile.devices))
    return records.replace(profile, **changes)


def host(profile, vgpu=True):
    """``(kernel, pynvml over it)``; ``vgpu``: a time-sliced vGPU on VF."""
    kernel = kernel_mod.SimKernel(profile)
    if vgpu:
        kernel.set_vgpu_type(VF, str(TIME_SLICED).encode())
    lib = sim_nvml.module(kernel=kernel)
    return kernel, lib


def product(profile, vgpu=True):
    return nvml.Nvml(host(profile, vgpu)[1])
