"""The hook's settings: a JSON snapshot of what it needs from the
configuration, rebuilt through oslo.config only when it is stale (see the
package doc: oslo.config costs more to import than a whole ``prepare``)."""

from __future__ import annotations

import json
import os

from libvirt_gpu.backends import registry
from libvirt_gpu import conffile
from libvirt_gpu import exception
from libvirt_gpu import fileutil
from libvirt_gpu import objects
from libvirt_gpu import records
from libvirt_gpu import sysfs as sysfs_mod

# The one default path (conffile's), which hooks/qemu has baked in.
DEFAULT_CONFIG_FILE = conffile.DEFAULT_CONFIG_FILE
SETTINGS_NAME = 'hook-settings.json'
SETTINGS_VERSION = 2
_MAX_SETTINGS_BYTES = 1024 * 1024


@records.record
class HookSettings:
    """What the hook needs from the configuration."""

    sysfs_root: str
    state_dir: str
    enabled: dict[objects.PciAddress, objects.EnabledType]

    def enabled_types(self):
        return sorted({e.type_id for e in self.enabled.values()})


def _config_key(config_file):
    """``[mtime_ns, size, inode]`` of the config file (None: missing)."""
    try:
        st = os.stat(config_file)
    except FileNotFoundError:
        return None
    return [st.st_mtime_ns, st.st_size, st.st_ino]


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
    from libvirt_gpu import enablement
    if config_file == DEFAULT_CONFIG_FILE and not os.path.exists(
            config_file):
        conf = conf_mod.load(None, environ={})
    else:
        conf = conf_mod.load(config_file)
    sysfs_key = _sysfs_key(conf.sysfs_root)
    # Every GPU, read from sysfs (no libvirt: the hook never imports it):
    # a GPU whose vGPUs live on SR-IOV VFs is configured by its PF, which
    # is no mdev parent.
    from libvirt_gpu import discovery
    sysfs = sysfs_mod.Sysfs(conf.sysfs_root)
    gpus = discovery.from_sysfs(sysfs).gpus
    return HookSettings(sysfs_root=conf.sysfs_root,
                        state_dir=conf.state_dir,
                        enabled=enablement.resolve(conf, gpus)), (
                            config_key, sysfs_key)


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
    os.makedirs(directory, mode=0o700, exist_ok=True)
    fileutil.write_atomic(settings_file, json.dumps(
        _settings_to_json(settings, config_file, *keys), indent=1,
        sort_keys=True), mode=0o600)


def load_settings(config_file, settings_file=None):
    """HookSettings from the snapshot when it is current, else from the
    configuration (and the snapshot rewritten).  Returns ``(settings,
    note)``; ``note`` says why the snapshot was not used, or None."""
    if settings_file:
        try:
            with open(settings_file, 'rb') as f:
                raw = f.read(_MAX_SETTINGS_BYTES + 1)
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
