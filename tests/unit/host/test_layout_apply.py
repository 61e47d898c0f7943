"""Converging a GPU to its layout (host/layout_apply.py): apply, a
second apply that does nothing, a failure injected at each step (no leak,
the next apply converges), a GPU that holds a vGPU refused naming its
domain (the real lease store).

``Gpu`` stands in for ``layout_apply.GpuDriver`` (the applier's side of
NVML and sysfs), not for NVML: it keeps one GPU's state as records and
enforces the driver rules the order depends on (DESIGN of issue 28: MIG
mode refused while VFs are enabled, enabling VFs destroys every GPU
instance and clears mixed-size mode, GIs limited by the GPU's slices,
memory and per-profile counts, mixed size and the scheduler refused while
a vGPU exists)."""

import collections

import pytest

from libvirt_gpu.devices import layout
from libvirt_gpu.host import layout_apply as la
from libvirt_gpu.devices import layout_plan as lp
from libvirt_gpu.devices import nvml
from libvirt_gpu import objects
from libvirt_gpu.store import state as state_mod
from tests.doubles import layout_facts as tl
import os
import subprocess
import time
from libvirt_gpu import conf as conf_mod
from libvirt_gpu import environment
from libvirt_gpu import exception
from libvirt_gpu import simulator
from libvirt_gpu.cmd import output
from libvirt_gpu.devices.backends import nvidia_vgpu
from libvirt_gpu.devices import sysfs as sysfs_mod
from libvirt_gpu.util import records
from tests.doubles import kernel_sysfs
from tests.doubles import layouts

ADDRESS = objects.PciAddress.parse(tl.H100)
VF = objects.PciAddress.parse('0000:41:00.4')
DOMAIN = objects.Uuid.parse('11111111-2222-3333-4444-555555555555')


class Gpu(object):
    """One H100 behind the ``GpuDriver`` interface."""

    def __init__(self, mig=False, vfs=0, mixed=False):
        self.facts_ = tl.h100_facts()
        self.mig, self.vfs, self.mixed = mig, vfs, mixed
        self.gis = {}              # id -> profile id
        self.scheduler = layout.Scheduler('best-effort')
        self.gi_schedulers = {}
        self.vgpus = ()
        self.fail = None           # an action that fails once
        self.pending = False       # MIG mode set but not current
        self.hides_mig_types = False   # MIG off: lists no MIG-backed type
        self.calls = []
        self._next = 1

    # reading
    def facts(self, address):
        types = self.facts_.types
        if self.hides_mig_types and not self.mig:
            types = tuple(t for t in types if not t.mig_backed)
        return layout.GpuFacts(address=address, mig=self.mig,
                               profiles=self.facts_.profiles,
                               types=types, vfs_total=20)

    def state(self, address, lay, facts):
        return layout.GpuState(
            address=address, mig=self.mig, vfs=self.vfs, vfs_total=20,
            gpu_instances=tuple(
                layout.GpuInstance(i, p, self.gi_schedulers.get(i))
                for i, p in sorted(self.gis.items())),
            mixed_size=None if self.mig else self.mixed,
            scheduler=self.scheduler, vgpus=self.vgpus)

    # the driver's rules
    def _refuse(self, call, reason):
        raise nvml.NvmlError(call=call, address=ADDRESS, reason=reason)

    def _fits(self, profile_id):
        profile = self.facts_.profile_by_id(profile_id)
        counts = collections.Counter(self.gis.values())
        slices = sum(self.facts_.profile_by_id(p).slices
                     for p in self.gis.values()) + profile.slices
        unit = self.facts_.memory_slice_mib
        memory = sum(self.facts_.profile_by_id(p).memory_mib // unit
                     for p in self.gis.values()) + profile.memory_mib // unit
        return (counts[profile_id] < profile.instances
                and slices <= self.facts_.slices
                and memory <= self.facts_.memory_mib // unit)

    def run(self, address, step, facts):
        self.calls.append(step.action)
        if self.fail == step.action:
            self.fail = None
            self._refuse(step.action, 'injected failure')
        if step.action == lp.MIG_MODE:
            if self.vfs:
                self._refuse('nvmlDeviceSetMigMode', 'VFs are enabled')
            if self.gis:
                self._refuse('nvmlDeviceSetMigMode', 'GIs exist')
            if not self.pending:
                self.mig = step.on
        elif step.action == lp.ENABLE_VFS:
            self.vfs = step.count
            self.gis, self.gi_schedulers, self.mixed = {}, {}, False
        elif step.action == lp.DISABLE_VFS:
            self.vfs = 0
        elif step.action == lp.CREATE_GI:
            if not self.mig or not self._fits(step.profile_id):
                self._refuse('nvmlDeviceCreateGpuInstance', 'no room')
            self.gis[self._next] = step.profile_id
            self._next += 1
        elif step.action == lp.DESTROY_GI:
            del self.gis[step.gi_id]
        elif step.action == lp.MIXED_SIZE:
            if self.mig or self.vgpus:
                self._refuse('nvmlDeviceSetVgpuHeterogeneousMode', 'in use')
            self.mixed = step.on
        elif step.action == lp.SCHEDULER:
            if self.vgpus:
                self._refuse('nvmlDeviceSetVgpuSchedulerState_v2', 'VM runs')
            self.scheduler = step.scheduler
        elif step.action == lp.GI_SCHEDULER:
            for gi in self.gis:
                self.gi_schedulers[gi] = step.scheduler


def apply(gpu, lay, dry_run=False, holders=None, progress=None):
    return la.Applier(gpu, holders=holders, dry_run=dry_run,
                      progress=progress).run([(lay, ADDRESS)])


MIG = tl.layout_of()
MIG_SLICED = tl.layout_of(mode='mig-time-sliced', scheduler='equal-share')
MIXED = tl.layout_of(mode='mixed-size', gis=(), types=(1160, 1161),
                     scheduler='equal-share', time_slice=4)


def gi_profiles(gpu):
    return sorted(gpu.gis.values())


@pytest.mark.parametrize('lay', [MIG, MIG_SLICED, MIXED],
                         ids=['mig', 'mig-time-sliced', 'mixed-size'])
def test_apply_converges_and_a_second_apply_does_nothing(lay):
    gpu = Gpu()
    lines = []
    report = apply(gpu, lay, progress=lines.append)
    assert not report.failed and report.changed
    assert len(lines) == len(report.changed)       # a line per step
    assert gpu.mig == lay.mig and gpu.vfs == 20
    if lay.mig:
        assert gi_profiles(gpu) == [9, 19, 19, 19, 19]
    else:
        assert gpu.mixed is True and gpu.scheduler == layout.Scheduler(
            'equal-share', 4)
    gpu.calls = []
    again = apply(gpu, lay)
    assert gpu.calls == [] and again.changed == ()
    assert [r.status for r in again.results] == [la.OK]


def test_plan_changes_nothing():
    gpu = Gpu()
    report = apply(gpu, MIG, dry_run=True)
    assert gpu.calls == [] and gpu.mig is False
    assert {r.status for r in report.results} == {la.WOULD}
    assert [p.steps[0].action for p in report.plans] == [lp.MIG_MODE]


def full_plan():
    return [s.action for s in lp.plan(
        MIG_SLICED, tl.h100_facts(False), Gpu().state(
            ADDRESS, MIG_SLICED, None)).steps]


@pytest.mark.parametrize('index', range(len(full_plan())))
def test_a_failure_at_each_step_leaks_nothing_and_the_next_apply_goes_on(
        index):
    gpu = Gpu()
    steps = full_plan()
    # fail the index-th step (the same action may come earlier: let those
    # pass by failing on the right occurrence)
    done_before = steps[:index].count(steps[index])
    original = gpu.run
    seen = collections.Counter()

    def run(address, step, facts):
        if step.action == steps[index]:
            seen[step.action] += 1
            if seen[step.action] == done_before + 1:
                gpu.fail = step.action
        return original(address, step, facts)
    gpu.run = run
    report = apply(gpu, MIG_SLICED)
    failed = report.failed
    assert len(failed) == 1 and failed[0].action == steps[index]
    message = failed[0].detail
    assert 'injected failure' in message and '\n' not in message
    assert 'done: ' in message and 'left: ' in message
    if index + 1 < len(steps):
        assert 'left: nothing' not in message
    # nothing leaked: every GPU instance is one the layout asks for
    wanted = layout.wanted_gpu_instances(MIG_SLICED, tl.h100_facts())
    for profile_id, count in collections.Counter(gpu.gis.values()).items():
        assert count <= wanted[profile_id]
    gpu.run = original
    again = apply(gpu, MIG_SLICED)
    assert not again.failed
    assert gi_profiles(gpu) == [9, 19, 19, 19, 19]
    assert set(gpu.gi_schedulers.values()) == {layout.Scheduler(
        'equal-share')}
    gpu.calls = []
    assert apply(gpu, MIG_SLICED).changed == () and gpu.calls == []


def test_a_gpu_holding_a_vgpu_is_refused_naming_the_domain(tmp_path):
    store = state_mod.LeaseStore(tmp_path / 'state')
    with store.transaction() as txn:
        txn.add(objects.Uuid.parse('99999999-2222-3333-4444-555555555555'),
                DOMAIN, VF, objects.TypeId.parse('nvidia-1150'))
    gpu = Gpu(mig=True, vfs=20)
    gpu.vgpus = (VF,)
    report = apply(gpu, MIG, holders=la.lease_holders(
        store, names={DOMAIN: 'guest-a'}))
    assert gpu.calls == [] and gpu.gis == {}
    [refusal] = report.failed
    assert refusal.status == la.REFUSED
    assert 'guest-a (%s)' % DOMAIN in refusal.detail
    assert 'create-gi' in refusal.detail and '\n' not in refusal.detail


def test_a_domain_libvirt_does_not_name_is_named_by_its_uuid(tmp_path):
    store = state_mod.LeaseStore(tmp_path / 'state')
    with store.transaction() as txn:
        txn.add(objects.Uuid.parse('99999999-2222-3333-4444-555555555555'),
                DOMAIN, VF, objects.TypeId.parse('nvidia-1150'))
    assert la.lease_holders(store)(ADDRESS, (VF,)) == ['domain %s' % DOMAIN]


def test_a_vgpu_nobody_leased_is_named_by_its_vf(tmp_path):
    store = state_mod.LeaseStore(tmp_path / 'state')
    gpu = Gpu(mig=True, vfs=20)
    gpu.vgpus = (VF,)
    report = apply(gpu, MIG, holders=la.lease_holders(store))
    assert 'a vGPU on 0000:41:00.4 that libvirt-gpu did not lease' in \
        report.failed[0].detail


def test_a_gpu_holding_a_vgpu_at_its_layout_is_fine():
    gpu = Gpu()
    apply(gpu, MIG)
    gpu.vgpus = (VF,)
    report = apply(gpu, MIG)
    assert not report.failed


def test_a_layout_the_gpu_cannot_hold_is_refused_before_any_step():
    gpu = Gpu(mig=True, vfs=20)
    report = apply(gpu, tl.layout_of(gis=(('3g.40gb', 2), ('1g.10gb', 1))))
    assert gpu.calls == []
    assert report.failed[0].action == 'check'
    assert '9 memory slices' in report.failed[0].detail


def test_a_layout_of_the_other_mig_mode_is_checked_before_any_step():
    """The GPU reports its profiles and every type with MIG off (as the
    simulated driver does): the layout is refused before the first step,
    by ``plan`` as by ``apply``."""
    for dry_run in (True, False):
        gpu = Gpu()
        report = apply(gpu, tl.layout_of(types=(1150, 1160)),
                       dry_run=dry_run)
        assert gpu.calls == []
        assert [r.status for r in report.results] == [la.FAILED]
        assert 'nvidia-1160 is time-sliced' in report.failed[0].detail
    # a GI profile the GPU lacks: refused, no AttributeError
    for mig in (False, True):
        report = apply(Gpu(mig=mig), tl.layout_of(gis=(('5g.50gb', 1),)),
                       dry_run=True)
        assert [r.status for r in report.results] == [la.FAILED]
        assert 'the GPU has no GI profile 5g.50gb (it has: 1g.10gb,' in \
            report.failed[0].detail
    # also where the GPU cannot say yet (MIG-backed types hidden)
    gpu = Gpu()
    gpu.hides_mig_types = True
    report = apply(gpu, tl.layout_of(gis=(('5g.50gb', 1),)))
    assert gpu.calls == []
    assert 'the GPU reports no GI profile 5g.50gb' in report.failed[0].detail
    # and a time-sliced layout on a MIG GPU
    gpu = Gpu(mig=True, vfs=20)
    report = apply(gpu, tl.layout_of(mode='time-sliced', gis=(),
                                     types=(1150,)))
    assert gpu.calls == []
    assert 'nvidia-1150 is MIG-backed' in report.failed[0].detail


def test_the_layout_is_checked_again_once_mig_mode_is_on():
    gpu = Gpu()
    gpu.hides_mig_types = True
    bad = tl.layout_of(types=(1150, 1160))     # a time-sliced type
    report = apply(gpu, bad)
    # MIG was off and the GPU listed no MIG-backed type then: the type
    # check waited for MIG mode, then refused
    assert gpu.calls == [lp.MIG_MODE]
    assert [r.status for r in report.results] == [la.DONE, la.FAILED]
    assert report.failed[0].action == 'check'
    assert 'nvidia-1160 is time-sliced' in report.failed[0].detail
    assert 'done: turn MIG mode on; left: enable 20 VFs' in \
        report.failed[0].detail


def test_a_mig_mode_that_needs_a_reset_stops_the_run():
    gpu = Gpu()
    gpu.pending = True
    report = apply(gpu, MIG)
    assert gpu.calls == [lp.MIG_MODE]
    assert 'the GPU needs a reset' in report.failed[0].detail
    assert 'left: enable 20 VFs' in report.failed[0].detail


def test_mig_on_a_gpu_without_mig_is_refused():
    gpu = Gpu()
    gpu.mig = None
    report = apply(gpu, MIG)
    assert 'has no MIG mode' in report.failed[0].detail


def test_a_gpu_at_its_layout_lets_the_run_go_on():
    gpu = Gpu(mig=True, vfs=20)
    assert not apply(gpu, MIG).failed          # now at its layout
    other = objects.PciAddress.parse(tl.H100_B)
    report = la.Applier(gpu).run([(MIG, ADDRESS), (MIG, other)])
    assert [(r.status, r.address) for r in report.results] == [
        (la.OK, ADDRESS), (la.OK, other)]


def test_the_first_failed_gpu_stops_the_run():
    gpu = Gpu()
    gpu.fail = lp.MIG_MODE
    other = objects.PciAddress.parse(tl.H100_B)
    report = la.Applier(gpu).run([(MIG, ADDRESS), (MIG, other)])
    assert [p.address for p in report.plans] == [ADDRESS]


def test_targets_and_only():
    by_gpu = {ADDRESS: MIG}
    assert la.targets(by_gpu) == [(MIG, ADDRESS)]
    with pytest.raises(Exception, match='is in no layout'):
        la.targets(by_gpu, objects.PciAddress.parse(tl.L40S))


def test_the_report_for_people_and_scripts():
    gpu = Gpu()
    report = apply(gpu, MIXED, dry_run=True)
    document = report.to_json()
    assert document['gpus'][0]['gpu'] == tl.H100
    assert [s['action'] for s in document['gpus'][0]['steps']] == [
        lp.ENABLE_VFS, lp.MIXED_SIZE, lp.SCHEDULER]
    assert document['module_option'] == (
        'options nvidia NVreg_RegistryDwordsPerDevice="pci=0000:41:00.0;'
        'RmPVMRL=0x40001"')
    assert report.details()[1].strip() == document['module_option']


# --- what make mutation found ----------------------------------------------
#
# What ``layout plan``/``apply`` promises that test_layout_apply left
# open: each test here fails on a change ``make mutation`` made to
# host/layout_apply.py that the rest stayed green on
# (docs/dev/mutation.md).
#
# ``GpuDriver`` is reached as on a host: nvidia-ml-py's binding over the
# simulated driver (``[gpu]/nvml = simulated``) and the kernel double
# answering the ``sriov_numvfs`` writes of a static tree
# (tests/unit/host/test_layout_apply_inject.py builds its hosts the same
# way); each
# step is seen in what the driver holds afterwards.  The applier's own
# rules (the whole refusal and failure lines, the report's counts) run on
# test_layout_apply's stand-in GPU.

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
                DOMAIN, vf, objects.TypeId.parse('nvidia-1153'))
    assert _rows(host.apply(shorter, names={DOMAIN: 'guest-a'}))[0][
        2].startswith('layout e2e, GPU 0000:bd:00.0: not changed, it holds '
                      'vGPUs of guest-a (%s); ' % DOMAIN)
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
    gpu = Gpu(mig=True, vfs=20)
    gpu.vgpus = (VF, objects.PciAddress.parse('0000:41:00.5'))
    report = la.Applier(gpu).run([(MIG, ADDRESS)])
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
    nvml.NvmlError(call='nvmlDeviceSetMigMode', address=ADDRESS,
                   reason='busy'),
    OSError(16, 'Device or resource busy'),
    subprocess.TimeoutExpired('sriov-manage', 300),
])
def test_a_failed_step_says_what_was_done_and_what_is_left(error):
    gpu = Gpu()
    original = gpu.run

    def run(address, step, facts):
        if step.action == lp.ENABLE_VFS:
            raise error
        return original(address, step, facts)
    gpu.run = run
    report = la.Applier(gpu).run([(MIG, ADDRESS)])
    assert [r.status for r in report.results] == [la.DONE, la.FAILED]
    assert {r.address for r in report.results} == {ADDRESS}
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
    gpu = Gpu()
    with caplog.at_level('INFO', logger=la.__name__):
        la.Applier(gpu).run([(MIXED, ADDRESS)])
    assert [r.getMessage() for r in caplog.records
            if r.name == la.__name__] == [
        'layout one, GPU 0000:41:00.0: done enable-vfs: enable 20 VFs',
        'layout one, GPU 0000:41:00.0: done mixed-size: turn mixed-size '
        'mode on',
        'layout one, GPU 0000:41:00.0: done scheduler: set the vGPU '
        'scheduler to equal-share, 4 ms (now best-effort)']


def test_an_apply_goes_on_to_the_next_gpu_after_one_that_converged():
    gpu = Gpu()
    other = objects.PciAddress.parse(tl.H100_B)
    report = la.Applier(gpu).run([(MIXED, ADDRESS),
                                  (MIXED, other)])
    assert [p.address for p in report.plans] == [ADDRESS, other]
    assert [r.status for r in report.results] == [la.DONE] * 3 + [la.OK]


def test_an_apply_goes_on_past_a_gpu_at_its_layout():
    gpu = Gpu()
    la.Applier(gpu).run([(MIXED, ADDRESS)])
    other = objects.PciAddress.parse(tl.H100_B)
    report = la.Applier(gpu).run([(MIXED, ADDRESS),
                                  (MIXED, other)])
    assert [p.address for p in report.plans] == [ADDRESS, other]
    assert _rows(report) == [
        (la.OK, 'layout', 'the GPU is at its layout: nothing to do')] * 2


def test_an_apply_stops_at_a_gpu_its_layout_does_not_fit():
    gpu = Gpu()
    gpu.mig = None
    other = objects.PciAddress.parse(tl.H100_B)
    report = la.Applier(gpu).run([(MIG, ADDRESS), (MIG, other)])
    assert [p.address for p in report.plans] == [ADDRESS]


def test_an_apply_stops_at_a_mig_mode_that_needs_a_reset():
    gpu = Gpu()
    gpu.pending = True
    other = objects.PciAddress.parse(tl.H100_B)
    report = la.Applier(gpu).run([(MIG, ADDRESS), (MIG, other)])
    assert [p.address for p in report.plans] == [ADDRESS]


def test_the_last_step_failing_leaves_nothing():
    gpu = Gpu(mig=True, vfs=20)
    lay = tl.layout_of(gis=(('1g.10gb', 1),), types=(1150,))
    gpu.fail = lp.CREATE_GI
    report = la.Applier(gpu).run([(lay, ADDRESS)])
    assert report.results[-1].detail.endswith(
        'done: nothing; left: nothing (run `libvirt-gpu layout apply` again '
        'once the cause is fixed: it goes on from here)')


def test_a_mig_mode_set_but_not_current_is_one_line():
    gpu = Gpu()
    gpu.pending = True
    report = la.Applier(gpu).run([(MIG, ADDRESS)])
    assert {r.address for r in report.results} == {ADDRESS}
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
    gpu = Gpu(mig=True)
    report = la.Applier(gpu).run([(MIXED, ADDRESS)])
    assert not report.failed
    assert gpu.mig is False and gpu.mixed is True


def test_a_mig_layout_on_a_gpu_without_mig_is_one_line():
    gpu = Gpu()
    gpu.mig = None
    report = la.Applier(gpu).run([(MIG, ADDRESS)])
    assert _rows(report) == [(
        la.FAILED, 'check',
        'layout one, GPU 0000:41:00.0: mode mig needs MIG, and this GPU has '
        'no MIG mode; use mode time-sliced or mixed-size')]
    assert report.plans == (lp.GpuPlan('one', ADDRESS, ()),)
    # a mixed-size layout on that GPU is checked and applied
    assert not la.Applier(gpu).run([(MIXED, ADDRESS)]).failed


def test_the_layout_is_checked_when_mig_mode_is_as_it_wants():
    gpu = Gpu(mig=True, vfs=20)
    bad = tl.layout_of(types=(1150, 1160))
    report = la.Applier(gpu).run([(bad, ADDRESS)])
    assert gpu.calls == []
    assert report.results[0].action == 'check'
    assert 'nvidia-1160 is time-sliced' in report.results[0].detail


class _TwoGpus(Gpu):
    """The stand-in, its vGPUs on the first GPU only."""

    def state(self, address, lay, facts):
        found = super().state(address, lay, facts)
        if address != ADDRESS:
            found = records.replace(found, vgpus=())
        return found


def test_a_plan_goes_on_past_a_refused_gpu_an_apply_stops():
    gpu = _TwoGpus(mig=True, vfs=20)
    gpu.vgpus = (VF,)
    other = objects.PciAddress.parse(tl.H100_B)
    targets = [(MIG, ADDRESS), (MIG, other)]
    dry = la.Applier(gpu, dry_run=True).run(targets)
    assert [p.address for p in dry.plans] == [ADDRESS, other]
    assert [r.status for r in dry.results] == [la.REFUSED] + [la.WOULD] * 5
    applied = la.Applier(gpu).run(targets)
    assert [p.address for p in applied.plans] == [ADDRESS]
    assert gpu.calls == []


def test_the_module_option_covers_every_gpu_only_when_told():
    lay = tl.layout_of(mode='mixed-size', gis=(), types=(1160,),
                       scheduler='equal-share')
    gpu = Gpu()
    assert la.Applier(gpu, dry_run=True).run(
        [(lay, ADDRESS)], every_gpu=True).module_option == (
        'options nvidia NVreg_RegistryDwords="RmPVMRL=0x1"')
    assert la.Applier(gpu, dry_run=True).run(
        [(lay, ADDRESS)]).module_option == (
        'options nvidia NVreg_RegistryDwordsPerDevice="pci=0000:41:00.0;'
        'RmPVMRL=0x1"')
    assert la.Applier(gpu, dry_run=True).run(
        [(MIG, ADDRESS)], every_gpu=True).module_option is None


def test_the_report_for_scripts_and_people_whole():
    gpu = Gpu()
    lay = tl.layout_of(mode='mixed-size', gis=(), types=(1160,))
    report = la.Applier(gpu, dry_run=True).run([(lay, ADDRESS)])
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
    by_gpu = {c: MIXED, a: MIG, b: MIG_SLICED}
    assert la.targets(by_gpu) == [(MIG, a), (MIG_SLICED, b),
                                  (MIXED, c)]
    assert la.targets(by_gpu, b) == [(MIG_SLICED, b)]
    assert la.targets({}) == []


def test_a_refusal_names_the_leases_on_the_gpu_itself(tmp_path):
    """The holders are asked about the GPU and its VFs: a lease on the
    physical GPU is named too."""
    store = state_mod.LeaseStore(tmp_path / 'state')
    with store.transaction() as txn:
        txn.add(objects.Uuid.parse('99999999-2222-3333-4444-555555555555'),
                DOMAIN, ADDRESS, objects.TypeId.parse('nvidia-1150'))
    gpu = Gpu(mig=True, vfs=20)
    gpu.vgpus = (VF,)
    report = la.Applier(gpu, holders=la.lease_holders(store)).run(
        [(MIG, ADDRESS)])
    assert _rows(report)[0][2].startswith(
        'layout one, GPU 0000:41:00.0: not changed, it holds vGPUs of '
        'domain %s, a vGPU on 0000:41:00.4 that libvirt-gpu did not '
        'lease; ' % DOMAIN)


def test_lease_holders_by_name_else_uuid_sorted(tmp_path):
    store = state_mod.LeaseStore(tmp_path / 'state')
    vf2 = objects.PciAddress.parse('0000:41:00.5')
    vf3 = objects.PciAddress.parse('0000:41:00.6')
    elsewhere = objects.PciAddress.parse('0000:42:00.4')
    other = objects.Uuid.parse('00000000-2222-3333-4444-555555555555')
    vgpu = objects.TypeId.parse('nvidia-1150')
    with store.transaction() as txn:
        txn.add(objects.Uuid.parse('99999999-2222-3333-4444-555555555551'),
                DOMAIN, VF, vgpu)
        txn.add(objects.Uuid.parse('99999999-2222-3333-4444-555555555552'),
                other, vf2, vgpu)
        txn.add(objects.Uuid.parse('99999999-2222-3333-4444-555555555553'),
                objects.Uuid.parse('77777777-2222-3333-4444-555555555555'),
                elsewhere, vgpu)
    holders = la.lease_holders(store, names={DOMAIN: 'guest-a'})
    assert holders(ADDRESS, (VF, vf2, vf3)) == [
        'domain %s' % other, 'guest-a (%s)' % DOMAIN,
        'a vGPU on 0000:41:00.6 that libvirt-gpu did not lease']
    assert la.lease_holders(store)(ADDRESS, (vf2,)) == [
        'domain %s' % other]
