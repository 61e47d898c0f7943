"""The hook's operations, as a table, and ``run``, the hook's one edge.

Each row of ``OPERATIONS`` (an ``Operation``) declares what the operation
reads of its input, whether it may print a rewritten domain XML on stdout
(libvirt's ``migrate`` and ``restore`` take the hook's stdout as the new
XML, an empty stdout meaning unchanged) and its exit rule: an operation
that *may refuse* exits 1 on any error, and libvirt stops what it was
doing; one that *never fails* logs the error and exits 0.  ``run`` parses
the input at the edge (then acts on typed values only), calls the row's
function and maps every error, ours or not, to the row's rule; no
operation chooses its exit status itself.

A new operation is one more row and one function (a ``Hook`` method)
taking the ``Hook`` and the ``Request`` and returning ``None`` (stdout
stays empty) or, for a row with ``rewrites``, the ``xmledit.Document`` it
edited in place (what is not ours comes back byte for byte); the
operation's name is also listed in ``hooks/qemu``'s ``HANDLED`` (a test
keeps the two in step).

``incoming`` and ``xmledit`` serve ``migrate`` alone: they are imported
when a row reads ``DOCUMENT`` or migrates, not at every guest start.
"""

from __future__ import annotations

import os
import sys

from libvirt_gpu.host import allocator as allocator_mod
from libvirt_gpu.devices.backends import base
from libvirt_gpu.devices import routes as routes_mod
from libvirt_gpu.virt import config_xml
from libvirt_gpu import environment
from libvirt_gpu import exception
from libvirt_gpu.store import figures
from libvirt_gpu.guests.hook import log as log_mod
from libvirt_gpu.guests.hook import settings as settings_mod
from libvirt_gpu.virt import metadata
from libvirt_gpu.util import records
from libvirt_gpu.store import state
from libvirt_gpu.store import statedir
from libvirt_gpu.devices import sysfs as sysfs_mod
from libvirt_gpu.util import xmlutil

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import BinaryIO, TextIO

    from libvirt_gpu import objects
    from libvirt_gpu.util import xmledit

PREPARE = 'prepare'
RELEASE = 'release'
RECONNECT = 'reconnect'
MIGRATE = 'migrate'
# reconnect names at most this many missing vGPUs, then counts the rest.
RECONNECT_LISTED = 10

# What hooks/qemu scans stdin for before importing anything (kept in step
# with it by a test): our namespace, an mdev hostdev, the start of a
# DOCTYPE or entity declaration, and a NUL byte (UTF-16 or UTF-32 text,
# where the others cannot be seen): refused here, never ignored.  And a
# character reference (``&#58;``, ``&#x6D;``), which can spell any of the
# others out of the fast path's sight: such a domain is parsed.
MARKERS = (metadata.NAMESPACE.encode(), b'mdev', b'<!DOCTYPE', b'<!ENTITY',
           b'\x00', b'&#')


# What an operation may read of its input (``Operation.reads``).
DEVICES = 'devices'        # <uuid>, <name>, the <hostdev>s, the pinning
METADATA = 'metadata'      # our <gpu:gpus> element
DOCUMENT = 'document'      # the input's bytes, editable in place (xmledit)


@records.record
class Request:
    """The accepted input of one hook call: what its operation reads."""

    operation: str
    domain: config_xml.DomainDevices
    meta: metadata.GpuMetadata
    document: xmledit.Document | None = None    # when read

    @property
    def label(self) -> str:
        return '%r (%s)' % (self.domain.name[:80], self.domain.uuid)

    @property
    def ours(self) -> bool:
        return not self.meta.empty or bool(self.domain.mdev_uuids)


def parse_request(operation: str, data: bytes,
                  reads: tuple[str, ...] = (DEVICES, METADATA)) -> Request:
    """Validate stdin, reading what ``reads`` names; InvalidInput (with
    the reason) when refused."""
    what = 'domain XML on stdin'
    # libvirt writes UTF-8 only; anything else is refused, never
    # decoded by a guess (nor edited at byte offsets: ``xmledit``)
    data = xmlutil.require_utf8(xmlutil.checked_bytes(data, what), what)
    root = xmlutil.parse(data, what)
    domain = config_xml.read_domain(root)
    meta = metadata.parse(root) if METADATA in reads else \
        metadata.GpuMetadata()
    document = None
    if DOCUMENT in reads:
        from libvirt_gpu.util import xmledit
        document = xmledit.Document.parse(data, what)
    return Request(operation=operation, domain=domain, meta=meta,
                   document=document)


class Hook(object):
    """One hook call on the host ``env`` (``environment.Environment``
    built from the settings snapshot: no libvirt)."""

    def __init__(self, env: environment.Environment,
                 log: log_mod.HookLog) -> None:
        self.env = env
        self.log = log
        # Every vGPU kind (classic mdev, NVIDIA's vendor interface on VFs)
        # behind one object: see backends.registry.
        self.vgpus = env.vgpus
        self.allocator = env.allocator

    # prepare ------------------------------------------------------------

    def claims(self, req: Request) -> list[allocator_mod.VgpuClaim]:
        """VgpuClaims of the domain: metadata first, then the hostdevs a
        vGPU kind defines persistently (``Vgpus.defined_device``)."""
        claims: list[allocator_mod.VgpuClaim] = []
        listed: set[objects.Uuid] = set()
        for entry in req.meta.vgpus:
            listed.add(entry.uuid)
            if not self.vgpus.in_devices(req.domain, entry.uuid,
                                         entry.parent):
                self.log.warning(
                    'metadata lists vGPU %s but <devices> has no <hostdev '
                    "type='mdev'> with that UUID; it is not created"
                    % entry.uuid)
                continue
            claims.append(allocator_mod.VgpuClaim(
                uuid=entry.uuid, type_id=entry.type_id, parent=entry.parent))
        for uuid in req.domain.mdev_uuids:
            if uuid in listed:
                continue
            device = self.vgpus.defined_device(uuid)
            if device is None:
                self.log.info('vGPU %s is neither in our metadata nor '
                              'defined persistently: left to libvirt' % uuid)
                continue
            route = self.env.routes.route_of_parent(self.vgpus.sysfs,
                                                    device.parent)
            if route != routes_mod.OURS:
                # Nova's definition of a Cyborg vGPU, say: Nova creates it
                # when it is missing, not us
                gpu = self.vgpus.sysfs.physfn(device.parent) or device.parent
                self.log.info('vGPU %s is defined on %s, %s: left to that '
                              'route' % (uuid, gpu, routes_mod.LABELS[route]))
                continue
            claims.append(allocator_mod.VgpuClaim(
                uuid=uuid, type_id=device.type_id, parent=device.parent,
                managed=False))
        return claims

    def check_pgpus(self, req: Request) -> None:
        for entry in req.meta.pgpus:
            setting = self.env.enabled.get(entry.address)
            if setting is not None:
                raise exception.GpuInUse(
                    address=entry.address,
                    reason='it is configured to offer vGPU type %s ([gpu]/'
                           'enabled_vgpu_types)' % setting.type_id)
            if entry.address not in req.domain.pci_addresses:
                self.log.warning(
                    "metadata lists GPU %s but <devices> has no <hostdev "
                    "type='pci'> with that address" % entry.address)
            # The same rule as the attach: a group of its own (but for its
            # companions), and every companion handed over with it, else
            # qemu fails on a group VFIO calls "not viable".
            device = base.PgpuDevice(entry.address)   # parsed: metadata
            companions = self.env.pci.companions(device)
            missing = [str(a) for a in companions
                       if a not in req.domain.pci_addresses]
            if missing:
                raise exception.GpuInUse(
                    address=entry.address,
                    reason="its IOMMU group also holds %s, which must go to "
                           "the guest with it; add a <hostdev type='pci' "
                           "managed='yes'> for each (`libvirt-gpu attach "
                           "--address` does)" % ', '.join(missing))
            self.env.pci.prepare(device)

    def prepare(self, req: Request) -> None:
        self.check_pgpus(req)
        claims = self.claims(req)
        if not claims:
            return None
        grants = self.allocator.reserve(req.domain.uuid, claims,
                                        pinning=req.domain.pinning)
        state.crash_point('prepare:reserved')
        created: list[allocator_mod.Grant] = []
        try:
            for grant in grants:
                if grant.existed:
                    continue
                self.vgpus.prepare(grant.device)
                created.append(grant)
                state.crash_point('prepare:created')
            self.allocator.mark_created(
                [g.device.uuid for g in grants
                 if g.lease is not None and not g.existed])
            state.crash_point('prepare:marked')
        except BaseException:
            self.rollback(grants, created)
            self._give_back(req, grants)
            raise
        for grant in grants:
            d = grant.device
            self.log.info('%s vGPU %s (%s on %s)' % (
                'kept existing' if grant.existed else 'created', d.uuid,
                d.type_id, d.parent))
        return None

    def rollback(self, grants: Sequence[allocator_mod.Grant],
                 created: Sequence[allocator_mod.Grant]) -> None:
        """Remove what this call created and drop the leases it took (a
        vGPU that cannot be removed keeps its lease, for reconcile)."""
        stuck: set[objects.Uuid] = set()
        for grant in created:
            try:
                self.vgpus.remove(grant.device.uuid)
                self.log.info('rolled back vGPU %s' % grant.device.uuid)
            except exception.LibvirtGpuError as e:
                stuck.add(grant.device.uuid)
                self.log.error('rollback: %s' % e)
        fresh = [g.device.uuid for g in grants
                 if g.lease is not None and not g.existed
                 and g.device.uuid not in stuck]
        try:
            self.allocator.forget(fresh)
        except exception.LibvirtGpuError as e:
            self.log.error('rollback: %s' % e)

    def _give_back(self, req: Request,
                   grants: Sequence[allocator_mod.Grant]) -> None:
        """A refused start no longer uses the existing mdevs it borrowed."""
        borrowed = [g.device.uuid for g in grants if g.lease is None]
        if not borrowed:
            return
        try:
            self.allocator.give_back(req.domain.uuid, borrowed)
        except exception.LibvirtGpuError as e:
            self.log.error('rollback: %s' % e)

    # release / reconnect -------------------------------------------------

    def release(self, req: Request) -> None:
        leases = self.allocator.begin_release(req.domain.uuid)
        done: list[objects.Uuid] = []
        for lease in leases:
            try:
                removed = self.vgpus.remove(lease.vgpu_uuid)
            except exception.LibvirtGpuError as e:
                self.log.error('vGPU %s of %s stays (its lease too, for '
                               '`libvirt-gpu reconcile`): %s'
                               % (lease.vgpu_uuid, req.label, e))
                continue
            done.append(lease.vgpu_uuid)
            self.log.info('%s vGPU %s (%s on %s)' % (
                'removed' if removed else 'already gone:', lease.vgpu_uuid,
                lease.type_id, lease.parent))
        if done:
            self.allocator.forget(done)
        return None

    def reconnect(self, req: Request) -> None:
        in_use = list(req.domain.mdev_uuids) + [
            e.uuid for e in req.meta.vgpus
            if e.uuid not in req.domain.mdev_uuids
            and self.vgpus.in_devices(req.domain, e.uuid, e.parent)]
        missing = [uuid for uuid in in_use
                   if self.vgpus.lookup(uuid) is None]
        for uuid in missing[:RECONNECT_LISTED]:
            self.log.warning('running domain %s uses vGPU %s, which does '
                             'not exist' % (req.label, uuid))
        if len(missing) > RECONNECT_LISTED:
            self.log.warning('running domain %s uses %d more vGPUs that do '
                             'not exist' % (req.label,
                                            len(missing) - RECONNECT_LISTED))
        self.log.info('reconnect: %d vGPU(s) in use, %d missing'
                      % (len(in_use), len(missing)))
        return None

    # migrate (the destination, before prepare) ---------------------------

    def migrate(self, req: Request) -> xmledit.Document | None:
        from libvirt_gpu.guests.hook import incoming
        return incoming.migrate(self, req)


@records.record
class Operation:
    """One row of the hook's table (see the module's docstring)."""

    name: str                  # libvirt's operation (argv[2])
    function: Callable[[Hook, Request], xmledit.Document | None]
    reads: tuple[str, ...]     # DEVICES, METADATA, DOCUMENT
    rewrites: bool             # may print a rewritten domain XML
    may_refuse: bool           # errors exit 1 (True) or 0 (False)
    failure: str               # what an error line says it could not do

    @property
    def failure_rc(self) -> int:
        return 1 if self.may_refuse else 0


OPERATIONS = (
    # A refused prepare makes libvirt refuse the start and show the reason.
    Operation(name=PREPARE, function=Hook.prepare,
              reads=(DEVICES, METADATA), rewrites=False, may_refuse=True,
              failure='cannot start'),
    Operation(name=RELEASE, function=Hook.release,
              reads=(DEVICES, METADATA), rewrites=False, may_refuse=False,
              failure='cannot clean up after'),
    # A non-zero exit at reconnect would kill the running guest.
    Operation(name=RECONNECT, function=Hook.reconnect,
              reads=(DEVICES, METADATA), rewrites=False, may_refuse=False,
              failure='cannot check'),
    # On the destination, before prepare: reserve this host's vGPUs and
    # name them in the XML libvirt will start; a refusal cancels the
    # migration and the guest runs on at the source (hook/incoming.py).
    Operation(name=MIGRATE, function=Hook.migrate,
              reads=(DEVICES, METADATA, DOCUMENT), rewrites=True,
              may_refuse=True, failure='cannot migrate in'),
)
HANDLED = tuple(op.name for op in OPERATIONS)


def operation(name: str, table: Sequence[Operation] = OPERATIONS
              ) -> Operation | None:
    """The row of ``table`` named ``name``, or None."""
    return next((op for op in table if op.name == name), None)


def run(argv: Sequence[str], data: bytes,
        config_file: str = settings_mod.DEFAULT_CONFIG_FILE,
        settings_file: str | None = None,
        sysfs: sysfs_mod.Sysfs | None = None, stderr: TextIO | None = None,
        stdout: BinaryIO | None = None,
        table: Sequence[Operation] = OPERATIONS,
        **places: str | None) -> int:
    """One hook call; returns the exit status.  ``sysfs`` replaces the
    configured ``Sysfs`` and ``places`` the places the vGPU kinds keep
    their files in (``Environment``'s keyword arguments: tests); a
    rewritten domain XML goes to ``stdout`` (a binary stream), and nothing
    else ever does."""
    stderr = stderr if stderr is not None else sys.stderr
    log = log_mod.HookLog(argv, stderr)
    op = operation(argv[2] if len(argv) > 2 else '', table)
    if op is None:
        return 0
    timer = figures.HookTimer(op.name)
    try:
        req = parse_request(op.name, data, op.reads)
    except exception.InvalidInput as e:
        log.error('%s of domain %r refused, nothing done: %s'
                  % (op.name, argv[1][:80] if len(argv) > 1 else '?', e))
        log.flush()
        return op.failure_rc
    except Exception as e:  # noqa: BLE001 - release/reconnect never fail
        log.error('internal error reading the XML of %s of domain %r, '
                  'nothing done: %s: %s'
                  % (op.name, argv[1][:80] if len(argv) > 1 else '?',
                     type(e).__name__, e))
        log.flush()
        return op.failure_rc
    if not req.ours:
        return 0
    outcome = figures.ERROR
    try:
        output = _call(op, req, log, config_file, settings_file, sysfs,
                       places)
        outcome = figures.ERROR if log.errors else figures.OK
    except exception.LibvirtGpuError as e:
        outcome = figures.REFUSED if op.may_refuse else figures.ERROR
        log.error('%s domain %s: %s' % (op.failure, req.label, e))
        return op.failure_rc
    except Exception as e:  # noqa: BLE001 - the hook's edge: report, exit
        log.error('internal error in %s of %s: %s: %s'
                  % (op.name, req.label, type(e).__name__, e))
        return op.failure_rc
    finally:
        log.record(timer, outcome)
        log.flush()
    if output is not None and output.changed:
        data = output.tobytes()
        try:
            # libvirt starts the guest from what we print: never XML that
            # is not well-formed (the operation checks it before it
            # commits anything; this is the edge's own word)
            xmlutil.parse(data, 'the rewritten domain XML')
        except exception.InvalidXml as e:
            log.error('internal error in %s of %s, nothing printed: %s'
                      % (op.name, req.label, e))
            log.flush()
            return op.failure_rc
        out = stdout if stdout is not None else sys.stdout.buffer
        out.write(data)
        out.flush()
    return 0


def _carved_vfs(env: environment.Environment, req: Request,
                log: log_mod.HookLog) -> tuple[objects.PciAddress, ...]:
    """The PCI hostdevs of the domain that are VFs carved for Nova, by
    the rule the allocator judges its GPUs by (``carving.on_host``: one
    ``env.carved``); a record that cannot be read is said, with what to
    do."""
    carved = env.carved
    if carved.damaged is not None:
        log.warning('%s; until then the GPUs whose VFs could be carved for '
                    'Nova (%s) are held as Nova\'s' % (
                        carved.damaged, ', '.join(
                            str(a) for a in sorted(carved.holding))
                        or 'none on this host'))
    return tuple(sorted(a for a in req.domain.pci_addresses
                        if a in carved.vfs))


def _call(op: Operation, req: Request, log: log_mod.HookLog,
          config_file: str, settings_file: str | None,
          sysfs: sysfs_mod.Sysfs | None,
          places: dict[str, str | None]) -> xmledit.Document | None:
    """The row's function on a host built from the settings snapshot;
    its ``xmledit.Document`` when it may rewrite the XML, else None."""
    settings, note = settings_mod.load_settings(config_file, settings_file)
    # A state directory someone else could steer is refused before the
    # log (or anything) is written there.
    statedir.ensure_dir(settings.state_dir)
    log.path = os.path.join(settings.state_dir, log_mod.LOG_NAME)
    if note:
        log.info(note)
    env = environment.Environment.for_hook(
        settings, sysfs or sysfs_mod.Sysfs(settings.sysfs_root), **places)
    novas = _carved_vfs(env, req, log)
    if novas and not (req.ours and op.name in (PREPARE, MIGRATE)):
        # Nova's guest (its VF hostdev is a VF carved for Nova): no lease,
        # no rewrite, nothing created or removed.  Only a guest of ours
        # (our metadata or mdevs) asking for a carved VF at a start or an
        # incoming migration goes on to its operation, whose claim the
        # allocator refuses (GpuInUse): the VF is never handed to it.
        log.info('domain %s uses VF(s) carved for Nova (%s): left to Nova'
                 % (req.label, ', '.join(str(a) for a in novas)))
        return None
    output = op.function(Hook(env, log), req)
    if output is not None and not op.rewrites:
        raise TypeError('operation %s returned XML but its row does not '
                        'let it rewrite the domain' % op.name)
    return output
