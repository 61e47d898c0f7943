"""What the lease store (store/state.py) promises that test_state and
test_state_guards left open: each test here fails on a change ``make
mutation`` made that those stayed green on (docs/dev/mutation.md) -- the
whole refusal a user reads, the order and the fields of what a
transaction returns, the boundaries of each bounded read, what a
migration's reservation and a lease's holder mean, and what a snapshot
reads.

Nothing waits: a lock is held by a second open file description of this
process (``flock`` excludes those too) and the store is told to wait
0.05 s.  A process in a given state (a zombie, a renamed one) is a forked
child told to go on through a pipe.  The tests run as root: another
user's file is made with ``os.chown``.
"""

import errno
import fcntl
import os
import sqlite3
import subprocess
import sys

import pytest

from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.store import state
from libvirt_gpu.util import records
from tests.doubles import poll
from tests.doubles import paths

U1 = objects.Uuid.parse('4b20d080-1b54-4048-85b3-a6a62d165c01')
U2 = objects.Uuid.parse('b1ae8bf6-38b0-4c81-9d44-78ce3f520496')
U3 = objects.Uuid.parse('0a000000-0000-4000-8000-000000000003')
DOM = objects.Uuid.parse('c7a5fdbd-cdaf-9455-926a-d65c16db1809')
DOM2 = objects.Uuid.parse('d7a5fdbd-cdaf-9455-926a-d65c16db1809')
AF = objects.PciAddress.parse('0000:af:00.0')
B3 = objects.PciAddress.parse('0000:3b:00.0')
T223 = objects.TypeId.parse('nvidia-223')
T224 = objects.TypeId.parse('nvidia-224')
OTHER = 4242            # a uid nobody here has
NOT_A_DOMAIN = r'^domain_uuid must be an objects\.Uuid, not str'
NOT_A_VGPU = r'^vgpu_uuid must be an objects\.Uuid, not str'
NOT_A_PARENT = r'^parent must be an objects\.PciAddress, not str'
ROOT = paths.ROOT
BOOT = '1111aaaa-0000-4000-8000-000000000000'

root_only = pytest.mark.skipif(os.geteuid() != 0,
                               reason='makes files of another user')


@pytest.fixture
def boot(tmp_path):
    path = tmp_path / 'boot_id'
    path.write_text(BOOT + '\n')
    return path


@pytest.fixture
def store(tmp_path, boot):
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


def _unwal(store):
    store.close()
    for suffix in ('-wal', '-shm'):
        if os.path.exists(store.db_path + suffix):
            os.unlink(store.db_path + suffix)


def _foreign(store, script):
    """The store's directory holding a lease file made by ``script``."""
    os.makedirs(store.state_dir, mode=0o700, exist_ok=True)
    with open(os.path.join(store.state_dir, state.BOOT_ID_NAME), 'w') as f:
        f.write(BOOT + '\n')
    _sql(store, script)
    return store


def _sql(store, script):
    """Run ``script`` on the store's lease file as another program would
    (its own SQLite connection, committed)."""
    db = sqlite3.connect(store.db_path)
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

def test_leases_come_oldest_first_then_by_uuid(store, monkeypatch):
    clock = iter([10.0, 20.0])
    monkeypatch.setattr(state.time, 'time', lambda: next(clock))
    with store.transaction() as txn:
        txn.add(U2, DOM, AF, T223)
    with store.transaction() as txn:
        txn.add(U3, DOM, AF, T223)
        txn.add(U1, DOM, AF, T223)
        assert [lease.vgpu_uuid for lease in txn.all()] == [U2, U3, U1]
        assert [lease.created_at for lease in txn.all()] == [10.0, 20.0,
                                                             20.0]


def test_an_added_lease_is_this_process_at_the_transactions_time(
        store, monkeypatch):
    monkeypatch.setattr(state.time, 'time', lambda: 1234.5)
    with store.transaction() as txn:
        added = txn.add(U1, None, AF, T223, state=state.CREATED,
                        expires_at=2000.0)
    assert added == state.Lease(
        vgpu_uuid=U1, domain_uuid=None, parent=AF, type_id=T223,
        state=state.CREATED, pid=os.getpid(),
        pid_start=state.process_start(os.getpid()), created_at=1234.5,
        updated_at=1234.5, expires_at=2000.0)
    assert store.leases() == [added]


def test_add_refuses_a_state_that_is_none_of_the_three(store):
    with pytest.raises(ValueError, match='^held$'):
        with store.transaction() as txn:
            txn.add(U1, DOM, AF, T223, state='held')
    for each in state.STATES:
        with store.transaction() as txn:
            assert txn.add(U1, DOM, AF, T223, state=each).state == each
            txn.delete(U1)


def test_a_uuid_leased_twice_names_the_domain_holding_it(store):
    with store.transaction() as txn:
        txn.add(U1, DOM, AF, T223)
    with pytest.raises(exception.LeaseConflict) as e:
        with store.transaction() as txn:
            txn.add(U1, DOM2, B3, T224)
    assert str(e.value) == 'vGPU %s is held by domain %s' % (U1, DOM)
    with pytest.raises(TypeError, match=NOT_A_DOMAIN):
        with store.transaction() as txn:
            txn.add(U2, str(DOM), AF, T223)
    with pytest.raises(TypeError, match=NOT_A_PARENT):
        with store.transaction() as txn:
            txn.add(U2, DOM, str(AF), T223)
    with pytest.raises(TypeError, match=r'^type_id must be an objects\.'
                                        r'TypeId, not str'):
        with store.transaction() as txn:
            txn.add(U2, DOM, AF, str(T223))


def test_get_for_domain_and_for_parent_select_exactly(store):
    with store.transaction() as txn:
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
        with store.transaction() as txn:
            txn.for_domain(str(DOM))
    with pytest.raises(TypeError, match=NOT_A_PARENT):
        with store.transaction() as txn:
            txn.for_parent(str(AF))


def _foreign_row(store, pid=1, pid_start=7, expires_at=500.0):
    with store.transaction() as txn:
        txn.add(U1, DOM, AF, T223)
    db = sqlite3.connect(store.db_path)
    db.execute('UPDATE leases SET pid = ?, pid_start = ?, created_at = 5.0, '
               'updated_at = 5.0, expires_at = ?',
               (pid, pid_start, expires_at))
    db.commit()
    db.close()


def test_update_takes_the_lease_over_and_ends_its_reservation(
        store, monkeypatch):
    _foreign_row(store)
    monkeypatch.setattr(state.time, 'time', lambda: 99.0)
    with store.transaction() as txn:
        changed = txn.update(U1, state=state.CREATED)
    assert changed == state.Lease(
        vgpu_uuid=U1, domain_uuid=DOM, parent=AF, type_id=T223,
        state=state.CREATED, pid=os.getpid(),
        pid_start=state.process_start(os.getpid()), created_at=5.0,
        updated_at=99.0, expires_at=None)
    assert store.leases() == [changed]


def test_update_changes_each_named_field(store):
    _foreign_row(store)
    with store.transaction() as txn:
        changed = txn.update(U1, domain_uuid=DOM2, parent=B3,
                             type_id=T224, expires_at=800.0)
    assert (changed.domain_uuid, changed.parent, changed.type_id,
            changed.state, changed.expires_at) == (DOM2, B3, T224,
                                                   state.RESERVED, 800.0)
    with store.transaction() as txn:
        assert txn.update(U1, domain_uuid=None).domain_uuid is None
    assert store.leases()[0].domain_uuid is None


def test_update_refuses_what_it_may_not_change(store):
    with store.transaction() as txn:
        txn.add(U1, DOM, AF, T223)
    with pytest.raises(ValueError) as e:
        with store.transaction() as txn:
            txn.update(U1, pid=1, created_at=0.0, state=state.CREATED)
    assert e.value.args == (['created_at', 'pid'],)
    with pytest.raises(ValueError, match='^gone$'):
        with store.transaction() as txn:
            txn.update(U1, state='gone')
    for name, value in (('parent', str(B3)), ('type_id', str(T224)),
                        ('domain_uuid', str(DOM2))):
        with pytest.raises(TypeError, match='^%s must be' % name):
            with store.transaction() as txn:
                txn.update(U1, **{name: value})
    assert store.leases()[0].state == state.RESERVED


def test_updating_no_lease_names_it(store):
    said = _message(lambda: store.transaction().__enter__().update(
        U2, state=state.CREATED))
    store.close()
    assert said == 'State file leases: no lease for %s' % U2


# --- borrowed mdevs ----------------------------------------------------------

def test_borrowed_mdevs_are_recorded_replaced_and_given_back(
        store, monkeypatch):
    monkeypatch.setattr(state.time, 'time', lambda: 42.0)
    with store.transaction() as txn:
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
        with store.transaction() as txn:
            txn.give_back(str(DOM2))
    with pytest.raises(TypeError, match=NOT_A_DOMAIN):
        with store.transaction() as txn:
            txn.borrow(U1, str(DOM2))
    with pytest.raises(TypeError, match=NOT_A_VGPU):
        with store.transaction() as txn:
            txn.borrow(str(U1), DOM2)
    with store.transaction() as txn:
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

def test_the_lock_file_names_this_process_and_nothing_else(store):
    store.leases()
    with open('/proc/self/cmdline', 'rb') as f:
        command = f.read(400).replace(b'\0', b' ').strip()
    with open(store.lock_path, 'rb') as f:
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


def test_a_held_lock_is_waited_on_briefly_and_its_holder_named(store):
    store.leases()
    fd = os.open(store.lock_path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        said = _message(store.leases)
    finally:
        os.close(fd)
    assert said.startswith('State file %s: still locked after 0 s by '
                           'process %d (' % (store.lock_path, os.getpid()))
    assert store.leases() == []


@root_only
def test_a_lock_file_of_another_user_is_refused(store):
    store.leases()
    os.chown(store.lock_path, OTHER, OTHER)
    said = _message(store.leases)
    assert said.startswith('State file %s: ' % store.lock_path)


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

def test_a_reboot_sets_the_file_and_its_wal_and_shm_aside(store, boot):
    with store.transaction() as txn:
        txn.add(U1, DOM, AF, T223)
    assert os.path.exists(store.db_path + '-wal')
    assert os.path.exists(store.db_path + '-shm')
    boot.write_text('2222\n')
    after = state.LeaseStore(store.state_dir, boot_id_path=str(boot))
    assert after.leases() == []
    for suffix in ('', '-wal', '-shm'):
        assert os.path.exists(store.db_path + '.previous-boot' + suffix)
    old = sqlite3.connect(store.db_path + '.previous-boot')
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


def test_a_recorded_boot_id_past_the_bound_is_another_boots(store, boot):
    with store.transaction() as txn:
        txn.add(U1, DOM, AF, T223)
    marker = os.path.join(store.state_dir, state.BOOT_ID_NAME)
    with open(marker, 'w') as f:
        f.write(BOOT + ' ' * 221 + '\n')        # 258 bytes
    assert state.LeaseStore(store.state_dir,
                            boot_id_path=str(boot)).leases() == []
    assert os.path.exists(store.db_path + '.previous-boot')
    with open(marker) as f:
        assert f.read() == BOOT + '\n'


def test_a_recorded_boot_id_within_the_bound_is_read(store, boot):
    with store.transaction() as txn:
        txn.add(U1, DOM, AF, T223)
    marker = os.path.join(store.state_dir, state.BOOT_ID_NAME)
    with open(marker, 'w') as f:
        f.write(BOOT + ' ' * 220 + '\n')        # 257 bytes: the same id
    assert [x.vgpu_uuid for x in state.LeaseStore(
        store.state_dir, boot_id_path=str(boot)).leases()] == [U1]


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

def test_the_lease_file_is_written_ahead(store):
    store.leases()
    db = sqlite3.connect(store.db_path)
    assert db.execute('PRAGMA journal_mode').fetchone()[0] == 'wal'
    db.close()


@pytest.mark.parametrize('version, refused', [(2, False), (3, True)])
def test_a_file_of_the_next_schema_is_refused(store, version, refused):
    store.leases()
    _unwal(store)
    _sql(store, 'PRAGMA user_version = %d' % version)
    again = state.LeaseStore(store.state_dir, boot_id_path=store.boot_id_path)
    if refused:
        assert _message(again.leases) == (
            'State file %s: written by a newer libvirt-gpu (schema 3, '
            'this one knows 2)' % store.db_path)
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
def test_a_file_holding_what_we_never_make_is_refused(store, script, what):
    _foreign(store, script)
    said = _message(store.leases)
    assert said == ('State file %s: it holds %s that libvirt-gpu never '
                    'makes, so it is another program\'s file or was '
                    'altered; %s' % (store.db_path, what,
                                     _aside(store.db_path)))
    with pytest.raises(exception.StateError) as e:
        with store.snapshot():
            pass
    assert str(e.value) == said


def test_a_file_without_the_lease_table_is_not_ours(store):
    _foreign(store, 'CREATE TABLE borrowed (mdev_uuid TEXT, domain_uuid '
                    'TEXT, created_at REAL);')
    assert _message(store.leases) == (
        'State file %s: it has no table leases, so it is not a lease file '
        'of libvirt-gpu; %s' % (store.db_path, _aside(store.db_path)))


@pytest.mark.parametrize('table, script, missing', [
    ('leases', 'CREATE TABLE leases (mdev_uuid TEXT, domain_uuid TEXT, '
     'state TEXT, pid INTEGER, pid_start INTEGER, created_at REAL, '
     'updated_at REAL);', 'parent, type_id'),
    ('borrowed', _TABLES.split(';')[0] + '; CREATE TABLE borrowed '
     '(mdev_uuid TEXT, created_at REAL);', 'domain_uuid'),
])
def test_a_table_without_our_columns_is_named(store, table, script,
                                              missing):
    _foreign(store, script)
    assert _message(store.leases) == (
        'State file %s: its table %s lacks the column(s) %s, so it is not '
        'a lease file of libvirt-gpu; %s'
        % (store.db_path, table, missing, _aside(store.db_path)))


def test_a_file_of_before_borrowing_gains_its_table(store):
    _foreign(store, _TABLES.split(';')[0] + ';')
    assert store.leases() == []
    with store.transaction() as txn:
        txn.borrow(U1, DOM)
        assert txn.borrower(U1) == DOM


def test_analyzes_statistics_are_no_foreign_table(store):
    with store.transaction() as txn:
        txn.add(U1, DOM, AF, T223)
    _sql(store, 'ANALYZE')
    again = state.LeaseStore(store.state_dir, boot_id_path=store.boot_id_path)
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


def test_garbage_is_named_not_a_sqlite_file(store):
    store.leases()
    _unwal(store)
    with open(store.db_path, 'wb') as f:
        f.write(b'garbage!' * 100)
    assert _message(store.leases) == (
        'State file %s: it is not a SQLite file (garbage, or another '
        'program\'s); %s' % (store.db_path, _aside(store.db_path)))


def test_an_empty_file_is_named_empty(store):
    store.leases()
    _unwal(store)
    os.truncate(store.db_path, 0)
    again = state.LeaseStore(store.state_dir, boot_id_path=store.boot_id_path)
    assert _message(again.leases) == (
        'State file %s: it is empty (0 bytes), so the leases it held are '
        'lost; move it aside (`mv %s %s.broken`), then run `libvirt-gpu '
        'reconcile --dry-run`' % ((store.db_path,) * 3))


def test_a_file_of_exactly_a_header_is_not_called_truncated(store):
    store.leases()
    _unwal(store)
    os.truncate(store.db_path, 100)
    try:
        state.LeaseStore(store.state_dir,
                         boot_id_path=store.boot_id_path).leases()
    except exception.StateError as e:
        assert 'truncated' not in str(e)


@root_only
@pytest.mark.parametrize('suffix', ['', '-wal', '-shm'])
def test_a_lease_file_part_of_another_user_is_refused(store, suffix):
    with store.transaction() as txn:
        txn.add(U1, DOM, AF, T223)
    store.close()
    path = store.db_path + suffix
    if not os.path.exists(path):
        with open(path, 'wb'):
            pass
    os.chown(path, OTHER, OTHER)
    again = state.LeaseStore(store.state_dir, boot_id_path=store.boot_id_path)
    assert _message(again.leases) == (
        'State file %s: it is owned by uid %d, not uid 0 (the owner of its '
        'directory): another user\'s file is not trusted; remove it'
        % (path, OTHER))


@pytest.mark.parametrize('suffix', ['', '-wal', '-shm'])
def test_a_lease_file_part_with_two_links_is_refused(store, tmp_path,
                                                     suffix):
    with store.transaction() as txn:
        txn.add(U1, DOM, AF, T223)
    store.close()
    path = store.db_path + suffix
    if not os.path.exists(path):
        with open(path, 'wb'):
            pass
    os.link(path, str(tmp_path / 'elsewhere'))
    again = state.LeaseStore(store.state_dir, boot_id_path=store.boot_id_path)
    assert _message(again.leases) == (
        'State file %s: it has 2 hard links: writing it would write a file '
        'elsewhere; remove it' % path)


@pytest.mark.parametrize('suffix', ['', '-wal'])
def test_a_lease_file_part_that_is_a_fifo_is_refused(store, suffix):
    store.leases()
    store.close()
    path = store.db_path + suffix
    if os.path.exists(path):
        os.unlink(path)
    if suffix == '':
        for other in ('-wal', '-shm'):
            if os.path.exists(path + other):
                os.unlink(path + other)
    os.mkfifo(path)
    again = state.LeaseStore(store.state_dir, boot_id_path=store.boot_id_path)
    said = _message(again.leases)
    assert said == ('State file %s: it is a FIFO, not a regular file; '
                    'remove it' % path)


# --- transactions and snapshots ----------------------------------------------

def test_a_sqlite_error_in_a_transaction_is_named_and_the_store_recovers(
        store):
    with store.transaction() as txn:
        txn.add(U1, DOM, AF, T223)
    with pytest.raises(exception.StateError) as e:
        with store.transaction() as txn:
            txn.add(U2, DOM, AF, T223)
            txn._db.execute('SELECT nosuch FROM leases')
    assert str(e.value) == ('State file %s: SQLite failed on it (no such '
                            'column: nosuch)' % store.db_path)
    assert store._db is None
    assert [x.vgpu_uuid for x in store.leases()] == [U1]


def test_a_snapshot_reads_what_was_committed_and_writes_nothing(store):
    with store.transaction() as txn:
        txn.add(U1, DOM, AF, T223)
    with store.snapshot() as txn:
        assert [x.vgpu_uuid for x in txn.all()] == [U1]
    with pytest.raises(exception.StateError) as e:
        with store.snapshot() as txn:
            txn.add(U2, DOM, AF, T223)
    assert str(e.value) == ('State file %s: SQLite failed on it (attempt '
                            'to write a readonly database)' % store.db_path)
    assert [x.vgpu_uuid for x in store.leases()] == [U1]


def test_a_snapshot_without_a_file_reads_no_leases_and_makes_none(store):
    with store.snapshot() as txn:
        assert txn.all() == [] and txn.borrowed() == {}
    assert not os.path.exists(store.state_dir)


def test_a_snapshot_of_an_earlier_boots_file_reads_no_leases(store, boot):
    with store.transaction() as txn:
        txn.add(U1, DOM, AF, T223)
    boot.write_text('2222\n')
    with store.snapshot() as txn:
        assert txn.all() == []
    assert os.path.exists(store.db_path)        # set aside by a writer only


@pytest.mark.parametrize('make, kind', [
    (os.mkdir, 'a directory'), (os.mkfifo, 'a FIFO'),
    (lambda path: os.symlink('/etc/hostname', path), 'a symbolic link')])
def test_a_snapshot_of_what_is_no_lease_file_refuses_it(store, make, kind):
    # read as "no leases", the exporter said read_ok 1 and every count 0
    store.leases()
    _unwal(store)
    os.unlink(store.db_path)
    make(store.db_path)
    with pytest.raises(exception.StateError) as e:
        with store.snapshot():
            pass
    assert str(e.value) == (
        'State file %s: it is %s, not a regular file; remove it'
        % (store.db_path, kind))


def test_a_snapshot_of_garbage_says_what_it_is(store):
    store.leases()
    _unwal(store)
    with open(store.db_path, 'wb') as f:
        f.write(b'garbage!' * 100)
    with pytest.raises(exception.StateError) as e:
        with store.snapshot():
            pass
    assert str(e.value) == (
        'State file %s: it is not a SQLite file (garbage, or another '
        'program\'s); %s' % (store.db_path, _aside(store.db_path)))


@pytest.mark.parametrize('name', ['a?b', 'a#b', 'a%20b', 'a b', 'caf\xe9'])
def test_a_snapshot_opens_a_path_of_any_characters(tmp_path, boot, name):
    s = state.LeaseStore(tmp_path / name, boot_id_path=str(boot))
    with s.transaction() as txn:
        txn.add(U1, DOM, AF, T223)
    with s.snapshot() as txn:
        assert [x.vgpu_uuid for x in txn.all()] == [U1]
    s.close()


def test_a_row_of_a_bad_type_is_listed_with_its_text(store):
    with store.transaction() as txn:
        txn.add(U1, DOM, AF, T223)
    _sql(store, "UPDATE leases SET type_id = 'bad type'")
    (lease,) = store.leases()
    assert lease.type_id is None and lease.bad_type_id == 'bad type'
    assert records.replace(lease, type_id=T223, bad_type_id=None) \
        .checked_type_id() == T223


def test_a_lease_file_gone_before_its_check_is_named(store):
    store.leases()
    store.close()
    _unwal(store)
    os.unlink(store.db_path)
    assert _message(store._check_db_file) == (
        'State file %s: No such file or directory' % store.db_path)


def test_the_lock_file_records_at_most_400_bytes_of_the_command(store):
    store.leases()
    code = ('import sys; from libvirt_gpu.store import state; '
            'state.LeaseStore(sys.argv[1]).leases()')
    args = [sys.executable, '-c', code, store.state_dir, 'x' * 500]
    subprocess.run(args, cwd=ROOT, check=True, timeout=60)
    with open(store.lock_path, 'rb') as f:
        pid, _, command = f.read().partition(b' ')
    written = ' '.join(args).encode()
    assert command == written[:400] + b'\n'


def test_an_unreadable_command_line_is_recorded_as_a_question_mark(
        store, monkeypatch):
    def refuse(path, *args):
        raise PermissionError(13, 'Permission denied', path)
    monkeypatch.setattr(state, 'open', refuse, raising=False)
    store.leases()
    with open(store.lock_path, 'rb') as f:
        assert f.read() == b'%d ?\n' % os.getpid()


def test_a_store_never_used_closes_quietly(tmp_path):
    s = state.LeaseStore(tmp_path / 'state')
    s.close()
    s.close()
    assert not os.path.exists(s.state_dir)


def test_a_file_of_an_earlier_boot_that_cannot_be_set_aside_is_named(
        store, boot):
    with store.transaction() as txn:
        txn.add(U1, DOM, AF, T223)
    store.close()
    blocker = store.db_path + '.previous-boot'
    os.mkdir(blocker)
    with open(os.path.join(blocker, 'x'), 'w'):
        pass
    boot.write_text('2222\n')
    said = _message(state.LeaseStore(store.state_dir,
                                     boot_id_path=str(boot)).leases)
    assert said == 'State file %s: Is a directory' % store.state_dir


def test_what_follows_analyzes_statistics_is_still_checked(store):
    with store.transaction() as txn:
        txn.add(U1, DOM, AF, T223)
    store.close()
    _sql(store, 'ANALYZE; CREATE TABLE zzz (x)')
    again = state.LeaseStore(store.state_dir, boot_id_path=store.boot_id_path)
    assert 'it holds a table zzz that libvirt-gpu never makes' in _message(
        again.leases)


def test_a_lease_table_without_our_columns_is_named_without_borrowed(store):
    _foreign(store, 'CREATE TABLE leases (mdev_uuid TEXT, domain_uuid TEXT, '
                    'state TEXT, pid INTEGER, pid_start INTEGER, '
                    'created_at REAL, updated_at REAL, parent TEXT);')
    assert 'its table leases lacks the column(s) type_id, so' in _message(
        store.leases)


def test_a_recorded_boot_id_of_other_bytes_is_another_boots(store, boot):
    with store.transaction() as txn:
        txn.add(U1, DOM, AF, T223)
    marker = os.path.join(store.state_dir, state.BOOT_ID_NAME)
    with open(marker, 'wb') as f:
        f.write(b'\xff' + BOOT.encode()[1:] + b'\n')
    assert state.LeaseStore(store.state_dir,
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


def test_a_lease_file_that_cannot_be_made_is_named(store, monkeypatch):
    monkeypatch.setattr(os, 'open', _failing(
        os.open, store.db_path, OSError(errno.ENOSPC,
                                        'No space left on device')))
    assert _message(store.leases) == (
        'State file %s: No space left on device' % store.db_path)


@pytest.mark.parametrize('error, reason', [
    ('unable to open database file',
     'SQLite failed on it (unable to open database file)'),
    ('file is not a database', 'it is not a SQLite file (garbage, or '
     'another program\'s); move it aside (`mv {0} {0}.broken`), then run '
     '`libvirt-gpu reconcile --dry-run`')])
def test_a_lease_file_sqlite_cannot_open_is_named(store, monkeypatch, error,
                                                  reason):
    monkeypatch.setattr(state.sqlite3, 'connect', _failing(
        state.sqlite3.connect, store.db_path,
        sqlite3.DatabaseError(error)))
    assert _message(store.leases) == 'State file %s: %s' % (
        store.db_path, reason.format(store.db_path))


def test_a_wal_that_cannot_be_looked_at_is_named(store, monkeypatch):
    store.leases()
    store.close()
    wal = store.db_path + '-wal'
    monkeypatch.setattr(os, 'lstat', _failing(
        os.lstat, wal, OSError(errno.EIO, 'Input/output error')))
    again = state.LeaseStore(store.state_dir, boot_id_path=store.boot_id_path)
    assert _message(again.leases) == 'State file %s: Input/output error' % wal


def test_a_boot_id_record_that_cannot_be_read_is_named(store, monkeypatch):
    store.leases()
    marker = os.path.join(store.state_dir, state.BOOT_ID_NAME)
    monkeypatch.setattr(state.statedir, 'read_file', _failing(
        state.statedir.read_file, marker,
        OSError(errno.EIO, 'Input/output error')))
    again = state.LeaseStore(store.state_dir, boot_id_path=store.boot_id_path)
    assert _message(again.leases) == (
        'State file %s: Input/output error' % marker)
