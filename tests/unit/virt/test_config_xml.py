"""templates/ rendered by config_xml, validated with libvirt's own schemas,
and domain XML read back."""

import os

import pytest
from lxml import etree

from libvirt_gpu.virt import config_xml
from libvirt_gpu import exception
from libvirt_gpu.virt import metadata
from libvirt_gpu import objects
from libvirt_gpu.util import xmlutil

SCHEMAS = '/usr/share/libvirt/schemas'
AF = objects.PciAddress.parse('0000:af:00.0')
T223 = objects.TypeId.parse('nvidia-223')
UUID = objects.Uuid.parse('4b20d080-1b54-4048-85b3-a6a62d165c01')
DOMAIN_UUID = objects.Uuid.parse('c7a5fdbd-cdaf-9455-926a-d65c16db1809')

needs_schemas = pytest.mark.skipif(
    not os.path.isfile(os.path.join(SCHEMAS, 'domain.rng')),
    reason='libvirt schemas not installed (Debian package libvirt-daemon '
           'or libvirt-clients); `make deps` installs them')


def _schema(name):
    return etree.RelaxNG(etree.parse(os.path.join(SCHEMAS, name)))


def domain_with(devices, meta=''):
    """A minimal domain holding ``devices`` (and ``<metadata>``)."""
    return ("<domain type='kvm'><name>vm1</name><uuid>%s</uuid>%s"
            "<memory unit='KiB'>65536</memory>"
            "<os><type arch='x86_64' machine='pc'>hvm</type></os>"
            "<devices>%s</devices></domain>"
            % (DOMAIN_UUID, '<metadata>%s</metadata>' % meta if meta else '',
               devices))


@needs_schemas
def test_hostdevs_validate_against_domain_rng():
    schema = _schema('domain.rng')
    meta = metadata.render_document(metadata.GpuMetadata(
        vgpus=(metadata.VgpuEntry(UUID, T223,
                                  objects.PciAddress.parse('0000:af:00.0')),),
        pgpus=(metadata.PgpuEntry(objects.PciAddress.parse(
            '0000:3b:00.0')),)))
    doc = etree.fromstring(domain_with(
        config_xml.pci_hostdev(objects.PciAddress.parse('0000:3b:00.0'))
        + config_xml.mdev_hostdev(UUID), meta))
    assert schema.validate(doc), schema.error_log


@needs_schemas
def test_schema_check_is_real():
    # The same check fails for a hostdev libvirt would refuse (no model).
    schema = _schema('domain.rng')
    bad = ("<hostdev mode='subsystem' type='mdev' managed='no' "
           "model='not-a-model'><source><address uuid='%s'/></source>"
           "</hostdev>" % UUID)
    assert not schema.validate(etree.fromstring(domain_with(bad)))


@needs_schemas
def test_nodedev_validates_against_nodedev_rng():
    schema = _schema('nodedev.rng')
    doc = etree.fromstring(config_xml.mdev_nodedev(
        objects.PciAddress.parse('0000:af:00.0'), T223, UUID))
    assert schema.validate(doc), schema.error_log
    assert doc.findtext('parent') == 'pci_0000_af_00_0'
    assert doc.find('capability/type').get('id') == 'nvidia-223'
    assert doc.findtext('capability/uuid') == UUID
    assert doc.findtext('name') == ('mdev_%s_0000_af_00_0'
                                    % UUID.replace('-', '_'))


def test_pci_hostdev_fields():
    elem = etree.fromstring(config_xml.pci_hostdev(
        objects.PciAddress.parse('0001:AF:1f.7')))
    assert elem.get('managed') == 'yes' and elem.get('type') == 'pci'
    assert dict(elem.find('source/address').attrib) == {
        'domain': '0x0001', 'bus': '0xaf', 'slot': '0x1f',
        'function': '0x7'}


def test_mdev_hostdev_fields():
    elem = etree.fromstring(config_xml.mdev_hostdev(
        objects.Uuid.parse(UUID.upper())))
    assert elem.get('model') == 'vfio-pci' and elem.get('managed') == 'no'
    assert elem.find('source/address').get('uuid') == UUID


@pytest.mark.parametrize('func,args', [
    (config_xml.mdev_hostdev, ("x'/><evil/>",)),
    (config_xml.mdev_hostdev, (str(UUID),)),
    (config_xml.pci_hostdev, ('0000:af:00.0\n',)),
    (config_xml.mdev_nodedev, (AF, "t'/><x", UUID)),
    (config_xml.mdev_nodedev, (AF, 'nvidia-223', UUID)),
    (config_xml.mdev_nodedev, ('../af:00.0', T223, UUID)),
])
def test_render_refuses_raw_text(func, args):
    # Rendering takes values parsed where they entered; text, even good
    # text, never reaches the XML.
    with pytest.raises(TypeError, match=r'objects\.\w+\.parse'):
        func(*args)


def test_read_domain():
    root = xmlutil.parse(domain_with(
        config_xml.mdev_hostdev(UUID) + config_xml.pci_hostdev(
            objects.PciAddress.parse('0000:3b:00.0'))
        + "<hostdev mode='capabilities' type='storage'><source><block>"
          "/dev/sdf1</block></source></hostdev>"))
    devs = config_xml.read_domain(root)
    assert devs.uuid == DOMAIN_UUID and devs.name == 'vm1'
    assert devs.mdev_uuids == (UUID,)
    assert devs.pci_addresses == (objects.PciAddress.parse('0000:3b:00.0'),)


@pytest.mark.parametrize('devices,match', [
    ("<hostdev mode='subsystem' type='mdev' model='vfio-pci'><source>"
     "<address uuid='../../x'/></source></hostdev>", 'not a UUID'),
    ("<hostdev mode='subsystem' type='mdev' model='vfio-pci'><source/>"
     "</hostdev>", 'no <source>'),
    ("<hostdev mode='subsystem' type='pci'><source><address domain='0x0' "
     "bus='0xzz' slot='0x0' function='0x0'/></source></hostdev>", 'hex'),
    ("<hostdev mode='subsystem' type='pci'><source><address domain='0x0' "
     "bus='0x1' slot='0x40' function='0x0'/></source></hostdev>", 'range'),
])
def test_read_domain_refuses_bad_hostdevs(devices, match):
    with pytest.raises(exception.InvalidInput, match=match):
        config_xml.read_domain(xmlutil.parse(domain_with(devices)))


def test_read_domain_refuses_bad_domain_uuid():
    with pytest.raises(exception.InvalidUuid):
        config_xml.read_domain(xmlutil.parse(
            domain_with('').replace(DOMAIN_UUID, 'c7a5fdbd\n../../..')))
