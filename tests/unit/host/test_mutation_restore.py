"""What ``libvirt-gpu restore`` (host/restore.py) promises that
test_restore, test_nova_carving and test_layouts_inject left open: each
test here fails on a change ``make mutation`` made that the rest stayed
green on (docs/dev/mutation.md) -- the report's shape and wording, each
branch of enabling a PF's VFs (and its dry run), the wait for VFs to show
their vGPU interface, the dry run of a persistent vGPU, the outcome left
for the exporter, and how the way to enable VFs is chosen."""

import json
import os
import shutil
import stat
import tempfile

import pytest

from libvirt_gpu import environment
from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu import simulator
from libvirt_gpu.host import restore
from libvirt_gpu.simulator import loading
from libvirt_gpu.store import figures
from tests.unit.host.test_restore import define
from tests.unit.host.test_restore import host
from tests.unit.host.test_restore import rebooted

PF = objects.PciAddress.parse('0000:41:00.0')
U1 = objects.Uuid.parse('aa618089-8b16-4d01-a136-25a0f3c73123')
U2 = objects.Uuid.parse('c73f1fa6-489e-4834-9476-d70dabd98c40')
U3 = objects.Uuid.parse('3b356d38-854e-48be-b376-00c72c7d119c')


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
