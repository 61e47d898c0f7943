"""libvirt node-device XML -> records.  Parsing only, no policy.

A PCI node device (libvirt ``nodedev.rng``)::

    <device>
      <name>pci_0000_af_00_0</name>
      <parent>pci_0000_ae_00_0</parent>
      <driver><name>nvidia</name></driver>
      <capability type='pci'>
        <class>0x030200</class>
        <domain>0</domain><bus>175</bus><slot>0</slot><function>0</function>
        <product id='0x1eb8'>TU104GL [Tesla T4]</product>
        <vendor id='0x10de'>NVIDIA Corporation</vendor>
        <capability type='mdev_types'>
          <type id='nvidia-223'><name>GRID T4-2B</name>
            <deviceAPI>vfio-pci</deviceAPI>
            <availableInstances>8</availableInstances></type>
        </capability>
        <capability type='virt_functions' maxCount='16'>...
        <capability type='phys_function'><address .../></capability>
        <iommuGroup number='58'>...</iommuGroup>
        <numa node='1'/>
      </capability>
    </device>

An mdev node device::

    <device>
      <name>mdev_<uuid with _>[_<parent address>]</name>
      <parent>pci_0000_af_00_0</parent>
      <capability type='mdev'><type id='nvidia-223'/><uuid>...</uuid>
        <iommuGroup number='...'/></capability>
    </device>
"""


from __future__ import annotations

from libvirt_gpu.util import bounds
from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.util import records
from libvirt_gpu.util import xmlutil

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from libvirt_gpu.util.xmlutil import Element


@records.record
class MdevNode:
    """An mdev node device as libvirt describes it.

    ``parent`` is None when libvirt names no PCI parent (``computer``: it
    did not see the parent device, e.g. a parent without a ``config``).
    """

    name: str
    parent: objects.PciAddress | None
    mdev: objects.Mdev


def _text(elem: Element, path: str) -> str | None:
    found = elem.find(path)
    if found is None or found.text is None:
        return None
    return found.text.strip()


def _required(elem: Element, path: str) -> str:
    """The text of ``path``, which libvirt always writes (ValueError,
    naming it, when it is missing: not a libvirt node device)."""
    found = _text(elem, path)
    if found is None:
        raise ValueError('node-device XML has no %s' % path)
    return found


def _element(elem: Element, path: str) -> Element:
    """The element at ``path``, which libvirt always writes (ValueError,
    naming it, when it is missing)."""
    found = elem.find(path)
    if found is None:
        raise ValueError('node-device XML has no %s' % path)
    return found


def _attr(elem: Element, name: str) -> str:
    found = elem.get(name)
    if found is None:
        raise ValueError('node-device XML: <%s> has no %s' % (elem.tag, name))
    return found


def _instances(elem: Element, type_id: objects.TypeId) -> int:
    """``availableInstances`` of a type, at most bounds.MAX_INSTANCES."""
    text = _text(elem, 'availableInstances') or '0'
    if not (text.isascii() and text.isdigit()) or len(text) > 19:
        raise exception.InvalidInput(
            reason='availableInstances of vGPU type %s is %r, not a count'
                   % (type_id, text[:40]))
    return bounds.check_instances(
        int(text), 'availableInstances of vGPU type %s' % type_id)


def _address(elem: Element) -> objects.PciAddress:
    """``<address domain='0x0000' bus='0xaf' slot='0x00' function='0x0'/>``"""
    return objects.PciAddress(int(_attr(elem, 'domain'), 16),
                              int(_attr(elem, 'bus'), 16),
                              int(_attr(elem, 'slot'), 16),
                              int(_attr(elem, 'function'), 16))


def pci_class(xml: str) -> str | None:
    """Return the ``<class>`` of a PCI node device (``0x030200``)."""
    root = xmlutil.parse(xml, 'node-device XML')
    return _text(root, "capability[@type='pci']/class")


def _pci_address(cap: Element) -> objects.PciAddress:
    return objects.PciAddress(int(_required(cap, 'domain')),
                              int(_required(cap, 'bus')),
                              int(_required(cap, 'slot')),
                              int(_required(cap, 'function')))


def parse_function(xml: str) -> objects.IommuMember:
    """Any PCI node device as an IommuMember: address, ids, class and
    driver (None where libvirt reports none)."""
    root = xmlutil.parse(xml, 'node-device XML')
    cap = root.find("capability[@type='pci']")
    if cap is None:
        raise ValueError('%s is not a PCI device' % _text(root, 'name'))
    vendor = cap.find('vendor')
    product = cap.find('product')
    return objects.IommuMember(
        address=_pci_address(cap),
        vendor_id=(objects.normalize_hex_id(vendor.get('id'))
                   if vendor is not None else None),
        product_id=(objects.normalize_hex_id(product.get('id'))
                    if product is not None else None),
        class_code=_text(cap, 'class'),
        driver=_text(root, 'driver/name'))


def parse_pci(xml: str, descriptions: Mapping[str, str] | None = None
              ) -> objects.Gpu:
    """Build a Gpu from a PCI node device's XML.

    libvirt does not report a type's description; ``descriptions`` maps a
    type id to one read elsewhere (sysfs) when the caller has it.
    """
    root = xmlutil.parse(xml, 'node-device XML')
    cap = root.find("capability[@type='pci']")
    if cap is None:
        raise ValueError('%s is not a PCI device' % _text(root, 'name'))
    address = _pci_address(cap)
    vendor = _element(cap, 'vendor')
    product = _element(cap, 'product')
    numa = cap.find('numa')
    group = cap.find('iommuGroup')
    physfn = cap.find("capability[@type='phys_function']/address")
    descriptions = descriptions or {}
    types = []
    for t in cap.iterfind("capability[@type='mdev_types']/type"):
        type_id = objects.TypeId.parse(t.get('id'))
        types.append(objects.VgpuType(
            id=type_id,
            name=_text(t, 'name'),
            description=descriptions.get(type_id),
            device_api=_text(t, 'deviceAPI'),
            available_instances=_instances(t, type_id),
        ))
    node = int(_attr(numa, 'node')) if numa is not None else -1
    members = () if group is None else tuple(sorted(
        objects.IommuMember(address=_address(a), vendor_id=None,
                            product_id=None, class_code=None, driver=None)
        for a in group.iterfind('address')))
    return objects.Gpu(
        address=address,
        vendor_id=objects.normalize_hex_id(vendor.get('id')),
        product_id=objects.normalize_hex_id(product.get('id')),
        class_code=_text(cap, 'class'),
        driver=_text(root, 'driver/name'),
        numa_node=node if node >= 0 else None,     # -1: unknown
        iommu_group=(int(_attr(group, 'number')) if group is not None
                     else None),
        vendor_name=(vendor.text or '').strip() or None,
        product_name=(product.text or '').strip() or None,
        physfn=_address(physfn) if physfn is not None else None,
        virtfns=tuple(sorted(_address(a) for a in cap.iterfind(
            "capability[@type='virt_functions']/address"))),
        mdev_types=tuple(sorted(types, key=lambda m: m.id)),
        iommu_members=members,
    )


def parse_mdev(xml: str) -> MdevNode:
    """Build an MdevNode from an mdev node device's XML."""
    root = xmlutil.parse(xml, 'node-device XML')
    name = _required(root, 'name')
    cap = root.find("capability[@type='mdev']")
    if cap is None:
        raise ValueError('%s is not an mdev' % name)
    uuid = _text(cap, 'uuid')
    if uuid is None:
        # libvirt < 7.7 has no <uuid>: the name is mdev_<uuid with _>.
        uuid = name[len('mdev_'):len('mdev_') + 36].replace('_', '-')
    type_elem = _element(cap, 'type')
    try:
        parent = objects.PciAddress.from_libvirt_name(_text(root, 'parent'))
    except exception.InvalidPciAddress:
        parent = None
    return MdevNode(
        name=name,
        parent=parent,
        mdev=objects.Mdev(uuid=objects.Uuid.parse(uuid),
                          type_id=objects.TypeId.parse(type_elem.get('id'))),
    )
