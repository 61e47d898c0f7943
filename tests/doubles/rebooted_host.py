"""A simulated host after a reboot, as ``libvirt-gpu restore`` finds it:
the bundled profile as a boot leaves it (``rebooted``: VFs off, no
vGPU), its tree under ``fast_tmp`` with the kernel double answering
(``host``), a configuration file (``conf``) and mdevctl's definition of
a vGPU (``define``)."""

import json
import os

from libvirt_gpu import conf as conf_mod
from libvirt_gpu import simulator
from tests.doubles import carved_host
from tests.doubles import kernel_sysfs


# the bundled profile as a boot leaves it: carved_host's, under the name
# restore's tests use
rebooted = carved_host.rebooted_profile


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
