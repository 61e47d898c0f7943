#!/usr/bin/env python3
"""What a MIG-backed vGPU costs the qemu hook's ``prepare``, next to a
time-sliced one of the same size, in the same run.

Two live simulated H100 80GB hosts (FUSE, the simulated driver answering
both sysfs and ``[gpu]/nvml = simulated``), each brought to its layout by
``libvirt-gpu layout apply``:

* time-sliced: ``vgpu_types = nvidia-1303`` (H100-10C, 10 GB);
* MIG-backed: ``gpu_instances = 1g.10gb:7``, ``vgpu_types = nvidia-1308``
  (H100-1-10C, 10 GB, one per GPU instance; the driver picks the GI, the
  hook reads it back and records it).

The installed hook runs as libvirt runs it (its argv, the guest's XML on
stdin, libvirt's clean environment): ``prepare begin`` of a guest with
``--vgpus`` vGPUs on free VFs, timed (whole process, wall and CPU), then
an untimed ``release end``; the two hosts in turn (ABBA: each goes first
every other run), ``--runs`` times, after one untimed warm-up each.
The figures are the ratios of the medians, MIG-backed over time-sliced,
of the wall time and of the hook's CPU time (issue 28's target: at most
1.0, within the noise of a shared machine).
The CPU time of the simulated driver (the FUSE server, which is not the
product) while the hook ran, and the number of file operations one
``prepare`` makes on the simulated /sys (with strace, where installed),
say where a difference comes from.  Needs root, /dev/fuse and mfusepy (what
``tests/functional/live_sysfs.py`` needs).

    .venv/bin/python bench/hook_mig.py [--runs 30] [--vgpus 1]
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import timing     # bench/timing.py: this directory is first on sys.path

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)

from libvirt_gpu.devices.backends import nvidia_vgpu  # noqa: E402
from libvirt_gpu.guests import hook  # noqa: E402
from libvirt_gpu import objects  # noqa: E402
from libvirt_gpu.virt import metadata  # noqa: E402
from tests.functional import live_sysfs  # noqa: E402
from tests import private_tmp  # noqa: E402

GPU = '0000:4e:00.0'
CLEAN_ENV = {'LC_ALL': 'C', 'PATH': '/usr/sbin:/usr/bin:/sbin:/bin',
             'HOME': '/root'}
MODES = (
    ('time-sliced', 'nvidia-1303',
     'mode = time-sliced\nvgpu_types = nvidia-1303\n'),
    ('MIG-backed', 'nvidia-1308',
     'mode = mig\ngpu_instances = 1g.10gb:7\nvgpu_types = nvidia-1308\n'),
)
DOMAIN = '''<domain type='kvm'>
  <name>bench</name>
  <uuid>9b2f7c1e-8a59-4f0e-b3c2-1d4e5f6a7b8c</uuid>
  <metadata>%s</metadata>
  <memory unit='KiB'>65536</memory>
  <vcpu placement='static'>1</vcpu>
  <os><type arch='x86_64' machine='pc-i440fx-7.2'>hvm</type></os>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    %s
  </devices>
</domain>
'''


class Host(object):
    """One live H100 at one layout, with our hook installed for it."""

    def __init__(self, work, name, type_id, layout):
        self.name, self.type_id = name, type_id
        self.dir = os.path.join(work, name.lower())
        os.mkdir(self.dir)
        self.live = live_sysfs.LiveSysfs('h100-80gb', uevents=False)
        self.live.start()
        self.config = os.path.join(self.dir, 'libvirt-gpu.conf')
        with open(self.config, 'w') as f:
            f.write('[DEFAULT]\nsysfs_root = %s\nstate_dir = %s\n'
                    '[gpu]\nnvml = simulated\nlayouts = bench\n'
                    '[layout_bench]\ngpus = %s\n%s'
                    % (self.live.root, os.path.join(self.dir, 'state'),
                       GPU, layout))
        r = subprocess.run(
            [sys.executable, '-m', 'libvirt_gpu.cmd.main', '--config-file',
             self.config, '--sysfs-root', self.live.root, 'layout', 'apply'],
            cwd=HERE, capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            raise SystemExit('layout apply (%s) failed: %s'
                             % (name, r.stdout + r.stderr))
        self.hook = hook.install(os.path.join(self.dir, 'hooks'),
                                 self.config).path

    def guest_xml(self, count):
        vfs = [objects.PciAddress.parse(str(a))
               for a in self.live.sysfs.virtfns(GPU)][:count]
        type_id = objects.TypeId.parse(self.type_id)
        meta = metadata.render_document(metadata.GpuMetadata(vgpus=tuple(
            metadata.VgpuEntry(objects.Uuid.new(), type_id, vf)
            for vf in vfs)))
        return (DOMAIN % (meta, ''.join(
            nvidia_vgpu.vf_hostdev(vf) for vf in vfs))).encode()

    def server_cpu(self):
        """CPU seconds the simulated host's server (the FUSE process that
        plays the kernel and the driver) has used so far."""
        with open('/proc/%d/stat' % self.live.pid) as f:
            fields = f.read().rsplit(')', 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf(
            'SC_CLK_TCK')

    def call(self, operation, xml, argv_prefix=()):
        """Wall, CPU seconds of one hook process and the server's CPU
        seconds while it ran."""
        sub = 'begin' if operation == 'prepare' else 'end'
        cpu0, server0 = timing.children_cpu(), self.server_cpu()
        t0 = time.perf_counter()
        r = subprocess.run(list(argv_prefix)
                           + [self.hook, 'bench', operation, sub, '-'],
                           input=xml, capture_output=True, env=CLEAN_ENV)
        wall = time.perf_counter() - t0
        cpu = timing.children_cpu() - cpu0
        if r.returncode != 0:
            raise SystemExit('%s %s failed: %s' % (
                self.name, operation, r.stderr.decode()[-2000:]))
        return wall, cpu, self.server_cpu() - server0

    def sysfs_operations(self, xml, work):
        """How many file operations on the simulated /sys one ``prepare``
        makes (strace), or None without strace."""
        if not shutil.which('strace'):
            return None
        out = os.path.join(work, 'strace-%s' % self.name.lower())
        self.call('prepare', xml, ['strace', '-f', '-o', out, '-e',
                                   'trace=%file,readlink'])
        self.call('release', xml)
        with open(out) as f:
            return sum(1 for line in f if self.live.root in line)

    def placed(self):
        return self.live.state()['driver']['placed']

    def close(self):
        self.live.close()


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--runs', type=int, default=30)
    p.add_argument('--vgpus', type=int, default=1, choices=range(1, 8),
                   metavar='1-7', help='vGPUs per guest (default 1)')
    args = p.parse_args()
    # state directories under /tmp are refused: see tests/private_tmp.py
    private_tmp.use_private_tmp()
    missing = live_sysfs.missing_requirements()
    if missing:
        raise SystemExit('cannot mount a live simulated host: %s'
                         % '; '.join(missing))
    work = tempfile.mkdtemp(prefix='bench-hook-mig-')
    hosts = []
    try:
        for name, type_id, layout in MODES:
            hosts.append(Host(work, name, type_id, layout))
        print('hosts:       two simulated H100 80GB (FUSE), %s'
              % ', '.join('%s %s' % (h.name, h.type_id) for h in hosts))
        print('load:        %s (1/5/15 min averages; %d CPUs)'
              % (' '.join('%.2f' % x for x in os.getloadavg()),
                 os.cpu_count()))
        xmls = {h.name: h.guest_xml(args.vgpus) for h in hosts}
        for h in hosts:                       # warm-up, and a check
            h.call('prepare', xmls[h.name])
            placed = h.placed()
            if len(placed) != args.vgpus:
                raise SystemExit('%s: prepare made %d vGPUs, not %d'
                                 % (h.name, len(placed), args.vgpus))
            h.call('release', xmls[h.name])
            if h.placed():
                raise SystemExit('%s: release left %s' % (h.name,
                                                          h.placed()))
        figures = {h.name: ([], [], []) for h in hosts}
        for run in range(args.runs):
            for h in (hosts if run % 2 == 0 else hosts[::-1]):
                for series, value in zip(figures[h.name],
                                         h.call('prepare', xmls[h.name])):
                    series.append(value)
                h.call('release', xmls[h.name])
        ops = {h.name: h.sysfs_operations(xmls[h.name], work)
               for h in hosts}
        print('prepare (%d vGPU%s), whole hook process, median of %d '
              '(release untimed):' % (args.vgpus, 's' * (args.vgpus > 1),
                                      args.runs))
        medians = {name: [statistics.median(series) * 1000
                          for series in figures[name]] for name in figures}
        for h in hosts:
            print('  %-12s wall %6.1f ms   hook CPU %6.1f ms   simulated '
                  'driver CPU %6.1f ms   file operations on /sys %s'
                  % ((h.name,) + tuple(medians[h.name])
                     + (ops[h.name] if ops[h.name] is not None
                        else '(no strace)',)))
        ts, mig = (h.name for h in hosts)
        print('MIG-backed / time-sliced: wall %.2fx, hook CPU %.2fx '
              '(target: at most 1.0x)'
              % tuple(medians[mig][i] / medians[ts][i] for i in (0, 1)))
    finally:
        for h in hosts:
            h.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == '__main__':
    main()
