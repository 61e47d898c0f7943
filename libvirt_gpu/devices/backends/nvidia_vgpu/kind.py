"""The vendor interface as a vGPU kind (``NvidiaVgpuBackend``): see the
package's doc for the interface, ``table`` for NVIDIA's published types,
``statefile`` for our record of the vGPUs.
"""

from __future__ import annotations

import errno
import time

from libvirt_gpu.devices.backends import base
from libvirt_gpu.devices import capabilities
from libvirt_gpu.virt import config_xml
from libvirt_gpu.devices.backends.nvidia_vgpu import files
from libvirt_gpu.devices.backends.nvidia_vgpu import names
from libvirt_gpu.devices.backends.nvidia_vgpu import statefile
from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.util import records

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    from libvirt_gpu.devices import capacity
    from libvirt_gpu.devices import nvml as nvml_mod
    from libvirt_gpu.devices.sysfs import Sysfs
    from libvirt_gpu.virt.config_xml import DomainDevices

    _Entries = Mapping[objects.Uuid, statefile.VendorVgpu]

_GONE_ERRNOS = (errno.ENODEV, errno.ENOENT)


# --- the backend -------------------------------------------------------------

def vf_hostdev(address: objects.PciAddress) -> str:
    """``<hostdev type='pci' managed='no'>`` of a VF (see the module doc):
    libvirt must not rebind it, NVIDIA's driver keeps it."""
    return config_xml.pci_hostdev(address, managed=False)


class NvidiaVgpuBackend(base.VgpuKind, capabilities.BindsParent,
                        capabilities.WatchedParents, capabilities.SriovGpus,
                        capabilities.VendorFunctions, capabilities.Recorded,
                        capabilities.Carvable, capabilities.DriverRooms,
                        capabilities.LayoutDriver):
    """vGPUs on VFs through NVIDIA's vendor interface.

    :param sysfs: the host's ``Sysfs``.
    :param state_dir: ``[DEFAULT]/state_dir`` (the state file lives there).
    :param remove_timeout: seconds to keep retrying a busy destroy.
    :param retry_stop: seconds to keep retrying a busy create.
    """

    name = objects.VENDOR_INTERFACE
    interface = objects.VENDOR_INTERFACE

    @classmethod
    def from_parts(cls, parts: base.KindParts) -> NvidiaVgpuBackend:
        extra = ({} if parts.remove_timeout is None
                 else {'remove_timeout': parts.remove_timeout})
        return cls(parts.sysfs, parts.state_dir, nvml=parts.nvml, **extra)

    def __init__(self, sysfs: Sysfs, state_dir: str,
                 remove_timeout: float = 10.0, retry_stop: float = 5.0,
                 nvml: nvml_mod.Nvml | None = None) -> None:
        self.sysfs = sysfs
        self.nvml = nvml          # nvml.Nvml, or None: no room is read
        self.files = files.VendorFiles(sysfs)
        self.state = statefile.VendorState(state_dir)
        self.remove_timeout = remove_timeout
        self.retry_stop = retry_stop

    # -- reading ------------------------------------------------------------

    parents_key = 'vendor_vfs'
    sysfs_names = names.SYSFS_NAMES

    @classmethod
    def parents_now(cls, sysfs: Sysfs) -> list[str]:
        return files.VendorFiles(sysfs).vf_names()

    @classmethod
    def sriov_pfs(cls, sysfs: Sysfs) -> list[objects.PciAddress]:
        """NVIDIA's SR-IOV GPUs: the interface lives on their VFs."""
        return base.nvidia_sriov_pfs(sysfs)

    @classmethod
    def read_function(cls, sysfs: Sysfs, address: objects.PciAddress
                      ) -> objects.VendorVf | None:
        return files.VendorFiles(sysfs).read_vf(address)

    @classmethod
    def complete_types(cls, pf: objects.Gpu, vfs: Sequence[objects.Gpu]
                       ) -> list[objects.Gpu]:
        # NVIDIA's table only where discovery completes types (the hook
        # never does: it imports nothing it does not use)
        from libvirt_gpu.devices.backends.nvidia_vgpu import table
        return table.complete_types(pf, vfs)

    def hostdev_xml(self, device: base.VgpuDevice) -> str:
        return vf_hostdev(device.parent)

    def in_devices(self, devices: DomainDevices, uuid: objects.Uuid,
                   parent: objects.PciAddress | None) -> bool:
        """The guest's ``<hostdev type='pci'>`` names the VF."""
        return (parent is not None and parent in devices.pci_addresses
                and self.is_parent(parent))

    def is_parent(self, address: objects.PciAddress) -> bool:
        """Whether ``address`` is a VF with the vendor interface."""
        return self.files.has_interface(
            objects.typed(address, objects.PciAddress, 'address'))

    def check_type(self, parent: objects.PciAddress,
                   type_id: objects.TypeId) -> None:
        """ParentGone unless ``parent`` is a VF with the vendor interface;
        UnknownType unless the VF lists ``type_id`` (as creatable now, or as
        its current type) or its GPU holds vGPUs: a GPU in equal-size mode
        lists only the types that fit beside them, so the kernel's answer
        to the create then says whether the type is unknown or does not
        fit (no table of type numbers here: they change between driver
        releases)."""
        objects.typed(parent, objects.PciAddress, 'parent')
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

    def _gpu_holds_vgpus(self, vf: objects.PciAddress) -> bool:
        pf = self.sysfs.physfn(vf)
        return any(self.is_parent(other)
                   and self.files.current_type(other)
                   for other in (self.sysfs.virtfns(pf) if pf else (vf,)))

    def available(self, parent: objects.PciAddress,
                  type_id: objects.TypeId) -> int:
        """1 when the VF is free and lists ``type_id`` as creatable, else
        0 (one vGPU per VF)."""
        objects.typed(parent, objects.PciAddress, 'parent')
        number = objects.vendor_type_number(type_id)
        if self.files.current_type(parent):
            return 0
        return int(any(n == number for n, _ in
                       self.files.creatable_types(parent)))

    def lookup(self, uuid: objects.Uuid) -> base.VgpuDevice | None:
        """Our vGPU ``uuid`` as a VgpuDevice (parent: its VF) when it exists
        now, else None."""
        objects.typed(uuid, objects.Uuid, 'uuid')
        entry = self.state.read().get(uuid)
        if entry is None or not self.is_parent(entry.vf):
            return None
        current = self.files.current_type(entry.vf)
        if current != objects.vendor_type_number(entry.type_id):
            return None
        return entry.device()

    def owns(self, uuid: objects.Uuid) -> bool:
        """Whether the state file records ``uuid`` (a cheap read of one
        JSON file, absent on hosts that never used the interface)."""
        return uuid in self.state.read()

    def recorded(self, uuid: objects.Uuid) -> bool:
        return self.owns(uuid)

    def existing(self, mdevs_by_parent: base.MdevsByParent | None = None
                 ) -> base.Existing:
        return {uuid: (entry.vf, entry.type_id)
                for uuid, entry in self.state.read().items()
                if self.lookup(uuid) is not None}

    def reserved_parents(self) -> dict[objects.PciAddress, objects.Uuid]:
        return {entry.vf: entry.uuid for entry in self.state.read().values()}

    def vgpu_type(self, parent: objects.PciAddress,
                  type_id: objects.TypeId) -> objects.VgpuType:
        """One instance when the VF is free and lists the type, named as
        the VF lists it."""
        number = objects.vendor_type_number(type_id)
        names = dict(self.files.creatable_types(parent))
        return objects.VgpuType(
            id=type_id, name=names.get(number),
            description=None, device_api='vfio-pci',
            available_instances=self.available(parent, type_id))

    def definition(self, uuid: objects.Uuid) -> base.VgpuDefinition | None:
        """A persistent state entry as a definition (the fields that
        matter: uuid, parent, type_id, start), else None."""
        entry = self.state.read().get(uuid)
        if entry is None or entry.start is None:     # not persistent
            return None
        return base.VgpuDefinition(
            uuid=entry.uuid, parent=entry.vf, type_id=entry.type_id,
            start=entry.start, source='the state file %s' % self.state.path)

    def choose_parent(self, gpu: objects.PciAddress,
                      type_id: objects.TypeId) -> objects.PciAddress:
        return self.choose_vf(gpu, type_id)

    def vgpus(self) -> dict[objects.Uuid, statefile.VendorVgpu]:
        """Every entry of the state file (``{uuid: VendorVgpu}``)."""
        return self.state.read()

    # -- after a reboot (restore) -------------------------------------------

    def restorable(self) -> tuple[base.Restorable, ...]:
        """Each ``auto`` entry of the state file, on its VF."""
        return tuple(
            base.Restorable(uuid=uuid, device=entry.device(),
                            detail='%s on VF %s' % (entry.type_id, entry.vf))
            for uuid, entry in sorted(self.state.read().items())
            if entry.start == 'auto')

    def recorded_gpus(self) -> tuple[objects.PciAddress, ...]:
        return tuple(entry.gpu for entry in self.state.read().values()
                     if entry.gpu is not None)

    def _interface_vfs(self) -> list[objects.PciAddress]:
        """Every VF with the vendor interface, sorted."""
        found = []
        for address in self.files.vf_addresses():
            if self.sysfs.physfn(address) is not None:
                found.append(address)
        return sorted(found)

    def boot_cleanup(self,
                     owner_running: Callable[[objects.Uuid], bool | None],
                     dry_run: bool = False) -> list[base.BootNote]:
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

    def _reset_stale(self, entries: _Entries,
                     vfs: Sequence[objects.PciAddress],
                     owner_running: Callable[[objects.Uuid], bool | None],
                     dry_run: bool
                     ) -> tuple[list[base.BootNote], set[objects.Uuid]]:
        """``(notes, UUIDs reset)`` of the VFs that hold a vGPU now."""
        notes: list[base.BootNote] = []
        reset: set[objects.Uuid] = set()
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
            if note.action == 'reset' and entry is not None:
                reset.add(entry.uuid)
            notes.append(note)
        return notes, reset

    def _judge_held(self, entry: statefile.VendorVgpu | None,
                    vf: objects.PciAddress, held: objects.TypeId,
                    owner_running: Callable[[objects.Uuid], bool | None],
                    dry_run: bool) -> base.BootNote:
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

    def _forget_gone(self, entries: _Entries,
                     vfs: Sequence[objects.PciAddress],
                     reset: set[objects.Uuid],
                     dry_run: bool) -> list[base.BootNote]:
        """Notes of the transient entries whose VF holds nothing now."""
        notes: list[base.BootNote] = []
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

    # -- layouts (host.layout_apply) ----------------------------------

    def layout_ready(self, vf: objects.PciAddress) -> bool:
        return self.is_parent(vf)

    def layout_vgpus(self, gpu: objects.PciAddress
                     ) -> tuple[objects.PciAddress, ...]:
        objects.typed(gpu, objects.PciAddress, 'gpu')
        return tuple(vf for vf in self.sysfs.virtfns(gpu)
                     if self.files.has_interface(vf)
                     and self.files.current_type(vf))

    def room(self, gpu: objects.PciAddress, type_id: objects.TypeId
             ) -> capacity.DriverRoom | None:
        """The driver's room for ``type_id`` on the physical GPU ``gpu``
        (``capacity.DriverRoom``) when it is in MIG or mixed-size mode;
        None in equal-size mode or without NVML (free VFs and the type's
        maximum then say it, ``capacity.vgpu_total``), and on a GPU
        without VFs (no vendor-interface vGPU there: NVML is not asked)."""
        objects.typed(gpu, objects.PciAddress, 'gpu')
        if self.nvml is None:
            return None
        vfs = self.sysfs.virtfns(gpu)
        if not vfs:
            return None
        from libvirt_gpu.devices import capacity
        from libvirt_gpu.devices import nvml as nvml_mod
        number = objects.vendor_type_number(type_id)
        held = [(vf, objects.vendor_type_id(current))
                for vf in vfs if self.is_parent(vf)
                for current in (self.files.current_type(vf),) if current]
        used = sum(1 for _, t in held if t == type_id)
        try:
            with self.nvml.session() as session:
                if session.mig_mode(gpu):
                    facts = {t.type_id: t
                             for t in session.vgpu_types(gpu)}
                    profiles = session.gi_profiles(gpu)
                    gis = session.gpu_instances(gpu, profiles)
                    mine = facts.get(type_id)
                    sizes = [(self.files.where(vf)[0],
                              getattr(facts.get(t), 'framebuffer_mib', None))
                             for vf, t in held]
                    rooms = capacity.gi_rooms(
                        gis, {p.id: p.name for p in profiles},
                        mine.gi_profile_id if mine is not None else None,
                        mine.max_per_gi if mine is not None else 0,
                        mine.framebuffer_mib if mine is not None else None,
                        sizes)
                    return capacity.DriverRoom(
                        mode=capacity.MODE_MIG, type_id=type_id, used=used,
                        gis=rooms)
                if session.mixed_size(gpu):
                    found = session.creatable_placements(gpu, number)
                    size, free = found if found is not None else (None, ())
                    return capacity.DriverRoom(
                        mode=capacity.MODE_MIXED, type_id=type_id,
                        used=used, placement_size=size, placements=free)
        except nvml_mod.NvmlUnavailable:
            return None
        return None

    def choose_vf(self, gpu: objects.PciAddress, type_id: objects.TypeId,
                  exclude: Iterable[objects.PciAddress] = ()
                  ) -> objects.PciAddress:
        """The first VF of the physical GPU ``gpu`` that is free (holds no
        vGPU, is not recorded for one of ours, not in ``exclude``) and lists
        ``type_id`` as creatable; NoCapacity when there is none."""
        objects.typed(gpu, objects.PciAddress, 'gpu')
        number = objects.vendor_type_number(type_id)
        taken = {e.vf for e in self.state.read().values()}
        taken.update(objects.typed(a, objects.PciAddress, 'exclude[]')
                     for a in exclude)
        looked = 0
        vfs: Sequence[objects.PciAddress] = self.sysfs.virtfns(gpu)
        for vf in vfs:
            if vf in taken or not self.is_parent(vf) \
                    or self.files.current_type(vf):
                continue
            looked += 1
            if any(n == number for n, _ in
                   self.files.creatable_types(vf)):
                return vf
        raise exception.NoCapacity(
            uuid=None, type_id=type_id, where='the GPU %s' % gpu,
            reason='none of its %d free VFs lists the type as creatable (the '
                   'GPU is full, or holds vGPUs of another framebuffer size)'
                   % looked)

    # -- create -------------------------------------------------------------

    def prepare(self, device: base.VgpuDevice, start: str | None = None,
                params: str | None = None) -> bool:
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
            self._record_where(device.uuid, vf)
            return True
        except BaseException:
            if added:
                with self.state.locked() as entries:
                    entries.pop(device.uuid, None)
            raise

    def _record_where(self, uuid: objects.Uuid,
                      vf: objects.PciAddress) -> None:
        """Late binding: the driver, not us, chose the GPU instance (or
        placement) of the vGPU just made on ``vf``; read it back and keep
        it with our record of the vGPU."""
        gi_id, placement = self.files.where(vf)
        if gi_id is None and placement is None:
            return
        with self.state.locked() as entries:
            entry = entries.get(uuid)
            if entry is not None:
                entries[uuid] = records.replace(entry, gi_id=gi_id,
                                                placement=placement)

    def _claim(self, device: base.VgpuDevice, start: str | None,
               params: str | None) -> bool:
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
            entries[device.uuid] = statefile.VendorVgpu(
                uuid=device.uuid, vf=vf, gpu=self.sysfs.physfn(vf),
                type_id=device.type_id,
                start=start if start is not None else (
                    old.start if old else None),
                params=params if params is not None else (
                    old.params if old else None))
            return old is None

    def _write_type(self, device: base.VgpuDevice, vf: objects.PciAddress,
                    number: int) -> None:
        # <VF>/nvidia/current_vgpu_type  <-  "1145"
        try:
            base.retry_transient(lambda: self.files.set_current_type(
                vf, number), stop_after=self.retry_stop)
        except exception.UnsafePath:
            raise
        except exception.SysfsWriteError as e:
            code = e.kwargs.get('errno')
            name = base.errno_name(code)
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

    # -- carving for another program (devices.carving) ---------------------

    def held_type(self, parent: objects.PciAddress) -> objects.TypeId | None:
        objects.typed(parent, objects.PciAddress, 'parent')
        current = self.files.current_type(parent)
        return objects.vendor_type_id(current) if current else None

    def write_type(self, parent: objects.PciAddress,
                   type_id: objects.TypeId) -> None:
        """Write ``type_id`` to the VF's type file, recording nothing (a
        VF carved for Nova is not one of our vGPUs)."""
        objects.typed(parent, objects.PciAddress, 'parent')
        number = objects.vendor_type_number(type_id)
        self.check_type(parent, type_id)
        try:
            base.retry_transient(lambda: self.files.set_current_type(
                parent, number), stop_after=self.retry_stop)
        except exception.UnsafePath:
            raise
        except exception.SysfsWriteError as e:
            code = e.kwargs.get('errno')
            raise exception.MdevCreateFailed(
                uuid='for Nova', type_id=type_id, parent=parent,
                reason='the driver answered %s'
                % base.errno_name(code))
        if self.files.current_type(parent) != number:
            raise exception.MdevCreateFailed(
                uuid='for Nova', type_id=type_id, parent=parent,
                reason='%s does not read %d after the write'
                % (names.CURRENT_TYPE, number))

    def clear_type(self, parent: objects.PciAddress) -> None:
        """Write 0 to the VF's type file (``reset_vf``)."""
        self.reset_vf(objects.typed(parent, objects.PciAddress, 'parent'))

    # -- remove -------------------------------------------------------------

    def remove(self, uuid: objects.Uuid) -> bool:
        """Destroy our vGPU ``uuid`` (write 0); False when it did not
        exist.  A persistent one keeps its state entry (it is defined, not
        running); a transient one loses it."""
        objects.typed(uuid, objects.Uuid, 'uuid')
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

    def reset_vf(self, vf: objects.PciAddress,
                 uuid: objects.Uuid | None = None) -> None:
        """Write 0 to a VF's ``current_vgpu_type``, retrying while the
        driver is busy (it may still be releasing the guest's vGPU) for up
        to ``remove_timeout`` seconds; MdevRemoveFailed after that."""
        objects.typed(vf, objects.PciAddress, 'vf')
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
                    base.errno_name(code), self.remove_timeout, vf))
        deadline = time.monotonic() + self.remove_timeout
        while self.files.current_type(vf) != 0:
            if time.monotonic() >= deadline:
                raise exception.MdevRemoveFailed(
                    uuid=label, reason='current_vgpu_type of %s is not 0 '
                                       'after the write' % vf)
            time.sleep(0.05)

    # -- persistence ----------------------------------------------------------

    def define(self, device: base.VgpuDevice, start: str = 'auto',
               params: str | None = None) -> None:
        """Make ``device`` persistent: recorded with ``start`` (``auto``:
        ``libvirt-gpu restore`` creates it at boot) without creating it."""
        if start not in statefile.STARTS:
            raise exception.InvalidInput(reason='start must be auto or '
                                                'manual, not %r' % (start,))
        self.check_type(device.parent, device.type_id)
        self._claim(device, start, params)

    def undefine(self, uuid: objects.Uuid) -> bool:
        """Forget that ``uuid`` is persistent; False when it was not.  An
        existing vGPU stays (transient) until it is removed."""
        objects.typed(uuid, objects.Uuid, 'uuid')
        with self.state.locked() as entries:
            entry = entries.get(uuid)
            if entry is None or not entry.persistent:
                return False
            entries[uuid] = records.replace(entry, start=None)
        if self.lookup(uuid) is None:
            with self.state.locked() as entries:
                entries.pop(uuid, None)
        return True
