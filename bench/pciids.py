#!/usr/bin/env python3
"""Naming GPUs from the PCI ID database: the lazy reader against a full
parse.

A CLI command names a handful of GPUs, so what matters is the cost of the
first few lookups in a fresh process.  Measured, as medians of several
runs, each with a fresh reader (the file stays in the page cache):

- ``lazy``: ``pciids.PciIds`` looking up vendor, device and subsystem of
  N GPUs (mmap + byte searches in the vendor's block);
- ``full parse``: reading the whole file into dicts of vendors, devices
  and subsystems (what a straightforward parser does), then the same
  lookups.

    .venv/bin/python bench/pciids.py [--runs 15] [--path FILE]
"""

import argparse
import os
import sys

import timing     # bench/timing.py: this directory is first on sys.path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from libvirt_gpu.devices import pciids  # noqa: E402

# (vendor, device, subvendor, subdevice): an H100, a T4, an L40S, an A100,
# the virtio NIC of the H100 capture, an Intel X710.
LOOKUPS = [('10de', '2330', '10de', '16c1'), ('10de', '1eb8', '10de', '12a2'),
           ('10de', '26b9', '10de', '1851'), ('10de', '20f1', '10de', '145f'),
           ('1af4', '1041', '1af4', '1100'), ('8086', '1572', '8086', '0001')]


def full_parse(path):
    vendors, devices, subsystems = {}, {}, {}
    vendor = device = None
    with open(path, encoding='utf-8', errors='replace') as f:
        for line in f:
            if not line.strip() or line.startswith('#'):
                continue
            if line.startswith('C '):
                break
            if line.startswith('\t\t'):
                sub, _, name = line.strip().partition('  ')
                subsystems[(vendor, device, sub)] = name
            elif line.startswith('\t'):
                device, _, name = line.strip().partition('  ')
                devices[(vendor, device)] = name
            else:
                vendor, _, name = line.strip().partition('  ')
                vendors[vendor] = name
    return vendors, devices, subsystems


def lazy(path, lookups):
    db = pciids.PciIds(path)
    names = [(db.vendor(v), db.device(v, d), db.subsystem(v, d, sv, sd))
             for v, d, sv, sd in lookups]
    db.close()
    return names


def parsed(path, lookups):
    vendors, devices, subsystems = full_parse(path)
    return [(vendors.get(v), devices.get((v, d)),
             subsystems.get((v, d, '%s %s' % (sv, sd))))
            for v, d, sv, sd in lookups]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--runs', type=int, default=15)
    parser.add_argument('--path', default=pciids.DEFAULT_PATH)
    args = parser.parse_args()
    if not os.path.exists(args.path):
        sys.exit('%s is missing: install the Debian package pci.ids'
                 % args.path)
    size = os.path.getsize(args.path)
    if lazy(args.path, LOOKUPS) != parsed(args.path, LOOKUPS):
        sys.exit('the lazy reader and the full parse disagree')
    print('%s: %.2f MB' % (args.path, size / 1e6))
    print('%-6s  %12s  %12s' % ('GPUs', 'lazy ms', 'full parse ms'))
    for count in (1, 2, 6):
        sample = LOOKUPS[:count]
        print('%-6d  %12.2f  %12.2f' % (
            count,
            timing.median_ms(lambda: lazy(args.path, sample), args.runs),
            timing.median_ms(lambda: parsed(args.path, sample), args.runs)))


if __name__ == '__main__':
    main()
