"""Carving VFs for Nova (``[nova]/carved``, ``devices.carving``) on the
simulated L40S host, whose writes act like the driver
(``kernel_sysfs.KernelSysfs``): the configuration's rules, and
``restore`` writing the type to the same VFs after every (simulated)
reboot."""

import os
import shutil
import tempfile

import pytest

from libvirt_gpu import environment
from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu import simulator
from libvirt_gpu.devices import carving
from libvirt_gpu.store import carved as carve_record
from libvirt_gpu.host import restore
from tests.doubles.carved_host import (
    CARVING, L1, L2, T_12Q, Host, plant, vfs)
from libvirt_gpu.devices.backends.nvidia_vgpu.files import (
    VendorFiles as vendor)


def carved_actions(report):
    return sorted((a.action, a.target) for a in report.actions
                  if a.what == 'carved-vf')


# --- restore writes the type, always to the same VFs ------------------------

def test_restore_carves_the_lowest_vfs_and_a_reboot_gives_them_back(
        fast_tmp):
    host = Host(fast_tmp, CARVING % ('10de:26b9', 4), rebooted=True)
    first = host.restore()
    assert first.failed == ()
    wanted = vfs(L1, 4, 5, 6, 7) + vfs(L2, 4, 5, 6, 7)
    assert carved_actions(first) == sorted(
        ('carved', str(vf)) for vf in wanted)
    assert [host.held(vf) for vf in wanted] == [1153] * 8
    # the next VF of each GPU holds nothing: the GPU is full of 12Q
    assert host.held(vfs(L2, 8)[0]) == 0
    assert sorted(host.record()) == sorted(wanted)
    assert {e.type_id for e in host.record().values()} == {T_12Q}
    # a second run changes nothing and writes nothing
    writes = len(host.sysfs.writes)
    second = host.restore()
    assert second.failed == ()
    assert second.changed == () and len(host.sysfs.writes) == writes
    # a reboot: VFs off, types gone; restore gives the same addresses the
    # same types
    host.boot()
    assert not host.sysfs.virtfns(L1) and not host.sysfs.virtfns(L2)
    third = host.restore()
    assert third.failed == ()
    assert carved_actions(third) == carved_actions(first)
    assert [host.held(vf) for vf in wanted] == [1153] * 8
    assert sorted(host.record()) == sorted(wanted)


def test_vfs_carved_by_hand_are_adopted_without_a_write(fast_tmp):
    host = Host(fast_tmp, CARVING % (L2, 2))
    vendor(host.sysfs).set_current_type(str(vfs(L2, 4)[0]), 1153)
    report = host.restore()
    assert carved_actions(report) == [('carved', '0000:bd:00.5'),
                                      ('ok', '0000:bd:00.4')]
    assert sorted(host.record()) == vfs(L2, 4, 5)


def test_a_low_vf_holding_another_type_is_left_alone_not_replaced(fast_tmp):
    # 0000:3d:00.4 and .5 hold L40S-1B vGPUs someone made; L40S-1Q has the
    # same framebuffer, so the GPU offers it, but the VFs are taken
    host = Host(fast_tmp, CARVING.replace('nvidia-1153', 'nvidia-1147')
                % (L1, 2))
    report = host.restore()
    assert carved_actions(report) == [('failed', '0000:3d:00.4'),
                                      ('failed', '0000:3d:00.5')]
    assert 'holds nvidia-1145' in report.failed[0].detail
    assert host.held(vfs(L1, 4)[0]) == 1145            # untouched
    assert host.held(vfs(L1, 6)[0]) == 0               # no other VF taken
    assert host.record() == {}


def test_a_carving_the_host_cannot_satisfy_is_reported_and_writes_nothing(
        fast_tmp):
    host = Host(fast_tmp, CARVING % (L1, 4))    # 1B held: no 12Q offered
    writes = len(host.sysfs.writes)
    report = host.restore()
    (failed,) = report.failed
    assert failed.what == 'carving'
    assert 'the GPU 0000:3d:00.0 does not offer it' in failed.detail
    assert 'hold nvidia-1145 now' in failed.detail
    assert len(host.sysfs.writes) == writes


def test_dry_run_writes_nothing(fast_tmp):
    host = Host(fast_tmp, CARVING % (L2, 4))
    writes = len(host.sysfs.writes)
    report = host.restore(dry_run=True)
    assert carved_actions(report) == [('would', str(vf))
                                      for vf in vfs(L2, 4, 5, 6, 7)]
    assert len(host.sysfs.writes) == writes and host.record() == {}


def test_a_vf_no_longer_carved_is_reset_once_no_guest_uses_it(fast_tmp):
    host = Host(fast_tmp, CARVING % (L2, 2))
    host.restore()
    host.write_config('')                       # the carving is gone
    used = {vfs(L2, 4)[0]: True}                # a guest uses bd:00.4
    # libvirt cannot be asked: both stay Nova's
    report = host.restore()
    assert carved_actions(report) == [('skipped', '0000:bd:00.4'),
                                      ('skipped', '0000:bd:00.5')]
    assert sorted(host.record()) == vfs(L2, 4, 5)
    assert host.env().carved.gpus == {L2}
    report = host.restore(vf_in_use=lambda vf: used.get(vf, False))
    assert carved_actions(report) == [('reset', '0000:bd:00.5'),
                                      ('skipped', '0000:bd:00.4')]
    (kept,) = [a for a in report.actions if a.action == 'skipped'
               and a.what == 'carved-vf']
    assert 'a running guest uses it' in kept.detail
    assert [host.held(vf) for vf in vfs(L2, 4, 5)] == [1153, 0]
    assert sorted(host.record()) == vfs(L2, 4)
    # the guest let go
    report = host.restore(vf_in_use=lambda vf: False)
    assert ('reset', '0000:bd:00.4') in carved_actions(report)
    assert host.record() == {} and host.held(vfs(L2, 4)[0]) == 0


def test_restore_enables_the_vfs_of_a_carved_gpu(fast_tmp):
    host = Host(fast_tmp, CARVING % (L2, 4), rebooted=True)
    assert restore.vf_targets(host.env()) == [L2]


# --- the configuration's rules ----------------------------------------------

@pytest.fixture(scope='module')
def shared_root():
    """One L40S tree for the tests that only read it."""
    path = tempfile.mkdtemp(prefix='lgpu-nova-tree-')
    root = os.path.join(path, 'sys')
    simulator.write_sysfs(simulator.load_profile('l40s'), root)
    yield root
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def resolve(fast_tmp, shared_root):
    """The planned carvings of a configuration on the shared tree."""
    def resolve(text):
        host = Host(fast_tmp, text, root=shared_root)
        return host.env().carved.planned
    return resolve


def test_resolved_carving_names_vfs_ids_resource_class_and_alias(resolve):
    (carved,) = resolve(CARVING % (L2, 4))
    assert carved.gpu == L2 and carved.vfs == tuple(vfs(L2, 4, 5, 6, 7))
    assert (carved.vendor_id, carved.product_id) == ('10de', '26b9')
    assert carved.type_name == 'NVIDIA L40S-12Q'
    assert carved.resource_class == 'CUSTOM_NVIDIA_L40S_12Q'
    assert carved.alias == 'l40s-12q'


def test_the_ids_nova_matches_are_the_vfs_not_the_pfs(fast_tmp):
    # Nova's device_spec matches the VFs it is handed: their own ids
    host = Host(fast_tmp, CARVING % (L2, 2))
    (first,) = vfs(L2, 4)
    with open(os.path.join(host.root, 'bus', 'pci', 'devices', str(first),
                           'device'), 'w') as f:
        f.write('0x26ba\n')
    (carved,) = host.env().carved.planned
    assert carved.vfs[0] == first
    assert (carved.vendor_id, carved.product_id) == ('10de', '26ba')


def test_resource_class_and_alias_may_be_named(resolve):
    (carved,) = resolve(CARVING % (L2, 1) + 'resource_class = '
                        'CUSTOM_VDI\nalias = vdi.large\n')
    assert (carved.resource_class, carved.alias) == ('CUSTOM_VDI',
                                                     'vdi.large')


@pytest.mark.parametrize('name, rc, alias', [
    ('NVIDIA L40S-12Q', 'CUSTOM_NVIDIA_L40S_12Q', 'l40s-12q'),
    ('GRID T4-2B', 'CUSTOM_GRID_T4_2B', 't4-2b'),
    ('NVIDIA RTX Pro 6000 Blackwell DC-48C',
     'CUSTOM_NVIDIA_RTX_PRO_6000_BLACKWELL_DC_48C',
     'rtx-pro-6000-blackwell-dc-48c'),
])
def test_default_names_from_the_type_name(name, rc, alias):
    import os_resource_classes
    assert carving.default_resource_class(name) == rc
    # Nova's own normalization of a resource_class tag agrees
    assert os_resource_classes.normalize_name(name) == rc
    assert carving.default_alias(name) == alias


# (the text goes on the [gpu] section the Host writes)
ROUTE = ('enabled_vgpu_types = nvidia-1145\n[vgpu_nvidia-1145]\n'
         'device_addresses = %s\n' % L2)


@pytest.mark.parametrize('text, expected', [
    (CARVING % (L2, 5),
     '[nova_l40s_12q]/count = 5: the GPU 0000:bd:00.0 holds at most 4 '
     'vGPUs of nvidia-1153 (NVIDIA L40S-12Q); lower the count'),
    (CARVING.replace('nvidia-1153', 'nvidia-9999') % (L2, 1),
     '[nova_l40s_12q]/vgpu_type = nvidia-9999: the GPU 0000:bd:00.0 does '
     'not offer it (it offers: nvidia-1145 (NVIDIA L40S-1B)'),
    (CARVING.replace('= l40s_12q', '= l40s_12q, again') % (L2, 1)
     + '[nova_again]\ngpus = 10de:26b9\nvgpu_type = nvidia-1153\n'
     'count = 1\n',
     'the GPU 0000:bd:00.0 is claimed by two carvings, [nova_l40s_12q] '
     'and [nova_again]'),
    (ROUTE + CARVING % (L2, 1),
     'a GPU can\'t be claimed by two routes: [nova_l40s_12q] carves '
     '0000:bd:00.0 for Nova and [gpu]/enabled_vgpu_types enables '
     'nvidia-1145 on it'),
    (CARVING % ('0000:5e:00.0', 1),
     '[nova_l40s_12q]/gpus names 0000:5e:00.0, but this host has no GPU '
     'there'),
    (CARVING % ('0000:bd:00.4', 1),
     '[nova_l40s_12q]/gpus names 0000:bd:00.4, a VF of the GPU '
     '0000:bd:00.0; name the physical GPU'),
    (CARVING % ('nvidia', 1), "[nova_l40s_12q]/gpus: 'nvidia' names no GPU"),
    (CARVING.replace('count = %d\n', '') % L2,
     '[nova_l40s_12q]/count is not set'),
    (CARVING.replace('vgpu_type = nvidia-1153\n', '') % (L2, 1),
     '[nova_l40s_12q]/vgpu_type is not set'),
    (CARVING % ('', 1), '[nova_l40s_12q]/gpus is empty'),
    (CARVING % (L2, 1) + 'resource_class = VGPU\n',
     "[nova_l40s_12q]/resource_class 'VGPU' is not a CUSTOM_ resource "
     "class"),
    (CARVING % (L2, 1) + 'alias = a:b\n',
     "[nova_l40s_12q]/alias 'a:b' is not an alias name"),
    (CARVING.replace('l40s_12q\n[', 'l40s 12q\n[') % (L2, 1),
     "[nova]/carved: 'l40s 12q' is not a carving name"),
])
def test_configuration_errors_name_the_option_and_the_gpu(resolve, text,
                                                          expected):
    with pytest.raises(exception.ConfigError) as e:
        resolve(text)
    assert expected in str(e.value)


def test_two_carvings_may_not_share_a_resource_class_for_two_types(
        resolve):
    text = (CARVING % (L2, 1) + 'resource_class = CUSTOM_X\n').replace(
        'carved = l40s_12q', 'carved = l40s_12q, other') + (
        '[nova_other]\ngpus = %s\nvgpu_type = nvidia-1147\ncount = 1\n'
        'resource_class = CUSTOM_X\n' % L1)
    with pytest.raises(exception.ConfigError) as e:
        resolve(text)
    assert 'resource class CUSTOM_X names two types' in str(e.value)


def test_a_typo_in_a_carving_section_is_named(resolve):
    with pytest.raises(exception.ConfigError) as e:
        resolve(CARVING.replace('count', 'cuont') % (L2, 1))
    assert ('unknown option [nova_l40s_12q]/cuont; did you mean count?'
            in str(e.value))


def test_an_mdev_gpu_is_refused_for_carving(fast_tmp):
    with pytest.raises(exception.ConfigError) as e:
        Host(fast_tmp, CARVING % ('0000:41:00.0', 1),
             profile='a100').env().carved
    assert 'whose vGPUs are mdevs' in str(e.value)


def test_a_model_no_gpu_of_this_host_is_carves_nothing(resolve):
    assert resolve(CARVING % ('10de:2331', 1)) == ()


def test_without_configuration_only_the_record_counts(fast_tmp):
    host = Host(fast_tmp, CARVING % (L2, 2))
    host.restore()
    hook_env = environment.Environment(host.state_dir, sysfs=host.sysfs,
                                       enabled={})
    assert hook_env.carved.planned == ()
    assert hook_env.carved.vfs == frozenset(vfs(L2, 4, 5))
    assert hook_env.carved.gpus == {L2}


def test_a_record_that_is_not_ours_is_refused(fast_tmp):
    os.makedirs(os.path.join(fast_tmp, 'state'), mode=0o700)
    path = os.path.join(fast_tmp, 'state', carve_record.RECORD_NAME)
    with open(path, 'w') as f:
        f.write('{"version": 1, "vfs": {"0000:bd:00.4": {"gpu": "x"}}}')
    with pytest.raises(exception.StateError) as e:
        carve_record.CarveRecord(os.path.join(fast_tmp, 'state')).read()
    assert 'entry' in str(e.value) and carve_record.RECORD_NAME in str(e.value)


def test_a_record_nested_past_the_parsers_depth_is_one_line(fast_tmp):
    # json.loads raises RecursionError on it: the hook reads this record
    # on every guest start, so a StateError naming the file, no traceback
    os.makedirs(os.path.join(fast_tmp, 'state'), mode=0o700)
    path = os.path.join(fast_tmp, 'state', carve_record.RECORD_NAME)
    with open(path, 'w') as f:
        f.write('{"a": ' * 5000 + '1' + '}' * 5000)
    with pytest.raises(exception.StateError, match='nested too deeply'):
        carve_record.CarveRecord(os.path.join(fast_tmp, 'state')).read()


def test_a_carving_section_not_listed_is_named(resolve):
    # nothing would read it: a misspelt name in [nova]/carved, or a
    # section left behind
    with pytest.raises(exception.ConfigError) as e:
        resolve(CARVING % (L2, 1) + '[nova_l40s_12g]\ncount = 1\n')
    assert ('section [nova_l40s_12g] is a carving [nova]/carved (l40s_12q) '
            'does not list, so nothing would read it; did you mean '
            '[nova_l40s_12q]?') in str(e.value)
    # its options are checked first, as a carving's
    with pytest.raises(exception.ConfigError) as e:
        resolve('[nova_spare]\ncuont = 1\n')
    assert ('unknown option [nova_spare]/cuont; did you mean count?'
            in str(e.value))


def test_which_vfs_running_guests_use_is_asked_of_libvirt(fast_tmp):
    vf = vfs(L2, 4)[0]
    # libvirt's test host runs one guest, without hostdevs
    assert restore.vf_user_check('test:///default')(vf) is False
    # no libvirt: cannot tell
    socket = os.path.join(fast_tmp, 'none.sock')
    assert restore.vf_user_check(
        'qemu+unix:///system?socket=%s' % socket)(vf) is None


def test_a_gpu_in_a_layout_may_be_carved(resolve):
    # the layout sets the GPU's mode; the carving writes the type
    (carved,) = resolve('layouts = l40s\n[layout_l40s]\ngpus = %s\n'
                        'mode = time-sliced\nvgpu_types = nvidia-1153\n'
                        % L2 + CARVING % (L2, 4))
    assert carved.gpu == L2 and len(carved.vfs) == 4


# --- a record that cannot be read --------------------------------------------

DAMAGED = [
    b'{"version": 1, "vfs": {',                          # cut off
    b'\xef\xbb\xbf{"version": 1, "vfs": {}}',            # a BOM
    '{"version": 1, "vfs": {}}'.encode('utf-16'),        # UTF-16
]


@pytest.mark.parametrize('data', DAMAGED)
def test_a_damaged_record_leaves_guests_on_gpus_nothing_carves_alone(
        fast_tmp, data):
    from tests.doubles.vendor_world \
        import A, World
    from tests.doubles.vendor_world \
        import mdev_domain_xml
    # an A100's vGPUs are mdevs on its VFs: nothing carves them
    world = World('a100', fast_tmp, 'nvidia-472', str(A))
    path = plant(world.state_dir, data)
    uuid = objects.Uuid.new()
    rc, err = world.hook('prepare', mdev_domain_xml(uuid))
    assert rc == 0, err
    assert str(uuid) in {str(m.uuid) for ms in world.sysfs.mdevs_by_parent()
                         .values() for m in ms}
    # what to do is said
    assert ('State file %s: not JSON' % path) in err
    assert carve_record.REMEDY in err
    assert ('carved for Nova (none on this host) are held as Nova\'s'
            in err)
    assert world.hook('release', mdev_domain_xml(uuid))[0] == 0
    assert world.leases() == []


def test_a_damaged_record_holds_every_gpu_that_could_be_carved(fast_tmp):
    from tests.doubles.vendor_world \
        import vf_domain_xml
    from tests.doubles.carved_host import run_hook
    host = Host(fast_tmp, 'enabled_vgpu_types = nvidia-1145\n'
                '[vgpu_nvidia-1145]\ndevice_addresses = %s\n' % L2)
    plant(host.state_dir, b'\xef\xbb\xbf{}')
    rc, err, _ = run_hook(host, 'prepare', vf_domain_xml(
        objects.Uuid.new(), str(vfs(L2, 9)[0])))
    assert rc == 1
    assert ('%s; until then the GPUs whose VFs could be carved for Nova '
            '(%s, %s) are held as Nova\'s'
            % (carve_record.REMEDY, L1, L2)) in err
    assert 'carved for Nova' in err.splitlines()[-1]
    assert host.held(vfs(L2, 9)[0]) == 0


@pytest.mark.parametrize('data', DAMAGED)
def test_restore_moves_a_damaged_record_aside_and_rebuilds_it(fast_tmp,
                                                              data):
    host = Host(fast_tmp, CARVING % (L2, 2))
    assert host.restore().failed == ()
    path = plant(host.state_dir, data)
    # a dry run says what it would do and does nothing
    report = host.restore(dry_run=True)
    (would,) = [a for a in report.actions if a.what == 'carve-record']
    assert (would.action, would.target) == ('would', path)
    assert would.detail.startswith('would move it aside and rebuild it '
                                   'from the configuration (not JSON')
    with open(path, 'rb') as f:
        assert f.read() == data
    report = host.restore()
    assert report.failed == ()
    (moved,) = [a for a in report.actions if a.what == 'carve-record']
    assert (moved.action, moved.target) == ('forgot', path)
    (aside,) = [n for n in os.listdir(host.state_dir)
                if n.startswith(carve_record.RECORD_NAME + '.damaged-')]
    import re
    assert re.fullmatch(r'nova-carved\.json\.damaged-\d{8}T\d{6}Z', aside)
    assert moved.detail.startswith('cannot be read (not JSON')
    assert ('moved aside to %s; rebuilt from the configuration'
            % os.path.join(host.state_dir, aside)) in moved.detail
    with open(os.path.join(host.state_dir, aside), 'rb') as f:
        assert f.read() == data
    # the VFs that hold the type are Nova's again, nothing written
    assert sorted(host.record()) == vfs(L2, 4, 5)
    assert ('ok', '0000:bd:00.4') in carved_actions(report)


def test_a_record_that_cannot_be_moved_aside_says_what_to_do(fast_tmp,
                                                             monkeypatch):
    host = Host(fast_tmp, CARVING % (L2, 2))
    path = plant(host.state_dir, b'[')

    def refuse(self, now=None):
        raise PermissionError(13, 'Permission denied')
    monkeypatch.setattr(carve_record.CarveRecord, 'set_aside', refuse)
    report = host.restore()
    (failed,) = report.failed
    assert (failed.what, failed.target) == ('carve-record', path)
    assert failed.detail.endswith('nor moved aside ([Errno 13] Permission '
                                  'denied): move it away by hand and run '
                                  '`libvirt-gpu restore` again')
    assert host.held(vfs(L2, 4)[0]) == 0       # nothing carved meanwhile


def test_nova_config_on_a_damaged_record_gives_nova_nothing(fast_tmp,
                                                            capsys):
    from libvirt_gpu.cmd import main as cli
    host = Host(fast_tmp, '[libvirt]\nconnection_uri = test:///default\n'
                + CARVING % (L2, 1))
    assert host.restore().failed == ()
    path = plant(host.state_dir, b'not json')
    rc = cli.main(['--config-file', host.config, '--sysfs-root', host.root,
                   'nova-config'])
    out, err = capsys.readouterr()
    assert rc == 0
    assert 'device_spec' not in out
    assert err.startswith('libvirt-gpu: warning: VF 0000:bd:00.4 '
                          '([nova_l40s_12q]) is not given to Nova: the '
                          'carve record cannot be read (State file %s: not '
                          'JSON' % path)
    assert err.rstrip().endswith(carve_record.REMEDY + ')')


# --- what restore's carving must keep doing ---------------------------------

def test_each_vf_is_recorded_as_nova_s_before_its_type_is_written(
        fast_tmp, monkeypatch):
    from libvirt_gpu.devices.backends.nvidia_vgpu import kind as kind_mod
    host = Host(fast_tmp, CARVING % (L2, 3))
    real = kind_mod.NvidiaVgpuBackend.write_type
    seen = []

    def write_type(self, parent, type_id):
        seen.append((parent, parent in host.record()))
        if parent == vfs(L2, 6)[0]:
            raise exception.MdevCreateFailed(uuid=parent, type_id=type_id,
                                             parent=parent, reason='EBUSY')
        return real(self, parent, type_id)
    monkeypatch.setattr(kind_mod.NvidiaVgpuBackend, 'write_type', write_type)
    report = host.restore()
    assert seen == [(vf, True) for vf in vfs(L2, 4, 5, 6)]
    assert carved_actions(report) == [('carved', '0000:bd:00.4'),
                                      ('carved', '0000:bd:00.5'),
                                      ('failed', '0000:bd:00.6')]
    assert report.failed[0].detail.endswith('EBUSY')
    # a VF whose write failed stays Nova's: nothing of ours goes there
    assert sorted(host.record()) == vfs(L2, 4, 5, 6)


def test_a_type_reset_that_fails_keeps_the_vf_nova_s(fast_tmp, monkeypatch):
    from libvirt_gpu.devices.backends.nvidia_vgpu import kind as kind_mod
    host = Host(fast_tmp, CARVING % (L2, 2))
    assert host.restore().failed == ()
    host.write_config('')

    def clear_type(self, parent):
        raise exception.MdevRemoveFailed(uuid=parent, reason='EBUSY')
    monkeypatch.setattr(kind_mod.NvidiaVgpuBackend, 'clear_type', clear_type)
    report = host.restore(vf_in_use=lambda vf: False)
    assert carved_actions(report) == [('failed', '0000:bd:00.4'),
                                      ('failed', '0000:bd:00.5')]
    assert report.failed[0].detail == (
        '[nova_l40s_12q] no longer carves it: Cannot remove vGPU '
        '0000:bd:00.4: EBUSY')
    assert sorted(host.record()) == vfs(L2, 4, 5)
    assert [host.held(vf) for vf in vfs(L2, 4, 5)] == [1153, 1153]


def test_the_lowest_vfs_are_carved_whatever_order_they_list_in(fast_tmp):
    host = Host(fast_tmp, CARVING % (L2, 2))
    # virtfn0 and virtfn1 name 0000:bd:00.7 and .6, virtfn2 and 3 .5 and
    # .4: the PF lists its VFs in another order than their addresses
    pf_dir = os.path.join(host.root, 'bus', 'pci', 'devices', str(L2))
    links = {n: os.readlink(os.path.join(pf_dir, 'virtfn%d' % n))
             for n in range(4)}
    for n in range(4):
        os.unlink(os.path.join(pf_dir, 'virtfn%d' % n))
        os.symlink(links[3 - n], os.path.join(pf_dir, 'virtfn%d' % n))
    assert host.sysfs.virtfns(L2)[:4] == tuple(vfs(L2, 7, 6, 5, 4))
    (carved,) = host.env().carved.planned
    assert carved.vfs == tuple(vfs(L2, 4, 5))
    report = host.restore()
    assert carved_actions(report) == [('carved', '0000:bd:00.4'),
                                      ('carved', '0000:bd:00.5')]


def test_two_records_set_aside_in_one_second_keep_both(fast_tmp):
    state_dir = os.path.join(fast_tmp, 'state')
    record = carve_record.CarveRecord(state_dir)
    names = []
    for data in (b'first', b'second'):
        plant(state_dir, data)
        names.append(record.set_aside(now=86400 * 365))
    assert names == [record.path + '.damaged-19710101T000000Z',
                     record.path + '.damaged-19710101T000000Z.2']
    for name, data in zip(names, (b'first', b'second')):
        with open(name, 'rb') as f:
            assert f.read() == data
    # a record that reads again (another run rebuilt it) is left as it is
    plant(state_dir, b'{"version": 1, "vfs": {}}')
    assert record.set_aside() is None and record.read() == {}


def test_the_gpus_that_could_be_carved_are_those_of_a_carving_kind(
        fast_tmp):
    from libvirt_gpu.devices import capabilities
    from libvirt_gpu.devices.backends import registry
    host = Host(fast_tmp, '')
    kinds = registry.kind_classes()
    carving_kinds = registry.having(kinds, capabilities.Carvable)
    assert carving_kinds and len(carving_kinds) < len(kinds)
    # whatever order the kinds come in
    for order in (kinds, tuple(reversed(kinds))):
        assert carving.carvable_gpus(host.sysfs, order) == {L1, L2}

    class Odd(carving_kinds[0]):
        @classmethod
        def parents_now(cls, sysfs):
            # a name that is no address, then the real VFs
            return ['not-a-vf'] + list(super().parents_now(sysfs))
    assert carving.carvable_gpus(host.sysfs, (Odd,)) == {L1, L2}
