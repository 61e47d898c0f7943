"""One capacity rule: what Placement is told a GPU holds and what the
allocator lets it hold both come from ``libvirt_gpu.devices.capacity``, on
every simulated profile (``libvirt-gpu simulate --list``)."""

import os
import shutil
import tempfile

import pytest

from libvirt_gpu.devices import capacity
from libvirt_gpu.devices import discovery
from libvirt_gpu import environment
from libvirt_gpu import objects
from libvirt_gpu import simulator
from libvirt_gpu.devices import sysfs as sysfs_mod
from libvirt_gpu.openstack.placement import model
from libvirt_gpu.simulator import loading
from tests.doubles import kinds
import logging
from libvirt_gpu.devices import layout

HOSTNAME = 'cn1'


@pytest.fixture(scope='module')
def hosts():
    """``{profile: (Environment, gpus)}`` of every bundled profile, written
    to a plain directory (no leases, no vendor state)."""
    # not /dev/shm: a state directory below a directory anyone can write
    # (sticky) is refused (statedir.check_dir)
    tmp = tempfile.mkdtemp(prefix='lgpu-capacity-')
    found = {}
    for name in loading.list_profiles():
        root = os.path.join(tmp, name, 'sys')
        simulator.write_sysfs(simulator.load_profile(name), root)
        sysfs = sysfs_mod.Sysfs(root)
        env = environment.Environment(os.path.join(tmp, name, 'state'),
                                      sysfs=sysfs, enabled={})
        found[name] = (env, discovery.from_sysfs(
            sysfs, kinds=kinds.registered()).gpus)
    yield found
    shutil.rmtree(tmp, ignore_errors=True)


def _cases(gpus):
    """(physical GPU, EnabledType) for every type each GPU offers."""
    for gpu in gpus:
        if gpu.is_vf:
            continue
        for mtype in gpu.offered_types():
            yield gpu, objects.EnabledType(mtype.id)


def _placement_total(gpu, enabled):
    """VGPU total of the GPU's provider in the tree Placement is sent."""
    built = model.build_tree(HOSTNAME, (gpu,), {gpu.address: enabled})
    totals = [inv.total for child in built.children
              for inv in child.inventories]
    return totals[0] if totals else 0


def _allocator_free(env, gpu, enabled):
    env.enabled = {gpu.address: enabled}
    allocator = env.allocator
    with env.store.transaction() as txn:
        return allocator.free(txn, gpu.address, enabled.type_id,
                              env.sysfs.mdevs_by_parent())


def _held(gpu, type_id):
    """(vGPUs of the type, whether one of another type blocks it).  A GPU
    whose vGPUs live on VFs is not blocked by what exists: each VF lists
    what the driver still lets it make (``capacity.free``)."""
    used = [t for f in gpu.functions for t in f.used_type_ids]
    other = not gpu.vf_gpus and any(t != type_id for t in used)
    return used.count(type_id), other


@pytest.mark.parametrize('name', loading.list_profiles())
def test_placement_and_allocator_agree_on_every_profile(hosts, name):
    env, gpus = hosts[name]
    checked = 0
    for gpu, enabled in _cases(gpus):
        total = capacity.vgpu_total(gpu, enabled)
        assert _placement_total(gpu, enabled) == total
        used, other = _held(gpu, enabled.type_id)
        assert _allocator_free(env, gpu, enabled) == capacity.free(
            total, used, 0, other_types=other), (gpu.address, enabled)
        checked += 1
    assert checked > 0


@pytest.mark.parametrize('name', loading.list_profiles())
def test_both_follow_the_one_rule(hosts, name, monkeypatch):
    """Change the rule (a limit of one vGPU per GPU) and both answers
    change with it: neither computes capacity on its own."""
    env, gpus = hosts[name]
    monkeypatch.setattr(capacity, 'limit', lambda mtype, enabled: 1)
    checked = 0
    for gpu, enabled in _cases(gpus):
        used, other = _held(gpu, enabled.type_id)
        expected_total = max(1, used) if capacity.vgpu_total(
            gpu, enabled) else 0
        assert _placement_total(gpu, enabled) == expected_total
        free = _allocator_free(env, gpu, enabled)
        assert free == capacity.free(expected_total, used, 0,
                                     other_types=other)
        assert free <= 1
        checked += 1
    assert checked > 0


def test_an_unknown_maximum_is_said_by_reports_not_by_the_allocator(
        hosts, caplog, monkeypatch):
    """Without a maximum only what exists plus one is counted: a report of
    the total warns (set max_instances), the allocator (whose refusal is
    the one line a guest start shows) does not, and both count alike."""
    monkeypatch.setattr(capacity, 'limit', lambda mtype, enabled: None)
    checked = 0
    for name in loading.list_profiles():
        env, gpus = hosts[name]
        for gpu, enabled in _cases(gpus):
            if not gpu.vf_gpus:
                continue
            caplog.clear()
            with caplog.at_level('WARNING'):
                quiet = capacity.vgpu_total(gpu, enabled, warn=False)
            assert caplog.records == []
            with caplog.at_level('WARNING'):
                said = capacity.vgpu_total(gpu, enabled)
            assert said == quiet
            assert any('no maximum known for vGPU type %s' % enabled.type_id
                       in r.getMessage() for r in caplog.records)
            caplog.clear()
            with caplog.at_level('WARNING'):
                _allocator_free(env, gpu, enabled)
            assert not any('no maximum known' in r.getMessage()
                           for r in caplog.records)
            checked += 1
    assert checked > 0


# --- what make mutation found ----------------------------------------------
#
# What ``devices.capacity`` promises, checked on its own and fast: each
# test here fails on a change ``make mutation`` made to devices/capacity.py
# that test_capacity (every simulated profile, through Placement and the
# allocator) stayed green on (docs/dev/mutation.md): the bounds of each
# number (exactly full, one over, never below what exists), what counts
# and what does not (pending leases, another type, a VF that holds one),
# the refusals and the warning word for word.
#
# The GPUs are built as discovery returns them (``objects.Gpu`` with its
# VFs), without a tree: the rules read nothing else.

PF = objects.PciAddress.parse('0000:41:00.0')
T = objects.TypeId.parse('nvidia-1145')
U = objects.TypeId.parse('nvidia-1146')
UUIDS = ['0a2b8d1c-1111-4222-8333-94444555566%d' % n for n in range(8)]


def vtype(type_id=T, available=1, published=None, description=None):
    return objects.VgpuType(id=type_id, name=None, description=description,
                            device_api='vfio-pci',
                            available_instances=available,
                            published_max=published)


def mdev(n, type_id=T):
    return objects.Mdev(uuid=objects.Uuid.parse(UUIDS[n]), type_id=type_id)


def gpu(address=PF, **fields):
    values = dict(vendor_id='10de', product_id='26b9',
                  class_code='0x030200', driver='nvidia', numa_node=0,
                  iommu_group=None)
    values.update(fields)
    return objects.Gpu(address, **values)


def vf(n, creatable=(), current=None, **fields):
    """VF ``n`` of PF (0000:41:00.4 on); a vendor interface with the
    ``creatable`` types and the vGPU ``current`` unless ``fields`` give
    mdev types instead."""
    if 'mdev_types' not in fields:
        fields['vendor_vf'] = objects.VendorVf(creatable=tuple(creatable),
                                               current=current)
    return gpu(objects.PciAddress.parse('0000:41:%02x.%d' % (
        n // 8, n % 8)), physfn=PF, **fields)


def with_vfs(*vfs, **fields):
    return gpu(virtfns=tuple(v.address for v in vfs), vf_gpus=tuple(vfs),
               **fields)


def enabled(type_id=T, max_instances=None):
    return objects.EnabledType(type_id, max_instances=max_instances)


def member(address, host_uses=False, companion=False, host_class=None,
           class_code='0x020000', driver='ixgbe'):
    return objects.IommuMember(
        objects.PciAddress.parse(address), '8086', '10fb', class_code,
        driver, companion=companion, host_uses=host_uses,
        host_class=host_class)


# --- pgpu_refusal, pgpu_companions ----------------------------------------

def test_a_gpu_without_an_iommu_group_is_refused_whole_in_one_line():
    assert capacity.pgpu_refusal(gpu(iommu_group=None)) == (
        'no IOMMU group, so VFIO cannot hand it to a guest: turn the IOMMU '
        'on (VT-d / AMD-Vi in the firmware, intel_iommu=on on Intel hosts) '
        'and reboot')


def test_group_0_of_its_own_is_given_whole():
    """Group 0 is a group (not "none"), and members the host does not use
    (the GPU, its audio function) do not stand in the way."""
    assert capacity.pgpu_refusal(gpu(iommu_group=0)) is None
    assert capacity.pgpu_refusal(gpu(iommu_group=0, iommu_members=(
        member('0000:41:00.0', class_code='0x030200', driver='nvidia'),
        member('0000:41:00.1', companion=True, class_code='0x040300',
               driver='snd_hda_intel')))) is None


def test_a_group_shared_with_host_devices_names_each_of_them():
    """Each device the host uses, with what it is (its kind when known,
    else its class) and its driver, in the group's order; a member the
    host does not use is not named."""
    shared = gpu(iommu_group=17, iommu_members=(
        member('0000:41:00.0', class_code='0x030200', driver='nvidia'),
        member('0000:42:00.0', host_uses=True,
               host_class='network controller'),
        member('0000:42:00.1', host_uses=True, class_code='0x010802',
               driver='nvme')))
    assert capacity.pgpu_refusal(shared) == (
        'its IOMMU group 17 also holds 0000:42:00.0 (network controller, '
        'driver ixgbe), 0000:42:00.1 (0x010802, driver nvme), which the '
        'host uses; VFIO hands a guest the whole group: put the GPU in a '
        'slot with a group of its own')


def test_the_companions_are_the_group_members_marked_so_sorted():
    found = capacity.pgpu_companions(gpu(iommu_group=3, iommu_members=(
        member('0000:41:00.3', companion=True),
        member('0000:42:00.0', host_uses=True),
        member('0000:41:00.1', companion=True))))
    assert found == (objects.PciAddress.parse('0000:41:00.1'),
                     objects.PciAddress.parse('0000:41:00.3'))
    assert capacity.pgpu_companions(gpu(iommu_group=3)) == ()


# --- limit, parent_total ----------------------------------------------------

@pytest.mark.parametrize('driver_max, setting, expected', [
    (None, None, None),
    (8, None, 8),
    (None, 4, 4),
    (8, 4, 4),
    (4, 8, 4),             # the setting never raises the driver's maximum
    (4, 4, 4),
])
def test_the_limit_is_the_smaller_known_one(driver_max, setting, expected):
    assert capacity.limit(vtype(published=driver_max),
                          enabled(max_instances=setting)) == expected


def test_the_limit_reads_max_instance_from_the_description_first():
    described = vtype(published=16, description=(
        'num_heads=4, framebuffer=2048M, max_instance=12'))
    assert capacity.limit(described, enabled()) == 12


def test_a_parent_that_does_not_list_the_type_holds_none():
    assert capacity.parent_total(None, 0, enabled()) == 0
    assert capacity.parent_total(None, 3, enabled(max_instances=8)) == 0


def test_a_parent_holds_what_exists_plus_what_it_can_still_make():
    assert capacity.parent_total(vtype(available=3), 2, enabled()) == 5


@pytest.mark.parametrize('available, used, cap, expected', [
    (3, 2, 5, 5),          # exactly the limit
    (3, 2, 4, 4),          # one over the limit: cut to it
    (3, 2, 6, 5),          # below the limit: what the driver says
    (0, 3, 1, 3),          # never below what exists
    (1, 2, 2, 2),
])
def test_a_parent_is_cut_to_the_limit_never_below_what_exists(
        available, used, cap, expected):
    assert capacity.parent_total(vtype(available=available, published=cap),
                                 used, enabled()) == expected
    assert capacity.parent_total(vtype(available=available), used,
                                 enabled(max_instances=cap)) == expected


# --- vgpu_total: a GPU without VFs ------------------------------------------

def test_a_gpu_without_vfs_counts_its_vgpus_of_the_type_only():
    """Two vGPUs of the type exist and one of another: the total is the
    two plus what the type can still make, cut to the limit."""
    t4 = gpu(mdev_types=(vtype(available=3), vtype(U, available=5)),
             mdevs=(mdev(0), mdev(1, U), mdev(2)))
    assert capacity.vgpu_total(t4, enabled()) == 5
    assert capacity.vgpu_total(t4, enabled(max_instances=4)) == 4
    assert capacity.vgpu_total(t4, enabled(max_instances=1)) == 2
    assert capacity.vgpu_total(t4, enabled(U)) == 6
    assert capacity.vgpu_total(
        t4, enabled(objects.TypeId.parse('nvidia-1147'))) == 0


# --- vgpu_total: a GPU whose vGPUs live on VFs -----------------------------

def sliced(published=8, pf_types=()):
    """A GPU with VFs: two hold T, one holds U, then free VFs: one lists T,
    one lists T and U, one lists U only, one lists T as an mdev type
    that cannot be made (0 available), one lists T as an mdev type
    with 2 available (a VF still holds one)."""
    t = vtype(published=published)
    return with_vfs(
        vf(4, current=t),
        vf(5, current=vtype(U)),
        vf(6, current=t),
        vf(7, creatable=(t,)),
        vf(8, creatable=(vtype(U), t)),
        vf(9, creatable=(vtype(U),)),
        vf(10, mdev_types=(vtype(available=0, published=published),)),
        vf(11, mdev_types=(vtype(available=2, published=published),)),
        mdev_types=tuple(pf_types))


def test_vfs_count_the_vgpus_of_the_type_plus_one_per_free_vf_listing_it():
    """2 held + 3 free VFs that can make one (the one listing only U, the
    one that lists T with none available and those holding a vGPU do
    not count)."""
    assert capacity.vgpu_total(sliced(), enabled()) == 5


@pytest.mark.parametrize('cap, expected', [
    (5, 5),                # exactly the limit
    (4, 4),                # one under what the VFs offer: cut
    (6, 5),
    (1, 2),                # never below what exists
])
def test_vfs_are_cut_to_the_limit_never_below_what_exists(cap, expected):
    assert capacity.vgpu_total(sliced(published=cap), enabled()) == expected
    assert capacity.vgpu_total(sliced(published=None),
                               enabled(max_instances=cap)) == expected


def test_a_gpu_with_vfs_that_no_function_offers_the_type_holds_none():
    assert capacity.vgpu_total(
        sliced(), enabled(objects.TypeId.parse('nvidia-1147'))) == 0


def test_a_function_that_is_not_a_vf_offers_all_it_lists():
    """A parent that is no VF (the PF) can hold several: its available
    instances count whole, beside the VFs' one each."""
    assert capacity.vgpu_total(sliced(published=20, pf_types=(
        vtype(available=3, published=20),)), enabled()) == 8


def test_the_vgpus_held_count_on_the_pf_too():
    """vGPUs of the type on the PF itself (mdevs) count as held; the PF
    still offers what it lists."""
    t = vtype(available=2, published=20)
    total = capacity.vgpu_total(with_vfs(
        vf(4, creatable=(t,)), mdev_types=(t,),
        mdevs=(mdev(0), mdev(1), mdev(2, U))), enabled())
    assert total == 2 + 2 + 1


def test_a_held_vf_first_does_not_hide_the_free_ones_after_it():
    t = vtype(published=8)
    assert capacity.vgpu_total(with_vfs(
        vf(4, current=t), vf(5, creatable=(t,)), vf(6, creatable=(t,))),
        enabled()) == 3


NO_MAX = ('no maximum known for vGPU type nvidia-1145 on GPU 0000:41:00.0 '
          '(no max_instance in its description, no published one): '
          'reporting 3; set [vgpu_nvidia-1145]/max_instances')


def _warnings(caplog):
    return [(r.name, r.levelno, r.getMessage()) for r in caplog.records]


def test_without_a_maximum_what_exists_plus_one_is_counted_and_said(caplog):
    """2 held and 3 free VFs offering: 2 + 1 (summing free VFs would
    over-report), said in one warning naming the setting."""
    with caplog.at_level(logging.DEBUG):
        assert capacity.vgpu_total(sliced(published=None), enabled()) == 3
    assert _warnings(caplog) == [
        ('libvirt_gpu.devices.capacity', logging.WARNING, NO_MAX)]


def test_without_a_maximum_the_allocator_counts_alike_in_silence(caplog):
    with caplog.at_level(logging.DEBUG):
        assert capacity.vgpu_total(sliced(published=None), enabled(),
                                   warn=False) == 3
    assert caplog.records == []


def test_without_a_maximum_and_nothing_free_only_what_exists_counts(caplog):
    t = vtype()
    full = with_vfs(vf(4, current=t), vf(5, current=t), vf(6, current=t),
                    vf(7, creatable=(vtype(U),)))
    with caplog.at_level(logging.DEBUG):
        assert capacity.vgpu_total(full, enabled()) == 3
        assert capacity.vgpu_total(full, enabled(), warn=False) == 3
    assert [m for _, _, m in _warnings(caplog)] == [NO_MAX]


def test_without_a_maximum_and_nothing_held_one_is_counted(caplog):
    fresh = with_vfs(vf(4, creatable=(vtype(),)),
                     vf(5, creatable=(vtype(),)))
    assert capacity.vgpu_total(fresh, enabled(), warn=False) == 1
    with caplog.at_level(logging.DEBUG):
        assert capacity.vgpu_total(fresh, enabled()) == 1
    assert [m for _, _, m in _warnings(caplog)] == [
        NO_MAX.replace('reporting 3', 'reporting 1')]


# --- free -------------------------------------------------------------------

@pytest.mark.parametrize('args, expected', [
    ((4, 1), 3),
    ((4, 1, 1), 2),        # a pending lease counts
    ((4, 0, 3), 1),
    ((4, 3, 1), 0),        # exactly full
    ((4, 2, 1), 1),        # one below full
    ((4, 4), 0),
    ((4, 3, 2), 0),        # over full (a limit lowered): none, never less
    ((2, 5, 0), 0),
])
def test_free_is_the_total_less_what_exists_and_what_is_pending(
        args, expected):
    assert capacity.free(*args) == expected


def test_another_type_blocks_the_gpu():
    assert capacity.free(4, 0, 0, other_types=True) == 0
    assert capacity.free(4, 0, 0, other_types=False) == 4
    assert capacity.free(4, 0, 0, True) == 0


# --- the driver's room: records ---------------------------------------------

def gi_room(**changes):
    values = dict(id=1, profile_id=19, profile='1g.10gb', used=0,
                  capacity=1)
    values.update(changes)
    return capacity.GiRoom(**values)


def test_a_room_record_is_built_by_name_and_shown_by_value():
    room = gi_room(used=1, capacity=2)
    assert (room.id, room.profile_id, room.profile, room.used,
            room.capacity) == (1, 19, '1g.10gb', 1, 2)
    assert repr(room) == ("GiRoom(id=1, profile_id=19, profile='1g.10gb', "
                          "used=1, capacity=2)")


def test_a_room_record_takes_its_defaults():
    room = capacity.DriverRoom(mode=capacity.MODE_MIXED, type_id=T, used=2)
    assert (room.gis, room.placement_size, room.placements) == (
        (), None, ())
    assert repr(room) == ("DriverRoom(mode='mixed-size', type_id='nvidia-"
                          "1145', used=2, gis=(), placement_size=None, "
                          "placements=())")


def test_a_room_record_refuses_unknown_and_missing_fields():
    with pytest.raises(TypeError) as e:
        gi_room(size=2, colour='red')
    assert str(e.value) == 'GiRoom has no field colour, size'
    with pytest.raises(TypeError) as e:
        capacity.GiRoom(id=1, profile_id=19)
    assert str(e.value) == 'GiRoom needs profile'
    with pytest.raises(TypeError) as e:
        capacity.DriverRoom(mode=capacity.MODE_MIG, used=0)
    assert str(e.value) == 'DriverRoom needs type_id'


def test_a_room_record_cannot_be_changed():
    room = gi_room()
    with pytest.raises(AttributeError) as e:
        room.used = 3
    assert str(e.value) == 'GiRoom is immutable'
    assert room.used == 0


def test_room_records_compare_and_hash_by_value_and_kind():
    assert gi_room() == gi_room()
    assert not gi_room() != gi_room()
    assert gi_room() != gi_room(used=1)
    assert gi_room() != gi_room(profile='1g.10gb+me')
    assert (gi_room() == 'GiRoom') is False
    assert len({gi_room(), gi_room(), gi_room(id=2)}) == 2
    assert hash(gi_room()) == hash(gi_room())
    mig = capacity.DriverRoom(mode=capacity.MODE_MIG, type_id=T, used=0)
    mixed = capacity.DriverRoom(mode=capacity.MODE_MIXED, type_id=T, used=0)
    assert mig != mixed

    class Other(capacity.GiRoom):
        __slots__ = ()

    assert Other(**dict(zip(Other._fields, (1, 19, '1g.10gb', 0, 1)))) \
        != gi_room()


# --- gi_rooms: MIG-backed -------------------------------------------------

PROFILES = {19: '1g.10gb', 15: '1g.20gb', 9: '3g.40gb'}


def gi(id, profile_id):
    return layout.GpuInstance(id=id, profile_id=profile_id)


def test_each_gi_of_the_profile_holds_max_per_gi_in_gi_order():
    rooms = capacity.gi_rooms(
        [gi(9, 19), gi(2, 9), gi(5, 19)], PROFILES, 19, 4, 10240, [])
    assert rooms == (
        capacity.GiRoom(id=2, profile_id=9, profile='3g.40gb', used=0,
                        capacity=0),
        capacity.GiRoom(id=5, profile_id=19, profile='1g.10gb', used=0,
                        capacity=4),
        capacity.GiRoom(id=9, profile_id=19, profile='1g.10gb', used=0,
                        capacity=4))


def test_a_gi_counts_only_the_vgpus_in_it():
    rooms = capacity.gi_rooms(
        [gi(1, 19), gi(2, 19)], PROFILES, 19, 2, 10240,
        [(2, 10240), (2, 10240), (7, 10240)])
    assert [(r.id, r.used, r.capacity, r.free) for r in rooms] == [
        (1, 0, 2, 2), (2, 2, 2, 0)]


def test_a_gi_holding_another_framebuffer_size_holds_none_of_the_type():
    """A GI holds vGPUs of one size: one 5 GiB vGPU in it leaves no room
    for a 10 GiB one (its used is still shown)."""
    rooms = capacity.gi_rooms(
        [gi(1, 19), gi(2, 19)], PROFILES, 19, 2, 10240,
        [(1, 5120), (2, 10240)])
    assert [(r.id, r.used, r.capacity, r.free) for r in rooms] == [
        (1, 1, 0, 0), (2, 1, 2, 1)]


def test_a_gi_of_another_profile_holds_none_even_empty():
    rooms = capacity.gi_rooms([gi(1, 15)], PROFILES, 19, 2, 10240, [])
    assert [(r.profile, r.capacity) for r in rooms] == [('1g.20gb', 0)]


def test_a_gi_never_holds_less_than_it_has():
    """Three vGPUs where the driver says two per GI (a lower maximum read
    later): the room is the three."""
    rooms = capacity.gi_rooms([gi(1, 19)], PROFILES, 19, 2, 10240,
                              [(1, 10240)] * 3)
    assert [(r.used, r.capacity, r.free) for r in rooms] == [(3, 3, 0)]


@pytest.mark.parametrize('max_per_gi', [None, 0])
def test_an_unknown_max_per_gi_is_one(max_per_gi):
    rooms = capacity.gi_rooms([gi(1, 19)], PROFILES, 19, max_per_gi, 10240,
                              [])
    assert [r.capacity for r in rooms] == [1]


def test_a_gi_profile_without_a_name_is_shown_by_its_id():
    rooms = capacity.gi_rooms([gi(4, 47)], PROFILES, 47, 1, 10240, [])
    assert rooms == (capacity.GiRoom(id=4, profile_id=47, profile='47',
                                     used=0, capacity=1),)


def test_no_gi_no_room():
    assert capacity.gi_rooms([], PROFILES, 19, 4, 10240, []) == ()


# --- room_total, and vgpu_total with a room ---------------------------------

def mig_room(used, *capacities):
    return capacity.DriverRoom(
        mode=capacity.MODE_MIG, type_id=T, used=used,
        gis=tuple(gi_room(id=n, capacity=c, used=0)
                  for n, c in enumerate(capacities)))


def mixed_room(used, placements):
    return capacity.DriverRoom(
        mode=capacity.MODE_MIXED, type_id=T, used=used, placement_size=2,
        placements=tuple(range(0, 2 * placements, 2)))


@pytest.mark.parametrize('room, setting, expected', [
    (mig_room(0, 4, 4, 0), None, 8),    # the GIs of the profile, summed
    (mig_room(0, 4, 4, 0), 8, 8),       # exactly the setting
    (mig_room(0, 4, 4, 0), 7, 7),       # one under: cut
    (mig_room(0, 4, 4, 0), 9, 8),       # never above the driver
    (mig_room(3, 4, 4, 0), 1, 3),       # never below what exists
    (mixed_room(2, 3), None, 5),        # what exists + creatable placements
    (mixed_room(2, 3), 4, 4),
    (mixed_room(2, 3), 1, 2),
    (mixed_room(0, 0), None, 0),
])
def test_the_driver_room_cut_by_the_setting(room, setting, expected):
    assert capacity.room_total(room, enabled(max_instances=setting)) == \
        expected
    assert capacity.vgpu_total(sliced(published=1), enabled(
        max_instances=setting), room=room) == expected
