"""What ``Allocator.reserve_incoming`` promises that its other tests left
open (the leases of a migration's destination, taken at its ``migrate``
hook), on the simulated T4 host of test_allocator (A 0000:3b:00.0 empty,
8 free; B 0000:af:00.0 holds two nvidia-223, EXISTING one of them, 6
free): each test here fails on a change ``make mutation`` made that the
rest stayed green on (docs/dev/mutation.md).  The allocator is called in
the test's own process (the hook run as a program runs the installed
code, never the mutant)."""

import os
import shutil
import tempfile
import time

import pytest

from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.devices.backends import mdev
from libvirt_gpu.host import allocator
from libvirt_gpu.store import state
from tests.doubles import kernel_sysfs
from tests.doubles import trees
from tests.doubles.t4_allocator import (
    A, B, DOM, DOM2, EXISTING, T_NVIDIA_223, claim, enabled, new_uuid)

T222 = objects.TypeId.parse('nvidia-222')
DEAD_PID = 2 ** 22 + 11


@pytest.fixture
def alloc(backend, store):
    return allocator.Allocator(backend, store, enabled())


def _uuids(grants):
    return [g.device.uuid for g in grants]


def _leases(store):
    return {lease.vgpu_uuid: lease for lease in store.leases()}


def _lease(store, uuid, domain, parent=A, type_id=T_NVIDIA_223,
           lease_state=state.RESERVED, expires_at=None):
    with store.transaction() as txn:
        return txn.add(uuid, domain, parent, type_id, lease_state,
                       expires_at=expires_at)


def _refused(error, call, *args, **kwargs):
    with pytest.raises(error) as e:
        call(*args, **kwargs)
    return str(e.value)


# --- what is stored, what is returned ----------------------------------------

def test_each_reservation_stands_until_the_time_given(alloc, store):
    until = time.time() + 123.5
    free = new_uuid()
    grants = alloc.reserve_incoming(DOM, [claim(uuid=free)], until)
    (grant,) = grants
    assert (grant.device.uuid, grant.device.parent, grant.device.type_id,
            grant.existed) == (free, A, T_NVIDIA_223, False)
    lease = _leases(store)[free]
    assert grant.lease == lease
    assert (lease.domain_uuid, lease.parent, lease.type_id, lease.state,
            lease.expires_at) == (DOM, A, T_NVIDIA_223, state.RESERVED,
                                  until)


def test_a_retry_renews_each_reservation_to_the_new_time(alloc, store):
    """The earlier try's leases, both the kept UUID and the new one a
    taken UUID got, stand until the retry's time, returned as stored."""
    kept = new_uuid()
    first = alloc.reserve_incoming(
        DOM, [claim(uuid=kept), claim(uuid=EXISTING)], time.time() + 50)
    later = time.time() + 500
    again = alloc.reserve_incoming(
        DOM, [claim(uuid=kept), claim(uuid=EXISTING)], later)
    assert _uuids(again) == _uuids(first)
    leases = _leases(store)
    assert len(leases) == 2
    for before, grant in zip(first, again):
        assert grant.existed is False
        assert grant.device == before.device
        assert grant.lease == leases[grant.device.uuid]
        assert grant.lease.expires_at == later
        assert grant.lease.state == state.RESERVED


def test_a_new_uuid_comes_from_the_function_given(alloc, store):
    chosen = objects.Uuid.parse('11111111-2222-4333-8444-555555555555')
    (grant,) = alloc.reserve_incoming(DOM, [claim(uuid=EXISTING)],
                                      time.time() + 60,
                                      new_uuid=lambda: chosen)
    assert grant.device.uuid == chosen
    assert list(_leases(store)) == [chosen]


def test_without_a_function_a_taken_uuid_gets_a_random_one(alloc, store):
    (grant,) = alloc.reserve_incoming(DOM, [claim(uuid=EXISTING)],
                                      time.time() + 60)
    assert type(grant.device.uuid) is objects.Uuid
    assert grant.device.uuid != EXISTING
    assert list(_leases(store)) == [grant.device.uuid]


def test_a_new_uuid_that_is_not_parsed_is_refused(alloc, store):
    said = _refused(TypeError, alloc.reserve_incoming, DOM,
                    [claim(uuid=EXISTING)], time.time() + 60,
                    new_uuid=lambda: str(new_uuid()))
    assert said.startswith('new_uuid() must be an objects.Uuid, not str')
    assert store.leases() == []


def test_a_domain_uuid_that_is_not_parsed_is_refused(alloc, store):
    said = _refused(TypeError, alloc.reserve_incoming, str(DOM), [claim()],
                    time.time() + 60)
    assert said.startswith('domain_uuid must be an objects.Uuid, not str')
    assert store.leases() == []


def test_the_check_sees_the_grants_before_they_commit(alloc, store):
    seen = []
    uuid = new_uuid()
    grants = alloc.reserve_incoming(DOM, [claim(uuid=uuid)],
                                    time.time() + 60, check=seen.append)
    assert seen == [grants] and _uuids(grants) == [uuid]


def test_a_pinned_guest_gets_the_gpu_near_it(alloc, store):
    """B (NUMA node 1, fewer free) for a guest pinned to node 1."""
    pinning = objects.NumaPinning(nodes=objects.parse_cpulist('1'))
    (grant,) = alloc.reserve_incoming(DOM, [claim()], time.time() + 60,
                                      pinning=pinning)
    assert grant.device.parent == B
    (grant,) = alloc.reserve_incoming(DOM2, [claim()], time.time() + 60)
    assert grant.device.parent == A


# --- room --------------------------------------------------------------------

def test_exactly_what_fits_is_reserved_and_one_more_refused(alloc, store):
    until = time.time() + 60
    said = _refused(exception.NoCapacity, alloc.reserve_incoming, DOM,
                    [claim() for _ in range(15)], until)
    assert said == (
        'No capacity left for vGPU type nvidia-223 on any GPU of this '
        'host: the domain asks for 15 vGPUs of this type and 14 fit (8 on '
        '0000:3b:00.0, 6 on 0000:af:00.0); looked at 0000:3b:00.0 (0 '
        'free), 0000:af:00.0 (0 free)')
    assert store.leases() == []
    claims = [claim() for _ in range(15)]
    with pytest.raises(exception.NoCapacity) as e:
        alloc.reserve_incoming(DOM, claims, until)
    assert e.value.kwargs['uuid'] == claims[-1].uuid   # the claim refused
    grants = alloc.reserve_incoming(DOM, claims[:-1], until)
    assert sorted(str(g.device.parent) for g in grants) == \
        [str(A)] * 8 + [str(B)] * 6


def test_a_refusal_counts_what_a_retry_renewed_as_fitting(alloc, store):
    """A retry asking for more than fits: the renewed reservation and the
    new ones are counted where they landed."""
    until = time.time() + 60
    kept = new_uuid()
    (first,) = alloc.reserve_incoming(DOM, [claim(uuid=kept)], until)
    said = _refused(exception.NoCapacity, alloc.reserve_incoming, DOM,
                    [claim(uuid=kept)] + [claim() for _ in range(14)],
                    until + 10)
    assert ('the domain asks for 15 vGPUs of this type and 14 fit (8 on '
            '0000:3b:00.0, 6 on 0000:af:00.0)') in said
    # all or nothing: the earlier try's lease as it was
    assert list(_leases(store).values()) == [first.lease]


def test_another_domains_reservation_is_named_in_a_refusal(alloc, store):
    until = time.time() + 60
    alloc.reserve_incoming(DOM2, [claim() for _ in range(10)], until)
    said = _refused(exception.NoCapacity, alloc.reserve_incoming, DOM,
                    [claim() for _ in range(5)], until)
    assert 'asks for 5 vGPUs of this type and 4 fit' in said
    assert '; 10 slot(s) are reserved for incoming live migration(s): 10 ' \
        'for domain %s until ' % DOM2 in said


def test_claims_are_placed_in_their_order_taken_uuids_too(
        alloc, store, backend):
    """One instance free on each GPU: the first claim (whose UUID is
    taken here) goes to A (the lowest address on a tie), the second to
    B."""
    _fill(store, A, 7)
    _fill(store, B, 5)
    free = new_uuid()
    grants = alloc.reserve_incoming(
        DOM, [claim(uuid=EXISTING), claim(uuid=free)], time.time() + 60)
    assert [g.device.parent for g in grants] == [A, B]
    assert grants[1].device.uuid == free != grants[0].device.uuid


def _fill(store, parent, n, domain=DOM2):
    with store.transaction() as txn:
        for _ in range(n):
            txn.add(new_uuid(), domain, parent, T_NVIDIA_223,
                    state.CREATED)


# --- a retry reserves nothing more -------------------------------------------

def test_a_uuid_claimed_twice_keeps_both_uuids_on_a_retry(alloc, store):
    uuid = new_uuid()
    until = time.time() + 60
    first = alloc.reserve_incoming(DOM, [claim(uuid=uuid)] * 2, until)
    again = alloc.reserve_incoming(DOM, [claim(uuid=uuid)] * 2, until + 5)
    assert _uuids(again) == _uuids(first)
    assert _uuids(first)[0] == uuid != _uuids(first)[1]
    assert sorted(_leases(store)) == sorted(_uuids(first))


def test_two_taken_uuids_keep_their_two_new_ones(alloc, store):
    until = time.time() + 60
    leased = new_uuid()
    _lease(store, leased, DOM2, parent=B, lease_state=state.CREATED)
    claims = [claim(uuid=EXISTING), claim(uuid=leased)]
    first = alloc.reserve_incoming(DOM, claims, until)
    again = alloc.reserve_incoming(DOM, claims, until + 5)
    # the same two again (which of them for which claim is not promised)
    assert sorted(_uuids(again)) == sorted(_uuids(first))
    assert len(set(_uuids(first))) == 2
    assert len(store.leases()) == 3


def test_a_retry_gives_each_type_back_its_own_new_uuid(backend, store):
    """Two taken UUIDs of two types: each claim gets again the new UUID
    an earlier try chose for its type, never the other type's."""
    alloc = allocator.Allocator(backend, store, {
        A: objects.EnabledType(T222), B: objects.EnabledType(T_NVIDIA_223)})
    leased = new_uuid()
    _lease(store, leased, DOM2, parent=B, lease_state=state.CREATED)
    claims = [claim(T222, uuid=leased), claim(uuid=EXISTING)]
    first = alloc.reserve_incoming(DOM, claims, time.time() + 60)
    assert [(g.device.parent, g.device.type_id) for g in first] == [
        (A, T222), (B, T_NVIDIA_223)]
    again = alloc.reserve_incoming(DOM, claims, time.time() + 70)
    assert [g.device for g in again] == [g.device for g in first]
    assert len(store.leases()) == 3


def test_an_earlier_uuid_of_another_type_is_taken_and_dropped(
        backend, store):
    """The earlier try reserved the UUID as another type: the retry's
    claim gets a new UUID of its type, and the earlier one is dropped."""
    alloc = allocator.Allocator(backend, store, {
        A: objects.EnabledType(T222), B: objects.EnabledType(T_NVIDIA_223)})
    uuid = new_uuid()
    alloc.reserve_incoming(DOM, [claim(T222, uuid=uuid)], time.time() + 60)
    (grant,) = alloc.reserve_incoming(DOM, [claim(uuid=uuid)],
                                      time.time() + 70)
    assert grant.device.uuid != uuid
    assert (grant.device.parent, grant.device.type_id) == (B, T_NVIDIA_223)
    assert list(_leases(store)) == [grant.device.uuid]


def test_a_reservation_of_a_vgpu_that_exists_is_no_earlier_try(
        alloc, store):
    """The domain's incoming lease whose vGPU exists here (a prepare made
    it) is neither renewed, nor reused for a taken UUID, nor dropped."""
    until = time.time() + 60
    _lease(store, EXISTING, DOM, parent=B, expires_at=until)
    leased = new_uuid()
    _lease(store, leased, DOM2, lease_state=state.CREATED)
    grants = alloc.reserve_incoming(
        DOM, [claim(uuid=EXISTING), claim(uuid=leased)], until + 5)
    uuids = _uuids(grants)
    assert len(set(uuids)) == 2 and not {EXISTING, leased} & set(uuids)
    leases = _leases(store)
    assert leases[EXISTING].expires_at == until
    assert len(leases) == 4


@pytest.mark.parametrize('lease_state', [state.CREATED, state.REMOVING])
def test_the_domains_lease_not_reserved_is_no_earlier_try(
        alloc, store, lease_state):
    """A lease of the domain that is being created or removed (its vGPU
    gone) is neither renewed for its UUID, nor reused, nor dropped."""
    until = time.time() + 60
    uuid = new_uuid()
    _lease(store, uuid, DOM, lease_state=lease_state, expires_at=until)
    leased = new_uuid()
    _lease(store, leased, DOM2, lease_state=state.CREATED)
    grants = alloc.reserve_incoming(
        DOM, [claim(uuid=uuid), claim(uuid=leased)], until + 5)
    uuids = _uuids(grants)
    assert len(set(uuids)) == 2 and not {uuid, leased} & set(uuids)
    leases = _leases(store)
    assert (leases[uuid].state, leases[uuid].expires_at) == (lease_state,
                                                             until)
    assert len(leases) == 4


def test_a_prepares_lease_is_no_earlier_try(alloc, store):
    """The domain's reserved lease without an expiry (a prepare under
    way) is neither reused for a taken UUID nor dropped."""
    prepared = new_uuid()
    _lease(store, prepared, DOM)
    (grant,) = alloc.reserve_incoming(DOM, [claim(uuid=EXISTING)],
                                      time.time() + 60)
    assert grant.device.uuid not in (EXISTING, prepared)
    assert _leases(store)[prepared].expires_at is None
    assert len(store.leases()) == 2


def test_another_domains_pending_reservation_is_never_taken_over(
        alloc, store):
    until = time.time() + 60
    uuid = new_uuid()
    (theirs,) = alloc.reserve_incoming(DOM2, [claim(uuid=uuid)], until)
    (grant,) = alloc.reserve_incoming(DOM, [claim(uuid=uuid)], until + 5)
    assert grant.device.uuid != uuid
    leases = _leases(store)
    assert leases[uuid] == theirs.lease
    assert leases[grant.device.uuid].domain_uuid == DOM


def test_a_dead_prepares_reservation_of_the_uuid_is_kept_for_it(
        alloc, store):
    """The domain's own reserved lease of the claim's UUID that no vGPU
    was made for (a prepare killed before it): the claim keeps its UUID
    on that lease, now standing until the migration's time, no second
    slot."""
    uuid = new_uuid()
    _lease(store, uuid, DOM, parent=B)
    with store.transaction() as txn:
        txn._db.execute('UPDATE leases SET pid = ?', (DEAD_PID,))
    until = time.time() + 60
    (grant,) = alloc.reserve_incoming(DOM, [claim(uuid=uuid)], until)
    assert (grant.device.uuid, grant.device.parent) == (uuid, B)
    (lease,) = store.leases()
    assert (lease.vgpu_uuid, lease.expires_at) == (uuid, until)


# --- reading the host: once per reservation ----------------------------------

def _count_listings(sysfs, monkeypatch):
    """The listings of the host's vGPUs (``mdevs_by_parent``) made from
    now on, each counted once (the method calls itself inside)."""
    calls = []
    depth = []
    real = sysfs.mdevs_by_parent

    def counted(*args, **kwargs):
        if not depth:
            calls.append(args)
        depth.append(1)
        try:
            return real(*args, **kwargs)
        finally:
            depth.pop()
    monkeypatch.setattr(sysfs, 'mdevs_by_parent', counted)
    return calls


def test_the_hosts_vgpus_are_listed_once_per_reservation(
        alloc, backend, store, monkeypatch):
    """The list of existing vGPUs is read once, under the lock, before
    any GPU's room (a vGPU made meanwhile makes a count low, never high;
    the lock is held in time linear in the claims): 14 claims, 2 GPUs,
    one listing."""
    calls = _count_listings(backend.sysfs, monkeypatch)
    grants = alloc.reserve_incoming(DOM, [claim() for _ in range(14)],
                                    time.time() + 60)
    assert len(grants) == 14 and len(calls) == 1


# --- one type per GPU within one reservation ---------------------------------

def test_a_gpu_given_another_type_in_the_same_call_gives_no_more(
        backend, store):
    """Both types enabled on both GPUs, A allowing one nvidia-222: the
    first nvidia-222 takes A, the nvidia-223 goes to B (A now holds
    another type), and the second nvidia-222 finds no room: B holds
    nvidia-223 since this very call."""
    both = objects.EnabledType(T_NVIDIA_223, others=(
        objects.EnabledType(T222, max_instances=1),))
    alloc = allocator.Allocator(backend, store, {A: both, B: both})
    said = _refused(exception.NoCapacity, alloc.reserve_incoming, DOM,
                    [claim(T222), claim(), claim(T222)], time.time() + 60)
    assert said == (
        'No capacity left for vGPU type nvidia-222 on any GPU of this '
        'host: the domain asks for 2 vGPUs of this type and 1 fit (1 on '
        '0000:3b:00.0); looked at 0000:3b:00.0 (0 free), 0000:af:00.0 (0 '
        'free)')
    assert store.leases() == []
    grants = alloc.reserve_incoming(DOM, [claim(T222), claim()],
                                    time.time() + 60)
    assert [g.device.parent for g in grants] == [A, B]


# --- SR-IOV (vendor interface): a taken UUID's new one is its own ------------

@pytest.fixture
def l40s():
    from tests.doubles import vendor_world as tv
    path = tempfile.mkdtemp(prefix='lgpu-mutinc-')
    yield tv.World('l40s', path, 'nvidia-1145', '%s, %s' % (tv.L1, tv.L2))
    shutil.rmtree(path, ignore_errors=True)


def test_a_taken_uuids_new_one_never_gets_the_vf_recorded_for_it(
        l40s, monkeypatch):
    """L40S host (one vGPU per VF; L2 0000:bd:00.0 has the most room):
    the claim's UUID is defined here on L2's first VF and leased by
    another domain, so it is taken and the vGPU gets a new UUID; that
    new vGPU is placed as itself, on the next VF, never on the one
    recorded for the UUID it replaces; a VF recorded for the claim's own
    UUID is usable by it.  The host's vGPUs are listed once for the
    room of every GPU, and as often for three claims as for one."""
    from libvirt_gpu.devices.backends import base
    from tests.doubles import vendor_world as tv
    alloc = l40s.allocator()
    first = objects.PciAddress.parse('0000:bd:00.4')
    taken = new_uuid()
    alloc.backend.kind_of(first).define(base.VgpuDevice(
        uuid=taken, parent=first, type_id=tv.T_NVIDIA_1145))
    _lease(alloc.store, taken, DOM2,
           parent=objects.PciAddress.parse('0000:3d:00.7'),
           type_id=tv.T_NVIDIA_1145, lease_state=state.CREATED)
    calls = _count_listings(alloc.backend.sysfs, monkeypatch)
    (grant,) = alloc.reserve_incoming(
        DOM, [claim(tv.T_NVIDIA_1145, uuid=taken)], time.time() + 60)
    assert grant.device.uuid != taken
    assert str(grant.device.parent) == '0000:bd:00.5'
    # a VF recorded for the claim's own UUID is usable by it (the next
    # free VF, 0000:bd:00.6, recorded for it)
    own = new_uuid()
    sixth = objects.PciAddress.parse('0000:bd:00.6')
    alloc.backend.kind_of(sixth).define(base.VgpuDevice(
        uuid=own, parent=sixth, type_id=tv.T_NVIDIA_1145))
    (mine,) = alloc.reserve_incoming(
        DOM2, [claim(tv.T_NVIDIA_1145, uuid=own)], time.time() + 60)
    assert (mine.device.uuid, mine.device.parent) == (own, sixth)
    del calls[:]
    assert alloc.capacity('nvidia-1145') == {tv.L1: 29, tv.L2: 30}
    assert len(calls) == 1
    del calls[:]
    alloc.reserve_incoming(DOM2, [claim(tv.T_NVIDIA_1145)],
                           time.time() + 60)
    once = len(calls)
    alloc.reserve_incoming(DOM2, [claim(tv.T_NVIDIA_1145)
                                  for _ in range(3)], time.time() + 60)
    assert len(calls) == 2 * once


def test_a_gpu_that_does_not_offer_the_type_is_passed_over(store):
    """A lists no nvidia-223 (its type directory gone): the vGPU goes to
    B, the GPU after it, and a refusal names A as not offering it."""
    with trees.simulated_tree('t4') as (root, profile):
        shutil.rmtree(os.path.join(
            root, 'devices', 'pci0000:3a', '0000:3a:00.0', '0000:3b:00.0',
            'mdev_supported_types', 'nvidia-223'))
        backend = mdev.MdevBackend(kernel_sysfs.KernelSysfs(root, profile))
        alloc = allocator.Allocator(backend, store, enabled())
        (grant,) = alloc.reserve_incoming(DOM, [claim()], time.time() + 60)
        assert grant.device.parent == B
        said = _refused(exception.NoCapacity, alloc.reserve_incoming, DOM2,
                        [claim() for _ in range(6)], time.time() + 60)
    assert 'looked at 0000:3b:00.0 (type not offered), 0000:af:00.0 (0 ' \
        'free); 1 slot(s) are reserved' in said


def test_a_parent_that_is_not_parsed_is_refused(alloc, store):
    with store.transaction() as txn:
        said = _refused(TypeError, alloc.free, txn, str(A), T_NVIDIA_223,
                        {})
    assert said.startswith('parent must be an objects.PciAddress, not str')
