"""The exporter's collector over a host's environment, and one scrape of
it read back through prometheus_client's own parser: ``collector``,
``scrape`` (``{(name, labels): value}``), ``value`` and ``series``; and
``every_family`` the exporter defines."""

from prometheus_client import parser as prom_parser

from libvirt_gpu import conf as conf_mod
from libvirt_gpu import environment
from libvirt_gpu import exporter
from libvirt_gpu.guests import reconcile
from libvirt_gpu.store import figures


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


def every_family():
    """Every family the exporter's family functions define, given an
    empty host."""
    empty = reconcile.Report(dry_run=True, findings=())
    groups = [
        exporter.gpu_families((), {}, {}, {}, (), None),
        exporter.vgpu_families({}, (), {}, None, {}),
        exporter.reconcile_families(empty),
        exporter.hook_families({}),
        exporter.task_families({t: None for t in figures.TASKS}),
        exporter.layout_families(()),
        exporter.nvml_families({}, {}),
    ]
    return [family for group in groups for family in group]
