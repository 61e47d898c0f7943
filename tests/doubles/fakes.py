"""Small hand-built records for unit tests that need no simulated host."""

from libvirt_gpu import objects

T4_1B = objects.VgpuType(
    id='nvidia-222', name='GRID T4-1B',
    description='num_heads=4, frl_config=45, framebuffer=1024M, '
                'max_resolution=5120x2880, max_instance=16',
    device_api='vfio-pci', available_instances=16)
T4_2B = objects.VgpuType(
    id='nvidia-223', name='GRID T4-2B',
    description='num_heads=4, frl_config=45, framebuffer=2048M, '
                'max_resolution=5120x2880, max_instance=8',
    device_api='vfio-pci', available_instances=8)
T4_4C = objects.VgpuType(
    id='nvidia-319', name='GRID T4-4C',
    description='num_heads=1, frl_config=60, framebuffer=4096M, '
                'max_resolution=4096x2160, max_instance=4',
    device_api='vfio-pci', available_instances=4)
T4_1A = objects.VgpuType(
    id='nvidia-225', name='GRID T4-1A',
    description='num_heads=1, frl_config=60, framebuffer=1024M, '
                'max_resolution=1280x1024, max_instance=16',
    device_api='vfio-pci', available_instances=16)


def gpu(address='0000:af:00.0', types=(T4_2B, T4_4C, T4_1A), mdevs=(),
        product_id='1eb8', vendor_id='10de'):
    return objects.Gpu(
        address=objects.PciAddress.parse(address), vendor_id=vendor_id,
        product_id=product_id, class_code='0x030200', driver='nvidia',
        numa_node=1, iommu_group=58, mdev_types=tuple(types),
        mdevs=tuple(mdevs))
