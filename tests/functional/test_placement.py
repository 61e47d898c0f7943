"""Sync provider trees to a real OpenStack Placement (see placement_server).

One Placement serves the module; the ``placement`` fixture empties it
before each test (allocations, then providers leaves first), so every test
starts from nothing and asserts on raw API reads.
"""

import threading
import uuid as uuidlib

import pytest

from libvirt_gpu.openstack import agent
from libvirt_gpu.devices import discovery
from libvirt_gpu import objects
from libvirt_gpu import simulator
from libvirt_gpu.devices import sysfs as sysfs_mod
from libvirt_gpu.openstack.placement import client as placement_client
from libvirt_gpu.openstack.placement import model
from libvirt_gpu.openstack.placement import sync
from libvirt_gpu.openstack.placement import tree as tree_mod
from tests.functional import placement_server
from tests.doubles import fakes
from tests.doubles import kinds

AF = objects.PciAddress.parse('0000:af:00.0')
B3 = objects.PciAddress.parse('0000:3b:00.0')
D8 = objects.PciAddress.parse('0000:d8:00.0')

T4_1B = fakes.T4_1B
T4_2B = fakes.T4_2B


def t4(address):
    return fakes.gpu(address, types=(T4_1B, T4_2B))


def build(host, gpus, enabled=None):
    return model.build_tree(host, gpus, {
        addr: objects.EnabledType(type_id)
        for addr, type_id in (enabled or {}).items()})


# --------------------------------------------------------------------------
# Fixtures and raw reads

@pytest.fixture(scope='module')
def server():
    with placement_server.running() as srv:
        yield srv


def _wipe(raw):
    providers = raw.get('/resource_providers').json()['resource_providers']
    consumers = set()
    for p in providers:
        allocs = raw.get('/resource_providers/%s/allocations'
                         % p['uuid']).json()['allocations']
        consumers.update(allocs)
    for consumer in consumers:
        assert raw.delete('/allocations/%s' % consumer).status_code == 204
    # Children before parents: deepest first.
    depth = {}
    by_uuid = {p['uuid']: p for p in providers}
    for p in providers:
        d, cur = 0, p
        while cur['parent_provider_uuid']:
            d, cur = d + 1, by_uuid[cur['parent_provider_uuid']]
        depth[p['uuid']] = d
    for p in sorted(providers, key=lambda p: -depth[p['uuid']]):
        assert raw.delete('/resource_providers/%s'
                          % p['uuid']).status_code == 204


class Raw:
    """Assertions over a raw keystoneauth Adapter (microversion 1.39)."""

    def __init__(self, adapter):
        self.a = adapter

    def get(self, url):
        resp = self.a.get(url, raise_exc=False)
        return resp

    def json(self, url):
        resp = self.a.get(url, raise_exc=False)
        assert resp.status_code == 200, (url, resp.status_code, resp.text)
        return resp.json()

    def tree(self, root_uuid):
        body = self.json('/resource_providers?in_tree=%s' % root_uuid)
        return {p['name']: p for p in body['resource_providers']}

    def inventories(self, uuid):
        return self.json('/resource_providers/%s/inventories'
                         % uuid)['inventories']

    def traits(self, uuid):
        return set(self.json('/resource_providers/%s/traits'
                             % uuid)['traits'])

    def exists(self, uuid):
        status = self.get('/resource_providers/%s' % uuid).status_code
        assert status in (200, 404)
        return status == 200

    def allocate(self, rp_uuid, amount, resource_class='VGPU'):
        consumer = str(uuidlib.uuid4())
        resp = self.a.put('/allocations/%s' % consumer, json={
            'allocations': {rp_uuid: {'resources': {resource_class: amount}}},
            'project_id': str(uuidlib.uuid4()),
            'user_id': str(uuidlib.uuid4()),
            'consumer_generation': None,
            'consumer_type': 'INSTANCE',
        }, raise_exc=False)
        assert resp.status_code == 204, resp.text
        return consumer

    def free(self, consumer):
        assert self.a.delete('/allocations/%s' % consumer,
                             raise_exc=False).status_code == 204


@pytest.fixture
def placement(server):
    _wipe(server.adapter())
    return server


@pytest.fixture
def raw(placement):
    return Raw(placement.adapter())


@pytest.fixture
def client(placement):
    return placement.client(retry_wait=0.01, retry_wait_max=0.05)


def uuid_of(name):
    return tree_mod.provider_uuid(name)


# --------------------------------------------------------------------------
# Tests

def test_server_timings_are_sane(placement):
    t = placement.timings
    assert 0 < t.start_s < placement_server.START_TIMEOUT
    assert 0 < t.db_sync_s < 120


def test_first_sync_creates_tree(client, raw):
    tree = build('h1', [t4(AF), t4(B3)], {AF: 'nvidia-223'})
    report = sync.sync(client, tree)

    assert [r.outcome for r in report.results] == [sync.CREATED] * 3
    assert report.root_uuid == uuid_of('h1') and not report.nested
    got = raw.tree(uuid_of('h1'))
    assert sorted(got) == ['h1', 'h1_0000:3b:00.0', 'h1_0000:af:00.0']
    assert got['h1']['parent_provider_uuid'] is None
    for name in ('h1_0000:3b:00.0', 'h1_0000:af:00.0'):
        assert got[name]['uuid'] == uuid_of(name)
        assert got[name]['parent_provider_uuid'] == uuid_of('h1')
        assert got[name]['root_provider_uuid'] == uuid_of('h1')

    vgpu = uuid_of('h1_0000:af:00.0')
    assert raw.inventories(vgpu) == {'VGPU': {
        'total': 8, 'reserved': 0, 'min_unit': 1, 'max_unit': 8,
        'step_size': 1, 'allocation_ratio': 1.0}}
    assert {'OWNER_CYBORG', 'CUSTOM_NVIDIA_1EB8_T4_2B',
            'HW_GPU_MAX_DISPLAY_HEADS_4'} <= raw.traits(vgpu)

    pgpu = uuid_of('h1_0000:3b:00.0')
    assert raw.inventories(pgpu)['PGPU']['total'] == 1
    assert raw.traits(pgpu) == {'OWNER_CYBORG', 'CUSTOM_NVIDIA_1EB8'}
    assert raw.inventories(uuid_of('h1')) == {}
    assert raw.traits(uuid_of('h1')) == set()
    # The custom traits exist now.
    assert raw.get('/traits/CUSTOM_NVIDIA_1EB8_T4_2B').status_code == 204


def test_second_sync_writes_nothing(client, raw):
    tree = build('h2', [t4(AF), t4(B3)], {AF: 'nvidia-223'})
    state = sync.SyncState()
    first = sync.sync(client, tree, state=state)
    assert first.stats.writes > 0

    # Without memory (one-shot CLI): reads only.
    cold = sync.sync(client, tree)
    assert cold.stats.writes == 0, cold.requests
    assert cold.requests == []
    assert {r.outcome for r in cold.results} == {sync.UNCHANGED}
    # in_tree + (inventories + traits) for root and each GPU provider.
    assert cold.stats.total == 1 + 2 * 3

    # With the agent's memory: one GET, whatever the number of GPUs.
    warm = sync.sync(client, tree, state=state)
    assert warm.stats.writes == 0
    assert warm.stats.total == 1
    assert dict(warm.stats.by_method) == {'GET': 1}
    assert not warm.changed


def test_steady_state_rereads_only_what_changed(client, raw):
    tree = build('h2b', [t4(AF), t4(B3)], {AF: 'nvidia-223'})
    state = sync.SyncState()
    sync.sync(client, tree, state=state)
    # A guest allocates on the vGPU provider: its generation moves.
    raw.allocate(uuid_of('h2b_0000:af:00.0'), 1)
    report = sync.sync(client, tree, state=state)
    assert report.stats.writes == 0
    assert report.stats.total == 1 + 2   # in_tree + that provider's reads
    assert sync.sync(client, tree, state=state).stats.total == 1


def test_enabling_another_type_changes_inventories_and_traits(client, raw):
    sync.sync(client, build('h3', [t4(AF), t4(B3)], {AF: 'nvidia-223'}))
    report = sync.sync(client, build('h3', [t4(AF), t4(B3)],
                                     {AF: 'nvidia-223', B3: 'nvidia-222'}))

    outcomes = {r.name: r.outcome for r in report.results}
    assert outcomes == {'h3': sync.UNCHANGED,
                        'h3_0000:af:00.0': sync.UNCHANGED,
                        'h3_0000:3b:00.0': sync.UPDATED}
    b3 = uuid_of('h3_0000:3b:00.0')
    inv = raw.inventories(b3)
    assert set(inv) == {'VGPU'} and inv['VGPU']['total'] == 16
    assert inv['VGPU']['max_unit'] == 16
    traits = raw.traits(b3)
    assert 'CUSTOM_NVIDIA_1EB8_T4_1B' in traits
    assert 'CUSTOM_NVIDIA_1EB8' not in traits
    assert [(r.method, r.url) for r in report.requests] == [
        ('PUT', '/traits/CUSTOM_NVIDIA_1EB8_T4_1B'),
        ('PUT', '/resource_providers/%s/inventories' % b3),
        ('PUT', '/resource_providers/%s/traits' % b3)]


def test_vanished_gpu_provider_is_deleted(client, raw):
    state = sync.SyncState()
    sync.sync(client, build('h4', [t4(AF), t4(B3)], {AF: 'nvidia-223'}),
              state=state)
    b3 = uuid_of('h4_0000:3b:00.0')
    assert raw.exists(b3)

    report = sync.sync(client, build('h4', [t4(AF)], {AF: 'nvidia-223'}),
                       state=state)
    assert report.with_outcome(sync.DELETED)[0].uuid == b3
    assert not raw.exists(b3)
    assert sorted(raw.tree(uuid_of('h4'))) == ['h4', 'h4_0000:af:00.0']


def test_vanished_gpu_with_allocations_is_kept_reserved(client, raw):
    state = sync.SyncState()
    sync.sync(client, build('h5', [t4(AF), t4(B3)], {AF: 'nvidia-223'}),
              state=state)
    af = uuid_of('h5_0000:af:00.0')
    consumer = raw.allocate(af, 2)

    gone = build('h5', [t4(B3)])
    report = sync.sync(client, gone, state=state)
    kept = report.with_outcome(sync.KEPT)
    assert [k.uuid for k in kept] == [af]
    assert consumer in kept[0].detail
    assert raw.exists(af)
    inv = raw.inventories(af)['VGPU']
    assert inv['reserved'] == inv['total'] == 8
    # Nothing more can be allocated there.
    cands = raw.json('/allocation_candidates?resources=VGPU:1&in_tree=%s'
                     % uuid_of('h5'))
    assert cands['allocation_requests'] == []

    # Kept and unchanged: no write; with memory, one read of its
    # allocations (deleting allocations does not move the generation).
    again = sync.sync(client, gone, state=state)
    assert again.stats.writes == 0 and again.stats.total == 2
    assert [k.uuid for k in again.with_outcome(sync.KEPT)] == [af]
    cold = sync.sync(client, gone)
    assert cold.stats.writes == 0

    # The guest goes away: the provider goes too.
    raw.free(consumer)
    final = sync.sync(client, gone, state=state)
    assert [d.uuid for d in final.with_outcome(sync.DELETED)] == [af]
    assert not raw.exists(af)


def test_inventory_in_use_is_final_and_reported(client, raw):
    sync.sync(client, build('h6', [t4(AF), t4(B3)], {AF: 'nvidia-222'}))
    af = uuid_of('h6_0000:af:00.0')
    raw.allocate(af, 2)
    # The operator disables the type of af (it would become a PGPU) while
    # guests hold VGPU there: Placement refuses to drop the VGPU inventory
    # (placement.inventory.inuse). 3b gets a type, which is still written.
    report = sync.sync(client, build('h6', [t4(AF), t4(B3)],
                                     {B3: 'nvidia-223'}))
    failed = report.failed
    assert [f.uuid for f in failed] == [af]
    assert 'stop or migrate them' in failed[0].detail
    assert set(raw.inventories(af)) == {'VGPU'}
    b3 = uuid_of('h6_0000:3b:00.0')
    assert raw.inventories(b3)['VGPU']['total'] == 8

    attempts = []
    client.before_request = attempts.append
    with pytest.raises(placement_client.InventoryInUse):
        client.set_inventories(af, client.get_inventories(af).generation,
                               [tree_mod.Inventory('PGPU', 1)])
    client.before_request = None
    assert [r.method for r in attempts] == ['GET', 'PUT']   # not retried


def test_concurrent_writer_conflict_is_retried(client, raw):
    sync.sync(client, build('h7', [t4(AF)], {AF: 'nvidia-223'}))
    af = uuid_of('h7_0000:af:00.0')
    inv_url = '/resource_providers/%s/inventories' % af
    sent = []

    def intruder(request):
        sent.append((request.method, request.url))
        if request.method == 'PUT' and request.url == inv_url \
                and sent.count(('PUT', inv_url)) == 1:
            # Another writer changes the provider between our read and
            # our write: its generation moves on.
            cur = raw.json('/resource_providers/%s/traits' % af)
            resp = raw.a.put('/resource_providers/%s/traits' % af, json={
                'resource_provider_generation':
                    cur['resource_provider_generation'],
                'traits': ['OWNER_CYBORG']}, raise_exc=False)
            assert resp.status_code == 200, resp.text

    client.before_request = intruder
    report = sync.sync(client, build('h7', [t4(AF)], {AF: 'nvidia-222'}))
    client.before_request = None

    assert not report.failed
    # The first PUT got a 409, the provider was re-read, the PUT retried.
    assert sent.count(('PUT', inv_url)) == 2
    i = sent.index(('PUT', inv_url))
    assert sent[i + 1] == ('GET', '/resource_providers/%s' % af)
    assert raw.inventories(af)['VGPU']['total'] == 16
    assert 'CUSTOM_NVIDIA_1EB8_T4_1B' in raw.traits(af)


def test_endless_conflicts_give_up_with_typed_error(client, raw):
    sync.sync(client, build('h8', [t4(AF)], {AF: 'nvidia-223'}))
    af = uuid_of('h8_0000:af:00.0')
    inv_url = '/resource_providers/%s/inventories' % af
    attempts = []

    def always(request):
        if request.method == 'PUT' and request.url == inv_url:
            attempts.append(request)
            cur = raw.json(inv_url)
            raw.a.put(inv_url, json={
                'resource_provider_generation':
                    cur['resource_provider_generation'],
                'inventories': cur['inventories']})

    client.before_request = always
    with pytest.raises(placement_client.GenerationConflict) as err:
        sync.sync(client, build('h8', [t4(AF)], {AF: 'nvidia-222'}))
    assert len(attempts) == client.conflict_retries
    assert 'next sync will try again' in str(err.value)


def test_two_hosts_allocation_candidates(client, raw, tmp_path):
    profile = simulator.load_profile('t4')
    gpus = {}
    for host in ('host-a', 'host-b'):
        root = tmp_path / host
        simulator.write_sysfs(profile, root)
        found = discovery.from_sysfs(sysfs_mod.Sysfs(str(root)),
                                     kinds=kinds.registered())
        assert found.gpus
        gpus[host] = found.gpus
    addrs = [g.address for g in gpus['host-a'] if g.mdev_type('nvidia-223')]
    assert addrs
    tree_a = build('host-a', gpus['host-a'], {a: 'nvidia-223' for a in addrs})
    tree_b = build('host-b', gpus['host-b'], {a: 'nvidia-222' for a in addrs})
    sync.sync(client, tree_a)
    sync.sync(client, tree_b)

    def candidates(trait):
        body = raw.json('/allocation_candidates?resources=VGPU:1&required=%s'
                        % trait)
        return {rp for req in body['allocation_requests']
                for rp in req['allocations']}

    want_a = {uuid_of(model.gpu_provider_name('host-a', a)) for a in addrs}
    assert candidates('CUSTOM_NVIDIA_1EB8_T4_2B') == want_a
    # On host-b, a GPU whose existing T4-2B vGPUs leave no room for T4-1B
    # has no VGPU provider; the others answer for T4-1B.
    want_b = {c.uuid for c in tree_b.children
              if 'CUSTOM_NVIDIA_1EB8_T4_1B' in c.traits}
    assert want_b and want_b <= {
        uuid_of(model.gpu_provider_name('host-b', a)) for a in addrs}
    assert candidates('CUSTOM_NVIDIA_1EB8_T4_1B') == want_b
    # Every candidate's root is the right compute node.
    body = raw.json('/allocation_candidates?resources=VGPU:1'
                    '&required=CUSTOM_NVIDIA_1EB8_T4_2B')
    roots = {s['root_provider_uuid']
             for s in body['provider_summaries'].values()}
    assert roots == {uuid_of('host-a')}


def test_nests_under_existing_provider_of_same_name(client, raw):
    nova_uuid = str(uuidlib.uuid4())
    resp = raw.a.post('/resource_providers', json={'name': 'compute-9',
                                                   'uuid': nova_uuid})
    assert resp.status_code == 200
    nova_inv = {'VCPU': {'total': 32, 'reserved': 0, 'min_unit': 1,
                         'max_unit': 32, 'step_size': 1,
                         'allocation_ratio': 4.0}}
    raw.a.put('/resource_providers/%s/inventories' % nova_uuid, json={
        'resource_provider_generation': 0, 'inventories': nova_inv})

    tree = build('compute-9', [t4(AF)], {AF: 'nvidia-223'})
    state = sync.SyncState()
    report = sync.sync(client, tree, state=state)
    assert report.nested and report.parent_uuid == nova_uuid
    assert not raw.exists(uuid_of('compute-9'))   # no root of our own
    got = raw.tree(nova_uuid)
    child = got['compute-9_0000:af:00.0']
    assert child['parent_provider_uuid'] == nova_uuid
    assert raw.inventories(child['uuid'])['VGPU']['total'] == 8
    assert raw.inventories(nova_uuid) == nova_inv   # Nova's, untouched

    # Nova updates its own inventory: our steady state is still one GET.
    cur = raw.json('/resource_providers/%s' % nova_uuid)
    nova_inv['VCPU']['total'] = 64
    nova_inv['VCPU']['max_unit'] = 64
    raw.a.put('/resource_providers/%s/inventories' % nova_uuid, json={
        'resource_provider_generation': cur['generation'],
        'inventories': nova_inv})
    again = sync.sync(client, tree, state=state)
    assert again.stats.writes == 0 and again.stats.total == 1
    cold = sync.sync(client, tree)
    assert cold.stats.writes == 0 and cold.nested


def test_foreign_gpu_providers_are_never_deleted(client, raw):
    # Providers named like ours under the same root but not created by us
    # (their uuid is not the one we derive from their name): Nova's own
    # vGPU provider (named as our earlier releases named theirs), and one
    # with our name scheme.
    sync.sync(client, build('h9', [t4(AF)], {AF: 'nvidia-223'}))
    nova = str(uuidlib.uuid4())
    resp = raw.a.post('/resource_providers', json={
        'name': 'h9_pci_0000_d8_00_0', 'uuid': nova,
        'parent_provider_uuid': uuid_of('h9')})
    assert resp.status_code == 200
    foreign = str(uuidlib.uuid4())
    resp = raw.a.post('/resource_providers', json={
        'name': 'h9_0000:d8:00.0', 'uuid': foreign,
        'parent_provider_uuid': uuid_of('h9')})
    assert resp.status_code == 200
    report = sync.sync(client, build('h9', [t4(AF)], {AF: 'nvidia-223'}))
    assert report.stats.writes == 0
    assert raw.exists(foreign) and raw.exists(nova)


def test_name_taken_by_another_provider_is_reported(client, raw):
    # Another provider with our provider's name and another uuid.
    resp = raw.a.post('/resource_providers', json={
        'name': 'h10_0000:af:00.0', 'uuid': str(uuidlib.uuid4())})
    assert resp.status_code == 200
    report = sync.sync(client, build('h10', [t4(AF), t4(B3)],
                                     {AF: 'nvidia-223'}))
    failed = report.failed
    assert [f.name for f in failed] == ['h10_0000:af:00.0']
    assert 'Another service owns' in failed[0].detail
    assert raw.exists(uuid_of('h10_0000:3b:00.0'))


def _on_providers(requests):
    """The requests on providers: not those making the custom traits and
    resource classes, which Placement keeps across the tests' wipes (an
    earlier test of the session may have made them already)."""
    return [r for r in requests if r.url.startswith('/resource_providers')]


def test_dry_run_plans_exactly_what_sync_sends(client, raw):
    tree = build('h11', [t4(AF), t4(B3)], {AF: 'nvidia-223'})
    plan = sync.sync(client, tree, dry_run=True)
    assert plan.dry_run and plan.stats.writes == 0
    assert not raw.exists(uuid_of('h11'))
    first = _on_providers(plan.requests)[0]
    assert first.method == 'POST'
    assert first.body == {'name': 'h11', 'uuid': uuid_of('h11')}

    real = sync.sync(client, tree)
    assert real.requests == plan.requests   # bodies and generations too
    assert real.stats.writes == len(plan.requests)

    changed = build('h11', [t4(AF)], {AF: 'nvidia-222'})
    plan2 = sync.sync(client, changed, dry_run=True)
    assert sorted(r.method for r in _on_providers(plan2.requests)) == [
        'DELETE', 'PUT', 'PUT']
    assert raw.exists(uuid_of('h11_0000:3b:00.0'))
    real2 = sync.sync(client, changed)
    assert real2.requests == plan2.requests


def test_microversion_negotiated(client):
    assert client.microversion == placement_client.MAX_VERSION


def test_agent_once_and_sync_once(placement, raw):
    from oslo_config import cfg

    from libvirt_gpu.conf import agent as agent_conf
    from libvirt_gpu.conf import placement as placement_conf

    conf = cfg.ConfigOpts()
    placement_conf.register_opts(conf)
    agent_conf.register_opts(conf)
    conf([], project='libvirt-gpu-test')
    conf.set_override('endpoint_override', placement.url, group='placement')
    tree = build('h12', [t4(AF)], {AF: 'nvidia-223'})

    dry = agent.sync_once(conf, dry_run=True, tree=tree)
    assert dry.requests and not raw.exists(uuid_of('h12'))
    report = agent.run(conf, lambda: tree, once=True)
    assert [r.outcome for r in report.results] == [sync.CREATED] * 2
    assert raw.inventories(uuid_of('h12_0000:af:00.0'))['VGPU'][
        'total'] == 8
    again = agent.sync_once(conf, url=placement.url, tree=tree)
    assert again.stats.writes == 0


def test_agent_loop_keeps_going_while_placement_is_down(placement, raw):
    from oslo_config import cfg

    from libvirt_gpu.conf import agent as agent_conf
    from libvirt_gpu.conf import placement as placement_conf

    conf = cfg.ConfigOpts()
    placement_conf.register_opts(conf)
    agent_conf.register_opts(conf)
    conf([], project='libvirt-gpu-test')
    conf.set_override('sync_interval', 1, group='agent')
    conf.set_override('backoff_max', 1, group='agent')
    tree = build('h13', [t4(AF)], {AF: 'nvidia-223'})

    # A port nobody listens on: every cycle fails to connect.
    down = placement_client.PlacementClient.from_url('http://127.0.0.1:9')
    stop = threading.Event()
    a = agent.Agent(conf, lambda: tree, client=down, stop_event=stop)
    thread = threading.Thread(target=a.run)
    thread.start()
    try:
        for _ in range(100):
            if a.failures >= 2:
                break
            stop.wait(0.05)
        # Placement comes back (the agent is pointed at the live one).
        a.client = placement.client()
        for _ in range(100):
            if a.last_report is not None:
                break
            stop.wait(0.05)
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()
    assert a.failures >= 2
    assert a.last_report is not None and not a.last_report.failed
    assert raw.exists(uuid_of('h13_0000:af:00.0'))
