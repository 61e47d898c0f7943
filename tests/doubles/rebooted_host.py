"""A simulated host after a reboot, as ``libvirt-gpu restore`` finds it:
the bundled profile as a boot leaves it (``rebooted``: VFs off, no
vGPU), its tree under ``fast_tmp`` with the kernel double answering
(``host``), a configuration file (``conf``) and mdevctl's definition of
a vGPU (``define``)."""

import json
import os

from libvirt_gpu import conf as conf_mod
from libvirt_gpu import simulator
from libvirt_gpu.simulator import loading
from tests.doubles import kernel_sysfs


def rebooted(name):
    """The bundled profile as a boot leaves it: VFs off, no vGPU."""
    with open(os.path.join(loading.profile_dir(), name + '.json')) as f:
        data = json.load(f)
    for dev in data['devices']:
        dev.pop('mdevs', None)
        dev.pop('held_type', None)
        if dev.get('virtfns'):
            dev['sriov_numvfs'] = 0
    return loading.profile_from_dict(data, source=name + '-rebooted')


def host(profile, fast_tmp):
    root = os.path.join(fast_tmp, 'sys')
    simulator.write_sysfs(profile, root)
    return kernel_sysfs.KernelSysfs(root, profile)


def conf(fast_tmp, text):
    path = os.path.join(fast_tmp, 'libvirt-gpu.conf')
    with open(path, 'w') as f:
        f.write('[DEFAULT]\nstate_dir = %s\n%s'
                % (os.path.join(fast_tmp, 'state'), text))
    return path, conf_mod.load(path)


def define(mdevctl, parent, uuid, type_id, start):
    os.makedirs(os.path.join(mdevctl, parent), exist_ok=True)
    with open(os.path.join(mdevctl, parent, uuid), 'w') as f:
        json.dump({'mdev_type': type_id, 'start': start, 'attrs': []}, f)
