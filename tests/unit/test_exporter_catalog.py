"""Every series the exporter defines is in docs/admin/metrics.md's table
under its full name, with exactly the labels it has: dashboards, alerts
and operators' queries are written against that table, so a label
renamed, dropped or added in the code (or a series left out of the
table) fails here."""

import os
import re

import pytest

from tests.doubles import paths
from tests.doubles.exporter_scrape import every_family as _families

METRICS_MD = os.path.join(paths.ROOT, 'docs', 'admin', 'metrics.md')


def _exposed(family):
    """The name a family's samples carry (a counter's with ``_total``)."""
    return family.name + ('_total' if family.type == 'counter' else '')


def _rows():
    """``[(names, labels)]`` of the table: each row's series (a name
    given as ``_suffix`` shares the first name's beginning) and labels."""
    rows = []
    with open(METRICS_MD) as f:
        for line in f:
            if not line.startswith('| `libvirt_gpu_'):
                continue
            cells = line.split('|')
            names = re.findall(r'`([a-z_]+)`', cells[1])
            labels = tuple(re.findall(r'`([a-z_]+)`', cells[2]))
            rows.append((names, labels))
    return rows


def _row_of(name, rows):
    for names, labels in rows:
        first = names[0]
        for given in names:
            if given == name:
                return labels
            if given.startswith('_') and name.endswith(given) \
                    and first.startswith(name[:-len(given)]):
                return labels
    return None


def test_the_family_functions_define_every_family_once():
    names = [f.name for f in _families()]
    assert len(names) == len(set(names))
    assert len(names) >= 30


@pytest.mark.parametrize('family', _families(), ids=lambda f: f.name)
def test_each_series_is_in_the_table_with_its_labels(family):
    labels = _row_of(_exposed(family), _rows())
    assert labels is not None, '%s is not in %s' % (
        _exposed(family), METRICS_MD)
    assert tuple(family._labelnames) == labels


def test_the_table_names_no_series_the_exporter_lacks():
    served = {_exposed(f) for f in _families()} | {
        'libvirt_gpu_exporter_read_ok'}          # made by collect itself
    for names, _ in _rows():
        first = names[0]
        for given in names:
            if given.startswith('_'):
                assert any(s.endswith(given) and first.startswith(
                    s[:-len(given)]) for s in served), (given, first)
            else:
                assert given in served, given
