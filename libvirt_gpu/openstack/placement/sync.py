"""Make Placement match a ProviderTree: plan (reads only), then apply.

What Placement ends up holding for host ``h`` with GPUs at af:00.0, 3b:00.0::

    h                  (ours, uuid3(h); or Nova's compute node named h)
    ├── h_0000:3b:00.0  PGPU 1: OWNER_CYBORG, CUSTOM_NVIDIA_1EB8
    └── h_0000:af:00.0  VGPU 8: OWNER_CYBORG, CUSTOM_NVIDIA_1EB8_T4_2B

Rules:

* The root: our own provider (uuid derived from the host name) if it exists;
  else an existing provider *named* like the host (Nova's compute node): the
  GPU providers become its children and its own inventories and traits are
  left to Nova; else we create our root.
* One child per GPU; inventories and traits replaced as a whole when they
  differ from the tree (custom traits are created first).
* A provider of ours (``<host>_<PCI address>`` name, uuid3 of that name, as
  Cyborg's conductor also makes them; or the ``<host>_pci_…`` names and
  uuid5 of earlier releases, which are replaced) whose GPU is
  no longer in the tree is deleted, unless allocations hold it: then every
  inventory gets ``reserved = total`` and it is reported as kept.
* Reads only when something may have changed: ``GET
  /resource_providers?in_tree=<root>`` lists every provider with its
  generation; a provider whose generation and desired content are the ones
  a previous sync verified (kept in :class:`SyncState`) is not read again.
  Any change of a provider's inventories or traits (and any allocation
  write but a DELETE) bumps its generation, so a steady-state sync costs
  one GET per host and no write; a kept provider (GPU gone, allocations
  remain) adds one GET of its allocations. Without a state (one-shot CLI
  sync) every provider is read.
* ``dry_run`` computes the same plan and returns the writes it would send.
"""

from __future__ import annotations

import time

from libvirt_gpu.openstack.placement import client as placement_client
from libvirt_gpu.openstack.placement import model
from libvirt_gpu.openstack.placement import tree as tree_mod
from libvirt_gpu.util import logs
from libvirt_gpu.util import records

LOG = logs.getLogger(__name__)

# Action kinds, also the verbs of the report.
CREATE = 'create'
MOVE = 'move'
INVENTORIES = 'inventories'
TRAITS = 'traits'
CREATE_TRAIT = 'create-trait'
DELETE = 'delete'

# A provider's verdict in the report.
CREATED = 'created'
UPDATED = 'updated'
UNCHANGED = 'unchanged'
DELETED = 'deleted'
KEPT = 'kept'          # GPU gone, allocations remain: reserved = total
FAILED = 'failed'


# --------------------------------------------------------------------------
# Records

@records.record
class Action:
    """One write of the plan.

    ``generation`` is the provider generation the write is expected to
    carry (as read, or 0 for a provider the plan creates, plus one per
    earlier write to it); apply uses the real one if it differs.
    """

    kind: str
    uuid: str | None       # provider (None for create-trait)
    name: str                        # provider or trait name
    generation: int | None = None
    parent_uuid: str | None = None
    inventories: tuple[tree_mod.Inventory, ...] = ()
    traits: frozenset[str] = frozenset()
    reason: str = ''

    def request(self, generation=None):
        """The request this action sends (with ``generation`` if given)."""
        gen = self.generation if generation is None else generation
        C = placement_client.PlacementClient
        if self.kind == CREATE:
            return C.create_provider_request(self.name, self.uuid,
                                             self.parent_uuid)
        if self.kind == MOVE:
            return C.update_provider_request(self.uuid, self.name,
                                             self.parent_uuid)
        if self.kind == INVENTORIES:
            return C.inventories_request(self.uuid, gen, self.inventories)
        if self.kind == TRAITS:
            return C.traits_request(self.uuid, gen, self.traits)
        if self.kind == CREATE_TRAIT:
            return C.create_trait_request(self.name)
        if self.kind == DELETE:
            return C.delete_provider_request(self.uuid)
        raise ValueError('unknown action kind %r' % self.kind)


@records.record
class ProviderResult:
    name: str
    uuid: str
    outcome: str        # CREATED, UPDATED, UNCHANGED, DELETED, KEPT, FAILED
    detail: str = ''


@records.record
class SyncPlan:
    root_uuid: str                 # root of the tree in Placement
    parent_uuid: str               # where the GPU providers hang
    nested: bool                   # parent is a provider we did not create
    actions: tuple[Action, ...]
    results: tuple[ProviderResult, ...]   # as planned
    # (uuid, generation, desired record or KEPT) verified by the reads,
    # remembered in SyncState when nothing needs writing.
    verified: tuple[tuple[str, int, object], ...]

    @property
    def requests(self):
        return [a.request() for a in self.actions]


@records.record(frozen=False)
class SyncReport:
    """What a sync did; the report shape of the CLI (``summary``,
    ``COLUMNS`` and ``rows``, ``details``, ``to_json``)."""

    host: str
    root_uuid: str
    parent_uuid: str
    nested: bool
    dry_run: bool
    results: list[ProviderResult]
    requests: list[placement_client.PlannedRequest]  # writes
    stats: placement_client.RequestStats   # everything sent, reads too
    duration_s: float

    def with_outcome(self, outcome):
        return [r for r in self.results if r.outcome == outcome]

    @property
    def changed(self):
        """Whether the sync wrote (or, dry run, would write) anything."""
        return bool(self.requests)

    @property
    def failed(self):
        return self.with_outcome(FAILED)

    def summary(self):
        counts = {}
        for r in self.results:
            counts[r.outcome] = counts.get(r.outcome, 0) + 1
        parts = ['%d %s' % (n, o) for o, n in sorted(counts.items())]
        if self.dry_run:
            sent = ('%d reads, %d writes planned [dry run]'
                    % (self.stats.total, len(self.requests)))
        else:
            sent = '%d requests (%d writes)' % (self.stats.total,
                                                self.stats.writes)
        return '%s: %s; %s in %.2f s' % (
            self.host, ', '.join(parts) or 'no providers', sent,
            self.duration_s)

    COLUMNS = ('OUTCOME', 'PROVIDER', 'UUID', 'DETAIL')

    def rows(self):
        return [(r.outcome, r.name, r.uuid, r.detail or None)
                for r in self.results]

    def details(self):
        """The writes (the plan of a dry run)::

            plan:
              POST /resource_providers {"name": "h", "uuid": "2f1c..."}
              PUT /resource_providers/9a0e.../inventories {...}
        """
        lines = ['plan:' if self.dry_run else 'sent:']
        lines.extend('  %s' % req for req in self.requests)
        if not self.requests:
            lines.append('  nothing to write')
        return lines

    def to_json(self):
        return {
            'host': self.host,
            'dry_run': self.dry_run,
            'changed': self.changed,
            'nested': self.nested,
            'root_uuid': self.root_uuid,
            'results': [records.asdict(r) for r in self.results],
            'requests': [records.asdict(r) for r in self.requests],
            'requests_sent': self.stats.total,
            'writes_sent': self.stats.writes,
            'duration_s': round(self.duration_s, 3),
        }


@records.record(frozen=False)
class SyncState:
    """What earlier syncs verified; lets a steady-state sync skip reads.

    ``verified`` maps a provider uuid to ``(generation, desired)`` where
    ``desired`` is the ResourceProvider record (or KEPT) that Placement was
    seen to match at that generation.
    """

    root_uuid: str | None = None
    verified: dict[str, tuple[int, object]] = (
        records.field(default_factory=dict))

    def forget(self):
        self.root_uuid = None
        self.verified.clear()

    def matches(self, uuid, generation, desired):
        return self.verified.get(uuid) == (generation, desired)


# --------------------------------------------------------------------------
# Plan

def _is_ours(provider, host, foreign=frozenset()):
    """A GPU provider this package (or Cyborg, from our driver) created
    for ``host``; or one of an earlier release's, to be replaced.  Never
    one of a GPU of another route (``foreign``: Cyborg's conductor names
    its providers as we do)."""
    if not provider.name.startswith(host + '_'):
        return False
    if model.gpu_provider_address(host, provider.name) in foreign:
        return False
    suffix = provider.name[len(host) + 1:]
    if suffix.startswith('pci_'):
        return provider.uuid == tree_mod.legacy_provider_uuid(provider.name)
    if model.gpu_provider_address(host, provider.name) is None:
        return False
    return provider.uuid == tree_mod.provider_uuid(provider.name)


class _Planner:
    def __init__(self, client, tree, state, nest, nova_root=False):
        self.client = client
        self.tree = tree
        self.state = state
        self.nest = nest or nova_root
        self.nova_root = nova_root
        self.actions = []
        self.results = []
        self.verified = []
        self.generations = {}   # uuid -> generation the next write carries

    # -- root ---------------------------------------------------------------

    def resolve_root(self):
        """-> (root Provider or None, providers in its tree, nested)."""
        ours = self.tree.root.uuid
        if self.state.root_uuid:
            providers = self.client.list_tree(self.state.root_uuid)
            root = _find(providers, self.state.root_uuid)
            if root is not None:
                return root, providers, root.uuid != ours
            LOG.info('Provider %s is gone from Placement; looking for the '
                     'root again', self.state.root_uuid)
            self.state.forget()
        providers = self.client.list_tree(ours)
        root = _find(providers, ours)
        if root is not None:
            return root, providers, False
        if self.nest:
            existing = self.client.find_provider_by_name(self.tree.root.name)
            if existing is not None:
                LOG.info('Nesting the GPU providers of %s under the existing '
                         'provider %s', self.tree.root.name, existing.uuid)
                return existing, self.client.list_tree(existing.uuid), True
        if self.nova_root:
            # the root's name is the compute node's, and Nova creates it:
            # taking it first makes nova-compute's create fail (409)
            raise placement_client.ComputeNodeMissing(
                host=self.tree.root.name)
        return None, (), False

    # -- one provider -------------------------------------------------------

    def _write(self, kind, desired, **kwargs):
        gen = self.generations.get(desired.uuid)
        self.actions.append(Action(kind=kind, uuid=desired.uuid,
                                   name=desired.name, generation=gen,
                                   **kwargs))
        if kind in (INVENTORIES, TRAITS):
            self.generations[desired.uuid] = gen + 1

    def plan_new(self, desired):
        self.generations[desired.uuid] = 0
        self._write(CREATE, desired, parent_uuid=desired.parent_provider_uuid)
        if desired.inventories:
            self._write(INVENTORIES, desired,
                        inventories=desired.inventories, reason='new')
        if desired.traits:
            self._write(TRAITS, desired, traits=desired.traits, reason='new')
        self.results.append(ProviderResult(desired.name, desired.uuid,
                                           CREATED))

    def plan_existing(self, desired, current):
        details = []
        self.generations[desired.uuid] = current.generation
        if (current.name != desired.name or current.parent_provider_uuid
                != desired.parent_provider_uuid):
            self._write(MOVE, desired,
                        parent_uuid=desired.parent_provider_uuid,
                        reason='parent %s -> %s'
                        % (current.parent_provider_uuid,
                           desired.parent_provider_uuid))
            details.append('moved')
        if self.state.matches(current.uuid, current.generation, desired):
            if not details:
                self.results.append(ProviderResult(desired.name, desired.uuid,
                                                   UNCHANGED))
            else:
                self.results.append(ProviderResult(
                    desired.name, desired.uuid, UPDATED, ', '.join(details)))
            return
        inventories = self.client.get_inventories(desired.uuid)
        if inventories.to_api() != desired.inventories_api():
            self._write(INVENTORIES, desired,
                        inventories=desired.inventories,
                        reason=_inventory_diff(inventories.to_api(),
                                               desired.inventories_api()))
            details.append('inventories')
        traits = self.client.get_traits(desired.uuid)
        if traits.traits != desired.traits:
            self._write(TRAITS, desired, traits=desired.traits,
                        reason='+%s -%s' % (
                            sorted(desired.traits - traits.traits),
                            sorted(traits.traits - desired.traits)))
            details.append('traits')
        if details:
            self.results.append(ProviderResult(desired.name, desired.uuid,
                                               UPDATED, ', '.join(details)))
        else:
            self.results.append(ProviderResult(desired.name, desired.uuid,
                                               UNCHANGED))
            self.verified.append((desired.uuid, current.generation, desired))

    def plan_vanished(self, current):
        # Always asked: DELETE /allocations/{consumer} does not bump the
        # provider's generation, so a kept provider costs one GET per sync.
        allocations = self.client.get_allocations(current.uuid)
        if not allocations.in_use:
            self.actions.append(Action(kind=DELETE, uuid=current.uuid,
                                       name=current.name,
                                       reason='GPU no longer on this host'))
            self.results.append(ProviderResult(current.name, current.uuid,
                                               DELETED))
            return
        self.plan_keep(current, allocations)

    def plan_keep(self, current, allocations):
        """Reserve everything of a provider that guests still use."""
        consumers = ', '.join(c.consumer_uuid for c in allocations.consumers)
        detail = ('GPU gone; kept with reserved = total for %d consumer(s): '
                  '%s' % (len(allocations.consumers), consumers))
        if self.state.matches(current.uuid, current.generation, KEPT):
            # Reserved at this generation already: inventories unchanged.
            self.results.append(ProviderResult(current.name, current.uuid,
                                               KEPT, detail))
            return
        inventories = self.client.get_inventories(current.uuid)
        reserved = tuple(records.replace(inv, reserved=inv.total)
                         for inv in inventories.inventories)
        if reserved != inventories.inventories:
            self.actions.append(Action(
                kind=INVENTORIES, uuid=current.uuid, name=current.name,
                generation=inventories.generation, inventories=reserved,
                reason='reserve all: GPU gone, allocations remain'))
        else:
            self.verified.append((current.uuid, current.generation, KEPT))
        self.results.append(ProviderResult(current.name, current.uuid, KEPT,
                                           detail))

    # -- everything ---------------------------------------------------------

    def plan(self):
        tree = self.tree
        host = tree.root.name
        root, providers, nested = self.resolve_root()
        by_uuid = {p.uuid: p for p in providers}
        if root is None:
            self.plan_new(tree.root)
            parent_uuid = tree.root.uuid
            root_uuid = tree.root.uuid
        elif nested:
            parent_uuid = root.uuid
            root_uuid = root.root_provider_uuid
        else:
            self.plan_existing(tree.root, root)
            parent_uuid = root.uuid
            root_uuid = root.root_provider_uuid
        wanted = set()
        for child in tree.children:
            desired = records.replace(child,
                                      parent_provider_uuid=parent_uuid)
            wanted.add(desired.uuid)
            current = by_uuid.get(desired.uuid)
            if current is None:
                self.plan_new(desired)
            else:
                self.plan_existing(desired, current)
        for current in providers:
            if current.uuid not in wanted and _is_ours(current, host,
                                                       tree.foreign):
                self.plan_vanished(current)
        self._create_traits_first()
        return SyncPlan(root_uuid=root_uuid, parent_uuid=parent_uuid,
                        nested=nested, actions=tuple(self.actions),
                        results=tuple(self.results),
                        verified=tuple(self.verified))

    def _create_traits_first(self):
        needed = set()
        for action in self.actions:
            if action.kind == TRAITS:
                needed |= action.traits
        missing = self.client.missing_custom_traits(needed) if needed else []
        creates = [Action(kind=CREATE_TRAIT, uuid=None, name=name,
                          reason='custom trait')
                   for name in missing]
        # Deletions first (they free names), then traits, then the rest in
        # order: a provider is created before its inventories and traits.
        deletes = [a for a in self.actions if a.kind == DELETE]
        rest = [a for a in self.actions if a.kind != DELETE]
        self.actions = deletes + creates + rest


def _find(providers, uuid):
    for provider in providers:
        if provider.uuid == uuid:
            return provider
    return None


def _inventory_diff(current, desired):
    changes = []
    for rc in sorted(set(current) | set(desired)):
        before, after = current.get(rc), desired.get(rc)
        if before == after:
            continue
        if before is None:
            changes.append('+%s %d' % (rc, after['total']))
        elif after is None:
            changes.append('-%s' % rc)
        else:
            keys = [k for k in sorted(after) if before.get(k) != after[k]]
            changes.append('%s %s' % (rc, ', '.join(
                '%s %s -> %s' % (k, before.get(k), after[k]) for k in keys)))
    return '; '.join(changes)


def plan(client, tree, state=None, nest=True, nova_root=False):
    """Read Placement and return the :class:`SyncPlan` (sends no write)."""
    return _Planner(client, tree, state or SyncState(), nest,
                    nova_root).plan()


# --------------------------------------------------------------------------
# Apply

class _Applier:
    def __init__(self, client, tree, plan_, state):
        self.client = client
        self.tree = tree
        self.plan = plan_
        self.state = state
        self.generations = {}      # uuid -> real generation after our writes
        self.failed = {}           # uuid -> ProviderResult
        self.kept = {}             # uuid -> ProviderResult (delete refused)
        self.unverified = set()    # uuids written by others meanwhile
        self.sent = []

    def _generation(self, action):
        return self.generations.get(action.uuid, action.generation)

    def run(self):
        for action in self.plan.actions:
            if action.uuid is not None and action.uuid in self.failed:
                continue
            if action.kind == CREATE and action.parent_uuid in self.failed:
                self.failed[action.uuid] = ProviderResult(
                    action.name, action.uuid, FAILED,
                    'not created: its parent %s could not be created'
                    % self.failed[action.parent_uuid].name)
                continue
            try:
                self._apply(action)
            except (placement_client.InventoryInUse,
                    placement_client.ProviderConflict,
                    placement_client.TraitNotFound) as exc:
                # Final for this provider; the others still sync.
                LOG.error('%s', exc)
                self.failed[action.uuid] = ProviderResult(
                    action.name, action.uuid, FAILED, str(exc))
                self.state.verified.pop(action.uuid, None)

    def _apply(self, action):
        self.sent.append(action.request(self._generation(action)))
        if action.kind == CREATE:
            created = self.client.create_provider(action.name, action.uuid,
                                                  action.parent_uuid)
            self.generations[action.uuid] = created.generation
        elif action.kind == MOVE:
            moved = self.client.update_provider(action.uuid, action.name,
                                                action.parent_uuid)
            self.generations[action.uuid] = moved.generation
        elif action.kind == INVENTORIES:
            self._written(action, self.client.set_inventories(
                action.uuid, self._generation(action), action.inventories))
        elif action.kind == TRAITS:
            self._written(action, self.client.set_traits(
                action.uuid, self._generation(action), action.traits))
        elif action.kind == CREATE_TRAIT:
            self.client.create_trait(action.name)
        elif action.kind == DELETE:
            try:
                self.client.delete_provider(action.uuid)
            except placement_client.ProviderInUse:
                # An allocation arrived between our check and the delete.
                LOG.info('Provider %s gained allocations; keeping it',
                         action.name)
                self._keep_instead(action)

    def _written(self, action, generation):
        if generation != self._generation(action) + 1:
            # Retried after a concurrent update: someone else wrote to the
            # provider meanwhile, so what it holds now is not verified.
            self.unverified.add(action.uuid)
        self.generations[action.uuid] = generation

    def _keep_instead(self, action):
        inventories = self.client.get_inventories(action.uuid)
        reserved = tuple(records.replace(inv, reserved=inv.total)
                         for inv in inventories.inventories)
        keep = Action(kind=INVENTORIES, uuid=action.uuid, name=action.name,
                      generation=inventories.generation, inventories=reserved,
                      reason='reserve all: GPU gone, allocations remain')
        if reserved != inventories.inventories:
            self._apply(keep)
        self.kept[action.uuid] = ProviderResult(
            action.name, action.uuid, KEPT,
            'GPU gone; allocations appeared while deleting: reserved = total')

    def results(self):
        out = []
        for planned in self.plan.results:
            out.append(self.failed.get(planned.uuid)
                       or self.kept.get(planned.uuid) or planned)
        return out

    def remember(self):
        state = self.state
        state.root_uuid = self.plan.root_uuid
        for uuid, generation, desired in self.plan.verified:
            state.verified[uuid] = (generation, desired)
        written = {}
        for action in self.plan.actions:
            if action.uuid is None:
                continue
            if action.kind == DELETE and action.uuid not in self.kept:
                state.verified.pop(action.uuid, None)
                continue
            written[action.uuid] = action
        desired = {p.uuid: p for p in _desired_providers(self.plan, self.tree)}
        for uuid in written:
            if (uuid in self.failed or uuid in self.unverified
                    or uuid not in self.generations):
                state.verified.pop(uuid, None)
            elif uuid in desired:
                state.verified[uuid] = (self.generations[uuid], desired[uuid])
            else:
                state.verified[uuid] = (self.generations[uuid], KEPT)


def _desired_providers(plan_, tree):
    """The tree's providers as written (children under plan.parent_uuid)."""
    out = [] if plan_.nested else [tree.root]
    out.extend(records.replace(c, parent_provider_uuid=plan_.parent_uuid)
               for c in tree.children)
    return out


def sync(client, tree, dry_run=False, state=None, nest=True,
         nova_root=False):
    """Make Placement hold ``tree``; return a :class:`SyncReport`.

    ``state`` (a :class:`SyncState` kept between calls, as the agent does)
    lets a sync skip the reads of providers nothing changed; it is updated
    in place. ``dry_run`` reads, plans and sends no write: the report's
    ``requests`` are the writes a real sync would send now.
    """
    state = state if state is not None else SyncState()
    start = time.monotonic()
    before = client.stats.copy()
    the_plan = plan(client, tree, state, nest=nest, nova_root=nova_root)
    if dry_run:
        results = list(the_plan.results)
        requests = the_plan.requests
    else:
        applier = _Applier(client, tree, the_plan, state)
        applier.run()
        applier.remember()
        results = applier.results()
        requests = applier.sent
    report = SyncReport(host=tree.root.name, root_uuid=the_plan.root_uuid,
                        parent_uuid=the_plan.parent_uuid,
                        nested=the_plan.nested, dry_run=dry_run,
                        results=results, requests=requests,
                        stats=client.stats - before,
                        duration_s=time.monotonic() - start)
    LOG.info('%s', report.summary())
    return report
