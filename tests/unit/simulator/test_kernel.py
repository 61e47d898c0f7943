"""The simulated kernel's mdev rules (no FUSE, no files) and the libudev
message format."""

import copy
import errno
import json
import threading
import time
import uuid as uuidlib

import pytest

from libvirt_gpu import simulator
from libvirt_gpu.simulator import kernel as kernel_mod
from libvirt_gpu.simulator import loading
from libvirt_gpu.simulator import uevent
from tests.doubles import trees
from tests.doubles.poll import wait_for

A = '0000:3b:00.0'          # empty T4
B = '0000:af:00.0'          # T4 holding two nvidia-223
EXISTING = '4b20d080-1b54-4048-85b3-a6a62d165c01'


def new_uuid():
    return str(uuidlib.uuid4())


def t4_data():
    path = loading.profile_dir() + '/t4.json'
    with open(path) as f:
        return json.load(f)


@pytest.fixture
def k():
    return kernel_mod.SimKernel('t4')


def errno_of(call, *args):
    with pytest.raises(OSError) as e:
        call(*args)
    return e.value.errno


# --- create ----------------------------------------------------------------

@pytest.mark.parametrize('data', [
    b'', b'1', new_uuid()[:35].encode(),                 # too short
    (new_uuid() + '\n\n').encode(),                       # 38 bytes
    b'zzzzzzzz-1b54-4048-85b3-a6a62d165c01',              # not hex
    b'4b20d0801b54-4048-85b3-a6a62d165c01-',              # dashes misplaced
])
def test_malformed_uuid_is_einval(k, data):
    assert errno_of(k.create_mdev, A, 'nvidia-223', data) == errno.EINVAL
    assert len(k.mdevs()) == 2


def test_uuid_parsing_is_the_kernels():
    u = new_uuid()
    assert kernel_mod.parse_create(u) == u
    assert kernel_mod.parse_create(u + '\n') == u
    assert kernel_mod.parse_create(u + 'x') == u        # 37th byte ignored
    assert kernel_mod.parse_create(u.upper().encode()) == u   # lowercased


def test_create_counts_down_every_type_of_the_gpu(k):
    before = {t.id: k.available_instances(A, t.id)
              for t in k.device(A).mdev_types}
    assert before['nvidia-223'] == 8 and before['nvidia-234'] == 1
    m = k.create_mdev(A, 'nvidia-223', new_uuid() + '\n')
    assert (m.parent, m.type_id) == (A, 'nvidia-223')
    assert k.available_instances(A, 'nvidia-223') == 7
    # one type per GPU: every other type is now unavailable on A
    assert all(k.available_instances(A, t) == 0 for t in before
               if t != 'nvidia-223')
    # the other GPU is untouched
    assert k.available_instances(B, 'nvidia-223') == 6


def test_duplicate_uuid_on_any_parent_is_eexist(k):
    assert errno_of(k.create_mdev, A, 'nvidia-223', EXISTING) == errno.EEXIST
    assert errno_of(k.create_mdev, B, 'nvidia-223', EXISTING) == errno.EEXIST
    # upper case names the same UUID
    assert errno_of(k.create_mdev, A, 'nvidia-223',
                    EXISTING.upper()) == errno.EEXIST
    assert [m.uuid for m in k.mdevs(A)] == []


def test_no_capacity_answers_the_profiles_errno(k):
    k.create_mdev(A, 'nvidia-234', new_uuid())     # T4-16Q: one per GPU
    code = errno_of(k.create_mdev, A, 'nvidia-234', new_uuid())
    assert code == errno.EINVAL                    # NVIDIA's answer
    data = t4_data()
    data['no_capacity_errno'] = 'EUSERS'           # the mdev core's answer
    other = kernel_mod.SimKernel(loading.profile_from_dict(data))
    other.create_mdev(A, 'nvidia-234', new_uuid())
    assert errno_of(other.create_mdev, A, 'nvidia-234',
                    new_uuid()) == errno.EUSERS


def test_mixed_types_refused(k):
    code = errno_of(k.create_mdev, B, 'nvidia-231', new_uuid())
    assert code == errno.EINVAL
    assert {m.type_id for m in k.mdevs(B)} == {'nvidia-223'}


def test_unknown_type_or_parent_is_enoent(k):
    assert errno_of(k.create_mdev, A, 'nvidia-999', new_uuid()) == \
        errno.ENOENT
    assert errno_of(k.create_mdev, '0000:ae:00.0', 'nvidia-223',
                    new_uuid()) == errno.ENOENT      # a bridge


def test_iommu_groups_are_fresh_and_reused_like_an_ida(k):
    groups = {m.iommu_group for m in k.mdevs()}
    # after the PCI devices' (28, 58) and implied bridges' (59, 60)
    assert groups == {61, 62}
    m1 = k.create_mdev(A, 'nvidia-223', new_uuid())
    assert m1.iommu_group == 63
    k.remove_mdev(EXISTING)
    m2 = k.create_mdev(A, 'nvidia-223', new_uuid())
    assert m2.iommu_group == 61        # the lowest free id again


def test_racing_creators_for_the_last_instances(k):
    winners, losers = [], []
    go = threading.Barrier(6)

    def creator():
        u = new_uuid()
        go.wait()
        try:
            k.create_mdev(A, 'nvidia-233', u)      # T4-8Q: two per GPU
            winners.append(u)
        except OSError as e:
            losers.append(e.errno)

    threads = [threading.Thread(target=creator) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 2
    assert losers == [errno.EINVAL] * 4
    assert sorted(m.uuid for m in k.mdevs(A)) == sorted(winners)


# --- remove ----------------------------------------------------------------

def test_remove_returns_capacity(k):
    assert k.available_instances(B, 'nvidia-223') == 6
    assert k.remove_mdev(EXISTING, b'1\n') is True
    assert k.mdev(EXISTING) is None
    assert k.available_instances(B, 'nvidia-223') == 7
    assert errno_of(k.remove_mdev, EXISTING) == errno.ENOENT


@pytest.mark.parametrize('data,removed', [
    (b'0', False), (b'0\n', False), (b'1', True), (b'0x1', True),
    (b'+7\n', True)])
def test_remove_values(k, data, removed):
    assert k.remove_mdev(EXISTING, data) is removed
    assert (k.mdev(EXISTING) is None) is removed


@pytest.mark.parametrize('data', [b'', b'yes', b'-1', b'1\n\n', b'08'])
def test_remove_bad_value_is_einval(k, data):
    assert errno_of(k.remove_mdev, EXISTING, data) == errno.EINVAL
    assert k.mdev(EXISTING) is not None


def test_busy_remove_ebusy_mode():
    k = kernel_mod.SimKernel('t4', busy_remove='ebusy')
    k.mark_busy(EXISTING)
    assert errno_of(k.remove_mdev, EXISTING) == errno.EBUSY
    assert k.mdev(EXISTING) is not None and k.busy() == [EXISTING]
    k.mark_idle(EXISTING)
    assert k.remove_mdev(EXISTING) is True


def test_busy_remove_blocks_until_the_guest_lets_go(k):
    k.mark_busy(EXISTING)
    done = []
    t0 = time.monotonic()
    t = threading.Thread(target=lambda: done.append(
        (k.remove_mdev(EXISTING), time.monotonic() - t0)))
    t.start()
    time.sleep(0.3)
    assert done == [] and k.mdev(EXISTING) is not None
    # the lock is not held while it waits: others proceed
    k.create_mdev(A, 'nvidia-223', new_uuid())
    k.mark_idle(EXISTING)
    t.join(5)
    assert done and done[0][0] is True and done[0][1] >= 0.3
    assert k.mdev(EXISTING) is None


def test_close_wakes_a_blocked_remover(k):
    k.mark_busy(EXISTING)
    errors = []

    def remover():
        try:
            k.remove_mdev(EXISTING)
        except OSError as e:
            errors.append(e.errno)

    t = threading.Thread(target=remover)
    t.start()
    time.sleep(0.1)
    k.close()
    t.join(5)
    assert errors == [errno.EINTR]


def test_unknown_busy_mode_refused():
    with pytest.raises(simulator.profile.exception.SimulatorError):
        kernel_mod.SimKernel('t4', busy_remove='sometimes')


# --- parent unbinding --------------------------------------------------------

def test_unbind_waits_for_busy_mdevs_and_refuses_creates(k):
    events = []
    k.subscribe(events.append)
    k.mark_busy(EXISTING)
    t = threading.Thread(target=k.unbind_parent, args=(B,))
    t.start()
    # the idle one goes at once, the busy one waits (polled: the thread
    # may not have run yet on a loaded machine)
    assert wait_for(lambda: k.parent_state(B) == kernel_mod.GOING
                    and [m.uuid for m in k.mdevs(B)] == [EXISTING])
    assert errno_of(k.create_mdev, B, 'nvidia-223', new_uuid()) == \
        errno.ENODEV
    assert k.available_instances(B, 'nvidia-223') == 0
    k.mark_idle(EXISTING)
    t.join(5)
    assert k.parent_state(B) == kernel_mod.UNBOUND and k.mdevs(B) == []
    assert errno_of(k.create_mdev, B, 'nvidia-223', new_uuid()) == \
        errno.ENOENT
    kinds = [type(e).__name__ for e in events]
    assert kinds == ['ParentGoing', 'MdevRemoved', 'MdevRemoved',
                     'ParentUnbound']
    assert events[2].mdev.uuid == EXISTING
    assert errno_of(k.unbind_parent, B) == errno.ENODEV
    k.bind_parent(B)
    assert k.available_instances(B, 'nvidia-223') == 8
    assert errno_of(k.bind_parent, B) == errno.EBUSY
    assert type(events[-1]).__name__ == 'ParentBound'


def test_unbind_forces_busy_mdevs_in_ebusy_mode():
    k = kernel_mod.SimKernel('t4', busy_remove='ebusy')
    k.mark_busy(EXISTING)
    k.unbind_parent(B)
    assert k.mdevs(B) == [] and k.busy() == []


def test_events_carry_what_the_tree_needs(k):
    events = []
    k.subscribe(events.append)
    u = new_uuid()
    k.create_mdev(A, 'nvidia-222', u)
    k.remove_mdev(u)
    assert [type(e) for e in events] == [kernel_mod.MdevAdded,
                                         kernel_mod.MdevRemoved]
    assert events[0].mdev == events[1].mdev
    assert events[0].mdev.type_id == 'nvidia-222'


def test_the_profile_is_not_changed(k):
    profile = simulator.load_profile('t4')
    before = copy.deepcopy(profile)
    k.create_mdev(A, 'nvidia-223', new_uuid())
    assert simulator.load_profile('t4') == before


# --- libudev messages --------------------------------------------------------

def test_murmur_hash2_matches_systemd():
    # string_hash32() of systemd's MurmurHash2.c, compiled and run on x86
    assert {s: uevent.murmur_hash2(s) for s in (
        'mdev', 'pci', 'pcie', 'block', 'usb_device', '')} == {
        'mdev': 3142717895, 'pci': 1494629266, 'pcie': 618540812,
        'block': 4026736055, 'usb_device': 670627084, '': 0}


def test_encode_decode_round_trip():
    props = [('ACTION', 'add'), ('DEVPATH', '/devices/pci0000:ae/x'),
             ('SUBSYSTEM', 'mdev'), ('MDEV_TYPE', 'nvidia-223'),
             ('SEQNUM', '7')]
    msg = uevent.encode(props)
    assert msg[:8] == b'libudev\0'
    assert msg[8:12] == b'\xfe\xed\xca\xfe'         # big-endian magic
    assert int.from_bytes(msg[12:16], 'little') == 40
    assert msg[40:].split(b'\0')[:5] == [
        b'ACTION=add', b'DEVPATH=/devices/pci0000:ae/x', b'SUBSYSTEM=mdev',
        b'MDEV_TYPE=nvidia-223', b'SEQNUM=7']
    assert msg.endswith(b'\0')
    assert msg[24:28] == uevent.murmur_hash2('mdev').to_bytes(4, 'big')
    assert uevent.decode(msg) == dict(props)


def test_encode_needs_the_keys_libudev_needs():
    with pytest.raises(ValueError):
        uevent.encode([('ACTION', 'add'), ('SUBSYSTEM', 'mdev')])
    with pytest.raises(ValueError):
        uevent.decode(b'add@/devices/x\0ACTION=add\0')   # kernel format


# --- SR-IOV ------------------------------------------------------------------

@pytest.fixture
def sriov(tmp_path):
    return kernel_mod.SimKernel(trees.sriov_profile_file(tmp_path))


def test_vfs_of_one_gpu_share_its_capacity(sriov):
    vf0, vf1 = '0000:3d:00.4', '0000:3d:00.5'
    sriov.create_mdev(vf0, 'nvidia-693', new_uuid())       # the whole A100
    assert sriov.available_instances(vf1, 'nvidia-693') == 0
    assert sriov.available_instances(vf1, 'nvidia-692') == 0
    assert errno_of(sriov.create_mdev, vf1, 'nvidia-692',
                    new_uuid()) == errno.EINVAL
    # a VF holds one vGPU even of a type with room left
    assert sriov.available_instances(vf0, 'nvidia-693') == 0


def test_vendor_interface_rules(sriov):
    vf0, vf1, vf2 = '0000:5e:00.4', '0000:5e:00.5', '0000:5e:00.6'
    assert sriov.vendor_vfs() == [vf0, vf1, vf2]
    assert [t.number for t in sriov.vf_creatable(vf0)] == [
        1145, 1154, 1155]
    for bad in (b'', b'abc', b'-1', b'1145x', b'9999'):
        assert errno_of(sriov.set_vgpu_type, vf0, bad) == errno.EINVAL
    assert sriov.set_vgpu_type(vf0, b'1145\n') == 'nvidia-1145'
    assert errno_of(sriov.set_vgpu_type, vf0, b'1145') == errno.EBUSY
    assert [t.number for t in sriov.vf_creatable(vf1)] == [1145]
    assert sriov.set_vgpu_type(vf1, b'0') is None           # a no-op
    sriov.mark_busy(vf0)
    sriov.busy_remove = kernel_mod.BUSY_EBUSY
    assert errno_of(sriov.set_vgpu_type, vf0, b'0') == errno.EBUSY
    sriov.mark_idle(vf0)
    assert sriov.set_vgpu_type(vf0, b'0') is None
    assert sriov.vf_type(vf0) is None
    assert errno_of(sriov.mark_busy, vf0) == errno.ENOENT    # holds none


# --- the bundled SR-IOV profiles: VFs share their GPU as the driver does -----

A100_PF = '0000:41:00.0'          # 16 VFs enabled, one A100-20C on .4
A100_OFF = '0000:c1:00.0'         # VFs not enabled
A100_HELD = 'aa618089-8b16-4d01-a136-25a0f3c73123'
L40S_FULLISH = '0000:3d:00.0'     # two L40S-1B
L40S_EMPTY = '0000:bd:00.0'


def _gpu_vfs(k, pf):
    return [a for a in k.parents()
            if k.profile.device(a).physfn == pf]


def _avail(k, vf):
    return {t.id: k.available_instances(vf, t.id)
            for t in k.device(vf).mdev_types}


def _check_gpu_invariants(k, pf):
    """What NVIDIA's driver guarantees on an SR-IOV GPU before vGPU 17:
    one vGPU per VF, one type per GPU, at most max_instance of it, and a
    VF shows a type available only when a create of it would succeed."""
    vfs = _gpu_vfs(k, pf)
    mdevs = [m for m in k.mdevs() if m.parent in vfs]
    assert len({m.parent for m in mdevs}) == len(mdevs)
    assert len({m.type_id for m in mdevs}) <= 1
    for m in mdevs:
        assert len(mdevs) <= k.device(m.parent).mdev_type(
            m.type_id).max_instance
    held = {m.parent for m in mdevs}
    for vf in vfs:
        for type_id, n in _avail(k, vf).items():
            assert n in (0, 1)
            fits = vf not in held and (
                not mdevs or (mdevs[0].type_id == type_id and len(mdevs)
                              < k.device(vf).mdev_type(type_id)
                              .max_instance))
            assert n == int(fits), (vf, type_id, n)


def test_a100_parents_are_the_enabled_vfs():
    k = kernel_mod.SimKernel('a100')
    assert k.parents() == _gpu_vfs(k, A100_PF)
    assert len(k.parents()) == 16
    # 0000:c1:00.0 has not enabled its VFs: the kernel has no such parent
    disabled = k.profile.device(A100_OFF).virtfns[0]
    assert disabled not in k.parents()
    assert errno_of(k.create_mdev, disabled, 'nvidia-472',
                    new_uuid()) == errno.ENOENT
    assert errno_of(k.create_mdev, A100_OFF, 'nvidia-472',
                    new_uuid()) == errno.ENOENT          # the PF: no types


def test_a100_create_on_one_vf_lowers_every_vf_of_the_gpu():
    k = kernel_mod.SimKernel('a100')
    vfs = _gpu_vfs(k, A100_PF)
    held = k.mdev(A100_HELD).parent
    _check_gpu_invariants(k, A100_PF)
    # A100-20C: two per GPU, one exists: every free VF offers one more,
    # and nothing else
    for vf in vfs:
        want = 0 if vf == held else 1
        assert _avail(k, vf) == {t.id: (want if t.id == 'nvidia-472'
                                        else 0)
                                 for t in k.device(vf).mdev_types}
    u = new_uuid()
    k.create_mdev(vfs[5], 'nvidia-472', u)
    _check_gpu_invariants(k, A100_PF)
    assert all(n == 0 for vf in vfs for n in _avail(k, vf).values())
    for vf in vfs:
        if vf not in (held, vfs[5]):
            assert errno_of(k.create_mdev, vf, 'nvidia-472',
                            new_uuid()) == errno.EINVAL
    # removing either one gives the slot back to every free VF
    k.remove_mdev(A100_HELD)
    _check_gpu_invariants(k, A100_PF)
    assert sum(_avail(k, vf)['nvidia-472'] for vf in vfs) == 15
    k.remove_mdev(u)
    _check_gpu_invariants(k, A100_PF)
    # an empty GPU offers every type on every VF (one vGPU per VF)
    assert all(_avail(k, vf) == {t.id: 1 for t in k.device(vf).mdev_types}
               for vf in vfs)
    k.create_mdev(vfs[0], 'nvidia-473', new_uuid())     # A100-40C: 1
    _check_gpu_invariants(k, A100_PF)
    assert all(n == 0 for vf in vfs for n in _avail(k, vf).values())


def test_a100_racing_creators_on_different_vfs_for_the_last_slot():
    for _ in range(20):
        k = kernel_mod.SimKernel('a100')
        vfs = [vf for vf in _gpu_vfs(k, A100_PF)
               if vf != k.mdev(A100_HELD).parent]
        go = threading.Barrier(len(vfs))
        winners, losers = [], []

        def creator(vf):
            u = new_uuid()
            go.wait()
            try:
                k.create_mdev(vf, 'nvidia-472', u)
                winners.append(vf)
            except OSError as e:
                losers.append(e.errno)

        threads = [threading.Thread(target=creator, args=(vf,))
                   for vf in vfs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(winners) == 1
        assert losers == [errno.EINVAL] * (len(vfs) - 1)
        assert len(k.mdevs()) == 2          # max_instance of A100-20C
        _check_gpu_invariants(k, A100_PF)


def test_a100_random_creates_and_removes_keep_the_drivers_rules():
    import random
    rng = random.Random(4242)
    k = kernel_mod.SimKernel('a100')
    vfs = _gpu_vfs(k, A100_PF)
    types = [t.id for t in k.device(vfs[0]).mdev_types]
    made = 0
    for _ in range(400):
        if k.mdevs() and rng.random() < 0.35:
            k.remove_mdev(rng.choice(k.mdevs()).uuid)
        else:
            vf, type_id = rng.choice(vfs), rng.choice(types)
            expected = k.available_instances(vf, type_id)
            try:
                k.create_mdev(vf, type_id, new_uuid())
                made += 1
                assert expected == 1
            except OSError as e:
                assert (e.errno, expected) == (errno.EINVAL, 0)
        _check_gpu_invariants(k, A100_PF)
    assert made > 50


def test_l40s_vendor_interface_shares_the_gpu():
    k = kernel_mod.SimKernel('l40s')
    gpu = [vf for vf in k.vendor_vfs()
           if k.profile.device(vf).physfn == L40S_EMPTY]
    other = [vf for vf in k.vendor_vfs()
             if k.profile.device(vf).physfn == L40S_FULLISH]
    assert len(gpu) == len(other) == 32
    everything = [t.id for t in k.vf_creatable(gpu[0])]
    assert len(everything) == 23
    # L40S-24Q (1155): two per GPU; creatable shrinks to the 24 GB types,
    # then to nothing on every VF of that GPU
    assert k.set_vgpu_type(gpu[3], b'1155\n') == 'nvidia-1155'
    for vf in gpu:
        want = [] if vf == gpu[3] else ['nvidia-1155', 'nvidia-1165']
        assert [t.id for t in k.vf_creatable(vf)] == want
    assert errno_of(k.set_vgpu_type, gpu[4], b'1145') == errno.EINVAL
    assert k.set_vgpu_type(gpu[9], b'1165') == 'nvidia-1165'
    assert all(k.vf_creatable(vf) == () for vf in gpu)
    for vf in gpu:
        if k.vf_type(vf) is None:
            assert errno_of(k.set_vgpu_type, vf, b'1155') == errno.EINVAL
    # the other GPU is untouched: 1 GB types next to its two L40S-1B
    assert [t.id for t in k.vf_creatable(other[2])] == [
        'nvidia-1145', 'nvidia-1147', 'nvidia-1157']
    k.set_vgpu_type(gpu[3], b'0')
    assert [t.id for t in k.vf_creatable(gpu[0])] == [
        'nvidia-1155', 'nvidia-1165']
    k.set_vgpu_type(gpu[9], b'0')
    assert [t.id for t in k.vf_creatable(gpu[0])] == everything


def test_l40s_racing_writers_for_the_last_vgpu():
    k = kernel_mod.SimKernel('l40s')
    gpu = [vf for vf in k.vendor_vfs()
           if k.profile.device(vf).physfn == L40S_EMPTY]
    k.set_vgpu_type(gpu[0], b'1156')          # L40S-48Q: one fills it
    assert all(k.vf_creatable(vf) == () for vf in gpu)
    k.set_vgpu_type(gpu[0], b'0')
    k.set_vgpu_type(gpu[0], b'1155')          # one of two 24Q
    go = threading.Barrier(len(gpu) - 1)
    winners, losers = [], []

    def writer(vf):
        go.wait()
        try:
            k.set_vgpu_type(vf, b'1155')
            winners.append(vf)
        except OSError as e:
            losers.append(e.errno)

    threads = [threading.Thread(target=writer, args=(vf,))
               for vf in gpu[1:]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1 and losers == [errno.EINVAL] * 30
    assert sum(1 for vf in gpu if k.vf_type(vf)) == 2


# --- busy_remove as a profile setting ----------------------------------------

def _t4_with(**top):
    data = t4_data()
    data.update(top)
    return loading.profile_from_dict(data)


def test_busy_remove_defaults_to_block():
    assert simulator.load_profile('t4').busy_remove == 'block'
    assert kernel_mod.SimKernel('t4').busy_remove == kernel_mod.BUSY_BLOCK


@pytest.mark.parametrize('bad', ['sometimes', 'EBUSY', '', None, 1, ['block']])
def test_busy_remove_profile_value_is_validated(bad):
    with pytest.raises(simulator.profile.exception.SimulatorError) as e:
        _t4_with(busy_remove=bad)
    assert "busy_remove %r is not one of 'block', 'ebusy'" % (bad,) in \
        str(e.value)


def test_busy_remove_ebusy_from_the_profile():
    k = kernel_mod.SimKernel(_t4_with(busy_remove='ebusy'))
    assert k.busy_remove == kernel_mod.BUSY_EBUSY
    k.mark_busy(EXISTING)
    assert errno_of(k.remove_mdev, EXISTING) == errno.EBUSY
    assert k.mdev(EXISTING) is not None
    # the argument overrides the profile
    k = kernel_mod.SimKernel(_t4_with(busy_remove='ebusy'),
                             busy_remove='block')
    assert k.busy_remove == kernel_mod.BUSY_BLOCK


def test_busy_remove_block_from_the_profile():
    k = kernel_mod.SimKernel(_t4_with(busy_remove='block'))
    k.mark_busy(EXISTING)
    done = []
    t = threading.Thread(target=lambda: done.append(
        k.remove_mdev(EXISTING)))
    t.start()
    time.sleep(0.2)
    assert done == [] and k.mdev(EXISTING) is not None
    k.mark_idle(EXISTING)
    t.join(5)
    assert done == [True] and k.mdev(EXISTING) is None
    k = kernel_mod.SimKernel(_t4_with(busy_remove='block'),
                             busy_remove='ebusy')
    assert k.busy_remove == kernel_mod.BUSY_EBUSY


def test_busy_remove_applies_to_vendor_vgpus_too():
    with open(loading.profile_dir() + '/l40s.json') as f:
        data = json.load(f)
    data['busy_remove'] = 'ebusy'
    k = kernel_mod.SimKernel(loading.profile_from_dict(data))
    vf = '0000:3d:00.4'
    k.mark_busy(vf)
    assert errno_of(k.set_vgpu_type, vf, b'0') == errno.EBUSY
    assert k.vf_type(vf) == 'nvidia-1145'
    k.mark_idle(vf)
    assert k.set_vgpu_type(vf, b'0') is None


# --- SR-IOV: sriov_numvfs --------------------------------------------------

def test_enabling_vfs_makes_them_parents_and_disabling_takes_them_away():
    k = kernel_mod.SimKernel('a100')
    seen = []
    k.subscribe(seen.append)
    assert k.numvfs(A100_OFF) == 0
    assert k.set_numvfs(A100_OFF, b'2\n') == \
        k.profile.device(A100_OFF).virtfns[:2]
    vf = k.profile.device(A100_OFF).virtfns[0]
    assert k.set_numvfs(A100_OFF, '2') == ()     # the same count: no-op
    assert seen == [kernel_mod.VfsEnabled(
        A100_OFF, k.profile.device(A100_OFF).virtfns[:2])]
    assert vf in k.parents() and k.parent_state(vf) == kernel_mod.BOUND
    assert k.available_instances(vf, 'nvidia-472') == 1
    uuid = new_uuid()
    k.create_mdev(vf, 'nvidia-472', uuid)
    assert errno_of(k.set_numvfs, A100_OFF, '0') == errno.EBUSY
    assert errno_of(k.set_numvfs, A100_OFF, '4') == errno.EBUSY
    k.remove_mdev(uuid)
    assert k.set_numvfs(A100_OFF, '0') == (vf, k.profile.device(
        A100_OFF).virtfns[1])
    assert isinstance(seen[-1], kernel_mod.VfsDisabled)
    assert vf not in k.parents()
    assert k.parent_state(vf) == kernel_mod.ABSENT
    assert errno_of(k.create_mdev, vf, 'nvidia-472',
                    new_uuid()) == errno.ENOENT


@pytest.mark.parametrize('data, code', [
    ('17', errno.ERANGE),            # above sriov_totalvfs (16)
    ('65536', errno.ERANGE),         # kstrtou16
    ('-1', errno.EINVAL), ('2 VFs', errno.EINVAL), ('', errno.EINVAL)])
def test_sriov_numvfs_refusals(data, code):
    k = kernel_mod.SimKernel('a100')
    assert errno_of(k.set_numvfs, A100_OFF, data) == code
    assert k.numvfs(A100_OFF) == 0


def test_sriov_numvfs_of_a_device_without_sr_iov_is_enoent():
    k = kernel_mod.SimKernel('t4')
    assert errno_of(k.set_numvfs, '0000:af:00.0', '1') == errno.ENOENT


def test_vendor_vfs_come_and_go_with_sriov_numvfs():
    k = kernel_mod.SimKernel('l40s')
    pf = k.profile.physical(k.profile.device(k.vendor_vfs()[0])).address
    free = [vf for vf in k.vendor_vfs() if vf in k.profile.device(pf).virtfns
            and k.vf_type(vf) is None]
    held = [vf for vf in k.vendor_vfs() if vf in k.profile.device(pf).virtfns
            and k.vf_type(vf)]
    if held:
        assert errno_of(k.set_numvfs, pf, '0') == errno.EBUSY
        for vf in held:
            k.set_vgpu_type(vf, '0')
    k.set_numvfs(pf, '0')
    assert not set(free) & set(k.vendor_vfs())
    assert errno_of(k.set_vgpu_type, free[0], '0') == errno.ENOENT


# --- restore: the state a tree shows ---------------------------------------

def test_restore_replaces_what_the_kernel_holds():
    k = kernel_mod.SimKernel('t4')
    mine = kernel_mod.KMdev(new_uuid(), A, 'nvidia-222', 300)
    k.restore(kernel_mod.KernelState(mdevs=(mine,), going=(B,)))
    assert k.mdevs() == [mine]
    assert k.available_instances(A, 'nvidia-222') == 15
    assert k.parent_state(B) == kernel_mod.GOING
    assert errno_of(k.create_mdev, B, 'nvidia-223',
                    new_uuid()) == errno.ENODEV
    k.restore(kernel_mod.KernelState())
    assert k.mdevs() == [] and k.parent_state(B) == kernel_mod.BOUND
