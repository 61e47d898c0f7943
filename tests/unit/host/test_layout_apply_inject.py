"""A failure injected at each step of ``layout apply`` leaves no leak, and
the next ``apply`` converges (issue 28's acceptance), on the simulated
hosts the layouts are for: A100 40GB and H100 80GB (MIG-backed), L40S
(mixed sizes), RTX PRO 6000 Blackwell (MIG, time-sliced inside GPU
instances).

The product is reached as on a host: its NVML is nvidia-ml-py's own
binding over the simulated driver (``[gpu]/nvml = simulated``), its
``sriov_numvfs`` writes are answered by the simulated kernel (the kernel
double over the same static tree).  A failure is injected into the
simulated driver (``simulator.nvml.inject``: the nth call of an NVML C
function, or the nth ``sriov_numvfs`` write, fails once), then:

1. ``apply`` stops at the step that made the call, with one line that
   says which step failed, why, what was done and what is left;
2. nothing leaked: no vGPU, no GPU instance without its compute instance
   that the next apply keeps, and the next plan is exactly the failed
   step and those the report said were left (a change the product made
   and cannot see, such as a GPU instance it counts as made but that has
   no compute instance, makes the next plan differ);
3. the fault struck once; the next ``apply`` runs those steps and the
   GPU ends as a failure-free apply leaves it (the simulated driver's
   whole state: MIG mode, GPU instances where they sit with their
   compute instances, mixed-size mode, schedulers); a further ``apply``
   has nothing to do.

The first tests show the injection itself (simulator/kernel.py,
simulator/nvml.py): the nth call fails once and changes nothing, a call
counts once however many questions it asks the driver, the fault is the
host's (every process on a static tree, a live tree's channel), and a
point that does not exist is refused.
"""

import collections
import errno
import os

import pynvml
import pytest

from libvirt_gpu import exception
from libvirt_gpu import simulator
from libvirt_gpu.host import layout_apply
from libvirt_gpu.devices.backends.nvidia_vgpu import names as vendor_names
from libvirt_gpu.devices import layout_plan as lp
from libvirt_gpu.simulator import kernel as kernel_mod
from libvirt_gpu.simulator import live
from libvirt_gpu.simulator import nvml as sim_nvml
from tests.doubles import kernel_sysfs
from tests.doubles import live_channel
from tests.doubles.layout_hosts import A100
from tests.doubles.layout_hosts import H100
from tests.doubles.layout_hosts import Host
from tests.doubles.layout_hosts import L40S
from tests.doubles.layout_hosts import RTX

MIG_CASES = (A100, H100, RTX)

Fault = collections.namedtuple('Fault', ['case', 'action', 'point', 'nth',
                                         'said', 'shrink'])
"""``point`` fails at its ``nth`` call, in the step ``action``; the
failure's line says ``said``; ``shrink``: the GPU is at ``case.layout``
first and goes to ``case.smaller`` (GPU instances destroyed)."""


def _faults():
    found = []
    for case in MIG_CASES:
        found += [
            # from boot: VFs enabled, MIG off
            Fault(case, lp.DISABLE_VFS, 'sriov_numvfs', 1, 'sriov_numvfs',
                  False),
            Fault(case, lp.MIG_MODE, 'nvmlDeviceSetMigMode', 1,
                  'NVML nvmlDeviceSetMigMode', False),
            Fault(case, lp.ENABLE_VFS, 'sriov_numvfs', 2, 'sriov_numvfs',
                  False),
            # the second GPU instance: the first is made and kept
            Fault(case, lp.CREATE_GI,
                  'nvmlDeviceCreateGpuInstanceWithPlacement', 2,
                  'NVML nvmlDeviceCreateGpuInstanceWithPlacement', False),
            # its compute instance: the GPU instance must go again
            Fault(case, lp.CREATE_GI,
                  'nvmlGpuInstanceCreateComputeInstance', 2,
                  'NVML nvmlGpuInstanceCreateComputeInstance', False),
            # a layout with a GPU instance less
            Fault(case, lp.DESTROY_GI, 'nvmlGpuInstanceDestroy', 1,
                  'NVML nvmlGpuInstanceDestroy', True),
        ]
    found += [
        # the other calls of those steps, on one GPU: the GPU instance
        # made but its id not read back; its compute instance not
        # destroyed
        Fault(H100, lp.CREATE_GI, 'nvmlGpuInstanceGetInfo', 2,
              'NVML nvmlGpuInstanceGetInfo', False),
        Fault(H100, lp.DESTROY_GI, 'nvmlComputeInstanceDestroy', 1,
              'NVML nvmlComputeInstanceDestroy', True),
        # the second GPU instance's scheduler: the first one's is set
        Fault(RTX, lp.GI_SCHEDULER, 'nvmlGpuInstanceSetVgpuSchedulerState_v2',
              2, 'NVML nvmlGpuInstanceSetVgpuSchedulerState', False),
        Fault(L40S, lp.MIXED_SIZE, 'nvmlDeviceSetVgpuHeterogeneousMode', 1,
              'NVML nvmlDeviceSetVgpuHeterogeneousMode', False),
        Fault(L40S, lp.SCHEDULER, 'nvmlDeviceSetVgpuSchedulerState_v2', 1,
              'NVML nvmlDeviceSetVgpuSchedulerState', False),
    ]
    return found


FAULTS = _faults()


def _fault_id(fault):
    return '%s-%s-%s%s' % (fault.case.profile, fault.action, fault.point,
                           '-shrink' if fault.shrink else '')


def _steps(steps):
    return [(s.action, s.detail) for s in steps]


def _names(steps):
    return '; '.join(s.detail for s in steps) or 'nothing'


Reference = collections.namedtuple('Reference', ['state', 'actions'])


@pytest.fixture(scope='module')
def references(tmp_path_factory):
    """``f(case, shrink)``: a ``Reference``: the simulated driver's state
    of the case's GPU after its layout (then, with ``shrink``, the smaller
    one) is applied without a failure on a fresh host, and the step
    kinds that apply ran (of the smaller layout: only the last apply)."""
    found = {}

    def reference(case, shrink):
        if (case, shrink) not in found:
            host = Host(tmp_path_factory.mktemp('reference'), case)
            for lines in (case.layout, case.smaller if shrink else None):
                if lines is not None:
                    report = host.apply(lines)
                    assert not report.failed, report.failed
            found[(case, shrink)] = Reference(
                host.driver()[0], {r.action for r in report.changed})
        return found[(case, shrink)]
    return reference


# --- the injection itself ----------------------------------------------------

H100_PF = '0000:4e:00.0'


def _lib(kernel=None, root=None):
    lib = sim_nvml.module(kernel=kernel, sysfs_root=root)
    lib.nvmlInit()
    return lib, lib.nvmlDeviceGetHandleByIndex(0)


def test_the_nth_call_fails_once_and_changes_nothing():
    kernel = kernel_mod.SimKernel('h100-80gb')
    kernel.set_numvfs(H100_PF, '0')
    lib, handle = _lib(kernel=kernel)
    sim_nvml.inject('nvmlDeviceGetMigMode', 2, kernel=kernel)
    sim_nvml.inject('nvmlDeviceSetMigMode', 1,
                    pynvml.NVML_ERROR_GPU_IS_LOST, kernel=kernel)
    assert sim_nvml.faults(kernel=kernel) == {
        'nvmlDeviceGetMigMode': [2, pynvml.NVML_ERROR_UNKNOWN],
        'nvmlDeviceSetMigMode': [1, pynvml.NVML_ERROR_GPU_IS_LOST]}
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        lib.nvmlDeviceSetMigMode(handle, 1)
    assert lib.nvmlDeviceGetMigMode(handle) == [0, 0]    # 1st: answered
    with pytest.raises(pynvml.NVMLError_Unknown):        # 2nd: fails
        lib.nvmlDeviceGetMigMode(handle)
    assert sim_nvml.faults(kernel=kernel) == {}
    lib.nvmlDeviceSetMigMode(handle, 1)                  # once only
    assert lib.nvmlDeviceGetMigMode(handle) == [1, 1]


def test_a_call_counts_once_however_many_questions_it_asks():
    kernel = kernel_mod.SimKernel('h100-80gb')
    lib, handle = _lib(kernel=kernel)
    # nvmlDeviceGetMemoryInfo asks the driver about the device twice
    sim_nvml.inject('nvmlDeviceGetMemoryInfo', 2, kernel=kernel)
    lib.nvmlDeviceGetMemoryInfo(handle)
    assert sim_nvml.faults(kernel=kernel) == {
        'nvmlDeviceGetMemoryInfo': [1, pynvml.NVML_ERROR_UNKNOWN]}
    with pytest.raises(pynvml.NVMLError_Unknown):
        lib.nvmlDeviceGetMemoryInfo(handle)


def test_a_fault_can_be_disarmed():
    kernel = kernel_mod.SimKernel('h100-80gb')
    lib, handle = _lib(kernel=kernel)
    sim_nvml.inject('nvmlDeviceGetMigMode', 1, kernel=kernel)
    sim_nvml.inject('nvmlDeviceGetMigMode', 0, kernel=kernel)
    assert sim_nvml.faults(kernel=kernel) == {}
    assert lib.nvmlDeviceGetMigMode(handle) == [0, 0]


def test_a_sysfs_write_fails_with_its_errno_and_changes_nothing(tmp_path):
    root = str(tmp_path / 'sys')
    simulator.write_sysfs(simulator.load_profile('h100-80gb'), root)
    tree = kernel_sysfs.KernelSysfs(root, 'h100-80gb')
    numvfs = os.path.join(root, 'bus/pci/devices', H100_PF, 'sriov_numvfs')
    sim_nvml.inject('sriov_numvfs', 1, sysfs_root=root)
    sim_nvml.inject(vendor_names.CURRENT_TYPE, 1, errno.EBUSY,
                    sysfs_root=root)
    with pytest.raises(exception.SysfsWriteError):
        tree.write(numvfs, '0')
    assert tree.writes[-1].errno == errno.EIO
    assert tree.kernel.state().numvfs == ((H100_PF, 32),)
    tree.write(numvfs, '0')
    assert tree.kernel.state().numvfs == ((H100_PF, 0),)
    assert sim_nvml.faults(sysfs_root=root) == {
        vendor_names.CURRENT_TYPE: [1, errno.EBUSY]}


def test_a_static_tree_s_fault_strikes_whichever_process_calls(tmp_path):
    """Each ``module(sysfs_root=...)`` reads the host from the tree as
    another process does: the fault and its count are the tree's."""
    root = str(tmp_path / 'sys')
    simulator.write_sysfs(simulator.load_profile('h100-80gb'), root)
    sim_nvml.inject('nvmlDeviceGetMigMode', 2, sysfs_root=root)
    first, handle = _lib(root=root)
    assert first.nvmlDeviceGetMigMode(handle) == [0, 0]
    second, handle = _lib(root=root)
    with pytest.raises(pynvml.NVMLError_Unknown):
        second.nvmlDeviceGetMigMode(handle)
    assert first.nvmlDeviceGetMigMode(
        first.nvmlDeviceGetHandleByIndex(0)) == [0, 0]


def test_a_live_tree_takes_faults_through_its_channel(tmp_path):
    tree = live.LiveTree('h100-80gb', uevents=False, workdir=str(tmp_path),
                         probe_delay=0)
    try:
        channel = live_channel.TreeChannel(tree)
        channel.call('inject', 'nvmlDeviceSetMigMode', 1, None)
        channel.call('inject', 'sriov_numvfs', 1, None)
        assert tree.state()['driver']['faults'] == {
            'nvmlDeviceSetMigMode': [1, pynvml.NVML_ERROR_UNKNOWN],
            'sriov_numvfs': [1, errno.EIO]}
        lib = sim_nvml.module(backend=channel)
        lib.nvmlInit()
        with pytest.raises(pynvml.NVMLError_Unknown):
            lib.nvmlDeviceSetMigMode(lib.nvmlDeviceGetHandleByIndex(0), 1)
        with pytest.raises(OSError) as raised:
            tree.write('/%s/sriov_numvfs' % tree.dirs[H100_PF], b'0')
        assert raised.value.errno == errno.EIO
        assert channel.call('faults') == {}
        assert 'faults' not in tree.state()['driver']
    finally:
        tree.close()


@pytest.mark.parametrize('point, nth, error', [
    ('nvmlNoSuchFunction', 1, None),
    ('nvmlShutdown', 1, None),            # asks the driver nothing
    ('sriov_totalvfs', 1, None),          # not a write the kernel answers
    ('nvmlDeviceSetMigMode', -1, None),
    ('nvmlDeviceSetMigMode', 1, 'EIO'),
])
def test_a_fault_that_cannot_strike_is_refused(point, nth, error):
    kernel = kernel_mod.SimKernel('h100-80gb')
    with pytest.raises(exception.SimulatorError):
        sim_nvml.inject(point, nth, error, kernel=kernel)
    assert kernel.faults() == {}


# --- a failure at each step of `layout apply` -------------------------------

@pytest.mark.parametrize('fault', FAULTS, ids=_fault_id)
def test_a_failure_at_each_step_leaks_nothing_and_the_next_apply_converges(
        tmp_path, fault, references):
    case = fault.case
    host = Host(tmp_path, case)
    lines = case.layout
    if fault.shrink:
        assert not host.apply().failed
        lines = case.smaller
    sim_nvml.inject(fault.point, fault.nth, sysfs_root=host.root)

    report = host.apply(lines)
    # 1. it stopped at the step that made the call, saying so in a line
    (plan,) = report.plans
    done = [r for r in report.results if r.status == layout_apply.DONE]
    at = len(done)
    assert [r.action for r in done] == [s.action for s in plan.steps[:at]]
    (failed,) = report.failed
    assert (failed.status, failed.action) == (layout_apply.FAILED,
                                              fault.action)
    assert plan.steps[at].action == fault.action
    assert failed.detail.count('\n') == 0
    assert failed.detail.startswith('layout e2e, GPU %s: %s failed: ' % (
        case.gpu, plan.steps[at].detail)), failed.detail
    assert fault.said in failed.detail, failed.detail
    assert failed.detail.endswith('; done: %s; left: %s (run `libvirt-gpu '
                                  'layout apply` again once the cause is '
                                  'fixed: it goes on from here)' % (
                                      _names(plan.steps[:at]),
                                      _names(plan.steps[at + 1:])))
    assert sim_nvml.faults(sysfs_root=host.root) == {}     # it struck

    # 2. nothing leaked: the next apply has exactly what the report
    # said was left to do, and no GPU instance without its compute
    # instance stays
    gpu, placed = host.driver()
    assert placed == {}
    again = host.apply(lines)
    assert _steps(again.plans[0].steps) == _steps(plan.steps[at:])
    destroyed = {s.gi_id for s in again.plans[0].steps
                 if s.action == lp.DESTROY_GI}
    half_made = [gi[0] for gi in gpu['gis'] if gi[4] is None]
    assert set(half_made) <= destroyed, (
        'GPU instances without their compute instance that the next apply '
        'keeps: %s' % half_made)

    # 3. the next apply converged, as a failure-free one does
    assert not again.failed, again.failed
    assert len(again.changed) == len(plan.steps) - at
    assert host.driver()[0] == references(case, fault.shrink).state
    assert host.apply(lines).plans[0].converged


def test_every_step_kind_of_each_host_s_apply_is_failed(references):
    """The faults above fail each kind of step that the failure-free
    applies of the four hosts run (and of the layouts with a GPU instance
    less), and together every kind of step there is."""
    ran = set()
    for case in MIG_CASES + (L40S,):
        for shrink in (False, True) if case.smaller else (False,):
            ran |= {(case.profile, action)
                    for action in references(case, shrink).actions}
    assert {(f.case.profile, f.action) for f in FAULTS} == ran
    assert {action for _, action in ran} == set(lp.ACTIONS)


def test_a_gpu_instance_left_without_its_compute_instance_is_made_again(
        references, tmp_path):
    """Two failures at once: the compute instance of the second GPU
    instance cannot be made, and neither can that GPU instance be
    destroyed again.  It stays without a compute instance (no vGPU can
    live in it); the next apply sees that, destroys it and makes it
    again, and ends as a failure-free apply does."""
    host = Host(tmp_path, H100)
    sim_nvml.inject('nvmlGpuInstanceCreateComputeInstance', 2,
                    sysfs_root=host.root)
    sim_nvml.inject('nvmlGpuInstanceDestroy', 1, sysfs_root=host.root)
    report = host.apply()
    (failed,) = report.failed
    # the first failure is said, then the one of the undoing
    assert ': NVML nvmlGpuInstanceCreateComputeInstance on GPU %s: ' % (
        H100.gpu) in failed.detail, failed.detail
    assert 'destroying the GPU instance again failed too' in failed.detail
    assert failed.detail.count('\n') == 0
    gpu, _ = host.driver()
    half_made = [gi[0] for gi in gpu['gis'] if gi[4] is None]
    assert len(half_made) == 1
    again = host.apply()
    destroys = [s for s in again.plans[0].steps
                if s.action == lp.DESTROY_GI]
    assert [s.gi_id for s in destroys] == half_made
    assert 'has no compute instance' in destroys[0].detail
    assert not again.failed, again.failed
    assert host.driver()[0] == references(H100, False).state
    assert host.apply().plans[0].converged


def test_restore_applies_a_layout_then_finds_it_in_place(tmp_path):
    """``restore`` brings the layouts back first: each step said as
    restore's own actions (would / applied / ok), per GPU."""
    from libvirt_gpu.host import restore as restore_mod
    host = Host(tmp_path, L40S)
    env = host.env(L40S.layout)

    def layout_notes(**kwargs):
        report = restore_mod.restore(env, settle_timeout=0, **kwargs)
        return [(a.action, a.target) for a in report.actions
                if a.what == 'layout']

    would = layout_notes(dry_run=True)
    assert would and set(would) == {(restore_mod.WOULD, L40S.gpu)}
    done = layout_notes()
    assert set(done) == {(restore_mod.APPLIED, L40S.gpu)}
    assert len(done) == len(would)
    assert set(layout_notes()) == {(restore_mod.OK, L40S.gpu)}
