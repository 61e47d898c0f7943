"""Live migration of a guest with vGPUs: the operator's side.

``check`` looks, before anything starts, at what VFIO migration of a
vGPU needs, through both hosts' libvirt connections:

* libvirt >= 8.6 and QEMU >= 8.1 on both sides (``MIN_LIBVIRT``,
  ``MIN_QEMU``; the versions from which libvirt and QEMU migrate VFIO
  devices, the ones nova requires for mdev live migration);
* no post-copy (QEMU refuses VFIO devices with post-copy);
* the guest runs and holds no whole GPU (VFIO cannot migrate one);
* the destination offers each mdev vGPU type of the guest with room
  enough, as libvirt's node devices there say (``availableInstances``
  of its mdev types); NVIDIA's vendor-interface vGPUs, on VFs, are not
  listed there and are left to the destination's hook.  Which types the
  destination *enables* is its own configuration: its ``migrate`` hook
  enforces that, and a refusal there cancels the migration with the
  guest running on here, untouched.

* NVIDIA's own rule, per vGPU (``driver_checks``): the source's NVML
  reads each vGPU's NVIDIA metadata (``nvmlVgpuInstanceGetMetadata``);
  NVIDIA's answer (``nvmlGetVgpuCompatibility``) needs the destination
  GPU's metadata, which only the destination's driver gives, so its
  ``migrate`` hook asks it and refuses before anything is copied.  The
  check says per vGPU what was read here and that the destination asks,
  or that it cannot (no NVML here: the destination's hook makes today's
  checks only).

* The destination's layout, per vGPU (``layout_checks``): how the
  vGPU's GPU here holds it, as this host's NVML reads it (MIG-backed:
  the GPU-instance profile of its type; mixed-size: the placement size of
  its type; time-sliced in equal-size mode), and so what a GPU there must
  have free for it.  libvirt lists neither GPU instances nor placements,
  so the destination's ``migrate`` hook judges it against its own layout
  (the driver's room: ``Allocator.reserve_incoming``) and refuses before
  anything is copied; the check says per vGPU what it needs there.

``stamp`` writes those metadata into the running domain's
``<gpu:vgpu nvidia-metadata=...>`` (live XML, which libvirt sends to the
destination); ``migrate`` stamps right before it starts, so they are
current whichever host driver runs here now.

``migrate`` then runs libvirt's peer-to-peer live migration while a
caller's ``progress`` sees the job's statistics, and aborts the job
(``abortJob``) when interrupted.
"""

import threading

from libvirt_gpu import exception
from libvirt_gpu.virt import guest as guest_mod
from libvirt_gpu.virt import nodedev
from libvirt_gpu.util import records

MIN_LIBVIRT = (8, 6, 0)
MIN_QEMU = (8, 1, 0)
# Seconds between two reads of the job's statistics.
POLL_SECONDS = 0.5


def version(number):
    """libvirt's encoded version (major * 1000000 + minor * 1000 +
    release) as a tuple."""
    return (number // 1000000, number // 1000 % 1000, number % 1000)


def _dotted(parts):
    return '.'.join(str(p) for p in parts)


@records.record
class Check:
    """One thing looked at before a migration."""

    what: str
    ok: bool
    detail: str


@records.record
class DriverAnswer:
    """NVIDIA's compatibility question for one vGPU, as far as the source
    gets: its metadata read here (``host_driver``, or ``read`` False), who
    answers, in one line (``detail``)."""

    uuid: object
    type_id: object
    read: bool
    host_driver: str | None
    detail: str


@records.record
class LayoutAnswer:
    """The destination-layout question of one vGPU, as far as the source
    gets: the vGPU mode of its GPU here (``mode``: ``capacity.MODE_MIG``,
    ``MODE_MIXED``, ``MODE_EQUAL``; None: not read), what a GPU there must
    have free for it (``needs``; None: not read), in one line
    (``detail``)."""

    uuid: object
    type_id: object
    mode: str | None
    needs: str | None
    detail: str


@records.record
class Plan:
    """What ``check`` found: the checks in order, the guest's vGPUs by
    type (``((type_id, count), ...)``), NVIDIA's question per vGPU
    (``DriverAnswer``) and the destination's layout question per vGPU
    (``LayoutAnswer``): no refusal of their own, the destination's hook
    answers both."""

    domain: str
    dest_uri: str
    checks: tuple
    vgpus: tuple = ()
    driver: tuple = ()
    layout: tuple = ()

    @property
    def ok(self):
        return all(c.ok for c in self.checks)

    @property
    def refusals(self):
        return [c for c in self.checks if not c.ok]


def _version_checks(side, host):
    lib, hyp = host.versions()
    found = []
    for name, have, need in (('libvirt', version(lib), MIN_LIBVIRT),
                             ('QEMU', version(hyp), MIN_QEMU)):
        ok = have >= need
        found.append(Check(
            what='%s %s' % (side, name), ok=ok,
            detail='%s%s' % (_dotted(have), '' if ok else
                             ' (VFIO migration needs %s >= %s: upgrade it '
                             'on the %s host)'
                             % (name, _dotted(need), side))))
    return found


def _room(dest_host):
    """``{type_id: available instances}`` over the destination's GPUs, as
    its libvirt's node devices say."""
    room = {}
    for xml in dest_host.pci_devices():
        try:
            gpu = nodedev.parse_pci(xml)
        except (ValueError, exception.InvalidInput):
            continue            # not a PCI function we can read: no room
        for t in gpu.mdev_types:
            room[t.id] = room.get(t.id, 0) + t.available_instances
    return room


def _vgpu_keys(entry):
    """Where NVML finds the vGPU ``entry``: its mdev UUID (classic vGPU),
    else its VF (vendor interface: NVML knows no UUID of it)."""
    return (entry.uuid,) + ((entry.parent,) if entry.parent is not None
                            else ())


def read_driver_metadata(meta, nvml):
    """``{uuid: VgpuMetadata or None}`` of the vGPUs of ``meta`` by this
    host's NVML (``nvml``, an ``nvml.Nvml`` or None: ``{}``)."""
    from libvirt_gpu.devices import nvml as nvml_mod
    keys = [k for entry in meta.vgpus for k in _vgpu_keys(entry)]
    found = nvml_mod.read_vgpu_metadata(nvml, keys) if keys else {}
    if not found:
        return {}
    return {entry.uuid: next((found[k] for k in _vgpu_keys(entry)
                              if found.get(k) is not None), None)
            for entry in meta.vgpus}


def driver_checks(meta, nvml):
    """One ``DriverAnswer`` per vGPU of ``meta``: NVIDIA's metadata of it
    read here, and who answers NVIDIA's compatibility question."""
    read = read_driver_metadata(meta, nvml)
    checks = []
    for entry in meta.vgpus:
        found = read.get(entry.uuid)
        if found is not None:
            detail = ('NVIDIA\'s metadata of it read here (host driver %s); '
                      'the destination\'s hook asks NVIDIA\'s driver there '
                      '(nvmlGetVgpuCompatibility) and refuses before '
                      'anything is copied unless it allows a live migration'
                      % (found.host_driver or 'unknown'))
        else:
            detail = ('NVIDIA\'s metadata of it not read here (%s): the '
                      'destination\'s hook cannot ask NVIDIA\'s driver and '
                      'makes today\'s checks only' % (
                          'NVML is not used on this host' if not read
                          else 'NVML lists no vGPU instance of it'))
        checks.append(DriverAnswer(
            uuid=entry.uuid, type_id=entry.type_id, read=found is not None,
            host_driver=found.host_driver if found is not None else None,
            detail=detail))
    return tuple(checks)


def _gpu_layout(session, gpu, entries):
    """``{uuid: (mode, needs)}`` of the vGPUs ``entries`` on the physical
    GPU ``gpu``, by this host's NVML ``session``."""
    from libvirt_gpu.devices import capacity
    mig = session.mig_mode(gpu)
    mixed = not mig and session.mixed_size(gpu)
    types = {t.type_id: t for t in session.vgpu_types(
        gpu, placements=bool(mixed))}
    names = ({p.id: p.name for p in session.gi_profiles(gpu)} if mig
             else {})
    found = {}
    for entry in entries:
        facts = types.get(entry.type_id)
        if mig:
            profile = names.get(getattr(facts, 'gi_profile_id', None))
            found[entry.uuid] = (capacity.MODE_MIG, (
                'a GPU instance of profile %s with room' % profile
                if profile else None))
        elif mixed:
            size = getattr(facts, 'placement_size', None)
            found[entry.uuid] = (capacity.MODE_MIXED, (
                'a free placement of size %d' % size
                if size is not None else None))
        else:
            found[entry.uuid] = (capacity.MODE_EQUAL,
                                 'room for the type (equal-size)')
    return found


def read_layouts(meta, nvml, sysfs):
    """``({uuid: (mode, needs)}, reason)`` of the vGPUs of ``meta`` whose
    GPU this host's NVML (``nvml``) tells of; ``reason`` (one line) says
    why the others are not read.  ``sysfs``: this host's, for a VF's
    physical GPU."""
    from libvirt_gpu.devices import nvml as nvml_mod
    if nvml is None:
        return {}, 'NVML is not used on this host'
    gpus = {}
    for entry in meta.vgpus:
        if entry.parent is None:
            continue            # "any GPU": none here to read
        gpu = (sysfs.physfn(entry.parent) if sysfs is not None
               else None) or entry.parent
        gpus.setdefault(gpu, []).append(entry)
    found, reason = {}, 'no GPU of it named here'
    try:
        with nvml.session() as session:
            for gpu, entries in sorted(gpus.items()):
                try:
                    found.update(_gpu_layout(session, gpu, entries))
                except (nvml_mod.NvmlError, nvml_mod.NvmlUnavailable) as e:
                    reason = 'NVML cannot tell of its GPU %s: %s' % (
                        gpu, e.kwargs.get('reason', e))
    except nvml_mod.NvmlUnavailable as e:
        return {}, str(e).split(';')[0]
    return found, reason


def layout_checks(meta, nvml, sysfs=None):
    """One ``LayoutAnswer`` per vGPU of ``meta``: how its GPU here holds
    it, and what the destination's hook needs free there."""
    found, reason = read_layouts(meta, nvml, sysfs) if meta.vgpus \
        else ({}, None)
    answers = []
    for entry in meta.vgpus:
        mode, needs = found.get(entry.uuid, (None, None))
        if mode is None:
            detail = ('its GPU\'s vGPU mode not read here (%s): the '
                      'destination\'s hook judges it against its own '
                      'layout' % reason)
        else:
            detail = ('%s here: the destination\'s hook reserves it only '
                      'on a GPU with %s (its own layout, as its driver '
                      'reads it) and refuses before anything is copied '
                      'otherwise' % (mode, needs or 'room for the type'))
        answers.append(LayoutAnswer(uuid=entry.uuid, type_id=entry.type_id,
                                    mode=mode, needs=needs, detail=detail))
    return tuple(answers)


def stamp(guest, nvml):
    """Write NVIDIA's metadata of each vGPU of the running ``guest``,
    as this host's NVML reads it now, into its live metadata (an entry NVML
    reads nothing of loses an older one: never a stale answer).  Returns
    the ``GpuMetadata`` written, or None when nothing changed."""
    _, meta = guest.devices()
    read = read_driver_metadata(meta, nvml)
    entries = tuple(records.replace(
        e, driver_metadata=(read[e.uuid].raw if read.get(e.uuid)
                            else None)) for e in meta.vgpus)
    if entries == meta.vgpus:
        return None
    meta = records.replace(meta, vgpus=entries)
    guest.set_gpu_metadata(meta, live=True)
    return meta


def check(source_host, dest_host, dest_uri, domain, postcopy=False,
          nvml=None, sysfs=None):
    """The ``Plan`` of migrating ``domain`` (name or UUID, on
    ``source_host``) to ``dest_host`` (reached by the source's libvirtd at
    ``dest_uri``); ``nvml``: the source host's NVML (``nvml.Nvml``), for
    NVIDIA's metadata of its vGPUs and their GPUs' layout; ``sysfs``: the
    source host's (a VF's physical GPU)."""
    guest = guest_mod.Guest(source_host.lookup_domain(domain))
    checks = []
    checks.extend(_version_checks('source', source_host))
    checks.extend(_version_checks('destination', dest_host))
    checks.append(Check(
        what='post-copy', ok=not postcopy,
        detail='not asked for' if not postcopy else
        'asked for, but QEMU refuses VFIO devices with post-copy: '
        'migrate with pre-copy (leave post-copy out)'))
    running = guest.is_active()
    checks.append(Check(what='guest running', ok=running,
                        detail='yes' if running else
                        'no: a stopped guest is not migrated live; start '
                        'it, or move its definition instead'))
    devices, meta = guest.devices()
    for entry in meta.pgpus:
        checks.append(Check(
            what='whole GPU %s' % entry.address, ok=False,
            detail='VFIO cannot migrate a whole GPU: detach it '
                   '(`libvirt-gpu detach --address %s`) first'
                   % entry.address))
    wanted = {}
    for entry in meta.vgpus:
        wanted[entry.type_id] = wanted.get(entry.type_id, 0) + 1
    # A vendor-interface vGPU is a VF (a PCI hostdev), not an mdev: the
    # destination's libvirt lists no mdev type for it, its hook judges it.
    on_vfs = {e.type_id for e in meta.vgpus
              if e.parent is not None and e.parent in devices.pci_addresses}
    as_mdev = set(wanted) - on_vfs
    room = _room(dest_host) if as_mdev else {}
    for type_id, count in sorted(wanted.items()):
        free = room.get(type_id)
        if type_id not in as_mdev:
            ok = True
            detail = ('%d needed, on VFs (vendor interface): libvirt does '
                      'not list them; the destination\'s hook checks the '
                      'room' % count)
        elif free is None:
            ok = False
            detail = ('the destination offers no %s (libvirt lists no GPU '
                      'with that mdev type there)' % type_id)
        else:
            ok = free >= count
            detail = '%d needed, %d available%s' % (
                count, free, '' if ok else ': free vGPUs there first')
        checks.append(Check(what='destination room for %s' % type_id,
                            ok=ok, detail=detail))
    return Plan(domain=guest.name, dest_uri=dest_uri, checks=tuple(checks),
                vgpus=tuple(sorted(wanted.items())),
                driver=driver_checks(meta, nvml),
                layout=layout_checks(meta, nvml, sysfs))


def _runs_here(guest):
    try:
        return guest.is_active()
    except exception.DomainNotFound:
        return False            # a transient guest that left


@records.record
class Outcome:
    """How a migration ended: ``done`` or aborted, and what libvirt
    measured (None where it did not say): the downtime and the job's whole
    time (ms), the bytes of memory in play."""

    done: bool
    downtime_ms: int | None = None
    data_total: int | None = None
    elapsed_ms: int | None = None
    # why libvirt did not abort when asked (the job was past the point)
    abort_refused: str | None = None


def migrate(source_host, dest_host, dest_uri, domain, progress=None,
            poll=POLL_SECONDS, interrupt=KeyboardInterrupt,
            migrate_uri=None, nvml=None):
    """Migrate ``domain`` live to ``dest_uri`` (check it first: ``check``),
    its memory over ``migrate_uri`` when given (``Guest.migrate_live``).
    ``progress(stats)`` is called with the job's statistics while it runs;
    an ``interrupt`` (Ctrl-C) aborts the job and waits for libvirt to put
    the guest back, running, on the source.  Returns an ``Outcome``;
    libvirt's refusal is a LibvirtError that says why.  ``nvml`` (this
    host's): NVIDIA's metadata of the vGPUs is written first (``stamp``)."""
    guest = guest_mod.Guest(source_host.lookup_domain(domain))
    uuid = guest.uuid
    if nvml is not None:
        stamp(guest, nvml)
    failed = []

    def run():
        try:
            guest.migrate_live(dest_uri, migrate_uri=migrate_uri)
        except exception.LibvirtGpuError as e:
            failed.append(e)

    worker = threading.Thread(target=run, name='migrate', daemon=True)
    worker.start()
    aborted = False
    refused = None
    while worker.is_alive():
        try:
            worker.join(poll)
            if worker.is_alive() and progress is not None:
                stats = guest.job_stats()
                if stats:
                    progress(stats)
        except interrupt:
            aborted = True
            refused = guest.abort_job()
    worker.join()
    if failed:
        if aborted:
            return Outcome(done=False)
        raise failed[0]
    if aborted and refused is None and _runs_here(guest):
        # libvirt 9.0 took the abort while the destination was preparing
        # and then returned from the migration without an error: the guest
        # running on here is the answer.
        return Outcome(done=False)
    # Done (also when an abort came too late to stop it).  The source
    # keeps the completed job's statistics (downtime included) while its
    # domain is defined; the destination's incoming job has fewer.
    stats = guest.job_stats(completed=True)
    if 'downtime' not in stats:
        stats = guest_mod.Guest(dest_host.lookup_domain(uuid)).job_stats(
            completed=True) or stats
    return Outcome(done=True, downtime_ms=stats.get('downtime'),
                   data_total=stats.get('data_total'),
                   elapsed_ms=stats.get('time_elapsed'),
                   abort_refused=refused or None)
