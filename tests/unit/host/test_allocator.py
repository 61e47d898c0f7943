"""Allocator: which GPU, how much room, leases as the guard."""


import pytest

from libvirt_gpu.host import allocator
from libvirt_gpu.devices.backends import mdev
from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.store import state
from tests.doubles import kernel_sysfs
from tests.doubles import trees

T_NVIDIA_223 = objects.TypeId.parse('nvidia-223')

A = objects.PciAddress.parse('0000:3b:00.0')    # empty
B = objects.PciAddress.parse('0000:af:00.0')    # holds two nvidia-223
DOM = objects.Uuid.parse('c7a5fdbd-cdaf-9455-926a-d65c16db1809')
DOM2 = objects.Uuid.parse('0a2b8d1c-1111-4222-8333-944445555666')
EXISTING = objects.Uuid.parse('4b20d080-1b54-4048-85b3-a6a62d165c01')


def new_uuid():
    return objects.Uuid.new()


@pytest.fixture
def backend():
    with trees.simulated_tree('t4') as tree:
        yield mdev.MdevBackend(kernel_sysfs.KernelSysfs(*tree))


@pytest.fixture
def store(tmp_path):
    return state.LeaseStore(tmp_path / 'state')


def enabled(type_id=T_NVIDIA_223, addresses=(A, B), max_instances=None):
    return {a: objects.EnabledType(type_id=objects.TypeId.parse(type_id),
                                   max_instances=max_instances)
            for a in addresses}


def claim(type_id=T_NVIDIA_223, parent=None, uuid=None, managed=True):
    if isinstance(type_id, str):
        type_id = objects.TypeId.parse(type_id)
    return allocator.VgpuClaim(uuid=uuid or new_uuid(), type_id=type_id,
                               parent=parent, managed=managed)


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
