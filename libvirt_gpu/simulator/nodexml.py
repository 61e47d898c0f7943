"""A profile as a document for libvirt's test driver (``test:///x.xml``).

The document is ``<node>`` holding one ``<device>`` per node device, in
the format of libvirt's ``nodedev.rng``: the ``computer``, every PCI
function (implied bridges included) and every existing mdev::

    <node>
      <device>
        <name>pci_0000_af_00_0</name>
        <parent>pci_0000_ae_00_0</parent>
        <driver><name>nvidia</name></driver>
        <capability type='pci'>
          <class>0x030200</class><domain>0</domain><bus>175</bus>...
          <product id='0x1eb8'>TU104GL [Tesla T4]</product>
          <vendor id='0x10de'>NVIDIA Corporation</vendor>
          <capability type='mdev_types'>
            <type id='nvidia-223'><name>GRID T4-2B</name>
              <deviceAPI>vfio-pci</deviceAPI>
              <availableInstances>6</availableInstances></type>
          </capability>
          <iommuGroup number='58'><address domain='0x0000' .../></iommuGroup>
          <numa node='1'/>
        </capability>
      </device>
      <device>
        <name>mdev_4b20d080_1b54_4048_85b3_a6a62d165c01</name>
        <parent>pci_0000_af_00_0</parent>
        <capability type='mdev'><type id='nvidia-223'/>
          <uuid>4b20d080-1b54-4048-85b3-a6a62d165c01</uuid>
          <iommuGroup number='60'/></capability>
      </device>
    </node>

libvirt 9.0's test driver keeps everything here except ``<driver>``, which
it does not parse; the element is still written because it is what a real
host reports and ``nodedev.rng`` allows it.
"""

import uuid as uuidlib
import xml.etree.ElementTree as ET

from libvirt_gpu import objects
from libvirt_gpu.simulator import capacity

COMPUTER = 'computer'
_UUID_NS = uuidlib.UUID('6f0b9a53-3a43-4c1e-9a0e-4b1d5c6a7e21')


def mdev_name(uuid):
    """``mdev_<uuid with _>`` (libvirt before 7.7; lookups go by UUID)."""
    return 'mdev_' + uuid.replace('-', '_')


def node_xml(profile):
    """The whole ``<node>`` document as a string."""
    node = ET.Element('node')
    for device in device_elements(profile):
        node.append(device)
    ET.indent(node)
    return ET.tostring(node, encoding='unicode') + '\n'


def device_elements(profile):
    """One ``<device>`` element per node device of ``profile``."""
    pci = profile.pci_devices()
    by_addr = {dev.address: dev for dev in pci}
    members = {}
    for dev in pci:
        if dev.iommu_group is not None:
            members.setdefault(dev.iommu_group, []).append(dev.address)
    elements = [_computer(profile)]
    for dev in pci:
        elements.append(_pci_device(dev, by_addr, members,
                                    profile.gpu_mdevs(dev)))
    groups = profile.mdev_iommu_groups()
    for dev in profile.devices:
        for mdev in dev.mdevs:
            elements.append(_mdev_device(dev, mdev, groups[mdev.uuid]))
    return elements


def _sub(parent, tag, text=None, **attrs):
    element = ET.SubElement(parent, tag, attrs)
    if text is not None:
        element.text = text
    return element


def _computer(profile):
    """``<device><name>computer</name><capability type='system'>...``"""
    device = ET.Element('device')
    _sub(device, 'name', COMPUTER)
    cap = _sub(device, 'capability', type='system')
    _sub(cap, 'product', 'Simulated host %s (%s)' % (profile.hostname,
                                                     profile.name))
    hardware = _sub(cap, 'hardware')
    _sub(hardware, 'vendor', 'libvirt-gpu simulator')
    _sub(hardware, 'uuid', str(uuidlib.uuid5(_UUID_NS, profile.name)))
    firmware = _sub(cap, 'firmware')
    _sub(firmware, 'vendor', 'libvirt-gpu simulator')
    return device


def _address(parent, address):
    """``<address domain='0x0000' bus='0xaf' slot='0x00' function='0x0'/>``"""
    pci = objects.PciAddress.parse(address)
    _sub(parent, 'address', domain='0x%04x' % pci.domain,
         bus='0x%02x' % pci.bus, slot='0x%02x' % pci.slot,
         function='0x%x' % pci.function)


def _pci_device(dev, by_addr, members, gpu_mdevs=None):
    """A PCI function.  Only enabled VFs are listed under a PF's
    ``virt_functions`` (``maxCount`` is ``sriov_totalvfs``); a VF's
    vendor-interface types appear nowhere: libvirt's node devices do not
    report NVIDIA's ``nvidia/`` directory."""
    device = ET.Element('device')
    _sub(device, 'name', dev.libvirt_name)
    parent = by_addr.get(dev.parent_bridge)
    _sub(device, 'parent', parent.libvirt_name if parent else COMPUTER)
    if dev.driver:
        _sub(_sub(device, 'driver'), 'name', dev.driver)
    cap = _sub(device, 'capability', type='pci')
    pci = dev.pci_address
    _sub(cap, 'class', dev.class_code)
    for tag in ('domain', 'bus', 'slot', 'function'):
        _sub(cap, tag, str(getattr(pci, tag)))
    _sub(cap, 'product', dev.product_name, id='0x' + dev.product_id)
    _sub(cap, 'vendor', dev.vendor_name, id='0x' + dev.vendor_id)
    if dev.physfn is not None:
        _address(_sub(cap, 'capability', type='phys_function'), dev.physfn)
    if dev.sriov_totalvfs is not None:
        vfs = _sub(cap, 'capability', type='virt_functions',
                   maxCount=str(dev.sriov_totalvfs))
        for vf in dev.enabled_virtfns:
            _address(vfs, vf)
    if dev.is_bridge:
        _sub(cap, 'capability', type='pci-bridge')
    if dev.mdev_types:
        types = _sub(cap, 'capability', type='mdev_types')
        for mtype in dev.mdev_types:
            entry = _sub(types, 'type', id=mtype.id)
            if mtype.name is not None:
                _sub(entry, 'name', mtype.name)
            _sub(entry, 'deviceAPI', mtype.device_api)
            _sub(entry, 'availableInstances', str(
                capacity.available_instances(dev, mtype.id, dev.mdevs,
                                             gpu_mdevs=gpu_mdevs)))
    if dev.iommu_group is not None:
        group = _sub(cap, 'iommuGroup', number=str(dev.iommu_group))
        for address in members[dev.iommu_group]:
            _address(group, address)
    if dev.numa_node >= 0:
        _sub(cap, 'numa', node=str(dev.numa_node))
    return device


def _mdev_device(parent, mdev, iommu_group):
    device = ET.Element('device')
    _sub(device, 'name', mdev_name(mdev.uuid))
    _sub(device, 'parent', parent.libvirt_name)
    cap = _sub(device, 'capability', type='mdev')
    _sub(cap, 'type', id=mdev.type_id)
    _sub(cap, 'uuid', mdev.uuid)
    _sub(cap, 'iommuGroup', number=str(iommu_group))
    return device
