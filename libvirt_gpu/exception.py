"""Typed errors of libvirt-gpu.

Every error carries a message built from ``msg_fmt`` and keyword arguments, in
the manner of nova.exception.NovaException: callers raise ``UnknownType(
type_id='nvidia-999', address='0000:af:00.0')`` and the CLI or hook prints
``str(exc)``, which says what is wrong and, where it can, what to do.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class LibvirtGpuError(Exception):
    """Base class of every error this package raises on purpose."""

    msg_fmt = "An unknown error occurred."

    def __init__(self, message: str | None = None, **kwargs: Any) -> None:
        self.kwargs: dict[str, Any] = kwargs
        if message is None:
            try:
                message = self.msg_fmt % kwargs
            except (KeyError, TypeError, ValueError):
                # A wrong format argument must not hide the real error.
                message = self.msg_fmt
        self.message: str = message
        super().__init__(message)


class InvalidInput(LibvirtGpuError):
    msg_fmt = "Invalid input: %(reason)s"


class InvalidPciAddress(InvalidInput):
    msg_fmt = ("%(value)r is not a PCI address; expected the form "
               "DDDD:BB:SS.F in hex digits, e.g. 0000:af:00.0")


class InvalidUuid(InvalidInput):
    msg_fmt = ("%(value)r is not a UUID; expected the form "
               "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx")


class InvalidTypeId(InvalidInput):
    msg_fmt = ("%(value)r is not a valid vGPU type id (1 to 64 letters, "
               "digits, '-', '_' or '.', starting with a letter or digit, "
               "e.g. nvidia-223)")


class InvalidXml(InvalidInput):
    msg_fmt = "Refused XML: %(reason)s"


class ConfigError(LibvirtGpuError):
    msg_fmt = "Configuration error: %(reason)s"


class ConfigFileUnreadable(ConfigError):
    msg_fmt = ("cannot read the configuration file %(path)s: %(reason)s "
               "(name a readable file with --config-file)")


class SysfsError(LibvirtGpuError):
    msg_fmt = "sysfs: %(path)s: %(reason)s"


class UnsafePath(SysfsError):
    msg_fmt = ("refusing path %(path)s: it leaves the sysfs root "
               "%(root)s")


class SysfsReadError(SysfsError):
    msg_fmt = "cannot read %(path)s: %(reason)s"


# Refusals of the sysfs reader: sysfs is input, a tree may hold anything.

class SysfsOutsideRoot(SysfsReadError):
    msg_fmt = ("refusing to read %(path)s: it resolves to %(real)s, outside "
               "the sysfs root %(root)s")


class SysfsNotRegularFile(SysfsReadError):
    msg_fmt = ("refusing to read %(path)s: it is %(kind)s, not a regular "
               "file as every sysfs attribute is")


class SysfsFileTooLarge(SysfsReadError):
    msg_fmt = ("refusing to read %(path)s: it holds more than %(limit)d "
               "bytes, which no sysfs attribute does")


class SysfsBadNumber(SysfsReadError):
    msg_fmt = "cannot read %(path)s: expected %(expected)s, read %(text)r"


class SysfsWriteError(SysfsError):
    msg_fmt = "cannot write %(path)s: %(reason)s"


class DeviceNotFound(LibvirtGpuError):
    msg_fmt = ("No GPU at %(address)s on this host; "
               "`libvirt-gpu list` shows the GPUs that were found")


class UnknownType(LibvirtGpuError):
    msg_fmt = ("The GPU at %(address)s does not offer vGPU type "
               "%(type_id)s; `libvirt-gpu types %(address)s` lists the "
               "types it offers")


class LibvirtError(LibvirtGpuError):
    msg_fmt = "libvirt: %(reason)s"


class LibvirtUnavailable(LibvirtError):
    msg_fmt = ("cannot connect to libvirt at %(uri)s: %(reason)s; is "
               "libvirtd running?%(hint)s")

    def __init__(self, message: str | None = None, **kwargs: Any) -> None:
        # ``hint``: what to do instead (``host.Host`` knows whether sysfs
        # would do); none given, none said.
        kwargs.setdefault('hint', '')
        super().__init__(message, **kwargs)


class LibvirtXmlError(LibvirtError):
    """libvirt was reached (or its test driver started) but refused XML:
    not a matter of libvirtd running."""
    msg_fmt = ("libvirt at %(uri)s cannot parse XML: %(reason)s; fix that "
               "XML (for test:///FILE, the file at the line named)")


class SimulatorError(LibvirtGpuError):
    msg_fmt = "Simulator: %(reason)s"


# --- vGPU/pGPU lifecycle: backends, leases, attach/detach, hook ----------

class NotSupported(LibvirtGpuError):
    msg_fmt = "%(what)s is not supported here: %(reason)s"


class MdevError(LibvirtGpuError):
    msg_fmt = "vGPU %(uuid)s: %(reason)s"


class NoCapacity(MdevError):
    msg_fmt = ("No capacity left for vGPU type %(type_id)s on %(where)s: "
               "%(reason)s")


class ParentGone(MdevError):
    msg_fmt = ("The GPU %(address)s is not an mdev parent (any more): "
               "%(reason)s")


class MdevConflict(MdevError):
    msg_fmt = ("vGPU %(uuid)s already exists as type %(existing_type)s on "
               "%(existing_parent)s, but type %(type_id)s on %(parent)s was "
               "asked for; pick another UUID or remove the existing vGPU")


class MdevCreateFailed(MdevError):
    msg_fmt = ("Cannot create vGPU %(uuid)s (type %(type_id)s on "
               "%(parent)s): %(reason)s")


class MdevRemoveFailed(MdevError):
    msg_fmt = "Cannot remove vGPU %(uuid)s: %(reason)s"


class TypeNotEnabled(LibvirtGpuError):
    msg_fmt = ("vGPU type %(type_id)s is not enabled on %(where)s "
               "([gpu]/enabled_vgpu_types: %(enabled)s)")


class GpuInUse(LibvirtGpuError):
    msg_fmt = "The GPU %(address)s cannot be used: %(reason)s"


class LeaseConflict(LibvirtGpuError):
    msg_fmt = "vGPU %(uuid)s is held by %(holder)s"


class StateError(LibvirtGpuError):
    msg_fmt = "State file %(path)s: %(reason)s"


class MetadataError(InvalidInput):
    msg_fmt = ("Domain metadata <gpus xmlns='urn:libvirt-gpu:1'>: "
               "%(reason)s")


class DomainNotFound(LibvirtGpuError):
    msg_fmt = "No domain %(domain)s (name or UUID) in %(uri)s"


class DomainStateError(LibvirtGpuError):
    msg_fmt = "Domain %(domain)s: %(reason)s"


class DeviceNotAttached(LibvirtGpuError):
    msg_fmt = "Domain %(domain)s holds no %(what)s"


class LibvirtTimeout(LibvirtError):
    msg_fmt = "libvirt: %(reason)s (timed out; worth retrying)"


class MigrationRefused(LibvirtGpuError):
    msg_fmt = "Migration refused: %(reason)s"


class ListenError(LibvirtGpuError):
    msg_fmt = "cannot listen on %(address)s port %(port)d: %(reason)s"
