"""A real, private libvirtd for functional tests.

``LibvirtDaemon`` runs the system's ``libvirtd`` (privileged,
``qemu:///system``) inside a private mount namespace, so it neither needs
nor disturbs a system daemon::

    with LibvirtDaemon(hooks={'qemu': script}) as daemon:
        conn = daemon.connect()
        dom = conn.createXML(tiny_domain_xml('vm1'))

How it is built
---------------
The test process starts a small *holder* (this file run as a script, under
``unshare --mount --propagation private``). The holder owns the namespace:

* it bind-mounts per-daemon temp dirs over ``/etc/libvirt``, ``/run/libvirt``,
  ``/var/lib/libvirt``, ``/var/log/libvirt`` and ``/var/cache/libvirt``, then
  the caller's extra ``binds`` (a simulated sysfs over ``/sys/bus/mdev`` ...).
  A target that does not exist is never created on the host: its parent is
  *shadowed* inside the namespace (a tmpfs over the parent, every original
  entry bind-mounted back, the new directory made in the tmpfs). That is how a
  bind over ``/sys/bus/mdev`` works on a kernel without the mdev bus.
* it runs ``libvirtd`` as its child on request (``start``/``stop``), and is a
  child sub-reaper: the qemu processes libvirtd double-forks become its
  children (not PID 1's, which in a container may reap late or never), so it
  reaps them at once and can find them to kill them. qemu runs in a mount
  namespace of its own (libvirt's default ``namespaces = ["mount"]``), so it
  is found as the holder's descendant, not by namespace.
* when its stdin closes (the test process ended, however it ended) it kills
  libvirtd (SIGTERM, then SIGKILL), every other process of its namespace and
  every descendant, removes the temp dir, and exits; the namespace dies with
  it.

qemu.conf sets ``cgroup_controllers = [ ]``: without systemd libvirt would
make ``machine/`` cgroups on the host, and a killed daemon would leave them.

The daemon's socket lives in a temp dir that is not mounted over, so the test
process connects from outside with
``qemu:///system?socket=<dir>/libvirt-sock``.

The qemu capability cache (``/var/cache/libvirt``) is shared by all daemons of
one test process: the first start probes qemu (~8 s), later ones take ~0.2 s.
It is removed when the process exits.

Only the standard library is imported at module level: the holder runs this
file with ``python -I``.
"""

import atexit
import ctypes
import errno
import json
import os
import pwd
import grp
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

LIBVIRTD = '/usr/sbin/libvirtd'
QEMU = '/usr/bin/qemu-system-x86_64'
QEMU_USER = 'libvirt-qemu'
QEMU_DRIVER = ('/usr/lib/x86_64-linux-gnu/libvirt/connection-driver/'
               'libvirt_driver_qemu.so')

QEMU_CONF = '''\
# written by tests/functional/libvirtd.py
user = "root"
group = "root"
stdio_handler = "file"
security_driver = "none"
# no cgroups: a killed daemon must not leave machine cgroups on the host
cgroup_controllers = [ ]
'''

LIBVIRTD_CONF = '''\
# written by tests/functional/libvirtd.py
auth_unix_rw = "none"
auth_unix_ro = "none"
unix_sock_dir = "{sock_dir}"
unix_sock_group = "root"
unix_sock_rw_perms = "0700"
unix_sock_ro_perms = "0700"
log_outputs = "{log_level}:file:/var/log/libvirt/libvirtd.log"
'''

# Directories the daemon owns, bound over the real paths in the namespace.
_STATE_DIRS = {
    'etc': '/etc/libvirt',
    'run': '/run/libvirt',
    'lib': '/var/lib/libvirt',
    'log': '/var/log/libvirt',
}
_CACHE_TARGET = '/var/cache/libvirt'

_TMP_PREFIX = 'libvirtd-fixture-'


class LibvirtDaemonError(Exception):
    """The private daemon could not be started, stopped or reached."""


def tiny_domain_xml(name, uuid=None, extra_devices='', metadata='',
                    memory_mib=64, domain_type=None, serial_log=None):
    """XML of a tiny guest that starts in well under a second
    (``tests/doubles/domains.py`` holds the one template).  ``domain_type``
    defaults to ``kvm`` where ``/dev/kvm`` is usable and ``qemu`` (TCG)
    otherwise."""
    # Imported here: this file also runs as a script (--holder), where the
    # tests package is not importable and no domain XML is made.
    from tests.doubles import domains
    if domain_type is None:
        domain_type = 'kvm' if kvm_usable() else 'qemu'
    return domains.tiny_domain_xml(
        name, uuid=uuid, extra_devices=extra_devices, metadata=metadata,
        memory_mib=memory_mib, domain_type=domain_type,
        serial_log=serial_log, emulator=QEMU)


def mdev_hostdev_xml(mdev_uuid):
    """A vGPU (mdev) hostdev, as libvirt wants it (``model`` is required)."""
    return ("<hostdev mode='subsystem' type='mdev' managed='no' "
            "model='vfio-pci'><source><address uuid='%s'/></source>"
            "</hostdev>" % mdev_uuid)


def recording_hook(log_path, extra=''):
    """A POSIX sh hook that appends one line per call to ``log_path``:
    ``<argv 1..4> uuid=<domain uuid from the stdin XML>``.

    It never calls libvirt. ``extra`` is sh run after the line is written
    (``$2``..``$4`` are the domain name, operation and sub-operation; the
    stdin XML is in ``$xml``).
    """
    return '''#!/bin/sh
xml=$(cat)
uuid=$(printf '%s\\n' "$xml" |
       sed -n 's:^ *<uuid>\\(.*\\)</uuid>.*:\\1:p' | head -n 1)
echo "$1 $2 $3 $4 uuid=$uuid" >> ''' + _sh_quote(log_path) + '''
''' + extra + '''
exit 0
'''


def read_hook_log(log_path):
    """The lines a ``recording_hook`` wrote, each as a list of words."""
    try:
        with open(log_path) as f:
            return [line.split() for line in f.read().splitlines()]
    except FileNotFoundError:
        return []


def _sh_quote(s):
    return "'" + str(s).replace("'", "'\\''") + "'"


def kvm_usable():
    return os.access('/dev/kvm', os.R_OK | os.W_OK)


def missing_requirements():
    """What this host lacks to run a private libvirtd, as sentences
    (empty when everything is there). Used to skip with an exact reason."""
    missing = []
    if os.geteuid() != 0:
        missing.append('not root (euid %d): libvirtd in a private mount '
                       'namespace needs root' % os.geteuid())
    for path, pkg in ((LIBVIRTD, 'libvirt-daemon'),
                      (QEMU, 'qemu-system-x86'),
                      (QEMU_DRIVER, 'libvirt-daemon-driver-qemu')):
        if not os.path.exists(path):
            missing.append('%s is missing (Debian package %s)' % (path, pkg))
    for tool in ('unshare', 'nsenter'):
        if not shutil.which(tool):
            missing.append('%s is missing (Debian package util-linux)' % tool)
    if not missing:
        r = subprocess.run(['unshare', '--mount', '--propagation', 'private',
                            'true'], capture_output=True, text=True)
        if r.returncode != 0:
            missing.append('cannot make a mount namespace here (unshare '
                           '--mount: %s)' % r.stderr.strip())
    try:
        import libvirt  # noqa: F401
    except ImportError as e:
        missing.append('python module libvirt cannot be imported (%s)' % e)
    return missing


def ensure_qemu_user():
    """Create the ``libvirt-qemu`` system user and group when missing: the
    Debian build of libvirtd refuses to start without them (they are made by
    libvirt-daemon-system, which we do not install)."""
    def have_group():
        try:
            grp.getgrnam(QEMU_USER)
            return True
        except KeyError:
            return False

    def have_user():
        try:
            pwd.getpwnam(QEMU_USER)
            return True
        except KeyError:
            return False

    if not have_group():
        r = subprocess.run(['groupadd', '--system', QEMU_USER],
                           capture_output=True, text=True)
        if r.returncode != 0 and not have_group():
            raise LibvirtDaemonError('groupadd %s failed: %s'
                                     % (QEMU_USER, r.stderr.strip()))
    if not have_user():
        r = subprocess.run(['useradd', '--system', '--gid', QEMU_USER,
                            '--no-create-home',
                            '--home-dir', '/var/lib/libvirt',
                            '--shell', '/usr/sbin/nologin', QEMU_USER],
                           capture_output=True, text=True)
        if r.returncode != 0 and not have_user():
            raise LibvirtDaemonError('useradd %s failed: %s'
                                     % (QEMU_USER, r.stderr.strip()))


# --- process bookkeeping ----------------------------------------------------

def mount_ns_of(pid):
    """``mnt:[4026532...]`` for a live process, None when gone/a zombie."""
    try:
        return os.readlink('/proc/%d/ns/mnt' % pid)
    except OSError:
        return None


def _stat(pid):
    """(state, ppid, starttime) of a process, None when it is gone."""
    try:
        with open('/proc/%d/stat' % pid) as f:
            fields = f.read().rsplit(')', 1)[1].split()
    except OSError:
        return None
    return fields[0], int(fields[1]), int(fields[19])


def _is_zombie(pid):
    st = _stat(pid)
    return st is None or st[0] in ('Z', 'X')


def _all_pids():
    return [int(e) for e in os.listdir('/proc') if e.isdigit()]


def descendants(root):
    """Live (non-zombie) descendants of ``root``. qemu runs in a mount
    namespace of its own (libvirt's default ``namespaces = ["mount"]``), so
    the namespace alone does not find it; it is the holder's child (the
    holder is a sub-reaper)."""
    children = {}
    for pid in _all_pids():
        st = _stat(pid)
        if st is not None and st[0] not in ('Z', 'X'):
            children.setdefault(st[1], []).append(pid)
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def pids_in_mount_ns(ns_id, exclude=()):
    """Live (non-zombie) processes whose mount namespace is ``ns_id``."""
    found = []
    for entry in os.listdir('/proc'):
        if not entry.isdigit():
            continue
        pid = int(entry)
        if pid in exclude:
            continue
        if mount_ns_of(pid) == ns_id and not _is_zombie(pid):
            found.append(pid)
    return found


def pids_mentioning(path):
    """Live processes whose command line or cwd mention ``path``."""
    found = []
    path_b = os.fsencode(path)
    for entry in os.listdir('/proc'):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open('/proc/%s/cmdline' % entry, 'rb') as f:
                cmd = f.read()
            cwd = os.fsencode(os.readlink('/proc/%s/cwd' % entry))
        except OSError:
            continue
        if (path_b in cmd or cwd.startswith(path_b)) \
                and not _is_zombie(int(entry)):
            found.append(int(entry))
    return found


# --- the shared capability cache --------------------------------------------

_cache_lock = threading.Lock()
_cache_dir = None


def _shared_cache_dir():
    global _cache_dir
    with _cache_lock:
        if _cache_dir is None:
            _sweep_stale_dirs()
            _cache_dir = tempfile.mkdtemp(
                prefix='%s%d-cache-' % (_TMP_PREFIX, os.getpid()))
            atexit.register(shutil.rmtree, _cache_dir, True)
        return _cache_dir


def _owner_alive(name):
    # libvirtd-fixture-<pid>-... -> is <pid> alive?
    try:
        pid = int(name[len(_TMP_PREFIX):].split('-', 1)[0])
    except ValueError:
        return True             # not ours to judge
    return not _is_zombie(pid)      # gone or a zombie: dead


_swept = False


def _sweep_stale_dirs():
    """Remove temp dirs left by a test process that was killed (SIGKILL
    leaves no chance to clean up; its holder kills the daemon but a shared
    cache dir may remain). Only dirs whose owner pid is dead."""
    global _swept
    if _swept:
        return
    _swept = True
    tmp = tempfile.gettempdir()
    for name in os.listdir(tmp):
        if name.startswith(_TMP_PREFIX) and not _owner_alive(name):
            shutil.rmtree(os.path.join(tmp, name), ignore_errors=True)


_live = set()
_live_lock = threading.Lock()


@atexit.register
def _close_all():
    with _live_lock:
        daemons = list(_live)
    for d in daemons:
        try:
            d.close()
        except Exception:  # noqa: BLE001 - last-ditch cleanup at exit
            pass


# --- the daemon -------------------------------------------------------------

class LibvirtDaemon:
    """A private ``libvirtd`` in its own mount namespace.

    :param hooks: ``{name: content}`` installed under ``/etc/libvirt/hooks``
        with mode 0755: ``'qemu'`` is the main hook, ``'qemu.d/50-gpu'`` a
        drop-in. Content is ``str``/``bytes``, or an ``os.PathLike`` whose
        file is copied.
    :param binds: ``[(host_path, target_path)]`` extra bind mounts made in the
        namespace after the libvirt dirs; a missing target is made without
        touching the host (see the module doc), so ``/sys/bus/mdev`` works.
    :param env: extra environment for the daemon (hooks see only LC_ALL, PATH
        and HOME: libvirt cleans their environment).
    :param qemu_conf: extra qemu.conf lines; they override the defaults
        above (e.g. ``cgroup_controllers = [ "cpu" ]``).
    :param libvirtd_conf: extra libvirtd.conf lines, same rule.
    :param log_level: libvirtd's log level to /var/log/libvirt/libvirtd.log
        (1 debug .. 4 error).
    :param shared_cache: share /var/cache/libvirt (qemu capabilities) with
        the other daemons of this process (fast second start).
    :param start_timeout: seconds to wait for the socket to answer.
    """

    def __init__(self, hooks=None, binds=(), env=None, qemu_conf='',
                 libvirtd_conf='', log_level=3, shared_cache=True,
                 start_timeout=120.0):
        self.hooks = dict(hooks or {})
        self.binds = [(os.fspath(s), os.fspath(t)) for s, t in binds]
        self.env = dict(env or {})
        self.qemu_conf = qemu_conf
        self.libvirtd_conf = libvirtd_conf
        self.log_level = log_level
        self.shared_cache = shared_cache
        self.start_timeout = start_timeout
        self.start_times = []   # seconds from spawn to a working connection
        self.tmpdir = None
        self.ns_id = None       # 'mnt:[...]' of the private namespace
        self.pid = None         # libvirtd's pid while it runs
        self._holder = None
        self._conns = []
        self._known = {}        # pid -> start time, see _remember()

    # -- paths ----------------------------------------------------------

    @property
    def sock_dir(self):
        return os.path.join(self.tmpdir, 'sock')

    @property
    def socket_path(self):
        return os.path.join(self.sock_dir, 'libvirt-sock')

    @property
    def uri(self):
        return 'qemu:///system?socket=' + self.socket_path

    def host_path(self, path):
        """Where a path of the namespace's libvirt dirs lives on the host,
        e.g. ``/var/log/libvirt/qemu/vm1.log`` -> ``<tmp>/log/qemu/vm1.log``
        (readable from outside the namespace)."""
        path = os.path.normpath(path)
        mapping = dict((t, os.path.join(self.tmpdir, k))
                       for k, t in _STATE_DIRS.items())
        for target, src in mapping.items():
            if path == target or path.startswith(target + '/'):
                return src + path[len(target):]
        raise ValueError('%s is not under a libvirt state dir' % path)

    @property
    def log_path(self):
        """libvirtd's own log (its log_outputs file), on the host."""
        return os.path.join(self.tmpdir, 'log', 'libvirtd.log')

    @property
    def stderr_path(self):
        return os.path.join(self.tmpdir, 'libvirtd.stderr')

    def qemu_log(self, domain_name):
        """The text of a guest's /var/log/libvirt/qemu/<name>.log."""
        try:
            with open(self.host_path('/var/log/libvirt/qemu/%s.log'
                                     % domain_name)) as f:
                return f.read()
        except FileNotFoundError:
            return ''

    # -- lifecycle ------------------------------------------------------

    def __enter__(self):
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def start(self):
        """Start the daemon (first call: also make the namespace)."""
        if self._holder is None:
            self._setup()
        if self.pid is not None:
            raise LibvirtDaemonError('libvirtd is already running (pid %d)'
                                     % self.pid)
        t0 = time.monotonic()
        reply = self._command('start')
        self.pid = int(reply.split()[1])
        self._wait_ready(t0)
        self.start_times.append(time.monotonic() - t0)
        return self

    def stop(self, timeout=30.0):
        """Stop libvirtd (SIGTERM, SIGKILL after ``timeout``). Guests keep
        running and all state stays, as with ``systemctl stop libvirtd``.
        Returns libvirtd's exit status."""
        self._close_conns()
        if self.pid is None:
            return None
        reply = self._command('stop %s' % timeout, timeout=timeout + 10)
        self.pid = None
        return int(reply.split()[1])

    def restart(self):
        """Stop and start again with the same state: running guests are
        reconnected (the ``reconnect`` hook op runs for each)."""
        self.stop()
        return self.start()

    def connect(self):
        """A new ``libvirt.virConnect`` to this daemon (closed on stop)."""
        import libvirt
        conn = libvirt.open(self.uri)
        self._conns.append(conn)
        return conn

    @property
    def holder_pid(self):
        """The process that owns the namespace (parent of libvirtd, and
        sub-reaper of the qemu processes), None once closed."""
        return self._holder.pid if self._holder is not None else None

    def run_in_namespace(self, argv, **kwargs):
        """``subprocess.run`` of ``argv`` inside the daemon's namespace
        (sees the same binds: /etc/libvirt, simulated sysfs ...)."""
        return subprocess.run(self.namespace_argv(argv), **kwargs)

    def namespace_argv(self, argv):
        if self._holder is None:
            raise LibvirtDaemonError('the namespace is not set up')
        return ['nsenter', '--target', str(self._holder.pid), '--mount',
                '--'] + list(argv)

    def close(self):
        """Kill the daemon and every process of its namespace, then remove
        the temp dirs. Idempotent; safe on any exit path."""
        self._close_conns()
        holder, self._holder = self._holder, None
        self.pid = None
        try:
            if holder is not None:
                self._kill_holder(holder)
        finally:
            with _live_lock:
                _live.discard(self)
            if self.tmpdir and os.path.isdir(self.tmpdir):
                shutil.rmtree(self.tmpdir, ignore_errors=True)

    def leftover_pids(self):
        """Live processes of this daemon: in its namespace, descended from
        its holder (libvirtd, qemu in its own namespace, hooks), seen so
        before, or started from its temp dir. Empty after close()."""
        self._remember()
        pids = set(pid for pid, start in self._known.items()
                   if _stat(pid) is not None and _stat(pid)[2] == start
                   and not _is_zombie(pid))
        if self.tmpdir:
            pids.update(pids_mentioning(self.tmpdir))
        return sorted(pids)

    def _remember(self):
        # pid -> start time of everything that belongs to this daemon, so
        # that it is still found after the holder is gone (pid reuse-safe).
        pids = []
        if self.ns_id and self.ns_id != mount_ns_of(os.getpid()):
            pids.extend(pids_in_mount_ns(self.ns_id))
        if self._holder is not None and self._holder.poll() is None:
            pids.append(self._holder.pid)
            pids.extend(descendants(self._holder.pid))
        for pid in pids:
            st = _stat(pid)
            if st is not None:
                self._known.setdefault(pid, st[2])

    # -- internals ------------------------------------------------------

    def _setup(self):
        missing = missing_requirements()
        if missing:
            raise LibvirtDaemonError('cannot run libvirtd: '
                                     + '; '.join(missing))
        ensure_qemu_user()
        _sweep_stale_dirs()
        self.tmpdir = tempfile.mkdtemp(prefix='%s%d-' % (_TMP_PREFIX,
                                                         os.getpid()))
        os.chmod(self.tmpdir, 0o755)
        with _live_lock:
            _live.add(self)
        for sub in list(_STATE_DIRS) + ['sock', 'cache', 'shadow']:
            os.makedirs(os.path.join(self.tmpdir, sub), mode=0o755)
        etc = os.path.join(self.tmpdir, 'etc')
        # The caller's lines go first: libvirt takes the first of duplicate
        # keys, so they override the fixture's defaults.
        with open(os.path.join(etc, 'qemu.conf'), 'w') as f:
            f.write(self.qemu_conf + '\n' + QEMU_CONF)
        with open(os.path.join(etc, 'libvirtd.conf'), 'w') as f:
            f.write(self.libvirtd_conf + '\n'
                    + LIBVIRTD_CONF.format(sock_dir=self.sock_dir,
                                           log_level=self.log_level))
        os.makedirs(os.path.join(etc, 'hooks', 'qemu.d'))
        for name, content in self.hooks.items():
            self.install_hook(name, content)

        cache = (_shared_cache_dir() if self.shared_cache
                 else os.path.join(self.tmpdir, 'cache'))
        binds = [(os.path.join(self.tmpdir, k), t)
                 for k, t in _STATE_DIRS.items()]
        binds.append((cache, _CACHE_TARGET))
        binds.extend(self.binds)
        env = {'PATH': '/usr/sbin:/usr/bin:/sbin:/bin', 'HOME': '/root',
               'LC_ALL': 'C'}
        env.update(self.env)
        config = {
            'binds': binds,
            'shadow_dir': os.path.join(self.tmpdir, 'shadow'),
            'argv': [LIBVIRTD, '--pid-file',
                     os.path.join(self.tmpdir, 'libvirtd.pid')],
            'env': env,
            'stderr': self.stderr_path,
            'shared_cache': cache if self.shared_cache else None,
        }
        with open(os.path.join(self.tmpdir, 'holder.log'), 'w') as log:
            self._holder = subprocess.Popen(
                ['unshare', '--mount', '--propagation', 'private', '--',
                 sys.executable, '-I', os.path.abspath(__file__), '--holder'],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                text=True, bufsize=1, close_fds=True, cwd='/',
                env={'PATH': env['PATH'], 'LC_ALL': 'C'})
        self._holder.stdin.write(json.dumps(config) + '\n')
        self._holder.stdin.flush()
        reply = self._read_reply(timeout=30)
        if not reply.startswith('ready '):
            raise LibvirtDaemonError('namespace setup failed: %s%s'
                                     % (reply, self._tail('holder.log')))
        self.ns_id = reply.split(None, 1)[1]

    def install_hook(self, name, content):
        """Write a hook (see ``hooks``). libvirtd looks for hook files when
        it starts: a hook that did not exist then needs a restart(); a
        changed one is used at its next call."""
        name = os.path.normpath(name)
        if name.startswith(('/', '..')):
            raise ValueError('hook name must be relative: %r' % name)
        path = os.path.join(self.tmpdir, 'etc', 'hooks', name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if isinstance(content, os.PathLike):
            shutil.copyfile(content, path)
        else:
            mode = 'wb' if isinstance(content, bytes) else 'w'
            with open(path, mode) as f:
                f.write(content)
        os.chmod(path, 0o755)

    def _command(self, cmd, timeout=30.0):
        if self._holder is None or self._holder.poll() is not None:
            raise LibvirtDaemonError('the namespace holder is gone%s'
                                     % self._tail('holder.log'))
        self._holder.stdin.write(cmd + '\n')
        self._holder.stdin.flush()
        reply = self._read_reply(timeout)
        if reply.startswith('error'):
            raise LibvirtDaemonError('%s: %s%s' % (cmd, reply,
                                                   self._tail('holder.log')))
        return reply

    def _read_reply(self, timeout):
        out = self._holder.stdout
        ready, _, _ = select.select([out], [], [], timeout)
        if not ready:
            raise LibvirtDaemonError(
                'the namespace holder did not answer within %ss%s'
                % (timeout, self._tail('holder.log')))
        line = out.readline()
        if not line:
            raise LibvirtDaemonError('the namespace holder died%s'
                                     % self._tail('holder.log'))
        return line.strip()

    def _wait_ready(self, t0):
        import libvirt
        deadline = t0 + self.start_timeout
        last = 'socket %s never appeared' % self.socket_path
        while True:
            if not _alive(self.pid):
                rc = self._command('wait')
                self.pid = None
                raise LibvirtDaemonError(
                    'libvirtd exited during start-up (%s)%s%s'
                    % (rc, self._tail('libvirtd.stderr'),
                       self._tail('log/libvirtd.log')))
            if os.path.exists(self.socket_path):
                try:
                    conn = libvirt.open(self.uri)
                    try:
                        conn.getLibVersion()
                    finally:
                        conn.close()
                    return
                except libvirt.libvirtError as e:
                    last = str(e)
            if time.monotonic() > deadline:
                raise LibvirtDaemonError(
                    'libvirtd did not answer on %s within %.0fs (last: %s)%s%s'
                    % (self.socket_path, self.start_timeout, last,
                       self._tail('libvirtd.stderr'),
                       self._tail('log/libvirtd.log')))
            time.sleep(0.05)

    def _close_conns(self):
        conns, self._conns = self._conns, []
        for c in conns:
            try:
                c.close()
            except Exception:  # noqa: BLE001 - the daemon may be gone
                pass

    def _kill_holder(self, holder):
        self._holder = holder
        self._remember()
        self._holder = None
        try:
            holder.stdin.write('shutdown\n')
            holder.stdin.flush()
        except (OSError, ValueError):
            pass
        try:
            holder.stdin.close()
        except (OSError, ValueError):
            pass
        try:
            holder.wait(timeout=30)
        except subprocess.TimeoutExpired:
            holder.kill()
            holder.wait()
        holder.stdout.close()
        # Backstop: the holder is gone; anything of ours it left (it was
        # killed, or timed out) is killed from here.
        for _ in range(50):
            pids = self.leftover_pids()
            if not pids:
                break
            for pid in pids:
                _kill(pid, signal.SIGKILL)
            time.sleep(0.05)

    def _tail(self, rel, n=40):
        if not self.tmpdir:
            return ''
        try:
            with open(os.path.join(self.tmpdir, rel), errors='replace') as f:
                lines = f.read().splitlines()[-n:]
        except OSError:
            return ''
        if not lines:
            return ''
        return '\n--- %s (last %d lines) ---\n%s' % (rel, len(lines),
                                                     '\n'.join(lines))


def _alive(pid):
    return pid is not None and os.path.exists('/proc/%d' % pid) \
        and not _is_zombie(pid)


def _kill(pid, sig):
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


# --- the holder (runs inside the namespace) ----------------------------------

_libc = None
MS_RDONLY = 1
MS_BIND = 4096
MS_REC = 16384
MNT_DETACH = 2
PR_SET_CHILD_SUBREAPER = 36


def _libc_call(name, *args):
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    if getattr(_libc, name)(*args) != 0:
        e = ctypes.get_errno()
        raise OSError(e, '%s%r: %s' % (name, args, os.strerror(e)))


def _mount(src, dst, fstype, flags, data=None):
    _libc_call('mount', os.fsencode(src) if src else None, os.fsencode(dst),
               os.fsencode(fstype) if fstype else None, ctypes.c_ulong(flags),
               data.encode() if data else None)


class _Holder:
    """Inside the namespace: mounts, runs libvirtd, reaps, cleans up."""

    def __init__(self, config):
        self.config = config
        self.made = set()       # dirs this holder made in its own tmpfs
        self.shadow_n = 0
        self.daemon = None      # libvirtd pid
        self.exited = {}        # pid -> wait status, for libvirtd
        self.ns = None          # our mount namespace, checked in setup()

    # mounts ------------------------------------------------------------

    def ensure_dir(self, path):
        """Make ``path`` exist in this namespace without writing to the host
        filesystem: shadow the parent with a tmpfs when needed."""
        if os.path.isdir(path):
            return
        if os.path.lexists(path):
            raise OSError(errno.ENOTDIR, 'not a directory', path)
        parent = os.path.dirname(path)
        self.ensure_dir(parent)
        if parent not in self.made:
            self.shadow(parent)
        os.mkdir(path, 0o755)
        self.made.add(path)

    def shadow(self, parent):
        # <parent> becomes a tmpfs holding every original entry bound back:
        #   bind <parent> -> <stage>; tmpfs on <parent>;
        #   for e in <stage>: placeholder <parent>/e, bind <stage>/e -> it
        # The stage lies in the temp dir, which may lie under <parent>
        # itself (TMPDIR=/var/lib/x on a host without /var/lib/libvirt):
        # then the tmpfs hides its path, so it is reached through a
        # descriptor taken before (/proc/self/fd/N names the mount
        # whatever covers its path).
        self.shadow_n += 1
        stage_dir = os.path.join(self.config['shadow_dir'],
                                 str(self.shadow_n))
        os.mkdir(stage_dir)
        _mount(parent, stage_dir, None, MS_BIND | MS_REC)
        fd = os.open(stage_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            stage = '/proc/self/fd/%d' % fd
            st = os.stat(parent)
            _mount('tmpfs', parent, 'tmpfs', 0,
                   'mode=%o' % (st.st_mode & 0o7777))
            for entry in os.listdir(fd):
                src = os.path.join(stage, entry)
                dst = os.path.join(parent, entry)
                if os.path.islink(src):
                    os.symlink(os.readlink(src), dst)
                    continue
                if os.path.isdir(src):
                    os.mkdir(dst)
                else:
                    open(dst, 'w').close()
                _mount(src, dst, None, MS_BIND | MS_REC)
            _libc_call('umount2', os.fsencode(stage), MNT_DETACH)
        finally:
            os.close(fd)
        self.made.add(parent)

    def setup(self):
        # kill_all() kills everything in our mount namespace: make sure it
        # is a namespace of our own, not the host's.
        self.ns = mount_ns_of(os.getpid())
        if self.ns in (mount_ns_of(os.getppid()), mount_ns_of(1), None):
            raise OSError(errno.EPERM, 'not in a private mount namespace '
                          '(%s); is this run under unshare --mount?' % self.ns)
        _libc_call('prctl', PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        for src, dst in self.config['binds']:
            if os.path.isdir(src):
                self.ensure_dir(dst)
            elif not os.path.lexists(dst):
                self.ensure_dir(os.path.dirname(dst))
                open(dst, 'w').close()
            _mount(src, dst, None, MS_BIND | MS_REC)

    # processes ---------------------------------------------------------

    def reap(self):
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.daemon:
                self.exited[pid] = status

    def start(self):
        if self.daemon is not None and self.daemon not in self.exited:
            return 'error libvirtd already running (pid %d)' % self.daemon
        with open(self.config['stderr'], 'ab') as err:
            proc = subprocess.Popen(
                self.config['argv'], env=self.config['env'],
                stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                close_fds=True, cwd='/')
        self.daemon = proc.pid
        # the reaper owns the child from now on
        proc.returncode = 0
        return 'started %d' % proc.pid

    def wait_daemon(self, timeout):
        deadline = time.monotonic() + timeout
        while self.daemon not in self.exited:
            if time.monotonic() > deadline:
                return None
            self.reap()
            time.sleep(0.02)
        return self.exited[self.daemon]

    def stop(self, timeout=30.0):
        if self.daemon is None:
            return 'stopped none'
        if self.daemon not in self.exited:
            _kill(self.daemon, signal.SIGTERM)
            if self.wait_daemon(timeout) is None:
                _kill(self.daemon, signal.SIGKILL)
                self.wait_daemon(10)
        status = self.exited.get(self.daemon)
        self.daemon = None
        if status is None:
            return 'error libvirtd did not exit'
        return 'stopped %d' % os.waitstatus_to_exitcode(status)

    def kill_all(self):
        self.stop(timeout=10)
        me = os.getpid()
        for _ in range(100):
            pids = set(pids_in_mount_ns(self.ns, exclude=(me,)))
            pids.update(descendants(me))
            if not pids:
                break
            for pid in pids:
                _kill(pid, signal.SIGKILL)
            time.sleep(0.05)
            self.reap()
        self.reap_all(timeout=10)

    def reap_all(self, timeout):
        """Wait (bounded) until this sub-reaper has no child left: every
        process of ours is killed by now, but a grandchild killed with its
        parent is handed to us only when the parent exits, so a single
        non-blocking reap can leave a zombie that init inherits when we
        exit (and reaps when it gets to it)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return True
            if pid == self.daemon:
                self.exited[pid] = status
            if pid == 0:
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.01)

    def serve(self):
        out = sys.stdout
        out.write('ready %s\n' % mount_ns_of(os.getpid()))
        out.flush()
        stdin = sys.stdin.buffer.raw
        buf = b''
        while True:
            ready, _, _ = select.select([stdin], [], [], 0.2)
            self.reap()
            if not ready:
                continue
            chunk = os.read(stdin.fileno(), 4096)
            if not chunk:
                return False                # the test process is gone
            buf += chunk
            while b'\n' in buf:
                line, buf = buf.split(b'\n', 1)
                words = line.decode().split()
                if not words:
                    continue
                cmd = words[0]
                if cmd == 'start':
                    reply = self.start()
                elif cmd == 'stop':
                    reply = self.stop(float(words[1]) if len(words) > 1
                                      else 30.0)
                elif cmd == 'wait':
                    status = self.wait_daemon(5)
                    reply = ('exit status %s' % (
                        None if status is None
                        else os.waitstatus_to_exitcode(status)))
                elif cmd == 'shutdown':
                    return True
                else:
                    reply = 'error unknown command %r' % cmd
                out.write(reply + '\n')
                out.flush()


def _holder_main():
    # stdin: one JSON line (config), then commands; stdout: one reply each.
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(1))
    line = sys.stdin.buffer.raw.readline()
    holder = _Holder(json.loads(line))
    try:
        holder.setup()
    except (OSError, ValueError) as e:
        sys.stdout.write('error %s\n' % e)
        sys.stdout.flush()
        return 1
    orphaned = True
    try:
        orphaned = not holder.serve()
    finally:
        holder.kill_all()
    if orphaned:
        # The test process died without close(): remove its temp dir here.
        _rmtree_one_fs(os.path.dirname(holder.config['shadow_dir']))
        cache = holder.config.get('shared_cache')
        if cache and not _owner_alive(os.path.basename(cache)):
            _rmtree_one_fs(cache)
    return 0


def _rmtree_one_fs(top):
    """rm -rf that never crosses into another mount (we are inside the
    namespace, where shadowed paths are bind mounts of host dirs)."""
    try:
        dev = os.lstat(top).st_dev
    except OSError:
        return
    with open('/proc/self/mountinfo') as f:
        mounts = set(line.split()[4].encode().decode('unicode_escape')
                     for line in f)
    if top in mounts:
        return
    walked = []
    for root, dirs, files in os.walk(top):
        keep = []
        for name in dirs:
            path = os.path.join(root, name)
            try:
                if os.path.islink(path):
                    files.append(name)
                elif (os.lstat(path).st_dev == dev
                      and path not in mounts):
                    keep.append(name)
            except OSError:
                pass
        dirs[:] = keep              # never descend into another mount
        walked.append((root, keep, files))
    for root, dirs, files in reversed(walked):
        for name in files:
            try:
                os.unlink(os.path.join(root, name))
            except OSError:
                pass
        for name in dirs:
            try:
                os.rmdir(os.path.join(root, name))
            except OSError:
                pass
    try:
        os.rmdir(top)
    except OSError:
        pass


if __name__ == '__main__' and sys.argv[1:] == ['--holder']:
    sys.exit(_holder_main())
