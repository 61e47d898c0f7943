"""The source's side of NVIDIA's migration rule (guests/migration.py):
``stamp`` writes NVIDIA's metadata of each vGPU, as this host's NVML
reads it now, into the running domain's live metadata (what libvirt sends
to the destination's hook); ``check`` says per vGPU what was read and who
answers.  On a fake libvirt domain and the simulated H100's NVML."""

import base64

from libvirt_gpu.devices import nvml
from libvirt_gpu.guests import migration
from libvirt_gpu import objects
from libvirt_gpu.virt import guest as guest_mod
from libvirt_gpu.virt import metadata
from tests.doubles import fake_libvirt
from tests.doubles import t4_hook as th
from tests.doubles import vendor_world as tv
from tests.doubles import h100_nvml as tn


def running(tmp_path, uuid, parent=tn.VF, driver_metadata=None):
    conn = fake_libvirt.FakeConnection(str(tmp_path / 'doms'))
    meta = metadata.render_document(metadata.GpuMetadata(vgpus=(
        metadata.VgpuEntry(objects.Uuid.parse(uuid),
                           objects.TypeId.parse('nvidia-1300'),
                           objects.PciAddress.parse(parent),
                           driver_metadata=driver_metadata),)))
    xml = tv.vf_domain_xml(uuid, parent, type_id='nvidia-1300').decode()
    xml = xml.replace(xml[xml.index('<gpu:gpus'):xml.index('</metadata>')],
                      meta)
    return guest_mod.Guest(conn.define(xml, active=True))


def live_entry(guest):
    (entry,) = guest.devices()[1].vgpus
    return entry


def test_stamp_writes_what_nvml_reads_now(tmp_path):
    uuid = th.new_uuid()
    guest = running(tmp_path, uuid)
    here = nvml.Nvml(tn.host(tn.h100(driver_version='550.127.05'))[1])
    assert migration.stamp(guest, here) is not None
    raw = live_entry(guest).driver_metadata
    assert nvml._vgpu_struct(here._module, raw).hostDriverVersion == \
        '550.127.05'
    # the live XML libvirt sends carries it, base64
    assert 'nvidia-metadata="%s"' % base64.b64encode(raw).decode() in \
        guest._domain.XMLDesc(0)
    assert migration.stamp(guest, here) is None         # nothing changed


def test_a_stale_stamp_is_dropped_when_nvml_reads_nothing(tmp_path):
    guest = running(tmp_path, th.new_uuid(), parent='0000:4e:00.6',
                    driver_metadata=b'old host')
    here = nvml.Nvml(tn.host(tn.h100())[1])          # no vGPU on :00.6
    assert migration.stamp(guest, here) is not None
    assert live_entry(guest).driver_metadata is None


def test_the_plan_says_per_vgpu_what_was_read_and_who_answers(tmp_path):
    uuid = objects.Uuid.parse(th.new_uuid())
    meta = metadata.GpuMetadata(vgpus=(metadata.VgpuEntry(
        uuid, objects.TypeId.parse('nvidia-1300'),
        objects.PciAddress.parse(tn.VF)),))
    (read,) = migration.driver_checks(meta, nvml.Nvml(tn.host(tn.h100())[1]))
    assert (read.uuid, read.read, read.host_driver) == (uuid, True,
                                                        '580.95.02')
    assert read.detail == (
        "NVIDIA's metadata of it read here (host driver 580.95.02); the "
        "destination's hook asks NVIDIA's driver there "
        "(nvmlGetVgpuCompatibility) and refuses before anything is copied "
        "unless it allows a live migration")
    (none,) = migration.driver_checks(meta, None)
    assert (none.read, none.host_driver) == (False, None)
    assert none.detail == (
        "NVIDIA's metadata of it not read here (NVML is not used on this "
        "host): the destination's hook cannot ask NVIDIA's driver and makes "
        "today's checks only")
    (absent,) = migration.driver_checks(meta, nvml.Nvml(
        tn.host(tn.h100(), vgpu=False)[1]))
    assert not absent.read
    assert 'NVML lists no vGPU instance of it' in absent.detail
