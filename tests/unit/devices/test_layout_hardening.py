"""Issue 39's layout findings, on the simulated hosts the layouts are for
(``layout_hosts.Host``: a static tree, the kernel double answering
its sysfs writes, ``[gpu]/nvml = simulated`` over the same tree):

- every check that can be made before the first step is made by ``plan``
  and by ``apply`` before its first step (a MIG layout whose type the GPU
  can never offer; a GI profile the GPU lacks while MIG mode must still
  change);
- every ``time_slice_ms`` the option takes is one the driver takes, and
  reads back as itself;
- a plain simulated tree (no kernel answers its writes) says that it
  cannot change its VFs and names ``simulate --live``;
- two appliers of one host (an operator's ``layout apply`` and
  ``restore``'s) never interleave: the second waits for the layouts lock,
  boundedly, and says who holds it.
"""

import os
import threading

import pytest

from libvirt_gpu import conf as conf_mod
from libvirt_gpu import environment
from libvirt_gpu.devices import layout
from libvirt_gpu.host import layout_apply
from libvirt_gpu.devices import layout_plan as lp
from libvirt_gpu import objects
from tests.doubles import layouts
from tests.doubles import layout_hosts

H100 = layout_hosts.H100
L40S = layout_hosts.L40S


def _failed_check(report):
    assert [r.status for r in report.results] == [layout_apply.FAILED]
    assert report.failed[0].action == 'check'
    return report.failed[0].detail


# --- checks before the first step --------------------------------------------

@pytest.mark.parametrize('lines, said', [
    # a time-sliced type in a MIG layout: never offered with MIG on
    (('mode = mig', 'gpu_instances = 1g.10gb:2', 'vgpu_types = nvidia-1300'),
     '[layout_e2e]/vgpu_types: nvidia-1300 is time-sliced, and with MIG on '
     'the GPU offers only MIG-backed types'),
    # a type the GPU does not support at all
    (('mode = mig', 'gpu_instances = 1g.10gb:2', 'vgpu_types = nvidia-9999'),
     '[layout_e2e]/vgpu_types: the GPU does not support nvidia-9999'),
    # a type whose GI profile the layout makes none of
    (('mode = mig', 'gpu_instances = 1g.10gb:2', 'vgpu_types = nvidia-1311'),
     'nvidia-1311 lives in 2g.20gb GPU instances, and '
     '[layout_e2e]/gpu_instances makes none'),
    # a GI profile the GPU lacks (was: AttributeError 'NoneType' ... 'id')
    (('mode = mig', 'gpu_instances = 5g.50gb:1', 'vgpu_types = nvidia-1308'),
     '[layout_e2e]/gpu_instances: the GPU has no GI profile 5g.50gb (it '
     'has: 1g.10gb, 2g.20gb,'),
    # more than the GPU's slices
    (('mode = mig', 'gpu_instances = 3g.40gb:2, 2g.20gb:1',
      'vgpu_types = nvidia-1312'),
     'needs 8 compute slices'),
])
def test_plan_and_apply_refuse_before_the_first_step_what_mig_on_refuses(
        tmp_path, lines, said):
    """The H100 as it boots: MIG off, its VFs enabled.  ``plan`` says the
    layout fails (it used to say "0 failed"); ``apply`` refuses before
    its first step (it used to disable every VF and turn MIG on first)."""
    host = layout_hosts.Host(tmp_path, H100)
    before = host.driver()
    env = host.env(lines)
    for dry_run in (True, False):
        report = layouts.converge(env, dry_run=dry_run,
                                  settle_timeout=5.0)
        detail = _failed_check(report)
        assert said in detail and '\n' not in detail
        assert detail.startswith('layout e2e, GPU %s: ' % H100.gpu)
        assert host.driver() == before
        assert env.sysfs.sriov_numvfs(
            objects.PciAddress.parse(H100.gpu)) == 32


def test_a_time_sliced_layout_on_a_mig_gpu_is_refused_before_mig_goes_off(
        tmp_path):
    host = layout_hosts.Host(tmp_path, H100)
    assert not layouts.converge(
        host.env(('mode = mig', 'gpu_instances = 1g.10gb:1',
                  'vgpu_types = nvidia-1308')), settle_timeout=5.0).failed
    before = host.driver()
    report = layouts.converge(
        host.env(('mode = time-sliced', 'vgpu_types = nvidia-1308')),
        settle_timeout=5.0)
    assert 'nvidia-1308 is MIG-backed; mode time-sliced offers ' \
        'time-sliced types' in _failed_check(report)
    assert host.driver() == before


def test_the_cli_plan_of_a_layout_the_gpu_can_never_offer_exits_1(
        tmp_path, capsys):
    from libvirt_gpu.cmd import main as cli
    host = layout_hosts.Host(tmp_path, H100)
    lines = ('mode = mig', 'gpu_instances = 1g.10gb:2',
             'vgpu_types = nvidia-1300')
    host.env(lines)
    config = os.path.join(host.path, 'c0.conf')
    code = cli.main(['--config-file', config, 'layout', 'plan'])
    out, err = capsys.readouterr()
    assert code == 1, out
    assert '0 to do, 1 failed or refused' in out
    assert 'nvidia-1300 is time-sliced' in out


# --- the scheduler's time slice ----------------------------------------------

def test_every_time_slice_the_option_takes_the_driver_takes_and_reads_back(
        tmp_path):
    """1 to 30 ms (``layout.TIME_SLICE_MS``, the option's range), each
    set through the product's NVML session on the simulated L40S and
    read back as itself (30 ms was sent as 33 per second, which the
    simulated driver refused: outside its 34..1000)."""
    host = layout_hosts.Host(tmp_path, L40S)
    env = host.env(L40S.layout)
    address = objects.PciAddress.parse(L40S.gpu)
    low, high = layout.TIME_SLICE_MS
    assert (low, high) == (1, 30)
    with env.nvml.session() as session:
        for ms in range(low, high + 1):
            for policy in (layout.EQUAL_SHARE, layout.FIXED_SHARE):
                wanted = layout.Scheduler(policy, ms)
                session.set_scheduler(address, wanted)
                assert session.scheduler(address) == wanted


@pytest.mark.parametrize('ms', [1, 30])
def test_apply_of_a_time_slice_at_each_end_converges(tmp_path, ms):
    host = layout_hosts.Host(tmp_path, L40S)
    lines = tuple(line if not line.startswith('time_slice_ms') else
                  'time_slice_ms = %d' % ms for line in L40S.layout)
    report = layouts.converge(host.env(lines), settle_timeout=5.0)
    assert not report.failed, report.failed
    assert lp.SCHEDULER in {r.action for r in report.changed}
    again = layouts.converge(host.env(lines), dry_run=True)
    assert [p.converged for p in again.plans] == [True]


# --- a plain simulated tree --------------------------------------------------

def test_a_plain_tree_says_it_cannot_change_its_vfs(tmp_path):
    """``simulate h100-80gb DIR`` writes files only: nothing answers its
    ``sriov_numvfs`` write, so its VFs stay.  The step says so and points
    at ``simulate --live`` (it used to go on and fail at MIG mode with
    NVML's "In use by another client")."""
    host = layout_hosts.Host(tmp_path, H100)
    name = os.path.join(host.path, 'plain.conf')
    with open(name, 'w') as f:
        f.write('[DEFAULT]\nsysfs_root = %s\nstate_dir = %s\n'
                '[gpu]\nnvml = simulated\nlayouts = e2e\n'
                '[layout_e2e]\ngpus = %s\n%s\n' % (
                    host.root, os.path.join(host.path, 'state'), H100.gpu,
                    '\n'.join(H100.layout)))
    conf = conf_mod.load(name)
    env = environment.Environment.from_conf(conf)     # the plain Sysfs
    report = layouts.converge(env, settle_timeout=0)
    assert [r.action for r in report.results] == [lp.DISABLE_VFS]
    detail = report.failed[0].detail
    assert 'disable the 32 VFs' in detail
    assert 'disable the 32 VFs (the driver changes MIG mode only without ' \
        'VFs) failed: cannot write 0000:4e:00.0: VFs disabled, but its 32 ' \
        'VFs are still there: nothing answered the write (a tree written ' \
        'by `libvirt-gpu simulate PROFILE DIR` is plain files and cannot ' \
        'change its VFs; serve it with `libvirt-gpu simulate --live ' \
        'PROFILE DIR` instead); done: nothing; left: turn MIG mode on' \
        in detail
    assert 'In use by another client' not in detail


# --- one applier at a time ---------------------------------------------------

def test_a_second_applier_waits_for_the_first_and_never_interleaves(
        tmp_path):
    """Two appliers of one host, each its own Environment (as an
    operator's ``layout apply`` and ``restore`` are): the first is held
    inside its run, after its first step, while the second tries.  The
    second is refused naming the lock's holder, without a step of its own
    (without the lock it ran its own plan beside the first's); once the
    first is done, it finds the GPU at its layout."""
    host = layout_hosts.Host(tmp_path, H100)
    first_env = host.env(H100.layout)
    second_env = host.env(H100.layout + ('',))      # its own Environment
    inside = threading.Event()
    go_on = threading.Event()
    found = {}

    def progress(result):
        if not inside.is_set():
            inside.set()
            assert go_on.wait(60)

    def first():
        found['first'] = layouts.converge(
            first_env, progress=progress, settle_timeout=5.0)

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert inside.wait(60)
        steps_then = host.driver()
        with pytest.raises(layout_apply.LayoutsLocked) as refused:
            layouts.converge(second_env, settle_timeout=5.0,
                             lock_timeout=0)
        assert host.driver() == steps_then      # the second did nothing
    finally:
        go_on.set()
        thread.join(60)
    message = str(refused.value)
    assert message.startswith('another `libvirt-gpu layout apply` or '
                              '`restore` is changing the GPUs of this '
                              'host: still locked after 0 s by process %d'
                              % os.getpid())
    assert message.endswith('run this again once it has ended')
    assert not found['first'].failed, found['first'].failed
    report = layouts.converge(second_env, settle_timeout=5.0,
                              lock_timeout=0)
    assert [r.status for r in report.results] == [layout_apply.OK]


# --- drift shrinks what Placement is offered ---------------------------------

def _l40s_totals(host, setting):
    from libvirt_gpu.devices import discovery
    from libvirt_gpu.openstack.placement import model
    from tests.doubles import kinds
    from tests.doubles import mig_host as mc
    env = mc._Env(host, {mc.L40S: setting})
    gpus = discovery.from_sysfs(host.sysfs, kinds=kinds.registered()).gpus
    found = model.build_tree('compute-1', gpus, env.enabled,
                             rooms=env.vgpus.rooms(env.enabled))
    return {p.name: [(i.resource_class, i.total) for i in p.inventories]
            for p in found.children
            if model.gpu_provider_address('compute-1', p.name) == mc.L40S}


def test_mixed_size_turned_off_by_hand_offers_one_size_only(tmp_path):
    """The L40S laid out ``nvidia-1153:3, nvidia-1145:1``: at its layout
    (mixed-size on) each type its own total; mixed-size mode then turned
    off by hand (the driver takes vGPUs of one type at a time): Placement
    is offered the first type only (it was offered 3 + 1 of two sizes),
    or the type of the vGPU the GPU holds; the layout applied again
    offers both again."""
    from tests.doubles import mig_host as mc
    host = mc.Host(str(tmp_path / 'sys'), 'l40s', str(tmp_path / 'state'))
    setting = objects.EnabledType(
        mc.L40S_12Q, max_instances=3, others=(objects.EnabledType(
            mc.L40S_1B, resource_class='CUSTOM_L40S_1B',
            max_instances=1),))
    both = {'compute-1_0000:bd:00.0': [('VGPU', 3)],
            'compute-1_0000:bd:00.0_nvidia-1145': [('CUSTOM_L40S_1B', 1)]}
    host.mixed(mc.L40S)
    assert _l40s_totals(host, setting) == both
    with host.nvml.session() as session:
        session.set_mixed_size(mc.L40S, False)         # by hand
    host.refresh(mc.L40S)
    assert _l40s_totals(host, setting) == {
        'compute-1_0000:bd:00.0': [('VGPU', 3)]}
    # a vGPU of the second type made meanwhile: that type only
    made, _ = host.fill(mc.L40S, mc.L40S_1B)
    assert made >= 1
    totals = _l40s_totals(host, setting)
    assert list(totals) == ['compute-1_0000:bd:00.0_nvidia-1145']
    assert totals['compute-1_0000:bd:00.0_nvidia-1145'][0][0] == \
        'CUSTOM_L40S_1B'
    # the layout applied again (the vGPU gone first): both again
    for vf in host.sysfs.virtfns(mc.L40S):
        if host.backend.files.current_type(vf):
            host.backend.files.set_current_type(vf, 0)
    host.mixed(mc.L40S)
    assert _l40s_totals(host, setting) == both


def test_two_applier_processes_never_interleave(tmp_path):
    """Two ``libvirt-gpu layout apply`` processes on one simulated H100
    (a static tree; NVML over the simulated driver): the first is held
    inside its first step (its sriov-manage script waits on a FIFO); the
    second, started then, is refused in one line naming the first's
    process and runs no step: its script never runs."""
    import subprocess
    import sys
    from tests.doubles import poll
    host = layout_hosts.Host(tmp_path, H100)
    host.env(H100.layout)
    config = os.path.join(host.path, 'c0.conf')
    calls = tmp_path / 'calls'
    go = tmp_path / 'go'
    os.mkfifo(str(go))
    script = tmp_path / 'sriov-manage'
    script.write_text('#!/bin/sh\necho "$PPID $*" >> %s\nread x < %s\n'
                      % (calls, go))
    script.chmod(0o755)
    argv = [sys.executable, '-m', 'libvirt_gpu.cmd.main', '--config-file',
            config, 'layout', 'apply', '--sriov-manage', str(script)]
    first = subprocess.Popen(argv, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    try:
        assert poll.wait_for(calls.exists, timeout=60)
        second = subprocess.run(argv + ['--wait', '0'], capture_output=True,
                                text=True, timeout=120)
    finally:
        with open(str(go), 'w') as f:      # the first goes on
            f.write('\n')
        first.communicate(timeout=120)
    assert second.returncode == 1
    assert second.stdout == ''
    assert second.stderr.count('\n') == 1, second.stderr
    assert second.stderr.startswith(
        'libvirt-gpu: error: another `libvirt-gpu layout apply` or '
        '`restore` is changing the GPUs of this host: still locked after '
        '0 s by process %d (' % first.pid), second.stderr
    assert calls.read_text() == '%d -d %s\n' % (first.pid, H100.gpu)
