"""``libvirt-gpu restore`` on simulated hosts after a reboot (VFs off, no
vGPU): VFs enabled, persistent vGPUs re-created (mdevctl definitions,
vendor-interface state), stale ones reset; a second run changes nothing."""

import json
import os
import stat


from libvirt_gpu.devices.backends import base
from libvirt_gpu.devices.backends import nvidia_vgpu
from libvirt_gpu import environment
from libvirt_gpu import objects
from libvirt_gpu.host import restore
from libvirt_gpu import simulator
from libvirt_gpu.cmd import main as cli
from libvirt_gpu.simulator import loading
from tests.doubles.rebooted_host import conf
from tests.doubles.rebooted_host import define
from tests.doubles.rebooted_host import host
from tests.doubles.rebooted_host import rebooted
from libvirt_gpu.devices.backends.nvidia_vgpu.files import (
    VendorFiles as vendor)
from libvirt_gpu.devices.backends.nvidia_vgpu import names as vendor_names
import shutil
import tempfile
import pytest
from libvirt_gpu import exception
from libvirt_gpu.store import figures

T_NVIDIA_1145 = objects.TypeId.parse('nvidia-1145')

U1 = objects.Uuid.parse('aa618089-8b16-4d01-a136-25a0f3c73123')
U2 = objects.Uuid.parse('c73f1fa6-489e-4834-9476-d70dabd98c40')
U3 = objects.Uuid.parse('3b356d38-854e-48be-b376-00c72c7d119c')
U4 = objects.Uuid.parse('676428a0-2445-499f-9bfd-65cd4a9bd18f')
U5 = objects.Uuid.parse('6c5954b8-5bc1-4769-b820-8099fe50aaba')


def summary(report):
    return sorted((a.action, a.what, a.target) for a in report.actions)


def test_a100_after_reboot_and_idempotence(fast_tmp):
    sysfs = host(rebooted('a100'), fast_tmp)
    _, cfg = conf(fast_tmp, '[gpu]\nenabled_vgpu_types = nvidia-472\n')
    mdevctl = os.path.join(fast_tmp, 'mdevctl.d')
    define(mdevctl, '0000:41:00.4', U1, 'nvidia-472', 'auto')
    define(mdevctl, '0000:41:00.5', U2, 'nvidia-472', 'manual')
    define(mdevctl, '0000:c1:00.4', U3, 'nvidia-473', 'auto')
    define(mdevctl, '0000:41:00.6', U4, 'nvidia-468', 'auto')   # won't fit
    os.makedirs(os.path.join(mdevctl, '0.0.0123'))            # a ccw parent
    state_dir = cfg.state_dir
    targets = restore.vf_targets(
        environment.Environment(state_dir, sysfs=sysfs, conf=cfg))
    assert [str(t) for t in targets] == ['0000:41:00.0', '0000:c1:00.0']

    def run():
        return restore.restore(
            environment.Environment(state_dir, sysfs=sysfs,
                                    mdevctl_dir=mdevctl),
            vf_pfs=targets, settle_timeout=0)
    first = run()
    assert summary(first) == [
        ('created', 'mdev', U3), ('created', 'mdev', U1),
        ('enabled-vfs', 'vfs', '0000:41:00.0'),
        ('enabled-vfs', 'vfs', '0000:c1:00.0'),
        ('failed', 'mdev', U4), ('skipped', 'mdev', U2)]
    assert 'No capacity' in [a for a in first.failed][0].detail
    assert len(sysfs.virtfns('0000:41:00.0')) == 16
    parents = sysfs.mdevs_by_parent()
    assert [m.uuid for m in parents[objects.PciAddress.parse(
        '0000:41:00.4')]] == [U1]
    writes = len(sysfs.writes)
    second = run()
    assert second.changed == ()                   # nothing to do twice
    assert len(sysfs.writes) == writes            # not one sysfs write
    assert summary(second) == [
        ('failed', 'mdev', U4), ('ok', 'mdev', U3), ('ok', 'mdev', U1),
        ('ok', 'vfs', '0000:41:00.0'), ('ok', 'vfs', '0000:c1:00.0'),
        ('skipped', 'mdev', U2)]


def test_l40s_after_reboot_from_our_state(fast_tmp):
    sysfs = host(rebooted('l40s'), fast_tmp)
    _, cfg = conf(fast_tmp, '[gpu]\nenabled_vgpu_types = nvidia-1145\n'
                  '[vgpu_nvidia-1145]\ndevice_addresses = 0000:3d:00.0\n')
    state = nvidia_vgpu.VendorState(cfg.state_dir)
    with state.locked() as entries:
        for uuid, vf, gpu, type_id, start, params in (
                (U1, '0000:3d:00.4', '0000:3d:00.0', 'nvidia-1145', 'auto',
                 'frame_rate_limiter=0'),
                (U2, '0000:3d:00.5', '0000:3d:00.0', 'nvidia-1145', None,
                 None),                     # transient: gone with the boot
                (U3, '0000:bd:00.4', '0000:bd:00.0', 'nvidia-1156', 'auto',
                 None)):
            entries[uuid] = nvidia_vgpu.VendorVgpu(
                uuid=uuid, vf=objects.PciAddress.parse(vf),
                gpu=objects.PciAddress.parse(gpu),
                type_id=type_id, start=start, params=params)
    # the GPU of U3 is not configured but our state names it
    targets = restore.vf_targets(
        environment.Environment(cfg.state_dir, sysfs=sysfs, conf=cfg))
    env = environment.Environment(
        cfg.state_dir, sysfs=sysfs,
        mdevctl_dir=os.path.join(fast_tmp, 'none'))
    assert [str(t) for t in targets] == ['0000:3d:00.0', '0000:bd:00.0']
    first = restore.restore(env, vf_pfs=targets, settle_timeout=0)
    assert summary(first) == [
        ('created', 'vgpu', U3), ('created', 'vgpu', U1),
        ('enabled-vfs', 'vfs', '0000:3d:00.0'),
        ('enabled-vfs', 'vfs', '0000:bd:00.0'), ('forgot', 'vgpu', U2)]
    assert first.failed == ()
    assert vendor(sysfs).current_type('0000:3d:00.4') == 1145
    assert vendor(sysfs).current_type('0000:bd:00.4') == 1156
    with open(os.path.join(vendor(sysfs).vendor_dir('0000:3d:00.4'),
                           vendor_names.VGPU_PARAMS)) as f:
        assert f.read() == 'frame_rate_limiter=0'
    assert sorted(state.read()) == sorted([U1, U3])
    writes = len(sysfs.writes)
    second = restore.restore(env.replace(), vf_pfs=targets,
                             settle_timeout=0)
    assert second.changed == () and len(sysfs.writes) == writes
    assert summary(second) == [
        ('ok', 'vfs', '0000:3d:00.0'), ('ok', 'vfs', '0000:bd:00.0'),
        ('ok', 'vgpu', U3), ('ok', 'vgpu', U1)]


def test_stale_vendor_vgpus_reset_only_when_their_guest_is_gone(fast_tmp):
    sysfs = host(simulator.load_profile('l40s'), fast_tmp)
    state_dir = os.path.join(fast_tmp, 'state')
    backend = nvidia_vgpu.NvidiaVgpuBackend(sysfs, state_dir)
    for uuid, vf in ((U1, '0000:3d:00.6'), (U2, '0000:3d:00.7'),
                     (U3, '0000:3d:01.0')):
        backend.prepare(base.VgpuDevice(
            uuid=uuid, parent=objects.PciAddress.parse(vf),
            type_id=objects.TypeId.parse('nvidia-1145')))
    vf = objects.PciAddress.parse('0000:3d:01.1')
    backend.define(base.VgpuDevice(uuid=U4, parent=vf,
                                   type_id=T_NVIDIA_1145), start='manual')
    backend.prepare(base.VgpuDevice(uuid=U4, parent=vf,
                                    type_id=T_NVIDIA_1145))
    running = {U1: False, U2: True, U3: None}

    def run():
        return restore.restore(
            environment.Environment(
                state_dir, sysfs=sysfs,
                mdevctl_dir=os.path.join(fast_tmp, 'none')),
            vf_pfs=(), owner_running=running.get, settle_timeout=0)
    first = run()
    assert summary(first) == [
        ('ok', 'vgpu', U2),                        # its guest runs
        ('reset', 'vgpu', U1),                     # its guest is gone
        ('skipped', 'vgpu', '0000:3d:00.4'),       # not ours: never touched
        ('skipped', 'vgpu', '0000:3d:00.5'),
        ('skipped', 'vgpu', U3)]                   # cannot tell: kept
    assert vendor(sysfs).current_type('0000:3d:00.6') == 0
    assert vendor(sysfs).current_type('0000:3d:00.7') == 1145
    assert vendor(sysfs).current_type('0000:3d:00.4') == 1145
    assert vendor(sysfs).current_type('0000:3d:01.1') == 1145  # persistent
    assert U1 not in backend.vgpus()
    writes = len(sysfs.writes)
    assert run().changed == () and len(sysfs.writes) == writes


def test_sriov_manage_is_run_and_its_failure_reported(fast_tmp):
    sysfs = host(rebooted('a100'), fast_tmp)
    log = os.path.join(fast_tmp, 'calls')
    script = os.path.join(fast_tmp, 'sriov-manage')
    with open(script, 'w') as f:
        f.write('#!/bin/sh\necho "$@" >> %s\n'
                '[ "$2" = 0000:c1:00.0 ] && { echo no GPU >&2; exit 3; }\n'
                'exit 0\n' % log)
    os.chmod(script, stat.S_IRWXU)
    report = restore.restore(
        environment.Environment(os.path.join(fast_tmp, 'state'),
                                sysfs=sysfs,
                                mdevctl_dir=os.path.join(fast_tmp, 'none')),
        vf_pfs=[objects.PciAddress.parse(a)
                for a in ('0000:41:00.0', '0000:c1:00.0')],
        sriov_manage=script,
        settle_timeout=0)
    with open(log) as f:
        calls = f.read().split('\n')[:2]
    assert calls == ['-e 0000:41:00.0', '-e 0000:c1:00.0']
    (failed,) = report.failed
    assert failed.target == '0000:c1:00.0' and 'exited 3' in failed.detail
    assert 'no GPU' in failed.detail
    assert restore.sriov_manage_for(fast_tmp, 'auto') is None   # not /sys
    assert restore.sriov_manage_for('/sys', 'none') is None
    assert restore.sriov_manage_for('/sys', script) == script


def test_cli_restore_json(fast_tmp, capsys):
    simulator.write_sysfs(simulator.load_profile('l40s'),
                          os.path.join(fast_tmp, 'sys'))
    path, _ = conf(fast_tmp, '[gpu]\nenabled_vgpu_types = nvidia-1145\n')
    argv = ['--config-file', path, '--sysfs-root',
            os.path.join(fast_tmp, 'sys'), 'restore', '--json',
            '--no-libvirt', '--mdevctl-dir', os.path.join(fast_tmp, 'none'),
            '--settle-timeout', '0']
    assert cli.main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc['changed'] == 0 and doc['failed'] == 0
    assert {(a['action'], a['target']) for a in doc['actions']} == {
        ('ok', '0000:3d:00.0'), ('ok', '0000:bd:00.0'),
        ('skipped', '0000:3d:00.4'), ('skipped', '0000:3d:00.5')}
    assert cli.main(argv[:-6] + ['--no-libvirt', '--settle-timeout', '0',
                                 '--mdevctl-dir',
                                 os.path.join(fast_tmp, 'none')]) == 0
    assert '0 change(s), 0 failure(s)' in capsys.readouterr().out


# --- what make mutation found ----------------------------------------------
#
# What ``libvirt-gpu restore`` (host/restore.py) promises that
# test_restore, test_nova_carving and test_layouts_inject left open: each
# test here fails on a change ``make mutation`` made that the rest stayed
# green on (docs/dev/mutation.md) -- the report's shape and wording, each
# branch of enabling a PF's VFs (and its dry run), the wait for VFs to show
# their vGPU interface, the dry run of a persistent vGPU, the outcome left
# for the exporter, and how the way to enable VFs is chosen.

PF = objects.PciAddress.parse('0000:41:00.0')


def env_of(sysfs, fast_tmp, **kwargs):
    kwargs.setdefault('mdevctl_dir', os.path.join(fast_tmp, 'none'))
    return environment.Environment(os.path.join(fast_tmp, 'state'),
                                   sysfs=sysfs, **kwargs)


@pytest.fixture
def a100(fast_tmp):
    """An A100 after a reboot: 16 VFs possible on 0000:41:00.0, none
    enabled."""
    return host(rebooted('a100'), fast_tmp)


def actions(run):
    return [(a.action, a.what, a.target, a.detail) for a in run.actions]


# --- the report --------------------------------------------------------------

@pytest.mark.parametrize('action, changed', [
    (restore.ENABLED_VFS, True), (restore.CARVED, True),
    (restore.CREATED, True), (restore.RESET, True), (restore.FORGOT, True),
    (restore.APPLIED, True), (restore.OK, False), (restore.SKIPPED, False),
    (restore.FAILED, False), (restore.WOULD, False)])
def test_an_action_is_a_change_only_when_it_changed_the_host(action,
                                                             changed):
    one = restore.Action(action, 'vfs', '0000:41:00.0', 'why')
    assert one.changed is changed
    assert one.to_json() == {'action': action, 'what': 'vfs',
                             'target': '0000:41:00.0', 'detail': 'why',
                             'changed': changed}


def test_the_report_counts_changes_and_failures_and_keeps_the_order():
    acts = (restore.Action(restore.CREATED, 'mdev', 'u1', 'created x'),
            restore.Action(restore.FAILED, 'vfs', 'p1', 'cannot'),
            restore.Action(restore.OK, 'vfs', 'p2', 'all 4 VFs enabled'),
            restore.Action(restore.RESET, 'vgpu', 'u2', 'gone'),
            restore.Action(restore.FAILED, 'mdev', 'u3', 'full'))
    report = restore.RestoreReport(actions=acts)
    assert report.changed == (acts[0], acts[3])
    assert report.failed == (acts[1], acts[4])
    assert report.summary() == '2 change(s), 2 failure(s)'
    assert report.COLUMNS == ('ACTION', 'WHAT', 'TARGET', 'DETAIL')
    assert report.rows() == [
        ('created', 'mdev', 'u1', 'created x'),
        ('failed', 'vfs', 'p1', 'cannot'),
        ('ok', 'vfs', 'p2', 'all 4 VFs enabled'),
        ('reset', 'vgpu', 'u2', 'gone'), ('failed', 'mdev', 'u3', 'full')]
    assert report.details() == ()
    assert report.to_json() == {
        'changed': 2, 'failed': 2,
        'actions': [a.to_json() for a in acts]}


def test_an_empty_report():
    report = restore.RestoreReport(actions=())
    assert report.summary() == '0 change(s), 0 failure(s)'
    assert report.to_json() == {'changed': 0, 'failed': 0, 'actions': []}


# --- 1. VFs ------------------------------------------------------------------

def test_a_pf_without_vfs_enabled_gets_all_of_them(a100, fast_tmp):
    run = restore.Restore(env_of(a100, fast_tmp), settle_timeout=0)
    run.enable_vfs(PF)
    assert actions(run) == [('enabled-vfs', 'vfs', '0000:41:00.0',
                             'enabled 16 VFs (sriov_numvfs)')]
    assert a100.sriov_numvfs(PF) == 16
    assert len(a100.virtfns(PF)) == 16


def test_a_pf_given_as_text_is_refused(a100, fast_tmp):
    run = restore.Restore(env_of(a100, fast_tmp), settle_timeout=0)
    with pytest.raises(TypeError) as e:
        run.enable_vfs('0000:41:00.0')
    assert str(e.value).startswith('pf must be an objects.PciAddress')
    assert a100.sriov_numvfs(PF) == 0


def test_a_pf_with_every_vf_enabled_is_left_as_it_is(fast_tmp):
    sysfs = host(simulator.load_profile('a100'), fast_tmp)
    writes = len(sysfs.writes)
    run = restore.Restore(env_of(sysfs, fast_tmp), settle_timeout=0)
    run.enable_vfs(PF)
    assert actions(run) == [('ok', 'vfs', '0000:41:00.0',
                             'all 16 VFs enabled')]
    assert len(sysfs.writes) == writes


def test_a_pf_with_some_vfs_enabled_is_left_and_reported(a100, fast_tmp):
    a100.set_sriov_numvfs(PF, 1)
    writes = len(a100.writes)
    run = restore.Restore(env_of(a100, fast_tmp), settle_timeout=0)
    run.enable_vfs(PF)
    assert actions(run) == [(
        'skipped', 'vfs', '0000:41:00.0',
        '1 of 16 VFs enabled by someone else: left as they are')]
    assert len(a100.writes) == writes and a100.sriov_numvfs(PF) == 1


def test_a_gpu_without_sr_iov_is_said_to_be_none(fast_tmp):
    sysfs = host(simulator.load_profile('t4'), fast_tmp)
    gpu = objects.PciAddress.parse('0000:3b:00.0')
    run = restore.Restore(env_of(sysfs, fast_tmp), settle_timeout=0)
    run.enable_vfs(gpu)
    assert actions(run) == [('skipped', 'vfs', '0000:3b:00.0',
                             'not an SR-IOV PF')]


@pytest.mark.parametrize('script, how', [
    (None, 'write 16 to sriov_numvfs'),
    ('/opt/nvidia/sriov-manage', '/opt/nvidia/sriov-manage -e')])
def test_a_dry_run_says_how_it_would_enable_and_writes_nothing(
        a100, fast_tmp, script, how):
    writes = len(a100.writes)
    run = restore.Restore(env_of(a100, fast_tmp), settle_timeout=0,
                          sriov_manage=script, dry_run=True)
    run.enable_vfs(PF)
    assert actions(run) == [('would', 'vfs', '0000:41:00.0',
                             'would enable 16 VFs (%s)' % how)]
    assert len(a100.writes) == writes and a100.sriov_numvfs(PF) == 0


def _script(fast_tmp, body):
    path = os.path.join(fast_tmp, 'sriov-manage')
    with open(path, 'w') as f:
        f.write('#!/bin/sh\n' + body)
    os.chmod(path, stat.S_IRWXU)
    return path


def test_nvidia_s_script_enables_and_the_vfs_it_has_not_shown_are_counted(
        a100, fast_tmp):
    # the script "succeeds" but enables nothing: all 16 are missing
    script = _script(fast_tmp, 'exit 0\n')
    run = restore.Restore(env_of(a100, fast_tmp), settle_timeout=0,
                          sriov_manage=script)
    run.enable_vfs(PF)
    assert actions(run) == [(
        'enabled-vfs', 'vfs', '0000:41:00.0',
        'enabled 16 VFs (%s -e); 16 VF(s) show no vGPU interface yet'
        % script)]


def test_a_failing_script_is_named_with_its_status_and_last_words(
        a100, fast_tmp):
    script = _script(fast_tmp, 'echo first >&2\necho "%s" >&2\nexit 3\n'
                     % ('x' * 400))
    run = restore.Restore(env_of(a100, fast_tmp), settle_timeout=0,
                          sriov_manage=script)
    run.enable_vfs(PF)
    ((action, what, target, detail),) = actions(run)
    assert (action, what, target) == ('failed', 'vfs', '0000:41:00.0')
    assert detail.startswith('cannot enable VFs: cannot write 0000:41:00.0: '
                             '%s -e exited 3: ' % script)
    assert detail.endswith('x' * 300)          # its last 300 characters
    assert 'first' not in detail and 'x' * 301 not in detail


def test_a_script_that_says_nothing_on_stderr_is_quoted_from_stdout(
        a100, fast_tmp):
    script = _script(fast_tmp, 'echo "  busy  "\nexit 1\n')
    run = restore.Restore(env_of(a100, fast_tmp), settle_timeout=0,
                          sriov_manage=script)
    run.enable_vfs(PF)
    assert actions(run)[0][3].endswith('%s -e exited 1: busy' % script)


def test_a_refused_write_is_reported_not_raised(a100, fast_tmp,
                                                monkeypatch):
    def refuse(address, count):
        raise exception.SysfsWriteError(path='sriov_numvfs',
                                        reason='Device or resource busy')
    monkeypatch.setattr(a100, 'set_sriov_numvfs', refuse)
    run = restore.Restore(env_of(a100, fast_tmp), settle_timeout=0)
    run.enable_vfs(PF)
    ((action, _, _, detail),) = actions(run)
    assert action == 'failed'
    assert detail.startswith('cannot enable VFs: ')
    assert 'Device or resource busy' in detail


class _Counting(restore.Restore):
    """A run whose VFs show their vGPU interface once asked ``ready_at``
    times in all (the driver registers them after they appear)."""

    ready_at = 0

    def _ready(self, vf):
        self.asked = getattr(self, 'asked', 0) + 1
        return self.asked > self.ready_at


def test_the_wait_ends_when_every_vf_shows_its_interface(a100, fast_tmp,
                                                         monkeypatch):
    pauses = []
    monkeypatch.setattr(restore.time, 'sleep', pauses.append)
    run = _Counting(env_of(a100, fast_tmp), settle_timeout=30)
    run.ready_at = 20             # the first pass sees 0 of 16 ready
    run.enable_vfs(PF)
    assert actions(run) == [('enabled-vfs', 'vfs', '0000:41:00.0',
                             'enabled 16 VFs (sriov_numvfs)')]
    assert run.asked == 16 * 3    # 0/16, then 12/16, then 16/16
    assert pauses == [0.1, 0.1]   # a short pause between looks


def test_the_wait_gives_up_at_its_deadline_and_counts_the_missing(
        a100, fast_tmp):
    run = _Counting(env_of(a100, fast_tmp), settle_timeout=0)
    run.ready_at = 5
    run.enable_vfs(PF)
    assert actions(run)[0][3] == (
        'enabled 16 VFs (sriov_numvfs); 5 VF(s) show no vGPU interface '
        'yet')
    assert run.asked == 16        # one look, no wait


def test_a_vf_is_ready_with_mdev_types_or_the_vendor_interface(fast_tmp):
    # a100 VFs show mdev types, its PF neither; l40s VFs the vendor
    # interface
    a100 = host(simulator.load_profile('a100'), fast_tmp)
    run = restore.Restore(env_of(a100, fast_tmp))
    assert run._ready(objects.PciAddress.parse('0000:41:00.4'))
    assert not run._ready(PF)
    other = tempfile.mkdtemp(prefix='lgpu-mutrestore-')
    try:
        l40s = host(simulator.load_profile('l40s'), other)
        run = restore.Restore(env_of(l40s, other))
        assert run._ready(objects.PciAddress.parse('0000:3d:00.4'))
        assert not run._ready(objects.PciAddress.parse('0000:3d:00.0'))
    finally:
        shutil.rmtree(other, ignore_errors=True)


# --- 3. persistent vGPUs, dry run -------------------------------------------

def without_vgpus(name):
    """The bundled profile with its VFs enabled and no vGPU."""
    with open(os.path.join(loading.profile_dir(), name + '.json')) as f:
        data = json.load(f)
    for dev in data['devices']:
        dev.pop('mdevs', None)
        dev.pop('held_type', None)
    return loading.profile_from_dict(data, source=name + '-bare')


def test_a_dry_run_says_which_persistent_vgpus_it_would_create(fast_tmp):
    sysfs = host(without_vgpus('a100'), fast_tmp)
    mdevctl = os.path.join(fast_tmp, 'mdevctl.d')
    define(mdevctl, '0000:41:00.4', U1, 'nvidia-472', 'auto')
    env = env_of(sysfs, fast_tmp, mdevctl_dir=mdevctl)
    writes = len(sysfs.writes)
    report = restore.restore(env, dry_run=True, settle_timeout=0)
    (one,) = [a for a in report.actions if a.target == str(U1)]
    assert (one.action, one.what) == ('would', 'mdev')
    assert one.detail.startswith('would create ')
    assert len(sysfs.writes) == writes
    assert sysfs.mdevs_by_parent() == {}
    # once it exists, the dry run says so
    restore.restore(env, settle_timeout=0)
    report = restore.restore(env.replace(), dry_run=True, settle_timeout=0)
    (one,) = [a for a in report.actions if a.target == str(U1)]
    assert (one.action, one.what) == ('ok', 'mdev')
    assert one.detail.startswith('exists: ')


# --- the outcome left for the exporter -------------------------------------

def test_a_run_leaves_its_changes_and_failures_for_the_exporter(
        a100, fast_tmp):
    state_dir = os.path.join(fast_tmp, 'state')
    mdevctl = os.path.join(fast_tmp, 'mdevctl.d')
    define(mdevctl, '0000:41:00.4', U1, 'nvidia-472', 'auto')
    define(mdevctl, '0000:41:00.4', U2, 'nvidia-468', 'auto')   # won't fit
    env = env_of(a100, fast_tmp, mdevctl_dir=mdevctl)
    report = restore.restore(env, vf_pfs=[PF], settle_timeout=0)
    assert len(report.changed) == 2 and len(report.failed) == 1
    doc = figures.outcome(state_dir, figures.RESTORE)
    assert doc['runs'] == 1 and doc['failures'] == 1
    (failed,) = report.failed
    assert doc['last_error'] == 'mdev %s: %s' % (U2, failed.detail)
    # a clean run: its changes are counted, no error
    shutil.rmtree(mdevctl)
    define(mdevctl, '0000:41:00.5', U2, 'nvidia-472', 'auto')
    report = restore.restore(env.replace(), vf_pfs=[PF], settle_timeout=0)
    assert report.failed == () and len(report.changed) == 1
    doc = figures.outcome(state_dir, figures.RESTORE)
    assert doc['runs'] == 2 and doc['failures'] == 1
    assert doc['last_changes'] == 1 and doc['changes_total'] == 1
    assert doc['last_success'] is not None


def test_two_failures_are_joined_in_the_recorded_error(a100, fast_tmp):
    state_dir = os.path.join(fast_tmp, 'state')
    mdevctl = os.path.join(fast_tmp, 'mdevctl.d')
    for uuid in (U1, U2, U3):           # one VF holds one of them
        define(mdevctl, '0000:41:00.4', uuid, 'nvidia-468', 'auto')
    report = restore.restore(env_of(a100, fast_tmp, mdevctl_dir=mdevctl),
                             vf_pfs=[PF], settle_timeout=0)
    assert len(report.failed) == 2
    assert figures.outcome(state_dir, figures.RESTORE)['last_error'] == \
        '; '.join('%s %s: %s' % (a.what, a.target, a.detail)
                  for a in report.failed)


def test_a_dry_run_records_nothing(a100, fast_tmp):
    state_dir = os.path.join(fast_tmp, 'state')
    restore.restore(env_of(a100, fast_tmp), vf_pfs=[PF], dry_run=True,
                    settle_timeout=0)
    assert figures.outcome(state_dir, figures.RESTORE) is None


def test_a_run_that_raises_records_the_error_and_raises_it(
        a100, fast_tmp, monkeypatch):
    state_dir = os.path.join(fast_tmp, 'state')

    def broken(self):
        raise exception.ConfigError(reason='[nova] is broken')
    monkeypatch.setattr(restore.Restore, 'carve', broken)
    with pytest.raises(exception.ConfigError):
        restore.restore(env_of(a100, fast_tmp), settle_timeout=0)
    doc = figures.outcome(state_dir, figures.RESTORE)
    assert doc['failures'] == 1 and '[nova] is broken' in doc['last_error']
    with pytest.raises(exception.ConfigError):
        restore.restore(env_of(a100, fast_tmp), settle_timeout=0,
                        dry_run=True)
    assert figures.outcome(state_dir, figures.RESTORE)['runs'] == 1


# --- how VFs are enabled -----------------------------------------------------

def test_the_way_to_enable_vfs(fast_tmp):
    # auto unless asked otherwise
    assert restore.sriov_manage_for(fast_tmp) is None
    installed = os.access(restore.SRIOV_MANAGE, os.X_OK)
    assert restore.sriov_manage_for('/sys') == (
        restore.SRIOV_MANAGE if installed else None)
    assert restore.sriov_manage_for('/sys', None) is None
    assert restore.sriov_manage_for('/sys', 'none') is None
    assert restore.sriov_manage_for(fast_tmp, '/x/sriov') == '/x/sriov'
    assert restore.sriov_manage_for('/sys', '/x/sriov') == '/x/sriov'
    # auto: NVIDIA's script only on the real /sys and only when installed
    assert restore.sriov_manage_for(fast_tmp, 'auto') is None
    installed = os.access(restore.SRIOV_MANAGE, os.X_OK)
    assert restore.sriov_manage_for('/sys', 'auto') == (
        restore.SRIOV_MANAGE if installed else None)
