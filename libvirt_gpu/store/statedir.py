"""The state directory (``[DEFAULT]/state_dir``): only root steers it.

The hook runs as root on every guest start and stop and writes its log,
its settings snapshot and the leases there, so nothing in that directory
may be another user's choice:

- the directory must be a directory (not a link), owned by root (or by
  the user running the command, for a private state directory of a
  non-root user) and not writable by group or others; else every state
  file is refused with one line saying how to fix it;
- every state file is opened without following a link and without
  waiting on a FIFO (``O_NOFOLLOW | O_NONBLOCK``), then ``fstat``: only a
  regular file is used;
- the lease store records which host it belongs to (``owner``: the sysfs
  root it was made for) and refuses another.
"""

import errno
import os
import stat

from libvirt_gpu import exception
from libvirt_gpu.util import filetype

OWNER_NAME = 'owner'
_MAX_OWNER_BYTES = 4096


def check_dir(path):
    """Refuse a state directory someone other than root (or this user)
    could steer; StateError with the command that fixes it."""
    try:
        st = os.lstat(path)
    except OSError as e:
        raise exception.StateError(path=path, reason=e.strerror)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise exception.StateError(
            path=path, reason='%s, not a directory; set [DEFAULT]/state_dir '
                              'to a directory' % filetype.kind(st.st_mode))
    if st.st_uid not in (0, os.geteuid()):
        raise exception.StateError(
            path=path, reason='owned by uid %d, not root: run `chown root '
                              '%s` or choose another [DEFAULT]/state_dir'
                              % (st.st_uid, path))
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise exception.StateError(
            path=path, reason='writable by group or others (mode %04o): '
                              'run `chmod go-w %s`'
                              % (stat.S_IMODE(st.st_mode), path))


def ensure_dir(path):
    """Create the state directory (mode 0700) when missing, then check it
    (``check_dir``)."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except FileExistsError:
        pass             # a file or dangling link: check_dir names it
    except OSError as e:
        raise exception.StateError(path=path, reason=e.strerror)
    check_dir(path)


def open_file(path, flags=os.O_RDONLY, mode=0o600):
    """``os.open`` of a state file that never follows a link nor blocks
    on a FIFO, and refuses anything but a regular file; returns the fd.
    OSError (as ``os.open``) when it is missing and not created."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK
                     | os.O_CLOEXEC, mode)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise exception.StateError(
                path=path, reason='it is a symbolic link, not a regular '
                                  'file; remove it')
        if e.errno == errno.ENXIO:
            raise exception.StateError(
                path=path, reason='%s; remove it' % filetype.open_error(
                    e, path))
        raise
    try:
        reason = filetype.not_regular(os.fstat(fd).st_mode)
    except OSError as e:
        reason = e.strerror
    if reason is not None:
        os.close(fd)
        raise exception.StateError(path=path, reason='%s; remove it'
                                   % reason)
    return fd


def read_file(path, max_bytes):
    """The bytes of a state file (at most ``max_bytes`` + 1, so a caller
    can tell an oversize one), through ``open_file``."""
    fd = open_file(path)
    try:
        chunks, left = [], max_bytes + 1
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b''.join(chunks)
    finally:
        os.close(fd)


def owner_text(sysfs_root):
    """What the owner file of a lease store made for ``sysfs_root``
    holds (the caller passes the resolved root: ``Sysfs.root``)."""
    return 'sysfs_root=%s\n' % os.path.abspath(os.fspath(sysfs_root))


def check_owner(state_dir, owner):
    """Record ``owner`` (``owner_text``) in a new state directory, or
    refuse one recorded for another host (called under the lease lock)."""
    path = os.path.join(state_dir, OWNER_NAME)
    try:
        recorded = read_file(path, _MAX_OWNER_BYTES).decode(
            'utf-8', 'replace')
    except FileNotFoundError:
        recorded = None
    except OSError as e:
        raise exception.StateError(path=path, reason=e.strerror)
    if recorded is None or recorded == '':
        fd = open_file(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            os.write(fd, owner.encode('utf-8'))
        finally:
            os.close(fd)
        return
    if recorded != owner:
        raise exception.StateError(
            path=state_dir,
            reason='its leases belong to the host with %s, not %s: give each '
                   'host (configuration) its own [DEFAULT]/state_dir'
                   % (recorded.strip(), owner.strip()))
