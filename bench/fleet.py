#!/usr/bin/env python3
"""Fleet benchmark: N simulated hosts (8 GPUs each) sync to one real Placement.

    .venv/bin/python bench/fleet.py [--hosts 10,100,500] [--concurrency 4]

For each N a fresh Placement (openstack-placement, SQLite, gunicorn; see
tests/functional/placement_server.py) is started and N agents sync to it:

* first sync   - empty Placement; the agent's client is new, so this
                 includes the microversion negotiation (GET /);
* steady       - the agent's next cycle, nothing changed: it remembers what
                 it verified (SyncState) and sends one GET per host;
* steady cold  - the same with no memory (a one-shot `placement sync`):
                 every provider's inventories and traits are read. Its cost
                 per host does not depend on N, so it runs on the first
                 `--cold-sample` hosts only (the phase says how many).

Requests and milliseconds are per host (mean; p95 of the time), writes are
the PUT/POST/DELETE among the requests; `wall` is the time for the whole
fleet with `--concurrency` agents syncing at once.

The hosts' GPUs come from the simulator: one synthetic 8-GPU host written
as a sysfs tree, discovered by the sysfs reader, and built into a provider
tree per host name (every GPU offers its first vGPU type).
"""

import argparse
import concurrent.futures
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from libvirt_gpu.devices import discovery  # noqa: E402
from libvirt_gpu import objects  # noqa: E402
from libvirt_gpu import simulator  # noqa: E402
from libvirt_gpu.devices import sysfs as sysfs_mod  # noqa: E402
from libvirt_gpu.util import records  # noqa: E402
from libvirt_gpu.openstack.placement import model  # noqa: E402
from libvirt_gpu.openstack.placement import sync  # noqa: E402
from tests import private_tmp  # noqa: E402
from tests.doubles import kinds  # noqa: E402
from tests.functional import placement_server  # noqa: E402

GPUS_PER_HOST = 8


@records.record
class Phase:
    name: str
    hosts: int
    requests: float      # per host, mean
    writes: float        # per host, mean
    ms_mean: float
    ms_p95: float
    wall_s: float


def discover_gpus():
    with tempfile.TemporaryDirectory(prefix='fleet-sysfs-') as root:
        simulator.write_sysfs(simulator.synthetic_profile(GPUS_PER_HOST),
                              root)
        gpus = discovery.from_sysfs(sysfs_mod.Sysfs(root),
                                    kinds=kinds.registered()).gpus
    if len(gpus) != GPUS_PER_HOST:
        raise SystemExit('simulator gave %d GPUs, expected %d'
                         % (len(gpus), GPUS_PER_HOST))
    return gpus


def host_tree(name, gpus):
    enabled = {g.address: objects.EnabledType(g.mdev_types[0].id)
               for g in gpus if g.mdev_types}
    return model.build_tree(name, gpus, enabled)


class Host:
    def __init__(self, name, gpus, server):
        self.tree = host_tree(name, gpus)
        self.client = server.client()
        self.state = sync.SyncState()

    def sync(self, remember=True):
        before = self.client.stats.copy()
        start = time.perf_counter()
        report = sync.sync(self.client, self.tree,
                           state=self.state if remember else None)
        elapsed = time.perf_counter() - start
        stats = self.client.stats - before
        if report.failed:
            raise SystemExit('%s: %s' % (self.tree.root.name,
                                         report.failed[0].detail))
        return stats.total, stats.writes, elapsed


def run_phase(name, hosts, concurrency, **kwargs):
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda h: h.sync(**kwargs), hosts))
    wall = time.perf_counter() - start
    times = sorted(r[2] * 1000 for r in results)
    return Phase(
        name=name, hosts=len(hosts),
        requests=statistics.mean(r[0] for r in results),
        writes=statistics.mean(r[1] for r in results),
        ms_mean=statistics.mean(times),
        ms_p95=times[min(len(times) - 1, int(len(times) * 0.95))],
        wall_s=wall)


def bench(n, gpus, concurrency, workers, cold_sample):
    with placement_server.running(workers=workers) as server:
        hosts = [Host('compute-%04d' % i, gpus, server) for i in range(n)]
        phases = [run_phase('first sync', hosts, concurrency),
                  run_phase('steady', hosts, concurrency),
                  run_phase('steady cold', hosts[:cold_sample], concurrency,
                            remember=False)]
        check = hosts[-1].client.list_tree(hosts[-1].tree.root.uuid)
        if len(check) != GPUS_PER_HOST + 1:
            raise SystemExit('host %s has %d providers in Placement'
                             % (hosts[-1].tree.root.name, len(check)))
        return server.timings, phases


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--hosts', default='10,100,500',
                        help='comma-separated fleet sizes (default '
                             '%(default)s)')
    parser.add_argument('--concurrency', type=int, default=4,
                        help='agents syncing at the same time (default '
                             '%(default)s)')
    parser.add_argument('--workers', type=int, default=1,
                        help='gunicorn worker processes of Placement '
                             '(default %(default)s; SQLite refuses '
                             'concurrent writers with "database is locked")')
    parser.add_argument('--cold-sample', type=int, default=100,
                        help='hosts measured in the steady-cold phase '
                             '(default %(default)s)')
    args = parser.parse_args(argv)
    # state directories under /tmp are refused: see tests/private_tmp.py
    private_tmp.use_private_tmp()
    sizes = [int(s) for s in args.hosts.split(',') if s.strip()]

    gpus = discover_gpus()
    print('Placement fleet benchmark: %d GPUs per host, %d agents at once, '
          'Placement = openstack-placement on SQLite, gunicorn %d sync '
          'worker(s), %d CPUs'
          % (GPUS_PER_HOST, args.concurrency, args.workers, os.cpu_count()))
    rows = []
    for n in sizes:
        timings, phases = bench(n, gpus, args.concurrency, args.workers,
                                args.cold_sample)
        print('  N=%d: placement install %.1f s, db sync %.1f s, start '
              '%.1f s' % (n, timings.install_s, timings.db_sync_s,
                          timings.start_s), flush=True)
        rows.extend((n, p) for p in phases)

    header = ('fleet', 'phase (hosts run)', 'req/host', 'writes/host',
              'ms/host', 'p95 ms', 'wall s')
    print()
    print('| %5s | %-19s | %8s | %11s | %7s | %6s | %6s |' % header)
    print('|------:|---------------------|---------:|------------:|--------:|'
          '-------:|-------:|')
    for fleet, p in rows:
        print('| %5d | %-19s | %8.1f | %11.1f | %7.1f | %6.1f | %6.1f |'
              % (fleet, '%s (%d)' % (p.name, p.hosts), p.requests, p.writes,
                 p.ms_mean, p.ms_p95, p.wall_s))
    return 0


if __name__ == '__main__':
    sys.exit(main())
