"""``libvirt-gpu attach/detach/domgpus`` against a real libvirtd.

The persistent XML of real domains is changed through the CLI, the result
read back from libvirt; a vGPU attached with --config is then created by
the hook at the next start.  A live attach cannot succeed here (no VFIO);
it must leave nothing behind.
"""

import json
import os
import pathlib
import subprocess
import sys
import uuid as uuidlib

import pytest

from libvirt_gpu.guests import hook
from libvirt_gpu.virt import metadata
from libvirt_gpu import objects
from libvirt_gpu.util import xmlutil
from tests.doubles import hosts
from tests.doubles import poll
from tests.functional import libvirtd

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
A = '0000:3b:00.0'
B = '0000:af:00.0'

missing = libvirtd.missing_requirements()
pytestmark = pytest.mark.skipif(bool(missing), reason='; '.join(missing))


@pytest.fixture(scope='module')
def gpu_host(tmp_path_factory):
    # vGPUs on 0000:af:00.0 only: 0000:3b:00.0 can be passed through whole
    with hosts.SimulatedHost(
            tmp_path_factory.mktemp('gpu-host'),
            extra_conf='[vgpu_nvidia-223]\ndevice_addresses = %s\n' % B) \
            as h:
        yield h


@pytest.fixture(scope='module')
def daemon(gpu_host, tmp_path_factory):
    staged = hook.install(str(tmp_path_factory.mktemp('hooks')),
                          gpu_host.config)
    with libvirtd.LibvirtDaemon(hooks={
            'qemu.d/libvirt-gpu': pathlib.Path(staged.path)}) as d:
        yield d


def cli(daemon, gpu_host, *args):
    r = subprocess.run(
        [sys.executable, '-m', 'libvirt_gpu.cmd.main', '-c', daemon.uri,
         '--config-file', gpu_host.config] + list(args),
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    return r


def persistent(dom):
    import libvirt
    root = xmlutil.parse(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
    return root, metadata.parse(root)


@pytest.fixture
def domain(daemon):
    conn = daemon.connect()
    dom = conn.defineXML(libvirtd.tiny_domain_xml(
        'vm-%s' % uuidlib.uuid4().hex[:8]))
    yield dom
    if dom.isActive():
        dom.destroy()
    dom.undefine()


def test_attach_config_and_detach_vgpu(daemon, gpu_host, domain):
    r = cli(daemon, gpu_host, 'attach', domain.name(), '--vgpu-type',
            'nvidia-223', '--config', '--json')
    assert r.returncode == 0, r.stderr
    done = json.loads(r.stdout)
    assert (done['kind'], done['config'], done['live']) == ('vgpu', True,
                                                            False)
    root, meta = persistent(domain)
    assert meta.vgpus == (metadata.VgpuEntry(done['uuid'], 'nvidia-223'),)
    hostdev = root.find("devices/hostdev[@type='mdev']")
    assert hostdev.get('model') == 'vfio-pci'
    assert hostdev.find('source/address').get('uuid') == done['uuid']
    assert done['uuid'] not in gpu_host.mdevs()      # made at next start
    r = cli(daemon, gpu_host, 'domgpus', domain.name())
    assert r.returncode == 0 and done['uuid'] in r.stdout, r.stderr
    r = cli(daemon, gpu_host, 'detach', domain.name(), '--vgpu-type',
            'nvidia-223', '--config')
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith('detached vGPU %s' % done['uuid'])
    root, meta = persistent(domain)
    assert meta.empty and root.find('devices/hostdev') is None


def test_current_is_config_for_a_stopped_domain(daemon, gpu_host, domain):
    r = cli(daemon, gpu_host, 'attach', domain.name(), '--vgpu-type',
            'nvidia-223')
    assert r.returncode == 0, r.stderr
    assert '(config)' in r.stdout and 'GPU chosen at the next start' in \
        r.stdout
    assert len(persistent(domain)[1].vgpus) == 1


def test_attach_config_whole_gpu(daemon, gpu_host, domain):
    r = cli(daemon, gpu_host, 'attach', domain.UUIDString(), '--address',
            A, '--config')                  # by UUID this time
    assert r.returncode == 0, r.stderr
    root, meta = persistent(domain)
    hostdev = root.find("devices/hostdev[@type='pci']")
    assert hostdev.get('managed') == 'yes'
    assert dict(hostdev.find('source/address').attrib) == {
        'domain': '0x0000', 'bus': '0x3b', 'slot': '0x00',
        'function': '0x0'}
    assert meta.pgpus == (metadata.PgpuEntry(objects.PciAddress.parse(A)),)
    r = cli(daemon, gpu_host, 'detach', domain.name(), '--address', A,
            '--config')
    assert r.returncode == 0, r.stderr
    root, meta = persistent(domain)
    assert meta.empty and root.find('devices/hostdev') is None


def test_refusals_are_clear(daemon, gpu_host, domain):
    r = cli(daemon, gpu_host, 'attach', domain.name(), '--vgpu-type',
            'nvidia-223', '--live')
    assert r.returncode == 1
    assert 'is not running' in r.stderr and '--config' in r.stderr
    r = cli(daemon, gpu_host, 'attach', domain.name(), '--vgpu-type',
            'nvidia-999', '--config')
    assert r.returncode == 1
    assert 'vGPU type nvidia-999 is not enabled on this host' in r.stderr
    r = cli(daemon, gpu_host, 'attach', domain.name(), '--address', B,
            '--config')
    assert r.returncode == 1 and 'configured to offer vGPU type' in r.stderr
    r = cli(daemon, gpu_host, 'attach', 'no-such-domain', '--vgpu-type',
            'nvidia-223')
    assert r.returncode == 1 and 'No domain no-such-domain' in r.stderr
    r = cli(daemon, gpu_host, 'attach', domain.name(), '--vgpu-type',
            'nvidia-223', '--current', '--live')
    assert r.returncode == 1 and '--current cannot be combined' in r.stderr
    root, meta = persistent(domain)
    assert meta.empty and root.find('devices/hostdev') is None


def test_attached_vgpu_is_created_by_the_hook_at_start(daemon, gpu_host,
                                                       domain):
    import libvirt
    r = cli(daemon, gpu_host, 'attach', domain.name(), '--vgpu-type',
            'nvidia-223', '--config', '--json')
    assert r.returncode == 0, r.stderr
    u = json.loads(r.stdout)['uuid']
    with pytest.raises(libvirt.libvirtError, match='VFIO'):
        domain.create()
    poll.wait_for(lambda: ('remove', u) in gpu_host.watcher.events, 10)
    mine = [ev for ev in gpu_host.watcher.events if ev[1] == u]
    assert [ev[0] for ev in mine] == ['create', 'remove']
    assert mine[0][2] == B                 # the only GPU enabled for it
    assert gpu_host.leases() == []


def test_live_attach_that_libvirt_refuses_leaves_nothing(daemon, gpu_host):
    conn = daemon.connect()
    dom = conn.createXML(libvirtd.tiny_domain_xml('live-target'), 0)
    try:
        before = sorted(gpu_host.mdevs())
        r = cli(daemon, gpu_host, 'attach', 'live-target', '--vgpu-type',
                'nvidia-223', '--live')
        assert r.returncode == 1
        # libvirt's own words, passed on
        assert 'Mediated host device assignment requires VFIO support' in \
            r.stderr
        assert sorted(gpu_host.mdevs()) == before
        assert gpu_host.leases() == []
        created = [ev for ev in gpu_host.watcher.events
                   if ev[0] == 'create' and ev[1] not in before]
        assert created and all(('remove', ev[1]) in gpu_host.watcher.events
                               for ev in created)
        assert metadata.parse(xmlutil.parse(dom.XMLDesc(0))).empty
    finally:
        dom.destroy()
