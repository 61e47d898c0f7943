"""A vendor-interface (vGPU 17+) guest migrating in, hook by hook, as
libvirt calls them on two simulated hosts (the kernel double writing each
tree): the destination's ``migrate`` chooses a free VF there and names it
in the XML, its ``prepare`` writes the type to that VF's
type file before the guest's QEMU starts there; after a
migration the source's ``release`` writes 0 to the source's VF; a failed
one runs the destination's ``release``, which writes 0 to the VF chosen
there; a destination that crashed before its ``release`` is set right by
``reconcile``.

And the destination's layout, before anything moves: on a GPU in MIG
mode a MIG-backed vGPU is reserved only while a GPU instance of its
profile has room, on a GPU in mixed-size mode only while a placement of
its size is free, counting the reservations of other incoming
migrations; else the ``migrate`` hook refuses in one line and reserves
nothing."""

import io
import os

import pytest

from libvirt_gpu import environment
from libvirt_gpu import objects
from libvirt_gpu.devices.backends import base
from libvirt_gpu.devices.backends.nvidia_vgpu.files import (
    VendorFiles as vendor)
from libvirt_gpu.guests import hook
from libvirt_gpu.guests import reconcile
from libvirt_gpu.store import state
from libvirt_gpu.virt import host as host_mod
from tests.doubles import fake_libvirt
from tests.doubles import paths
from tests.doubles import t4_migrate as thm
from tests.doubles import mig_host as tmc
from tests.doubles import vendor_world as tv

TYPE = 'nvidia-1145'                      # L40S-1B
SOURCE_VF = '0000:bd:00.4'
PRE = {'0000:3d:00.4': 1145, '0000:3d:00.5': 1145}   # not ours


def run(world, op, xml, stdout=None):
    """One hook call on ``world``: ``(rc, stderr)``; a rewritten XML goes
    to ``stdout``."""
    err = io.StringIO()
    rc = hook.run(['qemu', 'vm1', op, 'begin' if op != 'release' else 'end',
                   '-'], xml, config_file=world.config, sysfs=world.sysfs,
                  stderr=err, stdout=stdout,
                  mdevctl_dir=getattr(world, 'mdevctl', None))
    return rc, err.getvalue()


def migrate_in(world, xml):
    """The destination's ``migrate begin -``: ``(rc, rewritten XML or the
    input when unchanged, stderr)``."""
    out = io.BytesIO()
    rc, err = run(world, 'migrate', xml, stdout=out)
    return rc, out.getvalue() or xml, err


def typed(world):
    """``{VF: type number}`` of every VF holding a vGPU."""
    files = vendor(world.sysfs)
    return {str(vf): files.current_type(vf) for vf in files.vf_addresses()
            if files.current_type(vf)}


@pytest.fixture
def hosts(tmp_path):
    made = []
    for name in ('source', 'dest'):
        os.makedirs(str(tmp_path / name))
        made.append(tv.World('l40s', str(tmp_path / name), TYPE,
                             '%s, %s' % (tv.L1, tv.L2)))
    return made


@pytest.fixture
def running(hosts):
    """The guest started on the source: its vGPU on ``SOURCE_VF``; and its
    XML as the destination's ``migrate`` got it and printed it."""
    source, dest = hosts
    uuid = tv.new_uuid()
    xml = tv.vf_domain_xml(uuid, SOURCE_VF)
    assert run(source, 'prepare', xml) == (0, '')
    assert typed(source) == dict(PRE, **{SOURCE_VF: 1145})
    rc, incoming, err = migrate_in(dest, xml)
    assert (rc, err) == (0, '')
    (lease,) = dest.leases()
    chosen = str(lease.parent)
    assert b"parent='%s'" % chosen.encode() in incoming
    # reserved, not typed yet: the VF is written by prepare
    assert typed(dest) == PRE
    assert run(dest, 'prepare', incoming) == (0, '')
    assert typed(dest) == dict(PRE, **{chosen: 1145})
    assert dest.leases()[0].state == state.CREATED
    return uuid, xml, incoming, chosen


def test_a_migration_types_the_destination_vf_and_resets_the_source_s(
        hosts, running):
    source, dest = hosts
    uuid, xml, incoming, chosen = running
    # the source's domain released once the guest left
    assert run(source, 'release', xml) == (0, '')
    assert typed(source) == PRE and source.leases() == []
    (lease,) = dest.leases()
    assert (lease.vgpu_uuid, str(lease.parent), lease.state) == (
        uuid, chosen, state.CREATED)
    # the guest stops there later: its VF there is reset as after a start
    assert run(dest, 'release', incoming) == (0, '')
    assert typed(dest) == PRE and dest.leases() == []


def test_a_failed_migration_resets_the_destination_vf(hosts, running):
    source, dest = hosts
    uuid, xml, incoming, chosen = running
    # libvirt runs stopped and release for the incoming domain it could
    # not start (or whose migration was aborted)
    assert run(dest, 'release', incoming) == (0, '')
    assert typed(dest) == PRE and dest.leases() == []
    # the guest runs on at the source, its VF typed, its lease kept
    assert typed(source) == dict(PRE, **{SOURCE_VF: 1145})
    (lease,) = source.leases()
    assert lease.vgpu_uuid == uuid and lease.state == state.CREATED


def test_a_destination_that_crashed_before_release_is_reconciled(
        hosts, running, tmp_path):
    source, dest = hosts
    uuid, xml, incoming, chosen = running
    thm._holder_gone(dest, uuid)        # the hook process is long gone
    conn = fake_libvirt.FakeConnection(str(tmp_path / 'dest-doms'))
    report = reconcile.reconcile(environment.Environment(
        dest.state_dir, sysfs=dest.sysfs,
        host=host_mod.Host.from_connection(conn),
        mdevctl_dir=dest.mdevctl))
    (finding,) = [f for f in report.findings if f.uuid == uuid]
    assert finding.action == reconcile.REMOVED
    assert typed(dest) == PRE and dest.leases() == []


def test_a_vf_taken_there_since_the_migrate_hook_refuses_at_prepare(
        hosts, running):
    # prepare writes the VF the reservation names, never another one
    source, dest = hosts
    uuid, xml, incoming, chosen = running
    assert run(dest, 'release', incoming) == (0, '')
    rc, again, _ = migrate_in(dest, xml)
    assert rc == 0
    (lease,) = dest.leases()
    vendor(dest.sysfs).set_current_type(lease.parent, 1145)  # not ours
    rc, err = run(dest, 'prepare', again)
    assert rc == 1 and str(lease.parent) in err and '\n' not in err.strip()
    assert dest.leases() == []


# --- the destination's layout: MIG-backed and mixed-size ---------------------

H100_1_10C = tmc.H100_1_10C               # 1g.10gb, one per GI
L40S_1B = objects.TypeId.parse(TYPE)


class Layout(object):
    """A simulated destination whose GPU's layout the test sets
    (``mig_host.Host``), with our configuration (NVML
    simulated: the hook reads the driver's room there)."""

    def __init__(self, tmp, profile, gpu, type_id):
        self.host = tmc.Host(os.path.join(tmp, 'sys'), profile,
                             os.path.join(tmp, 'state'))
        self.sysfs = self.host.sysfs
        self.state_dir = self.host.state_dir
        self.config = os.path.join(tmp, 'libvirt-gpu.conf')
        with open(self.config, 'w') as f:
            f.write('[DEFAULT]\nsysfs_root = %s\nstate_dir = %s\n'
                    '[gpu]\nnvml = simulated\nenabled_vgpu_types = %s\n'
                    '[vgpu_%s]\ndevice_addresses = %s\n' % (
                        self.sysfs.root, self.state_dir, type_id, type_id,
                        gpu))

    def leases(self):
        return state.LeaseStore(self.state_dir).leases()


def incoming(type_id, vf='0000:17:00.4'):
    """A guest of another host with one vendor-interface vGPU."""
    return tv.vf_domain_xml(tv.new_uuid(), vf, type_id=type_id,
                            dom=tv.new_uuid())


@pytest.fixture
def h100(tmc_tmp):
    return Layout(tmc_tmp, 'h100-80gb', tmc.H100, H100_1_10C)


@pytest.fixture
def l40s_mixed(tmc_tmp):
    return Layout(tmc_tmp, 'l40s', tmc.L40S, tmc.L40S_12Q)


@pytest.fixture
def tmc_tmp():
    import shutil
    import tempfile
    path = tempfile.mkdtemp(prefix='lgpu-migvendor-')
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _fill_by_migrations(dest, type_id):
    """Incoming migrations of one vGPU each until the hook refuses:
    ``(how many were reserved, the refusal's stderr)``."""
    for made in range(32):
        rc, _, err = migrate_in(dest, incoming(type_id))
        if rc:
            return made, err
    raise AssertionError('never refused')


def test_mig_backed_incoming_vgpus_take_the_free_gis_only(h100):
    # two 1g.10gb GIs and a 3g.40gb one: H100-1-10C fits the two only,
    # while 14 free VFs still list it; the reservations (none created yet)
    # hold the GIs
    h100.host.mig(tmc.H100, [tmc.GI_1G_10GB] * 2 + [tmc.GI_3G_40GB])
    made, err = _fill_by_migrations(h100, H100_1_10C)
    assert made == 2
    (line,) = err.strip().splitlines()
    assert 'cannot migrate in' in line
    assert str(H100_1_10C) in line and str(tmc.H100) in line
    assert len(h100.leases()) == 2      # the refused one reserved nothing


def test_a_layout_without_a_gi_of_the_profile_refuses(h100):
    h100.host.mig(tmc.H100, [tmc.GI_3G_40GB])
    rc, _, err = migrate_in(h100, incoming(H100_1_10C))
    assert rc == 1 and str(H100_1_10C) in err and h100.leases() == []


def test_mixed_size_incoming_vgpus_take_the_free_placements(l40s_mixed):
    # L40S-12Q on a mixed-size L40S: 4 placements of size 8, one of them
    # taken by an L40S-1B beside (a GPU of equal-size vGPUs would take no
    # 12Q beside it at all)
    layout = l40s_mixed.host
    layout.mixed(tmc.L40S)
    layout.backend.prepare(base.VgpuDevice(
        uuid=tv.new_uuid(), parent=layout.backend.choose_vf(
            tmc.L40S, L40S_1B), type_id=L40S_1B))
    free = layout.backend.room(tmc.L40S, tmc.L40S_12Q).placements
    assert len(free) == 3
    made, err = _fill_by_migrations(l40s_mixed, tmc.L40S_12Q)
    assert made == 3
    (line,) = err.strip().splitlines()
    assert str(tmc.L40S_12Q) in line and str(tmc.L40S) in line
    assert len(l40s_mixed.leases()) == 3


CRASHING_PREPARE = '''
import sys
from libvirt_gpu.guests import hook
from tests.doubles import kernel_sysfs
sys.exit(hook.run(['qemu', 'vm1', 'prepare', 'begin', '-'],
                  sys.stdin.buffer.read(), config_file=sys.argv[1],
                  sysfs=kernel_sysfs.KernelSysfs(sys.argv[2], 'l40s'),
                  mdevctl_dir=sys.argv[3]))
'''


def _reconcile(world, tmp_path):
    conn = fake_libvirt.FakeConnection(str(tmp_path / 'doms'))
    return reconcile.reconcile(environment.Environment(
        world.state_dir, sysfs=world.sysfs,
        host=host_mod.Host.from_connection(conn),
        mdevctl_dir=world.mdevctl))


@pytest.mark.parametrize('expired', [False, True])
def test_a_prepare_killed_after_typing_the_vf_is_reconciled(
        hosts, tmp_path, expired):
    # the destination's prepare dies right after its write to the VF,
    # before it marks the lease created: the VF holds the type, the
    # lease is still the incoming reservation
    import subprocess
    import sys
    import time
    source, dest = hosts
    xml = tv.vf_domain_xml(tv.new_uuid(), SOURCE_VF)
    rc, incoming, _ = migrate_in(dest, xml)
    assert rc == 0
    (lease,) = dest.leases()
    thm._holder_gone(dest, lease.vgpu_uuid)   # the migrate hook exited
    r = subprocess.run(
        [sys.executable, '-c', CRASHING_PREPARE, dest.config, dest.root,
         dest.mdevctl], input=incoming, capture_output=True, cwd=paths.ROOT,
        env=dict(os.environ, **{state.CRASH_ENV: 'prepare:created'}),
        timeout=60)
    assert r.returncode == -9, r.stderr
    assert typed(dest) == dict(PRE, **{str(lease.parent): 1145})
    if expired:
        thm._holder_gone(dest, lease.vgpu_uuid, expires_at=time.time() - 1)
    report = _reconcile(dest, tmp_path)
    (finding,) = [f for f in report.findings if f.uuid == lease.vgpu_uuid]
    assert finding.action == reconcile.REMOVED, finding
    assert typed(dest) == PRE and dest.leases() == []
