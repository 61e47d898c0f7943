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

from libvirt_gpu import objects


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
