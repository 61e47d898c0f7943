"""One example of the fuzz test (tests/unit/fuzz/test_fuzz.py), run in a child
process so that a hang is judged by the parent's timeout:

    python -m tests.doubles.fuzz_driver CONFIG SETTINGS MDEVCTL PROFILE XML

runs the qemu hook's ``prepare``, ``release`` and ``reconnect`` on the
domain XML in the file XML, then ``libvirt-gpu list --json`` and
``placement show --json`` on the configured sysfs tree, and prints one JSON
line ``{"prepare": rc, "release": rc, "reconnect": rc, "list": rc,
"placement": rc}``.  Any exception that escapes is a traceback on stderr
and a non-zero exit: the parent fails the example.

The tree's kernel answers the writes (``KernelSysfs``): a create makes
the mdev as the kernel would, so a valid request does not wait for a
device that a plain tree never makes.  Where the planted tree is beyond
what that stand-in models, it answers EIO, as a kernel refusing the
write would.
"""

import contextlib
import errno
import io
import json
import os
import sys

from libvirt_gpu import exception
from tests.doubles import kernel_sysfs


class FuzzKernelSysfs(kernel_sysfs.KernelSysfs):
    """``KernelSysfs`` whose stand-in kernel answers EIO where the fuzzed
    tree breaks its own assumptions.  Only the stand-in's calls are
    wrapped: the product's ``Sysfs.write`` is not, so an error escaping
    it still fails the example."""

    def __init__(self, root, profile):
        super().__init__(root, profile)
        kernel = self.kernel
        classify, apply = kernel.classify, kernel.apply

        def safe_classify(real):
            try:
                return classify(real)
            except (OSError, ValueError, KeyError, TypeError,
                    exception.LibvirtGpuError):
                return None         # not a write the stand-in models

        def safe_apply(what, data):
            try:
                return apply(what, data)
            except OSError:
                raise
            except (ValueError, KeyError, TypeError, IndexError,
                    exception.LibvirtGpuError):
                raise OSError(errno.EIO, os.strerror(errno.EIO))

        kernel.classify = safe_classify
        kernel.apply = safe_apply


def main(argv):
    config, settings, mdevctl, profile, xml_path = argv[1:6]
    with open(xml_path, 'rb') as f:
        data = f.read()
    from libvirt_gpu.guests import hook
    with open(config) as f:
        root = [line.split('=', 1)[1].strip() for line in f
                if line.startswith('sysfs_root')][0]
    sysfs = FuzzKernelSysfs(root, profile)
    result = {}
    for op in ('prepare', 'release', 'reconnect'):
        result[op] = hook.run(['qemu', 'fuzz', op, 'begin', '-'], data,
                              config_file=config, settings_file=settings,
                              sysfs=sysfs, stderr=io.StringIO(),
                              mdevctl_dir=mdevctl)
    from libvirt_gpu.cmd import main as cli
    for name, command in (('list', ['list', '--json']),
                          ('placement', ['placement', 'show', '--json'])):
        with contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            result[name] = cli.main(['--config-file', config,
                                     '--sysfs-root', root] + command)
    print(json.dumps(result))
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
