"""The simulated hosts the layouts are for, as ``layout apply`` reaches
them on a host: a ``Case`` each (A100 40GB and H100 80GB, MIG-backed;
L40S, mixed sizes; RTX PRO 6000 Blackwell, MIG time-sliced inside GPU
instances), and ``Host`` (a static tree, the kernel double answering its
sysfs writes, ``[gpu]/nvml = simulated`` binding NVML to the same tree)."""

import collections
import os

from libvirt_gpu import conf as conf_mod
from libvirt_gpu import environment
from libvirt_gpu import simulator
from libvirt_gpu.simulator import sysfs_tree
from tests.doubles import kernel_sysfs
from tests.doubles import layouts

Case = collections.namedtuple('Case', ['profile', 'gpu', 'layout',
                                       'smaller'])
"""``layout``: the lines of ``[layout_e2e]``; ``smaller``: the same
layout with a GPU instance less (its apply destroys one)."""

A100 = Case('a100-40gb', '0000:41:00.0',
            ('mode = mig', 'gpu_instances = 3g.20gb:1, 1g.5gb:3',
             'vgpu_types = nvidia-474, nvidia-476'),
            ('mode = mig', 'gpu_instances = 3g.20gb:1, 1g.5gb:2',
             'vgpu_types = nvidia-474, nvidia-476'))
H100 = Case('h100-80gb', '0000:4e:00.0',
            ('mode = mig', 'gpu_instances = 2g.20gb:3, 1g.10gb:1',
             'vgpu_types = nvidia-1311, nvidia-1308'),
            ('mode = mig', 'gpu_instances = 2g.20gb:2, 1g.10gb:1',
             'vgpu_types = nvidia-1311, nvidia-1308'))
L40S = Case('l40s', '0000:bd:00.0',
            ('mode = mixed-size', 'vgpu_types = nvidia-1153:3, nvidia-1145:1',
             'scheduler = equal-share', 'time_slice_ms = 4'),
            None)
RTX = Case('rtx-pro-6000', '0000:ca:00.0',
           ('mode = mig-time-sliced',
            'gpu_instances = 2g.48gb+gfx:1, 1g.24gb+gfx:2',
            'vgpu_types = nvidia-1511, nvidia-1513',
            'scheduler = equal-share', 'time_slice_ms = 2'),
           ('mode = mig-time-sliced',
            'gpu_instances = 2g.48gb+gfx:1, 1g.24gb+gfx:1',
            'vgpu_types = nvidia-1511, nvidia-1513',
            'scheduler = equal-share', 'time_slice_ms = 2'))


class Host(object):
    """A simulated host as the product sees it on a real one: a static
    tree, the kernel double answering its sysfs writes, and
    ``[gpu]/nvml = simulated`` binding NVML to the same tree."""

    def __init__(self, path, case):
        self.path = str(path)
        self.case = case
        self.root = os.path.join(self.path, 'sys')
        profile = simulator.load_profile(case.profile)
        simulator.write_sysfs(profile, self.root)
        self.vfs = set(profile.device(case.gpu).virtfns)
        self._envs = {}

    def env(self, lines):
        """The host configured with the layout ``lines``: an Environment,
        as the CLI builds one (kept for the next apply: the host's GPUs
        stay, what is asked of them is read anew by each apply)."""
        if lines not in self._envs:
            name = os.path.join(self.path, 'c%d.conf' % len(self._envs))
            with open(name, 'w') as f:
                f.write('[DEFAULT]\nsysfs_root = %s\nstate_dir = %s\n'
                        '[gpu]\nnvml = simulated\nlayouts = e2e\n'
                        '[layout_e2e]\ngpus = %s\n%s\n' % (
                            self.root, os.path.join(self.path, 'state'),
                            self.case.gpu, '\n'.join(lines)))
            conf = conf_mod.load(name)
            self._envs[lines] = environment.Environment(
                conf.state_dir, conf=conf,
                sysfs=kernel_sysfs.KernelSysfs(self.root, self.case.profile))
        return self._envs[lines]

    def apply(self, lines=None):
        """``layout apply`` of ``lines`` (default: the case's layout)."""
        return layouts.converge(self.env(lines or self.case.layout),
                                settle_timeout=5.0)

    def driver(self):
        """The simulated driver's state of the case's GPU, and where the
        vGPUs on its VFs sit."""
        state = sysfs_tree.read_driver_state(self.root)
        return state['gpus'][self.case.gpu], {
            vf: where for vf, where in state['placed'].items()
            if vf in self.vfs}
