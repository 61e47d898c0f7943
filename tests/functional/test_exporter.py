"""A real Prometheus scrapes ``libvirt-gpu exporter`` on the live simulated
host, where guests start and stop under a real libvirtd through our
installed qemu hook; PromQL through Prometheus' HTTP API must return the
capacity, the holders and the hook's counts the host has.

Prometheus is Debian's ``prometheus`` package (the Makefile installs it),
started here with its own configuration, data directory and loopback port,
and stopped at the end; it loads the alert rules shipped in etc/.

The host (as in test_live_hook.py): two T4, ``nvidia-223`` (GRID T4-2B)
enabled on both, GPU B holding two vGPUs nobody leased; no VFIO, so a
guest with a vGPU runs ``prepare``, fails to start, then ``release``.  One
guest's vGPU is held busy (the simulated kernel refuses its removal with
EBUSY), so its release fails and leaves a lease whose process is gone:
what ``reconcile --dry-run`` calls a dead holder.

Two more live simulated hosts, each with NVML the simulated binding over
its own simulated driver (``[gpu]/nvml = simulated``), are brought to
their layouts by ``libvirt-gpu layout apply`` and scraped by the same
Prometheus once the T4 host's figures are checked: an H100 in MIG mode
(GPU instances, a MIG-backed vGPU in one) and an L40S in mixed-size mode
(placements, the equal-share scheduler), so that the dashboard's layout
panels have data too.
"""

import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import urllib.parse
import urllib.request
import uuid as uuidlib

import pytest

from libvirt_gpu.devices.backends.nvidia_vgpu import names as vendor_names
from tests.doubles import poll
from tests.doubles.ports import free_port
from tests.functional import hook_guests as hg
from tests.functional import live_sysfs as ls

A = '0000:3b:00.0'
B = '0000:af:00.0'
T4_2B = 'nvidia-223'
PROMETHEUS = shutil.which('prometheus')
RULES = os.path.join(ls.REPO, 'etc', 'libvirt-gpu', 'prometheus',
                     'libvirt-gpu-alerts.yml')
GATE_HOOK = """#!/bin/sh
# Holds the prepare of domain 'held' until the test opens the gate, so
# that the test can mark the vGPU our hook just made busy.
cat > /dev/null
[ "$1" = held ] && [ "$2" = prepare ] || exit 0
i=0
while [ ! -e %(gate)s ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
exit 0
"""

H100 = '0000:4e:00.0'
H100_VF = '0000:4e:00.4'
L40S = '0000:bd:00.0'        # the l40s profile's empty GPU
L40S_VF = '0000:bd:00.4'
L40S_HELD = '0000:3d:00.0'   # holds two vGPUs; in no layout
LAYOUTS = {
    'h100-80gb': '[layout_h100]\ngpus = %s\nmode = mig\n'
                 'gpu_instances = 1g.10gb:2, 3g.40gb:1\n'
                 'vgpu_types = nvidia-1308, nvidia-1312\n' % H100,
    'l40s': '[layout_l40s]\ngpus = %s\nmode = mixed-size\n'
            'vgpu_types = nvidia-1145:1, nvidia-1155:1\n'
            'scheduler = equal-share\n' % L40S,
}

missing = ls.live_host_requirements() + (
    [] if PROMETHEUS else ['prometheus is not installed (Debian package '
                           'prometheus)'])
pytestmark = pytest.mark.skipif(bool(missing), reason='; '.join(missing))


class GatedSetup(hg.HookSetup):
    def __init__(self, workdir, type_id):
        super().__init__(workdir, type_id)
        self.gate = os.path.join(workdir, 'gate')

    def extra_hooks(self):
        # qemu.d hooks run in name order: ours first
        return {'qemu.d/zz-gate': GATE_HOOK % {'gate': self.gate}}


def get(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as reply:
        return reply.read().decode()


class Prometheus(object):
    """Debian's prometheus, scraping ``target`` every 2 s."""

    def __init__(self, workdir, target):
        self.dir = os.path.join(workdir, 'prometheus')
        os.makedirs(os.path.join(self.dir, 'data'))
        self.port = free_port()
        self.url = 'http://127.0.0.1:%d' % self.port
        self.config = os.path.join(self.dir, 'prometheus.yml')
        self.targets = [target]
        self._write(self.targets)
        self.log = open(os.path.join(self.dir, 'log'), 'w')
        self.proc = subprocess.Popen(
            [PROMETHEUS, '--config.file', self.config,
             '--storage.tsdb.path', os.path.join(self.dir, 'data'),
             '--web.listen-address', '127.0.0.1:%d' % self.port],
            stdout=self.log, stderr=subprocess.STDOUT)

    def _write(self, targets, slow=()):
        with open(self.config, 'w') as f:
            # a scrape reads sysfs (FUSE here) and libvirt: on a loaded
            # 2-core machine it may take over a second; one that also
            # reads the simulated NVML (``slow``) several
            f.write('global:\n  scrape_interval: 2s\n  scrape_timeout: 2s\n'
                    '  evaluation_interval: 1s\n'
                    'rule_files:\n  - %s\n'
                    'scrape_configs:\n  - job_name: libvirt-gpu\n'
                    '    static_configs:\n      - targets: [%s]\n'
                    % (RULES, ', '.join('"%s"' % t for t in targets)))
            if slow:
                f.write('  - job_name: libvirt-gpu-layouts\n'
                        '    scrape_interval: 5s\n    scrape_timeout: 5s\n'
                        '    static_configs:\n      - targets: [%s]\n'
                        % ', '.join('"%s"' % t for t in slow))

    def scrape(self, slow):
        """Scrape ``slow`` too from now on (the configuration reloaded)."""
        self._write(self.targets, slow)
        self.proc.send_signal(signal.SIGHUP)

    def ready(self):
        try:
            return 'Ready' in get(self.url + '/-/ready', timeout=1)
        except OSError:
            return False

    def query(self, promql):
        """``[(labels, value)]`` of an instant query."""
        reply = json.loads(get(self.url + '/api/v1/query?' +
                               urllib.parse.urlencode({'query': promql})))
        assert reply['status'] == 'success', reply
        return [(r['metric'], float(r['value'][1]))
                for r in reply['data']['result']]

    def value(self, promql):
        found = self.query(promql)
        return found[0][1] if len(found) == 1 else found

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


class Exporter(object):
    """``libvirt-gpu exporter`` on the live host, its libvirt the test's
    daemon (``uri``; None: ``--no-libvirt``)."""

    def __init__(self, config, workdir, uri=None, name='exporter'):
        self.port = free_port()
        self.log = open(os.path.join(workdir, name + '.log'), 'w')
        where = ['-c', uri] if uri else []
        self.proc = subprocess.Popen(
            [sys.executable, '-m', 'libvirt_gpu.cmd.main', '--config-file',
             config] + where + ['exporter', '--port', str(self.port)]
            + ([] if uri else ['--no-libvirt']), stdout=self.log,
            stderr=subprocess.STDOUT, cwd=ls.REPO)
        self.url = 'http://127.0.0.1:%d/metrics' % self.port

    def ready(self):
        try:
            return 'libvirt_gpu_gpu_capacity' in get(self.url, timeout=5)
        except OSError:
            return False

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        finally:
            self.log.close()


@pytest.fixture(scope='module')
def host(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp('exporter'))
    setup = GatedSetup(workdir, T4_2B)
    with ls.LiveHost(workdir, hooks=setup.hooks, busy_remove='ebusy') as h:
        h.setup = setup
        h.workdir = workdir
        yield h


def cli(config, *argv):
    return subprocess.run(
        [sys.executable, '-m', 'libvirt_gpu.cmd.main', '--config-file',
         config] + list(argv), capture_output=True, text=True, timeout=300,
        cwd=ls.REPO)


def write_type(live, vf, number):
    """A vGPU of type ``number`` on ``vf``, as a guest start makes it."""
    with open(live.path('bus', 'pci', 'devices', vf, vendor_names.VENDOR_DIR,
                        vendor_names.CURRENT_TYPE), 'w') as f:
        f.write(str(number))


@pytest.fixture(scope='module')
def layout_hosts(tmp_path_factory):
    """``{profile: config}`` of the H100 and L40S hosts, at their
    layouts, each with one vGPU made on a GPU in a layout."""
    workdir = str(tmp_path_factory.mktemp('exporter-layouts'))
    with contextlib.ExitStack() as stack:
        configs = {}
        for profile, body in sorted(LAYOUTS.items()):
            live = stack.enter_context(ls.LiveSysfs(profile, uevents=False))
            config = os.path.join(workdir, profile + '.conf')
            with open(config, 'w') as f:
                f.write('[DEFAULT]\nstate_dir = %s\nsysfs_root = %s\n'
                        '[gpu]\nnvml = simulated\nlayouts = %s\n%s' % (
                            os.path.join(workdir, profile), live.root,
                            body[len('[layout_'):body.index(']')], body))
            done = cli(config, 'layout', 'apply')
            assert done.returncode == 0, done.stdout + done.stderr
            again = json.loads(cli(config, 'layout', 'apply',
                                   '--json').stdout)
            assert (again['done'], again['failed']) == (0, 0)
            configs[profile] = (config, live)
        write_type(configs['h100-80gb'][1], H100_VF, 1312)   # H100-3-40C
        write_type(configs['l40s'][1], L40S_VF, 1155)        # L40S-24Q
        yield workdir, {p: c for p, (c, _) in configs.items()}


# Series the exporters here serve without a value: the simulated driver
# takes no utilization samples of a vGPU (simulator/nvml.py,
# op_vgpu_samples), and the layout hosts' vGPUs are made behind our back
# (write_type: no record of ours, so NVML's vGPU instances join no vGPU of
# the host).  tests/unit/test_exporter.py checks both series on NVML's
# figures joined to a vGPU and its domain, test_dashboard.py the panels'
# queries against the series' labels.
NO_SAMPLES_HERE = ('libvirt_gpu_nvml_vgpu_utilization_ratio',
                   'libvirt_gpu_nvml_vgpu_fb_used_bytes')


def dashboard_queries():
    """``[(panel title, PromQL)]`` of the Grafana dashboard, its variables
    given the values Grafana would: every host, a 5-minute rate window,
    an hour's range."""
    with open(os.path.join(ls.REPO, 'etc', 'libvirt-gpu', 'grafana',
                           'libvirt-gpu.json')) as f:
        dashboard = json.load(f)
    values = (('$instance', '.*'), ('$__rate_interval', '5m'),
              ('$__range', '1h'))
    found = []
    for panel in dashboard['panels']:
        for target in panel['targets']:
            expr = target['expr']
            for name, value in values:
                expr = expr.replace(name, value)
            assert '$' not in expr, (panel['title'], expr)
            found.append((panel['title'], expr))
    return found


def start_and_fail(host, name, vgpus):
    """Define ``name`` with ``vgpus`` and start it: it cannot run here
    (no VFIO, or our hook refuses it); returns libvirt's message.  The
    domain stays defined, so that its name is known."""
    import libvirt
    dom = host.daemon.connect().defineXML(hg.guest_xml(name, vgpus))
    try:
        dom.create()
    except libvirt.libvirtError as e:
        return dom.UUIDString(), e.get_error_message()
    raise AssertionError('%s started' % name)


def test_prometheus_sees_capacity_holders_and_hook_counts(
        host, layout_hosts):
    exporter = Exporter(host.setup.config, host.workdir, host.daemon.uri)
    prom = None
    # the H100 and L40S hosts' exporters, scraped once the T4 host's
    # figures are checked
    workdir, configs = layout_hosts
    more = [Exporter(config, workdir, name='exporter-' + profile)
            for profile, config in sorted(configs.items())]
    try:
        assert poll.wait_for(exporter.ready, timeout=120), 'exporter not up'
        prom = Prometheus(host.workdir, '127.0.0.1:%d' % exporter.port)
        assert poll.wait_for(prom.ready, timeout=120), 'prometheus not up'
        assert poll.wait_for(lambda: prom.query(
            'libvirt_gpu_gpu_capacity'), timeout=120), 'nothing scraped'
        # before any guest: B holds the profile's two unleased vGPUs
        assert prom.value('sum(libvirt_gpu_gpu_free{type="%s"})'
                          % T4_2B) == 14

        # a guest starts (prepare: its vGPU is made) and stops (release)
        u1 = str(uuidlib.uuid4())
        _, said = start_and_fail(host, 'ok1', [(u1, T4_2B, None)])
        assert 'VFIO' in said
        # a guest asking for more than the host has is refused
        many = [(str(uuidlib.uuid4()), T4_2B, None) for _ in range(15)]
        _, said = start_and_fail(host, 'toomany', many)
        assert 'No capacity left for vGPU type %s' % T4_2B in said
        # a guest whose vGPU is busy when it stops: its release fails
        u3 = str(uuidlib.uuid4())
        result = {}
        starter = threading.Thread(target=lambda: result.update(
            held=start_and_fail(host, 'held', [(u3, T4_2B, B)])))
        starter.start()
        assert poll.wait_for(lambda: u3 in [
            m['uuid'] for m in host.live.state()['mdevs']], timeout=120)
        host.live.busy(u3)
        open(host.setup.gate, 'w').close()
        starter.join(120)
        held_uuid, said = result['held']
        assert 'VFIO' in said

        # wait for a scrape that has seen both releases
        assert poll.wait_for(lambda: prom.query(
            'libvirt_gpu_hook_calls_total{operation="release"} >= 2'),
            timeout=120), prom.query('libvirt_gpu_hook_calls_total')
        assert poll.wait_for(lambda: prom.query(
            'libvirt_gpu_dead_holder_leases == 1'), timeout=120)

        # capacity: how many T4-2B can this host still start?
        assert prom.value('sum(libvirt_gpu_gpu_free{type="%s"})'
                          % T4_2B) == 13
        assert prom.value('libvirt_gpu_gpu_used{gpu="%s"}' % B) == 3
        assert prom.value('libvirt_gpu_gpu_capacity{gpu="%s"}' % A) == 8
        assert prom.value('libvirt_gpu_type_available_instances{gpu="%s",'
                          'type="%s"}' % (B, T4_2B)) == 5
        # holders: which domains hold vGPUs on GPU B?
        holders = prom.query('count by (domain, domain_uuid, lease_state) '
                             '(libvirt_gpu_vgpu_info{gpu="%s",'
                             'domain_uuid!=""})' % B)
        assert holders == [({'domain': 'held', 'domain_uuid': held_uuid,
                             'lease_state': 'removing'}, 1.0)]
        assert prom.value('count(libvirt_gpu_vgpu_info{gpu="%s"})' % B) == 3
        # what reconcile --dry-run says: u3's lease (its hook is gone),
        # and the profile's two vGPUs no lease or domain explains
        assert prom.value('libvirt_gpu_unexplained_vgpus') == 2
        assert [labels['uuid'] for labels, _ in prom.query(
            'libvirt_gpu_reconcile_finding{what="mdev+lease"}')] == [u3]
        # the hook's counts, by operation
        calls = {labels['operation']: v for labels, v in prom.query(
            'libvirt_gpu_hook_calls_total')}
        assert calls['prepare'] == 3
        assert prom.value('libvirt_gpu_hook_refusals_total{operation='
                          '"prepare"}') == 1
        assert prom.value('libvirt_gpu_hook_errors_total{operation='
                          '"release"}') == 1
        assert prom.value('libvirt_gpu_hook_errors_total{operation='
                          '"prepare"}') == 0
        assert prom.value('sum(libvirt_gpu_hook_duration_seconds_count'
                          '{operation="prepare"})') == 3
        # the hook's error raises the alert at once (no `for:`)
        assert poll.wait_for(lambda: prom.query(
            'ALERTS{alertname="LibvirtGpuHookErrors",operation="release"}'),
            timeout=120)
        assert prom.value('min(libvirt_gpu_exporter_read_ok)') == 1

        # the H100 and L40S hosts join the scrape: their layouts
        for other in more:
            assert poll.wait_for(other.ready, timeout=120), 'not up'
        prom.scrape(['127.0.0.1:%d' % e.port for e in more])
        assert poll.wait_for(lambda: len(prom.query(
            'libvirt_gpu_gpu_layout_drift')) == 2 and prom.query(
            'libvirt_gpu_placements_used'), timeout=120), \
            prom.query('libvirt_gpu_exporter_read_ok')
        check_layouts(prom)
        # every panel of the Grafana dashboard has data to show, but those
        # of a series the simulated driver gives no values of: the
        # exporter serves its family (its HELP line), without samples
        scrapes = ''.join(get(e.url) for e in [exporter] + more)
        for title, expr in dashboard_queries():
            got = prom.query(expr)
            unsampled = [name for name in NO_SAMPLES_HERE if name in expr]
            if unsampled and not got:
                assert all('# HELP %s ' % name in scrapes
                           for name in unsampled), (title, expr)
                continue
            assert got and not all(math.isnan(v) for _, v in got), \
                (title, expr, got)
    finally:
        # the last scrape, kept beside the logs for whoever reads a failure
        try:
            with open(os.path.join(host.workdir, 'scrape.txt'), 'w') as f:
                f.write(get(exporter.url))
        except OSError:
            pass
        if prom is not None:
            prom.stop()
        for other in more:
            assert other.stop() == 0
        assert exporter.stop() == 0


def check_layouts(prom):
    """What the H100 and L40S hosts' exporters say of their layouts."""
    def by(promql, *labels):
        return {tuple(m[name] for name in labels): v
                for m, v in prom.query(promql)}
    # both at their layouts (a second apply did nothing): no drift
    assert by('libvirt_gpu_gpu_layout_drift', 'gpu', 'layout') == {
        (H100, 'h100'): 0, (L40S, 'l40s'): 0}
    assert by('libvirt_gpu_gpu_layout_steps', 'gpu') == {
        (H100,): 0, (L40S,): 0}
    # modes as the drivers report them; the L40S in no layout has no
    # drift series, and its mode
    assert by('libvirt_gpu_gpu_layout_mode{gpu!~"0000:(3b|af).*"}', 'gpu',
              'mode') == {(H100, 'mig'): 1, (L40S, 'mixed-size'): 1,
                          (L40S_HELD, 'time-sliced'): 1}
    # the H100's GPU instances: two 1g.10gb free, the 3g.40gb holding
    # the H100-3-40C made on its VF
    assert by('count by (profile) (libvirt_gpu_gpu_instance_info)',
              'profile') == {('1g.10gb',): 2, ('3g.40gb',): 1}
    assert by('sum by (profile, type) (libvirt_gpu_gpu_instance_vgpus_used)',
              'profile', 'type') == {('1g.10gb', 'nvidia-1308'): 0,
                                     ('3g.40gb', 'nvidia-1312'): 1}
    assert by('sum by (profile, type) (libvirt_gpu_gpu_instance_vgpus_free)',
              'profile', 'type') == {('1g.10gb', 'nvidia-1308'): 2,
                                     ('3g.40gb', 'nvidia-1312'): 0}
    # the L40S: its L40S-24Q holds a placement; the scheduler applied
    assert prom.value('libvirt_gpu_placements_used{gpu="%s",'
                      'type="nvidia-1155"}' % L40S) == 1
    assert prom.value('libvirt_gpu_placements_used{gpu="%s",'
                      'type="nvidia-1145"}' % L40S) == 0
    # 48 GB, 24 GB used: room for one more L40S-24Q
    assert prom.value('libvirt_gpu_placements_free{gpu="%s",'
                      'type="nvidia-1155"}' % L40S) == 1
    assert prom.value('libvirt_gpu_gpu_scheduler_info{gpu="%s",'
                      'policy="equal-share"}' % L40S) == 1
    assert prom.value('min(libvirt_gpu_exporter_read_ok{part="layout"})') \
        == 1
