"""Files written whole or not at all.

``write_atomic`` writes a temporary file in the target's directory (or in
``tmp_dir``), flushes it to disk, sets its mode (and root ownership when
asked), then renames it over the target: a reader or a crash sees the old
file or the new one, never half of one.  On any failure the temporary file
is removed and the target is left as it was.

The temporary file has a random name and is created with ``O_EXCL |
O_NOFOLLOW`` relative to a descriptor of its directory: a link or file
planted under a name we might pick is never opened, written nor
``chmod``-ed (the mode and owner are set on the descriptor), and a
directory renamed or swapped meanwhile cannot redirect the rename.
"""

from __future__ import annotations

import os

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def _create_temporary(dir_fd: int, name: str) -> tuple[int, str]:
    """``(fd, temporary name)``: a new file in ``dir_fd``, never one that
    was there."""
    for _ in range(100):
        tmp = '.%s.%s.tmp' % (name, os.urandom(8).hex())
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL
                           | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                           dir_fd=dir_fd), tmp
        except FileExistsError:
            continue
    raise FileExistsError('no free temporary name for %s' % name)


def write_atomic(path: str | os.PathLike[str], text: str, mode: int = 0o600,
                 tmp_dir: str | os.PathLike[str] | None = None,
                 root_owned: bool = False) -> None:
    """Replace ``path`` with ``text`` (str, written as UTF-8) atomically.

    :param mode: the new file's permission bits.
    :param tmp_dir: where the temporary file is made (same file system as
        ``path``); default: ``path``'s directory.  A directory that a
        program scans (libvirt's ``qemu.d``) must not see it.
    :param root_owned: chown the file to root:root when running as root.
    """
    directory, name = os.path.split(os.fspath(path))
    dir_fd = os.open(directory or '.', _DIR_FLAGS)
    try:
        tmp_fd = dir_fd if tmp_dir is None else os.open(tmp_dir, _DIR_FLAGS)
        try:
            _write_replace(dir_fd, name, tmp_fd, text, mode, root_owned)
        finally:
            if tmp_fd != dir_fd:
                os.close(tmp_fd)
    finally:
        os.close(dir_fd)


def _write_replace(dir_fd: int, name: str, tmp_fd: int, text: str,
                   mode: int, root_owned: bool) -> None:
    fd, tmp = _create_temporary(tmp_fd, name)
    try:
        try:
            data = memoryview(text.encode('utf-8'))
            while data:
                data = data[os.write(fd, data):]
            os.fsync(fd)
            if root_owned and os.geteuid() == 0:
                os.fchown(fd, 0, 0)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=tmp_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=tmp_fd)
        except OSError:
            pass
        raise
