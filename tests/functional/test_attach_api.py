"""libvirt_gpu.guests.api against a file-backed libvirt stand-in and a
simulated T4 host whose sysfs writes act like the kernel's.

What stays here is what a real libvirtd and kernel cannot be made to do on
cue: libvirt refusing a hot-plug, metadata that cannot be written, the
--current rules checked fast for every domain state.  The live attach and
detach themselves run on a real kernel and libvirtd in tests/kernel
(test_hotplug.py); test_attach.py runs the config paths on a real libvirtd.
"""

import contextlib
import uuid as uuidlib

import pytest
import xml.etree.ElementTree as ET

from libvirt_gpu.guests import api
from libvirt_gpu import conf as conf_mod
from libvirt_gpu.devices import discovery
from libvirt_gpu import exception
from libvirt_gpu.virt import metadata
from libvirt_gpu import objects
from libvirt_gpu import simulator
from libvirt_gpu.store import state
from libvirt_gpu.util import xmlutil
from tests.doubles import fake_libvirt
from tests.doubles import kernel_sysfs
from tests.doubles import kinds
from tests.functional import libvirtd

A = objects.PciAddress.parse('0000:3b:00.0')
B = objects.PciAddress.parse('0000:af:00.0')


class World(object):
    """fake_libvirt's connection over a simulated T4 host whose sysfs
    writes the kernel's rule book answers (tests/doubles/kernel_sysfs).
    The same paths run on a real kernel and libvirtd in tests/kernel."""

    def __init__(self, root, profile, tmp_path, extra=''):
        self.sysfs = kernel_sysfs.KernelSysfs(root, profile)
        self.state_dir = str(tmp_path / 'state')
        path = tmp_path / 'libvirt-gpu.conf'
        path.write_text('[DEFAULT]\nsysfs_root = %s\nstate_dir = %s\n'
                        '[gpu]\nenabled_vgpu_types = nvidia-223\n%s'
                        % (root, self.state_dir, extra))
        self.conf = conf_mod.load(str(path))
        self.conn = fake_libvirt.FakeConnection(tmp_path / 'domains')

    def domain(self, name, active=True, persistent=True):
        return self.conn.define(libvirtd.tiny_domain_xml(name),
                                active=active, persistent=persistent)

    def call(self, func, *args, **kwargs):
        return func(self.conn, *args, conf=self.conf, sysfs=self.sysfs,
                    **kwargs)

    def xml(self, dom, inactive=False):
        import libvirt
        return xmlutil.parse(dom.XMLDesc(
            libvirt.VIR_DOMAIN_XML_INACTIVE if inactive else 0))

    def meta(self, dom, inactive=False):
        return metadata.parse(self.xml(dom, inactive))

    def mdev_hostdevs(self, dom, inactive=False):
        return [a.get('uuid') for a in self.xml(dom, inactive).iterfind(
            "devices/hostdev[@type='mdev']/source/address")]

    def mdevs(self):
        """{uuid: (parent, type)} as the simulated kernel holds them."""
        return {m.uuid: (g.address, m.type_id)
                for g in discovery.from_sysfs(self.sysfs,
                                              kinds=kinds.registered()).gpus
                for m in g.mdevs}

    def leases(self):
        return state.LeaseStore(self.state_dir).leases()


@contextlib.contextmanager
def simulated_tree(tmp_path, name='t4'):
    profile = simulator.load_profile(name)
    root = str(tmp_path / 'sys')
    simulator.write_sysfs(profile, root)
    yield root, profile


@pytest.fixture
def world(tmp_path):
    with simulated_tree(tmp_path) as (root, profile):
        yield World(root, profile, tmp_path)


def test_live_attach_creates_and_hotplugs(world):
    dom = world.domain('vm1')
    done = world.call(api.attach, 'vm1', vgpu_type='nvidia-223', live=True)
    assert done.kind == 'vgpu' and done.live and not done.config
    assert done.parent == A                     # the GPU with most room
    assert world.mdevs()[done.uuid] == (A, 'nvidia-223')
    assert world.mdev_hostdevs(dom) == [done.uuid]
    assert world.meta(dom).vgpus == (metadata.VgpuEntry(
        done.uuid, 'nvidia-223', A),)
    assert world.mdev_hostdevs(dom, inactive=True) == []   # live only
    (lease,) = world.leases()
    assert (lease.vgpu_uuid, lease.domain_uuid, lease.state) == (
        done.uuid, dom.uuid, state.CREATED)


def test_live_attach_prefers_the_guests_numa_node(world):
    # B (node 1) holds two vGPUs, A (node 0) none: a guest pinned to node 1
    # gets B all the same; an unpinned one gets A (the most room)
    xml = libvirtd.tiny_domain_xml('vm1').replace(
        '<devices>', "<numatune><memory mode='strict' nodeset='1'/>"
                     "</numatune><devices>", 1)
    assert '<numatune>' in xml
    world.conn.define(xml, active=True, persistent=True)
    done = world.call(api.attach, 'vm1', vgpu_type='nvidia-223', live=True)
    assert done.parent == B
    world.domain('vm2')
    done = world.call(api.attach, 'vm2', vgpu_type='nvidia-223', live=True)
    assert done.parent == A


def test_live_and_config(world):
    dom = world.domain('vm1')
    done = world.call(api.attach, dom.uuid, vgpu_type='nvidia-223',
                      live=True, config=True)
    assert done.parent == A
    assert world.mdev_hostdevs(dom, inactive=True) == [done.uuid]
    # the persistent config names no GPU: chosen again at each start
    assert world.meta(dom, inactive=True).vgpus == (metadata.VgpuEntry(
        done.uuid, 'nvidia-223', None),)
    # ... unless the caller chose one
    pinned = world.call(api.attach, dom.uuid, vgpu_type='nvidia-223',
                        parent=str(B), live=True, config=True)
    assert pinned.parent == B
    assert world.meta(dom, inactive=True).vgpu(pinned.uuid).parent == B


def test_current_means_config_when_stopped(world):
    dom = world.domain('vm1', active=False)
    done = world.call(api.attach, 'vm1', vgpu_type='nvidia-223')
    assert (done.live, done.config, done.parent) == (False, True, None)
    assert done.uuid not in world.mdevs()      # at next start
    assert world.leases() == []
    assert world.mdev_hostdevs(dom, inactive=True) == [done.uuid]
    assert world.meta(dom, inactive=True).vgpu(done.uuid).parent is None


def test_current_means_live_when_running(world):
    dom = world.domain('vm1')
    done = world.call(api.attach, 'vm1', vgpu_type='nvidia-223')
    assert (done.live, done.config) == (True, False)
    assert done.uuid in world.mdevs()
    assert world.mdev_hostdevs(dom) == [done.uuid]


def test_live_on_a_stopped_domain_is_refused(world):
    world.domain('vm1', active=False)
    with pytest.raises(exception.DomainStateError, match='not running'):
        world.call(api.attach, 'vm1', vgpu_type='nvidia-223', live=True)
    assert world.leases() == []


def test_config_on_a_transient_domain_is_refused(world):
    world.domain('vm1', persistent=False)
    with pytest.raises(exception.DomainStateError, match='transient'):
        world.call(api.attach, 'vm1', vgpu_type='nvidia-223', config=True)


def test_unknown_domain(world):
    with pytest.raises(exception.DomainNotFound, match='nope'):
        world.call(api.attach, 'nope', vgpu_type='nvidia-223')


def test_type_not_enabled_changes_nothing(world):
    dom = world.domain('vm1', active=False)
    before = dom.XMLDesc(0)
    with pytest.raises(exception.TypeNotEnabled, match='nvidia-222'):
        world.call(api.attach, 'vm1', vgpu_type='nvidia-222', config=True)
    with pytest.raises(exception.TypeNotEnabled, match='the GPU 0000:af'):
        world.call(api.attach, 'vm1', vgpu_type='nvidia-222',
                   parent=str(B), config=True)
    with pytest.raises(exception.UnknownType):
        world.call(api.attach, 'vm1', vgpu_type='nvidia-999',
                   parent=str(B), config=True)
    assert dom.XMLDesc(0) == before


def test_no_capacity_changes_nothing(world):
    doms = [world.domain('vm%d' % i) for i in range(15)]
    for dom in doms[:14]:
        world.call(api.attach, dom.uuid, vgpu_type='nvidia-223', live=True)
    with pytest.raises(exception.NoCapacity):
        world.call(api.attach, doms[14].uuid, vgpu_type='nvidia-223',
                   live=True)
    assert world.mdev_hostdevs(doms[14]) == []
    assert len(world.leases()) == 14
    assert len(world.mdevs()) == 16    # 14 + 2 pre-existing


def test_failed_hotplug_is_rolled_back(world, monkeypatch):
    dom = world.domain('vm1')

    def refuse(self, xml, flags=0):
        raise fake_libvirt.libvirt_error(
            67, 'unsupported configuration: Mediated host device '
                'assignment requires VFIO support')
    monkeypatch.setattr(fake_libvirt.FakeDomain, 'attachDeviceFlags',
                        refuse)
    before = sorted(world.mdevs())
    with pytest.raises(exception.LibvirtError, match='VFIO'):
        world.call(api.attach, 'vm1', vgpu_type='nvidia-223', live=True)
    assert sorted(world.mdevs()) == before
    assert world.leases() == []
    assert world.meta(dom).empty


def test_failed_metadata_unplugs_again(world, monkeypatch):
    dom = world.domain('vm1')

    def refuse(self, *args):
        raise fake_libvirt.libvirt_error(1, 'internal error: boom')
    monkeypatch.setattr(fake_libvirt.FakeDomain, 'setMetadata', refuse)
    before = sorted(world.mdevs())
    with pytest.raises(exception.LibvirtError, match='boom'):
        world.call(api.attach, 'vm1', vgpu_type='nvidia-223', live=True)
    assert world.mdev_hostdevs(dom) == []
    assert sorted(world.mdevs()) == before
    assert world.leases() == []


def test_detach_live_removes_the_vgpu(world):
    dom = world.domain('vm1')
    done = world.call(api.attach, 'vm1', vgpu_type='nvidia-223', live=True,
                      config=True)
    out = world.call(api.detach, 'vm1', uuid=done.uuid, live=True)
    assert out.note is None
    assert world.mdev_hostdevs(dom) == [] and world.meta(dom).empty
    assert done.uuid not in world.mdevs()
    assert world.leases() == []
    # still in the persistent config until detached there too
    assert world.mdev_hostdevs(dom, inactive=True) == [done.uuid]
    world.call(api.detach, 'vm1', vgpu_type='nvidia-223', config=True)
    assert world.mdev_hostdevs(dom, inactive=True) == []
    assert world.meta(dom, inactive=True).empty


def test_detach_live_after_the_driver_removed_the_vgpu(world):
    # Some NVIDIA drivers remove a guest's mdev themselves: "already gone"
    # is done, and the lease is freed.
    dom = world.domain('vm1')
    done = world.call(api.attach, 'vm1', vgpu_type='nvidia-223', live=True)
    world.sysfs.kernel.remove(done.uuid)
    assert done.uuid not in world.sysfs.kernel.mdevs()
    out = world.call(api.detach, 'vm1', uuid=done.uuid, live=True)
    assert out.note is None
    assert world.mdev_hostdevs(dom) == [] and world.meta(dom).empty
    assert world.leases() == []


def test_detach_errors(world):
    world.domain('vm1', active=False)
    with pytest.raises(exception.DeviceNotAttached, match='nvidia-223'):
        world.call(api.detach, 'vm1', vgpu_type='nvidia-223')
    world.call(api.attach, 'vm1', vgpu_type='nvidia-223')
    world.call(api.attach, 'vm1', vgpu_type='nvidia-223')
    with pytest.raises(exception.InvalidInput, match='holds 2 vGPUs'):
        world.call(api.detach, 'vm1', vgpu_type='nvidia-223')
    with pytest.raises(exception.DeviceNotAttached):
        world.call(api.detach, 'vm1', uuid=str(uuidlib.uuid4()))
    with pytest.raises(exception.InvalidInput):
        world.call(api.detach, 'vm1')


def test_whole_gpu(tmp_path):
    with simulated_tree(tmp_path) as (root, profile):
        # only 0000:af:00.0 offers vGPUs: 0000:3b:00.0 may be passed through
        world = World(root, profile, tmp_path,
                      '[vgpu_nvidia-223]\ndevice_addresses = %s\n' % B)
        dom = world.domain('vm1', active=False)
        done = world.call(api.attach, 'vm1', address=str(A))
        assert (done.kind, done.address, done.config) == ('pgpu', A, True)
        hostdev = world.xml(dom, True).find(
            "devices/hostdev[@type='pci']")
        assert hostdev.get('managed') == 'yes'
        assert world.meta(dom, True).pgpus == (metadata.PgpuEntry(A),)
        with pytest.raises(exception.GpuInUse, match='configured'):
            world.call(api.attach, 'vm1', address=str(B))
        listing = world.call(api.list_devices, 'vm1')
        assert listing.pgpus == (A,) and listing.vgpus == ()
        world.call(api.detach, 'vm1', address=str(A))
        assert world.xml(dom, True).find("devices/hostdev") is None
        assert world.meta(dom, True).empty


def test_gpu_holding_vgpus_is_not_passed_through(tmp_path):
    with simulated_tree(tmp_path) as (root, profile):
        world = World(root, profile, tmp_path,
                      '[vgpu_nvidia-223]\ndevice_addresses = %s\n' % A)
        world.domain('vm1', active=False)
        with pytest.raises(exception.GpuInUse, match='holds 2 vGPU'):
            world.call(api.attach, 'vm1', address=str(B))


def test_list_devices(world):
    dom = world.domain('vm1')
    done = world.call(api.attach, 'vm1', vgpu_type='nvidia-223', live=True)
    foreign = str(uuidlib.uuid4())
    dom.attachDeviceFlags(
        "<hostdev mode='subsystem' type='mdev' model='vfio-pci'><source>"
        "<address uuid='%s'/></source></hostdev>" % foreign, 1)
    got = world.call(api.list_devices, 'vm1')
    assert got.active and not got.inactive_xml
    ours, theirs = got.vgpus
    assert (ours.uuid, ours.parent, ours.exists, ours.leased,
            ours.in_metadata) == (done.uuid, A, True, 'created', True)
    assert (theirs.uuid, theirs.exists, theirs.in_metadata,
            theirs.leased) == (foreign, False, False, None)
    assert ET.tostring(world.xml(dom))      # still a valid domain
