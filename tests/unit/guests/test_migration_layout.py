"""The source's side of the destination-layout question
(``migration.layout_checks``, in ``migrate --dry-run``): per vGPU, how its
GPU here holds it as this host's NVML reads it (MIG-backed: its type's
GPU-instance profile; mixed-size: its type's placement size; equal-size),
and what the destination's hook needs free there.  On the simulated H100
and L40S (the kernel double and the simulated NVML over one tree)."""

import pytest

from libvirt_gpu import objects
from libvirt_gpu.devices import capacity
from libvirt_gpu.devices.backends import base
from libvirt_gpu.guests import migration
from libvirt_gpu.virt import metadata
from tests.doubles import mig_host as tmc

h100 = tmc.h100
l40s = tmc.l40s


def vgpu_on(host, gpu, type_id):
    """A vGPU of ``type_id`` made on a free VF of ``gpu`` as the hook makes
    it; its metadata entry."""
    uuid = objects.Uuid.new()
    vf = host.backend.choose_vf(gpu, type_id)
    host.backend.prepare(base.VgpuDevice(uuid=uuid, parent=vf,
                                         type_id=type_id))
    return metadata.VgpuEntry(uuid, type_id, vf)


def answer(host, *entries, nvml=True):
    meta = metadata.GpuMetadata(vgpus=entries)
    return migration.layout_checks(meta, host.nvml if nvml else None,
                                   host.sysfs)


def test_a_mig_backed_vgpu_needs_a_gi_of_its_profile(h100):
    h100.mig(tmc.H100, [tmc.GI_1G_10GB] * 2 + [tmc.GI_3G_40GB])
    entry = vgpu_on(h100, tmc.H100, tmc.H100_1_10C)
    (a,) = answer(h100, entry)
    assert (a.uuid, a.type_id, a.mode, a.needs) == (
        entry.uuid, tmc.H100_1_10C, capacity.MODE_MIG,
        'a GPU instance of profile 1g.10gb with room')
    assert a.detail.startswith('mig-backed here: the destination\'s hook '
                               'reserves it only on a GPU with a GPU '
                               'instance of profile 1g.10gb with room')


def test_a_mixed_size_vgpu_needs_a_placement_of_its_size(l40s):
    l40s.mixed(tmc.L40S)
    entry = vgpu_on(l40s, tmc.L40S, tmc.L40S_12Q)
    (a,) = answer(l40s, entry)
    assert (a.mode, a.needs) == (capacity.MODE_MIXED,
                                 'a free placement of size 8')


def test_an_equal_size_vgpu_needs_room_for_its_type(l40s):
    l40s.vfs(tmc.L40S, 16)
    entry = vgpu_on(l40s, tmc.L40S, tmc.L40S_12Q)
    (a,) = answer(l40s, entry)
    assert (a.mode, a.needs) == (capacity.MODE_EQUAL,
                                 'room for the type (equal-size)')


def test_without_nvml_here_it_is_said_and_left_to_the_destination(l40s):
    l40s.mixed(tmc.L40S)
    entry = vgpu_on(l40s, tmc.L40S, tmc.L40S_12Q)
    (a,) = answer(l40s, entry, nvml=False)
    assert (a.mode, a.needs) == (None, None)
    assert a.detail == (
        "its GPU's vGPU mode not read here (NVML is not used on this "
        "host): the destination's hook judges it against its own layout")


@pytest.mark.parametrize('parent', [None, '0000:99:00.0'])
def test_a_vgpu_whose_gpu_nvml_does_not_know_is_not_read(l40s, parent):
    entry = metadata.VgpuEntry(
        objects.Uuid.new(), tmc.L40S_12Q,
        objects.PciAddress.parse(parent) if parent else None)
    (a,) = answer(l40s, entry)
    assert (a.mode, a.needs) == (None, None)
    assert ('no GPU of it named here' if parent is None else
            'NVML cannot tell of its GPU 0000:99:00.0: NVML lists no GPU '
            '0000:99:00.0'
            ) in a.detail


def test_the_answers_in_the_dry_run_s_json_and_text():
    from libvirt_gpu.cmd import output
    from libvirt_gpu.guests import api
    uuid = objects.Uuid.new()
    plan = migration.Plan(
        domain='vm1', dest_uri='qemu+ssh://b/system', checks=(),
        layout=(migration.LayoutAnswer(
            uuid=uuid, type_id=tmc.H100_1_10C, mode=capacity.MODE_MIG,
            needs='a GPU instance of profile 1g.10gb with room',
            detail='mig-backed here: ...'),))
    assert output.migration_to_json(api.Migration(plan=plan))['layout'] == [
        {'vgpu': str(uuid), 'type': 'nvidia-1308', 'mode': 'mig-backed',
         'needs': 'a GPU instance of profile 1g.10gb with room',
         'detail': 'mig-backed here: ...'}]
    assert output.migration_checks_text(plan).splitlines()[-1] == (
        '  ask  destination layout for vGPU %s (nvidia-1308): mig-backed '
        'here: ...' % uuid)
