"""What ``reconcile`` promises that the rest of the unit layer left open:
each test here fails on a change ``make mutation`` made to
guests/reconcile.py that the other tests stayed green on
(docs/dev/mutation.md): the whole line a report shows for each finding,
what is removed, kept or repaired and what is left untouched, and the
bounds (a lease exactly ``stuck_after`` old, one changed at the very
moment reconcile started).

On the simulated T4 host without vGPUs (``A`` and ``B``, ``nvidia-223``),
libvirt's domains in ``fake_libvirt`` and the real lease store."""

import os
import threading
import time

import pytest

from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.devices.backends import base
from libvirt_gpu.devices.backends import mdev as mdev_backend
from libvirt_gpu.guests import reconcile
from libvirt_gpu.store import state
from tests.doubles import fake_libvirt
from tests.doubles import trees
from tests.doubles import reconcile_world
from tests.doubles import t4_hook as th
from tests.doubles.reconcile_world import A
from tests.doubles.reconcile_world import B
from tests.doubles.reconcile_world import DOM
from tests.doubles.reconcile_world import DOM2
from tests.doubles.reconcile_world import TYPE
from tests.doubles.reconcile_world import World

DOM3 = objects.Uuid.parse('d3000000-0000-4000-8000-000000000003')
FIRST = objects.Uuid.parse('00000000-0000-4000-8000-000000000001')
FIRST_VGPU = objects.Uuid.parse('00000000-0000-4000-8000-0000000000aa')
LAST_VGPU = objects.Uuid.parse('ffffffff-0000-4000-8000-0000000000bb')
NOW = 1_800_000_000.0

world = reconcile_world.world


@pytest.fixture
def frozen(monkeypatch):
    """Every clock reading is ``NOW``: reconcile's start is known."""
    monkeypatch.setattr(time, 'time', lambda: NOW)
    return NOW


def lines(report):
    """``(action, what, uuid, reason)`` of each finding."""
    return [(f.action, f.what, f.uuid, f.reason) for f in report.findings]


# --- the report --------------------------------------------------------------

def test_an_empty_report_says_everything_is_accounted_for(world):
    report = world.reconcile()
    assert report.findings == ()
    assert report.summary() == ('nothing to do: every vGPU and lease is '
                                'accounted for')
    assert report.rows() == [] and report.stuck == []
    assert report.to_json() == {'dry_run': False, 'findings': []}


def test_the_report_counts_each_action_in_order_and_marks_a_dry_run(world):
    orphans = [world.mdev() for _ in range(2)]
    kept = world.mdev(B)
    report = world.reconcile(dry_run=True, covered=(A,))
    assert report.summary() == '1 kept, 2 would remove [dry run]'
    assert report.of(reconcile.KEPT) == [
        f for f in report.findings if f.uuid == kept]
    assert sorted(f.uuid for f in report.would_remove('mdev')) == \
        sorted(orphans)
    assert report.would_remove('lease', 'mdev+lease') == []
    assert report.details() == ()
    report = world.reconcile(covered=(A,))
    assert report.summary() == '1 kept, 2 removed'


def test_the_summary_counts_in_the_order_of_the_actions_names(world):
    incoming = th.new_uuid()        # found first: leases come first
    world.lease(incoming, lease_state=state.RESERVED,
                expires_at=time.time() + 600)
    shared = world.mdev()
    world.domain([shared], dom=DOM2)
    world.domain([shared], dom=DOM3)
    report = world.reconcile(dry_run=True)
    assert [f.action for f in report.findings] == [reconcile.INCOMING,
                                                   reconcile.CONFLICT]
    assert report.summary() == '1 conflict, 1 incoming [dry run]'


def test_rows_and_json_carry_every_field(world):
    uuid = world.mdev()
    world.lease(uuid, domain=DOM, lease_state=state.RESERVED)
    report = world.reconcile(dry_run=True)
    reason = ('no running domain uses it (lease reserved for domain %s, its '
              'process gone)' % DOM)
    assert report.rows() == [(reconcile.WOULD_REMOVE, 'mdev+lease', uuid, A,
                              TYPE, reason)]
    assert report.to_json() == {'dry_run': True, 'findings': [{
        'action': reconcile.WOULD_REMOVE, 'what': 'mdev+lease',
        'uuid': uuid, 'parent': str(A), 'type': TYPE, 'domain_uuid': DOM,
        'reason': reason}]}


def test_json_of_a_finding_without_a_gpu(world):
    world.conn.define(th.domain_xml([('nonsense', TYPE, None)], uuid=DOM2,
                                    name='broken').decode())
    (found,) = world.reconcile(dry_run=True).to_json()['findings']
    assert (found['parent'], found['type'], found['domain_uuid']) == (
        None, None, DOM2)


def test_stuck_lists_stuck_and_conflicting_findings_only(world):
    shared = world.mdev()
    world.domain([shared], dom=DOM2)
    world.domain([shared], dom=DOM3)
    gone = th.new_uuid()
    world.lease(gone, lease_state=state.RESERVED)
    world.domain([gone], dom=DOM)
    report = world.reconcile(dry_run=True)
    assert sorted((f.action, f.uuid) for f in report.stuck) == sorted([
        (reconcile.CONFLICT, shared), (reconcile.STUCK, gone)])


# --- which domains reference what ------------------------------------------

def test_running_and_defined_domains_protect_their_vgpus(world):
    running, stopped, transient = world.mdev(), world.mdev(), world.mdev()
    orphan = world.mdev()
    world.domain([running], dom=DOM)
    world.domain([stopped], dom=DOM2, active=False)
    world.domain([transient], dom=DOM3, persistent=False)
    report = world.reconcile()
    assert lines(report) == [(reconcile.REMOVED, 'mdev', orphan,
                              'no domain references it and it has no '
                              'lease')]
    assert world.mdevs() == {running, stopped, transient}
    refs = reconcile.domain_refs(world.env().host)
    assert refs.running == {running: frozenset([DOM]),
                            transient: frozenset([DOM3])}
    assert refs.defined == {running: frozenset([DOM]),
                            stopped: frozenset([DOM2])}
    assert refs.unreadable == ()


def test_metadata_alone_references_a_vgpu(world):
    uuid = world.mdev()
    world.conn.define(th.domain_xml([(uuid, TYPE, None)],
                                    hostdevs=[]).decode(), active=False)
    assert world.reconcile().findings == ()
    assert world.mdevs() == {uuid}


def test_an_unreadable_domain_keeps_every_unleased_vgpu(world):
    uuid = world.mdev()
    other = world.mdev(B)
    world.conn.define(th.domain_xml([('nonsense', TYPE, None)], uuid=DOM2,
                                    name='broken').decode(), active=True)
    report = world.reconcile()
    bad = [f for f in report.findings if f.what == 'domain']
    # its live and its persistent XML: each said once
    assert [(f.action, f.uuid, f.domain_uuid) for f in bad] == [
        (reconcile.CONFLICT, DOM2, DOM2)] * 2
    assert all(f.reason.startswith('its XML cannot be read: ')
               and 'nonsense' in f.reason for f in bad)
    assert sorted(x for x in lines(report) if x[1] == 'mdev') == sorted(
        (reconcile.KEPT, 'mdev', u, 'no readable domain references it, '
         'but some domain XML could not be read') for u in (uuid, other))
    (kept,) = [f for f in report.of(reconcile.KEPT) if f.uuid == uuid]
    assert (kept.parent, kept.type_id) == (A, TYPE)
    assert world.mdevs() == {uuid, other}


def test_a_domain_undefined_while_listed_is_skipped(world, monkeypatch):
    uuid = world.mdev()
    world.domain([], dom=FIRST)         # listed first
    world.domain([uuid], dom=DOM2)
    real = fake_libvirt.FakeDomain.isActive

    def undefined(self):
        if self.uuid == FIRST:
            raise exception.DomainNotFound(domain=FIRST)
        return real(self)
    monkeypatch.setattr(fake_libvirt.FakeDomain, 'isActive', undefined)
    refs = reconcile.domain_refs(world.env().host)
    assert refs.running == {uuid: frozenset([DOM2])}
    assert refs.unreadable == ()


# --- the connection ----------------------------------------------------------

class MadeUpDriver(fake_libvirt.FakeConnection):

    uri = 'test:///default'

    def getURI(self):
        return self.uri


@pytest.mark.parametrize('uri', ['test:///default',
                                 'test:///etc/host:1.xml'])
def test_libvirts_test_driver_is_refused(world, tmp_path, uri):
    world.conn = MadeUpDriver(tmp_path / 'test-doms')
    world.conn.uri = uri
    uuid = world.mdev()
    with pytest.raises(exception.InvalidInput) as e:
        world.reconcile()
    assert str(e.value).endswith(
        "reconcile needs the libvirt that runs this host's guests; "
        "%s is libvirt's test driver, which knows none of "
        'them (every vGPU would look unused): connect to qemu:///system '
        'with -c' % uri)
    assert world.mdevs() == {uuid}


@pytest.mark.parametrize('uri', [None, '', 'testing:///x',
                                 'qemu+ssh://test/system'])
def test_other_uris_are_accepted(world, tmp_path, uri):
    world.conn = MadeUpDriver(tmp_path / 'doms2')
    world.conn.uri = uri
    assert world.reconcile().findings == ()


# --- leases ------------------------------------------------------------------

def test_an_orphan_lease_is_removed_with_its_vgpu(world):
    uuid, bare = world.mdev(), th.new_uuid()
    other = world.mdev(B)
    world.lease(uuid, domain=DOM)
    world.lease(bare, domain=None, parent=B)
    world.lease(other, domain=DOM2, parent=B)
    world.domain([other], dom=DOM2)
    report = world.reconcile()
    assert sorted(lines(report)) == sorted([
        (reconcile.REMOVED, 'mdev+lease', uuid,
         'no running domain uses it (lease created for domain %s, its '
         'process gone)' % DOM),
        (reconcile.REMOVED, 'lease', bare,
         'no running domain uses it (lease created for domain -, its '
         'process gone)')])
    found = {f.uuid: f for f in report.findings}
    assert (found[uuid].parent, found[uuid].type_id,
            found[uuid].domain_uuid) == (A, TYPE, DOM)
    assert (found[bare].parent, found[bare].domain_uuid) == (B, None)
    assert world.mdevs() == {other}
    assert set(world.leases()) == {other}


def test_a_dry_run_changes_nothing(world):
    orphan, leased, used = world.mdev(), world.mdev(), world.mdev()
    world.lease(leased)
    world.lease(used, domain=DOM2, lease_state=state.RESERVED)
    world.domain([used], dom=DOM2)
    before = world.leases()
    planned = []
    report = world.reconcile(dry_run=True, on_plan=planned.append)
    assert sorted((f.action, f.uuid) for f in report.findings) == sorted([
        (reconcile.WOULD_REMOVE, orphan), (reconcile.WOULD_REMOVE, leased),
        (reconcile.WOULD_REPAIR, used)])
    assert planned == []
    assert world.leases() == before
    assert world.mdevs() == {orphan, leased, used}


def test_a_dry_run_never_waits_for_the_lease_lock(world):
    """``libvirt-gpu exporter`` runs one per scrape: a guest start
    holding the lock must not hold it up."""
    uuid = world.mdev()
    with world.store.transaction():
        report = world.reconcile(dry_run=True)
    assert [(f.action, f.uuid) for f in report.findings] == [
        (reconcile.WOULD_REMOVE, uuid)]


def test_the_plan_is_announced_before_anything_is_removed(world):
    uuid = world.mdev()
    leased = world.mdev(B)
    world.lease(leased, parent=B)
    seen = []

    def on_plan(findings):
        seen.append((sorted((f.action, f.what, f.uuid, f.parent,
                             f.type_id, f.domain_uuid, f.reason)
                            for f in findings), world.mdevs()))
    report = world.reconcile(on_plan=on_plan)
    assert seen == [(sorted([
        (reconcile.WOULD_REMOVE, 'mdev', uuid, A, TYPE, None,
         'no domain references it and it has no lease'),
        (reconcile.WOULD_REMOVE, 'mdev+lease', leased, B, TYPE, DOM,
         'no running domain uses it (lease created for domain %s, its '
         'process gone)' % DOM)]), {uuid, leased})]
    assert [f.reason for f in report.findings if f.uuid == uuid] == [
        'no domain references it and it has no lease']
    assert world.mdevs() == set()


def test_nothing_planned_announces_nothing(world):
    seen = []
    world.domain([world.mdev()])
    world.reconcile(on_plan=seen.append)
    assert seen == []


def test_a_used_lease_left_reserved_is_marked_created(world):
    uuid = world.mdev()
    world.lease(uuid, lease_state=state.RESERVED)
    world.domain([uuid])
    report = world.reconcile(dry_run=True)
    assert lines(report) == [(reconcile.WOULD_REPAIR, 'lease', uuid,
                              'in use by its running domain: reserved -> '
                              'created')]
    assert world.leases()[uuid].state == state.RESERVED
    report = world.reconcile()
    assert lines(report) == [(reconcile.REPAIRED, 'lease', uuid,
                              'in use by its running domain: reserved -> '
                              'created')]
    assert report.findings[0].domain_uuid == DOM
    lease = world.leases()[uuid]
    assert (lease.state, lease.pid) == (state.CREATED, os.getpid())
    assert world.reconcile().findings == ()       # nothing left to do
    assert world.mdevs() == {uuid}


def test_a_lease_used_by_another_domain_is_a_conflict(world):
    uuid = world.mdev()
    world.lease(uuid, domain=DOM)
    world.domain([uuid], dom=DOM2)
    report = world.reconcile()
    assert lines(report) == [(reconcile.CONFLICT, 'lease', uuid,
                              'leased to domain %s but used by running '
                              'domain(s) %s' % (DOM, DOM2))]
    assert (report.findings[0].parent, report.findings[0].type_id,
            report.findings[0].domain_uuid) == (A, TYPE, DOM)
    assert world.mdevs() == {uuid} and set(world.leases()) == {uuid}


def test_each_lease_is_judged_after_a_used_one(world):
    used, orphan = world.mdev(), world.mdev()
    world.lease(used)                   # leases are judged as made
    world.lease(orphan)
    world.domain([used])
    report = world.reconcile()
    assert [(f.action, f.uuid) for f in report.findings] == [
        (reconcile.REMOVED, orphan)]
    assert world.mdevs() == {used}


def test_a_leased_vgpu_used_by_two_domains_is_a_conflict(world):
    uuid = world.mdev()
    world.lease(uuid, domain=DOM)
    world.domain([uuid], dom=DOM)
    world.domain([uuid], dom=DOM2)
    report = world.reconcile()
    assert lines(report) == [(reconcile.CONFLICT, 'mdev', uuid,
                              'used by 2 running domains')]
    assert (report.findings[0].parent, report.findings[0].type_id,
            report.findings[0].domain_uuid) == (A, TYPE, DOM)
    world.conn.lookupByUUIDString(DOM).set_active(False)
    world.domain([uuid], dom=DOM3)
    report = world.reconcile()
    assert lines(report) == [
        (reconcile.CONFLICT, 'lease', uuid,
         'leased to domain %s but used by running domain(s) %s'
         % (DOM, ', '.join(sorted([DOM2, DOM3])))),
        (reconcile.CONFLICT, 'mdev', uuid, 'used by 2 running domains')]
    assert world.mdevs() == {uuid}


def test_a_running_domains_missing_vgpu_is_reported_not_repaired(world):
    uuid = th.new_uuid()
    world.lease(uuid, lease_state=state.RESERVED)
    world.domain([uuid])
    report = world.reconcile()
    assert lines(report) == [(reconcile.STUCK, 'mdev', uuid,
                              'a running domain uses it but it does not '
                              'exist')]
    assert (report.findings[0].parent, report.findings[0].type_id,
            report.findings[0].domain_uuid) == (A, TYPE, DOM)
    assert world.leases()[uuid].state == state.RESERVED


def test_a_live_holder_is_left_alone_until_stuck(world, frozen):
    young, old = world.mdev(), world.mdev()
    holder = os.getppid()
    world.lease(young, pid=holder, updated_at=NOW - 300,
                lease_state=state.RESERVED)
    world.lease(old, pid=holder, updated_at=NOW - 300.4,
                lease_state=state.REMOVING)
    report = world.reconcile(stuck_after=300)
    assert lines(report) == [(reconcile.STUCK, 'lease', old,
                              'process %d has held it (removing) for 300 s'
                              % holder)]
    assert report.findings[0].parent == A
    report = world.reconcile(stuck_after=299.5)
    assert sorted(f.uuid for f in report.of(reconcile.STUCK)) == sorted(
        [young, old])
    report = world.reconcile()              # 300 s unless told
    assert [f.uuid for f in report.of(reconcile.STUCK)] == [old]
    assert world.mdevs() == {young, old}


def test_a_lease_of_this_process_is_judged(world):
    uuid = world.mdev()
    world.lease(uuid, pid=os.getpid())
    report = world.reconcile()
    assert [(f.action, f.uuid) for f in report.findings] == [
        (reconcile.REMOVED, uuid)]
    assert world.leases() == {} and world.mdevs() == set()


def test_a_lease_changed_as_reconcile_started_is_left_alone(world, frozen):
    # both made at NOW: the one left alone is listed first (by UUID)
    now = world.mdev(uuid=FIRST_VGPU)
    before = world.mdev(uuid=LAST_VGPU)
    world.lease(now, updated_at=NOW)
    world.lease(before, updated_at=NOW - 0.001)
    report = world.reconcile()
    assert [(f.action, f.uuid) for f in report.findings] == [
        (reconcile.REMOVED, before)]
    assert world.mdevs() == {now}


def test_an_incoming_reservation_is_listed_and_kept(world, frozen):
    uuid, anonymous = th.new_uuid(), th.new_uuid()
    world.lease(uuid, lease_state=state.RESERVED, expires_at=NOW + 90.4)
    world.lease(anonymous, domain=None, lease_state=state.RESERVED,
                expires_at=NOW + 0.6)
    report = world.reconcile()
    clock = time.strftime('%H:%M:%S', time.localtime(NOW + 90.4))
    found = {f.uuid: f for f in report.findings}
    assert len(found) == 2
    assert (found[uuid].action, found[uuid].what, found[uuid].reason) == (
        reconcile.INCOMING, 'lease',
        'reserved for the incoming live migration of domain %s until %s '
        '(90 s left); its prepare takes it over, else reconcile frees it '
        'once it has expired' % (DOM, clock))
    assert found[anonymous].reason.startswith(
        'reserved for the incoming live migration of domain - until ')
    assert '(1 s left)' in found[anonymous].reason
    assert (found[uuid].parent, found[uuid].type_id,
            found[uuid].domain_uuid) == (A, TYPE, DOM)
    assert set(world.leases()) == {uuid, anonymous}


def test_a_reservation_expiring_as_reconcile_starts_is_freed(world, frozen):
    uuid, created = th.new_uuid(), world.mdev()
    world.lease(uuid, domain=None, lease_state=state.RESERVED,
                expires_at=NOW)
    world.lease(created, lease_state=state.CREATED, expires_at=NOW - 1)
    report = world.reconcile()
    clock = time.strftime('%H:%M:%S', time.localtime(NOW))
    assert sorted(lines(report)) == sorted([
        (reconcile.REMOVED, 'lease', uuid,
         'the incoming live migration of domain - reserved it until %s and '
         'its prepare never came' % clock),
        (reconcile.REMOVED, 'mdev+lease', created,
         'no running domain uses it (lease created for domain %s, its '
         'process gone)' % DOM)])
    assert world.leases() == {} and world.mdevs() == set()


def test_a_leased_vgpu_is_not_judged_again_as_unleased(world):
    uuid = world.mdev()
    world.lease(uuid, pid=os.getppid())       # a live holder
    assert world.reconcile().findings == ()
    assert world.mdevs() == {uuid}


# --- vGPUs without a lease ---------------------------------------------------

def test_only_a_covered_gpus_vgpus_are_judged(world):
    ours, theirs = world.mdev(A), world.mdev(B)
    report = world.reconcile(covered=(A,))
    assert lines(report) == [
        (reconcile.KEPT, 'mdev', theirs, 'unreferenced, but on a GPU the '
         'configuration does not enable and not made by us'),
        (reconcile.REMOVED, 'mdev', ours,
         'no domain references it and it has no lease')]
    assert (report.findings[0].parent, report.findings[0].type_id) == (
        B, TYPE)
    assert world.mdevs() == {theirs}
    assert world.reconcile(covered=()).of(reconcile.REMOVED) == []


def test_covered_takes_parsed_addresses_only(world):
    uuid = world.mdev(B)
    with pytest.raises(TypeError) as e:
        world.reconcile(covered=(str(B),))
    assert str(e.value).startswith('covered[] must be an objects.PciAddress')
    assert world.mdevs() == {uuid}
    report = world.reconcile(covered=(B,))
    assert [f.action for f in report.findings] == [reconcile.REMOVED]
    assert uuid not in world.mdevs()


def test_an_unleased_vgpu_used_by_two_domains_is_a_conflict(world):
    uuid = world.mdev()
    world.domain([uuid], dom=DOM)
    world.domain([uuid], dom=DOM2)
    world.domain([uuid], dom=DOM3, active=False)
    report = world.reconcile()
    assert lines(report) == [(reconcile.CONFLICT, 'mdev', uuid,
                              'used by 2 running domains: %s'
                              % ', '.join(sorted([DOM, DOM2])))]
    assert (report.findings[0].parent, report.findings[0].type_id) == (
        A, TYPE)
    assert world.mdevs() == {uuid}


def test_an_unreferenced_vgpu_used_by_a_domain_elsewhere_is_kept(world):
    uuid = world.mdev(B)
    world.domain([uuid], dom=DOM2)
    assert world.reconcile(covered=(A,)).findings == ()
    assert world.mdevs() == {uuid}


def test_an_mdevctl_definition_keeps_an_unreferenced_vgpu(world):
    uuid = world.mdev(uuid=FIRST_VGPU)              # judged first
    orphan = world.mdev(uuid=LAST_VGPU)
    os.makedirs(os.path.join(world.mdevctl_dir, str(A)))
    with open(os.path.join(world.mdevctl_dir, str(A), uuid), 'w') as f:
        f.write('{"mdev_type": "%s", "start": "manual", "attrs": []}'
                % TYPE)
    report = world.reconcile()
    assert lines(report) == [(reconcile.KEPT, 'mdev', uuid,
                              'unreferenced, but defined by mdevctl (%s)'
                              % world.mdevctl_dir),
                             (reconcile.REMOVED, 'mdev', orphan,
                              'no domain references it and it has no '
                              'lease')]
    assert (report.findings[0].parent, report.findings[0].type_id) == (
        A, TYPE)
    assert world.mdevs() == {uuid}


def test_an_unleased_orphan_is_claimed_while_it_is_removed(
        world, monkeypatch):
    uuid = world.mdev()
    seen = []
    real = mdev_backend.MdevBackend.remove

    def remove(self, vgpu):
        seen.append(world.leases().get(vgpu))
        return real(self, vgpu)
    monkeypatch.setattr(mdev_backend.MdevBackend, 'remove', remove)
    world.reconcile()
    (lease,) = seen
    assert (lease.vgpu_uuid, lease.domain_uuid, lease.parent, lease.type_id,
            lease.state, lease.pid) == (uuid, None, A, TYPE, state.REMOVING,
                                        os.getpid())
    assert world.leases() == {} and world.mdevs() == set()


def test_a_dry_run_claims_nothing(world, monkeypatch):
    uuid = world.mdev()
    leased = world.mdev()
    world.lease(leased)
    world.reconcile(dry_run=True)
    assert set(world.leases()) == {leased}
    assert world.leases()[leased].state == state.CREATED
    assert world.mdevs() == {uuid, leased}


# --- removal -----------------------------------------------------------------

def test_a_removal_that_fails_is_stuck_and_keeps_its_lease(
        world, monkeypatch):
    uuid, unleased = world.mdev(), world.mdev(B)
    world.lease(uuid)

    def refuse(self, vgpu):
        raise exception.MdevRemoveFailed(uuid=vgpu, reason='device busy')
    monkeypatch.setattr(mdev_backend.MdevBackend, 'remove', refuse)
    report = world.reconcile()
    assert sorted(f.uuid for f in report.of(reconcile.STUCK)) == sorted(
        [uuid, unleased])               # each tried
    (finding,) = [f for f in report.findings if f.uuid == uuid]
    assert (finding.action, finding.what, finding.uuid, finding.reason,
            finding.parent, finding.domain_uuid) == (
        reconcile.STUCK, 'mdev+lease', uuid,
        str(exception.MdevRemoveFailed(uuid=uuid, reason='device busy')),
        A, DOM)
    assert world.mdevs() == {uuid, unleased}
    leases = world.leases()
    assert {u: (lease.state, lease.pid) for u, lease in leases.items()} \
        == {u: (state.REMOVING, os.getpid()) for u in (uuid, unleased)}


def test_a_removal_that_hangs_is_given_up_after_the_timeout(
        world, monkeypatch):
    uuid = world.mdev()
    let_go = threading.Event()

    def hang(self, vgpu):
        let_go.wait(10)
    monkeypatch.setattr(mdev_backend.MdevBackend, 'remove', hang)
    try:
        report = world.reconcile(remove_timeout=0.2)
    finally:
        let_go.set()
    assert lines(report) == [(reconcile.STUCK, 'mdev', uuid,
                              'its removal did not finish within 0 s; a '
                              'process may still hold the device')]


def test_without_a_timeout_the_default_one_applies(world, monkeypatch):
    uuid = world.mdev()
    let_go = threading.Event()

    def hang(self, vgpu):
        let_go.wait(10)
    monkeypatch.setattr(mdev_backend.MdevBackend, 'remove', hang)
    monkeypatch.setattr(reconcile, 'REMOVE_TIMEOUT', 0.6)
    try:
        report = world.reconcile(remove_timeout=None)
    finally:
        let_go.set()
    assert [f.reason for f in report.findings] == [
        'its removal did not finish within 1 s; a process may still hold '
        'the device']
    assert uuid in world.mdevs()


def test_only_leases_this_process_claimed_are_dropped(world, monkeypatch):
    uuid = world.mdev()
    world.lease(uuid)
    real = mdev_backend.MdevBackend.remove

    def taken_over(self, vgpu):
        # another process takes the lease over while the vGPU goes
        real(self, vgpu)
        with state.LeaseStore(world.state_dir).transaction() as txn:
            txn._db.execute('UPDATE leases SET pid = ? WHERE mdev_uuid = ?',
                            (os.getppid(), vgpu))
    monkeypatch.setattr(mdev_backend.MdevBackend, 'remove', taken_over)
    report = world.reconcile()
    assert [f.action for f in report.findings] == [reconcile.REMOVED]
    assert set(world.leases()) == {uuid}


# --- borrowed vGPUs ----------------------------------------------------------

def _borrow(world, uuid, domain, since):
    with world.store.transaction() as txn:
        txn.borrow(uuid, domain)
        txn._db.execute('UPDATE borrowed SET created_at = ? WHERE '
                        'mdev_uuid = ?', (since, uuid))


def _borrowed(world):
    with world.store.transaction() as txn:
        return {u: d for u, (d, _) in txn.borrowed().items()}


def test_a_borrow_of_a_domain_no_longer_running_is_returned(world, frozen):
    uuid = world.mdev(B)
    world.domain([uuid], dom=DOM2, active=False)
    _borrow(world, uuid, DOM2, NOW - 0.001)
    reason = ('domain %s no longer runs: it no longer holds this existing '
              'vGPU' % DOM2)
    report = world.reconcile(dry_run=True, covered=(A,))
    assert lines(report) == [(reconcile.WOULD_REPAIR, 'borrowed', uuid,
                              reason)]
    assert report.findings[0].domain_uuid == DOM2
    assert _borrowed(world) == {uuid: DOM2}
    report = world.reconcile(covered=(A,))
    assert lines(report) == [(reconcile.REPAIRED, 'borrowed', uuid, reason)]
    assert _borrowed(world) == {}
    assert world.mdevs() == {uuid}


def test_a_borrow_still_running_or_just_made_is_kept(world, frozen):
    running, new = world.mdev(B), world.mdev(B)
    world.domain([running], dom=DOM2)
    world.domain([new], dom=DOM3, active=False)
    _borrow(world, running, DOM2, NOW - 5)
    _borrow(world, new, DOM3, NOW)
    assert world.reconcile(covered=(A,)).findings == ()
    assert _borrowed(world) == {running: DOM2, new: DOM3}


def test_a_running_domains_persistent_xml_protects_its_vgpus_too(world):
    """Attached for the next boot only (in the persistent XML, not the
    live one), or detached for the next boot only: both are referenced."""
    next_boot, this_boot = world.mdev(), world.mdev()
    world.domain([next_boot], dom=DOM)
    world.domain([this_boot], dom=DOM2)
    with world.conn.locked():
        for dom, xml in ((DOM, th.domain_xml([], uuid=DOM)),
                         (DOM2, None)):
            record = world.conn.load(dom)
            if xml is None:
                record['config'] = th.domain_xml([], uuid=DOM2).decode()
            else:
                record['live'] = xml.decode()
            world.conn.save(record)
    refs = reconcile.domain_refs(world.env().host)
    assert refs.running == {this_boot: frozenset([DOM2])}
    assert refs.defined == {next_boot: frozenset([DOM])}
    assert world.reconcile().findings == ()
    assert world.mdevs() == {next_boot, this_boot}


def test_a_hostdev_alone_references_a_vgpu(world):
    uuid = world.mdev()
    world.conn.define(th.domain_xml(hostdevs=[uuid]).decode(), active=True)
    assert world.reconcile().findings == ()
    assert world.mdevs() == {uuid}


# --- which GPUs' vGPUs are ours to judge ------------------------------------

@pytest.fixture
def a100(tmp_path):
    with trees.simulated_tree('a100', without_mdevs=True) as (root, profile):
        yield World(root, profile, tmp_path)


PF = objects.PciAddress.parse('0000:41:00.0')
VF = objects.PciAddress.parse('0000:41:00.4')


def test_a_vfs_vgpu_is_judged_by_its_physical_gpu(a100):
    uuid = th.new_uuid()
    a100.sysfs.kernel.create(VF, 'nvidia-472', uuid)
    report = a100.reconcile(dry_run=True, covered=(VF,))
    assert [(f.action, f.uuid) for f in report.findings] == [
        (reconcile.WOULD_REMOVE, uuid)]
    report = a100.reconcile(dry_run=True, covered=())
    assert [(f.action, f.uuid, f.parent) for f in report.findings] == [
        (reconcile.KEPT, uuid, VF)]
    report = a100.reconcile(covered=(PF,))
    assert [(f.action, f.uuid) for f in report.findings] == [
        (reconcile.REMOVED, uuid)]
    assert a100.mdevs() == set()


@pytest.fixture
def l40s(tmp_path):
    with trees.simulated_tree('l40s', without_mdevs=True) as (root, profile):
        yield World(root, profile, tmp_path)


def test_a_vgpu_we_recorded_is_ours_on_any_gpu(l40s):
    """A vendor-interface vGPU of ours (in the kind's own records) without
    a lease: judged although no GPU is covered."""
    uuid = th.new_uuid()
    vf = objects.PciAddress.parse('0000:bd:00.4')
    l40s.env().vgpus.prepare(base.VgpuDevice(
        uuid=uuid, parent=vf, type_id=objects.TypeId.parse('nvidia-1145')))
    report = l40s.reconcile(dry_run=True, covered=())
    assert [(f.action, f.what, f.uuid, f.parent, f.reason)
            for f in report.findings] == [
        (reconcile.WOULD_REMOVE, 'mdev', uuid, vf,
         'no domain references it and it has no lease')]


def test_a_lease_dropped_by_another_process_meanwhile_is_fine(
        world, monkeypatch):
    uuid = world.mdev()
    world.lease(uuid)
    real = mdev_backend.MdevBackend.remove

    def released(self, vgpu):
        real(self, vgpu)
        with state.LeaseStore(world.state_dir).transaction() as txn:
            txn.delete(vgpu)          # a release that came meanwhile
    monkeypatch.setattr(mdev_backend.MdevBackend, 'remove', released)
    report = world.reconcile()
    assert [(f.action, f.uuid) for f in report.findings] == [
        (reconcile.REMOVED, uuid)]
    assert world.leases() == {}


def test_a_running_domain_gives_back_only_what_it_no_longer_uses(
        world, frozen):
    kept = world.mdev(B, uuid=FIRST_VGPU)          # judged first
    unplugged = world.mdev(B, uuid=LAST_VGPU)
    world.domain([kept], dom=DOM2)
    world.domain([unplugged], dom=DOM3, active=False)
    _borrow(world, kept, DOM2, NOW - 5)
    _borrow(world, unplugged, DOM2, NOW - 5)
    report = world.reconcile(covered=(A,))
    assert [(f.action, f.uuid) for f in report.findings] == [
        (reconcile.REPAIRED, unplugged)]
    assert _borrowed(world) == {kept: DOM2}
