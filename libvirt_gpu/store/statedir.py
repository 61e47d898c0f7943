"""The state directory (``[DEFAULT]/state_dir``): only root steers it.

The hook runs as root on every guest start and stop and writes its log,
its settings snapshot and the leases there, so nothing in that directory
may be another user's choice (as OpenSSH's ``StrictModes``, libvirt's run
directories and systemd's tmpfiles treat trusted state):

- the directory must be a directory (not a link), owned by root (or by
  the user running the command, for a private state directory of a
  non-root user) and not writable by group or others, and so must every
  directory above it up to ``/`` (one another user could write, a sticky
  ``/tmp`` included, would let that user rename or swap the state
  directory); else every state file is refused with one line naming the
  directory and how to fix it;
- every state file is opened relative to a descriptor of that directory
  (a directory renamed or swapped after the check cannot redirect the
  open), without following a link and without waiting on a FIFO
  (``O_NOFOLLOW | O_NONBLOCK``), then ``fstat``: only a regular file
  owned by the directory's owner with one link (no hard link to a file
  elsewhere) is used; a new one is created with ``O_EXCL``; one readable
  by others is made private (0600), so no other user can open it to hold
  its lock;
- every wait on a lock is bounded and names the lock's holder
  (``lock``, ``/proc/locks``); every read is bounded (``read_file``);
- a JSON state file of records (``read_json``, ``write_json``) is changed
  under an exclusive ``flock`` of its own lock file (``locked_entries``)
  and written to a temporary file then renamed, so a reader sees the old
  or the new file, never half of one;
- the lease store records which host it belongs to (``owner``: the sysfs
  root it was made for) and refuses another.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import time

from libvirt_gpu import exception
from libvirt_gpu.util import fileutil
from libvirt_gpu.util import filetype
from libvirt_gpu.util import jsonutil
from libvirt_gpu.util import textutil

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Any, TypeVar

    _K = TypeVar('_K')
    _V = TypeVar('_V')
    StrPath = str | os.PathLike[str]

OWNER_NAME = 'owner'
_MAX_OWNER_BYTES = 4096
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# How long a lock is waited for unless the caller says otherwise.
LOCK_TIMEOUT = 2.0


class Refused(exception.StateError, OSError):
    """A state file or directory that is not to be trusted (another
    user's, a hard link, a link, not a regular file...).  Both a
    StateError and an OSError (EPERM): a caller that falls back on
    OSError (the hook settings' snapshot: rebuilt from the
    configuration) falls back on it too; ``strerror`` is the reason."""

    def __init__(self, path: StrPath, reason: str) -> None:
        exception.StateError.__init__(self, path=path, reason=reason)
        self.errno = errno.EPERM
        self.strerror = reason
        self.filename = path

    def __str__(self) -> str:
        return self.message


def _whose(uid: int) -> str:
    return 'root' if uid == 0 else 'uid %d' % uid


def _dir_reason(st: os.stat_result, path: str, what: str) -> str | None:
    """Why a directory of ``st`` cannot hold root's state (``what``: "it"
    for the state directory, "its parent X" for one above), or None."""
    if not stat.S_ISDIR(st.st_mode):
        return ('%s is %s, not a directory; set [DEFAULT]/state_dir to a '
                'directory' % (what, filetype.kind(st.st_mode)))
    if st.st_uid not in (0, os.geteuid()):
        return ('%s is owned by uid %d, not root, who could rename or swap '
                'it: run `chown root %s` or choose another '
                '[DEFAULT]/state_dir' % (what, st.st_uid, path))
    mode = stat.S_IMODE(st.st_mode)
    if mode & stat.S_ISVTX and mode & stat.S_IWOTH:
        return ('%s is writable by anyone (mode %04o, sticky like /tmp), '
                'where other users make names: choose a [DEFAULT]/state_dir '
                'whose every parent only root can write, such as '
                '/var/lib/libvirt-gpu' % (what, mode))
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        return ('%s is writable by group or others (mode %04o): run '
                '`chmod go-w %s`' % (what, mode, path))
    return None


def _ancestors(path: str) -> Iterator[str]:
    while True:
        parent = os.path.dirname(path)
        if parent == path:
            return
        yield parent
        path = parent


def check_dir(path: str) -> None:
    """Refuse a state directory someone other than root (or this user)
    could steer, itself or through a directory above it; Refused (a
    StateError) with the command that fixes it."""
    try:
        st = os.lstat(path)
    except OSError as e:
        raise exception.StateError(path=path, reason=e.strerror)
    if stat.S_ISLNK(st.st_mode):
        raise Refused(path, 'a symbolic link, not a directory; set '
                            '[DEFAULT]/state_dir to a directory')
    reason = _dir_reason(st, path, 'it')
    if reason is not None:
        raise Refused(path, reason)
    absolute = os.path.abspath(path)
    linked = _check_parents(path, absolute, os.lstat)
    if linked:
        # a link on the way (such as /var/run): judged where it points
        # too, every directory there (a few more stat calls, only then)
        _check_parents(path, os.path.realpath(absolute), os.stat)


def _check_parents(path: str, start: str,
                   stat_call: Callable[[str], os.stat_result]) -> bool:
    """Check every directory above ``start``; whether one was a link
    (``os.lstat``: then not judged here)."""
    linked = False
    for parent in _ancestors(start):
        try:
            st = stat_call(parent)
        except OSError as e:
            raise exception.StateError(path=path, reason='%s: %s'
                                       % (parent, e.strerror))
        if stat.S_ISLNK(st.st_mode):
            linked = True
            continue
        reason = _dir_reason(st, parent, 'its parent %s' % parent)
        if reason is not None:
            raise Refused(path, reason)
    return linked


def ensure_dir(path: str) -> None:
    """Create the state directory (mode 0700) when missing, then check it
    (``check_dir``)."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except FileExistsError:
        pass             # a file or dangling link: check_dir names it
    except OSError as e:
        raise exception.StateError(path=path, reason=e.strerror)
    check_dir(path)


def open_dir(path: str) -> tuple[int, os.stat_result]:
    """``(fd, st)`` of the state directory ``path``, opened without
    following a link and checked as ``check_dir`` checks the directory
    itself (its parents are ``check_dir``'s).  FileNotFoundError when
    missing."""
    try:
        fd = os.open(path, _DIR_FLAGS)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise Refused(path, 'not a directory (or a link to one); set '
                                '[DEFAULT]/state_dir to a directory')
        raise
    try:
        st = os.fstat(fd)
        reason = _dir_reason(st, path, 'it')
    except BaseException:
        os.close(fd)
        raise
    if reason is not None:
        os.close(fd)
        raise Refused(path, reason)
    return fd, st


def _open_flags(flags: int) -> int:
    return ((flags & ~(os.O_CREAT | os.O_EXCL | os.O_TRUNC))
            | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)


def open_at(dir_fd: int, name: str, path: StrPath, owner: int,
            flags: int = os.O_RDONLY, mode: int = 0o600) -> int:
    """A descriptor of the regular file ``name`` in the open directory
    ``dir_fd`` (``path``: its name in messages), owned by ``owner`` (the
    directory's owner) with one link; created (``O_CREAT`` in ``flags``)
    with ``O_EXCL``, never through a link; made private (no group or
    other bits) when it is not; truncated (``O_TRUNC``) only once checked.
    OSError (as ``os.open``) when it is missing and not created; Refused
    when it is not to be trusted."""
    fd = None
    for _ in range(3):
        if not flags & os.O_EXCL:
            try:
                fd = os.open(name, _open_flags(flags), dir_fd=dir_fd)
                break
            except FileNotFoundError:
                if not flags & os.O_CREAT:
                    raise
            except OSError as e:
                raise _open_refusal(e, name, path, dir_fd)
        try:
            fd = os.open(name, _open_flags(flags) | os.O_CREAT | os.O_EXCL,
                         mode & 0o700, dir_fd=dir_fd)
            break
        except FileExistsError:
            if flags & os.O_EXCL:
                raise
        except OSError as e:
            raise _open_refusal(e, name, path, dir_fd)
    if fd is None:
        raise Refused(path, 'it keeps appearing and disappearing; is '
                            'another program making it?')
    try:
        st = os.fstat(fd)
        reason = filetype.not_regular(st.st_mode)
        if reason is None:
            reason = _file_reason(st, path, owner)
        if reason is not None:
            raise Refused(path, reason + '; remove it (`rm %s`)' % path)
        if st.st_mode & 0o077 and st.st_uid == os.geteuid():
            os.fchmod(fd, stat.S_IMODE(st.st_mode) & 0o700)
        if flags & os.O_TRUNC and st.st_size:
            os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _file_reason(st: os.stat_result, path: StrPath,
                 owner: int) -> str | None:
    if st.st_uid != owner:
        return ('it is owned by %s, not %s (the owner of its directory): '
                'another user\'s file is not trusted'
                % (_whose(st.st_uid), _whose(owner)))
    if st.st_nlink != 1:
        return ('it has %d hard links: writing it would write a file '
                'elsewhere' % st.st_nlink)
    return None


def _open_refusal(error: OSError, name: str, path: StrPath,
                  dir_fd: int) -> OSError:
    if error.errno == errno.ELOOP:
        return Refused(path, 'it is a symbolic link, not a regular file; '
                             'remove it (`rm %s`)' % path)
    if error.errno == errno.ENXIO:
        try:
            kind = filetype.kind(os.stat(name, dir_fd=dir_fd,
                                         follow_symlinks=False).st_mode)
        except OSError:
            kind = 'a special file'
        return Refused(path, 'it is %s, not a regular file; remove it '
                             '(`rm %s`)' % (kind, path))
    return error


def open_file(path: StrPath, flags: int = os.O_RDONLY,
              mode: int = 0o600) -> int:
    """``os.open`` of a state file through its directory (``open_dir``,
    then ``open_at``: no link followed, no FIFO waited on, only a regular
    file of the directory's owner with one link, created ``O_EXCL``,
    private); returns the fd.  OSError (as ``os.open``) when it or its
    directory is missing and not created."""
    directory, name = os.path.split(os.fspath(path))
    dir_fd, st = open_dir(directory or '.')
    try:
        return open_at(dir_fd, name, path, st.st_uid, flags, mode)
    finally:
        os.close(dir_fd)


def _read_fd(fd: int, max_bytes: int) -> bytes:
    chunks, left = [], max_bytes + 1
    while left > 0:
        chunk = os.read(fd, left)
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b''.join(chunks)


def read_file(path: StrPath, max_bytes: int) -> bytes:
    """The bytes of a state file (at most ``max_bytes`` + 1, so a caller
    can tell an oversize one), through ``open_file``."""
    fd = open_file(path)
    try:
        return _read_fd(fd, max_bytes)
    finally:
        os.close(fd)


def read_system_file(path: str, max_bytes: int) -> bytes:
    """The bytes (at most ``max_bytes`` + 1) of a small regular file that
    is not ours (the kernel's ``boot_id``): not through a link, never
    waiting on a FIFO, nothing but a regular file (``/dev/zero`` is never
    read to the end).  OSError as ``os.open``; Refused for anything but
    a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
                     | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise Refused(path, 'it is a symbolic link, not a regular file')
        raise
    try:
        reason = filetype.not_regular(os.fstat(fd).st_mode)
        if reason is not None:
            raise Refused(path, reason)
        return _read_fd(fd, max_bytes)
    finally:
        os.close(fd)


def read_json(path: str, max_bytes: int) -> Any:
    """The JSON document of the state file ``path`` (read as
    ``read_file``), or None when there is none; StateError naming the file
    when it cannot be read, holds more than ``max_bytes`` or is not JSON
    (nested too deeply for the parser included)."""
    try:
        raw = read_file(path, max_bytes)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise exception.StateError(path=path, reason=e.strerror)
    if len(raw) > max_bytes:
        raise exception.StateError(
            path=path, reason='larger than %d bytes' % max_bytes)
    try:
        return jsonutil.loads(raw.decode('utf-8'))
    except (UnicodeDecodeError, ValueError) as e:
        raise exception.StateError(path=path, reason='not JSON: %s' % e)
    except RecursionError:
        raise exception.StateError(path=path,
                                   reason='not JSON: nested too deeply')


def write_json(path: str, data: object) -> None:
    """Write ``data`` to the state file ``path`` as JSON (indented, keys
    sorted, private), to a temporary file renamed over it."""
    fileutil.write_atomic(path, jsonutil.dumps(
        data, indent=1, sort_keys=True) + '\n', mode=0o600)


@contextlib.contextmanager
def locked_entries(state_dir: str, lock_path: str,
                   load: Callable[[], dict[_K, _V]],
                   save: Callable[[dict[_K, _V]], None],
                   timeout: float = 60.0) -> Iterator[dict[_K, _V]]:
    """The entries ``load()`` returns (a dict), to read and change under
    an exclusive ``flock`` of ``lock_path`` (its state directory made and
    checked, ``ensure_dir``; the wait bounded by ``timeout``, ``lock``);
    ``save(entries)`` on exit when they changed."""
    ensure_dir(state_dir)
    fd = open_file(lock_path, os.O_RDWR | os.O_CREAT)
    try:
        lock(fd, lock_path, timeout=timeout)
        entries = load()
        before = dict(entries)
        yield entries
        if entries != before:
            save(entries)
    finally:
        os.close(fd)


# --- locks -------------------------------------------------------------------

def lock_holders(fd: int) -> list[int]:
    """The PIDs that hold a ``flock`` on the file of ``fd``, from
    ``/proc/locks`` (the kernel's word: it names a holder that has not
    written anything yet); [] when none is seen."""
    try:
        st = os.fstat(fd)
        with open('/proc/locks', 'rb') as f:
            table = f.read(1 << 20)
    except OSError:
        return []
    wanted = b'%02x:%02x:%d' % (os.major(st.st_dev), os.minor(st.st_dev),
                                st.st_ino)
    pids = []
    for line in table.splitlines():
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 fe:00:2147674 0 EOF"; a waiter's
        # line has "->" after the number
        if len(fields) >= 6 and fields[1] == b'FLOCK' and \
                fields[5] == wanted and fields[4].isdigit():
            pid = int(fields[4])
            if pid and pid not in pids:
                pids.append(pid)
    return pids


def process_state(pid: int) -> tuple[str, str] | None:
    """``(state letter, command)`` of ``pid`` from ``/proc`` (bounded
    reads), or None when there is no such process."""
    try:
        with open('/proc/%d/stat' % pid, 'rb') as f:
            st = f.read(1024)
    except OSError:
        return None
    try:
        with open('/proc/%d/cmdline' % pid, 'rb') as f:
            command = f.read(400).replace(b'\0', b' ').strip()
    except OSError:
        command = b''
    state = st[st.rfind(b')') + 2:][:1].decode('ascii', 'replace')
    return state, command.decode('utf-8', 'replace')


def describe_holder(pid: int | None, path: StrPath) -> str:
    """A lock's holder in words, with what to run."""
    if pid is None:
        return ('an unknown process; find it with `fuser -v %s`' % path)
    found = process_state(pid)
    command = textutil.escape((found[1] if found else '')[:200],
                              newline=True) or '?'
    return ('process %d (%s); see what it does with `ps -o pid,stat,args '
            '-p %d` (state T: stopped, `kill -CONT %d`)'
            % (pid, command, pid, pid))


def stopped(pid: int | None) -> bool:
    """Whether ``pid`` is stopped (SIGSTOP, a debugger): it never lets a
    lock go by itself."""
    found = process_state(pid) if pid is not None else None
    return found is not None and found[0] in ('T', 't')


def lock(fd: int, path: StrPath, exclusive: bool = True,
         timeout: float = LOCK_TIMEOUT,
         holder: Callable[[int], int | None] | None = None) -> None:
    """``flock`` ``fd`` without ever waiting more than ``timeout``
    seconds, nor at all once its holder is seen stopped; StateError
    naming the holder (``lock_holders``, else ``holder(fd)``: the PID a
    caller's lock file records, else "unknown") otherwise."""
    operation = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
    deadline = time.monotonic() + timeout
    delay = 0.001
    while True:
        try:
            fcntl.flock(fd, operation | fcntl.LOCK_NB)
            return
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise exception.StateError(path=path, reason=e.strerror)
        late = time.monotonic() > deadline
        if delay >= 0.05 or late:
            pids = lock_holders(fd)
            pid = pids[0] if pids else (holder(fd) if holder else None)
            if stopped(pid):
                raise exception.StateError(
                    path=path, reason='locked by a stopped %s'
                    % describe_holder(pid, path))
            if late:
                raise exception.StateError(
                    path=path, reason='still locked after %.0f s by %s'
                    % (timeout, describe_holder(pid, path)))
        time.sleep(min(delay, max(deadline - time.monotonic(), 0.001)))
        delay = min(delay * 2, 0.05)


# --- the owner of a lease store ----------------------------------------------

def owner_text(sysfs_root: StrPath) -> str:
    """What the owner file of a lease store made for ``sysfs_root``
    holds (the caller passes the resolved root: ``Sysfs.root``)."""
    return 'sysfs_root=%s\n' % os.path.abspath(os.fspath(sysfs_root))


def check_owner(state_dir: str, owner: str) -> None:
    """Record ``owner`` (``owner_text``) in a new state directory, or
    refuse one recorded for another host (called under the lease lock)."""
    path = os.path.join(state_dir, OWNER_NAME)
    try:
        raw = read_file(path, _MAX_OWNER_BYTES)
    except FileNotFoundError:
        raw = None
    except exception.StateError:
        raise
    except OSError as e:
        raise exception.StateError(path=path, reason=e.strerror)
    if raw is None or raw == b'':
        fd = open_file(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            os.write(fd, owner.encode('utf-8'))
        finally:
            os.close(fd)
        return
    if len(raw) > _MAX_OWNER_BYTES:
        raise exception.StateError(
            path=path, reason='it holds more than %d bytes, not the one '
                              'line libvirt-gpu writes; move it aside '
                              '(`mv %s %s.broken`) if this directory is '
                              'this host\'s' % (_MAX_OWNER_BYTES, path, path))
    recorded = raw.decode('utf-8', 'replace')
    if recorded != owner:
        shown = recorded.strip()
        if len(shown) > 200:
            shown = shown[:200] + '...'
        raise exception.StateError(
            path=state_dir,
            reason='its leases belong to the host with %s, not %s: give each '
                   'host (configuration) its own [DEFAULT]/state_dir'
                   % (textutil.escape(shown, newline=True), owner.strip()))
