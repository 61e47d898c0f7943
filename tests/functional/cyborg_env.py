"""The real OpenStack Cyborg (17.0.0, from PyPI) for the functional tests.

Cyborg lives in its own virtual environment, ``.venv-cyborg`` (``make -f
Makefile.cyborg cyborg-venv``; ``LIBVIRT_GPU_CYBORG_VENV`` names another
one), with this checkout installed there, so that its agent finds our
driver (``libvirt_gpu_driver``) by its entry point.

A :class:`CyborgHost` is one compute node as Cyborg sees it, all in a
temporary directory: a simulated GPU host (sysfs tree), libvirt-gpu's
configuration for it, a ``cyborg.conf`` (``[agent] enabled_drivers =
libvirt_gpu_driver``, SQLite made by ``cyborg-dbsync create_schema``, the
test's Placement with Cyborg's ``admin_token`` client against its noauth2
API) and the compute-node provider nova-compute would have made, which
Cyborg's agent needs before it reports.
"""

import contextlib
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid as uuidlib

from tests.doubles import venvs
from tests.doubles.ports import free_port

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
VENV_ENV = 'LIBVIRT_GPU_CYBORG_VENV'
REPORT_SCRIPT = os.path.join(REPO, 'tests', 'functional', 'cyborg_report.py')

_CYBORG_CONF = """\
[DEFAULT]
host = {host}
transport_url = {transport}
log_file = {log}

[database]
connection = sqlite:///{db}

[agent]
enabled_drivers = libvirt_gpu_driver
resource_provider_name = {host}
resource_provider_startup_retries = 0

# The test Placement runs with [api] auth_strategy = noauth2.
[placement]
auth_type = admin_token
token = admin
endpoint = {placement}
endpoint_override = {placement}
region_name = RegionOne
"""


# What Cyborg 17's conductor logs as errors while all is well: when a
# deployable's resource class or traits change, it also asks Placement to
# delete the resource class and trait *definitions* it stopped using;
# Placement refuses for standard ones (400, 404) and ones in use (409).
KNOWN_ERRORS = ('Failed to delete trait record with placement API',
                'Failed to delete resource class record with placement API')


class CyborgError(RuntimeError):
    """Cyborg could not be installed, or one of its commands failed."""


def venv_path():
    return os.environ.get(VENV_ENV) or os.path.join(REPO, '.venv-cyborg')


def ensure_venv():
    """Return (venv path, seconds spent installing)."""
    venv = venv_path()
    if os.environ.get(VENV_ENV):
        return venv, 0.0
    return venvs.install(venv, 'Makefile.cyborg', 'cyborg-venv',
                         'CYBORG_VENV', '.cyborg-stamp', CyborgError,
                         'openstack-cyborg')


def env(lg_conf):
    """The environment of a Cyborg process: our configuration file, this
    checkout's code first (the venv's editable install may be another
    checkout's), and no warning noise (eventlet's deprecation on every
    start)."""
    return dict(os.environ, LIBVIRT_GPU_CONFIG=lg_conf,
                PYTHONWARNINGS='ignore', PYTHONPATH=REPO)


def create_schema(venv, workdir):
    """A Cyborg database made by ``cyborg-dbsync create_schema`` (its
    ``upgrade`` fails on SQLite: a migration runs ALTER COLUMN)."""
    db = os.path.join(workdir, 'schema.db')
    conf = os.path.join(workdir, 'schema.conf')
    with open(conf, 'w') as f:
        f.write('[DEFAULT]\nlog_file = %s\n[database]\nconnection = '
                'sqlite:///%s\n' % (os.path.join(workdir, 'schema.log'), db))
    result = subprocess.run(
        [os.path.join(venv, 'bin', 'cyborg-dbsync'), '--config-file', conf,
         'create_schema'], capture_output=True, text=True, timeout=300,
        env=env('/dev/null'))
    if result.returncode != 0:
        raise CyborgError('cyborg-dbsync create_schema failed:\n%s%s'
                          % (result.stdout, result.stderr))
    return db


class CyborgHost:
    """One compute node reported by Cyborg with our driver."""

    def __init__(self, venv, workdir, hostname, placement_url, schema_db,
                 transport='fake:/', sysfs_root=None, lg_conf=None,
                 extra_conf=''):
        """``sysfs_root`` and ``lg_conf`` name a host and libvirt-gpu
        configuration made elsewhere (default: ``sys`` and
        ``libvirt-gpu.conf`` in ``workdir``, see ``write_host`` and
        ``configure``); ``extra_conf`` is appended to cyborg.conf."""
        self.venv = venv
        self.workdir = workdir
        self.hostname = hostname
        self.placement_url = placement_url
        self.sysfs_root = sysfs_root or os.path.join(workdir, 'sys')
        self.lg_conf = lg_conf or os.path.join(workdir, 'libvirt-gpu.conf')
        self.conf = os.path.join(workdir, 'cyborg.conf')
        self.db = os.path.join(workdir, 'cyborg.db')
        self.log = os.path.join(workdir, 'cyborg.log')
        shutil.copyfile(schema_db, self.db)
        with open(self.conf, 'w') as f:
            f.write(_CYBORG_CONF.format(
                host=hostname, transport=transport, log=self.log,
                db=self.db, placement=placement_url) + extra_conf)

    def write_host(self, profile):
        from libvirt_gpu import simulator
        simulator.write_host(simulator.load_profile(profile),
                             self.sysfs_root)

    def configure(self, enabled, gpu_traits=True, state_dir=None,
                  cyborg=('all',), nova_conf=''):
        """libvirt-gpu's configuration: ``{type: [address, ...]}`` (no
        address: the type on every GPU that offers it).  ``cyborg``: the
        GPUs ``[routes]/cyborg`` gives Cyborg (default: all of them, the
        host is Cyborg's; None: no [routes] group, every GPU ours);
        ``nova_conf``: its ``[routes]/nova_conf`` (empty: not read).
        Beside it ``lg_conf_ours``: the same with every GPU on our own
        route."""
        lines = ['[DEFAULT]', 'sysfs_root = %s' % self.sysfs_root,
                 'state_dir = %s' % (state_dir or os.path.join(
                     self.workdir, 'state')),
                 '[gpu]', 'nvml = off',
                 'report_gpu_traits = %s' % str(gpu_traits).lower(),
                 'enabled_vgpu_types = %s' % ', '.join(enabled)]
        for type_id, addresses in enabled.items():
            if addresses:
                lines += ['[vgpu_%s]' % type_id,
                          'device_addresses = %s' % ', '.join(addresses)]
        with open(self.lg_conf_ours, 'w') as f:
            f.write('\n'.join(lines) + '\n')
        if cyborg is not None:
            lines += ['[routes]', 'cyborg = %s' % ', '.join(cyborg),
                      'nova_conf = %s' % nova_conf]
        with open(self.lg_conf, 'w') as f:
            f.write('\n'.join(lines) + '\n')

    @property
    def lg_conf_ours(self):
        return self.lg_conf + '.ours'

    def make_compute_node(self, adapter):
        """The root provider nova-compute makes (a random UUID)."""
        self.root_uuid = str(uuidlib.uuid4())
        resp = adapter.post('/resource_providers', json={
            'name': self.hostname, 'uuid': self.root_uuid}, raise_exc=False)
        assert resp.status_code == 200, resp.text
        return self.root_uuid

    def report(self, objects=False):
        """One agent report through the real conductor (in one process);
        returns the drivers Cyborg's ResourceTracker loaded, or with
        ``objects``, the Cyborg objects our driver's ``discover()`` gave it
        (plain fields, as ``discover --json`` prints them)."""
        result = subprocess.run(
            [os.path.join(self.venv, 'bin', 'python'), REPORT_SCRIPT,
             self.conf], capture_output=True, text=True, timeout=300,
            env=env(self.lg_conf), cwd=self.workdir)
        if result.returncode != 0:
            raise CyborgError('Cyborg report failed (%d):\n%s%s\n%s'
                              % (result.returncode, result.stdout,
                                 result.stderr, self.log_text()[-4000:]))
        errors = [line for line in self.log_text().splitlines()
                  if ' ERROR ' in line and not any(
                      known in line for known in KNOWN_ERRORS)]
        if errors:
            raise CyborgError('Cyborg logged errors:\n' + '\n'.join(errors))
        done = json.loads(result.stdout.strip().splitlines()[-1])
        return done['objects'] if objects else done['drivers']

    def log_text(self):
        if not os.path.exists(self.log):
            return ''
        with open(self.log, errors='replace') as f:
            return f.read()

    def rows(self, sql, *args):
        with sqlite3.connect(self.db) as db:
            return db.execute(sql, args).fetchall()

    def libvirt_gpu(self, *args, conf=None):
        """Our CLI on the same host and configuration (the test's venv;
        ``conf``: another configuration file)."""
        result = subprocess.run(
            [sys.executable, '-m', 'libvirt_gpu.cmd.main', '--config-file',
             conf or self.lg_conf, '--hostname', self.hostname] + list(args),
            capture_output=True, text=True, timeout=300, cwd=REPO)
        assert result.returncode == 0, result.stderr
        return result.stdout


# --------------------------------------------------------------------------
# Real processes: RabbitMQ, cyborg-conductor, cyborg-agent

RABBITMQ_DIR = os.path.join(REPO, '.cache', 'rabbitmq')
STOP_TIMEOUT = 20.0


def _port_open(port):
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(('127.0.0.1', port)) == 0


def wait_for(predicate, timeout, what, process=None, log=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if process is not None and process.poll() is not None:
            break
        time.sleep(0.25)
    tail = ''
    if log and os.path.exists(log):
        with open(log, errors='replace') as f:
            tail = f.read()[-4000:]
    raise CyborgError('%s: not after %.0f s%s\n%s' % (
        what, timeout, '' if process is None or process.poll() is None
        else ' (exited %s)' % process.returncode, tail))


def ensure_rabbitmq():
    stamp = os.path.join(RABBITMQ_DIR, '.rabbitmq-stamp')
    if not os.path.exists(stamp):
        result = subprocess.run(
            ['make', '-s', '-f', 'Makefile.cyborg', 'rabbitmq'], cwd=REPO,
            capture_output=True, text=True, timeout=900)
        if result.returncode != 0:
            raise CyborgError('unpacking RabbitMQ failed:\n%s%s'
                              % (result.stdout, result.stderr))
    return os.path.join(RABBITMQ_DIR, 'root')


def _stop_group(process):
    """SIGTERM to the process group we started, then SIGKILL."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(STOP_TIMEOUT)


@contextlib.contextmanager
def rabbitmq():
    """A RabbitMQ broker of Debian's packages on free loopback ports (its
    own epmd too), data in a temporary directory; yields its transport
    URL.  Stopped, epmd included, and removed on exit."""
    root = ensure_rabbitmq()
    workdir = tempfile.mkdtemp(prefix='rabbitmq-')
    port, dist, epmd = free_port(), free_port(), free_port()
    erl_bin = os.path.join(root, 'usr', 'lib', 'erlang', 'bin')
    e = dict(os.environ, HOME=workdir,
             PATH='%s:%s' % (erl_bin, os.environ['PATH']),
             RABBITMQ_NODENAME='rabbit-test@localhost',
             RABBITMQ_NODE_IP_ADDRESS='127.0.0.1',
             RABBITMQ_NODE_PORT=str(port), RABBITMQ_DIST_PORT=str(dist),
             ERL_EPMD_ADDRESS='127.0.0.1', ERL_EPMD_PORT=str(epmd),
             RABBITMQ_MNESIA_BASE=os.path.join(workdir, 'mnesia'),
             RABBITMQ_LOG_BASE=os.path.join(workdir, 'log'),
             RABBITMQ_LOGS=os.path.join(workdir, 'rabbit.log'),
             RABBITMQ_CONFIG_FILE=os.path.join(workdir, 'rabbitmq'),
             RABBITMQ_ADVANCED_CONFIG_FILE=os.path.join(workdir,
                                                        'advanced.config'),
             RABBITMQ_ENABLED_PLUGINS_FILE=os.path.join(workdir,
                                                        'enabled_plugins'),
             RABBITMQ_PID_FILE=os.path.join(workdir, 'rabbit.pid'),
             RABBITMQ_CONF_ENV_FILE=os.path.join(workdir, 'rabbitmq-env.conf'))
    for name, text in (('enabled_plugins', '[].\n'),
                       ('advanced.config', '[].\n'),
                       ('rabbitmq-env.conf', ''),
                       ('rabbitmq.conf', 'loopback_users = none\n')):
        with open(os.path.join(workdir, name), 'w') as f:
            f.write(text)
    log = os.path.join(workdir, 'rabbit.log')
    epmd_process = process = None
    try:
        # epmd in the foreground, ours to stop (erl would leave a daemon).
        epmd_process = subprocess.Popen(
            [os.path.join(erl_bin, 'epmd'), '-address', '127.0.0.1',
             '-port', str(epmd)], env=e, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True)
        wait_for(lambda: _port_open(epmd), 30, 'epmd', epmd_process)
        with open(os.path.join(workdir, 'server.out'), 'w') as out:
            process = subprocess.Popen(
                [os.path.join(root, 'usr', 'lib', 'rabbitmq', 'bin',
                              'rabbitmq-server')],
                env=e, cwd=workdir, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)
        wait_for(lambda: _port_open(port), 120, 'RabbitMQ', process, log)
        yield 'rabbit://guest:guest@127.0.0.1:%d/' % port
    finally:
        if process is not None:
            _stop_group(process)
        if epmd_process is not None:
            _stop_group(epmd_process)
        shutil.rmtree(workdir, ignore_errors=True)


class Service:
    """``cyborg-conductor`` or ``cyborg-agent`` of a CyborgHost, in its own
    process group, stopped on exit.  ``argv`` replaces the console script
    (``--config-file``/``--log-file`` are added); ``wrap`` turns the
    command line into another (``LibvirtDaemon.namespace_argv``: the
    agent in libvirtd's mount namespace, where the simulated tree is
    ``/sys``)."""

    def __init__(self, host, name, argv=None, wrap=None):
        self.host = host
        self.name = name
        self.argv = argv or [os.path.join(host.venv, 'bin', name)]
        self.wrap = wrap
        self.out = os.path.join(host.workdir, name + '.out')
        self.log = os.path.join(host.workdir, name + '.log')
        self.process = None

    def __enter__(self):
        argv = self.argv + ['--config-file', self.host.conf,
                            '--log-file', self.log]
        if self.wrap is not None:
            argv = self.wrap(argv)
        with open(self.out, 'w') as out:
            self.process = subprocess.Popen(
                argv, env=env(self.host.lg_conf), cwd=self.host.workdir,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def __exit__(self, *exc):
        _stop_group(self.process)

    def log_text(self):
        if not os.path.exists(self.log):
            return ''
        with open(self.log, errors='replace') as f:
            return f.read()
