"""Generated simulated hosts of any size, for benchmarks: the same
profile documents the bundled files are, built in code and loaded by
``loading.profile_from_dict``."""

import math

from libvirt_gpu import exception
from libvirt_gpu.simulator.loading import profile_from_dict
from libvirt_gpu.simulator.profile import VF_PER_VF


_VFS_PER_PF = 32
_PFS_PER_DOMAIN = 120
_SYNTH_UUID_NS = '8c5b4a3e-0f5e-4a8e-9d77-1f2b3c4d5e6f'


def synthetic_profile(parents, types=20):
    """A host with ``parents`` mdev parents, for benchmarks.

    Up to 8 parents: that many T4-style GPUs, each an mdev parent.  More:
    ``max(8, ceil(parents / 32))`` A100-style SR-IOV PFs (no types of their
    own, ``sriov_totalvfs`` 32) whose VFs are the parents, one vGPU each,
    as with NVIDIA's Ampere GPUs before vGPU 17.  Every fourth parent holds
    one mdev of the first type.  Each parent offers ``types`` types.
    """
    import uuid as uuidlib

    for value, what in ((parents, 'parents'), (types, 'types')):
        if isinstance(value, bool) or not isinstance(value, int) \
                or value < 1:
            raise exception.SimulatorError(
                reason='synthetic_profile: %s must be an integer >= 1, not '
                '%r' % (what, value))
    sriov = parents > 8
    heads = (16, 8, 4, 2, 1)
    catalogue = [{
        'id': 'nvidia-%d' % (500 + i),
        'name': 'NVIDIA SIM-%dQ' % (i + 1),
        'description': ('num_heads=4, frl_config=60, framebuffer=%dM, '
                        'max_resolution=5120x2880, max_instance=%d'
                        % (1024 * (i % 5 + 1),
                           1 if sriov else heads[i % 5])),
        'max_instance': 1 if sriov else heads[i % 5],
    } for i in range(types)]
    first_type = catalogue[0]['id']
    namespace = uuidlib.UUID(_SYNTH_UUID_NS)
    devices = []
    group = [10]
    n_parents = [0]

    def next_group():
        group[0] += 1
        return group[0] - 1

    def parent_fields(address):
        fields = {'mdev_types': 'sim', 'iommu_group': next_group()}
        if n_parents[0] % 4 == 0:
            fields['mdevs'] = [{
                'uuid': str(uuidlib.uuid5(namespace, address)),
                'type_id': first_type}]
        n_parents[0] += 1
        return fields

    n_gpus = max(8, math.ceil(parents / _VFS_PER_PF)) if sriov else parents
    for k in range(n_gpus):
        domain, j = divmod(k, _PFS_PER_DOMAIN)
        bridge = '%04x:%02x:00.0' % (domain, 0x10 + 2 * j)
        address = '%04x:%02x:00.0' % (domain, 0x11 + 2 * j)
        gpu = {
            'address': address, 'vendor_id': '10de',
            'class_code': '0x030200', 'subsystem_vendor_id': '10de',
            'vendor_name': 'NVIDIA Corporation', 'driver': 'nvidia',
            'numa_node': k % 2, 'parent_bridge': bridge,
        }
        if not sriov:
            gpu.update(product_id='1eb8', subsystem_device_id='12a2',
                       product_name='TU104GL [Tesla T4]',
                       **parent_fields(address))
            devices.append(gpu)
            continue
        n_vfs = parents // n_gpus + (1 if k < parents % n_gpus else 0)
        vfs = []
        for v in range(n_vfs):
            devfn = 4 + v
            vfs.append('%04x:%02x:%02x.%x' % (domain, 0x11 + 2 * j, devfn >> 3,
                                              devfn & 7))
        # Each VF here stands for an mdev parent of its own, so the VFs do
        # not share capacity ('per-vf'): the benchmark wants many parents,
        # not a model of one GPU (the a100 profile is that).
        gpu.update(product_id='20f1', subsystem_device_id='145f',
                   product_name='GA100 [A100 PCIe 40GB]',
                   iommu_group=next_group(), sriov_totalvfs=_VFS_PER_PF,
                   virtfns=vfs, vf_capacity=VF_PER_VF)
        devices.append(gpu)
        vf_fields = {k: v for k, v in gpu.items() if k != 'vf_capacity'}
        for vf in vfs:
            devices.append(dict(vf_fields, address=vf, sriov_totalvfs=None,
                                virtfns=[], physfn=address,
                                **parent_fields(vf)))
    return profile_from_dict({
        'name': 'synthetic-%d' % parents,
        'description': 'generated: %d mdev parents, %d types each'
                       % (parents, types),
        'hostname': 'sim-synthetic-%d' % parents,
        'no_capacity_errno': 'EINVAL',
        'type_catalogues': {'sim': catalogue},
        'devices': devices,
    }, source='synthetic_profile(%d, %d)' % (parents, types))
