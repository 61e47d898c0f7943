"""The vGPU kinds a test hands discovery, which imports no kind itself,
and a kind registered as a third party registers one: an entry point of
``registry.GROUP`` in a distribution of its own on the import path."""

import os
import shutil

from libvirt_gpu.devices.backends import registry


def registered():
    """The installed vGPU kinds (``registry.kind_classes``, read at the
    call, so a kind a test registered is seen), as an ``Environment``'s
    ``kind_classes`` gives them."""
    return tuple(registry.kind_classes())


class Registration(object):
    """A test-only distribution declaring one vGPU kind, on the import
    path while the test runs (``monkeypatch``)."""

    def __init__(self, directory, name, spec):
        self.directory = str(directory)
        self.name = name
        self.spec = spec
        self.dist = os.path.join(self.directory,
                                 'libvirt_gpu_test_%s-0.dist-info' % name)

    def install(self):
        os.makedirs(self.dist, exist_ok=True)
        with open(os.path.join(self.dist, 'METADATA'), 'w') as f:
            f.write('Metadata-Version: 2.1\nName: libvirt-gpu-test-%s\n'
                    'Version: 0\n' % self.name)
        with open(os.path.join(self.dist, 'entry_points.txt'), 'w') as f:
            f.write('[%s]\n%s = %s\n' % (registry.GROUP, self.name,
                                         self.spec))

    def uninstall(self):
        """What ``pip uninstall`` does to it: the distribution is gone
        (its directory changes, so the kept list of kinds is stale)."""
        shutil.rmtree(self.dist)


def register(monkeypatch, directory, name, spec):
    """Install the kind ``spec`` (``'module:Class'``) as the entry point
    ``name`` of a test-only distribution in ``directory`` (a directory of
    the test's own, put first on the import path); the
    ``Registration``."""
    found = Registration(directory, name, spec)
    found.install()
    monkeypatch.syspath_prepend(found.directory)
    return found
