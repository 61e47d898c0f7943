#!/usr/bin/env python3
"""Does scraping ``libvirt-gpu exporter`` slow guest starts down?

The installed qemu hook's ``prepare`` of a guest with 4 vGPUs (whole
process; each followed by an untimed ``release``) on a simulated T4 host
(the kernel's create/remove emulated by an inotify watcher in this
process), in blocks of ``--block`` runs, in turn: without scraping; while
a thread scrapes the exporter (``libvirt-gpu exporter --no-libvirt``, its
own process) once a second (Prometheus' default is every 60 s, commonly
15 s); while it scrapes in a loop as fast as it answers; ``--runs``
prepares each.  Prints the medians, and the scrapes' count and median
time.  A scrape takes no lease lock (a read-only SQLite snapshot), so the
prepares should differ only by the CPU the scrapes take from them on a
small machine (the tight loop keeps one CPU busy).

    .venv/bin/python bench/exporter.py [--runs 60] [--block 10]
"""

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import timing     # bench/timing.py: this directory is first on sys.path

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)

import hook as hook_bench  # noqa: E402 - bench/hook.py: its guest XML
from libvirt_gpu.guests import hook  # noqa: E402
from tests import private_tmp  # noqa: E402
from tests.doubles import kernel_sysfs  # noqa: E402
from tests.doubles import trees  # noqa: E402


def free_port():
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


class Scraper(threading.Thread):
    def __init__(self, url):
        super().__init__(daemon=True)
        self.url = url
        self.mode = None          # None, or seconds between scrapes
        self.stop = threading.Event()
        self.times = []

    def run(self):
        while not self.stop.is_set():
            mode = self.mode
            if mode is None:
                time.sleep(0.02)
                continue
            t0 = time.perf_counter()
            with urllib.request.urlopen(self.url, timeout=30) as reply:
                reply.read()
            self.times.append(time.perf_counter() - t0)
            if mode:
                self.stop.wait(mode)


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--runs', type=int, default=60)
    p.add_argument('--block', type=int, default=10)
    args = p.parse_args()
    # state directories under /tmp are refused: see tests/private_tmp.py
    private_tmp.use_private_tmp()
    work = tempfile.mkdtemp(prefix='bench-exporter-')
    exporter = None
    try:
        with trees.simulated_tree('t4') as (root, profile):
            config = os.path.join(work, 'libvirt-gpu.conf')
            with open(config, 'w') as f:
                f.write('[DEFAULT]\nsysfs_root = %s\nstate_dir = %s\n'
                        '[gpu]\nenabled_vgpu_types = nvidia-223\n'
                        % (root, os.path.join(work, 'state')))
            installed = hook.install(os.path.join(work, 'hooks'), config)
            port = free_port()
            exporter = subprocess.Popen(
                [sys.executable, '-m', 'libvirt_gpu.cmd.main',
                 '--config-file', config, 'exporter', '--no-libvirt',
                 '--port', str(port)], cwd=HERE)
            url = 'http://127.0.0.1:%d/metrics' % port
            for _ in range(300):
                try:
                    urllib.request.urlopen(url, timeout=5).read()
                    break
                except OSError:
                    time.sleep(0.1)
            scraper = Scraper(url)
            scraper.start()
            print('host:   simulated T4 (2 GPUs) at %s' % root)
            print('load:   %s (1/5/15 min averages; %d CPUs)'
                  % (' '.join('%.2f' % x for x in os.getloadavg()),
                     os.cpu_count()))
            argv = [installed.path, 'gpu']
            modes = ((None, 'no scraping'), (1.0, 'scraped every 1 s'),
                     (0, 'scraped in a tight loop'))
            timed = {mode: [] for mode, _ in modes}
            with kernel_sysfs.KernelWatcher(root, profile):
                for _ in range(3):                      # warm up
                    xml = hook_bench.gpu_xml(4)
                    hook_bench.timed(argv + ['prepare', 'begin', '-'], xml,
                                     hook_bench.CLEAN_ENV)
                    hook_bench.timed(argv + ['release', 'end', '-'], xml,
                                     hook_bench.CLEAN_ENV)
                while min(len(v) for v in timed.values()) < args.runs:
                    for mode, _ in modes:
                        scraper.mode = mode
                        for _ in range(args.block):
                            xml = hook_bench.gpu_xml(4)
                            timed[mode].append(hook_bench.timed(
                                argv + ['prepare', 'begin', '-'], xml,
                                hook_bench.CLEAN_ENV))
                            hook_bench.timed(argv + ['release', 'end', '-'],
                                             xml, hook_bench.CLEAN_ENV)
            scraper.mode = None
            scraper.stop.set()
            print('\nprepare of a guest with 4 vGPUs, whole process, '
                  'median of %d each (blocks of %d in turn):'
                  % (args.runs, args.block))
            for mode, label in modes:
                runs = timed[mode][:args.runs]
                print('   %-28s %.1f ms (min %.1f, max %.1f)'
                      % (label, statistics.median(runs) * 1000,
                         min(runs) * 1000, max(runs) * 1000))
            if scraper.times:
                print('   scrapes meanwhile: %d, median %.1f ms each (no '
                      'libvirt; sysfs and leases only)'
                      % (len(scraper.times),
                         statistics.median(scraper.times) * 1000))
            print('   CPU of this process tree: %.1f s'
                  % timing.children_cpu())
    finally:
        if exporter is not None:
            exporter.terminate()
            exporter.wait(30)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
