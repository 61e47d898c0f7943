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

import os
import sys

from libvirt_gpu.devices.backends import base
from libvirt_gpu.devices import capabilities
from libvirt_gpu.virt import config_xml
from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.util import jsonutil

GROUP = 'libvirt_gpu.vgpu_kinds'
FALLBACK = 'mdev'
CACHE_NAME = 'vgpu-kinds.json'
_CACHE_VERSION = 1


def load_kind(spec):
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


def _path_key():
    """What, when it changes, may change the entry points: each directory
    of the import path with its modification time (None: none there; the
    current directory, which a script's import path starts with, aside)."""
    key = []
    for entry in sys.path:
        if not entry:
            continue
        try:
            key.append([entry, os.stat(entry).st_mtime_ns])
        except OSError:
            key.append([entry, None])
    return key


def _memo(key):
    return tuple((entry, mtime) for entry, mtime in key)


def ordered(pairs):
    """``(name, spec)`` pairs in the order the kinds are asked: by name,
    the fallback last; ConfigError when two declare one name."""
    found = {}
    for name, spec in pairs:
        if found.get(name, spec) != spec:
            raise exception.ConfigError(
                reason='two vGPU kinds are named %r (%s and %s, entry points '
                       'of %s): uninstall one' % (name, found[name], spec,
                                                  GROUP))
        found[name] = spec
    return tuple(sorted(found.items(),
                        key=lambda pair: (pair[0] == FALLBACK, pair[0])))


def scan():
    """``(name, spec)`` of every entry point of ``GROUP``, ``ordered``
    (the slow read: ``importlib.metadata``)."""
    from importlib import metadata
    return ordered((ep.name, ep.value)
                   for ep in metadata.entry_points(group=GROUP))


def record(found):
    """The kinds ``found`` (``installed``) as JSON keeps them, under the
    import path they were read on: what ``remember`` takes back (the cache
    file's document; the hook keeps it in its settings snapshot)."""
    return {'version': _CACHE_VERSION, 'path': _path_key(),
            'kinds': [list(pair) for pair in found]}


def _of_record(data, key):
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


_installed = {}


def remember(data):
    """Take the kinds of a ``record`` as this process's list when the
    import path is as it was then; whether it was."""
    key = _path_key()
    found = _of_record(data, key)
    if found is not None:
        _installed[_memo(key)] = found
    return found is not None


def installed():
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


def kind_specs():
    """The ``'module:Class'`` of each installed kind, in order."""
    return tuple(spec for _, spec in installed())


_loaded = {}


def kind_classes(kinds=None):
    """The VgpuKind subclasses of ``kinds`` (``'module:Class'`` specs;
    default: the installed kinds, ``kind_specs``), in order; loaded once
    per list of specs."""
    specs = tuple(kinds or kind_specs())
    if specs not in _loaded:
        _loaded[specs] = [load_kind(spec) for spec in specs]
    return _loaded[specs]


def having(kinds, capability):
    """The kinds (instances or classes) of ``kinds`` that declare
    ``capability`` (a class of ``capabilities``), in order."""
    return tuple(kind for kind in kinds
                 if issubclass(kind if isinstance(kind, type)
                               else type(kind), capability))


class Vgpus(object):
    """Every vGPU kind of a host behind one object.

    :param sysfs: the host's ``Sysfs``.
    :param kinds: ``VgpuKind`` instances, in the order they are asked; the
        last is the fallback (see the module doc).
    """

    def __init__(self, sysfs, kinds):
        if not kinds:
            raise exception.ConfigError(reason='no vGPU kind is registered')
        self.sysfs = sysfs
        self.kinds = tuple(kinds)

    @classmethod
    def from_environment(cls, env, kinds=None):
        """Every kind of ``kinds`` (default: the installed kinds) for
        ``env``."""
        return cls(env.sysfs, [kind.from_environment(env)
                               for kind in kind_classes(kinds)])

    @property
    def kind_classes(self):
        """The classes of this host's kinds, in order (what discovery
        takes)."""
        return tuple(type(kind) for kind in self.kinds)

    def having(self, capability):
        """This host's kinds that declare ``capability`` (a class of
        ``capabilities``), in order."""
        return having(self.kinds, capability)

    def kind(self, name):
        """The kind registered as ``name``; KeyError when none is."""
        for kind in self.kinds:
            if kind.name == name:
                return kind
        raise KeyError(name)

    # -- which kind -------------------------------------------------------

    def kind_of(self, parent):
        """The kind whose vGPUs are made on ``parent``."""
        for kind in self.kinds[:-1]:
            if kind.is_parent(parent):
                return kind
        return self.kinds[-1]

    def kind_owning(self, uuid):
        """The kind vGPU ``uuid`` belongs to."""
        for kind in self.kinds[:-1]:
            if kind.owns(uuid):
                return kind
        return self.kinds[-1]

    # -- the DeviceBackend interface, by parent or by UUID ----------------

    def hostdev_xml(self, device):
        return self.kind_of(device.parent).hostdev_xml(device)

    def hostdev_for(self, uuid, parent=None, type_id=None):
        """The hostdev of vGPU ``uuid``: on ``parent`` when the kind there
        names its parent in the guest XML, else the fallback kind's (an
        mdev hostdev names only the UUID)."""
        if parent is not None and self.binds_parent(parent):
            return self.kind_of(parent).hostdev_xml(base.VgpuDevice(
                uuid=uuid, parent=parent, type_id=type_id))
        return config_xml.mdev_hostdev(uuid)

    def exists(self, device):
        return self.kind_of(device.parent).exists(device)

    def prepare(self, device):
        return self.kind_of(device.parent).prepare(device)

    def release(self, device):
        return self.remove(device.uuid)

    def lookup(self, uuid):
        """The existing vGPU ``uuid`` as a ``base.VgpuDevice``, or None;
        ``uuid`` an ``objects.Uuid``, parsed where it entered."""
        objects.typed(uuid, objects.Uuid, 'uuid')
        return self.kind_owning(uuid).lookup(uuid)

    def remove(self, uuid):
        objects.typed(uuid, objects.Uuid, 'uuid')
        return self.kind_owning(uuid).remove(uuid)

    def is_parent(self, address):
        return any(kind.is_parent(address) for kind in self.kinds)

    def check_type(self, parent, type_id):
        return self.kind_of(parent).check_type(parent, type_id)

    def available(self, parent, type_id):
        found = self.vgpu_type(parent, type_id)
        return found.available_instances if found is not None else 0

    def vgpu_type(self, parent, type_id):
        return self.kind_of(parent).vgpu_type(parent, type_id)

    def room(self, gpu, type_id):
        """The driver's room for ``type_id`` on the physical GPU ``gpu``
        (``capacity.DriverRoom``) from the kind that reads one (the vendor
        interface on a MIG or mixed-size GPU: ``capabilities.DriverRooms``),
        or None."""
        for kind in self.having(capabilities.DriverRooms):
            found = kind.room(gpu, type_id)
            if found is not None:
                return found
        return None

    def rooms(self, enabled):
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

    def definition(self, uuid):
        """The first definition of ``uuid`` any kind keeps (mdevctl's
        first: an operator's definition wins), else None."""
        for kind in reversed(self.having(capabilities.Persistent)):
            found = kind.definition(uuid)
            if found is not None:
                return found
        return None

    def definitions(self):
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

    def undefine(self, uuid):
        """Drop the persistent definition of ``uuid`` of the kind that
        keeps it (mdevctl's first); False when none does."""
        for kind in reversed(self.having(capabilities.Persistent)):
            if kind.definition(uuid) is not None:
                return kind.undefine(uuid)
        return False

    def defined_device(self, uuid):
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

    def existing(self, mdevs_by_parent=None):
        """``{uuid: (parent, type_id)}`` of every vGPU of every kind."""
        found = {}
        for kind in reversed(self.kinds):
            found.update(kind.existing(mdevs_by_parent))
        return found

    def recorded(self, uuid):
        """Whether any kind records ``uuid`` as ours
        (``capabilities.Recorded``)."""
        return any(kind.recorded(uuid)
                   for kind in self.having(capabilities.Recorded))

    def reserved_parents(self):
        """``{parent: uuid}`` recorded by every kind that binds its parents
        (``capabilities.BindsParent``)."""
        found = {}
        for kind in self.having(capabilities.BindsParent):
            found.update(kind.reserved_parents())
        return found

    def in_devices(self, devices, uuid, parent=None):
        """Whether a domain's devices hold the hostdev of vGPU ``uuid``."""
        return any(kind.in_devices(devices, uuid, parent)
                   for kind in self.kinds)

    def hostdev_function(self, uuid, parent, devices):
        """The PCI function a domain's devices hand over as vGPU ``uuid``
        (a kind that ``binds_parent``), else None."""
        if parent is None or not self.binds_parent(parent):
            return None
        if self.kind_of(parent).in_devices(devices, uuid, parent):
            return parent
        return None

    # -- vGPUs of the persistent configuration ------------------------------

    def binds_parent(self, parent):
        """Whether the kind of ``parent`` names it in the guest's XML
        (``capabilities.BindsParent``)."""
        return isinstance(self.kind_of(parent), capabilities.BindsParent)

    def keep_for_config(self, device):
        """Record ``device`` for a guest's persistent XML when its kind
        names the parent there; True when something was recorded."""
        if not self.binds_parent(device.parent):
            return False
        self.kind_of(device.parent).define(device, start='manual')
        return True

    def forget_for_config(self, uuid, parent):
        """Undo ``keep_for_config``."""
        if self.binds_parent(parent):
            self.kind_of(parent).undefine(uuid)

    def bind_for_config(self, gpus, type_id, parent, uuid):
        """The parent a ``config``-only vGPU goes to, recorded for it, when
        the kind of the GPUs ``gpus`` (physical GPUs, in order) names the
        parent in the guest XML; None otherwise (it is chosen at start).
        ``parent``: the caller's choice, a physical GPU or one function."""
        gpus = [g for g in gpus if self.binds_parent(self.parents_of(g)[0])]
        if not gpus:
            return None
        if parent is not None and parent != gpus[0]:
            chosen = parent                 # a function named by the caller
        else:
            chosen = None
            problems = []
            for gpu in gpus:
                try:
                    chosen = self.kind_of(self.parents_of(gpu)[0]
                                          ).choose_parent(gpu, type_id)
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

    def physical(self, address):
        """The physical GPU (PF) of a VF, else ``address`` itself."""
        objects.typed(address, objects.PciAddress, 'address')
        return self.sysfs.physfn(address) or address

    def parents_of(self, gpu):
        """The PCI functions vGPUs of the physical GPU ``gpu`` are made on:
        its VFs when it has any, else the GPU itself."""
        objects.typed(gpu, objects.PciAddress, 'gpu')
        return self.sysfs.virtfns(gpu) or (gpu,)
