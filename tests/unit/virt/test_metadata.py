"""The <gpu:gpus> metadata format: parse, render, strictness."""

import pytest

from libvirt_gpu import exception
from libvirt_gpu.virt import metadata
from libvirt_gpu import objects
from libvirt_gpu.util import xmlutil

UUID = objects.Uuid.parse('4b20d080-1b54-4048-85b3-a6a62d165c01')
UUID2 = objects.Uuid.parse('b1ae8bf6-38b0-4c81-9d44-78ce3f520496')

EXAMPLE = '''<domain type='kvm'>
  <name>vm1</name><uuid>c7a5fdbd-cdaf-9455-926a-d65c16db1809</uuid>
  <metadata>
    <other:thing xmlns:other="urn:someone-else"><other:vgpu uuid="x"/>
    </other:thing>
    <gpu:gpus xmlns:gpu="urn:libvirt-gpu:1">
      <gpu:vgpu uuid="%s" type="nvidia-223" parent="0000:af:00.0"/>
      <gpu:vgpu uuid="%s" type="nvidia-223"/>
      <!-- a comment is fine -->
      <gpu:pgpu address="0000:3b:00.0"/>
    </gpu:gpus>
  </metadata>
</domain>''' % (UUID, UUID2.upper())


def parse(text):
    return metadata.parse(xmlutil.parse(text))


def test_parse_the_documented_example():
    meta = parse(EXAMPLE)
    assert meta.vgpus == (
        metadata.VgpuEntry(UUID, objects.TypeId.parse('nvidia-223'),
                           objects.PciAddress.parse('0000:af:00.0')),
        metadata.VgpuEntry(UUID2, objects.TypeId.parse('nvidia-223'), None))
    assert meta.pgpus == (metadata.PgpuEntry(
        objects.PciAddress.parse('0000:3b:00.0')),)
    assert not meta.empty


def test_prefix_is_free_namespace_is_not():
    text = EXAMPLE.replace('<gpu:', '<g:').replace('</gpu:', '</g:').replace(
        'xmlns:gpu=', 'xmlns:g=')
    assert 'gpu:gpus' not in text
    assert parse(text) == parse(EXAMPLE)
    # Same names in another namespace are not ours.
    other = EXAMPLE.replace('urn:libvirt-gpu:1', 'urn:libvirt-gpu:2')
    assert parse(other).empty


def test_domain_without_metadata_is_empty():
    assert parse('<domain><name>x</name></domain>').empty


def test_render_round_trip():
    meta = parse(EXAMPLE)
    doc = ("<domain><metadata>%s</metadata></domain>"
           % metadata.render_document(meta))
    assert parse(doc) == meta
    # render() is what setMetadata gets: unprefixed, libvirt adds the ns
    assert metadata.render(meta).startswith('<gpus><vgpu uuid="%s" '
                                            'type="nvidia-223" parent='
                                            '"0000:af:00.0"/>' % UUID)


def test_with_and_without():
    meta = metadata.GpuMetadata()
    entry = metadata.VgpuEntry(UUID, objects.TypeId.parse('nvidia-223'))
    meta = meta.with_vgpu(entry)
    with pytest.raises(exception.MetadataError, match='listed already'):
        meta.with_vgpu(entry)
    assert meta.vgpu(objects.Uuid.parse(UUID.upper())) == entry
    assert meta.without_vgpu(UUID).empty
    pg = metadata.PgpuEntry(objects.PciAddress.parse('0000:3b:00.0'))
    meta = meta.with_pgpu(pg)
    assert meta.pgpu(pg.address) == pg
    assert meta.without_pgpu(pg.address).pgpus == ()


@pytest.mark.parametrize('body,match', [
    ('<gpu:vgpu uuid="%s"/>' % UUID, 'lacks type'),
    ('<gpu:vgpu type="nvidia-223"/>', 'lacks uuid'),
    ('<gpu:vgpu uuid="../../etc" type="nvidia-223"/>', 'not a UUID'),
    ('<gpu:vgpu uuid="%s" type="../nvidia-223"/>' % UUID, 'type id'),
    ('<gpu:vgpu uuid="%s" type="nvidia-223&#10;x"/>' % UUID, 'type id'),
    ('<gpu:vgpu uuid="%s" type="nvidia-223" parent="0000:af:00.0/.."/>'
     % UUID, 'PCI address'),
    ('<gpu:vgpu uuid="%s" type="nvidia-223" count="2"/>' % UUID,
     "unknown attribute"),
    ('<gpu:pgpu address="0000:3b:00.0&#10;"/>', 'PCI address'),
    ('<gpu:pgpu/>', 'lacks address'),
    ('<gpu:vgpu uuid="%s" type="nvidia-223"/><gpu:vgpu uuid="%s" '
     'type="nvidia-222"/>' % (UUID, UUID), 'listed twice'),
    ('<gpu:pgpu address="0000:3b:00.0"/><gpu:pgpu address="0000:3B:00.0"/>',
     'listed twice'),
    ('<gpu:mdev uuid="%s"/>' % UUID, 'unknown element'),
])
def test_strict_parsing(body, match):
    text = ('<domain><metadata><gpu:gpus xmlns:gpu="urn:libvirt-gpu:1">%s'
            '</gpu:gpus></metadata></domain>' % body)
    with pytest.raises(exception.MetadataError, match=match):
        parse(text)


def test_two_gpus_elements_refused():
    one = '<g:gpus xmlns:g="urn:libvirt-gpu:1"/>'
    with pytest.raises(exception.MetadataError, match='2 <gpus>'):
        parse('<domain><metadata>%s%s</metadata></domain>' % (one, one))


def test_pgpu_companions_round_trip():
    gpu = objects.PciAddress.parse('0000:65:00.0')
    audio = objects.PciAddress.parse('0000:65:00.1')
    meta = metadata.GpuMetadata(pgpus=(metadata.PgpuEntry(gpu, (audio,)),))
    body = metadata.render(meta)
    assert 'companions="0000:65:00.1"' in body
    doc = ('<domain><metadata>%s</metadata></domain>'
           % metadata.render_document(meta))
    assert metadata.parse(xmlutil.parse(doc)) == meta
    assert metadata.parse(xmlutil.parse(doc)).pgpu(gpu).companions == (
        audio,)


# --- what make mutation found ----------------------------------------------
#
# What the ``<gpu:gpus>`` format promises that test_metadata left open:
# each test here fails on a change ``make mutation`` made to
# virt/metadata.py that the rest stayed green on (docs/dev/mutation.md):
# the whole refusal a user reads, the exact text handed to libvirt, and the
# entries kept or dropped by each edit.

TYPE = objects.TypeId.parse('nvidia-223')
GPU = objects.PciAddress.parse('0000:3b:00.0')
GPU2 = objects.PciAddress.parse('0000:af:00.0')
AUDIO = objects.PciAddress.parse('0000:3b:00.1')
AUDIO2 = objects.PciAddress.parse('0000:3b:00.2')
HEAD = "Domain metadata <gpus xmlns='urn:libvirt-gpu:1'>: "


def _doc(inner, attrs=''):
    return ('<domain><metadata><gpu:gpus xmlns:gpu="urn:libvirt-gpu:1"%s>%s'
            '</gpu:gpus></metadata></domain>' % (attrs, inner))


def _parse(text):
    return metadata.parse(xmlutil.parse(text))


def _refusal(text):
    with pytest.raises(exception.MetadataError) as info:
        _parse(text)
    return str(info.value)


REFUSALS = [
    (_doc('', ' a="1"'), "<gpus> has unknown attribute(s) 'a'; allowed: "),
    (_doc('<gpu:vgpu uuid="%s" type="nvidia-223" zz="1" aa="2"/>' % UUID),
     "<vgpu> has unknown attribute(s) 'aa', 'zz'; allowed: "
     "nvidia-metadata, parent, type, uuid"),
    (_doc('<gpu:pgpu address="0000:3b:00.0" slot="1"/>'),
     "<pgpu> has unknown attribute(s) 'slot'; allowed: address, "
     "companions"),
    (_doc('<gpu:vgpu uuid="%s" type="nvidia-223" %s="1"/>'
          % (UUID, 'x' * 80)),
     "<vgpu> has unknown attribute(s) '%s; allowed: nvidia-metadata, "
     "parent, type, uuid" % ('x' * 59)),
    (_doc('<gpu:vgpu type="nvidia-223"/>'), '<vgpu> lacks uuid='),
    (_doc('<gpu:vgpu uuid="%s"/>' % UUID), '<vgpu> lacks type='),
    (_doc('<gpu:pgpu companions="0000:3b:00.1"/>'), '<pgpu> lacks address='),
    (_doc('<gpu:vgpu uuid="x" type="nvidia-223"/>'),
     "<vgpu>: 'x' is not a UUID; expected the form "
     "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"),
    (_doc('<gpu:vgpu uuid="%s" type="n v"/>' % UUID),
     "<vgpu>: 'n v' is not a valid vGPU type id (1 to 64 letters, digits, "
     "'-', '_' or '.', starting with a letter or digit, e.g. nvidia-223)"),
    (_doc('<gpu:vgpu uuid="%s" type="nvidia-223" parent="x"/>' % UUID),
     "<vgpu>: 'x' is not a PCI address; expected the form DDDD:BB:SS.F in "
     "hex digits, e.g. 0000:af:00.0"),
    (_doc('<gpu:pgpu address="x"/>'),
     "<pgpu>: 'x' is not a PCI address; expected the form DDDD:BB:SS.F in "
     "hex digits, e.g. 0000:af:00.0"),
    (_doc('<gpu:pgpu address="0000:3b:00.0" companions="0000:3b:00.1,y"/>'),
     "<pgpu>: 'y' is not a PCI address; expected the form DDDD:BB:SS.F in "
     "hex digits, e.g. 0000:af:00.0"),
    (_doc('<gpu:vgpu uuid="%s" type="nvidia-223"/>'
          '<gpu:vgpu uuid="%s" type="nvidia-224"/>' % (UUID, UUID)),
     'vGPU %s is listed twice' % UUID),
    (_doc('<gpu:pgpu address="0000:3b:00.0"/>'
          '<gpu:pgpu address="0000:3b:00.0"/>'),
     'GPU 0000:3b:00.0 is listed twice'),
    (_doc('<other xmlns="urn:x"/>'),
     'unknown element {urn:x}other; expected <vgpu> or <pgpu> in namespace '
     'urn:libvirt-gpu:1'),
    (_doc('<gpu:%s/>' % ('m' * 100)),
     'unknown element %s; expected <vgpu> or <pgpu> in namespace '
     'urn:libvirt-gpu:1' % ('{urn:libvirt-gpu:1}' + 'm' * 100)[:80]),
    ('<domain><metadata/><metadata><gpu:gpus xmlns:gpu="urn:libvirt-gpu:1"/>'
     '</metadata></domain>',
     "the domain has 2 <metadata> elements and libvirt reads only the "
     "first; put every application's metadata in one <metadata>"),
    ('<domain><metadata><g:gpus xmlns:g="urn:libvirt-gpu:1"/>'
     '<g:gpus xmlns:g="urn:libvirt-gpu:1"/><g:gpus xmlns:g="urn:libvirt-gpu:1"'
     '/></metadata></domain>',
     'the domain has 3 <gpus> elements; libvirt keeps one per namespace'),
]


@pytest.mark.parametrize('text,reason', REFUSALS)
def test_refusal_reads_whole(text, reason):
    assert _refusal(text) == HEAD + reason


def test_two_metadata_without_ours_are_not_our_business():
    assert _parse('<domain><metadata/><metadata/></domain>').empty


def test_pgpu_with_every_companion_in_order_and_empty_items_skipped():
    meta = _parse(_doc(
        '<gpu:pgpu address="0000:3b:00.0" '
        'companions=",0000:3b:00.2,,0000:3b:00.1"/>'
        '<gpu:pgpu address="0000:af:00.0" companions=""/>'))
    assert meta.pgpus == (metadata.PgpuEntry(GPU, (AUDIO2, AUDIO)),
                          metadata.PgpuEntry(GPU2, ()))


def test_comment_between_entries_is_skipped_and_order_kept():
    meta = _parse(_doc(
        '<!-- first --><gpu:vgpu uuid="%s" type="nvidia-223"/>'
        '<!-- between --><gpu:vgpu uuid="%s" type="nvidia-223" '
        'parent="0000:af:00.0"/><gpu:pgpu address="0000:3b:00.0"/>'
        '<gpu:pgpu address="0000:af:00.0"/>' % (UUID2, UUID)))
    assert meta.vgpus == (metadata.VgpuEntry(UUID2, TYPE),
                          metadata.VgpuEntry(UUID, TYPE, GPU2))
    assert meta.pgpus == (metadata.PgpuEntry(GPU), metadata.PgpuEntry(GPU2))


def test_comments_and_instructions_kept_by_a_parser_are_skipped():
    """``xmlutil.parse`` drops them; an element built by a parser that
    keeps them is read the same."""
    import xml.etree.ElementTree as ET
    builder = ET.TreeBuilder(insert_comments=True, insert_pis=True)
    parser = ET.XMLParser(target=builder)
    parser.feed('<gpu:gpus xmlns:gpu="urn:libvirt-gpu:1"><!-- c --><?pi x?>'
                '<gpu:vgpu uuid="%s" type="nvidia-223"/><!-- d -->'
                '<gpu:pgpu address="0000:3b:00.0"/></gpu:gpus>' % UUID)
    meta = metadata.parse_element(parser.close())
    assert meta.vgpus == (metadata.VgpuEntry(UUID, TYPE),)
    assert meta.pgpus == (metadata.PgpuEntry(GPU),)


def test_same_uuid_as_vgpu_and_address_as_gpu_are_distinct_keys():
    # a UUID seen among vGPUs does not count against GPUs, nor the reverse
    meta = _parse(_doc(
        '<gpu:vgpu uuid="%s" type="nvidia-223" parent="0000:3b:00.0"/>'
        '<gpu:pgpu address="0000:3b:00.0"/>' % UUID))
    assert len(meta.vgpus) == 1 and len(meta.pgpus) == 1


def test_render_exact_text():
    meta = metadata.GpuMetadata(
        vgpus=(metadata.VgpuEntry(UUID, TYPE, GPU2),
               metadata.VgpuEntry(UUID2, TYPE)),
        pgpus=(metadata.PgpuEntry(GPU, (AUDIO, AUDIO2)),
               metadata.PgpuEntry(GPU2)))
    assert metadata.render(meta) == (
        '<gpus><vgpu uuid="%s" type="nvidia-223" parent="0000:af:00.0"/>'
        '<vgpu uuid="%s" type="nvidia-223"/>'
        '<pgpu address="0000:3b:00.0" companions="0000:3b:00.1,0000:3b:00.2"'
        '/><pgpu address="0000:af:00.0"/></gpus>' % (UUID, UUID2))
    assert metadata.render(metadata.GpuMetadata()) == '<gpus></gpus>'


def test_render_document_exact_text_with_a_prefix():
    meta = metadata.GpuMetadata(vgpus=(metadata.VgpuEntry(UUID, TYPE),),
                                pgpus=(metadata.PgpuEntry(GPU),))
    assert metadata.render_document(meta, prefix='g') == (
        '<g:gpus xmlns:g="urn:libvirt-gpu:1"><g:vgpu uuid="%s" '
        'type="nvidia-223"/><g:pgpu address="0000:3b:00.0"/></g:gpus>'
        % UUID)
    assert metadata.render_document(metadata.GpuMetadata()) == (
        '<gpu:gpus xmlns:gpu="urn:libvirt-gpu:1"></gpu:gpus>')


@pytest.mark.parametrize('meta,what,kind', [
    (metadata.GpuMetadata(vgpus=(metadata.VgpuEntry(str(UUID), TYPE),)),
     'uuid', 'Uuid'),
    (metadata.GpuMetadata(vgpus=(metadata.VgpuEntry(UUID, 'nvidia-223'),)),
     'type_id', 'TypeId'),
    (metadata.GpuMetadata(pgpus=(metadata.PgpuEntry(GPU, ('0000:3b:00.1',)),
                                 )),
     'companion', 'PciAddress'),
])
def test_render_refuses_raw_text(meta, what, kind):
    with pytest.raises(TypeError) as info:
        metadata.render(meta)
    assert str(info.value).startswith('%s must be an objects.%s, not str'
                                      % (what, kind))


def test_empty_is_false_with_either_kind_alone():
    assert metadata.GpuMetadata().empty
    assert not metadata.GpuMetadata(
        vgpus=(metadata.VgpuEntry(UUID, TYPE),)).empty
    assert not metadata.GpuMetadata(pgpus=(metadata.PgpuEntry(GPU),)).empty


def test_lookups_find_the_matching_entry_or_none():
    one, two = metadata.VgpuEntry(UUID, TYPE), metadata.VgpuEntry(UUID2, TYPE)
    gpu, gpu2 = metadata.PgpuEntry(GPU), metadata.PgpuEntry(GPU2)
    meta = metadata.GpuMetadata(vgpus=(one, two), pgpus=(gpu, gpu2))
    assert meta.vgpu(UUID2) is two
    assert meta.pgpu(GPU2) is gpu2
    empty = metadata.GpuMetadata()
    assert empty.vgpu(UUID) is None and empty.pgpu(GPU) is None
    with pytest.raises(TypeError, match='^uuid must be an objects.Uuid'):
        meta.vgpu(str(UUID))
    with pytest.raises(TypeError, match='^address must be an objects.Pci'):
        meta.pgpu(str(GPU))
    with pytest.raises(TypeError, match='^uuid must be an objects.Uuid'):
        meta.without_vgpu(str(UUID))
    with pytest.raises(TypeError, match='^address must be an objects.Pci'):
        meta.without_pgpu(str(GPU))


def test_edits_append_in_order_and_remove_only_the_one_named():
    one, two = metadata.VgpuEntry(UUID, TYPE), metadata.VgpuEntry(UUID2, TYPE)
    gpu, gpu2 = metadata.PgpuEntry(GPU), metadata.PgpuEntry(GPU2)
    meta = (metadata.GpuMetadata().with_vgpu(one).with_vgpu(two)
            .with_pgpu(gpu).with_pgpu(gpu2))
    assert meta.vgpus == (one, two) and meta.pgpus == (gpu, gpu2)
    assert meta.without_vgpu(UUID).vgpus == (two,)
    assert meta.without_vgpu(UUID).pgpus == (gpu, gpu2)
    assert meta.without_pgpu(GPU2).pgpus == (gpu,)
    assert meta.without_pgpu(GPU2).vgpus == (one, two)


def test_listed_already_refusals_read_whole():
    one = metadata.VgpuEntry(UUID, TYPE)
    gpu = metadata.PgpuEntry(GPU)
    meta = metadata.GpuMetadata(vgpus=(one,), pgpus=(gpu,))
    with pytest.raises(exception.MetadataError) as info:
        meta.with_vgpu(metadata.VgpuEntry(UUID, TYPE, GPU))
    assert str(info.value) == HEAD + 'vGPU %s is listed already' % UUID
    with pytest.raises(exception.MetadataError) as info:
        meta.with_pgpu(metadata.PgpuEntry(GPU, (AUDIO,)))
    assert str(info.value) == HEAD + 'GPU 0000:3b:00.0 is listed already'
