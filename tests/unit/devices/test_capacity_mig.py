"""Capacity that is the driver's (issue 28 item 4): on a GPU in MIG mode
the room of a MIG-backed type is max instances per GI x the GIs of its
profile; on a GPU in mixed-size mode it is the type's creatable
placements.  Checked against the simulated driver (the kernel double and
the simulated NVML over the same tree): the numbers the product computes
are exactly what the driver then makes, and the next vGPU is refused in
one line naming the type and the GPU."""

import json
import os
import uuid as uuid_mod

import pytest

from libvirt_gpu.devices.backends import base
from libvirt_gpu.devices import capacity
from libvirt_gpu.devices.backends import registry
from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.openstack.placement import model
from libvirt_gpu.host import allocator as allocator_mod
from libvirt_gpu.store import state
from tests.doubles import mig_host
from tests.doubles.mig_host import GI_1G_10GB
from tests.doubles.mig_host import GI_3G_40GB
from tests.doubles.mig_host import H100
from tests.doubles.mig_host import H100_1_10C
from tests.doubles.mig_host import H100_1_20C
from tests.doubles.mig_host import L40S
from tests.doubles.mig_host import L40S_12Q
from tests.doubles.mig_host import L40S_1B
from tests.doubles.mig_host import _Env

h100 = mig_host.h100
l40s = mig_host.l40s


def _allocator(host, gpu, type_id):
    return allocator_mod.Allocator(
        registry.Vgpus(host.sysfs, [host.backend]),
        state.LeaseStore(host.state_dir),
        {gpu: objects.EnabledType(type_id)})


def _reserve_all(host, gpu, type_id):
    """Leases of ``type_id`` until the allocator refuses (none created
    yet), then each vGPU made by the driver on the VF it was given."""
    alloc = _allocator(host, gpu, type_id)
    grants = []
    domain = objects.Uuid.parse(str(uuid_mod.uuid4()))
    with pytest.raises(exception.NoCapacity) as refused:
        for _ in range(64):
            grants.extend(alloc.reserve(domain, [allocator_mod.VgpuClaim(
                objects.Uuid.parse(str(uuid_mod.uuid4())), type_id)]))
    for grant in grants:
        assert host.backend.prepare(grant.device) is True
    return alloc, len(grants), refused.value


def _total(host, gpu, type_id):
    room = host.backend.room(gpu, type_id)
    return room, capacity.vgpu_total(None, objects.EnabledType(type_id),
                                     room=room)


def _one_line(error):
    text = str(error)
    assert '\n' not in text
    return text


def test_mig_backed_room_is_max_per_gi_times_its_gis(h100):
    # 4 x 1g.10gb + 1 x 3g.40gb: H100-1-10C fits the four 1g.10gb GIs
    # only, one per GI; 12 free VFs list it, and it is not 7 (the type's
    # maximum on an empty GPU)
    h100.mig(H100, [GI_1G_10GB] * 4 + [GI_3G_40GB])
    room, total = _total(h100, H100, H100_1_10C)
    assert room.mode == capacity.MODE_MIG
    assert total == 4
    assert [(g.profile, g.capacity) for g in room.gis] == [
        ('3g.40gb', 0)] + [('1g.10gb', 1)] * 4
    made, refusal = h100.fill(H100, H100_1_10C)
    assert made == total                   # the driver made every one
    text = _one_line(refusal)
    assert str(H100_1_10C) in text and str(H100) in text
    room, total = _total(h100, H100, H100_1_10C)
    assert total == 4 and room.used == 4
    assert [g.free for g in room.gis] == [0] * 5


def test_a_type_of_no_gi_in_the_layout_has_no_room(h100):
    h100.mig(H100, [GI_1G_10GB] * 2)
    assert _total(h100, H100, H100_1_20C)[1] == 0
    assert h100.fill(H100, H100_1_20C)[0] == 0


def test_mixed_size_room_is_the_creatable_placements(l40s):
    l40s.mixed(L40S)
    room, total = _total(l40s, L40S, L40S_12Q)
    assert room.mode == capacity.MODE_MIXED
    assert room.placement_size == 8 and room.placements == (0, 8, 16, 24)
    assert total == 4
    made, refusal = l40s.fill(L40S, L40S_12Q)
    assert made == total
    text = _one_line(refusal)
    assert str(L40S_12Q) in text and str(L40S) in text
    room, total = _total(l40s, L40S, L40S_12Q)
    assert (room.used, room.placements, total) == (4, (), 4)


def test_equal_size_keeps_the_vf_rule(l40s):
    l40s.vfs(L40S, 16)
    assert l40s.backend.room(L40S, L40S_12Q) is None


class _NoSession(object):
    def session(self):
        raise AssertionError('NVML asked about a GPU without VFs')


def test_a_gpu_without_vfs_has_no_room_and_nvml_is_not_asked(l40s):
    l40s.mixed(L40S)
    assert l40s.backend.room(L40S, L40S_12Q) is not None
    l40s.vfs(L40S, 0)
    l40s.backend.nvml = _NoSession()
    assert l40s.backend.room(L40S, L40S_12Q) is None


def test_without_nvml_no_room_is_read(l40s):
    l40s.backend.nvml = None
    assert l40s.backend.room(L40S, L40S_12Q) is None


def test_the_allocator_promises_what_the_mig_driver_makes(h100):
    h100.mig(H100, [GI_1G_10GB] * 4 + [GI_3G_40GB])
    assert _allocator(h100, H100, H100_1_10C).capacity(H100_1_10C) == {
        H100: 4}
    alloc, granted, refusal = _reserve_all(h100, H100, H100_1_10C)
    assert granted == 4                 # every lease was made above
    text = _one_line(refusal)
    assert str(H100_1_10C) in text and str(H100) in text
    assert alloc.capacity(H100_1_10C) == {H100: 0}


def test_the_allocator_promises_what_the_mixed_size_driver_makes(l40s):
    l40s.mixed(L40S)
    alloc, granted, refusal = _reserve_all(l40s, L40S, L40S_12Q)
    assert granted == 4
    text = _one_line(refusal)
    assert str(L40S_12Q) in text and str(L40S) in text


def _inventory(host, gpu, type_id, rooms):
    from libvirt_gpu.devices import discovery
    from tests.doubles import kinds
    gpus = discovery.from_sysfs(host.sysfs, kinds=kinds.registered()).gpus
    provider_tree = model.build_tree(
        'compute-1', gpus, {gpu: objects.EnabledType(type_id)},
        rooms=rooms)
    (provider,) = [p for p in provider_tree.children
                   if p.name == model.gpu_provider_name('compute-1', gpu)]
    (inventory,) = provider.inventories
    return inventory.total


def test_placement_reports_max_per_gi_times_the_gis(h100):
    h100.mig(H100, [GI_1G_10GB] * 4 + [GI_3G_40GB])
    env = _Env(h100, {H100: objects.EnabledType(H100_1_10C)})
    rooms = env.vgpus.rooms(env.enabled)
    assert set(rooms) == {(H100, H100_1_10C)}
    assert _inventory(h100, H100, H100_1_10C, rooms) == 4
    # and it stays the GPU's total while the GPU fills
    h100.fill(H100, H100_1_10C)
    assert _inventory(h100, H100, H100_1_10C,
                      env.vgpus.rooms(env.enabled)) == 4


def test_placement_reports_the_creatable_placements(l40s):
    l40s.mixed(L40S)
    assert l40s.fill(L40S, L40S_12Q)[0] == 4
    with pytest.raises(exception.NoCapacity):
        l40s.backend.choose_vf(L40S, L40S_12Q)
    env = _Env(l40s, {L40S: objects.EnabledType(L40S_12Q)})
    rooms = env.vgpus.rooms(env.enabled)
    assert rooms[L40S, L40S_12Q].used == 4
    assert _inventory(l40s, L40S, L40S_12Q, rooms) == 4


def test_placement_leaves_out_a_gpu_with_no_gi_for_its_type(h100):
    h100.mig(H100, [GI_3G_40GB])
    env = _Env(h100, {H100: objects.EnabledType(H100_1_10C)})
    rooms = env.vgpus.rooms(env.enabled)
    assert rooms[H100, H100_1_10C].total == 0
    from libvirt_gpu.devices import discovery
    from tests.doubles import kinds
    gpus = discovery.from_sysfs(h100.sysfs, kinds=kinds.registered()).gpus
    assert model.build_tree('compute-1', gpus, {
        H100: objects.EnabledType(H100_1_10C)}, rooms=rooms).children == ()


def _cli(capsys, host, root, type_id, gpu, *argv):
    from libvirt_gpu.cmd import main as cli
    config = os.path.join(os.path.dirname(root), 'libvirt-gpu.conf')
    with open(config, 'w') as f:
        f.write('[DEFAULT]\nsysfs_root = %s\nstate_dir = %s\n'
                '[gpu]\nnvml = simulated\nenabled_vgpu_types = %s\n'
                '[vgpu_%s]\ndevice_addresses = %s\n' % (
                    root, host.state_dir, type_id, type_id, gpu))
    code = cli.main(['--config-file', config, '--sysfs-root', root]
                    + list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def test_list_shows_the_gis_and_the_driver_s_capacity(h100, capsys):
    h100.mig(H100, [GI_1G_10GB] * 4 + [GI_3G_40GB])
    root = h100.sysfs.root
    types = json.loads(_cli(capsys, h100, root, H100_1_10C, H100, 'types',
                            '--json'))[str(H100)]
    assert {t['id']: t['available_instances'] for t in types}[
        str(H100_1_10C)] == 4
    h100.fill(H100, H100_1_10C)
    gpus = {g['address']: g for g in json.loads(_cli(
        capsys, h100, root, H100_1_10C, H100, 'list', '--json'))}
    gpu = gpus[str(H100)]
    assert (gpu['vgpu_mode'], gpu['capacity']) == ('mig-backed', 4)
    assert [(g['profile'], g['used'], g['free'])
            for g in gpu['gpu_instances']] == [
        ('3g.40gb', 0, 0)] + [('1g.10gb', 1, 0)] * 4
    assert 'vgpu_mode' not in gpus['0000:4e:00.4']      # a VF
    text = _cli(capsys, h100, root, H100_1_10C, H100, 'list')
    assert '%s: mig-backed %s: GI 2 3g.40gb 0 used 0 free, GI 7 1g.10gb ' \
        '1 used 0 free' % (H100, H100_1_10C) in text


def test_list_shows_the_free_placements(l40s, capsys):
    l40s.mixed(L40S)
    l40s.backend.prepare(base.VgpuDevice(
        uuid=objects.Uuid.parse(str(uuid_mod.uuid4())),
        parent=l40s.backend.choose_vf(L40S, L40S_12Q), type_id=L40S_12Q))
    gpus = {g['address']: g for g in json.loads(_cli(
        capsys, l40s, l40s.sysfs.root, L40S_12Q, L40S, 'list', '--json'))}
    gpu = gpus[str(L40S)]
    assert (gpu['vgpu_mode'], gpu['capacity']) == ('mixed-size', 4)
    assert gpu['placements'] == {'size': 8, 'used': 1, 'free': [8, 16, 24]}


# --- the pure rules ----------------------------------------------------------

class _Gi(object):
    def __init__(self, id, profile_id):
        self.id, self.profile_id = id, profile_id


def test_gi_rooms_multiply_max_per_gi():
    gis = [_Gi(3, 19), _Gi(4, 19), _Gi(1, 9)]
    rooms = capacity.gi_rooms(gis, {19: '1g.10gb', 9: '3g.40gb'}, 19, 2,
                              10240, [(3, 10240)])
    assert [(r.id, r.capacity, r.used, r.free) for r in rooms] == [
        (1, 0, 0, 0), (3, 2, 1, 1), (4, 2, 0, 2)]
    room = capacity.DriverRoom(mode=capacity.MODE_MIG, type_id=H100_1_10C,
                               used=1, gis=rooms)
    assert room.total == 4


def test_a_gi_holding_another_framebuffer_size_gives_none():
    rooms = capacity.gi_rooms([_Gi(3, 19), _Gi(4, 19)], {}, 19, 2, 10240,
                              [(3, 5120)])
    assert [(r.capacity, r.used, r.free) for r in rooms] == [
        (0, 1, 0), (2, 0, 2)]


def test_max_instances_lowers_the_room_never_below_what_exists():
    room = capacity.DriverRoom(mode=capacity.MODE_MIXED, type_id=L40S_12Q,
                               used=3, placement_size=8, placements=(24,))
    assert capacity.room_total(room, objects.EnabledType(L40S_12Q)) == 4
    assert capacity.room_total(room, objects.EnabledType(
        L40S_12Q, max_instances=2)) == 3
    assert capacity.vgpu_total(None, objects.EnabledType(
        L40S_12Q, max_instances=1), room=room) == 3


def test_room_records_are_immutable_values():
    room = capacity.DriverRoom(mode=capacity.MODE_MIXED, type_id=L40S_12Q,
                               used=0)
    assert room == capacity.DriverRoom(
        mode=capacity.MODE_MIXED, type_id=L40S_12Q, used=0, placements=())
    with pytest.raises(AttributeError):
        room.used = 3
    with pytest.raises(TypeError, match='placement'):
        capacity.DriverRoom(mode=capacity.MODE_MIXED, type_id=L40S_12Q,
                            used=0, placement=8)


# --- several types on one GPU (a layout listing several vgpu_types) ---------

H100_3_40C = objects.TypeId.parse('nvidia-1312')   # 3g.40gb, 1 per GI


def _several(host, gpu, first, *others):
    """An allocator over ``gpu`` offering ``first`` and ``others``
    (``(TypeId, max_instances)`` each)."""
    setting = objects.EnabledType(
        first[0], max_instances=first[1], others=tuple(
            objects.EnabledType(t, max_instances=n) for t, n in others))
    return allocator_mod.Allocator(
        registry.Vgpus(host.sysfs, [host.backend]),
        state.LeaseStore(host.state_dir), {gpu: setting})


def _lease_in_turn(alloc, types):
    """One lease of each of ``types`` in turn, a type left out once the
    allocator refuses it, none created until all are refused; ``{type:
    grants}``."""
    domain = objects.Uuid.parse(str(uuid_mod.uuid4()))
    grants = {t: [] for t in types}
    waiting = list(types)
    while waiting:
        for type_id in list(waiting):
            try:
                grants[type_id].extend(alloc.reserve(domain, [
                    allocator_mod.VgpuClaim(
                        objects.Uuid.parse(str(uuid_mod.uuid4())),
                        type_id)]))
            except exception.NoCapacity as e:
                assert str(type_id) in _one_line(e)
                waiting.remove(type_id)
    return grants


def test_two_mig_types_of_their_own_gis_are_both_granted_in_full(h100):
    # leases of one type pending (not created yet) take nothing of the
    # other's GIs: each type gets all of its own, and the driver makes
    # every one of them
    h100.mig(H100, [GI_1G_10GB] * 4 + [GI_3G_40GB])
    alloc = _several(h100, H100, (H100_1_10C, None), (H100_3_40C, None))
    assert alloc.capacity(H100_1_10C) == {H100: 4}
    assert alloc.capacity(H100_3_40C) == {H100: 1}
    grants = _lease_in_turn(alloc, [H100_1_10C, H100_3_40C])
    assert {t: len(g) for t, g in grants.items()} == {
        H100_1_10C: 4, H100_3_40C: 1}
    for grant in grants[H100_1_10C] + grants[H100_3_40C]:
        assert h100.backend.prepare(grant.device) is True
    profiles = {gi_id: gi.profile for gi_id, gi in (
        (g.id, g) for g in h100.backend.room(H100, H100_1_10C).gis)}
    assert sorted(profiles.values()) == ['1g.10gb'] * 4 + ['3g.40gb']
    assert h100.backend.room(H100, H100_3_40C).used == 1


def test_a_type_not_on_the_gpu_is_refused_naming_the_gpus_types(h100):
    h100.mig(H100, [GI_1G_10GB] * 4 + [GI_3G_40GB])
    alloc = _several(h100, H100, (H100_1_10C, None), (H100_3_40C, None))
    with pytest.raises(exception.TypeNotEnabled) as refused:
        alloc.reserve(objects.Uuid.parse(str(uuid_mod.uuid4())), [
            allocator_mod.VgpuClaim(
                objects.Uuid.parse(str(uuid_mod.uuid4())), H100_1_20C)])
    assert 'nvidia-1308, nvidia-1312' in _one_line(refused.value)


def test_mixed_size_counts_are_what_each_type_gets(l40s):
    # 12Q:3 and 1B:1 fit together whatever placements the driver picks:
    # 12Q gets 3 (not the 4 it has alone) and 1B its 1, all made
    l40s.mixed(L40S)
    alloc = _several(l40s, L40S, (L40S_12Q, 3), (L40S_1B, 1))
    grants = _lease_in_turn(alloc, [L40S_1B, L40S_12Q])
    assert {t: len(g) for t, g in grants.items()} == {
        L40S_12Q: 3, L40S_1B: 1}
    for grant in grants[L40S_1B] + grants[L40S_12Q]:
        assert l40s.backend.prepare(grant.device) is True


def test_placement_has_a_provider_per_type_with_its_own_total(h100):
    from libvirt_gpu.devices import discovery
    from tests.doubles import kinds
    h100.mig(H100, [GI_1G_10GB] * 4 + [GI_3G_40GB])
    setting = objects.EnabledType(H100_1_10C, others=(
        objects.EnabledType(H100_3_40C, resource_class='CUSTOM_H100_3_40C'),))
    env = _Env(h100, {H100: setting})
    gpus = discovery.from_sysfs(h100.sysfs, kinds=kinds.registered()).gpus
    found = model.build_tree('compute-1', gpus, env.enabled,
                             rooms=env.vgpus.rooms(env.enabled))
    totals = {p.name: [(i.resource_class, i.total) for i in p.inventories]
              for p in found.children}
    assert totals == {
        'compute-1_0000:4e:00.0': [('VGPU', 4)],
        'compute-1_0000:4e:00.0_nvidia-1312': [('CUSTOM_H100_3_40C', 1)]}
    uuids = {p.uuid for p in found.children}
    assert len(uuids) == 2
    for provider in found.children:
        assert model.gpu_provider_address(
            'compute-1', provider.name) == H100
    traits = [p.traits for p in found.children]
    assert traits[0] != traits[1]            # each names its own type


@pytest.mark.parametrize('name, address', [
    ('compute-1_0000:4e:00.0', H100),
    ('compute-1_0000:4e:00.0_nvidia-1312', H100),
    ('compute-1_0000:4e:00.0_', None),            # no type after the _
    ('compute-1_0000:4e:00.0_../x', None),
    ('compute-2_0000:4e:00.0_nvidia-1312', None),
    ('compute-1_pci_0000_4e_00_0', None)])       # Nova's vGPU provider
def test_a_type_providers_name_is_read_back(name, address):
    assert model.gpu_provider_address('compute-1', name) == address
    if address is not None and name.count('_') == 2:
        assert model.type_provider_name(
            'compute-1', address, objects.TypeId.parse('nvidia-1312')) == name
