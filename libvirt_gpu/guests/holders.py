"""Which domain holds each vGPU: the one rule ``libvirt-gpu list`` and the
exporter say it by.

A vGPU's holder is its lease's domain, else the domain that borrowed it
(an incoming migration's), else the running domain whose XML names it
(read through libvirt: Cyborg's and Nova's vGPUs have no lease of ours).
Cheap to import (the CLI's ``list`` pays for nothing else): no libvirt,
no ``prometheus_client``; the connection is handed in.
"""

from libvirt_gpu import exception
from libvirt_gpu.util import records


@records.record
class DomainView:
    """What the running domains use, read through libvirt."""

    names: dict           # domain UUID -> name (every domain)
    vgpus: dict           # vGPU UUID -> UUID of the running domain using it
    pci: dict             # PCI address -> UUID of the running domain


def read_domains(host):
    """``DomainView`` of ``host`` (``host.Host``)."""
    names, vgpus, pci = {}, {}, {}
    for guest in host.list_guests():
        try:
            uuid = guest.uuid
            names[uuid] = guest.name
            if not guest.is_active():
                continue
            devices, meta = guest.devices()
        except (exception.DomainNotFound, exception.InvalidInput):
            continue          # gone while we listed, or XML we refuse
        for vgpu in set(devices.mdev_uuids) | {v.uuid for v in meta.vgpus}:
            vgpus[vgpu] = uuid
        for address in devices.pci_addresses:
            pci[address] = uuid
    return DomainView(names=names, vgpus=vgpus, pci=pci)


def holder(uuid, leases, borrowed, domains):
    """``(domain name, domain UUID)`` holding the vGPU ``uuid`` (``''``
    where unknown): its lease's domain, else the domain that borrowed it,
    else the running domain using it (libvirt); the name from libvirt.

    :param leases: ``{vGPU UUID: Lease}``.
    :param borrowed: ``LeaseStore`` ``Transaction.borrowed()``.
    :param domains: ``DomainView``, or None (no libvirt).
    """
    lease = leases.get(uuid)
    dom = (lease.domain_uuid if lease is not None
           else (borrowed.get(uuid) or (None,))[0])
    if dom is None and domains is not None:
        dom = domains.vgpus.get(uuid)
    name = domains.names.get(dom, '') if domains and dom else ''
    return name, dom or ''
