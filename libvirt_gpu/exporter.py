"""``libvirt-gpu exporter``: this host's GPUs, vGPUs and the hook's health
as Prometheus metrics (text format, written by ``prometheus_client``,
served by ``Server``: bounded connections and threads, timed-out
requests).

Every scrape reads the host afresh (``Environment.rediscover``): the GPUs
from sysfs, the enabled types, the leases through
``LeaseStore.snapshot`` (a read-only SQLite read: no flock, so a scrape
never holds up a guest's ``prepare``), the running domains through libvirt
when there is a connection, what ``reconcile --dry-run`` would report (the
``survey`` the CLI hands in, read the same lock-free way), the figures the
hook and the Placement sync/restore leave in the state directory
(``figures``: the hook's under a shared flock held for one read, which
only a hook call's own write can hold up), NVML's usage figures where
NVML answers, and each GPU's layout as NVML says it is (mode, MIG GPU
instances, placements, scheduler) with whether it differs from its
configured layout (``layout_plan.plan``, the planner of ``libvirt-gpu
layout plan``).

Capacity comes from the one rule: ``capacity.vgpu_total`` (what Placement
is told) and ``Allocator.free`` (what a guest start can still get).

A part that cannot be read (libvirt down, a damaged state file, a lease
file this user may not read) is left out of the scrape and
``libvirt_gpu_exporter_read_ok{part=...}`` says 0; the error is logged.
A value in a figures file that is not one we write is left out the same
way (read_ok 0, a warning), the rest of its part still served.  The
metric names and what they mean are listed in docs/admin/metrics.md.
"""

from __future__ import annotations

import os
import queue
import resource
import selectors
import socket
import threading
import time

from prometheus_client import core as prom
from prometheus_client import exposition as expo

from libvirt_gpu.devices import capacity
from libvirt_gpu.devices import layout as layout_mod
from libvirt_gpu.host import layout_apply
from libvirt_gpu.devices import layout_plan
from libvirt_gpu.devices import nvml as nvml_mod
from libvirt_gpu import exception
from libvirt_gpu.guests import holders
from libvirt_gpu.store import figures
from libvirt_gpu.store import state
from libvirt_gpu.util import logs
from libvirt_gpu import objects
from libvirt_gpu.util import records
from libvirt_gpu.util import textutil

LOG = logs.getLogger(__name__)

P = 'libvirt_gpu_'
PGPU = 'pgpu'
VGPU = 'vgpu'
NO_LEASE = 'none'
# the parts of a scrape, each read on its own (read_ok)
PARTS = ('host', 'leases', 'libvirt', 'reconcile', 'hook', 'tasks', 'nvml',
         'layout')
# a GPU's mode as its driver reports it (MIG mode, then mixed-size mode)
MODE_MIG = layout_mod.MIG
MODE_MIXED = layout_mod.MIXED_SIZE
MODE_SLICED = layout_mod.TIME_SLICED


# Which domain holds a vGPU: the rule ``libvirt-gpu list`` says it by too.
DomainView = holders.DomainView
read_domains = holders.read_domains
holder = holders.holder


class Scrape(object):
    """One scrape: reads each part once, notes which could not be read."""

    def __init__(self, collector):
        self.c = collector
        self.ok = {}

    def part(self, name, read):
        """``read()``, or None when it fails with one of our errors or an
        OSError (logged; ``read_ok`` says 0)."""
        try:
            value = read()
        except (exception.LibvirtGpuError, OSError) as e:
            LOG.warning('scrape: cannot read %s: %s', name, e)
            self.ok[name] = 0
            if name == 'libvirt' and self.c.host is not None:
                self.c.host.close()     # reconnect at the next scrape
            return None
        self.ok.setdefault(name, 1)
        return value

    def optional(self, name, read):
        """``part``, where a ``read()`` that returns None means "nothing
        to read on this host": the part is left out of ``read_ok``."""
        value = self.part(name, read)
        if value is None and self.ok.get(name) == 1:
            del self.ok[name]
        return value

    def dropped(self, name, notes):
        """Values of part ``name`` left out (``notes``: what was wrong):
        each logged, and ``read_ok`` says 0 for the part."""
        for note in notes:
            LOG.warning('scrape: %s: left out %s; the next write of that '
                        'file starts it afresh', name, note)
        if notes:
            self.ok[name] = 0


class HostCollector(object):
    """A ``prometheus_client`` collector of one host.

    :param env: the host's ``environment.Environment``: read afresh at
        each scrape (``rediscover``: its GPUs named by its ``pci_ids``, the
        enabled types, the allocator's count), its ``host`` (a
        ``host.Host`` to name domains, or None) and its ``nvml`` (or None).
    :param survey: ``survey()`` -> ``reconcile.Report`` of a dry run, or
        None (no libvirt: no reconcile series).
    """

    def __init__(self, env, survey=None):
        self.env = env
        self.host = env.host
        self.survey = survey
        self.nvml = env.nvml
        # libvirt's connection is not for two threads at once
        self._libvirt_lock = threading.Lock()

    def describe(self):
        return []       # the series depend on the host: no pre-check

    def collect(self):
        scrape = Scrape(self)
        env = self.env.rediscover()
        gpus = scrape.part('host', lambda: env.discovered.gpus)
        enabled = {}
        if gpus is not None:
            enabled = scrape.part('host', lambda: env.enabled) or {}
        domains = None
        survey = None
        if self.host is not None:
            with self._libvirt_lock:
                domains = scrape.part('libvirt',
                                      lambda: read_domains(self.host))
                if self.survey is not None and domains is not None:
                    survey = scrape.part('reconcile', self.survey)
        routes = None
        if gpus is not None:
            routes = scrape.part('host', lambda: env.routes)
        leases = scrape.part('leases', lambda: _read_leases(env, enabled))
        rows, borrowed, free, existing = leases or ((), {}, {}, {})
        gpus = gpus or ()
        physical = {f.address: gpu.address for gpu in gpus
                    if not gpu.is_vf for f in gpu.functions}
        route = route_labels(routes, physical)
        yield from gpu_families(gpus, enabled, free, existing, rows, domains,
                                route)
        yield from vgpu_families(existing, rows, borrowed, domains, physical,
                                 counted=leases is not None, route=route)
        if survey is not None:
            yield from reconcile_families(survey, route)
        dropped = []
        hook = scrape.part('hook', lambda: figures.hook_figures(
            env.state_dir, dropped))
        scrape.dropped('hook', dropped)
        if hook is not None:
            yield from hook_families(hook)
        dropped = []
        tasks = scrape.part('tasks', lambda: {
            task: figures.outcome(env.state_dir, task, dropped)
            for task in figures.TASKS})
        scrape.dropped('tasks', dropped)
        if tasks is not None:
            yield from task_families(tasks)
        views = scrape.optional('layout',
                                lambda: read_layout_views(env, gpus))
        if views:
            yield from layout_families(views)
        if self.nvml is not None:
            usage = scrape.part('nvml', self.nvml.usage)
            if usage:
                yield from nvml_families(usage, _owners(
                    existing, rows, borrowed, domains), route)
        ok = prom.GaugeMetricFamily(
            P + 'exporter_read_ok', 'Whether the part of this scrape could '
            'be read (1) or not (0, logged)', labels=['part'])
        for name in PARTS:
            if name in scrape.ok:
                ok.add_metric([name], scrape.ok[name])
        yield ok


def route_labels(routes, physical):
    """``route(parent)`` -> the ``route`` label of a vGPU whose parent (an
    mdev parent or VF; ``physical``: parent -> physical GPU) is ``parent``,
    or of a physical GPU: the route that owns the physical GPU
    (``routes.Routes``), ``''`` when ``routes`` could not be read (None) or
    the parent is unknown."""
    def route(parent):
        if routes is None or parent is None:
            return ''
        return routes.route_of(physical.get(parent, parent))
    return route


def _owners(existing, leases, borrowed, domains):
    """vGPU UUID -> (parent, domain name, domain UUID), for NVML."""
    rows = {lease.vgpu_uuid: lease for lease in leases}
    return {uuid: (parent,) + holder(uuid, rows, borrowed, domains)
            for uuid, (parent, _) in existing.items()}


def _read_leases(env, enabled):
    """Under a lock-free snapshot of the lease file: every lease, the
    borrowed vGPUs, ``{gpu: free}`` of the enabled GPUs (the allocator's
    own count) and every vGPU that exists (``{uuid: (parent, type)}``)."""
    _readable(env.store)
    with env.store.snapshot() as txn:
        # an mdev removed while it is listed (a guest stopping) is left
        # out, not an error: the next scrape sees the host settled
        mdevs = env.sysfs.mdevs_by_parent(skipped=[])
        existing = env.vgpus.existing(mdevs)
        free = {}
        for address, setting in sorted(enabled.items()):
            for type_id in setting.type_ids:
                try:
                    free[address, type_id] = env.allocator.free(
                        txn, address, type_id, mdevs)
                except exception.SysfsError as e:
                    LOG.warning('scrape: no free count of %s for %s: %s',
                                address, type_id, e)
        return tuple(txn.all()), txn.borrowed(), free, existing


def _gauge(name, text, labels):
    return prom.GaugeMetricFamily(P + name, text, labels=labels)


def gpu_families(gpus, enabled, free, existing, leases, domains,
                 route=None):
    """Per physical GPU: what it is, its mode, route (``route``:
    ``route_labels``) and capacity; per type: the instances the kernel or
    driver says it can still make."""
    route = route or route_labels(None, {})
    info = _gauge('gpu_info', 'A GPU of this host (value 1): ids, name, '
                  'mode (vgpu: sliced, pgpu: whole), enabled vGPU type and '
                  'the route that owns it', ['gpu', 'vendor_id',
                                             'product_id', 'product', 'mode',
                                             'enabled_type', 'route'])
    total = _gauge('gpu_capacity', 'vGPUs (mode vgpu) or whole GPUs (mode '
                   'pgpu: 1, 0 when it cannot be offered) the GPU holds: '
                   'the total Placement is told', ['gpu', 'mode', 'type'])
    used = _gauge('gpu_used', 'vGPUs of the enabled type that exist or are '
                  'leased on the GPU (mode pgpu: 1 while a running domain '
                  'has it; only with libvirt)', ['gpu', 'mode', 'type'])
    room = _gauge('gpu_free', 'vGPUs a guest start can still get on the GPU '
                  '(the allocator\'s count; mode pgpu: with libvirt only)',
                  ['gpu', 'mode', 'type'])
    refused = _gauge('gpu_not_offered', 'A GPU that is not offered whole '
                     '(value 1), with the reason', ['gpu', 'reason'])
    avail = _gauge('type_available_instances', 'Instances of a vGPU type '
                   'the GPU can still make, as the kernel or driver says '
                   '(a GPU with VFs: the whole GPU)', ['gpu', 'type', 'name'])
    for gpu in gpus:
        if gpu.is_vf:
            continue
        address = gpu.address
        setting = enabled.get(address)
        mode = VGPU if setting is not None else PGPU
        type_id = setting.type_id if setting is not None else ''
        info.add_metric([str(address), gpu.vendor_id, gpu.product_id,
                         gpu.product_name or '', mode, type_id,
                         route(address)], 1)
        if setting is not None:
            for one in setting.types:
                type_id = one.type_id
                cap = capacity.vgpu_total(gpu, one)
                total.add_metric([str(address), mode, type_id], cap)
                parents = {f.address for f in gpu.functions}
                here = {u for u, (p, t) in existing.items()
                        if p in parents and t == type_id}
                here |= {lease.vgpu_uuid for lease in leases
                         if lease.parent in parents
                         and lease.type_id == type_id}
                used.add_metric([str(address), mode, type_id], len(here))
                if (address, type_id) in free:
                    room.add_metric([str(address), mode, type_id],
                                    free[address, type_id])
        else:
            refusal = capacity.pgpu_refusal(gpu)
            cap = 0 if refusal else 1
            total.add_metric([str(address), mode, ''], cap)
            if refusal:
                refused.add_metric([str(address), refusal], 1)
            if domains is not None:
                taken = 1 if address in domains.pci else 0
                used.add_metric([str(address), mode, ''], taken)
                room.add_metric([str(address), mode, ''], max(0, cap - taken))
        for mtype, left in _available(gpu):
            avail.add_metric([str(address), mtype.id, mtype.name or ''],
                             left)
    return info, total, used, room, refused, avail


def _available(gpu):
    """``(type, instances it can still make)`` of a physical GPU: a GPU
    without VFs as its ``available_instances`` say; one whose vGPUs live on
    VFs, its capacity for the type less the vGPUs of it (the whole GPU, as
    ``libvirt-gpu types <PF>`` shows)."""
    for mtype in gpu.offered_types():
        if not gpu.vf_gpus:
            yield mtype, mtype.available_instances
            continue
        used = sum(f.used_type_ids.count(mtype.id) for f in gpu.functions)
        cap = capacity.vgpu_total(gpu, objects.EnabledType(mtype.id))
        yield mtype, max(0, cap - used)


def vgpu_families(existing, leases, borrowed, domains, physical,
                  counted=True, route=None):
    """Per vGPU (existing, or leased and not made yet): its type, GPU
    (``physical``: parent address -> physical GPU), route (``route``:
    ``route_labels``), holder and lease state; leases by state (not when
    the leases could not be read: ``counted`` False, absent rather than
    0)."""
    route = route or route_labels(None, {})
    info = _gauge('vgpu_info', 'A vGPU (value 1): type, parent (the mdev '
                  'parent or VF), the route that owns its GPU, the domain '
                  'that holds it (name with libvirt only) and its lease '
                  'state (none: not made by us, or no lease)',
                  ['uuid', 'type', 'gpu', 'parent', 'route', 'domain',
                   'domain_uuid', 'lease_state', 'exists'])
    by_state = _gauge('leases', 'Leases in the lease file, by state',
                      ['state'])
    rows = {lease.vgpu_uuid: lease for lease in leases}
    counts = dict.fromkeys(('reserved', 'created', 'removing'), 0)
    for lease in leases:
        counts[lease.state] = counts.get(lease.state, 0) + 1
    for uuid in sorted(set(existing) | set(rows)):
        lease = rows.get(uuid)
        parent, type_id = existing.get(uuid) or (lease.parent, lease.type_id)
        name, dom = holder(uuid, rows, borrowed, domains)
        info.add_metric([uuid, type_id, str(physical.get(parent, parent)),
                         str(parent), route(parent), name, dom,
                         lease.state if lease is not None else NO_LEASE,
                         'yes' if uuid in existing else 'no'], 1)
    for name, count in sorted(counts.items()):
        if counted:
            by_state.add_metric([name], count)
    return info, by_state


def reconcile_families(report, route=None):
    """What ``reconcile --dry-run`` reports (``reconcile.Report``):
    leases whose holder died and that no running domain uses, vGPUs no
    lease or domain explains; each finding with the route of its GPU
    (``route``: ``route_labels``).  What reconcile would remove is what
    it says (it leaves other routes' vGPUs alone, so they are no orphans
    here either)."""
    route = route or route_labels(None, {})
    dead = _gauge('dead_holder_leases', 'Leases whose process died and '
                  'whose vGPU no running domain uses (reconcile would '
                  'remove them)', [])
    unexplained = _gauge('unexplained_vgpus', 'vGPUs without a lease that '
                         'no domain references and mdevctl does not define '
                         '(reconcile would remove them)', [])
    each = _gauge('reconcile_finding', 'One finding of reconcile --dry-run '
                  '(value 1)', ['action', 'what', 'uuid', 'parent', 'type',
                                'domain_uuid', 'route'])
    for f in report.findings:
        each.add_metric([f.action, f.what, f.uuid, str(f.parent or ''),
                         f.type_id or '', f.domain_uuid or '',
                         route(f.parent)], 1)
    dead.add_metric([], len(report.would_remove('lease', 'mdev+lease')))
    unexplained.add_metric([], len(report.would_remove('mdev')))
    return dead, unexplained, each


def hook_families(found):
    """The hook's figures (``figures.hook_figures``)."""
    calls = prom.CounterMetricFamily(
        P + 'hook_calls', 'Calls of the qemu hook that handled one of our '
        'guests, by operation', labels=['operation'])
    refusals = prom.CounterMetricFamily(
        P + 'hook_refusals', 'Hook calls that refused the guest (prepare: '
        'the start failed with a reason, e.g. no capacity)',
        labels=['operation'])
    errors = prom.CounterMetricFamily(
        P + 'hook_errors', 'Hook calls that failed: an internal error, or '
        'a release/reconnect that could not do its work', labels=['operation'])
    latency = prom.HistogramMetricFamily(
        P + 'hook_duration_seconds', 'Time one hook call took (from its '
        'input read to its exit, not counting the interpreter start)',
        labels=['operation'])
    for operation, entry in found.items():
        calls.add_metric([operation], entry['calls'])
        refusals.add_metric([operation], entry['refusals'])
        errors.add_metric([operation], entry['errors'])
        buckets, running = [], 0
        for bound, count in zip(figures.BUCKETS + (float('inf'),),
                                entry['counts']):
            running += count
            buckets.append((_le(bound), running))
        latency.add_metric([operation], buckets, entry['seconds_sum'])
    return calls, refusals, errors, latency


def _le(bound):
    return '+Inf' if bound == float('inf') else repr(float(bound))


def task_families(tasks):
    """The last Placement sync and restore (``figures.outcome``), by
    ``task`` (not ``job``: Prometheus gives every series the ``job`` of
    its scrape)."""
    runs = prom.CounterMetricFamily(P + 'task_runs', 'Runs of the task',
                                    labels=['task'])
    failures = prom.CounterMetricFamily(P + 'task_failures', 'Runs that '
                                        'failed', labels=['task'])
    changes = prom.CounterMetricFamily(P + 'task_changes', 'Changes the '
                                       'task made (Placement writes, '
                                       'restore actions)', labels=['task'])
    last_changes = _gauge('task_last_changes', 'Changes the last successful '
                          'run made', ['task'])
    success = _gauge('task_last_success_timestamp_seconds', 'When the task '
                     'last succeeded (Unix time)', ['task'])
    failed = _gauge('task_last_error_timestamp_seconds', 'When the task last '
                    'failed (Unix time)', ['task'])
    error = _gauge('task_last_error_info', 'The last error of the task '
                   '(value 1)', ['task', 'error'])
    for task, doc in sorted(tasks.items()):
        if doc is None:
            continue
        # a value left out (figures.outcome: not one we write) is absent,
        # not 0: a counter served at 0 would read as a reset
        for family, key in ((runs, 'runs'), (failures, 'failures'),
                            (changes, 'changes_total'),
                            (last_changes, 'last_changes')):
            if key in doc:
                family.add_metric([task], doc[key])
        if doc.get('last_success') is not None:
            success.add_metric([task], float(doc['last_success']))
        if doc.get('last_error_time') is not None:
            failed.add_metric([task], float(doc['last_error_time']))
            error.add_metric([task, str(doc.get('last_error'))], 1)
    return runs, failures, changes, last_changes, success, failed, error


# --- layouts: each GPU's mode, GPU instances, placements, scheduler, drift --

@records.record
class TypeRoom:
    """vGPUs of one type in a GPU instance, or at a GPU's placements."""

    type_id: objects.TypeId
    used: int                 # vGPUs of the type that exist there
    free: int | None          # more the driver would make (None: unsaid)


@records.record
class GiView:
    """A MIG GPU instance that exists, and its vGPUs by type."""

    id: int
    profile: str                  # '1g.10gb' (the profile id unnamed)
    types: tuple                  # TypeRoom of the MIG-backed types of it


@records.record
class LayoutView:
    """One physical GPU as the layouts see it, read through NVML."""

    address: objects.PciAddress
    mode: str                     # MODE_SLICED, MODE_MIXED or MODE_MIG
    layout: str | None = None     # its layout's name (None: in none)
    # layout_plan.Step to its layout (None: no layout, or one it cannot
    # hold)
    steps: tuple | None = None
    gpu_instances: tuple = ()     # GiView (MIG)
    placements: tuple = ()        # TypeRoom per time-sliced type (mixed)
    scheduler: layout_mod.Scheduler | None = None

    @property
    def drift(self):
        """Whether the GPU differs from its layout: ``layout plan`` has
        steps for it, or it cannot hold its layout; None: no layout."""
        if self.layout is None:
            return None
        return self.steps is None or bool(self.steps)


def read_layout_views(env, gpus):
    """``LayoutView`` of every physical NVIDIA GPU of ``gpus`` NVML lists
    with vGPU types, and of every GPU in a layout; None when there is
    nothing to read (no layout, and no NVML or driver).  A layout's GPU
    NVML cannot answer for is an error (the part is unreadable)."""
    by_gpu = env.layouts
    if env.nvml is None:
        if by_gpu:
            raise nvml_mod.NvmlUnavailable(
                reason='[gpu]/nvml is off, or the GPUs are not read from '
                       'this host\'s /sys')
        return None
    try:
        session = env.nvml.session()
    except nvml_mod.NvmlUnavailable as e:
        if by_gpu:
            raise
        LOG.debug('scrape: no layout series: %s', e)
        return None
    views = []
    with session:
        driver = layout_apply.GpuDriver(
            session, env.sysfs, layout_apply.layout_kinds(env.vgpus))
        for gpu in sorted(gpus, key=lambda g: g.address):
            if gpu.is_vf or gpu.vendor_id != objects.NVIDIA_VENDOR_ID:
                continue
            layout = by_gpu.get(gpu.address)
            try:
                view = _layout_view(driver, gpu.address, layout)
            except nvml_mod.NvmlUnavailable:
                if layout is not None:
                    raise       # NVML lists no GPU there
                continue        # not NVML's (vfio-pci: a pGPU)
            if view is not None:
                views.append(view)
    return tuple(views)


def _layout_view(driver, address, layout):
    session = driver.session
    facts = _facts(driver, address)
    if layout is None and not facts.types:
        return None             # not on a vGPU host driver
    mig = bool(facts.mig)
    mixed = None if mig else session.mixed_size(address)
    mode = MODE_MIG if mig else MODE_MIXED if mixed else MODE_SLICED
    active = session.active_vgpus(address, mig)
    return LayoutView(
        address=address, mode=mode,
        layout=layout.name if layout is not None else None,
        steps=(_layout_steps(driver, layout, address, facts)
               if layout is not None else None),
        gpu_instances=(_gi_views(session, address, facts, active)
                       if mig else ()),
        placements=(_placement_rooms(session, address, facts, active)
                    if mode == MODE_MIXED else ()),
        scheduler=session.scheduler(address))


def _facts(driver, address):
    """``GpuDriver.facts``, less the GI profile table of a GPU without
    MIG mode (it has none: NVML_GPU_INSTANCE_PROFILE_COUNT calls a scrape
    saved)."""
    session = driver.session
    mig = session.mig_mode(address)
    return layout_mod.GpuFacts(
        address=address, mig=mig,
        profiles=session.gi_profiles(address) if mig is not None else (),
        types=session.vgpu_types(address, placements=True),
        vfs_total=driver.sysfs.sriov_totalvfs(address) or 0)


def _layout_steps(driver, layout, address, facts):
    """The steps ``layout plan`` lists for the GPU (the same checks as
    ``layout_apply.Applier``, then ``layout_plan.plan``); None when the GPU
    cannot hold its layout (logged; ``layout plan`` says why)."""
    try:
        layout_mod.check_before_steps(layout, facts)
        state = driver.state(address, layout, facts)
        return layout_plan.plan(layout, facts, state).steps
    except layout_mod.LayoutError as e:
        LOG.warning('scrape: %s', e)
        return None


def _gi_views(session, address, facts, active):
    """Each GPU instance with, per MIG-backed type of its profile, the
    vGPUs of it and how many more the GI takes: its maximum per GI less
    those, 0 while the GI holds a vGPU of another type (one frame buffer
    size per GI)."""
    views = []
    for gi in session.gpu_instances(address, facts.profiles):
        profile = facts.profile_by_id(gi.profile_id)
        here = [v for v in active if v.gi_id == gi.id]
        rooms = []
        for vtype in facts.types:
            if vtype.gi_profile_id != gi.profile_id:
                continue
            used = sum(1 for v in here if v.type_id == vtype.type_id)
            free = 0 if len(here) > used else \
                max(0, (vtype.max_per_gi or 0) - used)
            rooms.append(TypeRoom(vtype.type_id, used, free))
        views.append(GiView(
            id=gi.id, profile=(profile.name if profile is not None
                               else 'profile %d' % gi.profile_id),
            types=tuple(rooms)))
    return tuple(views)


def _placement_rooms(session, address, facts, active):
    """Per time-sliced type: its vGPUs on the GPU (each at a placement)
    and the placements NVML says one can still be made at."""
    rooms = []
    for vtype in facts.types:
        if vtype.mig_backed:
            continue
        found = session.creatable_placements(
            address, objects.vendor_type_number(vtype.type_id))
        ids = found[1] if found is not None else None
        rooms.append(TypeRoom(
            vtype.type_id,
            sum(1 for v in active if v.type_id == vtype.type_id),
            len(ids) if ids is not None else None))
    return tuple(rooms)


def layout_families(views):
    """The ``LayoutView``s as series (docs/admin/metrics.md)."""
    mode = _gauge('gpu_layout_mode', 'A GPU\'s mode as its driver reports '
                  'it (value 1): time-sliced, mixed-size or mig',
                  ['gpu', 'mode'])
    drift = _gauge('gpu_layout_drift', 'Whether the GPU differs from its '
                   'configured layout (1: `libvirt-gpu layout plan` has '
                   'steps for it, or it cannot hold the layout); GPUs in a '
                   'layout only', ['gpu', 'layout'])
    steps = _gauge('gpu_layout_steps', 'The steps `libvirt-gpu layout '
                   'apply` would run on the GPU', ['gpu', 'layout'])
    gi_info = _gauge('gpu_instance_info', 'A MIG GPU instance that exists '
                     '(value 1)', ['gpu', 'gi', 'profile'])
    gi_used = _gauge('gpu_instance_vgpus_used', 'vGPUs of the type in the '
                     'GPU instance', ['gpu', 'gi', 'profile', 'type'])
    gi_free = _gauge('gpu_instance_vgpus_free', 'vGPUs of the type the GPU '
                     'instance can still take', ['gpu', 'gi', 'profile',
                                                 'type'])
    pl_used = _gauge('placements_used', 'vGPUs of the type on the GPU in '
                     'mixed-size mode (each holds a placement)',
                     ['gpu', 'type'])
    pl_free = _gauge('placements_free', 'Placements a vGPU of the type can '
                     'still be made at (mixed-size mode; NVML\'s creatable '
                     'placements)', ['gpu', 'type'])
    policy = _gauge('gpu_scheduler_info', 'The GPU\'s vGPU scheduler policy '
                    '(value 1)', ['gpu', 'policy'])
    time_slice = _gauge('gpu_scheduler_time_slice_seconds', 'The vGPU '
                        'scheduler\'s time slice (where the driver gives '
                        'one)', ['gpu'])
    for view in views:
        gpu = str(view.address)
        mode.add_metric([gpu, view.mode], 1)
        if view.layout is not None:
            drift.add_metric([gpu, view.layout], 1 if view.drift else 0)
            if view.steps is not None:
                steps.add_metric([gpu, view.layout], len(view.steps))
        for gi in view.gpu_instances:
            gi_info.add_metric([gpu, str(gi.id), gi.profile], 1)
            for room in gi.types:
                labels = [gpu, str(gi.id), gi.profile, room.type_id]
                gi_used.add_metric(labels, room.used)
                gi_free.add_metric(labels, room.free)
        for room in view.placements:
            pl_used.add_metric([gpu, room.type_id], room.used)
            if room.free is not None:
                pl_free.add_metric([gpu, room.type_id], room.free)
        if view.scheduler is not None:
            policy.add_metric([gpu, view.scheduler.policy], 1)
            if view.scheduler.time_slice_ms:
                time_slice.add_metric(
                    [gpu], view.scheduler.time_slice_ms / 1000.0)
    return (mode, drift, steps, gi_info, gi_used, gi_free, pl_used, pl_free,
            policy, time_slice)


def nvml_families(usage, owners, route=None):
    """NVML's figures (``nvml.Nvml.usage``) joined to our vGPUs: a vGPU
    instance is matched by its mdev UUID, else by its VF's address; each
    with its route (``route``: ``route_labels``)."""
    route = route or route_labels(None, {})
    util = _gauge('nvml_gpu_utilization_ratio', 'GPU busy share over '
                  'NVML\'s last sample period (0 to 1)', ['gpu'])
    mem_used = _gauge('nvml_gpu_memory_used_bytes', 'Frame buffer in use',
                      ['gpu'])
    mem_total = _gauge('nvml_gpu_memory_total_bytes', 'Frame buffer',
                       ['gpu'])
    vutil = _gauge('nvml_vgpu_utilization_ratio', 'A vGPU\'s share of '
                   'its GPU\'s 3D/compute engine (0 to 1)',
                   ['uuid', 'gpu', 'parent', 'route', 'domain',
                    'domain_uuid'])
    vfb = _gauge('nvml_vgpu_fb_used_bytes', 'Frame buffer a vGPU uses',
                 ['uuid', 'gpu', 'parent', 'route', 'domain', 'domain_uuid'])
    by_parent = {parent: uuid for uuid, (parent, _, _) in owners.items()}
    for address, gpu in sorted(usage.items()):
        if gpu.utilization is not None:
            util.add_metric([str(address)], gpu.utilization)
        if gpu.memory_used is not None:
            mem_used.add_metric([str(address)], gpu.memory_used)
        if gpu.memory_total is not None:
            mem_total.add_metric([str(address)], gpu.memory_total)
        for vgpu in gpu.vgpus:
            uuid = vgpu.mdev_uuid or by_parent.get(vgpu.vf)
            if uuid not in owners:
                continue    # not a vGPU of this host (as sysfs says now)
            parent, name, dom = owners[uuid]
            labels = [uuid, str(address), str(parent or ''),
                      route(parent), name, dom]
            if vgpu.utilization is not None:
                vutil.add_metric(labels, vgpu.utilization)
            if vgpu.fb_used is not None:
                vfb.add_metric(labels, vgpu.fb_used)
    return util, mem_used, mem_total, vutil, vfb


def _printable(family):
    r"""``family`` with every label value as the CLI writes text
    (``textutil.escape``: C0/C1 controls and the bidirectional overrides
    as ``\xNN``/``\uNNNN``) and a lone surrogate (undecodable bytes, or
    ``\udcxx`` in a JSON file) as ``\udcxx``: a name from libvirt or sysfs
    reaches a terminal (``--once``) and Prometheus as the same valid,
    inert text, and the UTF-8 encoding of the scrape cannot fail."""
    family.samples = [sample._replace(labels={
        key: _text(value) for key, value in sample.labels.items()})
        for sample in family.samples]
    return family


def _text(value):
    value = textutil.escape(str(value))
    return value.encode('utf-8', 'backslashreplace').decode('utf-8')


def _readable(store):
    """StateError when this process may not read the lease file or the
    boot id beside it: the snapshot would take either as "no leases"
    (``read_ok`` would say 1 and every count 0)."""
    for path in (store.db_path,
                 os.path.join(store.state_dir, state.BOOT_ID_NAME)):
        try:
            os.stat(path)
        except FileNotFoundError:
            continue                # none yet: no leases, truly
        except PermissionError:
            pass
        else:
            if os.access(path, os.R_OK):
                continue
        raise exception.StateError(path=path, reason=(
            'permission denied to uid %d: run the exporter as the user '
            'that owns the state directory (root, as its systemd unit '
            'does)' % os.getuid()))


def render(collector):
    """The bytes a scrape of ``collector`` returns: Prometheus' text
    format (0.0.4), from ``prometheus_client``'s one generator, every
    label value ``_printable``: the same for ``--once`` and HTTP."""
    registry = prom.CollectorRegistry(auto_describe=False)
    registry.register(_Printable(collector))
    return expo.generate_latest(registry)


class _Printable(object):
    """``collector``'s families, each through ``_printable``."""

    def __init__(self, collector):
        self.collector = collector

    def collect(self):
        for family in self.collector.collect():
            yield _printable(family)


def exposition(collector):
    """The text a scrape of ``collector`` returns (``render``)."""
    return render(collector).decode()


# The HTTP server's bounds.  An idle or slow client costs one open file
# and no thread; past MAX_CONNECTIONS the longest-waiting one is closed,
# so a new scrape always gets in.  A request's whole header must arrive
# within REQUEST_TIMEOUT, its answer be taken within SEND_TIMEOUT.
MAX_CONNECTIONS = 256
REQUEST_TIMEOUT = 5.0
SEND_TIMEOUT = 10.0
MAX_REQUEST = 8192          # a scrape's header is far smaller
WORKERS = 2                 # scrapes answered at once (each reads the host)
CONTENT_TYPE = expo.CONTENT_TYPE_PLAIN_0_0_4


def connection_limit(limit=None):
    """How many connections the server holds: ``MAX_CONNECTIONS``, less
    where this process may open fewer files (half its soft limit less a
    reserve for the scrape's own files)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    limit = MAX_CONNECTIONS if limit is None else limit
    if soft != resource.RLIM_INFINITY:
        limit = min(limit, max(1, (soft - 64) // 2))
    return limit


class Server(object):
    """``/metrics`` over HTTP/1.x on one listening socket: one thread
    reads every connection's request (``selectors``), ``WORKERS`` threads
    answer complete ones; every connection is closed after its answer.

    Raises OSError when the address cannot be bound (in use, no
    permission, not this host's)."""

    def __init__(self, collector, address, port, max_connections=None,
                 request_timeout=None):
        self.collector = collector
        self.limit = connection_limit(max_connections)
        self.timeout = (REQUEST_TIMEOUT if request_timeout is None
                        else request_timeout)
        info = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM,
                                  flags=socket.AI_PASSIVE)[0]
        self.sock = socket.socket(info[0], socket.SOCK_STREAM)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.bind(info[4])
            self.sock.listen(128)
        except OSError:
            self.sock.close()
            raise
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]
        self._work = queue.Queue(maxsize=WORKERS * 4)
        self._pending = {}      # connection -> [deadline, bytes], oldest first
        self._lock = threading.Lock()       # one scrape at a time

    def serve(self, stop_event):
        """Answer until ``stop_event`` is set; then close every socket."""
        workers = [threading.Thread(target=self._answer, daemon=True,
                                    name='exporter-%d' % i)
                   for i in range(WORKERS)]
        for worker in workers:
            worker.start()
        sel = selectors.DefaultSelector()
        sel.register(self.sock, selectors.EVENT_READ)
        paused = 0.0
        try:
            while not stop_event.is_set():
                now = time.monotonic()
                if paused and now >= paused:
                    sel.register(self.sock, selectors.EVENT_READ)
                    paused = 0.0
                self._expire(sel, now)
                for key, _ in sel.select(0.2):
                    if key.fileobj is self.sock:
                        if not self._accept(sel):
                            # no file left: stop accepting for a moment
                            # rather than spin on a readable socket
                            sel.unregister(self.sock)
                            paused = time.monotonic() + 0.2
                    else:
                        self._read(sel, key.fileobj)
        finally:
            for _ in workers:
                self._work.put(None)
            for conn in list(self._pending):
                self._drop(sel, conn)
            sel.close()
            self.sock.close()
            for worker in workers:
                worker.join(SEND_TIMEOUT)

    def _accept(self, sel):
        made_room = False
        for _ in range(64):
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return True
            except ConnectionAbortedError:
                continue
            except OSError as e:        # EMFILE, ENFILE, ENOBUFS
                LOG.warning('exporter: cannot accept a connection: %s', e)
                if self._pending:
                    self._drop(sel, next(iter(self._pending)))
                    made_room = True
                    continue
                return False
            if len(self._pending) >= self.limit:
                self._drop(sel, next(iter(self._pending)))
            conn.setblocking(False)
            self._pending[conn] = [time.monotonic() + self.timeout, b'']
            sel.register(conn, selectors.EVENT_READ)
            if made_room:
                # it took the file freed for it: another accept now would
                # fail again and close one more, this one if it is alone
                return True
        return True

    def _expire(self, sel, now):
        for conn, (deadline, _) in list(self._pending.items()):
            if deadline > now:
                break           # oldest first: the rest are later
            self._drop(sel, conn)

    def _drop(self, sel, conn):
        self._pending.pop(conn, None)
        try:
            sel.unregister(conn)
        except (KeyError, ValueError):
            pass
        conn.close()

    def _read(self, sel, conn):
        entry = self._pending.get(conn)
        if entry is None:
            return
        try:
            data = conn.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b''
        entry[1] += data
        if not data or len(entry[1]) > MAX_REQUEST:
            self._drop(sel, conn)
            return
        if b'\r\n\r\n' not in entry[1] and b'\n\n' not in entry[1]:
            return
        self._pending.pop(conn)
        sel.unregister(conn)
        try:
            self._work.put_nowait((conn, entry[1]))
        except queue.Full:
            conn.close()        # every worker busy and a queue waiting

    def _answer(self):
        while True:
            job = self._work.get()
            if job is None:
                return
            conn, request = job
            try:
                conn.setblocking(True)
                conn.settimeout(SEND_TIMEOUT)
                conn.sendall(self._response(request))
            except OSError:
                pass            # the client went, or did not read in time
            finally:
                conn.close()

    def _response(self, request):
        words = request.split(b'\n', 1)[0].split()
        method = words[0] if words else b''
        path = words[1].split(b'?', 1)[0] if len(words) > 1 else b''
        if method not in (b'GET', b'HEAD'):
            return _http(405, b'only GET /metrics\n')
        if path not in (b'/metrics', b'/'):
            return _http(404, b'not found: the metrics are at /metrics\n')
        with self._lock:
            try:
                body = render(self.collector)
            except Exception:       # the server's edge: a 500, logged
                LOG.exception('exporter: the scrape failed')
                return _http(500, b'the scrape failed: see the log\n')
        return _http(200, body, CONTENT_TYPE, head=method == b'HEAD')


_REASONS = {200: 'OK', 404: 'Not Found', 405: 'Method Not Allowed',
            500: 'Internal Server Error'}


def _http(status, body, content_type='text/plain; charset=utf-8',
          head=False):
    header = ('HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n'
              'Connection: close\r\n\r\n' % (status, _REASONS[status],
                                             content_type, len(body)))
    return header.encode('ascii') + (b'' if head else body)


def serve(collector, address, port, stop_event, **limits):
    """Serve ``/metrics`` on ``address:port`` until ``stop_event`` is set
    (``Server``; ``limits``: its ``max_connections``, ``request_timeout``).
    Raises OSError when the port cannot be bound (in use, no
    permission)."""
    server = Server(collector, address, port, **limits)
    LOG.info('exporter: serving http://%s:%d/metrics', address, server.port)
    server.serve(stop_event)
