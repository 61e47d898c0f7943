"""The public Python API: give GPUs and vGPUs to domains and take them back.

::

    import libvirt
    from libvirt_gpu import api

    conn = libvirt.open('qemu:///system')
    done = api.attach(conn, 'vm1', vgpu_type='nvidia-223', live=True)
    print(done.uuid, done.parent)           # the vGPU and the GPU chosen
    api.attach(conn, 'vm2', address='0000:3b:00.0', config=True)
    print(api.list_devices(conn, 'vm1'))
    api.detach(conn, 'vm1', uuid=done.uuid, live=True)

``live``/``config`` mean what virsh's ``--live``/``--config`` mean; with
neither, the domain's current state is changed (live when it runs, its
persistent config otherwise), like ``--current``.

A vGPU attached ``live`` is created now (through libvirt's node-device API
where it can, sysfs otherwise) on the enabled GPU with the most room,
under the lease lock, then hot-plugged; its ``<gpu:vgpu>`` in the live
metadata names that GPU.  A vGPU attached only to the ``config`` goes into
the persistent XML without a GPU: the qemu hook creates it at the next
start, on whichever enabled GPU has room then.  A whole GPU (``address``)
is checked (a GPU, holding no vGPUs, not configured for vGPUs) and attached
with ``managed='yes'``: libvirt binds it to vfio-pci when the guest starts.

A vGPU of NVIDIA's vGPU 17+ vendor interface is given to the guest as its
VF (``<hostdev type='pci' managed='no'>``), so the VF is chosen when the
XML is written, also for a ``config``-only attach: that VF is then recorded
for the vGPU (a ``manual`` definition in the vendor state, so no other
attach takes it) and the vGPU is created on it at the next start.

Configuration (``conf``) defaults to ``conf.load()``: the file named by
``$LIBVIRT_GPU_CONFIG`` or ``/etc/libvirt-gpu/libvirt-gpu.conf``.
"""

import dataclasses
import time
import typing
import uuid as uuidlib

from libvirt_gpu import allocator as allocator_mod
from libvirt_gpu.backends import base
from libvirt_gpu.backends import pci as pci_backend
from libvirt_gpu.backends import registry
from libvirt_gpu import config_xml
from libvirt_gpu import exception
from libvirt_gpu import guest as guest_mod
from libvirt_gpu import host as host_mod
from libvirt_gpu import metadata
from libvirt_gpu import objects
from libvirt_gpu import state
from libvirt_gpu import sysfs as sysfs_mod

VGPU = 'vgpu'
PGPU = 'pgpu'
# How long a live detach waits for the guest to let go of the device
# before leaving the vGPU to the release hook.
DETACH_WAIT = 10.0


@dataclasses.dataclass(frozen=True)
class Attachment:
    """What attach/detach did."""

    domain_uuid: str
    domain_name: str
    kind: str                                  # 'vgpu' or 'pgpu'
    live: bool
    config: bool
    uuid: typing.Optional[str] = None          # vGPU
    type_id: typing.Optional[str] = None       # vGPU
    parent: typing.Optional[objects.PciAddress] = None   # vGPU, when known
    address: typing.Optional[objects.PciAddress] = None  # pGPU
    note: typing.Optional[str] = None          # e.g. removal left to hook


@dataclasses.dataclass(frozen=True)
class VgpuState:
    """One vGPU of a domain as found now."""

    uuid: str
    type_id: typing.Optional[str]       # None: an mdev hostdev not ours
    parent: typing.Optional[objects.PciAddress]
    in_metadata: bool
    in_devices: bool
    exists: bool
    leased: typing.Optional[str]        # lease state, None: no lease


@dataclasses.dataclass(frozen=True)
class DomainGpus:
    """What a domain holds (``list_devices``)."""

    domain_uuid: str
    domain_name: str
    active: bool
    inactive_xml: bool                  # read from the persistent config
    vgpus: typing.Tuple[VgpuState, ...]
    pgpus: typing.Tuple[objects.PciAddress, ...]


class Services(object):
    """Configuration, sysfs, backends and leases of this host, made once.

    Tests pass ``sysfs`` (a simulated tree with an emulated kernel).
    """

    def __init__(self, conn, conf=None, sysfs=None):
        if conf is None:
            from libvirt_gpu import conf as conf_mod
            conf = conf_mod.load()
        self.conf = conf
        self.host = (conn if isinstance(conn, host_mod.Host)
                     else host_mod.Host.from_connection(conn))
        self.sysfs = sysfs or sysfs_mod.Sysfs(conf.sysfs_root)
        # Every vGPU kind behind one backend (backends.registry).
        self.mdev = registry.VgpuBackend(self.sysfs, conf.state_dir,
                                         host=self.host)
        self.pci = pci_backend.PciBackend(self.sysfs)
        self.store = state.LeaseStore(conf.state_dir)
        self._enabled = None

    @property
    def enabled(self):
        """``{PciAddress: EnabledType}`` resolved against this host."""
        if self._enabled is None:
            from libvirt_gpu.conf import vgpu as vgpu_conf
            from libvirt_gpu import discovery
            gpus = discovery.from_sysfs(self.sysfs).gpus
            self._enabled = vgpu_conf.resolve(self.conf, gpus)
        return self._enabled

    @property
    def allocator(self):
        return allocator_mod.Allocator(self.mdev, self.store, self.enabled)

    def guest(self, domain):
        return guest_mod.Guest(self.host.lookup_domain(domain))


def _targets(guest, live, config):
    """virsh's meaning of --live/--config/--current -> (live, config)."""
    label = '%s (%s)' % (guest.name, guest.uuid)
    if not live and not config:
        return (True, False) if guest.is_active() else (False, True)
    if live and not guest.is_active():
        raise exception.DomainStateError(
            domain=label, reason='it is not running, so nothing can be '
                                 'attached or detached live; use --config')
    if config and not guest.is_persistent():
        raise exception.DomainStateError(
            domain=label, reason='it is transient: it has no persistent '
                                 'configuration; use --live')
    return live, config


def _new_uuid():
    return str(uuidlib.uuid4())


# --- attach ------------------------------------------------------------------

def attach(conn, domain, vgpu_type=None, address=None, parent=None,
           live=False, config=False, uuid=None, conf=None, sysfs=None):
    """Give ``domain`` (name, UUID or virDomain) a vGPU of ``vgpu_type``
    (optionally on GPU ``parent``, with mdev ``uuid``) or the whole GPU at
    ``address``.  Returns an Attachment."""
    if (vgpu_type is None) == (address is None):
        raise exception.InvalidInput(
            reason='give either a vGPU type or a GPU address')
    svc = Services(conn, conf, sysfs)
    guest = svc.guest(domain)
    live, config = _targets(guest, live, config)
    if address is not None:
        if parent is not None or uuid is not None:
            raise exception.InvalidInput(
                reason='parent and uuid are for vGPUs, not whole GPUs')
        return _attach_pgpu(svc, guest, objects.PciAddress.parse(address),
                            live, config)
    objects.validate_type_id(vgpu_type)
    uuid = objects.validate_uuid(uuid) if uuid else _new_uuid()
    parent = objects.PciAddress.parse(parent) if parent else None
    if live:
        return _attach_vgpu_live(svc, guest, vgpu_type, parent, uuid, config)
    return _attach_vgpu_config(svc, guest, vgpu_type, parent, uuid)


def _check_type_offered(svc, type_id, parent):
    """Refuse now what the hook would refuse at the next start."""
    enabled = svc.enabled
    if parent is None:
        if not any(e.type_id == type_id for e in enabled.values()):
            raise exception.TypeNotEnabled(
                type_id=type_id, where='this host',
                enabled=', '.join(sorted({e.type_id for e in
                                          enabled.values()})) or 'none')
        return
    svc.mdev.check_type(svc.mdev.parents_of(parent)[0]
                        if svc.mdev.sysfs.virtfns(parent) else parent,
                        type_id)
    setting = enabled.get(svc.mdev.physical(parent))
    if setting is None or setting.type_id != type_id:
        raise exception.TypeNotEnabled(
            type_id=type_id, where='the GPU %s' % parent,
            enabled=setting.type_id if setting else 'none on that GPU')


def _vendor_vf_for(svc, type_id, parent, uuid):
    """The VF a ``config``-only vGPU of the vendor interface goes to (see
    the module doc), recorded for it; None when the type is not one of the
    vendor interface on this host."""
    if parent is not None:
        gpus = [svc.mdev.physical(parent)]
    else:
        gpus = sorted(a for a, e in svc.enabled.items()
                      if e.type_id == type_id)
    gpus = [g for g in gpus if svc.mdev.is_vendor(
        svc.mdev.parents_of(g)[0])]
    if not gpus:
        return None
    if parent is not None and parent != gpus[0]:
        vf = parent                 # a VF named by the caller
    else:
        vf = None
        problems = []
        for gpu in gpus:
            try:
                vf = svc.mdev.vendor.choose_vf(gpu, type_id)
                break
            except exception.NoCapacity as e:
                problems.append(str(e))
        if vf is None:
            raise exception.NoCapacity(uuid=uuid, type_id=type_id,
                                       where='any GPU of this host',
                                       reason='; '.join(problems))
    svc.mdev.vendor.define(base.VgpuDevice(uuid=uuid, parent=vf,
                                           type_id=type_id), start='manual')
    return vf


def _attach_vgpu_config(svc, guest, type_id, parent, uuid):
    _check_type_offered(svc, type_id, parent)
    _, meta = guest.devices(inactive=True)
    vf = _vendor_vf_for(svc, type_id, parent, uuid)
    if vf is not None:
        parent = vf
        hostdev = svc.mdev.hostdev_xml(base.VgpuDevice(
            uuid=uuid, parent=vf, type_id=type_id))
    else:
        hostdev = config_xml.mdev_hostdev(uuid)
    meta = meta.with_vgpu(metadata.VgpuEntry(uuid, type_id, parent))
    try:
        guest.attach_device(hostdev, config=True)
    except BaseException:
        if vf is not None:
            svc.mdev.vendor.undefine(uuid)
        raise
    try:
        guest.set_gpu_metadata(meta, config=True)
    except exception.LibvirtGpuError:
        guest.detach_device(hostdev, config=True)
        if vf is not None:
            svc.mdev.vendor.undefine(uuid)
        raise
    return Attachment(domain_uuid=guest.uuid, domain_name=guest.name,
                      kind=VGPU, live=False, config=True, uuid=uuid,
                      type_id=type_id, parent=parent)


def _attach_vgpu_live(svc, guest, type_id, parent, uuid, config):
    if config:
        _, config_meta = guest.devices(inactive=True)
        config_meta = config_meta.with_vgpu(metadata.VgpuEntry(
            uuid, type_id, parent))
    _, live_meta = guest.devices()
    allocator = svc.allocator
    (grant,) = allocator.reserve(guest.uuid, [allocator_mod.VgpuClaim(
        uuid=uuid, type_id=type_id, parent=parent)])
    state.crash_point('attach:reserved')
    device = grant.device
    created = attached = False
    try:
        if config and svc.mdev.is_vendor(device.parent):
            # The persistent XML names the VF too: keep it for this vGPU.
            config_meta = config_meta.without_vgpu(uuid).with_vgpu(
                metadata.VgpuEntry(uuid, type_id, device.parent))
            svc.mdev.vendor.define(device, start='manual')
        if not grant.existed:
            created = svc.mdev.prepare(device)
            state.crash_point('attach:created')
            allocator.mark_created([uuid])
            state.crash_point('attach:marked')
        hostdev = svc.mdev.hostdev_xml(device)
        guest.attach_device(hostdev, live=True, config=config)
        attached = True
        state.crash_point('attach:attached')
        guest.set_gpu_metadata(live_meta.with_vgpu(metadata.VgpuEntry(
            uuid, type_id, device.parent)), live=True)
        if config:
            guest.set_gpu_metadata(config_meta, config=True)
        state.crash_point('attach:done')
    except BaseException:
        _undo_live_attach(svc, guest, device, grant, created, attached,
                          config)
        raise
    return Attachment(domain_uuid=guest.uuid, domain_name=guest.name,
                      kind=VGPU, live=True, config=config, uuid=uuid,
                      type_id=type_id, parent=device.parent)


def _undo_live_attach(svc, guest, device, grant, created, attached, config):
    """Best effort, in reverse; the first error is the one raised."""
    if attached:
        try:
            guest.detach_device(svc.mdev.hostdev_xml(device), live=True,
                                config=config)
        except exception.LibvirtGpuError:
            return       # still plugged: leave mdev and lease to reconcile
    if created:
        try:
            svc.mdev.remove(device.uuid)
        except exception.LibvirtGpuError:
            return
    if grant.lease is not None and not grant.existed:
        svc.allocator.forget([device.uuid])
    if config and svc.mdev.is_vendor(device.parent):
        try:
            svc.mdev.vendor.undefine(device.uuid)
        except exception.LibvirtGpuError:
            pass          # reconcile finds what is left


def _attach_pgpu(svc, guest, address, live, config):
    setting = svc.enabled.get(address)
    if setting is not None:
        raise exception.GpuInUse(
            address=address, reason='it is configured to offer vGPU type '
                                    '%s ([gpu]/enabled_vgpu_types)'
                                    % setting.type_id)
    device = base.PgpuDevice(address)
    svc.pci.prepare(device)
    hostdev = svc.pci.hostdev_xml(device)
    metas = []
    if live:
        metas.append((True, False, guest.devices()[1]))
    if config:
        metas.append((False, True, guest.devices(inactive=True)[1]))
    entry = metadata.PgpuEntry(address)
    new = [(lv, cf, meta.with_pgpu(entry)) for lv, cf, meta in metas]
    guest.attach_device(hostdev, live=live, config=config)
    try:
        for lv, cf, meta in new:
            guest.set_gpu_metadata(meta, live=lv, config=cf)
    except exception.LibvirtGpuError:
        guest.detach_device(hostdev, live=live, config=config)
        raise
    return Attachment(domain_uuid=guest.uuid, domain_name=guest.name,
                      kind=PGPU, live=live, config=config, address=address)


# --- detach ------------------------------------------------------------------

def _find_vgpu(guest, targets, uuid, vgpu_type):
    """The vGPU entry to detach, looked for in every target's XML."""
    found = {}
    for live, config in targets:
        devices, meta = guest.devices(inactive=config)
        if uuid is not None:
            entry = meta.vgpu(uuid)
            if entry is None and uuid in devices.mdev_uuids:
                entry = metadata.VgpuEntry(uuid, type_id=None)
            if entry is not None:
                found[entry.uuid] = entry
        else:
            for entry in meta.vgpus:
                if entry.type_id == vgpu_type:
                    found[entry.uuid] = entry
    label = '%s (%s)' % (guest.name, guest.uuid)
    what = 'vGPU %s' % uuid if uuid else 'vGPU of type %s' % vgpu_type
    if not found:
        raise exception.DeviceNotAttached(domain=label, what=what)
    if len(found) > 1:
        raise exception.InvalidInput(
            reason='domain %s holds %d vGPUs of type %s (%s); name one by '
                   'its UUID' % (label, len(found), vgpu_type,
                                 ', '.join(sorted(found))))
    return next(iter(found.values()))


def detach(conn, domain, uuid=None, address=None, vgpu_type=None,
           live=False, config=False, conf=None, sysfs=None):
    """Take a vGPU (by ``uuid``, or the only one of ``vgpu_type``) or the
    whole GPU at ``address`` from ``domain``.  A vGPU detached live is
    removed once the guest has let go of it (else the release hook removes
    it when the guest stops)."""
    if sum(x is not None for x in (uuid, address, vgpu_type)) != 1:
        raise exception.InvalidInput(
            reason='give one of: a vGPU UUID, a vGPU type, a GPU address')
    svc = Services(conn, conf, sysfs)
    guest = svc.guest(domain)
    live, config = _targets(guest, live, config)
    targets = [t for t in ((True, False), (False, True))
               if (live and t[0]) or (config and t[1])]
    label = '%s (%s)' % (guest.name, guest.uuid)
    if address is not None:
        address = objects.PciAddress.parse(address)
        for lv, cf in targets:
            devices, meta = guest.devices(inactive=cf)
            if address not in devices.pci_addresses:
                raise exception.DeviceNotAttached(
                    domain=label, what='GPU %s in its %s XML'
                    % (address, 'live' if lv else 'persistent'))
        hostdev = svc.pci.hostdev_xml(base.PgpuDevice(address))
        for lv, cf in targets:
            meta = guest.devices(inactive=cf)[1]
            guest.detach_device(hostdev, live=lv, config=cf)
            if meta.pgpu(address) is not None:
                guest.set_gpu_metadata(meta.without_pgpu(address), live=lv,
                                       config=cf)
        return Attachment(domain_uuid=guest.uuid, domain_name=guest.name,
                          kind=PGPU, live=live, config=config,
                          address=address)
    if uuid is not None:
        uuid = objects.validate_uuid(uuid)
    else:
        objects.validate_type_id(vgpu_type)
    entry = _find_vgpu(guest, targets, uuid, vgpu_type)
    vendor_vf = (entry.parent if entry.parent is not None
                 and svc.mdev.is_vendor(entry.parent) else None)
    if vendor_vf is not None:
        hostdev = svc.mdev.hostdev_xml(base.VgpuDevice(
            uuid=entry.uuid, parent=vendor_vf, type_id=entry.type_id))
    else:
        hostdev = config_xml.mdev_hostdev(entry.uuid)
    for lv, cf in targets:
        devices, meta = guest.devices(inactive=cf)
        if entry.uuid in devices.mdev_uuids or (
                vendor_vf is not None and vendor_vf in devices.pci_addresses):
            guest.detach_device(hostdev, live=lv, config=cf)
        if meta.vgpu(entry.uuid) is not None:
            guest.set_gpu_metadata(meta.without_vgpu(entry.uuid), live=lv,
                                   config=cf)
    if vendor_vf is not None and config:
        svc.mdev.vendor.undefine(entry.uuid)   # the VF is free again
    note = None
    if live:
        note = _remove_after_detach(svc, guest, entry.uuid, vendor_vf)
    return Attachment(domain_uuid=guest.uuid, domain_name=guest.name,
                      kind=VGPU, live=live, config=config, uuid=entry.uuid,
                      type_id=entry.type_id, parent=entry.parent, note=note)


def _remove_after_detach(svc, guest, uuid, vendor_vf=None):
    """Remove our vGPU once the running guest no longer lists it (its
    mdev, or for the vendor interface its VF)."""
    def listed():
        devices = guest.devices()[0]
        return uuid in devices.mdev_uuids or (
            vendor_vf is not None and vendor_vf in devices.pci_addresses)
    deadline = time.monotonic() + DETACH_WAIT
    while listed():
        if time.monotonic() > deadline:
            return ('the guest has not released vGPU %s yet; it is removed '
                    'when the guest stops' % uuid)
        time.sleep(0.1)
    allocator = svc.allocator
    leases = allocator.begin_release(guest.uuid, [uuid])
    if not leases:
        return 'vGPU %s has no lease of ours: left in place' % uuid
    svc.mdev.remove(uuid)
    allocator.forget([uuid])
    return None


# --- listing -----------------------------------------------------------------

def list_devices(conn, domain, inactive=False, conf=None, sysfs=None):
    """What ``domain`` holds: its vGPUs (from metadata and mdev hostdevs,
    with whether each exists and is leased) and whole GPUs.  ``inactive``
    reads the persistent config instead of the live XML."""
    svc = Services(conn, conf, sysfs)
    guest = svc.guest(domain)
    active = guest.is_active()
    devices, meta = guest.devices(inactive=inactive or not active)
    leases = {lease.mdev_uuid: lease.state
              for lease in svc.store.leases()
              if lease.domain_uuid == guest.uuid}
    vgpus = []
    listed = set()
    vfs = set()
    for entry in meta.vgpus:
        listed.add(entry.uuid)
        found = svc.mdev.lookup(entry.uuid)
        on_vf = (entry.parent is not None
                 and entry.parent in devices.pci_addresses
                 and svc.mdev.is_vendor(entry.parent))
        if on_vf:
            vfs.add(entry.parent)
        vgpus.append(VgpuState(
            uuid=entry.uuid, type_id=entry.type_id,
            parent=found.parent if found else entry.parent,
            in_metadata=True,
            in_devices=entry.uuid in devices.mdev_uuids or on_vf,
            exists=found is not None, leased=leases.get(entry.uuid)))
    for uuid in devices.mdev_uuids:
        if uuid in listed:
            continue
        found = svc.mdev.lookup(uuid)
        vgpus.append(VgpuState(
            uuid=uuid, type_id=found.type_id if found else None,
            parent=found.parent if found else None, in_metadata=False,
            in_devices=True, exists=found is not None,
            leased=leases.get(uuid)))
    pgpus = tuple(sorted((set(devices.pci_addresses) - vfs)
                         | {e.address for e in meta.pgpus}))
    return DomainGpus(domain_uuid=guest.uuid, domain_name=guest.name,
                      active=active, inactive_xml=inactive or not active,
                      vgpus=tuple(vgpus), pgpus=pgpus)
