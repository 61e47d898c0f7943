"""The Grafana dashboard queries only what the exporter serves."""

import json
import os
import re

import yaml

from libvirt_gpu import exporter
from tests.doubles import paths

REPO = paths.ROOT
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


# Labels Prometheus gives every series of a scrape, and a histogram's bucket
# bound.
SCRAPE_LABELS = {'instance', 'job'}
MATCHER = re.compile(r'([a-z_]+)\s*(?:=~|!~|!=|=)\s*"')
GROUPING = re.compile(r'\b(?:by|without)\s*\(([^)]*)\)')


def served_labels():
    """``{series name: its labels}`` of every family the exporter's family
    functions define (the catalog test's ``_families``)."""
    from tests.doubles import exporter_scrape
    found = {}
    for family in exporter_scrape.every_family():
        labels = set(family._labelnames) | SCRAPE_LABELS
        if family.type == 'counter':
            found[family.name + '_total'] = labels
        elif family.type == 'histogram':
            found[family.name + '_bucket'] = labels | {'le'}
            found[family.name + '_count'] = labels
            found[family.name + '_sum'] = labels
        else:
            found[family.name] = labels
    return found


def unknown_labels(expr, labels_of):
    """The labels ``expr`` selects on or groups by that a series it names
    lacks: ``{(series, label)}``."""
    used = set(MATCHER.findall(expr))
    for group in GROUPING.findall(expr):
        used |= {g.strip() for g in group.split(',') if g.strip()}
    return {(name, label) for name in METRIC.findall(expr)
            for label in used if label not in labels_of.get(name, ())}


def test_panels_select_and_group_only_by_labels_their_series_have():
    labels_of = served_labels()
    assert 'route' in labels_of['libvirt_gpu_vgpu_info']
    unknown = {(title,) + found for title, expr in expressions(load())
               for found in unknown_labels(expr, labels_of)}
    assert unknown == set()


def test_the_label_check_sees_a_label_the_series_lacks():
    labels_of = served_labels()
    assert unknown_labels(
        'count by (instance, route) (libvirt_gpu_gpu_free{mode="vgpu"})',
        labels_of) == {('libvirt_gpu_gpu_free', 'route')}
    assert unknown_labels(
        'libvirt_gpu_nvml_vgpu_fb_used_bytes{domian=~"vm.*"}',
        labels_of) == {('libvirt_gpu_nvml_vgpu_fb_used_bytes', 'domian')}
    assert unknown_labels('libvirt_gpu_no_such{gpu="x"}', labels_of) == {
        ('libvirt_gpu_no_such', 'gpu')}


def test_the_dashboard_shows_vgpus_by_route_and_each_domains_use():
    """Panels of the vGPUs by route, and of each domain's vGPU
    utilization and frame buffer (NVML's per-vGPU series)."""
    grouped = {}
    for _, expr in expressions(load()):
        for group in GROUPING.findall(expr):
            for name in METRIC.findall(expr):
                grouped.setdefault(name, set()).update(
                    g.strip() for g in group.split(','))
    assert 'route' in grouped.get('libvirt_gpu_vgpu_info', ())
    assert 'route' in grouped.get('libvirt_gpu_gpu_info', ())
    for series in ('libvirt_gpu_nvml_vgpu_utilization_ratio',
                   'libvirt_gpu_nvml_vgpu_fb_used_bytes'):
        assert 'domain' in grouped.get(series, ()), series
