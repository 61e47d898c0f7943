"""reconcile: what it removes, repairs, keeps and reports."""

import errno
import os
import threading
import uuid as uuidlib

import pytest

from libvirt_gpu import objects
from libvirt_gpu.virt import config_xml
from libvirt_gpu import environment
from libvirt_gpu import exception
from libvirt_gpu.virt import host as host_mod
from libvirt_gpu.virt import metadata
from libvirt_gpu.guests import reconcile
from libvirt_gpu.store import state
from tests.doubles import kernel_sysfs
from tests.doubles import trees
from tests.doubles import fake_libvirt
from tests.functional import libvirtd

A = '0000:3b:00.0'
B = '0000:af:00.0'
PRE1 = '4b20d080-1b54-4048-85b3-a6a62d165c01'     # on B, in the profile
PRE2 = 'b1ae8bf6-38b0-4c81-9d44-78ce3f520496'


class World(object):
    def __init__(self, root, profile, tmp_path):
        self.sysfs = kernel_sysfs.KernelSysfs(root, profile)
        self.store = state.LeaseStore(tmp_path / 'state')
        self.conn = fake_libvirt.FakeConnection(tmp_path / 'domains')
        self.mdevctl_dir = str(tmp_path / 'mdevctl.d')

    def run(self, **kwargs):
        # Both T4s are GPUs the configuration would enable.
        kwargs.setdefault('covered', (objects.PciAddress.parse(A),
                                      objects.PciAddress.parse(B)))
        return reconcile.reconcile(
            self.env(host_mod.Host.from_connection(self.conn),
                     remove_timeout=kwargs.pop('remove_timeout', None)),
            **kwargs)

    def env(self, host, remove_timeout=None):
        return environment.Environment(
            self.store.state_dir, sysfs=self.sysfs, host=host,
            mdevctl_dir=self.mdevctl_dir, remove_timeout=remove_timeout)

    def domain(self, name, uuids=(), active=True, meta_only=()):
        meta = metadata.render_document(metadata.GpuMetadata(vgpus=tuple(
            metadata.VgpuEntry(objects.Uuid.parse(u),
                               objects.TypeId.parse('nvidia-223'))
            for u in meta_only)))
        return self.conn.define(libvirtd.tiny_domain_xml(
            name, metadata=meta if meta_only else '',
            extra_devices=''.join(
                config_xml.mdev_hostdev(objects.Uuid.parse(u))
                for u in uuids)), active=active)

    def create(self, parent=A):
        u = str(uuidlib.uuid4())
        self.sysfs.kernel.create(parent, 'nvidia-223', u)
        return u

    def lease(self, uuid, domain, parent=A, st=state.CREATED, pid=None,
              age=0.0):
        with self.store.transaction() as txn:
            txn.add(objects.Uuid.parse(uuid),
                    domain and objects.Uuid.parse(domain),
                    objects.PciAddress.parse(parent),
                    objects.TypeId.parse('nvidia-223'), st)
            txn._db.execute(
                'UPDATE leases SET pid = ?, pid_start = NULL, '
                'updated_at = updated_at - ? WHERE mdev_uuid = ?',
                (pid if pid is not None else 2 ** 22 + 3, age + 1.0, uuid))

    def mdevs(self):
        return set(self.sysfs.kernel.mdevs())


@pytest.fixture
def world(tmp_path):
    with trees.simulated_tree('t4') as tree:
        yield World(tree[0], tree[1], tmp_path)


def by_uuid(report):
    return {f.uuid: f for f in report.findings}


def test_dry_run_changes_nothing_then_orphans_go(world):
    report = world.run(dry_run=True)
    assert {f.uuid: f.action for f in report.findings} == {
        PRE1: reconcile.WOULD_REMOVE, PRE2: reconcile.WOULD_REMOVE}
    assert world.mdevs() == {PRE1, PRE2} and world.store.leases() == []
    report = world.run()
    assert {f.uuid: f.action for f in report.findings} == {
        PRE1: reconcile.REMOVED, PRE2: reconcile.REMOVED}
    assert world.mdevs() == set() and world.store.leases() == []
    assert world.run().findings == ()


def test_referenced_and_defined_mdevs_are_kept(world):
    world.domain('stopped', [PRE1], active=False)
    d = os.path.join(world.mdevctl_dir, B)
    os.makedirs(d)
    with open(os.path.join(d, PRE2), 'w') as f:
        f.write('{"mdev_type": "nvidia-223", "start": "auto"}')
    report = world.run()
    assert world.mdevs() == {PRE1, PRE2}
    assert [f.uuid for f in report.of(reconcile.KEPT)] == [PRE2]
    assert 'mdevctl' in report.of(reconcile.KEPT)[0].reason


def test_lease_of_a_used_vgpu_is_repaired_unused_one_removed(world):
    used, unused = world.create(), world.create()
    dom = world.domain('running', [used])
    world.lease(used, dom.uuid, st=state.RESERVED)
    world.lease(unused, dom.uuid, st=state.CREATED)
    missing = str(uuidlib.uuid4())
    world.lease(missing, dom.uuid, st=state.RESERVED)  # never created
    found = by_uuid(world.run())
    assert found[used].action == reconcile.REPAIRED
    assert found[unused].action == reconcile.REMOVED
    assert found[unused].what == 'mdev+lease'
    assert found[missing].action == reconcile.REMOVED
    assert found[missing].what == 'lease'
    leases = {lease.vgpu_uuid: lease.state
              for lease in world.store.leases()}
    assert leases == {used: state.CREATED}
    assert used in world.mdevs() and unused not in world.mdevs()


def test_work_in_progress_is_left_alone_until_stuck(world):
    u = world.create()
    world.lease(u, str(uuidlib.uuid4()), st=state.RESERVED, pid=os.getppid())
    found = by_uuid(world.run(stuck_after=60))
    assert u not in found and u in world.mdevs()
    world.lease(str(uuidlib.uuid4()), None, st=state.RESERVED,
                pid=os.getppid(), age=600)
    report = world.run(stuck_after=60)
    stuck = report.of(reconcile.STUCK)
    assert len(stuck) == 1 and 'has held it' in stuck[0].reason
    assert u in world.mdevs()


def test_running_domain_with_a_missing_vgpu_is_reported(world):
    u = str(uuidlib.uuid4())
    dom = world.domain('broken', [u])
    world.lease(u, dom.uuid)
    (finding,) = world.run().of(reconcile.STUCK)
    assert finding.uuid == u and 'does not exist' in finding.reason


def test_conflicts_are_reported(world):
    a = world.domain('a', [PRE1])
    world.domain('b', [PRE1])
    u = world.create()
    world.domain('c', [u])
    world.lease(u, a.uuid)
    report = world.run()
    conflicts = {f.uuid: f.reason for f in report.of(reconcile.CONFLICT)}
    assert 'used by 2 running domains' in conflicts[PRE1]
    assert 'leased to domain %s' % a.uuid in conflicts[u]
    assert report.stuck and world.mdevs() >= {PRE1, u}


def test_unreadable_domain_blocks_removal_of_unleased_mdevs(world):
    dom = world.domain('ok')
    record = world.conn.load(dom.uuid)
    record['live'] = record['live'].replace(
        '<devices>', "<devices><hostdev mode='subsystem' type='mdev' "
        "model='vfio-pci'><source><address uuid='../../x'/></source>"
        "</hostdev>")
    world.conn.save(record)
    report = world.run()
    assert [f.what for f in report.of(reconcile.CONFLICT)] == ['domain']
    assert {f.uuid for f in report.of(reconcile.KEPT)} == {PRE1, PRE2}
    assert world.mdevs() == {PRE1, PRE2}


def test_a_removal_that_blocks_is_reported_stuck(world):
    holder_gone = threading.Event()     # the guest never lets go meanwhile
    finished = []

    class Held(kernel_sysfs.KernelSysfs):
        def write(self, path, data):
            if path.endswith('/remove'):
                holder_gone.wait(60)    # the kernel waits for the holder
                finished.append(path)
                raise exception.SysfsWriteError(path=path, reason='busy',
                                                errno=errno.EINTR)
            return super().write(path, data)
    world.sysfs = Held(world.sysfs.root, world.sysfs.profile)
    try:
        report = world.run(remove_timeout=0.3)
        # reconcile gave up on the blocked removals instead of waiting
        assert finished == []
    finally:
        holder_gone.set()
    assert {f.uuid for f in report.of(reconcile.STUCK)} == {PRE1, PRE2}
    assert all('did not finish' in f.reason for f in report.stuck)
    # the claim stays (removing, holder gone): the next run retries
    assert {lease.state for lease in world.store.leases()} == {
        state.REMOVING}


# --- scope, announcements, races (issue: reconcile hardening) ---------------

class _StartsAGuestWhileListed(object):
    """A libvirt connection on which a guest starts right after reconcile
    has listed the domains: its hook creates a vGPU and takes a lease
    (and has exited by the time reconcile takes the lock)."""

    def __init__(self, conn, during):
        self._conn, self._during = conn, during

    def __getattr__(self, name):
        return getattr(self._conn, name)

    def listAllDomains(self, flags=0):
        listed = self._conn.listAllDomains(flags)
        self._during()
        return listed


def test_lease_taken_after_the_domains_were_listed_is_left_alone(world):
    taken = {}

    def guest_starts():
        u = world.create()
        dom = str(uuidlib.uuid4())
        with world.store.transaction() as txn:
            txn.add(objects.Uuid.parse(u), objects.Uuid.parse(dom),
                    objects.PciAddress.parse(A),
                    objects.TypeId.parse('nvidia-223'), state.CREATED)
            # its hook process has exited (pid of no process), but the
            # lease is newer than reconcile's list of domains
            txn._db.execute('UPDATE leases SET pid = ?, pid_start = NULL '
                            'WHERE mdev_uuid = ?', (2 ** 22 + 3, u))
        taken['uuid'], taken['domain'] = u, dom

    conn = _StartsAGuestWhileListed(world.conn, guest_starts)
    report = reconcile.reconcile(
        world.env(host_mod.Host.from_connection(conn)),
        covered=(objects.PciAddress.parse(A), objects.PciAddress.parse(B)))
    u = taken['uuid']
    assert u not in by_uuid(report)
    assert u in world.mdevs()
    assert [(lease.vgpu_uuid, lease.domain_uuid, lease.state)
            for lease in world.store.leases()] == [
        (u, taken['domain'], state.CREATED)]
    # the profile's own unused mdevs were judged as usual
    assert {f.uuid for f in report.of(reconcile.REMOVED)} == {PRE1, PRE2}


def test_unleased_mdevs_on_gpus_not_configured_are_kept(world):
    # The configuration enables only GPU A; PRE1 and PRE2 (on B) were made
    # by someone else on a GPU we do not manage.
    extra = world.create(parent=A)
    report = world.run(covered=(objects.PciAddress.parse(A),))
    assert world.mdevs() == {PRE1, PRE2}
    assert [f.uuid for f in report.of(reconcile.REMOVED)] == [extra]
    kept = by_uuid(report)
    assert kept[PRE1].action == kept[PRE2].action == reconcile.KEPT
    assert 'does not enable' in kept[PRE1].reason
    # nothing configured: nothing unleased is touched at all
    assert world.run(covered=()).of(reconcile.REMOVED) == []
    assert world.mdevs() == {PRE1, PRE2}


def test_removals_are_announced_before_they_happen(world):
    seen = []

    def on_plan(plan):
        seen.append(({f.uuid for f in plan}, set(world.mdevs())))

    report = world.run(on_plan=on_plan)
    assert seen == [({PRE1, PRE2}, {PRE1, PRE2})]
    assert {f.uuid for f in report.of(reconcile.REMOVED)} == {PRE1, PRE2}
    seen.clear()
    world.run(on_plan=on_plan, dry_run=True)      # nothing to announce
    assert seen == []


def test_refuses_libvirts_test_driver(world):
    with host_mod.Host('test:///default') as h:
        with pytest.raises(exception.InvalidInput) as e:
            reconcile.reconcile(world.env(h), covered=(
                objects.PciAddress.parse(A), objects.PciAddress.parse(B)))
    assert 'test driver' in str(e.value)
    assert world.mdevs() == {PRE1, PRE2}
    assert world.store.leases() == []


def test_borrowed_mdev_of_a_stopped_domain_is_given_back(world):
    dom = str(uuidlib.uuid4())
    with world.store.transaction() as txn:
        txn.borrow(objects.Uuid.parse(PRE1), objects.Uuid.parse(dom))
    report = world.run(dry_run=True)
    (found,) = [f for f in report.findings if f.what == 'borrowed']
    assert (found.uuid, found.action, found.domain_uuid) == (
        PRE1, reconcile.WOULD_REPAIR, dom)
    with world.store.transaction() as txn:
        assert txn.borrowed()[PRE1][0] == dom     # dry run: kept
    running = world.domain('running', [PRE1])
    with world.store.transaction() as txn:
        txn.give_back(objects.Uuid.parse(dom))
        txn.borrow(objects.Uuid.parse(PRE1),
                   objects.Uuid.parse(running.uuid))
    report = world.run()
    assert PRE1 in world.mdevs()               # referenced: kept
    assert [f for f in report.findings if f.what == 'borrowed'] == []
    with world.store.transaction() as txn:
        assert txn.borrowed()[PRE1][0] == running.uuid
    running.set_active(False)
    report = world.run(dry_run=False)
    assert [(f.uuid, f.action) for f in report.findings
            if f.what == 'borrowed'] == [(PRE1, reconcile.REPAIRED)]
    with world.store.transaction() as txn:
        assert PRE1 not in txn.borrowed()
