"""Placement client, sync planning and agent loop, without a server.

The client is exercised over a scripted keystoneauth Adapter stand-in (what
goes on the wire, how answers map to typed errors); the sync over an
in-memory Placement that keeps generations the way the real one does. The
real-Placement behaviour is covered by tests/functional/test_placement.py.
"""

import collections
import json
import signal
import subprocess
import sys
import threading
import time
import uuid as uuidlib

from keystoneauth1 import exceptions as ks_exc
from oslo_config import cfg
import pytest

from libvirt_gpu.openstack import agent
from libvirt_gpu import exception
from libvirt_gpu.cmd import output
from libvirt_gpu.conf import agent as agent_conf
from libvirt_gpu.conf import placement as placement_conf
from libvirt_gpu.openstack.placement import client as pc
from libvirt_gpu.openstack.placement import sync
from libvirt_gpu.openstack.placement import tree as tree_mod
from tests.doubles import paths
from tests.doubles.placement_fake import FakePlacement, gpu_tree, TWO, uuid_of
import logging

VERSIONS = {'versions': [{'id': 'v1.0', 'min_version': '1.0',
                          'max_version': '1.39', 'status': 'CURRENT'}]}


# --------------------------------------------------------------------------
# A scripted Adapter

class Resp:
    def __init__(self, status, body=None):
        self.status_code = status
        self.content = b'' if body is None else json.dumps(body).encode()
        self.text = self.content.decode()

    def json(self):
        return json.loads(self.content)


def err(status, code, detail='nope'):
    return Resp(status, {'errors': [{'status': status, 'code': code,
                                     'title': 'x', 'detail': detail}]})


class ScriptedAdapter:
    endpoint_override = 'http://placement.test'

    def __init__(self, *answers):
        self.answers = list(answers)
        self.sent = []

    def request(self, url, method, **kwargs):
        self.sent.append((method, url, kwargs.get('json'),
                          kwargs.get('microversion')))
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def scripted(*answers, **kwargs):
    adapter = ScriptedAdapter(Resp(200, VERSIONS), *answers)
    kwargs.setdefault('retry_wait', 0)
    kwargs.setdefault('retry_wait_max', 0)
    return pc.PlacementClient(adapter, **kwargs), adapter


class TestClient:
    def test_negotiates_min_of_ours_and_theirs(self):
        client, adapter = scripted(Resp(200, {'resource_providers': []}))
        assert client.list_tree('u') == ()
        assert adapter.sent[0][:2] == ('GET', '/')
        assert adapter.sent[0][3] is None            # unversioned
        assert adapter.sent[1][3] == '1.39'
        assert client.stats.by_method['GET'] == 2

    def test_older_server_gets_its_max(self):
        old = {'versions': [{'max_version': '1.30', 'min_version': '1.0'}]}
        client = pc.PlacementClient(ScriptedAdapter(Resp(200, old)))
        assert client.microversion == (1, 30)

    def test_too_old_server_refused(self):
        old = {'versions': [{'max_version': '1.17', 'min_version': '1.0'}]}
        client = pc.PlacementClient(ScriptedAdapter(Resp(200, old)))
        with pytest.raises(pc.PlacementVersionTooOld) as e:
            client.microversion
        assert 'up to 1.17' in str(e.value) and '1.26' in str(e.value)

    def test_connection_failure_is_unavailable(self):
        client = pc.PlacementClient(ScriptedAdapter(
            ks_exc.ConnectFailure('refused')))
        with pytest.raises(pc.PlacementUnavailable) as e:
            client.microversion
        assert 'http://placement.test' in str(e.value)

    @pytest.mark.parametrize('status,cls', [
        (401, pc.PlacementAuthError), (403, pc.PlacementAuthError),
        (503, pc.PlacementUnavailable), (400, pc.PlacementError)])
    def test_status_maps_to_typed_error(self, status, cls):
        client, _ = scripted(err(status, 'placement.undefined_code'))
        with pytest.raises(cls):
            client.list_tree('u')

    def test_webob_boilerplate_dropped_from_detail(self):
        client, _ = scripted(err(
            400, 'placement.undefined_code',
            'The server could not comply with the request since it is '
            'either malformed or otherwise incorrect.\n\n No such trait X  '))
        with pytest.raises(pc.PlacementError) as e:
            client.list_tree('u')
        assert e.value.kwargs['detail'] == 'No such trait X'

    def test_conflict_rereads_generation_and_retries(self):
        provider = {'uuid': 'u', 'name': 'n', 'generation': 7,
                    'parent_provider_uuid': None, 'root_provider_uuid': 'u'}
        client, adapter = scripted(
            err(409, pc.CODE_CONCURRENT_UPDATE),
            Resp(200, provider),
            Resp(200, {'resource_provider_generation': 8, 'inventories': {}}))
        gen = client.set_inventories('u', 3, [tree_mod.Inventory('VGPU', 4)])
        assert gen == 8
        puts = [s for s in adapter.sent if s[0] == 'PUT']
        assert [p[2]['resource_provider_generation'] for p in puts] == [3, 7]
        assert puts[1][2]['inventories']['VGPU']['max_unit'] == 4

    def test_conflict_retries_are_bounded(self):
        provider = {'uuid': 'u', 'name': 'n', 'generation': 7,
                    'parent_provider_uuid': None, 'root_provider_uuid': 'u'}
        answers = [err(409, pc.CODE_CONCURRENT_UPDATE)]
        for _ in range(2):
            answers += [Resp(200, provider),
                        err(409, pc.CODE_CONCURRENT_UPDATE)]
        client, adapter = scripted(*answers, conflict_retries=3)
        with pytest.raises(pc.GenerationConflict) as e:
            client.set_traits('u', 1, ['OWNER_CYBORG'])
        assert '3 attempts' in str(e.value)
        assert not adapter.answers

    def test_inventory_in_use_is_final(self):
        client, adapter = scripted(err(409, pc.CODE_INVENTORY_INUSE))
        with pytest.raises(pc.InventoryInUse):
            client.set_inventories('u', 1, [tree_mod.Inventory('PGPU', 1)])
        assert len(adapter.sent) == 2

    def test_delete_of_missing_provider_is_fine(self):
        client, adapter = scripted(
            err(404, 'placement.resource_provider.not_found'))
        assert client.delete_provider('u') is None
        # the DELETE was sent (a 404 means someone removed it first) ...
        assert adapter.sent[-1][:2] == ('DELETE', '/resource_providers/u')
        assert adapter.answers == []
        # ... and only a 404 is taken as "already gone"
        client, _ = scripted(err(500, 'placement.unknown', 'boom'),
                             err(500, 'placement.unknown', 'boom'),
                             err(500, 'placement.unknown', 'boom'),
                             err(500, 'placement.unknown', 'boom'),
                             err(500, 'placement.unknown', 'boom'))
        with pytest.raises(pc.PlacementError):
            client.delete_provider('u')

    def test_delete_in_use(self):
        client, _ = scripted(err(409, pc.CODE_PROVIDER_INUSE))
        with pytest.raises(pc.ProviderInUse):
            client.delete_provider('u')

    def test_custom_traits_checked_once_then_created(self):
        client, adapter = scripted(Resp(200, {'traits': ['CUSTOM_A']}),
                                   Resp(201), Resp(204))
        assert client.missing_custom_traits(
            ['CUSTOM_A', 'CUSTOM_B', 'OWNER_CYBORG']) == ['CUSTOM_B']
        assert adapter.sent[1][1] == '/traits?name=in%3ACUSTOM_A%2CCUSTOM_B'
        client.create_trait('CUSTOM_B')
        assert client.missing_custom_traits(['CUSTOM_A', 'CUSTOM_B']) == []
        with pytest.raises(pc.InvalidTrait):
            client.create_trait('CUSTOM_bad name')

    def test_planned_request_str(self):
        req = pc.PlacementClient.traits_request('u', 2, {'B', 'A'})
        assert str(req) == ('PUT /resource_providers/u/traits '
                            '{"resource_provider_generation": 2, '
                            '"traits": ["A", "B"]}')


def make_conf(**agent_overrides):
    conf = cfg.ConfigOpts()
    placement_conf.register_opts(conf)
    agent_conf.register_opts(conf)
    conf([], project='libvirt-gpu-test')
    for key, value in agent_overrides.items():
        conf.set_override(key, value, group='agent')
    return conf


def _by_name(listed):
    """``list_opts()`` keyed by group name (its keys are OptGroups, so that
    the sample configuration shows their help)."""
    return {getattr(group, 'name', group): opts
            for group, opts in listed.items()}


class TestConf:
    def test_list_opts_groups(self):
        names = {o.dest for o in
                 _by_name(placement_conf.list_opts())['placement']}
        assert {'auth_type', 'auth_url', 'endpoint_override', 'service_type',
                'noauth_token', 'conflict_retries', 'timeout'} <= names
        assert {o.dest for o in
                _by_name(agent_conf.list_opts())['agent']} == {
            'sync_interval', 'backoff_max'}

    def test_defaults(self):
        conf = make_conf()
        assert conf.placement.service_type == 'placement'
        assert conf.placement.valid_interfaces == ['internal', 'public']

    def test_no_endpoint_no_auth_is_a_config_error(self):
        with pytest.raises(pc.PlacementConfigError) as e:
            pc.PlacementClient.from_conf(make_conf())
        assert '--url' in str(e.value)

    def test_url_gives_noauth_client(self):
        client = pc.PlacementClient.from_conf(make_conf(),
                                              url='http://p.test:8778')
        assert client.endpoint == 'http://p.test:8778'

    def test_keystone_auth_from_conf(self, tmp_path):
        path = tmp_path / 'libvirt-gpu.conf'
        path.write_text('[placement]\n'
                        'auth_type = password\n'
                        'auth_url = http://keystone.test/v3\n'
                        'username = agent\n'
                        'password = secret\n'
                        'project_name = service\n'
                        'user_domain_name = Default\n'
                        'project_domain_name = Default\n'
                        'endpoint_override = http://p.test\n')
        conf = cfg.ConfigOpts()
        placement_conf.register_opts(conf)
        agent_conf.register_opts(conf)
        conf(['--config-file', str(path)], project='libvirt-gpu-test')
        client = pc.PlacementClient.from_conf(conf)
        assert client.endpoint == 'http://p.test'
        auth = client._adapter.session.auth
        assert type(auth).__name__ == 'Password'
        assert auth.auth_url == 'http://keystone.test/v3'


class TestSync:
    def test_first_sync_plan_order_and_generations(self):
        fake = FakePlacement()
        report = sync.sync(fake, gpu_tree('h', TWO), dry_run=True)
        got = [(r.method, r.url) for r in report.requests]
        af, b3 = uuid_of('h_0000:af:00.0'), uuid_of('h_0000:3b:00.0')
        assert got == [
            ('PUT', '/traits/CUSTOM_T4'),
            ('PUT', '/traits/CUSTOM_T4_2B'),
            ('POST', '/resource_providers'),
            ('POST', '/resource_providers'),
            ('PUT', '/resource_providers/%s/inventories' % b3),
            ('PUT', '/resource_providers/%s/traits' % b3),
            ('POST', '/resource_providers'),
            ('PUT', '/resource_providers/%s/inventories' % af),
            ('PUT', '/resource_providers/%s/traits' % af)]
        assert report.requests[3].body == {
            'name': 'h_0000:3b:00.0', 'uuid': b3,
            'parent_provider_uuid': uuid_of('h')}
        gens = [r.body['resource_provider_generation']
                for r in report.requests if 'resource_provider_generation'
                in (r.body or {})]
        assert gens == [0, 1, 0, 1]
        assert fake.stats.writes == 0 and fake.providers == {}

        real = sync.sync(fake, gpu_tree('h', TWO))
        assert real.requests == report.requests
        assert fake.traits[af] == {'OWNER_CYBORG', 'CUSTOM_T4_2B'}

    def test_steady_state_is_one_read_with_state(self):
        fake = FakePlacement()
        state = sync.SyncState()
        sync.sync(fake, gpu_tree('h', TWO), state=state)
        for _ in range(3):
            before = fake.stats.copy()
            report = sync.sync(fake, gpu_tree('h', TWO), state=state)
            assert dict((fake.stats - before).by_method) == {'GET': 1}
            assert {r.outcome for r in report.results} == {sync.UNCHANGED}

    def test_steady_state_cost_independent_of_gpu_count(self):
        costs = []
        for n in (1, 8, 32):
            spec = {'%02x' % i: ('VGPU', 4, set()) for i in range(n)}
            fake = FakePlacement()
            state = sync.SyncState()
            sync.sync(fake, gpu_tree('h', spec), state=state)
            costs.append(sync.sync(fake, gpu_tree('h', spec),
                                   state=state).stats.total)
        assert costs == [1, 1, 1]

    def test_someone_else_changes_a_provider_it_is_reread_and_fixed(self):
        fake = FakePlacement()
        state = sync.SyncState()
        sync.sync(fake, gpu_tree('h', TWO), state=state)
        af = uuid_of('h_0000:af:00.0')
        fake.traits[af] = {'OWNER_CYBORG'}
        fake.bump(af)
        report = sync.sync(fake, gpu_tree('h', TWO), state=state)
        assert [(r.method, r.url) for r in report.requests] == [
            ('PUT', '/resource_providers/%s/traits' % af)]
        assert fake.traits[af] == {'OWNER_CYBORG', 'CUSTOM_T4_2B'}
        assert sync.sync(fake, gpu_tree('h', TWO),
                         state=state).stats.total == 1

    def test_write_retried_after_conflict_is_not_remembered(self):
        class Racy(FakePlacement):
            race = True

            def set_inventories(self, uuid, generation, inventories):
                if self.race:
                    # Another writer got in first; the client re-read the
                    # generation and retried (as PlacementClient does).
                    self.race = False
                    self.traits[uuid] = {'CUSTOM_INTRUDER'}
                    self.bump(uuid)
                    generation = self.providers[uuid]['generation']
                return super().set_inventories(uuid, generation, inventories)

        fake = Racy()
        fake.race = False
        state = sync.SyncState()
        sync.sync(fake, gpu_tree('h', TWO), state=state)
        fake.race = True
        changed = gpu_tree('h', {'af': ('VGPU', 4, {'CUSTOM_T4_2B'}),
                                 '3b': TWO['3b']})
        sync.sync(fake, changed, state=state)
        af = uuid_of('h_0000:af:00.0')
        assert fake.traits[af] == {'CUSTOM_INTRUDER'}
        # Not trusted: the next sync reads it again and repairs the traits.
        report = sync.sync(fake, changed, state=state)
        assert [(r.method, r.url) for r in report.requests] == [
            ('PUT', '/resource_providers/%s/traits' % af)]
        assert fake.traits[af] == {'OWNER_CYBORG', 'CUSTOM_T4_2B'}

    def test_foreign_provider_with_our_prefix_is_left_alone(self):
        fake = FakePlacement()
        sync.sync(fake, gpu_tree('h', TWO))
        fake.add('h_0000:d8:00.0', uuid='1' * 8 + '-1111-1111-1111-'
                 + '1' * 12, parent=uuid_of('h'))
        report = sync.sync(fake, gpu_tree('h', TWO))
        assert report.requests == []
        assert len(fake.providers) == 4

    def test_vanished_without_allocations_deleted_first(self):
        fake = FakePlacement()
        sync.sync(fake, gpu_tree('h', TWO))
        report = sync.sync(fake, gpu_tree('h', {
            'af': TWO['af'], 'd8': ('PGPU', 1, {'CUSTOM_T4'})}))
        assert [r.method for r in report.requests] == [
            'DELETE', 'POST', 'PUT', 'PUT']
        assert uuid_of('h_0000:3b:00.0') not in fake.providers

    @pytest.mark.parametrize('host', ['h', 'compute_1'])
    def test_a_type_provider_with_an_underscore_in_its_type_is_ours(
            self, host):
        # Intel GVT-g type ids hold "_" (i915-GVTg_V5_4), as a host name
        # may: such a provider is read back as ours, and deleted with its
        # type
        igd = '%s_0000:00:02.0' % host
        typed = igd + '_i915-GVTg_V5_4'
        root = tree_mod.ResourceProvider(host, uuid_of(host), None)

        def tree(*names):
            return tree_mod.ProviderTree(root, tuple(
                tree_mod.ResourceProvider(
                    name, uuid_of(name), root.uuid,
                    (tree_mod.Inventory('VGPU', 2),),
                    frozenset({'OWNER_CYBORG'})) for name in names))

        fake = FakePlacement()
        sync.sync(fake, tree(igd, typed))
        assert uuid_of(typed) in fake.providers
        report = sync.sync(fake, tree(igd))
        assert [(r.method, r.url) for r in report.requests] == [
            ('DELETE', '/resource_providers/%s' % uuid_of(typed))]
        assert set(fake.providers) == {uuid_of(host), uuid_of(igd)}

    def test_providers_of_earlier_releases_replaced(self):
        # Earlier releases named a GPU's provider <host>_pci_<libvirt name>
        # with a uuid5: recognised as ours and replaced by Cyborg's name
        # and uuid3; a provider of that name with another uuid (Nova's own
        # vGPU provider) is left alone.
        fake = FakePlacement()
        sync.sync(fake, gpu_tree('h', {}))
        root = uuid_of('h')
        old = 'h_pci_0000_af_00_0'
        old_uuid = fake.add(old, tree_mod.legacy_provider_uuid(old), root)
        fake.add('h_pci_0000_3b_00_0', 'nova-uuid', root)
        report = sync.sync(fake, gpu_tree('h', {'af': TWO['af']}))
        assert [r.uuid for r in report.with_outcome(sync.DELETED)] == [
            old_uuid]
        assert [r.name for r in report.with_outcome(sync.CREATED)] == [
            'h_0000:af:00.0']
        assert uuid_of('h_0000:af:00.0') == str(
            uuidlib.uuid3(uuidlib.NAMESPACE_DNS, 'h_0000:af:00.0'))
        assert 'nova-uuid' in fake.providers

    def test_vanished_with_allocations_kept_reserved(self):
        fake = FakePlacement()
        state = sync.SyncState()
        sync.sync(fake, gpu_tree('h', TWO), state=state)
        af = uuid_of('h_0000:af:00.0')
        fake.allocate(af, 'c1', amount=3)
        gone = gpu_tree('h', {'3b': TWO['3b']})
        report = sync.sync(fake, gone, state=state)
        assert [(r.name, r.outcome) for r in report.with_outcome(sync.KEPT)] \
            == [('h_0000:af:00.0', sync.KEPT)]
        assert 'c1' in report.with_outcome(sync.KEPT)[0].detail
        inv = fake.inventories[af]['VGPU']
        assert inv.reserved == inv.total == 8
        # Next time: only the allocation check, no inventory read or write.
        again = sync.sync(fake, gone, state=state)
        assert again.stats.total == 2 and again.stats.writes == 0
        # Deleting allocations does not bump the generation; still noticed.
        del fake.allocations[af]['c1']
        final = sync.sync(fake, gone, state=state)
        assert [r.uuid for r in final.with_outcome(sync.DELETED)] == [af]
        assert af not in fake.providers

    def test_allocation_racing_the_delete_keeps_instead(self):
        fake = FakePlacement()
        sync.sync(fake, gpu_tree('h', TWO))
        b3 = uuid_of('h_0000:3b:00.0')
        fake.refuse_delete.add(b3)
        report = sync.sync(fake, gpu_tree('h', {'af': TWO['af']}))
        assert [r.outcome for r in report.results
                if r.uuid == b3] == [sync.KEPT]
        assert fake.inventories[b3]['PGPU'].reserved == 1

    def test_inventory_in_use_fails_that_provider_only(self):
        fake = FakePlacement()
        sync.sync(fake, gpu_tree('h', TWO))
        af = uuid_of('h_0000:af:00.0')
        fake.allocate(af, 'c1')
        report = sync.sync(fake, gpu_tree('h', {
            'af': ('PGPU', 1, set()), '3b': ('VGPU', 4, set())}))
        assert [f.uuid for f in report.failed] == [af]
        b3 = uuid_of('h_0000:3b:00.0')
        assert fake.inventories[b3]['VGPU'].total == 4
        # Traits of the failed provider were not written either.
        assert 'CUSTOM_T4_2B' in fake.traits[af]

    def test_nests_under_existing_provider_by_name(self):
        fake = FakePlacement()
        nova = fake.add('h', uuid='2' * 8 + '-2222-2222-2222-' + '2' * 12)
        state = sync.SyncState()
        report = sync.sync(fake, gpu_tree('h', TWO), state=state)
        assert report.nested and report.parent_uuid == nova
        assert uuid_of('h') not in fake.providers
        for u in (uuid_of('h_0000:af:00.0'),
                  uuid_of('h_0000:3b:00.0')):
            assert fake.providers[u]['parent'] == nova
        fake.bump(nova)   # Nova writes its own inventory
        assert sync.sync(fake, gpu_tree('h', TWO),
                         state=state).stats.total == 1
        # nest=False: we would create our own root, and the name is taken.
        fresh = FakePlacement()
        fresh.add('h', uuid='3' * 8 + '-3333-3333-3333-' + '3' * 12)
        report = sync.sync(fresh, gpu_tree('h', TWO), nest=False)
        assert [f.name for f in report.failed] == [
            'h', 'h_0000:3b:00.0', 'h_0000:af:00.0']
        assert 'parent h could not be created' in report.failed[1].detail
        assert len(fresh.providers) == 1

    def test_a_host_with_nova_carvings_never_takes_the_compute_node_name(
            self):
        # no provider named after the host yet: Nova creates it, we wait
        fake = FakePlacement()
        for nest in (True, False):
            with pytest.raises(pc.ComputeNodeMissing) as e:
                sync.sync(fake, gpu_tree('h', TWO), nest=nest,
                          nova_root=True)
            assert 'No provider named h in Placement yet' in str(e.value)
            assert 'Start nova-compute' in str(e.value)
        assert fake.providers == {}
        # once Nova made it, we nest under it, even with nest_under_existing
        # off
        nova = fake.add('h', uuid='4' * 8 + '-4444-4444-4444-' + '4' * 12)
        report = sync.sync(fake, gpu_tree('h', TWO), nest=False,
                           nova_root=True)
        assert report.nested and report.parent_uuid == nova
        assert uuid_of('h') not in fake.providers
        # without carvings our own root is still made where none exists
        fresh = FakePlacement()
        assert not sync.sync(fresh, gpu_tree('h', TWO)).nested
        assert uuid_of('h') in fresh.providers

    def test_nova_owns_the_root_when_gpus_are_carved_for_it(self):
        class Conf:
            class nova:
                carved = ['l40s_12q']
        assert agent.nova_owns_root(Conf)
        Conf.nova.carved = []
        assert not agent.nova_owns_root(Conf)
        assert not agent.nova_owns_root(object())

    def test_moves_a_provider_to_the_right_parent(self):
        fake = FakePlacement()
        sync.sync(fake, gpu_tree('h', TWO))
        af = uuid_of('h_0000:af:00.0')
        # Somebody moved it under its sibling (same tree).
        fake.providers[af]['parent'] = uuid_of('h_0000:3b:00.0')
        report = sync.sync(fake, gpu_tree('h', TWO))
        assert [(r.method, r.url) for r in report.requests] == [
            ('PUT', '/resource_providers/%s' % af)]
        assert fake.providers[af]['parent'] == uuid_of('h')

    def test_root_gone_from_placement_resolved_again(self):
        fake = FakePlacement()
        state = sync.SyncState()
        sync.sync(fake, gpu_tree('h', TWO), state=state)
        fake.__init__()   # Placement's database was recreated
        report = sync.sync(fake, gpu_tree('h', TWO), state=state)
        assert [r.outcome for r in report.results] == [sync.CREATED] * 3
        assert len(fake.providers) == 3

    def test_summary_and_text(self):
        # The text is what the CLI prints: the report shape drawn by
        # cmd.output (summary, a table of providers, then the writes).
        fake = FakePlacement()
        plan = sync.sync(fake, gpu_tree('h', TWO), dry_run=True)
        text = output.report_text(plan).splitlines()
        assert text[0].startswith('h: 3 created; ')
        assert '[dry run]' in text[0]
        assert text[1].split() == ['OUTCOME', 'PROVIDER', 'UUID', 'DETAIL']
        assert text[3].split()[:2] == ['created', 'h']
        assert text[6] == 'plan:'
        assert text[7] == '  PUT /traits/CUSTOM_T4'
        assert len(text) == 7 + len(plan.requests)
        report = sync.sync(fake, gpu_tree('h', TWO))
        assert report.changed
        again = sync.sync(fake, gpu_tree('h', TWO))
        assert not again.changed
        assert output.report_text(again).splitlines()[-2:] == [
            'sent:', '  nothing to write']


# --------------------------------------------------------------------------
# Agent

class TestAgent:
    def test_backoff_doubles_to_cap_and_resets(self):
        b = agent.Backoff(10, rand=lambda: 0.5)
        assert [b.failed() for _ in range(6)] == [1, 2, 4, 8, 10, 10]
        b.succeeded()
        assert b.failed() == 1

    def test_loop_survives_failures_and_stops(self):
        fake = FakePlacement()
        calls = collections.Counter()
        stop = threading.Event()
        waits = []

        class Recording(threading.Event):
            def wait(self, timeout=None):
                waits.append(timeout)
                if len(waits) >= 5:
                    stop.set()
                return stop.is_set()

            def is_set(self):
                return stop.is_set()

        def discover():
            calls['discover'] += 1
            if calls['discover'] <= 3:
                raise pc.PlacementUnavailable(endpoint='x', reason='down')
            return gpu_tree('h', TWO)

        conf = make_conf(sync_interval=30, backoff_max=3)
        a = agent.Agent(conf, discover, client=fake,
                        stop_event=Recording())
        report = a.run()
        assert a.failures == 3
        # 1, 2, 4 s with +-25 % jitter, capped at backoff_max (3 s).
        assert 0.75 <= waits[0] <= 1.25 and 1.5 <= waits[1] <= 2.5
        assert 2.25 <= waits[2] <= 3
        assert waits[3:] == [30, 30]
        assert report is not None and len(fake.providers) == 3

    def test_once_raises_typed_error(self):
        def discover():
            raise exception.LibvirtUnavailable(uri='qemu:///system',
                                               reason='no socket')
        with pytest.raises(exception.LibvirtUnavailable):
            agent.run(make_conf(), discover, once=True,
                      client=FakePlacement())

    def test_sync_once_needs_a_tree(self):
        with pytest.raises(exception.InvalidInput):
            agent.sync_once(make_conf(), client=FakePlacement())

    def test_sync_once_dry_run(self):
        fake = FakePlacement()
        report = agent.sync_once(make_conf(), dry_run=True,
                                 tree=gpu_tree('h', TWO), client=fake)
        assert report.dry_run and report.requests and not fake.providers


AGENT_SCRIPT = '''
import logging, sys
from oslo_config import cfg
from libvirt_gpu.openstack import agent
from libvirt_gpu.conf import agent as agent_conf
from libvirt_gpu.conf import placement as placement_conf
from libvirt_gpu.openstack.placement import tree
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
conf = cfg.ConfigOpts()
placement_conf.register_opts(conf)
agent_conf.register_opts(conf)
conf([], project='t')
conf.set_override('endpoint_override', 'http://127.0.0.1:9', 'placement')
conf.set_override('backoff_max', 60, 'agent')
root = tree.ResourceProvider('h', tree.provider_uuid('h'), None)
agent.run(conf, lambda: tree.ProviderTree(root))
print('clean exit')
'''


def test_sigterm_stops_the_agent_cleanly():
    repo = paths.ROOT
    proc = subprocess.Popen([sys.executable, '-c', AGENT_SCRIPT], cwd=repo,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        # Wait until it has failed once against the unreachable Placement
        # (it then waits ~1 s before retrying).
        deadline = time.monotonic() + 30
        seen = ''
        while 'Sync failed' not in seen and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            seen += line
        assert 'Sync failed' in seen, seen
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert 'clean exit' in out
    assert 'Cannot reach Placement at http://127.0.0.1:9' in seen


# --- What ``make mutation`` found open (docs/dev/mutation.md) ---
# What the Placement sync (``placement.sync``) promises that the tests
# above left open: each test here fails on a change ``make mutation`` made
# that the rest stayed green on.  The sync runs over the in-memory
# Placement of tests/doubles/placement_fake.py (generations as the real
# one keeps them).

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
