"""What a path is, in words, for errors that refuse a file that is no
regular file (a FIFO where a sysfs attribute or the config file should be).
"""

from __future__ import annotations

import errno
import os
import stat

_KINDS = ((stat.S_ISDIR, 'a directory'), (stat.S_ISFIFO, 'a FIFO'),
          (stat.S_ISSOCK, 'a socket'), (stat.S_ISCHR, 'a character device'),
          (stat.S_ISBLK, 'a block device'), (stat.S_ISLNK, 'a symbolic link'))


def kind(mode: int) -> str:
    """``'a FIFO'``, ``'a socket'``... for a ``st_mode`` that is no regular
    file."""
    for test, name in _KINDS:
        if test(mode):
            return name
    return 'a special file'


def not_regular(mode: int) -> str | None:
    """The reason to refuse a file of ``st_mode``, or None when it is a
    regular file."""
    if stat.S_ISREG(mode):
        return None
    return 'it is %s, not a regular file' % kind(mode)


def kind_behind(error: OSError, path: str) -> str | None:
    """The kind of ``path`` when an ``os.open`` failed because it is no
    regular file (opening a socket, or a FIFO for writing, without blocking
    fails with ENXIO), else None."""
    if error.errno != errno.ENXIO:
        return None
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    return None if stat.S_ISREG(mode) else kind(mode)


def open_error(error: OSError, path: str) -> str:
    """Why an ``os.open`` of ``path`` failed, in words."""
    found = kind_behind(error, path)
    if found:
        return 'it is %s, not a regular file' % found
    return error.strerror or str(error)
