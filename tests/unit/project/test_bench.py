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
    ('list_phases.py', ['--runs', '1', '--parents', '2', '--types', '2']),
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


def _run_bench(argv, **kwargs):
    return subprocess.run([sys.executable] + argv, capture_output=True,
                          text=True, cwd=ROOT, timeout=300, **kwargs)


def test_list_phases_prints_each_phase_of_the_command():
    done = _run_bench([os.path.join(BENCH, 'list_phases.py'), '--runs', '1',
                       '--parents', '2', '--types', '2'])
    assert done.returncode == 0, done.stderr[-3000:]
    for phase in ('whole process', 'discovery: mdev types',
                  'JSON text and write', 'imports made by the command'):
        assert phase in done.stdout, done.stdout


def test_against_a_commit_that_is_not_there_is_one_line():
    done = _run_bench([os.path.join(BENCH, 'discovery.py'), '--whole-only',
                       '--against', 'no-such-ref-anywhere'])
    assert done.returncode == 1
    assert done.stderr == ('--against no-such-ref-anywhere: no such commit '
                           'in %s (a shallow clone may lack it: git fetch '
                           '--unshallow)\n' % ROOT)


def test_against_and_before_are_one_or_the_other():
    done = _run_bench([os.path.join(BENCH, 'hook.py'), '--before', ROOT,
                       '--against', 'HEAD'])
    assert done.returncode == 2
    assert 'not allowed with argument' in done.stderr


def test_against_writes_the_commit_s_tree_apart_and_removes_it():
    done = _run_bench(['-c', (
        'import os, sys; sys.path.insert(0, "bench"); import against\n'
        'with against.tree("HEAD") as (where, label):\n'
        '    print(where); print(label)\n'
        '    print(os.path.isfile(os.path.join(where, "libvirt_gpu", '
        '"__init__.py")))\n'
        '    print(os.path.exists(os.path.join(where, ".git")))\n')])
    assert done.returncode == 0, done.stderr[-3000:]
    where, label, package, git = done.stdout.splitlines()
    head = subprocess.run(['git', '-C', ROOT, 'rev-parse', 'HEAD'],
                          capture_output=True, text=True).stdout.strip()
    assert label == 'commit HEAD (%s)' % head[:7]
    assert (package, git) == ('True', 'False')
    assert not os.path.exists(where)
