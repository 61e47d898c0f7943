import pytest

from libvirt_gpu import exception
from libvirt_gpu.util import xmlutil
import xml.etree.ElementTree as ET

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


# --- What ``make mutation`` found open (docs/dev/mutation.md) ---
# What ``util/xmlutil`` promises that its other tests left open: each test
# here fails on a change ``make mutation`` made that the rest stayed green on
# (docs/dev/mutation.md). The path steps are memoized in the module: a path's
# steps are parsed once per process. mutmut runs the tests once in its own
# process (to learn which test calls what) and then each mutant in a process
# forked from it, so a path parsed by that first run was never parsed again
# under a mutant. Each test here starts with an empty memo, so that the
# parser is the one under test.

@pytest.fixture(autouse=True)
def _fresh_memo(monkeypatch):
    monkeypatch.setattr(xmlutil, '_STEPS', {})


def _same_as_elementtree(doc, path):
    ours, theirs = xmlutil.parse(doc), ET.fromstring(doc)
    assert [_shape(e) for e in ours.findall(path)] == \
        [_shape(e) for e in theirs.findall(path)]


def _refused(call, *args, **kwargs):
    with pytest.raises(exception.InvalidXml) as e:
        call(*args, **kwargs)
    return str(e.value)


# --- paths -------------------------------------------------------------------

@pytest.mark.parametrize('path', _PATHS + [
    ".[@type='kvm']", ".[@type='xen']", "devices/hostdev[@type='pci']"
    "[@mode='subsystem']", "metadata/{urn:libvirt-gpu:1}gpus"
    "[@v='1'][@w]", "metadata/{urn:libvirt-gpu:1}gpus[@v='1'][@v]"])
def test_each_path_parsed_afresh_answers_as_elementtree_does(path):
    _same_as_elementtree(_DOC, path)


_QUOTED = ("<d xmlns:g='urn:x'><e a='x}y' b='p=q' c='' f='{x}/y'/>"
           "<g:e a='1' b='2'/><g:e a='x}y'/><Xa><XXb>in</XXb></Xa></d>")


@pytest.mark.parametrize('path, found', [
    ("e[@a='x}y']", 1),             # a brace in a value ends no namespace
    ("{urn:x}e[@a='x}y']", 1),
    ("{urn:x}e[@a='1'][@b='2']", 1),
    ("{urn:x}e[@a='1'][@b='3']", 0),
    ("e[@b='p=q']", 1),             # the name ends at the first '='
    ("e[@c='']", 1),                # an empty value is a value
    ("e[@c=\"\"]", 1),
    ("e[@f='{x}/y']", 1),           # a '/' inside [...] does not cut
    ('Xa/XXb', 1),
])
def test_predicates_and_steps(path, found):
    root = xmlutil.parse(_QUOTED)
    assert len(root.findall(path)) == found


@pytest.mark.parametrize('path', [
    'name()', 'text()', "e[@a='x]", 'e[@a="x\']', "e[@a=']", 'e[@a=xyx]',
    'e[@a=XxX]', 'e[@a=|x|]', b'name', 5, None, '', '/d', 'e[@a]y',
    '{urn:x', 'd/{urn:x'])
def test_paths_outside_the_subset_are_refused_by_name(path):
    root = xmlutil.parse(_QUOTED)
    with pytest.raises(ValueError) as e:
        root.findall(path)
    assert str(e.value) == 'unsupported path %r' % (path,)


def test_iter_star_is_every_element():
    ours, theirs = xmlutil.parse(_DOC), ET.fromstring(_DOC)
    assert [e.tag for e in ours.iter('*')] == \
        [e.tag for e in theirs.iter('*')]
    assert len(list(ours.iter('*'))) > 10


# --- the tree ----------------------------------------------------------------

def test_namespaced_attributes_are_named_as_elementtree_names_them():
    doc = "<d xmlns:g='urn:x'><e g:a='1' b='2'/></d>"
    ours, theirs = xmlutil.parse(doc), ET.fromstring(doc)
    assert ours.find('e').attrib == theirs.find('e').attrib == \
        {'{urn:x}a': '1', 'b': '2'}
    assert ours.find("e[@{urn:x}a='1']") is not None


def test_long_text_and_tails_are_kept_whole():
    """expat hands text over in pieces past its buffer (8 KiB)."""
    text, tail = 'a&amp;' * 5000, 'b&lt;' * 5000
    doc = '<d><e>%s</e>%s<f/></d>' % (text, tail)
    ours, theirs = xmlutil.parse(doc), ET.fromstring(doc)
    assert ours.find('e').text == theirs.find('e').text == \
        text.replace('&amp;', '&')
    assert ours.find('e').tail == theirs.find('e').tail == \
        tail.replace('&lt;', '<')


# --- checked_bytes and parse -------------------------------------------------

def test_the_size_limit_is_inclusive():
    assert xmlutil.parse('<d/>', max_bytes=4).tag == 'd'
    assert _refused(xmlutil.parse, '<dd/>', max_bytes=4) == \
        'Refused XML: XML is 5 bytes, more than the 4 allowed'


@pytest.mark.parametrize('text, reason', [
    ('<d>\ud800</d>', 'XML is not valid Unicode (a lone surrogate)'),
    (5, 'XML is not text'),
    ('<!DOCTYPE d><d/>', 'XML carries a DOCTYPE or entity declaration'),
    ('<d><!ENTITY x "y"></d>', 'XML carries a DOCTYPE or entity declaration'),
])
def test_checked_bytes_refusals(text, reason):
    assert _refused(xmlutil.checked_bytes, text) == 'Refused XML: ' + reason
    assert _refused(xmlutil.parse, text) == 'Refused XML: ' + reason


def test_malformed_xml_is_refused_with_expat_s_words():
    assert _refused(xmlutil.parse, '<d>', 'input') == (
        'Refused XML: input is malformed: no element found: line 1, '
        'column 3')


def test_messages_name_what_was_read():
    assert _refused(xmlutil.parse, '<d/>', 'domain XML', max_bytes=1) == \
        'Refused XML: domain XML is 4 bytes, more than the 1 allowed'


def test_a_doctype_only_the_parser_sees():
    data = '<!DOCTYPE d><d/>'.encode('utf-16')
    assert _refused(xmlutil.parse, data) == \
        'Refused XML: XML carries a DOCTYPE'


def test_an_encoding_expat_cannot_read():
    reason = _refused(
        xmlutil.parse, b'<?xml version="1.0" encoding="x-bogus"?><d/>')
    assert reason.startswith(
        'Refused XML: XML declares an encoding that cannot be read (')
    assert reason.endswith('); write it in UTF-8')


# --- require_utf8 ------------------------------------------------------------

_CONVERT = 'only UTF-8 is read: convert it (`iconv -t UTF-8`)'


@pytest.mark.parametrize('encoding, name', [
    ('utf-16-be', 'UTF-16'), ('utf-16-le', 'UTF-16'),
    ('utf-32-be', 'UTF-32'), ('utf-32-le', 'UTF-32')])
def test_a_byte_order_mark_names_the_encoding(encoding, name):
    """UTF-32LE's mark starts with UTF-16LE's: told apart all the same."""
    data = '\ufeff<d/>'.encode(encoding)
    assert _refused(xmlutil.require_utf8, data, 'input') == (
        'Refused XML: input is %s (it starts with a byte order mark); '
        % name + _CONVERT)


def test_a_nul_byte_is_placed_at_its_first_offset():
    assert _refused(xmlutil.require_utf8, b'<\x00d\x00/>') == (
        'Refused XML: XML holds a NUL byte at offset 1 (UTF-16 or UTF-32 '
        'text?); ' + _CONVERT)


def test_bytes_that_do_not_decode():
    assert _refused(xmlutil.require_utf8, b'<d>\xe9</d>', 'input') == (
        'Refused XML: input is not UTF-8 (byte 0xe9 at offset 3); '
        + _CONVERT)


@pytest.mark.parametrize('data', [
    b'<?xml version="1.0" encoding="UTF-8"?><d/>',
    b"<?xml version='1.0' encoding='utf-8'?><d/>",
    b"<?xml version='1.0' encoding='utf8' standalone='yes'?><d/>",
    b'<?xml version="1.0" encoding="UTF-8" standalone="yes"?><d/>',
    b'\xef\xbb\xbf<?xml version="1.0" encoding="UTF-8"?><d/>',
    # "encoding" outside the declaration is no declaration
    b'<?xml version="1.0"?><?x encoding="latin-1"?><d/>',
    b'<?xml version="1.0"?><d>encoding="latin-1"</d>',
])
def test_utf8_is_read_however_declared(data):
    assert xmlutil.require_utf8(data) is data
    assert xmlutil.parse(data).tag == 'd'


@pytest.mark.parametrize('data, name', [
    (b'<?xml version="1.0" encoding="ISO-8859-1"?><d/>', 'ISO-8859-1'),
    (b"<?xml version='1.0' encoding='latin-1'?><d/>", 'latin-1'),
    (b'<?xml version="1.0" encoding="X-MAC-ROMAN"?><d/>', 'X-MAC-ROMAN'),
    (b'\xef\xbb\xbf<?xml version="1.0" encoding="ISO-8859-1"?><d/>',
     'ISO-8859-1'),
    (b'\n <?xml version="1.0" encoding="ISO-8859-1"?><d/>', 'ISO-8859-1'),
])
def test_other_declared_encodings_are_refused_by_name(data, name):
    assert _refused(xmlutil.require_utf8, data) == (
        'Refused XML: XML declares the encoding %s; only UTF-8 is read: '
        'convert it and declare UTF-8 (or nothing)' % name)


def test_a_declared_name_is_echoed_ascii_and_short():
    name = 'é' + 'x' * 60
    reason = _refused(
        xmlutil.require_utf8,
        ('<?xml version="1.0" encoding="%s"?><d/>' % name).encode())
    assert 'declares the encoding %s;' % ('\ufffd\ufffd' + 'x' * 38) in reason


@pytest.mark.parametrize('pad', [1, 190, 200, 5000])
def test_the_whole_declaration_is_read_however_long(pad):
    # padding inside the declaration never hides its encoding from the
    # check xmledit relies on, nor cuts its name ('utf-' at byte 200)
    data = (b'<?xml version="1.0"' + b' ' * pad
            + b'encoding="ISO-8859-1"?><d>caf\xc3\xa9</d>')
    assert _refused(xmlutil.require_utf8, data).endswith(
        'declares the encoding ISO-8859-1; only UTF-8 is read: convert it '
        'and declare UTF-8 (or nothing)')
    utf8 = data.replace(b'ISO-8859-1', b'UTF-8')
    assert xmlutil.require_utf8(utf8) is utf8
    for cut in range(max(0, pad + 10), pad + 26):
        shifted = utf8[:19] + b' ' * (cut - pad) + utf8[19:]
        assert xmlutil.require_utf8(shifted) is shifted
