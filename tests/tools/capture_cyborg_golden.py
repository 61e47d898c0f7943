"""Capture what OpenStack Cyborg's own NVIDIA driver reports for each
simulated host: the golden objects
tests/unit/openstack/test_cyborg_driver_golden.py
compares our driver's with (``tests/data/cyborg/golden.json``).

Regenerate (after a change of the simulated profiles, of the cases below,
or of Cyborg's pinned version in cyborg-constraints.txt)::

    make cyborg-venv
    .venv-cyborg/bin/python tests/tools/capture_cyborg_golden.py

Each case runs in a process of its own (Cyborg's configuration is
global): the profile is written as a simulated sysfs tree, Cyborg's
``nvidia_gpu_driver`` is loaded through stevedore as Cyborg's agent loads
it, and, in that process only, its absolute ``/sys/...`` paths are mapped
into the simulated tree and ``lspci -nn -D`` (which it runs through
privsep) is answered with lines written from the tree and pci.ids, the way
lspci writes them.  Nothing outside a temporary directory is touched.  The
objects are stored as plain fields (``cyborg_object.data`` without the
wrappers), in Cyborg's order.
"""

import builtins
import json
import os
import re
import subprocess
import sys
import tempfile
import types

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
OUTPUT = os.path.join(REPO, 'tests', 'data', 'cyborg', 'golden.json')
PCI_IDS = '/usr/share/misc/pci.ids'
HOSTNAME = 'compute-1'

# name -> (profile, {vGPU type: [addresses]}).  Cyborg reads a vGPU type
# from the GPU's own mdev_supported_types, so vGPU cases exist only where
# the mdev types sit on the physical GPU (T4s); on the SR-IOV profiles
# (A16, A100: types on the VFs; L40S: NVIDIA's vendor interface) Cyborg's
# driver fails for any enabled type, and they are captured whole.
CASES = {
    't4-pgpu': ('t4', {}),
    't4-vgpu': ('t4', {'nvidia-223': ['0000:af:00.0']}),
    'domain-pgpu': ('domain', {}),
    'domain-vgpu': ('domain', {'nvidia-223': ['0001:01:00.0']}),
    'mixed-pgpu': ('mixed', {}),
    'mixed-vgpu': ('mixed', {'nvidia-231': ['0000:3b:00.0']}),
    'a100-pgpu': ('a100', {}),
    'a16-pgpu': ('a16', {}),
    'l40s-pgpu': ('l40s', {}),
    'a100-40gb-pgpu': ('a100-40gb', {}),
    'h100-80gb-pgpu': ('h100-80gb', {}),
    'rtx-pro-6000-pgpu': ('rtx-pro-6000', {}),
    # Not a bundled profile: T4s that cannot be passed through whole (no
    # IOMMU group; a NIC of the host in the group), which Cyborg offers.
    't4-grouped-pgpu': ('tests/data/cyborg/t4-grouped.json', {}),
}

_ADDRESS = re.compile(r'^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]$')


def profile_path(profile):
    """A bundled profile's name, or a profile file relative to the
    repository."""
    return os.path.join(REPO, profile) if profile.endswith('.json') \
        else profile


def cyborg_conf(enabled):
    lines = ['[DEFAULT]', 'host = %s' % HOSTNAME, '']
    if enabled:
        lines += ['[gpu_devices]',
                  'enabled_vgpu_types = %s' % ', '.join(enabled), '']
        for type_id, addresses in enabled.items():
            lines += ['[vgpu_%s]' % type_id,
                      'device_addresses = %s' % ', '.join(addresses), '']
    return '\n'.join(lines)


def read_pci_ids(path=PCI_IDS):
    """-> (vendors {id: name}, devices {(vendor, device): name},
    classes {'0302': name})"""
    vendors, devices, classes = {}, {}, {}
    vendor = cls = None
    with open(path, encoding='utf-8', errors='replace') as f:
        for line in f:
            if not line.strip() or line.startswith('#'):
                continue
            if line.startswith('C '):
                cls = line[2:4]
                vendor = None
                continue
            if not line.startswith('\t'):
                cls = None
                vendor, _, name = line.rstrip('\n').partition('  ')
                vendors[vendor] = name
                continue
            if line.startswith('\t\t'):
                continue
            key, _, name = line.strip('\n\t').partition('  ')
            if cls is not None:
                classes[cls + key] = name
            elif vendor is not None:
                devices[(vendor, key)] = name
    return vendors, devices, classes


def lspci_lines(sim, pci_ids):
    """What ``lspci -nn -D`` prints for the simulated tree."""
    vendors, devices, classes = pci_ids
    base = os.path.join(sim, 'bus', 'pci', 'devices')

    def attr(dev, name):
        with open(os.path.join(base, dev, name)) as f:
            return f.read().strip()

    lines = []
    for dev in sorted(os.listdir(base)):
        if not _ADDRESS.match(dev):
            continue        # an mdev, not a PCI function
        cls = attr(dev, 'class')[2:6]
        ven, did = attr(dev, 'vendor')[2:], attr(dev, 'device')[2:]
        vname = vendors.get(ven)
        dname = devices.get((ven, did), 'Device')
        name = '%s %s' % (vname, dname) if vname else dname
        lines.append('%s %s [%s]: %s [%s:%s] (rev a1)' % (
            dev, classes.get(cls, 'Class'), cls, name, ven, did))
    return '\n'.join(lines) + '\n'


def plain(obj):
    """A Cyborg object's primitive without the ``cyborg_object`` wrappers."""
    if isinstance(obj, list):
        return [plain(o) for o in obj]
    if isinstance(obj, dict) and 'cyborg_object.data' in obj:
        return {k: plain(v) for k, v in obj['cyborg_object.data'].items()}
    return obj


def run_case(profile, enabled):
    """In this process: Cyborg's nvidia_gpu_driver on one simulated host."""
    with tempfile.TemporaryDirectory(prefix='cyborg-golden-') as tmp:
        return _run_case(tmp, profile, enabled)


def _run_case(tmp, profile, enabled):
    from libvirt_gpu import simulator

    sim = os.path.join(tmp, 'sys')
    simulator.write_host(simulator.load_profile(profile_path(profile)), sim)
    conf = os.path.join(tmp, 'cyborg.conf')
    with open(conf, 'w') as f:
        f.write(cyborg_conf(enabled))

    from cyborg.common import service
    service.prepare_service([sys.argv[0], '--config-file', conf])
    from cyborg.accelerator.common import utils
    from cyborg.accelerator.drivers.gpu.nvidia import sysinfo
    from stevedore import driver as sd_driver

    def remap(path):
        path = str(path)
        if path.startswith('/sys/'):
            return os.path.join(sim, path[len('/sys/'):])
        return path

    lines = lspci_lines(sim, read_pci_ids())
    utils.lspci_privileged = lambda: lines
    sysinfo.open = lambda p, *a, **k: builtins.open(remap(p), *a, **k)
    sysinfo.os = types.SimpleNamespace(
        listdir=lambda p: os.listdir(remap(p)),
        path=types.SimpleNamespace(
            expandvars=os.path.expandvars,
            exists=lambda p: os.path.exists(remap(p))))
    drv = sd_driver.DriverManager(
        namespace='cyborg.accelerator.driver', name='nvidia_gpu_driver',
        invoke_on_load=True).driver
    devices = [plain(d.obj_to_primitive()) for d in drv.discover()]
    return {'profile': profile, 'hostname': HOSTNAME, 'enabled': enabled,
            'lspci': lines.splitlines(), 'devices': devices}


def main(argv):
    if len(argv) == 3:      # one case, in a process of its own
        profile, enabled = CASES[argv[1]]
        with open(argv[2], 'w') as f:   # oslo.log writes to stdout
            json.dump(run_case(profile, enabled), f)
        return 0
    import cyborg.version
    version = cyborg.version.version_info.release_string()
    cases = {}
    env = dict(os.environ, PYTHONWARNINGS='ignore')
    with tempfile.TemporaryDirectory(prefix='cyborg-golden-') as tmp:
        for name in CASES:
            out = os.path.join(tmp, name + '.json')
            subprocess.run([sys.executable, os.path.abspath(__file__), name,
                            out], check=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, env=env)
            with open(out) as f:
                cases[name] = json.load(f)
        print('%s: %d devices' % (name, len(cases[name]['devices'])))
    os.makedirs(os.path.dirname(OUTPUT), exist_ok=True)
    with open(OUTPUT, 'w') as f:
        json.dump({'cyborg': version, 'cases': cases}, f, indent=1,
                  sort_keys=True)
        f.write('\n')
    print('wrote %s (Cyborg %s)' % (OUTPUT, version))
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
