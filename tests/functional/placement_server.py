"""Run a real OpenStack Placement for the functional tests and the benchmark.

    with placement_server.running() as server:
        server.url            # http://127.0.0.1:<port>
        server.client()       # a PlacementClient speaking to it (noauth2)

What runs is the ``openstack-placement`` package from PyPI in its own
virtual environment (``.venv-placement``, made by ``make -f
Makefile.placement placement-venv``; ``LIBVIRT_GPU_PLACEMENT_VENV`` names
another one), with SQLite and ``[api] auth_strategy = noauth2`` (every
request carries ``X-Auth-Token: admin``), served by gunicorn on a loopback
socket that we open ourselves and hand over (``--bind fd://N``), so there is
no race for a free port. The config file, database and log live in a
temporary directory that is removed on exit, whatever happens.
"""

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

from keystoneauth1 import adapter as ks_adapter
from keystoneauth1 import exceptions as ks_exc
from keystoneauth1 import session as ks_session
from keystoneauth1 import token_endpoint

from libvirt_gpu.util import records
from libvirt_gpu.openstack.placement import client as placement_client

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
VENV_ENV = 'LIBVIRT_GPU_PLACEMENT_VENV'
START_TIMEOUT = 60.0
STOP_TIMEOUT = 10.0

# [placement_database] sync_on_startup is off: `placement-manage db sync`
# runs before the server, as an operator would do it.
_CONF = """\
[DEFAULT]
debug = false
log_file = {log}

[api]
auth_strategy = noauth2

[placement_database]
connection = sqlite:///{db}
sync_on_startup = false
sqlite_synchronous = false
"""


class PlacementServerError(RuntimeError):
    """The test Placement could not be installed or started."""


@records.record
class Timings:
    install_s: float   # 0.0 when the venv was already there
    db_sync_s: float
    start_s: float     # process start until GET / answers


@records.record(frozen=False)
class PlacementServer:
    url: str
    workdir: str
    timings: Timings
    process: subprocess.Popen

    def adapter(self):
        """A raw keystoneauth Adapter for assertions (noauth2 admin)."""
        sess = ks_session.Session(
            auth=token_endpoint.Token(self.url, 'admin'))
        return ks_adapter.Adapter(sess, service_type='placement',
                                  endpoint_override=self.url,
                                  default_microversion='1.39')

    def client(self, **kwargs):
        return placement_client.PlacementClient.from_url(self.url, **kwargs)

    def log(self):
        path = os.path.join(self.workdir, 'placement.log')
        if not os.path.exists(path):
            return ''
        with open(path, errors='replace') as f:
            return f.read()


def venv_path():
    return os.environ.get(VENV_ENV) or os.path.join(REPO, '.venv-placement')


def ensure_venv():
    """Return (venv path, seconds spent installing)."""
    venv = venv_path()
    if os.environ.get(VENV_ENV):
        if not os.path.exists(os.path.join(venv, 'bin', 'placement-manage')):
            raise PlacementServerError(
                '%s=%s has no bin/placement-manage; install '
                'openstack-placement and gunicorn there' % (VENV_ENV, venv))
        return venv, 0.0
    stamp = os.path.join(venv, '.placement-stamp')
    if os.path.exists(stamp):
        return venv, 0.0
    start = time.monotonic()
    result = subprocess.run(
        ['make', '-s', '-f', 'Makefile.placement', 'placement-venv',
         'PLACEMENT_VENV=%s' % venv],
        cwd=REPO, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        raise PlacementServerError(
            'installing openstack-placement into %s failed:\n%s%s'
            % (venv, result.stdout, result.stderr))
    return venv, time.monotonic() - start


def _listen_socket():
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(('127.0.0.1', 0))
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def _wait_ready(url, process, workdir, timeout):
    sess = ks_session.Session()
    deadline = time.monotonic() + timeout
    last = 'no answer yet'
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise PlacementServerError(
                'placement exited with status %s before answering:\n%s'
                % (process.returncode, _tail(workdir)))
        try:
            resp = sess.get(url + '/', raise_exc=False, timeout=2,
                            connect_retries=0)
        except ks_exc.ConnectionError as exc:
            last = repr(exc)
        else:
            if resp.status_code == 200:
                return
            last = 'HTTP %d' % resp.status_code
        time.sleep(0.05)
    raise PlacementServerError('placement at %s not ready after %.0f s '
                               '(%s):\n%s' % (url, timeout, last,
                                              _tail(workdir)))


def _tail(workdir, limit=4000):
    text = ''
    for name in ('placement.log', 'gunicorn.log'):
        path = os.path.join(workdir, name)
        if os.path.exists(path):
            with open(path, errors='replace') as f:
                text += '--- %s ---\n%s' % (name, f.read()[-limit:])
    return text


def _stop(process):
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGINT)  # gunicorn: quick shutdown
    try:
        process.wait(STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(STOP_TIMEOUT)


@contextlib.contextmanager
def running(workers=1, threads=1):
    """Start a fresh Placement (empty database); stop and clean up on exit.

    ``workers`` gunicorn processes with ``threads`` threads each. Keep one
    of each with SQLite: concurrent writers get "database is locked" (HTTP
    500) from SQLite; a production Placement runs on MySQL/PostgreSQL.
    """
    venv, install_s = ensure_venv()
    workdir = tempfile.mkdtemp(prefix='placement-')
    process = None
    sock = None
    try:
        conf = os.path.join(workdir, 'placement.conf')
        with open(conf, 'w') as f:
            f.write(_CONF.format(db=os.path.join(workdir, 'placement.db'),
                                 log=os.path.join(workdir, 'placement.log')))
        env = dict(os.environ, OS_PLACEMENT_CONFIG_DIR=workdir)
        env.pop('PYTHONPATH', None)

        start = time.monotonic()
        result = subprocess.run(
            [os.path.join(venv, 'bin', 'placement-manage'),
             '--config-file', conf, 'db', 'sync'],
            env=env, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            raise PlacementServerError('placement-manage db sync failed:\n%s%s'
                                       % (result.stdout, result.stderr))
        db_sync_s = time.monotonic() - start

        sock = _listen_socket()
        port = sock.getsockname()[1]
        url = 'http://127.0.0.1:%d' % port
        start = time.monotonic()
        with open(os.path.join(workdir, 'gunicorn.log'), 'w') as log:
            process = subprocess.Popen(
                [os.path.join(venv, 'bin', 'gunicorn'),
                 '--bind', 'fd://%d' % sock.fileno(),
                 '--workers', str(workers), '--threads', str(threads),
                 '--worker-class', 'gthread' if threads > 1 else 'sync',
                 '--timeout', '120', '--graceful-timeout', '5',
                 'placement.wsgi.api:application'],
                env=env, cwd=workdir, stdout=log, stderr=subprocess.STDOUT,
                pass_fds=(sock.fileno(),), start_new_session=True)
        sock.close()   # the server holds its own copy
        sock = None
        _wait_ready(url, process, workdir, START_TIMEOUT)
        timings = Timings(install_s=install_s, db_sync_s=db_sync_s,
                          start_s=time.monotonic() - start)
        yield PlacementServer(url=url, workdir=workdir, timings=timings,
                              process=process)
    finally:
        if sock is not None:
            sock.close()
        if process is not None:
            _stop(process)
        shutil.rmtree(workdir, ignore_errors=True)
