"""The file names of NVIDIA's vGPU 17+ vendor interface, named once.

Data only (no import): the simulator, which builds and serves this
interface, and the tests take the names from here; no module outside
``backends/nvidia_vgpu/`` spells them (tests/unit/test_architecture.py)::

    bus/pci/devices/<VF>/<VENDOR_DIR>/<CREATABLE_TYPES>   (read)
        ID    : vGPU Name
        1145  : NVIDIA L40S-1B
    bus/pci/devices/<VF>/<VENDOR_DIR>/<CURRENT_TYPE>      (read/write)
        0 | 1145
    bus/pci/devices/<VF>/<VENDOR_DIR>/<VGPU_PARAMS>       (write)
        frame_rate_limiter=0, disable_vnc=1
"""

VENDOR_DIR = 'nvidia'
CREATABLE_TYPES = 'creatable_vgpu_types'
CURRENT_TYPE = 'current_vgpu_type'
VGPU_PARAMS = 'vgpu_params'

# What tests/unit/test_architecture.py looks for outside this package.
SYSFS_NAMES = (CREATABLE_TYPES, CURRENT_TYPE, VGPU_PARAMS)
