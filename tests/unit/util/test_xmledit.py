"""Domain XML edited in place (xmledit): what is not ours comes back byte
for byte, on a domain as nova defines it (its ``<nova:instance>``
metadata, a comment, another tool's default namespace, CDATA, a processing
instruction, both quote styles and irregular spacing)."""

import os
import xml.etree.ElementTree as ET

import pytest

from libvirt_gpu import exception
from libvirt_gpu.virt import metadata
from libvirt_gpu.util import xmledit
from libvirt_gpu.util import xmlutil
from tests.doubles import paths

DATA = os.path.join(paths.TESTS, 'data', 'domains', 'nova-vgpu.xml')
GPUS = '{%s}gpus' % metadata.NAMESPACE
VGPU = '{%s}vgpu' % metadata.NAMESPACE
NOVA = '{http://openstack.org/xmlns/libvirt/nova/1.1}'


@pytest.fixture
def nova():
    with open(DATA, 'rb') as f:
        return f.read()


def _outside(data, doc, elem):
    """The input's bytes before and after ``elem``."""
    return data[:elem.start], data[elem.end:]


def test_no_edit_gives_the_input_back(nova):
    doc = xmledit.Document.parse(nova, 'domain')
    assert not doc.changed
    assert doc.tobytes() == nova


def test_the_spans_are_the_elements_bytes(nova):
    doc = xmledit.Document.parse(nova, 'domain')
    assert doc.root.tag == 'domain'
    gpus = doc.root.find('metadata', GPUS)
    assert gpus.prefix == 'lgpu'
    assert doc.bytes_of(gpus).startswith(b'<lgpu:gpus xmlns:lgpu=')
    assert doc.bytes_of(gpus).endswith(b'</lgpu:gpus>')
    vgpu = gpus.find(VGPU)
    assert vgpu.empty
    assert doc.bytes_of(vgpu).endswith(b'parent="0000:3d:00.4"/>')
    flavor = doc.root.find('metadata', NOVA + 'instance', NOVA + 'flavor')
    assert flavor.attrib == {'name': 'g1.l40s-24q'}
    app = doc.root.find('metadata', '{urn:example:monitoring}app')
    assert doc.bytes_of(app) == (b"<app xmlns=\"urn:example:monitoring\"  "
                                 b"interval = '30'><![CDATA[a<b]]></app>")


def test_an_attribute_edit_changes_only_its_value(nova):
    doc = xmledit.Document.parse(nova, 'domain')
    vgpu = doc.root.find('metadata', GPUS, VGPU)
    doc.set_attribute(vgpu, 'parent', '0000:bd:00.5')
    out = doc.tobytes()
    old = b'parent="0000:3d:00.4"/>'
    assert nova.count(old) == 1
    assert out == nova.replace(old, b'parent="0000:bd:00.5"/>')
    # the result is the same document with the one value changed
    assert [e.tag for e in ET.fromstring(out).iter()] == \
        [e.tag for e in ET.fromstring(nova).iter()]


def test_a_new_attribute_goes_last_and_values_are_escaped(nova):
    doc = xmledit.Document.parse(nova, 'domain')
    vgpu = doc.root.find('metadata', GPUS, VGPU)
    doc.set_attribute(vgpu, 'note', 'a"<&')
    out = doc.tobytes()
    assert out == nova.replace(
        b'parent="0000:3d:00.4"/>',
        b'parent="0000:3d:00.4" note="a&quot;&lt;&amp;"/>')
    again = xmledit.Document.parse(out, 'domain')
    assert again.root.find('metadata', GPUS, VGPU).attrib['note'] == 'a"<&'


def test_our_element_replaced_keeps_everything_else(nova):
    """The edit a migration makes: our <gpus> rewritten (another parent),
    rendered with the prefix the input uses; every byte before and after
    it is the input's."""
    doc = xmledit.Document.parse(nova, 'domain')
    gpus = doc.root.find('metadata', GPUS)
    meta = metadata.parse_element(xmlutil.parse(doc.bytes_of(gpus)))
    moved = meta.without_vgpu(meta.vgpus[0].uuid).with_vgpu(
        metadata.VgpuEntry(uuid=meta.vgpus[0].uuid,
                           type_id=meta.vgpus[0].type_id.parse('nvidia-1145'),
                           parent=None))
    doc.replace(gpus, metadata.render_document(moved, prefix=gpus.prefix))
    out = doc.tobytes()
    before, after = _outside(nova, doc, gpus)
    assert out.startswith(before) and out.endswith(after)
    middle = out[len(before):len(out) - len(after)]
    assert middle.startswith(b'<lgpu:gpus xmlns:lgpu="urn:libvirt-gpu:1">')
    assert b'parent=' not in middle
    # nova's element and the comment are there, byte for byte
    assert b'<nova:instance xmlns:nova=' in before
    assert before.startswith(b'<!--\nWARNING: THIS IS AN AUTO-GENERATED')
    assert metadata.parse(xmlutil.parse(out)) == moved


def test_edits_made_in_any_order_land_in_document_order(nova):
    """Edits are spliced by position, not in the order they were made
    (the migrate hook edits the metadata, then the hostdev before it or
    after it)."""
    doc = xmledit.Document.parse(nova, 'domain')
    doc.append(doc.root.find('devices'), b'<hostdev/>')
    doc.set_attribute(doc.root.find('metadata', GPUS, VGPU), 'parent',
                      '0000:bd:00.5')
    doc.set_text(doc.root.find('name'), 'vm2')
    assert doc.tobytes() == nova.replace(
        b'<name>instance-0000002a</name>', b'<name>vm2</name>').replace(
        b'parent="0000:3d:00.4"', b'parent="0000:bd:00.5"').replace(
        b'</devices>', b'<hostdev/></devices>')


def test_text_and_children_edits(nova):
    doc = xmledit.Document.parse(nova, 'domain')
    name = doc.root.find('name')
    doc.set_text(name, 'vm<2>')
    acpi = doc.root.find('features', 'acpi')
    doc.set_text(acpi, 'x')
    devices = doc.root.find('devices')
    doc.append(devices, b'<hostdev/>')
    out = doc.tobytes()
    assert b'<name>vm&lt;2&gt;</name>' in out
    assert b'<acpi>x</acpi>' in out
    assert b'<hostdev/></devices>' in out
    assert out.replace(b'<name>vm&lt;2&gt;</name>', b'').replace(
        b'<acpi>x</acpi>', b'').replace(b'<hostdev/></devices>', b'') == \
        nova.replace(b'<name>instance-0000002a</name>', b'').replace(
            b'<acpi/>', b'').replace(b'</devices>', b'')


def test_two_edits_of_one_span_are_refused(nova):
    doc = xmledit.Document.parse(nova, 'domain')
    gpus = doc.root.find('metadata', GPUS)
    doc.set_attribute(gpus.find(VGPU), 'parent', '0000:bd:00.5')
    with pytest.raises(exception.InvalidXml, match='two edits'):
        doc.remove(gpus)


@pytest.mark.parametrize('bad, reason', [
    (b'<!DOCTYPE d [<!ENTITY e "x">]><domain>&e;</domain>', 'DOCTYPE'),
    (b'<domain><a></domain>', 'malformed'),
    (b'<?xml version="1.0" encoding="ISO-8859-1"?><domain/>', 'UTF-8'),
    (b'<domain>' + b' ' * 64 + b'</domain>', 'more than')])
def test_hostile_or_unreadable_input_is_refused(bad, reason):
    max_bytes = 64 if reason == 'more than' else xmlutil.MAX_XML_BYTES
    with pytest.raises(exception.InvalidXml, match=reason):
        xmledit.Document.parse(bad, 'domain', max_bytes=max_bytes)


def test_quoted_gt_in_attributes_does_not_end_a_tag():
    data = b"<d a='x>y' b=\"1\"><e f='>'/>text</d>"
    doc = xmledit.Document.parse(data, 'd')
    e = doc.root.find('e')
    assert doc.bytes_of(e) == b"<e f='>'/>"
    doc.set_attribute(doc.root, 'b', '2')
    assert doc.tobytes() == b"<d a='x>y' b=\"2\"><e f='>'/>text</d>"
