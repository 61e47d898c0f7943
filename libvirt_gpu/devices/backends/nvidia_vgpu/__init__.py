"""NVIDIA vGPU 17+ on kernels >= 6.8: the vendor interface, no mdev.

The GPU (an SR-IOV PF bound to ``nvidia``) has its VFs enabled (NVIDIA's
``sriov-manage -e``); each VF holds at most one vGPU and shows (``Sysfs``
is the only way in)::

    bus/pci/devices/0000:3d:00.4/nvidia/creatable_vgpu_types
        ID    : vGPU Name
        1145  : NVIDIA L40S-1B
        ...                           (shrinks as the GPU fills; empty: full)
    bus/pci/devices/0000:3d:00.4/nvidia/current_vgpu_type
        0                             write 1145: the vGPU exists on the VF
                                      write 0:    it is destroyed
    bus/pci/devices/0000:3d:00.4/nvidia/vgpu_params
        frame_rate_limiter=0          plugin parameters (write only)

The guest gets the VF itself, unmanaged (libvirt must not rebind it)::

    <hostdev mode='subsystem' type='pci' managed='no'>
      <source><address domain='0x0000' bus='0x3d' slot='0x00'
                       function='0x4'/></source>
    </hostdev>

Types are named ``nvidia-<n>`` here as everywhere else in libvirt-gpu (the
mdev interface of the same driver family names type 1145 ``nvidia-1145``),
so the configuration, the traits and the leases are those of an mdev.

A vGPU of this interface has no UUID of its own: ours (the one in the
domain's ``<gpu:vgpu uuid=...>``) is kept with the VF it lives on in a
state file next to the leases, ``<state_dir>/nvidia-vgpu.json``::

    {"version": 1, "vgpus": {"<uuid>": {
        "vf": "0000:3d:00.4", "gpu": "0000:3d:00.0", "type_id": "nvidia-1145",
        "start": null | "auto" | "manual", "params": null | "...",
        "gi_id": 3, "placement": 8}}}

``gi_id`` and ``placement`` (present once known) are where the driver put
the vGPU, read back after it was made (late binding: the type is written
to a free VF, and on a MIG-backed or mixed-size GPU the driver picks the
GPU instance or placement; ``names`` has their files).

``start`` is null for a vGPU that exists only while its guest runs, and
``auto``/``manual`` for a persistent one (the mdevctl meaning: ``restore``
re-creates ``auto`` ones after a reboot).

The package: ``names`` (the interface's file names, data only), ``files``
(reading and parsing them through a ``Sysfs``), ``table`` (what NVIDIA
publishes about its GPUs), ``statefile`` (our record of the vGPUs) and
``kind`` (``NvidiaVgpuBackend``, the vGPU kind).

A ``VgpuDevice`` of this backend has the VF as its ``parent``: the VF is
what the guest's ``<hostdev>`` names, so it is chosen when the XML is
written (``choose_vf``), not at guest start.

Transient answers (EBUSY/EAGAIN: the driver is still tearing a vGPU down
after its guest exited) are retried with tenacity for a bounded while;
tenacity is imported only then (the qemu hook pays for nothing it does not
use).
"""

from __future__ import annotations

from libvirt_gpu.devices.backends.nvidia_vgpu.kind import NvidiaVgpuBackend  # noqa
from libvirt_gpu.devices.backends.nvidia_vgpu.kind import (  # noqa: F401
    vf_hostdev)
from libvirt_gpu.devices.backends.nvidia_vgpu.statefile import (  # noqa: F401
    STARTS)
from libvirt_gpu.devices.backends.nvidia_vgpu.statefile import STATE_NAME  # noqa
from libvirt_gpu.devices.backends.nvidia_vgpu.statefile import VendorState  # noqa
from libvirt_gpu.devices.backends.nvidia_vgpu.statefile import VendorVgpu  # noqa

_TABLE = ('complete_types', 'GpuModel', 'KNOWN_GPUS', 'model_of',
          'published_max', 'type_framebuffer_gb')


def __getattr__(name: str) -> object:
    """NVIDIA's table (``table``), imported when first asked for: the
    hook never needs it."""
    if name in _TABLE:
        from libvirt_gpu.devices.backends.nvidia_vgpu import table
        return getattr(table, name)
    raise AttributeError('module %r has no attribute %r' % (__name__, name))
