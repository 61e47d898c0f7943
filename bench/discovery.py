#!/usr/bin/env python3
"""Discovery time through sysfs and through libvirt's test driver.

For simulated hosts of 1, 8, 64 and 256 mdev parents (~20 types each), the
median of several runs of each source, next to a baseline measured in the
same run: listing and reading every attribute file of the tree with the
plainest Python loop (the floor any sysfs reader pays).  Then a real-shaped
host: 8 x A100 PCIe 40GB with all 16 VFs of each enabled (128 mdev parents
with the A100's 6 time-sliced types, from the bundled ``a100`` profile),
where the VFs are grouped under their GPUs and capacity is shared.

Last, the whole process: ``libvirt-gpu --sysfs-root T list --json`` on the
largest simulated host against ``mdevctl types --dumpjson`` reading the same
tree, run alternately (medians of ``--cli-runs`` each), with the types each
one printed counted to prove they read the same thing.  mdevctl reads only
``/sys``, so this part runs in a private mount namespace with the tree
bind-mounted over ``/sys`` (root and ``unshare`` needed; skipped with a
note otherwise).  ``--before DIR`` adds a row for the package in DIR (an
older checkout) run the same way, for a before/after in one run;
``--against REF`` the same for commit REF of this checkout (``git
archive``d apart: bench/against.py).  Each figure is the median of the
rounds with its quartiles, each ratio taken round by round (every command
runs once a round, in turn).  ``--whole-only``: this part alone.  The CLI
reads a host this large in several processes (``libvirt_gpu/util/fanout.py``),
so its CPU time (user + system, the children's included) is printed
beside the wall time, and the same command runs again restricted to one
CPU, where it reads in one process.

    .venv/bin/python bench/discovery.py [--parents 1,8,64,256] [--runs 7]
                                        [--a100-gpus 8] [--cli-runs 15]
                                        [--before DIR | --against REF]
                                        [--whole-only]
"""

import argparse
import compileall
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import libvirt

import against    # bench/against.py and bench/timing.py: this
import timing     # directory is first on sys.path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from libvirt_gpu.devices import discovery  # noqa: E402
from libvirt_gpu.virt import host  # noqa: E402
from libvirt_gpu import objects  # noqa: E402
from libvirt_gpu import simulator  # noqa: E402
from libvirt_gpu.devices import sysfs  # noqa: E402
from libvirt_gpu.openstack.placement import model  # noqa: E402
from libvirt_gpu.simulator import loading  # noqa: E402
from tests import private_tmp  # noqa: E402
from tests.doubles import kinds  # noqa: E402


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


def a100_host(gpus=8):
    """``gpus`` A100 PCIe 40GB, each with its 16 VFs enabled, built from the
    bundled ``a100`` profile's first GPU (its types, ids and VF layout)."""
    with open(os.path.join(loading.profile_dir(), 'a100.json')) as f:
        data = json.load(f)
    pf = dict(data['devices'][0])
    vf_template = dict(data['devices'][1])
    vf_template.pop('mdevs', None)
    devices = []
    group = 100
    for k in range(gpus):
        bus = 0x41 + 0x10 * k
        address = '0000:%02x:00.0' % bus
        vfs = ['0000:%02x:%02x.%x' % (bus, (4 + v) >> 3, (4 + v) & 7)
               for v in range(16)]
        devices.append(dict(pf, address=address, virtfns=vfs,
                            parent_bridge='0000:%02x:01.1' % (bus - 1),
                            iommu_group=group, numa_node=k // 4))
        group += 1
        for vf in vfs:
            devices.append(dict(vf_template, address=vf, physfn=address,
                                parent_bridge='0000:%02x:01.1' % (bus - 1),
                                iommu_group=group, numa_node=k // 4))
            group += 1
    data.update(name='a100-x%d' % gpus, hostname='sim-a100-x%d' % gpus,
                devices=devices)
    return loading.profile_from_dict(data, source='a100_host(%d)' % gpus)


def bench_a100(gpus, runs):
    """Discovery and the provider tree of the 8 x A100 host."""
    profile = a100_host(gpus)
    with tempfile.TemporaryDirectory() as tmp:
        node_xml = simulator.write_host(profile, tmp)
        tree = sysfs.Sysfs(tmp)
        result = discovery.from_sysfs(tree, kinds=kinds.registered())
        pfs = [g for g in result.gpus if not g.is_vf]
        parents = sum(1 for g in result.gpus if g.mdev_types)
        enabled = {g.address: objects.EnabledType('nvidia-472')
                   for g in pfs}
        providers = model.build_tree('h', result.gpus, enabled).children
        totals = sorted({p.inventories_api()['VGPU']['total']
                         for p in providers})
        kind_classes = kinds.registered()
        t_sysfs = timing.median_ms(lambda: discovery.from_sysfs(
            tree, kinds=kind_classes), runs)
        t_tree = timing.median_ms(lambda: model.build_tree(
            'h', discovery.from_sysfs(tree, kinds=kind_classes).gpus,
            enabled), runs)
        uri = 'test://' + node_xml

        def via_libvirt():
            with host.Host(uri, read_only=True) as h:
                discovery.from_libvirt(h, tree, kinds=kinds.registered())
        t_libvirt = timing.median_ms(via_libvirt, runs)
    print()
    print('%d x A100 PCIe 40GB, all VFs enabled, median of %d runs (ms)'
          % (gpus, runs))
    print('%8s %8s %10s %16s %20s' % ('GPUs', 'parents', 'sysfs',
                                      'sysfs+tree', 'libvirt-test+sysfs'))
    print('%8d %8d %10.1f %16.1f %20.1f'
          % (len(pfs), parents, t_sysfs, t_tree, t_libvirt))
    print('providers: %d (one per GPU), A100-20C total per GPU: %s'
          % (len(providers), ', '.join(str(t) for t in totals)))


# What the ``libvirt-gpu`` console script runs (``main.run`` since it
# exists, ``main.main`` in older checkouts).
_CONSOLE_SCRIPT = ('import sys; from libvirt_gpu.cmd import main; '
                   'sys.exit(getattr(main, "run", main.main)())')


def _cli_argv(root, tree, cache_dir):
    """``libvirt-gpu --sysfs-root tree list --json`` from the package in
    ``root``: the console script's code, run with ``root`` as the working
    directory (first on ``sys.path``), so an older checkout is timed the
    same way as this one.  Each package keeps its settings snapshot in its
    own ``cache_dir``, as an installed copy does: the snapshot's key holds
    the option modules' mtimes, so two checkouts sharing one directory
    would each find the other's and pay the oslo.config import every
    run."""
    env = dict(os.environ, LIBVIRT_GPU_CACHE_DIR=cache_dir)
    return dict(args=[sys.executable, '-c', _CONSOLE_SCRIPT, '--sysfs-root',
                      tree, 'list', '--json'], cwd=root, env=env)


def _run_ms(spec):
    """Wall time of one whole process, its CPU time (user + system, less
    disturbed by other work on a busy machine), and what it printed."""
    cpu = timing.children_cpu()
    start = time.perf_counter()
    done = subprocess.run(stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                          check=True, **spec)
    return ((time.perf_counter() - start) * 1000.0,
            (timing.children_cpu() - cpu) * 1000.0, done.stdout)


def _types_listed(name, out):
    """How many (parent, type) pairs a command printed."""
    data = json.loads(out)
    if name == 'mdevctl':
        # [{parent: [{type id: {...}}, ...], ...}]
        return sum(len(types) for parents in data
                   for types in parents.values())
    return sum(len(g['mdev_types']) for g in data)


def _compile(root):
    """Byte-compile the package in ``root``, as ``pip install`` does: with
    PYTHONDONTWRITEBYTECODE set (or a checkout never imported), every run
    would compile every module again, which no installed copy does."""
    compileall.compile_dir(os.path.join(root, 'libvirt_gpu'), quiet=1)


def in_namespace(tree, runs, before):
    """Inside a private mount namespace: show ``tree`` as /sys, then run the
    commands alternately.  Prints a JSON document of the medians."""
    subprocess.run(['mount', '--bind', tree, '/sys'], check=True)
    _compile(os.path.dirname(HERE))
    if before:
        _compile(before)
    caches = tempfile.mkdtemp(prefix='bench-cache-')
    specs = {'mdevctl': dict(args=['mdevctl', 'types', '--dumpjson'])}
    specs['libvirt-gpu'] = _cli_argv(os.path.dirname(HERE), tree,
                                     os.path.join(caches, 'after'))
    # The same on one CPU: the CLI then reads in one process (fanout
    # forks no more processes than the CPUs it may run on).
    specs['one-cpu'] = dict(_cli_argv(os.path.dirname(HERE), tree,
                                      os.path.join(caches, 'after')),
                            preexec_fn=_one_cpu)
    if before:
        specs['before'] = _cli_argv(before, tree,
                                    os.path.join(caches, 'before'))
    times = {name: [] for name in specs}
    cpu = {name: [] for name in specs}
    counts = {}
    try:
        # one untimed round: the snapshots written, the tree in the cache
        for spec in specs.values():
            _run_ms(spec)
        _timed_rounds(specs, runs, times, cpu, counts)
    finally:
        shutil.rmtree(caches)
    json.dump({'ms': times, 'cpu_ms': cpu, 'types': counts}, sys.stdout)
    return 0


def _one_cpu():
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def _timed_rounds(specs, runs, times, cpu, counts):
    order = list(specs)
    for i in range(runs):
        # every other round the other way round: none always runs first
        for name in (order if i % 2 == 0 else order[::-1]):
            spec = specs[name]
            elapsed, used, out = _run_ms(spec)
            times[name].append(elapsed)
            cpu[name].append(used)
            counts.setdefault(name, _types_listed(name, out))


def _figure(values):
    """``median [q1-q3]``, the format of every figure of the table."""
    return '%.2f [%.2f-%.2f]' % timing.quartiles(values)


def bench_whole_process(parents, types, runs, before, label=None):
    """Whole-process ``list --json`` against mdevctl on the same tree."""
    print()
    why = None
    if os.geteuid() != 0:
        why = 'needs root (a private mount namespace)'
    elif not shutil.which('unshare') or not shutil.which('mdevctl'):
        why = 'needs unshare (util-linux) and mdevctl'
    if why:
        print('whole process vs mdevctl: skipped, %s' % why)
        return
    profile = simulator.synthetic_profile(parents, types=types)
    with tempfile.TemporaryDirectory() as tmp:
        simulator.write_host(profile, tmp)
        argv = ['unshare', '--mount', '--propagation', 'private', '--',
                sys.executable, os.path.abspath(__file__),
                '--in-namespace', tmp, '--cli-runs', str(runs)]
        if before:
            argv += ['--before', os.path.abspath(before)]
        got = json.loads(subprocess.run(argv, stdout=subprocess.PIPE,
                                        check=True).stdout)
    print_whole_process(got, parents, types, runs, before and (
        label or 'package in %s' % before))


def print_whole_process(got, parents, types, runs, before_label):
    """The table of ``in_namespace``'s answer: each command's wall and CPU
    time, and its ratio to mdevctl taken round by round (each round runs
    every command once, in turn: the ratio of one round is little
    disturbed by other work on the machine, which comes and goes between
    rounds), as median [first-third quartile]."""
    wall, cpu, counts = got['ms'], got['cpu_ms'], got['types']
    load = ' '.join('%.2f' % x for x in os.getloadavg())
    print('whole process on %d parents x %d types, in turn, %d rounds; '
          'median [quartiles]; load %s, %d CPUs'
          % (parents, types, runs, load, os.cpu_count()))
    print('%-46s %21s %18s %21s %18s %6s' % (
        'command', 'ms', 'x mdevctl', 'CPU ms', 'CPU x', 'types'))
    rows = [('mdevctl types --dumpjson (tree on /sys)', 'mdevctl'),
            ('libvirt-gpu --sysfs-root T list --json', 'libvirt-gpu'),
            ('  the same, on one CPU (one process)', 'one-cpu')]
    if before_label:
        rows.append(('  the same, %s' % before_label, 'before'))
    for label, name in rows:
        print('%-46s %21s %18s %21s %18s %6d' % (
            label, _figure(wall[name]),
            _figure([a / b for a, b in zip(wall[name], wall['mdevctl'])]),
            _figure(cpu[name]),
            _figure([a / b for a, b in zip(cpu[name], cpu['mdevctl'])]),
            counts[name]))
    if before_label:
        print('now / before, round by round: %s (CPU %s)' % (
            _figure([a / b for a, b in zip(wall['libvirt-gpu'],
                                           wall['before'])]),
            _figure([a / b for a, b in zip(cpu['libvirt-gpu'],
                                           cpu['before'])])))
    if len(set(counts.values())) != 1:
        print('WARNING: the commands did not list the same number of types')


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--parents', default='1,8,64,256')
    parser.add_argument('--types', type=int, default=20)
    parser.add_argument('--runs', type=int, default=7)
    parser.add_argument('--a100-gpus', type=int, default=8,
                        help='GPUs of the A100 host (0: skip it)')
    parser.add_argument('--cli-runs', type=int, default=15,
                        help='runs of each whole process (0: skip them)')
    parser.add_argument('--whole-only', action='store_true',
                        help='only the whole process against mdevctl')
    against.add_option(parser)
    parser.add_argument('--in-namespace', metavar='TREE',
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    # state directories under /tmp are refused: see tests/private_tmp.py
    private_tmp.use_private_tmp()
    if args.in_namespace:
        return in_namespace(args.in_namespace, args.cli_runs, args.before)
    with against.before_tree(args) as (before, label):
        return _main(args, before, label)


def _main(args, before, label):
    largest = max(int(p) for p in args.parents.split(','))
    if args.whole_only:
        bench_whole_process(largest, args.types, args.cli_runs, before,
                            label)
        return 0
    libvirt.registerErrorHandler(_quiet, None)
    rows = []
    for parents in [int(p) for p in args.parents.split(',')]:
        profile = simulator.synthetic_profile(parents, types=args.types)
        with tempfile.TemporaryDirectory() as tmp:
            node_xml = simulator.write_host(profile, tmp)
            tree = sysfs.Sysfs(tmp)
            result = discovery.from_sysfs(tree, kinds=kinds.registered())
            n_parents = sum(1 for g in result.gpus if g.mdev_types)
            n_types = sum(len(g.mdev_types) for g in result.gpus)
            t_sysfs = timing.median_ms(lambda: discovery.from_sysfs(
                tree, kinds=kinds.registered()), args.runs)
            t_floor = timing.median_ms(lambda: _read_all_files(tmp), args.runs)
            uri = 'test://' + node_xml

            def via_libvirt():
                with host.Host(uri, read_only=True) as h:
                    discovery.from_libvirt(h, kinds=kinds.registered())
            t_libvirt = timing.median_ms(via_libvirt, args.runs)
            rows.append((parents, n_parents, n_types, t_sysfs, t_floor,
                         t_libvirt))
    print('discovery, median of %d runs (ms)' % args.runs)
    header = ('parents', 'found', 'types', 'sysfs', 'read-all floor',
              'libvirt-test')
    print('%8s %8s %7s %10s %14s %12s' % header)
    for row in rows:
        print('%8d %8d %7d %10.1f %14.1f %12.1f' % row)
    if args.a100_gpus:
        bench_a100(args.a100_gpus, args.runs)
    if args.cli_runs:
        bench_whole_process(largest, args.types, args.cli_runs, before,
                            label)
    return 0


if __name__ == '__main__':
    sys.exit(main())
