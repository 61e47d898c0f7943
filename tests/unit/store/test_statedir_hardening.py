"""The state directory: nothing another user does can steer, hang or trick
root (issue 30, section 1).

Each test names the finding it covers.  They run as any user, but those
that make another user's file (``os.chown`` to uid 65534, nobody), which
only root can, are skipped without root (``root_only``); a lock held by
another process is held by a child process; every wait is bounded (a
child's ``timeout``, ``wait_for``).
"""

import fcntl
import json
import os
import sqlite3
import stat
import subprocess
import sys

import pytest

from libvirt_gpu import objects
from libvirt_gpu import exception
from libvirt_gpu.store import figures
from libvirt_gpu.util import fileutil
from libvirt_gpu.guests import hook
from libvirt_gpu.store import state
from libvirt_gpu.store import statedir
from libvirt_gpu.guests.hook import log as hook_log
from tests.doubles import poll
from tests.doubles import paths
from tests.doubles import t4_hook as th

ROOT = paths.ROOT
NOBODY = 65534

root_only = pytest.mark.skipif(os.geteuid() != 0,
                               reason='makes files of another user')


def _state_dir(tmp_path):
    """A state directory of this boot (its boot_id marker written: a
    lease file there is not set aside as an earlier boot's)."""
    path = tmp_path / 'state'
    statedir.ensure_dir(str(path))
    with open(state.BOOT_ID_PATH) as f:
        boot_id = f.read()
    with open(path / state.BOOT_ID_NAME, 'w') as f:
        f.write(boot_id)
    os.chmod(path / state.BOOT_ID_NAME, 0o600)
    return path


def _python(code, timeout=30):
    """Run ``code`` in a child process, bounded; its CompletedProcess."""
    return subprocess.run([sys.executable, '-c', code], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


def _stopped(pid):
    with open('/proc/%d/stat' % pid, 'rb') as f:
        text = f.read()
    return text[text.rfind(b')') + 2:][:1] in (b'T', b't')


class Holder(object):
    """A child process that holds a ``flock`` on ``path`` (and, with
    ``stop``, stops itself once it holds it)."""

    def __init__(self, path, stop=False, shared=False):
        code = ('import fcntl, os, signal, sys, time\n'
                'fd = os.open(%r, os.O_RDWR)\n'
                'fcntl.flock(fd, fcntl.%s)\n'
                'print("locked", flush=True)\n'
                '%s\n'
                'time.sleep(600)\n'
                % (str(path), 'LOCK_SH' if shared else 'LOCK_EX',
                   'os.kill(os.getpid(), signal.SIGSTOP)' if stop else ''))
        self.proc = subprocess.Popen([sys.executable, '-c', code],
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == 'locked'
        if stop:
            assert poll.wait_for(lambda: _stopped(self.proc.pid))
        self.pid = self.proc.pid

    def end(self):
        self.proc.kill()
        self.proc.wait(timeout=30)


# --- any local user hung every hook call -------------------------------------

def test_hook_figures_are_private_and_a_loose_one_is_tightened(tmp_path):
    """hook-figures.json was created 0644: any user could open it and hold
    its flock.  Now 0600, and one left 0644 is made 0600."""
    sd = _state_dir(tmp_path)
    figures.record_hook_call(str(sd), 'prepare', figures.OK, 0.01)
    path = sd / figures.HOOK_FIGURES
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    os.chmod(path, 0o644)
    figures.record_hook_call(str(sd), 'prepare', figures.OK, 0.01)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert figures.hook_figures(str(sd))['prepare']['calls'] == 2


@pytest.mark.parametrize('reader', [False, True])
def test_a_held_figures_lock_is_waited_on_a_bounded_time(tmp_path, reader):
    """A process holding the figures' lock hung every hook call (and the
    exporter's scrape) for ever: now the wait ends, naming the holder."""
    sd = _state_dir(tmp_path)
    figures.record_hook_call(str(sd), 'prepare', figures.OK, 0.01)
    holder = Holder(sd / figures.HOOK_FIGURES)
    try:
        call = ('figures.hook_figures(%r)' if reader else
                'figures.record_hook_call(%r, "prepare", "ok", 0.01)')
        done = _python(
            'from libvirt_gpu.store import figures\n'
            'figures.LOCK_TIMEOUT = 0.5\n'
            'try:\n'
            '    %s\n'
            'except Exception as e:\n'
            '    print(e)\n' % (call % str(sd)), timeout=20)
        assert 'still locked after' in done.stdout
        assert 'process %d (' % holder.pid in done.stdout
    finally:
        holder.end()


def test_a_held_figures_lock_costs_the_hook_a_warning_not_the_call(
        tmp_path):
    """A stopped holder: the hook's record gives up at once (in a child
    process, bounded: the old code waited for ever), and says who."""
    sd = _state_dir(tmp_path)
    figures.record_hook_call(str(sd), 'prepare', figures.OK, 0.01)
    holder = Holder(sd / figures.HOOK_FIGURES, stop=True)
    try:
        log_path = sd / hook_log.LOG_NAME
        done = _python(
            'import io\n'
            'from libvirt_gpu.store import figures\n'
            'from libvirt_gpu.guests.hook import log as hook_log\n'
            'log = hook_log.HookLog(["qemu", "vm1", "prepare", "begin"], '
            'io.StringIO())\n'
            'log.path = %r\n'
            'log.record(figures.HookTimer("prepare"), figures.OK)\n'
            'log.flush()\n' % str(log_path), timeout=20)
        assert done.returncode == 0, done.stderr[-500:]
        text = log_path.read_text()
        assert 'locked by a stopped process %d' % holder.pid in text
    finally:
        holder.end()


# --- hard links were followed ------------------------------------------------

def _outside(tmp_path):
    path = tmp_path / 'elsewhere'
    path.write_text('precious\n')
    os.chmod(path, 0o640)
    return path


def _assert_untouched(path):
    assert path.read_text() == 'precious\n'
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640


def test_a_hard_linked_hook_log_is_not_appended_to(tmp_path):
    sd = _state_dir(tmp_path)
    outside = _outside(tmp_path)
    os.link(outside, sd / hook_log.LOG_NAME)
    import io
    err = io.StringIO()
    log = hook_log.HookLog(['qemu', 'vm1', 'prepare', 'begin'], err)
    log.path = str(sd / hook_log.LOG_NAME)
    log.info('hello')
    log.flush()
    _assert_untouched(outside)
    assert 'it has 2 hard links' in err.getvalue()


def test_a_hard_linked_figures_file_is_not_written(tmp_path):
    sd = _state_dir(tmp_path)
    outside = _outside(tmp_path)
    os.link(outside, sd / figures.HOOK_FIGURES)
    with pytest.raises(exception.StateError, match='2 hard links'):
        figures.record_hook_call(str(sd), 'prepare', figures.OK, 0.01)
    _assert_untouched(outside)


def test_a_hard_linked_lease_lock_is_not_truncated(tmp_path):
    sd = _state_dir(tmp_path)
    outside = _outside(tmp_path)
    os.link(outside, sd / state.LOCK_NAME)
    with pytest.raises(exception.StateError) as e:
        state.LeaseStore(sd).leases()
    _assert_untouched(outside)
    assert 'it has 2 hard links' in str(e.value)
    assert 'rm %s' % (sd / state.LOCK_NAME) in str(e.value)


def test_write_atomic_never_follows_a_planted_temporary_name(tmp_path):
    """The temporary file had a name anyone could guess
    (``.<name>.<pid>.tmp``): a link planted there made root overwrite and
    chmod the file it points to."""
    sd = _state_dir(tmp_path)
    outside = _outside(tmp_path)
    os.symlink(outside, sd / ('.hook-settings.json.%d.tmp' % os.getpid()))
    fileutil.write_atomic(str(sd / 'hook-settings.json'), '{}', mode=0o644)
    _assert_untouched(outside)
    assert (sd / 'hook-settings.json').read_text() == '{}'


def test_write_atomic_creates_its_temporary_file_exclusively(tmp_path,
                                                             monkeypatch):
    """Even a name drawn twice is never opened: O_EXCL | O_NOFOLLOW."""
    sd = _state_dir(tmp_path)
    outside = _outside(tmp_path)
    draws = iter([b'\x01' * 8, b'\x01' * 8, b'\x02' * 8])
    monkeypatch.setattr(os, 'urandom', lambda n: next(draws))
    os.symlink(outside, sd / ('.target.%s.tmp' % ('01' * 8)))
    fileutil.write_atomic(str(sd / 'target'), 'new')
    _assert_untouched(outside)
    assert (sd / 'target').read_text() == 'new'
    assert sorted(n for n in os.listdir(sd) if 'target' in n) == [
        '.target.%s.tmp' % ('01' * 8), 'target']


# --- files planted earlier were trusted --------------------------------------

@root_only
def test_a_planted_settings_snapshot_is_not_trusted(env):
    """A hook-settings.json of another user (planted while the directory
    was writable) made the root hook create a vGPU the configuration does
    not allow: now it is rebuilt from the configuration."""
    settings, note = hook.load_settings(env.config, env.settings_file)
    assert settings.enabled_types() == ['nvidia-223']
    with open(env.settings_file) as f:
        doc = json.load(f)
    for entry in doc['extra']['enabled'].values():
        entry['type_id'] = 'nvidia-224'
    os.unlink(env.settings_file)
    with open(env.settings_file, 'w') as f:
        json.dump(doc, f)
    os.chown(env.settings_file, NOBODY, NOBODY)
    settings, note = hook.load_settings(env.config, env.settings_file)
    assert settings.enabled_types() == ['nvidia-223']
    assert note is not None                     # rebuilt, not trusted
    assert os.stat(env.settings_file).st_uid == 0


@root_only
@pytest.mark.parametrize('name', [state.LOCK_NAME, state.BOOT_ID_NAME,
                                  statedir.OWNER_NAME])
def test_another_users_state_file_is_refused(tmp_path, name):
    sd = _state_dir(tmp_path)
    state.LeaseStore(sd, sysfs_root=str(tmp_path)).leases()
    path = sd / name
    assert path.exists()
    os.chown(path, NOBODY, NOBODY)
    with pytest.raises(exception.StateError) as e:
        state.LeaseStore(sd, sysfs_root=str(tmp_path)).leases()
    assert 'owned by uid %d, not root' % NOBODY in str(e.value)
    assert 'rm %s' % path in str(e.value)


@root_only
def test_another_users_lease_file_is_refused(tmp_path):
    sd = _state_dir(tmp_path)
    store = state.LeaseStore(sd)
    store.leases()
    store.close()
    os.chown(store.db_path, NOBODY, NOBODY)
    with pytest.raises(exception.StateError, match='owned by uid 65534'):
        state.LeaseStore(sd).leases()


# --- only the directory was checked, not its parents -------------------------

@pytest.mark.parametrize('kind', [pytest.param('owner', marks=root_only),
                                  'group-writable', 'sticky'])
def test_a_parent_another_user_can_change_is_refused(tmp_path, kind):
    """A user who owns (or can write) a parent of the state directory
    could rename it away or swap it: every parent up to / is checked."""
    parent = tmp_path / 'parent'
    parent.mkdir()
    sd = parent / 'state'
    sd.mkdir(mode=0o700)
    if kind == 'owner':
        os.chown(parent, NOBODY, NOBODY)
        expected = 'its parent %s is owned by uid %d' % (parent, NOBODY)
        fix = 'chown root %s' % parent
    elif kind == 'group-writable':
        os.chmod(parent, 0o775)
        expected = 'its parent %s is writable by group or others' % parent
        fix = 'chmod go-w %s' % parent
    else:
        os.chmod(parent, 0o1777)
        expected = 'its parent %s is writable by anyone (mode 1777' % parent
        fix = 'such as /var/lib/libvirt-gpu'
    for call in (lambda: statedir.check_dir(str(sd)),
                 lambda: state.LeaseStore(sd).leases()):
        with pytest.raises(exception.StateError) as e:
            call()
        message = str(e.value)
        assert expected in message and fix in message
        assert '\n' not in message


@root_only
def test_a_linked_parent_is_judged_where_it_points(tmp_path):
    real = tmp_path / 'real'
    real.mkdir()
    os.chown(real, NOBODY, NOBODY)
    (real / 'state').mkdir(mode=0o700)
    os.symlink(real, tmp_path / 'link')
    with pytest.raises(exception.StateError, match='its parent %s is owned'
                       % real):
        statedir.check_dir(str(tmp_path / 'link' / 'state'))


def test_a_swapped_directory_cannot_redirect_a_state_file(tmp_path):
    """A state file is opened relative to a descriptor of its directory,
    never through a link where the directory was."""
    sd = _state_dir(tmp_path)
    elsewhere = tmp_path / 'elsewhere'
    elsewhere.mkdir(mode=0o700)
    os.rename(sd, tmp_path / 'moved')
    os.symlink(elsewhere, sd)
    with pytest.raises(exception.StateError, match='not a directory'):
        statedir.open_file(str(sd / 'hook.log'), os.O_WRONLY | os.O_CREAT)
    assert os.listdir(elsewhere) == []


# --- boot_id: a FIFO hung every call, /dev/zero was read to GBs --------------

def _store_code(sd, boot_id_path):
    return ('import resource\n'
            'resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n'
            'from libvirt_gpu.store import state\n'
            'try:\n'
            '    state.LeaseStore(%r, boot_id_path=%r).leases()\n'
            '    print("used")\n'
            'except Exception as e:\n'
            '    print(e)\n' % (str(sd), str(boot_id_path)))


def test_a_fifo_boot_id_is_refused_not_waited_on(tmp_path):
    sd = _state_dir(tmp_path)
    fifo = tmp_path / 'boot_id'
    os.mkfifo(fifo)
    done = _python(_store_code(sd, fifo))
    assert 'it is a FIFO, not a regular file' in done.stdout, done.stderr


def test_a_boot_id_linked_to_dev_zero_is_not_read(tmp_path):
    sd = _state_dir(tmp_path)
    link = tmp_path / 'boot_id'
    os.symlink('/dev/zero', link)
    done = _python(_store_code(sd, link))
    assert 'it is a symbolic link' in done.stdout, done.stderr[-500:]
    done = _python(_store_code(sd, '/dev/zero'))
    assert 'a character device, not a regular file' in done.stdout, \
        done.stderr[-500:]


def test_a_fifo_boot_id_marker_is_refused_not_waited_on(tmp_path):
    sd = _state_dir(tmp_path)
    os.unlink(sd / state.BOOT_ID_NAME)
    os.mkfifo(sd / state.BOOT_ID_NAME, 0o600)
    done = _python(_store_code(sd, state.BOOT_ID_PATH))
    assert 'it is a FIFO, not a regular file' in done.stdout, done.stderr


def test_a_huge_owner_file_is_not_echoed(tmp_path):
    sd = _state_dir(tmp_path)
    with open(sd / statedir.OWNER_NAME, 'w') as f:
        f.write('sysfs_root=/' + 'x' * (10 << 20) + '\n')
    os.chmod(sd / statedir.OWNER_NAME, 0o600)
    with pytest.raises(exception.StateError) as e:
        state.LeaseStore(sd, sysfs_root=str(tmp_path)).leases()
    assert 'x' * 100 not in str(e.value)
    assert 'more than 4096 bytes' in str(e.value)
    assert 'move it aside' in str(e.value)


def test_a_long_owner_line_is_cut_in_the_message(tmp_path):
    sd = _state_dir(tmp_path)
    with open(sd / statedir.OWNER_NAME, 'w') as f:
        f.write('sysfs_root=/' + 'x' * 3000 + '\n')
    with pytest.raises(exception.StateError) as e:
        state.LeaseStore(sd, sysfs_root=str(tmp_path)).leases()
    assert 'belong to the host with' in str(e.value)
    assert 'x' * 300 not in str(e.value) and 'x...' in str(e.value)


# --- lease files that are not ours -------------------------------------------

def _sqlite(path, script):
    db = sqlite3.connect(str(path))
    db.executescript(script)
    db.commit()
    db.close()
    os.chmod(path, 0o600)


def _schema(path):
    db = sqlite3.connect(str(path))
    try:
        return db.execute('SELECT type, name, sql FROM sqlite_master '
                          'ORDER BY name').fetchall()
    finally:
        db.close()


_FOREIGN = {
    'other-program': 'CREATE TABLE photos (id INTEGER PRIMARY KEY, '
                     'name TEXT);',
    'view': 'CREATE TABLE t (x); CREATE VIEW leases AS SELECT x FROM t;',
    'columns': 'CREATE TABLE leases (mdev_uuid TEXT PRIMARY KEY, x TEXT);',
    'trigger': state._SCHEMA + (
        'CREATE TRIGGER eat AFTER INSERT ON leases BEGIN '
        'DELETE FROM leases WHERE mdev_uuid = NEW.mdev_uuid; END;'),
}


@pytest.mark.parametrize('kind', sorted(_FOREIGN))
def test_a_foreign_lease_file_is_refused_not_adopted(tmp_path, kind):
    sd = _state_dir(tmp_path)
    db_path = sd / state.DB_NAME
    _sqlite(db_path, _FOREIGN[kind])
    before = _schema(db_path)
    store = state.LeaseStore(sd)
    for call in (store.leases, lambda: store.snapshot().__enter__()):
        with pytest.raises(exception.StateError) as e:
            call()
        message = str(e.value)
        assert 'move it aside (`mv %s %s.broken`)' % (db_path, db_path) \
            in message
        for raw in ('no such', 'may not be', 'near "', 'syntax error'):
            assert raw not in message
    assert _schema(db_path) == before           # never adopted nor changed


def test_a_garbage_lease_file_says_what_to_do(tmp_path):
    sd = _state_dir(tmp_path)
    db_path = sd / state.DB_NAME
    with open(db_path, 'wb') as f:
        f.write(os.urandom(8192))
    os.chmod(db_path, 0o600)
    with pytest.raises(exception.StateError) as e:
        state.LeaseStore(sd).leases()
    assert 'not a SQLite file' in str(e.value)
    assert 'move it aside' in str(e.value)
    assert 'file is not a database' not in str(e.value)


def test_our_own_lease_file_still_opens(tmp_path):
    sd = _state_dir(tmp_path)
    store = state.LeaseStore(sd)
    with store.transaction() as txn:
        txn.add(th.new_uuid(), th.DOM,
                objects.PciAddress.parse('0000:3b:00.0'),
                objects.TypeId.parse('nvidia-223'))
    store.close()
    assert len(state.LeaseStore(sd).leases()) == 1
    with state.LeaseStore(sd).snapshot() as txn:
        assert len(txn.all()) == 1


# --- a holder stopped before writing its PID ---------------------------------

def test_a_holder_stopped_before_naming_itself_is_named_at_once(tmp_path):
    """The lock file still names the previous holder (this test's
    process, running): the waiter used to trust it and wait the whole
    timeout.  The kernel's word (/proc/locks) names the real one."""
    sd = _state_dir(tmp_path)
    state.LeaseStore(sd).leases()               # records this process
    holder = Holder(sd / state.LOCK_NAME, stop=True)
    try:
        done = _python('from libvirt_gpu.store import state\n'
                       'try:\n'
                       '    state.LeaseStore(%r, lock_timeout=3600).leases()\n'
                       'except Exception as e:\n'
                       '    print(e)\n' % str(sd), timeout=30)
        assert 'locked by a stopped process %d' % holder.pid in done.stdout
        assert 'kill -CONT %d' % holder.pid in done.stdout
    finally:
        holder.end()


def test_lock_holders_names_the_kernels_holder(tmp_path):
    path = tmp_path / 'lockfile'
    path.write_text('')
    holder = Holder(path, shared=True)
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            assert statedir.lock_holders(fd) == [holder.pid]
            with pytest.raises(exception.StateError,
                               match='still locked after 0 s by process'):
                statedir.lock(fd, str(path), timeout=0.1)
            statedir.lock(fd, str(path), exclusive=False, timeout=0.1)
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
    finally:
        holder.end()


def test_an_unknown_holder_is_said_unknown(tmp_path):
    assert 'an unknown process; find it with `fuser -v /x`' in \
        statedir.describe_holder(None, '/x')


def test_a_lease_file_of_schema_1_still_opens(tmp_path):
    """No ``expires_at``, no ``borrowed`` table: an older file of ours,
    upgraded, not refused."""
    sd = _state_dir(tmp_path)
    db_path = sd / state.DB_NAME
    _sqlite(db_path, state._SCHEMA.split('CREATE TABLE IF NOT EXISTS '
                                         'borrowed')[0].replace(
        ',\n    expires_at  REAL\n', '\n') + 'PRAGMA user_version = 1;')
    assert 'expires_at' not in str(_schema(db_path))
    assert state.LeaseStore(sd).leases() == []
    assert 'borrowed' in str(_schema(db_path))
