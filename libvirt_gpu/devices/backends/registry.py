"""The vGPU kinds of this project, and the one object callers talk to.

A vGPU kind (``base.VgpuKind``) is found through an entry point of the
group ``GROUP`` (``libvirt_gpu.vgpu_kinds``), so that a third party's
package adds one by declaring it in its own ``setup.cfg``::

    [options.entry_points]
    libvirt_gpu.vgpu_kinds =
        mig = mig_vgpu.kind:MigKind

This project's own are ``mdev`` and ``nvidia`` (setup.py); an entry
point's name is its kind's ``name``.  The kinds are asked in the order of
their entry points' names, the fallback (``FALLBACK``, classic mdev)
last.  Reading the entry points costs more than a whole guest start of the
qemu hook (importing ``importlib.metadata`` alone), so the list is read
once and kept as data (``installed``, ``record``) under the modification
times of the import path's directories (installing or removing a package
changes them): in this process, in a cache file beside the
configuration's snapshot (``util.cachefiles.cache_dir``), and, for the qemu
hook, in its settings snapshot (``remember``).

``Vgpus`` holds one instance of each and hands every call to the kind it is
about: by parent (the first kind whose ``is_parent`` answers yes), by UUID
(the first kind that ``owns`` it).  The last kind is the fallback: a parent
or UUID no kind claims is classic mdev's, whose answers then say what is
wrong (ParentGone, not found).  What only some kinds do, it asks the kinds
that declare the capability (``capabilities``, ``having``).  Today:

* a VF with NVIDIA's vGPU 17+ vendor interface (``<VF>/nvidia/``):
  ``nvidia_vgpu.NvidiaVgpuBackend`` (``<hostdev type='pci' managed='no'>``
  of the VF); a vGPU is found by UUID in its state file first (a cheap read
  of one JSON file, absent on hosts that never used it);
* anything else (a T4, an Ampere VF that is an mdev parent):
  ``mdev.MdevBackend``.

SR-IOV GPUs are configured, reported and counted per physical GPU (the PF);
their vGPUs live on VFs, one each.  ``parents_of(gpu)`` lists the functions
vGPUs are made on (``discovery.gpu_view`` reads one physical GPU with its
VFs, given the kinds: ``Vgpus.kind_classes``).
"""

from __future__ import annotations

import os
import sys

from libvirt_gpu.devices.backends import base
from libvirt_gpu.devices import capabilities
from libvirt_gpu.virt import config_xml
from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.util import jsonutil

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from typing import TypeVar

    from libvirt_gpu.devices import capacity
    from libvirt_gpu.devices.sysfs import Sysfs
    from libvirt_gpu.virt.config_xml import DomainDevices

    _C = TypeVar('_C', bound=capabilities.Capability)
    # ``(name, 'module:Class')`` of each kind, ``ordered``
    Kinds = tuple[tuple[str, str], ...]
    # an import path's directories with their modification times
    PathKey = list[list[object]]

GROUP = 'libvirt_gpu.vgpu_kinds'
FALLBACK = 'mdev'
CACHE_NAME = 'vgpu-kinds.json'
_CACHE_VERSION = 1


def load_kind(spec: str) -> type[base.VgpuKind]:
    """``'module:Class'`` -> the VgpuKind subclass."""
    module, _, name = spec.partition(':')
    # The import statement's own machinery, not importlib.import_module:
    # no importlib package to load at every guest start, and
    # ``python -X importtime`` (bench/hook.py --importtime) sees the kinds.
    try:
        __import__(module)
        cls = getattr(sys.modules[module], name)
    except (ImportError, AttributeError) as e:
        raise exception.ConfigError(
            reason='the vGPU kind %s cannot be loaded (%s); reinstall the '
                   'package that declares it, or uninstall it' % (spec, e))
    if not (isinstance(cls, type) and issubclass(cls, base.VgpuKind)):
        raise exception.ConfigError(
            reason='%s is not a vGPU kind (a backends.base.VgpuKind)' % spec)
    return cls


def _path_key() -> PathKey:
    """What, when it changes, may change the entry points: each directory
    of the import path with its modification time (None: none there; the
    current directory, which a script's import path starts with, aside)."""
    key: PathKey = []
    for entry in sys.path:
        if not entry:
            continue
        try:
            key.append([entry, os.stat(entry).st_mtime_ns])
        except OSError:
            key.append([entry, None])
    return key


def _memo(key: PathKey) -> tuple[tuple[object, ...], ...]:
    return tuple(tuple(pair) for pair in key)


def ordered(pairs: Iterable[tuple[str, str]]) -> Kinds:
    """``(name, spec)`` pairs in the order the kinds are asked: by name,
    the fallback last; ConfigError when two declare one name."""
    found: dict[str, str] = {}
    for name, spec in pairs:
        if found.get(name, spec) != spec:
            raise exception.ConfigError(
                reason='two vGPU kinds are named %r (%s and %s, entry points '
                       'of %s): uninstall one' % (name, found[name], spec,
                                                  GROUP))
        found[name] = spec
    return tuple(sorted(found.items(),
                        key=lambda pair: (pair[0] == FALLBACK, pair[0])))


def scan() -> Kinds:
    """``(name, spec)`` of every entry point of ``GROUP``, ``ordered``
    (the slow read: ``importlib.metadata``)."""
    from importlib import metadata
    return ordered((ep.name, ep.value)
                   for ep in metadata.entry_points(group=GROUP))


def record(found: Kinds) -> dict[str, object]:
    """The kinds ``found`` (``installed``) as JSON keeps them, under the
    import path they were read on: what ``remember`` takes back (the cache
    file's document; the hook keeps it in its settings snapshot)."""
    return {'version': _CACHE_VERSION, 'path': _path_key(),
            'kinds': [list(pair) for pair in found]}


def _of_record(data: object, key: PathKey) -> Kinds | None:
    """The kinds a ``record`` keeps, when each directory of ``key`` was on
    the import path it was made under, unchanged (the qemu hook's path is
    a part of the installing command's); else None."""
    try:
        if not (isinstance(data, dict) and data.get('version')
                == _CACHE_VERSION):
            return None
        then = {entry: mtime for entry, mtime in data['path']}
        if any(entry not in then or then[entry] != mtime
               for entry, mtime in key):
            return None
        return ordered((str(name), str(spec))
                       for name, spec in data['kinds']) or None
    except (ValueError, TypeError, KeyError, exception.ConfigError):
        return None


_installed: dict[tuple[tuple[object, ...], ...], Kinds] = {}


def remember(data: object) -> bool:
    """Take the kinds of a ``record`` as this process's list when the
    import path is as it was then; whether it was."""
    key = _path_key()
    found = _of_record(data, key)
    if found is not None:
        _installed[_memo(key)] = found
    return found is not None


def installed() -> Kinds:
    """``(name, spec)`` of the installed kinds, ``ordered``: kept in this
    process (``remember``) and in the cache file while the import path is
    unchanged (see the module doc), else read again (``scan``)."""
    key = _path_key()
    found = _installed.get(_memo(key))
    if found is not None:
        return found
    from libvirt_gpu.util import cachefiles
    directory = cachefiles.cache_dir()
    path = os.path.join(directory, CACHE_NAME) if directory else None
    if path is not None:
        raw = cachefiles.read_private(path)
        try:
            found = _of_record(jsonutil.loads(raw), key) if raw else None
        except ValueError:
            found = None
    if found is None:
        found = scan()
        if not found:
            raise exception.ConfigError(
                reason='no vGPU kind is installed (no entry point of %s): '
                       'reinstall libvirt-gpu' % GROUP)
        if directory:
            cachefiles.write_private(directory, CACHE_NAME,
                                     jsonutil.dumps(record(found)))
    _installed[_memo(key)] = found
    return found


def kind_specs() -> tuple[str, ...]:
    """The ``'module:Class'`` of each installed kind, in order."""
    return tuple(spec for _, spec in installed())


_loaded: dict[tuple[str, ...], list[type[base.VgpuKind]]] = {}


def kind_classes(kinds: Iterable[str] | None = None
                 ) -> list[type[base.VgpuKind]]:
    """The VgpuKind subclasses of ``kinds`` (``'module:Class'`` specs;
    default: the installed kinds, ``kind_specs``), in order; loaded once
    per list of specs."""
    specs = tuple(kinds or kind_specs())
    if specs not in _loaded:
        _loaded[specs] = [load_kind(spec) for spec in specs]
    return _loaded[specs]


def having(kinds: Iterable[type[base.VgpuKind] | base.VgpuKind],
           capability: type[_C]) -> tuple[type[_C] | _C, ...]:
    """The kinds (instances or classes) of ``kinds`` that declare
    ``capability`` (a class of ``capabilities``), in order."""
    found: list[type[_C] | _C] = []
    for kind in kinds:
        if isinstance(kind, type):
            if issubclass(kind, capability):
                found.append(kind)
        elif isinstance(kind, capability):
            found.append(kind)
    return tuple(found)


class Vgpus(object):
    """Every vGPU kind of a host behind one object.

    :param sysfs: the host's ``Sysfs``.
    :param kinds: ``VgpuKind`` instances, in the order they are asked; the
        last is the fallback (see the module doc).
    """

    def __init__(self, sysfs: Sysfs, kinds: Iterable[base.VgpuKind]) -> None:
        if not kinds:
            raise exception.ConfigError(reason='no vGPU kind is registered')
        self.sysfs = sysfs
        self.kinds = tuple(kinds)

    @classmethod
    def from_parts(cls, parts: base.KindParts,
                   kinds: Iterable[str] | None = None) -> Vgpus:
        """Every kind of ``kinds`` (default: the installed kinds) for the
        host whose parts are ``parts``."""
        return cls(parts.sysfs, [kind.from_parts(parts)
                                 for kind in kind_classes(kinds)])

    @property
    def kind_classes(self) -> tuple[type[base.VgpuKind], ...]:
        """The classes of this host's kinds, in order (what discovery
        takes)."""
        return tuple(type(kind) for kind in self.kinds)

    def having(self, capability: type[_C]) -> tuple[_C, ...]:
        """This host's kinds that declare ``capability`` (a class of
        ``capabilities``), in order."""
        found: list[_C] = []
        for kind in self.kinds:
            if isinstance(kind, capability):
                found.append(kind)
        return tuple(found)

    def kind(self, name: str) -> base.VgpuKind:
        """The kind registered as ``name``; KeyError when none is."""
        for kind in self.kinds:
            if kind.name == name:
                return kind
        raise KeyError(name)

    # -- which kind -------------------------------------------------------

    def kind_of(self, parent: objects.PciAddress) -> base.VgpuKind:
        """The kind whose vGPUs are made on ``parent``."""
        for kind in self.kinds[:-1]:
            if kind.is_parent(parent):
                return kind
        return self.kinds[-1]

    def kind_owning(self, uuid: objects.Uuid) -> base.VgpuKind:
        """The kind vGPU ``uuid`` belongs to."""
        for kind in self.kinds[:-1]:
            if kind.owns(uuid):
                return kind
        return self.kinds[-1]

    # -- the DeviceBackend interface, by parent or by UUID ----------------

    def hostdev_xml(self, device: base.VgpuDevice) -> str:
        return self.kind_of(device.parent).hostdev_xml(device)

    def hostdev_for(self, uuid: objects.Uuid,
                    parent: objects.PciAddress | None = None,
                    type_id: objects.TypeId | None = None) -> str:
        """The hostdev of vGPU ``uuid``: on ``parent`` when the kind there
        names its parent in the guest XML, else the fallback kind's (an
        mdev hostdev names only the UUID)."""
        if parent is not None and self.binds_parent(parent):
            if type_id is None:
                raise TypeError('the hostdev of vGPU %s on %s names its '
                                'parent: pass its type_id' % (uuid, parent))
            return self.kind_of(parent).hostdev_xml(base.VgpuDevice(
                uuid=uuid, parent=parent, type_id=type_id))
        return config_xml.mdev_hostdev(uuid)

    def exists(self, device: base.VgpuDevice) -> bool:
        return self.kind_of(device.parent).exists(device)

    def prepare(self, device: base.VgpuDevice) -> bool:
        return self.kind_of(device.parent).prepare(device)

    def release(self, device: base.VgpuDevice) -> bool:
        return self.remove(device.uuid)

    def lookup(self, uuid: objects.Uuid) -> base.VgpuDevice | None:
        """The existing vGPU ``uuid`` as a ``base.VgpuDevice``, or None;
        ``uuid`` an ``objects.Uuid``, parsed where it entered."""
        objects.typed(uuid, objects.Uuid, 'uuid')
        return self.kind_owning(uuid).lookup(uuid)

    def remove(self, uuid: objects.Uuid) -> bool:
        objects.typed(uuid, objects.Uuid, 'uuid')
        return self.kind_owning(uuid).remove(uuid)

    def is_parent(self, address: objects.PciAddress) -> bool:
        return any(kind.is_parent(address) for kind in self.kinds)

    def check_type(self, parent: objects.PciAddress,
                   type_id: objects.TypeId) -> None:
        return self.kind_of(parent).check_type(parent, type_id)

    def available(self, parent: objects.PciAddress,
                  type_id: objects.TypeId) -> int:
        found = self.vgpu_type(parent, type_id)
        return found.available_instances if found is not None else 0

    def vgpu_type(self, parent: objects.PciAddress,
                  type_id: objects.TypeId) -> objects.VgpuType | None:
        return self.kind_of(parent).vgpu_type(parent, type_id)

    def room(self, gpu: objects.PciAddress,
             type_id: objects.TypeId) -> capacity.DriverRoom | None:
        """The driver's room for ``type_id`` on the physical GPU ``gpu``
        (``capacity.DriverRoom``) from the kind that reads one (the vendor
        interface on a MIG or mixed-size GPU: ``capabilities.DriverRooms``),
        or None."""
        for kind in self.having(capabilities.DriverRooms):
            found: capacity.DriverRoom | None = kind.room(gpu, type_id)
            if found is not None:
                return found
        return None

    def rooms(self, enabled: Mapping[objects.PciAddress, objects.EnabledType]
              ) -> dict[tuple[objects.PciAddress, objects.TypeId],
                        capacity.DriverRoom]:
        """``{(PciAddress, TypeId): capacity.DriverRoom}`` of the GPUs of
        ``enabled`` (``{PciAddress: EnabledType}``) whose enabled types
        the driver counts itself (``room``); the others are absent."""
        found = {}
        for address, setting in sorted(enabled.items()):
            for type_id in setting.type_ids:
                room = self.room(address, type_id)
                if room is not None:
                    found[address, type_id] = room
        return found

    def definition(self, uuid: objects.Uuid) -> base.VgpuDefinition | None:
        """The first definition of ``uuid`` any kind keeps (mdevctl's
        first: an operator's definition wins), else None."""
        for kind in reversed(self.having(capabilities.Persistent)):
            found: base.VgpuDefinition | None = kind.definition(uuid)
            if found is not None:
                return found
        return None

    def definitions(self) -> dict[objects.Uuid, base.VgpuDefinition]:
        """``{uuid: VgpuDefinition}`` of every persistent definition a
        kind keeps and can read (live or not; mdevctl's first), whatever
        ``restore`` would make of it."""
        found = {}
        for kind in self.having(capabilities.Persistent):
            for item in kind.restorable():
                try:
                    definition = kind.definition(item.uuid)
                except exception.LibvirtGpuError:
                    continue          # unreadable: restore reports it
                if definition is not None:
                    found[item.uuid] = definition
        return found

    def undefine(self, uuid: objects.Uuid) -> bool:
        """Drop the persistent definition of ``uuid`` of the kind that
        keeps it (mdevctl's first); False when none does."""
        for kind in reversed(self.having(capabilities.Persistent)):
            if kind.definition(uuid) is not None:
                return kind.undefine(uuid)
        return False

    def defined_device(self, uuid: objects.Uuid) -> base.VgpuDevice | None:
        """The vGPU ``uuid`` as the first kind that defines it describes
        it (a ``base.VgpuDevice``: the fallback's first), for a guest
        whose XML names it without our metadata, else None.  A definition
        the hook cannot honour (it sets attributes) is refused
        (``MdevCreateFailed``, saying what to do: the kind's
        ``attrs_refusal``)."""
        for kind in reversed(self.having(capabilities.Persistent)):
            definition = kind.definition(uuid)
            if definition is None:
                continue
            if definition.attrs:
                raise exception.MdevCreateFailed(
                    uuid=uuid, type_id=definition.type_id,
                    parent=definition.parent,
                    reason=kind.attrs_refusal(definition))
            return base.VgpuDevice(uuid=uuid, parent=definition.parent,
                                   type_id=definition.type_id)
        return None

    def existing(self, mdevs_by_parent: base.MdevsByParent | None = None
                 ) -> dict[objects.Uuid,
                           tuple[objects.PciAddress, objects.TypeId]]:
        """``{uuid: (parent, type_id)}`` of every vGPU of every kind."""
        found: dict[objects.Uuid,
                    tuple[objects.PciAddress, objects.TypeId]] = {}
        for kind in reversed(self.kinds):
            found.update(kind.existing(mdevs_by_parent))
        return found

    def recorded(self, uuid: objects.Uuid) -> bool:
        """Whether any kind records ``uuid`` as ours
        (``capabilities.Recorded``)."""
        return any(kind.recorded(uuid)
                   for kind in self.having(capabilities.Recorded))

    def reserved_parents(self) -> dict[objects.PciAddress, objects.Uuid]:
        """``{parent: uuid}`` recorded by every kind that binds its parents
        (``capabilities.BindsParent``)."""
        found: dict[objects.PciAddress, objects.Uuid] = {}
        for kind in self.having(capabilities.BindsParent):
            found.update(kind.reserved_parents())
        return found

    def in_devices(self, devices: DomainDevices, uuid: objects.Uuid,
                   parent: objects.PciAddress | None = None) -> bool:
        """Whether a domain's devices hold the hostdev of vGPU ``uuid``."""
        return any(kind.in_devices(devices, uuid, parent)
                   for kind in self.kinds)

    def hostdev_function(self, uuid: objects.Uuid,
                         parent: objects.PciAddress | None,
                         devices: DomainDevices) -> objects.PciAddress | None:
        """The PCI function a domain's devices hand over as vGPU ``uuid``
        (a kind that ``binds_parent``), else None."""
        if parent is None or not self.binds_parent(parent):
            return None
        if self.kind_of(parent).in_devices(devices, uuid, parent):
            return parent
        return None

    # -- vGPUs of the persistent configuration ------------------------------

    def binds_parent(self, parent: objects.PciAddress) -> bool:
        """Whether the kind of ``parent`` names it in the guest's XML
        (``capabilities.BindsParent``)."""
        return self._binding(parent) is not None

    def _binding(self, parent: objects.PciAddress
                 ) -> capabilities.BindsParent | None:
        """The kind of ``parent`` when it names the parent in the guest's
        XML, else None."""
        kind = self.kind_of(parent)
        return kind if isinstance(kind, capabilities.BindsParent) else None

    def keep_for_config(self, device: base.VgpuDevice) -> bool:
        """Record ``device`` for a guest's persistent XML when its kind
        names the parent there; True when something was recorded."""
        kind = self._binding(device.parent)
        if kind is None:
            return False
        kind.define(device, start='manual')
        return True

    def forget_for_config(self, uuid: objects.Uuid,
                          parent: objects.PciAddress) -> None:
        """Undo ``keep_for_config``."""
        kind = self._binding(parent)
        if kind is not None:
            kind.undefine(uuid)

    def bind_for_config(self, gpus: Iterable[objects.PciAddress],
                        type_id: objects.TypeId,
                        parent: objects.PciAddress | None,
                        uuid: objects.Uuid) -> objects.PciAddress | None:
        """The parent a ``config``-only vGPU goes to, recorded for it, when
        the kind of the GPUs ``gpus`` (physical GPUs, in order) names the
        parent in the guest XML; None otherwise (it is chosen at start).
        ``parent``: the caller's choice, a physical GPU or one function."""
        bound = [(gpu, kind) for gpu in gpus
                 for kind in (self._binding(self.parents_of(gpu)[0]),)
                 if kind is not None]
        if not bound:
            return None
        chosen: objects.PciAddress | None
        if parent is not None and parent != bound[0][0]:
            chosen = parent                 # a function named by the caller
        else:
            chosen = None
            problems = []
            for gpu, kind in bound:
                try:
                    chosen = kind.choose_parent(gpu, type_id)
                    break
                except exception.NoCapacity as e:
                    problems.append(str(e))
            if chosen is None:
                raise exception.NoCapacity(uuid=uuid, type_id=type_id,
                                           where='any GPU of this host',
                                           reason='; '.join(problems))
        self.keep_for_config(base.VgpuDevice(uuid=uuid, parent=chosen,
                                             type_id=type_id))
        return chosen

    # -- physical GPUs -------------------------------------------------------

    def physical(self, address: objects.PciAddress) -> objects.PciAddress:
        """The physical GPU (PF) of a VF, else ``address`` itself."""
        objects.typed(address, objects.PciAddress, 'address')
        return self.sysfs.physfn(address) or address

    def parents_of(self, gpu: objects.PciAddress
                   ) -> Sequence[objects.PciAddress]:
        """The PCI functions vGPUs of the physical GPU ``gpu`` are made on:
        its VFs when it has any, else the GPU itself."""
        objects.typed(gpu, objects.PciAddress, 'gpu')
        return self.sysfs.virtfns(gpu) or (gpu,)
