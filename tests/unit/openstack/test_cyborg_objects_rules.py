"""What Cyborg is told of a host whose ``[routes]/cyborg`` names only some
GPUs (openstack/cyborg_objects.py ``host_devices``), that the
rest of the unit layer left open (docs/dev/mutation.md): a GPU not given
to Cyborg is reported with nothing to offer and the reason names the
route that has it; a VF is never such a GPU; Cyborg's vGPUs are offered
as its own resource class, a class the operator chose kept."""

from libvirt_gpu import objects
from libvirt_gpu.openstack import cyborg_objects
from libvirt_gpu.util import records
from tests.doubles import fakes

A, B, C = '0000:3b:00.0', '0000:5e:00.0', '0000:af:00.0'


class GpuOptions:
    report_gpu_traits = False
    pgpu_vendor_ids = ('10de',)


def enabled(resource_class='VGPU'):
    return records.replace(objects.EnabledType(
        objects.TypeId.parse('nvidia-223')), resource_class=resource_class)


def offered(devices):
    """``{cpid_info: [(rc of each deployable), ...]}``."""
    return {d.controlpath_id.cpid_info: [
        a.value for dep in d.deployable_list for a in dep.attribute_list
        if a.key == 'rc'] for d in devices}


def test_gpus_not_given_to_cyborg_offer_nothing_and_say_whose_they_are():
    a, b, c = (fakes.gpu(x) for x in (A, B, C))
    vf = records.replace(fakes.gpu('0000:5e:00.4'), physfn=b.address)
    on = {g.address: enabled() for g in (a, b, c)}
    devices, why = cyborg_objects.host_devices(
        'h', [a, b, vf, c], on, GpuOptions, cyborg=[a.address],
        routes={b.address: 'given to Nova\'s own vGPUs (nova.conf)'})
    found = offered(devices)
    assert found[cyborg_objects.pci_info(a.address)] == [
        cyborg_objects.CYBORG_VGPU_RC]
    assert found[cyborg_objects.pci_info(b.address)] == []
    assert found[cyborg_objects.pci_info(c.address)] == []
    assert why == {
        b.address: 'not given to Cyborg ([routes]/cyborg does not name '
                   'it): given to Nova\'s own vGPUs (nova.conf)',
        c.address: 'not given to Cyborg ([routes]/cyborg does not name '
                   'it): libvirt-gpu\'s own guests'}


def test_without_routes_every_gpu_is_offered_as_it_is_configured():
    a, b = fakes.gpu(A), fakes.gpu(B)
    devices, why = cyborg_objects.host_devices(
        'h', [a, b], {a.address: enabled(), b.address: enabled()},
        GpuOptions)
    assert set(map(tuple, offered(devices).values())) == {('VGPU',)}
    assert why == {}


def test_cyborgs_class_replaces_vgpu_only():
    assert cyborg_objects.cyborg_setting(None) is None
    assert cyborg_objects.cyborg_setting(enabled()).resource_class == \
        cyborg_objects.CYBORG_VGPU_RC == 'CUSTOM_CYBORG_VGPU'
    chosen = enabled('CUSTOM_T4_2B')
    assert cyborg_objects.cyborg_setting(chosen) == chosen
