"""Discovery + configuration -> the Placement provider tree.

    <hostname>                              (root: the compute node)
    ├── <hostname>_pci_0000_3b_00_0         PGPU total 1
    └── <hostname>_pci_0000_af_00_0         VGPU total N, traits

One provider per *physical* GPU, named after its address (the PF's, for a
GPU with SR-IOV): never one per VF, and VFs are never offered whole.

A GPU with an enabled type reports VGPU with total = what it can hold of
that type (``vgpu_total``).  Any other GPU of a passthrough vendor
(``[gpu]/pgpu_vendor_ids``) that is not an SR-IOV VF and can be passed
through (``pgpu_refusal``: it has an IOMMU group) reports PGPU 1,
reserved while it (or one of its VFs) holds vGPUs.  vGPUs need no group
of the parent: each mdev or VF gets its own.  A GPU whose enabled
type has no capacity at all is left out: Placement refuses an inventory of
total 0.
"""

import logging

from libvirt_gpu.placement import traits as traits_mod
from libvirt_gpu.placement import tree

LOG = logging.getLogger(__name__)

PGPU = 'PGPU'
DEFAULT_PGPU_VENDORS = ('10de',)


def gpu_provider_name(hostname, address):
    return '%s_%s' % (hostname, address.libvirt_name)


def _limit(mtype, enabled):
    """The smaller of NVIDIA's per-GPU maximum (``max_instance`` of the
    description, or the published one) and ``[vgpu_<type>]/max_instances``;
    None when neither is known.  The setting can lower the maximum, never
    raise it above the driver's."""
    limits = [v for v in (mtype.max_instance, enabled.max_instances)
              if v is not None]
    return min(limits) if limits else None


def vgpu_total(gpu, enabled):
    """Capacity of ``enabled`` (EnabledType) on the physical GPU ``gpu``.

    A GPU without VFs (T4): ``available_instances`` of the type + its
    existing vGPUs of the type.  A GPU whose vGPUs live on VFs (one each):
    the vGPUs of the type on all its VFs + the free VFs that can take one
    now.  Either way never above the limit (``_limit``), never below what
    exists.  Without any limit a VF-based GPU reports what exists plus one:
    summing free VFs would over-report (16 VFs of an A100 are not 16
    vGPUs), and an under-report is the safe mistake.
    """
    type_id = enabled.type_id
    if not gpu.vf_gpus:
        mtype = gpu.mdev_type(type_id)
        if mtype is None:
            return 0
        used = sum(1 for m in gpu.mdevs if m.type_id == type_id)
        total = mtype.available_instances + used
        limit = _limit(mtype, enabled)
        if limit is not None:
            total = min(total, max(limit, used))
        return total
    mtype = gpu.offered_type(type_id)
    if mtype is None:
        return 0
    used = 0
    offering = 0
    for function in gpu.functions:
        held = function.used_type_ids
        used += sum(1 for t in held if t == type_id)
        if function.is_vf and held:
            continue                     # a VF holds one vGPU
        for candidate in function.vgpu_types:
            if candidate.id == type_id and candidate.available_instances > 0:
                offering += (1 if function.is_vf
                             else candidate.available_instances)
                break
    limit = _limit(mtype, enabled)
    if limit is None:
        LOG.warning('no maximum known for vGPU type %s on GPU %s (no '
                    'max_instance in its description, no published one): '
                    'reporting %d; set [vgpu_%s]/max_instances', type_id,
                    gpu.address, used + min(offering, 1), type_id)
        return used + min(offering, 1)
    return min(used + offering, max(limit, used))


def holds_vgpus(gpu):
    """Whether the GPU or one of its VFs holds a vGPU."""
    return any(f.used_type_ids for f in gpu.functions)


def gpu_provider(hostname, root_uuid, gpu, enabled=None, gpu_traits=True):
    """The child provider of one GPU, or None when it has no capacity."""
    name = gpu_provider_name(hostname, gpu.address)
    if enabled is not None:
        total = vgpu_total(gpu, enabled)
        if total < 1:
            return None
        inventory = tree.Inventory(enabled.resource_class, total=total)
        traits = traits_mod.vgpu_traits(
            gpu, gpu.offered_type(enabled.type_id), gpu_traits)
    else:
        inventory = tree.Inventory(PGPU, total=1,
                                   reserved=1 if holds_vgpus(gpu) else 0)
        traits = traits_mod.pgpu_traits(gpu)
    return tree.ResourceProvider(
        name=name, uuid=tree.provider_uuid(name),
        parent_provider_uuid=root_uuid, inventories=(inventory,),
        traits=traits)


NO_IOMMU_GROUP = (
    'no IOMMU group, so VFIO cannot hand it to a guest: turn the IOMMU on '
    '(VT-d / AMD-Vi in the firmware, intel_iommu=on on Intel hosts) and '
    'reboot')


def pgpu_refusal(gpu):
    """Why ``gpu`` cannot be given whole to a guest, or None."""
    if gpu.iommu_group is None:
        return NO_IOMMU_GROUP
    return None


def offered(gpu, enabled, pgpu_vendors=DEFAULT_PGPU_VENDORS):
    """Whether ``gpu`` gets a provider at all (before capacity): never a
    VF (its physical GPU has the provider), never a whole GPU that cannot
    be passed through (``pgpu_refusal``)."""
    if gpu.is_vf:
        return False
    if enabled is not None:
        return True
    return gpu.vendor_id in pgpu_vendors and pgpu_refusal(gpu) is None


def build_tree(hostname, gpus, enabled, gpu_traits=True,
               pgpu_vendors=DEFAULT_PGPU_VENDORS):
    """``enabled``: ``{PciAddress: EnabledType}`` from conf.vgpu.resolve
    (keyed by physical GPU)."""
    root = tree.ResourceProvider(name=hostname,
                                 uuid=tree.provider_uuid(hostname),
                                 parent_provider_uuid=None)
    children = []
    for gpu in sorted(gpus, key=lambda g: g.address):
        if not offered(gpu, enabled.get(gpu.address), pgpu_vendors):
            continue
        provider = gpu_provider(hostname, root.uuid, gpu,
                                enabled.get(gpu.address), gpu_traits)
        if provider is not None:
            children.append(provider)
    return tree.ProviderTree(root=root, children=tuple(children))
