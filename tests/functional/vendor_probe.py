"""The probe hook of the live vendor-interface tests (shared by
test_live_vendor and test_migrate_vendor): ``Setup``, our hook (configured
for ``type_id`` on the live tree) and ``qemu.d/zz-probe``, run after ours
(libvirt runs ``qemu.d`` in alphabetical order), which records at every
call what libvirtd's own /sys (the live tree bound over it) shows: the
VFs holding a vGPU, the mdevs, the free instances of the guest's type;
``probe`` reads those calls back.  And what a test reads of a live host
and a domain: ``vgpus_now``, ``hostdev_vfs``; ``L40S_PRE``: the vGPUs the
``l40s`` profile holds, not ours."""

import os

from libvirt_gpu import objects
from libvirt_gpu.devices.backends.nvidia_vgpu import names as vendor_names
from tests.functional import hook_guests as hg
from tests.functional import libvirtd

L40S_PRE = {'0000:3d:00.4': 'nvidia-1145', '0000:3d:00.5': 'nvidia-1145'}

PROBE = r'''#!/bin/sh
cat > /dev/null
line="$2 $3"
for f in /sys/bus/pci/devices/*/nvidia/@CURRENT@; do
    [ -e "$f" ] || continue
    read -r v < "$f"
    [ "$v" = 0 ] && continue
    d=${f%/nvidia/@CURRENT@}
    line="$line vf=${d##*/}:$v"
done
for d in /sys/bus/mdev/devices/*; do
    [ -e "$d" ] || continue
    line="$line mdev=${d##*/}"
done
free=0
for t in /sys/class/mdev_bus/*/mdev_supported_types/@TYPE@; do
    f=$t/available_instances
    [ -e "$f" ] || continue
    read -r n < "$f"
    free=$((free + n))
done
echo "$line free=$free" >> @LOG@
exit 0
'''


class Setup(hg.HookSetup):
    """Our hook (configured for ``type_id`` on the live tree) and the
    probe hook."""

    def __init__(self, workdir, type_id):
        super().__init__(workdir, type_id)
        self.probe_log = os.path.join(workdir, 'probe.log')

    def extra_hooks(self):
        probe = PROBE.replace('@TYPE@', self.type_id).replace(
            '@CURRENT@', vendor_names.CURRENT_TYPE).replace(
            '@LOG@', libvirtd._sh_quote(self.probe_log))
        return {'qemu.d/zz-probe': probe}


def probe(host):
    """``[(operation, sub-operation, {vf: number}, [mdev uuids], free)]``
    of every hook call so far, then forgets them."""
    try:
        with open(host.setup.probe_log) as f:
            lines = f.read().splitlines()
        os.unlink(host.setup.probe_log)
    except FileNotFoundError:
        return []
    calls = []
    for line in lines:
        words = line.split()
        vfs = dict(w[3:].rsplit(':', 1) for w in words[2:]
                   if w.startswith('vf='))
        calls.append((words[0], words[1],
                      {vf: int(n) for vf, n in vfs.items()},
                      sorted(w[5:] for w in words if w.startswith('mdev=')),
                      int(words[-1][len('free='):])))
    return calls


def by_operation(calls):
    return {(op, sub): rest for op, sub, *rest in calls}


def hostdev_vfs(root):
    """Addresses of the unmanaged PCI hostdevs in a domain's XML."""
    return [str(objects.PciAddress(*(int(a.get(k), 16) for k in (
        'domain', 'bus', 'slot', 'function'))))
        for a in root.findall("devices/hostdev[@type='pci'][@managed='no']"
                              "/source/address")]


def vgpus_now(host):
    return {vf: t for vf, t in host.live.state()['vgpus'].items() if t}
