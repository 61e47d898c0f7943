"""The hook's settings: a JSON snapshot of what it needs from the
configuration, rebuilt through oslo.config only when it is stale (see the
package doc: oslo.config costs more to import than a whole ``prepare``)."""

from __future__ import annotations

import json
import os
import stat

from libvirt_gpu.backends import registry
from libvirt_gpu import conffile
from libvirt_gpu import exception
from libvirt_gpu import fileutil
from libvirt_gpu import objects
from libvirt_gpu import records
from libvirt_gpu import statedir
from libvirt_gpu import sysfs as sysfs_mod

# The one default path (conffile's), which hooks/qemu has baked in.
DEFAULT_CONFIG_FILE = conffile.DEFAULT_CONFIG_FILE
SETTINGS_NAME = 'hook-settings.json'
SETTINGS_VERSION = 3
_MAX_SETTINGS_BYTES = 1024 * 1024
_MAX_CONFIG_BYTES = 1024 * 1024       # conffile's limit


@records.record
class HookSettings:
    """What the hook needs from the configuration."""

    sysfs_root: str
    state_dir: str
    enabled: dict[objects.PciAddress, objects.EnabledType]

    def enabled_types(self):
        return sorted({e.type_id for e in self.enabled.values()})


def _sha256():
    """A SHA-256 object from CPython's built-in module: ``hashlib`` loads
    OpenSSL's binding, about 3 ms of every hook call for the same digest.
    """
    try:
        from _sha2 import sha256           # Python 3.12+
    except ImportError:
        try:
            from _sha256 import sha256     # Python 3.11
        except ImportError:
            from hashlib import sha256
    return sha256()


def _config_key(config_file):
    """``[mtime_ns, size, inode, sha256]`` of the config file
    (None: missing or unreadable: the snapshot is then never current).
    The digest notices an edit that keeps the size and lands within one
    tick of the file system's clock (the times alone would not change)."""
    try:
        fd = os.open(config_file, os.O_RDONLY | os.O_NONBLOCK
                     | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > _MAX_CONFIG_BYTES:
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
    return [st.st_mtime_ns, st.st_size, st.st_ino, digest.hexdigest()]


def _sysfs_key(sysfs_root):
    """What, when it changes, makes the snapshot stale: the parents of
    every registered vGPU kind now, ``{kind.parents_key: [...]}`` (today
    ``{'mdev_parents': [...], 'vendor_vfs': [...]}``)."""
    sysfs = sysfs_mod.Sysfs(sysfs_root)
    return {kind.parents_key or kind.name: kind.parents_now(sysfs)
            for kind in registry.kind_classes()}


def settings_from_conf(config_file):
    """Build HookSettings through oslo.config and discovery (slow path)."""
    return read_settings(config_file)[0]


def read_settings(config_file):
    """``(HookSettings, keys)``: ``keys`` are the snapshot's ``(config
    key, sysfs key)`` taken before what they guard was read."""
    config_key = _config_key(config_file)
    from libvirt_gpu import conf as conf_mod
    from libvirt_gpu import environment
    if config_file == DEFAULT_CONFIG_FILE and not os.path.exists(
            config_file):
        conf = conf_mod.load(None, environ={})
    else:
        conf = conf_mod.load(config_file)
    sysfs_key = _sysfs_key(conf.sysfs_root)
    # Every GPU, read from sysfs (no libvirt: the hook never imports it):
    # a GPU whose vGPUs live on SR-IOV VFs is configured by its PF, which
    # is no mdev parent.
    env = environment.Environment.from_conf(conf)
    return HookSettings(sysfs_root=env.sysfs_root, state_dir=env.state_dir,
                        enabled=env.enabled), (config_key, sysfs_key)


def _settings_to_json(settings, config_file, config_key, sysfs_key):
    return {
        'version': SETTINGS_VERSION,
        'config_file': config_file,
        'config_key': config_key,
        'sysfs_key': sysfs_key,
        'sysfs_root': settings.sysfs_root,
        'state_dir': settings.state_dir,
        'enabled': {str(a): {'type_id': e.type_id,
                             'resource_class': e.resource_class,
                             'max_instances': e.max_instances}
                    for a, e in sorted(settings.enabled.items())},
    }


def _settings_from_json(data, config_file):
    """HookSettings of a snapshot, or None when it is stale or unusable."""
    if not isinstance(data, dict) or data.get('version') != \
            SETTINGS_VERSION or data.get('config_file') != config_file:
        return None
    if data.get('config_key') != _config_key(config_file):
        return None
    root = data.get('sysfs_root')
    if not isinstance(root, str) or not os.path.isabs(root):
        return None
    if data.get('sysfs_key') != _sysfs_key(root):
        return None
    state_dir = data.get('state_dir')
    if not isinstance(state_dir, str) or not os.path.isabs(state_dir):
        return None
    enabled = {}
    try:
        for address, entry in (data.get('enabled') or {}).items():
            max_instances = entry.get('max_instances')
            if max_instances is not None and (
                    not isinstance(max_instances, int) or max_instances < 1):
                return None
            enabled[objects.PciAddress.parse(address)] = objects.EnabledType(
                type_id=objects.validate_type_id(entry['type_id']),
                resource_class=str(entry.get('resource_class', 'VGPU')),
                max_instances=max_instances)
    except (exception.InvalidInput, KeyError, TypeError, AttributeError):
        return None
    return HookSettings(sysfs_root=root, state_dir=state_dir,
                        enabled=enabled)


def write_settings(settings, config_file, settings_file, keys=None):
    """Write the snapshot atomically (mode 0600).

    ``keys``: ``(config key, sysfs key)`` taken before ``settings`` were
    read (``load_settings``); None: taken now.
    """
    if keys is None:
        keys = (_config_key(config_file), _sysfs_key(settings.sysfs_root))
    directory = os.path.dirname(settings_file)
    statedir.ensure_dir(directory)
    fileutil.write_atomic(settings_file, json.dumps(
        _settings_to_json(settings, config_file, *keys), indent=1,
        sort_keys=True), mode=0o600)


def load_settings(config_file, settings_file=None):
    """HookSettings from the snapshot when it is current, else from the
    configuration (and the snapshot rewritten).  Returns ``(settings,
    note)``; ``note`` says why the snapshot was not used, or None."""
    if settings_file:
        # The snapshot steers the root hook: its directory must be root's
        # (statedir.check_dir) and the file a regular one, not a link.
        directory = os.path.dirname(settings_file)
        if os.path.lexists(directory):
            statedir.check_dir(directory)
        try:
            raw = statedir.read_file(settings_file, _MAX_SETTINGS_BYTES)
            data = json.loads(raw) if len(raw) <= _MAX_SETTINGS_BYTES \
                else None
        except FileNotFoundError:
            data = None
        except (OSError, ValueError, UnicodeDecodeError):
            data = None
        settings = _settings_from_json(data, config_file)
        if settings is not None:
            return settings, None
    settings, keys = read_settings(config_file)
    note = 'settings read from %s' % config_file
    if settings_file:
        try:
            write_settings(settings, config_file, settings_file, keys)
            note += ' (snapshot %s refreshed)' % settings_file
        except OSError as e:
            note += ' (cannot write snapshot %s: %s)' % (settings_file,
                                                         e.strerror)
    return settings, note
