"""A real libvirtd on the live simulated host: node devices, mdevctl and
udev messages end to end, with no GPU in the machine.

One ``LiveHost`` for the module: the FUSE tree bound over the /sys parts
libvirtd reads (``bus/pci/devices``, ``bus/mdev``, ``class/mdev_bus``,
``kernel/iommu_groups`` and the root buses under ``devices/``), a private
``/etc/mdevctl.d``, ``SYSTEMD_DEVICE_VERIFY_SYSFS=0``.  libvirtd learns of
mdevs that come and go from the simulator's udev messages, and creates,
defines and destroys them through the real mdevctl, whose writes the
simulated kernel answers.  Every test leaves the host as it found it.
"""

import json
import os
import time

import pytest

from libvirt_gpu.devices.backends import base
from libvirt_gpu.devices.backends import mdev as mdev_backend
from libvirt_gpu.virt import config_xml
from libvirt_gpu.devices import discovery
from libvirt_gpu import exception
from libvirt_gpu.virt import host as host_mod
from libvirt_gpu import objects
from libvirt_gpu.devices import pciids
from tests.doubles import kinds
from tests.functional import live_sysfs as ls

A = '0000:3b:00.0'
B = '0000:af:00.0'
PRE = ['4b20d080-1b54-4048-85b3-a6a62d165c01',
       'b1ae8bf6-38b0-4c81-9d44-78ce3f520496']

missing = ls.live_host_requirements()
pytestmark = pytest.mark.skipif(bool(missing), reason='; '.join(missing))


class SpyHost(host_mod.Host):
    """A Host that records what went through libvirt."""

    def __init__(self, uri):
        super().__init__(uri)
        self.calls = []

    def create_mdev(self, xml):
        name = super().create_mdev(xml)
        self.calls.append(('create', name))
        return name

    def destroy_mdev(self, uuid):
        done = super().destroy_mdev(uuid)
        self.calls.append(('destroy', uuid, done))
        return done

    def define_mdev(self, xml, autostart=False):
        name = super().define_mdev(xml, autostart=autostart)
        self.calls.append(('define', name))
        return name


@pytest.fixture(scope='module')
def host(tmp_path_factory):
    with ls.LiveHost(tmp_path_factory.mktemp('live-host')) as h:
        yield h


@pytest.fixture(autouse=True)
def restored(host):
    """Whatever a test did, the host is as the profile says afterwards."""
    yield
    live = host.live
    state = live.state()
    for m in state['mdevs']:
        live.idle(m['uuid'])
    for address, st in state['parents'].items():
        if st == 'unbound':
            live.sysfs.write(live.path('bus', 'pci', 'drivers', 'nvidia',
                                       'bind'), address)
    live.set_uevents(True)
    for m in live.state()['mdevs']:
        if m['uuid'] not in PRE:
            live.sysfs.write(live.path('bus', 'mdev', 'devices', m['uuid'],
                                       'remove'), '1')
    for parent in os.listdir(host.mdevctl_dir):
        if parent != 'scripts.d':
            for name in os.listdir(os.path.join(host.mdevctl_dir, parent)):
                os.unlink(os.path.join(host.mdevctl_dir, parent, name))
    assert sorted(m['uuid'] for m in live.state()['mdevs']) == PRE


def new_uuid():
    return objects.Uuid.new()


def vgpu_device(uuid, parent, type_id):
    """A VgpuDevice as the product builds one: the parent parsed."""
    return base.VgpuDevice(objects.Uuid.parse(uuid),
                           objects.PciAddress.parse(parent),
                           objects.TypeId.parse(type_id))


def settled(fn, tries=20):
    """``fn()``, again when a device vanished between libvirt's list and
    the next call (Host.mdev_nodes does not skip such devices)."""
    import libvirt
    for _ in range(tries - 1):
        try:
            return fn()
        except (exception.LibvirtError, libvirt.libvirtError) as e:
            if 'no node device' not in str(e):
                raise
            time.sleep(0.05)
    return fn()


def libvirt_view(host):
    def view():
        with host_mod.Host(host.uri) as h:
            return discovery.from_libvirt(h, host.live.sysfs,
                                          kinds=kinds.registered())
    return settled(view)


def sysfs_view(host):
    # Named from the PCI ID database libvirtd names devices from.
    return discovery.from_sysfs(host.live.sysfs, pci_ids=pciids.PciIds(),
                                kinds=kinds.registered())


def libvirt_mdevs(host, active_only=True):
    def mdevs():
        with host_mod.Host(host.uri) as h:
            return sorted(n.mdev.uuid for n in h.mdev_nodes(active_only))
    return settled(mdevs)


def kernel_mdevs(host):
    return sorted(m['uuid'] for m in host.live.state()['mdevs'])


def test_discovery_through_libvirtd_equals_sysfs(host):
    via_libvirt = libvirt_view(host)
    via_sysfs = sysfs_view(host)
    assert via_libvirt.source == 'libvirt'
    assert [g.address for g in via_libvirt.gpus] == [
        objects.PciAddress.parse(A), objects.PciAddress.parse(B)]
    assert via_libvirt.gpus == via_sysfs.gpus
    gpu = via_libvirt.gpu(objects.PciAddress.parse(B))
    assert gpu.driver == 'nvidia' and gpu.iommu_group == 58
    assert sorted(m.uuid for m in gpu.mdevs) == PRE
    assert gpu.mdev_type('nvidia-223').available_instances == 6
    # a vGPU made behind libvirt's back (a sysfs write): the udev message
    # tells it, and both views still agree, counts included
    u = new_uuid()
    host.live.sysfs.write(host.live.type_path(A, 'nvidia-231', 'create'), u)
    assert ls.wait_for(lambda: u in libvirt_mdevs(host))
    assert libvirt_view(host).gpus == sysfs_view(host).gpus
    assert libvirt_view(host).gpu(objects.PciAddress.parse(A)).mdev_type(
        'nvidia-231').available_instances == 7


def test_create_and_destroy_through_our_api(host, record_property):
    spy = SpyHost(host.uri)
    backend = mdev_backend.MdevBackend(host.live.sysfs, host=spy,
                                       mdevctl_dir=host.mdevctl_dir)
    device = vgpu_device(new_uuid(), A, 'nvidia-223')
    t0 = time.monotonic()
    assert backend.prepare(device) is True
    elapsed = time.monotonic() - t0
    record_property('nodeDeviceCreateXML_s', round(elapsed, 3))
    # libvirt made it (libvirt -> mdevctl -> create), and returned only
    # once the uevent had told it the device exists
    assert spy.calls == [('create', 'mdev_%s_%s' % (
        device.uuid.replace('-', '_'), A.replace(':', '_').replace('.',
                                                                   '_')))]
    assert elapsed < 10, 'libvirt polled: the uevent did not reach it'
    assert device.uuid in kernel_mdevs(host)
    assert device.uuid in libvirt_mdevs(host)
    assert backend.exists(device)
    assert backend.remove(device.uuid) is True
    assert spy.calls[-1] == ('destroy', device.uuid, True)
    assert device.uuid not in kernel_mdevs(host)
    assert ls.wait_for(lambda: device.uuid not in libvirt_mdevs(host))
    assert libvirt_view(host).gpus == sysfs_view(host).gpus


def test_define_persists_mdevctl_json_and_starts(host):
    import libvirt
    spy = SpyHost(host.uri)
    backend = mdev_backend.MdevBackend(host.live.sysfs, host=spy,
                                       mdevctl_dir=host.mdevctl_dir)
    device = vgpu_device(new_uuid(), B, 'nvidia-223')
    backend.define(device)
    assert spy.calls and spy.calls[0][0] == 'define'
    path = os.path.join(host.mdevctl_dir, B, device.uuid)
    with open(path) as f:
        assert json.load(f) == {'mdev_type': 'nvidia-223',
                                'start': 'manual', 'attrs': []}
    found = backend.definition(device.uuid)
    assert (found.parent, found.type_id) == (device.parent, 'nvidia-223')
    # defined, not started: the kernel has no such mdev, libvirt lists it
    # inactive (once its nodedev driver has read mdevctl's answer, which
    # it may do after nodeDeviceDefineXML returns)
    assert device.uuid not in kernel_mdevs(host)
    assert ls.wait_for(
        lambda: device.uuid in libvirt_mdevs(host, active_only=False))
    assert device.uuid not in libvirt_mdevs(host)
    conn = libvirt.open(host.uri)
    try:
        dev = host_mod.Host(host.uri)
        node = dev.find_mdev(device.uuid, inactive=True)
        node.create()                       # mdevctl start -u <uuid>
        assert device.uuid in kernel_mdevs(host)
        assert ls.wait_for(lambda: device.uuid in libvirt_mdevs(host))
        node.destroy()
        assert device.uuid not in kernel_mdevs(host)
        assert backend.undefine(device.uuid) is True
        assert not os.path.exists(path)
        dev.close()
    finally:
        conn.close()


def test_libvirt_refusals_leave_nothing_behind(host):
    spy = SpyHost(host.uri)
    before = kernel_mdevs(host)
    # a UUID the kernel already has: mdevctl's write gets EEXIST
    with pytest.raises(exception.LibvirtError):
        spy.create_mdev(config_xml.mdev_nodedev(
            objects.PciAddress.parse(A), objects.TypeId.parse('nvidia-223'),
            objects.Uuid.parse(PRE[0])))
    # another type on a GPU that holds vGPUs: NVIDIA's EINVAL
    u = new_uuid()
    with pytest.raises(exception.LibvirtError):
        spy.create_mdev(config_xml.mdev_nodedev(
            objects.PciAddress.parse(B), objects.TypeId.parse('nvidia-231'),
            objects.Uuid.parse(u)))
    assert kernel_mdevs(host) == before
    # libvirt may list the refused device for a moment (mdevctl's own
    # bookkeeping); it must not stay
    assert ls.wait_for(lambda: libvirt_mdevs(host) == before)
    # through the backend the same refusal is typed
    backend = mdev_backend.MdevBackend(host.live.sysfs, host=spy,
                                       mdevctl_dir=host.mdevctl_dir)
    with pytest.raises(exception.NoCapacity):
        backend.prepare(vgpu_device(u, B, 'nvidia-231'))
    assert kernel_mdevs(host) == before


def test_libvirtd_depends_on_the_udev_message(host):
    live = host.live
    live.set_uevents(False)
    u = new_uuid()
    live.sysfs.write(live.type_path(A, 'nvidia-223', 'create'), u)
    assert u in kernel_mdevs(host)
    time.sleep(1.0)
    assert u not in libvirt_mdevs(host)       # it did not look
    # "udevadm trigger": the same add event, replayed through the
    # device's uevent attribute
    live.set_uevents(True)
    live.sysfs.write(live.path('bus', 'mdev', 'devices', u, 'uevent'),
                     'add')
    assert ls.wait_for(lambda: u in libvirt_mdevs(host))
    live.sysfs.write(live.path('bus', 'mdev', 'devices', u, 'remove'), '1')
    assert ls.wait_for(lambda: u not in libvirt_mdevs(host))


def test_parent_unbind_seen_by_libvirtd(host):
    live = host.live
    live.sysfs.write(live.path('bus', 'pci', 'drivers', 'nvidia', 'unbind'),
                     B)
    assert ls.wait_for(lambda: not set(PRE) & set(libvirt_mdevs(host)))
    gpu = libvirt_view(host).gpu(objects.PciAddress.parse(B))
    assert (gpu.driver, gpu.mdev_types, gpu.mdevs) == (None, (), ())
    assert libvirt_view(host).gpus == sysfs_view(host).gpus
    live.sysfs.write(live.path('bus', 'pci', 'drivers', 'nvidia', 'bind'),
                     B)
    gpu = libvirt_view(host).gpu(objects.PciAddress.parse(B))
    assert gpu.driver == 'nvidia'
    assert gpu.mdev_type('nvidia-223').available_instances == 8
    # the profile's two vGPUs did not survive; put them back for the others
    for u in PRE:
        live.sysfs.write(live.type_path(B, 'nvidia-223', 'create'), u)
    assert ls.wait_for(lambda: set(PRE) <= set(libvirt_mdevs(host)))


@pytest.mark.parametrize('profile', ['mixed', 'domain', 'sriov'])
def test_discovery_parity_on_other_hosts(profile, tmp_path):
    """Other hardware: GPUs on vfio-pci or without a driver, a PCI domain
    other than 0000, SR-IOV VFs as mdev parents and with NVIDIA's vendor
    interface."""
    if profile == 'sriov':
        profile = ls.sriov_profile_file(tmp_path)
    with ls.LiveHost(tmp_path / 'host', profile=profile) as other:
        via_libvirt = libvirt_view(other)
        via_sysfs = sysfs_view(other)
        assert via_libvirt.gpus == via_sysfs.gpus
        assert len(via_sysfs.gpus) >= 2
        if profile == 'domain':
            assert {g.address.domain for g in via_libvirt.gpus} == {0, 1}
