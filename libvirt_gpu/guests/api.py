"""The public Python API: give GPUs and vGPUs to domains and take them back.

::

    import libvirt
    from libvirt_gpu.guests import api

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

from __future__ import annotations

import time

from libvirt_gpu.host import allocator as allocator_mod
from libvirt_gpu.devices.backends import base
from libvirt_gpu import environment
from libvirt_gpu import exception
from libvirt_gpu.virt import guest as guest_mod
from libvirt_gpu.virt import metadata
from libvirt_gpu import objects
from libvirt_gpu.util import records
from libvirt_gpu.store import state

VGPU = 'vgpu'
PGPU = 'pgpu'
# How long a live detach waits for the guest to let go of the device
# before leaving the vGPU to the release hook.
DETACH_WAIT = 10.0


@records.record
class Attachment:
    """What attach/detach did."""

    domain_uuid: str
    domain_name: str
    kind: str                                  # 'vgpu' or 'pgpu'
    live: bool
    config: bool
    uuid: str | None = None          # vGPU
    type_id: str | None = None       # vGPU
    parent: objects.PciAddress | None = None   # vGPU, when known
    address: objects.PciAddress | None = None  # pGPU
    note: str | None = None          # e.g. removal left to hook


@records.record
class VgpuState:
    """One vGPU of a domain as found now."""

    uuid: str
    type_id: str | None       # None: an mdev hostdev not ours
    parent: objects.PciAddress | None
    in_metadata: bool
    in_devices: bool
    exists: bool
    leased: str | None        # lease state, None: no lease


@records.record
class DomainGpus:
    """What a domain holds (``list_devices``)."""

    domain_uuid: str
    domain_name: str
    active: bool
    inactive_xml: bool                  # read from the persistent config
    vgpus: tuple[VgpuState, ...]
    pgpus: tuple[objects.PciAddress, ...]


def _environment(conn, conf, sysfs, env):
    """The host the call acts on: ``conn`` itself when it is an
    ``environment.Environment`` (with its libvirt ``host``), else the
    caller's ``env``, else the host of ``conn`` (a libvirt connection or
    ``host.Host``) as configured (``conf``, ``sysfs``)."""
    if isinstance(conn, environment.Environment):
        if env is not None or conf is not None or sysfs is not None:
            raise TypeError('give an Environment as conn, or conf/sysfs/'
                            'env beside a connection, not both')
        env = conn
    elif env is None:
        return environment.Environment.from_conf(conf, conn=conn,
                                                 sysfs=sysfs)
    if env.host is None:
        raise TypeError('the Environment has no libvirt host: build it '
                        'with its connection (Environment.from_conf(conn=)'
                        ' or env.replace(host=))')
    return env


def _guest(env, domain):
    return guest_mod.Guest(env.host.lookup_domain(domain))


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
    return objects.Uuid.new()


# --- attach ------------------------------------------------------------------

def attach(conn, domain, vgpu_type=None, address=None, parent=None,
           live=False, config=False, uuid=None, conf=None, sysfs=None,
           env=None):
    """Give ``domain`` (name, UUID or virDomain) a vGPU of ``vgpu_type``
    (optionally on GPU ``parent``, with vGPU ``uuid``) or the whole GPU at
    ``address``.  Returns an Attachment.  ``conn``: a libvirt connection,
    a ``host.Host``, or the ``environment.Environment`` of the host (with
    its libvirt ``host``); ``env``: the host beside a connection (else one
    is made from ``conn``, ``conf`` and ``sysfs``)."""
    if (vgpu_type is None) == (address is None):
        raise exception.InvalidInput(
            reason='give either a vGPU type or a GPU address')
    env = _environment(conn, conf, sysfs, env)
    guest = _guest(env, domain)
    live, config = _targets(guest, live, config)
    if address is not None:
        if parent is not None or uuid is not None:
            raise exception.InvalidInput(
                reason='parent and uuid are for vGPUs, not whole GPUs')
        return _attach_pgpu(env, guest, objects.PciAddress.parse(address),
                            live, config)
    vgpu_type = objects.TypeId.parse(vgpu_type)
    uuid = objects.Uuid.parse(uuid) if uuid else _new_uuid()
    parent = objects.PciAddress.parse(parent) if parent else None
    if live:
        return _attach_vgpu_live(env, guest, vgpu_type, parent, uuid, config)
    return _attach_vgpu_config(env, guest, vgpu_type, parent, uuid)


def _check_type_offered(env, type_id, parent):
    """Refuse now what the hook would refuse at the next start."""
    enabled = env.enabled
    if parent is None:
        if not any(e.of(type_id) for e in enabled.values()):
            raise exception.TypeNotEnabled(
                type_id=type_id, where='this host',
                enabled=allocator_mod.enabled_text(
                    enabled, getattr(enabled, 'configured', ())))
        return
    env.vgpus.check_type(env.vgpus.parents_of(parent)[0]
                         if env.sysfs.virtfns(parent) else parent, type_id)
    setting = enabled.get(env.vgpus.physical(parent))
    if setting is None or setting.of(type_id) is None:
        raise exception.TypeNotEnabled(
            type_id=type_id, where='the GPU %s' % parent,
            enabled=(', '.join(setting.type_ids) if setting
                     else 'none on that GPU'))


def _bind_for_config(env, type_id, parent, uuid):
    """The parent a ``config``-only vGPU is bound to now, recorded for it,
    when its kind names the parent in the guest XML (see the module doc);
    None when the parent is chosen at the next start."""
    if parent is not None:
        gpus = [env.vgpus.physical(parent)]
    else:
        gpus = sorted(a for a, e in env.enabled.items()
                      if e.of(type_id) is not None)
    return env.vgpus.bind_for_config(gpus, type_id, parent, uuid)


def _attach_vgpu_config(env, guest, type_id, parent, uuid):
    _check_type_offered(env, type_id, parent)
    _, meta = guest.devices(inactive=True)
    bound = _bind_for_config(env, type_id, parent, uuid)
    if bound is not None:
        parent = bound
    hostdev = env.vgpus.hostdev_for(uuid, bound, type_id)
    meta = meta.with_vgpu(metadata.VgpuEntry(uuid, type_id, parent))
    try:
        guest.attach_device(hostdev, config=True)
    except BaseException:
        if bound is not None:
            env.vgpus.forget_for_config(uuid, bound)
        raise
    try:
        guest.set_gpu_metadata(meta, config=True)
    except exception.LibvirtGpuError:
        guest.detach_device(hostdev, config=True)
        if bound is not None:
            env.vgpus.forget_for_config(uuid, bound)
        raise
    return Attachment(domain_uuid=guest.uuid, domain_name=guest.name,
                      kind=VGPU, live=False, config=True, uuid=uuid,
                      type_id=type_id, parent=parent)


def _attach_vgpu_live(env, guest, type_id, parent, uuid, config):
    if config:
        _, config_meta = guest.devices(inactive=True)
        config_meta = config_meta.with_vgpu(metadata.VgpuEntry(
            uuid, type_id, parent))
    live_devices, live_meta = guest.devices()
    allocator = env.allocator
    (grant,) = allocator.reserve(guest.uuid, [allocator_mod.VgpuClaim(
        uuid=uuid, type_id=type_id, parent=parent)],
        pinning=live_devices.pinning)
    state.crash_point('attach:reserved')
    device = grant.device
    created = attached = False
    try:
        if config and env.vgpus.binds_parent(device.parent):
            # The persistent XML names the parent too: keep it for this
            # vGPU.
            config_meta = config_meta.without_vgpu(uuid).with_vgpu(
                metadata.VgpuEntry(uuid, type_id, device.parent))
            env.vgpus.keep_for_config(device)
        if not grant.existed:
            created = env.vgpus.prepare(device)
            state.crash_point('attach:created')
            allocator.mark_created([uuid])
            state.crash_point('attach:marked')
        hostdev = env.vgpus.hostdev_xml(device)
        guest.attach_device(hostdev, live=True, config=config)
        attached = True
        state.crash_point('attach:attached')
        guest.set_gpu_metadata(live_meta.with_vgpu(metadata.VgpuEntry(
            uuid, type_id, device.parent)), live=True)
        if config:
            guest.set_gpu_metadata(config_meta, config=True)
        state.crash_point('attach:done')
    except BaseException:
        _undo_live_attach(env, guest, device, grant, created, attached,
                          config)
        raise
    return Attachment(domain_uuid=guest.uuid, domain_name=guest.name,
                      kind=VGPU, live=True, config=config, uuid=uuid,
                      type_id=type_id, parent=device.parent)


def _undo_live_attach(env, guest, device, grant, created, attached, config):
    """Best effort, in reverse; the first error is the one raised."""
    if attached:
        try:
            guest.detach_device(env.vgpus.hostdev_xml(device), live=True,
                                config=config)
        except exception.LibvirtGpuError:
            return       # still plugged: leave mdev and lease to reconcile
    if created:
        try:
            env.vgpus.remove(device.uuid)
        except exception.LibvirtGpuError:
            return
    if grant.lease is not None and not grant.existed:
        env.allocator.forget([device.uuid])
    if config:
        try:
            env.vgpus.forget_for_config(device.uuid, device.parent)
        except exception.LibvirtGpuError:
            pass          # reconcile finds what is left


def _attach_pgpu(env, guest, address, live, config):
    """The GPU and its companions (``backends.pci``), each a
    ``<hostdev type='pci' managed='yes'>``, recorded together in the
    metadata; on a failure nothing of it is left behind."""
    setting = env.enabled.get(address)
    if setting is not None:
        raise exception.GpuInUse(
            address=address, reason='it is configured to offer vGPU type '
                                    '%s ([gpu]/enabled_vgpu_types)'
                                    % setting.type_id)
    device = base.PgpuDevice(address)
    companions = env.pci.companions(device)
    env.pci.prepare(device)
    hostdevs = [env.pci.hostdev_xml(base.PgpuDevice(a))
                for a in (address,) + companions]
    metas = []
    if live:
        metas.append((True, False, guest.devices()[1]))
    if config:
        metas.append((False, True, guest.devices(inactive=True)[1]))
    entry = metadata.PgpuEntry(address, companions)
    new = [(lv, cf, meta.with_pgpu(entry)) for lv, cf, meta in metas]
    attached = []
    try:
        for hostdev in hostdevs:
            guest.attach_device(hostdev, live=live, config=config)
            attached.append(hostdev)
        for lv, cf, meta in new:
            guest.set_gpu_metadata(meta, live=lv, config=cf)
    except exception.LibvirtGpuError:
        for hostdev in reversed(attached):
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
           live=False, config=False, conf=None, sysfs=None, env=None):
    """Take a vGPU (by ``uuid``, or the only one of ``vgpu_type``) or the
    whole GPU at ``address`` from ``domain``.  A vGPU detached live is
    removed once the guest has let go of it (else the release hook removes
    it when the guest stops)."""
    if sum(x is not None for x in (uuid, address, vgpu_type)) != 1:
        raise exception.InvalidInput(
            reason='give one of: a vGPU UUID, a vGPU type, a GPU address')
    env = _environment(conn, conf, sysfs, env)
    guest = _guest(env, domain)
    live, config = _targets(guest, live, config)
    targets = [t for t in ((True, False), (False, True))
               if (live and t[0]) or (config and t[1])]
    if address is not None:
        return _detach_pgpu(env, guest, targets, live, config,
                            objects.PciAddress.parse(address))
    if uuid is not None:
        uuid = objects.Uuid.parse(uuid)
    else:
        vgpu_type = objects.TypeId.parse(vgpu_type)
    return _detach_vgpu(env, guest, targets, live, config, uuid, vgpu_type)


def _detach_pgpu(env, guest, targets, live, config, address):
    """A whole GPU and the companions recorded with it."""
    label = '%s (%s)' % (guest.name, guest.uuid)
    for lv, cf in targets:
        devices, meta = guest.devices(inactive=cf)
        if address not in devices.pci_addresses:
            raise exception.DeviceNotAttached(
                domain=label, what='GPU %s in its %s XML'
                % (address, 'live' if lv else 'persistent'))
    for lv, cf in targets:
        devices, meta = guest.devices(inactive=cf)
        entry = meta.pgpu(address)
        # The companions recorded with it go too (those still there).
        for function in (address,) + (
                entry.companions if entry is not None else ()):
            if function in devices.pci_addresses:
                guest.detach_device(env.pci.hostdev_xml(
                    base.PgpuDevice(function)), live=lv, config=cf)
        if entry is not None:
            guest.set_gpu_metadata(meta.without_pgpu(address), live=lv,
                                   config=cf)
    return Attachment(domain_uuid=guest.uuid, domain_name=guest.name,
                      kind=PGPU, live=live, config=config, address=address)


def _detach_vgpu(env, guest, targets, live, config, uuid, vgpu_type):
    """A vGPU (of whichever kind); removed once the running guest lets go
    of it, when detached live."""
    entry = _find_vgpu(guest, targets, uuid, vgpu_type)
    hostdev = env.vgpus.hostdev_for(entry.uuid, entry.parent, entry.type_id)
    # Listening before the unplug is asked for, so that its event is not
    # missed (libvirt sends it when the guest has let go).
    with guest.device_removals() as removals:
        for lv, cf in targets:
            devices, meta = guest.devices(inactive=cf)
            if env.vgpus.in_devices(devices, entry.uuid, entry.parent):
                guest.detach_device(hostdev, live=lv, config=cf)
            if meta.vgpu(entry.uuid) is not None:
                guest.set_gpu_metadata(meta.without_vgpu(entry.uuid),
                                       live=lv, config=cf)
        if config and entry.parent is not None:
            # A parent recorded for this vGPU is free again.
            env.vgpus.forget_for_config(entry.uuid, entry.parent)
        note = None
        if live:
            note = _remove_after_detach(env, guest, removals, entry.uuid,
                                        entry.parent)
    return Attachment(domain_uuid=guest.uuid, domain_name=guest.name,
                      kind=VGPU, live=live, config=config, uuid=entry.uuid,
                      type_id=entry.type_id, parent=entry.parent, note=note)


def _remove_after_detach(env, guest, removals, uuid, parent=None):
    """Remove our vGPU once the running guest no longer lists it: woken by
    libvirt's device-removed event (``removals``, nova's way), or, where
    the connection delivers no events, by looking again every little
    while; after ``DETACH_WAIT`` seconds it is left to the release hook."""
    def listed():
        return env.vgpus.in_devices(guest.devices()[0], uuid, parent)
    deadline = time.monotonic() + DETACH_WAIT
    while listed():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return ('the guest has not released vGPU %s yet; it is removed '
                    'when the guest stops' % uuid)
        removals.wait(remaining)
    allocator = env.allocator
    leases = allocator.begin_release(guest.uuid, [uuid])
    if not leases:
        return 'vGPU %s has no lease of ours: left in place' % uuid
    env.vgpus.remove(uuid)
    allocator.forget([uuid])
    return None


# --- listing -----------------------------------------------------------------

def list_devices(conn, domain, inactive=False, conf=None, sysfs=None,
                 env=None):
    """What ``domain`` holds: its vGPUs (from metadata and mdev hostdevs,
    with whether each exists and is leased) and whole GPUs.  ``inactive``
    reads the persistent config instead of the live XML."""
    env = _environment(conn, conf, sysfs, env)
    guest = _guest(env, domain)
    active = guest.is_active()
    devices, meta = guest.devices(inactive=inactive or not active)
    leases = {lease.vgpu_uuid: lease.state
              for lease in env.store.leases()
              if lease.domain_uuid == guest.uuid}
    vgpus = []
    listed = set()
    functions = set()          # PCI functions not listed as GPUs
    for entry in meta.vgpus:
        listed.add(entry.uuid)
        found = env.vgpus.lookup(entry.uuid)
        function = env.vgpus.hostdev_function(entry.uuid, entry.parent,
                                              devices)
        if function is not None:
            functions.add(function)
        vgpus.append(VgpuState(
            uuid=entry.uuid, type_id=entry.type_id,
            parent=found.parent if found else entry.parent,
            in_metadata=True,
            in_devices=env.vgpus.in_devices(devices, entry.uuid,
                                            entry.parent),
            exists=found is not None, leased=leases.get(entry.uuid)))
    for uuid in devices.mdev_uuids:
        if uuid in listed:
            continue
        found = env.vgpus.lookup(uuid)
        vgpus.append(VgpuState(
            uuid=uuid, type_id=found.type_id if found else None,
            parent=found.parent if found else None, in_metadata=False,
            in_devices=True, exists=found is not None,
            leased=leases.get(uuid)))
    for entry in meta.pgpus:
        functions.update(entry.companions)  # they go with their GPU
    pgpus = tuple(sorted((set(devices.pci_addresses) - functions)
                         | {e.address for e in meta.pgpus}))
    return DomainGpus(domain_uuid=guest.uuid, domain_name=guest.name,
                      active=active, inactive_xml=inactive or not active,
                      vgpus=tuple(vgpus), pgpus=pgpus)


@records.record
class Migration:
    """What ``migrate`` did: the checks (``migration.Plan``) and, unless
    it was a dry run or a check refused, how the migration ended
    (``migration.Outcome``)."""

    plan: object
    outcome: object = None


def migration_host(conn):
    """``conn`` (a ``virConnect`` or a ``host.Host``) as a ``host.Host``."""
    from libvirt_gpu.virt import host as host_mod
    return (conn if isinstance(conn, host_mod.Host)
            else host_mod.Host.from_connection(conn))


def migrate(conn, domain, dest_uri, dry_run=False, progress=None,
            postcopy=False, on_plan=None, migrate_uri=None, nvml=None,
            sysfs=None):
    """Migrate the running ``domain`` (name or UUID) with its vGPUs live
    to the host at ``dest_uri`` (a libvirt URI both this process and the
    source's libvirtd can open, e.g. ``qemu+ssh://host2/system``).

    Checks first (``migration.check``: versions on both sides, no
    post-copy, room for each vGPU type there); ``dry_run`` stops there.
    A refused check is a MigrationRefused naming each refusal; else the
    guest migrates (``migration.migrate``), ``progress(stats)`` seeing
    libvirt's job statistics, Ctrl-C aborting the job.  ``on_plan(plan)``
    sees the checks before either happens.  ``migrate_uri`` (e.g.
    ``tcp://10.0.0.2:49152``) names where the guest's memory goes, when the
    destination's host name is not the way there.  ``nvml``: this host's
    NVML (``nvml.Nvml``), which reads NVIDIA's metadata of the vGPUs for
    the destination's check (``migration.stamp``) and their GPUs' layout
    (``sysfs``: this host's, a VF's physical GPU)."""
    from libvirt_gpu.virt import host as host_mod
    from libvirt_gpu.guests import migration
    source = migration_host(conn)
    with host_mod.Host(dest_uri) as dest:
        plan = migration.check(source, dest, dest_uri, domain,
                               postcopy=postcopy, nvml=nvml, sysfs=sysfs)
        if on_plan is not None:
            on_plan(plan)
        if dry_run:
            return Migration(plan=plan)
        if not plan.ok:
            raise exception.MigrationRefused(reason='; '.join(
                '%s: %s' % (c.what, c.detail) for c in plan.refusals)
                + ' (nothing was started; the guest runs on here)')
        outcome = migration.migrate(source, dest, dest_uri, domain,
                                    progress=progress,
                                    migrate_uri=migrate_uri, nvml=nvml)
    return Migration(plan=plan, outcome=outcome)
