"""The Cyborg driver never hands Cyborg an empty or flapping report by
mistake (issue 30, part 2).

Cyborg's agent replaces its devices with each report (the conductor deletes
every device a driver stops reporting, and a device whose resource class
changes loses its accelerators), so a host read wrongly must make
``discover()`` raise (the agent then sends nothing and keeps what it has),
never report 0 devices or a vGPU GPU as a whole one.  Simulated hosts
(``libvirt_gpu.simulator``): sysfs plus libvirt's test driver on the
host's ``node.xml``, as
``tests/unit/openstack/test_cyborg_driver_golden.py`` reads them.
"""

import json
import os

import pytest

from libvirt_gpu import conf as conf_mod
from libvirt_gpu import exception
from libvirt_gpu.openstack import cyborg_driver
from libvirt_gpu.util import records
from tests.doubles.cyborg_host import host_conf
from tests.doubles.cyborg_host import t4
from tests.doubles.cyborg_host import write_conf
from tests.doubles.cyborg_host import write_host

T4_GPUS = ('0000:3b:00.0', '0000:af:00.0')
TYPE = 'nvidia-223'
# Offered whole with no vGPU type enabled: the GPU at af:00.0 holds two
# vGPUs now, so it is reported with no deployable (cyborg_objects.withheld).
WHOLE = {'0000:3b:00.0': 'PGPU', '0000:af:00.0': None}


def report(path):
    """``{address: resource class or None (no deployable)}`` of a
    discovery."""
    found = {}
    for device in cyborg_driver.discover_records('host-1', path):
        bdf = json.loads(device.controlpath_id.cpid_info)
        address = '%(domain)s:%(bus)s:%(device)s.%(function)s' % bdf
        rc = None
        for dep in device.deployable_list:
            rc = {a.key: a.value for a in dep.attribute_list}['rc']
        found[address] = rc
    return found


# -- [gpu]/pgpu_vendor_ids: the forms an operator writes ------------------

@pytest.mark.parametrize('written', ['0x10de', '10DE', '10de', ' 0X10dE '])
def test_every_form_of_a_vendor_id_reports_the_gpus(tmp_path, written):
    path = host_conf(tmp_path, gpu_lines=['pgpu_vendor_ids = %s' % written])
    assert report(path) == WHOLE


def test_a_vendor_id_is_held_as_discovery_has_it(tmp_path):
    path = host_conf(tmp_path, gpu_lines=['pgpu_vendor_ids = 0x10DE, 1A03'])
    assert conf_mod.load(path).gpu.pgpu_vendor_ids == ['10de', '1a03']


@pytest.mark.parametrize('written', ['nvidia', '10de0', '0x1g00', 'x10de'])
def test_another_form_is_refused_naming_the_option(tmp_path, written):
    path = host_conf(tmp_path, gpu_lines=['pgpu_vendor_ids = %s' % written])
    with pytest.raises(exception.ConfigError) as e:
        conf_mod.load(path)
    message = str(e.value)
    assert '[gpu]/pgpu_vendor_ids' in message
    assert repr(written.strip()) in message
    assert '0x10de' in message and '10DE' in message


def test_the_driver_raises_on_a_bad_vendor_id(tmp_path):
    path = host_conf(tmp_path, gpu_lines=['pgpu_vendor_ids = nvidia'])
    with pytest.raises(exception.ConfigError, match='pgpu_vendor_ids'):
        cyborg_driver.discover_records('host-1', path)


# -- [libvirt]/connection_uri: one that cannot describe this host ---------

@pytest.mark.parametrize('uri', [
    'test:///default', 'test://', 'qemu+ssh://other/system',
    'qemu://other/system', 'qemu+tcp:///system', 'qemu+tls://10.0.0.2/system',
])
def test_a_uri_that_cannot_describe_this_host_is_refused(tmp_path, uri):
    path = host_conf(tmp_path, uri=uri)
    with pytest.raises(cyborg_driver.ReportRefused) as e:
        cyborg_driver.discover_records('host-1', path)
    assert '[libvirt]/connection_uri = %s' % uri in str(e.value)
    assert 'qemu:///system' in str(e.value)


@pytest.mark.parametrize('uri', ['qemu:///system', 'qemu+unix:///system',
                                 'qemu:///session'])
def test_a_uri_of_this_host_is_accepted(uri):
    assert cyborg_driver.uri_refusal(uri) is None


def test_a_simulated_host_file_is_accepted(tmp_path):
    assert report(host_conf(tmp_path)) == WHOLE


# -- nothing visible at all ---------------------------------------------

def test_an_empty_pci_bus_is_refused(tmp_path):
    """A sysfs tree whose bus/pci/devices is empty (and libvirt seeing no
    device either): not a host without GPUs, a host not read."""
    root = tmp_path / 'sys'
    node_xml = write_host(str(root), records.replace(t4(), devices=()))
    assert os.listdir(str(root / 'bus' / 'pci' / 'devices')) == []
    path = write_conf(str(tmp_path / 'libvirt-gpu.conf'), str(root),
                      'test://%s' % node_xml)
    with pytest.raises(cyborg_driver.ReportRefused) as e:
        cyborg_driver.discover_records('host-1', path)
    message = str(e.value)
    assert 'no GPU' in message and 'bus/pci/devices' in message
    assert str(root) in message
    assert 'enabled_drivers' in message
    assert 'Cyborg keeps the devices it has' in message


# -- a vGPU GPU whose types cannot be read now ---------------------------

SINGLE = ['enabled_vgpu_types = %s' % TYPE]
SECTIONS = ['[vgpu_%s]' % TYPE, 'device_addresses = %s' % ', '.join(T4_GPUS)]


def test_a_vgpu_gpu_is_reported_as_vgpu(tmp_path):
    path = host_conf(tmp_path, gpu_lines=SINGLE)
    assert report(path) == dict.fromkeys(T4_GPUS, 'CUSTOM_CYBORG_VGPU')


@pytest.mark.parametrize('sections', [(), SECTIONS],
                         ids=['every-gpu-that-offers-it', 'named'])
def test_a_vgpu_gpu_without_types_now_is_never_offered_whole(
        tmp_path, sections):
    path = host_conf(tmp_path, t4(vanished=T4_GPUS[:1]), SINGLE, sections)
    with pytest.raises(exception.LibvirtGpuError) as e:
        cyborg_driver.discover_records('host-1', path)
    assert T4_GPUS[0] in str(e.value)


def test_a_vgpu_only_host_never_leaves_a_flapping_gpu_out(tmp_path):
    """With no vendor offered whole, the GPU would be missing from the
    report instead (and Cyborg would delete its device)."""
    path = host_conf(tmp_path, t4(vanished=T4_GPUS[:1]),
                     SINGLE + ['pgpu_vendor_ids ='])
    with pytest.raises(cyborg_driver.ReportRefused) as e:
        cyborg_driver.discover_records('host-1', path)
    assert 'left out of the report' in str(e.value)
    assert report(host_conf(tmp_path / 'ok', gpu_lines=SINGLE + [
        'pgpu_vendor_ids ='])) == dict.fromkeys(T4_GPUS, 'CUSTOM_CYBORG_VGPU')


def test_the_refusal_says_why_and_what_to_do(tmp_path):
    path = host_conf(tmp_path, t4(vanished=T4_GPUS[:1]), SINGLE)
    with pytest.raises(cyborg_driver.ReportRefused) as e:
        cyborg_driver.discover_records('host-1', path)
    message = str(e.value)
    assert 'lists no vGPU type now' in message
    assert 'PGPU' in message and 'vfio-pci' in message
    assert '[vgpu_%s]/device_addresses' % TYPE in message


def test_a_gpu_bound_to_vfio_is_offered_whole_beside_vgpus(tmp_path):
    """The rule is not "no PGPU with a vGPU type enabled": a GPU given to
    vfio-pci goes whole to guests (the host really is so)."""
    profile = t4(vanished=T4_GPUS[:1])
    profile = records.replace(profile, devices=tuple(
        records.replace(d, driver='vfio-pci') if d.address == T4_GPUS[0]
        else d for d in profile.devices))
    path = host_conf(tmp_path, profile, SINGLE)
    assert report(path) == {T4_GPUS[0]: 'PGPU',
                            T4_GPUS[1]: 'CUSTOM_CYBORG_VGPU'}


@pytest.mark.parametrize('sections', [(), SECTIONS],
                         ids=['every-gpu-that-offers-it', 'named'])
def test_a_flapping_gpu_never_changes_the_report(tmp_path, sections):
    """The types vanish and come back between reads, in every order the
    two reads (libvirt's node devices, then sysfs) can see them: each
    discovery reports both GPUs as vGPU GPUs, or raises; never a GPU
    missing or offered whole."""
    states = {'there': t4(), 'gone': t4(vanished=T4_GPUS[:1])}
    written = {}
    for name, profile in states.items():
        root = str(tmp_path / name)
        written[name] = (root, write_host(root, profile))
    outcomes = []
    for libvirt_sees in ('there', 'gone', 'there', 'gone'):
        for sysfs_sees in ('there', 'gone', 'gone', 'there'):
            path = write_conf(str(tmp_path / 'libvirt-gpu.conf'),
                              written[sysfs_sees][0],
                              'test://%s' % written[libvirt_sees][1],
                              SINGLE, sections)
            try:
                found = report(path)
            except exception.LibvirtGpuError:
                outcomes.append('refused')
                continue
            assert found == dict.fromkeys(T4_GPUS, 'CUSTOM_CYBORG_VGPU'), (
                libvirt_sees, sysfs_sees)
            outcomes.append('CUSTOM_CYBORG_VGPU')
    assert 'CUSTOM_CYBORG_VGPU' in outcomes and 'refused' in outcomes
