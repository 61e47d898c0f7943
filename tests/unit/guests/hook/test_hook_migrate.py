"""The destination's ``migrate`` hook (live migration): a GPU chosen here,
reserved under the lease lock until ``prepare`` takes it over, and the
domain XML edited in place (only our metadata and the hostdev's source
address change).  On the simulated T4 host (T4-2B, ``nvidia-223``: 8 per
GPU; 0000:3b:00.0 empty, 0000:af:00.0 holding two vGPUs, one of them
``EXISTING``) and the simulated L40S (vendor interface on VFs)."""

import io
import os
import subprocess
import sys
import time

import pytest

from libvirt_gpu import environment
from libvirt_gpu.guests import hook
from libvirt_gpu.virt import host as host_mod
from libvirt_gpu.guests import reconcile
from libvirt_gpu.store import state
from libvirt_gpu.guests.hook import incoming
from tests.doubles import fake_libvirt
from tests.doubles import paths
from tests.doubles import t4_hook as th
from tests.doubles import vendor_world as tv
from tests.doubles.t4_migrate import SOURCE_GPU
from tests.doubles.t4_migrate import _holder_gone
from tests.doubles.t4_migrate import incoming_xml
from tests.doubles.t4_migrate import migrate

A, B, DOM, EXISTING = th.A, th.B, th.DOM, th.EXISTING


def lease_of(env, uuid):
    return next(lease for lease in env.leases() if lease.vgpu_uuid == uuid)


# --- the XML edit -----------------------------------------------------------

def test_free_uuid_is_kept_and_only_the_parent_changes(env):
    uuid = th.new_uuid()
    xml = incoming_xml(uuid)
    before = time.time()
    rc, out, err = migrate(env, xml)
    assert (rc, err) == (0, '')
    # A has the most room; nothing else moved, byte for byte
    assert out == xml.replace(("parent='%s'" % SOURCE_GPU).encode(),
                              ("parent='%s'" % A).encode())
    lease = lease_of(env, uuid)
    assert (lease.domain_uuid, str(lease.parent), lease.state) == (
        DOM, A, state.RESERVED)
    assert lease.expires_at >= before + incoming.HOLD_SECONDS
    assert 'incoming vGPU %s (nvidia-223) reserved on %s' % (uuid, A) \
        in env.log()
    assert uuid not in env.sysfs.kernel.mdevs()      # nothing created yet


def test_prepare_turns_the_reservation_into_the_vgpu(env):
    uuid = th.new_uuid()
    rc, out, _ = migrate(env, incoming_xml(uuid))
    assert rc == 0
    free_before = _capacity(env)
    assert env.run('prepare', out) == (0, '')
    assert str(env.sysfs.kernel.mdevs()[uuid][0]) == A
    lease = lease_of(env, uuid)
    assert (lease.state, lease.expires_at) == (state.CREATED, None)
    assert len(env.leases()) == 1
    assert _capacity(env) == free_before        # counted once, not twice
    assert env.run('release', out) == (0, '')
    assert env.leases() == []


def _capacity(env):
    """``{GPU: free}`` for nvidia-223, as the hook's allocator counts."""
    from libvirt_gpu.guests.hook import settings as settings_mod
    settings, _ = settings_mod.load_settings(env.config, env.settings_file)
    return environment.Environment.for_hook(
        settings, env.sysfs, mdevctl_dir=env.mdevctl_dir
    ).allocator.capacity('nvidia-223')


def test_a_uuid_taken_here_is_replaced_in_metadata_and_hostdev(env):
    # EXISTING is a vGPU of this host already (on B)
    xml = incoming_xml(EXISTING)
    rc, out, err = migrate(env, xml)
    assert (rc, err) == (0, '')
    (lease,) = [lease for lease in env.leases()]
    new = lease.vgpu_uuid
    assert new != EXISTING and str(lease.parent) == A
    assert out == xml.replace(EXISTING.encode(), new.encode()).replace(
        ("parent='%s'" % SOURCE_GPU).encode(), ("parent='%s'" % A).encode())
    assert 'was %s on the source' % EXISTING in env.log()
    assert env.run('prepare', out) == (0, '')
    assert str(env.sysfs.kernel.mdevs()[new][0]) == A
    assert str(env.sysfs.kernel.mdevs()[EXISTING][0]) == B   # untouched


def test_a_uuid_leased_here_to_another_domain_is_replaced(env):
    uuid = th.new_uuid()
    other = th.domain_xml([(uuid, 'nvidia-223', None)],
                          uuid=th.new_uuid())
    assert env.run('prepare', other) == (0, '')
    rc, out, err = migrate(env, incoming_xml(uuid))
    assert (rc, err) == (0, '')
    assert uuid.encode() not in out


def test_an_entry_without_parent_keeps_any_gpu(env):
    uuid = th.new_uuid()
    xml = incoming_xml(uuid, parent=None)
    rc, out, err = migrate(env, xml)
    # the reservation is made (on A), the XML needs no change: nothing
    # printed means "unchanged" to libvirt
    assert (rc, out, err) == (0, b'', '')
    assert str(lease_of(env, uuid).parent) == A
    assert env.run('prepare', xml) == (0, '')
    assert str(env.sysfs.kernel.mdevs()[uuid][0]) == A
    assert len(env.leases()) == 1


def test_a_retried_migration_renews_its_reservation(env):
    uuid = th.new_uuid()
    first = migrate(env, incoming_xml(uuid))
    expires = lease_of(env, uuid).expires_at
    time.sleep(0.01)
    second = migrate(env, incoming_xml(uuid))
    assert first == second
    assert len(env.leases()) == 1
    assert lease_of(env, uuid).expires_at > expires


def test_a_guest_without_our_vgpus_is_left_alone(env):
    rc, out, err = migrate(env, th.domain_xml(hostdevs=[]))
    assert (rc, out, err) == (0, b'', '')
    assert env.leases() == []


# --- refused: exit 1, one line, nothing reserved ---------------------------

def refused(env, xml):
    rc, out, err = migrate(env, xml)
    assert (rc, out) == (1, b'')
    assert err.count('\n') == 1 and 'cannot migrate in domain' in err
    assert env.leases() == []
    return err


def test_refused_type_not_enabled(env):
    xml = incoming_xml(th.new_uuid()).replace(b'nvidia-223', b'nvidia-224')
    assert 'nvidia-224' in refused(env, xml)


def test_refused_without_room_and_nothing_half_reserved(env):
    # 14 fit (8 on A, 6 on B); the 15th does not: none is reserved
    uuids = [th.new_uuid() for _ in range(15)]
    xml = th.domain_xml([(u, 'nvidia-223', SOURCE_GPU) for u in uuids])
    assert 'No capacity left' in refused(env, xml)
    assert migrate(env, th.domain_xml(
        [(u, 'nvidia-223', SOURCE_GPU) for u in uuids[:14]]))[0] == 0
    assert len(env.leases()) == 14


def test_refused_whole_gpu(env):
    xml = incoming_xml(th.new_uuid(), pgpu="<g:pgpu address='%s'/>" % A)
    xml = xml.replace(b'</devices>', (
        "<hostdev mode='subsystem' type='pci' managed='yes'><source>"
        "<address domain='0x0000' bus='0x3b' slot='0x00' function='0x0'/>"
        "</source></hostdev></devices>").encode())
    assert 'VFIO cannot migrate' in refused(env, xml)


def test_held_reservations_count_against_capacity(env):
    before = _capacity(env)
    uuids = [th.new_uuid() for _ in range(4)]
    assert migrate(env, th.domain_xml(
        [(u, 'nvidia-223', SOURCE_GPU) for u in uuids]))[0] == 0
    after = _capacity(env)
    assert sum(before.values()) - sum(after.values()) == 4


# --- expiry: reconcile frees a reservation whose prepare never came ---------

def _reconcile(env, tmp_path):
    conn = fake_libvirt.FakeConnection(tmp_path / 'doms')
    return reconcile.reconcile(environment.Environment(
        env.state_dir, sysfs=env.sysfs,
        host=host_mod.Host.from_connection(conn),
        mdevctl_dir=env.mdevctl_dir))


def test_reconcile_keeps_a_held_reservation_then_frees_it(env, tmp_path):
    uuid = th.new_uuid()
    assert migrate(env, incoming_xml(uuid))[0] == 0
    _holder_gone(env, uuid)       # the migrate hook has exited
    report = _reconcile(env, tmp_path)
    assert [f.action for f in report.findings if f.uuid == uuid] == [
        reconcile.INCOMING]                 # listed, kept
    assert [lease.vgpu_uuid for lease in env.leases()] == [uuid]
    _holder_gone(env, uuid, expires_at=time.time() - 1)   # prepare never came
    report = _reconcile(env, tmp_path)
    (finding,) = [f for f in report.findings if f.uuid == uuid]
    assert finding.action == reconcile.REMOVED
    assert 'its prepare never came' in finding.reason
    assert env.leases() == []


def test_an_expired_reservation_is_named_as_stale(env):
    uuids = [th.new_uuid() for _ in range(14)]
    assert migrate(env, th.domain_xml(
        [(u, 'nvidia-223', SOURCE_GPU) for u in uuids]))[0] == 0
    for u in uuids:
        _holder_gone(env, u)
    rc, err = env.run('prepare', th.domain_xml(
        [(th.new_uuid(), 'nvidia-223', None)], uuid=th.new_uuid()))
    assert rc == 1 and 'died' not in err      # held: not stale
    for u in uuids:
        _holder_gone(env, u, expires_at=time.time() - 1)
    rc, err = env.run('prepare', th.domain_xml(
        [(th.new_uuid(), 'nvidia-223', None)], uuid=th.new_uuid()))
    assert rc == 1 and '14 lease(s) left by processes that died' in err


# --- the vendor interface: the hostdev names a free VF here -----------------

def test_vendor_interface_names_a_free_vf_here(fast_tmp):
    l40s = tv.World('l40s', fast_tmp, 'nvidia-1145',
                    '%s, %s' % (tv.L1, tv.L2))
    uuid = th.new_uuid()
    xml = tv.vf_domain_xml(uuid, '0000:17:00.5')       # the source's VF
    out, err = io.BytesIO(), io.StringIO()
    rc = hook.run(['qemu', 'vm1', 'migrate', 'begin', '-'], xml,
                  config_file=l40s.config, sysfs=l40s.sysfs, stderr=err,
                  mdevctl_dir=l40s.mdevctl, stdout=out)
    assert (rc, err.getvalue()) == (0, '')
    # the GPU with most room, its first free VF
    assert out.getvalue() == xml.replace(
        b"parent='0000:17:00.5'", b"parent='0000:bd:00.4'").replace(
        b"bus='0x17' slot='0x00' function='0x5'",
        b"bus='0xbd' slot='0x00' function='0x4'")
    (lease,) = l40s.leases()
    assert (lease.vgpu_uuid, str(lease.parent)) == (uuid, '0000:bd:00.4')
    assert l40s.hook('prepare', out.getvalue()) == (0, '')
    assert tv.vendor(l40s.sysfs).current_type('0000:bd:00.4') == 1145
    (lease,) = l40s.leases()
    assert lease.state == state.CREATED


def test_a_lease_file_of_schema_1_gains_the_expiry(tmp_path):
    import sqlite3
    old = state._SCHEMA.replace(',\n    expires_at  REAL\n', '\n')
    assert 'expires_at' not in old
    os.makedirs(tmp_path / 'st')
    db = sqlite3.connect(str(tmp_path / 'st' / state.DB_NAME))
    db.executescript(old)
    db.execute("INSERT INTO leases VALUES (?, ?, ?, 'nvidia-223', "
               "'created', 1, NULL, 0, 0)", (th.new_uuid(), DOM, A))
    db.execute('PRAGMA user_version = 1')
    db.commit()
    db.close()
    for path in (tmp_path / 'boot', tmp_path / 'st' / state.BOOT_ID_NAME):
        path.write_text('this boot\n')
    (lease,) = state.LeaseStore(str(tmp_path / 'st'),
                                boot_id_path=str(tmp_path / 'boot')).leases()
    assert lease.expires_at is None and not lease.held(time.time())


@pytest.mark.parametrize('op', hook.HANDLED)
def test_the_script_run_without_stdin_follows_the_table(op):
    """hooks/qemu answers a call with stdin closed before importing
    anything, by its own list of the operations that may refuse: it must
    be the table's (``migrate`` and ``prepare`` exit 1, the others 0)."""
    done = subprocess.run(
        [sys.executable, '-IS', os.path.join(paths.ROOT, 'hooks', 'qemu'),
         'vm1', op, 'begin', '-'], preexec_fn=lambda: os.close(0),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, timeout=60)
    assert done.returncode == hook.operation(op).failure_rc
    assert b'no domain XML on stdin' in done.stderr
    assert done.stdout == b''


def test_the_installed_hook_prints_the_rewritten_xml(env, tmp_path):
    """The installed file, run as libvirt runs it on the destination: the
    XML comes back on stdout and its prepare creates the vGPU there; a
    refusal prints nothing and exits 1."""
    from tests.doubles import kernel_sysfs
    done = hook.install(str(tmp_path / 'hooks'), env.config)
    uuid = th.new_uuid()
    xml = incoming_xml(uuid)
    clean_env = {'LC_ALL': 'C', 'PATH': '/usr/bin:/bin', 'HOME': '/root'}

    def run(op, data):
        return subprocess.run([done.path, 'vm1', op, 'begin', '-'],
                              input=data, capture_output=True,
                              env=clean_env, timeout=60)

    with kernel_sysfs.KernelWatcher(env.root, env.sysfs.profile):
        r = run('migrate', xml)
        assert (r.returncode, r.stderr) == (0, b'')
        assert r.stdout == xml.replace(
            ("parent='%s'" % SOURCE_GPU).encode(),
            ("parent='%s'" % A).encode())
        assert run('prepare', r.stdout).returncode == 0
        assert str(env.sysfs.kernel.mdevs()[uuid][0]) == A
    r = run('migrate', xml.replace(b'nvidia-223', b'nvidia-224'))
    assert (r.returncode, r.stdout) == (1, b'')
    assert b'nvidia-224' in r.stderr
