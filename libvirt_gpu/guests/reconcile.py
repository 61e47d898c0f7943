"""Find and repair what crashes and reboots leave behind.

A vGPU (of any kind: ``backends.registry.Vgpus``) or lease is an orphan
when no running domain uses it and no live process is working on it:

* a lease whose holder process died (a crash in attach or in the hook's
  prepare, a release that could not remove its vGPU) and whose vGPU no
  running domain uses: the vGPU is removed if it exists, then the lease;
* a vGPU with no lease that no domain (running, or defined and stopped)
  references and that no kind defines persistently (``Vgpus.definition``:
  mdevctl's definitions, the vendor interface's state file): removed;
* a lease whose vGPU a running domain uses but that was left ``reserved``:
  marked ``created``.

A reservation for an incoming live migration (``Lease.held``: the
destination's ``migrate`` hook made it and exited) is listed (``incoming``:
it takes room a local start may be refused for) and left alone until it
expires; then, when its ``prepare`` never came, it is an orphan like any
other lease whose process is gone, and the report says so.

Another route's GPUs (``routes.Routes``: Cyborg's, Nova's PCI route, Nova's
own vGPUs) are never ours to clean, with one exception.  On a GPU given to
Cyborg a vGPU no domain names is kept: Cyborg's agent made it when an ARQ
was bound, and Nova's spawn names it later.  Nova makes a vGPU it finds
missing at spawn persistent (a definition with autostart), and Cyborg's
unbind removes only the live device; so a definition on a Cyborg GPU that
no domain (running or defined) names is Nova's leftover of an ARQ that is
gone: undefined when it is not live; when it is live (libvirt started it
at boot) it is removed and undefined only at boot (``boot``: ``restore``
with libvirt, before nova-compute), and reported otherwise (a spawn may be
between its definition and its domain's).

Reported, not touched: a lease whose holder is still running after
``stuck_after`` seconds, a removal that does not finish (a process may hold
the device), a running domain that uses a vGPU that does not exist, a vGPU
used by two running domains or leased to another domain than the one using
it, and a domain whose XML cannot be read (then no unleased vGPU is
removed: we could not prove nobody references it).  The report calls a
vGPU an ``mdev`` whatever its kind (its findings' ``what``).

Ordering, so that reconcile never races a guest start: vGPUs are listed,
then domains (libvirt is never called under the lease lock: a starting
guest's hook may be waiting for that lock while libvirt waits for the
hook), then under the lock every lease still untouched since that moment
is judged and the ones to remove are claimed (``removing``, held by this
process; an unleased orphan gets such a lease too, so no prepare can adopt
it meanwhile).  Removal happens outside the lock; the leases of what was
removed are dropped at the end.
"""

from __future__ import annotations

import os
import threading
import time

from libvirt_gpu.devices import routes as routes_mod
from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.util import records
from libvirt_gpu.store import state

REMOVED = 'removed'
WOULD_REMOVE = 'would remove'
REPAIRED = 'repaired'
WOULD_REPAIR = 'would repair'
KEPT = 'kept'
# An incoming live migration's reservation that still stands: listed
# (it takes room a local start may miss), left alone.
INCOMING = 'incoming'
STUCK = 'stuck'
CONFLICT = 'conflict'
# Seconds a removal may take, where the Environment does not say.
REMOVE_TIMEOUT = 15.0


@records.record
class Finding:
    action: str          # one of the constants above
    what: str            # 'mdev', 'lease', 'mdev+lease', 'domain'
    uuid: str
    reason: str
    parent: objects.PciAddress | None = None
    type_id: str | None = None
    domain_uuid: str | None = None


@records.record
class Report:
    """What ``reconcile`` found; the report shape of the CLI (``summary``,
    ``COLUMNS`` and ``rows``, ``details``, ``to_json``)."""

    dry_run: bool
    findings: tuple[Finding, ...]

    COLUMNS = ('ACTION', 'WHAT', 'UUID', 'GPU', 'TYPE', 'REASON')

    def of(self, *actions):
        return [f for f in self.findings if f.action in actions]

    def would_remove(self, *whats):
        """What a dry run found to remove, of these kinds (``what``):
        ``'lease'``/``'mdev+lease'``, a lease whose holder died and that
        no running domain uses; ``'mdev'``, a vGPU no lease or domain
        explains."""
        return [f for f in self.findings
                if f.action == WOULD_REMOVE and f.what in whats]

    @property
    def stuck(self):
        return self.of(STUCK, CONFLICT)

    def summary(self):
        if not self.findings:
            return 'nothing to do: every vGPU and lease is accounted for'
        counts = {}
        for f in self.findings:
            counts[f.action] = counts.get(f.action, 0) + 1
        return '%s%s' % (', '.join('%d %s' % (n, a)
                                   for a, n in sorted(counts.items())),
                         ' [dry run]' if self.dry_run else '')

    def rows(self):
        return [(f.action, f.what, f.uuid, f.parent, f.type_id, f.reason)
                for f in self.findings]

    def details(self):
        return ()

    def to_json(self):
        return {'dry_run': self.dry_run, 'findings': [
            {'action': f.action, 'what': f.what, 'uuid': f.uuid,
             'parent': str(f.parent) if f.parent else None,
             'type': f.type_id, 'domain_uuid': f.domain_uuid,
             'reason': f.reason} for f in self.findings]}


@records.record
class DomainRefs:
    """Which mdev UUIDs the domains reference (hostdevs and metadata)."""

    running: dict[str, frozenset[str]]   # uuid -> domains
    defined: dict[str, frozenset[str]]   # uuid -> domains
    unreadable: tuple[Finding, ...]


def _uuids_of(guest, inactive):
    """The vGPU UUIDs one XML of ``guest`` names (hostdevs, metadata)."""
    devices, meta = guest.devices(inactive=inactive)
    return set(devices.mdev_uuids) | {v.uuid for v in meta.vgpus}


def domain_refs(host):
    """Read every domain's live and persistent XML through libvirt."""
    running, defined, bad = {}, {}, []
    for guest in host.list_guests():
        try:
            dom_uuid = guest.uuid
            xmls = []
            if guest.is_active():
                xmls.append((running, False))
            if guest.is_persistent():
                xmls.append((defined, True))
            for target, inactive in xmls:
                try:
                    uuids = _uuids_of(guest, inactive)
                except exception.InvalidInput as e:
                    bad.append(Finding(CONFLICT, 'domain', dom_uuid,
                                       'its XML cannot be read: %s' % e,
                                       domain_uuid=dom_uuid))
                    continue
                for uuid in uuids:
                    target.setdefault(uuid, set()).add(dom_uuid)
        except exception.DomainNotFound:
            continue              # undefined while we listed
    freeze = (lambda d: {k: frozenset(v) for k, v in d.items()})
    return DomainRefs(running=freeze(running), defined=freeze(defined),
                      unreadable=tuple(bad))


def _all_vgpus(vgpus):
    """``{uuid: (parent, type_id)}`` of every vGPU of every kind now."""
    return vgpus.existing()


def _remove_with_timeout(backend, uuid, timeout):
    """Remove in a thread: a remove the kernel blocks (a process holds the
    device) must not hang reconcile.  Returns None or the reason."""
    outcome = {}

    def work():
        try:
            backend.remove(uuid)
            outcome['ok'] = True
        except exception.LibvirtGpuError as e:
            outcome['error'] = str(e)
    thread = threading.Thread(target=work, daemon=True,
                              name='remove-%s' % uuid)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        return ('its removal did not finish within %.0f s; a process may '
                'still hold the device' % timeout)
    return outcome.get('error')


def check_connection(host):
    """Refuse a libvirt connection that cannot know this host's domains:
    libvirt's test driver (``test:///...``) has its own made-up ones, so
    every mdev of the host would look unused."""
    uri = host.connect().getURI() or ''
    if uri.split(':', 1)[0] == 'test':
        raise exception.InvalidInput(
            reason='reconcile needs the libvirt that runs this host\'s '
                   'guests; %s is libvirt\'s test driver, which knows none '
                   'of them (every vGPU would look unused): connect to '
                   'qemu:///system with -c' % uri)


def reconcile(env, dry_run=False, stuck_after=300.0, covered=(),
              on_plan=None, boot=False):
    """Repair what can be repaired on the host ``env`` (an
    ``environment.Environment`` with its libvirt ``host``; nothing when
    ``dry_run``); a Report of every finding.  A removal may take
    ``env.remove_timeout`` seconds (``REMOVE_TIMEOUT`` when it is None).

    ``covered``: the physical GPUs (``PciAddress``) the configuration
    enables; an mdev nobody leased is judged only on those (or when it is
    one of our recorded vendor-interface vGPUs): reconcile never removes
    what someone else made on a GPU we do not manage, nor anything on a GPU
    of another route (``env.routes``) but Nova's leftover definitions on
    Cyborg's (the module doc; ``boot``: the host is booting, before
    nova-compute).  ``on_plan(findings)`` is called with what will be
    removed before anything is.
    """
    host = env.host
    check_connection(host)
    covered = frozenset(objects.typed(a, objects.PciAddress, 'covered[]')
                        for a in covered)
    if env.remove_timeout is None:
        env = env.replace(remove_timeout=REMOVE_TIMEOUT)
    remove_timeout = env.remove_timeout
    store = env.store
    backend = env.vgpus
    routes = env.routes
    covered = covered - frozenset(routes.owners)
    started = time.time()
    vgpus_before = _all_vgpus(backend)
    definitions = backend.definitions()
    refs = domain_refs(host)
    findings = list(refs.unreadable)
    planned = []              # (uuid, parent, type_id, domain, reason, what)
    # A dry run writes nothing: it reads the leases without the lock, so
    # it never holds up a guest start (``libvirt-gpu exporter`` runs one
    # per scrape).
    with (store.snapshot() if dry_run else store.transaction()) as txn:
        vgpus = _all_vgpus(backend)
        leased = _judge_leases(txn, refs, vgpus, started, stuck_after,
                               dry_run, findings, planned)
        findings.extend(_return_borrowed(txn, refs, started, dry_run))
        unleased = {uuid: where for uuid, where in vgpus_before.items()
                    if uuid not in leased and uuid in vgpus}
        _judge_unleased(txn, refs, backend, covered, unleased, dry_run,
                        findings, planned, routes, definitions)
        _judge_cyborg_definitions(txn, refs, backend, routes, definitions,
                                  vgpus, boot, dry_run, findings, planned)
    if on_plan is not None and planned and not dry_run:
        on_plan([Finding(WOULD_REMOVE, what, uuid, reason, parent=parent,
                         type_id=type_id, domain_uuid=domain)
                 for uuid, parent, type_id, domain, reason, what in planned])
    findings.extend(_carry_out(store, backend, planned, dry_run,
                               remove_timeout))
    return Report(dry_run=dry_run, findings=tuple(findings))


def leftovers(env, dry_run=False, boot=True):
    """Only Nova's leftover definitions on Cyborg's GPUs (the module doc;
    ``restore``'s last step, with libvirt, at boot): a Report of what was
    undefined (and removed), or would be, and what was kept."""
    check_connection(env.host)
    backend = env.vgpus
    definitions = backend.definitions()
    refs = domain_refs(env.host)
    findings = list(refs.unreadable)
    planned = []
    store = env.store
    with (store.snapshot() if dry_run else store.transaction()) as txn:
        _judge_cyborg_definitions(txn, refs, backend, env.routes,
                                  definitions, _all_vgpus(backend), boot,
                                  dry_run, findings, planned)
    findings.extend(_carry_out(store, backend, planned, dry_run,
                               env.remove_timeout or REMOVE_TIMEOUT))
    return Report(dry_run=dry_run, findings=tuple(findings))


def _judge_leases(txn, refs, vgpus, started, stuck_after, dry_run, findings,
                  planned):
    """Every lease: stuck (a live holder for too long), used (judged by
    ``_judge_used``), or planned for removal (nobody runs it, its holder
    is gone).  A lease changed after the domains were listed is left
    alone.  Returns the leased UUIDs."""
    me = os.getpid()
    leased = set()
    for lease in txn.all():
        leased.add(lease.vgpu_uuid)
        where = dict(parent=lease.parent, type_id=lease.type_id,
                     domain_uuid=lease.domain_uuid)
        if lease.held(started):
            # an incoming migration's, until it expires: listed, kept
            findings.append(Finding(
                INCOMING, 'lease', lease.vgpu_uuid,
                'reserved for the incoming live migration of domain %s '
                'until %s (%.0f s left); its prepare takes it over, else '
                'reconcile frees it once it has expired'
                % (lease.domain_uuid or '-', _clock(lease.expires_at),
                   lease.expires_at - started), **where))
            continue
        if lease.holder_alive() and lease.pid != me:
            if started - lease.updated_at > stuck_after:
                findings.append(Finding(
                    STUCK, 'lease', lease.vgpu_uuid,
                    'process %d has held it (%s) for %.0f s'
                    % (lease.pid, lease.state,
                       started - lease.updated_at), **where))
            continue
        if lease.updated_at >= started:
            continue          # changed after the domains were read
        users = refs.running.get(lease.vgpu_uuid, frozenset())
        if users:
            findings.extend(_judge_used(txn, lease, users, vgpus,
                                        dry_run, where))
            continue
        exists = lease.vgpu_uuid in vgpus
        if lease.expires_at is not None and lease.state == state.RESERVED:
            reason = ('the incoming live migration of domain %s reserved it '
                      'until %s and its prepare never came'
                      % (lease.domain_uuid or '-',
                         _clock(lease.expires_at)))
        else:
            reason = ('no running domain uses it (lease %s for domain %s, '
                      'its process gone)' % (lease.state,
                                             lease.domain_uuid or '-'))
        planned.append((lease.vgpu_uuid, lease.parent, lease.type_id,
                        lease.domain_uuid, reason,
                        'mdev+lease' if exists else 'lease'))
        if not dry_run:
            txn.update(lease.vgpu_uuid, state=state.REMOVING)
    return leased


def _clock(when):
    """``when`` (seconds since the epoch) as local ``HH:MM:SS``."""
    return time.strftime('%H:%M:%S', time.localtime(when))


_ROUTE_KEPT = {
    routes_mod.CYBORG: 'on a GPU given to Cyborg ([routes]/cyborg): its ARQ '
                       'may be bound and Nova\'s spawn not come yet; left to '
                       'Cyborg',
    routes_mod.NOVA_VGPU: 'on a GPU of Nova\'s own vGPU route (nova.conf): '
                          'left to Nova',
    routes_mod.NOVA_PCI: 'on a GPU carved for Nova ([nova]/carved): left to '
                         'Nova',
}
LEFTOVER = ('Nova\'s definition of a Cyborg vGPU that no domain names (its '
            'ARQ is gone)')
LEFTOVER_LIVE = ('Nova\'s definition of a Cyborg vGPU that no domain names '
                 'yet, and live: a spawn may be under way; if its ARQ is '
                 'gone, `libvirt-gpu restore` (with libvirt, before '
                 'nova-compute) removes it at boot, or remove it by hand '
                 '(virsh nodedev-destroy, nodedev-undefine)')


def _judge_cyborg_definitions(txn, refs, backend, routes, definitions, vgpus,
                              boot, dry_run, findings, planned):
    """Nova's definitions on Cyborg's GPUs (see the module doc): a
    leftover is planned for undefining (and, at boot, a live one for
    removal too); one that is live outside a boot is reported."""
    for uuid, definition in sorted(definitions.items()):
        parent, type_id = definition.parent, definition.type_id
        if routes.route_of_parent(backend.sysfs, parent) != \
                routes_mod.CYBORG:
            continue
        if refs.running.get(uuid) or refs.defined.get(uuid):
            continue              # its instance's: Nova's to start
        if refs.unreadable:
            findings.append(Finding(
                KEPT, 'definition', uuid, 'Nova\'s definition of a Cyborg '
                'vGPU; no readable domain names it, but some domain XML '
                'could not be read', parent=parent, type_id=type_id))
            continue
        if uuid not in vgpus:
            planned.append((uuid, parent, type_id, None, LEFTOVER,
                            'definition'))
        elif boot:
            planned.append((uuid, parent, type_id, None, LEFTOVER +
                            ', started at boot', 'mdev+definition'))
            if not dry_run and txn.get(uuid) is None:
                txn.add(uuid, None, parent, type_id, state.REMOVING)
        else:
            findings.append(Finding(KEPT, 'mdev+definition', uuid,
                                    LEFTOVER_LIVE, parent=parent,
                                    type_id=type_id))


def _judge_unleased(txn, refs, backend, covered, unleased, dry_run,
                    findings, planned, routes=None, definitions=None):
    """Every vGPU without a lease (``{uuid: (parent, type_id)}``): kept
    when it is not ours to judge (another route's: reported when no
    domain names it), used, possibly used, or defined; else planned for
    removal."""
    routes = routes if routes is not None else routes_mod.Routes()
    for uuid, (parent, type_id) in sorted(unleased.items()):
        users = refs.running.get(uuid, frozenset()) | refs.defined.get(
            uuid, frozenset())
        route = routes.route_of_parent(backend.sysfs, parent)
        if route != routes_mod.OURS:
            if not users and not (route == routes_mod.CYBORG
                                  and uuid in (definitions or {})):
                findings.append(Finding(KEPT, 'mdev', uuid,
                                        _ROUTE_KEPT[route], parent=parent,
                                        type_id=type_id))
            continue
        if not users and not _managed(backend.sysfs, backend, uuid, parent,
                                      covered):
            findings.append(Finding(
                KEPT, 'mdev', uuid, 'unreferenced, but on a GPU the '
                'configuration does not enable and not made by us',
                parent=parent, type_id=type_id))
            continue
        if len(refs.running.get(uuid, ())) > 1:
            findings.append(Finding(
                CONFLICT, 'mdev', uuid, 'used by %d running domains: %s'
                % (len(refs.running[uuid]),
                   ', '.join(sorted(refs.running[uuid]))),
                parent=parent, type_id=type_id))
        if users:
            continue          # someone's: not ours to judge
        if refs.unreadable:
            findings.append(Finding(
                KEPT, 'mdev', uuid, 'no readable domain references it, '
                'but some domain XML could not be read', parent=parent,
                type_id=type_id))
            continue
        definition = backend.definition(uuid)
        if definition is not None:
            findings.append(Finding(
                KEPT, 'mdev', uuid, 'unreferenced, but defined by %s'
                % definition.source, parent=parent, type_id=type_id))
            continue
        planned.append((uuid, parent, type_id, None,
                        'no domain references it and it has no lease',
                        'mdev'))
        if not dry_run:
            txn.add(uuid, None, parent, type_id, state.REMOVING)


def _carry_out(store, backend, planned, dry_run, remove_timeout):
    """Remove what was planned (or say what would be), then drop the
    leases this process marked for removal.  Returns the findings."""
    me = os.getpid()
    findings = []
    removed = []
    for uuid, parent, type_id, domain, reason, what in planned:
        where = dict(parent=parent, type_id=type_id, domain_uuid=domain)
        if dry_run:
            findings.append(Finding(WOULD_REMOVE, what, uuid, reason,
                                    **where))
            continue
        problem = None
        if what != 'definition':
            problem = _remove_with_timeout(backend, uuid, remove_timeout)
        if problem is None and what.endswith('definition'):
            problem = _undefine(backend, uuid)
        if problem:
            findings.append(Finding(STUCK, what, uuid, problem, **where))
            continue
        removed.append(uuid)
        findings.append(Finding(REMOVED, what, uuid, reason, **where))
    if removed:
        with store.transaction() as txn:
            for uuid in removed:
                lease = txn.get(uuid)
                if lease is not None and lease.pid == me:
                    txn.delete(uuid)
    return findings


def _undefine(backend, uuid):
    """Drop ``uuid``'s persistent definition; None or the reason it
    could not be."""
    try:
        backend.undefine(uuid)
    except (exception.LibvirtGpuError, OSError) as e:
        return 'its definition could not be removed: %s' % e
    return None


def _judge_used(txn, lease, users, vgpus, dry_run, where):
    """A lease whose vGPU a running domain uses."""
    found = []
    if lease.domain_uuid not in users:
        found.append(Finding(
            CONFLICT, 'lease', lease.vgpu_uuid,
            'leased to domain %s but used by running domain(s) %s'
            % (lease.domain_uuid, ', '.join(sorted(users))), **where))
    if len(users) > 1:
        found.append(Finding(CONFLICT, 'mdev', lease.vgpu_uuid,
                             'used by %d running domains' % len(users),
                             **where))
    if lease.vgpu_uuid not in vgpus:
        found.append(Finding(STUCK, 'mdev', lease.vgpu_uuid,
                             'a running domain uses it but it does not '
                             'exist', **where))
    elif lease.state != state.CREATED:
        if not dry_run:
            txn.update(lease.vgpu_uuid, state=state.CREATED)
        found.append(Finding(REPAIRED if not dry_run else WOULD_REPAIR,
                             'lease', lease.vgpu_uuid,
                             'in use by its running domain: %s -> created'
                             % lease.state, **where))
    return found


def _return_borrowed(txn, refs, started, dry_run):
    """Forget that a domain uses an mdev someone else made once that domain
    no longer runs (its release never came: a crash)."""
    found = []
    for uuid, (domain, since) in sorted(txn.borrowed().items()):
        if since >= started or domain in refs.running.get(uuid, ()):
            continue
        if not dry_run:
            txn.give_back(domain, [uuid])
        found.append(Finding(REPAIRED if not dry_run else WOULD_REPAIR,
                             'borrowed', uuid, 'domain %s no longer runs: it '
                             'no longer holds this existing vGPU' % domain,
                             domain_uuid=domain))
    return found


def _managed(sysfs, backend, uuid, parent, covered):
    """Whether an unleased mdev is ours to judge: on a GPU the
    configuration enables (a VF counts as its physical GPU), or one of our
    recorded vGPUs (a kind that keeps its own records, such as the vendor
    interface's)."""
    if backend.recorded(uuid):
        return True
    gpu = sysfs.physfn(parent) or parent
    return gpu in covered or parent in covered
