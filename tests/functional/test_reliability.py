"""Races, crashes and hostile input, with real processes.

Each worker is ``python -m tests.doubles.worker attach|prepare``: a
separate process that shares with the others only what real callers share -
the sysfs tree (its kernel emulated by ``KernelSysfs``, serialised by
the tree's own lock as the kernel serialises), the lease file and, for
attach, a file-backed libvirt stand-in (the real daemon cannot hot-plug
here: no VFIO).

Crashes are SIGKILLs injected with LIBVIRT_GPU_TEST_CRASH_AT (see
libvirt_gpu/store/state.py crash_point): the process dies at that step, holding
whatever it held.  After each, ``reconcile`` must leave no orphan and no
double allocation.
"""

import json
import os
import signal
import subprocess
import sys

import pytest

from libvirt_gpu import objects
from libvirt_gpu.virt import config_xml
from libvirt_gpu import environment
from libvirt_gpu.guests import hook
from libvirt_gpu.virt import metadata
from libvirt_gpu.guests import reconcile
from libvirt_gpu.store import state
from libvirt_gpu.util import xmlutil
from tests.doubles import kernel_sysfs
from tests.doubles import trees
from tests.doubles import fake_libvirt
from tests.doubles import hostile
from tests.functional import libvirtd

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
TYPE = 'nvidia-227'          # GRID T4-4A: 4 per T4, 8 on the two GPUs
PER_GPU = 4
HOSTILE_DOMAIN = 'c7a5fdbd-cdaf-9455-926a-d65c16db1809'


class World(object):
    """An empty simulated T4 host (no mdevs), nvidia-227 enabled on both
    GPUs (8 vGPUs in all), a lease dir and a fake libvirt."""

    def __init__(self, root, profile, tmp_path):
        self.root = root
        self.profile = profile
        self.tmp = tmp_path
        self.state_dir = str(tmp_path / 'state')
        self.config = str(tmp_path / 'libvirt-gpu.conf')
        with open(self.config, 'w') as f:
            f.write('[DEFAULT]\nsysfs_root = %s\nstate_dir = %s\n'
                    '[gpu]\nenabled_vgpu_types = %s\n'
                    % (root, self.state_dir, TYPE))
        self.domains = str(tmp_path / 'domains')
        self.conn = fake_libvirt.FakeConnection(self.domains)
        self.sysfs = kernel_sysfs.KernelSysfs(root, profile)
        self.store = state.LeaseStore(self.state_dir)

    def worker(self, action, domain, env=None, go=None):
        argv = [sys.executable, '-m', 'tests.doubles.worker', action,
                '--root', self.root, '--profile', self.profile, '--config',
                self.config, '--domain', domain]
        if action == 'attach':
            argv += ['--domains', self.domains, '--vgpu-type', TYPE]
        if go:
            argv += ['--go', go]
        full_env = dict(os.environ)
        full_env.pop(state.CRASH_ENV, None)
        full_env.update(env or {})
        return subprocess.Popen(argv, cwd=ROOT, env=full_env,
                                stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def mdevs(self):
        return self.sysfs.kernel.mdevs()

    def running_refs(self):
        """``{mdev uuid: [domain uuid]}`` from every running domain."""
        refs = {}
        for dom in self.conn.listAllDomains():
            if not dom.isActive():
                continue
            root = xmlutil.parse(dom.XMLDesc(0))
            devices = config_xml.read_domain(root)
            for u in set(devices.mdev_uuids) | {
                    v.uuid for v in metadata.parse(root).vgpus}:
                refs.setdefault(u, []).append(dom.UUIDString())
        return refs

    def attach(self, domain):
        """api.attach in this process (no crash wanted); the error's
        class name or the Attachment."""
        from libvirt_gpu.guests import api
        from libvirt_gpu import conf as conf_mod
        from libvirt_gpu import exception
        try:
            return api.attach(self.conn, domain, vgpu_type=TYPE, live=True,
                              conf=conf_mod.load(self.config),
                              sysfs=self.sysfs)
        except exception.LibvirtGpuError as e:
            return type(e).__name__

    def hook(self, op, xml_path):
        with open(xml_path, 'rb') as f:
            return hook.run(['qemu', 'vm', op, 'begin', '-'], f.read(),
                            config_file=self.config, sysfs=self.sysfs)

    def reconcile(self, **kwargs):
        from libvirt_gpu.virt import host as host_mod
        # The configuration enables TYPE on both GPUs.
        kwargs.setdefault('covered', tuple(
            objects.PciAddress.parse(a)
            for a in ('0000:3b:00.0', '0000:af:00.0')))
        return reconcile.reconcile(environment.Environment(
            self.store.state_dir, sysfs=self.sysfs,
            host=host_mod.Host.from_connection(self.conn),
            mdevctl_dir=str(self.tmp / 'mdevctl.d')), **kwargs)

    def assert_consistent(self):
        """No orphan, no double allocation, nothing over capacity."""
        mdevs = self.mdevs()
        refs = self.running_refs()
        leases = {lease.vgpu_uuid: lease for lease in self.store.leases()}
        # every vGPU is used by exactly one running domain, and leased to it
        for uuid in mdevs:
            assert len(refs.get(uuid, [])) == 1, (uuid, refs)
            assert uuid in leases, uuid
            assert leases[uuid].domain_uuid == refs[uuid][0]
            assert leases[uuid].state == state.CREATED
        # every lease has its vGPU
        assert set(leases) == set(mdevs), (leases, mdevs)
        # every running domain's vGPU exists
        assert set(refs) <= set(mdevs), (refs, mdevs)
        per_gpu = {}
        for parent, _ in mdevs.values():
            per_gpu[parent] = per_gpu.get(parent, 0) + 1
        assert all(n <= PER_GPU for n in per_gpu.values()), per_gpu


@pytest.fixture
def world(tmp_path):
    with trees.simulated_tree('t4', without_mdevs=True) as tree:
        yield World(tree[0], tree[1], tmp_path)


def finish(proc, timeout=120):
    out, err = proc.communicate(timeout=timeout)
    lines = [line for line in out.splitlines() if line.startswith('{')]
    return proc.returncode, (json.loads(lines[-1]) if lines else None), err


# --- the race ----------------------------------------------------------------

def test_32_processes_race_for_8_vgpus(world, tmp_path):
    doms = [world.conn.define(libvirtd.tiny_domain_xml('race%02d' % i),
                              active=True) for i in range(32)]
    go = str(tmp_path / 'go')
    procs = [world.worker('attach', dom.uuid, go=go) for dom in doms]
    for proc in procs:                # every worker imported and configured
        assert proc.stdout.readline().strip() == 'ready'
    open(go, 'w').close()
    results = [finish(proc) for proc in procs]
    assert all(rc == 0 for rc, _, _ in results), [r[2] for r in results]
    ok = [r for _, r, _ in results if r['ok']]
    refused = [r for _, r, _ in results if not r['ok']]
    assert len(ok) == 8
    assert len(refused) == 24
    assert {r['error'] for r in refused} == {'NoCapacity'}
    assert all('No capacity left for vGPU type %s' % TYPE in r['message']
               for r in refused)
    # nothing leaked, nothing shared, nothing over capacity
    assert sorted(world.mdevs()) == sorted(r['uuid'] for r in ok)
    assert sorted(str(p) for p, _ in world.mdevs().values()) == \
        sorted(str(r['parent']) for r in ok) == \
        ['0000:3b:00.0'] * 4 + ['0000:af:00.0'] * 4
    world.assert_consistent()
    # each winner's domain holds its vGPU; no loser's domain holds one
    refs = world.running_refs()
    assert sorted(d for ds in refs.values() for d in ds) == sorted(
        r['domain'] for r in ok)
    report = world.reconcile()
    assert report.findings == ()          # nothing to repair after a race


# --- crashes in attach -------------------------------------------------------

ATTACH_STEPS = ['attach:reserved', 'attach:created', 'attach:marked',
                'attach:attached', 'attach:done']


@pytest.mark.parametrize('step', ATTACH_STEPS)
def test_crash_in_attach_then_reconcile(world, step):
    doms = [world.conn.define(libvirtd.tiny_domain_xml('vm%d' % i),
                              active=True) for i in range(3)]
    # one attach completes, one is killed at the step, one completes after
    assert not isinstance(world.attach(doms[0].uuid), str)
    rc, out, err = finish(world.worker('attach', doms[1].uuid,
                                       env={state.CRASH_ENV: step}))
    assert rc == -signal.SIGKILL, err
    assert not isinstance(world.attach(doms[2].uuid), str)
    # the crash leaves a lease behind (its holder dead)
    crashed = [lease for lease in world.store.leases()
               if lease.domain_uuid == doms[1].uuid]
    assert len(crashed) == 1 and not crashed[0].holder_alive()
    report = world.reconcile()
    world.assert_consistent()
    plugged = step in ('attach:attached', 'attach:done')
    if plugged:
        # the guest has the vGPU: it is kept, its lease settled
        assert crashed[0].vgpu_uuid in world.running_refs()
        assert report.of(reconcile.REMOVED) == []
    else:
        assert crashed[0].vgpu_uuid not in world.mdevs()
        (gone,) = report.of(reconcile.REMOVED)
        assert gone.uuid == crashed[0].vgpu_uuid
        assert gone.what == ('lease' if step == 'attach:reserved'
                             else 'mdev+lease')
    assert report.stuck == []
    # the capacity is whole again: the rest of the 8 can be attached
    used = len(world.mdevs())
    more = [world.conn.define(libvirtd.tiny_domain_xml('more%d' % i),
                              active=True) for i in range(9 - used)]
    results = [world.attach(d.uuid) for d in more]
    assert [isinstance(r, str) for r in results] == [False] * (8 - used) \
        + [True]
    assert results[-1] == 'NoCapacity'
    world.assert_consistent()


# --- crashes in prepare ------------------------------------------------------

PREPARE_STEPS = ['prepare:reserved', 'prepare:created@1',
                 'prepare:created@2', 'prepare:marked']


def guest_xml(world, name, n=2):
    uuids = [objects.Uuid.new() for _ in range(n)]
    xml = libvirtd.tiny_domain_xml(
        name, metadata=metadata.render_document(metadata.GpuMetadata(
            vgpus=tuple(metadata.VgpuEntry(u, objects.TypeId.parse(TYPE))
                        for u in uuids))),
        extra_devices=''.join(config_xml.mdev_hostdev(u) for u in uuids))
    path = world.tmp / ('%s.xml' % name)
    path.write_text(xml)
    dom = world.conn.define(xml, active=False)
    return dom, str(path), uuids


@pytest.mark.parametrize('step', PREPARE_STEPS)
def test_crash_in_prepare_then_reconcile(world, step):
    dom, xml_path, uuids = guest_xml(world, 'starting')
    rc, _, err = finish(world.worker('prepare', xml_path,
                                     env={state.CRASH_ENV: step}))
    assert rc == -signal.SIGKILL, err
    left = world.store.leases()
    assert {lease.domain_uuid for lease in left} == {dom.uuid}
    report = world.reconcile()
    # the guest never started: nothing of it may stay
    assert world.mdevs() == {} and world.store.leases() == []
    assert {f.uuid for f in report.of(reconcile.REMOVED)} == {
        lease.vgpu_uuid for lease in left}
    world.assert_consistent()
    # and it starts normally afterwards
    assert world.hook('prepare', xml_path) == 0
    assert sorted(world.mdevs()) == sorted(uuids)
    assert world.hook('release', xml_path) == 0
    assert world.mdevs() == {} and world.store.leases() == []


def test_retried_prepare_after_a_crash_allocates_nothing_twice(world):
    dom, xml_path, uuids = guest_xml(world, 'retried', n=3)
    rc, _, _ = finish(world.worker('prepare', xml_path, env={
        state.CRASH_ENV: 'prepare:created@2'}))
    assert rc == -signal.SIGKILL
    assert len(world.mdevs()) == 2 and len(world.store.leases()) == 3
    # libvirt retries the start without anyone reconciling
    assert world.hook('prepare', xml_path) == 0
    assert sorted(world.mdevs()) == sorted(uuids)
    leases = world.store.leases()
    assert sorted(lease.vgpu_uuid for lease in leases) == sorted(uuids)
    assert {lease.state for lease in leases} == {state.CREATED}
    # the capacity left is exactly 8 - 3
    from libvirt_gpu.host import allocator
    from libvirt_gpu.devices.backends import mdev
    from libvirt_gpu import objects
    alloc = allocator.Allocator(mdev.MdevBackend(world.sysfs), world.store,
                                {objects.PciAddress.parse(a):
                                 objects.EnabledType(TYPE)
                                 for a in ('0000:3b:00.0', '0000:af:00.0')})
    assert sum(alloc.capacity(TYPE).values()) == 5


# --- hostile input through the installed hook --------------------------------

def test_hostile_input_through_the_installed_hook(world, tmp_path):
    installed = hook.install(str(tmp_path / 'hooks'), world.config)
    clean_env = {'LC_ALL': 'C', 'PATH': '/usr/bin:/bin', 'HOME': '/root'}
    before = hostile.tree_snapshot(world.root)
    outcomes, expected = {}, {}
    for name, data in sorted(hostile.inputs(HOSTILE_DOMAIN).items()):
        r = subprocess.run([installed.path, 'evil', 'prepare', 'begin', '-'],
                           input=data, capture_output=True, env=clean_env,
                           timeout=60)
        outcomes[name] = (r.returncode, b'refused, nothing done' in r.stderr)
        # input naming neither our namespace nor an mdev is not ours: the
        # hook exits 0 before reading it (and does nothing either way)
        ours = any(marker in data for marker in hook.MARKERS)
        expected[name] = (1, True) if ours else (0, False)
    assert outcomes == expected
    assert list(expected.values()).count((1, True)) >= 15
    assert hostile.tree_snapshot(world.root) == before
    assert not os.path.exists(os.path.join(world.state_dir, 'hook.log'))
    assert world.store.leases() == []
