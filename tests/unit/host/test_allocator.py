"""Allocator: which GPU, how much room, leases as the guard."""


import pytest

from libvirt_gpu.host import allocator
from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.store import state
import time

from tests.doubles.t4_allocator import (
    A, B, DOM, DOM2, EXISTING, T_NVIDIA_223, claim, enabled, new_uuid)


def test_capacity_counts_mdevs_and_leases(backend, store):
    alloc = allocator.Allocator(backend, store, enabled())
    assert alloc.capacity('nvidia-223') == {A: 8, B: 6}
    alloc.reserve(DOM, [claim(parent=B)])
    assert alloc.capacity('nvidia-223') == {A: 8, B: 5}


def test_most_free_gpu_is_chosen(backend, store):
    alloc = allocator.Allocator(backend, store, enabled())
    grants = alloc.reserve(DOM, [claim() for _ in range(4)])
    # A (8 free) until it has no more than B (6 free), then lowest address
    assert [g.device.parent for g in grants] == [A, A, A, B]
    assert all(not g.existed and g.lease.state == state.RESERVED
               for g in grants)
    assert len(store.leases()) == 4


def test_never_over_commit(backend, store):
    alloc = allocator.Allocator(backend, store, enabled())
    alloc.reserve(DOM, [claim() for _ in range(14)])
    with pytest.raises(exception.NoCapacity, match=r'0 free'):
        alloc.reserve(DOM2, [claim()])
    assert len(store.leases()) == 14


def test_all_or_nothing(backend, store):
    alloc = allocator.Allocator(backend, store, enabled())
    with pytest.raises(exception.NoCapacity):
        alloc.reserve(DOM, [claim() for _ in range(15)])
    assert store.leases() == []


def test_max_instances_caps(backend, store):
    alloc = allocator.Allocator(backend, store, enabled(max_instances=3))
    # B already holds 2 of at most 3
    assert alloc.capacity('nvidia-223') == {A: 3, B: 1}


def test_other_type_blocks_the_gpu(backend, store):
    alloc = allocator.Allocator(backend, store, {A: objects.EnabledType(
        'nvidia-222')})
    alloc.reserve(DOM, [claim('nvidia-222')])
    # A pending lease of nvidia-222 leaves no room for another type, even
    # though available_instances of nvidia-223 still says 8.
    other = allocator.Allocator(backend, store, {A: objects.EnabledType(
        'nvidia-223')})
    assert other.capacity('nvidia-223') == {A: 0}


def test_type_not_enabled(backend, store):
    alloc = allocator.Allocator(backend, store, enabled())
    with pytest.raises(exception.TypeNotEnabled, match='nvidia-222'):
        alloc.reserve(DOM, [claim('nvidia-222')])
    with pytest.raises(exception.TypeNotEnabled, match='the GPU 0000:3b'):
        alloc.reserve(DOM, [claim('nvidia-222', parent=A)])


def test_explicit_parent(backend, store):
    alloc = allocator.Allocator(backend, store, enabled())
    (g,) = alloc.reserve(DOM, [claim(parent=B)])
    assert g.device.parent == B
    with pytest.raises(exception.ParentGone):
        alloc.reserve(DOM, [claim(parent=objects.PciAddress.parse(
            '0000:5e:00.0'))])
    with pytest.raises(exception.UnknownType):
        alloc.reserve(DOM, [claim('nvidia-999', parent=A)])


def test_claims_refuse_untyped_values():
    # Claims hold what the API and the hook parsed; the allocator does not
    # parse them again, so raw text is a programming error.
    with pytest.raises(TypeError, match=r'^VgpuClaim\.parent must be an '
                       r'objects\.PciAddress, not str .*'
                       r'objects\.PciAddress\.parse'):
        claim(parent='0000:5e:00.0')
    with pytest.raises(TypeError, match=r'^VgpuClaim\.uuid .*'
                                        r'objects\.Uuid\.parse'):
        allocator.VgpuClaim(uuid=None, type_id=T_NVIDIA_223)
    with pytest.raises(TypeError, match=r'^VgpuClaim\.type_id .*'
                                        r'objects\.TypeId\.parse'):
        claim(type_id=223)
    assert claim().parent is None
    assert claim(parent=A).parent is A


def test_unmanaged_claim_skips_the_enabled_check(backend, store):
    alloc = allocator.Allocator(backend, store, {})
    (g,) = alloc.reserve(DOM, [claim('nvidia-222', parent=A,
                                     managed=False)])
    assert g.device.type_id == 'nvidia-222'


def test_existing_mdev_without_lease_is_used_not_owned(backend, store):
    alloc = allocator.Allocator(backend, store, enabled())
    (g,) = alloc.reserve(DOM, [claim(uuid=EXISTING)])
    assert g.existed and g.lease is None and g.device.parent == B
    assert store.leases() == []
    with pytest.raises(exception.MdevConflict):
        alloc.reserve(DOM, [claim('nvidia-222', uuid=EXISTING)])


def test_lease_of_another_domain_is_a_conflict(backend, store):
    alloc = allocator.Allocator(backend, store, enabled())
    (g,) = alloc.reserve(DOM, [claim()])
    with pytest.raises(exception.LeaseConflict, match=DOM):
        alloc.reserve(DOM2, [claim(uuid=g.device.uuid)])


def test_dead_holders_lease_is_taken_over_by_its_domain(backend, store):
    alloc = allocator.Allocator(backend, store, enabled())
    u = new_uuid()
    with store.transaction() as txn:
        txn.add(u, DOM, A, objects.TypeId.parse('nvidia-223'))
        txn._db.execute('UPDATE leases SET pid = ?', (2 ** 22 + 11,))
    assert alloc.capacity('nvidia-223')[A] == 7     # still counted
    (g,) = alloc.reserve(DOM, [claim(uuid=u)])
    assert g.device.parent == A and not g.existed
    assert g.lease.held_by_me()
    assert alloc.capacity('nvidia-223')[A] == 7     # not counted twice


def test_live_holder_blocks_take_over(backend, store, tmp_path):
    alloc = allocator.Allocator(backend, store, enabled())
    u = new_uuid()
    with store.transaction() as txn:
        txn.add(u, DOM, A, objects.TypeId.parse('nvidia-223'))
        txn._db.execute('UPDATE leases SET pid = 1, pid_start = NULL')
    with pytest.raises(exception.LeaseConflict, match='still running'):
        alloc.reserve(DOM, [claim(uuid=u)])


def test_created_device_after_crash_is_reused(backend, store):
    alloc = allocator.Allocator(backend, store, enabled())
    (g,) = alloc.reserve(DOM, [claim()])
    backend.prepare(g.device)
    (again,) = alloc.reserve(DOM, [claim(uuid=g.device.uuid)])
    assert again.existed and again.lease.state == state.CREATED


def test_release_bookkeeping(backend, store):
    alloc = allocator.Allocator(backend, store, enabled())
    grants = alloc.reserve(DOM, [claim(), claim()])
    uuids = [g.device.uuid for g in grants]
    alloc.mark_created(uuids)
    assert {lease.state for lease in store.leases()} == {state.CREATED}
    taken = alloc.begin_release(DOM, uuids[:1])
    assert [lease.vgpu_uuid for lease in taken] == uuids[:1]
    assert taken[0].state == state.REMOVING
    alloc.forget(uuids)
    assert store.leases() == []


# --- what make mutation found ----------------------------------------------
#
# What the allocator promises that its other tests left open, on GPUs
# without VFs (the simulated T4 host of test_allocator: A empty, 8 free;
# B holds two nvidia-223, 6 free): each test here fails on a change ``make
# mutation`` made that the rest stayed green on (docs/dev/mutation.md).
# Mostly the whole refusal a user reads, and the counts in it.

T222 = objects.TypeId.parse('nvidia-222')
DEAD_PID = 2 ** 22 + 11
NO_ROOM = 'No capacity left for vGPU type nvidia-223 on '


# the T4 host and its lease store, as test_allocator makes them


def _domain(n):
    return objects.Uuid.parse('00000000-0000-4000-8000-%012d' % n)


def _refused(error, call, *args, **kwargs):
    with pytest.raises(error) as e:
        call(*args, **kwargs)
    return str(e.value)


def _stale(leases, domain, parent=A, n=1):
    uuids = []
    with leases.transaction() as txn:
        for _ in range(n):
            uuids.append(new_uuid())
            txn.add(uuids[-1], domain, parent, T_NVIDIA_223)
        txn._db.execute('UPDATE leases SET pid = ? WHERE domain_uuid = ?',
                        (DEAD_PID, str(domain)))
    return uuids


def _until(at):
    return time.strftime('%H:%M:%S', time.localtime(at))


# --- the refusals for room ---------------------------------------------------

def test_too_many_for_the_host_says_how_many_fit_where(backend, store):
    alloc = allocator.Allocator(backend, store, enabled())
    assert _refused(exception.NoCapacity, alloc.reserve, DOM,
                    [claim() for _ in range(15)]) == (
        NO_ROOM + 'any GPU of this host: the domain asks for 15 vGPUs of '
        'this type and 14 fit (8 on 0000:3b:00.0, 6 on 0000:af:00.0); '
        'looked at 0000:3b:00.0 (0 free), 0000:af:00.0 (0 free)')
    assert store.leases() == []


def test_claims_of_another_type_are_not_counted_as_fitting(backend, store):
    alloc = allocator.Allocator(backend, store, {
        A: objects.EnabledType(T222), B: objects.EnabledType(T_NVIDIA_223)})
    said = _refused(exception.NoCapacity, alloc.reserve, DOM,
                    [claim(T222)] + [claim() for _ in range(7)])
    assert said.startswith(
        NO_ROOM + 'any GPU of this host: the domain asks for 7 vGPUs of '
        'this type and 6 fit (6 on 0000:af:00.0); looked at 0000:af:00.0 '
        '(0 free)')


def test_one_claim_too_many_is_told_without_counts(backend, store):
    alloc = allocator.Allocator(backend, store, enabled())
    alloc.reserve(DOM, [claim() for _ in range(14)])
    assert _refused(exception.NoCapacity, alloc.reserve, DOM2,
                    [claim()]) == (
        NO_ROOM + 'any GPU of this host: looked at 0000:3b:00.0 (0 free), '
        '0000:af:00.0 (0 free)')


def test_a_named_gpu_without_room(backend, store):
    alloc = allocator.Allocator(backend, store, enabled())
    assert _refused(exception.NoCapacity, alloc.reserve, DOM,
                    [claim(parent=B) for _ in range(7)]) == (
        NO_ROOM + 'the GPU 0000:af:00.0: the domain asks for 7 vGPUs of '
        'this type and 6 fit (6 on 0000:af:00.0); its vGPUs and leases '
        'take every instance')
    # the last instance is given: refused at 0 free, not at 1
    alloc.reserve(DOM, [claim(parent=B) for _ in range(6)])
    assert alloc.capacity('nvidia-223') == {A: 8, B: 0}


def test_incoming_reservations_are_named_by_domain(backend, store):
    alloc = allocator.Allocator(backend, store, enabled())
    soon, later = time.time() + 100, time.time() + 200
    alloc.reserve_incoming(_domain(3), [claim()], soon)
    alloc.reserve_incoming(_domain(1), [claim(), claim()], soon)
    with store.transaction() as txn:    # one more, held longer
        txn.add(new_uuid(), _domain(1), B, T_NVIDIA_223, state.RESERVED,
                expires_at=later)
    alloc.reserve_incoming(DOM, [claim()], later)       # its own: not named
    said = _refused(exception.NoCapacity, alloc.reserve, DOM,
                    [claim() for _ in range(10)])
    assert said.endswith(
        '; 4 slot(s) are reserved for incoming live migration(s): 3 for '
        'domain %s until %s, 1 for domain %s until %s (their prepare takes '
        'them, else they are freed when they expire; `libvirt-gpu reconcile '
        '--dry-run` lists them)'
        % (_domain(1), _until(later), _domain(3), _until(soon)))


def test_at_most_five_domains_are_named(backend, store):
    alloc = allocator.Allocator(backend, store, enabled())
    until = time.time() + 100
    for n in range(6):
        alloc.reserve_incoming(_domain(n), [claim()], until)
    said = _refused(exception.NoCapacity, alloc.reserve, DOM,
                    [claim() for _ in range(9)])
    assert ('6 slot(s) are reserved for incoming live migration(s): %s '
            'and 1 more domain(s) (their'
            % ', '.join('1 for domain %s until %s' % (_domain(n),
                                                      _until(until))
                        for n in range(5))) in said
    assert str(_domain(5)) not in said


def test_five_domains_are_all_named(backend, store):
    alloc = allocator.Allocator(backend, store, enabled())
    until = time.time() + 100
    for n in range(5):
        alloc.reserve_incoming(_domain(n), [claim()], until)
    said = _refused(exception.NoCapacity, alloc.reserve, DOM,
                    [claim() for _ in range(10)])
    assert 'more domain' not in said and str(_domain(4)) in said


def test_a_stale_lease_is_named_whole(backend, store):
    alloc = allocator.Allocator(backend, store, enabled())
    (uuid,) = _stale(store, DOM2)
    assert _refused(exception.NoCapacity, alloc.reserve, DOM,
                    [claim() for _ in range(14)]).endswith(
        '(0 free); 1 lease(s) left by processes that died may be stale: %s '
        '(reserved for domain %s by process %d, gone); `libvirt-gpu '
        'reconcile --dry-run` shows what `libvirt-gpu reconcile` would free'
        % (uuid, DOM2, DEAD_PID))


def test_at_most_five_stale_leases_are_named(backend, store):
    alloc = allocator.Allocator(backend, store, enabled())
    uuids = _stale(store, DOM2, n=6)
    said = _refused(exception.NoCapacity, alloc.reserve, DOM,
                    [claim() for _ in range(9)])
    assert '; 6 lease(s) left by processes that died may be stale: ' in said
    assert ' and 1 more; `libvirt-gpu reconcile --dry-run`' in said
    assert sum(str(u) in said for u in uuids) == 5


def test_created_and_live_leases_are_not_stale(backend, store):
    alloc = allocator.Allocator(backend, store, enabled())
    grants = alloc.reserve(DOM2, [claim()])
    alloc.mark_created([grants[0].device.uuid])
    (done,) = _stale(store, _domain(7))
    with store.transaction() as txn:
        txn.update(done, state=state.CREATED)
    said = _refused(exception.NoCapacity, alloc.reserve, DOM,
                    [claim() for _ in range(13)])
    assert 'stale' not in said


# --- the other refusals ------------------------------------------------------

def test_more_claims_than_a_domain_may_hold(backend, store):
    alloc = allocator.Allocator(backend, store, enabled())
    most = allocator.MAX_VGPUS_PER_DOMAIN
    # exactly the most is judged for room, one more is refused before
    with pytest.raises(exception.NoCapacity):
        alloc.reserve(DOM, [claim() for _ in range(most)])
    assert _refused(exception.InvalidInput, alloc.reserve, DOM,
                    [claim() for _ in range(most + 1)]) == (
        'Invalid input: the domain asks for %d vGPUs and one domain may '
        'hold at most %d; give it fewer (split the work across guests)'
        % (most + 1, most))


def test_type_not_enabled_says_what_is(backend, store):
    alloc = allocator.Allocator(backend, store, {
        A: objects.EnabledType(T_NVIDIA_223)})
    assert _refused(exception.TypeNotEnabled, alloc.reserve, DOM,
                    [claim(T222)]) == (
        'vGPU type nvidia-222 is not enabled on this host '
        '([gpu]/enabled_vgpu_types: nvidia-223)')
    assert _refused(exception.TypeNotEnabled, alloc.reserve, DOM,
                    [claim(T222, parent=A)]) == (
        'vGPU type nvidia-222 is not enabled on the GPU 0000:3b:00.0 '
        '([gpu]/enabled_vgpu_types: nvidia-223)')
    assert _refused(exception.TypeNotEnabled, alloc.reserve, DOM,
                    [claim(parent=B)]) == (
        'vGPU type nvidia-223 is not enabled on the GPU 0000:af:00.0 '
        '([gpu]/enabled_vgpu_types: none on that GPU)')


def test_enabled_text():
    on = {A: objects.EnabledType(T_NVIDIA_223), B: objects.EnabledType(T222)}
    assert allocator.enabled_text(on) == 'nvidia-222, nvidia-223'
    assert allocator.enabled_text(on, ('nvidia-223', 'nvidia-999')) == (
        'nvidia-222, nvidia-223, nvidia-999, which no GPU of this host '
        'offers (`libvirt-gpu types` lists what they offer)')
    assert allocator.enabled_text({}) == 'none'


def test_an_existing_vgpu_of_another_type_or_gpu(backend, store):
    alloc = allocator.Allocator(backend, store, enabled())
    said = _refused(exception.MdevConflict, alloc.reserve, DOM,
                    [claim(T222, uuid=EXISTING)])
    assert EXISTING in said and 'nvidia-222' in said and \
        'nvidia-223' in said and 'any GPU' in said
    said = _refused(exception.MdevConflict, alloc.reserve, DOM,
                    [claim(uuid=EXISTING, parent=A)])
    assert '0000:3b:00.0' in said and '0000:af:00.0' in said
    (g,) = alloc.reserve(DOM, [claim(uuid=EXISTING, parent=B)])
    assert g.existed and g.device.parent == B


def test_an_existing_vgpu_serves_one_domain_at_a_time(backend, store):
    alloc = allocator.Allocator(backend, store, enabled())
    alloc.reserve(DOM, [claim(uuid=EXISTING)])
    alloc.reserve(DOM, [claim(uuid=EXISTING)])          # again: its own
    assert _refused(exception.LeaseConflict, alloc.reserve, DOM2,
                    [claim(uuid=EXISTING)]).endswith(
        'domain %s, which already uses this existing vGPU (it is given '
        'back when that domain stops)' % DOM)


def test_two_claims_of_which_one_or_none_fits(backend, store):
    alloc = allocator.Allocator(backend, store, enabled())
    alloc.reserve(DOM2, [claim() for _ in range(13)])
    assert _refused(exception.NoCapacity, alloc.reserve, DOM,
                    [claim(), claim()]).startswith(
        NO_ROOM + 'any GPU of this host: the domain asks for 2 vGPUs of '
        'this type and 1 fit (1 on 0000:af:00.0); looked at')
    alloc.reserve(DOM2, [claim()])
    assert _refused(exception.NoCapacity, alloc.reserve, DOM,
                    [claim(), claim()]).startswith(
        NO_ROOM + 'any GPU of this host: the domain asks for 2 vGPUs of '
        'this type and none fits; looked at')


def test_what_was_looked_at_is_said_per_gpu(backend, store):
    gone = objects.PciAddress.parse('0000:5e:00.0')
    alloc = allocator.Allocator(backend, store, {
        A: objects.EnabledType(T_NVIDIA_223),
        B: objects.EnabledType(T_NVIDIA_223),
        gone: objects.EnabledType(T_NVIDIA_223)}, carved={A})
    alloc.reserve(DOM2, [claim() for _ in range(6)])
    assert _refused(exception.NoCapacity, alloc.reserve, DOM,
                    [claim()]) == (
        NO_ROOM + 'any GPU of this host: looked at 0000:3b:00.0 (carved '
        'for Nova), 0000:5e:00.0 (gone), 0000:af:00.0 (0 free)')


def test_a_gpu_that_does_not_offer_the_type_is_said_so(backend, store):
    t999 = objects.TypeId.parse('nvidia-999')
    alloc = allocator.Allocator(backend, store, {
        A: objects.EnabledType(t999)})
    assert _refused(exception.NoCapacity, alloc.reserve, DOM,
                    [claim(t999)]) == (
        'No capacity left for vGPU type nvidia-999 on any GPU of this host: '
        'looked at 0000:3b:00.0 (type not offered)')


def test_five_stale_leases_are_all_named(backend, store):
    alloc = allocator.Allocator(backend, store, enabled())
    uuids = _stale(store, DOM2, n=5)
    said = _refused(exception.NoCapacity, alloc.reserve, DOM,
                    [claim() for _ in range(10)])
    items = ['%s (reserved for domain %s by process %d, gone)'
             % (u, DOM2, DEAD_PID) for u in uuids]
    assert 'may be stale: %s; `libvirt-gpu' % ', '.join(
        sorted(items, key=said.index)) in said


def test_a_stale_lease_of_no_domain_says_so(backend, store):
    alloc = allocator.Allocator(backend, store, enabled())
    (uuid,) = _stale(store, DOM2)
    with store.transaction() as txn:
        txn._db.execute('UPDATE leases SET domain_uuid = NULL, state = ?',
                        (state.REMOVING,))
    assert '%s (removing for domain - by process %d, gone)' % (
        uuid, DEAD_PID) in _refused(exception.NoCapacity, alloc.reserve, DOM,
                                    [claim() for _ in range(14)])


def test_an_incoming_reservation_is_never_called_stale(backend, store):
    alloc = allocator.Allocator(backend, store, enabled())
    alloc.reserve_incoming(DOM2, [claim()], time.time() + 100)
    with store.transaction() as txn:
        txn._db.execute('UPDATE leases SET pid = ?', (DEAD_PID,))
    said = _refused(exception.NoCapacity, alloc.reserve, DOM,
                    [claim() for _ in range(14)])
    assert 'reserved for incoming' in said and 'stale' not in said


# --- what a reservation reads ------------------------------------------------

def test_a_domain_s_claims_read_each_gpu_s_room_once(backend, store,
                                                     monkeypatch):
    # _Room: a domain's N claims cost one read of each GPU's room, counted
    # down as the transaction reserves, not one per claim
    alloc = allocator.Allocator(backend, store, enabled())
    reads = []
    free = allocator.Allocator.free

    def counted(self, txn, address, type_id, mdevs):
        reads.append((address, type_id))
        return free(self, txn, address, type_id, mdevs)

    monkeypatch.setattr(allocator.Allocator, 'free', counted)
    grants = alloc.reserve(DOM, [claim() for _ in range(4)])
    assert len(grants) == 4
    assert sorted(reads) == [(A, T_NVIDIA_223), (B, T_NVIDIA_223)]
