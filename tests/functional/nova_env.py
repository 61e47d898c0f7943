"""OpenStack Nova (34.0.0, from PyPI) for the functional tests of the Nova
route: its own code judges what libvirt-gpu gives it.

Nova lives in its own virtual environment, ``.venv-nova`` (``make -f
Makefile.nova nova-venv``; ``LIBVIRT_GPU_NOVA_VENV`` names another one).
No Nova service runs: ``judge()`` runs ``tests/functional/nova_probe.py``
with that venv's python, which imports Nova's modules and answers one
JSON line (its module doc says what each step runs).
"""

import json
import os
import subprocess

from tests.doubles import venvs

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
VENV_ENV = 'LIBVIRT_GPU_NOVA_VENV'
PROBE = os.path.join(REPO, 'tests', 'functional', 'nova_probe.py')
# Our hook, our CLI and this file never import Nova: only the probe does.
CONF_NAME = '50-libvirt-gpu.conf'
# What Nova needs besides what nova-config prints (nova's PCI-in-Placement
# guide): the scheduler's and the compute's switch.
NOVA_CONF = """\
[filter_scheduler]
pci_in_placement = true

[pci]
report_in_placement = true
"""


class NovaError(RuntimeError):
    """Nova could not be installed, or the probe failed."""


def venv_path():
    return os.environ.get(VENV_ENV) or os.path.join(REPO, '.venv-nova')


def ensure_venv():
    """Return (venv path, seconds spent installing)."""
    venv = venv_path()
    if os.environ.get(VENV_ENV):
        if not os.path.exists(os.path.join(venv, 'bin', 'python')):
            raise NovaError('%s=%s has no bin/python; install nova==34.0.0 '
                            'and libvirt-python there' % (VENV_ENV, venv))
        return venv, 0.0
    return venvs.install(venv, 'Makefile.nova', 'nova-venv', 'NOVA_VENV',
                         '.nova-stamp', NovaError, 'nova')


class Judge(object):
    """One Nova configuration (``nova.conf`` plus a ``nova.conf.d`` with
    one file of ours) in ``workdir``, and the probe that reads it."""

    def __init__(self, venv, workdir):
        self.venv = venv
        self.workdir = os.fspath(workdir)
        self.conf_dir = os.path.join(self.workdir, 'nova.conf.d')
        self.conf_file = os.path.join(self.workdir, 'nova.conf')
        os.makedirs(self.conf_dir, exist_ok=True)
        with open(self.conf_file, 'w') as f:
            f.write(NOVA_CONF)
        self.runs = 0

    def write(self, fragment):
        """Drop ``fragment`` (what ``libvirt-gpu nova-config`` printed)
        into the ``nova.conf.d`` directory; returns its path."""
        path = os.path.join(self.conf_dir, CONF_NAME)
        with open(path, 'w') as f:
            f.write(fragment)
        return path

    def run(self, steps, **request):
        """The probe's answer (a dict); ``{'refused': ...}`` when Nova
        refused the configuration."""
        self.runs += 1
        path = os.path.join(self.workdir, 'request-%d.json' % self.runs)
        with open(path, 'w') as f:
            json.dump(dict(request, steps=list(steps),
                           conf_dir=self.conf_dir,
                           conf_file=self.conf_file), f)
        result = subprocess.run(
            [os.path.join(self.venv, 'bin', 'python'), PROBE, path],
            capture_output=True, text=True, timeout=300, cwd=self.workdir,
            env=dict(os.environ, PYTHONWARNINGS='ignore'))
        if result.returncode not in (0, 2):
            raise NovaError('the Nova probe failed (exit %d):\n%s'
                            % (result.returncode, result.stderr[-6000:]))
        lines = result.stdout.strip().splitlines()
        if not lines:
            raise NovaError('the Nova probe printed nothing:\n%s'
                            % result.stderr[-6000:])
        return json.loads(lines[-1])
