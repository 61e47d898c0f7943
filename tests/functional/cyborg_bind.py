"""The real Cyborg 17 bind path on a live simulated host, for functional
tests (``test_cyborg_bind.py``, and scenarios with Nova's code).

``running(workdir, placement)`` starts, and stops on exit whatever
happens:

* a live simulated T4 host (``live_sysfs.LiveHost``: FUSE, whose
  ``create``/``remove`` writes make and remove vGPUs as the kernel does)
  and a real libvirtd that sees it as ``/sys``, with our qemu hook
  installed (``hook_guests.HookSetup``);
* libvirt-gpu's configuration giving the T4's vGPU GPU to Cyborg
  (``[routes]/cyborg = 0000:af:00.0``, ``[gpu]/enabled_vgpu_types =
  nvidia-223``), read by the hook, the CLI and Cyborg's agent alike;
* RabbitMQ, ``cyborg-conductor``, ``cyborg-api`` (``cyborg_api.py``: the
  WSGI app, a paste pipeline without keystonemiddleware) and
  ``cyborg-agent`` loading ``libvirt_gpu_driver``, the agent run *inside
  libvirtd's mount namespace*, so that its privsep helper (``[cyborg_sys_
  admin]/helper_command``: the venv's ``privsep-helper``, no sudo) writing
  an ARQ's attach-handle UUID to
  ``/sys/class/mdev_bus/<pci>/mdev_supported_types/<type>/create`` reaches
  the live tree;
* a stand-in for Nova's ``os-server-external-events`` API
  (``NovaEvents``): Cyborg's conductor notifies Nova after each bind, and
  answers the bind PATCH with 500 (``MissingAuthPlugin``) when it cannot;
* the compute node's provider in the test's Placement, as nova-compute
  makes it; Cyborg's agent reports under it.

It yields a ``BindHost``: ``.bind(arq)``, ``.unbind(arq)``,
``.delete(arq)``, ``.arq(uuid)``, ``.create_profile()``,
``.create_arq()``, ``.daemon`` (the LibvirtDaemon), ``.live`` (the
LiveSysfs), ``.sysfs_root``, ``.config`` (libvirt-gpu's configuration
file), ``.cli(...)`` (the libvirt-gpu CLI in the daemon's namespace) and
``.timings`` (seconds per step).
"""

import contextlib
import http.server
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid as uuidlib

from tests.doubles import ports
from tests.functional import cyborg_env
from tests.functional import hook_guests
from tests.functional import libvirtd
from tests.functional import live_sysfs

REPO = cyborg_env.REPO
API_SCRIPT = os.path.join(REPO, 'tests', 'functional', 'cyborg_api.py')
CYBORG_GPU = '0000:af:00.0'     # the T4 profile's vGPU GPU
OUR_GPU = '0000:3b:00.0'
T4_2B = 'nvidia-223'
# What a device profile for one GRID T4-2B vGPU on Cyborg's GPUs asks
# (our driver reports Cyborg's vGPUs as CUSTOM_CYBORG_VGPU).
T4_2B_GROUP = {'resources:CUSTOM_CYBORG_VGPU': '1',
               'trait:CUSTOM_NVIDIA_1EB8_T4_2B': 'required'}
BIND_TIMEOUT = 90.0
START_TIMEOUT = 120.0

_API_PASTE = """\
[pipeline:main]
pipeline = request_id api_v2

[app:api_v2]
paste.app_factory = cyborg.api.app:app_factory

[filter:request_id]
paste.filter_factory = oslo_middleware:RequestId.factory
"""

_EXTRA_CONF = """
[api]
host_ip = 127.0.0.1
port = {api_port}
api_workers = 1
api_paste_config = {paste}

# The stand-in for Nova's external-events API (any token is accepted).
[nova]
auth_type = admin_token
token = admin
endpoint = {nova}
endpoint_override = {nova}
region_name = RegionOne

[cyborg_sys_admin]
helper_command = {venv}/bin/privsep-helper --config-file {conf}
"""


class BindError(cyborg_env.CyborgError):
    """A Cyborg API call answered otherwise than the test expects."""


def pci_nodedev_name(address):
    """libvirt's node-device name of a PCI device: ``pci_0000_af_00_0``."""
    return 'pci_' + _underscored(address)


def nodedev_name(uuid, parent):
    """libvirt 9's node-device name of an mdev:
    ``mdev_<uuid, - as _>_<dddd>_<bb>_<dd>_<f>``."""
    return 'mdev_%s_%s' % (str(uuid).replace('-', '_'), _underscored(parent))


def _underscored(address):
    return str(address).replace(':', '_').replace('.', '_')


def provider_uuid(hostname, address):
    """The provider Cyborg's conductor makes for a deployable:
    ``uuid3(NAMESPACE_DNS, '<host>_<address>')``."""
    return str(uuidlib.uuid3(uuidlib.NAMESPACE_DNS,
                             '%s_%s' % (hostname, address)))


# --------------------------------------------------------------------------
# Nova's external-events API, stood in for

class NovaEvents:
    """An HTTP server answering Nova's ``POST /os-server-external-events``
    with 200 (each event ``code`` 200) and recording the events; any GET
    (version discovery) gets a compute version document."""

    def __init__(self):
        self.events = []
        self._lock = threading.Lock()
        self.server = None
        self.thread = None

    @property
    def url(self):
        return 'http://127.0.0.1:%d' % self.server.server_address[1]

    def __enter__(self):
        events, lock = self.events, self._lock

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self, code, doc):
                body = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header('Content-Type', 'application/json')
                self.send_header('Content-Length', str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                url = 'http://%s/' % self.headers.get('Host', '')
                self._answer(200, {'version': {
                    'id': 'v2.1', 'status': 'CURRENT', 'version': '2.96',
                    'min_version': '2.1',
                    'links': [{'rel': 'self', 'href': url}]}})

            def do_POST(self):
                length = int(self.headers.get('Content-Length') or 0)
                try:
                    doc = json.loads(self.rfile.read(length) or b'{}')
                    got = list(doc['events'])
                except (ValueError, KeyError, TypeError):
                    self._answer(400, {'error': 'not an events document'})
                    return
                if not self.path.rstrip('/').endswith(
                        '/os-server-external-events'):
                    self._answer(404, {'error': self.path})
                    return
                with lock:
                    events.extend(got)
                self._answer(200, {'events': [dict(e, code=200)
                                              for e in got]})

        self.server = http.server.ThreadingHTTPServer(
            ('127.0.0.1', ports.free_port()), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)

    def of(self, instance_uuid):
        with self._lock:
            return [e for e in self.events
                    if e.get('server_uuid') == instance_uuid]


# --------------------------------------------------------------------------
# Cyborg's API

class Client:
    """Cyborg's v2 API over urllib, as Nova calls it: an admin of
    ``project_id`` with a service token (what keystonemiddleware would
    put in the headers; bind, unbind and deleting a bound ARQ need it).
    ``timings``: ``[(step, seconds)]`` of every call."""

    def __init__(self, url, project_id):
        self.url = url.rstrip('/')
        self.project_id = project_id
        self.timings = []

    def request(self, method, path, body=None, expect=(200,)):
        data = None if body is None else json.dumps(body).encode()
        headers = {
            'Content-Type': 'application/json',
            'Accept': 'application/json',
            'X-Auth-Token': 'admin', 'X-Roles': 'admin,member,reader',
            'X-Service-Roles': 'service', 'X-Project-Id': self.project_id,
            'X-User-Id': 'nova', 'X-Tenant-Id': self.project_id}
        req = urllib.request.Request(self.url + path, data=data,
                                     method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                status, text = resp.status, resp.read().decode()
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read().decode(errors='replace')
        if status not in expect:
            raise BindError('%s %s answered %d: %s'
                            % (method, path, status, text[:2000]))
        return json.loads(text) if text else None

    def timed(self, step, func, *args, **kwargs):
        t0 = time.monotonic()
        try:
            return func(*args, **kwargs)
        finally:
            self.timings.append((step, time.monotonic() - t0))

    def create_profile(self, name, groups):
        return self.timed('create device profile', self.request, 'POST',
                          '/v2/device_profiles',
                          [{'name': name, 'groups': groups}], expect=(201,))

    def create_arqs(self, profile_name):
        doc = self.timed('create ARQ', self.request, 'POST',
                         '/v2/accelerator_requests',
                         {'device_profile_name': profile_name},
                         expect=(201,))
        return [a['uuid'] for a in doc['arqs']]

    def arq(self, uuid):
        return self.request('GET', '/v2/accelerator_requests/%s' % uuid)

    def patch(self, step, patch_list):
        self.timed(step, self.request, 'PATCH', '/v2/accelerator_requests',
                   patch_list, expect=(202,))

    def delete(self, uuid):
        self.timed('delete ARQ', self.request, 'DELETE',
                   '/v2/accelerator_requests?arqs=%s' % uuid, expect=(204,))


class BindHost:
    """One compute node of Cyborg's with our driver, on a live tree seen
    by a real libvirtd (see the module doc)."""

    def __init__(self, live_host, cyborg, client, nova, setup, services):
        self.live_host = live_host
        self.daemon = live_host.daemon
        self.live = live_host.live
        self.sysfs_root = live_host.live.root
        self.cyborg = cyborg
        self.hostname = cyborg.hostname
        self.config = cyborg.lg_conf
        self.setup = setup
        self.state_dir = setup.state_dir
        self.hook_calls_log = setup.calls_log
        self.client = client
        self.nova = nova
        self.services = services        # {name: cyborg_env.Service}
        self.timings = client.timings
        # [(step, seconds since running() began)] of the start
        self.start_timings = []

    # -- Cyborg ---------------------------------------------------------

    def device_rp_uuid(self, address=CYBORG_GPU):
        return provider_uuid(self.hostname, address)

    def create_profile(self, name='t4-2b', groups=None):
        return self.client.create_profile(name, [dict(
            groups or T4_2B_GROUP)])

    def create_arq(self, profile_name='t4-2b'):
        (uuid,) = self.client.create_arqs(profile_name)
        return uuid

    def arq(self, uuid):
        return self.client.arq(uuid)

    def arqs(self):
        """Every ARQ Cyborg has, ``{uuid: ARQ}``."""
        return {a['uuid']: a for a in self.client.request(
            'GET', '/v2/accelerator_requests')['arqs']}

    def bind(self, arq_uuid, instance_uuid=None, address=CYBORG_GPU,
             timeout=BIND_TIMEOUT):
        """Bind as Nova's conductor does (hostname, the device provider
        Placement allocated, the instance), wait until Cyborg says Bound;
        returns the ARQ."""
        instance_uuid = instance_uuid or str(uuidlib.uuid4())
        t0 = time.monotonic()
        self.client.patch('bind PATCH', {arq_uuid: [
            {'path': '/hostname', 'op': 'add', 'value': self.hostname},
            {'path': '/device_rp_uuid', 'op': 'add',
             'value': self.device_rp_uuid(address)},
            {'path': '/instance_uuid', 'op': 'add',
             'value': instance_uuid}]})
        arq = self.wait_state(arq_uuid, ('Bound', 'BindFailed'), timeout)
        self.timings.append(('bind until Bound', time.monotonic() - t0))
        if arq['state'] != 'Bound':
            raise BindError('ARQ %s: %s\n%s' % (arq_uuid, arq['state'],
                                                self.log_tail()))
        return arq

    def unbind(self, arq_uuid):
        self.client.patch('unbind PATCH', {arq_uuid: [
            {'path': '/hostname', 'op': 'remove'},
            {'path': '/device_rp_uuid', 'op': 'remove'},
            {'path': '/instance_uuid', 'op': 'remove'}]})
        return self.arq(arq_uuid)

    def delete(self, arq_uuid):
        self.client.delete(arq_uuid)

    def wait_state(self, arq_uuid, states, timeout):
        last = live_sysfs.wait_for(
            lambda: _in_states(self.arq(arq_uuid), states), timeout, 0.1)
        if not last:
            raise BindError('ARQ %s never reached %s: %s\n%s' % (
                arq_uuid, '/'.join(states), self.arq(arq_uuid),
                self.log_tail()))
        return last

    def log_tail(self, n=4000):
        return '\n'.join('--- %s ---\n%s' % (name, s.log_text()[-n:])
                         for name, s in self.services.items())

    # -- the host -------------------------------------------------------

    def hook_calls(self):
        """Every hook call libvirt made, ``[argv 1..4, 'uuid=<domain>']``
        (a recording hook beside ours)."""
        return libvirtd.read_hook_log(self.hook_calls_log)

    def mdev_path(self, uuid):
        return self.live.path('bus', 'mdev', 'devices', str(uuid))

    def mdev_parent_and_type(self, uuid):
        """(parent address, type) of a live vGPU, read from sysfs; None
        when there is none."""
        path = self.mdev_path(uuid)
        if not os.path.exists(path):
            return None
        return (os.path.basename(os.path.dirname(os.path.realpath(path))),
                os.path.basename(os.path.realpath(
                    os.path.join(path, 'mdev_type'))))

    def nodedev(self, uuid, parent=CYBORG_GPU):
        """The vGPU's node device as libvirt names it (a
        ``virNodeDevice``), None when libvirt has none."""
        import libvirt
        try:
            return self.daemon.connect().nodeDeviceLookupByName(
                nodedev_name(uuid, parent))
        except libvirt.libvirtError:
            return None

    def cli(self, *args, check=True):
        """``libvirt-gpu -c <the daemon> --config-file <config> ARGS`` in
        the daemon's namespace (its /etc/mdevctl.d, the tree as /sys);
        a CompletedProcess with text output."""
        result = self.daemon.run_in_namespace(
            [sys.executable, '-m', 'libvirt_gpu.cmd.main', '-c',
             self.daemon.uri, '--config-file', self.config,
             '--hostname', self.hostname] + list(args),
            capture_output=True, text=True, timeout=300, cwd=REPO,
            env=dict(os.environ, PYTHONPATH=REPO))
        if check and result.returncode not in (0,):
            raise BindError('libvirt-gpu %s: exit %d\n%s%s' % (
                ' '.join(args), result.returncode, result.stdout,
                result.stderr))
        return result


class _HookSetup(hook_guests.HookSetup):
    """Our hook, and one that records each call libvirt makes."""

    def __init__(self, workdir, type_id):
        super().__init__(workdir, type_id)
        self.calls_log = os.path.join(workdir, 'hook-calls.log')

    def extra_hooks(self):
        return {'qemu.d/00-record': libvirtd.recording_hook(self.calls_log)}


def _in_states(arq, states):
    return arq if arq['state'] in states else None


def _wait_log(service, text, timeout=START_TIMEOUT):
    cyborg_env.wait_for(lambda: text in service.log_text(), timeout,
                        '%s: %r in its log' % (service.name, text),
                        service.process, service.log)


def _schema_in_background(venv, cyborg_dir):
    """``cyborg_env.create_schema`` in a thread (it takes seconds, as
    RabbitMQ's start does); call the result for the path, or its error."""
    done = {}

    def make():
        try:
            done['db'] = cyborg_env.create_schema(venv, cyborg_dir)
        except cyborg_env.CyborgError as e:
            done['error'] = e

    thread = threading.Thread(target=make, daemon=True)
    thread.start()

    def result():
        thread.join(300)
        if 'error' in done:
            raise done['error']
        if 'db' not in done:
            raise cyborg_env.CyborgError('cyborg-dbsync create_schema did '
                                         'not finish in 300 s')
        return done['db']
    return result


def _reported(placement, rp, agent):
    """Whether Cyborg's provider ``rp`` is in Placement; raises at once
    when our driver refused to report (its one line in the agent's log)
    rather than waiting for the provider that will not come."""
    refused = [line for line in agent.log_text().splitlines()
               if 'libvirt_gpu_driver: nothing reported' in line
               or 'libvirt_gpu_driver refuses to report' in line]
    if refused:
        raise cyborg_env.CyborgError('cyborg-agent: ' + refused[0])
    return placement.adapter().get('/resource_providers/%s' % rp,
                                   raise_exc=False).status_code == 200


@contextlib.contextmanager
def running(workdir, placement, hostname='cy-bind', project_id=None,
            cyborg_gpus=(CYBORG_GPU,), nova_conf=''):
    """See the module doc.  ``placement``: a ``placement_server`` server
    (``.url``, ``.adapter()``); ``cyborg_gpus``: ``[routes]/cyborg``
    (its first GPU's provider is waited for); ``nova_conf``:
    ``[routes]/nova_conf`` (empty: not read)."""
    workdir = os.fspath(workdir)
    timings = []
    t0 = time.monotonic()
    venv = cyborg_env.ensure_venv()[0]
    cyborg_dir = os.path.join(workdir, 'cyborg')
    os.makedirs(cyborg_dir)
    schema = _schema_in_background(venv, cyborg_dir)
    paste = os.path.join(cyborg_dir, 'api-paste.ini')
    with open(paste, 'w') as f:
        f.write(_API_PASTE)
    setup = _HookSetup(workdir, T4_2B)
    api_port = ports.free_port()
    with contextlib.ExitStack() as stack:
        live_host = stack.enter_context(live_sysfs.LiveHost(
            workdir, hooks=setup.hooks))
        timings.append(('live tree + libvirtd', time.monotonic() - t0))
        nova = stack.enter_context(NovaEvents())
        transport = stack.enter_context(cyborg_env.rabbitmq())
        timings.append(('rabbitmq', time.monotonic() - t0))
        extra = _EXTRA_CONF.format(
            api_port=api_port, paste=paste, nova=nova.url, venv=venv,
            conf=os.path.join(cyborg_dir, 'cyborg.conf'))
        cyborg = cyborg_env.CyborgHost(
            venv, cyborg_dir, hostname, placement.url, schema(),
            transport=transport, sysfs_root=live_host.live.root,
            lg_conf=setup.config, extra_conf=extra)
        # the hook wrote its configuration when libvirtd started: this one
        # replaces it (the hook reads it at its next call)
        cyborg.configure({T4_2B: []}, state_dir=setup.state_dir,
                         cyborg=list(cyborg_gpus), nova_conf=nova_conf)
        cyborg.make_compute_node(placement.adapter())
        conductor = stack.enter_context(
            cyborg_env.Service(cyborg, 'cyborg-conductor'))
        api = stack.enter_context(cyborg_env.Service(
            cyborg, 'cyborg-api', argv=[os.path.join(venv, 'bin', 'python'),
                                        API_SCRIPT]))
        _wait_log(conductor, 'Created RPC server')
        timings.append(('conductor', time.monotonic() - t0))
        agent = stack.enter_context(cyborg_env.Service(
            cyborg, 'cyborg-agent', wrap=live_host.daemon.namespace_argv))
        client = Client('http://127.0.0.1:%d' % api_port,
                        project_id or uuidlib.uuid4().hex)
        cyborg_env.wait_for(lambda: 'serving' in _read(api.out),
                            START_TIMEOUT, 'cyborg-api serving',
                            api.process, api.out)
        timings.append(('api', time.monotonic() - t0))
        rp = provider_uuid(hostname, cyborg_gpus[0])
        cyborg_env.wait_for(lambda: _reported(placement, rp, agent),
                            START_TIMEOUT, "the agent's first report",
                            agent.process, agent.log)
        timings.append(('agent report', time.monotonic() - t0))
        host = BindHost(live_host, cyborg, client, nova, setup,
                        {'cyborg-conductor': conductor, 'cyborg-api': api,
                         'cyborg-agent': agent})
        host.start_timings[:] = timings
        yield host


def _read(path):
    try:
        with open(path, errors='replace') as f:
            return f.read()
    except FileNotFoundError:
        return ''
