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
import sys
from tests.doubles import paths

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


# --- What ``make mutation`` found open (docs/dev/mutation.md) ---
# What the XML we write and the devices we read from a domain promise that
# test_xml left open: each test here fails on a change ``make mutation`` made
# to virt/config_xml.py that the rest stayed green on (docs/dev/mutation.md):
# the exact text handed to libvirt, the bounds of each address field, and the
# whole refusal a user reads.

UUID2 = objects.Uuid.parse('b1ae8bf6-38b0-4c81-9d44-78ce3f520496')
ADDRESS = objects.PciAddress.parse('0001:af:1f.7')
TYPE = objects.TypeId.parse('nvidia-223')
REPO = paths.ROOT


@pytest.mark.parametrize('managed,word', [(True, 'yes'), (False, 'no')])
def test_pci_hostdev_exact_text(managed, word):
    assert config_xml.pci_hostdev(ADDRESS, managed=managed) == (
        "<hostdev mode='subsystem' type='pci' managed='%s'>\n"
        "  <source>\n"
        "    <address domain='0x0001' bus='0xaf' slot='0x1f' "
        "function='0x7'/>\n"
        "  </source>\n"
        "</hostdev>\n" % word)
    assert "managed='yes'" in config_xml.pci_hostdev(ADDRESS)


def test_mdev_hostdev_exact_text():
    assert config_xml.mdev_hostdev(UUID) == (
        "<hostdev mode='subsystem' type='mdev' managed='no' "
        "model='vfio-pci'>\n"
        "  <source>\n"
        "    <address uuid='%s'/>\n"
        "  </source>\n"
        "</hostdev>\n" % UUID)


def test_mdev_nodedev_exact_text():
    assert config_xml.mdev_nodedev_name(UUID, ADDRESS) == (
        'mdev_4b20d080_1b54_4048_85b3_a6a62d165c01_0001_af_1f_7')
    assert config_xml.mdev_nodedev(ADDRESS, TYPE, UUID) == (
        "<device>\n"
        "  <name>mdev_4b20d080_1b54_4048_85b3_a6a62d165c01_0001_af_1f_7"
        "</name>\n"
        "  <parent>pci_0001_af_1f_7</parent>\n"
        "  <capability type='mdev'>\n"
        "    <type id='nvidia-223'/>\n"
        "    <uuid>4b20d080-1b54-4048-85b3-a6a62d165c01</uuid>\n"
        "  </capability>\n"
        "</device>\n")


@pytest.mark.parametrize('call,what,kind', [
    (lambda: config_xml.pci_hostdev(str(ADDRESS)), 'address', 'PciAddress'),
    (lambda: config_xml.mdev_hostdev(str(UUID)), 'uuid', 'Uuid'),
    (lambda: config_xml.mdev_nodedev_name(UUID, str(ADDRESS)), 'parent',
     'PciAddress'),
    (lambda: config_xml.mdev_nodedev_name(str(UUID), ADDRESS), 'uuid',
     'Uuid'),
    (lambda: config_xml.mdev_nodedev(str(ADDRESS), TYPE, UUID), 'parent',
     'PciAddress'),
    (lambda: config_xml.mdev_nodedev(ADDRESS, str(TYPE), UUID), 'type_id',
     'TypeId'),
])
def test_raw_text_is_refused_by_name(call, what, kind):
    with pytest.raises(TypeError) as info:
        call()
    assert str(info.value).startswith('%s must be an objects.%s, not str'
                                      % (what, kind))


def test_template_dirs_in_order():
    assert config_xml.template_dirs() == [
        os.path.join(REPO, 'templates'),
        os.path.join(sys.prefix, 'share', 'libvirt-gpu', 'templates'),
        '/usr/local/share/libvirt-gpu/templates',
        '/usr/share/libvirt-gpu/templates']


def test_a_missing_template_is_named_with_every_place_looked_in():
    with pytest.raises(exception.ConfigError) as info:
        config_xml._template('no-such.xml')
    assert str(info.value) == (
        'Configuration error: template no-such.xml not found in %s'
        % ', '.join(config_xml.template_dirs()))


def test_a_template_without_its_values_is_refused_whole():
    with pytest.raises(exception.ConfigError) as info:
        config_xml._render(config_xml.PCI_HOSTDEV, managed='yes')
    assert str(info.value) == ("Configuration error: template "
                               "hostdev-pci.xml does not fit its values: "
                               "'domain'")


def test_values_are_escaped():
    text = config_xml._render(config_xml.MDEV_HOSTDEV, uuid='a\'<&">')
    assert "uuid='a&apos;&lt;&amp;&quot;&gt;'" in text


def _domain(devices='', extra='', uuid=' %s ' % UUID, name='<name>v</name>',
            root='domain'):
    return xmlutil.parse('<%s>%s<uuid>%s</uuid>%s<devices>%s</devices></%s>'
                         % (root, name, uuid, extra, devices, root))


def _pci(domain='0x0001', bus='0xaf', slot='0x1f', function='0x7',
         mode=''):
    attrs = ''.join(" %s='%s'" % (k, v) for k, v in (
        ('domain', domain), ('bus', bus), ('slot', slot),
        ('function', function)) if v is not None)
    return ("<hostdev%s type='pci'><source><address%s/></source></hostdev>"
            % (mode, attrs))


def _mdev(uuid, mode=''):
    return ("<hostdev%s type='mdev'><source><address uuid='%s'/></source>"
            "</hostdev>" % (mode, uuid))


def test_read_domain_every_field_in_order():
    found = config_xml.read_domain(_domain(
        _mdev(UUID2) + _pci() + _mdev(str(UUID).upper(),
                                      mode=" mode='subsystem'") +
        _pci(domain='0X0', bus='0x3B', slot='0x0', function='0x0') +
        _pci(mode=" mode='capabilities'") + _mdev(UUID2, mode=" mode='x'") +
        "<hostdev type='pci'/><hostdev type='usb'><source><address "
        "bus='0x1' device='0x2'/></source></hostdev>"))
    assert found == config_xml.DomainDevices(
        uuid=UUID, name='v', mdev_uuids=(UUID2, UUID),
        pci_addresses=(ADDRESS, objects.PciAddress.parse('0000:3b:00.0')),
        pinning=objects.UNPINNED)


def test_read_domain_without_a_name_is_named_empty():
    assert config_xml.read_domain(_domain(name='')).name == ''


@pytest.mark.parametrize('fields,ok', [
    (dict(domain='0xffffffff', bus='0xff', slot='0x1f', function='0x7'),
     True),
    (dict(domain='0x100000000'), False), (dict(bus='0x100'), False),
    (dict(slot='0x20'), False), (dict(function='0x8'), False)])
def test_a_pci_source_address_up_to_each_bound(fields, ok):
    root = _domain(_pci(**fields))
    if ok:
        assert config_xml.read_domain(root).pci_addresses == (
            objects.PciAddress(0xffffffff, 0xff, 0x1f, 7),)
        return
    with pytest.raises(exception.InvalidXml) as info:
        config_xml.read_domain(root)
    assert str(info.value) == ("Refused XML: <hostdev type='pci'> source "
                               "address out of range")


@pytest.mark.parametrize('fields,reason', [
    (dict(domain=None), "<hostdev type='pci'> source address lacks domain"),
    (dict(bus=None), "<hostdev type='pci'> source address lacks bus"),
    (dict(slot=None), "<hostdev type='pci'> source address lacks slot"),
    (dict(function=None),
     "<hostdev type='pci'> source address lacks function"),
    (dict(bus='ff'), "<hostdev type='pci'> source address bus='ff' is not "
                     "hex"),
    (dict(slot='0x'), "<hostdev type='pci'> source address slot='0x' is not "
                      "hex"),
    (dict(function='0xg'), "<hostdev type='pci'> source address "
                           "function='0xg' is not hex"),
    (dict(domain='0x' + 'z' * 50), "<hostdev type='pci'> source address "
                                   "domain='0x%s' is not hex" % ('z' * 38)),
    (dict(), None),
])
def test_a_pci_source_address_refusal_reads_whole(fields, reason):
    root = _domain(_pci(**fields))
    if reason is None:
        assert config_xml.read_domain(root).pci_addresses == (ADDRESS,)
        return
    with pytest.raises(exception.InvalidXml) as info:
        config_xml.read_domain(root)
    assert str(info.value) == 'Refused XML: ' + reason


@pytest.mark.parametrize('devices', [
    "<hostdev type='mdev'/>",
    "<hostdev type='mdev'><source><address/></source></hostdev>"])
def test_an_mdev_hostdev_without_its_uuid_is_refused_whole(devices):
    with pytest.raises(exception.InvalidXml) as info:
        config_xml.read_domain(_domain(devices))
    assert str(info.value) == ("Refused XML: <hostdev type='mdev'> has no "
                               "<source><address uuid=.../>")


def test_read_domain_refusals_read_whole():
    with pytest.raises(exception.InvalidXml) as info:
        config_xml.read_domain(_domain(root='d' * 50))
    assert str(info.value) == ('Refused XML: root element is <%s>, not '
                               '<domain>' % ('d' * 40))
    with pytest.raises(exception.InvalidXml) as info:
        config_xml.read_domain(xmlutil.parse('<domain><name>v</name>'
                                             '</domain>'))
    assert str(info.value) == 'Refused XML: domain XML has no <uuid>'


@pytest.mark.parametrize('extra,nodes,cpus', [
    ('', (), ()),
    ("<numatune><memory nodeset=''/></numatune><vcpu cpuset=''>2</vcpu>",
     (), ()),
    ("<vcpu>2</vcpu><numatune><memory/></numatune>", (), ()),
    ("<numatune><memory nodeset='1'/></numatune>", ((1, 1),), ()),
    ("<vcpu cpuset='0-3'>4</vcpu>", (), ((0, 3),)),
    ("<numatune><memory nodeset='0,2'/></numatune>"
     "<vcpu cpuset='16-31'>4</vcpu>", ((0, 0), (2, 2)), ((16, 31),)),
])
def test_read_pinning(extra, nodes, cpus):
    pinning = config_xml.read_domain(_domain(extra=extra)).pinning
    assert pinning.nodes.ranges == nodes
    assert pinning.cpus.ranges == cpus


def test_a_pinning_that_is_not_a_list_is_refused_whole():
    with pytest.raises(exception.InvalidXml) as info:
        config_xml.read_domain(_domain(extra="<vcpu cpuset='0-3,x'>4</vcpu>"))
    assert str(info.value) == (
        "Refused XML: <vcpu> cpuset '0-3,x' is not a list of numbers and "
        "ranges (0-15,32) below 65536")
    with pytest.raises(exception.InvalidXml) as info:
        config_xml.read_domain(_domain(
            extra="<numatune><memory nodeset='y'/></numatune>"))
    assert str(info.value).startswith("Refused XML: <numatune> nodeset 'y'")


def test_a_template_is_read_from_the_first_place_that_has_it(monkeypatch):
    monkeypatch.setattr(config_xml, '_templates', {})
    with open(os.path.join(REPO, 'templates', 'hostdev-mdev.xml')) as f:
        expected = f.read().replace('$uuid', str(UUID))
    assert config_xml.mdev_hostdev(UUID) == expected


def test_hostdevs_after_one_skipped_are_still_read():
    found = config_xml.read_domain(_domain(
        _pci(mode=" mode='capabilities'") + "<hostdev type='pci'/>" +
        "<hostdev type='usb'/>" + _mdev(UUID2) + _pci()))
    assert found.mdev_uuids == (UUID2,)
    assert found.pci_addresses == (ADDRESS,)
