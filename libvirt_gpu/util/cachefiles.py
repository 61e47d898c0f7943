"""The cache directory of this user's processes and its private files.

``cache_dir``: ``$LIBVIRT_GPU_CACHE_DIR`` when set (empty: no cache), root's
``/var/cache/libvirt-gpu``, else ``$XDG_CACHE_HOME/libvirt-gpu``
(``~/.cache``).  What is kept there steers what a later process does (the
configuration's snapshot, ``confcache``; the installed vGPU kinds,
``devices.backends.registry``), so a file is read only when it is a
regular file of this user that no one else may write, and written
atomically, private.
"""

from __future__ import annotations

import os
import stat

from libvirt_gpu.util import fileutil

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

CACHE_ENV = 'LIBVIRT_GPU_CACHE_DIR'
ROOT_CACHE_DIR = '/var/cache/libvirt-gpu'
# The most bytes of a cache file read
MAX_BYTES = 1024 * 1024


def cache_dir(environ: Mapping[str, str] | None = None) -> str | None:
    """Where snapshots live (None: nowhere)."""
    environ = os.environ if environ is None else environ
    if CACHE_ENV in environ:
        return environ[CACHE_ENV] or None
    if os.geteuid() == 0:
        return ROOT_CACHE_DIR
    base = environ.get('XDG_CACHE_HOME') or os.path.join(
        os.path.expanduser('~'), '.cache')
    return os.path.join(base, 'libvirt-gpu')


def read_private(path: str, limit: int = MAX_BYTES) -> bytes | None:
    """The bytes of the cache file ``path`` when it is a regular file (no
    link) of this user that no one else may write, at most ``limit``
    bytes; None otherwise (what it steers, no one else may)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK |
                     os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if (not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or
                st.st_mode & 0o022 or st.st_size > limit):
            return None
        with os.fdopen(os.dup(fd), 'rb') as f:
            return f.read(limit + 1)
    except OSError:
        return None
    finally:
        os.close(fd)


def write_private(directory: str, name: str, data: str) -> bool:
    """Write ``data`` (text) to the cache file ``name`` of ``directory``
    (made 0700) atomically, mode 0600; False when it cannot be written."""
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        fileutil.write_atomic(os.path.join(directory, name), data,
                              mode=0o600)
    except OSError:
        return False
    return True
