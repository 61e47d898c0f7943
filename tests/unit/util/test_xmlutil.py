import pytest

from libvirt_gpu import exception
from libvirt_gpu.util import xmlutil

HOSTILE = [
    # external entity
    '<!DOCTYPE d [<!ENTITY x SYSTEM "file:///etc/passwd">]><d>&x;</d>',
    # billion laughs
    '<!DOCTYPE d [<!ENTITY a "aaaa"><!ENTITY b "&a;&a;&a;&a;">]><d>&b;</d>',
    # a DOCTYPE alone
    '<!DOCTYPE domain SYSTEM "http://example.invalid/x.dtd"><domain/>',
    # malformed
    '<domain><name>x</domain>',
    '',
    # a DOCTYPE the byte search cannot see: the parser refuses it
    '<!DOCTYPE d [<!ENTITY x "y">]><d>&x;</d>'.encode('utf-16'),
    # an entity never declared
    '<d>&x;</d>',
]


@pytest.mark.parametrize('text', HOSTILE)
def test_hostile_refused(text):
    with pytest.raises(exception.InvalidXml):
        xmlutil.parse(text)


def test_oversize_refused():
    with pytest.raises(exception.InvalidXml, match='bytes'):
        xmlutil.parse('<d>' + 'x' * 100 + '</d>', max_bytes=64)


def test_parses_plain_xml():
    root = xmlutil.parse("<domain type='kvm'><name>g</name></domain>")
    assert root.findtext('name') == 'g'


def test_comments_and_processing_instructions_dropped():
    root = xmlutil.parse('<d><!-- c --><?pi x?><e a="1"/></d>')
    assert [child.tag for child in root] == ['e']


def test_utf16_document_parsed():
    root = xmlutil.parse("<domain><name>g</name></domain>".encode('utf-16'))
    assert root.findtext('name') == 'g'


# --- the element tree answers as ElementTree's does ------------------------

_DOC = (
    "<domain type='kvm' xmlns:gpu='urn:libvirt-gpu:1'>\n"
    "  <name>g &amp; h</name>\n  <uuid>u</uuid><empty/>\n"
    "  <metadata><gpu:gpus v='1'><gpu:vgpu uuid='a'/>tail"
    "<gpu:vgpu uuid='b'/></gpu:gpus><other xmlns='http://x.example/a/b'>"
    "<y/></other></metadata>\n"
    "  <devices><hostdev mode='subsystem' type='mdev'><source>"
    "<address uuid='1'/></source></hostdev>text<hostdev type='pci'>"
    "<source><address domain='0x0000' bus='0x41'/></source></hostdev>"
    "<capability type='pci'><x/></capability><capability type='mdev'/>"
    "</devices>\n</domain>")

_PATHS = [
    'name', 'uuid', 'empty', 'missing', 'devices', 'devices/hostdev',
    'devices/hostdev/source/address', './devices/hostdev', '*', '*/hostdev',
    'devices/*', "devices/hostdev[@type='pci']", 'devices/hostdev[@mode]',
    'devices/hostdev[@type="mdev"]/source',
    "devices/capability[@type='pci']/x",
    "devices/capability[@type='nope']", 'metadata/{urn:libvirt-gpu:1}gpus',
    'metadata/{urn:libvirt-gpu:1}gpus/{urn:libvirt-gpu:1}vgpu',
    'metadata/{http://x.example/a/b}other/{http://x.example/a/b}y',
    "metadata/{urn:libvirt-gpu:1}gpus[@v='1']/{urn:libvirt-gpu:1}vgpu"
    "[@uuid='b']", '.', "devices/hostdev[@type='pci'][@mode]",
]


def _shape(element):
    if element is None:
        return None
    return (element.tag, dict(element.attrib), element.text, element.tail,
            [_shape(child) for child in element])


@pytest.mark.parametrize('path', _PATHS)
def test_paths_answer_as_elementtree_does(path):
    import xml.etree.ElementTree as ET
    ours, theirs = xmlutil.parse(_DOC), ET.fromstring(_DOC)
    assert [_shape(e) for e in ours.findall(path)] == \
        [_shape(e) for e in theirs.findall(path)]
    assert [_shape(e) for e in ours.iterfind(path)] == \
        [_shape(e) for e in theirs.iterfind(path)]
    assert _shape(ours.find(path)) == _shape(theirs.find(path))
    assert ours.findtext(path) == theirs.findtext(path)
    assert ours.findtext(path, 'd') == theirs.findtext(path, 'd')


def test_tree_answers_as_elementtree_does():
    import xml.etree.ElementTree as ET
    ours, theirs = xmlutil.parse(_DOC), ET.fromstring(_DOC)
    assert _shape(ours) == _shape(theirs)
    assert [e.tag for e in ours.iter()] == [e.tag for e in theirs.iter()]
    assert [e.tag for e in ours.iter('address')] == \
        [e.tag for e in theirs.iter('address')]
    assert len(ours) == len(theirs) and ours[1].tag == theirs[1].tag
    hostdev = ours.find('devices/hostdev')
    assert hostdev.get('type') == 'mdev' and hostdev.get('x', 'd') == 'd'
    assert sorted(hostdev.items()) == sorted(
        theirs.find('devices/hostdev').items())


@pytest.mark.parametrize('path', [
    '', '/domain', '//hostdev', 'devices/..', 'hostdev[1]', 'hostdev[x]',
    "hostdev[@type='pci'", "hostdev[@type=pci]", '{urn:x', 'a/@b',
    "hostdev[@type='pci']x"])
def test_paths_beyond_the_subset_are_refused(path):
    root = xmlutil.parse(_DOC)
    with pytest.raises(ValueError, match='unsupported path'):
        root.findall(path)
