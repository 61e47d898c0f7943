"""Which route owns each GPU of the host: one owner per GPU.

A GPU reaches guests by exactly one of four routes:

=============  ==============================================================
``libvirt-gpu``  ours: domain metadata, the qemu hook, ``libvirt-gpu
                 attach`` and ``agent`` (every GPU no other route claims)
``cyborg``       OpenStack Cyborg: ``[routes]/cyborg`` names the GPUs, whose
                 types the enablement gives (``[gpu]/enabled_vgpu_types``);
                 only ``libvirt_gpu_driver`` reports them, Cyborg binds
                 ARQs to their vGPUs and Nova boots them
``nova-pci``     Nova's PCI passthrough of carved VFs (``[nova]/carved``,
                 ``devices.carving``)
``nova-vgpu``    Nova's own vGPU route: ``[devices]/enabled_mdev_types`` and
                 ``[mdev_<type>]/device_addresses`` of the nova.conf
                 ``[routes]/nova_conf`` names (Nova's rule: the GPUs each
                 type lists, and every other GPU offering the first type
                 that lists none)
=============  ==============================================================

``resolve`` reads the configuration against the host's GPUs and refuses,
in one line naming both claims, a GPU two routes claim.  ``Routes`` is what
follows: every part of ours leaves the GPUs of the other routes alone
(``Routes.foreign``: the allocator never hands them out, the Placement
tree leaves them out, reconcile and restore never remove their vGPUs),
and the Cyborg report offers only Cyborg's.  The hook has no configuration:
its settings snapshot keeps ``Routes.owners`` (``to_json`` / ``from_json``).

No oslo.config here: ``conf`` reads like a ConfigOpts or the CLI's snapshot
of one.  Nova's file is read with oslo.config's own INI parser (the one
nova-compute reads it with), from a regular file of bounded size.
"""

from __future__ import annotations

import os
import stat

from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.devices import selectors as selectors_mod
from libvirt_gpu.util import records

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Protocol

    class _Sysfs(Protocol):         # sysfs.Sysfs, what a route reads
        def physfn(self, address: objects.PciAddress
                   ) -> objects.PciAddress | None: ...

OURS = 'libvirt-gpu'
CYBORG = 'cyborg'
NOVA_PCI = 'nova-pci'
NOVA_VGPU = 'nova-vgpu'
ROUTES = (OURS, CYBORG, NOVA_PCI, NOVA_VGPU)

# What a refusal says of a GPU of each route.
LABELS = {
    OURS: 'libvirt-gpu\'s own guests',
    CYBORG: 'given to OpenStack Cyborg ([routes]/cyborg)',
    NOVA_PCI: 'carved for Nova ([nova]/carved)',
    NOVA_VGPU: 'Nova\'s own vGPU route (nova.conf [devices]/'
               'enabled_mdev_types)',
}

_MAX_NOVA_CONF_BYTES = 4 * 1024 * 1024


@records.record
class Claim:
    """One route's claim of one physical GPU: the route and the words that
    say where the claim is written (for a refusal)."""

    route: str
    source: str


@records.record
class Routes:
    """The owner of every physical GPU that is not ours (``owners``:
    ``{PciAddress: route}``); a GPU it does not name is ours."""

    owners: dict[objects.PciAddress, str] = records.field(
        default_factory=dict)

    def route_of(self, address: objects.PciAddress) -> str:
        return self.owners.get(address, OURS)

    def route_of_parent(self, sysfs: _Sysfs,
                        parent: objects.PciAddress) -> str:
        """The route of a vGPU whose parent is ``parent``: its physical
        GPU's (a VF's PF, read from ``sysfs``)."""
        return self.route_of(sysfs.physfn(parent) or parent)

    def of(self, route: str) -> tuple[objects.PciAddress, ...]:
        """The physical GPUs of ``route`` (not ``OURS``), sorted."""
        return tuple(sorted(a for a, r in self.owners.items()
                            if r == route))

    def foreign(self, route: str = OURS) -> dict[objects.PciAddress, str]:
        """``{PciAddress: label}`` of the GPUs another route than ``route``
        owns, of those ``owners`` names (for ``OURS``: all of them)."""
        return {a: LABELS[r] for a, r in self.owners.items() if r != route}

    def to_json(self) -> dict[str, str]:
        return {str(a): r for a, r in sorted(self.owners.items())}

    @classmethod
    def from_json(cls, data: object) -> Routes:
        """``Routes`` from ``to_json``'s form; ValueError when it is not
        that."""
        if not isinstance(data, dict):
            raise ValueError('routes: not an object')
        owners: dict[objects.PciAddress, str] = {}
        for key, route in data.items():
            if route not in ROUTES or route == OURS:
                raise ValueError('routes: %r is no route' % (route,))
            try:
                owners[objects.PciAddress.parse(key)] = route
            except exception.InvalidInput as e:
                raise ValueError('routes: %s' % e)
        return cls(owners=owners)


# --- Nova's own vGPU route ---------------------------------------------------

@records.record
class NovaVgpus:
    """What nova.conf gives Nova's own vGPU route: the enabled types in
    its order, the GPUs each lists, and the type of the GPUs no type lists
    (the first enabled type without ``device_addresses``, as nova's
    ``LibvirtDriver._get_supported_vgpu_types`` reads it)."""

    path: str
    types: tuple[str, ...] = ()
    addresses: dict[objects.PciAddress, str] = records.field(
        default_factory=dict)
    default_type: str | None = None


def _nova_error(path, reason):
    return exception.ConfigError(
        reason='[routes]/nova_conf %s: %s' % (path, reason))


def _read_regular(path, limit):
    """The bytes of the regular file ``path`` (never a FIFO or a device:
    opened non-blocking and judged by ``fstat``), or None when there is no
    file there."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
                     | os.O_NOCTTY)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise _nova_error(path, e.strerror)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _nova_error(path, 'not a regular file')
        with os.fdopen(fd, 'rb', closefd=False) as f:
            raw = f.read(limit + 1)
    except OSError as e:
        raise _nova_error(path, e.strerror)
    finally:
        os.close(fd)
    if len(raw) > limit:
        raise _nova_error(path, 'larger than %d bytes' % limit)
    return raw


def _sections(path, text):
    """``{section: {key: [values]}}`` of an INI text as oslo.config (and
    so nova-compute) parses it."""
    from oslo_config import cfg
    from oslo_config import iniparser
    sections = {}
    parser = cfg.ConfigParser(path, sections)
    try:
        iniparser.BaseParser.parse(parser, text.splitlines(True))
    except iniparser.ParseError as e:
        raise _nova_error(path, 'Nova could not read it either: %s' % e)
    return sections


def _list(values):
    """An oslo.config ListOpt's value: the last line given, split at
    commas."""
    if not values:
        return []
    return [v.strip() for v in values[-1].split(',') if v.strip()]


def read_nova_conf(path):
    """``NovaVgpus`` of the nova.conf at ``path`` (empty when there is no
    file); ConfigError naming the file for one it cannot read."""
    if not path:
        return NovaVgpus(path='')
    raw = _read_regular(path, _MAX_NOVA_CONF_BYTES)
    if raw is None:
        return NovaVgpus(path=path)
    try:
        text = raw.decode('utf-8')
    except UnicodeDecodeError:
        raise _nova_error(path, 'not UTF-8 text')
    sections = _sections(path, text)
    devices = sections.get('devices', {})
    types = _list(devices.get('enabled_mdev_types')
                  or devices.get('enabled_vgpu_types'))
    addresses, default = {}, None
    for type_id in types:
        group = (sections.get('mdev_%s' % type_id)
                 or sections.get('vgpu_%s' % type_id) or {})
        listed = _list(group.get('device_addresses'))
        if not listed:
            default = default or type_id
            continue
        for text_address in listed:
            try:
                address = objects.PciAddress.parse(text_address)
            except exception.InvalidInput:
                raise _nova_error(path, '[mdev_%s]/device_addresses: %r is '
                                  'no PCI address' % (type_id, text_address))
            addresses[address] = type_id
    return NovaVgpus(path=path, types=tuple(types), addresses=addresses,
                     default_type=default)


def nova_claims(nova, gpus):
    """``{physical GPU: Claim}`` of Nova's own vGPU route on ``gpus``: a
    listed address (a VF's counts for its physical GPU), then every other
    physical GPU that offers the default type."""
    by_address = {g.address: g for g in gpus}
    found = {}
    for address, type_id in sorted(nova.addresses.items()):
        gpu = by_address.get(address)
        physical = gpu.physfn if gpu is not None and gpu.is_vf else address
        found[physical] = Claim(NOVA_VGPU, '%s [mdev_%s]/device_addresses'
                                % (nova.path, type_id))
    if nova.default_type is not None:
        for gpu in gpus:
            if not gpu.is_vf and gpu.address not in found and \
                    gpu.offered_type(nova.default_type) is not None:
                found[gpu.address] = Claim(
                    NOVA_VGPU, '%s [devices]/enabled_mdev_types (%s, on '
                    'every GPU offering it)' % (nova.path, nova.default_type))
    return found


# --- Cyborg's route ----------------------------------------------------------

CYBORG_OPTION = '[routes]/cyborg'


def cyborg_values(conf):
    routes = getattr(conf, 'routes', None)
    return [str(v).strip() for v in routes.cyborg] if routes is not None \
        else []


def cyborg_claims(conf, gpus):
    """``{physical GPU: Claim}`` of ``[routes]/cyborg`` on ``gpus``;
    ConfigError naming the option for an entry that names no GPU, a VF,
    or an address where the host has none."""
    selectors = selectors_mod.parse(CYBORG_OPTION, cyborg_values(conf),
                                    allow_all=True)
    if selectors == selectors_mod.ALL:
        return {g.address: Claim(CYBORG, '[routes]/cyborg = all')
                for g in gpus if not g.is_vf}
    found = {}
    for _selector, named in selectors_mod.resolve(CYBORG_OPTION, selectors,
                                                  gpus):
        for gpu in named:
            found[gpu.address] = Claim(CYBORG, '[routes]/cyborg')
    return found


# --- all four ----------------------------------------------------------------

def _refuse(address, first, second):
    return exception.ConfigError(
        reason='a GPU can\'t be claimed by two routes: %s gives %s to %s and '
               '%s gives it to %s; give it to one route (docs/admin/nova.md, '
               '"Routes")' % (first.source, address, first.route,
                              second.source, second.route))


def resolve(conf, gpus, enabled, carved, nova=None):
    """The ``Routes`` of the host whose GPUs are ``gpus``.

    :param enabled: ``{PciAddress: EnabledType}`` (``enablement.resolve``:
        the types of our route and Cyborg's).
    :param carved: ``{physical GPU: where}`` carved for Nova (``where``: the
        carving's section, or the record).
    :param nova: ``NovaVgpus`` (default: read from ``[routes]/nova_conf``).

    ConfigError, in one line naming both claims, for a GPU two routes
    claim: Cyborg's and a carving, Nova's vGPU route and any other, or
    Nova's vGPU route and a type our configuration enables on the GPU.
    """
    if nova is None:
        routes = getattr(conf, 'routes', None)
        nova = read_nova_conf(routes.nova_conf if routes is not None
                              else '')
    claims = {}

    def claim(address, new):
        old = claims.get(address)
        if old is not None and old.route != new.route:
            raise _refuse(address, old, new)
        claims.setdefault(address, new)

    for address, where in sorted(carved.items()):
        claim(address, Claim(NOVA_PCI, where))
    every = cyborg_values(conf) == [selectors_mod.ALL]
    if not every:
        for address, found in sorted(cyborg_claims(conf, gpus).items()):
            claim(address, found)
    for address, found in sorted(nova_claims(nova, gpus).items()):
        claim(address, found)
        setting = enabled.get(address)
        if setting is not None:
            raise _refuse(address, found, Claim(
                CYBORG if every else OURS,
                '[gpu]/enabled_vgpu_types (%s)' % setting.type_id))
    if every:
        for address, found in sorted(cyborg_claims(conf, gpus).items()):
            claims.setdefault(address, found)
    return Routes(owners={a: c.route for a, c in claims.items()})
