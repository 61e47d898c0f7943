"""What ``incoming.targets`` promises that its other tests left open: each
test here fails on a change ``make mutation`` made that the rest stayed
green on (docs/dev/mutation.md).  ``targets`` is called on a request built
here, as test_migrate_section4 does: the hook's own parse refuses some of
these inputs before ``targets`` sees them, and ``targets`` must not depend
on that."""

import pytest

from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.guests.hook import incoming
from libvirt_gpu.guests.hook import operations
from libvirt_gpu.util import xmledit
from libvirt_gpu.util import xmlutil
from libvirt_gpu.virt import metadata
from tests.doubles import t4_hook as th
from tests.doubles import t4_migrate as tm

TYPE = objects.TypeId.parse('nvidia-223')


def _request(xml, uuids, domain_xml=None):
    return operations.Request(
        operation='migrate', domain=operations.config_xml.read_domain(
            xmlutil.parse(domain_xml or xml)),
        meta=metadata.GpuMetadata(vgpus=tuple(
            metadata.VgpuEntry(uuid=u, type_id=TYPE) for u in uuids)),
        document=xmledit.Document.parse(xml))


def test_two_gpus_elements_in_one_metadata_are_refused():
    uuid = th.new_uuid()
    xml = tm.incoming_xml(uuid).replace(
        b'</metadata>', b"<g:gpus xmlns:g='urn:libvirt-gpu:1'/></metadata>")
    with pytest.raises(exception.MigrationRefused) as e:
        incoming.targets(_request(xml, [uuid]))
    # the count said is the one of <gpus>, not of <metadata>
    assert str(e.value) == (
        "Migration refused: the domain XML's <metadata> holds 2 <gpus> "
        'elements of libvirt-gpu; one says which vGPUs are ours')


def test_a_vgpu_of_the_metadata_without_its_element_is_refused():
    uuid, other = th.new_uuid(), th.new_uuid()
    with pytest.raises(exception.MigrationRefused) as e:
        incoming.targets(_request(tm.incoming_xml(uuid), [uuid, other]))
    assert str(e.value) == (
        'Migration refused: vGPU %s of the metadata has no <vgpu> element '
        'this hook can edit' % other)


def test_a_domain_without_devices_or_metadata_has_no_targets():
    uuid = th.new_uuid()
    xml = tm.incoming_xml(uuid)
    start, end = xml.index(b'<devices>'), xml.index(b'</devices>')
    bare = xml[:start] + xml[end + len(b'</devices>'):]
    assert incoming.targets(_request(bare, [uuid])) == []
    start, end = xml.index(b'<g:gpus'), xml.index(b'</g:gpus>')
    unmarked = xml[:start] + xml[end + len(b'</g:gpus>'):]
    assert incoming.targets(_request(unmarked, [])) == []


def test_hostdevs_with_incomplete_source_addresses_are_passed_over():
    """Another PCI device (no function= here) and an mdev without a UUID
    are no vGPU of ours: skipped, not a crash (the hook's parse of the
    domain refuses them before; ``targets`` reads the document itself)."""
    uuid = th.new_uuid()
    base = tm.incoming_xml(uuid)
    xml = base.replace(b'</devices>', (
        b"<hostdev mode='subsystem' type='pci'><source><address "
        b"domain='0x0000' bus='0x03' slot='0x00'/></source></hostdev>"
        b"<hostdev mode='subsystem' type='mdev'><source><address/>"
        b"</source></hostdev></devices>"))
    (target,) = incoming.targets(_request(xml, [uuid], domain_xml=base))
    assert target.entry.uuid == uuid and not target.vf
    assert target.source.attrib['uuid'] == uuid
