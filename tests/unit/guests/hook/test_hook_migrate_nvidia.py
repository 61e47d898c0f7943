"""The destination's ``migrate`` hook asks NVIDIA's driver: the source
vGPU's NVIDIA metadata (``nvidia-metadata=`` of its ``<gpu:vgpu>``) put
to ``nvmlGetVgpuCompatibility`` with the GPU chosen here, on the simulated
H100 host (``[gpu]/nvml = simulated``, driver 580.95.02).  The source's
metadata comes from another simulated H100 (its own kernel, its driver
version as the test sets it)."""

import base64

import pytest

from libvirt_gpu import objects
from tests.doubles import h100_migrate as hm
from tests.doubles import t4_hook as th
from tests.doubles.h100_migrate import GPU
from tests.doubles.h100_migrate import SOURCE_VF
from tests.doubles.h100_migrate import hook_log
from tests.doubles.h100_migrate import incoming
from tests.doubles.h100_migrate import migrate
from tests.doubles.h100_migrate import source_metadata
from tests.doubles.h100_migrate import without_hostdev

h100 = hm.h100


def test_another_driver_branch_is_refused_with_nvidia_s_reason(h100):
    uuid = th.new_uuid()
    rc, out, err = migrate(h100, incoming(
        uuid, source_metadata(driver_version='550.127.05')))
    assert (rc, out) == (1, b'')
    assert err.strip().splitlines()[-1].endswith(
        "Migration refused: vGPU %s (nvidia-1300): NVIDIA's driver allows "
        "no live migration to GPU %s (no kind at all): limited by the "
        "host driver (the source runs 550.127.05, this host 580.95.02)"
        % (uuid, GPU))
    assert len(err.strip().splitlines()) == 1
    assert h100.leases() == []                  # nothing reserved here


def test_another_board_is_refused(h100):
    uuid = th.new_uuid()
    rc, _, err = migrate(h100, incoming(
        uuid, source_metadata(product_id='2331')))
    assert rc == 1
    assert 'limited by the GPU' in err and h100.leases() == []


def test_a_compatible_vgpu_is_reserved_as_before(h100):
    uuid = th.new_uuid()
    rc, out, err = migrate(h100, incoming(uuid, source_metadata()))
    assert (rc, err) == (0, '')
    assert b"parent='0000:4e:00.4'" in out
    (lease,) = h100.leases()
    assert (lease.vgpu_uuid, str(lease.parent)) == (uuid, '0000:4e:00.4')
    assert "NVIDIA's driver allows a live migration to GPU %s" % GPU in \
        hook_log(h100)


def test_without_the_source_s_metadata_the_log_says_so(h100):
    uuid = th.new_uuid()
    rc, _, err = migrate(h100, incoming(uuid))
    assert (rc, err) == (0, '')
    assert len(h100.leases()) == 1
    assert ("incoming vGPU %s (nvidia-1300) carries no NVIDIA metadata "
            "from the source: NVIDIA's compatibility check not made, "
            "today's checks only" % uuid) in hook_log(h100)


def test_without_nvml_here_the_check_is_not_made_and_said(h100):
    with open(h100.config) as f:
        text = f.read()
    with open(h100.config, 'w') as f:
        f.write(text.replace('nvml = simulated', 'nvml = off'))
    uuid = th.new_uuid()
    rc, _, err = migrate(h100, incoming(
        uuid, source_metadata(driver_version='550.127.05')))
    said = ("incoming vGPU %s (nvidia-1300): NVIDIA's compatibility check "
            "not made: NVML is not used on this host ([gpu]/nvml); today's "
            "checks only" % uuid)
    assert (rc, err) == (0, 'libvirt-gpu: warning: %s\n' % said)
    assert said in hook_log(h100) and len(h100.leases()) == 1


def test_metadata_that_is_not_base64_is_refused(h100):
    xml = incoming(th.new_uuid()).replace(
        b"parent='%s'/>" % SOURCE_VF.encode(),
        b"parent='%s' nvidia-metadata='@@'/>" % SOURCE_VF.encode())
    rc, _, err = migrate(h100, xml)
    assert rc == 1 and "nvidia-metadata= is not base64" in err
    assert h100.leases() == []


# --- the metadata attribute -------------------------------------------------

def _parsed(attr):
    from libvirt_gpu.util import xmlutil
    from libvirt_gpu.virt import metadata
    text = ('<domain><metadata><g:gpus xmlns:g="urn:libvirt-gpu:1">'
            '<g:vgpu uuid="%s" type="nvidia-1300" %s/></g:gpus></metadata>'
            '</domain>' % (th.new_uuid(), attr))
    return metadata.parse(xmlutil.parse(text, 'test'))


def test_the_source_s_metadata_round_trips_through_our_xml():
    from libvirt_gpu.util import xmlutil
    from libvirt_gpu.virt import metadata
    raw = source_metadata()
    entry = metadata.VgpuEntry(objects.Uuid.new(),
                               objects.TypeId.parse('nvidia-1300'),
                               driver_metadata=raw)
    text = metadata.render_document(metadata.GpuMetadata(vgpus=(entry,)))
    assert 'nvidia-metadata="%s"' % base64.b64encode(raw).decode() in text
    back = metadata.parse(xmlutil.parse(
        '<domain><metadata>%s</metadata></domain>' % text, 'test'))
    assert back.vgpus == (entry,)
    assert 'nvidia-metadata' not in metadata.render(metadata.GpuMetadata(
        vgpus=(metadata.VgpuEntry(entry.uuid, entry.type_id),)))


@pytest.mark.parametrize('value, message', [
    ('', 'is not base64'), ('QUJ', 'is not base64'),
    ('QUJD\u00e9', 'is not base64'),
    ('A' * 5465, "is longer than NVIDIA's metadata of a vGPU can be "
                 r"\(4096 bytes at most\)"),
])
def test_metadata_that_cannot_be_nvidia_s_is_refused(value, message):
    from libvirt_gpu import exception
    with pytest.raises(exception.MetadataError, match=message):
        _parsed('nvidia-metadata="%s"' % value)


def test_the_longest_metadata_allowed_is_taken():
    raw = b'\x01' * 4096
    (entry,) = _parsed('nvidia-metadata="%s"'
                       % base64.b64encode(raw).decode()).vgpus
    assert entry.driver_metadata == raw


def test_a_vgpu_without_its_hostdev_is_put_to_every_gpu_here(h100):
    # nothing to reserve for it, but the source's driver says it runs
    # there: NVIDIA's refusal stands; a compatible one passes as before
    uuid = th.new_uuid()
    rc, out, err = migrate(h100, without_hostdev(incoming(
        uuid, source_metadata(driver_version='550.127.05'))))
    assert (rc, out) == (1, b'')
    assert ("vGPU %s (nvidia-1300): NVIDIA's driver allows no live "
            "migration to GPU %s" % (uuid, GPU)) in err
    for xml in (incoming(uuid), incoming(uuid, source_metadata())):
        assert migrate(h100, without_hostdev(xml)) == (0, b'', '')
    assert h100.leases() == []


# --- issue 39: one vGPU named by two hostdevs --------------------------------

def test_one_vgpu_named_by_two_hostdevs_is_refused(tmp_path):
    from tests.doubles import t4_migrate as thm
    from tests.doubles import trees
    with trees.simulated_tree('t4') as (root, profile):
        env = th.Env(root, profile, tmp_path)
        # EXISTING is taken here: one hostdev would be given a new UUID,
        # the other would still hand the guest EXISTING
        xml = thm.incoming_xml(th.EXISTING)
        start = xml.index(b'<hostdev')
        end = xml.index(b'</hostdev>') + len(b'</hostdev>')
        rc, out, err = thm.migrate(env, xml[:end] + xml[start:end]
                                   + xml[end:])
        assert (rc, out) == (1, b'')
        assert ('vGPU %s is named by 2 hostdevs; a vGPU is one hostdev: '
                'remove the others' % th.EXISTING) in err
        assert err.count('\n') == 1 and env.leases() == []
