"""One libvirt domain: its XML, its host devices, our metadata in it.

Like nova's ``guest.Guest``: a thin wrapper over ``virDomain`` that turns
libvirt errors into typed ones by error code and makes no decisions.  The
``live``/``config`` flags map to ``VIR_DOMAIN_AFFECT_LIVE``/``_CONFIG``.
"""

from __future__ import annotations

import contextlib
import threading
import time

import libvirt

from libvirt_gpu.virt import config_xml
from libvirt_gpu import exception
from libvirt_gpu.virt import metadata
from libvirt_gpu import objects
from libvirt_gpu.util import xmlutil

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

    from libvirt_gpu.util.xmlutil import Element


# Where the connection delivers no events: how long a wait for a device
# removal lasts before the caller looks at the domain again.
POLL_INTERVAL = 0.1


class DeviceRemovals(object):
    """libvirt's ``VIR_DOMAIN_EVENT_ID_DEVICE_REMOVED`` events of one
    domain, waited for as nova waits for them: ``wait(timeout)`` returns
    True as soon as a device of the domain was removed since the last
    wait, False when ``timeout`` passed.  Where the connection delivers no
    events (no event loop registered before it was opened, a driver
    without them), ``events`` is False and a wait lasts at most
    ``POLL_INTERVAL``: the caller looks again, the timeout stays its
    fallback."""

    def __init__(self, domain: libvirt.virDomain) -> None:
        self._removed = threading.Event()
        self._conn: libvirt.virConnect | None = None
        self._callback: int | None = None
        try:
            conn = domain.connect()
            self._callback = conn.domainEventRegisterAny(
                domain, libvirt.VIR_DOMAIN_EVENT_ID_DEVICE_REMOVED,
                self._on_removed, None)
            self._conn = conn
        except (libvirt.libvirtError, AttributeError):
            # Any refusal means the same (no event loop, no events from
            # this driver, a connection object without them): poll.
            self._callback = None

    @property
    def events(self) -> bool:
        return self._callback is not None

    def _on_removed(self, conn: libvirt.virConnect,
                    domain: libvirt.virDomain, alias: str,
                    opaque: object) -> None:
        self._removed.set()

    def wait(self, timeout: float) -> bool:
        if not self.events:
            time.sleep(max(0.0, min(timeout, POLL_INTERVAL)))
            return False
        got = self._removed.wait(max(0.0, timeout))
        self._removed.clear()
        return got

    def close(self) -> None:
        if self._callback is not None and self._conn is not None:
            try:
                self._conn.domainEventDeregisterAny(self._callback)
            except libvirt.libvirtError:
                pass           # the connection is gone: so is the callback
            self._callback = None


# How libvirt ends the message of a hook that exited non-zero (virCommand's
# "Child process (ARGV) unexpected exit status N: STDERR"): what the hook
# said is after it.
_HOOK_EXIT = 'unexpected exit status '


def _hook_said(message: str) -> str:
    """The hook's own words in libvirt's VIR_ERR_HOOK_SCRIPT_FAILED
    message (which leads with the hook's command line and environment),
    or the whole message where libvirt worded it otherwise."""
    _, found, rest = message.rpartition(_HOOK_EXIT)
    if found:
        status, colon, said = rest.partition(': ')
        if colon and status.isdigit() and said.strip():
            return said.strip()
    return message


def _flags(live: bool, config: bool) -> int:
    flags = 0
    if live:
        flags |= libvirt.VIR_DOMAIN_AFFECT_LIVE
    if config:
        flags |= libvirt.VIR_DOMAIN_AFFECT_CONFIG
    return flags


class Guest(object):

    def __init__(self, domain: libvirt.virDomain) -> None:
        self._domain = domain

    def _typed(self, error: libvirt.libvirtError,
               what: str) -> exception.LibvirtGpuError:
        code = error.get_error_code()
        message = error.get_error_message() or str(error)
        label = '%s (%s)' % (self.name, self.uuid)
        if code == libvirt.VIR_ERR_NO_DOMAIN:
            return exception.DomainNotFound(domain=label, uri='libvirt')
        if code == libvirt.VIR_ERR_OPERATION_INVALID:
            return exception.DomainStateError(domain=label, reason=message)
        if code == libvirt.VIR_ERR_DEVICE_MISSING:
            return exception.DeviceNotAttached(domain=label, what=message)
        if code == libvirt.VIR_ERR_OPERATION_TIMEOUT:
            return exception.LibvirtTimeout(reason='%s of %s: %s'
                                            % (what, label, message))
        return exception.LibvirtError(reason='%s of %s: %s'
                                      % (what, label, message))

    @property
    def uuid(self) -> objects.Uuid:
        # libvirt's answer enters the program here, parsed once.
        return objects.Uuid.parse(self._domain.UUIDString())

    @property
    def name(self) -> str:
        return str(self._domain.name())

    def is_active(self) -> bool:
        try:
            return bool(self._domain.isActive())
        except libvirt.libvirtError as e:
            raise self._typed(e, 'state')

    def is_persistent(self) -> bool:
        try:
            return bool(self._domain.isPersistent())
        except libvirt.libvirtError as e:
            raise self._typed(e, 'state')

    def xml(self, inactive: bool = False) -> Element:
        """The domain XML (persistent config when ``inactive``), parsed."""
        try:
            text = self._domain.XMLDesc(
                libvirt.VIR_DOMAIN_XML_INACTIVE if inactive else 0)
        except libvirt.libvirtError as e:
            raise self._typed(e, 'reading the XML')
        return xmlutil.parse(text, 'domain XML')

    def devices(self, inactive: bool = False
                ) -> tuple[config_xml.DomainDevices, metadata.GpuMetadata]:
        """``config_xml.DomainDevices`` and ``metadata.GpuMetadata``."""
        root = self.xml(inactive)
        return config_xml.read_domain(root), metadata.parse(root)

    def attach_device(self, xml: str, live: bool = False,
                      config: bool = False) -> None:
        """``virDomainAttachDeviceFlags`` of one device element."""
        try:
            self._domain.attachDeviceFlags(xml, _flags(live, config))
        except libvirt.libvirtError as e:
            raise self._typed(e, 'attaching a device')

    @contextlib.contextmanager
    def device_removals(self) -> Iterator[DeviceRemovals]:
        """``DeviceRemovals`` of this domain while the block runs."""
        removals = DeviceRemovals(self._domain)
        try:
            yield removals
        finally:
            removals.close()

    def detach_device(self, xml: str, live: bool = False,
                      config: bool = False) -> None:
        """``virDomainDetachDeviceFlags``; a live detach may finish after
        this returns (the guest acknowledges the unplug)."""
        try:
            self._domain.detachDeviceFlags(xml, _flags(live, config))
        except libvirt.libvirtError as e:
            raise self._typed(e, 'detaching a device')

    def set_gpu_metadata(self, meta: metadata.GpuMetadata, live: bool = False,
                         config: bool = False) -> None:
        """Replace our ``<gpu:gpus>`` element (drop it when ``meta`` is
        empty)::

            <metadata><gpu:gpus xmlns:gpu="urn:libvirt-gpu:1">...</gpu:gpus>
        """
        try:
            self._domain.setMetadata(
                libvirt.VIR_DOMAIN_METADATA_ELEMENT,
                None if meta.empty else metadata.render(meta),
                metadata.PREFIX, metadata.NAMESPACE, _flags(live, config))
        except libvirt.libvirtError as e:
            raise self._typed(e, 'writing the metadata')

    # -- live migration ----------------------------------------------------

    def migrate_live(self, dest_uri: str,
                     migrate_uri: str | None = None) -> None:
        """Migrate the running domain live to ``dest_uri`` (libvirt's
        ``migrateToURI3`` with ``VIR_MIGRATE_LIVE | VIR_MIGRATE_PEER2PEER``:
        the source's libvirtd talks to the destination's; pre-copy only);
        the guest's memory goes to ``migrate_uri`` (e.g.
        ``tcp://10.0.0.2:49152``) when given, else where the destination's
        libvirtd says (its host name).  Returns when done, raises
        LibvirtError when libvirt gave up or the job was aborted."""
        flags = libvirt.VIR_MIGRATE_LIVE | libvirt.VIR_MIGRATE_PEER2PEER
        params: dict[str, str] = {}
        if migrate_uri:
            params[libvirt.VIR_MIGRATE_PARAM_URI] = migrate_uri
        try:
            self._domain.migrateToURI3(dest_uri, params, flags)
        except libvirt.libvirtError as e:
            message = e.get_error_message() or str(e)
            if e.get_error_code() == libvirt.VIR_ERR_HOOK_SCRIPT_FAILED:
                message = "a qemu hook refused it: %s" % _hook_said(message)
            raise exception.LibvirtError(
                reason='migration to %s: %s' % (dest_uri, message))

    def job_stats(self, completed: bool = False) -> dict[str, Any]:
        """libvirt's statistics of the domain's job (``{}`` when none):
        ``data_processed``, ``data_remaining``, ``downtime`` (ms)..."""
        flags = libvirt.VIR_DOMAIN_JOB_STATS_COMPLETED if completed else 0
        try:
            stats: dict[str, Any] = self._domain.jobStats(flags)
            return stats
        except libvirt.libvirtError as e:
            if e.get_error_code() in (libvirt.VIR_ERR_NO_DOMAIN,
                                      libvirt.VIR_ERR_OPERATION_INVALID):
                return {}
            raise self._typed(e, 'reading the job statistics')

    def abort_job(self) -> str | None:
        """Abort the domain's job (a migration): None when libvirt took
        the request, else its reason for not (no job runs any more, or it
        is past aborting)."""
        try:
            self._domain.abortJob()
        except libvirt.libvirtError as e:
            if e.get_error_code() in (libvirt.VIR_ERR_OPERATION_INVALID,
                                      libvirt.VIR_ERR_NO_DOMAIN):
                return str(e.get_error_message() or e)
            raise self._typed(e, 'aborting its job')
        return None
