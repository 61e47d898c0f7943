"""What the allocator promises on GPUs whose vGPUs live on SR-IOV VFs (the
simulated L40S host of tests/doubles/vendor_world, vendor interface:
L1 0000:3d:00.0 holds two L40S-1B that are not ours, 30 free; L2
0000:bd:00.0 empty, 32 free; one L40S-1B per VF) and on the paths around
it that test_allocator's mutation tests left open (give_back, NUMA
nearness):
each test here fails on a change ``make mutation`` made that the rest
stayed green on (docs/dev/mutation.md)."""

import os
import shutil
import tempfile
import time

import pytest

from libvirt_gpu.devices.backends import base
from libvirt_gpu.devices.backends import mdev
from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.host import allocator
from libvirt_gpu.store import state
from tests.doubles import kernel_sysfs
from tests.doubles import trees
from tests.doubles import t4_allocator
from tests.doubles.vendor_world \
        import DOM, L1, L2, T_NVIDIA_1145, World

T_1146 = objects.TypeId.parse('nvidia-1146')        # L40S-2B
DOM2 = objects.Uuid.parse('0a2b8d1c-1111-4222-8333-944445555666')
NO_ROOM = ('No capacity left for vGPU type nvidia-1145 on the GPU '
           '0000:bd:00.0: ')


@pytest.fixture
def l40s():
    # a private directory: a state directory below one anyone can write
    # is refused (statedir.check_dir)
    path = tempfile.mkdtemp(prefix='lgpu-mutsriov-')
    yield World('l40s', path, 'nvidia-1145', '%s, %s' % (L1, L2))
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def t4():
    with trees.simulated_tree('t4') as tree:
        yield mdev.MdevBackend(kernel_sysfs.KernelSysfs(*tree))


def vf(text):
    return objects.PciAddress.parse(text)


def claim(parent=None, uuid=None, type_id=T_NVIDIA_1145, managed=True):
    return allocator.VgpuClaim(uuid=uuid or objects.Uuid.new(),
                               type_id=type_id, parent=parent,
                               managed=managed)


def _alloc(world, enabled=None, carved=frozenset()):
    made = world.allocator()
    return allocator.Allocator(
        made.backend, made.store,
        made.enabled if enabled is None else enabled, carved=carved)


def _parents(grants):
    return [str(g.device.parent) for g in grants]


def _refused(error, call, *args):
    with pytest.raises(error) as e:
        call(*args)
    return str(e.value)


def _lease(world, parent, type_id=T_NVIDIA_1145, domain=DOM2):
    uuid = objects.Uuid.new()
    with state.LeaseStore(world.state_dir).transaction() as txn:
        txn.add(uuid, domain, parent, type_id)
    return uuid


# --- which VF ----------------------------------------------------------------

def test_each_claim_takes_the_next_free_vf(l40s):
    alloc = _alloc(l40s)
    grants = alloc.reserve(DOM, [claim() for _ in range(3)])
    # the most room (L2) until a tie, then the lowest address (L1)
    assert _parents(grants) == ['0000:bd:00.4', '0000:bd:00.5',
                                '0000:3d:00.6']
    assert [g.lease.parent for g in grants] == [g.device.parent
                                                for g in grants]
    assert alloc.capacity('nvidia-1145') == {L1: 29, L2: 30}
    # the next domain's too: the leased VFs are skipped
    (grant,) = alloc.reserve(DOM2, [claim(parent=L2)])
    assert str(grant.device.parent) == '0000:bd:00.6'


def test_a_claim_naming_a_vf_gets_that_vf(l40s):
    alloc = _alloc(l40s)
    (grant,) = alloc.reserve(DOM, [claim(parent=vf('0000:bd:00.6'))])
    assert str(grant.device.parent) == '0000:bd:00.6'
    assert alloc.capacity('nvidia-1145') == {L1: 30, L2: 31}
    # the PF named: its first free VF
    (grant,) = alloc.reserve(DOM, [claim(parent=L2)])
    assert str(grant.device.parent) == '0000:bd:00.4'


def test_a_leased_vf_named_is_refused_in_one_line(l40s):
    alloc = _alloc(l40s)
    alloc.reserve(DOM, [claim(parent=vf('0000:bd:00.5'))])
    refused = claim(parent=vf('0000:bd:00.5'))
    with pytest.raises(exception.NoCapacity) as e:
        alloc.reserve(DOM2, [refused])
    assert str(e.value) == (
        NO_ROOM + 'its vGPUs and leases take every instance or VF '
        '0000:bd:00.5 is taken')
    assert e.value.kwargs['uuid'] == refused.uuid
    with state.LeaseStore(l40s.state_dir).transaction() as txn:
        mdevs = alloc.backend.sysfs.mdevs_by_parent()
        assert alloc.free(txn, vf('0000:bd:00.5'), T_NVIDIA_1145,
                          mdevs) == 0
        assert alloc.free(txn, vf('0000:bd:00.6'), T_NVIDIA_1145,
                          mdevs) == 31
        assert alloc.free(txn, L2, T_NVIDIA_1145, mdevs) == 31


def test_a_vf_recorded_for_another_vgpu_goes_to_that_vgpu_only(l40s):
    alloc = _alloc(l40s)
    defined = objects.Uuid.new()
    first = vf('0000:bd:00.4')
    alloc.backend.kind_of(first).define(base.VgpuDevice(
        uuid=defined, parent=first, type_id=T_NVIDIA_1145))
    (other,) = alloc.reserve(DOM, [claim(parent=L2)])
    assert str(other.device.parent) == '0000:bd:00.5'
    (own,) = alloc.reserve(DOM, [claim(parent=L2, uuid=defined)])
    assert str(own.device.parent) == '0000:bd:00.4'


def test_the_last_instance_is_given_then_the_gpu_is_full(l40s):
    setting = {L2: objects.EnabledType(T_NVIDIA_1145, max_instances=2)}
    alloc = _alloc(l40s, enabled=setting)
    assert alloc.capacity('nvidia-1145') == {L2: 2}
    grants = alloc.reserve(DOM, [claim(), claim()])
    assert _parents(grants) == ['0000:bd:00.4', '0000:bd:00.5']
    assert _refused(exception.NoCapacity, alloc.reserve, DOM2,
                    [claim(parent=L2)]) == (
        NO_ROOM + 'its vGPUs and leases take every instance')
    assert _refused(exception.NoCapacity, alloc.reserve, DOM2,
                    [claim()]) == (
        'No capacity left for vGPU type nvidia-1145 on any GPU of this '
        'host: looked at 0000:bd:00.0 (0 free)')


# --- what is counted ---------------------------------------------------------

def test_a_lease_of_another_type_leaves_the_gpu_nothing(l40s):
    alloc = _alloc(l40s)
    _lease(l40s, vf('0000:bd:01.1'), T_1146)
    assert alloc.capacity('nvidia-1145') == {L1: 30, L2: 0}
    assert _refused(exception.NoCapacity, alloc.reserve, DOM,
                    [claim(parent=L2)]) == (
        NO_ROOM + 'its vGPUs and leases take every instance')
    (grant,) = alloc.reserve(DOM, [claim()])
    assert grant.device.parent.bus == L1.bus


def test_a_lease_on_a_vf_counts_once_and_until_made(l40s):
    alloc = _alloc(l40s)
    (grant,) = alloc.reserve(DOM, [claim(parent=L2)])
    assert alloc.capacity('nvidia-1145') == {L1: 30, L2: 31}
    assert alloc.backend.prepare(grant.device) is True
    alloc.mark_created([grant.device.uuid])
    # made: the vGPU and its lease are one instance, not two
    assert alloc.capacity('nvidia-1145') == {L1: 30, L2: 31}
    (nxt,) = alloc.reserve(DOM2, [claim(parent=L2)])
    assert str(nxt.device.parent) == '0000:bd:00.5'
    assert alloc.capacity('nvidia-1145') == {L1: 30, L2: 30}


def test_the_vgpus_that_are_not_ours_take_room_but_not_a_vf_twice(l40s):
    alloc = _alloc(l40s)
    (grant,) = alloc.reserve(DOM, [claim(parent=L1)])
    # 0000:3d:00.4 and .5 hold the two that are not ours
    assert str(grant.device.parent) == '0000:3d:00.6'
    assert alloc.capacity('nvidia-1145') == {L1: 29, L2: 32}


def test_an_incoming_domain_gets_a_vf_per_vgpu_and_a_retry_no_more(l40s):
    alloc = _alloc(l40s)
    claims = [claim(parent=vf('0000:65:00.4')) for _ in range(2)]
    until = time.time() + 100
    grants = alloc.reserve_incoming(DOM, claims, until)
    # the source's parent is ignored: the most room here, one VF each
    assert _parents(grants) == ['0000:bd:00.4', '0000:bd:00.5']
    assert [g.device.uuid for g in grants] == [c.uuid for c in claims]
    again = alloc.reserve_incoming(DOM, claims, until + 50)
    assert _parents(again) == _parents(grants)
    assert [g.lease.expires_at for g in again] == [until + 50] * 2
    assert alloc.capacity('nvidia-1145') == {L1: 30, L2: 30}


# --- refusals of a claim naming an SR-IOV GPU --------------------------------

def test_a_carved_gpu_is_refused_naming_what_was_named(l40s):
    alloc = _alloc(l40s, carved={L2})
    assert alloc.capacity('nvidia-1145') == {L1: 30, L2: 0}
    reason = ('its VFs are carved for Nova ([nova]/carved): they go to '
              'Nova\'s instances only')
    assert _refused(exception.GpuInUse, alloc.reserve, DOM,
                    [claim(parent=L2)]) == (
        'The GPU 0000:bd:00.0 cannot be used: ' + reason)
    assert _refused(exception.GpuInUse, alloc.reserve, DOM,
                    [claim(parent=vf('0000:bd:00.7'))]) == (
        'The GPU 0000:bd:00.7 cannot be used: ' + reason)
    (grant,) = alloc.reserve(DOM, [claim()])
    assert grant.device.parent.bus == L1.bus


def test_a_type_not_enabled_names_the_physical_gpu(l40s):
    alloc = _alloc(l40s, enabled={
        L1: objects.EnabledType(T_NVIDIA_1145)})
    assert _refused(exception.TypeNotEnabled, alloc.reserve, DOM,
                    [claim(parent=vf('0000:bd:00.4'))]) == (
        'vGPU type nvidia-1145 is not enabled on the GPU 0000:bd:00.0 '
        '([gpu]/enabled_vgpu_types: none on that GPU)')
    # an operator's own definition (not managed) needs no enabling
    (grant,) = alloc.reserve(DOM, [claim(parent=vf('0000:bd:00.4'),
                                         managed=False)])
    assert str(grant.device.parent) == '0000:bd:00.4'


def test_a_type_the_named_vf_does_not_offer(l40s):
    alloc = _alloc(l40s)
    unknown = objects.TypeId.parse('nvidia-9999')
    assert _refused(exception.UnknownType, alloc.reserve, DOM,
                    [claim(parent=vf('0000:bd:00.4'), type_id=unknown,
                           managed=False)]).startswith(
        'The GPU at 0000:bd:00.4 does not offer vGPU type nvidia-9999')


# --- NUMA: near first, unknown is not near -----------------------------------

def test_a_pinned_guest_gets_the_near_gpu_first(l40s):
    alloc = _alloc(l40s)
    near0 = objects.NumaPinning(nodes=objects.parse_cpulist('0'))
    (grant,) = alloc.reserve(DOM, [claim()], near0)
    assert grant.device.parent.bus == L1.bus       # 30 free, near
    (grant,) = alloc.reserve(DOM, [claim()])
    assert grant.device.parent.bus == L2.bus       # unpinned: most room


def test_a_gpu_whose_node_cannot_be_read_is_not_near(t4, tmp_path):
    # on the T4 host (GPUs without VFs): B, pinned to, is near until its
    # numa_node reads as garbage
    store = state.LeaseStore(tmp_path / 'state')
    alloc = allocator.Allocator(t4, store, t4_allocator.enabled())
    node = t4.sysfs.locality(t4_allocator.B)[0]
    pinned = objects.NumaPinning(nodes=objects.parse_cpulist(str(node)))
    assert t4.sysfs.locality(t4_allocator.A)[0] != node
    (grant,) = alloc.reserve(DOM, [t4_allocator.claim()], pinned)
    assert grant.device.parent == t4_allocator.B      # 6 free, near
    with open(os.path.join(t4.sysfs.pci_dir(t4_allocator.B), 'numa_node'),
              'w') as f:
        f.write('zero\n')
    (grant,) = alloc.reserve(DOM, [t4_allocator.claim()], pinned)
    assert grant.device.parent == t4_allocator.A      # 8 free


# --- give_back and begin_release (the T4 host) -------------------------------

OTHER = objects.Uuid.parse('b1ae8bf6-38b0-4c81-9d44-78ce3f520496')


def _t4(t4, tmp_path):
    return allocator.Allocator(t4, state.LeaseStore(tmp_path / 'state'),
                               t4_allocator.enabled())


def test_give_back_frees_only_the_named_vgpus_of_that_domain(t4, tmp_path):
    alloc = _t4(t4, tmp_path)
    existing = t4_allocator.EXISTING
    alloc.reserve(DOM, [t4_allocator.claim(uuid=existing),
                        t4_allocator.claim(uuid=OTHER)])
    alloc.give_back(DOM2, [existing])        # not DOM2's: nothing
    with pytest.raises(exception.LeaseConflict):
        alloc.reserve(DOM2, [t4_allocator.claim(uuid=existing)])
    alloc.give_back(DOM, [existing])
    (grant,) = alloc.reserve(DOM2, [t4_allocator.claim(uuid=existing)])
    assert grant.existed and grant.lease is None
    with pytest.raises(exception.LeaseConflict):   # still DOM's
        alloc.reserve(DOM2, [t4_allocator.claim(uuid=OTHER)])


def test_begin_release_takes_the_named_leases_only(t4, tmp_path):
    alloc = _t4(t4, tmp_path)
    alloc.reserve(DOM, [t4_allocator.claim(), t4_allocator.claim()])
    alloc.reserve(DOM2, [t4_allocator.claim()])
    with alloc.store.transaction() as txn:
        first, second = [lease.vgpu_uuid for lease in txn.for_domain(DOM)]
    # the one named comes after one not named: the rest are still looked at
    taken = alloc.begin_release(DOM, [second])
    assert [(t.vgpu_uuid, t.state) for t in taken] == [
        (second, state.REMOVING)]
    states = {lease.vgpu_uuid: (lease.domain_uuid, lease.state)
              for lease in alloc.store.leases()}
    assert states[first] == (DOM, state.RESERVED)
    assert sorted(s for d, s in states.values() if d == DOM2) == [
        state.RESERVED]
    assert {t.vgpu_uuid for t in alloc.begin_release(DOM)} == {
        first, second}


def test_begin_release_gives_back_only_the_named_borrowed(t4, tmp_path):
    alloc = _t4(t4, tmp_path)
    alloc.reserve(DOM, [t4_allocator.claim(uuid=t4_allocator.EXISTING),
                        t4_allocator.claim(uuid=OTHER)])
    assert alloc.begin_release(DOM, [t4_allocator.EXISTING]) == []
    alloc.reserve(DOM2, [t4_allocator.claim(uuid=t4_allocator.EXISTING)])
    with pytest.raises(exception.LeaseConflict):
        alloc.reserve(DOM2, [t4_allocator.claim(uuid=OTHER)])
    alloc.begin_release(DOM)
    alloc.reserve(DOM2, [t4_allocator.claim(uuid=OTHER)])


def test_begin_release_refuses_a_lease_another_process_creates(t4, tmp_path):
    alloc = _t4(t4, tmp_path)
    (grant,) = alloc.reserve(DOM, [t4_allocator.claim()])
    uuid = grant.device.uuid
    parent = os.getppid()               # alive, not this process
    with alloc.store.transaction() as txn:
        txn._db.execute('UPDATE leases SET pid = ?, pid_start = NULL',
                        (parent,))
    assert _refused(exception.LeaseConflict, alloc.begin_release, DOM) == (
        'vGPU %s is held by process %d (reserved), still running'
        % (uuid, parent))
    # created: a stop of a running guest takes it whoever made it
    with alloc.store.transaction() as txn:
        txn.update(uuid, state=state.CREATED)
        txn._db.execute('UPDATE leases SET pid = ?, pid_start = NULL',
                        (parent,))
    assert [t.vgpu_uuid for t in alloc.begin_release(DOM)] == [uuid]


def test_begin_release_names_the_argument_that_is_not_parsed(t4, tmp_path):
    alloc = _t4(t4, tmp_path)
    with pytest.raises(TypeError, match=r'^domain_uuid must be an '
                       r'objects\.Uuid, not str'):
        alloc.begin_release(str(DOM))
    with pytest.raises(TypeError, match=r'^uuids\[\] must be an '
                       r'objects\.Uuid, not str'):
        alloc.begin_release(DOM, [str(t4_allocator.EXISTING)])
