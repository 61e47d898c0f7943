"""A simulated host for the tests that run the hook under a real libvirtd.

The tree is a simulated one (``trees.simulated_tree``); its kernel is
``SimKernel``, applied by a ``kernel_sysfs.KernelWatcher`` to the writes the
hook makes from libvirtd's process.  The same hook paths run on a real
kernel in ``tests/kernel``; these stay because they are fast and cover GPU
models a VM cannot emulate.
"""

import os

from tests.doubles import kernel_sysfs
from tests.doubles import trees


class SimulatedHost(object):
    """A simulated host for the hook run by a real libvirtd: the sysfs tree
    (its kernel emulated by a ``KernelWatcher``), a configuration file
    pointing the hook at it, and a state dir.  A context manager."""

    def __init__(self, workdir, profile='t4', types='nvidia-223',
                 extra_conf='', without_mdevs=False):
        self.workdir = os.fspath(workdir)
        self.profile_name = profile
        self.types = types
        self.extra_conf = extra_conf
        self.without_mdevs = without_mdevs
        self.state_dir = os.path.join(self.workdir, 'state')
        self.config = os.path.join(self.workdir, 'libvirt-gpu.conf')
        self._tree = None
        self.root = self.profile = self.watcher = None

    def __enter__(self):
        self._tree = trees.simulated_tree(
            self.profile_name, without_mdevs=self.without_mdevs)
        self.root, self.profile = self._tree.__enter__()
        with open(self.config, 'w') as f:
            f.write('[DEFAULT]\nsysfs_root = %s\nstate_dir = %s\n'
                    '[gpu]\nenabled_vgpu_types = %s\n%s'
                    % (self.root, self.state_dir, self.types,
                       self.extra_conf))
        self.watcher = kernel_sysfs.KernelWatcher(self.root,
                                                  self.profile).start()
        return self

    def __exit__(self, *exc):
        self.watcher.stop()
        self._tree.__exit__(*exc)

    def mdevs(self):
        return self.watcher.kernel.mdevs()

    def leases(self):
        from libvirt_gpu.store import state
        return state.LeaseStore(self.state_dir).leases()

    def hook_log(self):
        try:
            with open(os.path.join(self.state_dir, 'hook.log')) as f:
                return f.read()
        except FileNotFoundError:
            return ''
