"""The exporter's collector over a host's environment, and one scrape of
it read back through prometheus_client's own parser: ``collector``,
``scrape`` (``{(name, labels): value}``), ``value`` and ``series``."""

from prometheus_client import parser as prom_parser

from libvirt_gpu import conf as conf_mod
from libvirt_gpu import environment
from libvirt_gpu import exporter


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
