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
from tests.unit.guests.hook.test_hook import domain_xml
from tests.unit.guests.hook.test_hook import Env
from tests.unit.guests.hook.test_hook import new_uuid

A = '0000:3b:00.0'
B = '0000:af:00.0'
DOM2 = objects.Uuid.parse('6a8a3b1e-9d0b-4a55-9d84-3c7f0f3f4e21')
# the vGPUs the t4 profile holds on B (no lease, no domain)
PRE = ['4b20d080-1b54-4048-85b3-a6a62d165c01',
       'b1ae8bf6-38b0-4c81-9d44-78ce3f520496']


@pytest.fixture
def host(tmp_path):
    with trees.simulated_tree('t4') as (root, profile):
        yield Env(root, profile, tmp_path)


def collector(host, nvml=None, **kwargs):
    conf = conf_mod.load(host.config)
    env = environment.Environment.from_conf(conf, sysfs=host.sysfs)
    if nvml is not None:
        env.nvml = nvml              # the part a test gives
    return exporter.HostCollector(env, **kwargs), env


def scrape(col):
    """``{(name, frozenset(labels.items())): value}`` of one scrape."""
    found = {}
    for family in prom_parser.text_string_to_metric_families(
            exporter.exposition(col)):
        for s in family.samples:
            found[(s.name, frozenset(s.labels.items()))] = s.value
    return found


def value(samples, metric, **labels):
    return samples[(metric, frozenset(labels.items()))]


def series(samples, name):
    return [dict(k[1]) for k in samples if k[0] == name]


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
    from libvirt_gpu.store import allocator

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
