#!/usr/bin/env python3
"""Discovery time through sysfs and through libvirt's test driver.

For simulated hosts of 1, 8, 64 and 256 mdev parents (~20 types each), the
median of several runs of each source, next to a baseline measured in the
same run: listing and reading every attribute file of the tree with the
plainest Python loop (the floor any sysfs reader pays).

    .venv/bin/python bench/discovery.py [--parents 1,8,64,256] [--runs 7]
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

import libvirt

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from libvirt_gpu import discovery  # noqa: E402
from libvirt_gpu import host  # noqa: E402
from libvirt_gpu import simulator  # noqa: E402
from libvirt_gpu import sysfs  # noqa: E402


def _median_ms(func, runs):
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        func()
        times.append((time.perf_counter() - start) * 1000.0)
    return statistics.median(times)


def _read_all_files(root):
    """Baseline: read every regular file under the PCI device dirs once."""
    count = 0
    for dirpath, _dirs, files in os.walk(os.path.join(root, 'devices')):
        for name in files:
            if name in ('create', 'remove'):
                continue
            with open(os.path.join(dirpath, name), 'rb') as f:
                f.read()
            count += 1
    return count


def _quiet(_ctx, _err):
    pass


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--parents', default='1,8,64,256')
    parser.add_argument('--types', type=int, default=20)
    parser.add_argument('--runs', type=int, default=7)
    args = parser.parse_args(argv)
    libvirt.registerErrorHandler(_quiet, None)
    rows = []
    for parents in [int(p) for p in args.parents.split(',')]:
        profile = simulator.synthetic_profile(parents, types=args.types)
        with tempfile.TemporaryDirectory() as tmp:
            node_xml = simulator.write_host(profile, tmp)
            tree = sysfs.Sysfs(tmp)
            result = discovery.from_sysfs(tree)
            n_parents = sum(1 for g in result.gpus if g.mdev_types)
            n_types = sum(len(g.mdev_types) for g in result.gpus)
            t_sysfs = _median_ms(lambda: discovery.from_sysfs(tree),
                                 args.runs)
            t_floor = _median_ms(lambda: _read_all_files(tmp), args.runs)
            uri = 'test://' + node_xml

            def via_libvirt():
                with host.Host(uri, read_only=True) as h:
                    discovery.from_libvirt(h)
            t_libvirt = _median_ms(via_libvirt, args.runs)
            rows.append((parents, n_parents, n_types, t_sysfs, t_floor,
                         t_libvirt))
    print('discovery, median of %d runs (ms)' % args.runs)
    header = ('parents', 'found', 'types', 'sysfs', 'read-all floor',
              'libvirt-test')
    print('%8s %8s %7s %10s %14s %12s' % header)
    for row in rows:
        print('%8d %8d %7d %10.1f %14.1f %12.1f' % row)
    return 0


if __name__ == '__main__':
    sys.exit(main())
