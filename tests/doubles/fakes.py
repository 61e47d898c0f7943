"""Small hand-built records for unit tests that need no simulated host."""

from libvirt_gpu import objects


def t4_type(number, name, heads, frl, framebuffer_mib, resolution):
    """A T4 type as its driver lists it, all its instances free (16 GiB
    of framebuffer: max_instance = 16384 / framebuffer)."""
    most = 16384 // framebuffer_mib
    return objects.VgpuType(
        id='nvidia-%d' % number, name='GRID T4-%s' % name,
        description='num_heads=%d, frl_config=%d, framebuffer=%dM, '
                    'max_resolution=%s, max_instance=%d'
                    % (heads, frl, framebuffer_mib, resolution, most),
        device_api='vfio-pci', available_instances=most)


T4_1B = t4_type(222, '1B', 4, 45, 1024, '5120x2880')
T4_2B = t4_type(223, '2B', 4, 45, 2048, '5120x2880')
T4_4C = t4_type(319, '4C', 1, 60, 4096, '4096x2160')
T4_1A = t4_type(225, '1A', 1, 60, 1024, '1280x1024')


def gpu(address='0000:af:00.0', types=(T4_2B, T4_4C, T4_1A), mdevs=(),
        product_id='1eb8', vendor_id='10de'):
    return objects.Gpu(
        address=objects.PciAddress.parse(address), vendor_id=vendor_id,
        product_id=product_id, class_code='0x030200', driver='nvidia',
        numa_node=1, iommu_group=58, mdev_types=tuple(types),
        mdevs=tuple(mdevs))
