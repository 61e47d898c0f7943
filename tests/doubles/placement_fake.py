"""An in-memory Placement behind the client's interface
(``FakePlacement``: providers, inventories, traits, allocations,
generations as Placement keeps them), and provider trees to sync to it
(``gpu_tree``, ``TWO``)."""


from libvirt_gpu.openstack.placement import client as pc
from libvirt_gpu.openstack.placement import tree as tree_mod


class FakePlacement:
    """Providers, inventories, traits, allocations; generations as Placement
    bumps them (inventory/trait writes; allocation writes but DELETE)."""

    endpoint = 'fake://placement'

    def __init__(self):
        self.providers = {}     # uuid -> dict(name, parent, generation)
        self.inventories = {}   # uuid -> {rc: Inventory}
        self.traits = {}        # uuid -> set
        self.allocations = {}   # uuid -> {consumer: {rc: n}}
        self.known_traits = {'OWNER_CYBORG'}
        self.stats = pc.RequestStats()
        self.microversion = (1, 39)
        self.refuse_delete = set()

    def _count(self, method):
        self.stats.by_method[method] += 1

    def _provider(self, uuid):
        p = self.providers[uuid]
        root = uuid
        while self.providers[root]['parent']:
            root = self.providers[root]['parent']
        return pc.Provider(uuid=uuid, name=p['name'],
                           generation=p['generation'],
                           parent_provider_uuid=p['parent'],
                           root_provider_uuid=root)

    def add(self, name, uuid=None, parent=None):
        uuid = uuid or tree_mod.provider_uuid(name)
        self.providers[uuid] = {'name': name, 'parent': parent,
                                'generation': 0}
        self.inventories[uuid] = {}
        self.traits[uuid] = set()
        self.allocations[uuid] = {}
        return uuid

    def bump(self, uuid):
        self.providers[uuid]['generation'] += 1

    # reads
    def list_tree(self, uuid):
        self._count('GET')
        if uuid not in self.providers:
            return ()
        root = self._provider(uuid).root_provider_uuid
        return tuple(self._provider(u) for u in self.providers
                     if self._provider(u).root_provider_uuid == root)

    def find_provider_by_name(self, name):
        self._count('GET')
        for u, p in self.providers.items():
            if p['name'] == name:
                return self._provider(u)
        return None

    def get_provider(self, uuid):
        self._count('GET')
        return self._provider(uuid) if uuid in self.providers else None

    def get_inventories(self, uuid):
        self._count('GET')
        return pc.ProviderInventories(
            self.providers[uuid]['generation'],
            tuple(tree_mod.Inventory(**{**vars(i), 'max_unit': i.to_api()[
                'max_unit']}) for _, i in sorted(
                    self.inventories[uuid].items())))

    def get_traits(self, uuid):
        self._count('GET')
        return pc.ProviderTraits(self.providers[uuid]['generation'],
                                 frozenset(self.traits[uuid]))

    def get_allocations(self, uuid):
        self._count('GET')
        return pc.ProviderAllocations(
            self.providers[uuid]['generation'],
            tuple(pc.ConsumerAllocation(c, tuple(sorted(r.items())))
                  for c, r in sorted(self.allocations[uuid].items())))

    def missing_custom_traits(self, traits):
        self._count('GET')
        return sorted(t for t in traits if t.startswith('CUSTOM_')
                      and t not in self.known_traits)

    # writes
    def create_trait(self, name):
        self._count('PUT')
        self.known_traits.add(name)

    def create_provider(self, name, uuid, parent_uuid=None):
        self._count('POST')
        if any(p['name'] == name for p in self.providers.values()):
            raise pc.ProviderConflict(name=name, uuid=uuid, detail='dup')
        self.add(name, uuid, parent_uuid)
        return self._provider(uuid)

    def update_provider(self, uuid, name, parent_uuid):
        self._count('PUT')
        self.providers[uuid].update(name=name, parent=parent_uuid)
        return self._provider(uuid)

    def _check(self, uuid, generation):
        if self.providers[uuid]['generation'] != generation:
            raise pc.GenerationConflict(uuid=uuid, what='x', attempts=1)

    def set_inventories(self, uuid, generation, inventories):
        self._count('PUT')
        self._check(uuid, generation)
        new = {i.resource_class: i for i in inventories}
        for alloc in self.allocations[uuid].values():
            if set(alloc) - set(new):
                raise pc.InventoryInUse(uuid=uuid, detail='in use')
        self.inventories[uuid] = new
        self.bump(uuid)
        return self.providers[uuid]['generation']

    def set_traits(self, uuid, generation, traits):
        self._count('PUT')
        self._check(uuid, generation)
        self.traits[uuid] = set(traits)
        self.bump(uuid)
        return self.providers[uuid]['generation']

    def delete_provider(self, uuid):
        self._count('DELETE')
        if self.allocations[uuid] or uuid in self.refuse_delete:
            raise pc.ProviderInUse(uuid=uuid, detail='allocations')
        for table in (self.providers, self.inventories, self.traits,
                      self.allocations):
            del table[uuid]

    def allocate(self, uuid, consumer, rc='VGPU', amount=1):
        self.allocations[uuid][consumer] = {rc: amount}
        self.bump(uuid)


def gpu_tree(host, spec):
    """spec: {'af': ('VGPU', 8, {'CUSTOM_X'})} -> ProviderTree."""
    root = tree_mod.ResourceProvider(host, tree_mod.provider_uuid(host), None)
    children = []
    for bus, (rc, total, traits) in sorted(spec.items()):
        name = '%s_0000:%s:00.0' % (host, bus)
        children.append(tree_mod.ResourceProvider(
            name, tree_mod.provider_uuid(name), root.uuid,
            (tree_mod.Inventory(rc, total),),
            frozenset({'OWNER_CYBORG'} | traits)))
    return tree_mod.ProviderTree(root, tuple(children))


def uuid_of(name):
    return tree_mod.provider_uuid(name)


TWO = {'af': ('VGPU', 8, {'CUSTOM_T4_2B'}), '3b': ('PGPU', 1, {'CUSTOM_T4'})}
