"""The qemu hook run by a real libvirtd, on a simulated host, from install
to a guest's start and stop.

One private libvirtd (its own mount namespace, socket directory and hooks
directory) for the module.  Our hook is installed into that hooks directory
by ``libvirt-gpu hook install`` after the daemon started, so the daemon must
be restarted to find it (proved below).  The hook's configuration points at
a simulated T4 host whose kernel is emulated by an inotify watcher in this
process (tests/doubles/hosts.py): the hook runs inside the
daemon's namespace and writes ``create``/``remove`` there; the watcher makes
the mdevs appear and go.  The kernel here has no VFIO, so a guest with a
vGPU runs ``prepare``, fails to start ("Mediated host device assignment
requires VFIO support"), then runs ``stopped`` and ``release``: enough for
the hook's whole lifecycle.
"""

import os
import subprocess
import sys
import time
import uuid as uuidlib

import pytest

from libvirt_gpu import objects
from libvirt_gpu.virt import config_xml
from libvirt_gpu.virt import metadata
from tests.doubles import hosts
from tests.doubles import poll
from tests.functional import libvirtd

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
VFIO_ERROR = 'Mediated host device assignment requires VFIO support'

missing = libvirtd.missing_requirements()
pytestmark = pytest.mark.skipif(bool(missing), reason='; '.join(missing))


def cli(*args):
    return subprocess.run([sys.executable, '-m', 'libvirt_gpu.cmd.main']
                          + list(args), cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def gpu_domain_xml(name, vgpus, hostdevs=None):
    """A tiny guest with ``<gpu:vgpu>`` entries ((uuid, type)) and, by
    default, their hostdevs."""
    meta = metadata.render_document(metadata.GpuMetadata(vgpus=tuple(
        metadata.VgpuEntry(objects.Uuid.parse(u), objects.TypeId.parse(t))
        for u, t in vgpus)))
    if hostdevs is None:
        hostdevs = [u for u, _ in vgpus]
    return libvirtd.tiny_domain_xml(
        name, metadata=meta,
        extra_devices=''.join(config_xml.mdev_hostdev(objects.Uuid.parse(u))
                              for u in hostdevs))


class Observed(object):
    """What the module fixture saw while setting up."""


@pytest.fixture(scope='module')
def gpu_host(tmp_path_factory):
    with hosts.SimulatedHost(tmp_path_factory.mktemp('gpu-host')) as h:
        yield h


@pytest.fixture(scope='module')
def daemon(gpu_host, tmp_path_factory):
    import libvirt
    seen = Observed()
    d = libvirtd.LibvirtDaemon()
    try:
        d.start()
        hooks_dir = os.path.join(d.tmpdir, 'etc', 'hooks')
        seen.install = cli('--config-file', gpu_host.config, 'hook',
                           'install', '--dir', hooks_dir)
        # Installed, but this daemon looked for hooks when it started.
        conn = d.connect()
        u = str(uuidlib.uuid4())
        dom = conn.defineXML(gpu_domain_xml('before-restart',
                                            [(u, 'nvidia-223')]))
        try:
            dom.create()
        except libvirt.libvirtError as e:
            seen.before_restart_error = e.get_error_message()
        seen.before_restart_events = list(gpu_host.watcher.events)
        dom.undefine()
        # A recording hook next to ours: libvirt runs qemu, then qemu.d/*
        d.calls_log = str(tmp_path_factory.mktemp('calls') / 'calls.log')
        with open(os.path.join(hooks_dir, 'qemu'), 'w') as f:
            f.write(libvirtd.recording_hook(d.calls_log))
        os.chmod(os.path.join(hooks_dir, 'qemu'), 0o755)
        d.restart()
        d.seen = seen
        yield d
    finally:
        d.close()


def calls_for(daemon, dom_uuid):
    """``[(operation, sub-operation)]`` the recording hook saw."""
    return [(words[1], words[2])
            for words in libvirtd.read_hook_log(daemon.calls_log)
            if words[-1] == 'uuid=%s' % dom_uuid]


wait_for = poll.wait_for


def test_hook_install_and_restart(daemon, gpu_host):
    r = daemon.seen.install
    assert r.returncode == 0, r.stderr
    assert 'qemu.d/libvirt-gpu (root-owned, mode 0755)' in r.stdout
    assert 'restart libvirtd' in r.stdout
    # before the restart libvirt did not run it: no vGPU was made
    assert VFIO_ERROR in daemon.seen.before_restart_error
    assert daemon.seen.before_restart_events == []
    installed = os.path.join(daemon.tmpdir, 'etc', 'hooks', 'qemu.d',
                             'libvirt-gpu')
    st = os.stat(installed)
    assert (st.st_mode & 0o777, st.st_uid) == (0o755, 0)
    # installing again: the daemon already has hooks
    r = cli('--config-file', gpu_host.config, 'hook', 'install', '--dir',
            os.path.dirname(os.path.dirname(installed)))
    assert r.returncode == 0 and 'nothing to restart' in r.stdout


def test_guest_without_gpus_runs_and_the_hook_does_nothing(daemon,
                                                           gpu_host):
    conn = daemon.connect()
    events = list(gpu_host.watcher.events)
    log = gpu_host.hook_log()
    leases = gpu_host.leases()
    dom = conn.createXML(libvirtd.tiny_domain_xml('plain'), 0)
    try:
        assert dom.isActive()
    finally:
        dom.destroy()
    ops = calls_for(daemon, dom.UUIDString())
    assert ('prepare', 'begin') in ops and ('release', 'end') in ops
    assert gpu_host.watcher.events == events
    assert gpu_host.hook_log() == log
    assert gpu_host.leases() == leases


def test_vgpu_created_at_prepare_removed_at_release(daemon, gpu_host):
    import libvirt
    conn = daemon.connect()
    u = str(uuidlib.uuid4())
    dom = conn.defineXML(gpu_domain_xml('vgpu1', [(u, 'nvidia-223')]))
    try:
        with pytest.raises(libvirt.libvirtError) as e:
            dom.create()
        # no VFIO in this kernel: the start fails after prepare
        assert e.value.get_error_code() == libvirt.VIR_ERR_CONFIG_UNSUPPORTED
        assert VFIO_ERROR in e.value.get_error_message()
        assert wait_for(lambda: ('remove', u) in gpu_host.watcher.events)
        mine = [ev for ev in gpu_host.watcher.events if ev[1] == u]
        assert [ev[0] for ev in mine] == ['create', 'remove']
        assert mine[0][3] == 'nvidia-223'
        assert mine[0][2] == '0000:3b:00.0'       # the GPU with most room
        assert u not in gpu_host.mdevs()
        assert gpu_host.leases() == []
        log = gpu_host.hook_log()
        assert log.index('created vGPU %s' % u) < log.index(
            'removed vGPU %s' % u)
        ops = [op for op, _ in calls_for(daemon, dom.UUIDString())]
        assert ops.index('prepare') < ops.index('release')
        assert 'stopped' in ops
    finally:
        dom.undefine()


def test_start_refused_with_the_reason(daemon, gpu_host):
    import libvirt
    conn = daemon.connect()
    good, bad = str(uuidlib.uuid4()), str(uuidlib.uuid4())
    dom = conn.defineXML(gpu_domain_xml(
        'refused', [(good, 'nvidia-223'), (bad, 'nvidia-999')]))
    events = list(gpu_host.watcher.events)
    try:
        with pytest.raises(libvirt.libvirtError) as e:
            dom.create()
        assert e.value.get_error_code() == libvirt.VIR_ERR_HOOK_SCRIPT_FAILED
        message = e.value.get_error_message()
        assert 'libvirt-gpu: cannot start domain' in message
        assert 'vGPU type nvidia-999 is not enabled on this host' in message
        assert not dom.isActive()
        assert gpu_host.watcher.events == events      # nothing created
        assert gpu_host.leases() == []
    finally:
        dom.undefine()


def test_daemon_restart_reconnects_and_guests_survive(daemon, gpu_host):
    import libvirt
    conn = daemon.connect()
    plain = conn.createXML(libvirtd.tiny_domain_xml('keeps-running'), 0)
    # ours by metadata (the vGPU has no hostdev: nothing to create, so the
    # guest can run here), so the hook takes its slow path at reconnect
    u = str(uuidlib.uuid4())
    ours = conn.createXML(gpu_domain_xml('ours-running',
                                         [(u, 'nvidia-223')], hostdevs=[]),
                          0)
    uuids = [plain.UUIDString(), ours.UUIDString()]
    daemon.restart()
    conn = daemon.connect()
    try:
        # libvirt reconnects to each guest in a thread of its own, after
        # the daemon answers: wait for the hook calls
        for uuid in uuids:
            assert wait_for(lambda: ('reconnect', 'begin') in calls_for(
                daemon, uuid)), calls_for(daemon, uuid)
        assert wait_for(lambda: 'reconnect: 0 vGPU(s) in use, 0 missing'
                        in gpu_host.hook_log())
        time.sleep(0.5)       # a failed reconnect would kill the guest now
        for uuid in uuids:
            assert conn.lookupByUUIDString(uuid).isActive()
    finally:
        for uuid in uuids:
            try:
                conn.lookupByUUIDString(uuid).destroy()
            except libvirt.libvirtError:
                pass          # gone already: the assertion above says why


def test_reconcile_cli_against_the_daemon(daemon, gpu_host):
    # The profile's two pre-existing mdevs on 0000:af:00.0 belong to no
    # domain of this daemon: orphans.  A defined (stopped) domain that
    # references one keeps it.
    conn = daemon.connect()
    pre = sorted(u for u, (p, _) in gpu_host.mdevs().items()
                 if str(p) == '0000:af:00.0')
    assert len(pre) == 2
    keeper = conn.defineXML(gpu_domain_xml('keeper', [(pre[0],
                                                      'nvidia-223')]))
    try:
        args = ('-c', daemon.uri, '--config-file', gpu_host.config,
                'reconcile')
        r = cli(*(args + ('--dry-run',)))
        assert r.returncode == 0, r.stderr
        assert 'would remove' in r.stdout and pre[1] in r.stdout
        assert pre[0] not in r.stdout
        assert set(pre) <= set(gpu_host.mdevs())
        r = cli(*args)
        assert r.returncode == 0, r.stderr
        assert ('remove', pre[1]) in gpu_host.watcher.events
        assert pre[0] in gpu_host.mdevs() and pre[1] not in gpu_host.mdevs()
        r = cli(*args)
        assert 'nothing to do' in r.stdout
    finally:
        keeper.undefine()
