"""Discovery + configuration -> the Placement provider tree.

    <hostname>                              (root: the compute node)
    ├── <hostname>_0000:3b:00.0             PGPU total 1
    └── <hostname>_0000:af:00.0             VGPU total N, traits

Names and UUIDs (``tree.provider_uuid``) are the ones OpenStack Cyborg
gives the deployable of a GPU (``openstack.cyborg_objects``).

One provider per *physical* GPU, named after its address (the PF's, for a
GPU with SR-IOV): never one per VF, and VFs are never offered whole.  A
GPU whose layout offers several vGPU types (``devices.layout``) has one
provider per type, beside each other under the root: the first type's is
the GPU's own (``<hostname>_<address>``), each other type's is named
``<hostname>_<address>_<type>`` (``type_provider_name``).  Their totals
never share room: the layout gives each type GIs of its own profile (MIG)
or a count that fits beside the others' whatever placements the driver
picks (mixed sizes), so no mix of allocations Placement accepts is
refused by the driver.

A GPU with an enabled type reports VGPU with total = what it can hold of
that type (``capacity.vgpu_total``); on a GPU in MIG or mixed-size mode
that is the driver's own count (``Vgpus.rooms``: max instances per GPU
instance x the GPU instances of the type's profile; the type's creatable
placements), so no allocation Placement accepts is refused by the driver
for lack of room.  Any other GPU of a passthrough vendor
(``[gpu]/pgpu_vendor_ids``) that is not an SR-IOV VF and can be passed
through (``pgpu_refusal``: it has an IOMMU group) reports PGPU 1,
reserved while it (or one of its VFs) holds vGPUs.  vGPUs need no group
of the parent: each mdev or VF gets its own.  A GPU whose enabled
type has no capacity at all is left out: Placement refuses an inventory of
total 0.

A GPU carved for Nova (``[nova]/carved``, ``carving.Carved.gpus``) is left
out whole: its carved VFs are Nova's PCI devices, which Nova reports
itself, and what they use of the GPU is not ours to offer.  Nothing we
report may look like Nova's own providers (``check_not_novas``): none is
named ``<host>_pci_...`` (Nova's vGPU providers), none has the trait
``OWNER_NOVA``, none takes the name Nova gives a carved GPU's PCI
provider (``<host>_<PCI address upper-cased>``; Placement may compare
names without case).
"""

from libvirt_gpu.util import bounds
from libvirt_gpu.devices import capacity
from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.openstack.placement import traits as traits_mod
from libvirt_gpu.openstack.placement import tree

PGPU = 'PGPU'
DEFAULT_PGPU_VENDORS = (objects.NVIDIA_VENDOR_ID,)
# What Nova (34) puts on its own providers, and its vGPU providers' names.
NOVA_OWNER_TRAIT = 'OWNER_NOVA'
NOVA_VGPU_INFIX = '_pci_'


def gpu_provider_name(hostname, address):
    """``compute-1_0000:af:00.0``: Cyborg's deployable name."""
    return '%s_%s' % (hostname, address)


def type_provider_name(hostname, address, type_id):
    """``compute-1_0000:af:00.0_nvidia-1155``: the provider of a further
    type of a GPU that offers several."""
    return '%s_%s_%s' % (hostname, address, type_id)


def gpu_provider_address(hostname, name):
    """The inverse of ``gpu_provider_name`` and ``type_provider_name``,
    for a name read back from Placement (where it enters the program):
    the ``objects.PciAddress`` it names, or None when it is no GPU
    provider's name of ``hostname``."""
    if not name.startswith(hostname + '_'):
        return None
    address, sep, type_id = name[len(hostname) + 1:].partition('_')
    try:
        if sep:
            objects.TypeId.parse(type_id)
        return objects.PciAddress.parse(address)
    except exception.InvalidInput:
        return None


# The capacity rules live in ``libvirt_gpu.devices.capacity`` (the allocator
# uses the same function): Placement's total is that function's answer.
vgpu_total = capacity.vgpu_total


def holds_vgpus(gpu):
    """Whether the GPU or one of its VFs holds a vGPU."""
    return any(f.used_type_ids for f in gpu.functions)


def gpu_provider(hostname, root_uuid, gpu, enabled=None, gpu_traits=True,
                 room=None, name=None):
    """The child provider of one GPU (of its type ``enabled``), or None
    when it has no capacity; ``room``: the driver's
    (``capacity.DriverRoom``) on a MIG or mixed-size GPU; ``name``: the
    provider's, when not the GPU's own."""
    name = name or gpu_provider_name(hostname, gpu.address)
    if enabled is not None:
        # Placement keeps totals in 32-bit integers: never more than that
        # (each type's count is bounded already, bounds.MAX_INSTANCES).
        total = min(capacity.vgpu_total(gpu, enabled, room=room),
                    bounds.PLACEMENT_MAX)
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


def host_tree(hostname, gpus, enabled, options, carved=frozenset(),
              rooms=None, foreign=frozenset()):
    """The provider tree of a host named ``hostname``: its GPUs as
    discovered (``gpus``), its enabled types (``enabled``), its
    configuration's ``[gpu]`` options (``options``: ``report_gpu_traits``,
    ``pgpu_vendor_ids``), the GPUs carved for Nova (``carved``), the
    driver's rooms (``rooms``: ``Vgpus.rooms`` of ``enabled``) and the
    GPUs of other routes (``foreign``); see ``build_tree``."""
    return build_tree(hostname, gpus, enabled, options.report_gpu_traits,
                      options.pgpu_vendor_ids, carved=carved, rooms=rooms,
                      foreign=frozenset(foreign))


def nova_pci_provider_name(hostname, address):
    """``compute-1_0000:AF:00.0``: the provider Nova's PCI-in-Placement
    makes for the physical GPU ``address`` (its VFs' parent)."""
    return '%s_%s' % (hostname, str(address).upper())


class NovaProviderClash(exception.LibvirtGpuError):
    msg_fmt = ('refusing to report %(name)s to Placement: %(reason)s; '
               'this is a bug of libvirt-gpu, please report it')


def check_not_novas(provider_tree, carved=()):
    """NovaProviderClash unless every provider of ``provider_tree`` but
    its root differs from Nova's own (see the module doc); ``carved``:
    the physical GPUs carved for Nova."""
    host = provider_tree.root.name
    novas = {nova_pci_provider_name(host, a).upper() for a in carved}
    for provider in provider_tree.children:
        if provider.name.startswith(host + NOVA_VGPU_INFIX):
            raise NovaProviderClash(
                name=provider.name, reason='Nova names its vGPU providers '
                '<host>_pci_<address>')
        if NOVA_OWNER_TRAIT in provider.traits:
            raise NovaProviderClash(
                name=provider.name, reason='the trait %s marks Nova\'s own '
                'providers' % NOVA_OWNER_TRAIT)
        if provider.name.upper() in novas:
            raise NovaProviderClash(
                name=provider.name, reason='its GPU is carved for Nova, '
                'whose PCI provider of it has that name')


def build_tree(hostname, gpus, enabled, gpu_traits=True,
               pgpu_vendors=DEFAULT_PGPU_VENDORS, carved=frozenset(),
               rooms=None, foreign=frozenset()):
    """``enabled``: ``{PciAddress: EnabledType}`` from enablement.resolve
    (keyed by physical GPU); ``carved``: the physical GPUs carved for
    Nova (left out); ``rooms``: ``Vgpus.rooms``; ``foreign``: the GPUs of
    other routes (left out, and their providers left alone by a sync)."""
    rooms = rooms or {}
    root = tree.ResourceProvider(name=hostname,
                                 uuid=tree.provider_uuid(hostname),
                                 parent_provider_uuid=None)
    children = []
    for gpu in sorted(gpus, key=lambda g: g.address):
        if gpu.address in carved or gpu.address in foreign or not offered(
                gpu, enabled.get(gpu.address), pgpu_vendors):
            continue
        setting = enabled.get(gpu.address)
        if setting is None:
            provider = gpu_provider(hostname, root.uuid, gpu, None,
                                    gpu_traits)
            if provider is not None:
                children.append(provider)
            continue
        for one in capacity.offered_types(gpu, setting, rooms):
            name = None if one is setting else type_provider_name(
                hostname, gpu.address, one.type_id)
            provider = gpu_provider(hostname, root.uuid, gpu, one,
                                    gpu_traits, name=name,
                                    room=rooms.get((gpu.address,
                                                    one.type_id)))
            if provider is not None:
                children.append(provider)
    found = tree.ProviderTree(root=root, children=tuple(children),
                              foreign=frozenset(foreign))
    check_not_novas(found, carved)
    return found
