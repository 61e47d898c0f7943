"""A listening AF_UNIX socket at any path, however deep.

An AF_UNIX address is limited to 108 bytes, and a test's temporary
directory can be deeper than that (a clone under /tmp puts them under
``~/.cache/libvirt-gpu-tests/<checkout>``, see tests/private_tmp.py). The
socket is bound through ``/proc/self/fd/<dir>/<name>``, which names the same
directory in a few bytes, so the path the test then hands to the product is
the long one, as a user's would be.
"""

import contextlib
import os
import socket


@contextlib.contextmanager
def unix_socket(path):
    """Bind a socket at ``path`` and yield it; closed on leaving (the
    socket file stays, as a socket a crashed program left would)."""
    directory, name = os.path.split(os.fspath(path))
    fd = os.open(directory or '.', os.O_RDONLY | os.O_DIRECTORY)
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind('/proc/self/fd/%d/%s' % (fd, name))
            yield sock
    finally:
        os.close(fd)


def make_socket_file(path):
    """A socket file at ``path``, nobody listening."""
    with unix_socket(path):
        pass
    return path
