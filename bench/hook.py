#!/usr/bin/env python3
"""How much the qemu hook costs a guest start.

1. Whole-process time of the installed hook for a guest without GPUs
   (``prepare begin``, the operation that does the most), next to a bare
   ``<interpreter> -I -c pass`` of the same interpreter and of
   ``<interpreter> -I -S -c pass`` (the interpreter as the hook's first
   line starts it), interleaved in the same run; medians [quartiles] of
   ``--runs`` each.  Targets: at most 1.5x the first, 1.1x the second.
2. Whole-process time of ``prepare`` for a guest with 4 vGPUs on a
   simulated T4 host (the kernel's create/remove emulated by an inotify
   watcher in this process), each followed by an untimed ``release``.
   Target: under 100 ms.  The first (cold) run, which rebuilds the hook's
   settings snapshot through oslo.config, is reported apart.  In turn
   with it, a live migration's destination: ``migrate`` of the same kind
   of guest coming from another host (its 4 vGPUs reserved here and the
   XML rewritten), followed by an untimed ``prepare`` and ``release``.  With
   ``--before DIR``, the hook of the package in DIR (an older checkout),
   installed with its own state directory on the same host, runs in turn
   with this one, for a before/after in one run; ``--against REF``, the
   same for commit REF of this checkout (bench/against.py).
3. What recording its figures for ``libvirt-gpu exporter`` costs a call
   (``figures``; target: at most 1 ms): ``hook.run`` of ``prepare`` (4
   vGPUs) and ``release`` in this process, with recording and with it
   replaced by nothing, interleaved in the same run (medians of
   ``--record-runs`` each), and the recording call alone.

With ``--importtime N``, the N costliest imports of one warm 4-vGPU
``prepare`` (and, with ``--before``/``--against``, of the older hook, and
the modules only one of the two imports).  With ``--instructions N``, the
instructions (valgrind's callgrind) of N warm 4-vGPU ``prepare`` calls,
of the older hook's too, and of a bare ``-I -S -c pass``: a count that a
busy machine does not disturb, where wall time on such a machine moves
by tens of percent between runs.

    .venv/bin/python bench/hook.py [--runs 200] [--prepare-runs 30]
                                   [--record-runs 200]
                                   [--before DIR | --against REF]
                                   [--importtime N] [--instructions N]
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid as uuidlib

import against    # bench/against.py and bench/timing.py: this
import timing     # directory is first on sys.path

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)

from libvirt_gpu.virt import config_xml  # noqa: E402
from libvirt_gpu.store import figures  # noqa: E402
from libvirt_gpu.guests import hook  # noqa: E402
from libvirt_gpu.virt import metadata  # noqa: E402
from libvirt_gpu import objects  # noqa: E402
from tests import private_tmp  # noqa: E402
from tests.doubles import kernel_sysfs  # noqa: E402
from tests.doubles import trees  # noqa: E402

CLEAN_ENV = {'LC_ALL': 'C', 'PATH': '/usr/sbin:/usr/bin:/sbin:/bin',
             'HOME': '/root'}
PLAIN_XML = b'''<domain type='kvm' id='7'>
  <name>plain</name>
  <uuid>9b2f7c1e-8a59-4f0e-b3c2-1d4e5f6a7b8c</uuid>
  <memory unit='KiB'>65536</memory>
  <currentMemory unit='KiB'>65536</currentMemory>
  <vcpu placement='static'>1</vcpu>
  <os><type arch='x86_64' machine='pc-i440fx-7.2'>hvm</type></os>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <controller type='usb' index='0' model='none'/>
    <controller type='pci' index='0' model='pci-root'/>
    <interface type='network'><mac address='52:54:00:12:34:56'/>
      <source network='default'/><model type='virtio'/></interface>
    <serial type='pty'><target port='0'/></serial>
    <video><model type='none'/></video>
    <memballoon model='none'/>
  </devices>
</domain>
'''


CPU = []      # CPU seconds (user + system) of each timed child, in order
OUT = []      # the stdout of each timed child, in order
SOURCE_GPU = '0000:65:00.0'     # a migrating guest's GPU on its source


def timed(argv, data=b'', env=None):
    """Wall seconds of one process; its CPU seconds go to CPU (a figure
    that other work on a busy machine disturbs less than wall time)."""
    cpu0 = timing.children_cpu()
    t0 = time.perf_counter()
    r = subprocess.run(argv, input=data, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, env=env)
    elapsed = time.perf_counter() - t0
    CPU.append(timing.children_cpu() - cpu0)
    OUT.append(r.stdout)
    if r.returncode != 0:
        raise SystemExit('%s failed (%d): %s' % (argv, r.returncode,
                                                 r.stderr.decode()[-2000:]))
    return elapsed


def gpu_xml(n, parent=None):
    uuids = [objects.Uuid.parse(str(uuidlib.uuid4())) for _ in range(n)]
    type_id = objects.TypeId.parse('nvidia-223')
    meta = metadata.render_document(metadata.GpuMetadata(vgpus=tuple(
        metadata.VgpuEntry(u, type_id, parent) for u in uuids)))
    devices = ''.join(config_xml.mdev_hostdev(u) for u in uuids)
    xml = PLAIN_XML.decode().replace(
        '<memory ', '<metadata>%s</metadata>\n  <memory ' % meta, 1)
    return xml.replace('</devices>', devices + '</devices>').encode()


def install_from(package_dir, hooks_dir, config):
    """Install the hook of the libvirt_gpu package in ``package_dir``;
    returns its path."""
    # The hook package moved to libvirt_gpu/guests/ (aa3d4d4); an older
    # checkout (f8d0e51, the one item 8 of issue 27 compares with) has it
    # at the top.
    code = ('import sys; sys.path.insert(0, %r)\n'
            'try:\n'
            '    from libvirt_gpu.guests import hook\n'
            'except ImportError:      # before the package was grouped\n'
            '    import importlib\n'
            '    hook = importlib.import_module("libvirt_gpu" + ".hook")\n'
            'print(hook.install(%r, %r).path)'
            % (package_dir, hooks_dir, config))
    return subprocess.run([sys.executable, '-c', code], check=True,
                          stdout=subprocess.PIPE, text=True,
                          cwd=package_dir).stdout.strip()


def ms(seconds):
    return '%.1f ms' % (seconds * 1000)


def spread_ms(seconds):
    """``median ms [first-third quartile]`` of ``seconds``."""
    return '%.1f ms [%.1f-%.1f]' % tuple(
        x * 1000 for x in timing.quartiles(seconds))


def spread_x(ratios):
    return '%.2fx [%.2f-%.2f]' % timing.quartiles(ratios)


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--runs', type=int, default=200)
    p.add_argument('--prepare-runs', type=int, default=30)
    p.add_argument('--record-runs', type=int, default=200)
    against.add_option(p)
    p.add_argument('--importtime', type=int, metavar='N', default=0,
                   help="print the N costliest imports of one warm 4-vGPU "
                   "prepare (python -X importtime, cumulative)")
    p.add_argument('--instructions', type=int, metavar='N', default=0,
                   help="count the instructions of N warm 4-vGPU "
                   "prepares under valgrind's callgrind (needs valgrind), "
                   "next to a bare interpreter's and the older hook's")
    args = p.parse_args()
    # state directories under /tmp are refused: see tests/private_tmp.py
    private_tmp.use_private_tmp()
    with against.before_tree(args) as (before, label):
        return _main(args, before, label)


def _main(args, before, label):
    work = tempfile.mkdtemp(prefix='bench-hook-')
    try:
        with trees.simulated_tree('t4') as (root, profile):
            config = os.path.join(work, 'libvirt-gpu.conf')
            state_dir = os.path.join(work, 'state')
            with open(config, 'w') as f:
                f.write('[DEFAULT]\nsysfs_root = %s\nstate_dir = %s\n'
                        '[gpu]\nenabled_vgpu_types = nvidia-223\n'
                        % (root, state_dir))
            installed = hook.install(os.path.join(work, 'hooks'), config)
            python = installed.python
            before_hook = None
            if before:
                before_config = os.path.join(work, 'before.conf')
                with open(before_config, 'w') as f:
                    f.write('[DEFAULT]\nsysfs_root = %s\nstate_dir = %s\n'
                            '[gpu]\nenabled_vgpu_types = nvidia-223\n'
                            % (root, os.path.join(work, 'before-state')))
                before_hook = install_from(
                    before, os.path.join(work, 'before-hooks'),
                    before_config)
                print('before:      %s (%s)' % (before_hook, label))
            print('hook:        %s (interpreter %s -IS)'
                  % (installed.path, python))
            print('host:        simulated T4 (2 GPUs) at %s; state %s'
                  % (root, state_dir))

            print('load:        %s (1/5/15 min averages; %d CPUs)'
                  % (' '.join('%.2f' % x for x in os.getloadavg()),
                     os.cpu_count()))
            bare, bare_s, ours, system = [], [], [], []
            bare_cpu, ours_cpu = [], []
            have_system = os.path.exists('/usr/bin/python3')
            argv = [installed.path, 'plain', 'prepare', 'begin', '-']
            for _ in range(5):                          # warm the caches
                timed(argv, PLAIN_XML, CLEAN_ENV)
                timed([python, '-I', '-c', 'pass'])
                timed([python, '-I', '-S', '-c', 'pass'])
            for _ in range(args.runs):
                bare.append(timed([python, '-I', '-c', 'pass']))
                bare_cpu.append(CPU[-1])
                # the interpreter as the hook's first line starts it
                bare_s.append(timed([python, '-I', '-S', '-c', 'pass']))
                ours.append(timed(argv, PLAIN_XML, CLEAN_ENV))
                ours_cpu.append(CPU[-1])
                if have_system:
                    system.append(timed(['/usr/bin/python3', '-I', '-c',
                                         'pass']))
            m_bare, m_ours = statistics.median(bare), statistics.median(ours)
            print('\n1. guest without GPUs, whole process, median [quartiles] '
                  'of %d:' % args.runs)
            print('   %-44s %s' % ('%s -I -c pass' % python, spread_ms(bare)))
            print('   %-44s %s' % ('%s -I -S -c pass' % python,
                                   spread_ms(bare_s)))
            if system:
                print('   %-44s %s' % ('/usr/bin/python3 -I -c pass',
                                       spread_ms(system)))
            print('   %-44s %s' % ('hook prepare begin (no GPU)',
                                   spread_ms(ours)))
            print('   ratio hook / bare interpreter: %.2fx (target <= 1.5x)'
                  % (m_ours / m_bare))
            print('   ratio hook / interpreter -I -S: %.2fx, run by run %s '
                  '(target <= 1.1x)' % (
                      m_ours / statistics.median(bare_s),
                      spread_x([a / b for a, b in zip(ours, bare_s)])))
            print('   CPU time, median: bare %s, hook %s'
                  % (ms(statistics.median(bare_cpu)),
                     ms(statistics.median(ours_cpu))))

            runs, runs_cpu = [], []
            mig, mig_cpu = [], []
            old, old_cpu = [], []
            cold = None
            with kernel_sysfs.KernelWatcher(root, profile):
                os.unlink(installed.settings_file)      # force a cold run
                for i in range(args.prepare_runs + 1):
                    xml = gpu_xml(4)
                    elapsed = timed([installed.path, 'gpu', 'prepare',
                                     'begin', '-'], xml, CLEAN_ENV)
                    if i:
                        runs_cpu.append(CPU[-1])
                    timed([installed.path, 'gpu', 'release', 'end', '-'],
                          xml, CLEAN_ENV)
                    if i == 0:
                        cold = elapsed
                    else:
                        runs.append(elapsed)
                    if before_hook and i:
                        old.append(timed([before_hook, 'gpu', 'prepare',
                                          'begin', '-'], xml, CLEAN_ENV))
                        old_cpu.append(CPU[-1])
                        timed([before_hook, 'gpu', 'release', 'end', '-'],
                              xml, CLEAN_ENV)
                    if i:
                        xml = gpu_xml(4, objects.PciAddress.parse(
                            SOURCE_GPU))
                        mig.append(timed([installed.path, 'gpu', 'migrate',
                                          'begin', '-'], xml, CLEAN_ENV))
                        mig_cpu.append(CPU[-1])
                        here = OUT[-1] or xml
                        if SOURCE_GPU.encode() in here:
                            raise SystemExit('migrate left the source GPU '
                                             'in the XML')
                        timed([installed.path, 'gpu', 'prepare', 'begin',
                               '-'], here, CLEAN_ENV)
                        timed([installed.path, 'gpu', 'release', 'end',
                               '-'], here, CLEAN_ENV)
            print('\n2. prepare of a guest with 4 vGPUs (created, then '
                  'released untimed), whole process:')
            print('   cold (settings snapshot rebuilt):  %s' % ms(cold))
            print('   median of %d:                      %s (target < 100 '
                  'ms)' % (len(runs), ms(statistics.median(runs))))
            print('   quartiles, min / max:              %s, %s / %s'
                  % (spread_ms(runs), ms(min(runs)), ms(max(runs))))
            print('   CPU time of the hook, median:      %s'
                  % ms(statistics.median(runs_cpu)))
            print('   ratio to the bare interpreter:     %.2fx (target <= '
                  '3x), CPU %.2fx' % (statistics.median(runs) / m_bare,
                                      statistics.median(runs_cpu) /
                                      statistics.median(bare_cpu)))
            print('   migrate on the destination (4 vGPUs reserved, XML '
                  'rewritten), in turn with it:')
            print('   median of %d:                      %s, CPU %s'
                  % (len(mig), ms(statistics.median(mig)),
                     ms(statistics.median(mig_cpu))))
            if old:
                print('   before (%s), in turn with it:' % label)
                print('   median of %d:                      %s, CPU %s'
                      % (len(old), ms(statistics.median(old)),
                         ms(statistics.median(old_cpu))))
                print('   ratio now / before:                %.2fx (CPU '
                      '%.2fx)' % (statistics.median(runs) /
                                  statistics.median(old),
                                  statistics.median(runs_cpu) /
                                  statistics.median(old_cpu)))
            if args.importtime:
                with kernel_sysfs.KernelWatcher(root, profile):
                    import_profile(python, installed.path, args.importtime,
                                   before_hook, label)
            if args.instructions:
                with kernel_sysfs.KernelWatcher(root, profile):
                    instruction_counts(python, installed.path,
                                       args.instructions, before_hook, label)
            recording(root, profile, config, installed.settings_file,
                      state_dir, args.record_runs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def import_profile(python, hook_path, n, before_hook=None, label=None):
    """Where a warm 4-vGPU prepare's start-up goes: the ``n`` imports
    with the largest cumulative time (``-X importtime``), and their sum
    for the top-level ones; with ``before_hook``, the modules only one of
    the two imports, each with its own time."""
    now = _imports(python, hook_path)
    _print_imports('imports of one warm prepare', now, n)
    if before_hook:
        before = _imports(python, before_hook)
        _print_imports('imports of one warm prepare of %s' % label,
                       before, n)
        own_now = {name.strip(): own for _, own, name in now}
        own_before = {name.strip(): own for _, own, name in before}
        for title, mine, other in (('only now', own_now, own_before),
                                   ('only before', own_before, own_now)):
            names = sorted(set(mine) - set(other), key=mine.get,
                           reverse=True)
            print('\n   %s: %d modules, own time %s' % (
                title, len(names), ms(sum(mine[x] for x in names) / 1e6)))
            for name in names[:n]:
                print('   %9s  %s' % (ms(mine[name] / 1e6), name))


def _instructions(argv, data=b''):
    """The instructions callgrind counts for the process ``argv``."""
    r = subprocess.run(['valgrind', '--tool=callgrind',
                        '--callgrind-out-file=/dev/null'] + argv,
                       input=data, capture_output=True, env=CLEAN_ENV)
    if r.returncode != 0:
        raise SystemExit('%s failed under valgrind (%d): %s' % (
            argv, r.returncode, r.stderr.decode()[-2000:]))
    for line in r.stderr.decode().splitlines():
        if 'Collected :' in line:
            return int(line.rsplit(':', 1)[1])
    raise SystemExit('valgrind printed no instruction count for %s' % argv)


def instruction_counts(python, hook_path, n, before_hook=None, label=None):
    """Instructions of ``n`` warm 4-vGPU prepares (each released untimed),
    of ``before_hook``'s in turn with them, and of a bare interpreter."""
    if shutil.which('valgrind') is None:
        raise SystemExit('--instructions needs valgrind (apt-get install '
                         'valgrind)')
    bare = _instructions([python, '-I', '-S', '-c', 'pass'])
    now, before = [], []
    for _ in range(n):
        for hook_at, counts in ((hook_path, now), (before_hook, before)):
            if hook_at is None:
                continue
            xml = gpu_xml(4)
            counts.append(_instructions([python, '-I', '-S', hook_at, 'gpu',
                                         'prepare', 'begin', '-'], xml))
            timed([hook_at, 'gpu', 'release', 'end', '-'], xml, CLEAN_ENV)
    print('\n   instructions (callgrind), median of %d:' % n)
    print('   %-34s %6.1f M' % ('%s -I -S -c pass' % python, bare / 1e6))
    print('   %-34s %6.1f M = %.2fx the bare interpreter' % (
        'prepare (4 vGPUs)', statistics.median(now) / 1e6,
        statistics.median(now) / bare))
    if before:
        print('   %-34s %6.1f M = %.2fx the bare interpreter' % (
            'prepare of %s' % label, statistics.median(before) / 1e6,
            statistics.median(before) / bare))
        print('   ratio now / before:                %.3fx'
              % (statistics.median(now) / statistics.median(before)))


def _imports(python, hook_path):
    """``[(cumulative ns, own ns, name)]`` of one warm 4-vGPU prepare."""
    xml = gpu_xml(4)
    r = subprocess.run([python, '-X', 'importtime', '-IS', hook_path, 'gpu',
                        'prepare', 'begin', '-'], input=xml,
                       capture_output=True, env=CLEAN_ENV)
    timed([hook_path, 'gpu', 'release', 'end', '-'], xml, CLEAN_ENV)
    rows = []
    for line in r.stderr.decode().splitlines():
        if not line.startswith('import time:') or 'cumulative' in line:
            continue
        own, cumulative, name = line.split('|', 2)
        rows.append((int(cumulative), int(own.split(':')[1]), name[1:]))
    return rows


def _print_imports(title, rows, n):
    top = [r for r in rows if not r[2].startswith(' ')]
    print('\n   %s: %d modules, top level %s (cumulative)'
          % (title, len(rows), ms(sum(r[0] for r in top) / 1e6)))
    for cumulative, own, name in sorted(rows, reverse=True)[:n]:
        print('   %9s %9s  %s' % (ms(cumulative / 1e6), ms(own / 1e6),
                                  name.rstrip()))


def recording(root, profile, config, settings_file, state_dir, n):
    """Section 3: the hook's in-process cost with and without recording
    its figures, interleaved."""
    sysfs = kernel_sysfs.KernelSysfs(root, profile)
    real_done = figures.HookTimer.done

    mode = 'with'

    def call(op, xml):
        t0, c0 = time.perf_counter(), time.process_time()
        rc = hook.run(['qemu', 'gpu', op, 'begin', '-'], xml,
                      config_file=config, settings_file=settings_file,
                      sysfs=sysfs, stderr=sys.stderr)
        if rc != 0:
            raise SystemExit('%s failed' % op)
        cpu[mode].append(time.process_time() - c0)
        return time.perf_counter() - t0

    timings = {'with': ([], []), 'without': ([], [])}
    cpu = {'with': [], 'without': []}
    try:
        for i in range(n + 5):
            # each goes first every other time: neither gets the warmer
            # caches
            for mode in (('with', 'without') if i % 2 else
                         ('without', 'with')):
                figures.HookTimer.done = (
                    real_done if mode == 'with' else lambda *a: None)
                xml = gpu_xml(4)
                prepare, release = call('prepare', xml), call('release', xml)
                if i >= 5:                       # the first five warm up
                    timings[mode][0].append(prepare)
                    timings[mode][1].append(release)
    finally:
        figures.HookTimer.done = real_done
    alone, alone_cpu = [], []
    for _ in range(n):
        t0, c0 = time.perf_counter(), time.process_time()
        figures.record_hook_call(state_dir, 'prepare', figures.OK, 0.01)
        alone.append(time.perf_counter() - t0)
        alone_cpu.append(time.process_time() - c0)
    print('\n3. recording the figures (libvirt-gpu exporter), hook.run in '
          'this process, median of %d each, interleaved:' % n)
    for index, op in enumerate(('prepare (4 vGPUs)', 'release')):
        with_, without = (statistics.median(timings[m][index])
                          for m in ('with', 'without'))
        print('   %-18s with %s, without %s: +%.3f ms'
              % (op, ms(with_), ms(without), (with_ - without) * 1000))
    print('   CPU time of a call (prepare or release), median: with %s, '
          'without %s' % (ms(statistics.median(cpu['with'])),
                          ms(statistics.median(cpu['without']))))
    print('   figures.record_hook_call alone, median: %.3f ms wall, %.3f ms '
          'CPU (target <= 1 ms)' % (statistics.median(alone) * 1000,
                                    statistics.median(alone_cpu) * 1000))


if __name__ == '__main__':
    sys.exit(main())
