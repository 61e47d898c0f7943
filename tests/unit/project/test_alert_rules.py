"""The alert rules shipped in etc/ (etc/libvirt-gpu/prometheus/), checked
by Prometheus' own ``promtool`` (Debian's ``prometheus`` package, which
the Makefile installs) on the made-up series of
tests/data/prometheus/alerts-test.yml."""

import os
import re
import shutil
import subprocess

import pytest

from libvirt_gpu import exporter
from tests.doubles import paths

ROOT = paths.ROOT
RULES = os.path.join(ROOT, 'etc', 'libvirt-gpu', 'prometheus',
                     'libvirt-gpu-alerts.yml')
RULE_TESTS = os.path.join(ROOT, 'tests', 'data', 'prometheus',
                          'alerts-test.yml')
PROMTOOL = shutil.which('promtool')
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason='promtool not installed (Debian package '
    'prometheus; `make deps` installs it)')


@needs_promtool
def test_the_rules_are_valid():
    done = subprocess.run([PROMTOOL, 'check', 'rules', RULES],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert 'SUCCESS: 6 rules found' in done.stdout


@needs_promtool
def test_the_rules_fire_where_they_must_on_made_up_series():
    done = subprocess.run([PROMTOOL, 'test', 'rules', RULE_TESTS],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
@pytest.mark.parametrize('alert', ['LibvirtGpuDeadHolderLeases',
                                   'LibvirtGpuLayoutDrift'])
def test_a_wrong_expectation_fails(tmp_path, alert):
    """The rule test can fail: the same tests expecting the alert at 14
    minutes, where the series say none yet."""
    with open(RULE_TESTS) as f:
        text = f.read().replace('../../../etc', os.path.join(ROOT, 'etc'))
    broken = tmp_path / 'alerts-test.yml'
    broken.write_text(text.replace(
        "      - eval_time: 14m\n        alertname: "
        "%s\n        exp_alerts: []" % alert,
        "      - eval_time: 14m\n        alertname: "
        "%s\n        exp_alerts:\n"
        "          - exp_labels: {severity: warning, instance: h1}"
        % alert))
    assert broken.read_text() != text
    done = subprocess.run([PROMTOOL, 'test', 'rules', str(broken)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0


def test_the_rules_use_only_series_the_exporter_serves():
    with open(RULES) as f:
        used = set(re.findall(r'\blibvirt_gpu_\w+', f.read()))
    with open(exporter.__file__) as f:
        source = f.read()
    served = {exporter.P + name for name in re.findall(
        r"(?:_gauge\(|P \+ )'(\w+)'", source)}
    served |= {name + '_total' for name in served}
    assert used and used <= served, used - served
