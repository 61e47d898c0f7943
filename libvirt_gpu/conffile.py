"""Which configuration file a process reads, and whether it is one.

No oslo.config here: the CLI decides from these rules alone whether its
settings snapshot (``confcache``) still describes the file, and imports
oslo.config (``libvirt_gpu.conf``) only when it does not.
"""

import os
import stat

from libvirt_gpu import exception
from libvirt_gpu.util import filetype

DEFAULT_CONFIG_FILE = '/etc/libvirt-gpu/libvirt-gpu.conf'
CONFIG_ENV = 'LIBVIRT_GPU_CONFIG'

# A configuration file is a few KiB; anything bigger is a mistake (a log,
# /dev/zero) that must not be read into memory.
MAX_CONFIG_BYTES = 1024 * 1024


def config_path(config_file=None, environ=None):
    """Which file to read, and whether it must exist."""
    environ = os.environ if environ is None else environ
    if config_file:
        return config_file, True
    if environ.get(CONFIG_ENV):
        return environ[CONFIG_ENV], True
    return DEFAULT_CONFIG_FILE, False


def check_config_file(path, required):
    """Whether ``path`` is a config file to read: a regular file of at most
    MAX_CONFIG_BYTES (a FIFO would hang the reader, ``/dev/zero`` fill the
    memory).  Missing: False, or a ConfigError when ``required``.  It is
    opened without blocking and judged by ``fstat``, so nothing here waits.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        if required:
            raise exception.ConfigError(
                reason='config file %s does not exist' % path)
        return False
    except OSError as e:
        kind = filetype.kind_behind(e, path)     # a socket
        if kind is None:
            raise exception.ConfigFileUnreadable(path=path,
                                                 reason=e.strerror)
        raise _not_regular(path, kind)
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if stat.S_ISCHR(st.st_mode) and _is_devnull(st):
        return False         # ``--config-file /dev/null``: no settings
    if not stat.S_ISREG(st.st_mode):
        raise _not_regular(path, filetype.kind(st.st_mode))
    if st.st_size > MAX_CONFIG_BYTES:
        raise exception.ConfigFileUnreadable(
            path=path, reason='it is %d bytes, more than the %d a '
                              'configuration file can be; is it the right '
                              'file?' % (st.st_size, MAX_CONFIG_BYTES))
    return True


def _is_devnull(st):
    try:
        null = os.stat(os.devnull)
    except OSError:
        return False
    return stat.S_ISCHR(null.st_mode) and st.st_rdev == null.st_rdev


def _not_regular(path, kind):
    return exception.ConfigFileUnreadable(
        path=path, reason='it is %s, not a regular file' % kind)


# Directories other programs (or users) keep their own files in: a state
# directory there would share its names (``leases.lock``, ``hook.log``,
# ``owner``) with theirs.  Compared after normalizing (``/var/lib/..``).
SHARED_DIRS = frozenset([
    '/', '/bin', '/boot', '/dev', '/etc', '/home', '/lib', '/lib32',
    '/lib64', '/libx32', '/media', '/mnt', '/opt', '/proc', '/root', '/run',
    '/sbin', '/srv', '/sys', '/tmp', '/usr', '/usr/bin', '/usr/include',
    '/usr/lib', '/usr/lib32', '/usr/lib64', '/usr/libexec', '/usr/local',
    '/usr/local/bin', '/usr/local/lib', '/usr/local/share', '/usr/sbin',
    '/usr/share', '/usr/src', '/var', '/var/backups', '/var/cache',
    '/var/lib', '/var/local', '/var/lock', '/var/log', '/var/mail',
    '/var/opt', '/var/run', '/var/spool', '/var/tmp', '/etc/libvirt',
    '/var/lib/libvirt', '/run/libvirt', '/var/run/libvirt',
    '/var/cache/libvirt', '/var/log/libvirt'])
# How many entries of a state directory are looked at for a directory of
# another program (ours holds about ten files and no directory).
_MAX_ENTRIES_LOOKED_AT = 4096


def check_state_dir(state_dir, path):
    """[DEFAULT]/state_dir may be missing (it is made on first use) but
    must be a directory of libvirt-gpu's own: not something other than a
    directory, not relative (the hook runs in another working directory
    than the CLI), not a directory other programs keep their files in
    (``SHARED_DIRS``: ``/``, ``/etc``, ``/usr/lib`` ...), nor one that
    holds another program's directories (libvirt-gpu makes none there).
    ConfigError naming the option and what to do."""
    def refuse(why):
        return exception.ConfigError(
            reason='%s: [DEFAULT]/state_dir = %s %s; name a directory of '
                   'libvirt-gpu\'s own, such as /var/lib/libvirt-gpu (it '
                   'is created when missing)' % (path, state_dir, why))
    if not os.path.isabs(state_dir):
        raise refuse('is a relative path, which names another directory '
                     'in each program that reads it')
    for name in {os.path.normpath(state_dir), os.path.realpath(state_dir)}:
        if name in SHARED_DIRS or name.startswith('/proc/') or \
                name.startswith('/sys/') or name.startswith('/dev/'):
            raise refuse('is %s, a directory other programs use too' % name
                         if name != state_dir else
                         'is a directory other programs use too')
    if os.path.exists(state_dir) and not os.path.isdir(state_dir):
        raise exception.ConfigError(
            reason='%s: [DEFAULT]/state_dir = %s is not a directory; name '
                   'a directory (it is created when missing)'
                   % (path, state_dir))
    other = _foreign_directory(state_dir)
    if other is not None:
        raise refuse('holds the directory %s, which libvirt-gpu never makes '
                     'there: the directory is another program\'s'
                     % ascii(other)[1:-1])


def _foreign_directory(state_dir):
    """The name of a directory that holds something, in ``state_dir``
    (None: none, or it cannot be listed: the state directory's own
    checks then say why)."""
    try:
        listing = os.scandir(state_dir)
    except OSError:
        return None
    with listing:
        for count, entry in enumerate(listing):
            if count >= _MAX_ENTRIES_LOOKED_AT:
                return None
            try:
                if not entry.is_dir(follow_symlinks=False):
                    continue
                with os.scandir(entry.path) as inner:
                    if next(inner, None) is not None:
                        return entry.name
            except OSError:
                continue
    return None
