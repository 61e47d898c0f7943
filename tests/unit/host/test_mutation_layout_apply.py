"""What ``layout plan``/``apply`` promises that test_layout_apply left
open: each test here fails on a change ``make mutation`` made to
host/layout_apply.py that the rest stayed green on
(docs/dev/mutation.md).

``GpuDriver`` is reached as on a host: nvidia-ml-py's binding over the
simulated driver (``[gpu]/nvml = simulated``) and the kernel double
answering the ``sriov_numvfs`` writes of a static tree
(tests/unit/host/test_layout_apply_inject.py builds its hosts the same
way); each
step is seen in what the driver holds afterwards.  The applier's own
rules (the whole refusal and failure lines, the report's counts) run on
test_layout_apply's stand-in GPU."""

import os
import subprocess
import time

import pytest

from libvirt_gpu import conf as conf_mod
from libvirt_gpu import environment
from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu import simulator
from libvirt_gpu.cmd import output
from libvirt_gpu.devices import layout
from libvirt_gpu.devices.backends import nvidia_vgpu
from libvirt_gpu.host import layout_apply as la
from libvirt_gpu.devices import layout_plan as lp
from libvirt_gpu.devices import nvml
from libvirt_gpu.devices import sysfs as sysfs_mod
from libvirt_gpu.store import state as state_mod
from libvirt_gpu.util import records
from tests.doubles import kernel_sysfs
from tests.doubles import layouts
from tests.unit.devices import test_layout as tl
from tests.unit.host import test_layout_apply as tla

H100 = objects.PciAddress.parse('0000:4e:00.0')
L40S = objects.PciAddress.parse('0000:bd:00.0')
RTX = objects.PciAddress.parse('0000:ca:00.0')
H100_MIG = ('mode = mig', 'gpu_instances = 2g.20gb:3, 1g.10gb:1',
            'vgpu_types = nvidia-1311, nvidia-1308')
H100_SMALLER = ('mode = mig', 'gpu_instances = 2g.20gb:2, 1g.10gb:1',
                'vgpu_types = nvidia-1311, nvidia-1308')
L40S_MIXED = ('mode = mixed-size',
              'vgpu_types = nvidia-1153:3, nvidia-1145:1',
              'scheduler = equal-share', 'time_slice_ms = 4')
RTX_SLICED = ('mode = mig-time-sliced',
              'gpu_instances = 2g.48gb+gfx:1, 1g.24gb+gfx:2',
              'vgpu_types = nvidia-1511, nvidia-1513',
              'scheduler = equal-share', 'time_slice_ms = 2')


class Host(object):
    """A simulated host; an Environment for each layout, kept for the
    next apply (its GPUs stay: what is asked of them is read anew)."""

    def __init__(self, path, profile, gpu):
        self.path = str(path)
        self.profile = profile
        self.gpu = gpu
        self.root = os.path.join(self.path, 'sys')
        simulator.write_sysfs(simulator.load_profile(profile), self.root)
        self.sysfs = kernel_sysfs.KernelSysfs(self.root, profile)
        self._envs = {}

    def env(self, lines, nvml_option='simulated'):
        key = (lines, nvml_option, self.gpu)
        if key in self._envs:
            return self._envs[key]
        name = os.path.join(self.path, 'c%d.conf' % len(self._envs))
        with open(name, 'w') as f:
            f.write('[DEFAULT]\nsysfs_root = %s\nstate_dir = %s\n'
                    '[gpu]\nnvml = %s\nlayouts = e2e\n'
                    '[layout_e2e]\ngpus = %s\n%s\n' % (
                        self.root, os.path.join(self.path, 'state'),
                        nvml_option, self.gpu, '\n'.join(lines)))
        conf = conf_mod.load(name)
        self._envs[key] = environment.Environment(
            conf.state_dir, conf=conf, sysfs=self.sysfs)
        return self._envs[key]

    def apply(self, lines, **kwargs):
        kwargs.setdefault('settle_timeout', 5.0)
        return layouts.converge(self.env(lines), **kwargs)

    def state(self, lines):
        """What ``GpuDriver`` reads of the GPU, for the layout ``lines``."""
        env = self.env(lines)
        address = objects.PciAddress.parse(self.gpu)
        with env.nvml.session() as session:
            driver = la.GpuDriver(session, env.sysfs,
                                  la.layout_kinds(env.vgpus))
            facts = driver.facts(address)
            return facts, driver.state(
                address, env.layouts[address], facts)


def _rows(report):
    """Each line's status, step and detail; each names the GPU of a plan."""
    assert {r.address for r in report.results} <= {
        p.address for p in report.plans}
    return [(r.status, r.action, r.detail) for r in report.results]


AT_LAYOUT = [(la.OK, 'layout', 'the GPU is at its layout: nothing to do')]


# --- GpuDriver on the simulated driver ---------------------------------------

def test_h100_from_boot_to_its_mig_layout_and_one_gi_less(tmp_path):
    host = Host(tmp_path, 'h100-80gb', str(H100))
    facts, before = host.state(H100_MIG)
    assert (facts.mig, facts.vfs_total) == (False, 32)
    assert (before.mig, before.vfs, before.vfs_total, before.gpu_instances,
            before.vgpus) == (False, 32, 32, (), ())
    create = ('create a %s GPU instance at memory slice %d (with its '
              'compute instance)')
    steps = [
        (lp.DISABLE_VFS, 'disable the 32 VFs (the driver changes MIG mode '
                         'only without VFs)'),
        (lp.MIG_MODE, 'turn MIG mode on'),
        (lp.ENABLE_VFS, 'enable 32 VFs'),
        (lp.CREATE_GI, create % ('2g.20gb', 0)),
        (lp.CREATE_GI, create % ('2g.20gb', 2)),
        (lp.CREATE_GI, create % ('2g.20gb', 4)),
        (lp.CREATE_GI, create % ('1g.10gb', 6))]
    plan = host.apply(H100_MIG, dry_run=True)
    assert _rows(plan) == [(la.WOULD,) + step for step in steps]
    assert plan.summary() == (
        '1 GPU(s); 0 step(s) done, 7 to do, 0 failed or refused')
    assert host.state(H100_MIG)[1] == before          # a plan changes nothing
    seen = []
    report = host.apply(H100_MIG, progress=seen.append)
    assert _rows(report) == [(la.DONE,) + step for step in steps]
    assert seen == list(report.results)
    assert report.summary() == (
        '1 GPU(s); 7 step(s) done, 0 to do, 0 failed or refused')
    assert report.module_option is None and report.details() == ()
    facts, after = host.state(H100_MIG)
    assert (facts.mig, after.mig, after.vfs, after.mixed_size) == (
        True, True, 32, None)
    assert [(g.profile_id, g.start, g.size, g.compute, g.scheduler)
            for g in after.gpu_instances] == [
        (14, 0, 2, True, None), (14, 2, 2, True, None),
        (14, 4, 2, True, None), (19, 6, 1, True, None)]
    again = host.apply(H100_MIG)
    assert _rows(again) == AT_LAYOUT
    assert again.summary() == (
        '1 GPU(s); 0 step(s) done, 0 to do, 0 failed or refused')
    assert [p.address for p in report.plans] == [H100]
    assert {r.address for r in report.results} == {H100}
    smaller = host.apply(H100_SMALLER)
    assert [(r.status, r.action) for r in smaller.results] == [
        (la.DONE, lp.DESTROY_GI)]
    _, after = host.state(H100_SMALLER)
    assert [g.profile_id for g in after.gpu_instances] == [14, 14, 19]
    assert _rows(host.apply(H100_SMALLER)) == AT_LAYOUT
    # a GPU instance more, MIG mode as it is: the GPU's facts as read
    assert _rows(host.apply(H100_MIG)) == [
        (la.DONE, lp.CREATE_GI, create % ('2g.20gb', 4))]
    # in MIG mode the layout is checked against the GPU before any step
    too_big = ('mode = mig', 'gpu_instances = 3g.40gb:2, 1g.10gb:1',
               'vgpu_types = nvidia-1311')
    refused = host.apply(too_big)
    assert [(r.status, r.action) for r in refused.results] == [
        (la.FAILED, 'check')]
    _rows(refused)
    assert refused.results[0].detail.startswith(
        'layout e2e, GPU 0000:4e:00.0: ')
    # its VFs disabled: the driver reads none, and the plan enables them
    env = host.env(H100_SMALLER)
    with env.nvml.session() as session:
        driver = la.GpuDriver(session, env.sysfs,
                              la.layout_kinds(env.vgpus))
        driver.run(H100, lp.Step(lp.DISABLE_VFS, 'x'), None)
        facts = driver.facts(H100)
        state = driver.state(H100, env.layouts[H100], facts)
    assert (state.vfs, state.vfs_total) == (0, 32)
    plan = host.apply(H100_SMALLER, dry_run=True)
    assert _rows(plan)[0] == (
        la.WOULD, lp.ENABLE_VFS,
        'enable 32 VFs (this destroys every GPU instance)')


def test_l40s_to_mixed_sizes_and_its_scheduler_then_a_vgpu_on_it(
        tmp_path):
    host = Host(tmp_path, 'l40s', str(L40S))
    facts, before = host.state(L40S_MIXED)
    assert (facts.mig, before.mig, before.mixed_size, before.scheduler,
            before.vgpus) == (None, None, False,
                              layout.Scheduler('best-effort'), ())
    report = host.apply(L40S_MIXED)
    assert _rows(report) == [
        (la.DONE, lp.MIXED_SIZE, 'turn mixed-size mode on'),
        (la.DONE, lp.SCHEDULER, 'set the vGPU scheduler to equal-share, '
                                '4 ms (now best-effort)')]
    _, after = host.state(L40S_MIXED)
    assert (after.mixed_size, after.scheduler) == (
        True, layout.Scheduler('equal-share', 4))
    # the host has other NVIDIA GPUs in no layout: a line per device
    assert report.details() == (
        'to set the schedulers at module load instead (after a driver '
        'reload), in /etc/modprobe.d/nvidia-vgpu.conf:',
        '  options nvidia NVreg_RegistryDwordsPerDevice="pci=0000:bd:00.0;'
        'RmPVMRL=0x40001"')
    assert _rows(host.apply(L40S_MIXED)) == AT_LAYOUT
    # a vGPU on its fourth VF: the GPU holds it, and stays as it is
    vf = host.sysfs.virtfns(L40S)[3]
    nvidia_vgpu.files.VendorFiles(host.sysfs).set_current_type(vf, 1153)
    _, busy = host.state(L40S_MIXED)
    assert busy.vgpus == (vf,)
    shorter = L40S_MIXED[:-1] + ('time_slice_ms = 2',)
    assert _rows(host.apply(shorter)) == [(
        la.REFUSED, 'layout',
        'layout e2e, GPU 0000:bd:00.0: not changed, it holds vGPUs of a vGPU '
        'on %s that libvirt-gpu did not lease; scheduler needs the GPU '
        'without vGPUs: stop or move those guests first' % vf)]
    # leased: the domain by the name the caller knows it by
    with host.env(shorter).store.transaction() as txn:
        txn.add(objects.Uuid.parse('99999999-2222-3333-4444-555555555555'),
                tla.DOMAIN, vf, objects.TypeId.parse('nvidia-1153'))
    assert _rows(host.apply(shorter, names={tla.DOMAIN: 'guest-a'}))[0][
        2].startswith('layout e2e, GPU 0000:bd:00.0: not changed, it holds '
                      'vGPUs of guest-a (%s); ' % tla.DOMAIN)
    assert host.state(L40S_MIXED)[1].scheduler == layout.Scheduler(
        'equal-share', 4)


def test_rtx_gpu_instances_get_their_scheduler(tmp_path):
    host = Host(tmp_path, 'rtx-pro-6000', str(RTX))
    report = host.apply(RTX_SLICED)
    assert report.results[-1].action == lp.GI_SCHEDULER
    assert report.results[-1].detail == (
        'set the vGPU scheduler of each GPU instance to equal-share, 2 ms')
    _, after = host.state(RTX_SLICED)
    assert [(g.profile_id, g.scheduler) for g in after.gpu_instances] == [
        (35, layout.Scheduler('equal-share', 2)),
        (47, layout.Scheduler('equal-share', 2)),
        (47, layout.Scheduler('equal-share', 2))]
    # its one NVIDIA GPU is in the layout: one value for the module
    assert report.module_option == (
        'options nvidia NVreg_RegistryDwords="RmPVMRL=0x20001"')
    assert _rows(host.apply(RTX_SLICED)) == AT_LAYOUT


def test_a_step_the_driver_does_not_know_is_refused(h100_tree):
    with pytest.raises(exception.InvalidInput) as e:
        la.GpuDriver(None, h100_tree, ()).run(
            H100, lp.Step('reboot', 'reboot the host'), None)
    assert str(e.value) == "Invalid input: no layout step 'reboot'"


def test_converge_without_nvml_says_why(tmp_path):
    host = Host(tmp_path, 'h100-80gb', str(H100))
    with pytest.raises(nvml.NvmlUnavailable) as e:
        layouts.converge(host.env(H100_MIG, nvml_option='off'))
    assert str(e.value) == (
        "NVML cannot be used: [gpu]/nvml is off, or the GPUs are not read "
        "from this host's /sys; layouts need NVIDIA's driver and the "
        "nvidia-ml-py package ([gpu]/nvml = auto)")


def test_converge_of_a_gpu_in_no_layout_is_refused_and_none_is_empty(
        tmp_path):
    host = Host(tmp_path, 'h100-80gb', str(H100))
    other = objects.PciAddress.parse('0000:01:00.0')
    with pytest.raises(exception.InvalidInput) as e:
        layouts.converge(host.env(H100_MIG), only=other)
    assert str(e.value) == (
        'Invalid input: the GPU 0000:01:00.0 is in no layout ([gpu]/layouts;'
        ' `libvirt-gpu layout plan` lists the GPUs in one)')
    # a layout that claims no GPU of the host: nothing to do, NVML unasked
    host.gpu = '10de:ffff'
    empty = layouts.converge(host.env(H100_MIG, nvml_option='off'))
    assert empty == la.Report(results=())


# --- sriov-manage ------------------------------------------------------------

def _script(tmp_path, body):
    path = tmp_path / 'sriov-manage'
    path.write_text('#!/bin/sh\necho "$@" >> %s\n%s\n'
                    % (tmp_path / 'calls', body))
    path.chmod(0o755)
    return str(path)


@pytest.fixture(scope='module')
def h100_tree(tmp_path_factory):
    """A static H100 tree (VFs enabled, read only here)."""
    root = tmp_path_factory.mktemp('h100') / 'sys'
    simulator.write_sysfs(simulator.load_profile('h100-80gb'), str(root))
    return sysfs_mod.Sysfs(str(root))


def vendor_kinds(sysfs):
    """The kinds that drive layouts on ``sysfs`` (NVIDIA's vendor
    interface: its VFs are waited for; its state file is never read)."""
    return (nvidia_vgpu.NvidiaVgpuBackend(sysfs, state_dir='/nonexistent'),)


def _vfs_step(sysfs, script, step, settle_timeout=5.0):
    """``step`` run by a ``GpuDriver`` with ``script`` as sriov-manage."""
    la.GpuDriver(None, sysfs, vendor_kinds(sysfs), sriov_manage=script,
                 settle_timeout=settle_timeout).run(H100, step, None)


def test_sriov_manage_disables_and_enables_the_vfs(tmp_path, h100_tree):
    script = _script(tmp_path, 'exit 0')
    _vfs_step(h100_tree, script, lp.Step(lp.DISABLE_VFS, 'x'))
    _vfs_step(h100_tree, script, lp.Step(lp.ENABLE_VFS, 'y', count=32))
    assert (tmp_path / 'calls').read_text() == (
        '-d 0000:4e:00.0\n-e 0000:4e:00.0\n')


def test_sriov_manage_waits_no_longer_than_the_vfs_take(tmp_path,
                                                        h100_tree):
    """Every one of the 32 VFs shows its vendor interface already: the
    wait ends at once, not at its timeout."""
    script = _script(tmp_path, 'exit 0')
    started = time.monotonic()
    _vfs_step(h100_tree, script, lp.Step(lp.ENABLE_VFS, 'y', count=32),
              settle_timeout=60.0)
    assert time.monotonic() - started < 30.0


def test_sriov_manage_waits_for_the_vfs_it_enabled(tmp_path, h100_tree):
    """Up to its timeout, for VFs that never come (33 of 32)."""
    script = _script(tmp_path, 'exit 0')
    started = time.monotonic()
    _vfs_step(h100_tree, script, lp.Step(lp.ENABLE_VFS, 'y', count=33),
              settle_timeout=0.3)
    assert time.monotonic() - started >= 0.3


def test_sriov_manage_failing_is_one_line_with_its_output(
        tmp_path, h100_tree):
    said = 'x' * 400 + ' no such GPU'
    script = _script(tmp_path, 'echo "%s" >&2\necho out\nexit 3' % said)
    with pytest.raises(exception.SysfsWriteError) as e:
        _vfs_step(h100_tree, script, lp.Step(lp.DISABLE_VFS, 'x'))
    assert str(e.value) == (
        'cannot write 0000:4e:00.0: %s -d exited 3: %s' % (script,
                                                           said[-300:]))
    quiet = _script(tmp_path, 'echo "  only stdout  "\nexit 1')
    with pytest.raises(exception.SysfsWriteError) as e:
        _vfs_step(h100_tree, quiet, lp.Step(lp.ENABLE_VFS, 'y', count=32))
    assert str(e.value) == ('cannot write 0000:4e:00.0: %s -e exited 1: '
                            'only stdout' % quiet)


def test_converge_runs_sriov_manage_when_given(tmp_path):
    """``layout apply --sriov-manage``: the script disables the VFs (here
    it does nothing, and the driver refuses MIG mode with VFs on)."""
    script = _script(tmp_path, 'exit 0')
    host = Host(tmp_path, 'h100-80gb', str(H100))
    report = host.apply(H100_MIG, sriov_manage=script)
    assert (tmp_path / 'calls').read_text() == '-d 0000:4e:00.0\n'
    assert [(r.status, r.action) for r in report.results] == [
        (la.DONE, lp.DISABLE_VFS), (la.FAILED, lp.MIG_MODE)]


# --- the applier's rules, on the stand-in GPU --------------------------------

def test_a_busy_gpu_is_refused_naming_each_vf_by_default():
    gpu = tla.Gpu(mig=True, vfs=20)
    gpu.vgpus = (tla.VF, objects.PciAddress.parse('0000:41:00.5'))
    report = la.Applier(gpu).run([(tla.MIG, tla.ADDRESS)])
    assert [r.detail for r in report.results] == [
        'layout one, GPU 0000:41:00.0: not changed, it holds vGPUs of a vGPU '
        'on 0000:41:00.4, a vGPU on 0000:41:00.5; create-gi, create-gi, '
        'create-gi, create-gi, create-gi needs the GPU without vGPUs: stop '
        'or move those guests first']
    assert report.summary() == (
        '1 GPU(s); 0 step(s) done, 0 to do, 1 failed or refused')
    assert report.to_json()['failed'] == 1
    assert report.to_json()['gpus'][0]['vgpus'] == [
        '0000:41:00.4', '0000:41:00.5']


@pytest.mark.parametrize('error', [
    nvml.NvmlError(call='nvmlDeviceSetMigMode', address=tla.ADDRESS,
                   reason='busy'),
    OSError(16, 'Device or resource busy'),
    subprocess.TimeoutExpired('sriov-manage', 300),
])
def test_a_failed_step_says_what_was_done_and_what_is_left(error):
    gpu = tla.Gpu()
    original = gpu.run

    def run(address, step, facts):
        if step.action == lp.ENABLE_VFS:
            raise error
        return original(address, step, facts)
    gpu.run = run
    report = la.Applier(gpu).run([(tla.MIG, tla.ADDRESS)])
    assert [r.status for r in report.results] == [la.DONE, la.FAILED]
    assert {r.address for r in report.results} == {tla.ADDRESS}
    assert report.results[1].action == lp.ENABLE_VFS
    assert report.results[1].detail == (
        'layout one, GPU 0000:41:00.0: enable 20 VFs failed: %s; done: '
        'turn MIG mode on; left: %s (run `libvirt-gpu layout apply` again '
        'once the cause is fixed: it goes on from here)' % (
            error, '; '.join(
                'create a %s GPU instance (with its compute instance)'
                % name for name in ('3g.40gb',) + ('1g.10gb',) * 4)))
    assert report.summary() == (
        '1 GPU(s); 1 step(s) done, 0 to do, 1 failed or refused')
    assert (report.to_json()['failed'], report.to_json()['done']) == (1, 1)


def test_each_step_is_logged_as_it_ends(caplog):
    gpu = tla.Gpu()
    with caplog.at_level('INFO', logger=la.__name__):
        la.Applier(gpu).run([(tla.MIXED, tla.ADDRESS)])
    assert [r.getMessage() for r in caplog.records
            if r.name == la.__name__] == [
        'layout one, GPU 0000:41:00.0: done enable-vfs: enable 20 VFs',
        'layout one, GPU 0000:41:00.0: done mixed-size: turn mixed-size '
        'mode on',
        'layout one, GPU 0000:41:00.0: done scheduler: set the vGPU '
        'scheduler to equal-share, 4 ms (now best-effort)']


def test_an_apply_goes_on_to_the_next_gpu_after_one_that_converged():
    gpu = tla.Gpu()
    other = objects.PciAddress.parse(tl.H100_B)
    report = la.Applier(gpu).run([(tla.MIXED, tla.ADDRESS),
                                  (tla.MIXED, other)])
    assert [p.address for p in report.plans] == [tla.ADDRESS, other]
    assert [r.status for r in report.results] == [la.DONE] * 3 + [la.OK]


def test_an_apply_goes_on_past_a_gpu_at_its_layout():
    gpu = tla.Gpu()
    la.Applier(gpu).run([(tla.MIXED, tla.ADDRESS)])
    other = objects.PciAddress.parse(tl.H100_B)
    report = la.Applier(gpu).run([(tla.MIXED, tla.ADDRESS),
                                  (tla.MIXED, other)])
    assert [p.address for p in report.plans] == [tla.ADDRESS, other]
    assert _rows(report) == [
        (la.OK, 'layout', 'the GPU is at its layout: nothing to do')] * 2


def test_an_apply_stops_at_a_gpu_its_layout_does_not_fit():
    gpu = tla.Gpu()
    gpu.mig = None
    other = objects.PciAddress.parse(tl.H100_B)
    report = la.Applier(gpu).run([(tla.MIG, tla.ADDRESS), (tla.MIG, other)])
    assert [p.address for p in report.plans] == [tla.ADDRESS]


def test_an_apply_stops_at_a_mig_mode_that_needs_a_reset():
    gpu = tla.Gpu()
    gpu.pending = True
    other = objects.PciAddress.parse(tl.H100_B)
    report = la.Applier(gpu).run([(tla.MIG, tla.ADDRESS), (tla.MIG, other)])
    assert [p.address for p in report.plans] == [tla.ADDRESS]


def test_the_last_step_failing_leaves_nothing():
    gpu = tla.Gpu(mig=True, vfs=20)
    lay = tl.layout_of(gis=(('1g.10gb', 1),), types=(1150,))
    gpu.fail = lp.CREATE_GI
    report = la.Applier(gpu).run([(lay, tla.ADDRESS)])
    assert report.results[-1].detail.endswith(
        'done: nothing; left: nothing (run `libvirt-gpu layout apply` again '
        'once the cause is fixed: it goes on from here)')


def test_a_mig_mode_set_but_not_current_is_one_line():
    gpu = tla.Gpu()
    gpu.pending = True
    report = la.Applier(gpu).run([(tla.MIG, tla.ADDRESS)])
    assert {r.address for r in report.results} == {tla.ADDRESS}
    assert _rows(report) == [
        (la.DONE, lp.MIG_MODE, 'turn MIG mode on'),
        (la.FAILED, 'check',
         'layout one, GPU 0000:41:00.0: MIG mode is set but not current: '
         'the GPU needs a reset (nvidia-smi -r -i <index>, with no process '
         'on it) or a reboot; done: turn MIG mode on; left: enable 20 VFs; '
         'create a 3g.40gb GPU instance (with its compute instance); '
         'create a 1g.10gb GPU instance (with its compute instance); '
         'create a 1g.10gb GPU instance (with its compute instance); '
         'create a 1g.10gb GPU instance (with its compute instance); '
         'create a 1g.10gb GPU instance (with its compute instance)')]


def test_mig_mode_turned_off_is_checked_as_off():
    gpu = tla.Gpu(mig=True)
    report = la.Applier(gpu).run([(tla.MIXED, tla.ADDRESS)])
    assert not report.failed
    assert gpu.mig is False and gpu.mixed is True


def test_a_mig_layout_on_a_gpu_without_mig_is_one_line():
    gpu = tla.Gpu()
    gpu.mig = None
    report = la.Applier(gpu).run([(tla.MIG, tla.ADDRESS)])
    assert _rows(report) == [(
        la.FAILED, 'check',
        'layout one, GPU 0000:41:00.0: mode mig needs MIG, and this GPU has '
        'no MIG mode; use mode time-sliced or mixed-size')]
    assert report.plans == (lp.GpuPlan('one', tla.ADDRESS, ()),)
    # a mixed-size layout on that GPU is checked and applied
    assert not la.Applier(gpu).run([(tla.MIXED, tla.ADDRESS)]).failed


def test_the_layout_is_checked_when_mig_mode_is_as_it_wants():
    gpu = tla.Gpu(mig=True, vfs=20)
    bad = tl.layout_of(types=(1150, 1160))
    report = la.Applier(gpu).run([(bad, tla.ADDRESS)])
    assert gpu.calls == []
    assert report.results[0].action == 'check'
    assert 'nvidia-1160 is time-sliced' in report.results[0].detail


class _TwoGpus(tla.Gpu):
    """The stand-in, its vGPUs on the first GPU only."""

    def state(self, address, lay, facts):
        found = super().state(address, lay, facts)
        if address != tla.ADDRESS:
            found = records.replace(found, vgpus=())
        return found


def test_a_plan_goes_on_past_a_refused_gpu_an_apply_stops():
    gpu = _TwoGpus(mig=True, vfs=20)
    gpu.vgpus = (tla.VF,)
    other = objects.PciAddress.parse(tl.H100_B)
    targets = [(tla.MIG, tla.ADDRESS), (tla.MIG, other)]
    dry = la.Applier(gpu, dry_run=True).run(targets)
    assert [p.address for p in dry.plans] == [tla.ADDRESS, other]
    assert [r.status for r in dry.results] == [la.REFUSED] + [la.WOULD] * 5
    applied = la.Applier(gpu).run(targets)
    assert [p.address for p in applied.plans] == [tla.ADDRESS]
    assert gpu.calls == []


def test_the_module_option_covers_every_gpu_only_when_told():
    lay = tl.layout_of(mode='mixed-size', gis=(), types=(1160,),
                       scheduler='equal-share')
    gpu = tla.Gpu()
    assert la.Applier(gpu, dry_run=True).run(
        [(lay, tla.ADDRESS)], every_gpu=True).module_option == (
        'options nvidia NVreg_RegistryDwords="RmPVMRL=0x1"')
    assert la.Applier(gpu, dry_run=True).run(
        [(lay, tla.ADDRESS)]).module_option == (
        'options nvidia NVreg_RegistryDwordsPerDevice="pci=0000:41:00.0;'
        'RmPVMRL=0x1"')
    assert la.Applier(gpu, dry_run=True).run(
        [(tla.MIG, tla.ADDRESS)], every_gpu=True).module_option is None


def test_the_report_for_scripts_and_people_whole():
    gpu = tla.Gpu()
    lay = tl.layout_of(mode='mixed-size', gis=(), types=(1160,))
    report = la.Applier(gpu, dry_run=True).run([(lay, tla.ADDRESS)])
    assert report.to_json() == {
        'results': [
            {'status': 'would', 'layout': 'one', 'gpu': '0000:41:00.0',
             'action': 'enable-vfs', 'detail': 'enable 20 VFs'},
            {'status': 'would', 'layout': 'one', 'gpu': '0000:41:00.0',
             'action': 'mixed-size', 'detail': 'turn mixed-size mode on'}],
        'gpus': [{'layout': 'one', 'gpu': '0000:41:00.0', 'steps': [
            {'action': 'enable-vfs', 'detail': 'enable 20 VFs',
             'count': 20},
            {'action': 'mixed-size', 'detail': 'turn mixed-size mode on',
             'on': True}], 'vgpus': []}],
        'failed': 0, 'done': 0, 'module_option': None}
    assert output.report_text(report) == (
        '1 GPU(s); 0 step(s) done, 2 to do, 0 failed or refused\n'
        'STATUS  LAYOUT  GPU           STEP        DETAIL\n'
        '------  ------  ------------  ----------  -----------------------\n'
        'would   one     0000:41:00.0  enable-vfs  enable 20 VFs\n'
        'would   one     0000:41:00.0  mixed-size  turn mixed-size mode on')


# --- targets and lease holders -----------------------------------------------

def test_targets_sorted_by_address_and_only_one():
    a = objects.PciAddress.parse(tl.H100)
    b = objects.PciAddress.parse(tl.H100_B)
    c = objects.PciAddress.parse(tl.L40S)
    by_gpu = {c: tla.MIXED, a: tla.MIG, b: tla.MIG_SLICED}
    assert la.targets(by_gpu) == [(tla.MIG, a), (tla.MIG_SLICED, b),
                                  (tla.MIXED, c)]
    assert la.targets(by_gpu, b) == [(tla.MIG_SLICED, b)]
    assert la.targets({}) == []


def test_a_refusal_names_the_leases_on_the_gpu_itself(tmp_path):
    """The holders are asked about the GPU and its VFs: a lease on the
    physical GPU is named too."""
    store = state_mod.LeaseStore(tmp_path / 'state')
    with store.transaction() as txn:
        txn.add(objects.Uuid.parse('99999999-2222-3333-4444-555555555555'),
                tla.DOMAIN, tla.ADDRESS, objects.TypeId.parse('nvidia-1150'))
    gpu = tla.Gpu(mig=True, vfs=20)
    gpu.vgpus = (tla.VF,)
    report = la.Applier(gpu, holders=la.lease_holders(store)).run(
        [(tla.MIG, tla.ADDRESS)])
    assert _rows(report)[0][2].startswith(
        'layout one, GPU 0000:41:00.0: not changed, it holds vGPUs of '
        'domain %s, a vGPU on 0000:41:00.4 that libvirt-gpu did not '
        'lease; ' % tla.DOMAIN)


def test_lease_holders_by_name_else_uuid_sorted(tmp_path):
    store = state_mod.LeaseStore(tmp_path / 'state')
    vf2 = objects.PciAddress.parse('0000:41:00.5')
    vf3 = objects.PciAddress.parse('0000:41:00.6')
    elsewhere = objects.PciAddress.parse('0000:42:00.4')
    other = objects.Uuid.parse('00000000-2222-3333-4444-555555555555')
    vgpu = objects.TypeId.parse('nvidia-1150')
    with store.transaction() as txn:
        txn.add(objects.Uuid.parse('99999999-2222-3333-4444-555555555551'),
                tla.DOMAIN, tla.VF, vgpu)
        txn.add(objects.Uuid.parse('99999999-2222-3333-4444-555555555552'),
                other, vf2, vgpu)
        txn.add(objects.Uuid.parse('99999999-2222-3333-4444-555555555553'),
                objects.Uuid.parse('77777777-2222-3333-4444-555555555555'),
                elsewhere, vgpu)
    holders = la.lease_holders(store, names={tla.DOMAIN: 'guest-a'})
    assert holders(tla.ADDRESS, (tla.VF, vf2, vf3)) == [
        'domain %s' % other, 'guest-a (%s)' % tla.DOMAIN,
        'a vGPU on 0000:41:00.6 that libvirt-gpu did not lease']
    assert la.lease_holders(store)(tla.ADDRESS, (vf2,)) == [
        'domain %s' % other]
