"""What a host is, built once: the composition root of every entry point.

An ``Environment`` names the host's places (the sysfs root, the state
directory, and the places a vGPU kind keeps its own files in, each
declared by its kind: ``VgpuKind.places``), its libvirt ``host.Host`` when
there is one, and its configuration; the parts made from them are built on
first use and kept:

``sysfs``      ``sysfs.Sysfs`` of the sysfs root
``vgpus``      every vGPU kind behind one object (``backends.registry``)
``pci``        whole GPUs by PCI passthrough (``backends.pci``)
``store``      the lease store (``state.LeaseStore``)
``enabled``    ``{PciAddress: EnabledType}``: the enabled vGPU type of
               each GPU, resolved against this host
``allocator``  ``allocator.Allocator`` of the above

reconcile and restore receive one and wire nothing themselves; the API
takes one or builds it.  ``from_conf`` builds it from oslo.config (the CLI,
the API); ``for_hook`` from the hook's settings snapshot, without
importing oslo.config or libvirt (the hook runs on every guest start).
"""

import functools


class Environment(object):
    """:param sysfs: a ``sysfs.Sysfs`` (tests pass an emulated tree), or
        None to read ``sysfs_root``.
    :param state_dir: ``[DEFAULT]/state_dir``.
    :param host: a ``host.Host``, or None (the hook: no libvirt).
    :param conf: the oslo.config object, or None (the hook).
    :param enabled: the resolved enabled types, or None to resolve them
        from ``conf`` against this host on first use.
    :param kinds: the vGPU kinds (``registry.KINDS`` form).
    :param remove_timeout: seconds a vGPU removal may take (None: each
        kind's default).
    :param places: a path for a place a kind declares (``VgpuKind.places``,
        by its name), instead of the kind's default; a name no kind
        declares is refused (TypeError, as for any unknown argument).
    """

    def __init__(self, state_dir, sysfs=None, sysfs_root='/sys',
                 host=None, conf=None, enabled=None, kinds=None,
                 remove_timeout=None, **places):
        self.state_dir = state_dir
        self.sysfs_root = sysfs.root if sysfs is not None else sysfs_root
        self._kinds = kinds
        defaults = {place.name: place.default
                    for kind in self.kind_classes for place in kind.places}
        unknown = sorted(set(places) - set(defaults))
        if unknown:
            raise TypeError(
                'Environment() got unexpected keyword argument(s) %s: no '
                'vGPU kind declares such a place (known: %s)'
                % (', '.join(unknown), ', '.join(sorted(defaults))))
        self.places = {name: (places[name] if places.get(name) is not None
                              else default)
                       for name, default in defaults.items()}
        self.host = host
        self.conf = conf
        self.remove_timeout = remove_timeout
        # given parts take the place of those built on first use
        if sysfs is not None:
            self.sysfs = sysfs
        if enabled is not None:
            self.enabled = dict(enabled)

    @classmethod
    def from_conf(cls, conf=None, conn=None, sysfs=None, sysfs_root=None,
                  state_dir=None, **kwargs):
        """The host as configured: ``conf`` (default ``conf.load()``),
        ``conn`` (a libvirt connection or ``host.Host``, optional), and the
        overrides of the command line (a place given as None: the kind's
        default)."""
        if conf is None:
            from libvirt_gpu import conf as conf_mod
            conf = conf_mod.load()
        host = None
        if conn is not None:
            from libvirt_gpu import host as host_mod
            host = (conn if isinstance(conn, host_mod.Host)
                    else host_mod.Host.from_connection(conn))
        return cls(state_dir=state_dir or conf.state_dir, sysfs=sysfs,
                   sysfs_root=sysfs_root or conf.sysfs_root, host=host,
                   conf=conf, **kwargs)

    @classmethod
    def for_hook(cls, settings, sysfs, **places):
        """The hook's host: its settings snapshot, no libvirt."""
        return cls(state_dir=settings.state_dir, sysfs=sysfs,
                   enabled=settings.enabled, **places)

    def replace(self, **changes):
        """The same host with ``changes`` (arguments of the constructor);
        the parts given or built so far are kept unless changed, the
        others are built again on first use."""
        args = dict(self.places, state_dir=self.state_dir,
                    sysfs=self.__dict__.get('sysfs'),
                    sysfs_root=self.sysfs_root, host=self.host,
                    conf=self.conf, enabled=self.__dict__.get('enabled'),
                    kinds=self._kinds, remove_timeout=self.remove_timeout)
        args.update(changes)
        return type(self)(**args)

    def place(self, name):
        """The path of the place a kind declared as ``name``
        (``VgpuKind.places``): the one given, else the kind's default."""
        return self.places[name]

    @property
    def kind_classes(self):
        """The ``VgpuKind`` subclasses of this host, in order (the
        registry's, loaded once per list)."""
        from libvirt_gpu.backends import registry
        return registry.kind_classes(self._kinds)

    # -- the parts, built on first use and kept -------------------------

    @functools.cached_property
    def sysfs(self):
        from libvirt_gpu import sysfs as sysfs_mod
        return sysfs_mod.Sysfs(self.sysfs_root)

    @functools.cached_property
    def vgpus(self):
        from libvirt_gpu.backends import registry
        return registry.Vgpus.from_environment(self, kinds=self._kinds)

    @functools.cached_property
    def pci(self):
        from libvirt_gpu.backends import pci as pci_backend
        return pci_backend.PciBackend(self.sysfs)

    @functools.cached_property
    def store(self):
        from libvirt_gpu import state
        return state.LeaseStore(self.state_dir, sysfs_root=self.sysfs.root)

    @functools.cached_property
    def enabled(self):
        """``{PciAddress: EnabledType}`` resolved against this host."""
        from libvirt_gpu import discovery
        from libvirt_gpu import enablement
        gpus = discovery.from_sysfs(self.sysfs, kinds=self.kind_classes).gpus
        return enablement.resolve(self.conf, gpus)

    @property
    def allocator(self):
        from libvirt_gpu import allocator as allocator_mod
        return allocator_mod.Allocator(self.vgpus, self.store, self.enabled)
