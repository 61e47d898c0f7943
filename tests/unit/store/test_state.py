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
import errno
from tests.doubles import poll

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


# --- what make mutation found ----------------------------------------------
#
# What the lease store (store/state.py) promises that test_state and
# test_state_guards left open: each test here fails on a change ``make
# mutation`` made that those stayed green on (docs/dev/mutation.md) -- the
# whole refusal a user reads, the order and the fields of what a
# transaction returns, the boundaries of each bounded read, what a
# migration's reservation and a lease's holder mean, and what a snapshot
# reads.
#
# Nothing waits: a lock is held by a second open file description of this
# process (``flock`` excludes those too) and the store is told to wait
# 0.05 s.  A process in a given state (a zombie, a renamed one) is a forked
# child told to go on through a pipe.  The tests run as root: another
# user's file is made with ``os.chown``.

U3 = objects.Uuid.parse('0a000000-0000-4000-8000-000000000003')
DOM2 = objects.Uuid.parse('d7a5fdbd-cdaf-9455-926a-d65c16db1809')
B3 = objects.PciAddress.parse('0000:3b:00.0')
T224 = objects.TypeId.parse('nvidia-224')
OTHER = 4242            # a uid nobody here has
NOT_A_DOMAIN = r'^domain_uuid must be an objects\.Uuid, not str'
NOT_A_VGPU = r'^vgpu_uuid must be an objects\.Uuid, not str'
NOT_A_PARENT = r'^parent must be an objects\.PciAddress, not str'
BOOT = '1111aaaa-0000-4000-8000-000000000000'

root_only = pytest.mark.skipif(os.geteuid() != 0,
                               reason='makes files of another user')


@pytest.fixture
def boot(tmp_path):
    path = tmp_path / 'boot_id'
    path.write_text(BOOT + '\n')
    return path


@pytest.fixture
def boots(tmp_path, boot):
    s = state.LeaseStore(tmp_path / 'state', lock_timeout=0.05,
                         boot_id_path=str(boot))
    yield s
    s.close()


def _message(call):
    with pytest.raises(exception.StateError) as e:
        call()
    return str(e.value)


def _lease(**changes):
    values = dict(vgpu_uuid=U1, domain_uuid=DOM, parent=AF, type_id=T223,
                  state=state.RESERVED, pid=os.getpid(),
                  pid_start=state.process_start(os.getpid()),
                  created_at=1.0, updated_at=1.0)
    values.update(changes)
    return state.Lease(**values)


def _unwal(boots):
    boots.close()
    for suffix in ('-wal', '-shm'):
        if os.path.exists(boots.db_path + suffix):
            os.unlink(boots.db_path + suffix)


def _foreign(boots, script):
    """The store's directory holding a lease file made by ``script``."""
    os.makedirs(boots.state_dir, mode=0o700, exist_ok=True)
    with open(os.path.join(boots.state_dir, state.BOOT_ID_NAME), 'w') as f:
        f.write(BOOT + '\n')
    _sql(boots, script)
    return boots


def _sql(boots, script):
    """Run ``script`` on the store's lease file as another program would
    (its own SQLite connection, committed)."""
    db = sqlite3.connect(boots.db_path)
    db.executescript(script)
    db.commit()
    db.close()


class Child(object):
    """A forked child that runs ``setup()``, says so through a pipe and
    then waits until ``end()`` (or, with ``exit_at_once``, exits at once
    and stays a zombie until reaped)."""

    def __init__(self, setup=lambda: None, exit_at_once=False):
        ready_r, ready_w = os.pipe()
        self.end_r, end_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            try:
                os.close(end_w)
                setup()
                os.write(ready_w, b'x')
                if not exit_at_once:
                    os.read(self.end_r, 1)
            finally:
                os._exit(0)
        os.close(ready_w)
        self._end_w = end_w
        assert os.read(ready_r, 1) == b'x'
        os.close(ready_r)

    def end(self):
        os.close(self._end_w)
        os.close(self.end_r)
        os.waitpid(self.pid, 0)


# --- a lease's meaning -------------------------------------------------------

def test_a_reservation_stands_until_its_expiry_and_not_at_it():
    lease = _lease(expires_at=100.0)
    assert lease.held(99.5)
    assert not lease.held(100.0)
    assert not lease.held(100.5)
    assert not _lease().held(0.0)       # no expiry: not a reservation


def test_a_row_whose_type_is_no_type_id_is_named_when_used():
    assert _lease().checked_type_id() == T223
    bad = _lease(type_id=None, bad_type_id='nvidia 223')
    with pytest.raises(exception.InvalidTypeId) as e:
        bad.checked_type_id()
    assert "'nvidia 223' is not a valid vGPU type id" in str(e.value)


def test_a_holder_without_a_start_time_is_alive_while_its_pid_runs():
    assert _lease(pid_start=None).holder_alive()
    assert not _lease(pid=2 ** 22 + 7, pid_start=None).holder_alive()


def test_held_by_me_wants_this_pid_alive_with_this_start():
    assert _lease().held_by_me()
    parent = os.getppid()
    other = _lease(pid=parent, pid_start=state.process_start(parent))
    assert other.holder_alive() and not other.held_by_me()
    assert not _lease(pid_start=_lease().pid_start + 1).held_by_me()


# --- the holder's start time -------------------------------------------------

def _stat_field_22(pid):
    with open('/proc/%d/stat' % pid) as f:
        text = f.read()
    return int(text[text.rindex(')') + 2:].split()[19])


def test_process_start_is_the_stat_start_time():
    assert state.process_start(os.getpid()) == _stat_field_22(os.getpid())
    assert state.process_start(2 ** 22 + 7) is None


def test_process_start_reads_past_a_command_holding_parentheses():
    def rename():
        with open('/proc/self/comm', 'w') as f:
            f.write('a) b c d e f g')
    child = Child(rename)
    try:
        with open('/proc/%d/stat' % child.pid, 'rb') as f:
            assert b'(a) b c d e f g)' in f.read()
        start = state.process_start(child.pid)
        assert start == _stat_field_22(child.pid)
    finally:
        child.end()


def test_a_zombie_holds_nothing():
    child = Child(exit_at_once=True)
    try:
        assert poll.wait_for(lambda: _state_letter(child.pid) == 'Z')
        assert state.process_start(child.pid) is None
    finally:
        os.waitpid(child.pid, 0)
        os.close(child._end_w)
        os.close(child.end_r)


def _state_letter(pid):
    with open('/proc/%d/stat' % pid) as f:
        text = f.read()
    return text[text.rindex(')') + 2]


# --- crash points ------------------------------------------------------------

@pytest.fixture
def kills(monkeypatch):
    killed = []
    monkeypatch.setattr(state, '_crash_counts', {})
    monkeypatch.setattr(os, 'kill', lambda pid, sig: killed.append(
        (pid, sig)))
    return killed


@pytest.mark.parametrize('wanted, at', [
    ('attach:created', 1), ('attach:created@1', 1),
    ('attach:created@3', 3), ('attach:created@x', 1)])
def test_a_crash_point_fires_at_its_occurrence(monkeypatch, kills, wanted,
                                               at):
    import signal
    monkeypatch.setenv(state.CRASH_ENV, wanted)
    for i in range(1, 5):
        state.crash_point('attach:other')
        state.crash_point('attach:other')      # counted apart, never fired
        state.crash_point('attach:created')
        assert kills == ([(os.getpid(), signal.SIGKILL)] if i >= at else [])


def test_no_crash_point_without_the_variable(monkeypatch, kills):
    monkeypatch.setenv(state.CRASH_ENV, '')
    state.crash_point('')
    monkeypatch.delenv(state.CRASH_ENV)
    state.crash_point('attach:created')
    assert kills == []


# --- what a transaction reads and writes -------------------------------------

def test_leases_come_oldest_first_then_by_uuid(boots, monkeypatch):
    clock = iter([10.0, 20.0])
    monkeypatch.setattr(state.time, 'time', lambda: next(clock))
    with boots.transaction() as txn:
        txn.add(U2, DOM, AF, T223)
    with boots.transaction() as txn:
        txn.add(U3, DOM, AF, T223)
        txn.add(U1, DOM, AF, T223)
        assert [lease.vgpu_uuid for lease in txn.all()] == [U2, U3, U1]
        assert [lease.created_at for lease in txn.all()] == [10.0, 20.0,
                                                             20.0]


def test_an_added_lease_is_this_process_at_the_transactions_time(
        boots, monkeypatch):
    monkeypatch.setattr(state.time, 'time', lambda: 1234.5)
    with boots.transaction() as txn:
        added = txn.add(U1, None, AF, T223, state=state.CREATED,
                        expires_at=2000.0)
    assert added == state.Lease(
        vgpu_uuid=U1, domain_uuid=None, parent=AF, type_id=T223,
        state=state.CREATED, pid=os.getpid(),
        pid_start=state.process_start(os.getpid()), created_at=1234.5,
        updated_at=1234.5, expires_at=2000.0)
    assert boots.leases() == [added]


def test_add_refuses_a_state_that_is_none_of_the_three(boots):
    with pytest.raises(ValueError, match='^held$'):
        with boots.transaction() as txn:
            txn.add(U1, DOM, AF, T223, state='held')
    for each in state.STATES:
        with boots.transaction() as txn:
            assert txn.add(U1, DOM, AF, T223, state=each).state == each
            txn.delete(U1)


def test_a_uuid_leased_twice_names_the_domain_holding_it(boots):
    with boots.transaction() as txn:
        txn.add(U1, DOM, AF, T223)
    with pytest.raises(exception.LeaseConflict) as e:
        with boots.transaction() as txn:
            txn.add(U1, DOM2, B3, T224)
    assert str(e.value) == 'vGPU %s is held by domain %s' % (U1, DOM)
    with pytest.raises(TypeError, match=NOT_A_DOMAIN):
        with boots.transaction() as txn:
            txn.add(U2, str(DOM), AF, T223)
    with pytest.raises(TypeError, match=NOT_A_PARENT):
        with boots.transaction() as txn:
            txn.add(U2, DOM, str(AF), T223)
    with pytest.raises(TypeError, match=r'^type_id must be an objects\.'
                                        r'TypeId, not str'):
        with boots.transaction() as txn:
            txn.add(U2, DOM, AF, str(T223))


def test_get_for_domain_and_for_parent_select_exactly(boots):
    with boots.transaction() as txn:
        txn.add(U1, DOM, AF, T223)
        txn.add(U2, DOM2, B3, T223)
        txn.add(U3, DOM, B3, T224)
        assert txn.get(U2).domain_uuid == DOM2
        assert txn.get(objects.Uuid.parse(
            '00000000-0000-4000-8000-000000000000')) is None
        assert [x.vgpu_uuid for x in txn.for_domain(DOM)] == [U3, U1]
        assert [x.vgpu_uuid for x in txn.for_domain(DOM2)] == [U2]
        assert [x.vgpu_uuid for x in txn.for_parent(B3)] == [U3, U2]
        assert txn.delete(U2) is True
        assert [x.vgpu_uuid for x in txn.all()] == [U3, U1]
    with pytest.raises(TypeError, match=NOT_A_DOMAIN):
        with boots.transaction() as txn:
            txn.for_domain(str(DOM))
    with pytest.raises(TypeError, match=NOT_A_PARENT):
        with boots.transaction() as txn:
            txn.for_parent(str(AF))


def _foreign_row(boots, pid=1, pid_start=7, expires_at=500.0):
    with boots.transaction() as txn:
        txn.add(U1, DOM, AF, T223)
    db = sqlite3.connect(boots.db_path)
    db.execute('UPDATE leases SET pid = ?, pid_start = ?, created_at = 5.0, '
               'updated_at = 5.0, expires_at = ?',
               (pid, pid_start, expires_at))
    db.commit()
    db.close()


def test_update_takes_the_lease_over_and_ends_its_reservation(
        boots, monkeypatch):
    _foreign_row(boots)
    monkeypatch.setattr(state.time, 'time', lambda: 99.0)
    with boots.transaction() as txn:
        changed = txn.update(U1, state=state.CREATED)
    assert changed == state.Lease(
        vgpu_uuid=U1, domain_uuid=DOM, parent=AF, type_id=T223,
        state=state.CREATED, pid=os.getpid(),
        pid_start=state.process_start(os.getpid()), created_at=5.0,
        updated_at=99.0, expires_at=None)
    assert boots.leases() == [changed]


def test_update_changes_each_named_field(boots):
    _foreign_row(boots)
    with boots.transaction() as txn:
        changed = txn.update(U1, domain_uuid=DOM2, parent=B3,
                             type_id=T224, expires_at=800.0)
    assert (changed.domain_uuid, changed.parent, changed.type_id,
            changed.state, changed.expires_at) == (DOM2, B3, T224,
                                                   state.RESERVED, 800.0)
    with boots.transaction() as txn:
        assert txn.update(U1, domain_uuid=None).domain_uuid is None
    assert boots.leases()[0].domain_uuid is None


def test_update_refuses_what_it_may_not_change(boots):
    with boots.transaction() as txn:
        txn.add(U1, DOM, AF, T223)
    with pytest.raises(ValueError) as e:
        with boots.transaction() as txn:
            txn.update(U1, pid=1, created_at=0.0, state=state.CREATED)
    assert e.value.args == (['created_at', 'pid'],)
    with pytest.raises(ValueError, match='^gone$'):
        with boots.transaction() as txn:
            txn.update(U1, state='gone')
    for name, value in (('parent', str(B3)), ('type_id', str(T224)),
                        ('domain_uuid', str(DOM2))):
        with pytest.raises(TypeError, match='^%s must be' % name):
            with boots.transaction() as txn:
                txn.update(U1, **{name: value})
    assert boots.leases()[0].state == state.RESERVED


def test_updating_no_lease_names_it(boots):
    said = _message(lambda: boots.transaction().__enter__().update(
        U2, state=state.CREATED))
    boots.close()
    assert said == 'State file leases: no lease for %s' % U2


# --- borrowed mdevs ----------------------------------------------------------

def test_borrowed_mdevs_are_recorded_replaced_and_given_back(
        boots, monkeypatch):
    monkeypatch.setattr(state.time, 'time', lambda: 42.0)
    with boots.transaction() as txn:
        assert txn.borrower(U1) is None
        txn.borrow(U1, DOM)
        txn.borrow(U2, DOM)
        txn.borrow(U3, DOM2)
        assert txn.borrower(U1) == DOM and txn.borrower(U3) == DOM2
        txn.borrow(U3, DOM)                 # replaced
        assert txn.borrowed() == {U1: (DOM, 42.0), U2: (DOM, 42.0),
                                  U3: (DOM, 42.0)}
        txn.borrow(U3, DOM2)
        txn.give_back(DOM, [U2])
        assert txn.borrowed() == {U1: (DOM, 42.0), U3: (DOM2, 42.0)}
        txn.give_back(DOM)
        assert txn.borrowed() == {U3: (DOM2, 42.0)}
        assert all(isinstance(k, objects.Uuid) and isinstance(v[0],
                                                              objects.Uuid)
                   for k, v in txn.borrowed().items())
        assert isinstance(txn.borrower(U3), objects.Uuid)
    with pytest.raises(TypeError, match=NOT_A_DOMAIN):
        with boots.transaction() as txn:
            txn.give_back(str(DOM2))
    with pytest.raises(TypeError, match=NOT_A_DOMAIN):
        with boots.transaction() as txn:
            txn.borrow(U1, str(DOM2))
    with pytest.raises(TypeError, match=NOT_A_VGPU):
        with boots.transaction() as txn:
            txn.borrow(str(U1), DOM2)
    with boots.transaction() as txn:
        assert txn.borrowed() == {U3: (DOM2, 42.0)}


def test_the_holder_named_is_the_kernels_else_the_recorded_one(tmp_path):
    path = tmp_path / 'lock'
    path.write_bytes(b'1 init\n')
    fd = os.open(path, os.O_RDWR)
    other = os.open(path, os.O_RDWR)
    try:
        assert state._holder(fd, 'L').startswith('process 1 (')
        path.write_bytes(b'')
        assert state._holder(fd, 'L') == (
            'an unknown process; find it with `fuser -v L`')
        path.write_bytes(b'1 init\n')
        fcntl.flock(other, fcntl.LOCK_EX)
        assert state._holder(fd, 'L').startswith('process %d ('
                                                 % os.getpid())
    finally:
        os.close(other)
        os.close(fd)


# --- the lock ----------------------------------------------------------------

def test_the_lock_file_names_this_process_and_nothing_else(boots):
    boots.leases()
    with open('/proc/self/cmdline', 'rb') as f:
        command = f.read(400).replace(b'\0', b' ').strip()
    with open(boots.lock_path, 'rb') as f:
        assert f.read() == b'%d %s\n' % (os.getpid(), command[:400])


@pytest.mark.parametrize('text, pid', [
    (b'1234 /usr/bin/python3 hook\n', 1234), (b'1234', 1234),
    (b'x1234 hook\n', None), (b'', None), (b' 1234 hook', None)])
def test_the_recorded_holder_is_the_first_word_when_a_number(
        tmp_path, text, pid):
    path = tmp_path / 'lock'
    path.write_bytes(text)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert state._recorded_holder(fd) == pid
    finally:
        os.close(fd)


def test_a_held_lock_is_waited_on_briefly_and_its_holder_named(boots):
    boots.leases()
    fd = os.open(boots.lock_path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        said = _message(boots.leases)
    finally:
        os.close(fd)
    assert said.startswith('State file %s: still locked after 0 s by '
                           'process %d (' % (boots.lock_path, os.getpid()))
    assert boots.leases() == []


@root_only
def test_a_lock_file_of_another_user_is_refused(boots):
    boots.leases()
    os.chown(boots.lock_path, OTHER, OTHER)
    said = _message(boots.leases)
    assert said.startswith('State file %s: ' % boots.lock_path)


def test_a_store_waits_a_minute_unless_told(tmp_path):
    s = state.LeaseStore(tmp_path / 'state')
    assert s.lock_timeout == 60.0
    assert repr(s) == 'LeaseStore(%r)' % str(tmp_path / 'state')
    assert s.db_path == str(tmp_path / 'state' / 'leases.sqlite3')
    assert s.lock_path == str(tmp_path / 'state' / 'leases.lock')


def test_a_store_of_one_host_refuses_a_directory_of_another(tmp_path, boot):
    one = state.LeaseStore(tmp_path / 'state', lock_timeout=0.05,
                           boot_id_path=str(boot), sysfs_root='/one')
    one.leases()
    one.leases()
    other = state.LeaseStore(tmp_path / 'state', lock_timeout=0.05,
                             boot_id_path=str(boot), sysfs_root='/two')
    said = _message(other.leases)
    assert '/one' in said and '/two' in said
    assert state.LeaseStore(tmp_path / 'state',
                            boot_id_path=str(boot)).leases() == []


# --- the boot the leases belong to -------------------------------------------

def test_a_reboot_sets_the_file_and_its_wal_and_shm_aside(boots, boot):
    with boots.transaction() as txn:
        txn.add(U1, DOM, AF, T223)
    assert os.path.exists(boots.db_path + '-wal')
    assert os.path.exists(boots.db_path + '-shm')
    boot.write_text('2222\n')
    after = state.LeaseStore(boots.state_dir, boot_id_path=str(boot))
    assert after.leases() == []
    for suffix in ('', '-wal', '-shm'):
        assert os.path.exists(boots.db_path + '.previous-boot' + suffix)
    old = sqlite3.connect(boots.db_path + '.previous-boot')
    assert old.execute('SELECT mdev_uuid FROM leases').fetchall() == [
        (str(U1),)]
    old.close()


def test_without_a_boot_id_nothing_is_compared(tmp_path):
    s = state.LeaseStore(tmp_path / 'state',
                         boot_id_path=str(tmp_path / 'none'))
    with s.transaction() as txn:
        txn.add(U1, DOM, AF, T223)
    assert not os.path.exists(os.path.join(s.state_dir, state.BOOT_ID_NAME))
    again = state.LeaseStore(tmp_path / 'state',
                             boot_id_path=str(tmp_path / 'none'))
    with again.snapshot() as txn:
        assert [x.vgpu_uuid for x in txn.all()] == [U1]


def test_a_boot_id_of_64_bytes_is_one_and_of_65_is_refused(tmp_path):
    boot = tmp_path / 'boot_id'
    boot.write_text('b' * 63 + '\n')
    s = state.LeaseStore(tmp_path / 'state', boot_id_path=str(boot))
    with s.transaction() as txn:
        txn.add(U1, DOM, AF, T223)
    again = state.LeaseStore(tmp_path / 'state', boot_id_path=str(boot))
    assert [x.vgpu_uuid for x in again.leases()] == [U1]
    assert (tmp_path / 'state' / 'boot_id').read_text() == 'b' * 63 + '\n'
    boot.write_text('b' * 65)
    said = _message(state.LeaseStore(tmp_path / 'state',
                                     boot_id_path=str(boot)).leases)
    assert said == ('State file %s: longer than a boot id (64 bytes or '
                    'more)' % boot)


def test_a_recorded_boot_id_past_the_bound_is_another_boots(boots, boot):
    with boots.transaction() as txn:
        txn.add(U1, DOM, AF, T223)
    marker = os.path.join(boots.state_dir, state.BOOT_ID_NAME)
    with open(marker, 'w') as f:
        f.write(BOOT + ' ' * 221 + '\n')        # 258 bytes
    assert state.LeaseStore(boots.state_dir,
                            boot_id_path=str(boot)).leases() == []
    assert os.path.exists(boots.db_path + '.previous-boot')
    with open(marker) as f:
        assert f.read() == BOOT + '\n'


def test_a_recorded_boot_id_within_the_bound_is_read(boots, boot):
    with boots.transaction() as txn:
        txn.add(U1, DOM, AF, T223)
    marker = os.path.join(boots.state_dir, state.BOOT_ID_NAME)
    with open(marker, 'w') as f:
        f.write(BOOT + ' ' * 220 + '\n')        # 257 bytes: the same id
    assert [x.vgpu_uuid for x in state.LeaseStore(
        boots.state_dir, boot_id_path=str(boot)).leases()] == [U1]


@pytest.mark.parametrize('raw', [b'\xff\xfe-boot\n', b'\xff' * 64])
def test_a_boot_id_that_is_not_ascii_is_the_same_boot_at_each_open(
        tmp_path, raw):
    # no kernel's id has such bytes; if one did, its leases must not be
    # set aside at every open (U+FFFD written as three bytes read back as
    # three replacement characters: another boot's id)
    boot = tmp_path / 'boot_id'
    boot.write_bytes(raw)
    s = state.LeaseStore(tmp_path / 'state', boot_id_path=str(boot))
    with s.transaction() as txn:
        txn.add(U1, DOM, AF, T223)
    for _ in range(2):
        again = state.LeaseStore(tmp_path / 'state', boot_id_path=str(boot))
        assert [x.vgpu_uuid for x in again.leases()] == [U1]
        again.close()
    s.close()
    assert not os.path.exists(s.db_path + '.previous-boot')
    marker = (tmp_path / 'state' / state.BOOT_ID_NAME).read_bytes()
    assert marker.isascii() and b'\\xff' in marker
    boot.write_bytes(raw.replace(b'\xff', b'\xfe', 1))    # another boot
    assert state.LeaseStore(tmp_path / 'state',
                            boot_id_path=str(boot)).leases() == []


# --- the file and its schema -------------------------------------------------

def test_the_lease_file_is_written_ahead(boots):
    boots.leases()
    db = sqlite3.connect(boots.db_path)
    assert db.execute('PRAGMA journal_mode').fetchone()[0] == 'wal'
    db.close()


@pytest.mark.parametrize('version, refused', [(2, False), (3, True)])
def test_a_file_of_the_next_schema_is_refused(boots, version, refused):
    boots.leases()
    _unwal(boots)
    _sql(boots, 'PRAGMA user_version = %d' % version)
    again = state.LeaseStore(boots.state_dir, boot_id_path=boots.boot_id_path)
    if refused:
        assert _message(again.leases) == (
            'State file %s: written by a newer libvirt-gpu (schema 3, '
            'this one knows 2)' % boots.db_path)
    else:
        assert again.leases() == []


def _aside(path):
    return ('move it aside (`mv %s %s.broken`), then run `libvirt-gpu '
            'reconcile --dry-run`' % (path, path))


_TABLES = """
CREATE TABLE leases (mdev_uuid TEXT PRIMARY KEY NOT NULL, domain_uuid TEXT,
    parent TEXT NOT NULL, type_id TEXT NOT NULL, state TEXT NOT NULL,
    pid INTEGER NOT NULL, pid_start INTEGER, created_at REAL NOT NULL,
    updated_at REAL NOT NULL, expires_at REAL);
CREATE TABLE borrowed (mdev_uuid TEXT PRIMARY KEY NOT NULL,
    domain_uuid TEXT NOT NULL, created_at REAL NOT NULL);
"""


@pytest.mark.parametrize('script, what', [
    (_TABLES + 'CREATE VIEW v AS SELECT * FROM leases;', 'a view v'),
    (_TABLES + 'CREATE TRIGGER t AFTER INSERT ON leases BEGIN '
     'DELETE FROM leases; END;', 'a trigger t'),
    (_TABLES + 'CREATE INDEX i ON leases (type_id);', 'an index i'),
    (_TABLES + 'CREATE TABLE extra (x);', 'a table extra'),
    ('CREATE TABLE other (x); CREATE INDEX leases_domain ON other (x);',
     'an index leases_domain'),
    (_TABLES + 'CREATE TABLE "bad\nname" (x);', 'a table bad\\nname'),
    (_TABLES + 'CREATE TABLE %s (x);' % ('t' * 100), 'a table ' + 't' * 80),
])
def test_a_file_holding_what_we_never_make_is_refused(boots, script, what):
    _foreign(boots, script)
    said = _message(boots.leases)
    assert said == ('State file %s: it holds %s that libvirt-gpu never '
                    'makes, so it is another program\'s file or was '
                    'altered; %s' % (boots.db_path, what,
                                     _aside(boots.db_path)))
    with pytest.raises(exception.StateError) as e:
        with boots.snapshot():
            pass
    assert str(e.value) == said


def test_a_file_without_the_lease_table_is_not_ours(boots):
    _foreign(boots, 'CREATE TABLE borrowed (mdev_uuid TEXT, domain_uuid '
                    'TEXT, created_at REAL);')
    assert _message(boots.leases) == (
        'State file %s: it has no table leases, so it is not a lease file '
        'of libvirt-gpu; %s' % (boots.db_path, _aside(boots.db_path)))


@pytest.mark.parametrize('table, script, missing', [
    ('leases', 'CREATE TABLE leases (mdev_uuid TEXT, domain_uuid TEXT, '
     'state TEXT, pid INTEGER, pid_start INTEGER, created_at REAL, '
     'updated_at REAL);', 'parent, type_id'),
    ('borrowed', _TABLES.split(';')[0] + '; CREATE TABLE borrowed '
     '(mdev_uuid TEXT, created_at REAL);', 'domain_uuid'),
])
def test_a_table_without_our_columns_is_named(boots, table, script,
                                              missing):
    _foreign(boots, script)
    assert _message(boots.leases) == (
        'State file %s: its table %s lacks the column(s) %s, so it is not '
        'a lease file of libvirt-gpu; %s'
        % (boots.db_path, table, missing, _aside(boots.db_path)))


def test_a_file_of_before_borrowing_gains_its_table(boots):
    _foreign(boots, _TABLES.split(';')[0] + ';')
    assert boots.leases() == []
    with boots.transaction() as txn:
        txn.borrow(U1, DOM)
        assert txn.borrower(U1) == DOM


def test_analyzes_statistics_are_no_foreign_table(boots):
    with boots.transaction() as txn:
        txn.add(U1, DOM, AF, T223)
    _sql(boots, 'ANALYZE')
    again = state.LeaseStore(boots.state_dir, boot_id_path=boots.boot_id_path)
    assert [x.vgpu_uuid for x in again.leases()] == [U1]


@pytest.mark.parametrize('text, reason', [
    ('file is not a database', 'it is not a SQLite file (garbage, or '
     'another program\'s); ' + _aside('/s/l')),
    ('file is encrypted or is not a database', 'it is not a SQLite file '
     '(garbage, or another program\'s); ' + _aside('/s/l')),
    ('database disk image is malformed', 'it is damaged; ' + _aside('/s/l')),
    ('it is corrupt', 'it is damaged; ' + _aside('/s/l')),
    ('disk I/O error', 'SQLite failed on it (disk I/O error)'),
    ('x' * 300, 'SQLite failed on it (%s)' % ('x' * 200)),
])
def test_sqlite_errors_in_words(text, reason):
    assert state._sqlite_reason(sqlite3.DatabaseError(text), '/s/l') == \
        reason


def test_garbage_is_named_not_a_sqlite_file(boots):
    boots.leases()
    _unwal(boots)
    with open(boots.db_path, 'wb') as f:
        f.write(b'garbage!' * 100)
    assert _message(boots.leases) == (
        'State file %s: it is not a SQLite file (garbage, or another '
        'program\'s); %s' % (boots.db_path, _aside(boots.db_path)))


def test_an_empty_file_is_named_empty(boots):
    boots.leases()
    _unwal(boots)
    os.truncate(boots.db_path, 0)
    again = state.LeaseStore(boots.state_dir, boot_id_path=boots.boot_id_path)
    assert _message(again.leases) == (
        'State file %s: it is empty (0 bytes), so the leases it held are '
        'lost; move it aside (`mv %s %s.broken`), then run `libvirt-gpu '
        'reconcile --dry-run`' % ((boots.db_path,) * 3))


def test_a_file_of_exactly_a_header_is_not_called_truncated(boots):
    boots.leases()
    _unwal(boots)
    os.truncate(boots.db_path, 100)
    try:
        state.LeaseStore(boots.state_dir,
                         boot_id_path=boots.boot_id_path).leases()
    except exception.StateError as e:
        assert 'truncated' not in str(e)


@root_only
@pytest.mark.parametrize('suffix', ['', '-wal', '-shm'])
def test_a_lease_file_part_of_another_user_is_refused(boots, suffix):
    with boots.transaction() as txn:
        txn.add(U1, DOM, AF, T223)
    boots.close()
    path = boots.db_path + suffix
    if not os.path.exists(path):
        with open(path, 'wb'):
            pass
    os.chown(path, OTHER, OTHER)
    again = state.LeaseStore(boots.state_dir, boot_id_path=boots.boot_id_path)
    assert _message(again.leases) == (
        'State file %s: it is owned by uid %d, not uid 0 (the owner of its '
        'directory): another user\'s file is not trusted; remove it'
        % (path, OTHER))


@pytest.mark.parametrize('suffix', ['', '-wal', '-shm'])
def test_a_lease_file_part_with_two_links_is_refused(boots, tmp_path,
                                                     suffix):
    with boots.transaction() as txn:
        txn.add(U1, DOM, AF, T223)
    boots.close()
    path = boots.db_path + suffix
    if not os.path.exists(path):
        with open(path, 'wb'):
            pass
    os.link(path, str(tmp_path / 'elsewhere'))
    again = state.LeaseStore(boots.state_dir, boot_id_path=boots.boot_id_path)
    assert _message(again.leases) == (
        'State file %s: it has 2 hard links: writing it would write a file '
        'elsewhere; remove it' % path)


@pytest.mark.parametrize('suffix', ['', '-wal'])
def test_a_lease_file_part_that_is_a_fifo_is_refused(boots, suffix):
    boots.leases()
    boots.close()
    path = boots.db_path + suffix
    if os.path.exists(path):
        os.unlink(path)
    if suffix == '':
        for other in ('-wal', '-shm'):
            if os.path.exists(path + other):
                os.unlink(path + other)
    os.mkfifo(path)
    again = state.LeaseStore(boots.state_dir, boot_id_path=boots.boot_id_path)
    said = _message(again.leases)
    assert said == ('State file %s: it is a FIFO, not a regular file; '
                    'remove it' % path)


# --- transactions and snapshots ----------------------------------------------

def test_a_sqlite_error_in_a_transaction_is_named_and_the_store_recovers(
        boots):
    with boots.transaction() as txn:
        txn.add(U1, DOM, AF, T223)
    with pytest.raises(exception.StateError) as e:
        with boots.transaction() as txn:
            txn.add(U2, DOM, AF, T223)
            txn._db.execute('SELECT nosuch FROM leases')
    assert str(e.value) == ('State file %s: SQLite failed on it (no such '
                            'column: nosuch)' % boots.db_path)
    assert boots._db is None
    assert [x.vgpu_uuid for x in boots.leases()] == [U1]


def test_a_snapshot_reads_what_was_committed_and_writes_nothing(boots):
    with boots.transaction() as txn:
        txn.add(U1, DOM, AF, T223)
    with boots.snapshot() as txn:
        assert [x.vgpu_uuid for x in txn.all()] == [U1]
    with pytest.raises(exception.StateError) as e:
        with boots.snapshot() as txn:
            txn.add(U2, DOM, AF, T223)
    assert str(e.value) == ('State file %s: SQLite failed on it (attempt '
                            'to write a readonly database)' % boots.db_path)
    assert [x.vgpu_uuid for x in boots.leases()] == [U1]


def test_a_snapshot_without_a_file_reads_no_leases_and_makes_none(boots):
    with boots.snapshot() as txn:
        assert txn.all() == [] and txn.borrowed() == {}
    assert not os.path.exists(boots.state_dir)


def test_a_snapshot_of_an_earlier_boots_file_reads_no_leases(boots, boot):
    with boots.transaction() as txn:
        txn.add(U1, DOM, AF, T223)
    boot.write_text('2222\n')
    with boots.snapshot() as txn:
        assert txn.all() == []
    assert os.path.exists(boots.db_path)        # set aside by a writer only


@pytest.mark.parametrize('make, kind', [
    (os.mkdir, 'a directory'), (os.mkfifo, 'a FIFO'),
    (lambda path: os.symlink('/etc/hostname', path), 'a symbolic link')])
def test_a_snapshot_of_what_is_no_lease_file_refuses_it(boots, make, kind):
    # read as "no leases", the exporter said read_ok 1 and every count 0
    boots.leases()
    _unwal(boots)
    os.unlink(boots.db_path)
    make(boots.db_path)
    with pytest.raises(exception.StateError) as e:
        with boots.snapshot():
            pass
    assert str(e.value) == (
        'State file %s: it is %s, not a regular file; remove it'
        % (boots.db_path, kind))


def test_a_snapshot_of_garbage_says_what_it_is(boots):
    boots.leases()
    _unwal(boots)
    with open(boots.db_path, 'wb') as f:
        f.write(b'garbage!' * 100)
    with pytest.raises(exception.StateError) as e:
        with boots.snapshot():
            pass
    assert str(e.value) == (
        'State file %s: it is not a SQLite file (garbage, or another '
        'program\'s); %s' % (boots.db_path, _aside(boots.db_path)))


@pytest.mark.parametrize('name', ['a?b', 'a#b', 'a%20b', 'a b', 'caf\xe9'])
def test_a_snapshot_opens_a_path_of_any_characters(tmp_path, boot, name):
    s = state.LeaseStore(tmp_path / name, boot_id_path=str(boot))
    with s.transaction() as txn:
        txn.add(U1, DOM, AF, T223)
    with s.snapshot() as txn:
        assert [x.vgpu_uuid for x in txn.all()] == [U1]
    s.close()


def test_a_row_of_a_bad_type_is_listed_with_its_text(boots):
    with boots.transaction() as txn:
        txn.add(U1, DOM, AF, T223)
    _sql(boots, "UPDATE leases SET type_id = 'bad type'")
    (lease,) = boots.leases()
    assert lease.type_id is None and lease.bad_type_id == 'bad type'
    assert records.replace(lease, type_id=T223, bad_type_id=None) \
        .checked_type_id() == T223


def test_a_lease_file_gone_before_its_check_is_named(boots):
    boots.leases()
    boots.close()
    _unwal(boots)
    os.unlink(boots.db_path)
    assert _message(boots._check_db_file) == (
        'State file %s: No such file or directory' % boots.db_path)


def test_the_lock_file_records_at_most_400_bytes_of_the_command(boots):
    boots.leases()
    code = ('import sys; from libvirt_gpu.store import state; '
            'state.LeaseStore(sys.argv[1]).leases()')
    args = [sys.executable, '-c', code, boots.state_dir, 'x' * 500]
    subprocess.run(args, cwd=ROOT, check=True, timeout=60)
    with open(boots.lock_path, 'rb') as f:
        pid, _, command = f.read().partition(b' ')
    written = ' '.join(args).encode()
    assert command == written[:400] + b'\n'


def test_an_unreadable_command_line_is_recorded_as_a_question_mark(
        boots, monkeypatch):
    def refuse(path, *args):
        raise PermissionError(13, 'Permission denied', path)
    monkeypatch.setattr(state, 'open', refuse, raising=False)
    boots.leases()
    with open(boots.lock_path, 'rb') as f:
        assert f.read() == b'%d ?\n' % os.getpid()


def test_a_store_never_used_closes_quietly(tmp_path):
    s = state.LeaseStore(tmp_path / 'state')
    s.close()
    s.close()
    assert not os.path.exists(s.state_dir)


def test_a_file_of_an_earlier_boot_that_cannot_be_set_aside_is_named(
        boots, boot):
    with boots.transaction() as txn:
        txn.add(U1, DOM, AF, T223)
    boots.close()
    blocker = boots.db_path + '.previous-boot'
    os.mkdir(blocker)
    with open(os.path.join(blocker, 'x'), 'w'):
        pass
    boot.write_text('2222\n')
    said = _message(state.LeaseStore(boots.state_dir,
                                     boot_id_path=str(boot)).leases)
    assert said == 'State file %s: Is a directory' % boots.state_dir


def test_what_follows_analyzes_statistics_is_still_checked(boots):
    with boots.transaction() as txn:
        txn.add(U1, DOM, AF, T223)
    boots.close()
    _sql(boots, 'ANALYZE; CREATE TABLE zzz (x)')
    again = state.LeaseStore(boots.state_dir, boot_id_path=boots.boot_id_path)
    assert 'it holds a table zzz that libvirt-gpu never makes' in _message(
        again.leases)


def test_a_lease_table_without_our_columns_is_named_without_borrowed(boots):
    _foreign(boots, 'CREATE TABLE leases (mdev_uuid TEXT, domain_uuid TEXT, '
                    'state TEXT, pid INTEGER, pid_start INTEGER, '
                    'created_at REAL, updated_at REAL, parent TEXT);')
    assert 'its table leases lacks the column(s) type_id, so' in _message(
        boots.leases)


def test_a_recorded_boot_id_of_other_bytes_is_another_boots(boots, boot):
    with boots.transaction() as txn:
        txn.add(U1, DOM, AF, T223)
    marker = os.path.join(boots.state_dir, state.BOOT_ID_NAME)
    with open(marker, 'wb') as f:
        f.write(b'\xff' + BOOT.encode()[1:] + b'\n')
    assert state.LeaseStore(boots.state_dir,
                            boot_id_path=str(boot)).leases() == []
    with open(marker) as f:
        assert f.read() == BOOT + '\n'


def test_a_boot_id_that_is_not_ascii_is_read_not_a_crash(tmp_path):
    boot = tmp_path / 'boot_id'
    boot.write_bytes(b'\xff' + BOOT.encode()[1:] + b'\n')
    s = state.LeaseStore(tmp_path / 'state', boot_id_path=str(boot))
    assert s.leases() == []
    with s.snapshot() as txn:
        assert txn.all() == []


# --- a disk that fails: each error names the file and what went wrong -------

def _failing(real, path, error):
    def call(name, *args, **kwargs):
        if os.fspath(name) == path:
            raise error
        return real(name, *args, **kwargs)
    return call


def test_a_lease_file_that_cannot_be_made_is_named(boots, monkeypatch):
    monkeypatch.setattr(os, 'open', _failing(
        os.open, boots.db_path, OSError(errno.ENOSPC,
                                        'No space left on device')))
    assert _message(boots.leases) == (
        'State file %s: No space left on device' % boots.db_path)


@pytest.mark.parametrize('error, reason', [
    ('unable to open database file',
     'SQLite failed on it (unable to open database file)'),
    ('file is not a database', 'it is not a SQLite file (garbage, or '
     'another program\'s); move it aside (`mv {0} {0}.broken`), then run '
     '`libvirt-gpu reconcile --dry-run`')])
def test_a_lease_file_sqlite_cannot_open_is_named(boots, monkeypatch, error,
                                                  reason):
    monkeypatch.setattr(state.sqlite3, 'connect', _failing(
        state.sqlite3.connect, boots.db_path,
        sqlite3.DatabaseError(error)))
    assert _message(boots.leases) == 'State file %s: %s' % (
        boots.db_path, reason.format(boots.db_path))


def test_a_wal_that_cannot_be_looked_at_is_named(boots, monkeypatch):
    boots.leases()
    boots.close()
    wal = boots.db_path + '-wal'
    monkeypatch.setattr(os, 'lstat', _failing(
        os.lstat, wal, OSError(errno.EIO, 'Input/output error')))
    again = state.LeaseStore(boots.state_dir, boot_id_path=boots.boot_id_path)
    assert _message(again.leases) == 'State file %s: Input/output error' % wal


def test_a_boot_id_record_that_cannot_be_read_is_named(boots, monkeypatch):
    boots.leases()
    marker = os.path.join(boots.state_dir, state.BOOT_ID_NAME)
    monkeypatch.setattr(state.statedir, 'read_file', _failing(
        state.statedir.read_file, marker,
        OSError(errno.EIO, 'Input/output error')))
    again = state.LeaseStore(boots.state_dir, boot_id_path=boots.boot_id_path)
    assert _message(again.leases) == (
        'State file %s: Input/output error' % marker)
