"""Classic mediated devices (mdev): NVIDIA vGPU before vGPU 17, Intel GVT-g.

The kernel's interface (``Sysfs`` is the only way in)::

    class/mdev_bus/0000:af:00.0 -> ../../devices/.../0000:af:00.0
    bus/pci/devices/0000:af:00.0/mdev_supported_types/nvidia-223/
        available_instances   6
        create                write a UUID: the mdev appears
    bus/mdev/devices/<uuid> -> ../../../devices/.../0000:af:00.0/<uuid>
        mdev_type -> ../mdev_supported_types/nvidia-223
        remove                write 1: the mdev goes away

Creating follows mdevctl: check the parent, then the type, then the
capacity, each with its own error, and then let the kernel decide - reading
``available_instances`` and writing ``create`` is a race, so the write's
answer is the truth (EEXIST: the UUID is taken; ENODEV: the parent is going
away; EUSERS/ENOSPC, or EINVAL from NVIDIA: no capacity).

With a libvirt connection (``host``; never in the hook), create and remove
go through ``virNodeDeviceCreateXML`` / ``virNodeDevice.destroy`` so
libvirt's view stays current; where libvirt cannot (VIR_ERR_NO_SUPPORT) the
sysfs path is used.  Persistent definitions use ``virNodeDeviceDefineXML``
or, without libvirt, mdevctl's own files::

    /etc/mdevctl.d/0000:af:00.0/<uuid>
    {"mdev_type": "nvidia-223", "start": "manual", "attrs": []}

Only transient answers are retried (EBUSY/EAGAIN, a libvirt operation
timeout), a few times with a growing wait; tenacity is imported only then,
because the qemu hook would pay for importing it on every guest start
(``bench/hook.py`` measures the hook).
"""

from __future__ import annotations

import errno
import os
import time

from libvirt_gpu.devices.backends import base
from libvirt_gpu.devices import capabilities
from libvirt_gpu.virt import config_xml
from libvirt_gpu import exception
from libvirt_gpu.util import fileutil
from libvirt_gpu.util import jsonutil
from libvirt_gpu import objects
from libvirt_gpu.devices import sysfs as sysfs_mod

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from libvirt_gpu.virt.config_xml import DomainDevices

MDEVCTL_DIR = '/etc/mdevctl.d'
MDEVCTL_STARTS = ('auto', 'manual')
_MAX_DEFINITION_BYTES = 64 * 1024

# Answers of a full parent: the mdev core says EUSERS (older kernels
# ENOSPC); NVIDIA's driver says EINVAL.
_NO_CAPACITY_ERRNOS = (errno.EUSERS, errno.ENOSPC, errno.EDQUOT)
_GONE_ERRNOS = (errno.ENOENT, errno.ENODEV)


# An mdevctl definition (``/etc/mdevctl.d/<parent>/<uuid>``).
MdevDefinition = base.VgpuDefinition


def _wait_for(predicate: Callable[[], bool], timeout: float) -> bool:
    """Poll ``predicate`` (at once, then with growing sleeps) until it is
    true or ``timeout`` seconds pass; returns its last value."""
    deadline = time.monotonic() + timeout
    delay = 0.0002
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return predicate()
        time.sleep(delay)
        delay = min(delay * 1.5, 0.05)


class MdevBackend(base.VgpuKind, capabilities.Persistent,
                  capabilities.WatchedParents, capabilities.SriovGpus):
    """Creates and removes mdevs; ``sysfs`` is the host's ``Sysfs``.

    :param host: a ``host.Host`` to create/remove through libvirt, or None
        (the hook: sysfs only).
    :param mdevctl_dir: where mdevctl keeps definitions.
    :param appear_timeout: seconds to wait for ``bus/mdev/devices/<uuid>``
        after the kernel accepted a create (at once on a real kernel).
    :param remove_timeout: seconds to wait for an mdev to go away after a
        remove, and for a busy remove to be accepted (vendor drivers clean
        up their own mdevs shortly after a guest exits).
    """

    name = 'mdev'
    noun = 'mdev'
    parents_key = 'mdev_parents'
    places = (base.Place('mdevctl_dir', MDEVCTL_DIR),)

    @classmethod
    def parents_now(cls, sysfs: sysfs_mod.Sysfs) -> list[str]:
        """Names under ``<root>/class/mdev_bus`` (the mdev parents now)."""
        return sorted(sysfs.listdir(sysfs.path(*sysfs_mod.MDEV_BUS),
                                    optional=True))

    @classmethod
    def from_parts(cls, parts: base.KindParts) -> MdevBackend:
        extra = ({} if parts.remove_timeout is None
                 else {'remove_timeout': parts.remove_timeout})
        return cls(parts.sysfs, host=parts.host,
                   mdevctl_dir=parts.place('mdevctl_dir'), **extra)

    @classmethod
    def sriov_pfs(cls, sysfs: sysfs_mod.Sysfs) -> list[objects.PciAddress]:
        """NVIDIA's SR-IOV GPUs: from Ampere on, classic mdevs live on
        their VFs."""
        return base.nvidia_sriov_pfs(sysfs)

    def __init__(self, sysfs: sysfs_mod.Sysfs,
                 host: base.MdevHost | None = None,
                 mdevctl_dir: str = MDEVCTL_DIR,
                 appear_timeout: float = 5.0, remove_timeout: float = 10.0,
                 retry_stop: float = 5.0) -> None:
        self.sysfs = sysfs
        self.host = host
        self.mdevctl_dir = mdevctl_dir
        self.appear_timeout = appear_timeout
        self.remove_timeout = remove_timeout
        self.retry_stop = retry_stop

    # -- reading --------------------------------------------------------

    def hostdev_xml(self, device: base.VgpuDevice) -> str:
        return config_xml.mdev_hostdev(device.uuid)

    def _exists_path(self, path: str) -> bool:
        # A stat of a path Sysfs built from validated parts.
        return os.path.lexists(path)

    def lookup(self, uuid: objects.Uuid) -> base.VgpuDevice | None:
        """The existing mdev ``uuid`` (validated by the caller, see
        ``objects.Uuid.parse``) as a VgpuDevice, or None.

        Reads ``bus/mdev/devices/<uuid>`` (a link into its parent's
        directory, which must resolve under the sysfs root) and its
        ``mdev_type`` link; both names are parsed here, where they enter
        the program (InvalidTypeId for a type link that is no type id).
        """
        path = self.sysfs.mdev_dir(uuid)
        if not self._exists_path(path):
            return None
        real = self.sysfs.resolved_under_root(path)
        type_id = self.sysfs.link_name(os.path.join(path, 'mdev_type'))
        if type_id is None:
            if not self._exists_path(path):
                return None       # removed while we looked
            raise exception.SysfsReadError(
                path=os.path.join(path, 'mdev_type'),
                reason='mdev without a type link')
        try:
            parent = objects.PciAddress.parse(
                os.path.basename(os.path.dirname(real)))
        except exception.InvalidPciAddress:
            raise exception.SysfsReadError(
                path=path, reason='the parent of this mdev is not a PCI '
                                  'device')
        return base.VgpuDevice(uuid=uuid, parent=parent,
                               type_id=objects.TypeId.parse(type_id))

    def owns(self, uuid: objects.Uuid) -> bool:
        return self.lookup(uuid) is not None

    def existing(self, mdevs_by_parent: base.MdevsByParent | None = None
                 ) -> base.Existing:
        if mdevs_by_parent is None:
            mdevs_by_parent = self.sysfs.mdevs_by_parent()
        return {m.uuid: (parent, m.type_id)
                for parent, mdevs in mdevs_by_parent.items()
                for m in mdevs}

    def in_devices(self, devices: DomainDevices, uuid: objects.Uuid,
                   parent: objects.PciAddress | None) -> bool:
        """The guest's ``<hostdev type='mdev'>`` names the UUID."""
        return uuid in devices.mdev_uuids

    def is_parent(self, address: objects.PciAddress) -> bool:
        """``class/mdev_bus/<address>`` exists."""
        return self._exists_path(self.sysfs.path(
            'class', 'mdev_bus',
            str(objects.typed(address, objects.PciAddress, 'address'))))

    def check_type(self, parent: objects.PciAddress,
                   type_id: objects.TypeId) -> None:
        """Parent first, then type: ParentGone or UnknownType, else None."""
        objects.typed(type_id, objects.TypeId, 'type_id')
        if not self.is_parent(parent):
            raise exception.ParentGone(
                address=parent, uuid=None,
                reason='no %s in the sysfs class mdev_bus (is the GPU '
                       'bound to its vGPU driver?)' % parent)
        if type_id not in self.sysfs.mdev_type_ids(parent):
            raise exception.UnknownType(type_id=type_id, address=parent)

    def available(self, parent: objects.PciAddress,
                  type_id: objects.TypeId) -> int:
        """``available_instances`` of a type the parent lists."""
        return self.sysfs.read_int(os.path.join(
            self.sysfs.types_dir(parent), type_id, 'available_instances'))

    def max_instance(self, parent: objects.PciAddress,
                     type_id: objects.TypeId) -> int | None:
        """NVIDIA's ``max_instance=`` from the type's description, or
        None."""
        description = self.sysfs.read(os.path.join(
            self.sysfs.types_dir(parent), type_id, 'description'),
            optional=True)
        mtype = objects.VgpuType(id=type_id, name=None,
                                 description=description, device_api='',
                                 available_instances=0)
        return mtype.max_instance

    def vgpu_type(self, parent: objects.PciAddress,
                  type_id: objects.TypeId) -> objects.VgpuType | None:
        """The type's ``available_instances`` as the parent lists it now
        (the kernel's count already holds the driver's maximum, so the
        description is not read: the allocator asks this for every GPU
        of every claim), None when the parent does not list the type."""
        available = self.sysfs.read_int(os.path.join(
            self.sysfs.types_dir(parent), type_id, 'available_instances'),
            optional=True)
        if available is None:
            return None
        return objects.VgpuType(id=type_id, name=None, description=None,
                                device_api='', available_instances=available)

    # -- create -----------------------------------------------------------

    def prepare(self, device: base.VgpuDevice) -> bool:
        """Create the mdev (see the module doc).  True: created now;
        False: it existed already with this parent and type."""
        existing = self.lookup(device.uuid)
        if existing is not None:
            return self._same_or_conflict(device, existing)
        self.check_type(device.parent, device.type_id)
        if self.available(device.parent, device.type_id) < 1:
            raise self._no_capacity(device, 'available_instances is 0')
        if self.host is not None:
            try:
                return self._create_libvirt(device, self.host)
            except exception.NotSupported:
                pass   # this libvirt cannot create mdevs: the kernel can
        return self._create_sysfs(device)

    def _same_or_conflict(self, device: base.VgpuDevice,
                          existing: base.VgpuDevice) -> bool:
        if (existing.parent == device.parent
                and existing.type_id == device.type_id):
            return False
        raise exception.MdevConflict(
            uuid=device.uuid, existing_type=existing.type_id,
            existing_parent=existing.parent, type_id=device.type_id,
            parent=device.parent)

    def _no_capacity(self, device: base.VgpuDevice,
                     reason: str) -> exception.NoCapacity:
        return exception.NoCapacity(uuid=device.uuid,
                                    type_id=device.type_id,
                                    where='the GPU %s' % device.parent,
                                    reason=reason)

    def _create_sysfs(self, device: base.VgpuDevice) -> bool:
        # <types>/<type>/create  <-  "<uuid>", only the parent's own file:
        # one linked to another GPU's would make the vGPU there while the
        # lease names this one
        try:
            path, _ = self.sysfs.own_file(
                self.sysfs.pci_dir(device.parent), sysfs_mod.TYPES_DIR,
                device.type_id, 'create')
        except exception.SysfsError as e:
            raise exception.MdevCreateFailed(
                uuid=device.uuid, type_id=device.type_id,
                parent=device.parent, reason='%s: %s' % (
                    e.kwargs.get('path'), e.kwargs.get('reason')))
        try:
            base.retry_transient(
                lambda: self.sysfs.write(path, device.uuid),
                stop_after=self.retry_stop)
        except exception.SysfsWriteError as e:
            return self._create_refused(device, e)
        if not _wait_for(lambda: self.lookup(device.uuid) is not None,
                         self.appear_timeout):
            raise exception.MdevCreateFailed(
                uuid=device.uuid, type_id=device.type_id,
                parent=device.parent,
                reason='the kernel accepted the UUID but %s did not appear '
                       'within %.0f s' % (self.sysfs.mdev_dir(device.uuid),
                                          self.appear_timeout))
        return True

    def _create_refused(self, device: base.VgpuDevice,
                        error: exception.SysfsWriteError) -> bool:
        """Turn the kernel's answer to a create into a typed error."""
        code = error.kwargs.get('errno')
        name = base.errno_name(code)
        if code == errno.EEXIST:
            existing = self.lookup(device.uuid)
            if existing is not None:
                return self._same_or_conflict(device, existing)
            raise exception.MdevCreateFailed(
                uuid=device.uuid, type_id=device.type_id,
                parent=device.parent,
                reason='the kernel answered EEXIST: the UUID is in use by '
                       'a device that is not a PCI mdev')
        if code == errno.ENODEV or not self.is_parent(device.parent):
            raise exception.ParentGone(
                address=device.parent, uuid=device.uuid,
                reason='the kernel answered %s to the create' % name)
        if code == errno.ENOENT:
            raise exception.UnknownType(type_id=device.type_id,
                                        address=device.parent)
        if code in _NO_CAPACITY_ERRNOS:
            raise self._no_capacity(device, 'the kernel answered %s' % name)
        if code == errno.EINVAL and self.available(device.parent,
                                                   device.type_id) < 1:
            raise self._no_capacity(
                device, 'the kernel answered EINVAL and available_instances '
                        'is now 0 (NVIDIA answers EINVAL when the GPU is '
                        'full or holds vGPUs of another type)')
        raise exception.MdevCreateFailed(
            uuid=device.uuid, type_id=device.type_id, parent=device.parent,
            reason='the kernel answered %s (%s)' % (
                name, error.kwargs.get('reason') or os.strerror(code or 0)))

    def _create_libvirt(self, device: base.VgpuDevice,
                        host: base.MdevHost) -> bool:
        """``virNodeDeviceCreateXML``; when libvirt fails and the device
        does not exist, the kernel is asked directly (libvirt's node-device
        view can lag or be missing - no virtnodedevd, a parent it has not
        seen - and the kernel's answer is the one that counts)."""
        xml = config_xml.mdev_nodedev(device.parent, device.type_id,
                                      device.uuid)
        try:
            base.retry_transient(lambda: host.create_mdev(xml),
                                 stop_after=self.retry_stop)
        except exception.NotSupported:
            raise
        except exception.LibvirtError as e:
            existing = self.lookup(device.uuid)
            if existing is not None:
                self._same_or_conflict(device, existing)
                return True
            try:
                return self._create_sysfs(device)
            except exception.MdevError as kernel_error:
                raise type(kernel_error)(
                    message='%s (libvirt first answered: %s)'
                    % (kernel_error, e), **kernel_error.kwargs)
        return True

    # -- remove -----------------------------------------------------------

    def remove(self, uuid: objects.Uuid) -> bool:
        """Remove mdev ``uuid``; False when it did not exist (or was gone
        before we removed it: some NVIDIA drivers remove a guest's mdev
        themselves when qemu exits).

        Waits up to ``remove_timeout`` for it to go (a vendor driver may be
        removing it itself at the same time; either way it is gone).
        """
        objects.typed(uuid, objects.Uuid, 'uuid')
        if self.lookup(uuid) is None:
            return False
        removed = False
        host = self.host
        if host is not None:
            try:
                removed = base.retry_transient(
                    lambda: host.destroy_mdev(uuid),
                    stop_after=self.retry_stop)
            except exception.NotSupported:
                removed = False
            except exception.LibvirtError as e:
                if not self._exists_path(self.sysfs.mdev_dir(uuid)):
                    # The vendor driver removed it itself when qemu exited
                    # (libvirt then fails to stop what is gone): done.
                    return False
                raise exception.MdevRemoveFailed(uuid=uuid, reason=str(e))
        if not removed:
            self._remove_sysfs(uuid)
        if not _wait_for(lambda: not self._exists_path(
                self.sysfs.mdev_dir(uuid)), self.remove_timeout):
            raise exception.MdevRemoveFailed(
                uuid=uuid, reason='it is still present %.0f s after the '
                                  'remove; is a guest still using it?'
                                  % self.remove_timeout)
        return True

    def _remove_sysfs(self, uuid: objects.Uuid) -> None:
        # bus/mdev/devices/<uuid>/remove  <-  "1", only through the vGPU's
        # own directory: the link bus/mdev/devices/<uuid> must lead to a
        # directory named <uuid> (one pointing at another vGPU's would
        # remove that vGPU instead).
        directory = self.sysfs.mdev_dir(uuid)
        try:
            real = self.sysfs.resolved_under_root(directory)
        except OSError as e:
            raise exception.MdevRemoveFailed(uuid=uuid, reason=e.strerror)
        if os.path.basename(real) != uuid:
            raise exception.MdevRemoveFailed(
                uuid=uuid, reason='%s leads to %s, not to a directory of '
                                  'that vGPU; nothing removed'
                                  % (directory, real))
        # ... and its own remove: one linked to another vGPU's would
        # remove that one
        try:
            path, _ = self.sysfs.own_file(directory, 'remove')
        except exception.SysfsError as e:
            raise exception.MdevRemoveFailed(
                uuid=uuid, reason='%s: %s' % (e.kwargs.get('path'),
                                              e.kwargs.get('reason')))
        try:
            base.retry_transient(
                lambda: self.sysfs.write(path, '1'),
                stop_after=self.remove_timeout)
        except exception.UnsafePath:
            raise
        except exception.SysfsWriteError as e:
            if e.kwargs.get('errno') in _GONE_ERRNOS:
                return    # gone meanwhile (a vendor driver's own cleanup)
            raise exception.MdevRemoveFailed(
                uuid=uuid, reason='the kernel answered %s' % (
                    base.errno_name(e.kwargs.get('errno'), e)))

    # -- persistent definitions ------------------------------------------

    def _definition_path(self, parent: objects.PciAddress,
                         uuid: objects.Uuid) -> str:
        return os.path.join(self.mdevctl_dir,
                            str(objects.typed(parent, objects.PciAddress,
                                              'parent')),
                            objects.typed(uuid, objects.Uuid, 'uuid'))

    def _parents(self) -> list[tuple[objects.PciAddress, str]]:
        """``(parent, directory)`` of each PCI parent under mdevctl's
        directory, sorted by name (mdevctl also keeps ccw/ap parents, and
        a stray file may lie there: both skipped)."""
        try:
            names = sorted(os.listdir(self.mdevctl_dir))
        except FileNotFoundError:
            return []
        except OSError as e:
            raise exception.ConfigError(reason='%s: %s' % (self.mdevctl_dir,
                                                           e.strerror))
        found = []
        for name in names:
            try:
                parent = objects.PciAddress.parse(name)
            except exception.InvalidPciAddress:
                continue
            found.append((parent, os.path.join(self.mdevctl_dir, name)))
        return found

    def definitions(self) -> list[tuple[objects.PciAddress, objects.Uuid]]:
        """``(parent, uuid)`` of every mdevctl definition of a PCI parent,
        sorted."""
        found = []
        for parent, path in self._parents():
            if not os.path.isdir(path):
                continue
            for entry in os.listdir(path):
                try:
                    found.append((parent, objects.Uuid.parse(entry)))
                except exception.InvalidUuid:
                    continue
        return sorted(found)

    def restorable(self) -> tuple[base.Restorable, ...]:
        """mdevctl's definitions with ``"start": "auto"``, to create after
        a reboot; ``manual`` ones are left for their guest's hook, ones
        that set attributes for ``mdevctl start`` (which applies them), a
        UUID defined under two parents for mdevctl."""
        found = []
        for parent, uuid in self.definitions():
            try:
                definition = self.definition(uuid)
            except exception.LibvirtGpuError as e:
                found.append(base.Restorable(uuid=uuid, detail=str(e),
                                             failed=True))
                continue
            if definition is None or definition.parent != parent:
                found.append(base.Restorable(
                    uuid=uuid, detail='defined under %s and elsewhere; left '
                    'to mdevctl' % parent))
                continue
            where = '%s on %s' % (definition.type_id, parent)
            if definition.start != 'auto':
                found.append(base.Restorable(
                    uuid=uuid, detail='%s is defined with start %s: its '
                    'guest creates it' % (where, definition.start)))
            elif definition.attrs:
                found.append(base.Restorable(
                    uuid=uuid, detail='%s sets attributes: `mdevctl start '
                    '-u %s` applies them' % (where, uuid)))
            else:
                found.append(base.Restorable(
                    uuid=uuid, detail=where, device=base.VgpuDevice(
                        uuid=uuid, parent=parent,
                        type_id=definition.type_id)))
        return tuple(found)

    def attrs_refusal(self, definition: base.VgpuDefinition) -> str:
        """mdevctl applies a definition's attributes: ``mdevctl start``."""
        return ('its mdevctl definition sets attributes; start it with '
                '`mdevctl start -u %s` instead' % definition.uuid)

    def definition(self, uuid: objects.Uuid) -> base.VgpuDefinition | None:
        """The mdevctl definition of ``uuid``, or None.

        Reads ``<mdevctl_dir>/<parent>/<uuid>``; directories whose name is
        not a PCI address are skipped (mdevctl also keeps ccw/ap parents).
        """
        objects.typed(uuid, objects.Uuid, 'uuid')
        for parent, _ in self._parents():
            path = self._definition_path(parent, uuid)
            if os.path.isfile(path):
                return self._read_definition(path, parent, uuid)
        return None

    def _read_definition(self, path: str, parent: objects.PciAddress,
                         uuid: objects.Uuid) -> base.VgpuDefinition:
        def bad(reason: str) -> exception.ConfigError:
            return exception.ConfigError(
                reason='mdevctl definition %s: %s' % (path, reason))
        try:
            with open(path, 'rb') as f:
                raw = f.read(_MAX_DEFINITION_BYTES + 1)
        except OSError as e:
            raise bad(e.strerror or str(e))
        if len(raw) > _MAX_DEFINITION_BYTES:
            raise bad('larger than %d bytes' % _MAX_DEFINITION_BYTES)
        try:
            data = jsonutil.loads(raw.decode('utf-8'))
        except (UnicodeDecodeError, ValueError) as e:
            raise bad('not JSON: %s' % e)
        except RecursionError:
            raise bad('not JSON: nested too deeply')
        if not isinstance(data, dict):
            raise bad('not a JSON object')
        try:
            type_id = objects.TypeId.parse(data.get('mdev_type'))
        except exception.InvalidTypeId as e:
            raise bad(str(e))
        start = data.get('start', 'manual')
        if start not in MDEVCTL_STARTS:
            raise bad('"start" is %r, not auto or manual' % (start,))
        attrs = []
        for item in data.get('attrs') or []:
            if not isinstance(item, dict) or len(item) != 1:
                raise bad('"attrs" entries must be {"name": "value"}')
            (key, value), = item.items()
            attrs.append((str(key), str(value)))
        return MdevDefinition(uuid=uuid, parent=parent, type_id=type_id,
                              start=start, attrs=tuple(attrs),
                              source='mdevctl (%s)' % self.mdevctl_dir)

    def define(self, device: base.VgpuDevice, start: str = 'manual') -> None:
        """Make ``device`` persistent (not started): libvirt's
        ``virNodeDeviceDefineXML`` when a connection can, else mdevctl's
        JSON file written atomically."""
        if start not in MDEVCTL_STARTS:
            raise exception.InvalidInput(reason='start must be auto or '
                                                'manual, not %r' % start)
        self.check_type(device.parent, device.type_id)
        host = self.host
        if host is not None:
            xml = config_xml.mdev_nodedev(device.parent, device.type_id,
                                          device.uuid)
            try:
                base.retry_transient(
                    lambda: host.define_mdev(xml, autostart=(
                        start == 'auto')), stop_after=self.retry_stop)
                return
            except exception.NotSupported:
                pass
        existing = self.definition(device.uuid)
        if existing is not None and (existing.parent != device.parent or
                                     existing.type_id != device.type_id):
            raise exception.MdevConflict(
                uuid=device.uuid, existing_type=existing.type_id,
                existing_parent=existing.parent, type_id=device.type_id,
                parent=device.parent)
        path = self._definition_path(device.parent, device.uuid)
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        fileutil.write_atomic(path, jsonutil.dumps(
            {'mdev_type': device.type_id, 'start': start, 'attrs': []},
            indent=2) + '\n', mode=0o644)

    def undefine(self, uuid: objects.Uuid) -> bool:
        """Remove a persistent definition; False when there was none."""
        objects.typed(uuid, objects.Uuid, 'uuid')
        host = self.host
        if host is not None:
            try:
                if base.retry_transient(lambda: host.undefine_mdev(uuid),
                                        stop_after=self.retry_stop):
                    return True
            except exception.NotSupported:
                pass
        found = self.definition(uuid)
        if found is None:
            return False
        os.unlink(self._definition_path(found.parent, uuid))
        return True
