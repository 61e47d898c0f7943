"""The benchmarks run as docs/dev/benchmarks.md says, whatever ``TMPDIR``
says: under the default /tmp (writable by anyone) a state directory is
refused, so each script keeps its files in the private directory the
tests use (tests/private_tmp.py)."""

import ast
import os
import subprocess
import sys

import pytest
from tests.doubles import paths

ROOT = paths.ROOT
BENCH = os.path.join(ROOT, 'bench')


@pytest.fixture
def public_tmp(tmp_path):
    """A directory like /tmp: writable by anyone, sticky."""
    path = tmp_path / 'public'
    path.mkdir()
    path.chmod(0o1777)
    return path


@pytest.mark.parametrize('script, argv', [
    ('hook.py', ['--runs', '1', '--prepare-runs', '1', '--record-runs', '1']),
    ('exporter.py', ['--runs', '1', '--block', '1']),
])
def test_a_benchmark_runs_with_tmpdir_world_writable(public_tmp, script,
                                                     argv):
    env = dict(os.environ, TMPDIR=str(public_tmp))
    done = subprocess.run([sys.executable, os.path.join(BENCH, script)]
                          + argv, capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert 'Traceback' not in done.stderr
    assert os.listdir(public_tmp) == []


def _calls_use_private_tmp(tree):
    return any(isinstance(node, ast.Call)
               and isinstance(node.func, ast.Attribute)
               and node.func.attr == 'use_private_tmp'
               for node in ast.walk(tree))


def test_every_benchmark_that_makes_temporary_files_uses_the_private_tmp():
    # the ones that need root or FUSE (hook_mig.py, discovery.py's
    # namespace) or Placement (fleet.py) are not run above
    scripts = sorted(n for n in os.listdir(BENCH) if n.endswith('.py'))
    makes = []
    for name in scripts:
        with open(os.path.join(BENCH, name)) as f:
            tree = ast.parse(f.read())
        imported = {alias.name for node in ast.walk(tree)
                    if isinstance(node, ast.Import) for alias in node.names}
        if 'tempfile' in imported:
            makes.append(name)
            assert _calls_use_private_tmp(tree), name
    assert {'hook.py', 'exporter.py', 'hook_mig.py', 'discovery.py',
            'fleet.py'} <= set(makes)
