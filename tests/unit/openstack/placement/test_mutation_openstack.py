"""What the Placement sync (``placement.sync``) and the Cyborg objects
(``placement.cyborg_objects``) promise that test_placement_sync and
test_cyborg_golden left open: each test here fails on a change ``make
mutation`` made that the rest stayed green on (docs/dev/mutation.md).

The sync runs over test_placement_sync's in-memory Placement (generations
as the real one keeps them)."""

import logging
import time
import uuid as uuidlib

import pytest

from libvirt_gpu import conf as conf_mod
from libvirt_gpu import conffile
from libvirt_gpu.devices import capacity
from libvirt_gpu import environment
from libvirt_gpu import objects
from libvirt_gpu.openstack import cyborg_driver
from libvirt_gpu.openstack.placement import client as pc
from libvirt_gpu.openstack.placement import cyborg_objects
from libvirt_gpu.openstack.placement import model
from libvirt_gpu.openstack.placement import sync
from libvirt_gpu.openstack.placement import traits as traits_mod
from libvirt_gpu.openstack.placement import tree as tree_mod
from libvirt_gpu.util import records
from tests.doubles import fakes
from tests.unit.openstack.placement.test_sync import FakePlacement
from tests.unit.openstack.placement.test_sync import gpu_tree
from tests.unit.openstack.placement.test_sync import TWO
from tests.unit.openstack.placement.test_sync import uuid_of

AF = uuid_of('h_0000:af:00.0')
B3 = uuid_of('h_0000:3b:00.0')
ROOT = uuid_of('h')
NOVA = '2' * 8 + '-2222-2222-2222-' + '2' * 12


def _synced(spec=TWO, state=None):
    fake = FakePlacement()
    sync.sync(fake, gpu_tree('h', spec), state=state)
    return fake


def _verbs(report):
    return [(r.method, r.url) for r in report.requests]


def _outcomes(results):
    return [(r.name, r.outcome, r.detail) for r in results]


# -- Action.request: one request per kind ----------------------------------

def test_each_action_kind_sends_its_own_request():
    inv = (tree_mod.Inventory('VGPU', 4),)
    C = pc.PlacementClient
    assert sync.Action(sync.CREATE, 'u', 'n', parent_uuid='p').request() \
        == C.create_provider_request('n', 'u', 'p')
    assert sync.Action(sync.MOVE, 'u', 'n', parent_uuid='p').request() \
        == C.update_provider_request('u', 'n', 'p')
    assert sync.Action(sync.INVENTORIES, 'u', 'n', generation=3,
                       inventories=inv).request() \
        == C.inventories_request('u', 3, inv)
    assert sync.Action(sync.TRAITS, 'u', 'n', generation=3,
                       traits=frozenset({'CUSTOM_A'})).request() \
        == C.traits_request('u', 3, {'CUSTOM_A'})
    assert sync.Action(sync.CREATE_TRAIT, None, 'CUSTOM_A').request() \
        == C.create_trait_request('CUSTOM_A')
    assert sync.Action(sync.DELETE, 'u', 'n').request() \
        == C.delete_provider_request('u')


def test_a_given_generation_replaces_the_planned_one():
    inv = (tree_mod.Inventory('VGPU', 4),)
    action = sync.Action(sync.INVENTORIES, 'u', 'n', generation=3,
                         inventories=inv)
    assert action.request(7).body['resource_provider_generation'] == 7
    assert action.request().body['resource_provider_generation'] == 3
    traits = sync.Action(sync.TRAITS, 'u', 'n', generation=3,
                         traits=frozenset({'CUSTOM_A'}))
    assert traits.request(0).body['resource_provider_generation'] == 0


def test_an_unknown_action_kind_is_refused():
    with pytest.raises(ValueError) as e:
        sync.Action('rename', 'u', 'n').request()
    assert str(e.value) == "unknown action kind 'rename'"


# -- SyncReport: the text and JSON the CLI prints ---------------------------

def test_summary_of_a_dry_run_counts_reads_and_planned_writes():
    report = sync.sync(FakePlacement(), gpu_tree('h', TWO), dry_run=True)
    report.duration_s = 1.234
    assert report.summary() == (
        'h: 3 created; %d reads, 9 writes planned [dry run] in 1.23 s'
        % report.stats.total)
    assert report.stats.total == 3      # the tree, the name, the traits


def test_summary_of_a_sync_counts_outcomes_in_name_order():
    fake = _synced()
    report = sync.sync(fake, gpu_tree('h', {
        'af': ('VGPU', 4, {'CUSTOM_T4_2B'}), '3b': TWO['3b']}))
    report.duration_s = 0.5
    assert report.summary() == (
        'h: 2 unchanged, 1 updated; %d requests (1 writes) in 0.50 s'
        % report.stats.total)
    assert report.stats.total == 8 and report.stats.writes == 1


def test_summary_of_a_host_without_providers():
    fake = FakePlacement()
    fake.add('h', uuid=NOVA)
    report = sync.sync(fake, gpu_tree('h', {}))
    report.duration_s = 0
    assert report.results == [] and report.nested
    assert report.summary() == 'h: no providers; 3 requests (0 writes) ' \
        'in 0.00 s'


def test_rows_and_details():
    fake = _synced()
    report = sync.sync(fake, gpu_tree('h', {'af': TWO['af']}))
    assert report.rows() == [
        ('unchanged', 'h', ROOT, None),
        ('unchanged', 'h_0000:af:00.0', AF, None),
        ('deleted', 'h_0000:3b:00.0', B3, None)]
    assert report.details() == ['sent:', '  DELETE /resource_providers/%s'
                                % B3]
    dry = sync.sync(fake, gpu_tree('h', {}), dry_run=True)
    assert dry.details() == ['plan:', '  DELETE /resource_providers/%s'
                             % AF]
    assert sync.SyncReport.COLUMNS == ('OUTCOME', 'PROVIDER', 'UUID',
                                       'DETAIL')


def test_failed_lists_the_failed_providers_only():
    fake = _synced()
    fake.allocate(AF, 'c1')
    report = sync.sync(fake, gpu_tree('h', {
        'af': ('PGPU', 1, set()), '3b': TWO['3b']}))
    assert [r.name for r in report.failed] == ['h_0000:af:00.0']
    assert report.rows()[2][3].startswith('Cannot change the inventory')
    assert [r.name for r in report.with_outcome(sync.UNCHANGED)] == [
        'h', 'h_0000:3b:00.0']


def test_to_json_of_a_sync():
    fake = _synced()
    report = sync.sync(fake, gpu_tree('h', {'af': TWO['af']}))
    report.duration_s = 0.12345
    assert report.to_json() == {
        'host': 'h', 'dry_run': False, 'changed': True, 'nested': False,
        'root_uuid': ROOT,
        'results': [
            {'name': 'h', 'uuid': ROOT, 'outcome': 'unchanged',
             'detail': ''},
            {'name': 'h_0000:af:00.0', 'uuid': AF, 'outcome': 'unchanged',
             'detail': ''},
            {'name': 'h_0000:3b:00.0', 'uuid': B3, 'outcome': 'deleted',
             'detail': ''}],
        'requests': [{'method': 'DELETE', 'url': '/resource_providers/%s'
                      % B3, 'body': None}],
        'requests_sent': report.stats.total, 'writes_sent': 1,
        'duration_s': 0.123}
    assert report.stats.total == 7


def test_to_json_of_a_nested_dry_run():
    fake = FakePlacement()
    fake.add('h', uuid=NOVA)
    report = sync.sync(fake, gpu_tree('h', {}), dry_run=True)
    got = report.to_json()
    assert (got['dry_run'], got['changed'], got['nested'],
            got['root_uuid'], got['requests'], got['writes_sent']) == (
        True, False, True, NOVA, [], 0)


# -- plan: one provider -----------------------------------------------------

def test_a_provider_renamed_by_someone_is_named_back():
    fake = _synced()
    fake.providers[AF]['name'] = 'other'
    plan = sync.plan(fake, gpu_tree('h', TWO))
    move = [a for a in plan.actions if a.kind == sync.MOVE]
    assert [(a.uuid, a.name, a.parent_uuid, a.reason) for a in move] == [
        (AF, 'h_0000:af:00.0', ROOT, 'parent %s -> %s' % (ROOT, ROOT))]
    assert _outcomes(plan.results)[2] == (
        'h_0000:af:00.0', sync.UPDATED, 'moved')
    # what was read is not remembered: a write follows
    assert [v[0] for v in plan.verified] == [ROOT, B3]


def test_a_moved_provider_with_a_verified_state_is_updated_unread():
    state = sync.SyncState()
    fake = _synced(state=state)
    fake.providers[AF]['parent'] = B3
    before = fake.stats.copy()
    plan = sync.plan(fake, gpu_tree('h', TWO), state)
    assert (fake.stats - before).total == 1        # the tree only
    assert _outcomes(plan.results) == [
        ('h', sync.UNCHANGED, ''), ('h_0000:3b:00.0', sync.UNCHANGED, ''),
        ('h_0000:af:00.0', sync.UPDATED, 'moved')]
    assert [r.uuid for r in plan.results] == [ROOT, B3, AF]
    assert [(a.kind, a.reason) for a in plan.actions] == [
        (sync.MOVE, 'parent %s -> %s' % (B3, ROOT))]


def test_changed_inventories_and_traits_say_what_changed():
    fake = _synced()
    fake.bump(AF)
    fake.bump(AF)
    spec = {'af': ('VGPU', 4, {'CUSTOM_NEW'}), '3b': TWO['3b']}
    plan = sync.plan(fake, gpu_tree('h', spec))
    writes = [(a.kind, a.generation, a.reason) for a in plan.actions
              if a.uuid == AF]
    assert writes == [
        (sync.INVENTORIES, 4,
         'VGPU max_unit 8 -> 4, total 8 -> 4'),
        (sync.TRAITS, 5, "+['CUSTOM_NEW'] -['CUSTOM_T4_2B']")]
    assert _outcomes(plan.results)[2] == (
        'h_0000:af:00.0', sync.UPDATED, 'inventories, traits')
    assert [a.name for a in plan.actions if a.kind == sync.CREATE_TRAIT] \
        == ['CUSTOM_NEW']
    # unchanged ones are verified at the generation read
    assert plan.verified == (
        (ROOT, 0, gpu_tree('h', spec).root),
        (B3, 2, gpu_tree('h', spec).children[0]))


def test_a_trait_change_alone():
    fake = _synced()
    spec = {'af': ('VGPU', 8, set()), '3b': TWO['3b']}
    plan = sync.plan(fake, gpu_tree('h', spec))
    assert [(a.kind, a.generation, a.reason) for a in plan.actions] == [
        (sync.TRAITS, 2, "+[] -['CUSTOM_T4_2B']")]
    assert _outcomes(plan.results)[2] == (
        'h_0000:af:00.0', sync.UPDATED, 'traits')


@pytest.mark.parametrize('current,desired,diff', [
    ({}, {'VGPU': {'total': 8}}, '+VGPU 8'),
    ({'PGPU': {'total': 1}}, {}, '-PGPU'),
    ({'VGPU': {'total': 8, 'reserved': 0}},
     {'VGPU': {'total': 8, 'reserved': 8}}, 'VGPU reserved 0 -> 8'),
    ({'VGPU': {'total': 8}, 'PGPU': {'total': 1}},
     {'VGPU': {'total': 8}, 'ZGPU': {'total': 2}}, '-PGPU; +ZGPU 2'),
    ({'A': {'total': 1}}, {'A': {'total': 1, 'step_size': 2}},
     'A step_size None -> 2'),
])
def test_inventory_diff(current, desired, diff):
    assert sync._inventory_diff(current, desired) == diff


def test_a_new_provider_s_writes_say_new():
    plan = sync.plan(FakePlacement(), gpu_tree('h', {'af': TWO['af']}))
    assert [(a.kind, a.name, a.generation, a.reason)
            for a in plan.actions] == [
        (sync.CREATE_TRAIT, 'CUSTOM_T4_2B', None, 'custom trait'),
        (sync.CREATE, 'h', 0, ''),
        (sync.CREATE, 'h_0000:af:00.0', 0, ''),
        (sync.INVENTORIES, 'h_0000:af:00.0', 0, 'new'),
        (sync.TRAITS, 'h_0000:af:00.0', 1, 'new')]


def test_a_gone_gpu_in_use_is_kept_reserved_with_its_consumers():
    fake = _synced()
    fake.allocate(AF, 'c1')
    fake.allocate(AF, 'c2')
    plan = sync.plan(fake, gpu_tree('h', {'3b': TWO['3b']}))
    detail = ('GPU gone; kept with reserved = total for 2 consumer(s): '
              'c1, c2')
    assert _outcomes(plan.results)[2] == (
        'h_0000:af:00.0', sync.KEPT, detail)
    assert [r.uuid for r in plan.results] == [ROOT, B3, AF]
    (keep,) = plan.actions
    assert (keep.kind, keep.uuid, keep.name, keep.generation,
            keep.reason) == (
        sync.INVENTORIES, AF, 'h_0000:af:00.0', 4,
        'reserve all: GPU gone, allocations remain')
    assert keep.inventories == (
        tree_mod.Inventory('VGPU', 8, reserved=8, max_unit=8),)
    assert AF not in [v[0] for v in plan.verified]


def test_a_kept_provider_already_reserved_is_verified_not_written():
    fake = _synced()
    fake.allocate(AF, 'c1')
    sync.sync(fake, gpu_tree('h', {'3b': TWO['3b']}))
    plan = sync.plan(fake, gpu_tree('h', {'3b': TWO['3b']}))
    assert plan.actions == ()
    assert (AF, 4, sync.KEPT) in plan.verified
    assert _outcomes(plan.results)[2] == (
        'h_0000:af:00.0', sync.KEPT,
        'GPU gone; kept with reserved = total for 1 consumer(s): c1')
    assert plan.results[2].uuid == AF


def test_a_kept_provider_verified_earlier_is_not_read_again():
    state = sync.SyncState()
    fake = _synced(state=state)
    fake.allocate(AF, 'c1')
    sync.sync(fake, gpu_tree('h', {'3b': TWO['3b']}), state=state)
    assert state.verified[AF] == (4, sync.KEPT)
    before = fake.stats.copy()
    plan = sync.plan(fake, gpu_tree('h', {'3b': TWO['3b']}), state)
    assert dict((fake.stats - before).by_method) == {'GET': 2}
    assert _outcomes(plan.results)[2] == (
        'h_0000:af:00.0', sync.KEPT,
        'GPU gone; kept with reserved = total for 1 consumer(s): c1')
    assert plan.results[2].uuid == AF


def test_a_gone_gpu_without_allocations_is_deleted_first():
    fake = _synced()
    plan = sync.plan(fake, gpu_tree('h', {'af': TWO['af'],
                                          'd8': ('PGPU', 1, {'CUSTOM_D'})}))
    assert [(a.kind, a.name, a.reason) for a in plan.actions][:2] == [
        (sync.DELETE, 'h_0000:3b:00.0', 'GPU no longer on this host'),
        (sync.CREATE_TRAIT, 'CUSTOM_D', 'custom trait')]
    assert _outcomes(plan.results)[-1] == ('h_0000:3b:00.0', sync.DELETED,
                                           '')


def test_known_traits_are_not_asked_for_without_trait_writes():
    fake = _synced()
    before = fake.stats.copy()
    sync.plan(fake, gpu_tree('h', {'af': ('VGPU', 4, {'CUSTOM_T4_2B'}),
                                   '3b': TWO['3b']}))
    # tree, root inventories + traits, two children's: no trait lookup
    assert (fake.stats - before).total == 7


# -- which providers are ours -----------------------------------------------

@pytest.mark.parametrize('name,uuid,ours', [
    ('h_0000:af:00.0', None, True),
    ('h_0000:af:00.0_nvidia-223', None, True),
    ('h_0000:af:00.0', NOVA, False),
    ('h_pci_0000_af_00_0', 'legacy', True),
    ('h_pci_0000_af_00_0', None, False),
    ('h_gpu', None, False),
    ('hh_0000:af:00.0', None, False),
    ('h0000:af:00.0', None, False),
    ('x_0000:af:00.0', None, False),
])
def test_which_providers_are_ours(name, uuid, ours):
    if uuid is None:
        uuid = tree_mod.provider_uuid(name)
    elif uuid == 'legacy':
        uuid = tree_mod.legacy_provider_uuid(name)
    provider = pc.Provider(uuid=uuid, name=name, generation=0,
                           parent_provider_uuid=ROOT,
                           root_provider_uuid=ROOT)
    assert sync._is_ours(provider, 'h') is ours


# -- the root ---------------------------------------------------------------

def test_a_remembered_nova_root_stays_nested():
    fake = FakePlacement()
    fake.add('h', uuid=NOVA)
    state = sync.SyncState()
    sync.sync(fake, gpu_tree('h', TWO), state=state)
    assert state.root_uuid == NOVA
    report = sync.sync(fake, gpu_tree('h', TWO), state=state)
    assert report.nested and report.parent_uuid == NOVA
    assert report.root_uuid == NOVA
    assert [r.name for r in report.results] == [
        'h_0000:3b:00.0', 'h_0000:af:00.0']


def test_a_nested_tree_is_read_under_the_existing_root():
    fake = FakePlacement()
    fake.add('h', uuid=NOVA)
    sync.sync(fake, gpu_tree('h', TWO))
    report = sync.sync(fake, gpu_tree('h', TWO))
    assert report.requests == [] and report.failed == []
    assert [(r.name, r.outcome) for r in report.results] == [
        ('h_0000:3b:00.0', sync.UNCHANGED),
        ('h_0000:af:00.0', sync.UNCHANGED)]


def test_a_remembered_own_root_is_not_nested():
    state = sync.SyncState()
    fake = _synced(state=state)
    report = sync.sync(fake, gpu_tree('h', TWO), state=state)
    assert [(r.uuid, r.outcome) for r in report.results] == [
        (ROOT, sync.UNCHANGED), (B3, sync.UNCHANGED), (AF, sync.UNCHANGED)]
    assert not report.nested and report.root_uuid == ROOT
    assert report.parent_uuid == ROOT


def test_a_remembered_root_gone_is_forgotten_and_said(caplog):
    state = sync.SyncState()
    fake = FakePlacement()
    fake.add('h', uuid=NOVA)
    sync.sync(fake, gpu_tree('h', TWO), state=state)
    fake.__init__()
    fake.add('h', uuid=NOVA.replace('2', '5'))
    with caplog.at_level(logging.INFO, 'libvirt_gpu'):
        plan = sync.plan(fake, gpu_tree('h', TWO), state)
    assert ('Provider %s is gone from Placement; looking for the root '
            'again' % NOVA) in caplog.text
    assert state.root_uuid is None and state.verified == {}
    assert plan.parent_uuid == NOVA.replace('2', '5') and plan.nested
    assert ('Nesting the GPU providers of h under the existing provider %s'
            % NOVA.replace('2', '5')) in caplog.text


def test_an_own_root_is_found_before_a_provider_of_that_name():
    fake = _synced()
    before = fake.stats.copy()
    plan = sync.plan(fake, gpu_tree('h', TWO))
    assert not plan.nested and plan.root_uuid == ROOT
    # no lookup by name: the tree, then each provider's inventories+traits
    assert (fake.stats - before).total == 7


def test_without_nesting_a_missing_root_is_created():
    fake = FakePlacement()
    plan = sync.plan(fake, gpu_tree('h', {}), nest=False)
    assert fake.stats.total == 1             # no lookup by name
    assert [(a.kind, a.name) for a in plan.actions] == [(sync.CREATE, 'h')]
    assert (plan.root_uuid, plan.parent_uuid, plan.nested) == (
        ROOT, ROOT, False)


def test_the_nested_tree_of_a_grandchild_root():
    # the provider named like the host is itself a child (a Nova tree):
    # the report gives the tree's root, the GPUs hang under the named one
    fake = FakePlacement()
    top = fake.add('region', uuid='6' * 8 + '-6666-6666-6666-' + '6' * 12)
    fake.add('h', uuid=NOVA, parent=top)
    plan = sync.plan(fake, gpu_tree('h', TWO))
    assert (plan.root_uuid, plan.parent_uuid, plan.nested) == (
        top, NOVA, True)
    fake2 = FakePlacement()
    top2 = fake2.add('region', uuid=top)
    fake2.add('h', uuid=ROOT, parent=top2)
    plan = sync.plan(fake2, gpu_tree('h', TWO))
    assert (plan.root_uuid, plan.parent_uuid, plan.nested) == (
        top, ROOT, False)


# -- apply ------------------------------------------------------------------

class Refusing(FakePlacement):
    """Refuses the writes named in ``refuse``: {(kind, uuid): error}."""

    def __init__(self):
        super().__init__()
        self.refuse = {}

    def set_traits(self, uuid, generation, traits):
        if ('traits', uuid) in self.refuse:
            self._count('PUT')
            raise self.refuse['traits', uuid]
        return super().set_traits(uuid, generation, traits)

    def create_provider(self, name, uuid, parent_uuid=None):
        if ('create', uuid) in self.refuse:
            self._count('POST')
            raise self.refuse['create', uuid]
        return super().create_provider(name, uuid, parent_uuid)


def test_the_children_of_a_root_not_created_fail_with_it():
    fake = Refusing()
    fake.refuse['create', ROOT] = pc.ProviderConflict(
        name='h', uuid=ROOT, detail='dup')
    report = sync.sync(fake, gpu_tree('h', TWO))
    assert [(r.name, r.uuid, r.outcome, r.detail)
            for r in report.results][1:] == [
        ('h_0000:3b:00.0', B3, sync.FAILED,
         'not created: its parent h could not be created'),
        ('h_0000:af:00.0', AF, sync.FAILED,
         'not created: its parent h could not be created')]
    assert fake.providers == {}


def test_a_trait_write_refused_fails_that_provider_and_forgets_it():
    state = sync.SyncState()
    fake = Refusing()
    sync.sync(fake, gpu_tree('h', TWO), state=state)
    fake.refuse['traits', AF] = pc.TraitNotFound(traits='CUSTOM_X',
                                                 detail='no')
    spec = {'af': ('VGPU', 4, {'CUSTOM_X'}), '3b': ('PGPU', 1, set())}
    report = sync.sync(fake, gpu_tree('h', spec), state=state)
    assert [(r.name, r.outcome) for r in report.results] == [
        ('h', sync.UNCHANGED), ('h_0000:3b:00.0', sync.UPDATED),
        ('h_0000:af:00.0', sync.FAILED)]
    assert report.failed[0].detail.startswith(
        'Placement does not know trait(s) in CUSTOM_X')
    assert AF not in state.verified and B3 in state.verified
    assert fake.inventories[AF]['VGPU'].total == 4
    # the next sync reads it again and writes the traits
    fake.refuse.clear()
    again = sync.sync(fake, gpu_tree('h', spec), state=state)
    assert _verbs(again) == [('PUT', '/resource_providers/%s/traits' % AF)]


def test_a_create_refused_fails_the_provider_and_skips_its_writes(
        caplog):
    fake = Refusing()
    refused = pc.ProviderConflict(name='h_0000:af:00.0', uuid=AF,
                                  detail='dup')
    fake.refuse['create', AF] = refused
    with caplog.at_level(logging.INFO, 'libvirt_gpu'):
        report = sync.sync(fake, gpu_tree('h', TWO))
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.getMessage() for r in errors] == [str(refused)]
    assert [(r.name, r.outcome) for r in report.results] == [
        ('h', sync.CREATED), ('h_0000:3b:00.0', sync.CREATED),
        ('h_0000:af:00.0', sync.FAILED)]
    assert AF not in fake.providers
    # its inventories and traits were never sent
    assert [r.url for r in report.requests if AF in r.url] == []
    assert report.requests[-1].method == 'POST'


def test_apply_carries_each_write_s_generation_and_remembers_it():
    fake = _synced()
    fake.bump(AF)
    spec = {'af': ('VGPU', 4, {'CUSTOM_T4_2B', 'CUSTOM_Y'}),
            '3b': TWO['3b']}
    plan = sync.plan(fake, gpu_tree('h', spec))
    state = sync.SyncState()
    applier = sync._Applier(fake, gpu_tree('h', spec), plan, state)
    applier.run()
    gens = [r.body['resource_provider_generation'] for r in applier.sent
            if r.body and 'resource_provider_generation' in r.body]
    assert gens == [3, 4]
    assert fake.providers[AF]['generation'] == 5
    applier.remember()
    assert state.verified[AF] == (5, gpu_tree('h', spec).children[1])


def test_a_renamed_provider_is_named_back_then_written():
    state = sync.SyncState()
    fake = _synced(state=state)
    fake.providers[AF]['name'] = 'other'
    fake.bump(AF)
    spec = {'af': ('VGPU', 8, set()), '3b': TWO['3b']}
    report = sync.sync(fake, gpu_tree('h', spec), state=state)
    assert fake.providers[AF]['name'] == 'h_0000:af:00.0'
    assert fake.traits[AF] == {'OWNER_CYBORG'}
    assert _verbs(report) == [
        ('PUT', '/resource_providers/%s' % AF),
        ('PUT', '/resource_providers/%s/traits' % AF)]
    assert state.verified[AF] == (4, gpu_tree('h', spec).children[1])


class Intruded(FakePlacement):
    """Another writer bumps a provider just before our inventory write;
    the client re-reads the generation and retries (as PlacementClient
    does), so the write returns a generation two above the planned one."""

    intrude = False

    def set_inventories(self, uuid, generation, inventories):
        if self.intrude:
            self.bump(uuid)
            generation += 1
        return super().set_inventories(uuid, generation, inventories)


def test_a_write_after_a_retried_one_carries_the_real_generation():
    fake = Intruded()
    state = sync.SyncState()
    sync.sync(fake, gpu_tree('h', {'af': TWO['af']}), state=state)
    assert AF in state.verified
    fake.intrude = True
    spec = {'af': ('VGPU', 4, {'CUSTOM_T4_2B', 'CUSTOM_Y'})}
    report = sync.sync(fake, gpu_tree('h', spec), state=state)
    assert [r.body['resource_provider_generation']
            for r in report.requests if r.body] == [2, 4]
    assert fake.traits[AF] == {'OWNER_CYBORG', 'CUSTOM_T4_2B', 'CUSTOM_Y'}
    # written over another writer: read again next time
    assert AF not in state.verified


def test_remember_keeps_what_was_verified_and_written():
    state = sync.SyncState()
    fake = _synced(state=state)
    spec = {'af': ('VGPU', 4, {'CUSTOM_T4_2B'})}
    sync.sync(fake, gpu_tree('h', spec), state=state)
    desired = gpu_tree('h', spec).children[0]
    assert state.verified == {ROOT: (0, gpu_tree('h', spec).root),
                              AF: (3, desired)}
    assert state.root_uuid == ROOT


def test_a_first_sync_with_a_state_remembers_what_it_read():
    fake = _synced()
    state = sync.SyncState()
    sync.sync(fake, gpu_tree('h', TWO), state=state)
    found = gpu_tree('h', TWO)
    assert state.verified == {ROOT: (0, found.root),
                              B3: (2, found.children[0]),
                              AF: (2, found.children[1])}


def test_remember_keeps_a_provider_kept_instead_of_deleted(caplog):
    state = sync.SyncState()
    fake = _synced(state=state)
    fake.refuse_delete.add(B3)
    with caplog.at_level(logging.INFO, 'libvirt_gpu'):
        report = sync.sync(fake, gpu_tree('h', {'af': TWO['af']}),
                           state=state)
    assert caplog.records[0].getMessage() == (
        'Provider h_0000:3b:00.0 gained allocations; keeping it')
    assert report.results[2] == sync.ProviderResult(
        'h_0000:3b:00.0', B3, sync.KEPT,
        'GPU gone; allocations appeared while deleting: reserved = total')
    assert state.verified[B3] == (3, sync.KEPT)
    assert fake.inventories[B3]['PGPU'].reserved == 1
    fake.refuse_delete.clear()
    fake.allocations[B3]['c'] = {'PGPU': 1}
    before = fake.stats.copy()
    report = sync.sync(fake, gpu_tree('h', {'af': TWO['af']}), state=state)
    assert (fake.stats - before).total == 2 and not report.requests


def test_a_deleted_provider_is_forgotten():
    state = sync.SyncState()
    fake = _synced(state=state)
    assert B3 in state.verified
    sync.sync(fake, gpu_tree('h', {'af': TWO['af']}), state=state)
    assert B3 not in state.verified and AF in state.verified


def test_a_sync_report_counts_only_its_own_requests(caplog):
    fake = _synced()
    start = time.monotonic()
    with caplog.at_level(logging.INFO, 'libvirt_gpu'):
        report = sync.sync(fake, gpu_tree('h', TWO))
    took = time.monotonic() - start
    assert 0 <= report.duration_s <= took
    assert [r.getMessage() for r in caplog.records] == [report.summary()]
    assert report.stats.total == 7 and report.stats.writes == 0
    assert not report.changed and report.requests == []
    assert report.host == 'h' and not report.dry_run
    assert report.duration_s >= 0


# -- cyborg_objects: the fields of Cyborg's driver objects -----------------

def _type(type_id='nvidia-223'):
    return objects.EnabledType(objects.TypeId.parse(type_id))


def _addr(text):
    return objects.PciAddress.parse(text)


def test_pci_and_mdev_info_write_every_part_of_the_address():
    address = _addr('00ab:3b:1f.7')
    assert cyborg_objects.pci_info(address) == (
        '{"bus": "3b", "device": "1f", "domain": "00ab", "function": "7"}')
    assert cyborg_objects.mdev_info(address, 'nvidia-223', 12) == (
        '{"asked_type": "nvidia-223", "bus": "3b", "device": "1f", '
        '"domain": "00ab", "function": "7", "vgpu_mark": "nvidia-223_12"}')


@pytest.mark.parametrize('given,ordered', [
    ({'HW_X', 'CUSTOM_B', 'OWNER_CYBORG', 'CUSTOM_A', 'A_Y'},
     ['OWNER_CYBORG', 'CUSTOM_A', 'CUSTOM_B', 'A_Y', 'HW_X']),
    ({'HW_X', 'CUSTOM_B'}, ['CUSTOM_B', 'HW_X']),
    (set(), []),
])
def test_ordered_traits(given, ordered):
    assert cyborg_objects.ordered_traits(frozenset(given)) == ordered


@pytest.mark.parametrize('vendor,product,name', [
    ('NVIDIA Corporation', 'TU104GL [Tesla T4]',
     'NVIDIA Corporation TU104GL [Tesla T4]'),
    ('NVIDIA Corporation', None, 'NVIDIA Corporation Device'),
    (None, 'TU104GL', 'TU104GL'),
    (None, None, 'Device'),
])
def test_model_name(vendor, product, name):
    gpu = records.replace(fakes.gpu(), vendor_name=vendor,
                          product_name=product)
    assert cyborg_objects.model_name(gpu) == name


@pytest.mark.parametrize('class_code,name', [
    ('0x030000', 'VGA compatible controller'),
    ('0x030100', 'XGA compatible controller'),
    ('0x030200', '3D controller'),
    ('0x0302A0', '3D controller'),
    ('0x038000', 'Display controller'),
    ('0x030900', 'Display controller'),
])
def test_controller(class_code, name):
    gpu = records.replace(fakes.gpu(), class_code=class_code)
    assert cyborg_objects.controller(gpu) == name


def _with_vfs(vfs, types=()):
    pf = fakes.gpu('0000:3d:00.0', types=types)
    made = tuple(records.replace(
        fakes.gpu(address, types=vf_types, mdevs=mdevs),
        physfn=pf.address) for address, vf_types, mdevs in vfs)
    return records.replace(pf, vf_gpus=made,
                           virtfns=tuple(v.address for v in made))


def _mdev(type_id):
    return objects.Mdev(str(uuidlib.uuid4()), objects.TypeId.parse(type_id))


def test_mdev_parents_on_vfs_used_ones_of_the_type_then_free_ones():
    other = fakes.t4_type(225, '1A', 1, 60, 1024, '1280x1024')
    gpu = _with_vfs([
        ('0000:3d:00.7', (fakes.T4_2B,), ()),
        ('0000:3d:00.5', (fakes.T4_2B,), (_mdev('nvidia-223'),)),
        ('0000:3d:00.6', (fakes.T4_2B,), (_mdev('nvidia-225'),)),
        ('0000:3d:00.4', (other,), ()),
        ('0000:3d:01.0', (fakes.T4_2B,), ()),
    ])
    t = objects.TypeId.parse('nvidia-223')
    assert [str(a) for a in cyborg_objects.mdev_parents(gpu, t, 9)] == [
        '0000:3d:00.5', '0000:3d:00.7', '0000:3d:01.0']
    assert [str(a) for a in cyborg_objects.mdev_parents(gpu, t, 2)] == [
        '0000:3d:00.5', '0000:3d:00.7']
    assert cyborg_objects.mdev_parents(gpu, t, 0) == []
    plain = fakes.gpu()
    assert cyborg_objects.mdev_parents(plain, t, 3) == [plain.address] * 3


def test_reported_gpus():
    gpu = fakes.gpu()
    amd = records.replace(gpu, vendor_id='1002')
    vf = records.replace(gpu, physfn=_addr('0000:af:00.0'))
    assert cyborg_objects.reported(gpu, None)
    assert not cyborg_objects.reported(amd, None)
    assert cyborg_objects.reported(amd, _type())
    assert cyborg_objects.reported(amd, None, pgpu_vendors=('1002',))
    assert not cyborg_objects.reported(vf, _type())
    assert not cyborg_objects.reported(vf, None)


def test_withheld_says_why():
    gpu = fakes.gpu()
    assert cyborg_objects.withheld(gpu, None) is None
    assert cyborg_objects.withheld(gpu, _type()) is None
    no_group = records.replace(gpu, iommu_group=None)
    assert cyborg_objects.withheld(no_group, None) == (
        'not offered whole: %s' % model.NO_IOMMU_GROUP)
    busy = records.replace(gpu, mdevs=(_mdev('nvidia-223'),))
    assert cyborg_objects.withheld(busy, None) == (
        'not offered whole: it holds vGPUs now (Cyborg could not reserve '
        'it)')
    full = records.replace(gpu, mdev_types=(records.replace(
        fakes.T4_2B, available_instances=0),))
    assert cyborg_objects.withheld(full, _type()) == (
        'vGPU type nvidia-223: no room left')
    # one room left: offered
    room = records.replace(gpu, mdev_types=(records.replace(
        fakes.T4_2B, available_instances=1),))
    assert cyborg_objects.withheld(room, _type()) is None


def test_vendor_interface_refusal():
    t = objects.VgpuType('nvidia-1145', 'NVIDIA L40S-1B', None, 'vfio-pci',
                         1)
    vf = records.replace(fakes.gpu('0000:3d:00.4', types=()),
                         physfn=_addr('0000:3d:00.0'),
                         vendor_vf=objects.VendorVf(creatable=(t,)))
    pf = records.replace(fakes.gpu('0000:3d:00.0', types=()),
                         vf_gpus=(vf,), virtfns=(vf.address,))
    setting = _type('nvidia-1145')
    why = cyborg_objects.vendor_interface_refusal(pf, setting)
    assert why == (
        'vGPU type nvidia-1145 is made through the nvidia vendor interface '
        'of the GPU\'s SR-IOV VFs (NVIDIA\'s is vGPU 17+): Cyborg binds '
        'vGPUs only as mdevs, and Nova would pass a VF from Cyborg with '
        'managed=yes, taking it from the vendor\'s driver; the GPU is '
        'reported to Cyborg with nothing to offer (give its VFs to Nova '
        'as PCI devices with "managed": "no", or use libvirt-gpu agent)')
    assert cyborg_objects.withheld(pf, setting) == why
    assert cyborg_objects.vendor_interface_refusal(pf, None) is None
    assert cyborg_objects.vendor_interface_refusal(
        fakes.gpu(), _type()) is None
    bare = fakes.gpu(types=())
    assert bare.vgpu_interface is None
    assert cyborg_objects.vendor_interface_refusal(bare, _type()) is None


def test_a_whole_gpu_s_deployable():
    gpu = records.replace(fakes.gpu('0000:3b:00.0'), vendor_name='NVIDIA',
                          product_name='T4')
    (device,) = cyborg_objects.driver_devices('h', [gpu], {})
    assert cyborg_objects.to_primitive(device) == {
        'vendor': '10de', 'model': 'NVIDIA T4', 'type': 'GPU',
        'std_board_info': '{"product_id": "1eb8", "controller": '
                          '"3D controller"}',
        'vendor_board_info': '{"vendor_info": "gpu_vb_info"}',
        'controlpath_id': {
            'cpid_type': 'PCI',
            'cpid_info': cyborg_objects.pci_info(gpu.address)},
        'deployable_list': [{
            'name': 'h_0000:3b:00.0', 'num_accelerators': 1,
            'attribute_list': [
                {'key': 'rc', 'value': 'PGPU'},
                {'key': 'trait0', 'value': 'OWNER_CYBORG'},
                {'key': 'trait1', 'value': 'CUSTOM_NVIDIA_1EB8'}],
            'attach_handle_list': [{
                'attach_type': 'PCI',
                'attach_info': cyborg_objects.pci_info(gpu.address),
                'in_use': False}],
            'driver_name': 'NVIDIA'}],
        'stub': False}


def test_a_vgpu_deployable_with_and_without_display_traits():
    gpu = fakes.gpu()
    enabled = {gpu.address: records.replace(_type(), resource_class='VGPU',
                                            max_instances=2)}
    (device,) = cyborg_objects.driver_devices('h', [gpu], enabled)
    (dep,) = device.deployable_list
    assert dep.num_accelerators == 2
    assert [(a.key, a.value) for a in dep.attribute_list] == [
        ('rc', 'VGPU'), ('trait0', 'OWNER_CYBORG'),
        ('trait1', 'CUSTOM_NVIDIA_1EB8_T4_2B'),
        ('trait2', 'HW_GPU_MAX_DISPLAY_HEADS_4')]
    assert [h.attach_info for h in dep.attach_handle_list] == [
        cyborg_objects.mdev_info(gpu.address, 'nvidia-223', i)
        for i in (0, 1)]
    assert {h.attach_type for h in dep.attach_handle_list} == {'MDEV'}
    (plain,) = cyborg_objects.driver_devices('h', [gpu], enabled,
                                             gpu_traits=False)
    assert [a.value for a in plain.deployable_list[0].attribute_list] == [
        'VGPU', 'OWNER_CYBORG', 'CUSTOM_NVIDIA_1EB8_T4_2B']


def test_driver_name_of_another_vendor():
    amd = records.replace(fakes.gpu(), vendor_id='1002')
    other = records.replace(fakes.gpu('0000:3b:00.0'), vendor_id='1af4')
    devices = cyborg_objects.driver_devices(
        'h', [amd, other], {}, pgpu_vendors=('1002', '1af4'))
    assert [d.deployable_list[0].driver_name for d in devices] == [
        '1af4', 'AMD']


def test_driver_devices_by_address_reported_only():
    a, b = fakes.gpu('0000:af:00.0'), fakes.gpu('0000:3b:00.0')
    amd = records.replace(fakes.gpu('0000:5e:00.0'), vendor_id='1002')
    devices = cyborg_objects.driver_devices('h', [a, amd, b], {})
    assert [d.controlpath_id.cpid_info for d in devices] == [
        cyborg_objects.pci_info(b.address),
        cyborg_objects.pci_info(a.address)]


def test_withheld_gpus_names_the_reported_ones_without_deployable():
    busy = fakes.gpu('0000:af:00.0', mdevs=(_mdev('nvidia-223'),))
    free = fakes.gpu('0000:3b:00.0')
    amd = records.replace(fakes.gpu('0000:5e:00.0', mdevs=(
        _mdev('nvidia-223'),)), vendor_id='1002')
    found = cyborg_objects.withheld_gpus([busy, amd, free], {})
    assert list(found) == [busy.address]
    assert found[busy.address].startswith('not offered whole: it holds')
    assert cyborg_objects.withheld_gpus(
        [busy, free], {busy.address: _type()}) == {}


class GpuOptions:
    report_gpu_traits = False
    pgpu_vendor_ids = ('10de',)


def test_host_devices_withholds_carved_gpus_and_says_why():
    a, b = fakes.gpu('0000:af:00.0'), fakes.gpu('0000:3b:00.0')
    vf = records.replace(fakes.gpu('0000:5e:00.4'),
                         physfn=_addr('0000:5e:00.0'))
    busy = fakes.gpu('0000:d8:00.0', mdevs=(_mdev('nvidia-223'),))
    devices, why = cyborg_objects.host_devices(
        'h', [a, busy, vf, b], {a.address: _type()}, GpuOptions,
        carved=frozenset({b.address, vf.address}))
    assert [(d.controlpath_id.cpid_info, len(d.deployable_list))
            for d in devices] == [
        (cyborg_objects.pci_info(b.address), 0),
        (cyborg_objects.pci_info(a.address), 1),
        (cyborg_objects.pci_info(busy.address), 0)]
    assert list(why) == [b.address, busy.address]
    assert why[b.address] == cyborg_objects.CARVED == (
        'carved for Nova ([nova]/carved): its VFs and the capacity they '
        'use are Nova\'s PCI devices')
    # [gpu] options reach the objects: display traits, vendors

    class Traits(GpuOptions):
        report_gpu_traits = True
        pgpu_vendor_ids = ()
    devices, why = cyborg_objects.host_devices(
        'h', [a, busy, b], {a.address: _type()}, Traits)
    assert [d.controlpath_id.cpid_info for d in devices] == [
        cyborg_objects.pci_info(a.address)]
    assert 'HW_GPU_MAX_DISPLAY_HEADS_4' in [
        x.value for x in devices[0].deployable_list[0].attribute_list]
    assert why == {}


def test_to_primitive_of_plain_values_and_tuples():
    assert cyborg_objects.to_primitive(3) == 3
    assert cyborg_objects.to_primitive(('a', ('b',))) == ['a', ['b']]
    handle = cyborg_objects.DriverAttachHandle('PCI', '{}')
    assert cyborg_objects.to_primitive((handle,)) == [
        {'attach_type': 'PCI', 'attach_info': '{}', 'in_use': False}]


# -- cyborg_driver: the guards before a report -----------------------------

@pytest.mark.parametrize('uri,why', [
    ('test:///default', "[libvirt]/connection_uri = test:///default is "
     "libvirt's built-in test host, not this one: set qemu:///system"),
    ('test:', "[libvirt]/connection_uri = test: is libvirt's built-in test "
     "host, not this one: set qemu:///system"),
    ('qemu+ssh:///system', '[libvirt]/connection_uri = qemu+ssh:///system '
     'names another host: Cyborg reports the GPUs of the host it runs on; '
     'set qemu:///system'),
    ('qemu://[::1/system', "[libvirt]/connection_uri 'qemu://[::1/system' "
     "is not a URI (Invalid IPv6 URL)"),
    ('test:///var/lib/node.xml', None),
    ('qemu+unix:///system', None),
])
def test_uri_refusal_texts(uri, why):
    assert cyborg_driver.uri_refusal(uri) == why


def _conf(tmp_path, *lines):
    path = tmp_path / 'libvirt-gpu.conf'
    path.write_text('\n'.join(('[DEFAULT]', 'sysfs_root = %s' % tmp_path,
                               '[gpu]', 'nvml = off') + lines) + '\n')
    return conf_mod.load(str(path))


def _vanished(address, **changes):
    return records.replace(fakes.gpu(address, types=()), **changes)


def test_unreadable_vgpu_gpus_names_each_gpu_without_types(tmp_path):
    conf = _conf(tmp_path, 'enabled_vgpu_types = nvidia-223',
                 'pgpu_vendor_ids = 10de, 1002')
    gone = _vanished('0000:af:00.0')
    amd = _vanished('0000:5e:00.0', vendor_id='1002', driver=None)
    found = cyborg_driver.unreadable_vgpu_gpus(
        [gone, amd, fakes.gpu('0000:3b:00.0'),
         _vanished('0000:86:00.0', driver='vfio-pci'),
         _vanished('0000:87:00.0', vendor_id='1af4'),
         _vanished('0000:88:00.4', physfn=_addr('0000:88:00.0')),
         _vanished('0000:d8:00.0')],
        {_addr('0000:d8:00.0'): _type()}, conf)
    assert list(found) == [amd.address, gone.address]
    assert found[gone.address] == (
        'GPU 0000:af:00.0 lists no vGPU type now (driver nvidia), while '
        '[gpu]/enabled_vgpu_types = nvidia-223 enables it on every GPU '
        'that offers it: its types could not be read (is its driver '
        'reloading, or are its SR-IOV VFs not enabled yet?), and it would '
        'be offered whole (PGPU) instead; if it is meant to go whole to '
        'guests, bind it to vfio-pci or name the vGPU GPUs in '
        '[vgpu_nvidia-223]/device_addresses')
    assert '(driver none)' in found[amd.address]


def test_unreadable_vgpu_gpu_of_a_vendor_not_offered_whole(tmp_path):
    conf = _conf(tmp_path, 'enabled_vgpu_types = nvidia-223',
                 'pgpu_vendor_ids =')
    gone = _vanished('0000:af:00.0')
    found = cyborg_driver.unreadable_vgpu_gpus([gone], {}, conf)
    assert 'it would be left out of the report (Cyborg would delete it);' \
        in found[gone.address]


@pytest.mark.parametrize('lines', [
    (),
    ('enabled_vgpu_types = nvidia-223, nvidia-222',),
    ('enabled_vgpu_types = nvidia-223', '[vgpu_nvidia-223]',
     'device_addresses = 0000:af:00.0'),
])
def test_unreadable_vgpu_gpus_only_for_one_type_on_every_gpu(tmp_path,
                                                             lines):
    conf = _conf(tmp_path, *lines)
    assert cyborg_driver.unreadable_vgpu_gpus(
        [_vanished('0000:af:00.0')], {}, conf) == {}


class Env:
    """What report_refusal reads of an ``environment.Environment``."""

    def __init__(self, gpus, source=None, enabled=None):
        self.discovered = type('Discovered', (), {'gpus': tuple(gpus)})
        self.source = source
        self.sysfs_root = '/srv/sys'
        self.enabled = enabled or {}


def test_report_refusal_of_a_host_without_gpus_names_where_it_read(
        tmp_path):
    conf = _conf(tmp_path)
    why = cyborg_driver.report_refusal(conf, Env(()))
    assert why == (
        'no GPU (PCI display controller) is visible on this host (read '
        'from sysfs at /srv/sys, [DEFAULT]/sysfs_root = /srv/sys): is this '
        'the host\'s own sysfs, with its bus/pci/devices? Cyborg would '
        'delete every device of the host; if the host really has no GPU '
        'any more, remove libvirt_gpu_driver from cyborg.conf\'s '
        '[agent]/enabled_drivers')
    source = environment.Source(uri='qemu:///system')
    assert '(read from libvirt at qemu:///system, [DEFAULT]/sysfs_root' in \
        cyborg_driver.report_refusal(conf, Env((), source))
    assert cyborg_driver.report_refusal(conf, Env([fakes.gpu()])) is None


def test_report_refusal_joins_every_unreadable_gpu(tmp_path):
    conf = _conf(tmp_path, 'enabled_vgpu_types = nvidia-223')
    why = cyborg_driver.report_refusal(conf, Env(
        [_vanished('0000:af:00.0'), _vanished('0000:3b:00.0')]))
    first, second = why.split('; if it is meant')[:2]
    assert first.startswith('GPU 0000:3b:00.0 lists no vGPU type now')
    assert 'devices_addresses' not in why
    assert '/device_addresses; GPU 0000:af:00.0 lists' in why


def test_report_refused_says_cyborg_keeps_its_devices():
    assert str(cyborg_driver.ReportRefused(reason='why')) == (
        'libvirt_gpu_driver refuses to report, so that Cyborg keeps the '
        'devices it has: why')


def test_withheld_gpus_are_logged_warning_only_where_a_type_is_enabled(
        tmp_path, caplog):
    from tests.unit.openstack import test_cyborg_driver_report_guards as guards
    path = guards.host_conf(tmp_path)
    # the file named in the environment handed in
    with caplog.at_level(logging.INFO, 'libvirt_gpu'):
        devices = cyborg_driver.discover_records(
            'host-1', environ={conffile.CONFIG_ENV: path})
    assert [d.deployable_list[0].name for d in devices
            if d.deployable_list] == ['host-1_0000:3b:00.0']
    assert len(devices) == 2
    (record,) = [r for r in caplog.records
                 if 'nothing to offer' in r.getMessage()]
    assert record.levelno == logging.INFO
    assert record.getMessage() == (
        '0000:af:00.0: reported to Cyborg with nothing to offer: not '
        'offered whole: it holds vGPUs now (Cyborg could not reserve it)')
    caplog.clear()
    # af:00.0 holds T4-2B vGPUs: no room for a T4-1B beside them
    full = guards.host_conf(tmp_path / 'full', gpu_lines=[
        'enabled_vgpu_types = nvidia-222'], sections=[
        '[vgpu_nvidia-222]', 'device_addresses = 0000:af:00.0'])
    with caplog.at_level(logging.INFO, 'libvirt_gpu'):
        cyborg_driver.discover_records('host-1', full)
    (record,) = [r for r in caplog.records
                 if 'nothing to offer' in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert record.getMessage().endswith('vGPU type nvidia-222: no room left')


class CyborgConf:
    class gpu_devices:
        enabled_vgpu_types = []
        filter_sriov_vfs = False


def test_ignored_cyborg_options():
    assert cyborg_driver.ignored_cyborg_options(object()) == []
    assert cyborg_driver.ignored_cyborg_options(CyborgConf) == []

    class Set(CyborgConf):
        class gpu_devices:
            enabled_vgpu_types = ['nvidia-223']
            filter_sriov_vfs = True
    assert cyborg_driver.ignored_cyborg_options(Set) == [
        '[gpu_devices]/enabled_vgpu_types',
        '[gpu_devices]/filter_sriov_vfs']

    class Filter(CyborgConf):
        class gpu_devices:
            enabled_vgpu_types = []
            filter_sriov_vfs = True
    assert cyborg_driver.ignored_cyborg_options(Filter) == [
        '[gpu_devices]/filter_sriov_vfs']


def test_only_the_driver_class_is_built_on_access():
    with pytest.raises(AttributeError) as e:
        cyborg_driver.NoSuchThing
    assert str(e.value) == ("module 'libvirt_gpu.openstack.cyborg_driver' "
                            "has no attribute 'NoSuchThing'")


# -- tree, traits, model: the records and names of the provider tree -------

def test_provider_uuids_of_a_name():
    assert tree_mod.provider_uuid('h') == str(
        uuidlib.uuid3(uuidlib.NAMESPACE_DNS, 'h'))
    assert tree_mod.legacy_provider_uuid('h') == str(uuidlib.uuid5(
        uuidlib.UUID('2f5b6a4e-8f57-4b4e-9c53-3f1a7c0e6d21'), 'h'))


@pytest.mark.parametrize('kwargs,why', [
    ({'total': 0}, 'Placement refuses an inventory of total 0'),
    ({'total': -1}, 'Placement refuses an inventory of total -1'),
    ({'total': 2, 'reserved': 3}, 'reserved 3 outside 0..2'),
    ({'total': 2, 'reserved': -1}, 'reserved -1 outside 0..2'),
])
def test_an_inventory_placement_refuses_is_refused(kwargs, why):
    with pytest.raises(ValueError) as e:
        tree_mod.Inventory('VGPU', **kwargs)
    assert str(e.value) == why


def test_the_smallest_and_fully_reserved_inventories_are_fine():
    assert tree_mod.Inventory('PGPU', 1).to_api() == {
        'total': 1, 'reserved': 0, 'min_unit': 1, 'max_unit': 1,
        'step_size': 1, 'allocation_ratio': 1.0}
    assert tree_mod.Inventory('VGPU', 4, reserved=4, min_unit=2,
                              max_unit=2, step_size=2,
                              allocation_ratio=1.5).to_api() == {
        'total': 4, 'reserved': 4, 'min_unit': 2, 'max_unit': 2,
        'step_size': 2, 'allocation_ratio': 1.5}


def test_a_tree_as_a_dict():
    found = gpu_tree('h', {'af': TWO['af']})
    assert found.providers == (found.root,) + found.children
    assert found.to_dict() == {'resource_providers': [
        {'name': 'h', 'uuid': ROOT, 'parent_provider_uuid': None,
         'inventories': {}, 'traits': []},
        {'name': 'h_0000:af:00.0', 'uuid': AF, 'parent_provider_uuid': ROOT,
         'inventories': {'VGPU': tree_mod.Inventory('VGPU', 8).to_api()},
         'traits': ['CUSTOM_T4_2B', 'OWNER_CYBORG']}]}
    assert tree_mod.ProviderTree(found.root).providers == (found.root,)


def _vtype(name, type_id='nvidia-223', description=None):
    return objects.VgpuType(type_id, name, description, 'vfio-pci', 1)


@pytest.mark.parametrize('name,word', [
    ('GRID T4-2B', 'T4-2B'),
    ('grid T4-2B', 'T4-2B'),
    ('NVIDIA  L40S-1B ', 'L40S-1B'),
    ('Quadro RTX-1Q', 'Quadro RTX-1Q'),
    ('NVIDIA', 'NVIDIA'),
    ('NVIDIA ', 'NVIDIA'),
    ('GRID   ', 'GRID'),
    ('  ', 'nvidia-223'),
    (None, 'nvidia-223'),
])
def test_vgpu_type_word(name, word):
    assert traits_mod.vgpu_type_word(_vtype(name)) == word


def test_custom_traits_are_capped_at_255():
    assert traits_mod.custom('NVIDIA', '1eb8', 'T4-2B') == \
        'CUSTOM_NVIDIA_1EB8_T4_2B'
    long = traits_mod.custom('A' * 300)
    assert long == ('CUSTOM_' + 'A' * 300)[:255]
    assert len(traits_mod.custom('A' * 248)) == 255


@pytest.mark.parametrize('vendor,word', [
    ('10de', 'NVIDIA'), ('1002', 'AMD'), ('8086', 'INTEL'), ('1af4', '1af4')])
def test_vendor_word(vendor, word):
    assert traits_mod.vendor_word(vendor) == word


def test_pgpu_traits_of_another_vendor():
    amd = records.replace(fakes.gpu(), vendor_id='1002', product_id='74a1')
    assert traits_mod.pgpu_traits(amd) == {'OWNER_CYBORG',
                                           'CUSTOM_AMD_74A1'}


@pytest.mark.parametrize('description,found', [
    ('num_heads=2, max_resolution=1280x1024',
     {'HW_GPU_MAX_DISPLAY_HEADS_2', 'HW_GPU_RESOLUTION_W1280H1024'}),
    ('num_heads=x2, max_resolution=1280x', set()),
    ('num_heads=, max_resolution=x1024', set()),
    ('num_heads=0004, max_resolution=01280x01024',
     {'HW_GPU_MAX_DISPLAY_HEADS_4', 'HW_GPU_RESOLUTION_W1280H1024'}),
    ('num_heads=99', set()),
    (None, set()),
])
def test_description_traits(description, found):
    assert traits_mod.description_traits(
        _vtype('x', description=description)) == found


def test_vgpu_traits_of_another_vendor():
    amd = records.replace(fakes.gpu(), vendor_id='1002', product_id='74a1')
    assert traits_mod.vgpu_traits(amd, _vtype(
        'MxGPU 4', description='num_heads=1')) == {
        'OWNER_CYBORG', 'CUSTOM_AMD_74A1_MXGPU_4',
        'HW_GPU_MAX_DISPLAY_HEADS_1'}


@pytest.mark.parametrize('name,address', [
    ('h_0000:af:00.0', '0000:af:00.0'),
    ('h_0000:af:00.0_nvidia-223', '0000:af:00.0'),
    ('h_0000:af:00.0_', None),
    ('h_0000:af:00.0_bad type', None),
    ('h_0000:zz:00.0', None),
    ('hx_0000:af:00.0', None),
    ('h0000:af:00.0', None),
    ('g_0000:af:00.0', None),
])
def test_gpu_provider_address(name, address):
    got = model.gpu_provider_address('h', name)
    assert (None if got is None else str(got)) == address


def test_provider_names():
    assert model.gpu_provider_name('c1', _addr('0000:af:00.0')) == \
        'c1_0000:af:00.0'
    assert model.type_provider_name('c1', _addr('0000:af:00.0'),
                                    'nvidia-1155') == \
        'c1_0000:af:00.0_nvidia-1155'
    assert model.nova_pci_provider_name('c1', _addr('0000:af:00.0')) == \
        'c1_0000:AF:00.0'


def test_holds_vgpus_counts_the_vfs_too():
    gpu = _with_vfs([('0000:3d:00.4', (fakes.T4_2B,), ())])
    assert not model.holds_vgpus(gpu)
    busy = _with_vfs([('0000:3d:00.4', (fakes.T4_2B,),
                       (_mdev('nvidia-223'),))])
    assert model.holds_vgpus(busy)
    assert model.holds_vgpus(fakes.gpu(mdevs=(_mdev('nvidia-223'),)))


def test_a_vgpu_provider_s_total_is_capped_for_placement():
    huge = records.replace(fakes.T4_2B, description=None,
                           available_instances=2 ** 31 + 5)
    gpu = fakes.gpu(types=(huge,))
    provider = model.gpu_provider('h', ROOT, gpu, _type())
    assert provider.inventories[0].total == 2 ** 31 - 1
    exact = records.replace(huge, available_instances=2 ** 31 - 1)
    provider = model.gpu_provider('h', ROOT, fakes.gpu(types=(exact,)),
                                  _type())
    assert provider.inventories[0].total == 2 ** 31 - 1
    one = records.replace(huge, available_instances=1)
    provider = model.gpu_provider('h', ROOT, fakes.gpu(types=(one,)),
                                  _type(), name='other')
    assert (provider.name, provider.uuid, provider.parent_provider_uuid,
            provider.inventories) == (
        'other', tree_mod.provider_uuid('other'), ROOT,
        (tree_mod.Inventory('VGPU', 1),))


def test_offered():
    gpu = fakes.gpu()
    assert model.offered(gpu, None)
    assert model.offered(gpu, _type())
    assert not model.offered(records.replace(gpu, iommu_group=None), None)
    assert model.offered(records.replace(gpu, iommu_group=None), _type())
    assert not model.offered(records.replace(gpu, vendor_id='1002'), None)
    assert model.offered(records.replace(gpu, vendor_id='1002'), None,
                         pgpu_vendors=('1002',))
    vf = records.replace(gpu, physfn=_addr('0000:af:00.0'))
    assert not model.offered(vf, _type())


def _tree_of(*children, host='h'):
    root = tree_mod.ResourceProvider(host, tree_mod.provider_uuid(host),
                                     None)
    return tree_mod.ProviderTree(root, tuple(
        tree_mod.ResourceProvider(name, tree_mod.provider_uuid(name),
                                  root.uuid, traits=frozenset(t))
        for name, t in children))


def test_check_not_novas_refusals():
    with pytest.raises(model.NovaProviderClash) as e:
        model.check_not_novas(_tree_of(('h_pci_0000_af_00_0', ())))
    assert str(e.value) == (
        'refusing to report h_pci_0000_af_00_0 to Placement: Nova names '
        'its vGPU providers <host>_pci_<address>; this is a bug of '
        'libvirt-gpu, please report it')
    with pytest.raises(model.NovaProviderClash) as e:
        model.check_not_novas(_tree_of(('h_0000:af:00.0', ('OWNER_NOVA',))))
    assert ("h_0000:af:00.0 to Placement: the trait OWNER_NOVA marks "
            "Nova's own providers;") in str(e.value)
    with pytest.raises(model.NovaProviderClash) as e:
        model.check_not_novas(_tree_of(('h_0000:af:00.0', ())),
                              carved=[_addr('0000:af:00.0')])
    assert ("h_0000:af:00.0 to Placement: its GPU is carved for Nova, "
            "whose PCI provider of it has that name;") in str(e.value)
    # the root is Nova's compute node's name: never refused
    model.check_not_novas(_tree_of(('h_0000:3b:00.0', ('OWNER_CYBORG',)),
                                   host='h_pci_x'))
    model.check_not_novas(_tree_of(('h_0000:af:00.0', ())),
                          carved=[_addr('0000:3b:00.0')])


def test_build_tree_leaves_carved_gpus_out_and_names_further_types():
    a, b = fakes.gpu('0000:af:00.0'), fakes.gpu('0000:3b:00.0')
    setting = records.replace(_type(), others=(_type('nvidia-319'),))
    # where the driver counts each type's room (mixed sizes): one
    # provider per type
    both = {(a.address, t.type_id): capacity.DriverRoom(
        mode=capacity.MODE_MIXED, type_id=t.type_id, used=0,
        placement_size=1, placements=tuple(range(n)))
        for t, n in zip(setting.types, (8, 4))}
    found = model.build_tree('h', [a, b], {a.address: setting},
                             carved=frozenset({b.address}), rooms=both)
    assert [(p.name, p.inventories[0].total) for p in found.children] == [
        ('h_0000:af:00.0', 8), ('h_0000:af:00.0_nvidia-319', 4)]
    # without (equal-size mode: one type at a time): the first only
    found = model.build_tree('h', [a, b], {a.address: setting},
                             carved=frozenset({b.address}))
    assert [(p.name, p.inventories[0].total) for p in found.children] == [
        ('h_0000:af:00.0', 8)]
    rooms = {(a.address, setting.type_id): capacity.DriverRoom(
        mode=capacity.MODE_MIXED, type_id=setting.type_id, used=1,
        placement_size=2, placements=(0, 2))}
    (room,) = model.build_tree('h', [a], {a.address: _type()},
                               rooms=rooms).children
    assert room.inventories[0].total == 3
    # a vGPU type enabled on a GPU not offered whole still gets its provider
    amd = records.replace(fakes.gpu('0000:5e:00.0'), vendor_id='1002',
                          iommu_group=None)
    (vgpus,) = model.build_tree('h', [amd], {amd.address: _type()}).children
    assert vgpus.name == 'h_0000:5e:00.0'


class HostEnv:
    """What host_tree reads of an ``environment.Environment``."""

    def __init__(self, gpus, enabled, carved, rooms, gpu_traits=False,
                 owners=None):
        from libvirt_gpu.devices import routes as routes_mod
        self.routes = routes_mod.Routes(owners=owners or {})
        self.discovered = type('Discovered', (), {'gpus': tuple(gpus)})
        self.enabled = enabled
        self.carved = type('Carved', (), {'gpus': frozenset(carved)})
        self.conf = type('Conf', (), {'gpu': type('Gpu', (), {
            'report_gpu_traits': gpu_traits,
            'pgpu_vendor_ids': ('1002',)})})
        self.vgpus = type('Vgpus', (), {
            'rooms': staticmethod(lambda asked: rooms if asked is enabled
                                  else {})})


def test_host_tree_takes_everything_from_the_environment():
    a, b = fakes.gpu('0000:af:00.0'), fakes.gpu('0000:3b:00.0')
    amd = records.replace(fakes.gpu('0000:5e:00.0'), vendor_id='1002')
    carved = records.replace(fakes.gpu('0000:5f:00.0'), vendor_id='1002')
    nvidia = fakes.gpu('0000:d8:00.0')
    enabled = {a.address: _type()}
    rooms = {(a.address, enabled[a.address].type_id): capacity.DriverRoom(
        mode=capacity.MODE_MIXED, type_id=enabled[a.address].type_id,
        used=0, placement_size=2, placements=(0, 2))}
    cyborgs = records.replace(fakes.gpu('0000:60:00.0'), vendor_id='1002')
    gpus = [a, b, amd, carved, nvidia, cyborgs]
    found = model.host_tree(HostEnv(gpus, enabled, {carved.address},
                                    rooms, owners={
                                        cyborgs.address: 'cyborg'}), 'c1')
    assert found.root.name == 'c1'
    # another route's GPU is left out, and its provider left alone
    assert found.foreign == {cyborgs.address}
    assert [(p.name, p.inventories[0].total, sorted(p.traits))
            for p in found.children] == [
        ('c1_0000:5e:00.0', 1, ['CUSTOM_AMD_1EB8', 'OWNER_CYBORG']),
        ('c1_0000:af:00.0', 2, ['CUSTOM_NVIDIA_1EB8_T4_2B',
                                'OWNER_CYBORG'])]
    displayed = model.host_tree(HostEnv(gpus, enabled, {carved.address},
                                        rooms, gpu_traits=True, owners={
                                            cyborgs.address: 'cyborg'}),
                                'c1')
    assert 'HW_GPU_MAX_DISPLAY_HEADS_4' in displayed.children[1].traits
