"""GPU layouts end to end (issue 28's acceptance), on each of the four
simulated hosts of the GPUs that have layouts: A100 40GB and H100 80GB
(MIG-backed), L40S (mixed sizes), RTX PRO 6000 Blackwell (MIG with
``+gfx`` GPU instances, time-sliced inside them).

One live host per profile (module scope: a FUSE tree served by the
simulated kernel and driver, ``[gpu]/nvml = simulated`` so that the CLI
and the hook reach the same NVML, and a real libvirtd that sees the tree
as its /sys).  The tests of a host run in order and build on each other:

1. ``layout plan``, ``layout apply`` and a second ``apply`` (no steps)
   through the CLI with ``--json``; the simulated driver then has the
   layout's MIG mode, GPU instances or mixed-size mode; ``placement show
   --json`` offers of each of the layout's types on that GPU exactly what
   the simulated driver says it can make.
2. Guests get vGPUs of the layout's type through our installed hook,
   run as libvirt runs it (its argv, the domain XML on stdin, libvirt's
   clean environment): this host has no VFIO, so a guest started by
   libvirtd is refused after ``prepare`` and its vGPU released; the
   guests that must keep theirs are prepared by running the hook file
   itself.  Up to the capacity the simulated driver allows (checked
   against where it put each one: which GPU instance, which placement),
   and the next guest, started by libvirtd, is refused by the hook in
   one line naming the type and the GPU.
3. Another layout for that GPU is refused by ``layout apply``, naming the
   domains that hold its vGPUs.
4. The guests' vGPUs made persistent (``auto``), a simulated reboot (GPU
   instances, VFs and vGPUs gone, MIG mode kept) and ``restore``: the
   layout comes back first, then every vGPU, on the GPU instances or
   placements of the layout.
"""

import collections
import json
import os
import subprocess
import sys

import pytest

from libvirt_gpu import objects
from libvirt_gpu.devices.backends import base
from libvirt_gpu.devices.backends import nvidia_vgpu
from libvirt_gpu.devices.backends.nvidia_vgpu import statefile
from libvirt_gpu.openstack.placement import traits
from libvirt_gpu import simulator
from libvirt_gpu.simulator import nvml as sim_nvml
from tests.functional import hook_guests as hg
from tests.functional import libvirtd
from tests.functional import live_sysfs as ls
from tests.functional.live_layouts import CASES, config_text

missing = ls.live_host_requirements()
pytestmark = pytest.mark.skipif(bool(missing), reason='; '.join(missing))


class Setup(hg.HookSetup):
    """Our hook, configured with the case's layout on the live tree."""

    def __init__(self, workdir, case):
        super().__init__(workdir, case.type_id)
        self.case = case
        self.other_config = os.path.join(workdir, 'other.conf')

    def hooks(self, live):
        hooks = super().hooks(live)
        with open(self.config, 'w') as f:
            f.write(config_text(live.root, self.state_dir, self.case))
        with open(self.other_config, 'w') as f:
            f.write(config_text(live.root, self.state_dir, self.case,
                                other=True))
        return hooks


@pytest.fixture(scope='module', params=CASES, ids=[c.profile for c in CASES])
def host(request, tmp_path_factory):
    case = request.param
    workdir = str(tmp_path_factory.mktemp('layout-' + case.profile))
    setup = Setup(workdir, case)
    with ls.LiveHost(workdir, profile=case.profile, hooks=setup.hooks,
                     uevents=False) as h:
        h.setup = setup
        h.case = case
        h.guests = {}            # name -> (uuid, vf), holding a vGPU
        yield h


def cli(host, *argv, config=None, fails=False):
    """``libvirt-gpu -c URI --config-file CONF ARGV --json``: its JSON."""
    r = subprocess.run(
        [sys.executable, '-m', 'libvirt_gpu.cmd.main', '-c', host.uri,
         '--config-file', config or host.setup.config] + list(argv)
        + ['--json'], cwd=ls.REPO, capture_output=True, text=True,
        timeout=120)
    assert r.returncode == (1 if fails else 0), r.stdout + r.stderr
    return json.loads(r.stdout)


def driver(host):
    """The simulated driver's view of the case's GPU and its VFs."""
    state = host.live.state()
    gpu = state['driver']['gpus'][host.case.gpu]
    vfs = [str(a) for a in host.live.sysfs.virtfns(host.case.gpu)]
    placed = {vf: where for vf, where in state['driver']['placed'].items()
              if vf in vfs}
    return gpu, vfs, placed


def gi_profiles(gpu):
    """``{gi id: profile id}`` of the GPU's instances (the simulator's
    state lists each GI as ``[id, profile id, start, ...]``)."""
    return {gi[0]: gi[1] for gi in gpu['gis']}


def steps(report):
    return [s['action'] for g in report['gpus'] for s in g['steps']]


def run_hook(host, name, xml, operation='prepare'):
    """Our installed hook file run as libvirtd runs it."""
    path = os.path.join(host.daemon.tmpdir, 'etc', 'hooks', 'qemu.d',
                        'libvirt-gpu')
    return subprocess.run(
        [path, name, operation, 'begin', '-'], input=xml, text=True,
        capture_output=True, timeout=120, cwd='/',
        env={'LC_ALL': 'C', 'PATH': os.environ['PATH'], 'HOME': '/'})


def free_vf(host):
    _, vfs, placed = driver(host)
    taken = set(placed) | {vf for _, vf in host.guests.values()}
    return next(vf for vf in vfs if vf not in taken)


def test_plan_apply_apply_again(host):
    case = host.case
    plan = cli(host, 'layout', 'plan')
    assert plan['failed'] == 0 and plan['done'] == 0
    # the module option line, for the layouts that name a scheduler
    assert bool(plan['module_option']) == any(
        ln.startswith('scheduler') for ln in case.layout)
    planned = steps(plan)
    assert planned, plan
    applied = cli(host, 'layout', 'apply')
    assert (applied['done'], applied['failed']) == (len(planned), 0)
    assert [r['action'] for r in applied['results']] == planned
    again = cli(host, 'layout', 'apply')
    assert steps(again) == [] and again['done'] == again['failed'] == 0
    gpu, _, placed = driver(host)
    assert placed == {}
    if case.per_gi is None:
        assert (gpu['mig_mode'], gpu['heterogeneous']) == (0, True)
    else:
        assert gpu['mig_mode'] == 1
        assert len(gpu['gis']) == sum(
            int(part.split(':')[1]) for part in
            case.layout[1].split(' = ')[1].split(', '))


def layout_types(case):
    """``{type id: its count, or None}`` of the layout's ``vgpu_types``."""
    (line,) = [ln for ln in case.layout if ln.startswith('vgpu_types = ')]
    found = {}
    for item in line.split(' = ')[1].split(', '):
        type_id, _, count = item.partition(':')
        found[type_id] = int(count) if count else None
    return found


def driver_room(host):
    """``{type id: (how many the simulated driver can make on the case's
    GPU now, the type's trait)}`` of the layout's types, as the driver
    answers through NVML: a MIG-backed type's maximum (max per GPU
    instance x the GPU instances of its profile), a time-sliced one's
    creatable placements."""
    case = host.case
    lib = sim_nvml.module(sysfs_root=host.live.root)
    lib.nvmlInit()
    product = simulator.load_profile(case.profile).device(case.gpu).product_id
    found = {}
    try:
        handle = lib.nvmlDeviceGetHandleByPciBusId(case.gpu)
        for type_id in layout_types(case):
            number = int(type_id.split('-')[1])
            if lib.nvmlVgpuTypeGetGpuInstanceProfileId(number) != \
                    sim_nvml.INVALID_GPU_INSTANCE_PROFILE_ID:
                room = lib.nvmlVgpuTypeGetMaxInstances(handle, number)
            else:
                room = lib.nvmlDeviceGetVgpuTypeCreatablePlacements(
                    handle, number).count
            named = collections.namedtuple('T', 'id name')(
                type_id, lib.nvmlVgpuTypeGetName(number))
            found[type_id] = (room, traits.custom(
                'NVIDIA', product, traits.vgpu_type_word(named)))
    finally:
        lib.nvmlShutdown()
    return found


def test_placement_offers_what_the_driver_can_make(host):
    """``placement show --json`` at the layout: each provider of the
    GPU stands for one of the layout's types (its type trait), every
    type the driver can make has one, and its total is what the
    simulated driver can make of that type (capped by the type's count
    in the layout, where it gives one: the counts of a mixed-size GPU's
    types fit together whatever placements the driver picks)."""
    case = host.case
    room = driver_room(host)
    counts = layout_types(case)
    wanted = {type_id: min(n, counts[type_id] or n)
              for type_id, (n, _) in room.items()}
    assert wanted[case.type_id] == case.capacity
    r = subprocess.run(
        [sys.executable, '-m', 'libvirt_gpu.cmd.main', '--config-file',
         host.setup.config, '--sysfs-root', host.live.root, 'placement',
         'show', '--json'], cwd=ls.REPO, capture_output=True, text=True,
        timeout=120)
    assert r.returncode == 0, r.stderr
    providers = [p for p in json.loads(r.stdout)['resource_providers']
                 if case.gpu in p['name']]
    of_trait = {trait: type_id for type_id, (_, trait) in room.items()}
    offered = {}
    for provider in providers:
        (type_id,) = [of_trait[t] for t in provider['traits']
                      if t in of_trait]
        assert type_id not in offered, providers
        (inventory,) = provider['inventories'].values()
        offered[type_id] = (inventory['total'], inventory['reserved'])
    assert offered == {type_id: (n, 0) for type_id, n in wanted.items()
                       if n}, (room, providers)


def test_guests_fill_the_gpu_and_the_next_is_refused(host):
    import libvirt
    case = host.case
    conn = host.daemon.connect()
    for i in range(case.capacity):
        name = '%s-%d' % (case.profile, i)
        if i == 0:
            # what an operator does: attach --config picks the VF
            dom = conn.defineXML(libvirtd.tiny_domain_xml(name))
            done = cli(host, 'attach', name, '--vgpu-type', case.type_id,
                       '--config')
            u, vf = done['uuid'], done['parent']
            assert vf in driver(host)[1]
            xml = dom.XMLDesc(0)
        else:
            u, vf = str(objects.Uuid.new()), free_vf(host)
            xml = hg.guest_xml(name, [(u, case.type_id, vf)], vendor=True)
            conn.defineXML(xml)
        done = run_hook(host, name, xml)
        assert done.returncode == 0, done.stderr
        host.guests[name] = (u, vf)
    gpu, vfs, placed = driver(host)
    number = int(case.type_id.split('-')[1])
    assert placed == {vf: [case.type_id, placed[vf][1], placed[vf][2]]
                      for _, vf in host.guests.values()}
    if case.per_gi is None:
        # each at a placement of its own, none overlapping (size 8)
        spots = sorted(where[2] for where in placed.values())
        assert all(b - a >= 8 for a, b in zip(spots, spots[1:])), spots
        assert all(where[1] is None for where in placed.values())
    else:
        # the driver put per_gi of them in each GI of the type's profile
        profiles = gi_profiles(gpu)
        used = collections.Counter(where[1] for where in placed.values())
        want = {p for p in profiles.values()
                if profiles and used and p == profiles[next(iter(used))]}
        assert len(want) == 1
        assert sorted(used.values()) == [case.per_gi] * len(used)
        assert set(used) == {g for g, p in profiles.items() if p in want}
    # our record of each vGPU says where the driver put it
    records = statefile.VendorState(host.setup.state_dir).read()
    assert {(e.vf and str(e.vf), e.gi_id, e.placement)
            for e in records.values()} == {
        (vf, where[1], where[2]) for vf, where in placed.items()}
    # the driver has no room left: no free VF offers the type; a type the
    # layout gives a count stops there, with room left in the driver
    files = nvidia_vgpu.files.VendorFiles(host.live.sysfs)
    free = [vf for vf in vfs if vf not in placed]
    offering = [vf for vf in free
                if any(n == number for n, _ in files.creatable_types(vf))]
    counted = any('%s:' % case.type_id in line for line in case.layout)
    assert bool(offering) == counted, (offering, counted)
    # `list --json` says the same (read from sysfs: with `-c`, the
    # simulated NVML has no root to bind to)
    r = subprocess.run(
        [sys.executable, '-m', 'libvirt_gpu.cmd.main', '--config-file',
         host.setup.config, '--sysfs-root', host.live.root, 'list',
         '--json'], cwd=ls.REPO, capture_output=True, text=True, timeout=120)
    (listed,) = [g for g in json.loads(r.stdout) if g['address'] == case.gpu]
    assert (listed['enabled_type'], listed['capacity']) == (
        case.type_id, case.capacity), r.stdout
    if case.per_gi is not None:
        held = {gi['id']: (gi['used'], gi['free'])
                for gi in listed['gpu_instances'] if gi['used']}
        assert held == {gid: (case.per_gi, 0) for gid in used}
    # the next guest, started by libvirtd, is refused by our hook
    name = '%s-full' % case.profile
    code, message = hg.start(
        host, name, [(str(objects.Uuid.new()), case.type_id, free[0])],
        vendor=True)
    assert code == libvirt.VIR_ERR_HOOK_SCRIPT_FAILED
    ours = [ln for ln in message.splitlines() if 'No capacity' in ln]
    assert len(ours) == 1, message
    assert ('No capacity left for vGPU type %s on the GPU %s'
            % (case.type_id, case.gpu)) in ours[0], message
    assert driver(host)[2] == placed
    host.refusal = message


def test_the_refusal_is_one_line(host):
    """What the hook wrote (libvirt quotes it after the exit status) is
    the one line of the refusal, with no warning before it."""
    said = host.refusal.split('unexpected exit status 1: ', 1)[1]
    assert said.strip().count('\n') == 0, said


def test_another_layout_is_refused_naming_the_domains(host):
    before = driver(host)
    report = cli(host, 'layout', 'apply', config=host.setup.other_config,
                 fails=True)
    (failed,) = [r for r in report['results'] if r['status'] == 'refused']
    assert '\n' not in failed['detail']
    for name in host.guests:
        assert name in failed['detail'], failed['detail']
    assert driver(host) == before


def test_reboot_then_restore_brings_layout_then_vgpus_back(host):
    case = host.case
    backend = nvidia_vgpu.NvidiaVgpuBackend(host.live.sysfs,
                                            host.setup.state_dir)
    for u, vf in host.guests.values():
        backend.define(base.VgpuDevice(
            uuid=objects.Uuid.parse(u), parent=objects.PciAddress.parse(vf),
            type_id=objects.TypeId.parse(case.type_id)), start='auto')
    gpu, _, placed = driver(host)
    host.live.command('reboot')
    after, vfs, gone = driver(host)
    assert (after['gis'], vfs, gone) == ([], [], {})
    assert after['mig_mode'] == gpu['mig_mode']
    report = cli(host, 'restore', '--sriov-manage', 'none')
    back, _, again = driver(host)
    assert sorted(gi_profiles(back).values()) == sorted(
        gi_profiles(gpu).values())
    assert back['heterogeneous'] == gpu['heterogeneous']
    assert {vf: where[0] for vf, where in again.items()} == {
        vf: case.type_id for vf in placed}
    if case.per_gi is not None:
        profiles = gi_profiles(back)
        assert len({profiles[where[1]] for where in again.values()}) == 1
        used = collections.Counter(where[1] for where in again.values())
        assert sorted(used.values()) == [case.per_gi] * len(used)
    # the layout first, then the vGPUs, and nothing failed
    assert report['failed'] == 0, report
    whats = [a['what'] for a in report['actions']]
    assert whats[0] == 'layout' and whats[-1] == 'vgpu', whats
    assert max(i for i, w in enumerate(whats) if w == 'layout') < min(
        i for i, w in enumerate(whats) if w == 'vgpu'), whats
    assert sorted(a['target'] for a in report['actions']
                  if a['what'] == 'vgpu') == sorted(
        u for u, _ in host.guests.values())
    # a second restore finds the layout and every vGPU in place
    assert cli(host, 'restore', '--sriov-manage', 'none')['changed'] == 0


def test_the_documented_h100_layout_converges(tmp_path):
    """docs/admin/layouts.md's H100 example (``1g.10gb:4, 3g.40gb:1``)
    on a fresh H100: one apply makes it, a second has nothing to do."""
    with ls.LiveSysfs('h100-80gb', uevents=False) as live:
        config = tmp_path / 'h100.conf'
        config.write_text(
            '[DEFAULT]\nsysfs_root = %s\nstate_dir = %s\n'
            '[gpu]\nnvml = simulated\nlayouts = h100_mig\n'
            '[layout_h100_mig]\ngpus = 10de:2330\nmode = mig\n'
            'gpu_instances = 1g.10gb:4, 3g.40gb:1\n'
            'vgpu_types = nvidia-1308, nvidia-1312\n'
            % (live.root, tmp_path / 'state'))
        runs = [subprocess.run(
            [sys.executable, '-m', 'libvirt_gpu.cmd.main', '--config-file',
             str(config), '--sysfs-root', live.root, 'layout', 'apply',
             '--json'], cwd=ls.REPO, capture_output=True, text=True,
            timeout=120) for _ in range(2)]
        assert [r.returncode for r in runs] == [0, 0], runs[-1].stdout
        assert steps(json.loads(runs[1].stdout)) == []
        gis = live.state()['driver']['gpus']['0000:4e:00.0']['gis']
        assert sorted(gi[1] for gi in gis) == [9, 19, 19, 19, 19]
