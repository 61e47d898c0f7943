"""util/filetype: why an open failed, in words, never "None"."""

import errno
import os

from libvirt_gpu.util import filetype


def test_an_open_error_says_the_kernels_reason(tmp_path):
    path = str(tmp_path / 'missing')
    try:
        os.open(path, os.O_RDONLY)
    except OSError as e:
        error = e
    assert filetype.open_error(error, path) == os.strerror(errno.ENOENT)


def test_an_error_without_an_errno_says_its_message(tmp_path):
    # an OSError raised by our own code (no errno, strerror None) reads as
    # its message, not "None" (the type check found the None)
    error = OSError('it keeps changing')
    assert filetype.open_error(error, str(tmp_path)) == 'it keeps changing'


def test_a_socket_is_named(tmp_path):
    import socket
    path = str(tmp_path / 's')
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(path)
        try:
            os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as e:
            error = e
        assert filetype.open_error(error, path) == (
            'it is a socket, not a regular file')
