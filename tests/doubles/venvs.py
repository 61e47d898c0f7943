"""The private virtual environments of the functional tests' OpenStack
services (``.venv-cyborg``, ``.venv-nova`` ...), each made by its own
``Makefile.<service>`` target and marked done by a stamp file in it."""

import os
import subprocess
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def install(venv, makefile, target, variable, stamp, error, what):
    """``(venv, seconds spent installing)``: nothing is done when the
    ``stamp`` file is in ``venv``; else ``make -s -f <makefile> <target>
    <variable>=<venv>`` in this checkout makes it (15 minutes at most),
    and ``error`` (an exception class) is raised with make's output,
    naming ``what`` was being installed, when that fails."""
    if os.path.exists(os.path.join(venv, stamp)):
        return venv, 0.0
    start = time.monotonic()
    result = subprocess.run(
        ['make', '-s', '-f', makefile, target, '%s=%s' % (variable, venv)],
        cwd=REPO, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        raise error('installing %s into %s failed:\n%s%s'
                    % (what, venv, result.stdout, result.stderr))
    return venv, time.monotonic() - start
