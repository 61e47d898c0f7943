"""What ``libvirt-gpu restore`` (host/restore.py) says that the rest of
the unit layer left open (docs/dev/mutation.md): a persistent vGPU that
already exists reported as such, not as created; a carve record that
cannot be read named in the log with its damage when the GPUs it holds
are asked for, and the consequence of rebuilding it said in the report;
a step 5 that cannot judge Cyborg's GPUs reported as a vGPU row."""

import logging
import os
import shutil
import tempfile

import pytest

from libvirt_gpu import exception
from libvirt_gpu.store import carved as carve_record
from libvirt_gpu.host import restore
from tests.doubles.carved_host import CARVING
from tests.doubles.carved_host import Host
from tests.doubles.carved_host import L2
from tests.doubles.carved_host import plant
from tests.doubles import reconcile_world
from tests.doubles.rebooted_host import conf
from tests.doubles.rebooted_host import define
from tests.doubles.rebooted_host import host
from tests.doubles.rebooted_host import rebooted
from tests.doubles.reconcile_world import _restore

U1 = 'aa618089-8b16-4d01-a136-25a0f3c73123'


@pytest.fixture
def fast_tmp():
    # the state directory's parent is this 0700 one: a state directory
    # below a directory anyone can write is refused (statedir.check_dir)
    path = tempfile.mkdtemp(prefix='lgpu-restore-rules-')
    yield path
    shutil.rmtree(path, ignore_errors=True)


world = reconcile_world.world


def test_a_persistent_vgpu_is_created_once_then_reported_as_existing(
        fast_tmp):
    from libvirt_gpu import environment
    sysfs = host(rebooted('a100'), fast_tmp)
    _, cfg = conf(fast_tmp, '[gpu]\nenabled_vgpu_types = nvidia-472\n')
    mdevctl = os.path.join(fast_tmp, 'mdevctl.d')
    define(mdevctl, '0000:41:00.4', U1, 'nvidia-472', 'auto')

    def one(report):
        (found,) = [a for a in report.actions if a.target == U1]
        return found.action, found.what, found.detail

    def run():
        env = environment.Environment.from_conf(cfg, sysfs=sysfs,
                                                mdevctl_dir=mdevctl)
        return restore.restore(env, vf_pfs=restore.vf_targets(env),
                               settle_timeout=0)
    action, what, detail = one(run())
    assert (action, what) == (restore.CREATED, 'mdev')
    assert detail.startswith('created ') and '0000:41:00.4' in detail
    # the next boot's restore finds it there: nothing created, and said so
    again = one(run())
    assert again == (restore.OK, 'mdev',
                     'exists: ' + detail[len('created '):])


def test_the_gpus_a_damaged_record_holds_are_logged_with_its_damage(
        fast_tmp, caplog):
    stored = Host(fast_tmp, CARVING % (L2, 2))
    assert stored.restore().failed == ()
    path = plant(stored.state_dir, b'{"version": 1, "vfs": {')
    with caplog.at_level(logging.WARNING, logger=restore.LOG.name):
        found = restore.carved_gpus(stored.env())
    # the configuration still names the GPU: it stays held
    assert L2 in found
    (logged,) = [r.getMessage() for r in caplog.records
                 if r.name == restore.LOG.name]
    assert ('State file %s: not JSON' % path) in logged
    assert carve_record.REMEDY in logged


def test_rebuilding_a_damaged_record_says_what_it_no_longer_holds(
        fast_tmp):
    stored = Host(fast_tmp, CARVING % (L2, 2))
    assert stored.restore().failed == ()
    path = plant(stored.state_dir, b'[')
    try:
        carve_record.CarveRecord(stored.state_dir).read()
    except carve_record.DamagedRecord as e:
        damage = e.kwargs['damage']
    (moved,) = [a for a in stored.restore().actions
                if a.what == 'carve-record']
    (aside,) = [n for n in os.listdir(stored.state_dir)
                if n.startswith(carve_record.RECORD_NAME + '.damaged-')]
    assert (moved.action, moved.target) == (restore.FORGOT, path)
    assert moved.detail == (
        'cannot be read (%s): moved aside to %s; rebuilt from the '
        'configuration (a VF it named that the configuration no longer '
        'carves is no longer held as Nova\'s)'
        % (damage, os.path.join(stored.state_dir, aside)))


def test_step_5_without_libvirt_says_which_unit_judges(world):
    run_ = _restore(world)
    run_.other_routes()
    assert [(a.action, a.what, a.target, a.detail) for a in run_.actions] == [
        (restore.SKIPPED, 'vgpu', 'cyborg', 'libvirt not asked '
         '(--no-libvirt): Nova\'s leftover definitions on Cyborg\'s GPUs '
         'are judged by a restore with libvirt '
         '(libvirt-gpu-restore-routes.service)')]


def test_step_5_failing_is_a_vgpu_row_of_the_report(world):
    def broken(dry_run):
        raise exception.LibvirtGpuError('libvirt is down')
    run_ = _restore(world, leftovers=broken)
    run_.other_routes()
    (failed,) = run_.actions
    assert (failed.action, failed.what, failed.target) == (
        restore.FAILED, 'vgpu', 'cyborg')


def test_a_carving_the_host_cannot_satisfy_is_a_failed_row(fast_tmp):
    stored = Host(fast_tmp, CARVING % (L2, 999))
    report = stored.restore()
    (failed,) = [a for a in report.failed if a.what == 'carving']
    assert (failed.action, failed.target) == (restore.FAILED,
                                              '[nova]/carved')
    assert 'count = 999' in failed.detail
    assert stored.record() == {}                 # nothing of it written


def test_a_definition_that_cannot_be_read_fails_the_restore(fast_tmp):
    from libvirt_gpu import environment
    sysfs = host(rebooted('a100'), fast_tmp)
    _, cfg = conf(fast_tmp, '[gpu]\nenabled_vgpu_types = nvidia-472\n')
    mdevctl = os.path.join(fast_tmp, 'mdevctl.d')
    define(mdevctl, '0000:41:00.4', U1, 'nvidia-472', 'auto')
    with open(os.path.join(mdevctl, '0000:41:00.4', U1), 'w') as f:
        f.write('{"mdev_type": ')                  # cut off
    env = environment.Environment.from_conf(cfg, sysfs=sysfs,
                                            mdevctl_dir=mdevctl)
    report = restore.restore(env, vf_pfs=restore.vf_targets(env),
                             settle_timeout=0)
    (failed,) = [a for a in report.actions if a.target == U1]
    assert (failed.action, failed.what) == (restore.FAILED, 'mdev')
    assert failed in report.failed
