"""Modern NVIDIA GPUs end to end: a real libvirtd, our qemu hook and
``libvirt-gpu reconcile`` on the live simulated host (FUSE).

* L40S (``l40s`` profile, NVIDIA vGPU 17+ vendor interface, no mdev): the
  guest names its vGPU in our metadata with the VF as ``parent`` and holds
  the VF as ``<hostdev type='pci' managed='no'>``.  ``prepare`` writes the
  type to the VF's type file (``names.CURRENT_TYPE``); ``release`` writes 0.
* A100 (``a100`` profile, classic mdev on SR-IOV VFs): the guest's mdev is
  made on a VF; the VFs of the GPU share its ``max_instance``.

This host has no VFIO, so libvirt refuses each start after ``prepare``
(PCI hostdev: "host doesn't support passthrough of host PCI devices";
mdev: "Mediated host device assignment requires VFIO support") and then
runs ``release``.  A second hook, ``qemu.d/zz-probe`` (run after ours:
libvirt runs ``qemu.d`` in alphabetical order), records at every call what
libvirtd's own /sys (the live tree bound over it) shows: the VFs holding a
vGPU, the mdevs, the free instances of the guest's type.
"""

import json
import subprocess
import sys

import pytest

from libvirt_gpu import objects
from tests.functional import hook_guests as hg
from tests.functional import libvirtd
from tests.functional import live_sysfs as ls
from tests.functional.vendor_probe import L40S_PRE
from tests.functional.vendor_probe import Setup
from tests.functional.vendor_probe import by_operation
from tests.functional.vendor_probe import hostdev_vfs
from tests.functional.vendor_probe import probe
from tests.functional.vendor_probe import vgpus_now
from libvirt_gpu.devices.backends.nvidia_vgpu.files import (
    VendorFiles as vendor)

PCI_VFIO_ERROR = "host doesn't support passthrough of host PCI devices"
MDEV_VFIO_ERROR = 'Mediated host device assignment requires VFIO support'

L40S_VF = '0000:bd:00.6'                 # on the empty L40S
A100_PF = '0000:41:00.0'
A100_VF = '0000:41:00.6'
A100_PRE = 'aa618089-8b16-4d01-a136-25a0f3c73123'   # A100-20C on .4

missing = ls.live_host_requirements()
pytestmark = pytest.mark.skipif(bool(missing), reason='; '.join(missing))


def _host(tmp_path_factory, profile, type_id):
    workdir = str(tmp_path_factory.mktemp('live-' + profile))
    setup = Setup(workdir, type_id)
    h = ls.LiveHost(workdir, profile=profile, hooks=setup.hooks)
    h.setup = setup
    return h


@pytest.fixture(scope='class')
def l40s(tmp_path_factory):
    with _host(tmp_path_factory, 'l40s', 'nvidia-1145') as h:
        yield h


@pytest.fixture(scope='class')
def a100(tmp_path_factory):
    with _host(tmp_path_factory, 'a100', 'nvidia-472') as h:
        yield h


def new_uuid():
    return objects.Uuid.new()


def reconcile(host, *extra):
    """``libvirt-gpu reconcile --json`` against the host's daemon: its
    findings as ``[(action, what, uuid)]``."""
    r = subprocess.run(
        [sys.executable, '-m', 'libvirt_gpu.cmd.main', '-c', host.uri,
         '--config-file', host.setup.config, 'reconcile', '--json']
        + list(extra), cwd=ls.REPO, capture_output=True, text=True,
        timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return [(f['action'], f['what'], f['uuid'])
            for f in json.loads(r.stdout)['findings']]


def cli_json(host, *argv):
    """``libvirt-gpu -c URI --config-file CONF ARGV --json`` as a process:
    its JSON answer (it must succeed)."""
    r = subprocess.run(
        [sys.executable, '-m', 'libvirt_gpu.cmd.main', '-c', host.uri,
         '--config-file', host.setup.config] + list(argv) + ['--json'],
        cwd=ls.REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


def l40s_inactive(dom):
    """The persistent XML of ``dom`` (parsed)."""
    import libvirt
    from lxml import etree
    return etree.fromstring(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))


# --- L40S: the vGPU 17+ vendor interface -------------------------------------

class TestL40S(object):

    @pytest.fixture(autouse=True)
    def restored(self, l40s):
        probe(l40s)
        yield
        sysfs = l40s.live.sysfs
        for vf in vgpus_now(l40s):
            if vf not in L40S_PRE:
                vendor(sysfs).set_current_type(vf, 0)
        assert vgpus_now(l40s) == L40S_PRE

    def test_prepare_sets_the_vf_type_release_resets_it(self, l40s):
        import libvirt
        u = new_uuid()
        code, message = hg.start(l40s, 'l40s-1', [(u, 'nvidia-1145', L40S_VF)],
                                 vendor=True)
        # libvirt got past prepare and refused for lack of VFIO
        assert code == libvirt.VIR_ERR_CONFIG_UNSUPPORTED
        assert PCI_VFIO_ERROR in message
        calls = by_operation(probe(l40s))
        pre = {vf: 1145 for vf in L40S_PRE}
        # what libvirtd's /sys showed right after our prepare ...
        assert calls[('prepare', 'begin')][0] == dict(pre, **{L40S_VF: 1145})
        # ... and after our release
        assert calls[('release', 'end')][0] == pre
        assert vgpus_now(l40s) == L40S_PRE
        assert hg.leases(l40s) == []
        log = hg.hook_log(l40s)
        assert log.index('created vGPU %s (nvidia-1145 on %s)'
                         % (u, L40S_VF)) < log.index(
            'removed vGPU %s (nvidia-1145 on %s)' % (u, L40S_VF))
        assert reconcile(l40s) == []
        assert vgpus_now(l40s) == L40S_PRE

    def test_vf_holding_another_vgpu_is_refused_at_prepare(self, l40s):
        import libvirt
        u = new_uuid()
        code, message = hg.start(l40s, 'l40s-2',
                                 [(u, 'nvidia-1145', '0000:3d:00.4')],
                                 vendor=True)
        assert code == libvirt.VIR_ERR_HOOK_SCRIPT_FAILED
        assert 'libvirt-gpu: cannot start domain' in message
        assert '0000:3d:00.4' in message
        # libvirt runs every qemu.d script before it judges their exit
        # status: the probe saw our refused prepare change nothing
        calls = by_operation(probe(l40s))
        pre = {vf: 1145 for vf in L40S_PRE}
        assert calls[('prepare', 'begin')][0] == pre
        assert calls[('release', 'end')][0] == pre
        assert vgpus_now(l40s) == L40S_PRE
        assert hg.leases(l40s) == []

    def test_full_gpu_refused_at_prepare(self, l40s):
        import libvirt
        sysfs = l40s.live.sysfs
        # fill the empty L40S with two L40S-24Q: its VFs list nothing
        gpu = [str(a) for a in sysfs.virtfns('0000:bd:00.0')]
        vendor(sysfs).set_current_type(gpu[0], 1155)
        vendor(sysfs).set_current_type(gpu[1], 1155)
        assert vendor(sysfs).creatable_types(L40S_VF) == ()
        full = vgpus_now(l40s)
        u = new_uuid()
        code, message = hg.start(l40s, 'l40s-3', [(u, 'nvidia-1145', L40S_VF)],
                                 vendor=True)
        assert code == libvirt.VIR_ERR_HOOK_SCRIPT_FAILED
        assert 'libvirt-gpu: cannot start domain' in message
        assert 'No capacity left for vGPU type nvidia-1145 on the GPU ' \
            '0000:bd:00.0' in message
        assert vgpus_now(l40s) == full
        assert hg.leases(l40s) == []
        assert reconcile(l40s) == []          # not ours: left alone
        assert vgpus_now(l40s) == full

    def test_cli_attach_config_start_detach(self, l40s):
        """What an operator does: ``attach --config`` a vendor-interface
        vGPU to a stopped guest through the real daemon, start it (the
        hook creates the vGPU on the VF chosen at attach), ``detach
        --config``; nothing is left."""
        import libvirt
        conn = l40s.daemon.connect()
        dom = conn.defineXML(libvirtd.tiny_domain_xml('l40s-att'))
        try:
            done = cli_json(l40s, 'attach', 'l40s-att', '--vgpu-type',
                            'nvidia-1145', '--config')
            assert (done['kind'], done['type'], done['config'],
                    done['live']) == ('vgpu', 'nvidia-1145', True, False)
            vf = done['parent']
            assert vf not in L40S_PRE           # a free VF, reserved now
            root = l40s_inactive(dom)
            assert hostdev_vfs(root) == [vf]
            entries = root.findall(
                'metadata/{urn:libvirt-gpu:1}gpus/{urn:libvirt-gpu:1}vgpu')
            assert [(e.get('uuid'), e.get('type'), e.get('parent'))
                    for e in entries] == [(done['uuid'], 'nvidia-1145', vf)]
            assert vgpus_now(l40s) == L40S_PRE  # nothing created yet
            with pytest.raises(libvirt.libvirtError) as e:
                dom.create()
            assert e.value.get_error_code() == \
                libvirt.VIR_ERR_CONFIG_UNSUPPORTED
            assert PCI_VFIO_ERROR in e.value.get_error_message()
            calls = by_operation(probe(l40s))
            pre = {v: 1145 for v in L40S_PRE}
            assert calls[('prepare', 'begin')][0] == dict(pre, **{vf: 1145})
            assert calls[('release', 'end')][0] == pre
            done = cli_json(l40s, 'detach', 'l40s-att', '--uuid',
                            done['uuid'], '--config')
            root = l40s_inactive(dom)
            assert hostdev_vfs(root) == []
            assert root.find('metadata/{urn:libvirt-gpu:1}gpus/'
                             '{urn:libvirt-gpu:1}vgpu') is None
            assert hg.leases(l40s) == []
            assert reconcile(l40s) == []
            assert vgpus_now(l40s) == L40S_PRE
        finally:
            dom.undefine()


# --- A100: classic mdev on SR-IOV VFs ----------------------------------------

def mdev_events(host, u):
    return [(e['ACTION'], e['DEVPATH'].split('/')[-2])
            for e in host.live.sent() if e['DEVPATH'].endswith('/' + u)]


class TestA100(object):

    @pytest.fixture(autouse=True)
    def restored(self, a100):
        probe(a100)
        yield
        live = a100.live
        for m in live.state()['mdevs']:
            if m['uuid'] != A100_PRE:
                live.sysfs.write(live.path('bus', 'mdev', 'devices',
                                           m['uuid'], 'remove'), '1')
        if not live.state()['mdevs']:          # reconcile removed it
            live.sysfs.write(live.type_path('0000:41:00.4', 'nvidia-472',
                                            'create'), A100_PRE)
        assert [m['uuid'] for m in live.state()['mdevs']] == [A100_PRE]

    def test_mdev_on_a_vf_made_at_prepare_removed_at_release(self, a100):
        import libvirt
        u = new_uuid()
        code, message = hg.start(a100, 'a100-1', [(u, 'nvidia-472', A100_VF)],
                                 vendor=False)
        assert code == libvirt.VIR_ERR_CONFIG_UNSUPPORTED
        assert MDEV_VFIO_ERROR in message
        calls = by_operation(probe(a100))
        # after prepare: ours next to the GPU's other A100-20C, and no VF
        # of the GPU offers another (max_instance 2 per GPU)
        assert calls[('prepare', 'begin')][1:] == [sorted([A100_PRE, u]), 0]
        # after release: gone, and the 15 free VFs offer one each again
        assert calls[('release', 'end')][1:] == [[A100_PRE], 15]
        assert ls.wait_for(lambda: len(mdev_events(a100, u)) == 2)
        assert mdev_events(a100, u) == [('add', A100_VF),
                                        ('remove', A100_VF)]
        assert hg.leases(a100) == []
        # The profile's A100-20C belongs to no domain of this daemon: the
        # one orphan reconcile finds.  The guest left nothing behind.
        assert reconcile(a100, '--dry-run') == [
            ('would remove', 'mdev', A100_PRE)]
        assert reconcile(a100) == [('removed', 'mdev', A100_PRE)]
        assert a100.live.state()['mdevs'] == []
        assert reconcile(a100) == []

    def test_gpu_full_across_vfs_refused_at_prepare(self, a100):
        import libvirt
        live = a100.live
        # the GPU's second A100-20C, on another VF: the GPU is full
        other = new_uuid()
        live.sysfs.write(live.type_path('0000:41:01.3', 'nvidia-472',
                                        'create'), other)
        u = new_uuid()
        code, message = hg.start(a100, 'a100-2', [(u, 'nvidia-472', None)],
                                 vendor=False)
        assert code == libvirt.VIR_ERR_HOOK_SCRIPT_FAILED
        assert 'libvirt-gpu: cannot start domain' in message
        assert 'No capacity left for vGPU type nvidia-472' in message
        assert mdev_events(a100, u) == []
        assert sorted(m['uuid'] for m in live.state()['mdevs']) == sorted(
            [A100_PRE, other])
        assert hg.leases(a100) == []
