"""NVIDIA vGPU 17+ on kernels >= 6.8: the vendor interface, no mdev.

The GPU (an SR-IOV PF bound to ``nvidia``) has its VFs enabled (NVIDIA's
``sriov-manage -e``); each VF holds at most one vGPU and shows (``Sysfs``
is the only way in)::

    bus/pci/devices/0000:3d:00.4/nvidia/creatable_vgpu_types
        ID    : vGPU Name
        1145  : NVIDIA L40S-1B
        ...                           (shrinks as the GPU fills; empty: full)
    bus/pci/devices/0000:3d:00.4/nvidia/current_vgpu_type
        0                             write 1145: the vGPU exists on the VF
                                      write 0:    it is destroyed
    bus/pci/devices/0000:3d:00.4/nvidia/vgpu_params
        frame_rate_limiter=0          plugin parameters (write only)

The guest gets the VF itself, unmanaged (libvirt must not rebind it)::

    <hostdev mode='subsystem' type='pci' managed='no'>
      <source><address domain='0x0000' bus='0x3d' slot='0x00'
                       function='0x4'/></source>
    </hostdev>

Types are named ``nvidia-<n>`` here as everywhere else in libvirt-gpu (the
mdev interface of the same driver family names type 1145 ``nvidia-1145``),
so the configuration, the traits and the leases are those of an mdev.

A vGPU of this interface has no UUID of its own: ours (the one in the
domain's ``<gpu:vgpu uuid=...>``) is kept with the VF it lives on in a
state file next to the leases, ``<state_dir>/nvidia-vgpu.json``::

    {"version": 1, "vgpus": {"<uuid>": {
        "vf": "0000:3d:00.4", "gpu": "0000:3d:00.0", "type_id": "nvidia-1145",
        "start": null | "auto" | "manual", "params": null | "..."}}}

``start`` is null for a vGPU that exists only while its guest runs, and
``auto``/``manual`` for a persistent one (the mdevctl meaning: ``restore``
re-creates ``auto`` ones after a reboot).

A ``VgpuDevice`` of this backend has the VF as its ``parent``: the VF is
what the guest's ``<hostdev>`` names, so it is chosen when the XML is
written (``choose_vf``), not at guest start.

Transient answers (EBUSY/EAGAIN: the driver is still tearing a vGPU down
after its guest exited) are retried with tenacity for a bounded while;
tenacity is imported only then (the qemu hook pays for nothing it does not
use).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import time

from libvirt_gpu.backends import base
from libvirt_gpu import config_xml
from libvirt_gpu.backends.nvidia_vgpu import files
from libvirt_gpu.backends.nvidia_vgpu import names
from libvirt_gpu import exception
from libvirt_gpu import fileutil
from libvirt_gpu import objects
from libvirt_gpu import records


STATE_NAME = 'nvidia-vgpu.json'
LOCK_NAME = 'nvidia-vgpu.lock'
STATE_VERSION = 1
STARTS = ('auto', 'manual')
_MAX_STATE_BYTES = 4 * 1024 * 1024

_GONE_ERRNOS = (errno.ENODEV, errno.ENOENT)


# --- what NVIDIA publishes about its GPUs ----------------------------------
#
# Only what a type the host lists lacks is filled in from here, by the type's
# NAME (type numbers change between driver releases, and
# ``creatable_vgpu_types`` lists only what is creatable now): a type the host
# does not list is never added.

@records.record
class GpuModel:
    """A GPU model of the vendor interface, as NVIDIA documents it.

    ``name``: the model as its type names begin (``NVIDIA L40S`` of
    ``NVIDIA L40S-4Q``); ``framebuffer_gb``: memory of the GPU;
    ``max_vgpus``: the most vGPUs one GPU holds (its smallest types are
    capped there).
    """

    name: str
    framebuffer_gb: int
    max_vgpus: int


# NVIDIA L40S (10de:26b9, Ada, 48 GB).  NVIDIA's per-GPU maximums in
# equal-size mode are 48 GB / the type's framebuffer, at most 32 (the
# L40S-1B description of vGPU 16 reads ``max_instance=32``).
L40S = GpuModel('NVIDIA L40S', 48, 32)

KNOWN_GPUS = {model.name: model for model in (L40S,)}

# "NVIDIA L40S-12Q" -> 12 (GB of framebuffer), time-sliced series only;
# MIG-backed names ("NVIDIA H100-1-10C") have their own maximums.
# (A pattern: ``re`` compiles it when first used; see objects.py.)
_TIME_SLICED_RE = r'-(\d+)([ABCQ])$'


def type_framebuffer_gb(name):
    """Framebuffer (GB) of a time-sliced type from its name, or None."""
    if not name:
        return None
    last = name.split()[-1]
    if re.search(r'-\d+-\d+[A-Z]+$', last):
        return None                    # MIG-backed
    m = re.search(_TIME_SLICED_RE, last)
    if m is None or int(m.group(1)) < 1:
        return None
    return int(m.group(1))


def model_of(name):
    """The GpuModel a type name belongs to (``NVIDIA L40S-4Q`` -> L40S), or
    None."""
    if not name or '-' not in name:
        return None
    return KNOWN_GPUS.get(name.rsplit('-', 1)[0])


def published_max(name, visible_names=()):
    """NVIDIA's per-GPU maximum of the type named ``name``, in equal-size
    mode.

    A known model: ``min(max_vgpus, framebuffer / type framebuffer)``.  An
    unknown one: the same division by the largest framebuffer among
    ``visible_names`` (the types the GPU lists now), which is the GPU's own
    while it is empty and smaller once it holds vGPUs - an estimate that can
    only be low, never high.  None when the name gives no framebuffer.
    """
    size = type_framebuffer_gb(name)
    if size is None:
        return None
    model = model_of(name)
    if model is not None:
        return max(1, min(model.max_vgpus, model.framebuffer_gb // size))
    sizes = [s for s in (type_framebuffer_gb(n) for n in visible_names) if s]
    if not sizes:
        return None
    return max(1, max(sizes) // size)


def complete_types(pf, vfs):
    """The VF Gpu records of one physical GPU with their vendor types
    completed: every type named (from any VF's list - a VF's current type
    is a number only - else NVML's name of that id) and given its maximum
    (NVML's ``nvmlVgpuTypeGetMaxInstances`` where NVML answered for the
    GPU, ``pf.nvml``; else NVIDIA's published one, by name).  Only the
    types the VFs list, never one NVML or a table adds; VFs without the
    vendor interface are returned unchanged."""
    names = {}
    for vf in vfs:
        if vf.vendor_vf is not None \
                and vf.vendor_vf.interface == objects.VENDOR_INTERFACE:
            for mtype in vf.vendor_vf.creatable:
                names.setdefault(mtype.id, mtype.name)
    visible = tuple(n for n in names.values() if n)

    by_nvml = {objects.vendor_type_id(t.id): t
               for t in (pf.nvml.vgpu_types if pf.nvml is not None else ())}

    def complete(mtype):
        nvml = by_nvml.get(mtype.id)
        name = mtype.name or names.get(mtype.id) or (
            nvml.name if nvml is not None else None)
        return records.replace(
            mtype, name=name,
            published_max=(nvml.max_instances if nvml is not None
                           and nvml.max_instances > 0
                           else published_max(name, visible)))

    done = []
    for vf in vfs:
        state = vf.vendor_vf
        if state is not None and state.interface == objects.VENDOR_INTERFACE:
            state = objects.VendorVf(
                creatable=tuple(complete(t) for t in state.creatable),
                current=complete(state.current) if state.current else None)
            vf = records.replace(vf, vendor_vf=state)
        done.append(vf)
    return done


# --- the VFs of the interface -----------------------------------------------

# --- the state file ----------------------------------------------------------

@records.record
class VendorVgpu:
    """One of our vGPUs on the vendor interface (a state file entry)."""

    uuid: str
    vf: objects.PciAddress
    gpu: objects.PciAddress | None
    type_id: str
    start: str | None = None       # None: transient
    params: str | None = None      # vgpu_params to write

    @property
    def persistent(self):
        return self.start is not None

    def device(self):
        return base.VgpuDevice(uuid=self.uuid, parent=self.vf,
                               type_id=self.type_id)

    def to_json(self):
        return {'vf': str(self.vf),
                'gpu': str(self.gpu) if self.gpu else None,
                'type_id': self.type_id, 'start': self.start,
                'params': self.params}


class VendorState(object):
    """``<state_dir>/nvidia-vgpu.json`` under an exclusive ``flock`` of
    ``<state_dir>/nvidia-vgpu.lock``; written to a temporary file and
    renamed, so a crash leaves the old or the new file, never half of one.
    """

    def __init__(self, state_dir):
        if not state_dir or not os.path.isabs(os.fspath(state_dir)):
            raise exception.ConfigError(
                reason='state_dir %r must be an absolute path' % (state_dir,))
        self.state_dir = os.fspath(state_dir)
        self.path = os.path.join(self.state_dir, STATE_NAME)
        self.lock_path = os.path.join(self.state_dir, LOCK_NAME)

    def _error(self, reason):
        return exception.StateError(path=self.path, reason=reason)

    @contextlib.contextmanager
    def locked(self):
        """``{uuid: VendorVgpu}`` to read and change; saved on exit."""
        os.makedirs(self.state_dir, mode=0o700, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                     0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            entries = self._load()
            before = dict(entries)
            yield entries
            if entries != before:
                self._save(entries)
        finally:
            os.close(fd)

    def read(self):
        """A snapshot, read under the lock ({} without creating anything
        when there is no state file yet)."""
        if not os.path.exists(self.path):
            return {}
        with self.locked() as entries:
            return dict(entries)

    def _load(self):
        try:
            with open(self.path, 'rb') as f:
                raw = f.read(_MAX_STATE_BYTES + 1)
        except FileNotFoundError:
            return {}
        except OSError as e:
            raise self._error(e.strerror)
        if len(raw) > _MAX_STATE_BYTES:
            raise self._error('larger than %d bytes' % _MAX_STATE_BYTES)
        try:
            data = json.loads(raw.decode('utf-8'))
        except (UnicodeDecodeError, ValueError) as e:
            raise self._error('not JSON: %s' % e)
        if not isinstance(data, dict) or data.get('version') != \
                STATE_VERSION or not isinstance(data.get('vgpus'), dict):
            raise self._error('not a version %d state file' % STATE_VERSION)
        entries = {}
        for uuid, entry in data['vgpus'].items():
            try:
                uuid = objects.validate_uuid(uuid)
                start = entry.get('start')
                if start is not None and start not in STARTS:
                    raise exception.InvalidInput(reason='start %r' % start)
                params = entry.get('params')
                if params is not None and not isinstance(params, str):
                    raise exception.InvalidInput(reason='params')
                entries[uuid] = VendorVgpu(
                    uuid=uuid, vf=objects.PciAddress.parse(entry['vf']),
                    gpu=(objects.PciAddress.parse(entry['gpu'])
                         if entry.get('gpu') else None),
                    type_id=objects.validate_type_id(entry['type_id']),
                    start=start, params=params)
            except (exception.InvalidInput, KeyError, TypeError,
                    AttributeError) as e:
                raise self._error('entry %r is invalid: %s' % (uuid, e))
        return entries

    def _save(self, entries):
        data = {'version': STATE_VERSION,
                'vgpus': {u: e.to_json() for u, e in sorted(entries.items())}}
        fileutil.write_atomic(self.path, json.dumps(
            data, indent=1, sort_keys=True) + '\n', mode=0o600)


# --- the backend -------------------------------------------------------------

def vf_hostdev(address):
    """``<hostdev type='pci' managed='no'>`` of a VF (see the module doc):
    libvirt must not rebind it, NVIDIA's driver keeps it."""
    return config_xml.pci_hostdev(address, managed=False)


class NvidiaVgpuBackend(base.VgpuKind):
    """vGPUs on VFs through NVIDIA's vendor interface.

    :param sysfs: the host's ``Sysfs``.
    :param state_dir: ``[DEFAULT]/state_dir`` (the state file lives there).
    :param remove_timeout: seconds to keep retrying a busy destroy.
    :param retry_stop: seconds to keep retrying a busy create.
    """

    kind = 'pci'
    name = objects.VENDOR_INTERFACE
    interface = objects.VENDOR_INTERFACE
    binds_parent = True

    @classmethod
    def from_environment(cls, env):
        extra = ({} if env.remove_timeout is None
                 else {'remove_timeout': env.remove_timeout})
        return cls(env.sysfs, env.state_dir, **extra)

    def __init__(self, sysfs, state_dir, remove_timeout=10.0,
                 retry_stop=5.0):
        self.sysfs = sysfs
        self.files = files.VendorFiles(sysfs)
        self.state = VendorState(state_dir)
        self.remove_timeout = remove_timeout
        self.retry_stop = retry_stop

    # -- reading ------------------------------------------------------------

    parents_key = 'vendor_vfs'
    sysfs_names = names.SYSFS_NAMES

    @classmethod
    def parents_now(cls, sysfs):
        return files.VendorFiles(sysfs).vf_names()

    @classmethod
    def read_function(cls, sysfs, address):
        return files.VendorFiles(sysfs).read_vf(address)

    @classmethod
    def complete_types(cls, pf, vfs):
        return complete_types(pf, vfs)

    def hostdev_xml(self, device):
        return vf_hostdev(device.parent)

    def is_parent(self, address):
        """Whether ``address`` is a VF with the vendor interface."""
        return self.files.has_interface(
            objects.PciAddress.parse(address))

    def check_type(self, parent, type_id):
        """ParentGone unless ``parent`` is a VF with the vendor interface;
        UnknownType unless the VF lists ``type_id`` (as creatable now, or as
        its current type) or its GPU holds vGPUs: a GPU in equal-size mode
        lists only the types that fit beside them, so the kernel's answer
        to the create then says whether the type is unknown or does not
        fit (no table of type numbers here: they change between driver
        releases)."""
        parent = objects.PciAddress.parse(parent)
        try:
            number = objects.vendor_type_number(type_id)
        except exception.InvalidTypeId:
            raise exception.UnknownType(type_id=type_id, address=parent)
        if not self.is_parent(parent):
            raise exception.ParentGone(
                address=parent, uuid=None,
                reason='%s has no nvidia/ directory (are its VFs enabled and '
                       'the vGPU manager loaded?)' % parent)
        listed = {n for n, _ in self.files.creatable_types(parent)}
        listed.add(self.files.current_type(parent))
        if number not in listed and not self._gpu_holds_vgpus(parent):
            raise exception.UnknownType(type_id=type_id, address=parent)

    def _gpu_holds_vgpus(self, vf):
        pf = self.sysfs.physfn(vf)
        return any(self.is_parent(other)
                   and self.files.current_type(other)
                   for other in (self.sysfs.virtfns(pf) if pf else (vf,)))

    def available(self, parent, type_id):
        """1 when the VF is free and lists ``type_id`` as creatable, else
        0 (one vGPU per VF)."""
        parent = objects.PciAddress.parse(parent)
        number = objects.vendor_type_number(type_id)
        if self.files.current_type(parent):
            return 0
        return int(any(n == number for n, _ in
                       self.files.creatable_types(parent)))

    def lookup(self, uuid):
        """Our vGPU ``uuid`` as a VgpuDevice (parent: its VF) when it exists
        now, else None."""
        uuid = objects.validate_uuid(uuid)
        entry = self.state.read().get(uuid)
        if entry is None or not self.is_parent(entry.vf):
            return None
        current = self.files.current_type(entry.vf)
        if current != objects.vendor_type_number(entry.type_id):
            return None
        return entry.device()

    def owns(self, uuid):
        """Whether the state file records ``uuid`` (a cheap read of one
        JSON file, absent on hosts that never used the interface)."""
        return uuid in self.state.read()

    def recorded(self, uuid):
        return self.owns(uuid)

    def existing(self, mdevs_by_parent=None):
        return {uuid: (entry.vf, entry.type_id)
                for uuid, entry in self.state.read().items()
                if self.lookup(uuid) is not None}

    def reserved_parents(self):
        return {entry.vf: entry.uuid for entry in self.state.read().values()}

    def vgpu_type(self, parent, type_id):
        """One instance when the VF is free and lists the type, named as
        the VF lists it."""
        number = objects.vendor_type_number(type_id)
        names = dict(self.files.creatable_types(parent))
        return objects.VgpuType(
            id=type_id, name=names.get(number),
            description=None, device_api='vfio-pci',
            available_instances=self.available(parent, type_id))

    def definition(self, uuid):
        """A persistent state entry as a definition (the fields that
        matter: uuid, parent, type_id, start), else None."""
        entry = self.state.read().get(uuid)
        if entry is None or not entry.persistent:
            return None
        return base.VgpuDefinition(
            uuid=entry.uuid, parent=entry.vf, type_id=entry.type_id,
            start=entry.start)

    def choose_parent(self, gpu, type_id):
        return self.choose_vf(gpu, type_id)

    def exists(self, device):
        found = self.lookup(device.uuid)
        return (found is not None and found.parent == device.parent
                and found.type_id == device.type_id)

    def vgpus(self):
        """Every entry of the state file (``{uuid: VendorVgpu}``)."""
        return self.state.read()

    # -- after a reboot (restore) -------------------------------------------

    parent_noun = 'VF'

    def persistent(self):
        return tuple(entry.device() for _, entry
                     in sorted(self.state.read().items())
                     if entry.start == 'auto')

    def recorded_gpus(self):
        return tuple(entry.gpu for entry in self.state.read().values()
                     if entry.gpu is not None)

    def _interface_vfs(self):
        """Every VF with the vendor interface, sorted."""
        found = []
        for name in self.files.vf_names():
            try:
                address = objects.PciAddress.parse(name)
            except exception.InvalidPciAddress:
                continue
            if self.sysfs.physfn(address) is not None:
                found.append(address)
        return sorted(found)

    def boot_cleanup(self, owner_running, dry_run=False):
        """A VF whose type is set for one of our transient vGPUs whose
        guest is not running is reset to 0; a transient entry whose VF
        holds nothing is forgotten; a VF holding a vGPU that is not ours is
        reported, never touched; when whether a guest runs cannot be told,
        nothing is reset."""
        entries = self.state.read()
        vfs = self._interface_vfs()
        notes, reset = self._reset_stale(entries, vfs, owner_running,
                                         dry_run)
        notes.extend(self._forget_gone(entries, vfs, reset, dry_run))
        return notes

    def _reset_stale(self, entries, vfs, owner_running, dry_run):
        """``(notes, UUIDs reset)`` of the VFs that hold a vGPU now."""
        notes, reset = [], set()
        by_vf = {e.vf: e for e in entries.values()}
        for vf in vfs:
            try:
                current = self.files.current_type(vf)
            except exception.SysfsReadError as e:
                notes.append(base.BootNote('failed', str(vf), str(e)))
                continue
            entry = by_vf.get(vf)
            if not current or (entry is not None and entry.persistent):
                continue      # restore reports persistent ones itself
            held = objects.vendor_type_id(current)
            note = self._judge_held(entry, vf, held, owner_running, dry_run)
            if note.action == 'reset':
                reset.add(entry.uuid)
            notes.append(note)
        return notes, reset

    def _judge_held(self, entry, vf, held, owner_running, dry_run):
        """The BootNote of a VF holding type ``held`` for ``entry`` (None:
        not ours), after resetting it when its guest is gone."""
        if entry is None:
            return base.BootNote('skipped', str(vf), 'holds %s, not one of '
                                 'ours: left alone' % held)
        running = owner_running(entry.uuid)
        if running is None:
            return base.BootNote('skipped', entry.uuid, '%s on VF %s: cannot '
                                 'tell whether its guest runs; kept'
                                 % (held, vf))
        if running:
            return base.BootNote('ok', entry.uuid, '%s on VF %s is in use by '
                                 'a running guest' % (held, vf))
        if dry_run:
            return base.BootNote(
                'would', entry.uuid, 'would reset VF %s (write 0 to its %s: '
                'it holds %s for a guest that is not running)'
                % (vf, names.CURRENT_TYPE, held))
        try:
            self.remove(entry.uuid)
        except exception.LibvirtGpuError as e:
            return base.BootNote('failed', entry.uuid, str(e))
        return base.BootNote('reset', entry.uuid, 'reset VF %s (held %s for '
                             'a guest that is not running)' % (vf, held))

    def _forget_gone(self, entries, vfs, reset, dry_run):
        """Notes of the transient entries whose VF holds nothing now."""
        notes = []
        present = set(vfs)
        for uuid, entry in sorted(entries.items()):
            if entry.persistent or uuid in reset:
                continue
            gone = entry.vf not in present
            if not gone:
                try:
                    gone = not self.files.current_type(entry.vf)
                except exception.SysfsReadError:
                    gone = False
            if not gone:
                continue
            if dry_run:
                notes.append(base.BootNote(
                    'would', uuid, 'would forget it: its VF %s holds no '
                    'vGPU any more' % entry.vf))
                continue
            with self.state.locked() as live:
                if uuid in live and not live[uuid].persistent:
                    del live[uuid]
            notes.append(base.BootNote(
                'forgot', uuid, 'its VF %s holds no vGPU any more'
                % entry.vf))
        return notes

    def choose_vf(self, gpu, type_id, exclude=()):
        """The first VF of the physical GPU ``gpu`` that is free (holds no
        vGPU, is not recorded for one of ours, not in ``exclude``) and lists
        ``type_id`` as creatable; NoCapacity when there is none."""
        gpu = objects.PciAddress.parse(gpu)
        number = objects.vendor_type_number(type_id)
        taken = {e.vf for e in self.state.read().values()}
        taken.update(objects.PciAddress.parse(a) for a in exclude)
        looked = 0
        for vf in self.sysfs.virtfns(gpu):
            if vf in taken or not self.is_parent(vf):
                continue
            looked += 1
            if self.files.current_type(vf):
                continue
            if any(n == number for n, _ in
                   self.files.creatable_types(vf)):
                return vf
        raise exception.NoCapacity(
            uuid=None, type_id=type_id, where='the GPU %s' % gpu,
            reason='none of its %d free VFs lists the type as creatable (the '
                   'GPU is full, or holds vGPUs of another framebuffer size)'
                   % looked)

    # -- create -------------------------------------------------------------

    def prepare(self, device, start=None, params=None):
        """Create the vGPU on its VF (``device.parent``).  True: created
        now; False: the VF already held it for us.  Idempotent.  A VF that
        holds a vGPU we did not record is an MdevConflict.

        ``start``/``params`` are kept in the state file (``define``).
        """
        vf = device.parent
        number = objects.vendor_type_number(device.type_id)
        self.check_type(vf, device.type_id)
        added = self._claim(device, start, params)
        try:
            current = self.files.current_type(vf)
            if current == number and not added:
                return False          # ours, made earlier
            if current:
                # A vGPU we have no record of is someone else's (nvidia-smi,
                # another tool): never taken over, never removed by us.
                raise exception.MdevConflict(
                    uuid=device.uuid,
                    existing_type=objects.vendor_type_id(current),
                    existing_parent=vf, type_id=device.type_id, parent=vf)
            self._write_type(device, vf, number)
            entry = self.state.read().get(device.uuid)
            if entry is not None and entry.params:
                self.files.write_params(vf, entry.params)
            return True
        except BaseException:
            if added:
                with self.state.locked() as entries:
                    entries.pop(device.uuid, None)
            raise

    def _claim(self, device, start, params):
        """Record ``device`` on its VF; True when the entry is new.  A VF
        recorded for another of our vGPUs, or this UUID on another VF, is
        an MdevConflict."""
        vf = device.parent
        with self.state.locked() as entries:
            for other in entries.values():
                if other.vf == vf and other.uuid != device.uuid:
                    raise exception.MdevConflict(
                        uuid=device.uuid, existing_type=other.type_id,
                        existing_parent='%s (as vGPU %s)' % (vf, other.uuid),
                        type_id=device.type_id, parent=vf)
            old = entries.get(device.uuid)
            if old is not None and (old.vf != vf
                                    or old.type_id != device.type_id):
                raise exception.MdevConflict(
                    uuid=device.uuid, existing_type=old.type_id,
                    existing_parent=old.vf, type_id=device.type_id,
                    parent=vf)
            entries[device.uuid] = VendorVgpu(
                uuid=device.uuid, vf=vf, gpu=self.sysfs.physfn(vf),
                type_id=device.type_id,
                start=start if start is not None else (
                    old.start if old else None),
                params=params if params is not None else (
                    old.params if old else None))
            return old is None

    def _write_type(self, device, vf, number):
        # <VF>/nvidia/current_vgpu_type  <-  "1145"
        try:
            base.retry_transient(lambda: self.files.set_current_type(
                vf, number), stop_after=self.retry_stop)
        except exception.UnsafePath:
            raise
        except exception.SysfsWriteError as e:
            code = e.kwargs.get('errno')
            name = errno.errorcode.get(code, str(code))
            if code in _GONE_ERRNOS or not self.is_parent(vf):
                raise exception.ParentGone(
                    address=vf, uuid=device.uuid,
                    reason='the driver answered %s' % name)
            if not self.available(vf, device.type_id):
                raise exception.NoCapacity(
                    uuid=device.uuid, type_id=device.type_id,
                    where='the GPU of VF %s' % vf,
                    reason='the driver answered %s and no longer lists the '
                           'type as creatable' % name)
            raise exception.MdevCreateFailed(
                uuid=device.uuid, type_id=device.type_id, parent=vf,
                reason='the driver answered %s' % name)
        if self.files.current_type(vf) != number:
            raise exception.MdevCreateFailed(
                uuid=device.uuid, type_id=device.type_id, parent=vf,
                reason='current_vgpu_type does not read %d after the write'
                % number)

    # -- remove -------------------------------------------------------------

    def release(self, device):
        return self.remove(device.uuid)

    def remove(self, uuid):
        """Destroy our vGPU ``uuid`` (write 0); False when it did not
        exist.  A persistent one keeps its state entry (it is defined, not
        running); a transient one loses it."""
        uuid = objects.validate_uuid(uuid)
        entry = self.state.read().get(uuid)
        if entry is None:
            return False
        removed = False
        if self.is_parent(entry.vf):
            current = self.files.current_type(entry.vf)
            if current == objects.vendor_type_number(entry.type_id):
                self.reset_vf(entry.vf, uuid=uuid)
                removed = True
        if not entry.persistent:
            with self.state.locked() as entries:
                if uuid in entries and not entries[uuid].persistent:
                    del entries[uuid]
        return removed

    def reset_vf(self, vf, uuid=None):
        """Write 0 to a VF's ``current_vgpu_type``, retrying while the
        driver is busy (it may still be releasing the guest's vGPU) for up
        to ``remove_timeout`` seconds; MdevRemoveFailed after that."""
        vf = objects.PciAddress.parse(vf)
        label = uuid or 'on VF %s' % vf
        try:
            base.retry_transient(
                lambda: self.files.set_current_type(vf, 0),
                stop_after=self.remove_timeout)
        except exception.UnsafePath:
            raise
        except exception.SysfsWriteError as e:
            code = e.kwargs.get('errno')
            if code in _GONE_ERRNOS:
                return        # the VF went away: the vGPU with it
            raise exception.MdevRemoveFailed(
                uuid=label, reason='the driver answered %s for %.0f s; is a '
                'guest still using VF %s?' % (
                    errno.errorcode.get(code, code), self.remove_timeout, vf))
        deadline = time.monotonic() + self.remove_timeout
        while self.files.current_type(vf) != 0:
            if time.monotonic() >= deadline:
                raise exception.MdevRemoveFailed(
                    uuid=label, reason='current_vgpu_type of %s is not 0 '
                                       'after the write' % vf)
            time.sleep(0.05)

    # -- persistence ----------------------------------------------------------

    def define(self, device, start='auto', params=None):
        """Make ``device`` persistent: recorded with ``start`` (``auto``:
        ``libvirt-gpu restore`` creates it at boot) without creating it."""
        if start not in STARTS:
            raise exception.InvalidInput(reason='start must be auto or '
                                                'manual, not %r' % (start,))
        self.check_type(device.parent, device.type_id)
        self._claim(device, start, params)

    def undefine(self, uuid):
        """Forget that ``uuid`` is persistent; False when it was not.  An
        existing vGPU stays (transient) until it is removed."""
        uuid = objects.validate_uuid(uuid)
        with self.state.locked() as entries:
            entry = entries.get(uuid)
            if entry is None or not entry.persistent:
                return False
            entries[uuid] = records.replace(entry, start=None)
        if self.lookup(uuid) is None:
            with self.state.locked() as entries:
                entries.pop(uuid, None)
        return True
