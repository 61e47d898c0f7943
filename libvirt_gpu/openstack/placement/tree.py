"""Records of a Placement resource-provider tree (no I/O, no policy).

The tree is what ``placement.model.build_tree`` computes from discovery and
configuration, and what ``placement.client`` writes to a real Placement.
Shapes follow the Placement API: ``Inventory.to_api()`` is the body of one
resource class in ``PUT /resource_providers/{uuid}/inventories``.
"""

from __future__ import annotations

import uuid

from libvirt_gpu.util import records

# A provider's UUID is uuid3(NAMESPACE_DNS, its name): stable for a name, so
# every sync of the same host finds the same providers, and the UUID OpenStack
# Cyborg's conductor gives the provider of a deployable of that name, so
# that a host moves between Cyborg and our agent without new providers.
NAMESPACE = uuid.NAMESPACE_DNS
# What releases before 0.2 derived UUIDs from (uuid5): such providers are
# still recognised as ours, and replaced.
LEGACY_NAMESPACE = uuid.UUID('2f5b6a4e-8f57-4b4e-9c53-3f1a7c0e6d21')


def provider_uuid(name):
    return str(uuid.uuid3(NAMESPACE, name))


def legacy_provider_uuid(name):
    return str(uuid.uuid5(LEGACY_NAMESPACE, name))


@records.record
class Inventory:
    resource_class: str
    total: int
    reserved: int = 0
    min_unit: int = 1
    max_unit: int | None = None   # None: same as total
    step_size: int = 1
    allocation_ratio: float = 1.0

    def __post_init__(self):
        if self.total < 1:
            raise ValueError('Placement refuses an inventory of total %d'
                             % self.total)
        if not 0 <= self.reserved <= self.total:
            raise ValueError('reserved %d outside 0..%d'
                             % (self.reserved, self.total))

    def to_api(self):
        return {
            'total': self.total,
            'reserved': self.reserved,
            'min_unit': self.min_unit,
            'max_unit': self.total if self.max_unit is None else self.max_unit,
            'step_size': self.step_size,
            'allocation_ratio': self.allocation_ratio,
        }


@records.record
class ResourceProvider:
    name: str
    uuid: str
    parent_provider_uuid: str | None
    inventories: tuple[Inventory, ...] = ()
    traits: frozenset[str] = frozenset()

    def inventories_api(self):
        return {inv.resource_class: inv.to_api() for inv in self.inventories}

    def to_dict(self):
        return {
            'name': self.name,
            'uuid': self.uuid,
            'parent_provider_uuid': self.parent_provider_uuid,
            'inventories': self.inventories_api(),
            'traits': sorted(self.traits),
        }


@records.record
class ProviderTree:
    """A compute-node root and one child provider per GPU; ``foreign``:
    the GPUs of other routes (``routes.Routes``), whose providers (Cyborg's
    conductor names them as we do) a sync leaves alone."""

    root: ResourceProvider
    children: tuple[ResourceProvider, ...] = ()
    foreign: frozenset = frozenset()

    @property
    def providers(self):
        return (self.root,) + self.children

    def to_dict(self):
        return {'resource_providers': [p.to_dict() for p in self.providers]}
