"""A test-only vGPU kind with a sysfs interface of its own (made up): the
proof that a kind is a plugin (docs/dev/architecture.md, "A new vGPU kind").

Nothing outside this module and its registration (an entry point of
``registry.GROUP`` in a test-only distribution, ``kinds.register``) knows
it.  ``ToyKind`` implements the core of the contract (``base.CORE``) and
nothing else; ``FullToyKind`` declares the capabilities a kind of this
shape may have (``capabilities``).  Its interface, on an SR-IOV VF::

    bus/pci/devices/<VF>/toyvgpu/types     what the VF can take, one a line:
        1 Toy-1G 4                         <number> <name> <per-GPU maximum>
    bus/pci/devices/<VF>/toyvgpu/current   0, or the number of the vGPU the
                                           VF holds (write n: create it;
                                           write 0: destroy it)

Type ids are ``toy-<number>``; the guest gets the VF itself
(``<hostdev type='pci' managed='no'>``), as with NVIDIA's vendor
interface.  Our vGPUs are recorded in ``<state_dir>/toy-vgpu.json``
(``{uuid: [vf, type_id, start]}``: start None for a vGPU that lives while
its guest runs, ``auto`` for one ``restore`` creates after a reboot),
since the interface has no UUIDs.  Every file
is read and written through the ``Sysfs`` the kind is given.
"""

import json
import os

from libvirt_gpu.devices.backends import base
from libvirt_gpu.devices import capabilities
from libvirt_gpu.virt import config_xml
from libvirt_gpu import exception
from libvirt_gpu.util import fileutil
from libvirt_gpu import objects

SPEC = 'tests.doubles.toy_kind:FullToyKind'
CORE_SPEC = 'tests.doubles.toy_kind:ToyKind'
INTERFACE = 'toy'
TOY_DIR = 'toyvgpu'
TYPES_FILE = 'types'
CURRENT_FILE = 'current'
STATE_NAME = 'toy-vgpu.json'


def type_id(number):
    return 'toy-%d' % number


def type_number(value):
    return int(objects.TypeId.parse(value)[len('toy-'):])


class ToyFiles(object):
    """The toy interface of a host's sysfs."""

    def __init__(self, sysfs):
        self.sysfs = sysfs

    def directory(self, address):
        return os.path.join(self.sysfs.pci_dir(address), TOY_DIR)

    def has_interface(self, address):
        return self.sysfs.isdir(self.directory(address))

    def types(self, address):
        """``((number, name, maximum), ...)``"""
        path = os.path.join(self.directory(address), TYPES_FILE)
        rows = []
        for line in self.sysfs.read(path).splitlines():
            number, name, maximum = line.split()
            rows.append((int(number), name, int(maximum)))
        return tuple(rows)

    def current(self, address):
        return self.sysfs.read_int(
            os.path.join(self.directory(address), CURRENT_FILE))

    def set_current(self, address, number):
        self.sysfs.write(os.path.join(self.directory(address),
                                      CURRENT_FILE), str(number))


def make_toy_vf(root, vf, types=((1, 'Toy-1G', 4), (2, 'Toy-2G', 2))):
    """Give the VF ``vf`` of the plain tree ``root`` the toy interface (the
    test's stand-in for a driver)."""
    directory = os.path.join(root, 'bus', 'pci', 'devices', str(vf),
                             TOY_DIR)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, TYPES_FILE), 'w') as f:
        f.write(''.join('%d %s %d\n' % t for t in types))
    with open(os.path.join(directory, CURRENT_FILE), 'w') as f:
        f.write('0\n')


def read_function(sysfs, address):
    """The ``objects.VendorVf`` of the toy interface on ``address``, or
    None."""
    files = ToyFiles(sysfs)
    if not files.has_interface(address):
        return None
    current = files.current(address)
    creatable = () if current else tuple(
        objects.VgpuType(id=type_id(n), name=name, description=None,
                         device_api='vfio-pci', available_instances=1,
                         published_max=maximum)
        for n, name, maximum in files.types(address))
    held = None
    if current:
        named = {n: (name, m) for n, name, m in files.types(address)}
        name, maximum = named.get(current, (None, None))
        held = objects.VgpuType(id=type_id(current), name=name,
                                description=None, device_api='vfio-pci',
                                available_instances=0,
                                published_max=maximum)
    return objects.VendorVf(creatable=creatable, current=held,
                            interface=INTERFACE)


class ToyKind(base.VgpuKind):
    """vGPUs of the toy interface, one per VF: the core only."""

    name = INTERFACE

    @classmethod
    def from_parts(cls, parts):
        return cls(parts.sysfs, parts.state_dir)

    def __init__(self, sysfs, state_dir):
        self.sysfs = sysfs
        self.files = ToyFiles(sysfs)
        self.path = os.path.join(state_dir, STATE_NAME)

    # -- our records ------------------------------------------------------

    def _read(self):
        if not os.path.exists(self.path):
            return {}
        with open(self.path) as f:
            # the kind's own file: parsed here, where it enters
            return {objects.Uuid.parse(uuid): (
                objects.PciAddress.parse(vf), objects.TypeId.parse(type_),
                start)
                for uuid, (vf, type_, start) in json.load(f).items()}

    def _write(self, entries):
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        fileutil.write_atomic(self.path, json.dumps(
            {u: [str(vf), t, start] for u, (vf, t, start)
             in entries.items()}))

    # -- the core (base.CORE) ---------------------------------------------

    def is_parent(self, address):
        return self.files.has_interface(objects.PciAddress.parse(address))

    def owns(self, uuid):
        return uuid in self._read()

    def lookup(self, uuid):
        entry = self._read().get(uuid)
        if entry is None or not self.is_parent(entry[0]) or \
                self.files.current(entry[0]) != type_number(entry[1]):
            return None
        return base.VgpuDevice(uuid=uuid, parent=entry[0], type_id=entry[1])

    def check_type(self, parent, type_id_):
        if not self.is_parent(parent):
            raise exception.ParentGone(address=parent, uuid=None,
                                       reason='no toy interface')
        if self.vgpu_type(parent, type_id_) is None:
            raise exception.UnknownType(type_id=type_id_, address=parent)

    def vgpu_type(self, parent, type_id_):
        state = read_function(self.sysfs, parent)
        if state is None:
            return None
        return next((t for t in state.types if t.id == type_id_), None)

    def prepare(self, device):
        if self.exists(device):
            return False
        self.check_type(device.parent, device.type_id)
        if self.files.current(device.parent):
            raise exception.NoCapacity(
                uuid=device.uuid, type_id=device.type_id,
                where=str(device.parent), reason='the VF holds a vGPU')
        self.files.set_current(device.parent, type_number(device.type_id))
        entries = self._read()
        start = entries[device.uuid][2] if device.uuid in entries else None
        entries[device.uuid] = (device.parent, device.type_id, start)
        self._write(entries)
        return True

    def remove(self, uuid):
        entries = self._read()
        entry = entries.pop(uuid, None)
        if entry is None:
            return False
        removed = False
        if self.is_parent(entry[0]) and self.files.current(entry[0]):
            self.files.set_current(entry[0], 0)
            removed = True
        self._write(entries)
        return removed

    def existing(self, mdevs_by_parent=None):
        found = {}
        for uuid in self._read():
            device = self.lookup(uuid)
            if device is not None:
                found[uuid] = (device.parent, device.type_id)
        return found

    def in_devices(self, devices, uuid, parent):
        return parent is not None and self.is_parent(parent) and \
            parent in devices.pci_addresses

    def hostdev_xml(self, device):
        return config_xml.pci_hostdev(device.parent, managed=False)


class FullToyKind(ToyKind, capabilities.BindsParent,
                  capabilities.WatchedParents, capabilities.VendorFunctions,
                  capabilities.Recorded):
    """The toy kind with the capabilities of a VF-based kind that keeps its
    own records: seen by discovery, its parents watched by the hook, its
    vGPUs defined for a guest's persistent XML and restored after a
    reboot."""

    parents_key = 'toy_vfs'
    sysfs_names = (TOY_DIR,)

    # -- capabilities.WatchedParents ----------------------------------------

    @classmethod
    def parents_now(cls, sysfs):
        return sysfs.functions_with(TOY_DIR)

    # -- capabilities.VendorFunctions ---------------------------------------

    @classmethod
    def read_function(cls, sysfs, address):
        return read_function(sysfs, address)

    @classmethod
    def complete_types(cls, pf, vfs):
        return vfs

    # -- capabilities.BindsParent (and Persistent) --------------------------

    def definition(self, uuid):
        return None

    def define(self, device, start='manual'):
        entries = self._read()
        entries[device.uuid] = (device.parent, device.type_id, start)
        self._write(entries)

    def undefine(self, uuid):
        entries = self._read()
        if entries.pop(uuid, None) is not None:
            self._write(entries)

    def restorable(self):
        return tuple(base.Restorable(
            uuid=uuid, device=base.VgpuDevice(uuid=uuid, parent=vf,
                                              type_id=type_),
            detail='%s on toy VF %s' % (type_, vf))
            for uuid, (vf, type_, start)
            in sorted(self._read().items()) if start == 'auto')

    def reserved_parents(self):
        return {vf: uuid for uuid, (vf, _, _) in self._read().items()}

    def choose_parent(self, gpu, type_id_):
        reserved = self.reserved_parents()
        for vf in self.sysfs.virtfns(gpu):
            found = self.vgpu_type(vf, type_id_)
            if vf not in reserved and found is not None \
                    and found.available_instances:
                return vf
        raise exception.NoCapacity(uuid=None, type_id=type_id_,
                                   where=str(gpu), reason='no free toy VF')

    # -- capabilities.Recorded ----------------------------------------------

    def recorded(self, uuid):
        return uuid in self._read()

    def recorded_gpus(self):
        return tuple(sorted({self.sysfs.physfn(vf) for vf, _, _
                             in self._read().values()
                             if self.sysfs.physfn(vf) is not None}))

    def boot_cleanup(self, owner_running, dry_run=False):
        notes = []
        for uuid, (vf, type_, start) in sorted(self._read().items()):
            if start is not None or self.lookup(uuid) is None:
                continue
            if owner_running(uuid) is not False:
                notes.append(base.BootNote('skipped', uuid, 'kept'))
            elif dry_run:
                notes.append(base.BootNote('would', uuid,
                                           'would reset toy VF %s' % vf))
            else:
                self.remove(uuid)
                notes.append(base.BootNote('reset', uuid,
                                           'reset toy VF %s' % vf))
        return notes
