"""The libvirt connection: node devices in, node devices out.

Like nova's ``host.Host``, this owns the connection and nothing else: no
policy, no XML building.  libvirt errors are checked by error code, narrowly,
and re-raised as our typed errors.
"""

from __future__ import annotations

import threading

import libvirt

from libvirt_gpu import exception
from libvirt_gpu.virt import nodedev
from libvirt_gpu import objects

TYPE_CHECKING = False
if TYPE_CHECKING:
    from libvirt_gpu.virt import guest as guest_mod


def _ignore_error(_ctx: object, _err: object) -> None:
    """libvirt prints every error to stderr unless a handler is set; ours
    are raised as exceptions and reported once, by the caller."""


# Errors that say libvirt read XML it could not parse, not that it could
# not be reached.
_XML_ERRORS = (libvirt.VIR_ERR_XML_ERROR, libvirt.VIR_ERR_XML_DETAIL)


_event_loop: threading.Thread | None = None


def start_event_loop() -> None:
    """libvirt's default event loop, run in a daemon thread, once per
    process.  A connection delivers domain events (a device removed) only
    when the loop was registered before it was opened: a program that
    waits for them starts it first (nova starts its own when the driver
    starts; ``Host(events=True)`` does it at ``connect``)."""
    global _event_loop
    if _event_loop is not None:
        return

    def run() -> None:
        while True:
            libvirt.virEventRunDefaultImpl()
    libvirt.virEventRegisterDefaultImpl()
    _event_loop = threading.Thread(target=run, name='libvirt-events',
                                   daemon=True)
    _event_loop.start()


class Host(object):
    """A libvirt connection this program opens (``connect``), or one a
    caller lends (``from_connection``).

    libvirt's error handler is the process's: it is set (to print
    nothing, since every error is raised and reported once by the caller)
    only when a ``Host`` opens its own connection, the way nova's
    ``Host`` does when the driver starts, never when this module is
    imported, so that a program using the API with its own connection
    keeps its own handler.
    """

    def __init__(self, uri: str | None, read_only: bool = False,
                 events: bool = False) -> None:
        self.uri = uri
        self.read_only = read_only
        self.events = events
        self._conn: libvirt.virConnect | None = None
        self._borrowed = False

    def connect(self) -> libvirt.virConnect:
        if self._conn is None:
            libvirt.registerErrorHandler(_ignore_error, None)
            if self.events:
                start_event_loop()
            try:
                if self.read_only:
                    self._conn = libvirt.openReadOnly(self.uri)
                else:
                    self._conn = libvirt.open(self.uri)
            except libvirt.libvirtError as e:
                if e.get_error_code() in _XML_ERRORS:
                    # a malformed test:///FILE: the hint must fit the error
                    # (its message goes on with the line and a caret: one
                    # line is said)
                    raise exception.LibvirtXmlError(
                        uri=self.uri,
                        reason=(e.get_error_message() or '?').splitlines()[0])
                raise exception.LibvirtUnavailable(
                    uri=self.uri, reason=e.get_error_message(),
                    hint=self._unavailable_hint())
        return self._conn

    def _unavailable_hint(self) -> str:
        """What to do when libvirt cannot be reached: read-only callers
        (discovery) can read sysfs instead; the others need libvirt."""
        if self.read_only:
            return ' Use --sysfs-root to read sysfs instead'
        return ' This command needs libvirt: -c URI picks the connection'

    @classmethod
    def from_connection(cls, conn: libvirt.virConnect) -> Host:
        """Wrap a caller's open ``virConnect``; ``close()`` leaves it open
        (its owner closes it)."""
        host = cls(uri=None)
        host._conn = conn
        host._borrowed = True
        return host

    def close(self) -> None:
        if self._borrowed:
            self._conn = None
            return
        if self._conn is not None:
            try:
                self._conn.close()
            except libvirt.libvirtError:
                pass   # closing a dead connection: nothing left to release
            self._conn = None

    def __enter__(self) -> Host:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def versions(self) -> tuple[int, int]:
        """``(libvirt, hypervisor)`` versions of the connection's host,
        as libvirt encodes them (major * 1000000 + minor * 1000 +
        release); the hypervisor's is QEMU's for a qemu connection."""
        conn = self.connect()
        try:
            return int(conn.getLibVersion()), int(conn.getVersion())
        except libvirt.libvirtError as e:
            raise exception.LibvirtError(reason=e.get_error_message())

    def _list(self, flags: int) -> list[libvirt.virNodeDevice]:
        try:
            devices: list[libvirt.virNodeDevice] = (
                self.connect().listAllDevices(flags))
            return devices
        except libvirt.libvirtError as e:
            raise exception.LibvirtError(reason=e.get_error_message())

    def pci_devices(self) -> list[str]:
        """XML of every PCI node device (one removed while we list is
        skipped)."""
        result: list[str] = []
        flags = libvirt.VIR_CONNECT_LIST_NODE_DEVICES_CAP_PCI_DEV
        for dev in self._list(flags):
            xml = _xml_desc(dev)
            if xml is not None:
                result.append(xml)
        return result

    def mdev_nodes(self, active_only: bool = True) -> list[nodedev.MdevNode]:
        """MdevNode of every (active) mdev node device.

        A device removed between the listing and its reading is skipped:
        mdevs come and go while guests start and stop.
        """
        result: list[nodedev.MdevNode] = []
        for dev in self._list(libvirt.VIR_CONNECT_LIST_NODE_DEVICES_CAP_MDEV):
            try:
                if active_only and not _is_active(dev):
                    continue
            except _Gone:
                continue
            xml = _xml_desc(dev)
            if xml is not None:
                result.append(nodedev.parse_mdev(xml))
        return result

    # -- mdev create / define / destroy (never from the qemu hook) ---------

    def create_mdev(self, xml: str) -> str:
        """``virNodeDeviceCreateXML`` of an mdev (``config_xml.mdev_nodedev``
        input); returns the new device's name.  libvirt >= 6.5 with mdevctl;
        it waits for the kernel's uevent."""
        try:
            return str(self.connect().nodeDeviceCreateXML(xml, 0).name())
        except libvirt.libvirtError as e:
            raise _typed(e, 'creating an mdev through libvirt')

    def define_mdev(self, xml: str, autostart: bool = False) -> str:
        """``virNodeDeviceDefineXML`` (libvirt >= 7.3): a persistent mdev,
        not started; ``autostart`` starts it at boot.  When autostart
        cannot be set, the definition is dropped again: nothing is left
        half-made."""
        try:
            dev = self.connect().nodeDeviceDefineXML(xml, 0)
        except AttributeError:      # libvirt-python < 7.3
            raise exception.NotSupported(
                what='defining an mdev through libvirt',
                reason='libvirt-python has no nodeDeviceDefineXML')
        except libvirt.libvirtError as e:
            raise _typed(e, 'defining an mdev through libvirt')
        name: str = dev.name()
        if autostart:
            try:
                self._set_autostart(name)
            except (libvirt.libvirtError, AttributeError) as e:
                error: exception.LibvirtGpuError
                if isinstance(e, AttributeError):   # libvirt-python < 7.8
                    error = exception.NotSupported(
                        what='marking an mdev to start at boot through '
                             'libvirt',
                        reason='libvirt-python has no '
                               'virNodeDevice.setAutostart')
                else:
                    error = _typed(e, 'marking mdev %s to start at boot'
                                   % name)
                left = self._undefine_named(name)
                if left:
                    raise exception.LibvirtError(
                        reason='%s; %s' % (error.kwargs['reason'], left))
                raise error
        return name

    # libvirt (9.0, with mdevctl) rebuilds its list of defined mdevs from
    # mdevctl's after each define: for a moment a device defined just
    # before may be missing from it, and setAutostart on it answers
    # VIR_ERR_NO_NODE_DEVICE (seen with two defines in a row in the
    # kernel tests; a lookup a quarter of a second later finds it).
    AUTOSTART_WAIT = 5.0

    def _set_autostart(self, name: str) -> None:
        # tenacity makes the first call at once, without waiting
        import tenacity
        conn = self.connect()
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(
                lambda e: isinstance(e, libvirt.libvirtError) and
                e.get_error_code() == libvirt.VIR_ERR_NO_NODE_DEVICE),
            stop=tenacity.stop_after_delay(self.AUTOSTART_WAIT),
            wait=tenacity.wait_exponential(multiplier=0.1, max=1.0),
            reraise=True)
        retrying(lambda: conn.nodeDeviceLookupByName(name).setAutostart(1))

    def _undefine_named(self, name: str) -> str | None:
        """Undefine node device ``name`` (a define being undone); None,
        or what is left and how to remove it."""
        try:
            self.connect().nodeDeviceLookupByName(name).undefine(0)
        except libvirt.libvirtError as e:
            return ('its definition could not be dropped (%s): remove it '
                    'with "virsh nodedev-undefine %s"'
                    % (e.get_error_message(), name))
        return None

    def find_mdev(self, uuid: objects.Uuid, inactive: bool = False
                  ) -> libvirt.virNodeDevice | None:
        """The ``virNodeDevice`` of mdev ``uuid`` (looked up by UUID, never
        by a constructed name), or None."""
        objects.typed(uuid, objects.Uuid, 'uuid')
        flags = libvirt.VIR_CONNECT_LIST_NODE_DEVICES_CAP_MDEV
        if inactive:
            flags |= getattr(libvirt, 'VIR_CONNECT_LIST_NODE_DEVICES_INACTIVE',
                             0)
        for dev in self._list(flags):
            try:
                found = nodedev.parse_mdev(dev.XMLDesc(0))
            except libvirt.libvirtError as e:
                if e.get_error_code() == libvirt.VIR_ERR_NO_NODE_DEVICE:
                    continue        # gone while we listed
                raise _typed(e, 'reading an mdev node device')
            if found.mdev.uuid == uuid:
                return dev
        return None

    def destroy_mdev(self, uuid: objects.Uuid) -> bool:
        """Stop mdev ``uuid`` through libvirt; False when libvirt does not
        know it (the caller then uses sysfs)."""
        dev = self.find_mdev(uuid)
        if dev is None:
            return False
        try:
            dev.destroy()
        except libvirt.libvirtError as e:
            if e.get_error_code() == libvirt.VIR_ERR_NO_NODE_DEVICE:
                return False
            raise _typed(e, 'removing an mdev through libvirt')
        return True

    def undefine_mdev(self, uuid: objects.Uuid) -> bool:
        """Drop libvirt's persistent definition of ``uuid``; False when
        there is none."""
        dev = self.find_mdev(uuid, inactive=True)
        if dev is None:
            return False
        try:
            dev.undefine(0)
        except libvirt.libvirtError as e:
            if e.get_error_code() == libvirt.VIR_ERR_NO_NODE_DEVICE:
                return False
            raise _typed(e, 'undefining an mdev through libvirt')
        except AttributeError:
            raise exception.NotSupported(
                what='undefining an mdev through libvirt',
                reason='libvirt-python has no virNodeDevice.undefine')
        return True

    # -- domains --------------------------------------------------------

    def lookup_domain(self, ident: str | libvirt.virDomain
                      ) -> libvirt.virDomain:
        """A ``virDomain`` by UUID or name (a virDomain is returned as is).
        """
        if isinstance(ident, libvirt.virDomain):
            return ident
        conn = self.connect()
        try:
            try:
                uuid = objects.Uuid.parse(ident)
            except exception.InvalidUuid:
                return conn.lookupByName(ident)
            return conn.lookupByUUIDString(uuid)
        except libvirt.libvirtError as e:
            if e.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                raise exception.DomainNotFound(domain=ident,
                                               uri=self.uri or conn.getURI())
            raise _typed(e, 'looking up domain %s' % ident)

    def list_domains(self) -> list[libvirt.virDomain]:
        """Every domain libvirt knows (running, or defined and stopped)."""
        try:
            domains: list[libvirt.virDomain] = (
                self.connect().listAllDomains(0))
            return domains
        except libvirt.libvirtError as e:
            raise _typed(e, 'listing domains')

    def list_guests(self) -> list[guest_mod.Guest]:
        """Every domain libvirt knows, as ``guest.Guest``s."""
        from libvirt_gpu.virt import guest as guest_mod
        return [guest_mod.Guest(dom) for dom in self.list_domains()]


def _typed(error: libvirt.libvirtError,
           what: str) -> exception.LibvirtGpuError:
    """A libvirtError as our typed error, by code."""
    code = error.get_error_code()
    message = error.get_error_message() or str(error)
    if code == libvirt.VIR_ERR_NO_SUPPORT:
        return exception.NotSupported(what=what, reason=message)
    if code == libvirt.VIR_ERR_OPERATION_TIMEOUT:
        return exception.LibvirtTimeout(reason='%s: %s' % (what, message))
    return exception.LibvirtError(reason='%s: %s' % (what, message))


class _Gone(Exception):
    """A node device vanished between listing and reading it."""


def _xml_desc(dev: libvirt.virNodeDevice) -> str | None:
    """``dev.XMLDesc(0)``, or None when the device is gone."""
    try:
        xml: str = dev.XMLDesc(0)
        return xml
    except libvirt.libvirtError as e:
        if e.get_error_code() == libvirt.VIR_ERR_NO_NODE_DEVICE:
            return None
        raise exception.LibvirtError(reason=e.get_error_message())


def _is_active(dev: libvirt.virNodeDevice) -> bool:
    try:
        return bool(dev.isActive())
    except (AttributeError, libvirt.libvirtError) as e:
        if isinstance(e, libvirt.libvirtError):
            code = e.get_error_code()
            if code == libvirt.VIR_ERR_NO_NODE_DEVICE:
                raise _Gone()
            if code != libvirt.VIR_ERR_NO_SUPPORT:
                raise exception.LibvirtError(reason=e.get_error_message())
        return True   # drivers without isActive only list live devices
