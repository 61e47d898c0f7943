"""The Cyborg driver's guards before a report (``openstack.cyborg_driver``):
the texts of each refusal, the GPUs it withholds and why, and the options
it ignores.  Each test fails on a change ``make mutation`` made that the
rest of the unit tests stayed green on (docs/dev/mutation.md); the
objects it reports are compared with Cyborg's own in
test_cyborg_driver_golden.py."""

import logging

import pytest

from libvirt_gpu import conf as conf_mod
from libvirt_gpu import conffile
from libvirt_gpu import environment
from libvirt_gpu import objects
from libvirt_gpu.openstack import cyborg_driver
from libvirt_gpu.util import records
from tests.doubles import fakes


def _type(type_id='nvidia-223'):
    return objects.EnabledType(objects.TypeId.parse(type_id))


def _addr(text):
    return objects.PciAddress.parse(text)


# -- cyborg_driver: the guards before a report -----------------------------

@pytest.mark.parametrize('uri,why', [
    ('test:///default', "[libvirt]/connection_uri = test:///default is "
     "libvirt's built-in test host, not this one: set qemu:///system"),
    ('test:', "[libvirt]/connection_uri = test: is libvirt's built-in test "
     "host, not this one: set qemu:///system"),
    ('qemu+ssh:///system', '[libvirt]/connection_uri = qemu+ssh:///system '
     'names another host: Cyborg reports the GPUs of the host it runs on; '
     'set qemu:///system'),
    ('qemu://[::1/system', "[libvirt]/connection_uri 'qemu://[::1/system' "
     "is not a URI (Invalid IPv6 URL)"),
    ('test:///var/lib/node.xml', None),
    ('qemu+unix:///system', None),
])
def test_uri_refusal_texts(uri, why):
    assert cyborg_driver.uri_refusal(uri) == why


def _conf(tmp_path, *lines):
    path = tmp_path / 'libvirt-gpu.conf'
    path.write_text('\n'.join(('[DEFAULT]', 'sysfs_root = %s' % tmp_path,
                               '[gpu]', 'nvml = off') + lines) + '\n')
    return conf_mod.load(str(path))


def _vanished(address, **changes):
    return records.replace(fakes.gpu(address, types=()), **changes)


def test_unreadable_vgpu_gpus_names_each_gpu_without_types(tmp_path):
    conf = _conf(tmp_path, 'enabled_vgpu_types = nvidia-223',
                 'pgpu_vendor_ids = 10de, 1002')
    gone = _vanished('0000:af:00.0')
    amd = _vanished('0000:5e:00.0', vendor_id='1002', driver=None)
    found = cyborg_driver.unreadable_vgpu_gpus(
        [gone, amd, fakes.gpu('0000:3b:00.0'),
         _vanished('0000:86:00.0', driver='vfio-pci'),
         _vanished('0000:87:00.0', vendor_id='1af4'),
         _vanished('0000:88:00.4', physfn=_addr('0000:88:00.0')),
         _vanished('0000:d8:00.0')],
        {_addr('0000:d8:00.0'): _type()}, conf)
    assert list(found) == [amd.address, gone.address]
    assert found[gone.address] == (
        'GPU 0000:af:00.0 lists no vGPU type now (driver nvidia), while '
        '[gpu]/enabled_vgpu_types = nvidia-223 enables it on every GPU '
        'that offers it: its types could not be read (is its driver '
        'reloading, or are its SR-IOV VFs not enabled yet?), and it would '
        'be offered whole (PGPU) instead; if it is meant to go whole to '
        'guests, bind it to vfio-pci or name the vGPU GPUs in '
        '[vgpu_nvidia-223]/device_addresses')
    assert '(driver none)' in found[amd.address]


def test_unreadable_vgpu_gpu_of_a_vendor_not_offered_whole(tmp_path):
    conf = _conf(tmp_path, 'enabled_vgpu_types = nvidia-223',
                 'pgpu_vendor_ids =')
    gone = _vanished('0000:af:00.0')
    found = cyborg_driver.unreadable_vgpu_gpus([gone], {}, conf)
    assert 'it would be left out of the report (Cyborg would delete it);' \
        in found[gone.address]


@pytest.mark.parametrize('lines', [
    (),
    ('enabled_vgpu_types = nvidia-223, nvidia-222',),
    ('enabled_vgpu_types = nvidia-223', '[vgpu_nvidia-223]',
     'device_addresses = 0000:af:00.0'),
])
def test_unreadable_vgpu_gpus_only_for_one_type_on_every_gpu(tmp_path,
                                                             lines):
    conf = _conf(tmp_path, *lines)
    assert cyborg_driver.unreadable_vgpu_gpus(
        [_vanished('0000:af:00.0')], {}, conf) == {}


class Env:
    """What report_refusal reads of an ``environment.Environment``."""

    def __init__(self, gpus, source=None, enabled=None):
        self.discovered = type('Discovered', (), {'gpus': tuple(gpus)})
        self.source = source
        self.sysfs_root = '/srv/sys'
        self.enabled = enabled or {}


def test_report_refusal_of_a_host_without_gpus_names_where_it_read(
        tmp_path):
    conf = _conf(tmp_path)
    why = cyborg_driver.report_refusal(conf, Env(()))
    assert why == (
        'no GPU (PCI display controller) is visible on this host (read '
        'from sysfs at /srv/sys, [DEFAULT]/sysfs_root = /srv/sys): is this '
        'the host\'s own sysfs, with its bus/pci/devices? Cyborg would '
        'delete every device of the host; if the host really has no GPU '
        'any more, remove libvirt_gpu_driver from cyborg.conf\'s '
        '[agent]/enabled_drivers')
    source = environment.Source(uri='qemu:///system')
    assert '(read from libvirt at qemu:///system, [DEFAULT]/sysfs_root' in \
        cyborg_driver.report_refusal(conf, Env((), source))
    assert cyborg_driver.report_refusal(conf, Env([fakes.gpu()])) is None


def test_report_refusal_joins_every_unreadable_gpu(tmp_path):
    conf = _conf(tmp_path, 'enabled_vgpu_types = nvidia-223')
    why = cyborg_driver.report_refusal(conf, Env(
        [_vanished('0000:af:00.0'), _vanished('0000:3b:00.0')]))
    first, second = why.split('; if it is meant')[:2]
    assert first.startswith('GPU 0000:3b:00.0 lists no vGPU type now')
    assert 'devices_addresses' not in why
    assert '/device_addresses; GPU 0000:af:00.0 lists' in why


def test_report_refused_says_cyborg_keeps_its_devices():
    assert str(cyborg_driver.ReportRefused(reason='why')) == (
        'libvirt_gpu_driver refuses to report, so that Cyborg keeps the '
        'devices it has: why')


def test_withheld_gpus_are_logged_warning_only_where_a_type_is_enabled(
        tmp_path, caplog):
    from tests.doubles import cyborg_host
    path = cyborg_host.host_conf(tmp_path)
    # the file named in the environment handed in
    with caplog.at_level(logging.INFO, 'libvirt_gpu'):
        devices = cyborg_driver.discover_records(
            'host-1', environ={conffile.CONFIG_ENV: path})
    assert [d.deployable_list[0].name for d in devices
            if d.deployable_list] == ['host-1_0000:3b:00.0']
    assert len(devices) == 2
    (record,) = [r for r in caplog.records
                 if 'nothing to offer' in r.getMessage()]
    assert record.levelno == logging.INFO
    assert record.getMessage() == (
        '0000:af:00.0: reported to Cyborg with nothing to offer: not '
        'offered whole: it holds vGPUs now (Cyborg could not reserve it)')
    caplog.clear()
    # af:00.0 holds T4-2B vGPUs: no room for a T4-1B beside them
    full = cyborg_host.host_conf(tmp_path / 'full', gpu_lines=[
        'enabled_vgpu_types = nvidia-222'], sections=[
        '[vgpu_nvidia-222]', 'device_addresses = 0000:af:00.0'])
    with caplog.at_level(logging.INFO, 'libvirt_gpu'):
        cyborg_driver.discover_records('host-1', full)
    (record,) = [r for r in caplog.records
                 if 'nothing to offer' in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert record.getMessage().endswith('vGPU type nvidia-222: no room left')


class CyborgConf:
    class gpu_devices:
        enabled_vgpu_types = []
        filter_sriov_vfs = False


def test_ignored_cyborg_options():
    assert cyborg_driver.ignored_cyborg_options(object()) == []
    assert cyborg_driver.ignored_cyborg_options(CyborgConf) == []

    class Set(CyborgConf):
        class gpu_devices:
            enabled_vgpu_types = ['nvidia-223']
            filter_sriov_vfs = True
    assert cyborg_driver.ignored_cyborg_options(Set) == [
        '[gpu_devices]/enabled_vgpu_types',
        '[gpu_devices]/filter_sriov_vfs']

    class Filter(CyborgConf):
        class gpu_devices:
            enabled_vgpu_types = []
            filter_sriov_vfs = True
    assert cyborg_driver.ignored_cyborg_options(Filter) == [
        '[gpu_devices]/filter_sriov_vfs']


def test_only_the_driver_class_is_built_on_access():
    with pytest.raises(AttributeError) as e:
        cyborg_driver.NoSuchThing
    assert str(e.value) == ("module 'libvirt_gpu.openstack.cyborg_driver' "
                            "has no attribute 'NoSuchThing'")
