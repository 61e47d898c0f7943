"""What every device kind offers, in the manner of os-vif's plugins.

A device kind (whole GPU by PCI passthrough, mdev vGPU, ...) is one module
with one ``DeviceBackend`` subclass.  The callers (the hook, the API)
never look inside: they ask a backend to ``prepare`` a device before a guest
uses it, to ``release`` it afterwards, and for the ``<hostdev>`` XML that
hands it to the guest.  Backends hold no libvirt domain logic and no
allocation policy (``allocator`` chooses, ``guest`` attaches).
"""

import abc
import dataclasses
import errno

from libvirt_gpu import exception
from libvirt_gpu import objects

# Answers that mean "not now" (the driver or libvirt is busy), never "no".
TRANSIENT_ERRNOS = (errno.EBUSY, errno.EAGAIN, errno.EINTR)


def is_transient(exc):
    """Whether ``exc`` is worth retrying: EBUSY/EAGAIN/EINTR from sysfs, or
    a libvirt operation timeout."""
    if isinstance(exc, exception.LibvirtTimeout):
        return True
    return (isinstance(exc, exception.SysfsWriteError)
            and exc.kwargs.get('errno') in TRANSIENT_ERRNOS)


def retry_transient(func, stop_after=5.0, first_wait=0.05, max_wait=1.0):
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


@dataclasses.dataclass(frozen=True)
class VgpuDevice:
    """A vGPU with every choice made: which UUID, on which GPU, which type."""

    uuid: str
    parent: objects.PciAddress
    type_id: str

    def __post_init__(self):
        object.__setattr__(self, 'uuid', objects.validate_uuid(self.uuid))
        object.__setattr__(self, 'parent',
                           objects.PciAddress.parse(self.parent))
        objects.validate_type_id(self.type_id)


@dataclasses.dataclass(frozen=True)
class PgpuDevice:
    """A whole GPU handed to one guest."""

    address: objects.PciAddress

    def __post_init__(self):
        object.__setattr__(self, 'address',
                           objects.PciAddress.parse(self.address))


class DeviceBackend(abc.ABC):
    """One device kind."""

    #: ``'mdev'`` or ``'pci'``: the ``<hostdev type=...>`` it produces.
    kind = None

    @abc.abstractmethod
    def hostdev_xml(self, device):
        """The ``<hostdev>`` element that gives ``device`` to a guest."""

    @abc.abstractmethod
    def exists(self, device):
        """Whether the host has ``device`` now, ready to be used."""

    @abc.abstractmethod
    def prepare(self, device):
        """Make ``device`` usable by a guest.  Returns True when this call
        changed the host (so a rollback must undo it), False when it was
        ready already.  Idempotent."""

    @abc.abstractmethod
    def release(self, device):
        """Undo ``prepare``.  Returns True when something was removed.
        Idempotent: releasing what is not there is not an error."""
