#!/usr/bin/env python3
"""Where the time of one cold ``libvirt-gpu --sysfs-root T list --json``
goes, on the simulated host of bench/discovery.py's whole-process part
(256 mdev parents x 20 types).

Each run is a fresh process restricted to one CPU (so that it reads in
one process: no fork hides work), the package byte-compiled as an
installed copy is; the process times its own phases (``perf_counter``
around the functions the command calls, the garbage collector through
``gc.callbacks``) and writes them on a pipe.  Interleaved with them, the
interpreter alone (``python -c pass``: start-up and exit, with ``site``
as the console script has it).  A phase holds the imports made in it (the
command imports what it needs when it runs); "imports made by the
command" sums them all (the outermost ``__import__`` calls), and ``python
-X importtime`` tells them apart.  Medians [quartiles] of ``--runs``, in
ms and as a share of the whole process's median.

    .venv/bin/python bench/list_phases.py [--runs 15] [--parents 256]
                                          [--types 20]
"""

import argparse
import ast
import compileall
import os
import subprocess
import sys
import tempfile
import time

import timing     # bench/timing.py: this directory is first on sys.path

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)

from libvirt_gpu import simulator  # noqa: E402
from tests import private_tmp  # noqa: E402

# Run by each measured process (argv: the tree, the pipe's descriptor).
CHILD = r'''
import gc, os, sys, time
start = time.perf_counter()
phases = {}
collecting = [0.0]


def timed(owner, name, label):
    func = getattr(owner, name)

    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return func(*args, **kwargs)
        finally:
            phases[label] = phases.get(label, 0.0) + time.perf_counter() - t0
    setattr(owner, name, wrapper)


def lazy(cls, name, label):
    prop = cls.__dict__[name]             # a functools.cached_property
    func = prop.func

    def wrapper(self):
        t0 = time.perf_counter()
        try:
            return func(self)
        finally:
            phases[label] = phases.get(label, 0.0) + time.perf_counter() - t0
    prop.func = wrapper


def on_gc(phase, info):
    if phase == 'start':
        collecting.append(time.perf_counter())
    else:
        collecting[0] += time.perf_counter() - collecting.pop()


gc.callbacks.append(on_gc)
from libvirt_gpu.cmd import main
phases['import libvirt_gpu.cmd.main'] = time.perf_counter() - start
from libvirt_gpu.cmd import host_cmds, output
from libvirt_gpu import confcache, environment
from libvirt_gpu.devices import discovery, enablement
from libvirt_gpu.devices.sysfs import devices
t_after_imports = time.perf_counter()
import builtins
real_import = builtins.__import__
importing = [0]


def counted_import(*args, **kwargs):
    if importing[0]:
        return real_import(*args, **kwargs)
    importing[0] = 1
    t0 = time.perf_counter()
    try:
        return real_import(*args, **kwargs)
    finally:
        importing[0] = 0
        phases['imports made by the command'] = phases.get(
            'imports made by the command', 0.0) + time.perf_counter() - t0


builtins.__import__ = counted_import
timed(main, 'build_parser', 'parser')
timed(confcache, 'load', 'settings snapshot')
timed(environment.Environment, 'from_conf', 'Environment')
timed(discovery, 'from_sysfs', 'discovery')
timed(devices.Sysfs, '_mdev_types_of', 'discovery: mdev types')
timed(devices.Sysfs, 'read_gpu', 'discovery: read_gpu (with types)')
timed(discovery, 'with_names', 'PCI names')
timed(enablement, 'resolve', 'enabled types')
lazy(environment.Environment, 'routes', 'routes')
lazy(environment.Environment, 'vgpus', 'vgpu kinds (rooms)')
timed(host_cmds, '_holders', 'holders (leases)')
timed(output, 'gpu_to_json', 'documents')
timed(output, 'emit_gpus_json', 'JSON text and write')
sys.argv = ['libvirt-gpu', '--sysfs-root', sys.argv[1], 'list', '--json']
t0 = time.perf_counter()
code = main.run()
phases['main.run (all of the command)'] = time.perf_counter() - t0
builtins.__import__ = real_import
phases['imports of host_cmds, environment...'] = (
    t_after_imports - start - phases['import libvirt_gpu.cmd.main'])
phases['garbage collector'] = collecting[0]
phases['in the process, all'] = time.perf_counter() - start
sys.stdout.flush()
with os.fdopen(int(sys.argv_fd), 'w') as f:
    f.write(repr(phases))
'''


def _one_cpu():
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def _child(tree, env):
    read_fd, write_fd = os.pipe()
    code = 'import sys; sys.argv_fd = %d\n' % write_fd + CHILD
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, '-c', code, tree], cwd=HERE,
                          env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, pass_fds=(write_fd,),
                          preexec_fn=_one_cpu)
    wall = time.perf_counter() - t0
    os.close(write_fd)
    if done.returncode != 0:
        os.close(read_fd)
        raise SystemExit('list --json failed (%d): %s' % (
            done.returncode, done.stderr.decode()[-2000:]))
    with os.fdopen(read_fd) as f:
        phases = ast.literal_eval(f.read())
    phases['whole process'] = wall
    return phases


def _bare(env):
    t0 = time.perf_counter()
    subprocess.run([sys.executable, '-c', 'pass'], cwd=HERE, env=env,
                   preexec_fn=_one_cpu, check=True)
    return time.perf_counter() - t0


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--runs', type=int, default=15)
    p.add_argument('--parents', type=int, default=256)
    p.add_argument('--types', type=int, default=20)
    args = p.parse_args()
    # state directories under /tmp are refused: see tests/private_tmp.py
    private_tmp.use_private_tmp()
    compileall.compile_dir(os.path.join(HERE, 'libvirt_gpu'), quiet=1)
    profile = simulator.synthetic_profile(args.parents, types=args.types)
    runs = {}
    bare = []
    with tempfile.TemporaryDirectory() as tmp:
        tree = os.path.join(tmp, 'sys')
        simulator.write_host(profile, tree)
        env = dict(os.environ,
                   LIBVIRT_GPU_CACHE_DIR=os.path.join(tmp, 'cache'))
        env.pop('PYTHONDONTWRITEBYTECODE', None)
        _child(tree, env)                       # the settings snapshot
        for _ in range(args.runs):
            for name, value in _child(tree, env).items():
                runs.setdefault(name, []).append(value * 1000.0)
            bare.append(_bare(env) * 1000.0)
    whole = timing.quartiles(runs['whole process'])[0]
    in_process = timing.quartiles(runs['in the process, all'])[0]
    print('cold list --json on %d parents x %d types, one CPU, %d runs; '
          'median [quartiles] ms; load %s'
          % (args.parents, args.types, args.runs,
             ' '.join('%.2f' % x for x in os.getloadavg())))
    rows = [('whole process', runs['whole process']),
            ('  start-up and exit, around the code',
             [w - i for w, i in zip(runs['whole process'],
                                    runs['in the process, all'])]),
            ('    (an interpreter alone: python -c pass)', bare)]
    order = ['import libvirt_gpu.cmd.main',
             'imports of host_cmds, environment...',
             'main.run (all of the command)', 'imports made by the command',
             'parser', 'settings snapshot',
             'Environment', 'discovery',
             'discovery: read_gpu (with types)', 'discovery: mdev types',
             'PCI names', 'enabled types', 'routes', 'vgpu kinds (rooms)',
             'holders (leases)', 'documents', 'JSON text and write',
             'garbage collector']
    for name in order:
        if name in runs:
            rows.append(('  ' + name if name.startswith(('import', 'main'))
                         else '    ' + name, runs[name]))
    for label, values in rows:
        median, q1, q3 = timing.quartiles(values)
        print('%-44s %7.1f [%6.1f-%6.1f] %5.1f %%'
              % (label, median, q1, q3, 100.0 * median / whole))
    print('(in the process: %.1f ms of the %.1f)' % (in_process, whole))
    return 0


if __name__ == '__main__':
    sys.exit(main())
