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

Refused (exit 1, one line): a type not enabled here, no room, a whole GPU
passed through (VFIO cannot migrate it), a vGPU that is an mdev on the
source but lives on VFs here (or the reverse).
"""

import time

from libvirt_gpu.store import allocator as allocator_mod
from libvirt_gpu import exception
from libvirt_gpu.virt import metadata

# How long a reservation stands without its prepare (seconds): libvirt runs
# prepare right after migrate, before any memory is copied.
HOLD_SECONDS = 300.0

_NS = '{%s}' % metadata.NAMESPACE
_PCI_FIELDS = (('domain', '0x%04x'), ('bus', '0x%02x'), ('slot', '0x%02x'),
               ('function', '0x%x'))


def _same_uuid(value, uuid):
    """Whether an attribute's text names ``uuid`` (an ``objects.Uuid``,
    parsed with the metadata): compared, not parsed again."""
    return isinstance(value, str) and value.lower() == uuid


def _same_pci(address, pci):
    """Whether an ``<address domain= bus= slot= function=>`` element
    names ``pci`` (an ``objects.PciAddress``): its numbers compared."""
    try:
        return tuple(int(address.attrib.get(name, ''), 16)
                     for name, _ in _PCI_FIELDS) == (
            pci.domain, pci.bus, pci.slot, pci.function)
    except ValueError:
        return False


class Target(object):
    """One vGPU of the incoming domain: its metadata entry, the element of
    that entry and the ``<address>`` of its hostdev's ``<source>``; ``vf``
    when the hostdev hands over a VF (the vendor interface)."""

    __slots__ = ('entry', 'element', 'source', 'vf')

    def __init__(self, entry, element, source, vf):
        self.entry = entry
        self.element = element
        self.source = source
        self.vf = vf


def targets(req):
    """The ``Target`` of each vGPU of ``req``'s metadata that its devices
    hold (in metadata order)."""
    doc = req.document
    gpus = doc.root.find('metadata', _NS + metadata.ROOT)
    elements = gpus.findall(_NS + 'vgpu') if gpus is not None else []
    devices = doc.root.find('devices')
    sources = []
    for hostdev in devices.findall('hostdev') if devices is not None else ():
        source = hostdev.find('source', 'address')
        if source is not None and hostdev.attrib.get(
                'mode', 'subsystem') == 'subsystem':
            sources.append((hostdev.attrib.get('type'), source))
    found = []
    for entry in req.meta.vgpus:
        element = next(e for e in elements
                       if _same_uuid(e.attrib.get('uuid'), entry.uuid))
        # <hostdev type='mdev'> names the vGPU's UUID; type='pci' its VF
        by_uuid = next((s for kind, s in sources if kind == 'mdev'
                        and _same_uuid(s.attrib.get('uuid'), entry.uuid)),
                       None)
        vf = next((s for kind, s in sources if kind == 'pci'
                   and entry.parent is not None
                   and _same_pci(s, entry.parent)), None)
        if by_uuid is not None:
            found.append(Target(entry, element, by_uuid, vf=False))
        elif vf is not None:
            found.append(Target(entry, element, vf, vf=True))
    return found


def _check_kind(hook, target, grant):
    here = hook.vgpus.binds_parent(grant.device.parent)
    if here != target.vf:
        raise exception.MigrationRefused(
            reason='vGPU %s (%s) is %s on the source but %s here; both '
                   'hosts must offer the type the same way'
                   % (target.entry.uuid, target.entry.type_id,
                      'a VF (vendor interface)' if target.vf else 'an mdev',
                      'a VF (vendor interface)' if here else 'an mdev'))


def migrate(hook, req):
    """Reserve this host's vGPUs for the incoming domain ``req`` and
    return its XML edited to name them (see the module doc)."""
    if req.meta.pgpus:
        raise exception.MigrationRefused(
            reason='it holds the whole GPU %s, which VFIO cannot migrate; '
                   'detach it (`libvirt-gpu detach`) or stop the guest'
                   % req.meta.pgpus[0].address)
    found = targets(req)
    if not found:
        return None
    claims = [allocator_mod.VgpuClaim(uuid=t.entry.uuid,
                                      type_id=t.entry.type_id)
              for t in found]
    grants = hook.allocator.reserve_incoming(
        req.domain.uuid, claims, time.time() + HOLD_SECONDS,
        pinning=req.domain.pinning)
    try:
        for target, grant in zip(found, grants):
            _check_kind(hook, target, grant)
    except exception.LibvirtGpuError:
        hook.allocator.forget([g.device.uuid for g in grants])
        raise
    doc = req.document
    for target, grant in zip(found, grants):
        device = grant.device
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
        hook.log.info('incoming vGPU %s (%s) reserved on %s%s' % (
            device.uuid, device.type_id, device.parent,
            '' if device.uuid == target.entry.uuid
            else ' (was %s on the source, taken here)' % target.entry.uuid))
    return doc
