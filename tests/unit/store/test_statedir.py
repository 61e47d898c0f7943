"""What the trusted state directory (store/statedir.py) promises that
test_statedir_guards and test_statedir_hardening left open: each test here
fails on a change ``make mutation`` made that the rest stayed green on
(docs/dev/mutation.md) -- the whole refusal a user reads, the bounds of
each read, which file is opened and how, and a lock's wait.

Every wait on a lock is short and passed explicitly (``timeout=0.05`` to
``0.6``): a holder is a second open file description of this process or
a child process that holds the ``flock`` (forked, told to end through a
pipe); nothing sleeps to wait for anything.  They run as any user;
those that make other users' files (``os.chown``) or check a non-root
caller in a forked child that became another user need root and are
skipped without it (``root_only``).
"""

import errno
import fcntl
import os
import pickle
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from libvirt_gpu import exception
from libvirt_gpu.store import statedir
from tests.doubles import poll
from tests.doubles import paths

ROOT = paths.ROOT
OTHER = 4242            # a uid and gid nobody here has
THIRD = 4343

root_only = pytest.mark.skipif(os.geteuid() != 0,
                               reason='makes files of another user')


@pytest.fixture
def sd(tmp_path):
    """A private state directory (checked usable)."""
    path = tmp_path / 'state'
    statedir.ensure_dir(str(path))
    return path


def _fds():
    return sorted(os.listdir('/proc/self/fd'))


def _message(call):
    with pytest.raises(exception.StateError) as e:
        call()
    return str(e.value)


def _file(path, text='data', mode=0o600, uid=0):
    with open(path, 'w') as f:
        f.write(text)
    os.chmod(path, mode)
    if uid:
        os.chown(path, uid, uid)
    return str(path)


class Child(object):
    """A forked child that runs ``setup()`` (holding whatever it opens),
    says so through a pipe, optionally stops itself, and waits until
    ``end()``."""

    def __init__(self, setup=lambda: None, stop=False):
        ready_r, ready_w = os.pipe()
        self.end_r, end_w = os.pipe()
        pid = os.fork()
        if pid == 0:                                # the child
            code = 1
            try:
                os.close(ready_r)
                os.close(end_w)
                setup()
                os.write(ready_w, b'x')
                if stop:
                    os.kill(os.getpid(), signal.SIGSTOP)
                os.read(self.end_r, 1)
                code = 0
            finally:
                os._exit(code)
        os.close(ready_w)
        os.close(self.end_r)
        self.end_w = end_w
        assert os.read(ready_r, 1) == b'x'
        os.close(ready_r)
        self.pid = pid
        if stop:
            assert poll.wait_for(lambda: _state(pid) == 'T')

    def end(self):
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        os.close(self.end_w)


def _state(pid):
    with open('/proc/%d/stat' % pid, 'rb') as f:
        text = f.read()
    return text[text.rfind(b')') + 2:][:1].decode()


def _flock(path, operation=fcntl.LOCK_EX):
    def setup():
        fd = os.open(str(path), os.O_RDONLY)
        fcntl.flock(fd, operation)
    return setup


def _as_user(uid, call):
    """``call()``'s result (or its exception, as its type and message)
    in a forked child running as ``uid``."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            try:
                result = ('ok', call())
            except Exception as e:
                result = ('error', type(e).__name__, str(e))
            os.write(write, pickle.dumps(result))
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, 'rb') as f:
        data = f.read()
    os.waitpid(pid, 0)
    return pickle.loads(data)


def _reachable_by_all(path):
    """Whether root's state checks pass for ``path`` and its parents, and
    every user can pass through each of them."""
    try:
        statedir.check_dir(path)
    except (OSError, exception.StateError):
        return False
    while True:
        if not os.stat(path).st_mode & stat.S_IXOTH:
            return False
        if path == '/':
            return True
        path = os.path.dirname(path)


@pytest.fixture
def shared():
    """A directory every user can reach, in a root-owned parent nobody
    else writes (not the checkout: a clone below /tmp, which everyone
    writes, or in a private directory would fail the parents' check for
    reasons of its own), removed after."""
    candidates = ('/run', '/var/lib', os.path.join(ROOT, '.cache'))
    bases = [base for base in candidates
             if os.path.isdir(base) and _reachable_by_all(base)]
    assert bases, 'no root-owned directory every user can pass through'
    path = tempfile.mkdtemp(prefix='libvirt-gpu-test-', dir=bases[0])
    os.chmod(path, 0o755)
    yield path
    subprocess.run(['rm', '-rf', path], check=True)


# --- Refused ----------------------------------------------------------------

def test_a_refusal_is_a_state_error_and_a_permission_error():
    e = statedir.Refused('/s/f', 'why')
    assert isinstance(e, exception.StateError) and isinstance(e, OSError)
    assert (e.errno, e.strerror, e.filename) == (errno.EPERM, 'why', '/s/f')
    assert str(e) == 'State file /s/f: why'


# --- the directory ----------------------------------------------------------

def test_a_missing_directory_says_so(tmp_path):
    path = str(tmp_path / 'nope')
    assert _message(lambda: statedir.check_dir(path)) == (
        'State file %s: No such file or directory' % path)


def test_a_linked_directory_is_refused(tmp_path, sd):
    link = str(tmp_path / 'link')
    os.symlink(sd, link)
    assert _message(lambda: statedir.check_dir(link)) == (
        'State file %s: a symbolic link, not a directory; set '
        '[DEFAULT]/state_dir to a directory' % link)


def test_a_fifo_is_not_a_directory(tmp_path):
    path = str(tmp_path / 'fifo')
    os.mkfifo(path, 0o700)
    assert _message(lambda: statedir.check_dir(path)) == (
        'State file %s: it is a FIFO, not a directory; set '
        '[DEFAULT]/state_dir to a directory' % path)


@root_only
def test_another_users_directory_names_the_fix(sd):
    os.chown(sd, OTHER, 0)
    assert _message(lambda: statedir.check_dir(str(sd))) == (
        'State file %s: it is owned by uid %d, not root, who could rename '
        'or swap it: run `chown root %s` or choose another '
        '[DEFAULT]/state_dir' % (sd, OTHER, sd))


@pytest.mark.parametrize('mode', [0o770, 0o702, 0o1770])
def test_a_writable_directory_names_its_mode_and_the_fix(sd, mode):
    os.chmod(sd, mode)
    assert _message(lambda: statedir.check_dir(str(sd))) == (
        'State file %s: it is writable by group or others (mode %04o): run '
        '`chmod go-w %s`' % (sd, mode, sd))


def test_a_sticky_directory_anyone_writes_is_refused_as_such(sd):
    os.chmod(sd, 0o1777)
    assert _message(lambda: statedir.check_dir(str(sd))) == (
        'State file %s: it is writable by anyone (mode 1777, sticky like '
        '/tmp), where other users make names: choose a [DEFAULT]/state_dir '
        'whose every parent only root can write, such as '
        '/var/lib/libvirt-gpu' % sd)


@pytest.mark.parametrize('mode', [0o1700, 0o1755, 0o700])
def test_a_sticky_bit_alone_is_no_reason(sd, mode):
    os.chmod(sd, mode)
    statedir.check_dir(str(sd))
    fd, st = statedir.open_dir(str(sd))
    os.close(fd)
    assert stat.S_IMODE(st.st_mode) == mode


def test_a_parent_is_named_with_its_fix(tmp_path):
    parent = tmp_path / 'p'
    (parent / 'state').mkdir(parents=True, mode=0o700)
    os.chmod(parent, 0o770)
    path = str(parent / 'state')
    assert _message(lambda: statedir.check_dir(path)) == (
        'State file %s: its parent %s is writable by group or others '
        '(mode 0770): run `chmod go-w %s`' % (path, parent, parent))


@root_only
def test_every_parent_is_checked_not_only_the_first(tmp_path):
    top = tmp_path / 'top'
    (top / 'mid' / 'state').mkdir(parents=True, mode=0o700)
    os.chown(top, OTHER, OTHER)
    path = str(top / 'mid' / 'state')
    assert 'its parent %s is owned by uid %d' % (top, OTHER) in _message(
        lambda: statedir.check_dir(path))


def test_a_relative_state_directory_is_checked_up_to_the_root(
        tmp_path, monkeypatch):
    (tmp_path / 'w' / 'state').mkdir(parents=True, mode=0o700)
    monkeypatch.chdir(tmp_path / 'w')
    statedir.check_dir('state')
    os.chmod(tmp_path / 'w', 0o777)
    assert 'its parent %s is writable by group or others' % (
        tmp_path / 'w') in _message(lambda: statedir.check_dir('state'))


def test_parents_above_a_link_are_checked_too(tmp_path):
    """Above the link the path's own parents (not where it points) can
    still be renamed by whoever writes them."""
    real = tmp_path / 'real'
    (real / 'state').mkdir(parents=True, mode=0o700)
    loose = tmp_path / 'loose'
    loose.mkdir()
    os.symlink(real, loose / 'link')
    path = str(loose / 'link' / 'state')
    statedir.check_dir(path)
    os.chmod(loose, 0o775)
    assert 'its parent %s is writable by group or others' % loose in \
        _message(lambda: statedir.check_dir(path))


def test_a_parent_where_a_link_points_is_named_with_the_state_dir(
        tmp_path):
    real = tmp_path / 'real'
    (real / 'sub').mkdir(parents=True)
    os.symlink(real / 'sub', tmp_path / 'link')
    (real / 'sub' / 'state').mkdir(mode=0o700)
    path = str(tmp_path / 'link' / 'state')
    statedir.check_dir(path)
    os.chmod(real, 0o777)
    assert _message(lambda: statedir.check_dir(path)) == (
        'State file %s: its parent %s is writable by group or others '
        '(mode 0777): run `chmod go-w %s`' % (path, real, real))


def test_a_parent_that_cannot_be_examined_is_named(sd, monkeypatch):
    parent = os.path.dirname(str(sd))
    real = os.lstat

    def lstat(path, *args, **kwargs):
        if path == parent:
            raise PermissionError(errno.EACCES, 'Permission denied')
        return real(path, *args, **kwargs)
    monkeypatch.setattr(os, 'lstat', lstat)
    assert _message(lambda: statedir.check_dir(str(sd))) == (
        'State file %s: %s: Permission denied' % (sd, parent))


@root_only
def test_a_non_root_user_may_keep_a_private_state_directory(shared):
    mine = os.path.join(shared, 'mine')
    roots = os.path.join(shared, 'roots')
    theirs = os.path.join(shared, 'theirs')
    for path, uid in ((mine, OTHER), (roots, 0), (theirs, THIRD)):
        os.mkdir(path, 0o755)
        os.chown(path, uid, uid)
    statedir.check_dir(roots)                   # root's, for root too
    assert _as_user(OTHER, lambda: statedir.check_dir(mine)) == ('ok', None)
    assert _as_user(OTHER, lambda: statedir.check_dir(roots)) == (
        'ok', None)
    found = _as_user(OTHER, lambda: statedir.check_dir(theirs))
    assert found[0] == 'error' and 'owned by uid %d' % THIRD in found[2]


def test_a_new_state_directory_is_private(tmp_path):
    path = tmp_path / 'new' / 'state'
    statedir.ensure_dir(str(path))
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
    statedir.ensure_dir(str(path))              # and again: it stands


def test_a_state_directory_under_a_file_says_why(tmp_path):
    _file(tmp_path / 'f')
    path = str(tmp_path / 'f' / 'state')
    assert _message(lambda: statedir.ensure_dir(path)) == (
        'State file %s: Not a directory' % path)


def test_a_file_where_the_directory_should_be_is_refused(tmp_path):
    path = _file(tmp_path / 'f')
    assert _message(lambda: statedir.ensure_dir(path)).startswith(
        'State file %s: it is ' % path)


def test_open_dir_gives_a_descriptor_of_the_directory_itself(sd):
    fd, st = statedir.open_dir(str(sd))
    try:
        assert os.path.samestat(os.fstat(fd), os.stat(sd))
        assert os.path.samestat(st, os.stat(sd))
        assert not os.get_inheritable(fd)
        assert os.listdir(fd) == []
    finally:
        os.close(fd)


@pytest.mark.parametrize('kind', ['link', 'file'])
def test_open_dir_refuses_what_is_not_a_directory(tmp_path, sd, kind):
    path = tmp_path / 'x'
    if kind == 'link':
        os.symlink(sd, path)
    else:
        _file(path)
    before = _fds()
    assert _message(lambda: statedir.open_dir(str(path))) == (
        'State file %s: not a directory (or a link to one); set '
        '[DEFAULT]/state_dir to a directory' % path)
    assert _fds() == before


def test_open_dir_refuses_a_loose_directory_and_closes_it(sd):
    os.chmod(sd, 0o777)
    before = _fds()
    assert _message(lambda: statedir.open_dir(str(sd))) == (
        'State file %s: it is writable by group or others (mode 0777): run '
        '`chmod go-w %s`' % (sd, sd))
    assert _fds() == before


def test_open_dir_of_a_missing_directory_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        statedir.open_dir(str(tmp_path / 'nope'))


# --- state files ------------------------------------------------------------

def test_a_new_state_file_is_private_whatever_mode_is_asked(sd):
    for name, mode, expected in (('a', 0o600, 0o600), ('b', 0o644, 0o600),
                                 ('c', 0o755, 0o700)):
        fd = statedir.open_file(str(sd / name), os.O_WRONLY | os.O_CREAT,
                                mode)
        try:
            assert not os.get_inheritable(fd)
            os.write(fd, b'x')
        finally:
            os.close(fd)
        assert stat.S_IMODE(os.stat(sd / name).st_mode) == expected
        assert (sd / name).read_bytes() == b'x'


@pytest.mark.parametrize('mode, expected', [(0o644, 0o600), (0o604, 0o600),
                                            (0o755, 0o700), (0o700, 0o700),
                                            (0o400, 0o400)])
def test_a_file_others_can_open_is_made_private(sd, mode, expected):
    path = _file(sd / 'f', mode=mode)
    fd = statedir.open_file(path)
    os.close(fd)
    assert stat.S_IMODE(os.stat(path).st_mode) == expected
    assert (sd / 'f').read_text() == 'data'


@root_only
def test_another_users_file_is_never_chmod_ed(sd):
    """Accepted when its directory's owner is that user (``owner``), and
    left as it is: only our own files are made private."""
    path = _file(sd / 'f', mode=0o644, uid=OTHER)
    dir_fd, _ = statedir.open_dir(str(sd))
    try:
        fd = statedir.open_at(dir_fd, 'f', path, OTHER)
        os.close(fd)
    finally:
        os.close(dir_fd)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644


@root_only
@pytest.mark.parametrize('file_uid, owner, words', [
    (OTHER, 0, 'owned by uid %d, not root' % OTHER),
    (0, OTHER, 'owned by root, not uid %d' % OTHER),
    (OTHER, THIRD, 'owned by uid %d, not uid %d' % (OTHER, THIRD))])
def test_a_file_of_another_owner_is_refused_untouched(sd, file_uid, owner,
                                                      words):
    path = _file(sd / 'f', mode=0o644, uid=file_uid)
    before = _fds()
    dir_fd, _ = statedir.open_dir(str(sd))
    try:
        message = _message(lambda: statedir.open_at(
            dir_fd, 'f', path, owner, os.O_RDWR | os.O_TRUNC))
    finally:
        os.close(dir_fd)
    assert message == (
        'State file %s: it is %s (the owner of its directory): another '
        'user\'s file is not trusted; remove it (`rm %s`)'
        % (path, words, path))
    assert _fds() == before
    assert (sd / 'f').read_text() == 'data'
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644


def test_a_hard_linked_file_is_neither_truncated_nor_changed(tmp_path, sd):
    outside = _file(tmp_path / 'outside', 'precious', mode=0o644)
    os.link(outside, sd / 'f')
    before = _fds()
    assert _message(lambda: statedir.open_file(
        str(sd / 'f'), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)) == (
        'State file %s: it has 2 hard links: writing it would write a file '
        'elsewhere; remove it (`rm %s`)' % (sd / 'f', sd / 'f'))
    assert _fds() == before
    assert (tmp_path / 'outside').read_text() == 'precious'
    assert stat.S_IMODE(os.stat(outside).st_mode) == 0o644


def test_a_linked_state_file_is_refused(tmp_path, sd):
    target = _file(tmp_path / 'target')
    os.symlink(target, sd / 'f')
    for flags in (os.O_RDONLY, os.O_WRONLY | os.O_CREAT):
        assert _message(lambda: statedir.open_file(str(sd / 'f'), flags)) \
            == ('State file %s: it is a symbolic link, not a regular file; '
                'remove it (`rm %s`)' % (sd / 'f', sd / 'f'))
    assert (tmp_path / 'target').read_text() == 'data'


@pytest.mark.parametrize('kind', ['fifo', 'socket'])
def test_a_special_file_opened_for_writing_is_named(sd, kind):
    from tests.doubles import sockets
    path = str(sd / 'f')
    if kind == 'fifo':
        os.mkfifo(path, 0o600)
        words = 'a FIFO'
    else:
        sockets.make_socket_file(path)
        words = 'a socket'
    assert _message(lambda: statedir.open_file(
        path, os.O_WRONLY | os.O_CREAT)) == (
        'State file %s: it is %s, not a regular file; remove it (`rm %s`)'
        % (path, words, path))


def test_a_special_file_gone_before_it_is_named_is_still_refused(
        sd, monkeypatch):
    path = str(sd / 'f')
    os.mkfifo(path, 0o600)

    def gone(*args, **kwargs):
        raise FileNotFoundError(errno.ENOENT, 'No such file or directory')
    monkeypatch.setattr(os, 'stat', gone)
    assert _message(lambda: statedir.open_file(path, os.O_WRONLY)) == (
        'State file %s: it is a special file, not a regular file; remove it '
        '(`rm %s`)' % (path, path))


def test_what_a_refused_name_is_is_said_of_the_name_not_its_target(
        tmp_path, sd, monkeypatch):
    """A FIFO swapped for a link to one between the open and the look
    at it: the link is named, never followed."""
    os.mkfifo(tmp_path / 'fifo', 0o600)
    os.symlink(tmp_path / 'fifo', sd / 'f')
    real = os.open

    def no_reader(name, flags, *args, **kwargs):
        if kwargs.get('dir_fd') is None:
            return real(name, flags, *args, **kwargs)
        raise OSError(errno.ENXIO, 'No such device or address')
    monkeypatch.setattr(os, 'open', no_reader)
    path = str(sd / 'f')
    assert _message(lambda: statedir.open_file(path, os.O_WRONLY)) == (
        'State file %s: it is a symbolic link, not a regular file; remove '
        'it (`rm %s`)' % (path, path))


def test_a_fifo_is_never_waited_on(sd):
    """Opened for reading it would wait for a writer: refused at once."""
    path = str(sd / 'f')
    os.mkfifo(path, 0o600)
    found = []

    def call():
        try:
            statedir.open_file(path)
        except exception.StateError as e:
            found.append(str(e))
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(5)
    if thread.is_alive():                   # let it go: open the writer
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(5)
    assert found == ['State file %s: it is a FIFO, not a regular file; '
                     'remove it (`rm %s`)' % (path, path)]


def test_a_directory_in_a_state_file_s_place(sd):
    (sd / 'd').mkdir()
    path = str(sd / 'd')
    assert _message(lambda: statedir.open_file(path)) == (
        'State file %s: it is a directory, not a regular file; remove it '
        '(`rm %s`)' % (path, path))
    with pytest.raises(IsADirectoryError):
        statedir.open_file(path, os.O_WRONLY)


def test_a_missing_file_is_not_created_unless_asked(sd):
    with pytest.raises(FileNotFoundError):
        statedir.open_file(str(sd / 'f'))
    with pytest.raises(FileNotFoundError):
        statedir.open_file(str(sd / 'f'), os.O_WRONLY)
    assert os.listdir(sd) == []


def test_o_excl_refuses_an_existing_file(sd):
    _file(sd / 'f')
    with pytest.raises(FileExistsError):
        statedir.open_file(str(sd / 'f'), os.O_WRONLY | os.O_CREAT
                           | os.O_EXCL)
    fd = statedir.open_file(str(sd / 'g'), os.O_WRONLY | os.O_CREAT
                            | os.O_EXCL)
    os.close(fd)
    assert stat.S_IMODE(os.stat(sd / 'g').st_mode) == 0o600


def test_an_existing_file_is_opened_as_asked(sd):
    _file(sd / 'f', 'old')
    fd = statedir.open_file(str(sd / 'f'), os.O_RDWR | os.O_CREAT)
    try:
        assert os.read(fd, 10) == b'old'
        os.write(fd, b'+')
    finally:
        os.close(fd)
    assert (sd / 'f').read_text() == 'old+'
    fd = statedir.open_file(str(sd / 'f'), os.O_WRONLY | os.O_TRUNC)
    try:
        assert os.fstat(fd).st_size == 0
        os.write(fd, b'new')
    finally:
        os.close(fd)
    assert (sd / 'f').read_text() == 'new'
    fd = statedir.open_file(str(sd / 'f'), os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, b'!')
    finally:
        os.close(fd)
    assert (sd / 'f').read_text() == 'new!'


@pytest.mark.parametrize('flags', [os.O_RDONLY, os.O_WRONLY | os.O_CREAT,
                                   os.O_WRONLY | os.O_CREAT | os.O_EXCL])
def test_a_name_the_system_refuses_is_its_error(sd, flags):
    with pytest.raises(OSError) as e:
        statedir.open_file(str(sd / ('x' * 300)), flags)
    assert e.value.errno == errno.ENAMETOOLONG
    assert not isinstance(e.value, exception.StateError)


def test_a_file_name_without_a_directory_is_in_the_current_one(
        sd, monkeypatch):
    monkeypatch.chdir(sd)
    before = _fds()
    fd = statedir.open_file('f', os.O_WRONLY | os.O_CREAT)
    os.close(fd)
    assert _fds() == before
    assert (sd / 'f').exists()


def _racing_open(monkeypatch, settle_after):
    """os.open as if another program made and removed the file between
    our tries, settling after ``settle_after`` of them."""
    real = os.open
    tries = []

    def racing(name, flags, *args, **kwargs):
        if kwargs.get('dir_fd') is None:
            return real(name, flags, *args, **kwargs)
        tries.append(flags)
        if len(tries) <= settle_after:
            if flags & os.O_EXCL:
                raise FileExistsError(errno.EEXIST, 'File exists')
            raise FileNotFoundError(errno.ENOENT, 'No such file')
        return real(name, flags, *args, **kwargs)
    monkeypatch.setattr(os, 'open', racing)
    return tries


def test_a_file_that_keeps_flapping_is_given_up_after_three_tries(
        sd, monkeypatch):
    tries = _racing_open(monkeypatch, 6)
    path = str(sd / 'f')
    assert _message(lambda: statedir.open_file(
        path, os.O_WRONLY | os.O_CREAT)) == (
        'State file %s: it keeps appearing and disappearing; is another '
        'program making it?' % path)
    assert len(tries) == 6


def test_a_file_that_settles_on_the_third_try_is_used(sd, monkeypatch):
    _racing_open(monkeypatch, 5)
    fd = statedir.open_file(str(sd / 'f'), os.O_WRONLY | os.O_CREAT)
    os.close(fd)
    assert (sd / 'f').exists()


# --- reads ------------------------------------------------------------------

@pytest.mark.parametrize('max_bytes, expected', [(100, 7), (7, 7), (6, 7),
                                                 (5, 6), (0, 1)])
def test_a_read_is_bounded_to_one_byte_past_the_limit(sd, max_bytes,
                                                      expected):
    path = _file(sd / 'f', 'abcdefg')
    before = _fds()
    assert statedir.read_file(path, max_bytes) == b'abcdefg'[:expected]
    assert statedir.read_system_file(path, max_bytes) == \
        b'abcdefg'[:expected]
    assert _fds() == before


def test_a_large_file_is_read_only_to_its_bound(sd):
    path = _file(sd / 'f', 'x' * 100000)
    assert statedir.read_file(path, 10) == b'x' * 11
    assert statedir.read_system_file(path, 10) == b'x' * 11


def test_a_system_file_that_comes_in_pieces_is_read_whole():
    """/proc returns a file in pieces: each read until the bound."""
    with open('/proc/self/maps', 'rb') as f:
        size = len(f.read())
    assert size > 8192
    got = statedir.read_system_file('/proc/self/maps', 1 << 20)
    assert len(got) > 8192 and got.endswith(b'\n')
    assert len(statedir.read_system_file('/proc/self/maps', 5000)) == 5001


def test_a_system_file_that_is_a_link_is_refused(tmp_path):
    target = _file(tmp_path / 'target')
    os.symlink(target, tmp_path / 'link')
    path = str(tmp_path / 'link')
    assert _message(lambda: statedir.read_system_file(path, 10)) == (
        'State file %s: it is a symbolic link, not a regular file' % path)


@pytest.mark.parametrize('path, words', [('/dev/zero', 'a character device'),
                                         ('/', 'a directory')])
def test_a_system_file_that_is_not_regular_is_refused(path, words):
    before = _fds()
    assert _message(lambda: statedir.read_system_file(path, 10)) == (
        'State file %s: it is %s, not a regular file' % (path, words))
    assert _fds() == before


def test_a_system_fifo_is_refused_not_waited_on(tmp_path):
    path = str(tmp_path / 'fifo')
    os.mkfifo(path)
    assert _message(lambda: statedir.read_system_file(path, 10)) == (
        'State file %s: it is a FIFO, not a regular file' % path)


def test_a_missing_system_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        statedir.read_system_file(str(tmp_path / 'nope'), 10)


# --- JSON -------------------------------------------------------------------

def test_json_is_written_sorted_indented_private_and_read_back(sd):
    path = str(sd / 'f.json')
    statedir.write_json(path, {'b': 1, 'a': [2, 'é']})
    with open(path, 'rb') as f:
        assert f.read() == (b'{\n "a": [\n  2,\n  "\\u00e9"\n ],\n'
                            b' "b": 1\n}\n')
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert statedir.read_json(path, 100) == {'a': [2, 'é'], 'b': 1}


def test_json_of_exactly_the_bound_is_read_one_more_is_refused(sd):
    path = _file(sd / 'f', '[1, 2]')
    assert statedir.read_json(path, 6) == [1, 2]
    assert _message(lambda: statedir.read_json(path, 5)) == (
        'State file %s: larger than 5 bytes' % path)


def test_missing_json_is_none(sd):
    assert statedir.read_json(str(sd / 'f'), 10) is None


def test_json_that_cannot_be_trusted_says_why(tmp_path, sd):
    os.symlink(_file(tmp_path / 'target', '{}'), sd / 'f')
    path = str(sd / 'f')
    assert _message(lambda: statedir.read_json(path, 10)) == (
        'State file %s: it is a symbolic link, not a regular file; remove it '
        '(`rm %s`)' % (path, path))


@pytest.mark.parametrize('raw, words', [
    (b'{"a": ', 'not JSON: '),
    (b'"\xff"', 'not JSON: \'utf-8\' codec can\'t decode byte 0xff'),
    (b'[' * 100000, 'not JSON: nested too deeply')])
def test_json_that_is_not_json_says_so(sd, raw, words):
    path = str(sd / 'f')
    with open(path, 'wb') as f:
        f.write(raw)
    message = _message(lambda: statedir.read_json(path, 1 << 20))
    assert message.startswith('State file %s: %s' % (path, words))


# --- locked entries ---------------------------------------------------------

def test_entries_are_changed_under_an_exclusive_lock_and_saved_once(
        tmp_path):
    state_dir = tmp_path / 'new-state'
    lock_path = str(state_dir / 'x.lock')
    saved, seen = [], []

    def load():
        other = os.open(lock_path, os.O_RDONLY)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_SH | fcntl.LOCK_NB)
        finally:
            os.close(other)
        seen.append('load')
        return {'a': 1}

    before = _fds()
    with statedir.locked_entries(str(state_dir), lock_path, load,
                                 saved.append, timeout=0.1) as entries:
        assert entries == {'a': 1}
        entries['b'] = 2
    assert saved == [{'a': 1, 'b': 2}] and seen == ['load']
    assert _fds() == before
    assert stat.S_IMODE(os.stat(state_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(lock_path).st_mode) == 0o600
    other = os.open(lock_path, os.O_RDONLY)        # and let go after
    fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.close(other)


def test_unchanged_entries_are_not_saved(sd):
    saved = []
    with statedir.locked_entries(str(sd), str(sd / 'x.lock'),
                                 lambda: {'a': 1}, saved.append,
                                 timeout=0.1) as entries:
        entries['a'] = 1
    assert saved == []
    with pytest.raises(KeyError):
        with statedir.locked_entries(str(sd), str(sd / 'x.lock'),
                                     lambda: {}, saved.append,
                                     timeout=0.1) as entries:
            entries['a'] = 2
            raise KeyError('a')
    assert saved == []


def test_held_entries_are_refused_after_the_given_timeout(sd):
    lock_path = str(sd / 'x.lock')
    _file(lock_path, '')
    holder = os.open(lock_path, os.O_RDONLY)
    try:
        fcntl.flock(holder, fcntl.LOCK_SH)
        start = time.monotonic()
        message = _message(lambda: statedir.locked_entries(
            str(sd), lock_path, dict, dict, timeout=0.6).__enter__())
        assert time.monotonic() - start >= 0.6
    finally:
        os.close(holder)
    assert message.startswith('State file %s: still locked after 1 s by '
                              'process %d (' % (lock_path, os.getpid()))


# --- locks ------------------------------------------------------------------

@pytest.fixture
def lock_file(sd):
    path = str(sd / 'x.lock')
    _file(path, '')
    fd = os.open(path, os.O_RDWR)
    yield path, fd
    os.close(fd)


def _try(path, operation):
    """Whether another open file description gets ``operation`` now."""
    other = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(other, operation | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(other)


def test_a_free_lock_is_taken_exclusive_or_shared(lock_file):
    path, fd = lock_file
    statedir.lock(fd, path, timeout=0.05)
    assert not _try(path, fcntl.LOCK_SH)
    fcntl.flock(fd, fcntl.LOCK_UN)
    statedir.lock(fd, path, exclusive=False, timeout=0.05)
    assert _try(path, fcntl.LOCK_SH) and not _try(path, fcntl.LOCK_EX)


def test_a_lock_held_here_is_refused_after_the_timeout_naming_us(
        lock_file):
    path, fd = lock_file
    holder = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(holder, fcntl.LOCK_SH)
        statedir.lock(fd, path, exclusive=False, timeout=0.05)   # shared
        fcntl.flock(fd, fcntl.LOCK_UN)
        start = time.monotonic()
        message = _message(lambda: statedir.lock(fd, path, timeout=0.2))
        waited = time.monotonic() - start
    finally:
        os.close(holder)
    assert 0.2 <= waited < 5
    pid = os.getpid()
    assert message == (
        'State file %s: still locked after 0 s by %s' % (
            path, statedir.describe_holder(pid, path)))
    assert message.startswith('State file %s: still locked after 0 s by '
                              'process %d (' % (path, pid))
    statedir.lock(fd, path, timeout=0.05)       # free again


def test_the_timeout_is_said_in_whole_seconds(lock_file):
    path, fd = lock_file
    holder = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        message = _message(lambda: statedir.lock(fd, path, timeout=0.6))
    finally:
        os.close(holder)
    assert 'still locked after 1 s by process %d' % os.getpid() in message


def test_a_lock_let_go_while_waiting_is_taken_soon(lock_file,
                                                   monkeypatch):
    """Retried within milliseconds, not once a second: the holder lets
    go as the waiter starts its first pause."""
    path, fd = lock_file
    holder = os.open(path, os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)
    real = time.sleep
    pauses = []

    def sleep(seconds):
        pauses.append(seconds)
        fcntl.flock(holder, fcntl.LOCK_UN)
        real(seconds)
    monkeypatch.setattr(time, 'sleep', sleep)
    try:
        statedir.lock(fd, path, timeout=5)
    finally:
        os.close(holder)
    # one pause of milliseconds, then taken (the pauses, not the wall
    # clock: a loaded machine may run late)
    assert len(pauses) == 1 and 0 < pauses[0] <= 0.05
    assert not _try(path, fcntl.LOCK_SH)


def test_the_pause_between_tries_stays_short(lock_file, monkeypatch):
    """A long wait is retried every 50 ms at most: the pauses grow to
    that cap and stay there (pauses that kept doubling would reach
    seconds)."""
    path, fd = lock_file
    holder = os.open(path, os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)
    real = time.sleep
    pauses = []

    def sleep(seconds):
        pauses.append(seconds)
        if len(pauses) == 12:
            fcntl.flock(holder, fcntl.LOCK_UN)
        real(seconds)
    monkeypatch.setattr(time, 'sleep', sleep)
    try:
        statedir.lock(fd, path, timeout=10)
    finally:
        os.close(holder)
    assert len(pauses) == 12 and max(pauses) <= 0.05
    assert pauses == sorted(pauses) and pauses[0] < pauses[-1]


def test_a_lock_that_cannot_be_taken_at_all_says_why(tmp_path):
    fd = os.open(str(tmp_path), os.O_RDONLY)
    os.close(fd)
    assert _message(lambda: statedir.lock(fd, '/x', timeout=0.05)) == (
        'State file /x: Bad file descriptor')


def test_a_stopped_holder_is_named_at_once(lock_file):
    path, fd = lock_file
    child = Child(_flock(path), stop=True)
    try:
        start = time.monotonic()
        message = _message(lambda: statedir.lock(fd, path, timeout=20))
        waited = time.monotonic() - start
        described = statedir.describe_holder(child.pid, path)
    finally:
        child.end()
    assert waited < 10              # named, not waited out
    assert message == ('State file %s: locked by a stopped %s'
                       % (path, described))
    assert 'process %d (' % child.pid in message
    assert '`kill -CONT %d`' % child.pid in message


def test_a_running_holder_in_another_process_is_named(lock_file):
    path, fd = lock_file
    child = Child(_flock(path))
    try:
        assert statedir.lock_holders(fd) == [child.pid]
        assert not statedir.stopped(child.pid)
        message = _message(lambda: statedir.lock(fd, path, timeout=0.1))
    finally:
        child.end()
    assert 'still locked after 0 s by process %d (' % child.pid in message


def test_without_proc_locks_the_callers_holder_is_named(
        lock_file, monkeypatch):
    path, fd = lock_file
    child = Child(_flock(path))
    asked = []

    def holder(f):
        asked.append(f)
        return child.pid

    def no_proc(name, *args, **kwargs):
        raise FileNotFoundError(errno.ENOENT, 'No such file', name)
    try:
        with monkeypatch.context() as m:
            m.setattr(statedir, 'open', no_proc, raising=False)
            assert statedir.lock_holders(fd) == []
            message = _message(lambda: statedir.lock(
                fd, path, timeout=0.1, holder=holder))
            unknown = _message(lambda: statedir.lock(fd, path, timeout=0.1))
    finally:
        child.end()
    assert asked and set(asked) == {fd}
    assert 'still locked after 0 s by process %d (' % child.pid in message
    assert unknown == ('State file %s: still locked after 0 s by an unknown '
                       'process; find it with `fuser -v %s`' % (path, path))


def test_the_kernels_holders_are_each_named_once(lock_file, sd):
    path, fd = lock_file
    assert statedir.lock_holders(fd) == []
    mine = [os.open(path, os.O_RDONLY) for _ in range(2)]
    for f in mine:
        fcntl.flock(f, fcntl.LOCK_SH)
    children = [Child(_flock(path, fcntl.LOCK_SH)) for _ in range(2)]
    try:
        found = statedir.lock_holders(fd)
        assert sorted(found) == sorted([os.getpid()]
                                       + [c.pid for c in children])
        # another file's lock is not this one's
        other = _file(sd / 'other', '')
        other_fd = os.open(other, os.O_RDONLY)
        try:
            assert statedir.lock_holders(other_fd) == []
        finally:
            os.close(other_fd)
    finally:
        for c in children:
            c.end()
        for f in mine:
            os.close(f)


def test_a_waiter_is_not_a_holder(lock_file):
    path, fd = lock_file
    holder = Child(_flock(path))
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:                                    # a blocked waiter
        try:
            os.close(write)
            waiter = os.open(path, os.O_RDONLY)
            fcntl.flock(waiter, fcntl.LOCK_EX)
            os.read(read, 1)
        finally:
            os._exit(0)
    os.close(read)
    try:
        assert poll.wait_for(lambda: b'->' in open('/proc/locks', 'rb').read())
        assert statedir.lock_holders(fd) == [holder.pid]
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(write)
        holder.end()


def test_the_kernels_table_is_read_to_1_mib_at_most(
        lock_file, monkeypatch):
    import io
    path, fd = lock_file
    st = os.fstat(fd)
    line = b'1: FLOCK  ADVISORY  WRITE 4321 %02x:%02x:%d 0 EOF\n' % (
        os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    filler = b'2: POSIX  ADVISORY  WRITE 1 00:00:1 0 EOF\n'
    for head, found in ((b'', [4321]), (filler * ((1 << 20) // len(filler)
                                                  + 1), [])):
        table = head + line
        monkeypatch.setattr(statedir, 'open', lambda name, mode:
                            io.BytesIO(table), raising=False)
        assert statedir.lock_holders(fd) == found


def test_no_holders_of_a_closed_descriptor(tmp_path):
    fd = os.open(str(tmp_path), os.O_RDONLY)
    os.close(fd)
    assert statedir.lock_holders(fd) == []


# --- processes --------------------------------------------------------------

def _cmdline(pid):
    with open('/proc/%d/cmdline' % pid, 'rb') as f:
        return f.read()


def test_a_process_state_is_its_letter_and_command():
    pid = os.getpid()
    command = _cmdline(pid)[:400].replace(b'\0', b' ').strip().decode()
    assert statedir.process_state(pid) == ('R', command)
    assert statedir.process_state(99999999) is None
    assert not statedir.stopped(None)
    assert not statedir.stopped(99999999)
    assert not statedir.stopped(pid)


def test_a_process_named_with_a_parenthesis_is_read_right():
    def setup():
        with open('/proc/self/comm', 'w') as f:
            f.write('x) T y')
    child = Child(setup)
    try:
        assert poll.wait_for(lambda: _state(child.pid) == 'S')
        assert statedir.process_state(child.pid)[0] == 'S'
        assert not statedir.stopped(child.pid)
    finally:
        child.end()


def test_a_stopped_or_traced_process_is_stopped():
    child = Child(stop=True)
    try:
        assert statedir.process_state(child.pid)[0] == 'T'
        assert statedir.stopped(child.pid)
    finally:
        child.end()
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    pid = os.fork()
    if pid == 0:
        try:
            libc.ptrace(0, 0, None, None)          # PTRACE_TRACEME
            os.kill(os.getpid(), signal.SIGSTOP)
        finally:
            os._exit(0)
    try:
        os.waitpid(pid, os.WUNTRACED)
        assert statedir.process_state(pid)[0] == 't'
        assert statedir.stopped(pid)
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def test_a_process_whose_command_cannot_be_read_is_shown_unknown(
        monkeypatch):
    pid = os.getpid()

    def no_cmdline(name, mode):
        if name.endswith('/cmdline'):
            raise PermissionError(errno.EACCES, 'Permission denied', name)
        return open(name, mode)
    monkeypatch.setattr(statedir, 'open', no_cmdline, raising=False)
    assert statedir.process_state(pid) == ('R', '')
    assert statedir.describe_holder(pid, '/x').startswith(
        'process %d (?); ' % pid)
    assert statedir.describe_holder(99999999, '/x').startswith(
        'process 99999999 (?); ')


def test_a_zombie_has_no_command():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    try:
        assert poll.wait_for(lambda: _state(pid) == 'Z')
        assert statedir.process_state(pid) == ('Z', '')
        assert statedir.describe_holder(pid, '/x').startswith(
            'process %d (?); ' % pid)
    finally:
        os.waitpid(pid, 0)


def _sleeper(*args):
    proc = subprocess.Popen(
        [sys.executable.encode(), b'-c', b'import sys; sys.stdin.read()']
        + list(args), stdin=subprocess.PIPE)
    assert poll.wait_for(lambda: args[-1] in _cmdline(proc.pid))
    return proc


def _end(proc):
    proc.stdin.close()
    proc.wait(timeout=30)


def test_a_long_command_is_read_to_400_bytes_and_shown_to_200():
    proc = _sleeper(b'a' * 1000)
    try:
        command = statedir.process_state(proc.pid)[1]
        full = _cmdline(proc.pid).replace(b'\0', b' ').decode()
        assert command == full[:400]
        described = statedir.describe_holder(proc.pid, '/x')
    finally:
        _end(proc)
    assert described == (
        'process %d (%s); see what it does with `ps -o pid,stat,args -p %d` '
        '(state T: stopped, `kill -CONT %d`)'
        % (proc.pid, full[:200], proc.pid, proc.pid))


def test_a_command_in_words_is_escaped_and_decoded():
    proc = _sleeper(b'a\nb\x1bc\xffd')
    try:
        command = statedir.process_state(proc.pid)[1]
        described = statedir.describe_holder(proc.pid, '/x')
    finally:
        _end(proc)
    assert command.endswith('a\nb\x1bc\ufffdd')
    assert 'a\\nb\\x1bc\ufffdd)' in described
    assert '\n' not in described


# --- the owner of a lease store ---------------------------------------------

def test_owner_text_is_the_absolute_sysfs_root(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert statedir.owner_text('sim') == 'sysfs_root=%s\n' % (
        tmp_path / 'sim')
    assert statedir.owner_text(tmp_path / 'x') == 'sysfs_root=%s\n' % (
        tmp_path / 'x')


def test_the_owner_is_recorded_once_in_a_private_file(sd):
    owner = statedir.owner_text('/sys/é')
    statedir.check_owner(str(sd), owner)
    path = sd / 'owner'
    assert path.read_bytes() == owner.encode('utf-8')
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    statedir.check_owner(str(sd), owner)
    assert path.read_bytes() == owner.encode('utf-8')


def _owner_file(sd, raw):
    path = sd / statedir.OWNER_NAME
    with open(path, 'wb') as f:
        f.write(raw)
    os.chmod(path, 0o600)
    return str(path)


def test_another_hosts_owner_is_said_with_both(sd):
    _owner_file(sd, b'sysfs_root=/other\n')
    assert _message(lambda: statedir.check_owner(
        str(sd), statedir.owner_text('/sys'))) == (
        'State file %s: its leases belong to the host with '
        'sysfs_root=/other, not sysfs_root=/sys: give each host '
        '(configuration) its own [DEFAULT]/state_dir' % sd)


@pytest.mark.parametrize('length, shown', [(200, None), (201, 200)])
def test_a_recorded_owner_is_cut_past_200_characters(sd, length, shown):
    recorded = 'y' * length
    _owner_file(sd, recorded.encode() + b'\n')
    message = _message(lambda: statedir.check_owner(
        str(sd), statedir.owner_text('/sys')))
    expected = recorded if shown is None else recorded[:shown] + '...'
    assert 'belong to the host with %s, not' % expected in message


def test_a_recorded_owner_is_shown_on_one_line_and_decoded(sd):
    _owner_file(sd, b'a\nb\xffc\n')
    message = _message(lambda: statedir.check_owner(
        str(sd), statedir.owner_text('/sys')))
    assert 'the host with a\\nb\ufffdc, not sysfs_root=/sys:' in message


@pytest.mark.parametrize('size', [4096, 4097])
def test_an_owner_file_is_read_to_4096_bytes(sd, size):
    path = _owner_file(sd, b'z' * size)
    message = _message(lambda: statedir.check_owner(
        str(sd), statedir.owner_text('/sys')))
    if size == 4096:
        assert 'belong to the host with %s...' % ('z' * 200) in message
    else:
        assert message == (
            'State file %s: it holds more than 4096 bytes, not the one line '
            'libvirt-gpu writes; move it aside (`mv %s %s.broken`) if this '
            'directory is this host\'s' % (path, path, path))


def test_an_untrusted_owner_file_is_refused_as_such(tmp_path, sd):
    os.symlink(_file(tmp_path / 'target', 'sysfs_root=/sys\n'),
               sd / statedir.OWNER_NAME)
    path = str(sd / statedir.OWNER_NAME)
    assert _message(lambda: statedir.check_owner(
        str(sd), statedir.owner_text('/sys'))) == (
        'State file %s: it is a symbolic link, not a regular file; remove '
        'it (`rm %s`)' % (path, path))


@root_only
def test_an_owner_file_that_cannot_be_read_says_why(shared):
    state_dir = os.path.join(shared, 'state')
    os.mkdir(state_dir, 0o700)
    statedir.check_owner(state_dir, statedir.owner_text('/sys'))   # root's
    found = _as_user(OTHER, lambda: statedir.check_owner(
        state_dir, statedir.owner_text('/sys')))
    assert found == ('error', 'StateError', 'State file %s: Permission '
                     'denied' % os.path.join(state_dir, 'owner'))
