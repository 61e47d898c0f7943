"""libvirt-gpu exporter and the figures it serves.

The hook runs in-process on a simulated T4 host (the simulator's kernel
answers, as in test_hook.py) and the exporter's collector is scraped
through prometheus_client's own text format, read back with its parser.
The scrape under a real Prometheus is tests/functional/test_exporter.py.
"""

import errno
import fcntl
import json
import multiprocessing
import os
import socket
import subprocess
import sys

import pytest
from prometheus_client import parser as prom_parser

from libvirt_gpu.openstack import agent
from libvirt_gpu.devices import capacity
from libvirt_gpu import objects
from libvirt_gpu import conf as conf_mod
from libvirt_gpu import environment
from libvirt_gpu import exception
from libvirt_gpu import exporter
from libvirt_gpu.store import figures
from libvirt_gpu.store import state
from tests.doubles import h100
from tests.doubles import trees
from tests.doubles import exporter_scrape
from tests.doubles.exporter_scrape import collector, scrape, series, value
from tests.doubles.t4_hook import A, B
from tests.doubles.t4_hook import domain_xml
from tests.doubles.t4_hook import new_uuid
import gc
import logging
import math
import queue
import resource
import select
import selectors
import shutil
import sqlite3
import struct
import tempfile
import time
from prometheus_client import core as prom
from libvirt_gpu.devices import layout as layout_mod
from libvirt_gpu.devices import nvml
from libvirt_gpu.devices import routes
from libvirt_gpu.guests import reconcile
from libvirt_gpu import simulator
from libvirt_gpu.virt import host as host_mod
from tests.doubles import fake_libvirt
from tests.doubles.poll import wait_for
from tests.doubles import exporter_layout as tel
from tests.doubles import t4_hook as th

DOM2 = objects.Uuid.parse('6a8a3b1e-9d0b-4a55-9d84-3c7f0f3f4e21')
# the vGPUs the t4 profile holds on B (no lease, no domain)
PRE = ['4b20d080-1b54-4048-85b3-a6a62d165c01',
       'b1ae8bf6-38b0-4c81-9d44-78ce3f520496']


# --- the hook's figures ------------------------------------------------------

def test_hook_calls_are_counted_by_operation_and_outcome(host):
    u1 = new_uuid()
    assert host.run('prepare', domain_xml([(u1, 'nvidia-223', B)]))[0] == 0
    # B holds two vGPUs of the simulated profile: 6 more fit, the 7th not
    many = [(new_uuid(), 'nvidia-223', B) for _ in range(7)]
    rc, err = host.run('prepare', domain_xml(many, uuid=DOM2))
    assert rc == 1 and 'No capacity' in err
    assert host.run('release', domain_xml([(u1, 'nvidia-223', B)]))[0] == 0
    found = figures.hook_figures(host.state_dir)
    assert {op: (e['calls'], e['refusals'], e['errors'])
            for op, e in found.items()} == {'prepare': (2, 1, 0),
                                            'release': (1, 0, 0),
                                            'reconnect': (0, 0, 0),
                                            'migrate': (0, 0, 0)}
    assert sum(found['prepare']['counts']) == 2
    assert found['prepare']['seconds_sum'] > 0


def test_an_internal_error_counts_as_an_error(host, monkeypatch):
    from libvirt_gpu.host import allocator

    def broken(self, *args, **kwargs):
        raise RuntimeError('boom')
    monkeypatch.setattr(allocator.Allocator, 'begin_release', broken)
    rc, err = host.run('release', domain_xml([(new_uuid(), 'nvidia-223',
                                               B)]))
    assert rc == 0 and 'internal error' in err
    assert figures.hook_figures(host.state_dir)['release']['errors'] == 1


def test_refused_input_is_not_counted_before_the_state_dir_is_known(host):
    rc, _ = host.run('prepare', b'<domain><nope')
    assert rc == 1
    path = os.path.join(host.state_dir, figures.HOOK_FIGURES)
    assert not os.path.exists(path)


def test_a_state_dir_that_cannot_be_written_costs_a_warning(host):
    u1 = new_uuid()
    os.makedirs(host.state_dir, exist_ok=True)
    os.mkdir(os.path.join(host.state_dir, figures.HOOK_FIGURES))  # no file
    rc, err = host.run('prepare', domain_xml([(u1, 'nvidia-223', B)]))
    assert rc == 0
    assert "cannot record the hook's figures" in err
    assert u1 in host.mdevs()


def test_the_operations_served_are_the_hooks():
    from libvirt_gpu.guests import hook
    assert figures.OPERATIONS == hook.HANDLED


def _record_one(state_dir, timeout=None):
    """A hook call's recording in a forked child: exit 0 when it wrote,
    3 when its wait for the lock ran out (``timeout``), 1 else."""
    if timeout is not None:
        figures.LOCK_TIMEOUT = timeout
    try:
        figures.record_hook_call(state_dir, 'prepare', figures.OK, 0.003)
    except exception.StateError:
        os._exit(3)
    os._exit(0)


@pytest.mark.parametrize('holder', ['hook call', 'scrape'])
def test_a_hook_call_waits_for_the_figures_lock_and_loses_no_count(
        tmp_path, holder):
    """Forced interleaving, not chance: while another hook call holds the
    figures file's lock (exclusive) or a scrape reads it (shared), a hook
    call waits and writes nothing: its bounded wait runs out (broken by
    writing without the lock, or under a shared one: the call then
    writes and succeeds).  An update made under the lock is kept, and the
    next call counts on top of it."""
    state_dir = str(tmp_path)
    figures.record_hook_call(state_dir, 'prepare', figures.OK, 0.003)
    ctx = multiprocessing.get_context('fork')
    fd = os.open(os.path.join(state_dir, figures.HOOK_FIGURES), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if holder == 'hook call'
                    else fcntl.LOCK_SH)
        # forked while we hold the lock: flock belongs to the open file,
        # which the child does not open through this descriptor
        writer = ctx.Process(target=_record_one, args=(state_dir, 0.3))
        writer.start()
        writer.join(60)
        assert writer.exitcode == 3, 'wrote without waiting'
        old = os.pread(fd, figures.MAX_BYTES + 1, 0)
        doc = json.loads(old)
        assert doc['operations']['prepare']['calls'] == 1
        if holder == 'hook call':       # its update, under the lock
            doc['operations']['prepare']['calls'] += 10
            os.pwrite(fd, json.dumps(doc).encode().ljust(len(old)), 0)
    finally:
        os.close(fd)                # drops the lock
    writer = ctx.Process(target=_record_one, args=(state_dir,))
    writer.start()
    writer.join(60)
    assert writer.exitcode == 0
    entry = figures.hook_figures(state_dir)['prepare']
    assert entry['calls'] == (12 if holder == 'hook call' else 2)


def test_a_damaged_figures_file_reads_as_nothing_and_is_rewritten(tmp_path):
    path = tmp_path / figures.HOOK_FIGURES
    path.write_text('{"version": 1, "buckets": [1]')
    assert figures.hook_figures(str(tmp_path))['release']['calls'] == 0
    figures.record_hook_call(str(tmp_path), 'release', figures.ERROR, 0.2)
    assert figures.hook_figures(str(tmp_path))['release']['errors'] == 1


# --- a scrape ----------------------------------------------------------------

def test_capacity_holders_and_hook_counts(host):
    col, _ = collector(host)
    before = scrape(col)
    # the profile: B holds two T4-2B of no lease; A none, both enabled
    assert value(before, 'libvirt_gpu_gpu_capacity', gpu=B, mode='vgpu',
                 type='nvidia-223') == 8
    assert value(before, 'libvirt_gpu_gpu_used', gpu=B, mode='vgpu',
                 type='nvidia-223') == 2
    assert value(before, 'libvirt_gpu_gpu_free', gpu=A, mode='vgpu',
                 type='nvidia-223') == 8
    u1, u2 = new_uuid(), new_uuid()
    assert host.run('prepare', domain_xml([(u1, 'nvidia-223', B),
                                           (u2, 'nvidia-223', B)]))[0] == 0
    after = scrape(col)
    assert value(after, 'libvirt_gpu_gpu_free', gpu=B, mode='vgpu',
                 type='nvidia-223') == 4
    assert value(after, 'libvirt_gpu_gpu_used', gpu=B, mode='vgpu',
                 type='nvidia-223') == 4
    assert value(after, 'libvirt_gpu_type_available_instances', gpu=B,
                 type='nvidia-223', name='GRID T4-2B') == 4
    held = [s for s in series(after, 'libvirt_gpu_vgpu_info')
            if s['domain_uuid']]
    assert sorted(s['uuid'] for s in held) == sorted([u1, u2])
    assert {(s['gpu'], s['type'], s['lease_state'], s['exists'])
            for s in held} == {(B, 'nvidia-223', 'created', 'yes')}
    assert value(after, 'libvirt_gpu_leases', state='created') == 2
    assert value(after, 'libvirt_gpu_hook_calls_total',
                 operation='prepare') == 1
    assert value(after, 'libvirt_gpu_hook_duration_seconds_count',
                 operation='prepare') == 1
    assert value(after, 'libvirt_gpu_exporter_read_ok', part='leases') == 1
    # no libvirt, no NVML: those series are absent, not zero
    assert not series(after, 'libvirt_gpu_dead_holder_leases')
    assert not [k for k in after if k[0].startswith('libvirt_gpu_nvml')]


def test_a_whole_gpu_is_shown_with_why_it_is_not_offered(tmp_path):
    root = h100.copy_capture(tmp_path / 'sys')
    config = tmp_path / 'conf'
    config.write_text('[DEFAULT]\nsysfs_root = %s\nstate_dir = %s\n'
                      % (root, tmp_path / 'state'))
    env = environment.Environment.from_conf(conf_mod.load(str(config)))
    found = scrape(exporter.HostCollector(env))
    assert series(found, 'libvirt_gpu_gpu_not_offered') == [
        {'gpu': h100.GPU, 'reason': capacity.NO_IOMMU_GROUP}]
    assert value(found, 'libvirt_gpu_gpu_capacity', gpu=h100.GPU,
                 mode='pgpu', type='') == 0
    # named as `libvirt-gpu list` names it: from the configured pci.ids
    assert value(found, 'libvirt_gpu_gpu_info', gpu=h100.GPU,
                 vendor_id='10de', product_id='2330',
                 product=env.pci_ids.device('10de', '2330') or '',
                 mode='pgpu', enabled_type='', route='libvirt-gpu') == 1


def test_a_scrape_waits_for_no_lease_lock(host):
    """A prepare holds the lease lock (flock + BEGIN IMMEDIATE) while it
    chooses GPUs; a scrape meanwhile reads the leases as they were."""
    col, env = collector(host)
    env.store = state.LeaseStore(host.state_dir, lock_timeout=0.5)
    writer = state.LeaseStore(host.state_dir)
    with writer.transaction() as txn:
        txn.add(new_uuid(), DOM2, objects.PciAddress.parse(B),
                objects.TypeId.parse('nvidia-223'), state.RESERVED)
    with writer.transaction() as txn:      # held across the scrape
        txn.add(new_uuid(), DOM2, objects.PciAddress.parse(B),
                objects.TypeId.parse('nvidia-223'), state.RESERVED)
        during = scrape(col)
    assert value(during, 'libvirt_gpu_exporter_read_ok', part='leases') == 1
    assert value(during, 'libvirt_gpu_leases', state='reserved') == 1
    assert value(during, 'libvirt_gpu_gpu_free', gpu=B, mode='vgpu',
                 type='nvidia-223') == 5
    assert value(scrape(col), 'libvirt_gpu_gpu_free', gpu=B, mode='vgpu',
                 type='nvidia-223') == 4


def test_the_lease_snapshot_cannot_write(tmp_path):
    store = state.LeaseStore(str(tmp_path))
    with store.transaction() as txn:
        txn.add(new_uuid(), DOM2, objects.PciAddress.parse(B),
                objects.TypeId.parse('nvidia-223'))
    with pytest.raises(Exception) as caught:
        with store.snapshot() as txn:
            txn.add(new_uuid(), DOM2, objects.PciAddress.parse(B),
                    objects.TypeId.parse('nvidia-223'))
    assert 'readonly' in str(caught.value)


def test_sync_and_restore_outcomes(host, tmp_path):
    class Report(object):
        failed = ()
        requests = ('a', 'b', 'c')

    conf = conf_mod.load(host.config)
    agent.record(conf, Report())
    agent.record(conf, error='Placement at http://p:8778 is unavailable')
    figures.record_outcome(host.state_dir, figures.RESTORE, changes=2)
    found = scrape(collector(host)[0])
    assert value(found, 'libvirt_gpu_task_runs_total',
                 task='placement-sync') == 2
    assert value(found, 'libvirt_gpu_task_failures_total',
                 task='placement-sync') == 1
    assert value(found, 'libvirt_gpu_task_changes_total',
                 task='placement-sync') == 3
    assert value(found, 'libvirt_gpu_task_last_error_info',
                 task='placement-sync',
                 error='Placement at http://p:8778 is unavailable') == 1
    assert value(found, 'libvirt_gpu_task_last_changes', task='restore') == 2
    assert ('libvirt_gpu_task_last_error_timestamp_seconds',
            frozenset({('task', 'restore')})) not in found


# --- the command -------------------------------------------------------------

def cli(*args, config=None):
    argv = [sys.executable, '-m', 'libvirt_gpu.cmd.main']
    if config:
        argv += ['--config-file', config]
    return subprocess.run(argv + ['exporter'] + list(args),
                          capture_output=True, text=True, timeout=120)


def test_help_teaches():
    done = cli('--help')
    assert done.returncode == 0
    for word in ('/metrics', 'capacity', 'reconcile --dry-run', '--once',
                 'examples:', '--port'):
        assert word in done.stdout


@pytest.mark.parametrize('args, said', [
    (['--port', '0'], "'0' is not a TCP port"),
    (['--port', 'http'], "'http' is not a TCP port"),
    (['--port', '70000'], "'70000' is not a TCP port"),
    (['--bogus'], 'unrecognized arguments: --bogus'),
])
def test_bad_flags_are_one_line_usage_errors(args, said):
    done = cli(*args)
    assert done.returncode == 2
    assert said in done.stderr
    assert len(done.stderr.strip().splitlines()[-1]) < 200
    assert 'Traceback' not in done.stderr


def test_a_port_in_use_is_a_one_line_error(host):
    sock = socket.socket()
    sock.bind(('127.0.0.1', 0))
    sock.listen()
    port = sock.getsockname()[1]
    try:
        done = cli('--no-libvirt', '--port', str(port), config=host.config)
    finally:
        sock.close()
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        'libvirt-gpu: error: cannot listen on 127.0.0.1 port %d: Address '
        'already in use (another process listens there: stop it, or pick '
        'another --port)' % port]


def test_a_port_without_permission_is_a_one_line_error():
    # As a user without CAP_NET_BIND_SERVICE (the test runs as root):
    # the real bind's answer, mapped the way the command maps it.
    from libvirt_gpu.cmd import service_cmds
    code = ('import socket, os; os.setuid(65534); s = socket.socket()\n'
            'try:\n s.bind(("127.0.0.1", 81))\nexcept OSError as e:\n'
            ' print(e.errno)\n')
    if os.geteuid() != 0:
        pytest.skip('needs root to drop to an unprivileged user')
    done = subprocess.run([sys.executable, '-c', code], capture_output=True,
                          text=True, timeout=60)
    got = int(done.stdout)
    assert got == errno.EACCES
    error = service_cmds._listen_error('127.0.0.1', 81, OSError(
        got, os.strerror(got)))
    assert str(error) == (
        'cannot listen on 127.0.0.1 port 81: Permission denied (ports '
        'below 1024 need root: pick a --port above 1023)')


def test_once_prints_one_scrape(host):
    done = cli('--once', '--no-libvirt', config=host.config)
    assert done.returncode == 0, done.stderr
    names = {f.name for f in prom_parser.text_string_to_metric_families(
        done.stdout)}
    assert {'libvirt_gpu_gpu_capacity', 'libvirt_gpu_gpu_free',
            'libvirt_gpu_vgpu_info', 'libvirt_gpu_exporter_read_ok'} <= names


def test_a_scrape_waits_only_for_a_hook_write_in_progress(host):
    """The figures are read under a shared flock: a hook call writing
    (exclusive) delays the scrape until it is done, and the scrape sees
    the whole write, never half of it."""
    import threading
    import time
    figures.record_hook_call(host.state_dir, 'prepare', figures.OK, 0.01)
    path = os.path.join(host.state_dir, figures.HOOK_FIGURES)
    with open(path, 'rb') as f:
        second = f.read().replace(b'"calls":1', b'"calls":2', 1)
    fd = os.open(path, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)      # a hook call, writing
    os.pwrite(fd, second[:20], 0)       # half of its write so far
    result = {}
    reader = threading.Thread(target=lambda: result.update(
        found=scrape(collector(host)[0])))
    reader.start()
    time.sleep(0.2)
    assert reader.is_alive()            # the scrape waits for the writer
    os.pwrite(fd, second, 0)            # the rest of the write
    os.close(fd)                        # and the lock goes with it
    reader.join(30)
    assert value(result['found'], 'libvirt_gpu_hook_calls_total',
                 operation='prepare') == 2


def test_a_shorter_document_is_padded_not_truncated(tmp_path):
    state_dir = str(tmp_path)
    figures.record_hook_call(state_dir, 'reconnect', figures.OK, 0.01)
    path = tmp_path / figures.HOOK_FIGURES
    longer = path.read_bytes()
    # a document with more in it than the next one will have
    path.write_bytes(longer.replace(b'"calls":1', b'"calls":100000000'))
    size = path.stat().st_size
    figures.record_hook_call(state_dir, 'reconnect', figures.OK, 0.01)
    assert path.stat().st_size == size
    assert figures.hook_figures(state_dir)['reconnect']['calls'] == \
        100000001


# --- NVML ------------------------------------------------------------------

def nvml_spec(u1, stranger):
    """B of the T4 host busy, with three active vGPU instances: ours (u1),
    one of the profile's, and one this host does not know."""
    return {'gpus': [
        {'bus_id': '00000000:AF:00.0', 'name': 'Tesla T4',
         'memory_total_mib': 15360, 'memory_used_mib': 4096,
         'utilization_gpu': 37, 'virtualization_mode': 3,
         'mig_mode': 'NVMLError: Not Supported', 'supported_vgpus': [],
         'creatable_vgpus': [],
         'vgpu_instances': [
             {'id': 7, 'mdev_uuid': u1, 'fb_usage_mib': 1800,
              'sm_util': 55},
             {'id': 8, 'mdev_uuid': PRE[0], 'fb_usage_mib': 200},
             {'id': 9, 'mdev_uuid': stranger, 'fb_usage_mib': 100,
              'sm_util': 3}]},
        # a GPU that answers nothing of this
        {'bus_id': '00000000:3B:00.0', 'name': 'Tesla T4',
         'memory_total_mib': 15360, 'virtualization_mode': 3,
         'mig_mode': 'NVMLError: Not Supported', 'supported_vgpus': [],
         'creatable_vgpus': []}]}


def test_nvml_usage_is_joined_to_the_vgpu_and_its_domain(host):
    from libvirt_gpu.devices import nvml
    from tests.doubles import nvml_fake
    u1 = new_uuid()
    assert host.run('prepare', domain_xml([(u1, 'nvidia-223', B)]))[0] == 0
    fake = nvml_fake.module(nvml_spec(u1, new_uuid()))
    col, _ = collector(host, nvml=nvml.Nvml(fake))
    found = scrape(col)
    assert value(found, 'libvirt_gpu_nvml_gpu_utilization_ratio',
                 gpu=B) == 0.37
    assert value(found, 'libvirt_gpu_nvml_gpu_memory_used_bytes',
                 gpu=B) == 4096 * 2 ** 20
    assert value(found, 'libvirt_gpu_nvml_gpu_memory_total_bytes',
                 gpu=A) == 15360 * 2 ** 20
    # A answers no utilisation: no series, not a 0
    assert series(found, 'libvirt_gpu_nvml_gpu_utilization_ratio') == [
        {'gpu': B}]
    ours = dict(uuid=u1, gpu=B, parent=B, route='libvirt-gpu', domain='',
                domain_uuid='c7a5fdbd-cdaf-9455-926a-d65c16db1809')
    assert value(found, 'libvirt_gpu_nvml_vgpu_utilization_ratio',
                 **ours) == 0.55
    assert value(found, 'libvirt_gpu_nvml_vgpu_fb_used_bytes',
                 **ours) == 1800 * 2 ** 20
    # the profile's vGPU (no lease, no domain), without a sample; the
    # stranger is not a vGPU of this host: left out
    assert sorted(s['uuid'] for s in series(
        found, 'libvirt_gpu_nvml_vgpu_fb_used_bytes')) == sorted([u1,
                                                                  PRE[0]])
    assert [s['uuid'] for s in series(
        found, 'libvirt_gpu_nvml_vgpu_utilization_ratio')] == [u1]


def test_without_nvml_its_series_are_absent(host):
    from libvirt_gpu.devices import nvml
    from tests.doubles import nvml_fake
    fake = nvml_fake.module({'init_error': 9, 'gpus': []})
    found = scrape(collector(host, nvml=nvml.Nvml(fake))[0])
    assert not [k for k in found if k[0].startswith('libvirt_gpu_nvml')]
    assert value(found, 'libvirt_gpu_exporter_read_ok', part='nvml') == 1


@pytest.mark.parametrize('planted', ['fifo', 'link'])
def test_figures_file_that_is_not_a_regular_file_is_refused_at_once(
        tmp_path, planted):
    """The figures file follows the state directory's rules: a FIFO there
    must not block a guest's start (the write is refused at once, in a
    child judged by a timeout, never a speed limit), a link is not
    followed (its target stays untouched)."""
    state_dir = tmp_path / 'state'
    state_dir.mkdir()
    target = tmp_path / 'target'
    target.write_bytes(b'keep')
    for name in (figures.HOOK_FIGURES, figures.OUTCOME % figures.RESTORE):
        if planted == 'fifo':
            os.mkfifo(state_dir / name)
        else:
            os.symlink(target, state_dir / name)
    code = ('import sys\n'
            'from libvirt_gpu import exception\n'
            'from libvirt_gpu.store import figures\n'
            'try:\n'
            '    figures.record_hook_call(sys.argv[1], "prepare", "ok", 0.1)\n'
            'except exception.StateError as e:\n'
            '    print("refused", e)\n')
    r = subprocess.run([sys.executable, '-c', code, str(state_dir)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith('refused'), r.stdout
    assert target.read_bytes() == b'keep'
    with pytest.raises(exception.StateError):
        figures.hook_figures(str(state_dir))
    assert figures.record_outcome(str(state_dir), figures.RESTORE) is False


# --- What ``make mutation`` found open (docs/dev/mutation.md) ---
# What the exporter serves, pinned where test_exporter*.py left it open: each
# test here fails on a change ``make mutation`` made to exporter.py that the
# rest stayed green on (docs/dev/mutation.md). The family functions are
# called directly with records built here (a whole scrape of a simulated host
# cannot set one value at a time), and the series compared whole: every name,
# label and value, so that a label swapped, a value off by one or a series
# added or dropped fails. The HTTP server's parts are called directly on a
# socket pair or on its own listening socket (no serve loop, no waits).

P = 'libvirt_gpu_'
GPU_A = objects.PciAddress.parse('0000:3b:00.0')
GPU_B = objects.PciAddress.parse('0000:5e:00.0')
C = objects.PciAddress.parse('0000:af:00.0')
VF = objects.PciAddress.parse('0000:5e:00.4')
VF2 = objects.PciAddress.parse('0000:5e:00.5')
T = objects.TypeId.parse('nvidia-223')
T2 = objects.TypeId.parse('nvidia-224')
U1, U2, U3, U4, U5 = (objects.Uuid.parse('%d0000000-0000-4000-8000-'
                                         '000000000000' % i)
                      for i in range(1, 6))
D1, D2, D3 = (objects.Uuid.parse('d%d000000-0000-4000-8000-000000000000'
                                 % i) for i in range(1, 4))


def samples(families):
    """``{(name, frozenset(labels)): value}`` of ``families``' samples."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in families for s in family.samples}


def row(metric, value, **labels):
    return {(P + metric, frozenset(labels.items())): value}


def rows(*parts):
    found = {}
    for part in parts:
        found.update(part)
    return found


class Families(object):
    """A collector of the families given."""

    def __init__(self, families):
        self.families = families

    def collect(self):
        return iter(self.families)


# --- what each family says of itself ----------------------------------------

HELP = [
    ('gpu_info', 'gauge', 'A GPU of this host (value 1): ids, name, mode '
     '(vgpu: sliced, pgpu: whole), enabled vGPU type and the route that '
     'owns it'),
    ('gpu_capacity', 'gauge', 'vGPUs (mode vgpu) or whole GPUs (mode pgpu: '
     '1, 0 when it cannot be offered) the GPU holds: the total Placement is '
     'told'),
    ('gpu_used', 'gauge', 'vGPUs of the enabled type that exist or are '
     'leased on the GPU (mode pgpu: 1 while a running domain has it; only '
     'with libvirt)'),
    ('gpu_free', 'gauge', "vGPUs a guest start can still get on the GPU "
     "(the allocator's count; mode pgpu: with libvirt only)"),
    ('gpu_not_offered', 'gauge', 'A GPU that is not offered whole (value '
     '1), with the reason'),
    ('type_available_instances', 'gauge', 'Instances of a vGPU type the GPU '
     'can still make, as the kernel or driver says (a GPU with VFs: the '
     'whole GPU)'),
    ('vgpu_info', 'gauge', 'A vGPU (value 1): type, parent (the mdev parent '
     'or VF), the route that owns its GPU, the domain that holds it (name '
     'with libvirt only) and its lease state (none: not made by us, or no '
     'lease)'),
    ('leases', 'gauge', 'Leases in the lease file, by state'),
    ('dead_holder_leases', 'gauge', 'Leases whose process died and whose '
     'vGPU no running domain uses (reconcile would remove them)'),
    ('unexplained_vgpus', 'gauge', 'vGPUs without a lease that no domain '
     'references and mdevctl does not define (reconcile would remove '
     'them)'),
    ('reconcile_finding', 'gauge', 'One finding of reconcile --dry-run '
     '(value 1)'),
    ('hook_calls', 'counter', 'Calls of the qemu hook that handled one of '
     'our guests, by operation'),
    ('hook_refusals', 'counter', 'Hook calls that refused the guest '
     '(prepare: the start failed with a reason, e.g. no capacity)'),
    ('hook_errors', 'counter', 'Hook calls that failed: an internal error, '
     'or a release/reconnect that could not do its work'),
    ('hook_duration_seconds', 'histogram', 'Time one hook call took (from '
     'its input read to its exit, not counting the interpreter start)'),
    ('task_runs', 'counter', 'Runs of the task'),
    ('task_failures', 'counter', 'Runs that failed'),
    ('task_changes', 'counter', 'Changes the task made (Placement writes, '
     'restore actions)'),
    ('task_last_changes', 'gauge', 'Changes the last successful run made'),
    ('task_last_success_timestamp_seconds', 'gauge', 'When the task last '
     'succeeded (Unix time)'),
    ('task_last_error_timestamp_seconds', 'gauge', 'When the task last '
     'failed (Unix time)'),
    ('task_last_error_info', 'gauge', 'The last error of the task (value '
     '1)'),
    ('gpu_layout_mode', 'gauge', "A GPU's mode as its driver reports it "
     "(value 1): time-sliced, mixed-size or mig"),
    ('gpu_layout_drift', 'gauge', 'Whether the GPU differs from its '
     'configured layout (1: `libvirt-gpu layout plan` has steps for it, or '
     'it cannot hold the layout); GPUs in a layout only'),
    ('gpu_layout_steps', 'gauge', 'The steps `libvirt-gpu layout apply` '
     'would run on the GPU'),
    ('gpu_instance_info', 'gauge', 'A MIG GPU instance that exists (value '
     '1)'),
    ('gpu_instance_vgpus_used', 'gauge', 'vGPUs of the type in the GPU '
     'instance'),
    ('gpu_instance_vgpus_free', 'gauge', 'vGPUs of the type the GPU '
     'instance can still take'),
    ('placements_used', 'gauge', 'vGPUs of the type on the GPU in '
     'mixed-size mode (each holds a placement)'),
    ('placements_free', 'gauge', "Placements a vGPU of the type can still "
     "be made at (mixed-size mode; NVML's creatable placements)"),
    ('gpu_scheduler_info', 'gauge', "The GPU's vGPU scheduler policy (value "
     "1)"),
    ('gpu_scheduler_time_slice_seconds', 'gauge', "The vGPU scheduler's "
     "time slice (where the driver gives one)"),
    ('nvml_gpu_utilization_ratio', 'gauge', "GPU busy share over NVML's "
     "last sample period (0 to 1)"),
    ('nvml_gpu_memory_used_bytes', 'gauge', 'Frame buffer in use'),
    ('nvml_gpu_memory_total_bytes', 'gauge', 'Frame buffer'),
    ('nvml_vgpu_utilization_ratio', 'gauge', "A vGPU's share of its GPU's "
     "3D/compute engine (0 to 1)"),
    ('nvml_vgpu_fb_used_bytes', 'gauge', 'Frame buffer a vGPU uses'),
]


def test_each_family_says_what_it_is_in_its_help_and_type():
    """The HELP and TYPE lines a scrape carries: what an operator reads in
    Prometheus' metric browser next to the series."""
    text = exporter.exposition(Families(exporter_scrape.every_family()))
    said = [(f.name[len(P):], f.type, f.documentation)
            for f in prom_parser.text_string_to_metric_families(text)]
    assert said == HELP


# --- the GPUs ---------------------------------------------------------------

def _gpu(address, mdev_types=(), mdevs=(), iommu_group=5, **kwargs):
    return objects.Gpu(address=address, vendor_id='10de', product_id='1eb8',
                       class_code='0x030200', driver='nvidia', numa_node=0,
                       iommu_group=iommu_group, mdev_types=mdev_types,
                       mdevs=mdevs, **kwargs)


def _vtype(type_id, available, max_instance=8, name='GRID T4-2B'):
    return objects.VgpuType(
        id=type_id, name=name, device_api='vfio-pci',
        description='num_heads=1, max_instance=%d' % max_instance,
        available_instances=available)


def _lease(uuid, parent, type_id=T, state_name=state.CREATED, domain=None):
    return state.Lease(vgpu_uuid=uuid, domain_uuid=domain, parent=parent,
                       type_id=type_id, state=state_name, pid=1,
                       pid_start=None, created_at=0.0, updated_at=0.0)


def _route(physical=None, **owners):
    """``exporter.route_labels`` of ``Routes`` whose ``owners`` are given
    as ``A=routes.CYBORG``."""
    named = {'A': GPU_A, 'B': GPU_B, 'C': C}
    return exporter.route_labels(routes.Routes(owners={
        named[k]: v for k, v in owners.items()}), physical or {})


def _domains(names=None, vgpus=None, pci=None):
    return exporter.DomainView(names=names or {}, vgpus=vgpus or {},
                               pci=pci or {})


def test_a_vgpu_gpu_counts_its_types_vgpus_and_leases_once_each():
    """Used: the vGPUs of the type on the GPU, existing or leased, a vGPU
    both existing and leased once; those of another type or GPU not."""
    gpu = _gpu(GPU_A, mdev_types=(_vtype(T, 6), _vtype(T2, 3, 4, None)),
               mdevs=(objects.Mdev(U1, T), objects.Mdev(U2, T)),
               product_name='Tesla T4')
    enabled = {GPU_A: objects.EnabledType(T, others=(
        objects.EnabledType(T2, max_instances=2),))}
    existing = {U1: (GPU_A, T), U2: (GPU_A, T), U3: (GPU_A, T2),
                U4: (GPU_B, T)}
    leases = (_lease(U1, GPU_A), _lease(U5, GPU_A, state_name=state.RESERVED),
              _lease(U4, GPU_B), _lease(U3, GPU_A, T2))
    found = samples(exporter.gpu_families(
        [gpu], enabled, {(GPU_A, T): 5}, existing, leases, None,
        _route(A=routes.CYBORG)))
    a = str(GPU_A)
    assert found == rows(
        row('gpu_info', 1, gpu=a, vendor_id='10de', product_id='1eb8',
            product='Tesla T4', mode='vgpu', enabled_type=T,
            route='cyborg'),
        row('gpu_capacity', 8, gpu=a, mode='vgpu', type=T),
        row('gpu_capacity', 2, gpu=a, mode='vgpu', type=T2),
        row('gpu_used', 3, gpu=a, mode='vgpu', type=T),
        row('gpu_used', 1, gpu=a, mode='vgpu', type=T2),
        row('gpu_free', 5, gpu=a, mode='vgpu', type=T),
        row('type_available_instances', 6, gpu=a, type=T, name='GRID T4-2B'),
        row('type_available_instances', 3, gpu=a, type=T2, name=''))


def test_a_vgpu_gpu_counts_the_vgpus_of_its_vfs():
    """A PF's vGPUs live on its VFs: those count as the GPU's."""
    vf1 = _gpu(VF, mdev_types=(_vtype(T, 0, 2),),
               mdevs=(objects.Mdev(U1, T),), physfn=GPU_B)
    vf2 = _gpu(VF2, mdev_types=(_vtype(T, 1, 2),), physfn=GPU_B)
    pf = _gpu(GPU_B, virtfns=(VF, VF2), vf_gpus=(vf1, vf2))
    found = samples(exporter.gpu_families(
        [vf1, pf, vf2], {GPU_B: objects.EnabledType(T)}, {}, {U1: (VF, T)},
        (_lease(U2, VF2, state_name=state.RESERVED),), None))
    b = str(GPU_B)
    assert found == rows(
        # no routes read: the route is unsaid
        row('gpu_info', 1, gpu=b, vendor_id='10de', product_id='1eb8',
            product='', mode='vgpu', enabled_type=T, route=''),
        row('gpu_capacity', 2, gpu=b, mode='vgpu', type=T),
        row('gpu_used', 2, gpu=b, mode='vgpu', type=T),
        # the whole GPU: its capacity less the vGPUs its VFs hold
        row('type_available_instances', 1, gpu=b, type=T,
            name='GRID T4-2B'))


def test_a_full_gpu_with_vfs_has_no_instance_left_not_less_than_none():
    vf1 = _gpu(VF, mdev_types=(_vtype(T, 0, 1),),
               mdevs=(objects.Mdev(U1, T),), physfn=GPU_B)
    vf2 = _gpu(VF2, mdev_types=(_vtype(T, 0, 1),),
               mdevs=(objects.Mdev(U2, T),), physfn=GPU_B)
    pf = _gpu(GPU_B, virtfns=(VF, VF2), vf_gpus=(vf1, vf2))
    assert [(t.id, left) for t, left in exporter._available(pf)] == [(T, 0)]


def test_whole_gpus_with_libvirt_say_capacity_use_and_why_not_offered():
    """Mode pgpu: capacity 1, or 0 with the reason where it cannot be
    offered; used 1 while a running domain has it; free never below 0."""
    offered = _gpu(GPU_A, product_name='Tesla T4')
    taken = _gpu(C, iommu_group=7)
    refused = _gpu(GPU_B, iommu_group=None)
    found = samples(exporter.gpu_families(
        [offered, taken, refused], {}, {}, {}, (),
        _domains(pci={C: D1, GPU_B: D2}), _route(C=routes.NOVA_VGPU)))
    a, b, c = str(GPU_A), str(GPU_B), str(C)
    info = dict(vendor_id='10de', product_id='1eb8', mode='pgpu',
                enabled_type='')
    assert found == rows(
        row('gpu_info', 1, gpu=a, product='Tesla T4', route='libvirt-gpu',
            **info),
        row('gpu_info', 1, gpu=c, product='', route='nova-vgpu', **info),
        row('gpu_info', 1, gpu=b, product='', route='libvirt-gpu', **info),
        row('gpu_capacity', 1, gpu=a, mode='pgpu', type=''),
        row('gpu_capacity', 1, gpu=c, mode='pgpu', type=''),
        row('gpu_capacity', 0, gpu=b, mode='pgpu', type=''),
        row('gpu_used', 0, gpu=a, mode='pgpu', type=''),
        row('gpu_used', 1, gpu=c, mode='pgpu', type=''),
        row('gpu_used', 1, gpu=b, mode='pgpu', type=''),
        row('gpu_free', 1, gpu=a, mode='pgpu', type=''),
        row('gpu_free', 0, gpu=c, mode='pgpu', type=''),
        row('gpu_free', 0, gpu=b, mode='pgpu', type=''),
        row('gpu_not_offered', 1, gpu=b,
            reason=exporter.capacity.NO_IOMMU_GROUP))


def test_whole_gpus_without_libvirt_say_no_use():
    found = samples(exporter.gpu_families(
        [_gpu(GPU_A)], {}, {}, {}, (), None))
    assert {k[0] for k in found} == {P + 'gpu_info', P + 'gpu_capacity'}


# --- the vGPUs --------------------------------------------------------------

def test_each_vgpu_with_its_gpu_holder_and_lease_state():
    """A vGPU's holder: its lease's domain, else (no lease) the domain
    that borrowed it, else the running domain using it; named by libvirt.
    A lease not made yet is a vGPU that does not exist, of its lease's
    parent and type."""
    existing = {U1: (VF, T), U3: (GPU_A, T2), U4: (GPU_A, T)}
    leases = (_lease(U1, VF, domain=D1),
              _lease(U2, VF2, T2, state.RESERVED),
              _lease(U5, GPU_A, state_name='incoming'))
    domains = _domains(names={D1: 'one', D2: 'two', D3: 'three'},
                       vgpus={U3: D3, U5: D3})
    found = samples(exporter.vgpu_families(
        existing, leases, {U2: (D2, 'x'), U1: (D3, 'x'), U4: (D2, 'x')},
        domains,
        {VF: GPU_B, VF2: GPU_B},
        route=_route({VF: GPU_B, VF2: GPU_B}, B=routes.CYBORG)))
    # a vGPU on a VF has the route of the VF's physical GPU
    assert found == rows(
        row('vgpu_info', 1, uuid=U1, type=T, gpu=str(GPU_B), parent=str(VF),
            route='cyborg', domain='one', domain_uuid=D1,
            lease_state='created', exists='yes'),
        row('vgpu_info', 1, uuid=U2, type=T2, gpu=str(GPU_B), parent=str(VF2),
            route='cyborg', domain='', domain_uuid='',
            lease_state='reserved', exists='no'),
        row('vgpu_info', 1, uuid=U3, type=T2, gpu=str(GPU_A),
            parent=str(GPU_A),
            route='libvirt-gpu', domain='three', domain_uuid=D3,
            lease_state='none', exists='yes'),
        row('vgpu_info', 1, uuid=U4, type=T, gpu=str(GPU_A), parent=str(GPU_A),
            route='libvirt-gpu', domain='two', domain_uuid=D2,
            lease_state='none', exists='yes'),
        # a lease without a domain: the running domain using its vGPU
        row('vgpu_info', 1, uuid=U5, type=T, gpu=str(GPU_A), parent=str(GPU_A),
            route='libvirt-gpu', domain='three', domain_uuid=D3,
            lease_state='incoming', exists='no'),
        row('leases', 1, state='created'),
        row('leases', 1, state='reserved'),
        row('leases', 0, state='removing'),
        row('leases', 1, state='incoming'))


def test_leases_not_read_are_not_counted_at_zero():
    found = samples(exporter.vgpu_families(
        {U1: (GPU_A, T)}, (), {}, None, {}, counted=False))
    assert [k[0] for k in found] == [P + 'vgpu_info']


def test_a_holder_without_libvirt_has_no_name():
    lease = _lease(U1, GPU_A, domain=D1)
    assert exporter.holder(U1, {U1: lease}, {}, None) == ('', D1)
    assert exporter.holder(U2, {}, {U2: (D2, 'x')}, None) == ('', D2)
    assert exporter.holder(U3, {}, {}, None) == ('', '')
    domains = _domains(names={D1: 'one'}, vgpus={U3: D1})
    assert exporter.holder(U3, {}, {}, domains) == ('one', D1)
    assert exporter.holder(U2, {}, {U2: (D2, 'x')}, domains) == ('', D2)
    assert exporter.holder(U4, {}, {}, domains) == ('', '')


def test_the_owners_nvml_is_joined_to():
    leases = (_lease(U1, GPU_A, domain=D1),)
    domains = _domains(names={D1: 'one', D2: 'two'}, vgpus={U2: D2})
    assert exporter._owners(
        {U1: (GPU_A, T), U2: (VF, T2), U3: (GPU_A, T)}, leases,
        {}, domains) == {
        U1: (GPU_A, 'one', D1), U2: (VF, 'two', D2), U3: (GPU_A, '', '')}


# --- reconcile --------------------------------------------------------------

def test_reconcile_counts_what_a_run_would_remove_by_kind():
    def finding(action, what, uuid, **kwargs):
        return reconcile.Finding(action=action, what=what, uuid=uuid,
                                 reason='r', **kwargs)
    report = reconcile.Report(dry_run=True, findings=(
        finding(reconcile.WOULD_REMOVE, 'lease', U1, parent=GPU_A, type_id=T,
                domain_uuid=D1),
        finding(reconcile.WOULD_REMOVE, 'mdev+lease', U2),
        finding(reconcile.WOULD_REMOVE, 'mdev', U3),
        finding(reconcile.KEPT, 'lease', U4),
        finding(reconcile.WOULD_REPAIR, 'mdev', U5)))
    found = samples(exporter.reconcile_families(report,
                                                _route(A=routes.CYBORG)))
    # a finding without a GPU has no route
    each = dict(parent='', type='', domain_uuid='', route='')
    assert found == rows(
        row('dead_holder_leases', 2),
        row('unexplained_vgpus', 1),
        row('reconcile_finding', 1, action='would remove', what='lease',
            uuid=U1, parent=str(GPU_A), type=T, domain_uuid=D1,
            route='cyborg'),
        row('reconcile_finding', 1, action='would remove', what='mdev+lease',
            uuid=U2, **each),
        row('reconcile_finding', 1, action='would remove', what='mdev',
            uuid=U3, **each),
        row('reconcile_finding', 1, action='kept', what='lease', uuid=U4,
            **each),
        row('reconcile_finding', 1, action='would repair', what='mdev',
            uuid=U5, **each))


# --- the hook's figures -----------------------------------------------------

def test_the_hook_histogram_is_cumulative_with_every_bound():
    counts = [1, 0, 2] + [0] * (len(figures.BUCKETS) - 3) + [4]
    found = samples(exporter.hook_families({
        'prepare': {'calls': 7, 'refusals': 2, 'errors': 1,
                    'counts': counts, 'seconds_sum': 41.5},
        'release': {'calls': 0, 'refusals': 0, 'errors': 0,
                    'counts': [0] * (len(figures.BUCKETS) + 1),
                    'seconds_sum': 0.0}}))
    expected = rows(
        row('hook_calls_total', 7, operation='prepare'),
        row('hook_refusals_total', 2, operation='prepare'),
        row('hook_errors_total', 1, operation='prepare'),
        row('hook_duration_seconds_count', 7, operation='prepare'),
        row('hook_duration_seconds_sum', 41.5, operation='prepare'),
        row('hook_calls_total', 0, operation='release'),
        row('hook_refusals_total', 0, operation='release'),
        row('hook_errors_total', 0, operation='release'),
        row('hook_duration_seconds_count', 0, operation='release'),
        row('hook_duration_seconds_sum', 0.0, operation='release'))
    running = 0
    for bound, count in zip(figures.BUCKETS + (math.inf,), counts):
        running += count
        le = '+Inf' if bound == math.inf else repr(float(bound))
        expected.update(row('hook_duration_seconds_bucket', running,
                            operation='prepare', le=le))
        expected.update(row('hook_duration_seconds_bucket', 0,
                            operation='release', le=le))
    assert found == expected


@pytest.mark.parametrize('bound,said', [
    (0.001, '0.001'), (1, '1.0'), (30.0, '30.0'), (math.inf, '+Inf')])
def test_a_bucket_bound_as_prometheus_writes_it(bound, said):
    assert exporter._le(bound) == said


# --- Placement sync and restore ---------------------------------------------

def test_each_task_s_figures_and_only_those_it_has():
    found = samples(exporter.task_families({
        figures.PLACEMENT_SYNC: {
            'runs': 5, 'failures': 2, 'changes_total': 9, 'last_changes': 3,
            'last_success': 1700000000, 'last_error_time': 1690000000.5,
            'last_error': 'Placement said 409'},
        figures.RESTORE: {'runs': 1, 'last_success': None,
                          'last_error_time': None, 'last_error': 'old'},
        'other': None}))
    sync, restore = figures.PLACEMENT_SYNC, figures.RESTORE
    assert found == rows(
        row('task_runs_total', 5, task=sync),
        row('task_failures_total', 2, task=sync),
        row('task_changes_total', 9, task=sync),
        row('task_last_changes', 3, task=sync),
        row('task_last_success_timestamp_seconds', 1700000000.0, task=sync),
        row('task_last_error_timestamp_seconds', 1690000000.5, task=sync),
        row('task_last_error_info', 1, task=sync,
            error='Placement said 409'),
        row('task_runs_total', 1, task=restore))


def test_a_task_s_failure_and_changes_without_its_runs():
    found = samples(exporter.task_families({figures.RESTORE: {
        'failures': 1, 'changes_total': 0, 'last_error_time': 5}}))
    assert found == rows(
        row('task_failures_total', 1, task=figures.RESTORE),
        row('task_changes_total', 0, task=figures.RESTORE),
        row('task_last_error_timestamp_seconds', 5.0, task=figures.RESTORE),
        row('task_last_error_info', 1, task=figures.RESTORE, error='None'))


# --- layouts ----------------------------------------------------------------

def test_each_gpu_s_layout_series():
    views = (
        exporter.LayoutView(
            address=GPU_A, mode=exporter.MODE_MIG, layout='h100',
            steps=('one', 'two'),
            gpu_instances=(exporter.GiView(id=3, profile='1g.10gb', types=(
                exporter.TypeRoom(T, 1, 0), exporter.TypeRoom(T2, 0, 4))),),
            scheduler=layout_mod.Scheduler('best-effort')),
        exporter.LayoutView(
            address=GPU_B, mode=exporter.MODE_MIXED,
            placements=(exporter.TypeRoom(T, 2, 5),
                        exporter.TypeRoom(T2, 1, None)),
            scheduler=layout_mod.Scheduler('equal-share', 4)),
        exporter.LayoutView(address=C, mode=exporter.MODE_SLICED,
                            layout='t4', steps=None),
        exporter.LayoutView(address=VF, mode=exporter.MODE_SLICED,
                            layout='t4', steps=(),
                            scheduler=layout_mod.Scheduler('fixed-share', 0)))
    found = samples(exporter.layout_families(views))
    a, b, c, v = str(GPU_A), str(GPU_B), str(C), str(VF)
    assert found == rows(
        row('gpu_layout_mode', 1, gpu=a, mode='mig'),
        row('gpu_layout_mode', 1, gpu=b, mode='mixed-size'),
        row('gpu_layout_mode', 1, gpu=c, mode='time-sliced'),
        row('gpu_layout_mode', 1, gpu=v, mode='time-sliced'),
        row('gpu_layout_drift', 1, gpu=a, layout='h100'),
        row('gpu_layout_drift', 1, gpu=c, layout='t4'),
        row('gpu_layout_drift', 0, gpu=v, layout='t4'),
        row('gpu_layout_steps', 2, gpu=a, layout='h100'),
        row('gpu_layout_steps', 0, gpu=v, layout='t4'),
        row('gpu_instance_info', 1, gpu=a, gi='3', profile='1g.10gb'),
        row('gpu_instance_vgpus_used', 1, gpu=a, gi='3', profile='1g.10gb',
            type=T),
        row('gpu_instance_vgpus_free', 0, gpu=a, gi='3', profile='1g.10gb',
            type=T),
        row('gpu_instance_vgpus_used', 0, gpu=a, gi='3', profile='1g.10gb',
            type=T2),
        row('gpu_instance_vgpus_free', 4, gpu=a, gi='3', profile='1g.10gb',
            type=T2),
        row('placements_used', 2, gpu=b, type=T),
        row('placements_free', 5, gpu=b, type=T),
        row('placements_used', 1, gpu=b, type=T2),
        row('gpu_scheduler_info', 1, gpu=a, policy='best-effort'),
        row('gpu_scheduler_info', 1, gpu=b, policy='equal-share'),
        row('gpu_scheduler_info', 1, gpu=v, policy='fixed-share'),
        row('gpu_scheduler_time_slice_seconds', 0.004, gpu=b))


def test_drift_is_unsaid_without_a_layout():
    assert exporter.LayoutView(address=GPU_A, mode='mig').drift is None
    assert exporter.LayoutView(address=GPU_A, mode='mig', steps=(),
                               layout='x').drift is False
    assert exporter.LayoutView(address=GPU_A, mode='mig', steps=None,
                               layout='x').drift is True
    assert exporter.LayoutView(address=GPU_A, mode='mig', steps=('s',),
                               layout='x').drift is True


# --- NVML -------------------------------------------------------------------

def test_nvml_figures_join_a_vgpu_by_its_uuid_else_its_vf():
    usage = {
        GPU_A: nvml.GpuUsage(utilization=0.5, memory_used=100,
                             memory_total=1000, vgpus=(
                                 nvml.VgpuUsage('stranger', None, 0.9, 1),
                                 nvml.VgpuUsage(str(U1), None, 0.25, 64),
                                 nvml.VgpuUsage(str(U3), None, 0.5, None),
                                 nvml.VgpuUsage(str(U4), None, None, None))),
        GPU_B: nvml.GpuUsage(utilization=None, memory_used=None,
                             memory_total=None, vgpus=(
                                 nvml.VgpuUsage(None, VF, 0.1, 32),
                                 nvml.VgpuUsage(None, VF2, 0.2, 8)))}
    owners = {U1: (GPU_A, 'one', D1), U2: (VF, '', ''), U3: (None, '', ''),
              U4: (GPU_A, '', '')}
    found = samples(exporter.nvml_families(
        usage, owners, _route({VF: GPU_B}, B=routes.CYBORG)))
    assert found == rows(
        row('nvml_gpu_utilization_ratio', 0.5, gpu=str(GPU_A)),
        row('nvml_gpu_memory_used_bytes', 100, gpu=str(GPU_A)),
        row('nvml_gpu_memory_total_bytes', 1000, gpu=str(GPU_A)),
        row('nvml_vgpu_utilization_ratio', 0.25, uuid=U1, gpu=str(GPU_A),
            parent=str(GPU_A), route='libvirt-gpu', domain='one',
            domain_uuid=D1),
        row('nvml_vgpu_fb_used_bytes', 64, uuid=U1, gpu=str(GPU_A),
            parent=str(GPU_A), route='libvirt-gpu', domain='one',
            domain_uuid=D1),
        # a parent unknown (no VF, no mdev parent said): empty, no route
        row('nvml_vgpu_utilization_ratio', 0.5, uuid=U3, gpu=str(GPU_A),
            parent='', route='', domain='', domain_uuid=''),
        # a VF's vGPU: the route of its physical GPU
        row('nvml_vgpu_utilization_ratio', 0.1, uuid=U2, gpu=str(GPU_B),
            parent=str(VF), route='cyborg', domain='', domain_uuid=''),
        row('nvml_vgpu_fb_used_bytes', 32, uuid=U2, gpu=str(GPU_B),
            parent=str(VF), route='cyborg', domain='', domain_uuid=''))


# --- label values as text ---------------------------------------------------

def test_label_values_are_escaped_and_valid_utf8():
    family = prom.GaugeMetricFamily(P + 'x', 'x', labels=['a', 'b'])
    family.add_metric(['tab\there\u202e', 'bad\udcff'], 1)
    family.add_metric(['plain', 7], 2)
    found = exporter._printable(family)
    assert found is family
    assert [(s.name, s.labels, s.value) for s in found.samples] == [
        (P + 'x', {'a': 'tab\\x09here\\u202e', 'b': 'bad\\udcff'}, 1),
        (P + 'x', {'a': 'plain', 'b': '7'}, 2)]


# --- one scrape's parts -----------------------------------------------------

class Connection(object):
    """A libvirt ``host.Host`` stand-in that notes its ``close``."""

    def __init__(self):
        self.closed = 0

    def close(self):
        self.closed += 1


class Owner(object):
    """What ``Scrape`` reads of its collector: the libvirt host."""

    def __init__(self, host=None):
        self.host = host


def _fails(error):
    def read():
        raise error
    return read


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records
            if r.name == exporter.LOG.name and r.levelno == logging.WARNING]


def test_a_part_read_is_ok_and_its_value_returned(caplog):
    scrape = exporter.Scrape(Owner())
    with caplog.at_level(logging.DEBUG):
        assert scrape.part('host', lambda: 'gpus') == 'gpus'
    assert scrape.ok == {'host': 1}
    assert _warnings(caplog) == []


@pytest.mark.parametrize('error', [
    exception.StateError(path='/x', reason='damaged'),
    PermissionError(13, 'Permission denied')])
def test_a_part_that_fails_is_none_logged_and_not_ok(caplog, error):
    libvirt = Connection()
    scrape = exporter.Scrape(Owner(libvirt))
    scrape.part('hook', lambda: 1)
    with caplog.at_level(logging.WARNING):
        assert scrape.part('hook', _fails(error)) is None
    assert scrape.ok == {'hook': 0}
    assert _warnings(caplog) == ['scrape: cannot read hook: %s' % error]
    # a later read of the part that works does not make it whole again
    assert scrape.part('hook', lambda: 2) == 2
    assert scrape.ok == {'hook': 0}
    assert libvirt.closed == 0      # not the libvirt part: kept open


def test_libvirt_that_fails_is_closed_to_reconnect_at_the_next_scrape():
    libvirt = Connection()
    scrape = exporter.Scrape(Owner(libvirt))
    scrape.part('libvirt', _fails(exception.LibvirtGpuError()))
    assert libvirt.closed == 1
    assert scrape.ok == {'libvirt': 0}
    # without a connection there is nothing to close
    scrape = exporter.Scrape(Owner(None))
    assert scrape.part('libvirt', _fails(OSError('gone'))) is None


def test_a_part_that_fails_otherwise_is_not_ours_to_hide():
    scrape = exporter.Scrape(Owner())
    with pytest.raises(ValueError):
        scrape.part('host', _fails(ValueError('a bug')))


def test_an_optional_part_with_nothing_to_read_is_left_out():
    scrape = exporter.Scrape(Owner())
    assert scrape.optional('layout', lambda: None) is None
    assert scrape.ok == {}
    assert scrape.optional('layout', lambda: ()) == ()
    assert scrape.ok == {'layout': 1}
    # a failure stays said, even when the part read nothing before
    scrape = exporter.Scrape(Owner())
    scrape.optional('nvml', _fails(OSError('no')))
    assert scrape.optional('nvml', lambda: None) is None
    assert scrape.ok == {'nvml': 0}


def test_values_left_out_are_each_logged_and_the_part_not_ok(caplog):
    scrape = exporter.Scrape(Owner())
    scrape.part('tasks', lambda: {})
    with caplog.at_level(logging.WARNING):
        scrape.dropped('tasks', [])
        assert scrape.ok == {'tasks': 1}
        scrape.dropped('tasks', ['runs -1', 'failures x'])
    assert scrape.ok == {'tasks': 0}
    assert _warnings(caplog) == [
        'scrape: tasks: left out runs -1; the next write of that file '
        'starts it afresh',
        'scrape: tasks: left out failures x; the next write of that file '
        'starts it afresh']


# --- the domains libvirt lists ----------------------------------------------

class Devices(object):
    def __init__(self, mdev_uuids=(), pci_addresses=()):
        self.mdev_uuids = mdev_uuids
        self.pci_addresses = pci_addresses


class Meta(object):
    def __init__(self, vgpus=()):
        self.vgpus = vgpus


class Guest(object):
    """A ``guests.Guest`` stand-in: ``error`` raised by ``devices``."""

    def __init__(self, uuid, name, active=True, devices=None, meta=None,
                 error=None):
        self.uuid, self.name, self.active = uuid, name, active
        self._devices = devices or Devices()
        self._meta = meta or Meta()
        self.error = error

    def is_active(self):
        return self.active

    def devices(self):
        if self.error is not None:
            raise self.error
        return self._devices, self._meta


class Host(object):
    def __init__(self, guests):
        self.guests = guests

    def list_guests(self):
        return self.guests


class MetaVgpu(object):
    def __init__(self, uuid):
        self.uuid = uuid


def test_the_domains_a_scrape_reads():
    """Every domain named; a running one's vGPUs (mdevs and those our
    metadata lists) and whole GPUs; a stopped one's none; one gone or
    refused while listed, skipped."""
    host = Host([
        Guest(D1, 'one', devices=Devices([U1], [GPU_A]),
              meta=Meta([MetaVgpu(U2), MetaVgpu(U1)])),
        Guest(D2, 'two', active=False, devices=Devices([U3], [GPU_B])),
        Guest(D3, 'three', error=exception.DomainNotFound(uuid=D3)),
        Guest(U5, 'five', error=exception.InvalidInput(reason='bad')),
        Guest(U4, 'four', devices=Devices([], [C]))])
    view = exporter.read_domains(host)
    assert view == exporter.DomainView(
        names={D1: 'one', D2: 'two', D3: 'three', U5: 'five', U4: 'four'},
        vgpus={U1: D1, U2: D1}, pci={GPU_A: D1, C: U4})


# --- the lease file's readability -------------------------------------------

class Store(object):
    """What ``_readable`` reads of a ``LeaseStore``."""

    def __init__(self, state_dir):
        self.state_dir = state_dir
        self.db_path = os.path.join(state_dir, state.DB_NAME)


@pytest.fixture
def shared_dir():
    """A state directory every user can pass through (``/run``: its parents
    up to / too)."""
    if os.geteuid() != 0 or not os.access('/run', os.W_OK):
        pytest.skip('drops root to a user')
    path = tempfile.mkdtemp(prefix='lgpu-mut-exporter-', dir='/run')
    os.chmod(path, 0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _as_nobody(state_dir):
    """What ``_readable`` says, run as nobody: '' or its error's text."""
    # root reads all; called here too so that mutmut, which learns which
    # test calls which function in this process only, runs this test
    exporter._readable(Store(state_dir))
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            try:
                exporter._readable(Store(state_dir))
                said = ''
            except exception.StateError as e:
                said = str(e)
            os.write(write, said.encode() + b'.')
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as f:
        said = f.read()
    _, status = os.waitpid(pid, 0)
    assert status == 0 and said.endswith('.')
    return said[:-1]


def _file(state_dir, name, mode):
    path = os.path.join(state_dir, name)
    with open(path, 'w') as f:
        f.write('x')
    os.chmod(path, mode)
    return path


def _refused(path):
    return ('State file %s: permission denied to uid 65534: run the exporter '
            'as the user that owns the state directory (root, as its '
            'systemd unit does)' % path)


def test_lease_files_not_there_yet_are_no_leases(shared_dir):
    assert _as_nobody(shared_dir) == ''


def test_lease_files_a_user_may_read_are_read(shared_dir):
    _file(shared_dir, state.DB_NAME, 0o644)
    _file(shared_dir, state.BOOT_ID_NAME, 0o644)
    assert _as_nobody(shared_dir) == ''


@pytest.mark.parametrize('db_mode', [None, 0o644])
def test_a_boot_id_a_user_may_not_read_is_said(shared_dir, db_mode):
    if db_mode is not None:
        _file(shared_dir, state.DB_NAME, db_mode)
    boot_id = _file(shared_dir, state.BOOT_ID_NAME, 0o600)
    assert _as_nobody(shared_dir) == _refused(boot_id)


def test_a_lease_file_a_user_may_not_read_is_said(shared_dir):
    db = _file(shared_dir, state.DB_NAME, 0o600)
    _file(shared_dir, state.BOOT_ID_NAME, 0o644)
    assert _as_nobody(shared_dir) == _refused(db)


def test_a_state_dir_a_user_may_not_enter_is_said(shared_dir):
    db = _file(shared_dir, state.DB_NAME, 0o644)
    os.chmod(shared_dir, 0o700)
    assert _as_nobody(shared_dir) == _refused(db)


# --- HTTP -------------------------------------------------------------------

def test_an_answer_s_header_and_body():
    assert exporter._http(404, b'not here\n') == (
        b'HTTP/1.1 404 Not Found\r\nContent-Type: text/plain; '
        b'charset=utf-8\r\nContent-Length: 9\r\nConnection: close\r\n\r\n'
        b'not here\n')
    assert exporter._http(200, b'abc', 'text/x', head=True) == (
        b'HTTP/1.1 200 OK\r\nContent-Type: text/x\r\nContent-Length: 3\r\n'
        b'Connection: close\r\n\r\n')


class Broken(object):
    def collect(self):
        raise RuntimeError('a bug')
        yield


@pytest.fixture
def server():
    server = exporter.Server(Families([]), '127.0.0.1', 0,
                             max_connections=2, request_timeout=3.0)
    try:
        yield server
    finally:
        for conn in list(server._pending):
            conn.close()
        server.sock.close()


def _head(answer):
    return answer.split(b'\r\n', 1)[0]


def test_a_request_s_method_and_path(server):
    server.collector = Families(exporter_scrape.every_family()[:1])
    ok = server._response(b'GET /metrics?name[]=x HTTP/1.1\r\n\r\n')
    body = exporter.render(server.collector)
    assert ok == exporter._http(200, body, exporter.CONTENT_TYPE)
    assert exporter.CONTENT_TYPE == 'text/plain; version=0.0.4; ' \
        'charset=utf-8'
    assert server._response(b'GET / HTTP/1.0\n\n') == ok
    # the path ends at the first '?'
    assert server._response(b'GET /metrics?a?b HTTP/1.1\r\n\r\n') == ok
    assert server._response(b'HEAD /metrics HTTP/1.1\r\n\r\n') == \
        exporter._http(200, body, exporter.CONTENT_TYPE, head=True)
    assert server._response(b'POST /metrics HTTP/1.1\r\n\r\n') == \
        b'HTTP/1.1 405 Method Not Allowed\r\nContent-Type: text/plain; ' \
        b'charset=utf-8\r\nContent-Length: 18\r\nConnection: close\r\n\r\n' \
        b'only GET /metrics\n'
    assert server._response(b'\r\n\r\n') == \
        exporter._http(405, b'only GET /metrics\n')
    assert server._response(b'GET /other HTTP/1.1\r\n\r\n') == \
        exporter._http(404, b'not found: the metrics are at /metrics\n')
    assert server._response(b'GET\r\n\r\n') == \
        exporter._http(404, b'not found: the metrics are at /metrics\n')
    # the first line alone decides: no version is fine, an empty line
    # with the request on the next one is not
    assert server._response(b'GET /metrics\r\n\r\n') == ok
    assert server._response(b'\r\nGET /metrics HTTP/1.1\r\n\r\n') == \
        exporter._http(405, b'only GET /metrics\n')


def test_a_scrape_that_fails_is_a_500_logged(server, caplog):
    server.collector = Broken()
    with caplog.at_level(logging.ERROR):
        answer = server._response(b'GET /metrics HTTP/1.1\r\n\r\n')
    assert answer == exporter._http(500, b'the scrape failed: see the log\n')
    assert [r.getMessage() for r in caplog.records
            if r.levelno == logging.ERROR] == [
        'exporter: the scrape failed']


def test_the_server_s_bounds(server):
    assert server.limit == 2
    assert server.timeout == 3.0
    assert server._work.maxsize == exporter.WORKERS * 4
    assert server.port == server.sock.getsockname()[1] != 0
    assert server.sock.getblocking() is False
    default = exporter.Server(Families([]), '127.0.0.1', 0)
    try:
        assert default.timeout == exporter.REQUEST_TIMEOUT == 5.0
        assert default.limit == exporter.connection_limit()
    finally:
        default.sock.close()


def test_a_port_in_use_is_refused(server):
    with pytest.raises(OSError):
        exporter.Server(Families([]), '127.0.0.1', server.port)


def _pair(server, sel, deadline=None):
    """A connection the server holds (``_pending``) and its client end."""
    mine, theirs = socket.socketpair()
    mine.setblocking(False)
    server._pending[mine] = [time.monotonic() + 60
                             if deadline is None else deadline, b'']
    sel.register(mine, selectors.EVENT_READ)
    return mine, theirs


def test_a_request_is_read_in_pieces_then_queued(server):
    sel = selectors.DefaultSelector()
    mine, theirs = _pair(server, sel)
    theirs.sendall(b'GET /metrics HTTP/1.1\r\n')
    server._read(sel, mine)
    assert server._pending[mine][1] == b'GET /metrics HTTP/1.1\r\n'
    assert server._work.empty()
    theirs.sendall(b'Host: x\r\n\r\n')
    server._read(sel, mine)
    assert mine not in server._pending
    assert sel.get_map() == {}
    assert server._work.get_nowait() == (
        mine, b'GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n')
    # nothing more to read: no error, nothing done
    server._read(sel, mine)
    mine.close()
    theirs.close()


def test_a_request_ends_at_a_blank_line_of_bare_newlines(server):
    sel = selectors.DefaultSelector()
    mine, theirs = _pair(server, sel)
    theirs.sendall(b'GET /metrics HTTP/1.0\n\n')
    server._read(sel, mine)
    assert server._work.get_nowait() == (mine, b'GET /metrics HTTP/1.0\n\n')
    mine.close()
    theirs.close()


def test_a_request_not_yet_sent_waits(server):
    sel = selectors.DefaultSelector()
    mine, theirs = _pair(server, sel)
    server._read(sel, mine)         # nothing there: would block
    assert server._pending[mine][1] == b''
    theirs.close()


def test_a_client_that_closes_or_sends_too_much_is_dropped(server):
    sel = selectors.DefaultSelector()
    mine, theirs = _pair(server, sel)
    theirs.close()
    server._read(sel, mine)
    assert mine not in server._pending and mine.fileno() == -1
    mine, theirs = _pair(server, sel)
    server._pending[mine][1] = b'x' * (exporter.MAX_REQUEST - 4095)
    theirs.sendall(b'y' * 4096)
    server._read(sel, mine)
    assert mine not in server._pending and mine.fileno() == -1
    assert sel.get_map() == {}
    theirs.close()
    # exactly the bound: still read
    mine, theirs = _pair(server, sel)
    server._pending[mine][1] = b'x' * (exporter.MAX_REQUEST - 4096)
    theirs.sendall(b'y' * 4096)
    server._read(sel, mine)
    assert len(server._pending[mine][1]) == exporter.MAX_REQUEST
    theirs.close()


def test_a_request_past_a_full_queue_is_closed(server):
    sel = selectors.DefaultSelector()
    server._work = queue.Queue(maxsize=1)
    server._work.put(None)
    mine, theirs = _pair(server, sel)
    theirs.sendall(b'GET / HTTP/1.1\r\n\r\n')
    server._read(sel, mine)
    assert mine.fileno() == -1 and mine not in server._pending
    theirs.close()


def test_connections_past_their_deadline_expire_oldest_first(server):
    sel = selectors.DefaultSelector()
    now = time.monotonic()
    old, old_peer = _pair(server, sel, deadline=now - 1)
    due, due_peer = _pair(server, sel, deadline=now)
    late, late_peer = _pair(server, sel, deadline=now + 1)
    server._expire(sel, now)
    assert list(server._pending) == [late]
    assert old.fileno() == due.fileno() == -1
    assert list(sel.get_map().values())[0].fileobj is late
    for s in (old_peer, due_peer, late_peer):
        s.close()


def test_dropping_a_connection_not_registered_closes_it(server):
    sel = selectors.DefaultSelector()
    mine, theirs = socket.socketpair()
    server._drop(sel, mine)
    assert mine.fileno() == -1
    theirs.close()


def test_accepting_past_the_bound_drops_the_longest_waiting(server):
    sel = selectors.DefaultSelector()
    clients = [socket.create_connection(('127.0.0.1', server.port),
                                        timeout=2) for _ in range(3)]
    try:
        before = time.monotonic()
        assert server._accept(sel) is True
        after = time.monotonic()
        held = list(server._pending)
        assert len(held) == server.limit == 2
        assert all(before + 3.0 <= deadline <= after + 3.0
                   and data == b'' for deadline, data in
                   server._pending.values())
        assert all(conn.getblocking() is False for conn in held)
        assert {k.fileobj for k in sel.get_map().values()} == set(held)
        # the first client's connection was the one dropped
        clients[0].settimeout(2)
        assert clients[0].recv(1) == b''
    finally:
        for c in clients:
            c.close()


@pytest.mark.parametrize('soft,limit,held', [
    (1024, None, exporter.MAX_CONNECTIONS), (576, None, 256),
    (574, None, 255), (200, None, 68), (201, None, 68), (200, 10, 10),
    (66, None, 1),
    (60, None, 1)])
def test_the_connections_held_stay_under_the_file_limit(soft, limit, held):
    old = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, old[1]))
    try:
        found = exporter.connection_limit(limit)
        assert found == held and isinstance(found, int)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, old)


def _no_file_left():
    """Lower this process's open-file limit to its lowest free
    descriptor: the next file it opens fails with EMFILE."""
    spare = os.dup(0)
    os.close(spare)
    resource.setrlimit(resource.RLIMIT_NOFILE,
                       (spare, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))


def test_accepting_with_no_file_left_makes_room_from_the_oldest(server,
                                                                caplog):
    """EMFILE at accept: the longest-waiting connection is closed and the
    new one taken; with none held, accepting stops for a moment
    (False)."""
    sel = selectors.DefaultSelector()
    server.limit = 8
    old = resource.getrlimit(resource.RLIMIT_NOFILE)
    clients = []
    # Collected first, then no collection until the end: a socket an
    # earlier test left behind, closed by a collection after the oldest
    # connection was taken, frees a descriptor below the oldest's, and
    # closing the oldest then makes no room under the lowered limit.
    collecting = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        clients.append(socket.create_connection(('127.0.0.1', server.port),
                                                timeout=2))
        assert server._accept(sel) is True
        [oldest] = list(server._pending)
        clients.append(socket.create_connection(('127.0.0.1', server.port),
                                                timeout=2))
        _no_file_left()
        with caplog.at_level(logging.WARNING):
            assert server._accept(sel) is True
        [held] = list(server._pending)
        assert held is not oldest and oldest.fileno() == -1
        assert {k.fileobj for k in sel.get_map().values()} == {held}
        assert clients[0].recv(1) == b''        # the oldest, closed
        assert _warnings(caplog) == [
            'exporter: cannot accept a connection: [Errno 24] Too many '
            'open files']
        server._drop(sel, held)
        resource.setrlimit(resource.RLIMIT_NOFILE, old)
        clients.append(socket.create_connection(('127.0.0.1', server.port),
                                                timeout=2))
        _no_file_left()
        # nothing held to close: accepting stops for a moment
        assert server._accept(sel) is False
        assert server._pending == {}
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, old)
        if collecting:
            gc.enable()
        for c in clients:
            c.close()


def _free_port(address):
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def _connection(address, port):
    try:
        return socket.create_connection((address, port), timeout=5)
    except OSError:
        return None


def test_serve_serves_its_collector_on_the_address_and_port_given(caplog):
    """``serve`` hands its collector, address, port and limits to the
    server: the scrape answers with the collector's series, on that
    address only (127.0.0.2: not 127.0.0.1, where a server bound to
    every address would answer too), and an idle client is closed at
    the request timeout given, not the default."""
    import threading
    stop = threading.Event()
    port = _free_port('127.0.0.2')
    col = Families(exporter_scrape.every_family()[:1])
    runner = threading.Thread(target=exporter.serve, args=(
        col, '127.0.0.2', port, stop), kwargs={'request_timeout': 0.3})
    clients = []
    with caplog.at_level(logging.INFO):
        runner.start()
        try:
            scrape = wait_for(lambda: _connection('127.0.0.2', port),
                              timeout=10)
            assert scrape is not None
            clients.append(scrape)
            scrape.sendall(b'GET /metrics HTTP/1.1\r\n\r\n')
            assert _read_all(scrape) == exporter._http(
                200, exporter.render(col), exporter.CONTENT_TYPE)
            assert _connection('127.0.0.1', port) is None
            idle = _connection('127.0.0.2', port)
            clients.append(idle)
            started = time.monotonic()
            assert _read_all(idle) == b''
            assert time.monotonic() - started < exporter.REQUEST_TIMEOUT
        finally:
            stop.set()
            runner.join(10)
            for c in clients:
                c.close()
    assert not runner.is_alive()
    assert [r.getMessage() for r in caplog.records
            if r.name == exporter.LOG.name] == [
        'exporter: serving http://127.0.0.2:%d/metrics' % port]


def test_one_round_accepts_at_most_64_connections(server):
    """The rest wait for the next round of the loop, which first expires
    and reads those it holds."""
    sel = selectors.DefaultSelector()
    server.limit = 100
    clients = [socket.create_connection(('127.0.0.1', server.port),
                                        timeout=2) for _ in range(65)]
    try:
        assert server._accept(sel) is True
        assert len(server._pending) == 64
        assert server._accept(sel) is True
        assert len(server._pending) == 65
    finally:
        for c in clients:
            c.close()


def test_a_client_that_resets_is_dropped(server):
    sel = selectors.DefaultSelector()
    client = socket.create_connection(('127.0.0.1', server.port), timeout=2)
    assert server._accept(sel) is True
    [conn] = list(server._pending)
    client.sendall(b'GET')
    assert wait_for(lambda: server._read(sel, conn) or
                    server._pending[conn][1] == b'GET', timeout=5)
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                      struct.pack('ii', 1, 0))
    client.close()                  # RST: recv raises ECONNRESET
    assert select.select([conn], [], [], 5)[0] == [conn]
    server._read(sel, conn)         # once: the next recv would say EOF
    assert conn.fileno() == -1 and sel.get_map() == {}
    assert conn not in server._pending


# --- MIG GPU instances and placements ----------------------------------------

def _tf(number, gi=None, per_gi=None, size=None):
    return layout_mod.TypeFacts(
        type_id=objects.vendor_type_id(number), name='t%d' % number,
        framebuffer_mib=1024, gi_profile_id=gi, max_per_gi=per_gi,
        placement_size=size, placements=(0, 1) if size else ())


TA, TB, TC, TS, TS2 = (objects.vendor_type_id(n)
                       for n in (1152, 1153, 1150, 1160, 1161))


class Layouts(object):
    """``nvml.Session``'s GI and placement reads."""

    def __init__(self, gis=(), placements=None):
        self.gis = gis
        self.placements = placements or {}
        self.asked = []

    def gpu_instances(self, address, profiles):
        self.asked.append((address, profiles))
        return self.gis

    def creatable_placements(self, address, number):
        self.asked.append((address, number))
        ids = self.placements.get(number)
        return None if ids is None else (1, ids)


def _active(type_id, gi=None, placement=None):
    return nvml.ActiveVgpu(type_id, gi, placement)


def test_each_gpu_instance_s_room_by_type():
    """A GI's room for a type: its maximum per GI less its vGPUs of it,
    never below 0; none while it holds a vGPU of another type."""
    profiles = (layout_mod.GiProfile(id=9, name='3g.40gb', slices=3,
                                     instances=2, memory_mib=40000),
                layout_mod.GiProfile(id=19, name='1g.10gb', slices=1,
                                     instances=7, memory_mib=10000))
    facts = layout_mod.GpuFacts(address=GPU_A, mig=True, profiles=profiles,
                                types=(_tf(1152, 9, 4), _tf(1153, 9, 2),
                                       _tf(1150, 19), _tf(1160, size=1)))
    gis = tuple(layout_mod.GpuInstance(i, p)
                for i, p in ((1, 9), (2, 9), (3, 19), (4, 77), (5, 9)))
    active = [_active(TA, 1), _active(TA, 1), _active(TB, 5)] + \
        [_active(TA, 5)] * 5
    session = Layouts(gis)
    views = exporter._gi_views(session, GPU_A, facts, active)
    assert session.asked == [(GPU_A, profiles)]
    room = exporter.TypeRoom
    assert views == (
        exporter.GiView(id=1, profile='3g.40gb', types=(
            room(TA, 2, 2), room(TB, 0, 0))),
        exporter.GiView(id=2, profile='3g.40gb', types=(
            room(TA, 0, 4), room(TB, 0, 2))),
        # a type of its profile with no maximum said: no room
        exporter.GiView(id=3, profile='1g.10gb', types=(room(TC, 0, 0),)),
        exporter.GiView(id=4, profile='profile 77', types=()),
        exporter.GiView(id=5, profile='3g.40gb', types=(
            room(TA, 5, 0), room(TB, 1, 0))))


def test_each_time_sliced_type_s_placements():
    facts = layout_mod.GpuFacts(address=GPU_A, mig=None, types=(
        _tf(1152, 9, 4), _tf(1160, size=1), _tf(1161, size=2)))
    session = Layouts(placements={1160: (2, 3, 4)})
    active = [_active(TS, placement=0), _active(TS, placement=1),
              _active(TS2, placement=4), _active(TA, 1)]
    rooms = exporter._placement_rooms(session, GPU_A, facts, active)
    assert session.asked == [(GPU_A, 1160), (GPU_A, 1161)]
    assert rooms == (exporter.TypeRoom(TS, 2, 3),
                     exporter.TypeRoom(TS2, 1, None))


class MigLayout(object):
    """What ``_layout_steps`` reads of a ``layout.Layout``."""

    name = 'h100'
    mode = 'mig'
    mig = True


def test_a_mig_layout_on_a_gpu_without_mig_has_no_steps_and_says_why(
        caplog):
    facts = layout_mod.GpuFacts(address=GPU_A, mig=None)
    with caplog.at_level(logging.WARNING):
        assert exporter._layout_steps(None, MigLayout(), GPU_A, facts) is None
    assert _warnings(caplog) == [
        'scrape: layout h100, GPU %s: mode mig needs MIG, and this GPU has '
        'no MIG mode; use mode time-sliced or mixed-size' % GPU_A]


def test_a_task_never_run_does_not_hide_the_next():
    found = samples(exporter.task_families({
        figures.PLACEMENT_SYNC: None, figures.RESTORE: {'runs': 2}}))
    assert found == row('task_runs_total', 2, task=figures.RESTORE)


# --- a whole scrape: which parts it read ------------------------------------

@pytest.fixture
def t4(tmp_path):
    with trees.simulated_tree('t4') as (root, profile):
        yield th.Env(root, profile, tmp_path)


@pytest.fixture(scope='module')
def layout_host():
    """test_exporter_layout's simulated L40S host."""
    path = tempfile.mkdtemp(prefix='lgpu-mut-exporter-layout-')
    root = os.path.join(path, 'sys')
    simulator.write_sysfs(simulator.load_profile('l40s'), root)
    yield path, root
    shutil.rmtree(path, ignore_errors=True)


def _collector(host, conn, survey):
    env = environment.Environment.from_conf(
        conf_mod.load(host.config), sysfs=host.sysfs,
        conn=host_mod.Host.from_connection(conn) if conn is not None
        else None)
    return exporter.HostCollector(env, survey)


def _read_ok(found):
    return {dict(k[1])['part']: v for k, v in found.items()
            if k[0] == P + 'exporter_read_ok'}


class Down(object):
    """A libvirt ``host.Host`` that cannot list its domains."""

    def __init__(self):
        self.closed = 0

    def list_guests(self):
        raise exception.LibvirtGpuError()

    def close(self):
        self.closed += 1


def _report():
    return reconcile.Report(dry_run=True, findings=(reconcile.Finding(
        action=reconcile.WOULD_REMOVE, what='mdev', uuid=U1, reason='r'),))


def test_a_scrape_with_libvirt_and_reconcile_reads_every_part(t4, tmp_path):
    conn = fake_libvirt.FakeConnection(str(tmp_path / 'doms'))
    calls = []

    def survey():
        calls.append(1)
        return _report()
    found = scrape(_collector(t4, conn, survey))
    assert calls == [1]
    assert _read_ok(found) == {'host': 1, 'leases': 1, 'libvirt': 1,
                               'reconcile': 1, 'hook': 1, 'tasks': 1}
    assert found[(P + 'unexplained_vgpus', frozenset())] == 1
    text = exporter.exposition(_collector(t4, conn, survey))
    assert ('# HELP libvirt_gpu_exporter_read_ok Whether the part of this '
            'scrape could be read (1) or not (0, logged)\n'
            '# TYPE libvirt_gpu_exporter_read_ok gauge\n') in text


def test_reconcile_is_not_read_without_libvirt_s_domains(t4, tmp_path):
    calls = []
    col = _collector(t4, None, lambda: calls.append(1))
    assert 'reconcile' not in _read_ok(scrape(col))
    down = Down()
    col.host = down
    found = scrape(col)
    assert calls == [] and down.closed == 1
    assert _read_ok(found) == {'host': 1, 'leases': 1, 'libvirt': 0,
                               'hook': 1, 'tasks': 1}


def test_a_reconcile_that_fails_is_said_and_serves_nothing(t4, tmp_path):
    conn = fake_libvirt.FakeConnection(str(tmp_path / 'doms'))

    def survey():
        raise exception.StateError(path='/x', reason='busy')
    found = scrape(_collector(t4, conn, survey))
    assert _read_ok(found)['reconcile'] == 0
    assert not [k for k in found if k[0] in (
        P + 'dead_holder_leases', P + 'unexplained_vgpus')]


def test_layouts_without_nvml_say_why_in_the_log(layout_host, caplog):
    with caplog.at_level(logging.WARNING):
        found = tel.scrape(layout_host, tel.MIXED, nvml_on=False)
    assert tel.read_ok(found)['layout'] == 0
    assert _warnings(caplog) == [
        "scrape: cannot read layout: NVML cannot be used: [gpu]/nvml is "
        "off, or the GPUs are not read from this host's /sys; layouts need "
        "NVIDIA's driver and the nvidia-ml-py package ([gpu]/nvml = auto)"]


# --- the leases and free counts a scrape reads ------------------------------

class Snapshot(object):
    """A lease snapshot (``LeaseStore.snapshot``'s transaction)."""

    def __init__(self, leases, borrowed):
        self.leases, self._borrowed = leases, borrowed

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def all(self):
        return list(self.leases)

    def borrowed(self):
        return self._borrowed


class LeaseHost(object):
    """What ``_read_leases`` reads of an ``Environment``: ``free`` is
    ``{(gpu, type): count or an error}``."""

    def __init__(self, state_dir, snapshot, mdevs, existing, free):
        self.store = Store(state_dir)
        self.store.snapshot = lambda: snapshot
        self.sysfs = self
        self.vgpus = self
        self.allocator = self
        self._mdevs, self._existing, self._free = mdevs, existing, free
        self.asked = []

    def mdevs_by_parent(self, skipped):
        assert skipped == []
        return self._mdevs

    def existing(self, mdevs):
        assert mdevs is self._mdevs
        return self._existing

    def free(self, txn, address, type_id, mdevs):
        assert mdevs is self._mdevs and isinstance(txn, Snapshot)
        self.asked.append((address, type_id))
        answer = self._free[address, type_id]
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_free_counts_of_every_enabled_type_and_one_unreadable_said(
        tmp_path, caplog):
    leases = (_lease(U1, GPU_A),)
    snapshot = Snapshot(leases, {U2: (D2, 'x')})
    error = exception.SysfsError(path='/sys/x', reason='gone')
    env = LeaseHost(str(tmp_path), snapshot, {GPU_A: ()}, {U1: (GPU_A, T)}, {
        (GPU_A, T): 3, (GPU_A, T2): error, (C, T): 0})
    enabled = {C: objects.EnabledType(T), GPU_A: objects.EnabledType(
        T, others=(objects.EnabledType(T2),))}
    with caplog.at_level(logging.WARNING):
        found = exporter._read_leases(env, enabled)
    assert found == (leases, {U2: (D2, 'x')}, {(GPU_A, T): 3, (C, T): 0},
                     {U1: (GPU_A, T)})
    assert env.asked == [(GPU_A, T), (GPU_A, T2), (C, T)]
    assert _warnings(caplog) == [
        'scrape: no free count of %s for %s: sysfs: /sys/x: gone'
        % (GPU_A, T2)]


def test_a_host_whose_gpus_cannot_be_read_says_so(t4, caplog):
    col, _ = collector(t4)
    shutil.rmtree(os.path.join(t4.root, 'bus'))
    with caplog.at_level(logging.WARNING):
        found = scrape(col)
    assert _read_ok(found) == {'host': 0, 'leases': 1, 'hook': 1,
                               'tasks': 1, 'layout': 0}
    assert not [k for k in found if k[0] == P + 'gpu_info']
    assert _warnings(caplog)[0].startswith('scrape: cannot read host: ')


def _read_all(sock):
    """Everything ``sock`` receives until its peer closes (b'' on a
    reset), each wait bounded by its timeout."""
    data = b''
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


def test_the_serve_loop_answers_times_out_and_closes_at_stop():
    """In this process (the hardening tests run it in a child): a scrape
    answered, an idle client closed at its deadline, every connection and
    the listening socket closed when told to stop; the workers are daemon
    threads (one still sending to a slow client does not keep the process
    alive at exit)."""
    import threading
    stop = threading.Event()
    served = Families(exporter_scrape.every_family()[:1])
    server = exporter.Server(served, '127.0.0.1', 0, request_timeout=0.3)
    runner = threading.Thread(target=server.serve, args=(stop,))
    runner.start()
    clients = []

    def connect():
        clients.append(socket.create_connection(
            ('127.0.0.1', server.port), timeout=5))
        return clients[-1]
    try:
        assert wait_for(lambda: len([
            t for t in threading.enumerate()
            if t.name.startswith('exporter-')]) == exporter.WORKERS,
            timeout=10)
        workers = [t for t in threading.enumerate()
                   if t.name.startswith('exporter-')]
        assert sorted(t.name for t in workers) == ['exporter-0',
                                                   'exporter-1']
        assert all(t.daemon for t in workers)
        idle = connect()
        scrape = connect()
        scrape.sendall(b'GET /metrics HTTP/1.1\r\n\r\n')
        assert _read_all(scrape) == server._response(
            b'GET /metrics HTTP/1.1\r\n\r\n')
        started = time.monotonic()
        assert _read_all(idle) == b''       # its deadline passed
        assert time.monotonic() - started < 4
        held = connect()
        held.sendall(b'GET')
        assert wait_for(lambda: len(server._pending) == 1, timeout=5)
    finally:
        stop.set()
        runner.join(10)
    assert not runner.is_alive()
    assert _read_all(held) == b''
    assert server.sock.fileno() == -1
    assert not [t for t in threading.enumerate()
                if t.name.startswith('exporter-')]
    for c in clients:
        c.close()


# --- one GPU's layout as NVML says it is -------------------------------------

class Recorder(object):
    """An ``nvml.Session`` (and ``GpuDriver``) stand-in: each read answers
    from ``answers`` and is noted with its arguments in ``asked``."""

    def __init__(self, **answers):
        self.answers = answers
        self.asked = []
        self.session = self
        self.sysfs = self

    def _answer(self, name, *args, **kwargs):
        self.asked.append((name, args, kwargs))
        return self.answers.get(name)

    def mig_mode(self, address):
        return self._answer('mig_mode', address)

    def gi_profiles(self, address):
        return self._answer('gi_profiles', address)

    def vgpu_types(self, address, **kwargs):
        return self._answer('vgpu_types', address, **kwargs)

    def sriov_totalvfs(self, address):
        return self._answer('sriov_totalvfs', address)

    def mixed_size(self, address):
        return self._answer('mixed_size', address)

    def active_vgpus(self, address, mig):
        return self._answer('active_vgpus', address, mig)

    def scheduler(self, address):
        return self._answer('scheduler', address)

    def gpu_instances(self, address, profiles):
        return self._answer('gpu_instances', address, profiles)

    def creatable_placements(self, address, number):
        return self._answer('creatable_placements', address, number)


PROFILES = (layout_mod.GiProfile(id=9, name='3g.40gb', slices=3,
                                 instances=2, memory_mib=40000),)


def test_a_mig_gpu_s_facts_and_view():
    types = (_tf(1152, 9, 4),)
    nv = Recorder(mig_mode=True, gi_profiles=PROFILES, vgpu_types=types,
                  sriov_totalvfs=None, active_vgpus=(_active(TA, 1),),
                  gpu_instances=(layout_mod.GpuInstance(1, 9),),
                  scheduler=layout_mod.Scheduler('best-effort'))
    assert exporter._facts(nv, GPU_A) == layout_mod.GpuFacts(
        address=GPU_A, mig=True, profiles=PROFILES, types=types, vfs_total=0)
    assert nv.asked == [('mig_mode', (GPU_A,), {}),
                        ('gi_profiles', (GPU_A,), {}),
                        ('vgpu_types', (GPU_A,), {'placements': True}),
                        ('sriov_totalvfs', (GPU_A,), {})]
    nv.asked = []
    view = exporter._layout_view(nv, GPU_A, None)
    assert view == exporter.LayoutView(
        address=GPU_A, mode='mig', gpu_instances=(exporter.GiView(
            id=1, profile='3g.40gb', types=(
                exporter.TypeRoom(TA, 1, 3),)),),
        scheduler=layout_mod.Scheduler('best-effort'))
    assert [a for a in nv.asked if a[0] in (
        'mixed_size', 'active_vgpus', 'scheduler')] == [
        ('active_vgpus', (GPU_A, True), {}), ('scheduler', (GPU_A,), {})]


@pytest.mark.parametrize('mig', [None, False])
def test_a_gpu_without_mig_on_has_no_profiles_read(mig):
    types = (_tf(1160, size=1),)
    nv = Recorder(mig_mode=mig, gi_profiles=PROFILES, vgpu_types=types,
                  sriov_totalvfs=16)
    facts = exporter._facts(nv, GPU_A)
    assert facts == layout_mod.GpuFacts(
        address=GPU_A, mig=mig, profiles=PROFILES if mig is False else (),
        types=types, vfs_total=16)
    assert ('gi_profiles', (GPU_A,), {}) in nv.asked or mig is None
    assert ('gi_profiles', (GPU_A,), {}) not in nv.asked or mig is False


@pytest.mark.parametrize('mixed,mode', [
    (True, exporter.MODE_MIXED), (False, exporter.MODE_SLICED),
    (None, exporter.MODE_SLICED)])
def test_a_time_sliced_gpu_s_view(mixed, mode):
    types = (_tf(1160, size=1),)
    nv = Recorder(mig_mode=None, vgpu_types=types, sriov_totalvfs=0,
                  mixed_size=mixed, active_vgpus=(_active(TS, None, 0),),
                  creatable_placements=(1, (1, 2)),
                  scheduler=layout_mod.Scheduler('equal-share', 2))
    view = exporter._layout_view(nv, GPU_A, None)
    placements = ((exporter.TypeRoom(TS, 1, 2),)
                  if mode == exporter.MODE_MIXED else ())
    assert view == exporter.LayoutView(
        address=GPU_A, mode=mode, placements=placements,
        scheduler=layout_mod.Scheduler('equal-share', 2))
    assert ('mixed_size', (GPU_A,), {}) in nv.asked
    assert ('active_vgpus', (GPU_A, False), {}) in nv.asked
    assert not [a for a in nv.asked if a[0] == 'gpu_instances']


def test_a_gpu_in_no_layout_and_without_vgpu_types_has_no_view():
    nv = Recorder(mig_mode=None, vgpu_types=(), sriov_totalvfs=0)
    assert exporter._layout_view(nv, GPU_A, None) is None
    assert [a[0] for a in nv.asked] == [
        'mig_mode', 'vgpu_types', 'sriov_totalvfs']


def test_without_nvml_and_layouts_the_reason_is_a_debug_line(layout_host,
                                                             caplog):
    with caplog.at_level(logging.DEBUG, logger=exporter.LOG.name):
        found = tel.scrape(layout_host, '', None)
    assert 'layout' not in tel.read_ok(found)
    assert [r.getMessage() for r in caplog.records
            if r.name == exporter.LOG.name] == [
        "scrape: no layout series: NVML cannot be used: NVML Shared Library "
        "Not Found; layouts need NVIDIA's driver and the nvidia-ml-py "
        "package ([gpu]/nvml = auto)"]


def test_a_worker_answers_each_request_and_closes_it(server):
    server.collector = Families(exporter_scrape.every_family()[:1])
    mine, theirs = socket.socketpair()
    mine.setblocking(False)
    gone, gone_peer = socket.socketpair()
    gone_peer.close()
    server._work.put((gone, b'GET /metrics HTTP/1.1\r\n\r\n'))
    server._work.put((mine, b'HEAD /metrics HTTP/1.1\r\n\r\n'))
    server._work.put(None)
    server._answer()                # returns at None
    assert gone.fileno() == -1 and mine.fileno() == -1
    theirs.settimeout(2)
    answer = b''
    while True:
        data = theirs.recv(65536)
        if not data:
            break
        answer += data
    theirs.close()
    assert answer == server._response(b'HEAD /metrics HTTP/1.1\r\n\r\n')


class Counting(Families):
    def __init__(self, families):
        super().__init__(families)
        self.scrapes = 0

    def collect(self):
        self.scrapes += 1
        return super().collect()


def test_a_render_reads_the_host_once():
    """Not once more to learn the series' names (a registry's
    auto_describe): each scrape reads the host once."""
    col = Counting(exporter_scrape.every_family()[:1])
    text = exporter.exposition(col)
    assert col.scrapes == 1
    assert text == exporter.render(col).decode()
    assert text.startswith('# HELP libvirt_gpu_gpu_info ')


def test_a_lease_file_another_program_altered_is_not_read_as_none(t4):
    """read_ok{leases} 0 and no leases series (not every state at 0);
    the GPUs are still served."""
    assert t4.run('prepare', th.domain_xml([(new_uuid(), 'nvidia-223',
                                             B)]))[0] == 0
    col, _ = collector(t4)
    db = os.path.join(t4.state_dir, state.DB_NAME)
    for suffix in ('', '-wal', '-shm'):
        if os.path.exists(db + suffix):
            os.remove(db + suffix)
    with sqlite3.connect(db) as other:
        other.execute('CREATE TABLE other (x)')
    other.close()
    found = scrape(col)
    assert _read_ok(found)['leases'] == 0
    assert not [k for k in found if k[0] == P + 'leases']
    assert [k for k in found if k[0] == P + 'gpu_info']


def test_a_client_that_does_not_take_its_answer_frees_the_worker(
        server, monkeypatch):
    """Within SEND_TIMEOUT (made short here) the worker gives up on a
    client that reads nothing of a large answer, and closes it."""
    import threading
    monkeypatch.setattr(exporter, 'SEND_TIMEOUT', 0.2)
    big = prom.GaugeMetricFamily(P + 'big', 'a large answer',
                                 labels=['name'])
    big.add_metric(['x' * (8 << 20)], 1)
    server.collector = Families([big])
    mine, theirs = socket.socketpair()
    server._work.put((mine, b'GET /metrics HTTP/1.1\r\n\r\n'))
    server._work.put(None)
    worker = threading.Thread(target=server._answer, daemon=True)
    worker.start()
    worker.join(10)
    try:
        assert not worker.is_alive()
        assert mine.fileno() == -1
    finally:
        theirs.close()


class NoEnabled(object):
    """An ``Environment`` whose enabled types cannot be read (its GPUs
    can)."""

    def __init__(self, env):
        self._env = env

    def __getattr__(self, name):
        return getattr(self._env, name)

    @property
    def enabled(self):
        raise exception.ConfigError(reason='[vgpu_x]: broken')

    def rediscover(self):
        self._env = self._env.rediscover()
        return self


def test_enabled_types_that_cannot_be_read_make_the_host_part_unread(
        t4, caplog):
    _, env = collector(t4)
    with caplog.at_level(logging.WARNING):
        found = scrape(exporter.HostCollector(NoEnabled(env)))
    assert _read_ok(found)['host'] == 0
    # the GPUs are still served, as whole GPUs
    assert {s['mode'] for s in series(found, P + 'gpu_info')} == {'pgpu'}
    assert _warnings(caplog)[0] == (
        'scrape: cannot read host: Configuration error: [vgpu_x]: broken')


def test_a_vgpu_on_a_vf_is_shown_on_its_physical_gpu(layout_host, tmp_path):
    _, root = layout_host
    config = tmp_path / 'libvirt-gpu.conf'
    config.write_text('[DEFAULT]\nstate_dir = %s\nsysfs_root = %s\n'
                      % (tmp_path / 'state', root))
    env = environment.Environment.from_conf(conf_mod.load(str(config)))
    vf = next(g for g in env.discovered.gpus if g.is_vf)
    with env.store.transaction() as txn:
        txn.add(U1, None, vf.address, objects.TypeId.parse('nvidia-1145'))
    found = scrape(exporter.HostCollector(env))
    assert series(found, P + 'vgpu_info') == [dict(
        uuid=U1, type='nvidia-1145', gpu=str(vf.physfn),
        parent=str(vf.address), route='libvirt-gpu', domain='',
        domain_uuid='',
        lease_state='reserved', exists='no')]


def test_a_running_domain_s_vgpu_is_named_by_libvirt(t4, tmp_path):
    conn = fake_libvirt.FakeConnection(str(tmp_path / 'doms'))
    conn.define(th.domain_xml([(PRE[0], 'nvidia-223', B)]).decode(),
                active=True)
    found = scrape(_collector(t4, conn, None))
    [info] = [s for s in series(found, P + 'vgpu_info')
              if s['uuid'] == PRE[0]]
    assert (info['domain'], info['domain_uuid']) == ('vm1', th.DOM)


class Asked(tel.Session):
    """test_exporter_layout's Session, noting each GPU NVML is asked
    about."""

    def __init__(self, gpus):
        super().__init__(gpus)
        self.addresses = set()

    def mig_mode(self, address):
        self.addresses.add(str(address))
        return super().mig_mode(address)


def test_nvml_is_asked_about_physical_gpus_only(layout_host):
    session = Asked({tel.L40S: tel.l40s()})
    tel.scrape(layout_host, '', session)
    assert session.addresses == {tel.L40S, tel.MIGGPU}     # not their VFs
