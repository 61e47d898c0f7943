"""The XML we build from ``templates/`` and the device part of domain XML.

Rendering and reading only, no policy (nova's ``virt/libvirt/config.py``
role).  Every value is validated before it is put into a template, and
escaped as well, so a template can never be made to say more than it says.

Templates (``templates/``, installed to ``share/libvirt-gpu/templates``):

* ``hostdev-pci.xml``  a whole GPU (``managed='yes'``: libvirt binds it
  to vfio-pci), or the VF of a vendor-interface vGPU (``managed='no'``)::

    <hostdev mode='subsystem' type='pci' managed='yes'>
      <source><address domain='0x0000' bus='0xaf' slot='0x00'
                       function='0x0'/></source>
    </hostdev>

* ``hostdev-mdev.xml``  a vGPU::

    <hostdev mode='subsystem' type='mdev' managed='no' model='vfio-pci'>
      <source><address uuid='4b20d080-1b54-4048-85b3-a6a62d165c01'/></source>
    </hostdev>

* ``nodedev-mdev.xml``  input of ``virNodeDeviceCreateXML``/``DefineXML``::

    <device>
      <name>mdev_4b20d080_..._0000_af_00_0</name>
      <parent>pci_0000_af_00_0</parent>
      <capability type='mdev'><type id='nvidia-223'/>
        <uuid>4b20d080-1b54-4048-85b3-a6a62d165c01</uuid></capability>
    </device>
"""

from __future__ import annotations

import os
import sys

from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.util import records
from libvirt_gpu.util import xmlutil

TYPE_CHECKING = False
if TYPE_CHECKING:
    import string

    from libvirt_gpu.util.xmlutil import Element

PCI_HOSTDEV = 'hostdev-pci.xml'
MDEV_HOSTDEV = 'hostdev-mdev.xml'
MDEV_NODEDEV = 'nodedev-mdev.xml'

_templates: dict[str, string.Template] = {}
# One escape for every XML we write (xmlutil's, kept light for the hook).
escape = xmlutil.escape


def template_dirs() -> list[str]:
    """Where templates are looked for, in order.

    The source tree (``<repo>/templates``) first, then the data directory
    ``setup.py`` installs (``<prefix>/share/libvirt-gpu/templates``).
    """
    here = os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
    return [os.path.join(here, 'templates'),
            os.path.join(sys.prefix, 'share', 'libvirt-gpu', 'templates'),
            '/usr/local/share/libvirt-gpu/templates',
            '/usr/share/libvirt-gpu/templates']


def _template(name: str) -> string.Template:
    if name not in _templates:
        import string     # here: the hook reads domains, renders none
        for directory in template_dirs():
            path = os.path.join(directory, name)
            if os.path.isfile(path):
                with open(path) as f:
                    _templates[name] = string.Template(f.read())
                break
        else:
            raise exception.ConfigError(
                reason='template %s not found in %s'
                % (name, ', '.join(template_dirs())))
    return _templates[name]


def _render(template_name: str, **values: object) -> str:
    escaped = {k: escape(v) for k, v in values.items()}
    try:
        return _template(template_name).substitute(escaped)
    except (KeyError, ValueError) as e:
        raise exception.ConfigError(
            reason='template %s does not fit its values: %s'
            % (template_name, e))


def pci_hostdev(address: objects.PciAddress, managed: bool = True) -> str:
    """``<hostdev type='pci'>`` of a PCI function: ``managed='yes'`` for a
    whole GPU, ``'no'`` for a function libvirt must leave bound to its
    driver (a VF that holds a vendor-interface vGPU)."""
    pci = objects.typed(address, objects.PciAddress, 'address')
    return _render(PCI_HOSTDEV, managed='yes' if managed else 'no',
                   domain='0x%04x' % pci.domain,
                   bus='0x%02x' % pci.bus, slot='0x%02x' % pci.slot,
                   function='0x%x' % pci.function)


def mdev_hostdev(uuid: objects.Uuid) -> str:
    """``<hostdev type='mdev' model='vfio-pci'>`` of a vGPU."""
    return _render(MDEV_HOSTDEV,
                   uuid=objects.typed(uuid, objects.Uuid, 'uuid'))


def mdev_nodedev_name(uuid: objects.Uuid,
                      parent: objects.PciAddress) -> str:
    """The name libvirt >= 7.7 gives an mdev: ``mdev_<uuid_>_<parent_>``.

    Only written into create/define input, which libvirt ignores the name
    of; lookups always go by UUID.
    """
    pci = objects.typed(parent, objects.PciAddress, 'parent')
    return 'mdev_%s_%s' % (objects.typed(uuid, objects.Uuid,
                                         'uuid').replace('-', '_'),
                           pci.libvirt_name[len('pci_'):])


def mdev_nodedev(parent: objects.PciAddress, type_id: objects.TypeId,
                 uuid: objects.Uuid) -> str:
    """Node-device XML that asks libvirt to create/define an mdev."""
    pci = objects.typed(parent, objects.PciAddress, 'parent')
    return _render(MDEV_NODEDEV, name=mdev_nodedev_name(uuid, pci),
                   parent=pci.libvirt_name,
                   type_id=objects.typed(type_id, objects.TypeId, 'type_id'),
                   uuid=uuid)


# --- reading domain XML ----------------------------------------------------

@records.record
class DomainDevices:
    """Who a domain is and which host devices it names.

    Read from (an element tree of) domain XML::

        <domain><name>vm1</name><uuid>...</uuid>
          <devices>
            <hostdev mode='subsystem' type='mdev' ...>
              <source><address uuid='...'/></source></hostdev>
            <hostdev mode='subsystem' type='pci' ...>
              <source><address domain='0x0000' bus='0xaf' slot='0x00'
                               function='0x0'/></source></hostdev>
    """

    uuid: objects.Uuid
    name: str
    mdev_uuids: tuple[objects.Uuid, ...] = ()
    pci_addresses: tuple[objects.PciAddress, ...] = ()
    # <numatune><memory nodeset='1'/></numatune>, <vcpu cpuset='16-31'>
    pinning: objects.NumaPinning = objects.UNPINNED


def _hex_attr(elem: Element, name: str) -> int:
    value = elem.get(name)
    if value is None:
        raise exception.InvalidXml(
            reason='<hostdev type=\'pci\'> source address lacks %s' % name)
    try:
        if not value.lower().startswith('0x'):
            raise ValueError(value)
        return int(value[2:], 16)
    except ValueError:
        raise exception.InvalidXml(
            reason='<hostdev type=\'pci\'> source address %s=%r is not '
                   'hex' % (name, value[:40]))


def _pci_source(address: Element) -> objects.PciAddress:
    """``<address domain='0x0000' bus='0xaf' slot='0x00' function='0x0'/>``"""
    parts = [_hex_attr(address, n)
             for n in ('domain', 'bus', 'slot', 'function')]
    if parts[0] > 0xffffffff or parts[1] > 0xff or parts[2] > 0x1f \
            or parts[3] > 0x7:
        raise exception.InvalidXml(
            reason='<hostdev type=\'pci\'> source address out of range')
    return objects.PciAddress(*parts)


def read_domain(root: Element) -> DomainDevices:
    """``DomainDevices`` of a parsed ``<domain>`` (an ElementTree element,
    ``xmlutil.parse``)."""
    if root.tag != 'domain':
        raise exception.InvalidXml(reason='root element is <%s>, not '
                                          '<domain>' % str(root.tag)[:40])
    text = root.findtext('uuid')
    if text is None:
        raise exception.InvalidXml(reason='domain XML has no <uuid>')
    uuid = objects.Uuid.parse(text.strip())
    mdevs: list[objects.Uuid] = []
    pcis: list[objects.PciAddress] = []
    for hostdev in root.iterfind('devices/hostdev'):
        if hostdev.get('mode', 'subsystem') != 'subsystem':
            continue
        address = hostdev.find('source/address')
        kind = hostdev.get('type')
        if kind == 'mdev':
            if address is None or address.get('uuid') is None:
                raise exception.InvalidXml(
                    reason="<hostdev type='mdev'> has no <source><address "
                           "uuid=.../>")
            mdevs.append(objects.Uuid.parse(address.get('uuid')))
        elif kind == 'pci' and address is not None:
            pcis.append(_pci_source(address))
    return DomainDevices(uuid=uuid, name=(root.findtext('name') or ''),
                         mdev_uuids=tuple(mdevs), pci_addresses=tuple(pcis),
                         pinning=read_pinning(root))


def read_pinning(root: Element) -> objects.NumaPinning:
    """``objects.NumaPinning`` of a parsed ``<domain>``: the nodeset of
    ``<numatune><memory>`` and the cpuset of ``<vcpu>``."""
    memory = root.find('numatune/memory')
    vcpu = root.find('vcpu')
    nodeset = memory.get('nodeset') if memory is not None else None
    cpuset = vcpu.get('cpuset') if vcpu is not None else None
    if not nodeset and not cpuset:
        return objects.UNPINNED
    try:
        return objects.NumaPinning(
            nodes=objects.parse_cpulist(nodeset, '<numatune> nodeset'),
            cpus=objects.parse_cpulist(cpuset, '<vcpu> cpuset'))
    except exception.InvalidInput as e:
        raise exception.InvalidXml(reason=e.kwargs['reason'])
