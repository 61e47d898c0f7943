"""`libvirt-gpu agent`: keep this host's GPU providers in Placement.

Every ``[agent]/sync_interval`` seconds: discover the GPUs and build the
provider tree (``discover_fn``), then sync it to Placement. The sync keeps a
:class:`~libvirt_gpu.openstack.placement.sync.SyncState` between cycles,
so a cycle in which nothing changed costs one ``GET`` and no write.

When Placement (or discovery) fails, the agent logs it and tries again
after 1, 2, 4, ... seconds, capped at ``[agent]/backoff_max``; it never exits
for that. A bad configuration (no Placement endpoint or auth) is fatal at
start. SIGTERM or SIGINT stops it between two cycles (or during a wait).
"""

from __future__ import annotations

import random
import signal
import threading
import time
import typing

from libvirt_gpu import exception
from libvirt_gpu.store import figures
from libvirt_gpu.util import logs
from libvirt_gpu.openstack.placement import client as placement_client
from libvirt_gpu.openstack.placement import sync as sync_mod
from libvirt_gpu.openstack.placement import tree as tree_mod

LOG = logs.getLogger(__name__)

# discover_fn() -> ProviderTree: discovery + configuration + build_tree
# (the CLI's: ``model.host_tree`` of the host discovered anew).  It runs
# every cycle, so GPUs that appear or vanish are noticed.
DiscoverFn = typing.Callable[[], tree_mod.ProviderTree]


def make_client(conf, url=None):
    """A PlacementClient from [placement] (``url`` overrides the endpoint).

    Raises PlacementConfigError when neither auth options nor a URL say
    where Placement is.
    """
    return placement_client.PlacementClient.from_conf(conf, url=url)


def nova_owns_root(conf):
    """Whether nova-compute runs on this host and so owns the provider
    named after it: GPUs are carved for Nova (``[nova]/carved``)."""
    nova = getattr(conf, 'nova', None)
    return bool(nova is not None and nova.carved)


def sync_once(conf, url=None, dry_run=False, tree=None, discover_fn=None,
              client=None, state=None):
    """One sync of ``tree`` (or of ``discover_fn()``); returns a SyncReport.

    What ``libvirt-gpu placement sync --url URL [--dry-run]`` runs. Errors
    are typed (PlacementError and subclasses); nothing is retried here
    beyond the generation-conflict retries of the client.
    """
    if tree is None:
        if discover_fn is None:
            raise exception.InvalidInput(
                reason='sync_once needs a provider tree or a discover_fn')
        tree = discover_fn()
    if client is None:
        client = make_client(conf, url=url)
    try:
        report = sync_mod.sync(client, tree, dry_run=dry_run, state=state,
                               nest=conf.placement.nest_under_existing,
                               nova_root=nova_owns_root(conf))
    except exception.LibvirtGpuError as e:
        if not dry_run:
            record(conf, error=e)
        raise
    if not dry_run:
        record(conf, report)
    return report


def record(conf, report=None, error=None):
    """Leave the outcome of one sync for ``libvirt-gpu exporter``
    (``figures``): ``error``, or the ``report`` (its failed providers are
    the error; its writes the changes)."""
    state_dir = getattr(conf, 'state_dir', None)
    if state_dir is None:
        return          # a configuration without [DEFAULT] (a library use)
    if report is not None and report.failed:
        error = '; '.join('%s: %s' % (r.name, r.detail)
                          for r in report.failed)
    figures.record_outcome(
        state_dir, figures.PLACEMENT_SYNC, error=error,
        changes=len(report.requests) if report is not None else 0)


class Backoff:
    """1, 2, 4, ... seconds (with +-25 % jitter), capped."""

    def __init__(self, cap, rand=random.random):
        self.cap = cap
        self.failures = 0
        self._rand = rand

    def failed(self):
        """Record a failure; return how long to wait before the next try."""
        self.failures += 1
        base = min(self.cap, 2 ** min(self.failures - 1, 30))
        return min(self.cap, base * (0.75 + 0.5 * self._rand()))

    def succeeded(self):
        self.failures = 0


class Agent:
    def __init__(self, conf, discover_fn, client=None, stop_event=None):
        self.conf = conf
        self.discover_fn = discover_fn
        self.client = client if client is not None else make_client(conf)
        self.state = sync_mod.SyncState()
        self.stop_event = stop_event or threading.Event()
        self.backoff = Backoff(conf.agent.backoff_max)
        self.cycles = 0
        self.failures = 0
        self.last_report = None

    def cycle(self):
        """Discover, build, sync once. Raises typed errors."""
        self.cycles += 1
        tree = self.discover_fn()
        report = sync_mod.sync(self.client, tree, state=self.state,
                               nest=self.conf.placement.nest_under_existing,
                               nova_root=nova_owns_root(self.conf))
        record(self.conf, report)
        self.last_report = report
        log = LOG.info if report.changed or report.failed else LOG.debug
        log('%s', report.summary())
        for result in report.failed:
            LOG.error('%s: %s', result.name, result.detail)
        for result in report.with_outcome(sync_mod.KEPT):
            LOG.warning('%s: %s', result.name, result.detail)
        return report

    def run(self, once=False):
        """Cycle until stopped (or once). Returns the last SyncReport."""
        while not self.stop_event.is_set():
            try:
                self.cycle()
            except exception.LibvirtGpuError as exc:
                record(self.conf, error=exc)
                if once:
                    raise
                self.failures += 1
                delay = self.backoff.failed()
                LOG.warning('Sync failed (attempt %d), retrying in %.1f s: '
                            '%s', self.backoff.failures, delay, exc)
            else:
                if self.backoff.failures:
                    LOG.info('Sync succeeded again after %d failure(s)',
                             self.backoff.failures)
                self.backoff.succeeded()
                delay = self.conf.agent.sync_interval
            if once:
                break
            self.stop_event.wait(delay)
        return self.last_report


def serve(conf, discover_fn, once=False, url=None, client=None,
          stop_event=None):
    """``libvirt-gpu agent``: every cycle syncs ``discover_fn()`` (the
    provider tree of the host discovered anew: the CLI's, from its
    ``Environment.rediscover``) to the Placement of ``conf`` (``url``:
    instead of the configured endpoint).  Returns the last SyncReport."""
    if client is None:
        client = make_client(conf, url=url)
    return run(conf, discover_fn, once=once, client=client,
               stop_event=stop_event)


def run(conf, discover_fn, once=False, client=None, stop_event=None):
    """Run the agent (``libvirt-gpu agent``); returns the last SyncReport.

    SIGTERM/SIGINT set the stop event (when called from the main thread);
    the previous handlers are restored on return.
    """
    agent = Agent(conf, discover_fn, client=client, stop_event=stop_event)
    previous = {}
    if not once and threading.current_thread() is threading.main_thread():
        def _stop(signum, frame):
            LOG.info('Signal %d: stopping', signum)
            agent.stop_event.set()

        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, _stop)
    started = time.monotonic()
    LOG.info('Agent: syncing to Placement at %s every %d s',
             agent.client.endpoint, conf.agent.sync_interval)
    try:
        return agent.run(once=once)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        LOG.info('Agent stopped after %d cycle(s) in %.0f s',
                 agent.cycles, time.monotonic() - started)
