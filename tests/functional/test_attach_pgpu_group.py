"""A whole GPU's IOMMU group, through the API, against a real libvirtd.

The H100 capture (tests/doubles/h100.py) with IOMMU groups added is the
host's sysfs: with the GPU's HDMI audio function in its group both go to
the guest (and come back on detach); with the host's NIC in its group the
attach is refused naming the NIC; without a group it is refused saying
why.  Only the persistent XML is changed (no VFIO here to start a guest).
"""

import uuid as uuidlib

import pytest

from libvirt_gpu.guests import api
from libvirt_gpu import environment
from libvirt_gpu import exception
from libvirt_gpu.virt import host as host_mod
from libvirt_gpu.virt import metadata
from libvirt_gpu import objects
from libvirt_gpu.devices import sysfs as sysfs_mod
from libvirt_gpu.util import xmlutil
from tests.doubles import h100
from tests.functional import libvirtd as libvirtd_mod

GPU = objects.PciAddress.parse(h100.GPU)
AUDIO = objects.PciAddress.parse(h100.AUDIO)


def _env(conn, root, tmp_path):
    return environment.Environment(
        state_dir=str(tmp_path / 'state'), sysfs=sysfs_mod.Sysfs(root),
        host=host_mod.Host.from_connection(conn), enabled={})


def _define(conn):
    return conn.defineXML(libvirtd_mod.tiny_domain_xml(
        'vm-%s' % uuidlib.uuid4().hex[:8]))


def _persistent(dom):
    import libvirt
    root = xmlutil.parse(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
    hostdevs = sorted(
        objects.PciAddress(*(int(a.get(k), 16) for k in
                             ('domain', 'bus', 'slot', 'function')))
        for a in root.iterfind("devices/hostdev[@type='pci']/source/"
                               "address"))
    managed = {h.get('managed') for h in
               root.iterfind("devices/hostdev[@type='pci']")}
    return hostdevs, managed, metadata.parse(root)


def test_gpu_goes_with_its_audio_function(libvirtd, h100_audio_sysfs,
                                          tmp_path):
    conn = libvirtd.connect()
    env = _env(conn, h100_audio_sysfs, tmp_path)
    dom = _define(conn)
    done = api.attach(conn, dom.name(), address=h100.GPU, config=True,
                      env=env)
    assert done.address == GPU
    hostdevs, managed, meta = _persistent(dom)
    assert hostdevs == [GPU, AUDIO] and managed == {'yes'}
    assert meta.pgpus == (metadata.PgpuEntry(GPU, (AUDIO,)),)
    # the audio function is part of the GPU, not a GPU of its own
    assert api.list_devices(conn, dom.name(), env=env).pgpus == (GPU,)
    api.detach(conn, dom.name(), address=h100.GPU, config=True, env=env)
    hostdevs, _, meta = _persistent(dom)
    assert hostdevs == [] and meta.empty
    dom.undefine()


def _refused_whole(libvirtd, root, tmp_path):
    """Attach the H100 whole to a new domain of the sysfs ``root``: it must
    be refused (GpuInUse) with nothing left in the domain; the message."""
    conn = libvirtd.connect()
    env = _env(conn, root, tmp_path)
    dom = _define(conn)
    with pytest.raises(exception.GpuInUse) as e:
        api.attach(conn, dom.name(), address=h100.GPU, config=True,
                   env=env)
    hostdevs, _, meta = _persistent(dom)
    assert hostdevs == [] and meta.empty          # nothing left behind
    dom.undefine()
    return str(e.value)


def test_group_with_the_hosts_nic_is_refused(libvirtd, h100_nic_sysfs,
                                             tmp_path):
    message = _refused_whole(libvirtd, h100_nic_sysfs, tmp_path)
    assert h100.NIC in message and 'network controller' in message
    assert 'host uses' in message


def test_gpu_without_iommu_group_is_refused(libvirtd, h100_sysfs, tmp_path):
    message = _refused_whole(libvirtd, h100_sysfs, tmp_path)
    assert 'no IOMMU group' in message and h100.GPU in message
