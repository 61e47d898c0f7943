"""What a path is, in words, for errors that refuse a file that is no
regular file (a FIFO where a sysfs attribute or the config file should be).
"""

import errno
import os
import stat

_KINDS = ((stat.S_ISDIR, 'a directory'), (stat.S_ISFIFO, 'a FIFO'),
          (stat.S_ISSOCK, 'a socket'), (stat.S_ISCHR, 'a character device'),
          (stat.S_ISBLK, 'a block device'), (stat.S_ISLNK, 'a symbolic link'))


def kind(mode):
    """``'a FIFO'``, ``'a socket'``... for a ``st_mode`` that is no regular
    file."""
    for test, name in _KINDS:
        if test(mode):
            return name
    return 'a special file'


def not_regular(mode):
    """The reason to refuse a file of ``st_mode``, or None when it is a
    regular file."""
    if stat.S_ISREG(mode):
        return None
    return 'it is %s, not a regular file' % kind(mode)


def open_error(error, path):
    """The reason an ``os.open`` of ``path`` failed, in words: opening a
    socket (or a FIFO for writing) without blocking fails with ENXIO,
    which says what the file is better as a kind."""
    if error.errno == errno.ENXIO:
        try:
            return not_regular(os.stat(path).st_mode) or error.strerror
        except OSError:
            pass
    return error.strerror
