"""The ``Context`` a CLI command runs with: the parsed command line, the
configuration and, built when first used, the host."""

import functools

from libvirt_gpu import confcache
from libvirt_gpu.cmd import output


class Context(object):
    """What a command needs: the parsed configuration and the host
    (``env``, an ``environment.Environment``: discovery, NVML, the PCI
    names and the enabled types, each built once when first used).

    A command that only reads option values (``snapshot=True`` in its
    parser defaults) gets them from the settings snapshot when it is
    current (``confcache``: no oslo.config import); the others get the
    ConfigOpts of ``conf.load``."""

    def __init__(self, args):
        self.args = args
        if getattr(args, 'snapshot', False):
            self.conf = confcache.load(args.config_file)
        else:
            from libvirt_gpu import conf as conf_mod
            self.conf = conf_mod.load(args.config_file)

    @functools.cached_property
    def env(self):
        """The host as this command line names it: libvirt at ``-c`` only,
        sysfs at ``--sysfs-root`` only, or neither: libvirt at
        [libvirt]/connection_uri, falling back to sysfs.  A command run
        once may read a large host in several processes."""
        from libvirt_gpu import environment
        source = environment.Source(
            uri=self.args.connect or self.conf.libvirt.connection_uri,
            fallback=not self.args.connect, sysfs_root=self.args.sysfs_root)
        return environment.Environment.from_conf(
            self.conf, sysfs_root=self.args.sysfs_root, source=source,
            parallel=True, mdevctl_dir=getattr(self.args, 'mdevctl_dir',
                                               None))

    @property
    def result(self):
        return self.env.discovered

    @property
    def enabled(self):
        return self.env.enabled

    @property
    def hostname(self):
        return self.args.hostname or self.conf.host

    def environment(self, host=None):
        """The host that the lifecycle commands act on: ``env`` read from
        its sysfs (what the allocator and the kinds work with), with
        ``host``, its libvirt ``Host``, when the command has one."""
        return self.env.replace(host=host, source=None, parallel=False)

    def libvirt_uri(self):
        """The libvirt URI the lifecycle commands open: ``-c``, else
        [libvirt]/connection_uri."""
        return self.args.connect or self.conf.libvirt.connection_uri

    def say_source(self):
        where = (self.args.connect or self.conf.libvirt.connection_uri
                 if self.result.source == 'libvirt' else
                 self.args.sysfs_root or self.conf.sysfs_root)
        output.emit_note('source: %s (%s)' % (self.result.source, where),
                         as_json=self.args.json)
