"""Discovery + configuration -> the Placement provider tree.

    <hostname>                              (root: the compute node)
    ├── <hostname>_pci_0000_3b_00_0         PGPU total 1
    └── <hostname>_pci_0000_af_00_0         VGPU total N, traits

A GPU with an enabled type reports VGPU with total = available instances of
that type + existing mdevs of that type (capped by max_instances).  Any other
GPU of a passthrough vendor (``[gpu]/pgpu_vendor_ids``) that is not an
SR-IOV VF reports PGPU 1, reserved while it holds mdevs of another type.  A GPU
whose enabled type has no capacity at all is left out: Placement refuses an
inventory of total 0.
"""

from libvirt_gpu.placement import traits as traits_mod
from libvirt_gpu.placement import tree

PGPU = 'PGPU'
DEFAULT_PGPU_VENDORS = ('10de',)


def gpu_provider_name(hostname, address):
    return '%s_%s' % (hostname, address.libvirt_name)


def vgpu_total(gpu, enabled):
    """Capacity of ``enabled`` (EnabledType) on ``gpu``."""
    mtype = gpu.mdev_type(enabled.type_id)
    if mtype is None:
        return 0
    used = sum(1 for m in gpu.mdevs if m.type_id == enabled.type_id)
    total = mtype.available_instances + used
    if enabled.max_instances is not None:
        total = min(total, max(enabled.max_instances, used))
    return total


def gpu_provider(hostname, root_uuid, gpu, enabled=None, gpu_traits=True):
    """The child provider of one GPU, or None when it has no capacity."""
    name = gpu_provider_name(hostname, gpu.address)
    if enabled is not None:
        total = vgpu_total(gpu, enabled)
        if total < 1:
            return None
        inventory = tree.Inventory(enabled.resource_class, total=total)
        traits = traits_mod.vgpu_traits(gpu, gpu.mdev_type(enabled.type_id),
                                        gpu_traits)
    else:
        inventory = tree.Inventory(PGPU, total=1,
                                   reserved=1 if gpu.mdevs else 0)
        traits = traits_mod.pgpu_traits(gpu)
    return tree.ResourceProvider(
        name=name, uuid=tree.provider_uuid(name),
        parent_provider_uuid=root_uuid, inventories=(inventory,),
        traits=traits)


def offered(gpu, enabled, pgpu_vendors=DEFAULT_PGPU_VENDORS):
    """Whether ``gpu`` gets a provider at all (before capacity)."""
    if enabled is not None:
        return True
    return gpu.vendor_id in pgpu_vendors and not gpu.is_vf


def build_tree(hostname, gpus, enabled, gpu_traits=True,
               pgpu_vendors=DEFAULT_PGPU_VENDORS):
    """``enabled``: ``{PciAddress: EnabledType}`` from conf.vgpu.resolve."""
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
