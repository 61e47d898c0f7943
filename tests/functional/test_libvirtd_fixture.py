"""The private libvirtd fixture, and the qemu hook contract (which
operations libvirt runs the hook for, in which order, and what a non-zero
exit does: see libvirt_gpu/guests/hook/) proved against the real daemon with a
recording hook that never calls libvirt."""

import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid as uuidlib

import pytest

from tests.functional import libvirtd as L

libvirt = pytest.importorskip('libvirt')

START = [['prepare', 'begin'], ['start', 'begin'], ['started', 'begin']]
STOP = [['stopped', 'end'], ['release', 'end']]


def hook_calls(log_path, name, timeout=5.0, until=None):
    """[[op, subop], ...] the recording hook logged for guest ``name``
    (waits up to ``timeout`` for the last one to be ``until``)."""
    deadline = time.monotonic() + timeout
    while True:
        calls = [line[1:3] for line in L.read_hook_log(log_path)
                 if line[0] == name]
        if until is None or (calls and calls[-1] == until) \
                or time.monotonic() > deadline:
            return calls
        time.sleep(0.05)


def hook_uuids(log_path, name):
    return {line[-1] for line in L.read_hook_log(log_path) if line[0] == name}


@pytest.fixture
def hook_log(tmp_path):
    return str(tmp_path / 'hook.log')


@pytest.fixture
def recording(libvirtd_factory, hook_log):
    """A daemon whose /etc/libvirt/hooks/qemu records every call."""
    return libvirtd_factory(hooks={'qemu': L.recording_hook(hook_log)})


def test_guest_without_gpu_runs_the_whole_hook_lifecycle(recording, hook_log):
    conn = recording.connect()
    uuid = str(uuidlib.uuid4())
    dom = conn.createXML(L.tiny_domain_xml('plain', uuid=uuid))
    assert dom.isActive()
    assert dom.state()[0] == libvirt.VIR_DOMAIN_RUNNING
    assert hook_calls(hook_log, 'plain') == START

    dom.destroy()
    assert hook_calls(hook_log, 'plain', until=STOP[-1]) == START + STOP
    # every call got the domain XML on stdin, and the argv's 4th word is '-'
    assert hook_uuids(hook_log, 'plain') == {'uuid=' + uuid}
    assert {line[3] for line in L.read_hook_log(hook_log)} == {'-'}


def test_guest_with_mdev_runs_prepare_fails_then_is_released(recording,
                                                             hook_log):
    conn = recording.connect()
    mdev = str(uuidlib.uuid4())
    xml = L.tiny_domain_xml('vgpu', extra_devices=L.mdev_hostdev_xml(mdev))
    with pytest.raises(libvirt.libvirtError) as err:
        conn.createXML(xml)
    message = str(err.value)
    # libvirt only checks that /dev/vfio/vfio exists, then looks the mdev up
    if os.path.exists('/dev/vfio/vfio'):
        assert message == ("device not found: mediated device '%s' not found"
                           % mdev)
    else:
        assert message == ('unsupported configuration: Mediated host device '
                           'assignment requires VFIO support')
    assert hook_calls(hook_log, 'vgpu', until=STOP[-1]) == \
        [['prepare', 'begin']] + STOP
    assert conn.listAllDomains() == []


def test_hook_failing_at_prepare_refuses_the_start(libvirtd_factory,
                                                   hook_log):
    fail = textwrap.dedent('''\
        if [ "$2" = prepare ]; then
            echo "no vGPU left for $uuid" >&2
            exit 3
        fi
        ''')
    daemon = libvirtd_factory(hooks={'qemu': L.recording_hook(hook_log, fail)})
    conn = daemon.connect()
    uuid = str(uuidlib.uuid4())
    with pytest.raises(libvirt.libvirtError) as err:
        conn.createXML(L.tiny_domain_xml('refused', uuid=uuid))
    assert err.value.get_error_code() == libvirt.VIR_ERR_HOOK_SCRIPT_FAILED
    message = str(err.value)
    assert message.startswith('Hook script execution failed: ')
    assert ('/etc/libvirt/hooks/qemu refused prepare begin -) unexpected '
            'exit status 3: no vGPU left for %s' % uuid) in message
    # A refused start still runs stopped and release: the hook cleans up
    # after a refused prepare there.
    assert hook_calls(hook_log, 'refused', until=STOP[-1]) == \
        [['prepare', 'begin']] + STOP
    assert conn.listAllDomains() == []


def test_restart_reconnects_a_running_guest(recording, hook_log):
    conn = recording.connect()
    uuid = str(uuidlib.uuid4())
    conn.createXML(L.tiny_domain_xml('survivor', uuid=uuid))
    pidfile = recording.host_path('/run/libvirt/qemu/survivor.pid')
    with open(pidfile) as f:
        qemu_pid = int(f.read())

    recording.restart()

    # libvirtd answers before its reconnect threads ran the hook: poll.
    assert hook_calls(hook_log, 'survivor', until=['reconnect', 'begin']) \
        == START + [['reconnect', 'begin']]
    conn = recording.connect()
    dom = conn.lookupByUUIDString(uuid)
    assert dom.isActive()
    assert dom.state()[0] == libvirt.VIR_DOMAIN_RUNNING
    with open(pidfile) as f:
        assert int(f.read()) == qemu_pid
    # qemu runs in a mount namespace libvirt made for it, under our holder
    assert qemu_pid in L.descendants(recording.holder_pid)

    dom.destroy()       # the reconnected daemon can still stop it
    assert hook_calls(hook_log, 'survivor', until=STOP[-1]) == \
        START + [['reconnect', 'begin']] + STOP


def test_binds_over_missing_sys_and_dev_paths(libvirtd_factory, tmp_path,
                                              hook_log):
    # A simulated /sys/bus/mdev and a /dev/vfio: neither exists on this
    # kernel; the daemon, its hooks and run_in_namespace all see them, the
    # host does not.
    mdev_uuid = str(uuidlib.uuid4())
    sim = tmp_path / 'sys-bus-mdev'
    (sim / 'devices').mkdir(parents=True)
    (sim / 'marker').write_text('simulated\n')
    mdev_bus = tmp_path / 'sys-class-mdev_bus'
    (mdev_bus / '0000:af:00.0').mkdir(parents=True)
    vfio = tmp_path / 'dev-vfio'
    vfio.mkdir()
    (vfio / 'vfio').write_text('')
    host_had = {p: os.path.exists(p) for p in
                ('/sys/bus/mdev', '/sys/class/mdev_bus', '/dev/vfio',
                 '/run/libvirt',
                 '/var/lib/libvirt', '/var/log/libvirt', '/var/cache/libvirt')}
    extra = 'cat /sys/bus/mdev/marker >> %s\n' % L._sh_quote(hook_log)
    daemon = libvirtd_factory(
        hooks={'qemu.d/50-sysfs': L.recording_hook(hook_log, extra)},
        binds=[(sim, '/sys/bus/mdev'), (mdev_bus, '/sys/class/mdev_bus'),
               (vfio, '/dev/vfio')],
        env={'SYSTEMD_DEVICE_VERIFY_SYSFS': '0'})

    inside = daemon.run_in_namespace(
        ['sh', '-c', 'cat /sys/bus/mdev/marker; ls /dev/vfio; '
                     'ls /sys/class/mdev_bus; '
                     'LC_ALL=C ls /sys/bus/pci/devices /sys/class/net; '
                     'test -e /dev/kvm && echo kvm'],
        capture_output=True, text=True, check=True).stdout.split()
    assert inside[:3] == ['simulated', 'vfio', '0000:af:00.0']
    # what was under the shadowed parents (/sys/bus, /sys/class, /dev) is
    # still there
    assert inside[3:] == (
        ['/sys/bus/pci/devices:'] + sorted(os.listdir('/sys/bus/pci/devices'))
        + ['/sys/class/net:'] + sorted(os.listdir('/sys/class/net'))
        + (['kvm'] if os.path.exists('/dev/kvm') else []))
    assert {p: os.path.exists(p) for p in host_had} == host_had

    # libvirtd sees them too: past the VFIO check, it looks the mdev up in
    # the simulated /sys/bus/mdev/devices.
    conn = daemon.connect()
    with pytest.raises(libvirt.libvirtError) as err:
        conn.createXML(L.tiny_domain_xml(
            'simvgpu', extra_devices=L.mdev_hostdev_xml(mdev_uuid)))
    assert str(err.value) == ("device not found: mediated device '%s' not "
                              "found" % mdev_uuid)
    assert err.value.get_error_code() == libvirt.VIR_ERR_DEVICE_MISSING
    # the qemu.d/ drop-in ran and read the simulated tree
    calls = hook_calls(hook_log, 'simvgpu', until=STOP[-1])
    assert calls == [['prepare', 'begin']] + STOP
    with open(hook_log) as f:
        assert f.read().count('simulated\n') == 3


def test_temp_dir_under_a_shadowed_parent(libvirtd_factory, tmp_path,
                                          monkeypatch):
    # TMPDIR under a directory the fixture shadows (as /var/lib is, with
    # TMPDIR=/var/lib/x, on a host without /var/lib/libvirt): the stage of
    # the shadow lies in the temp dir that the tmpfs then covers.
    L._shared_cache_dir()           # where the test process's TMPDIR is
    # Not in tmp_path, nor in the private temp dir: the daemon's socket
    # lies three levels below this and an AF_UNIX path has 108 bytes at
    # most (a clone under /tmp puts the private dir under ~/.cache); a
    # 0700 directory of its own under /tmp is as private and short.
    host = pathlib.Path(tempfile.mkdtemp(prefix='sh-', dir='/tmp'))
    (host / 'tmp').mkdir()
    (host / 'kept').write_text('kept\n')
    sim = tmp_path / 'sim'
    sim.mkdir()
    (sim / 'marker').write_text('bound\n')
    monkeypatch.setattr(tempfile, 'tempdir', str(host / 'tmp'))
    target = host / 'missing' / 'sim'
    daemon = None
    try:
        daemon = libvirtd_factory(binds=[(sim, target)])
        assert daemon.tmpdir.startswith(str(host / 'tmp') + os.sep)
        inside = daemon.run_in_namespace(
            ['sh', '-c', 'cat %s %s; ls %s' % (
                target / 'marker', host / 'kept', daemon.tmpdir)],
            capture_output=True, text=True, check=True).stdout.split()
        assert inside[:2] == ['bound', 'kept']
        assert set(inside[2:]) == set(os.listdir(daemon.tmpdir))
        assert not (host / 'missing').exists()
        conn = daemon.connect()
        dom = conn.createXML(L.tiny_domain_xml('undertmp'))
        assert dom.isActive() == 1
    finally:
        if daemon is not None:
            daemon.close()
        shutil.rmtree(host)


def test_close_leaves_no_process_and_no_temp_dir(libvirtd_factory):
    daemon = libvirtd_factory()
    conn = daemon.connect()
    conn.createXML(L.tiny_domain_xml('leftover'))
    with open(daemon.host_path('/run/libvirt/qemu/leftover.pid')) as f:
        qemu_pid = int(f.read())
    qemu_start = L._stat(qemu_pid)[2]
    tmpdir, ns_id = daemon.tmpdir, daemon.ns_id
    assert qemu_pid in daemon.leftover_pids()

    daemon.close()
    daemon.close()                                      # idempotent

    assert daemon.leftover_pids() == []
    assert L.pids_in_mount_ns(ns_id) == []
    assert L.pids_mentioning(tmpdir) == []
    # Reaped, not a zombie: the holder (a sub-reaper) waits for its last
    # child before it exits.  The same pid may be a new process by now
    # (pid_max is small on some hosts), so the process is told by its
    # start time, not by /proc/<pid> alone.
    assert not _same_process_exists(qemu_pid, qemu_start)
    assert not os.path.exists(tmpdir)


def _same_process_exists(pid, start):
    st = L._stat(pid)
    return st is not None and st[2] == start


def test_holder_reaps_a_grandchild_handed_to_it_late(tmp_path):
    # The race behind a zombie qemu after close(): a grandchild killed
    # together with its parent is reparented to the sub-reaper only when
    # the parent exits.  reap_all waits for it; a bare reap would not.
    script = textwrap.dedent('''\
        import ctypes, os, signal, sys, time
        sys.path.insert(0, %r)
        from tests.functional import libvirtd as L
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.prctl(36, 1, 0, 0, 0) == 0      # PR_SET_CHILD_SUBREAPER
        r, w = os.pipe()
        parent = os.fork()
        if parent == 0:
            child = os.fork()
            if child == 0:
                time.sleep(60)
                os._exit(0)
            os.write(w, b'%%d\\n' %% child)
            time.sleep(0.3)                          # dies after its child
            os._exit(0)
        grandchild = int(os.read(r, 64).split()[0])
        start = L._stat(grandchild)[2]
        os.kill(grandchild, signal.SIGKILL)
        h = L._Holder.__new__(L._Holder)
        h.daemon, h.exited = None, {}
        done = h.reap_all(timeout=10)
        st = L._stat(grandchild)
        print(done, st is not None and st[2] == start, flush=True)
        ''') % os.path.dirname(os.path.dirname(os.path.dirname(
            os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, '-c', script], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ['True', 'False']     # reaped, no zombie


def test_killed_test_process_leaves_no_process_behind(libvirtd_requirements,
                                                      tmp_path):
    # The test process dies by SIGKILL with a guest running: its holder sees
    # stdin close, kills the daemon and qemu and removes the temp dir.
    script = textwrap.dedent('''\
        import os, signal, sys
        sys.path.insert(0, %r)
        from tests.functional import libvirtd as L
        d = L.LibvirtDaemon().start()
        d.connect().createXML(L.tiny_domain_xml('orphan'))
        qemu = open(d.host_path('/run/libvirt/qemu/orphan.pid')).read()
        print(d.ns_id, d.tmpdir, L._cache_dir, d.pid, qemu, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        ''') % os.path.dirname(os.path.dirname(os.path.dirname(
            os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, '-c', script], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == -signal.SIGKILL, out.stderr
    ns_id, tmpdir, cache, daemon_pid, qemu_pid = out.stdout.split()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if not L.pids_in_mount_ns(ns_id) and not os.path.exists(cache):
            break
        time.sleep(0.1)
    assert L.pids_in_mount_ns(ns_id) == []
    assert L.pids_mentioning(tmpdir) == []
    assert not os.path.exists(tmpdir)
    assert not os.path.exists(cache)
    for pid in (daemon_pid, qemu_pid):
        assert not L._alive(int(pid))


def test_start_times(libvirtd_factory, hook_log, record_property):
    # A cold capability cache (its own), then a restart: what the first and
    # later starts cost here. libvirt 9.0 probes qemu's capabilities at the
    # first guest start, not at daemon start.
    def guest(conn, name):
        t0 = time.monotonic()
        dom = conn.createXML(L.tiny_domain_xml(name))
        t1 = time.monotonic()
        dom.destroy()
        return round(t1 - t0, 3), round(time.monotonic() - t1, 3)

    daemon = libvirtd_factory(shared_cache=False,
                              hooks={'qemu': L.recording_hook(hook_log)})
    first_create, first_destroy = guest(daemon.connect(), 'first')
    daemon.restart()
    second_create, second_destroy = guest(daemon.connect(), 'second')
    times = {
        'daemon_first_start_s': round(daemon.start_times[0], 3),
        'daemon_second_start_s': round(daemon.start_times[1], 3),
        'guest_create_cold_cache_s': first_create,
        'guest_create_warm_cache_s': second_create,
        'guest_destroy_s': second_destroy,
    }
    for k, v in times.items():
        record_property(k, v)
    print('libvirtd timings:', times)
    # Figures only (printed and recorded): no wall-clock bound in a test.
    assert len(daemon.start_times) == 2
    assert hook_calls(hook_log, 'second', until=STOP[-1]) == START + STOP


def test_start_failure_reports_the_daemon_log(libvirtd_factory):
    # qemu_conf lines override the fixture's (libvirt takes the first of
    # duplicate keys); a daemon that cannot start says why.
    with pytest.raises(L.LibvirtDaemonError) as err:
        libvirtd_factory(qemu_conf='user = "no-such-user-xyz"')
    message = str(err.value)
    assert message.startswith('libvirtd exited during start-up')
    assert ("Initialization of QEMU state driver failed: invalid argument: "
            "Failed to parse user 'no-such-user-xyz'") in message


def test_tiny_domain_xml_validates():
    xml = L.tiny_domain_xml('v', metadata='<x:a xmlns:x="urn:x"/>',
                            extra_devices=L.mdev_hostdev_xml(
                                str(uuidlib.uuid4())),
                            serial_log='/tmp/serial.log')
    rng = '/usr/share/libvirt/schemas/domain.rng'
    if not os.path.exists(rng):
        pytest.skip('%s is missing (Debian package libvirt0)' % rng)
    lxml_etree = pytest.importorskip('lxml.etree')
    schema = lxml_etree.RelaxNG(lxml_etree.parse(rng))
    doc = lxml_etree.fromstring(xml.encode())
    assert schema.validate(doc), schema.error_log
