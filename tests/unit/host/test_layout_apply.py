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
from tests.unit.devices import test_layout as tl

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
