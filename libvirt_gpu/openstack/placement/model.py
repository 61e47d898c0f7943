"""Discovery + configuration -> the Placement provider tree.

    <hostname>                              (root: the compute node)
    ├── <hostname>_0000:3b:00.0             PGPU total 1
    └── <hostname>_0000:af:00.0             VGPU total N, traits

Names and UUIDs (``tree.provider_uuid``) are the ones OpenStack Cyborg
gives the deployable of a GPU (``placement.cyborg_objects``).

One provider per *physical* GPU, named after its address (the PF's, for a
GPU with SR-IOV): never one per VF, and VFs are never offered whole.

A GPU with an enabled type reports VGPU with total = what it can hold of
that type (``capacity.vgpu_total``).  Any other GPU of a passthrough vendor
(``[gpu]/pgpu_vendor_ids``) that is not an SR-IOV VF and can be passed
through (``pgpu_refusal``: it has an IOMMU group) reports PGPU 1,
reserved while it (or one of its VFs) holds vGPUs.  vGPUs need no group
of the parent: each mdev or VF gets its own.  A GPU whose enabled
type has no capacity at all is left out: Placement refuses an inventory of
total 0.
"""

from libvirt_gpu.util import bounds
from libvirt_gpu.devices import capacity
from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.openstack.placement import traits as traits_mod
from libvirt_gpu.openstack.placement import tree

PGPU = 'PGPU'
DEFAULT_PGPU_VENDORS = (objects.NVIDIA_VENDOR_ID,)


def gpu_provider_name(hostname, address):
    """``compute-1_0000:af:00.0``: Cyborg's deployable name."""
    return '%s_%s' % (hostname, address)


def gpu_provider_address(hostname, name):
    """The inverse of ``gpu_provider_name``, for a name read back from
    Placement (where it enters the program): the ``objects.PciAddress``
    it names, or None when it is no GPU provider's name of ``hostname``."""
    if not name.startswith(hostname + '_'):
        return None
    try:
        return objects.PciAddress.parse(name[len(hostname) + 1:])
    except exception.InvalidPciAddress:
        return None


# The capacity rules live in ``libvirt_gpu.devices.capacity`` (the allocator
# uses the same function): Placement's total is that function's answer.
vgpu_total = capacity.vgpu_total


def holds_vgpus(gpu):
    """Whether the GPU or one of its VFs holds a vGPU."""
    return any(f.used_type_ids for f in gpu.functions)


def gpu_provider(hostname, root_uuid, gpu, enabled=None, gpu_traits=True):
    """The child provider of one GPU, or None when it has no capacity."""
    name = gpu_provider_name(hostname, gpu.address)
    if enabled is not None:
        # Placement keeps totals in 32-bit integers: never more than that
        # (each type's count is bounded already, bounds.MAX_INSTANCES).
        total = min(capacity.vgpu_total(gpu, enabled), bounds.PLACEMENT_MAX)
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


NO_IOMMU_GROUP = capacity.NO_IOMMU_GROUP
pgpu_refusal = capacity.pgpu_refusal


def offered(gpu, enabled, pgpu_vendors=DEFAULT_PGPU_VENDORS):
    """Whether ``gpu`` gets a provider at all (before capacity): never a
    VF (its physical GPU has the provider), never a whole GPU that cannot
    be passed through (``pgpu_refusal``)."""
    if gpu.is_vf:
        return False
    if enabled is not None:
        return True
    return gpu.vendor_id in pgpu_vendors and pgpu_refusal(gpu) is None


def host_tree(env, hostname):
    """The provider tree of the host ``env`` (an
    ``environment.Environment``, handed in: its GPUs as discovered, its
    enabled types and its configuration's ``[gpu]`` options)."""
    return build_tree(hostname, env.discovered.gpus, env.enabled,
                      env.conf.gpu.report_gpu_traits,
                      env.conf.gpu.pgpu_vendor_ids)


def build_tree(hostname, gpus, enabled, gpu_traits=True,
               pgpu_vendors=DEFAULT_PGPU_VENDORS):
    """``enabled``: ``{PciAddress: EnabledType}`` from enablement.resolve
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
