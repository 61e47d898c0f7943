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
