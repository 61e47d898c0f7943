"""What a host is, built once: the composition root of every entry point.

An ``Environment`` names the host's places (the sysfs root, the state
directory, and the places a vGPU kind keeps its own files in, each
declared by its kind: ``VgpuKind.places``), its libvirt ``host.Host`` when
there is one, its configuration and where discovery reads the host
(``Source``); the parts made from them are built on first use and kept:

``sysfs``       ``sysfs.Sysfs`` of the sysfs root
``pci_ids``     the PCI ID database that names the GPUs (``pciids``)
``nvml``        NVIDIA's management library, where the configuration and
                the host allow it (``nvml.source``), else None
``discovered``  the host as discovered (``objects.DiscoveryResult``:
                the GPUs, named, with what NVML says)
``layouts``     ``{PciAddress: Layout}``: the configuration's layouts
                (``[gpu]/layouts``) parsed and resolved against this
                host's GPUs once (the one place they are:
                ``layout.claims``); none without a configuration
``enabled``     ``{PciAddress: EnabledType}``: the enabled vGPU type of
                each GPU (of a GPU in a layout: its layout's first type),
                resolved against this host (the one place it is:
                ``enablement.resolve``)
``carved``      what is Nova's (``carving.Carved``): the carvings of the
                configuration resolved against this host (the one place
                they are: ``carving.resolve``), and the VFs ``restore``
                recorded as carved
``routes``      which route owns each GPU (``routes.Routes``: ours,
                Cyborg's, Nova's PCI route or Nova's own vGPUs), resolved
                against this host (the one place it is: ``routes.resolve``;
                the hook's from its settings snapshot)
``vgpus``       every vGPU kind behind one object (``backends.registry``)
``pci``         whole GPUs by PCI passthrough (``backends.pci``), never a
                GPU recorded as carved for Nova nor one of another route
``store``       the lease store (``state.LeaseStore``)
``allocator``   ``allocator.Allocator`` of the above: never a GPU of
                another route

Every entry point takes one and builds none of these itself: the CLI
(``cmd.context.Context.env``; the agent's cycles too), the exporter
(``exporter.HostCollector``), the API (its ``conn`` may be one), the hook
(``for_hook``), reconcile and restore.  Only they hold it: each hands the
modules below the parts those use (``layout_apply.converge`` its layouts,
GPUs, NVML, sysfs and lease holders; ``placement.model.host_tree`` its
GPUs, enabled types, carved GPUs, kinds' rooms and other routes' GPUs),
never the ``Environment`` itself.  ``from_conf`` builds it from
oslo.config (or the CLI's snapshot of it); ``for_hook`` from the hook's
settings snapshot, without importing oslo.config or libvirt (the hook runs
on every guest start).  A long-lived process that must see the host anew
(the agent every cycle, the exporter every scrape) asks for
``rediscover()``: the same host, its discovery and what follows from it
forgotten.
"""

from __future__ import annotations

import functools

from libvirt_gpu.util import records

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Protocol

    from oslo_config import cfg

    from libvirt_gpu import confcache
    from libvirt_gpu.devices.backends import base
    from libvirt_gpu.devices.backends import pci as pci_backend
    from libvirt_gpu.devices.backends import registry
    from libvirt_gpu.devices import carving
    from libvirt_gpu.devices import nvml as nvml_mod
    from libvirt_gpu.devices import routes as routes_mod
    from libvirt_gpu.devices import sysfs as sysfs_mod
    from libvirt_gpu import objects
    from libvirt_gpu.host import allocator as allocator_mod

    class HookSettings(Protocol):
        """What ``for_hook`` reads of the hook's settings snapshot
        (``guests.hook.settings.HookSettings``, a room above)."""

        @property
        def state_dir(self) -> str: ...

        @property
        def enabled(self) -> dict[objects.PciAddress,
                                  objects.EnabledType]: ...

        @property
        def routes(self) -> routes_mod.Routes: ...

        @property
        def nvml(self) -> str: ...


@records.record
class Source:
    """Where discovery reads the host (the CLI's choice): libvirt at
    ``uri`` (``fallback``: sysfs at the sysfs root when libvirt cannot be
    reached; no ``fallback``: libvirt only, the command line's ``-c``),
    completed by ``sysfs_root`` when one was named.  An ``Environment``
    without a ``Source`` reads its sysfs only (the hook, the API,
    reconcile, the exporter)."""

    uri: str
    fallback: bool = True
    sysfs_root: str | None = None


# Parts that follow from discovery: rediscover() builds them again.
_DISCOVERED = ('_found', 'discovered', 'layouts', 'enabled', 'carved',
               'routes', 'allocator', 'pci')
# What the enabled types are resolved from: replace() changing one of
# these resolves them again.
_RESOLVED_FROM = {'sysfs', 'sysfs_root', 'conf', 'kinds', 'source'}
# Parts of the host itself, kept by rediscover().
_KEPT = ('sysfs', 'pci_ids', 'nvml', 'vgpus', 'store')


class Environment(object):
    """:param sysfs: a ``sysfs.Sysfs`` (tests pass an emulated tree), or
        None to read ``sysfs_root``.
    :param state_dir: ``[DEFAULT]/state_dir``.
    :param host: a ``host.Host``, or None (the hook: no libvirt).
    :param conf: the oslo.config object (or the CLI's snapshot of its
        values), or None (the hook).
    :param enabled: the resolved enabled types, or None to resolve them
        from ``conf`` against this host on first use.
    :param routes: the resolved ``routes.Routes``, or None to resolve them
        likewise (none but ours without a configuration).
    :param kinds: the vGPU kinds (``'module:Class'`` specs), or None:
        the installed ones (``registry.installed``).
    :param remove_timeout: seconds a vGPU removal may take (None: each
        kind's default).
    :param source: where discovery reads the host (a ``Source``), or None:
        its sysfs.
    :param parallel: whether discovery may read a large host in several
        processes (a command run once; not a long-lived process).
    :param places: a path for a place a kind declares (``VgpuKind.places``,
        by its name), instead of the kind's default; a name no kind
        declares is refused (TypeError, as for any unknown argument).
    """

    def __init__(self, state_dir, sysfs=None, sysfs_root='/sys',
                 host=None, conf=None, enabled=None, kinds=None,
                 remove_timeout=None, source=None, parallel=False,
                 routes=None, nvml_setting=None, **places):
        self.state_dir = state_dir
        # ``[gpu]/nvml`` without a configuration (the hook's snapshot)
        self.nvml_setting = nvml_setting
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
        self.source = source
        self.parallel = parallel
        # given parts take the place of those built on first use
        self._given_enabled = enabled is not None
        self._given_routes = routes
        if routes is not None:
            self.routes = routes
        if sysfs is not None:
            self.sysfs = sysfs
        if enabled is not None:
            # a copy; an enablement.Enabled keeps the types configured
            self.enabled = (type(enabled)(enabled)
                            if isinstance(enabled, dict) else dict(enabled))

    @classmethod
    def from_conf(cls, conf: cfg.ConfigOpts | confcache.Values | None = None,
                  conn: Any = None, sysfs: sysfs_mod.Sysfs | None = None,
                  sysfs_root: str | None = None,
                  state_dir: str | None = None,
                  **kwargs: Any) -> Environment:
        """The host as configured: ``conf`` (default ``conf.load()``),
        ``conn`` (a libvirt connection or ``host.Host``, optional), and the
        overrides of the command line (a place given as None: the kind's
        default)."""
        if conf is None:
            from libvirt_gpu import conf as conf_mod
            conf = conf_mod.load()
        return cls(state_dir=state_dir or conf.state_dir, sysfs=sysfs,
                   sysfs_root=sysfs_root or conf.sysfs_root,
                   host=_as_host(conn), conf=conf, **kwargs)

    @classmethod
    def for_hook(cls, settings: HookSettings,
                 sysfs: sysfs_mod.Sysfs, **places: str | None) -> Environment:
        """The hook's host: its settings snapshot, no libvirt."""
        return cls(state_dir=settings.state_dir, sysfs=sysfs,
                   enabled=settings.enabled, routes=settings.routes,
                   nvml_setting=settings.nvml,
                   **places)

    def _arguments(self):
        return dict(self.places, state_dir=self.state_dir,
                    sysfs=self.__dict__.get('sysfs'),
                    sysfs_root=self.sysfs_root, host=self.host,
                    conf=self.conf, kinds=self._kinds,
                    remove_timeout=self.remove_timeout, source=self.source,
                    parallel=self.parallel, routes=self._given_routes,
                    nvml_setting=self.nvml_setting)

    def replace(self, **changes):
        """The same host with ``changes`` (arguments of the constructor);
        the parts given or built so far are kept unless changed, the
        others are built again on first use (the enabled types too when
        what they were resolved from changed)."""
        args = self._arguments()
        if self._given_enabled or not set(changes) & _RESOLVED_FROM:
            args['enabled'] = self.__dict__.get('enabled')
        if 'host' in changes:
            changes['host'] = _as_host(changes['host'])
        args.update(changes)
        return type(self)(**args)

    def rediscover(self):
        """The same host to be discovered again (the agent's next cycle,
        the exporter's next scrape): what follows from discovery (the
        GPUs, the enabled types unless they were given, the allocator) is
        built anew; the host's own parts (its sysfs, PCI names, NVML, vGPU
        kinds, lease store) are kept."""
        args = self._arguments()
        if self._given_enabled:
            args['enabled'] = self.enabled
        fresh = type(self)(**args)
        for name in _KEPT:
            if name in self.__dict__ and name not in fresh.__dict__:
                fresh.__dict__[name] = self.__dict__[name]
        return fresh

    def place(self, name):
        """The path of the place a kind declared as ``name``
        (``VgpuKind.places``): the one given, else the kind's default."""
        return self.places[name]

    @property
    def kind_classes(self):
        """The ``VgpuKind`` subclasses of this host, in order (the
        registry's, loaded once per list)."""
        from libvirt_gpu.devices.backends import registry
        return registry.kind_classes(self._kinds)

    # -- the parts, built on first use and kept -------------------------

    @functools.cached_property
    def sysfs(self) -> sysfs_mod.Sysfs:
        from libvirt_gpu.devices import sysfs as sysfs_mod
        return sysfs_mod.Sysfs(self.sysfs_root)

    @functools.cached_property
    def pci_ids(self):
        """``pciids.PciIds`` of ``[DEFAULT]/pci_ids_file``; None without a
        configuration (numbers only, as sysfs has them)."""
        if self.conf is None:
            return None
        from libvirt_gpu.devices import pciids
        return pciids.PciIds(self.conf.pci_ids_file)

    @functools.cached_property
    def nvml(self) -> nvml_mod.Nvml | None:
        """``nvml.Nvml`` where ``[gpu]/nvml`` allows it and the GPUs are
        this machine's (its own sysfs; libvirt named on the command line
        describes another host); None otherwise."""
        setting = (self.conf.gpu.nvml if self.conf is not None
                   else self.nvml_setting)
        if setting is None:
            return None
        from libvirt_gpu.devices import nvml as nvml_mod
        local = self.source is None or self.source.fallback
        return nvml_mod.source(setting,
                               sysfs_root=self.sysfs_root if local else None)

    @functools.cached_property
    def _found(self):
        """The GPUs as the source reports them: what the enabled types are
        resolved against (no names looked up, no NVML asked)."""
        from libvirt_gpu.devices import discovery
        kinds = self.kind_classes
        source = self.source
        if source is None:
            return discovery.from_sysfs(self.sysfs, parallel=self.parallel,
                                        kinds=kinds)
        return discovery.discover(
            uri=None if source.fallback else source.uri,
            sysfs_root=source.sysfs_root, default_uri=source.uri,
            default_sysfs_root=self.sysfs_root, parallel=self.parallel,
            kinds=kinds)

    @functools.cached_property
    def discovered(self):
        """The host as discovered (``objects.DiscoveryResult``): its GPUs,
        named from the PCI ID database, with what NVML says of them."""
        from libvirt_gpu.devices import discovery
        kinds = self.kind_classes
        return discovery.with_nvml(
            discovery.with_names(self._found, self.pci_ids, kinds),
            self.nvml, kinds)

    @property
    def kind_parts(self) -> base.KindParts:
        """The parts of this host its vGPU kinds are built from (the
        kinds receive these, never the environment)."""
        from libvirt_gpu.devices.backends import base
        return base.KindParts(
            sysfs=self.sysfs, state_dir=self.state_dir, host=self.host,
            nvml=self.nvml, remove_timeout=self.remove_timeout,
            places=self.places)

    @functools.cached_property
    def vgpus(self) -> registry.Vgpus:
        from libvirt_gpu.devices.backends import registry
        return registry.Vgpus.from_parts(self.kind_parts, kinds=self._kinds)

    @functools.cached_property
    def pci(self) -> pci_backend.PciBackend:
        from libvirt_gpu.devices.backends import pci as pci_backend
        return pci_backend.PciBackend(self.sysfs, state_dir=self.state_dir,
                                      foreign=self.routes.foreign())

    @functools.cached_property
    def store(self):
        from libvirt_gpu.store import state
        return state.LeaseStore(self.state_dir, sysfs_root=self.sysfs.root)

    @functools.cached_property
    def layouts(self):
        """``{PciAddress: Layout}``: the layouts of the configuration
        (``[gpu]/layouts``), each read and checked once and resolved
        against this host's GPUs (``layout.claims``); empty without a
        configuration (the hook's enabled types come from its
        snapshot)."""
        if self.conf is None:
            return {}
        from libvirt_gpu.devices import layout as layout_mod
        return layout_mod.claims(layout_mod.read_layouts(self.conf),
                                 self._found.gpus)

    @functools.cached_property
    def enabled(self) -> dict[objects.PciAddress, objects.EnabledType]:
        """``{PciAddress: EnabledType}`` resolved against this host: the
        one place the configuration's enabled types meet the GPUs."""
        from libvirt_gpu.devices import enablement
        return enablement.resolve(self.conf, self._found.gpus, self.layouts)

    @functools.cached_property
    def carved(self) -> carving.Carved:
        """``carving.Carved``: the configuration's carvings for Nova
        resolved against this host (none without a configuration: the
        hook), and the VFs ``restore`` recorded as carved, read against
        this host (``carving.on_host``)."""
        from libvirt_gpu.devices import carving
        carved = carving.on_host(self.state_dir, self.sysfs,
                                 self.kind_classes)
        if self.conf is None:
            return carved
        return records.replace(carved, planned=carving.resolve(
            self.conf, self._found.gpus, self.enabled, self.layouts,
            known_names={e.type_id: e.type_name
                         for e in carved.recorded if e.type_name}))

    @functools.cached_property
    def routes(self) -> routes_mod.Routes:
        """``routes.Routes``: which route owns each GPU, the configuration
        read against this host (only ours without a configuration and
        without routes given: the hook's come from its snapshot)."""
        from libvirt_gpu.devices import routes as routes_mod
        if self.conf is None:
            return routes_mod.Routes()
        from libvirt_gpu.devices import carving
        # the GPUs the carvings name (whether the host can satisfy them
        # or not: restore reports that) and those the record names
        carved = {address: '[%s]' % c.section for address, c in
                  carving.matching(carving.carvings(self.conf),
                                   self._found.gpus).items()}
        found = carving.on_host(self.state_dir, self.sysfs,
                                self.kind_classes)
        held = [r.gpu for r in found.recorded] + (
            [] if found.damaged is not None else sorted(found.holding))
        for address in held:
            carved.setdefault(address, 'the carve record (nova-carved.json)')
        return routes_mod.resolve(self.conf, self._found.gpus, self.enabled,
                                  carved)

    @functools.cached_property
    def allocator(self) -> allocator_mod.Allocator:
        from libvirt_gpu.devices import routes as routes_mod
        from libvirt_gpu.host import allocator as allocator_mod
        foreign = dict.fromkeys(self.carved.held_gpus,
                                routes_mod.LABELS[routes_mod.NOVA_PCI])
        foreign.update(self.routes.foreign())
        return allocator_mod.Allocator(self.vgpus, self.store, self.enabled,
                                       carved=foreign)


def _as_host(conn):
    """``conn`` (a libvirt connection, a ``host.Host`` or None) as a
    ``host.Host`` or None."""
    if conn is None:
        return None
    from libvirt_gpu.virt import host as host_mod
    return (conn if isinstance(conn, host_mod.Host)
            else host_mod.Host.from_connection(conn))
