"""The destination's side of a live migration: the hook's ``migrate``.

libvirt runs ``qemu NAME migrate begin -`` on the destination host before
``prepare``, with the incoming domain's XML on stdin; what the hook prints
replaces that XML (nothing printed: unchanged) and a non-zero exit cancels
the migration while the guest runs on at the source, untouched.

For each vGPU of our ``<gpu:gpus>`` metadata a GPU of this host is chosen
by the rules of ``prepare`` (the type enabled here, room, the guest's NUMA
pinning) and reserved for the domain under the lease lock
(``Allocator.reserve_incoming``).  The reservation outlives this process
(which exits at once) until ``HOLD_SECONDS`` have passed: ``prepare``, a
moment later, takes it over and creates the vGPUs; one whose ``prepare``
never comes is freed by ``reconcile`` once it has expired.

The XML is edited in place (``xmledit.Document``), everything else byte
for byte:

* ``<gpu:vgpu parent=...>``: the GPU (or, for NVIDIA's vendor interface,
  the VF) chosen here; ``uuid=`` too when the source's UUID is taken here;
* an mdev ``<hostdev>``: its ``<source><address uuid=...>``, only when the
  UUID changed;
* a vendor-interface VF's ``<hostdev type='pci'>``: its ``<source><address
  domain= bus= slot= function=>``, the VF chosen here.

Nothing is created here: for the vendor interface the VF chosen is
only reserved, and ``prepare`` writes its type before QEMU starts (a
migration failing before ``prepare`` typed nothing here); a failed or
aborted migration after it runs ``release`` for the incoming domain,
which writes 0 again (``reconcile`` after a crash).  The room is the
driver's (``Allocator.reserve_incoming``): on a GPU in MIG mode a GPU
instance of the type's profile with room, on one in mixed-size mode a
free placement of its size.

NVIDIA's own rule, for each vGPU whose entry carries the source's NVIDIA
metadata (``nvidia-metadata=``, written by the source: see
docs/admin/migration.md): the GPU chosen here is put to NVIDIA's driver
(``nvml.compatibility``: ``nvmlGetVgpuCompatibility`` with this GPU's
``nvmlDeviceGetVgpuMetadata``) and the migration refused, with NVIDIA's
reason, unless the answer allows a live migration; a vGPU whose hostdev
the XML lacks (nothing is reserved for it) is put to every GPU here
(``nvml.best_compatibility``).  Where NVML is not used
here or does not answer ("not supported"), or the entry carries no
metadata, the log says that the check was not made and today's checks
stand alone.

Refused (exit 1, one line), reserving nothing: a type not enabled here,
no room, a whole GPU passed through (VFIO cannot migrate it), a vGPU that
is an mdev on the source but lives on VFs here (or the reverse), more than
``allocator.MAX_VGPUS_PER_DOMAIN`` vGPUs (before the lease lock), two
vGPUs naming one hostdev, one vGPU named by two hostdevs; and, by
``operations.parse_request``, input that is not UTF-8 or has two
``<metadata>`` elements.  All or nothing: the checks and the edits run
inside the reservation's transaction (``reserve_incoming``'s ``check``),
and the edited XML is parsed once more before it commits.  A retry of
the same domain's migration renews the reservations its earlier try made
instead of adding to them.
"""

from __future__ import annotations

import time

from libvirt_gpu.host import allocator as allocator_mod
from libvirt_gpu import exception
from libvirt_gpu.util import xmlutil
from libvirt_gpu.virt import metadata

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Protocol

    from libvirt_gpu.devices.backends import base
    from libvirt_gpu.devices.backends import registry
    from libvirt_gpu import environment
    from libvirt_gpu.guests.hook import log as log_mod
    from libvirt_gpu import objects
    from libvirt_gpu.util import xmledit
    from libvirt_gpu.virt import config_xml

    # What this module uses of ``Hook`` and ``Request``
    # (``operations`` imports this module when a migration comes in).
    class Hook(Protocol):
        @property
        def env(self) -> environment.Environment: ...

        @property
        def log(self) -> log_mod.HookLog: ...

        @property
        def vgpus(self) -> registry.Vgpus: ...

        @property
        def allocator(self) -> allocator_mod.Allocator: ...

    class Request(Protocol):
        @property
        def domain(self) -> config_xml.DomainDevices: ...

        @property
        def meta(self) -> metadata.GpuMetadata: ...

        @property
        def document(self) -> xmledit.Document | None: ...

# How long a reservation stands without its prepare (seconds): libvirt runs
# prepare right after migrate, before any memory is copied.
HOLD_SECONDS = 300.0

_NS = '{%s}' % metadata.NAMESPACE
_PCI_FIELDS = (('domain', '0x%04x'), ('bus', '0x%02x'), ('slot', '0x%02x'),
               ('function', '0x%x'))


def _uuid_key(value: str | None) -> str | None:
    """An attribute's text as a UUID key (compared, not parsed again: the
    metadata's ``objects.Uuid`` is lower case), or None."""
    return value.lower() if isinstance(value, str) else None


def _pci_key(address: xmledit.Element) -> tuple[int, ...] | None:
    """The ``(domain, bus, slot, function)`` numbers of an ``<address
    domain= bus= slot= function=>`` element, or None."""
    try:
        return tuple(int(address.attrib.get(name, ''), 16)
                     for name, _ in _PCI_FIELDS)
    except ValueError:
        return None


class Target(object):
    """One vGPU of the incoming domain: its metadata entry, the element of
    that entry and the ``<address>`` of its hostdev's ``<source>``; ``vf``
    when the hostdev hands over a VF (the vendor interface)."""

    __slots__ = ('entry', 'element', 'source', 'vf')

    def __init__(self, entry: metadata.VgpuEntry, element: xmledit.Element,
                 source: xmledit.Element, vf: bool) -> None:
        self.entry = entry
        self.element = element
        self.source = source
        self.vf = vf


def _refuse(reason: str) -> exception.MigrationRefused:
    return exception.MigrationRefused(reason=reason)


def _document(req: Request) -> xmledit.Document:
    """``req``'s editable XML, which ``migrate``'s row reads."""
    if req.document is None:
        raise TypeError('migrate edits the domain XML: its row of '
                        'operations.OPERATIONS must read DOCUMENT')
    return req.document


def targets(req: Request) -> list[Target]:
    """The ``Target`` of each vGPU of ``req``'s metadata that its devices
    hold (in metadata order); one pass over the metadata and the hostdevs.
    MigrationRefused when one hostdev would serve two vGPUs."""
    doc = _document(req)
    found_metadata = doc.root.findall('metadata')
    found_gpus = [g for m in found_metadata
                  for g in m.findall(_NS + metadata.ROOT)]
    # metadata.parse refuses both first; never edit a guess
    if len(found_metadata) > 1:
        raise _refuse('the domain XML has %d <metadata> elements and '
                      'libvirt reads only the first' % len(found_metadata))
    if len(found_gpus) > 1:
        raise _refuse('the domain XML\'s <metadata> holds %d <%s> elements '
                      'of libvirt-gpu; one says which vGPUs are ours'
                      % (len(found_gpus), metadata.ROOT))
    elements: dict[str | None, xmledit.Element] = {}
    for vgpu in (found_gpus[0].findall(_NS + 'vgpu')
                 if found_gpus else ()):
        elements.setdefault(_uuid_key(vgpu.attrib.get('uuid')), vgpu)
    devices = doc.root.find('devices')
    by_uuid: dict[str | None, list[xmledit.Element]] = {}
    by_pci: dict[tuple[int, ...] | None, list[xmledit.Element]] = {}
    for hostdev in devices.findall('hostdev') if devices is not None else ():
        source = hostdev.find('source', 'address')
        if source is None or hostdev.attrib.get(
                'mode', 'subsystem') != 'subsystem':
            continue
        # <hostdev type='mdev'> names the vGPU's UUID; type='pci' its VF
        if hostdev.attrib.get('type') == 'mdev':
            by_uuid.setdefault(_uuid_key(source.attrib.get('uuid')),
                               []).append(source)
        elif hostdev.attrib.get('type') == 'pci':
            by_pci.setdefault(_pci_key(source), []).append(source)
    found = []
    served: dict[int, objects.Uuid] = {}    # id(source) -> its vGPU
    for entry in req.meta.vgpus:
        element = elements.get(entry.uuid)
        if element is None:
            raise _refuse('vGPU %s of the metadata has no <vgpu> element '
                          'this hook can edit' % entry.uuid)
        sources = by_uuid.get(entry.uuid)
        vf = sources is None
        if vf and entry.parent is not None:
            p = entry.parent
            sources = by_pci.get((p.domain, p.bus, p.slot, p.function))
        if sources is None:
            continue
        if len(sources) > 1:
            # only one of them would be edited: the other would still
            # hand the guest the UUID (or VF) that may be taken here
            raise _refuse('vGPU %s is named by %d hostdevs; a vGPU is one '
                          'hostdev: remove the others'
                          % (entry.uuid, len(sources)))
        source = sources[0]
        other = served.setdefault(id(source), entry.uuid)
        if other != entry.uuid:
            raise _refuse('vGPUs %s and %s both name the hostdev of %s; '
                          'each vGPU needs its own (one vGPU per VF)'
                          % (other, entry.uuid, entry.parent))
        found.append(Target(entry, element, source, vf=vf))
    return found


def _check_kind(hook: Hook, target: Target,
                grant: allocator_mod.Grant) -> None:
    here = hook.vgpus.binds_parent(grant.device.parent)
    if here != target.vf:
        raise exception.MigrationRefused(
            reason='vGPU %s (%s) is %s on the source but %s here; both '
                   'hosts must offer the type the same way'
                   % (target.entry.uuid, target.entry.type_id,
                      'a VF (vendor interface)' if target.vf else 'an mdev',
                      'a VF (vendor interface)' if here else 'an mdev'))


def _gpu_of(hook: Hook, target: Target,
            device: base.VgpuDevice) -> objects.PciAddress:
    """The physical GPU of the vGPU chosen here: the VF's PF (vendor
    interface), or the mdev's parent."""
    if target.vf:
        return hook.env.sysfs.physfn(device.parent) or device.parent
    return device.parent


def _check_driver_rules(
        hook: Hook, entry: metadata.VgpuEntry,
        chosen: tuple[Target, base.VgpuDevice] | None = None) -> None:
    """NVIDIA's answer for the source's vGPU ``entry`` on the GPU chosen
    here for it (``chosen``: its target and the grant's device), or on the
    best GPU here when none is (its hostdev is not in the XML: nothing to
    reserve);
    MigrationRefused unless it allows a live migration."""
    if entry.driver_metadata is None:
        hook.log.info(
            'incoming vGPU %s (%s) carries no NVIDIA metadata from the '
            'source: NVIDIA\'s compatibility check not made, today\'s '
            'checks only' % (entry.uuid, entry.type_id))
        return
    # imported here: a guest start (prepare) never pays for it
    from libvirt_gpu.devices import nvml as nvml_mod
    meta = nvml_mod.VgpuMetadata(raw=entry.driver_metadata)
    try:
        nvml = hook.env.nvml
    except exception.ConfigError as e:
        answer = nvml_mod.unknown(str(e))
    else:
        if chosen is None:
            answer = nvml_mod.best_compatibility(nvml, meta)
        else:
            answer = nvml_mod.compatibility(
                nvml, meta, _gpu_of(hook, *chosen))
    if answer.verdict == nvml_mod.NOT_LIVE:
        raise exception.MigrationRefused(
            reason='vGPU %s (%s): %s' % (entry.uuid, entry.type_id,
                                         answer.reason))
    if answer.verdict == nvml_mod.UNKNOWN:
        hook.log.warning(
            'incoming vGPU %s (%s): NVIDIA\'s compatibility check not '
            'made: %s; today\'s checks only'
            % (entry.uuid, entry.type_id, answer.reason))
    else:
        hook.log.info('incoming vGPU %s (%s): %s'
                      % (entry.uuid, entry.type_id, answer.reason))


def migrate(hook: Hook, req: Request
            ) -> xmledit.Document | None:
    """Reserve this host's vGPUs for the incoming domain ``req`` and
    return its XML edited to name them (see the module doc).  All or
    nothing: the edits are made, and every check passed, before the
    reservations are committed; a refusal leaves none behind."""
    if req.meta.pgpus:
        raise exception.MigrationRefused(
            reason='it holds the whole GPU %s, which VFIO cannot migrate; '
                   'detach it (`libvirt-gpu detach`) or stop the guest'
                   % req.meta.pgpus[0].address)
    if len(req.meta.vgpus) > allocator_mod.MAX_VGPUS_PER_DOMAIN:
        # refused before the lease lock, which every guest start waits for
        raise exception.MigrationRefused(
            reason='it carries %d vGPUs and this host gives one domain at '
                   'most %d; give the guest fewer vGPUs before migrating it'
                   % (len(req.meta.vgpus),
                      allocator_mod.MAX_VGPUS_PER_DOMAIN))
    found = targets(req)
    held = {t.entry.uuid for t in found}
    for entry in req.meta.vgpus:
        if entry.uuid not in held:
            _check_driver_rules(hook, entry)
    if not found:
        return None
    claims = [allocator_mod.VgpuClaim(uuid=t.entry.uuid,
                                      type_id=t.entry.type_id)
              for t in found]
    doc = _document(req)

    def edit(grants: Sequence[allocator_mod.Grant]) -> None:
        """Inside the reservation's transaction: what raises here undoes
        the reservation."""
        for target, grant in zip(found, grants):
            _check_kind(hook, target, grant)
            _check_driver_rules(hook, target.entry, (target, grant.device))
        for target, grant in zip(found, grants):
            _edit(doc, target, grant.device)
        # what libvirt will start from: well-formed, or nothing reserved
        xmlutil.parse(doc.tobytes(), 'the rewritten domain XML')

    grants = hook.allocator.reserve_incoming(
        req.domain.uuid, claims, time.time() + HOLD_SECONDS,
        pinning=req.domain.pinning, check=edit)
    for target, grant in zip(found, grants):
        device = grant.device
        hook.log.info('incoming vGPU %s (%s) reserved on %s%s' % (
            device.uuid, device.type_id, device.parent,
            '' if device.uuid == target.entry.uuid
            else ' (was %s on the source, taken here)' % target.entry.uuid))
    return doc


def _edit(doc: xmledit.Document, target: Target,
          device: base.VgpuDevice) -> None:
    """Name ``device`` (chosen here) in ``target``'s metadata entry and
    hostdev."""
    if device.uuid != target.entry.uuid:
        doc.set_attribute(target.element, 'uuid', device.uuid)
        if not target.vf:
            doc.set_attribute(target.source, 'uuid', device.uuid)
    moved = (target.entry.parent is not None
             and target.entry.parent != device.parent)
    if moved:       # an entry without parent= keeps "any GPU here"
        doc.set_attribute(target.element, 'parent', str(device.parent))
    if target.vf and moved:
        for name, form in _PCI_FIELDS:
            doc.set_attribute(target.source, name,
                              form % getattr(device.parent, name))
