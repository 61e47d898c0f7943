"""The simulated L40S host the carving tests boot and reboot (its config
file and state directory beside its tree), the ``[nova]`` carving that
names it, and the hook run on it as Nova's libvirt would: shared by the
carving's, the Nova routes', restore's and the CLI's tests."""

import io
import json
import os
import shutil

from libvirt_gpu import conf as conf_mod
from libvirt_gpu import environment
from libvirt_gpu import objects
from libvirt_gpu import simulator
from libvirt_gpu.guests import hook
from libvirt_gpu.host import restore
from libvirt_gpu.simulator import loading
from libvirt_gpu.store import carved as carve_record
from tests.doubles import kernel_sysfs
from libvirt_gpu.devices.backends.nvidia_vgpu.files import (
    VendorFiles as vendor)

L1 = objects.PciAddress.parse('0000:3d:00.0')     # 2 x L40S-1B not ours
L2 = objects.PciAddress.parse('0000:bd:00.0')     # empty
T_12Q = objects.TypeId.parse('nvidia-1153')        # NVIDIA L40S-12Q, 4/GPU

CARVING = """
[nova]
carved = l40s_12q
[nova_l40s_12q]
gpus = %s
vgpu_type = nvidia-1153
count = %d
"""


def rebooted_profile(name='l40s'):
    """The bundled profile as a boot leaves it: VFs off, no vGPU."""
    with open(os.path.join(loading.profile_dir(), name + '.json')) as f:
        data = json.load(f)
    for dev in data['devices']:
        dev.pop('mdevs', None)
        dev.pop('held_type', None)
        if dev.get('virtfns'):
            dev['sriov_numvfs'] = 0
    return loading.profile_from_dict(data, source=name + '-rebooted')


class Host(object):
    """A simulated host with its configuration file and state directory;
    ``boot()`` rewrites its tree as a reboot leaves it (the state
    directory, on disk, stays)."""

    def __init__(self, tmp, text, profile='l40s', rebooted=False,
                 root=None):
        self.tmp = tmp
        self.root = root or os.path.join(tmp, 'sys')
        self.profile = profile
        self.state_dir = os.path.join(tmp, 'state')
        self.config = os.path.join(tmp, 'libvirt-gpu.conf')
        self.write_config(text)
        if rebooted:
            self.boot()
        else:
            if root is None:
                simulator.write_sysfs(simulator.load_profile(profile),
                                      self.root)
            self.sysfs = kernel_sysfs.KernelSysfs(self.root, profile)

    def write_config(self, text):
        with open(self.config, 'w') as f:
            f.write('[DEFAULT]\nsysfs_root = %s\nstate_dir = %s\n[gpu]\n'
                    'nvml = off\n%s' % (self.root, self.state_dir, text))
        self.conf = conf_mod.load(self.config)

    def boot(self):
        shutil.rmtree(self.root, ignore_errors=True)
        profile = rebooted_profile(self.profile)
        simulator.write_sysfs(profile, self.root)
        self.sysfs = kernel_sysfs.KernelSysfs(self.root, profile)

    def env(self):
        return environment.Environment.from_conf(
            self.conf, sysfs=self.sysfs,
            mdevctl_dir=os.path.join(self.tmp, 'mdevctl.d'))

    def restore(self, **kwargs):
        env = self.env()
        return restore.restore(env, vf_pfs=restore.vf_targets(env),
                               settle_timeout=0, **kwargs)

    def held(self, vf):
        return vendor(self.sysfs).current_type(str(vf))

    def record(self):
        return carve_record.CarveRecord(self.state_dir).read()


def vfs(gpu, *functions):
    """``vfs(L2, 4, 5)`` -> the VFs 0000:bd:00.4, 0000:bd:00.5."""
    return [objects.PciAddress(gpu.domain, gpu.bus, f // 8, f % 8)
            for f in functions]


def plant(state_dir, data):
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    path = os.path.join(state_dir, carve_record.RECORD_NAME)
    with open(path, 'wb') as f:
        f.write(data)
    return path


def run_hook(host, op, xml):
    err, out = io.StringIO(), io.BytesIO()
    rc = hook.run(['qemu', 'nova-1', op, 'begin', '-'], xml,
                  config_file=host.config, sysfs=host.sysfs, stderr=err,
                  stdout=out, mdevctl_dir=os.path.join(host.tmp,
                                                       'mdevctl.d'))
    return rc, err.getvalue(), out.getvalue()


def hook_log(host):
    with open(os.path.join(host.state_dir, hook.LOG_NAME)) as f:
        return f.read()
