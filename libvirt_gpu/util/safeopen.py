"""Opening a file beneath a directory without following any link.

A write under the sysfs root (an mdev's ``create`` and ``remove``, a
VF's vGPU type, ``sriov_numvfs``) is judged on the path's real
location, then opened by that location relative to a descriptor of the
root, walked without following a link: should a racer swap a directory for
a link between the check and the open (possible only where someone else
can write the tree, never on the real ``/sys``), the open fails instead of
landing outside the root.

Each component is opened with ``O_NOFOLLOW`` relative to the one before
(a few microseconds each).  Asked for (``use_openat2``) and where the
kernel has it (Linux 5.6+), one ``openat2`` with ``RESOLVE_BENEATH |
RESOLVE_NO_SYMLINKS`` does the same walk; it needs ``ctypes``, about 4 ms
to import, which the qemu hook would pay at every guest start for a
saving of microseconds, so the walk is the default.
"""

import errno
import os

# linux/openat2.h
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08
# The same number in the unified syscall table of every architecture.
_SYS_OPENAT2 = 437
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

_openat2 = None         # None: not tried yet; False: the kernel lacks it


def _load_openat2():
    global _openat2
    if _openat2 is None:
        try:
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            syscall = libc.syscall
            syscall.restype = ctypes.c_long

            class OpenHow(ctypes.Structure):
                _fields_ = [('flags', ctypes.c_uint64),
                            ('mode', ctypes.c_uint64),
                            ('resolve', ctypes.c_uint64)]

            def call(dir_fd, path, flags):
                how = OpenHow(flags, 0, _RESOLVE_BENEATH
                              | _RESOLVE_NO_SYMLINKS
                              | _RESOLVE_NO_MAGICLINKS)
                fd = syscall(_SYS_OPENAT2, dir_fd, os.fsencode(path),
                             ctypes.byref(how), ctypes.sizeof(how))
                if fd < 0:
                    err = ctypes.get_errno()
                    raise OSError(err, os.strerror(err), path)
                return fd

            _openat2 = call
        except (ImportError, OSError, AttributeError):
            _openat2 = False
    return _openat2


def _components(relative):
    parts = [p for p in relative.split('/') if p]
    if not parts or any(p in ('.', '..') for p in parts):
        raise OSError(errno.EINVAL, 'not a plain relative path', relative)
    return parts


def _walk(root_fd, parts, flags):
    """The per-component ``O_NOFOLLOW`` walk."""
    fd = os.dup(root_fd)
    try:
        for part in parts[:-1]:
            next_fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = next_fd
        return os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC,
                       dir_fd=fd)
    finally:
        os.close(fd)


def open_beneath(dir_fd, relative, flags, use_openat2=False):
    """A descriptor of ``relative`` under the open directory ``dir_fd``,
    opened with ``flags``, no component of ``relative`` a link and none
    ``..``.  OSError as ``os.open`` (ELOOP or EXDEV: a link on the
    way)."""
    parts = _components(relative)
    call = _load_openat2() if use_openat2 else False
    if call:
        try:
            return call(dir_fd, '/'.join(parts),
                        flags | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as e:
            if e.errno != errno.ENOSYS:
                raise
            global _openat2
            _openat2 = False
    return _walk(dir_fd, parts, flags)
