"""The exporter cannot be starved or broken by one bad value (issue 30,
section 3): idle and slow clients are bounded and timed out, a bad value
in a figures file is left out with a warning instead of failing every
scrape, ``--once`` and HTTP serve the same valid text, and what could not
be read is said (``read_ok`` 0), not served as zeros.

The server tests run a stand-in collector in a child process on
127.0.0.1 (its own open-file limit; a bounded number of sockets here) and
poll with ``wait_for``.
"""

import json
import os
import socket
import subprocess
import sys
import urllib.request

import pytest
from prometheus_client import core as prom
from prometheus_client import parser as prom_parser

from libvirt_gpu import exporter
from libvirt_gpu.store import figures
from libvirt_gpu.store import state
from tests.doubles.poll import wait_for
from tests.doubles.exporter_scrape import collector
from tests.doubles.exporter_scrape import scrape
from tests.doubles.t4_hook import B
from tests.doubles.t4_hook import domain_xml
from tests.doubles.t4_hook import new_uuid
from tests.doubles import paths

ROOT = paths.ROOT
FILES = 256         # the child's open-file limit (the default is 1,024)
CHILD = '''
import resource, sys, threading
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (%d, hard))
from prometheus_client import core as prom
from libvirt_gpu import exporter
class One(object):
    def collect(self):
        g = prom.GaugeMetricFamily('libvirt_gpu_up', 'a stand-in')
        g.add_metric([], 1)
        yield g
exporter.REQUEST_TIMEOUT = 1.0
exporter.serve(One(), '127.0.0.1', int(sys.argv[1]), threading.Event())
''' % FILES


class Named(object):
    """A collector of one series whose label holds ``name``."""

    def __init__(self, name):
        self.name = name

    def collect(self):
        family = prom.GaugeMetricFamily('libvirt_gpu_vgpu_info', 'a vGPU',
                                        labels=['domain'])
        family.add_metric([self.name], 1)
        yield family


def _free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def _connects(port):
    try:
        socket.create_connection(('127.0.0.1', port), timeout=1).close()
    except OSError:
        return False
    return True


def _get(port, timeout=2):
    try:
        with urllib.request.urlopen('http://127.0.0.1:%d/metrics' % port,
                                    timeout=timeout) as answer:
            return answer.read()
    except OSError:
        return None


def _threads(pid):
    with open('/proc/%d/status' % pid) as f:
        for line in f:
            if line.startswith('Threads:'):
                return int(line.split()[1])


@pytest.fixture(scope='module')
def server():
    """``(pid, port)`` of an exporter serving a stand-in collector."""
    port = _free_port()
    child = subprocess.Popen([sys.executable, '-c', CHILD, str(port)],
                             cwd=ROOT)
    try:
        assert wait_for(lambda: _connects(port), timeout=20)
        yield child.pid, port
    finally:
        child.kill()
        child.wait(10)


def _open(port, n, send=b''):
    held = []
    for _ in range(n):
        s = socket.create_connection(('127.0.0.1', port), timeout=2)
        if send:
            s.sendall(send)
        held.append(s)
    return held


def _closed(s):
    s.setblocking(False)
    try:
        return s.recv(1) == b''
    except BlockingIOError:
        return False
    except OSError:
        return True         # reset: closed too


# --- connections -------------------------------------------------------------

def test_idle_connections_past_the_file_limit_do_not_starve_a_scrape(
        server):
    pid, port = server
    held = _open(port, FILES + 44)      # more than the child may open
    try:
        # at once, while they are held: the longest-waiting one makes room
        body = _get(port, timeout=5)
        assert body and b'libvirt_gpu_up 1.0' in body
        # one thread reads every connection, two answer: none per client
        assert _threads(pid) <= 1 + exporter.WORKERS
    finally:
        for s in held:
            s.close()


def test_a_slow_client_is_closed_and_holds_no_thread(server):
    pid, port = server
    held = _open(port, 30, send=b'GET /metrics HTTP/1.1\r\nHost: x\r\n')
    try:
        assert _threads(pid) <= 1 + exporter.WORKERS
        # the child's REQUEST_TIMEOUT is 1 s: each is closed soon after
        assert wait_for(lambda: all(_closed(s) for s in held), timeout=8)
        assert _get(port)
    finally:
        for s in held:
            s.close()


def test_the_connection_bound_stays_under_the_file_limit():
    import resource
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert exporter.connection_limit() * 2 < soft
    assert exporter.connection_limit(10 ** 6) < soft


# --- one renderer ------------------------------------------------------------

@pytest.mark.parametrize('name', ['a\tb', 'vm\u202eexe', 'x\x1b]0;t\x07',
                                  'bad\udcff'])
def test_once_and_http_serve_the_same_valid_text(name, capsys):
    import threading
    from libvirt_gpu.cmd import term
    col = Named(name)
    stop = threading.Event()
    server = exporter.Server(col, '127.0.0.1', 0)
    thread = threading.Thread(target=server.serve, args=(stop,))
    thread.start()
    try:
        body = wait_for(lambda: _get(server.port), timeout=8)
    finally:
        stop.set()
        thread.join(10)
    with term.escaped_output():       # as the CLI writes --once
        sys.stdout.write(exporter.exposition(col))
    once = capsys.readouterr().out
    assert once == body.decode()
    # every character printable, and Prometheus' parser reads it back
    line = [x for x in once.splitlines() if not x.startswith('#')][0]
    assert line.isprintable()
    [family] = prom_parser.text_string_to_metric_families(once)
    assert family.samples[0].labels['domain'].startswith(name[:1])


# --- bad values in the figures -----------------------------------------------

def _hook_file(state_dir, entry, operation='prepare'):
    zero = {'calls': 0, 'refusals': 0, 'errors': 0, 'seconds_sum': 0.0,
            'counts': [0] * (len(figures.BUCKETS) + 1)}
    doc = {'version': figures.VERSION, 'buckets': list(figures.BUCKETS),
           'operations': {'release': dict(zero, calls=3),
                          operation: dict(zero, **entry)}}
    os.makedirs(state_dir, exist_ok=True)
    with open(os.path.join(state_dir, figures.HOOK_FIGURES), 'w') as f:
        json.dump(doc, f)


def _op(samples, metric, operation):
    return samples.get((metric, frozenset({('operation', operation)})))


def _read_ok(samples, part):
    return samples.get(('libvirt_gpu_exporter_read_ok',
                        frozenset({('part', part)})))


@pytest.mark.parametrize('entry,operation,said', [
    ({'calls': float('inf')}, 'prepare', 'calls is Infinity'),
    ({'errors': -4}, 'prepare', 'errors is -4, not a count'),
    ({'counts': [True] * (len(figures.BUCKETS) + 1)}, 'prepare',
     'counts is true'),
    ({}, '\ud800', 'operation "\\ud800" is not one of the hook\'s'),
])
def test_a_bad_hook_value_is_left_out_with_a_warning(host, caplog, entry,  # noqa: E501
                                                     operation, said):
    _hook_file(host.state_dir, entry, operation)
    col, _ = collector(host)
    found = scrape(col)
    # the scrape is served: the other operations, read_ok 0, a warning
    assert _op(found, 'libvirt_gpu_hook_calls_total', 'release') == 3
    assert _op(found, 'libvirt_gpu_hook_calls_total', operation) is None
    assert _read_ok(found, 'hook') == 0
    assert _read_ok(found, 'leases') == 1
    assert any(said in r.getMessage() for r in caplog.records), \
        [r.getMessage() for r in caplog.records]
    # the next hook call counts that operation afresh: all is served again
    figures.record_hook_call(host.state_dir, 'prepare', figures.OK, 0.01)
    again = scrape(col)
    assert _op(again, 'libvirt_gpu_hook_calls_total', 'prepare') == 1
    assert _op(again, 'libvirt_gpu_hook_calls_total', 'release') == 3
    assert _read_ok(again, 'hook') == 1


def _outcome_file(state_dir, **values):
    doc = dict({'version': figures.VERSION, 'runs': 5, 'failures': 1,
                'last_run': 1.7e9, 'last_success': 1.7e9,
                'last_error': 'no Placement', 'last_error_time': 1.6e9,
                'last_changes': 2, 'changes_total': 7}, **values)
    os.makedirs(state_dir, exist_ok=True)
    with open(os.path.join(state_dir, figures.OUTCOME
                           % figures.PLACEMENT_SYNC), 'w') as f:
        json.dump(doc, f)


def _task(samples, metric, **labels):
    return samples.get((metric, frozenset(dict(
        labels, task=figures.PLACEMENT_SYNC).items())))


@pytest.mark.parametrize('values,absent,said', [
    ({'runs': float('inf')}, 'libvirt_gpu_task_runs_total',
     'runs is Infinity'),
    ({'failures': -1}, 'libvirt_gpu_task_failures_total',
     'failures is -1, not a count'),
    ({'last_success': float('nan')},
     'libvirt_gpu_task_last_success_timestamp_seconds',
     'last_success is NaN'),
])
def test_a_bad_task_value_is_left_out_with_a_warning(host, caplog, values,  # noqa: E501
                                                     absent, said):
    _outcome_file(host.state_dir, **values)
    col, _ = collector(host)
    found = scrape(col)
    assert _task(found, absent) is None
    assert _task(found, 'libvirt_gpu_task_changes_total') == 7
    assert _read_ok(found, 'tasks') == 0
    assert any(said in r.getMessage() for r in caplog.records)
    # a later run does not fail on it, and starts that value afresh
    assert figures.record_outcome(host.state_dir, figures.PLACEMENT_SYNC,
                                  changes=1, now=1.8e9)
    again = scrape(col)
    assert _read_ok(again, 'tasks') == 1
    assert _task(again, 'libvirt_gpu_task_changes_total') == 8
    assert _task(again, 'libvirt_gpu_task_runs_total') >= 1


def test_a_stored_error_with_a_surrogate_is_served_escaped(host):  # noqa: E501
    _outcome_file(host.state_dir, last_error='cannot open /x/\udcff')
    col, _ = collector(host)
    found = scrape(col)
    assert _task(found, 'libvirt_gpu_task_last_error_info',
                 error='cannot open /x/\\udcff') == 1
    assert _read_ok(found, 'tasks') == 1
    # and after a later good run (the last error stays the last error)
    figures.record_outcome(host.state_dir, figures.PLACEMENT_SYNC,
                           changes=0, now=1.8e9)
    assert _task(scrape(col), 'libvirt_gpu_task_last_error_info',
                 error='cannot open /x/\\udcff') == 1


# --- what could not be read --------------------------------------------------

@pytest.mark.skipif(os.geteuid() != 0, reason='drops root to a user')
def test_leases_a_user_cannot_read_are_said_so_not_zero(host, monkeypatch):
    assert host.run('prepare', domain_xml([(new_uuid(), 'nvidia-223',
                                            B)]))[0] == 0
    assert os.path.exists(os.path.join(host.state_dir, state.DB_NAME))
    os.chmod(host.state_dir, 0o700)
    col, _ = collector(host)
    # The child below cannot read this checkout (a clone in a 0700
    # directory): the vGPU kinds it would look up again on its import
    # path are the ones this process found.  The test is the leases'.
    from libvirt_gpu.devices.backends import registry
    found = registry.installed()
    monkeypatch.setattr(registry, 'installed', lambda: found)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:        # the child: as nobody, one scrape, to the pipe
        code = 1
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            found = scrape(col)
            os.write(write, json.dumps(
                [_read_ok(found, 'leases'),
                 sorted(dict(k[1]).get('state') for k in found
                        if k[0] == 'libvirt_gpu_leases')]).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as f:
        said = f.read()
    _, status = os.waitpid(pid, 0)
    assert status == 0 and said
    ok, states = json.loads(said)
    assert ok == 0          # not 1 with every count at 0
    assert states == []     # absent, not "0 reserved"
