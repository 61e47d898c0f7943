"""Leases in SQLite under an flock: atomicity, crash safety, exclusion."""

import fcntl
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap

import pytest

from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.store import state
from libvirt_gpu.util import records
from tests.doubles import paths

# The store takes values parsed where they entered the program.
U1 = objects.Uuid.parse('4b20d080-1b54-4048-85b3-a6a62d165c01')
U2 = objects.Uuid.parse('b1ae8bf6-38b0-4c81-9d44-78ce3f520496')
DOM = objects.Uuid.parse('c7a5fdbd-cdaf-9455-926a-d65c16db1809')
AF = objects.PciAddress.parse('0000:af:00.0')
T223 = objects.TypeId.parse('nvidia-223')
ROOT = paths.ROOT


@pytest.fixture
def store(tmp_path):
    return state.LeaseStore(tmp_path / 'state', lock_timeout=5)


def run_child(code, env=None):
    """Run ``code`` in a fresh interpreter (cwd: the repo)."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([sys.executable, '-c', textwrap.dedent(code)],
                          cwd=ROOT, env=full_env, capture_output=True,
                          text=True, timeout=60)


def test_add_get_update_delete(store):
    with store.transaction() as txn:
        lease = txn.add(U1, DOM, AF, T223)
    assert lease.state == state.RESERVED and lease.pid == os.getpid()
    assert str(lease.parent) == '0000:af:00.0'
    with store.transaction() as txn:
        assert txn.get(U1) == lease
        assert txn.for_domain(DOM) == [lease]
        assert txn.for_parent(AF) == [lease]
        assert txn.for_parent(objects.PciAddress.parse('0000:3b:00.0')) == []
        changed = txn.update(U1, state=state.CREATED)
    assert changed.state == state.CREATED
    assert records.replace(changed, state=state.RESERVED,
                           updated_at=lease.updated_at) == lease
    with store.transaction() as txn:
        assert txn.delete(U1) is True
        assert txn.delete(U1) is False
    assert store.leases() == []


def test_files_are_private(store):
    store.leases()
    assert os.stat(store.state_dir).st_mode & 0o777 == 0o700
    assert os.stat(store.db_path).st_mode & 0o777 == 0o600
    assert os.stat(store.lock_path).st_mode & 0o777 == 0o600


def test_duplicate_uuid_is_a_conflict(store):
    with store.transaction() as txn:
        txn.add(U1, DOM, AF, T223)
    with pytest.raises(exception.LeaseConflict, match=DOM):
        with store.transaction() as txn:
            txn.add(U1, None, objects.PciAddress.parse('0000:3b:00.0'), T223)


def test_exception_rolls_back(store):
    with pytest.raises(RuntimeError):
        with store.transaction() as txn:
            txn.add(U1, DOM, AF, T223)
            raise RuntimeError('boom')
    assert store.leases() == []


def test_update_of_missing_lease(store):
    with pytest.raises(exception.StateError, match='no lease'):
        with store.transaction() as txn:
            txn.update(U1, state=state.CREATED)


@pytest.mark.parametrize('bad', ['../x', U1 + '\n', "'; DROP TABLE x",
                                 str(U1)])
def test_raw_text_is_refused(store, bad):
    # Text is parsed where it enters the program, never here: even a good
    # UUID as a plain str is a programming error.
    with pytest.raises(TypeError, match=r'objects\.Uuid\.parse'):
        with store.transaction() as txn:
            txn.add(bad, DOM, AF, T223)
    with pytest.raises(TypeError, match='objects.TypeId'):
        with store.transaction() as txn:
            txn.add(U1, DOM, AF, str(T223))
    with pytest.raises(TypeError, match='objects.PciAddress'):
        with store.transaction() as txn:
            txn.add(U1, DOM, '0000:af:00.0', T223)
    assert store.leases() == []


def test_sigkill_inside_a_transaction_leaves_nothing_and_no_lock(store):
    r = run_child('''
        import os, signal
        from libvirt_gpu import objects
        from libvirt_gpu.store import state
        s = state.LeaseStore(%r)
        with s.transaction() as txn:
            txn.add(objects.Uuid.parse(%r), objects.Uuid.parse(%r),
                    objects.PciAddress.parse('0000:af:00.0'),
                    objects.TypeId.parse('nvidia-223'))
            os.kill(os.getpid(), signal.SIGKILL)
    ''' % (store.state_dir, U1, DOM))
    assert r.returncode == -signal.SIGKILL, r.stderr
    # The flock died with the process: a non-blocking lock is granted.
    fd = os.open(store.lock_path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
    assert store.leases() == []


def test_sigkill_after_commit_leaves_a_lease_with_a_dead_holder(store):
    r = run_child('''
        import os, signal
        from libvirt_gpu import objects
        from libvirt_gpu.store import state
        s = state.LeaseStore(%r)
        with s.transaction() as txn:
            txn.add(objects.Uuid.parse(%r), objects.Uuid.parse(%r),
                    objects.PciAddress.parse('0000:af:00.0'),
                    objects.TypeId.parse('nvidia-223'))
        os.kill(os.getpid(), signal.SIGKILL)
    ''' % (store.state_dir, U1, DOM))
    assert r.returncode == -signal.SIGKILL, r.stderr
    (lease,) = store.leases()
    assert lease.vgpu_uuid == U1 and not lease.holder_alive()


def test_lock_excludes_other_processes(store):
    store.leases()
    holder = subprocess.Popen([sys.executable, '-c', textwrap.dedent('''
        import sys, time
        from libvirt_gpu.store import state
        s = state.LeaseStore(%r)
        with s.transaction() as txn:
            print('locked', flush=True)
            time.sleep(30)
    ''' % store.state_dir)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == 'locked'
        impatient = state.LeaseStore(store.state_dir, lock_timeout=0.2)
        with pytest.raises(exception.StateError, match='still locked'):
            impatient.leases()
    finally:
        holder.kill()
        holder.wait()
    assert store.leases() == []


def test_holder_alive_guards_against_pid_reuse(store):
    with store.transaction() as txn:
        lease = txn.add(U1, DOM, AF, T223)
    assert lease.holder_alive() and lease.held_by_me()
    reused = records.replace(lease, pid_start=lease.pid_start + 1)
    assert not reused.holder_alive()
    gone = records.replace(lease, pid=2 ** 22 + 7)
    assert not gone.holder_alive()


def test_newer_schema_refused(store):
    store.leases()
    db = sqlite3.connect(store.db_path)
    db.execute('PRAGMA user_version = 99')
    db.close()
    with pytest.raises(exception.StateError, match='newer'):
        state.LeaseStore(store.state_dir).leases()


def test_garbage_state_file_is_a_clear_error(store):
    store.leases()
    for suffix in ('-wal', '-shm'):
        if os.path.exists(store.db_path + suffix):
            os.unlink(store.db_path + suffix)
    with open(store.db_path, 'w') as f:
        f.write('this is not a database' * 100)
    with pytest.raises(exception.StateError, match=store.db_path):
        state.LeaseStore(store.state_dir).leases()


def test_crash_point_kills_at_the_named_occurrence():
    code = '''
        from libvirt_gpu.store import state
        for i in range(3):
            print(i, flush=True)
            state.crash_point('attach:created')
        print('survived', flush=True)
    '''
    r = run_child(code, {state.CRASH_ENV: 'attach:created@2'})
    assert r.returncode == -signal.SIGKILL
    assert r.stdout.split() == ['0', '1']
    r = run_child(code, {state.CRASH_ENV: 'prepare:created'})
    assert r.returncode == 0 and 'survived' in r.stdout


def test_leases_of_an_earlier_boot_are_set_aside(tmp_path):
    boot = tmp_path / 'boot_id'
    boot.write_text('1111\n')
    first = state.LeaseStore(tmp_path / 'state', boot_id_path=str(boot))
    with first.transaction() as txn:
        txn.add(U1, DOM, AF, T223)
    again = state.LeaseStore(tmp_path / 'state', boot_id_path=str(boot))
    assert [lease.vgpu_uuid for lease in again.leases()] == [U1]
    boot.write_text('2222\n')              # the host rebooted
    after = state.LeaseStore(tmp_path / 'state', boot_id_path=str(boot))
    assert after.leases() == []
    assert os.path.exists(after.db_path + '.previous-boot')
    assert (tmp_path / 'state' / 'boot_id').read_text() == '2222\n'


def test_a_garbled_file_of_an_earlier_boot_does_not_matter(tmp_path):
    boot = tmp_path / 'boot_id'
    boot.write_text('1111\n')
    store = state.LeaseStore(tmp_path / 'state', boot_id_path=str(boot))
    store.leases()
    with open(store.db_path, 'r+b') as f:
        f.write(b'\0garbage after a power cut' * 50)
    boot.write_text('2222\n')
    assert state.LeaseStore(tmp_path / 'state',
                            boot_id_path=str(boot)).leases() == []


def test_a_lease_file_written_before_the_vgpu_rename_still_opens(tmp_path):
    """Leases name a vGPU of any kind ``vgpu_uuid``; the column on disk
    kept its first name, ``mdev_uuid``, so a file an earlier release wrote
    (this exact schema) is read, updated and freed as it is."""
    boot = tmp_path / 'boot_id'
    boot.write_text('1111\n')
    state_dir = tmp_path / 'state'
    state_dir.mkdir(mode=0o700)
    (state_dir / 'boot_id').write_text('1111\n')
    db = sqlite3.connect(str(state_dir / state.DB_NAME))
    db.executescript("""
        CREATE TABLE leases (
            mdev_uuid TEXT PRIMARY KEY NOT NULL, domain_uuid TEXT,
            parent TEXT NOT NULL, type_id TEXT NOT NULL,
            state TEXT NOT NULL CHECK (state IN ('reserved', 'created',
                                                 'removing')),
            pid INTEGER NOT NULL, pid_start INTEGER,
            created_at REAL NOT NULL, updated_at REAL NOT NULL);
        CREATE TABLE borrowed (mdev_uuid TEXT PRIMARY KEY NOT NULL,
            domain_uuid TEXT NOT NULL, created_at REAL NOT NULL);
    """)
    db.execute("INSERT INTO leases VALUES (?, ?, '0000:af:00.0', "
               "'nvidia-223', 'created', 1, NULL, 1.0, 1.0)", (U1, DOM))
    db.execute('INSERT INTO borrowed VALUES (?, ?, 1.0)', (U2, DOM))
    db.commit()
    db.close()
    store = state.LeaseStore(state_dir, boot_id_path=str(boot))
    [lease] = store.leases()
    assert (lease.vgpu_uuid, lease.domain_uuid, str(lease.parent)) == (
        U1, DOM, '0000:af:00.0')
    with store.transaction() as txn:
        assert txn.borrowed() == {U2: (DOM, 1.0)}
        txn.give_back(DOM, [U2])
        assert txn.borrowed() == {}
        assert txn.update(U1, state=state.REMOVING).state == state.REMOVING
        txn.delete(U1)
    assert store.leases() == [] and not hasattr(lease, 'mdev_uuid')


def test_holder_line_is_written_over_never_truncated_to_zero(
        tmp_path, monkeypatch):
    # ext4 flushes a file truncated to zero at close (auto_da_alloc):
    # milliseconds on every transaction.  The line is written over the
    # last holder's, then the file is cut to its length.
    path = tmp_path / 'lock'
    path.write_bytes(b'99999999 ' + b'x' * 300 + b'\n')
    truncated = []
    real_ftruncate = os.ftruncate
    monkeypatch.setattr(os, 'ftruncate', lambda fd, size: (
        truncated.append(size), real_ftruncate(fd, size))[1])
    fd = os.open(path, os.O_RDWR)
    try:
        state._record_holder(fd)
        assert 0 not in truncated
        line = path.read_bytes()
        assert line.startswith(b'%d ' % os.getpid())
        assert b'x' * 10 not in line        # the last holder's is gone
        assert 'process %d (' % os.getpid() in state._holder(fd, 'lock')
    finally:
        os.close(fd)
