"""The hook's settings: the configuration's snapshot (``confcache``: one
form, one staleness rule, the CLI's too) kept in the state directory, with
the enabled types resolved against this host's GPUs beside its values.

Read on every guest start, so cheaply: the snapshot's key (the
configuration file, the option modules, the host name), the installed vGPU
kinds (``registry.record``: kept under the import path's modification
times) and the parents of every kind that watches them
(``capabilities.WatchedParents``) are compared, and nothing else is
imported.  The configuration changed: it is read again
through oslo.config (which costs more to import than a whole ``prepare``).
Only the parents changed (VFs enabled by ``sriov-manage``): the enabled
types are resolved again from the snapshot's values, without oslo.config.
"""

from __future__ import annotations

import os

from libvirt_gpu.devices import capabilities
from libvirt_gpu.devices.backends import registry
from libvirt_gpu.devices import routes as routes_mod
from libvirt_gpu import confcache
from libvirt_gpu import conffile
from libvirt_gpu import exception
from libvirt_gpu.util import fileutil
from libvirt_gpu.util import jsonutil
from libvirt_gpu import objects
from libvirt_gpu.util import records
from libvirt_gpu.store import statedir
from libvirt_gpu.devices import sysfs as sysfs_mod

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from oslo_config import cfg

# The one default path (conffile's), which hooks/qemu has baked in.
DEFAULT_CONFIG_FILE = conffile.DEFAULT_CONFIG_FILE
SETTINGS_NAME = 'hook-settings.json'
_MAX_SETTINGS_BYTES = 1024 * 1024


@records.record
class HookSettings:
    """What the hook needs: where the host is, the enabled types
    resolved against it, which GPUs other routes own (left alone), and
    ``[gpu]/nvml`` (NVIDIA's migration check)."""

    sysfs_root: str
    state_dir: str
    enabled: dict[objects.PciAddress, objects.EnabledType]
    routes: routes_mod.Routes = records.field(
        default_factory=routes_mod.Routes)
    nvml: str = 'auto'

    def enabled_types(self) -> list[objects.TypeId]:
        return sorted({t for e in self.enabled.values() for t in e.type_ids})


def _sysfs_key(sysfs_root: str) -> dict[str, object]:
    """What, when it changes, makes the resolved enabled types stale: the
    parents of every registered vGPU kind now, ``{kind.parents_key:
    [...]}`` (today ``{'mdev_parents': [...], 'vendor_vfs': [...]}``)."""
    sysfs = sysfs_mod.Sysfs(sysfs_root)
    return {kind.parents_key or kind.name: kind.parents_now(sysfs)
            for kind in registry.kind_classes()
            if issubclass(kind, capabilities.WatchedParents)}


def _load_conf(config_file: str) -> cfg.ConfigOpts:
    """The configuration through oslo.config (the slow path): the default
    file may be missing (defaults), a named one may not."""
    from libvirt_gpu import conf as conf_mod
    if config_file == DEFAULT_CONFIG_FILE and not os.path.exists(
            config_file):
        return conf_mod.load(None, environ={})
    return conf_mod.load(config_file)


def _resolved(conf: cfg.ConfigOpts | confcache.Values,
              sysfs_key: dict[str, object]
              ) -> tuple[HookSettings, dict[str, object]]:
    """HookSettings of ``conf`` (a ConfigOpts or the snapshot's Values),
    its enabled types resolved against the host now, and the snapshot's
    ``extra`` for them under ``sysfs_key`` (taken before the host was
    read).  Every GPU is read from sysfs (no libvirt: the hook never
    imports it)."""
    from libvirt_gpu import environment
    env = environment.Environment.from_conf(conf)
    settings = HookSettings(sysfs_root=env.sysfs_root,
                            state_dir=env.state_dir, enabled=env.enabled,
                            routes=env.routes, nvml=conf.gpu.nvml)
    extra = {'sysfs_key': sysfs_key, 'routes': env.routes.to_json(),
             'kinds': registry.record(registry.installed()),
             'enabled': {str(a): dict(_entry(e), others=[
                 _entry(o) for o in e.others])
                 for a, e in sorted(settings.enabled.items())}}
    return settings, extra


def _entry(setting: objects.EnabledType) -> dict[str, object]:
    return {'type_id': setting.type_id,
            'resource_class': setting.resource_class,
            'max_instances': setting.max_instances}


def _setting_of(entry: Any,
                others: tuple[objects.EnabledType, ...] = ()
                ) -> objects.EnabledType:
    """An ``EnabledType`` from a snapshot's entry; ValueError when its
    ``max_instances`` is no positive integer."""
    max_instances = entry.get('max_instances')
    if max_instances is not None and (
            not isinstance(max_instances, int) or max_instances < 1):
        raise ValueError(max_instances)
    return objects.EnabledType(
        type_id=objects.TypeId.parse(entry['type_id']),
        resource_class=str(entry.get('resource_class', 'VGPU')),
        max_instances=max_instances, others=others)


def read_settings(config_file: str
                  ) -> tuple[HookSettings, dict[str, object] | None]:
    """``(HookSettings, document)`` read through oslo.config (the slow
    path): ``document`` is the snapshot to keep (``write_settings``), its
    keys taken before what they guard was read; None when the values
    cannot be kept as JSON."""
    config_key = confcache.key(config_file)
    conf = _load_conf(config_file)
    settings, extra = _resolved(conf, _sysfs_key(conf.sysfs_root))
    return settings, confcache.document(config_key, conf, extra)


def _enabled_of(extra: dict[str, Any]
                ) -> dict[objects.PciAddress, objects.EnabledType] | None:
    """The enabled types kept in a snapshot, or None when unusable."""
    enabled: dict[objects.PciAddress, objects.EnabledType] = {}
    try:
        for address, entry in (extra.get('enabled') or {}).items():
            others = tuple(_setting_of(o) for o in entry.get('others', ()))
            enabled[objects.PciAddress.parse(address)] = _setting_of(
                entry, others)
    except (exception.InvalidInput, KeyError, TypeError, AttributeError,
            ValueError):
        return None
    return enabled


def _routes_of(extra: dict[str, Any]) -> routes_mod.Routes | None:
    """The routes kept in a snapshot, or None when unusable (a snapshot
    without them is of an older release: read again)."""
    if 'routes' not in extra:
        return None
    try:
        routes: routes_mod.Routes = routes_mod.Routes.from_json(
            extra['routes'])
    except ValueError:
        return None
    return routes


def _paths_ok(values: confcache.Values) -> bool:
    root, state_dir = values.sysfs_root, values.state_dir
    return (isinstance(root, str) and os.path.isabs(root)
            and isinstance(state_dir, str) and os.path.isabs(state_dir))


def write_settings(document: dict[str, object], settings_file: str) -> None:
    """Write the snapshot ``document`` (``read_settings``) atomically
    (mode 0600) in its directory, which only root may steer."""
    statedir.ensure_dir(os.path.dirname(settings_file))
    fileutil.write_atomic(settings_file, jsonutil.dumps(
        document, indent=1, sort_keys=True), mode=0o600)


def _read_snapshot(config_file: str, settings_file: str
                   ) -> confcache.Snapshot | None:
    """The current ``confcache.Snapshot`` there, or None."""
    # The snapshot steers the root hook: its directory must be root's
    # (statedir.check_dir) and the file a regular one, not a link.
    directory = os.path.dirname(settings_file)
    if os.path.lexists(directory):
        statedir.check_dir(directory)
    try:
        raw = statedir.read_file(settings_file, _MAX_SETTINGS_BYTES)
    except OSError:
        return None
    if len(raw) > _MAX_SETTINGS_BYTES:
        return None
    found = confcache.parse(raw, config_file)
    if found is None or not _paths_ok(found.values):
        return None
    return found


def load_settings(config_file: str, settings_file: str | None = None
                  ) -> tuple[HookSettings, str | None]:
    """HookSettings from the snapshot when it is current, else from the
    configuration (and the snapshot rewritten).  Returns ``(settings,
    note)``; ``note`` says why the snapshot was not used, or None."""
    found = _read_snapshot(config_file, settings_file) if settings_file \
        else None
    if found is not None:
        values = found.values
        extra: dict[str, Any] = (found.extra if isinstance(found.extra, dict)
                                 else {})
        # the installed vGPU kinds, as the snapshot keeps them (reading
        # their entry points costs more than a guest start)
        kinds = bool(extra) and registry.remember(extra.get('kinds'))
        sysfs_key = _sysfs_key(values.sysfs_root)
        if kinds and extra.get('sysfs_key') == sysfs_key:
            enabled = _enabled_of(extra)
            routes = _routes_of(extra)
            if enabled is not None and routes is not None:
                from libvirt_gpu.devices import enablement
                return HookSettings(
                    sysfs_root=values.sysfs_root, state_dir=values.state_dir,
                    enabled=enablement.Enabled(
                        enabled, values.gpu.enabled_vgpu_types),
                    routes=routes, nvml=values.gpu.nvml), None
        # the host's vGPU parents (or kinds) changed: resolved again from
        # the same values, without oslo.config
        settings, extra = _resolved(values, sysfs_key)
        document = confcache.document(found.key, values, extra)
        note = 'enabled types resolved again (the vGPU parents changed)'
    else:
        settings, document = read_settings(config_file)
        note = 'settings read from %s' % config_file
    if settings_file and document is not None:
        try:
            write_settings(document, settings_file)
            note += ' (snapshot %s refreshed)' % settings_file
        except OSError as e:
            note += ' (cannot write snapshot %s: %s)' % (settings_file,
                                                         e.strerror)
    return settings, note
