"""xmledit behaviours no other test pinned (issue 30, section 6): each of
these was changed alone in the product code and the suite stayed green.
Every test here fails under the change named in its docstring."""

import pytest

from libvirt_gpu import exception
from libvirt_gpu.util import xmledit


def _doc(text):
    return xmledit.Document.parse(text.encode(), 'test XML')


def test_two_insertions_at_one_offset_are_refused():
    """Two new attributes of one name land at one offset: refused, never a
    start tag with a duplicate attribute (broken by dropping the
    zero-width case of ``_edit``'s overlap test)."""
    doc = _doc('<domain><devices a="1"/></domain>')
    devices = doc.root.find('devices')
    doc.set_attribute(devices, 'b', '2')
    with pytest.raises(exception.InvalidXml) as e:
        doc.set_attribute(devices, 'b', '3')
    assert 'two edits' in str(e.value)
    assert doc.tobytes() == b'<domain><devices a="1" b="2"/></domain>'


def test_an_insertion_inside_a_replaced_span_is_refused():
    doc = _doc('<domain><devices a="1"></devices></domain>')
    devices = doc.root.find('devices')
    doc.replace(devices, '<devices/>')
    with pytest.raises(exception.InvalidXml):
        doc.append(devices, '<x/>')


@pytest.mark.parametrize('tag', [
    '<devices path="/dev/">', "<devices path='/'>", '<devices p="a/b" >'])
def test_a_slash_in_an_attribute_value_is_not_self_closing(tag):
    """A start tag whose attribute value holds ``/`` (even just before the
    closing quote) has content and an end tag (broken by taking any ``/``
    of the start tag as ``/>``, in the parser or in ``set_attribute``)."""
    text = '<domain>%s<hostdev/></devices><name>x</name></domain>' % tag
    doc = _doc(text)
    devices = doc.root.find('devices')
    assert not devices.empty
    assert [c.tag for c in devices.children] == ['hostdev']
    assert doc.bytes_of(devices) == (
        tag + '<hostdev/></devices>').encode()
    doc.set_attribute(devices, 'n', '1')
    doc.append(devices, '<x/>')
    out = doc.tobytes().decode()
    head = tag[:-1] + ' n="1">'        # a new attribute goes last
    assert out == text.replace(tag, head).replace(
        '<hostdev/></devices>', '<hostdev/><x/></devices>')
    assert xmledit.Document.parse(out.encode()).root.find(
        'devices').attrib['n'] == '1'


@pytest.mark.parametrize('name', ['UTF-8', 'utf-8', 'Utf8', 'UTF8'])
def test_the_encoding_declaration_is_read_whatever_its_case(name):
    """libvirt writes ``UTF-8``; the check of the declared encoding must
    not care for case (broken by dropping its ``lower()``)."""
    text = '<?xml version="1.0" encoding="%s"?>\n<domain/>' % name
    doc = _doc(text)
    doc.set_attribute(doc.root, 'type', 'kvm')
    assert doc.tobytes() == text.replace(
        '<domain/>', '<domain type="kvm"/>').encode()


@pytest.mark.parametrize('name', ['ISO-8859-1', 'utf-16', 'UTF-16'])
def test_other_encodings_are_refused(name):
    with pytest.raises(exception.InvalidXml) as e:
        xmledit.Document.parse(
            ('<?xml version="1.0" encoding="%s"?><domain/>' % name).encode())
    assert 'only UTF-8' in str(e.value) and name in str(e.value)


@pytest.mark.parametrize('tag, name', [
    ('<devices a="1" b=\'2\'/>', 'devices'),
    ('<devices a="1"  />', 'devices'),
    ('<g:gpus xmlns:g="urn:libvirt-gpu:1"/>', 'g:gpus'),
    ('<devices\n  a="1"/>', 'devices')])
def test_appending_to_an_empty_parent_with_attributes(tag, name):
    """The empty parent gains an end tag of its name alone, its start tag
    kept byte for byte (broken by taking the end tag's name from the
    whole start tag, attributes included)."""
    text = '<domain>%s<name>x</name></domain>' % tag
    doc = _doc(text)
    parent = doc.root.children[0]
    assert parent.empty
    doc.append(parent, '<x/>')
    head = tag[:-2].rstrip()
    out = doc.tobytes()
    assert out == text.replace(
        tag, '%s><x/></%s>' % (head, name)).encode()
    again = xmledit.Document.parse(out).root.children[0]
    assert [c.local for c in again.children] == ['x']
    assert again.attrib == parent.attrib


def test_set_text_on_an_empty_element_with_attributes():
    doc = _doc('<domain><name a="1"/></domain>')
    doc.set_text(doc.root.find('name'), 'vm')
    assert doc.tobytes() == b'<domain><name a="1">vm</name></domain>'


# --- found by `make mutation` on xmledit.py ---------------------------------

@pytest.mark.parametrize('order', ['a first', 'b first'])
def test_edits_of_adjacent_spans_are_both_kept(order):
    """Spans that touch do not overlap: ``<a/>`` ends where ``<b/>``
    starts."""
    doc = _doc('<r><a/><b/></r>')
    a, b = doc.root.children
    edits = [(a, '<a1/>'), (b, '<b1/>')]
    if order == 'b first':
        edits.reverse()
    for elem, text in edits:
        doc.replace(elem, text)
    assert doc.tobytes() == b'<r><a1/><b1/></r>'


def test_find_findall_and_remove():
    doc = _doc('<r><a n="1"/><b/><a n="2"/></r>')
    assert [e.attrib['n'] for e in doc.root.findall('a')] == ['1', '2']
    assert doc.root.find('c') is None
    assert doc.root.find('b', 'x') is None
    assert [e.tag for e in doc.root.iter()] == ['r', 'a', 'b', 'a']
    doc.remove(doc.root.find('b'))
    assert doc.tobytes() == b'<r><a n="1"/><a n="2"/></r>'


def test_prefixes_are_read_as_written():
    doc = _doc('<r xmlns:g="urn:g"><plain/><g:x/><y xmlns="urn:y"/></r>')
    plain, x, y = doc.root.children
    assert (plain.tag, plain.prefix) == ('plain', '')
    assert (x.tag, x.prefix) == ('{urn:g}x', 'g')
    assert (y.tag, y.prefix) == ('{urn:y}y', '')


def test_a_quoted_gt_in_an_element_named_with_an_x():
    doc = _doc('<r><X p="a>b" q=\'X>\'/><Xy>t</Xy></r>')
    x, xy = doc.root.children
    assert doc.bytes_of(x) == b'<X p="a>b" q=\'X>\'/>'
    assert doc.bytes_of(xy) == b'<Xy>t</Xy>'


def test_set_text_on_an_empty_element_spaced_before_its_slash():
    doc = _doc('<r><name a="1"  /></r>')
    doc.set_text(doc.root.find('name'), 'vm')
    assert doc.tobytes() == b'<r><name a="1">vm</name></r>'


@pytest.mark.parametrize('bad, said', [
    ('<domain><devices>', 'domain XML is malformed: '),
    ('<domain><devices></domain>', 'domain XML is malformed: '),
    ('<?xml version="1.0" encoding="latin-1"?><domain/>',
     'domain XML is in latin-1; only UTF-8 can be edited'),
])
def test_refusals_say_what_and_why(bad, said):
    with pytest.raises(exception.InvalidXml) as e:
        xmledit.Document.parse(bad.encode(), 'domain XML')
    assert said in str(e.value)


def test_refusals_word_for_word():
    """The exact lines an operator sees (a test of a substring lets a
    mangled message through)."""
    def said(data, *args):
        with pytest.raises(exception.InvalidXml) as e:
            xmledit.Document.parse(data, *args)
        return str(e.value)

    assert said(b'<?xml version="1.0" encoding="latin-1"?><d/>', 'stdin') \
        == 'Refused XML: stdin is in latin-1; only UTF-8 can be edited'
    # the declaration is found after leading blanks too
    assert said(b'\n <?xml version="1.0" encoding="latin-1"?><d/>') == \
        'Refused XML: XML is in latin-1; only UTF-8 can be edited'
    long_name = 'x' * 50
    assert said(('<?xml version="1.0" encoding="%s"?><d/>'
                 % long_name).encode(), 'stdin') == (
        'Refused XML: stdin is in %s; only UTF-8 can be edited'
        % long_name[:40])
    assert said('<?xml version="1.0" encoding="ütf-8"?><d/>'.encode(),
                'stdin') == ('Refused XML: stdin is in \ufffd\ufffdtf-8; '
                             'only UTF-8 can be edited')
    assert said(b'<d><e></d>', 'stdin').startswith(
        'Refused XML: stdin is malformed: mismatched tag')
    assert said(b'<d>' + b' ' * 100 + b'</d>', 'stdin', 50) == (
        'Refused XML: stdin is 107 bytes, more than the 50 allowed')
    doc = _doc('<r><a/></r>')
    doc.set_attribute(doc.root.find('a'), 'x', '1')
    with pytest.raises(exception.InvalidXml) as e:
        doc.set_attribute(doc.root.find('a'), 'x', '2')
    assert str(e.value) == 'Refused XML: two edits of bytes 5-5 of the ' \
        'document'


def test_set_text_and_append_on_an_empty_element_with_two_attributes():
    doc = _doc('<r><name a="1" b="2"/><devices a="1" b="2"/></r>')
    doc.set_text(doc.root.find('name'), 'vm')
    doc.append(doc.root.find('devices'), '<x/>')
    assert doc.tobytes() == (b'<r><name a="1" b="2">vm</name>'
                             b'<devices a="1" b="2"><x/></devices></r>')
