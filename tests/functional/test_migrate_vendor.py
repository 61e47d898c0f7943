"""A vendor-interface (vGPU 17+) guest migrating live between two live
simulated L40S hosts, each a FUSE tree with its own real libvirtd (its
own host UUID) and our hook: the guest holds its VF as ``<hostdev
type='pci' managed='no'>``; the destination's ``migrate`` hook chooses a
free VF there and names it in the XML, its ``prepare`` writes the type to
that VF before QEMU starts there, and the source's ``release`` writes 0
to the source's VF once the guest left; a migration whose incoming QEMU
fails leaves the destination's VF as it was (its ``release`` writes 0).

What this host lacks for a guest to hold a VF is stood in for, and
nothing else:

* VFIO: libvirt starts a PCI hostdev only where ``/dev/vfio/vfio``
  exists, so each daemon's namespace gets a ``/dev/vfio`` of empty files
  (``namespaces = [ ]``: QEMU runs in the daemon's namespace, where they
  are); and the guest's emulator is ``qemu-wrapper``, which starts this
  host's QEMU without the ``vfio-pci`` device (nothing can open a
  simulated VF).  So the VF carries no device state; the guest's memory
  migrates for real.
* The VFs' driver: libvirt 9.0 takes an unmanaged PCI hostdev only bound
  to ``vfio-pci``, so the profile (``l40s``) binds the second L40S's VFs
  to it (their vendor-interface files are the simulated driver's all the
  same), and the tree's ``bus/pci/drivers`` is bound where libvirt
  resolves the driver link.
* Locked memory: libvirt limits a VFIO guest's locked memory to its
  ``<memtune><hard_limit>``, which is set to this container's hard
  ``RLIMIT_MEMLOCK`` (no cgroups: it limits nothing else).

A failed migration: ``qemu-wrapper`` exits at once when it is started
for an incoming migration while ``FAIL_INCOMING`` exists (the
destination's QEMU dies after its ``prepare``)."""

import json
import os
import resource
import stat
import sys
import uuid as uuidlib

import pytest

from libvirt_gpu import objects
from libvirt_gpu.devices.backends import nvidia_vgpu
from libvirt_gpu.devices.backends.nvidia_vgpu.files import (
    VendorFiles as vendor)
from libvirt_gpu.simulator import loading
from libvirt_gpu.virt import metadata
from tests.doubles import poll
from tests.functional import hook_guests as hg
from tests.functional import libvirtd as libvirtd_mod
from tests.functional import live_sysfs as ls
from tests.functional import migration_hosts as tmn
from tests.functional import vendor_probe as tlv

TYPE = 'nvidia-1145'                     # L40S-1B
GPU = '0000:bd:00.0'                     # the empty L40S, VFs on vfio-pci
SOURCE_VF = '0000:bd:00.4'
HELD = tlv.L40S_PRE                      # the profile's two, not ours
PRE = {vf: 1145 for vf in HELD}          # as the probe reads them

missing = ls.live_host_requirements()
pytestmark = pytest.mark.skipif(bool(missing), reason='; '.join(missing))

WRAPPER = r'''#!%(python)s -I
import os
import sys
args = sys.argv[1:]
if '-incoming' in args and os.path.exists(%(fail)r):
    sys.exit('qemu-wrapper: the incoming QEMU fails (simulated)')
kept = []
while args:
    arg = args.pop(0)
    if arg == '-device' and args and 'vfio-pci' in args[0]:
        args.pop(0)
        continue
    kept.append(arg)
os.execv(%(qemu)r, [%(qemu)r] + kept)
'''


class Host(tmn.Host):
    """``migration_hosts``' host (own host UUID, ``ext_uri``), its
    daemon seeing ``/dev/vfio`` and the tree's drivers."""

    def start(self):
        vfio = os.path.join(self.workdir, 'vfio')
        os.makedirs(vfio)
        groups = {d['iommu_group'] for d in self.profile_data['devices']}
        for name in ['vfio'] + sorted(str(g) for g in groups):
            open(os.path.join(vfio, name), 'w').close()
        for sub in ('callouts', 'notifiers'):
            os.makedirs(os.path.join(self.mdevctl_dir, 'scripts.d', sub),
                        exist_ok=True)
        self.live.start()
        self.daemon = libvirtd_mod.LibvirtDaemon(
            hooks=self.hooks(self.live),
            binds=self.live.libvirt_binds() + [
                (self.mdevctl_dir, '/etc/mdevctl.d'), (vfio, '/dev/vfio'),
                (self.live.path('bus', 'pci', 'drivers'),
                 '/sys/bus/pci/drivers')],
            env={'SYSTEMD_DEVICE_VERIFY_SYSFS': '0'},
            qemu_conf='namespaces = [ ]',
            libvirtd_conf='host_uuid = "%s"' % uuidlib.uuid4())
        self.daemon.start()
        self.ext_uri = self.relay()
        return self

    def relay(self):
        relay = os.path.join(self.workdir, 'relay.sh')
        with open(relay, 'w') as f:
            f.write('#!/bin/sh\nexec %s -I %s %s\n' % (
                sys.executable, tmn.RELAY, self.daemon.socket_path))
        os.chmod(relay, stat.S_IRWXU)
        return 'qemu+ext://127.0.0.1/system?command=%s' % relay


def _host(tmp_path_factory, name):
    workdir = str(tmp_path_factory.mktemp(name))
    with open(os.path.join(loading.profile_dir(), 'l40s.json')) as f:
        data = json.load(f)
    for device in data['devices']:
        if device.get('physfn') == GPU:
            device['driver'] = 'vfio-pci'
    profile = os.path.join(workdir, 'profile.json')
    with open(profile, 'w') as f:
        json.dump(data, f)
    setup = tlv.Setup(workdir, TYPE)
    host = Host(workdir, profile=profile, hooks=setup.hooks)
    host.setup = setup
    host.profile_data = data
    return host


@pytest.fixture(scope='module')
def source(tmp_path_factory):
    with _host(tmp_path_factory, 'vendor-source') as h:
        yield h


@pytest.fixture(scope='module')
def dest(tmp_path_factory):
    with _host(tmp_path_factory, 'vendor-dest') as h:
        # a vGPU not ours on the source's VF: the destination chooses
        # another, and says so in the XML
        vendor(h.live.sysfs).set_current_type(SOURCE_VF, 1145)
        yield h


@pytest.fixture(scope='module')
def emulator(tmp_path_factory):
    """``(qemu-wrapper, FAIL_INCOMING)``: the guest's emulator, and the
    file whose existence fails the incoming QEMU."""
    workdir = str(tmp_path_factory.mktemp('emulator'))
    path = os.path.join(workdir, 'qemu-wrapper')
    fail = os.path.join(workdir, 'FAIL_INCOMING')
    with open(path, 'w') as f:
        f.write(WRAPPER % {'python': sys.executable, 'fail': fail,
                           'qemu': libvirtd_mod.QEMU})
    os.chmod(path, 0o755)
    return path, fail


def guest_xml(name, vgpu, emulator):
    meta = metadata.render_document(metadata.GpuMetadata(vgpus=(
        metadata.VgpuEntry(vgpu, objects.TypeId.parse(TYPE),
                           objects.PciAddress.parse(SOURCE_VF)),)))
    xml = libvirtd_mod.tiny_domain_xml(
        name, metadata=meta, extra_devices=nvidia_vgpu.vf_hostdev(
            objects.PciAddress.parse(SOURCE_VF)))
    memlock_kib = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1] // 1024
    return xml.replace(libvirtd_mod.QEMU, emulator).replace(
        '<devices>', "<memtune><hard_limit unit='KiB'>%d</hard_limit>"
        "</memtune><devices>" % memlock_kib, 1)


@pytest.fixture
def guest(source, dest, emulator):
    """The guest running on the source, its vGPU (by our prepare) on
    ``SOURCE_VF``; the destination's probe log emptied."""
    import libvirt
    name = 'vf-%s' % uuidlib.uuid4().hex[:8]
    vgpu = objects.Uuid.new()
    dom = source.daemon.connect().createXML(
        guest_xml(name, vgpu, emulator[0]), 0)
    assert tlv.vgpus_now(source) == dict(HELD, **{SOURCE_VF: TYPE})
    tlv.probe(dest)
    yield name, dom, vgpu
    for host in (source, dest):
        try:
            host.daemon.connect().lookupByName(name).destroy()
        except libvirt.libvirtError as e:
            assert e.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN
    assert tlv.vgpus_now(source) == HELD
    assert tlv.vgpus_now(dest) == dict(HELD, **{SOURCE_VF: TYPE})
    assert hg.leases(source) == [] and hg.leases(dest) == []


def _hostdev_vf(dom):
    from lxml import etree
    return tlv.hostdev_vfs(etree.fromstring(dom.XMLDesc(0)))


def test_a_vendor_guest_migrates_with_its_vf_typed_there(source, dest,
                                                         guest):
    name, dom, vgpu = guest
    assert tmn.migrate(source, dest, name).done
    assert tmn.on(source, name) == []
    there = dest.daemon.connect().lookupByName(name)
    assert there.isActive()
    # the destination's VF: chosen by its hook, named in the XML libvirt
    # started, typed by its prepare, leased to the guest
    (lease,) = hg.leases(dest)
    chosen = str(lease.parent)
    assert chosen != SOURCE_VF
    assert str(dest.live.sysfs.physfn(lease.parent)) == GPU
    assert (lease.vgpu_uuid, lease.state) == (vgpu, 'created')
    assert _hostdev_vf(there) == [chosen]
    assert tlv.vgpus_now(dest) == dict(HELD, **{SOURCE_VF: TYPE,
                                                chosen: TYPE})
    calls = tlv.by_operation(tlv.probe(dest))
    assert chosen not in calls[('migrate', 'begin')][0]
    assert calls[('prepare', 'begin')][0][chosen] == 1145
    # the source's release reset its VF and dropped its lease (libvirt
    # runs it before the migration call returns; waited for all the same)
    assert poll.wait_for(
        lambda: tlv.vgpus_now(source) == HELD and hg.leases(source) == [],
        timeout=30)


def test_a_failed_migration_leaves_the_destination_vf_untyped(
        source, dest, guest, emulator):
    from libvirt_gpu import exception
    name, dom, vgpu = guest
    open(emulator[1], 'w').close()
    try:
        with pytest.raises(exception.LibvirtError) as failed:
            tmn.migrate(source, dest, name)
    finally:
        os.unlink(emulator[1])
    assert 'the incoming QEMU fails (simulated)' in str(failed.value)
    calls = tlv.by_operation(tlv.probe(dest))
    (line,) = [x for x in hg.hook_log(dest).splitlines()
               if 'incoming vGPU %s (%s) reserved on' % (vgpu, TYPE) in x]
    chosen = line.split(' reserved on ')[1].split()[0]
    # prepare typed the VF chosen there, the failure's release reset it
    assert calls[('prepare', 'begin')][0] == dict(
        PRE, **{SOURCE_VF: 1145, chosen: 1145})
    assert calls[('release', 'end')][0] == dict(PRE, **{SOURCE_VF: 1145})
    assert tlv.vgpus_now(dest) == dict(HELD, **{SOURCE_VF: TYPE})
    assert hg.leases(dest) == [] and tmn.on(dest, name) == []
    # the guest runs on at the source, its VF typed, its lease kept
    assert dom.isActive()
    assert tlv.vgpus_now(source) == dict(HELD, **{SOURCE_VF: TYPE})
    (lease,) = hg.leases(source)
    assert (lease.vgpu_uuid, str(lease.parent)) == (vgpu, SOURCE_VF)
