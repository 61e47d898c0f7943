"""The configuration's snapshot: its values without importing
oslo.config, for the CLI and the qemu hook alike.

Importing oslo.config costs a read-only command more than the command
itself (``libvirt-gpu list`` on a large host).  So once oslo.config has
read and validated a configuration file (``libvirt_gpu.conf.load``: every
option read once), the values of every option are written to a snapshot;
a later command that only reads values (``list``, ``types``, ``discover``,
``placement show``) takes them from it when the snapshot still describes
the same inputs:

- the file: its path, ``(dev, inode, size, mtime_ns, ctime_ns)`` and the
  SHA-256 of its bytes (so a change within one timestamp tick is seen
  too); a missing file (or ``/dev/null``) is its own key;
- the options registered: size and mtime of the modules that declare them
  (``libvirt_gpu/conf/*.py``), so an upgrade that adds one is seen;
- the host name (the default of ``[DEFAULT]/host``; ``uname``'s node
  name, which is what ``socket.gethostname`` returns on Linux).

oslo.config reads no environment variables here (``use_env=False``), so
none are part of the key.  A file that fails validation never gets a
snapshot; a snapshot that does not match is ignored and rewritten by the
next command that reads the file through oslo.config (which pays the
import once).

This is the one staleness rule (``key``) and the one form on disk
(``document``/``parse``: the key, the values, and what a reader derived
from them and keeps beside them, ``extra``).  The CLI's snapshot lives in
``$LIBVIRT_GPU_CACHE_DIR`` when set (empty: no snapshot), else
``/var/cache/libvirt-gpu`` for root and ``$XDG_CACHE_HOME/libvirt-gpu``
(``~/.cache/libvirt-gpu``) for other users.  It is used only when it is a
regular file owned by this user and writable by no one else; a directory
that cannot be written means no snapshot, never an error.  The qemu
hook's is the same document in the state directory (``hook.settings``),
with the enabled types resolved against the host as its ``extra``.
"""

from __future__ import annotations

import os
import stat

from libvirt_gpu import conffile
from libvirt_gpu.util import cachefiles
from libvirt_gpu.util import jsonutil
from libvirt_gpu.util import records

TYPE_CHECKING = False
if TYPE_CHECKING:
    from oslo_config import cfg

try:
    # CPython's own SHA-256 (3.12 names it _sha2, 3.11 and older _sha256):
    # hashlib loads OpenSSL first, about 3 ms that every guest start (the
    # hook) and every ``list`` would pay for the same digest.
    from _sha2 import sha256 as _sha256
except ImportError:
    try:
        from _sha256 import sha256 as _sha256
    except ImportError:
        from hashlib import sha256 as _sha256

SNAPSHOT_VERSION = 2
_MAX_SNAPSHOT_BYTES = cachefiles.MAX_BYTES
_CONF_PACKAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                             'conf')


class Values(object):
    """Option values read like a ConfigOpts: ``values.sysfs_root``,
    ``values.gpu.nvml``, ``values['vgpu_nvidia-223'].max_instances``."""

    def __init__(self, options, groups=None):
        self._options = options
        self._groups = {name: Values(opts)
                        for name, opts in (groups or {}).items()}

    def plain(self):
        """``(options, groups)`` as JSON keeps them (``document``)."""
        return (dict(self._options),
                {name: dict(group._options)
                 for name, group in self._groups.items()})

    def __getitem__(self, name):
        if name in self._groups:
            return self._groups[name]
        return self._options[name]

    def __getattr__(self, name):
        if name.startswith('_'):
            raise AttributeError(name)
        try:
            return self[name]
        except KeyError:
            raise AttributeError('no option or group %r' % name)


def snapshot_path(directory, path):
    """One snapshot per configuration path (the path is in the key too)."""
    return os.path.join(directory, 'conf-%08x.json'
                        % int(_sha256(os.fsencode(path)).hexdigest()[:8], 16))


def file_key(path):
    """``[dev, inode, size, mtime_ns, ctime_ns, sha256]`` of the
    configuration file ``path``; None when there is none to read (missing,
    ``/dev/null``, not a regular file, larger than a configuration file
    can be, unreadable).  The digest notices an edit that keeps the size
    and lands within one tick of the file system's clock."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or \
                st.st_size > conffile.MAX_CONFIG_BYTES:
            return None
        digest = _sha256()
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            digest.update(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns,
            st.st_ctime_ns, digest.hexdigest()]


def _options_key():
    """The modules that declare the options: an upgrade changes them."""
    key = {}
    for name in sorted(os.listdir(_CONF_PACKAGE)):
        if name.endswith('.py'):
            st = os.stat(os.path.join(_CONF_PACKAGE, name))
            key[name] = [st.st_size, st.st_mtime_ns]
    return key


def key(path: str) -> dict[str, object]:
    """What a snapshot of the configuration file ``path`` must match: the
    file (``file_key``), the modules that declare the options, the host
    name (the default of ``[DEFAULT]/host``)."""
    return {'version': SNAPSHOT_VERSION, 'config_file': path,
            'file': file_key(path), 'options': _options_key(),
            'hostname': os.uname().nodename}


def _plain(value):
    """Whether ``value`` survives JSON unchanged (str, int, bool, None,
    float, lists and dicts of them)."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return True
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v)
                   for k, v in value.items())
    return False


def values_of(conf):
    """``(options, groups)`` of a loaded ConfigOpts, or None when a value
    would not survive JSON (then no snapshot is written)."""
    from oslo_config import cfg
    options, groups = {}, {}
    for name in conf:
        item = conf[name]
        if isinstance(item, cfg.ConfigOpts.GroupAttr):
            groups[name] = {opt: item[opt] for opt in item}
        else:
            options[name] = item
    if not _plain(options) or not _plain(groups):
        return None
    return options, groups


@records.record
class Snapshot:
    """A current snapshot (``parse``): the configuration's ``values``,
    the ``key`` they were kept under, and the reader's ``extra``."""

    values: Values
    key: dict[str, object]
    extra: object = None


def document(snapshot_key: dict[str, object],
             conf: cfg.ConfigOpts | Values,
             extra: object = None) -> dict[str, object] | None:
    """The snapshot of ``conf`` (a loaded ConfigOpts, or the ``Values``
    of a snapshot) under ``snapshot_key`` (taken before the file was
    read), with ``extra`` (a reader's own JSON, kept beside the values);
    None when a value would not survive JSON."""
    values = conf.plain() if isinstance(conf, Values) else values_of(conf)
    if values is None:
        return None
    found = {'key': snapshot_key, 'options': values[0], 'groups': values[1]}
    if extra is not None:
        found['extra'] = extra
    return found


def parse(data: str | bytes, path: str) -> Snapshot | None:
    """The ``Snapshot`` in a document (JSON text) of the configuration
    file ``path`` when it is current (``key``), else None."""
    try:
        data = jsonutil.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None             # (RecursionError: nested too deep)
    expected = key(path)
    if not isinstance(data, dict) or data.get('key') != expected:
        return None
    options, groups = data.get('options'), data.get('groups')
    if not isinstance(options, dict) or not isinstance(groups, dict) or \
            not all(isinstance(g, dict) for g in groups.values()):
        return None
    return Snapshot(values=Values(options, groups), key=expected,
                    extra=data.get('extra'))


def read(path, environ=None):
    """The snapshot's Values for ``path``, or None when there is none that
    matches."""
    directory = cachefiles.cache_dir(environ)
    if directory is None:
        return None
    raw = cachefiles.read_private(snapshot_path(directory, path))
    if raw is None:
        return None
    found = parse(raw, path)
    return found.values if found is not None else None


def write(path, snapshot_key, conf, environ=None):
    """Write the snapshot of ``conf`` (read from ``path``) under
    ``snapshot_key``, taken before the file was read.  Quietly nothing
    when the cache directory cannot be written."""
    directory = cachefiles.cache_dir(environ)
    found = document(snapshot_key, conf)
    if directory is None or found is None:
        return False
    return cachefiles.write_private(directory, os.path.basename(
        snapshot_path(directory, path)), jsonutil.dumps(found,
                                                        sort_keys=True))


def load(config_file=None, environ=None):
    """The configuration's values: from the snapshot when it matches,
    else through ``libvirt_gpu.conf.load`` (a ConfigOpts, which is then
    snapshotted).  The file checks of ``conffile`` apply either way."""
    path, required = conffile.config_path(config_file, environ)
    conffile.check_config_file(path, required)
    values = read(path)
    if values is not None:
        conffile.check_state_dir(values.state_dir, path)
        return values
    snapshot_key = key(path)
    from libvirt_gpu import conf as conf_mod
    conf = conf_mod.load(config_file, environ)
    write(path, snapshot_key, conf)
    return conf
