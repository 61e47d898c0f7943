"""A live simulated sysfs (FUSE) for functional tests.

``LiveSysfs(profile)`` runs ``python -m libvirt_gpu.cmd.simulate_live
--control-stdio`` as a child process that mounts the simulated host on a
fresh temp dir, and talks to it over its stdin/stdout::

    with LiveSysfs('t4') as live:
        sysfs = live.sysfs                  # Sysfs(<mountpoint>)
        live.busy(uuid)                     # a guest holds the mdev
        live.state()['mdevs']               # what the simulated kernel has
        binds = live.libvirt_binds()        # for LibvirtDaemon(binds=...)

Cleanup is unconditional: ``close()`` (also on any exception and at
interpreter exit) asks the server to quit, kills it after 10 s, lazily
unmounts whatever is still mounted and removes the temp dir.  If the test
process itself dies, the server sees its stdin close and unmounts itself;
the temp dirs of dead test processes are swept by the next ``start()``.

``missing_requirements()`` says, as sentences, why FUSE cannot work here
(not root, no /dev/fuse, no libfuse3 or mfusepy): tests skip with it.
"""

import atexit
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

from libvirt_gpu import exception
from libvirt_gpu.simulator import live as live_mod
from libvirt_gpu.devices import sysfs as sysfs_mod
from tests.doubles import poll
from tests.doubles import trees

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
_TMP_PREFIX = 'live-sysfs-'
FAST_TMP = '/dev/shm'
# What libvirtd (through libudev), mdevctl and libvirt's PCI code read.
LIBVIRT_SYS_PARTS = ('bus/pci/devices', 'bus/mdev', 'class/mdev_bus',
                     'kernel/iommu_groups')

_live = set()
_live_lock = threading.Lock()


class LiveSysfsError(Exception):
    """The live tree could not be mounted, reached or unmounted."""


def missing_requirements():
    """What this host lacks to mount a live tree, as sentences."""
    missing = []
    if os.geteuid() != 0:
        missing.append('not root (euid %d): mounting FUSE with allow_other '
                       'and sending udev events need root' % os.geteuid())
    if not os.path.exists('/dev/fuse'):
        missing.append('/dev/fuse is missing (load the fuse module)')
    if not (shutil.which('fusermount3') or shutil.which('umount')):
        missing.append('neither fusermount3 (Debian package fuse3) nor '
                       'umount is installed')
    try:
        live_mod.import_fuse_binding()
    except exception.SimulatorError as e:
        missing.append(str(e))
    return missing


def mounts():
    """Mount points of this process's namespace."""
    with open('/proc/self/mountinfo') as f:
        return [line.split()[4].encode().decode('unicode_escape')
                for line in f]


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _lazy_unmount(path):
    for argv in (['fusermount3', '-u', '-z', path], ['umount', '-l', path]):
        if shutil.which(argv[0]):
            subprocess.run(argv, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
        if path not in mounts():
            return True
    return path not in mounts()


def _remove_tmpdir(tmpdir):
    """rm -rf, never through a mount."""
    mnt = os.path.join(tmpdir, 'mnt')
    if mnt in mounts() and not _lazy_unmount(mnt):
        return False
    shutil.rmtree(tmpdir, ignore_errors=True)
    return not os.path.exists(tmpdir)


def _tmp_bases():
    """/dev/shm first: the backing tree is thousands of small files."""
    bases = [FAST_TMP] if os.access(FAST_TMP, os.W_OK) else []
    return bases + [tempfile.gettempdir()]


def sweep_stale_dirs():
    """Temp dirs left by test processes that died."""
    for base in _tmp_bases():
        _sweep(base)


def _sweep(base):
    for name in os.listdir(base):
        if not name.startswith(_TMP_PREFIX):
            continue
        try:
            pid = int(name[len(_TMP_PREFIX):].split('-')[0])
        except ValueError:
            continue
        if pid != os.getpid() and not _pid_alive(pid):
            _remove_tmpdir(os.path.join(base, name))


def leftovers():
    """``(mount points, pids)`` of live trees this process started that are
    still there (``([], [])`` once every one was closed)."""
    tag = '%s%d-' % (_TMP_PREFIX, os.getpid())
    pids = []
    for entry in os.listdir('/proc'):
        if not entry.isdigit():
            continue
        try:
            with open('/proc/%s/cmdline' % entry, 'rb') as f:
                cmdline = f.read().decode('utf-8', 'replace')
            with open('/proc/%s/stat' % entry) as f:
                zombie = f.read().rsplit(')', 1)[1].split()[0] in 'ZX'
        except OSError:
            continue
        if tag in cmdline and not zombie:
            pids.append(int(entry))
    return [m for m in mounts() if tag in m], pids


class LiveSysfs(object):
    """One mounted live tree (see the module doc)."""

    def __init__(self, profile='t4', busy_remove=None, uevents=True,
                 probe_delay=None, start_timeout=30.0):
        self.profile = os.fspath(profile)
        self.probe_delay = probe_delay
        self.busy_remove = busy_remove
        self.uevents = uevents
        self.start_timeout = start_timeout
        self.tmpdir = None
        self.mountpoint = None
        self.proc = None
        self.pid = None
        self.backing = None
        self._lock = threading.Lock()

    # -- lifecycle ------------------------------------------------------------

    def __enter__(self):
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc):
        self.close()

    def start(self):
        sweep_stale_dirs()
        self.tmpdir = tempfile.mkdtemp(prefix='%s%d-' % (_TMP_PREFIX,
                                                         os.getpid()),
                                       dir=_tmp_bases()[0])
        with _live_lock:
            _live.add(self)
        self.mountpoint = os.path.join(self.tmpdir, 'mnt')
        workdir = os.path.join(self.tmpdir, 'work')
        os.mkdir(self.mountpoint)
        os.mkdir(workdir)
        argv = [sys.executable, '-m', 'libvirt_gpu.cmd.simulate_live',
                '--control-stdio', '--workdir', workdir]
        if self.busy_remove:
            argv += ['--busy-remove', self.busy_remove]
        if not self.uevents:
            argv.append('--no-uevents')
        if self.probe_delay is not None:
            argv += ['--probe-delay', str(self.probe_delay)]
        argv += [self.profile, self.mountpoint]
        env = dict(os.environ)
        env['PYTHONPATH'] = os.pathsep.join(
            [REPO] + [p for p in env.get('PYTHONPATH', '').split(os.pathsep)
                      if p])
        with open(self.log_path, 'wb') as log:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=log, cwd='/', env=env, close_fds=True)
        self.pid = self.proc.pid
        line = self._read_line(self.start_timeout)
        if not line.startswith('ready '):
            raise LiveSysfsError('the live sysfs did not start: %r%s'
                                 % (line, self.log_tail()))
        info = json.loads(line.split(' ', 1)[1])
        self.backing = info['backing']
        if self.mountpoint not in mounts():
            raise LiveSysfsError('the server said ready but %s is not a '
                                 'mount point%s' % (self.mountpoint,
                                                    self.log_tail()))
        return self

    def close(self):
        """Stop the server, unmount, remove the temp dir.  Idempotent."""
        proc, self.proc = self.proc, None
        try:
            if proc is not None:
                try:
                    proc.stdin.write(b'quit\n')
                    proc.stdin.flush()
                except (OSError, ValueError):
                    pass
                try:
                    proc.stdin.close()
                except (OSError, ValueError):
                    pass
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.send_signal(signal.SIGKILL)
                    proc.wait()
                proc.stdout.close()
            if self.mountpoint and self.mountpoint in mounts():
                _lazy_unmount(self.mountpoint)
        finally:
            with _live_lock:
                _live.discard(self)
            if self.tmpdir:
                _remove_tmpdir(self.tmpdir)

    @property
    def log_path(self):
        return os.path.join(self.tmpdir, 'server.log')

    def log_tail(self, n=30):
        try:
            with open(self.log_path, errors='replace') as f:
                lines = f.read().splitlines()[-n:]
        except (OSError, TypeError):
            return ''
        return '\n--- live sysfs server log ---\n' + '\n'.join(lines)

    def is_mounted(self):
        return bool(self.mountpoint) and self.mountpoint in mounts()

    def server_alive(self):
        return self.pid is not None and _pid_alive(self.pid) and (
            self.proc is None or self.proc.poll() is None)

    # -- control --------------------------------------------------------------

    def _read_line(self, timeout):
        out = self.proc.stdout
        ready, _, _ = select.select([out], [], [], timeout)
        if not ready:
            raise LiveSysfsError('the live sysfs server did not answer '
                                 'within %ss%s' % (timeout, self.log_tail()))
        line = out.readline()
        if not line:
            raise LiveSysfsError('the live sysfs server exited (%s)%s'
                                 % (self.proc.poll(), self.log_tail()))
        return line.decode('utf-8', 'replace').strip()

    def command(self, line, timeout=10.0):
        """Send one control command; returns the decoded JSON of an
        ``ok <json>`` reply (None for a bare ``ok``)."""
        with self._lock:
            if self.proc is None:
                raise LiveSysfsError('the live sysfs is closed')
            self.proc.stdin.write(line.encode() + b'\n')
            self.proc.stdin.flush()
            reply = self._read_line(timeout)
        if reply == 'ok':
            return None
        if reply.startswith('ok '):
            return json.loads(reply[3:])
        raise LiveSysfsError('%s: %s' % (line, reply))

    def busy(self, uuid):
        self.command('busy %s' % uuid)

    def idle(self, uuid):
        self.command('idle %s' % uuid)

    def state(self):
        return self.command('state')

    def sent(self):
        """Properties of the last uevents the server broadcast."""
        return self.command('sent')

    def set_uevents(self, on):
        self.command('uevents %s' % ('on' if on else 'off'))

    # -- paths ----------------------------------------------------------------

    @property
    def root(self):
        return self.mountpoint

    @property
    def sysfs(self):
        return sysfs_mod.Sysfs(self.mountpoint)

    def path(self, *parts):
        return os.path.join(self.mountpoint, *parts)

    def type_path(self, parent, type_id, name):
        return self.path('class', 'mdev_bus', str(parent),
                         'mdev_supported_types', type_id, name)

    def libvirt_binds(self):
        """``(source, target)`` binds that put this tree where libvirtd,
        libudev and mdevctl look: the /sys parts they read, and every root
        bus ``devices/pciDDDD:BB`` the links lead into.  A part the tree
        lacks is left as the host has it (a vGPU 17+ host such as the
        ``l40s`` profile has no ``bus/mdev`` nor ``class/mdev_bus``: no mdev
        module is loaded there)."""
        binds = [(self.path(part), '/sys/' + part)
                 for part in LIBVIRT_SYS_PARTS
                 if os.path.isdir(self.path(part))]
        for bus in sorted(os.listdir(self.path('devices'))):
            binds.append((self.path('devices', bus), '/sys/devices/' + bus))
        return binds


class LiveHost(object):
    """A live tree and a real libvirtd that sees it as its /sys.

    The daemon (``tests/functional/libvirtd.py``) runs in a private mount
    namespace where the tree's parts are bound over ``/sys`` (see
    ``LiveSysfs.libvirt_binds``) and ``mdevctl_dir`` over
    ``/etc/mdevctl.d``, with ``SYSTEMD_DEVICE_VERIFY_SYSFS=0`` (libudev
    otherwise refuses anything that is not sysfs).  mdevctl run there
    (``run_mdevctl``) sees the same.  ``hooks`` is LibvirtDaemon's, or a
    callable given the mounted LiveSysfs that returns them.  A context
    manager; ``close()`` stops the daemon before the tree.
    """

    def __init__(self, workdir, profile='t4', hooks=None, **live_kwargs):
        self.workdir = os.fspath(workdir)
        self.live = LiveSysfs(profile, **live_kwargs)
        self.hooks = hooks or {}
        self.mdevctl_dir = os.path.join(self.workdir, 'mdevctl.d')
        self.daemon = None

    def __enter__(self):
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc):
        self.close()

    def start(self):
        from tests.functional import libvirtd
        for sub in ('callouts', 'notifiers'):   # mdevctl insists on them
            os.makedirs(os.path.join(self.mdevctl_dir, 'scripts.d', sub),
                        exist_ok=True)
        self.live.start()
        hooks = self.hooks(self.live) if callable(self.hooks) else self.hooks
        self.daemon = libvirtd.LibvirtDaemon(
            hooks=hooks,
            binds=self.live.libvirt_binds() + [(self.mdevctl_dir,
                                                '/etc/mdevctl.d')],
            env={'SYSTEMD_DEVICE_VERIFY_SYSFS': '0'})
        self.daemon.start()
        return self

    def close(self):
        try:
            if self.daemon is not None:
                self.daemon.close()
        finally:
            self.live.close()

    @property
    def uri(self):
        return self.daemon.uri

    def run_mdevctl(self, *args):
        """``mdevctl ARGS`` inside the daemon's namespace (CompletedProcess
        with text output)."""
        return self.daemon.run_in_namespace(['mdevctl'] + list(args),
                                            capture_output=True, text=True,
                                            timeout=60)


def live_host_requirements():
    from tests.functional import libvirtd
    return missing_requirements() + libvirtd.missing_requirements() + (
        [] if shutil.which('mdevctl') else
        ['mdevctl is not installed (Debian package mdevctl)'])


@atexit.register
def _close_all():
    with _live_lock:
        lives = list(_live)
    for tree in lives:
        tree.close()


# --- profiles ----------------------------------------------------------------

# The small SR-IOV host is a shared double: unit tests use it too.
A100_VFS = trees.A100_VFS
L40S_VFS = trees.L40S_VFS
sriov_profile_file = trees.sriov_profile_file


wait_for = poll.wait_for
