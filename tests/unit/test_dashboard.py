"""The Grafana dashboard queries only what the exporter serves."""

import json
import os
import re

import yaml

from libvirt_gpu import exporter

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
GRAFANA = os.path.join(REPO, 'etc', 'libvirt-gpu', 'grafana')
DASHBOARD = os.path.join(GRAFANA, 'libvirt-gpu.json')
METRIC = re.compile(r'\blibvirt_gpu_[a-z_]+\b')


def load():
    with open(DASHBOARD) as f:
        return json.load(f)


def expressions(dashboard):
    """``[(panel title, expr)]`` of every panel's queries."""
    return [(panel['title'], target['expr'])
            for panel in dashboard['panels']
            for target in panel['targets']]


def served_names():
    """Every series name the exporter's source declares: gauges by name,
    counters with ``_total``, histograms with their three series."""
    with open(exporter.__file__) as f:
        source = f.read()
    names = set()
    for kind, name in re.findall(
            r"(_gauge|GaugeMetricFamily|CounterMetricFamily|"
            r"HistogramMetricFamily)\(\s*(?:P \+ )?'([a-z_]+)'", source):
        name = 'libvirt_gpu_' + name
        if kind == 'CounterMetricFamily':
            names.add(name + '_total')
        elif kind == 'HistogramMetricFamily':
            names.update(name + s for s in ('_bucket', '_count', '_sum'))
        else:
            names.add(name)
    return names


def test_every_panel_has_a_query_and_a_prometheus_source():
    dashboard = load()
    assert dashboard['uid'] == 'libvirt-gpu'
    assert dashboard['panels']
    for panel in dashboard['panels']:
        assert panel['targets'], panel['title']
        assert panel['datasource']['type'] == 'prometheus', panel['title']
        for target in panel['targets']:
            assert METRIC.search(target['expr']), (panel['title'], target)
    ids = [p['id'] for p in dashboard['panels']]
    assert len(ids) == len(set(ids))


def test_panels_query_only_series_the_exporter_serves():
    served = served_names()
    assert 'libvirt_gpu_gpu_free' in served
    assert 'libvirt_gpu_hook_calls_total' in served
    assert 'libvirt_gpu_hook_duration_seconds_bucket' in served
    unknown = {(title, name) for title, expr in expressions(load())
               for name in METRIC.findall(expr) if name not in served}
    assert unknown == set()


def test_the_dashboard_covers_what_an_operator_asks():
    queried = {name for _, expr in expressions(load())
               for name in METRIC.findall(expr)}
    for needed in ('libvirt_gpu_gpu_free', 'libvirt_gpu_gpu_capacity',
                   'libvirt_gpu_vgpu_info',
                   'libvirt_gpu_hook_duration_seconds_bucket',
                   'libvirt_gpu_hook_errors_total',
                   # layouts: drift, and room in GPU instances and at
                   # placements, by profile and type
                   'libvirt_gpu_gpu_layout_drift',
                   'libvirt_gpu_gpu_instance_vgpus_free',
                   'libvirt_gpu_placements_free'):
        assert needed in queried, needed


def test_no_two_panels_overlap():
    cells = set()
    for panel in load()['panels']:
        pos = panel['gridPos']
        here = {(x, y) for x in range(pos['x'], pos['x'] + pos['w'])
                for y in range(pos['y'], pos['y'] + pos['h'])}
        assert not here & cells, panel['title']
        assert pos['x'] + pos['w'] <= 24, panel['title']
        cells |= here


def test_the_host_variable_is_used_by_every_query():
    dashboard = load()
    names = [v['name'] for v in dashboard['templating']['list']]
    assert names == ['datasource', 'instance']
    for title, expr in expressions(dashboard):
        assert 'instance=~"$instance"' in expr, title


def test_provisioning_file_points_grafana_at_the_documented_path():
    with open(os.path.join(GRAFANA, 'libvirt-gpu-dashboards.yaml')) as f:
        provisioning = yaml.safe_load(f)
    [provider] = provisioning['providers']
    assert provider['type'] == 'file'
    path = provider['options']['path']
    with open(os.path.join(REPO, 'docs', 'admin', 'metrics.md')) as f:
        assert 'install -d %s\n' % path in f.read()
