"""What a vGPU kind may do beyond the core (``base.VgpuKind``): each
capability a small declared interface, as os-vif's plugins declare what
they support.

A kind declares a capability by subclassing it (``class
NvidiaVgpuBackend(base.VgpuKind, capabilities.Persistent, ...)``) and
implements its abstract members; the registry and the other callers ask
``isinstance(kind, Capability)`` (``issubclass`` for a kind's class,
``registry.having``), never whether an attribute happens to be there.  A
kind without a capability is simply not asked: a kind that makes vGPUs
only while their guest runs needs none of them.

``CAPABILITIES`` lists them; tests/unit/project/test_architecture.py checks
that every kind implements each it declares and none it does not.  This module
imports nothing of ours, so that the rooms below the kinds (discovery,
carving) may ask a kind they are handed what it declares.
"""

from __future__ import annotations

import abc

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any, TypeAlias

    # The floor imports nothing of ours (tests/unit/test_architecture.py),
    # not even for the checker: the records and typed values a capability
    # passes are named here for the reader, and each kind's own signature
    # says them precisely (``backends.base``, ``objects``, ``capacity``).
    BootNote: TypeAlias = Any
    Restorable: TypeAlias = Any
    VgpuDefinition: TypeAlias = Any
    VgpuDevice: TypeAlias = Any
    DriverRoom: TypeAlias = Any
    Gpu: TypeAlias = Any
    Sysfs: TypeAlias = Any
    VendorVf: TypeAlias = Any
    PciAddress: TypeAlias = Any
    TypeId: TypeAlias = Any
    Uuid: TypeAlias = Any


class Capability(abc.ABC):
    """The base of every capability (not one itself)."""

    #: The names a kind implements to have the capability.
    MEMBERS: tuple[str, ...] = ()

    #: What one of the kind's vGPUs is called in the reports of what a
    #: capability did (``restore``'s).
    noun: str = 'vgpu'


class Persistent(Capability):
    """Persistence: the kind keeps definitions of vGPUs that outlive their
    guest (mdevctl's directory, a state file), which ``restore`` creates
    again after a reboot."""

    MEMBERS: tuple[str, ...] = ('definition', 'define', 'undefine',
                                'restorable')

    @abc.abstractmethod
    def definition(self, uuid: Uuid) -> VgpuDefinition | None:
        """The persistent definition of ``uuid`` (a ``base.VgpuDefinition``:
        ``uuid``, ``parent``, ``type_id``, ``start``, ``attrs``, ``source``:
        where the kind keeps it, in words for an operator), else None."""

    @abc.abstractmethod
    def define(self, device: VgpuDevice, start: str = 'manual') -> None:
        """Make ``device`` persistent without creating it."""

    @abc.abstractmethod
    def undefine(self, uuid: Uuid) -> bool:
        """Drop the persistent definition of ``uuid``; False when none."""

    @abc.abstractmethod
    def restorable(self) -> tuple[Restorable, ...]:
        """``base.Restorable``s: what ``restore`` creates again after a
        reboot, and what it leaves alone, and why."""

    def attrs_refusal(self, definition: VgpuDefinition) -> str:
        """Why the hook does not create a vGPU whose ``definition`` sets
        attributes (``registry.Vgpus.defined_device`` refuses it), and what
        to do instead."""
        return ('its definition (%s) sets attributes, which this hook does '
                'not apply' % definition.source)


class WatchedParents(Capability):
    """Parents that come and go (VFs enabled, a driver bound): the qemu
    hook's settings snapshot keeps the parents of each such kind under
    ``parents_key`` and resolves the enabled types again when they
    change."""

    MEMBERS: tuple[str, ...] = ('parents_key', 'parents_now')

    #: The name of the kind's entry in the hook's settings key.
    parents_key: str = ''

    @classmethod
    @abc.abstractmethod
    def parents_now(cls, sysfs: Sysfs) -> list[str]:
        """Names of the kind's parents on the host ``sysfs`` now, sorted,
        read cheaply (the hook asks at every guest start)."""


class SriovGpus(Capability):
    """vGPUs on the VFs of SR-IOV physical GPUs: ``restore`` enables the
    VFs of the GPUs this names after a reboot."""

    MEMBERS: tuple[str, ...] = ('sriov_pfs',)

    @classmethod
    @abc.abstractmethod
    def sriov_pfs(cls, sysfs: Sysfs) -> list[PciAddress]:
        """The physical GPUs whose VFs the kind makes vGPUs on, when the
        configuration names no addresses."""


class VendorFunctions(Capability):
    """A sysfs interface of the kind's own on PCI functions without mdev
    types (NVIDIA's vendor interface on VFs): discovery reads its types
    through the kind."""

    MEMBERS: tuple[str, ...] = ('sysfs_names', 'read_function',
                                'complete_types')

    #: The file names of the kind's interface: spelled in the kind's
    #: module (or package) and nowhere else in the repository
    #: (tests/unit/project/test_architecture.py).
    sysfs_names: tuple[str, ...] = ()

    @classmethod
    @abc.abstractmethod
    def read_function(cls, sysfs: Sysfs,
                      address: PciAddress) -> VendorVf | None:
        """The ``objects.VendorVf`` of the PCI function ``address`` when
        the kind's interface is there, else None; through ``sysfs``
        only."""

    @classmethod
    @abc.abstractmethod
    def complete_types(cls, pf: Gpu, vfs: Sequence[Gpu]) -> list[Gpu]:
        """The VF records of the physical GPU ``pf`` with the kind's types
        completed (names, maxima), the others unchanged."""


class Recorded(Capability):
    """The kind keeps its own record of the vGPUs libvirt-gpu made (the
    interface has no UUIDs of its own): they are ours to judge even on a
    GPU the configuration no longer covers, and the kind cleans its
    records after a reboot."""

    MEMBERS: tuple[str, ...] = ('recorded', 'recorded_gpus', 'boot_cleanup')

    @abc.abstractmethod
    def recorded(self, uuid: Uuid) -> bool:
        """Whether the kind's records name ``uuid``."""

    @abc.abstractmethod
    def recorded_gpus(self) -> tuple[PciAddress, ...]:
        """Physical GPUs the records mention: ``restore`` enables their
        VFs."""

    @abc.abstractmethod
    def boot_cleanup(self, owner_running: Callable[[Uuid], bool | None],
                     dry_run: bool = False) -> list[BootNote]:
        """After a reboot: reset the kind's vGPUs whose guest does not run
        (``owner_running(uuid)``: True, False, or None when it cannot
        tell) and forget records of vGPUs that are gone; ``base.BootNote``s
        of what was done (``dry_run``: would be done)."""


class BindsParent(Persistent):
    """The guest's persistent XML names the parent (the vGPU's hostdev is
    the parent itself): a ``config``-only attach chooses the parent and
    defines the vGPU on it; the parents so recorded are taken."""

    MEMBERS: tuple[str, ...] = Persistent.MEMBERS + ('choose_parent',
                                                     'reserved_parents')

    @abc.abstractmethod
    def choose_parent(self, gpu: PciAddress,
                      type_id: TypeId) -> PciAddress:
        """The parent of the physical GPU ``gpu`` a ``config``-only vGPU of
        ``type_id`` goes to; NoCapacity when none can take it."""

    @abc.abstractmethod
    def reserved_parents(self) -> Mapping[PciAddress, Uuid]:
        """``{parent: uuid}`` of the parents recorded for a vGPU of this
        kind that may not exist yet (no other vGPU may take them)."""


class Carvable(Capability):
    """One vGPU per parent function whose type can be written for another
    program (a VF carved for OpenStack Nova, ``devices.carving``)."""

    MEMBERS: tuple[str, ...] = ('held_type', 'write_type', 'clear_type')

    @abc.abstractmethod
    def held_type(self, parent: PciAddress) -> TypeId | None:
        """The type id of the vGPU the parent function holds now, None
        when it holds none."""

    @abc.abstractmethod
    def write_type(self, parent: PciAddress, type_id: TypeId) -> None:
        """Make the parent function hold a vGPU of ``type_id``, recorded by
        no one; MdevCreateFailed, NoCapacity or ParentGone when the driver
        refuses."""

    @abc.abstractmethod
    def clear_type(self, parent: PciAddress) -> None:
        """Make the parent function hold no vGPU; MdevRemoveFailed when
        the driver keeps it."""


class DriverRooms(Capability):
    """The driver counts a GPU's room itself (MIG GPU instances,
    mixed-size placements): the allocator and Placement take its word."""

    MEMBERS: tuple[str, ...] = ('room',)

    @abc.abstractmethod
    def room(self, gpu: PciAddress, type_id: TypeId) -> DriverRoom | None:
        """The driver's room for ``type_id`` on the physical GPU ``gpu``
        (``capacity.DriverRoom``), or None where the driver does not count
        it (free parents and the type's maximum then say it)."""


class LayoutDriver(Capability):
    """The kind's vGPUs live on the VFs of a GPU that ``layout apply``
    shapes (MIG mode, GPU instances, VFs): ``layout_apply`` asks it which
    VFs are ready and which hold a vGPU."""

    MEMBERS: tuple[str, ...] = ('layout_ready', 'layout_vgpus')

    @abc.abstractmethod
    def layout_ready(self, vf: PciAddress) -> bool:
        """Whether the VF ``vf`` shows the kind's interface (enabled VFs
        are waited for until they do)."""

    @abc.abstractmethod
    def layout_vgpus(self, gpu: PciAddress) -> tuple[PciAddress, ...]:
        """The VFs of the physical GPU ``gpu`` that hold a vGPU of the
        kind now (a GPU that holds one is not reshaped)."""


CAPABILITIES: tuple[type[Capability], ...] = (
    Persistent, WatchedParents, SriovGpus, VendorFunctions, Recorded,
    BindsParent, Carvable, DriverRooms, LayoutDriver)


def declared(kind: object) -> tuple[type[Capability], ...]:
    """The capabilities ``kind`` (a kind or its class) declares, in
    ``CAPABILITIES`` order."""
    cls = kind if isinstance(kind, type) else type(kind)
    return tuple(c for c in CAPABILITIES if issubclass(cls, c))
