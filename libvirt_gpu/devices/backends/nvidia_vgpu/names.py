"""The file names of NVIDIA's vGPU 17+ vendor interface, named once.

Data only (no import): the simulator, which builds and serves this
interface, and the tests take the names from here; no module outside
``backends/nvidia_vgpu/`` spells them
(tests/unit/project/test_architecture.py)::

    bus/pci/devices/<VF>/<VENDOR_DIR>/<CREATABLE_TYPES>   (read)
        ID    : vGPU Name
        1145  : NVIDIA L40S-1B
    bus/pci/devices/<VF>/<VENDOR_DIR>/<CURRENT_TYPE>      (read/write)
        0 | 1145
    bus/pci/devices/<VF>/<VENDOR_DIR>/<VGPU_PARAMS>       (write)
        frame_rate_limiter=0, disable_vnc=1
    bus/pci/devices/<VF>/<VENDOR_DIR>/<GPU_INSTANCE_ID>   (read)
        3                     the MIG GPU instance the driver put the vGPU in
    bus/pci/devices/<VF>/<VENDOR_DIR>/<PLACEMENT_ID>      (read)
        8                     where a mixed-size vGPU sits (both: ENXIO
                              while the VF holds no vGPU)
"""

VENDOR_DIR = 'nvidia'
CREATABLE_TYPES = 'creatable_vgpu_types'
CURRENT_TYPE = 'current_vgpu_type'
VGPU_PARAMS = 'vgpu_params'
GPU_INSTANCE_ID = 'gpu_instance_id'
PLACEMENT_ID = 'placement_id'

# What tests/unit/project/test_architecture.py looks for outside this package.
SYSFS_NAMES = (CREATABLE_TYPES, CURRENT_TYPE, VGPU_PARAMS, GPU_INSTANCE_ID,
               PLACEMENT_ID)
