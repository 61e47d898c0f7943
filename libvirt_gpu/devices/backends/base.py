"""What every device kind offers, in the manner of os-vif's plugins.

A device kind (whole GPU by PCI passthrough, mdev vGPU, ...) is one module
with one ``DeviceBackend`` subclass.  The callers (the hook, the API)
never look inside: they ask a backend to ``prepare`` a device before a guest
uses it, to ``release`` it afterwards, and for the ``<hostdev>`` XML that
hands it to the guest.  Backends hold no libvirt domain logic and no
allocation policy (``allocator`` chooses, ``guest`` attaches).
"""

from __future__ import annotations

import abc
import errno
import os

from libvirt_gpu import exception
from libvirt_gpu.util import logs
from libvirt_gpu import objects
from libvirt_gpu.util import records

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence
    from typing import Generic, Protocol, Self, TypeVar

    from libvirt_gpu.devices import nvml as nvml_mod
    from libvirt_gpu.devices.sysfs import Sysfs
    from libvirt_gpu.virt.config_xml import DomainDevices

    _T = TypeVar('_T')
    # what a kind's calls take: a VgpuDevice, or a PgpuDevice (``pci``)
    _Device = TypeVar('_Device', bound='VgpuDevice | PgpuDevice')

    class MdevHost(Protocol):
        """What a kind asks of a libvirt connection (``virt.host.Host``,
        a door the kinds do not open: the environment hands it in)."""

        def create_mdev(self, xml: str) -> str: ...
        def define_mdev(self, xml: str, autostart: bool = False) -> str: ...
        def destroy_mdev(self, uuid: objects.Uuid) -> bool: ...
        def undefine_mdev(self, uuid: objects.Uuid) -> bool: ...

    # ``existing``: {uuid: (parent, type_id)}
    Existing = Mapping[objects.Uuid, tuple[objects.PciAddress,
                                           objects.TypeId]]
    MdevsByParent = Mapping[objects.PciAddress, Sequence[objects.Mdev]]
else:
    class Generic(object):
        """``typing.Generic`` for the checker alone (as in
        ``store/recordfile.py``): the hook never imports ``typing``."""

        def __class_getitem__(cls, params):
            return cls

    _Device = None

LOG = logs.getLogger(__name__)


@records.record
class KindParts:
    """What a vGPU kind is built from (``VgpuKind.from_parts``): the parts
    of the host the composition root (``environment.Environment.
    kind_parts``) hands down, never the environment itself.

    ``sysfs``: the host's ``Sysfs``; ``state_dir``: the state directory;
    ``host``: the libvirt connection a kind may create mdevs through (None:
    sysfs only); ``nvml``: NVIDIA's library (None: off); ``remove_timeout``:
    how long a removal waits (None: each kind's default); ``places``: the
    path of each ``Place`` a kind declared (``place``)."""

    sysfs: Sysfs
    state_dir: str
    host: MdevHost | None = None
    nvml: nvml_mod.Nvml | None = None
    remove_timeout: float | None = None
    places: Mapping[str, str] = records.field(default_factory=dict)

    def place(self, name: str) -> str:
        """The path of the place a kind declared as ``name``."""
        return self.places[name]


# Answers that mean "not now" (the driver or libvirt is busy), never "no".
TRANSIENT_ERRNOS = (errno.EBUSY, errno.EAGAIN, errno.EINTR)


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is worth retrying: EBUSY/EAGAIN/EINTR from sysfs, or
    a libvirt operation timeout."""
    if isinstance(exc, exception.LibvirtTimeout):
        return True
    return (isinstance(exc, exception.SysfsWriteError)
            and exc.kwargs.get('errno') in TRANSIENT_ERRNOS)


def errno_name(code: int | None, default: object = None) -> str:
    """``'EBUSY'`` of the errno ``code``; else ``default`` (``code``
    itself when None) as text."""
    if code is not None and code in errno.errorcode:
        return errno.errorcode[code]
    return str(code if default is None else default)


def retry_transient(func: Callable[[], _T], stop_after: float = 5.0,
                    first_wait: float = 0.05, max_wait: float = 1.0) -> _T:
    """``func()``, retried while it fails with a transient answer.

    The first call is made without tenacity (the hook's fast path must not
    import it); a transient failure imports it and retries with exponential
    waits until ``stop_after`` seconds have passed, then re-raises the last
    error.  Anything else is raised at once.
    """
    try:
        return func()
    except (exception.SysfsWriteError, exception.LibvirtTimeout) as e:
        if not is_transient(e):
            raise
    import tenacity
    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception(is_transient),
        stop=tenacity.stop_after_delay(stop_after),
        wait=tenacity.wait_exponential(multiplier=first_wait, max=max_wait),
        reraise=True)
    return retrying(func)


def is_sriov_pf(sysfs: Sysfs, address: objects.PciAddress) -> bool:
    """Whether ``address`` is a physical function with VFs to enable."""
    try:
        total = sysfs.sriov_totalvfs(address)
    except exception.SysfsReadError:
        return False
    return bool(total) and sysfs.physfn(address) is None


def nvidia_sriov_pfs(sysfs: Sysfs) -> list[objects.PciAddress]:
    """Every NVIDIA SR-IOV physical function of ``sysfs`` on the
    ``nvidia`` driver (Ampere and later: their vGPUs, mdev or vendor
    interface, live on VFs), sorted; a device whose files cannot be read
    is skipped with a warning."""
    found = []
    for address in sysfs.pci_addresses():
        base_dir = sysfs.pci_dir(address)
        try:
            vendor = sysfs.read(os.path.join(base_dir, 'vendor'),
                                optional=True)
            if not vendor or objects.normalize_hex_id(vendor) != \
                    objects.NVIDIA_VENDOR_ID:
                continue
        except (exception.SysfsReadError, exception.InvalidInput) as e:
            LOG.warning('PCI device %s skipped: %s', address, e)
            continue
        driver = sysfs.link_name(os.path.join(base_dir, 'driver'))
        if driver == 'nvidia' and is_sriov_pf(sysfs, address):
            found.append(address)
    return sorted(found)


# What each field of the device records holds, and the function that makes
# one from text where a value enters the program.
_PARSERS = {
    'uuid': (objects.Uuid, 'an objects.Uuid', 'objects.Uuid.parse'),
    'parent': (objects.PciAddress, 'an objects.PciAddress',
               'objects.PciAddress.parse'),
    'address': (objects.PciAddress, 'an objects.PciAddress',
                'objects.PciAddress.parse'),
    'type_id': (objects.TypeId, 'an objects.TypeId', 'objects.TypeId.parse'),
}


def refuse_untyped(record: object, optional: Iterable[str] = ()) -> None:
    """TypeError naming the first field of ``record`` (a ``uuid``,
    ``parent``, ``address`` or ``type_id``; None allowed for the names in
    ``optional``) that does not hold its type: a programming error, a
    caller passed raw text inward."""
    for f in records.fields(record):
        if f.name not in _PARSERS:
            continue
        expected, what, parser = _PARSERS[f.name]
        value = getattr(record, f.name)
        if value is None and f.name in optional:
            continue
        if not isinstance(value, expected):
            raise TypeError(
                '%s.%s must be %s, not %s %r: parse it with %s where it '
                'enters the program (CLI, API, hook input, state load, '
                'sysfs) and pass the result' % (
                    type(record).__name__, f.name, what,
                    type(value).__name__, value, parser))


@records.record
class VgpuDevice:
    """A vGPU with every choice made: which UUID, on which GPU, which type.

    Plain typed values, parsed and validated where they entered the
    program: ``uuid`` by ``objects.Uuid.parse`` (so lowercase),
    ``parent`` by ``objects.PciAddress.parse``, ``type_id`` by
    ``objects.TypeId.parse``.  Construction only refuses a value of
    the wrong type (a programming error); it does not parse again."""

    uuid: objects.Uuid
    parent: objects.PciAddress
    type_id: objects.TypeId

    def __post_init__(self) -> None:
        if not (isinstance(self.parent, objects.PciAddress)
                and type(self.uuid) is objects.Uuid
                and type(self.type_id) is objects.TypeId):
            refuse_untyped(self)


@records.record
class PgpuDevice:
    """A whole GPU handed to one guest: ``address`` parsed by
    ``objects.PciAddress.parse`` where it entered the program."""

    address: objects.PciAddress

    def __post_init__(self) -> None:
        if not isinstance(self.address, objects.PciAddress):
            refuse_untyped(self)


@records.record
class VgpuDefinition:
    """A persistent vGPU: created at boot (``start='auto'``) or on demand
    (``'manual'``), as its kind records it; ``source`` says where, for an
    operator (``'mdevctl (/etc/mdevctl.d)'``)."""

    uuid: objects.Uuid
    parent: objects.PciAddress
    type_id: objects.TypeId
    start: str
    attrs: tuple[tuple[str, str], ...] = ()
    source: str = ''


@records.record
class Restorable:
    """One persistent vGPU a kind records
    (``capabilities.Persistent.restorable``): ``device`` to create again
    after a reboot, described by ``detail`` (``'nvidia-223 on
    0000:af:00.0'``); or, with no ``device``, one left alone, ``detail``
    saying why (``failed``: its record cannot be read)."""

    uuid: str
    detail: str
    device: VgpuDevice | None = None
    failed: bool = False


@records.record
class Place:
    """A place on the host a kind keeps its own files in (mdevctl's
    directory, say): the name an ``Environment`` knows it by (its keyword
    argument and ``Environment.place``), and its default path."""

    name: str
    default: str


@records.record
class BootNote:
    """What a kind did, or would do, to one vGPU after a reboot
    (``capabilities.Recorded.boot_cleanup``), for ``restore``'s report."""

    action: str        # 'reset', 'forgot', 'would', 'ok', 'skipped', 'failed'
    target: str        # a vGPU's UUID, or the parent holding one
    detail: str


class DeviceBackend(Generic[_Device], abc.ABC):
    """One device kind."""

    #: ``'mdev'`` or ``'pci'``: the ``<hostdev type=...>`` it produces.
    kind: str | None = None

    @abc.abstractmethod
    def hostdev_xml(self, device: _Device) -> str:
        """The ``<hostdev>`` element that gives ``device`` to a guest."""

    @abc.abstractmethod
    def exists(self, device: _Device) -> bool:
        """Whether the host has ``device`` now, ready to be used."""

    @abc.abstractmethod
    def prepare(self, device: _Device) -> bool:
        """Make ``device`` usable by a guest.  Returns True when this call
        changed the host (so a rollback must undo it), False when it was
        ready already.  Idempotent."""

    @abc.abstractmethod
    def release(self, device: _Device) -> bool:
        """Undo ``prepare``.  Returns True when something was removed.
        Idempotent: releasing what is not there is not an error."""


class VgpuKind(DeviceBackend[VgpuDevice]):
    """One way of making vGPUs (classic mdev, NVIDIA's vendor interface on
    VFs, ...), in the manner of os-vif's ``PluginBase``: the core every
    kind implements.  What a kind does beyond it (definitions that outlive
    a guest, VFs of SR-IOV GPUs, carving, the driver's room, layouts) it
    declares by subclassing the capabilities of ``capabilities``.

    A kind is one module with one subclass, found through the entry
    points of ``registry.GROUP``; ``registry.Vgpus`` asks each kind which
    parents and UUIDs are its own and hands each call to that kind, so
    that the API, the allocator, the hook and reconcile never ask which
    kind they hold.  ``device`` arguments are ``VgpuDevice``s; ``parent``
    arguments are ``objects.PciAddress``es and ``uuid`` arguments UUIDs
    that ``objects.Uuid.parse`` accepted (lowercase), all parsed at the
    edge (``objects.Uuid``; nothing below the edge parses them again).  A
    ``VgpuDevice`` a kind returns holds the same: what it reads from sysfs
    or its own files it parses there.

    The core (``CORE``): ``name``, ``places``, ``from_parts``,
    ``is_parent``, ``owns``, ``lookup``, ``existing``, ``check_type``,
    ``vgpu_type``, ``prepare``, ``remove``, ``hostdev_xml`` and
    ``in_devices``; ``exists`` and ``release`` follow from ``lookup`` and
    ``remove``.
    """

    #: The kind's name (its entry point's, ``registry.GROUP``).
    name: str = ''

    #: The places on the host the kind keeps its own files in
    #: (``Place``s): an ``Environment`` takes each as a keyword argument
    #: (a test's own directory) and hands it on (``Environment.place``);
    #: nothing outside the kind names them.
    places: tuple[Place, ...] = ()

    @classmethod
    @abc.abstractmethod
    def from_parts(cls, parts: KindParts) -> Self:
        """The kind for the host whose parts are ``parts``."""

    @abc.abstractmethod
    def is_parent(self, address: objects.PciAddress) -> bool:
        """Whether vGPUs of this kind are made on the PCI function
        ``address`` now."""

    @abc.abstractmethod
    def owns(self, uuid: objects.Uuid) -> bool:
        """Whether ``uuid`` is a vGPU of this kind (existing or recorded)."""

    @abc.abstractmethod
    def lookup(self, uuid: objects.Uuid) -> VgpuDevice | None:
        """``uuid`` as a VgpuDevice when it exists now, else None."""

    @abc.abstractmethod
    def existing(self, mdevs_by_parent: MdevsByParent | None = None
                 ) -> Existing:
        """``{uuid: (parent, type_id)}`` of the vGPUs of this kind that
        exist now (``mdevs_by_parent``: the mdevs, when already read)."""

    @abc.abstractmethod
    def check_type(self, parent: objects.PciAddress,
                   type_id: objects.TypeId) -> None:
        """ParentGone / UnknownType unless ``parent`` offers ``type_id``."""

    @abc.abstractmethod
    def vgpu_type(self, parent: objects.PciAddress,
                  type_id: objects.TypeId) -> objects.VgpuType | None:
        """``type_id`` as ``parent`` offers it now (``objects.VgpuType``:
        available instances and maximum), None when it does not."""

    @abc.abstractmethod
    def remove(self, uuid: objects.Uuid) -> bool:
        """Remove ``uuid``; False when it did not exist."""

    @abc.abstractmethod
    def in_devices(self, devices: DomainDevices, uuid: objects.Uuid,
                   parent: objects.PciAddress | None) -> bool:
        """Whether a domain's ``config_xml.DomainDevices`` hold the hostdev
        of vGPU ``uuid`` (on ``parent``, None when unknown)."""

    def exists(self, device: VgpuDevice) -> bool:
        """Whether ``device`` exists now, on its parent, of its type."""
        return self.lookup(device.uuid) == device

    def release(self, device: VgpuDevice) -> bool:
        return self.remove(device.uuid)


#: The members every vGPU kind implements (``VgpuKind``).
CORE = ('name', 'places', 'from_parts', 'is_parent', 'owns',
        'lookup', 'existing', 'check_type', 'vgpu_type', 'prepare',
        'remove', 'hostdev_xml', 'in_devices')
