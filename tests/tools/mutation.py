"""``make mutation``: mutmut on the modules a change touches.

    python tests/tools/mutation.py [--base REF] [--modules M ...]
                                   [--tests T ...] [--jobs N] [--keep]
                                   [--sample N [--seed S]] [--exclude P ...]
                                   [--ignore-tests T ...]
                                   [--only GLOB ...]

The modules: those named (``libvirt_gpu/util/bounds.py`` or
``libvirt_gpu.util.bounds``), else every ``libvirt_gpu`` module changed since
the merge base with ``--base`` (default ``origin/main``, else ``main``),
committed or not.  The tests: those named, else for each module the unit
tests named after it in the folder of ``tests/unit/`` that mirrors its
package (``tests/unit/devices/test_layout.py``, ``test_layout_*.py``
for ``libvirt_gpu/devices/layout.py``), and the unit tests that import
it.  Small on purpose: mutmut first runs the selection once to learn
which test calls which function, then runs, for each mutant, the tests
that call it.

mutmut's own settings are in setup.cfg's ``[mutmut]``; the modules and
the tests are set here, on mutmut's loaded configuration (``only_mutate``
and ``pytest_add_cli_args_test_selection``), so that nothing tracked
changes during a run.  mutmut works in ``mutants/`` (a copy of the tree,
ignored by git), emptied first unless ``--keep``.

``--sample N`` runs N mutants drawn at random (``--seed``, default 1)
from all those of the modules instead of every one: on many modules, an
estimate of the ratio in minutes where the whole takes hours.  The ratio
is then printed with its 95% interval (Wilson).  ``--exclude`` leaves out
the modules under a path (``libvirt_gpu/simulator``); ``--ignore-tests``
leaves test files (or ``file::test`` ids) out of a folder named in
``--tests``: those that read the package's source or count the modules a
program imports, which mutmut's rewritten copy changes.  ``--only`` runs
and counts only the mutants whose names match one of the globs
(``'*ǁAllocatorǁreserve_incoming__mutmut_*'``: one function's).

A test that starts Python (the CLI as ``python -m libvirt_gpu.cmd.main``,
a probe with ``-c``) counts as calling what that Python calls: while
mutmut learns which test calls which function, every Python started
without ``-I`` finds ``mutants/`` and a ``sitecustomize`` first on its
path (``PYTHONPATH``) that writes down the functions it called, and they
are added to the test that started it.  Its mutants then run with those
tests, the started Python importing the mutated copy.

Prints, per module and in all, the kill ratio (killed, timed out or
caught, over every mutant tried) and the surviving mutants; ``mutmut
show NAME`` prints one's diff.  Exits 0 whatever the ratio (a report,
not a gate), 2 when nothing could be run.
"""

import argparse
import fnmatch
import math
import os
import random
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
PACKAGE = 'libvirt_gpu'
UNIT = os.path.join('tests', 'unit')
KILLED = ('killed', 'timeout', 'caught by type check', 'segfault')
NOT_TRIED = ('not checked', 'skipped', 'check was interrupted by user')


def _git(*args):
    return subprocess.run(['git'] + list(args), cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout.split()


def _base(ref):
    for candidate in ([ref] if ref else ['origin/main', 'main']):
        try:
            _git('rev-parse', '--verify', '-q', candidate + '^{commit}')
            return candidate
        except subprocess.CalledProcessError:
            continue
    sys.exit('mutation: no base %s to compare with: name one (BASE=REF) '
             'or name the modules (MODULES=...)' % (ref or 'origin/main'))


def changed_modules(ref):
    """``libvirt_gpu`` modules changed since the merge base with ``ref``,
    in the working tree (committed, staged or not) or new."""
    base = _git('merge-base', _base(ref), 'HEAD')[0]
    names = set(_git('diff', '--name-only', '--diff-filter=d', base, '--',
                     PACKAGE))
    names |= set(_git('ls-files', '--others', '--exclude-standard', '--',
                      PACKAGE))
    return sorted(n for n in names if n.endswith('.py')
                  and os.path.isfile(os.path.join(ROOT, n)))


def module_path(name):
    """``libvirt_gpu/x/y.py`` for a path or a dotted name."""
    path = name if name.endswith('.py') else name.replace('.', '/') + '.py'
    path = os.path.relpath(os.path.join(ROOT, path), ROOT)
    if not (path.startswith(PACKAGE + os.sep)
            and os.path.isfile(os.path.join(ROOT, path))):
        sys.exit('mutation: %s is not a module of %s' % (name, PACKAGE))
    return path


def _imports(text, path):
    """Whether test source ``text`` imports the module at ``path``."""
    parts = path[:-3].split(os.sep)
    if parts[-1] == '__init__':
        parts = parts[:-1]
    dotted = '.'.join(parts)
    parent, leaf = '.'.join(parts[:-1]), parts[-1]
    patterns = [r'^\s*import %s\b' % re.escape(dotted),
                r'^\s*from %s import' % re.escape(dotted)]
    if parent:
        patterns.append(r'^\s*from %s import (\(\s*)?([\w, \t]*\b)?%s\b'
                        % (re.escape(parent), re.escape(leaf)))
    return any(re.search(p, text, re.M) for p in patterns)


def tests_for(path):
    """The unit tests of the module at ``path`` (see the module doc):
    ``tests/unit/`` mirrors the package, so ``libvirt_gpu/devices/layout.py``
    has ``tests/unit/devices/test_layout.py`` and ``test_layout_*.py``, a
    package's ``__init__`` (``libvirt_gpu/guests/hook/__init__.py``)
    ``tests/unit/guests/hook/test_hook*.py``; with them, every unit test
    file that imports the module."""
    unit = os.path.join(ROOT, UNIT)
    parts = path[:-3].split(os.sep)[1:]
    if parts and parts[-1] == '__init__':
        parts = parts[:-1]
        folder, leaf = parts, (parts[-1] if parts else PACKAGE)
    else:
        folder, leaf = parts[:-1], parts[-1]
    mirror = os.path.join(unit, *folder)
    found = []
    for directory, dirs, files in os.walk(unit):
        dirs.sort()
        for f in sorted(files):
            if not (f.startswith('test_') and f.endswith('.py')):
                continue
            full = os.path.join(directory, f)
            if directory == mirror and (f == 'test_%s.py' % leaf
                                        or f.startswith('test_%s_' % leaf)):
                found.append(full)
                continue
            with open(full) as fh:
                if _imports(fh.read(), path):
                    found.append(full)
    return [os.path.relpath(f, ROOT) for f in found]


def _results(paths):
    """``{module path: {mutant name: status}}`` from mutants/."""
    from mutmut.mutation.data import SourceFileMutationData
    from mutmut.stats import status_by_exit_code
    found = {}
    for path in paths:
        data = SourceFileMutationData(path=path)
        try:
            data.load()
        except FileNotFoundError:
            found[path] = {}
            continue
        found[path] = {name: status_by_exit_code[code]
                       for name, code in data.exit_code_by_key.items()}
    return found


def wilson(killed, tried, z=1.96):
    """The 95% interval (Wilson score) of a ratio of ``killed`` in
    ``tried`` drawn at random, as fractions ``(low, high)``."""
    if not tried:
        return 0.0, 1.0
    p = float(killed) / tried
    centre = (p + z * z / (2 * tried)) / (1 + z * z / tried)
    half = (z / (1 + z * z / tried)) * math.sqrt(
        p * (1 - p) / tried + z * z / (4.0 * tried * tried))
    return max(0.0, centre - half), min(1.0, centre + half)


def draw(names, count, seed):
    """``count`` of ``names`` at random, the same for the same seed."""
    names = sorted(names)
    if count >= len(names):
        return names
    return sorted(random.Random(seed).sample(names, count))


def selected(found, globs):
    """``found`` (``{module path: {mutant name: status}}``) with only
    the mutants whose names match one of ``globs`` (all when none)."""
    if not globs:
        return found
    return {path: {name: status for name, status in statuses.items()
                   if any(fnmatch.fnmatchcase(name, g) for g in globs)}
            for path, statuses in found.items()}


def report(found, out=sys.stdout, sampled=False):
    """Print the ratio per module and in all; returns (killed, tried)."""
    all_killed = all_tried = 0
    survivors = []
    for path, statuses in sorted(found.items()):
        tried = {n: s for n, s in statuses.items() if s not in NOT_TRIED}
        killed = sum(1 for s in tried.values() if s in KILLED)
        all_killed += killed
        all_tried += len(tried)
        ratio = '%5.1f%%' % (100.0 * killed / len(tried)) if tried else '  n/a'
        print('%s  %4d/%-4d killed  %s' % (ratio, killed, len(tried), path),
              file=out)
        survivors += sorted((n, s) for n, s in tried.items()
                            if s not in KILLED)
    if all_tried:
        print('%5.1f%%  %4d/%-4d killed  in all'
              % (100.0 * all_killed / all_tried, all_killed, all_tried),
              file=out)
        if sampled:
            low, high = wilson(all_killed, all_tried)
            print('        95%% interval %.1f%% to %.1f%% (a random sample; '
                  'per-module figures are rough)'
                  % (100 * low, 100 * high), file=out)
    if survivors:
        print('\nsurvivors (`.venv/bin/mutmut show NAME` for the diff):',
              file=out)
        for name, status in survivors:
            print('  %-14s %s' % (status, name), file=out)
    return all_killed, all_tried


def selection(tests, ignored=()):
    """pytest's arguments for ``tests`` less ``ignored`` (files, or
    ``file::test`` ids)."""
    return list(tests) + [('--deselect=%s' if '::' in t else '--ignore=%s')
                          % t for t in ignored]


HITS_ENV = 'LIBVIRT_GPU_MUTATION_HITS'
# Written to mutants/.child-site/sitecustomize.py (see the docstring).
CHILD_SITE = '''\
"""Written by tests/tools/mutation.py: while mutmut learns which test
calls which function, a Python a test starts writes down the functions
it called, one file per process in $%(env)s."""
import atexit
import os


def _record():
    where = os.environ.get(%(env)r)
    if not where or os.environ.get('MUTANT_UNDER_TEST') != 'stats':
        return
    try:
        from mutmut.mutation import trampoline
    except ImportError:
        return
    hits = set()

    def hit(name, caller=None):
        hits.add(name)

    def save():
        if hits:
            path = os.path.join(where, '%%d.hits' %% os.getpid())
            with open(path + '.tmp', 'w') as f:
                f.write('\\n'.join(sorted(hits)))
            os.rename(path + '.tmp', path)

    trampoline.record_trampoline_hit = hit
    atexit.register(save)


_record()
''' % {'env': HITS_ENV}


class ChildHits:
    """A pytest plugin: before mutmut's own collector reads what a test
    called, add what the Pythons it started called (their ``.hits``
    files, removed once read)."""

    def __init__(self, where, stats):
        self.where = where
        self.stats = stats

    def take(self):
        for name in sorted(os.listdir(self.where)):
            if name.endswith('.hits'):
                path = os.path.join(self.where, name)
                with open(path) as f:
                    self.stats.update(f.read().split())
                os.unlink(path)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_teardown(self, item, nextitem):
        self.take()


def child_hits(mutants):
    """Make the Pythons that tests start during mutmut's run find
    ``mutants`` and record their calls; return the folder of records."""
    site = os.path.join(mutants, '.child-site')
    where = os.path.join(mutants, '.child-hits')
    for folder in (site, where):
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
    with open(os.path.join(site, 'sitecustomize.py'), 'w') as f:
        f.write(CHILD_SITE)
    path = [site, mutants] + [p for p in os.environ.get(
        'PYTHONPATH', '').split(os.pathsep) if p]
    os.environ['PYTHONPATH'] = os.pathsep.join(path)
    os.environ[HITS_ENV] = where
    return where


def _collect_child_hits(where):
    from mutmut.runners import harness
    from mutmut.state import state
    plugin = ChildHits(where, state()._stats)
    execute = harness.PytestRunner.execute_pytest

    def execute_pytest(self, params, **kwargs):
        plugin.stats = state()._stats
        kwargs['plugins'] = list(kwargs.get('plugins') or []) + [plugin]
        return execute(self, params, **kwargs)

    harness.PytestRunner.execute_pytest = execute_pytest


def _generate(jobs):
    """Make mutants/ the way ``mutmut run`` begins, and name every
    mutant of the configured modules."""
    from mutmut import __main__ as m
    m.set_mutant_under_test('mutant_generation')
    os.makedirs('mutants', exist_ok=True)
    m.copy_src_dir()
    m.copy_also_copy_files()
    m.setup_source_paths()
    m.store_lines_covered_by_tests()
    m.create_mutants(jobs)
    mutants, _ = m.collect_source_file_mutation_data(mutant_names=())
    return [name for _, name, _ in mutants]


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n\n')[0])
    parser.add_argument('--base', default=None)
    parser.add_argument('--modules', nargs='*', default=None)
    parser.add_argument('--tests', nargs='*', default=None)
    parser.add_argument('--jobs', type=int, default=2)
    parser.add_argument('--keep', action='store_true')
    parser.add_argument('--sample', type=int, default=None, metavar='N')
    parser.add_argument('--seed', type=int, default=1)
    parser.add_argument('--exclude', nargs='*', default=[], metavar='PATH')
    parser.add_argument('--ignore-tests', nargs='*', default=[],
                        metavar='PATH')
    parser.add_argument('--only', nargs='*', default=[], metavar='GLOB')
    args = parser.parse_args(argv)
    if args.sample is not None and args.sample < 1:
        parser.error('--sample takes a count of mutants, 1 or more')
    os.chdir(ROOT)
    if args.modules:
        paths = sorted({module_path(m) for m in args.modules})
    else:
        paths = changed_modules(args.base)
    excluded = [os.path.normpath(e) + os.sep for e in args.exclude]
    paths = [p for p in paths
             if not any((p + os.sep).startswith(e) or p.startswith(e)
                        for e in excluded)]
    if not paths:
        print('mutation: no %s module changed; name some (MODULES=...)'
              % PACKAGE)
        return 0
    tests = list(args.tests or [])
    if not tests:
        for path in paths:
            found = tests_for(path)
            if not found:
                print('mutation: no unit test imports %s' % path)
            tests += [t for t in found if t not in tests]
    if not tests:
        print('mutation: no tests to run; name some (TESTS=...)')
        return 2
    print('mutation: modules %s' % ' '.join(paths))
    print('mutation: tests   %s' % ' '.join(tests))
    if not args.keep:
        shutil.rmtree('mutants', ignore_errors=True)

    from mutmut import configuration
    from mutmut import __main__ as mutmut_main
    config = configuration.config()
    config.only_mutate = list(paths)
    config.pytest_add_cli_args_test_selection = selection(
        tests, args.ignore_tests)
    # mutmut's copy of a module holds every mutant of it (tens of times
    # the source): a test that starts Python anew compiles it again unless
    # the bytecode is kept.
    os.environ.pop('PYTHONDONTWRITEBYTECODE', None)
    # mutmut copies tests/ following links, and the captured sysfs trees
    # of tests/data link in cycles (a device's driver links back to it):
    # copied here instead, links as links.
    config.also_copy = [p for p in config.also_copy
                        if os.path.normpath(str(p)) != 'tests']
    # Tests that read the tree (the docs, the Makefile, bench/) find it
    # in mutants/ as in the checkout: every tracked top-level entry.
    copied = {os.path.normpath(str(p)) for p in config.also_copy}
    for top in sorted(set(n.split('/')[0] for n in _git('ls-files'))):
        if top not in copied | {PACKAGE, 'tests', 'mutants'}:
            config.also_copy.append(top)
    shutil.rmtree(os.path.join('mutants', 'tests'), ignore_errors=True)
    shutil.copytree('tests', os.path.join('mutants', 'tests'),
                    symlinks=True,
                    ignore=shutil.ignore_patterns('__pycache__'))
    _collect_child_hits(child_hits(os.path.abspath('mutants')))
    names = list(args.only)
    if args.sample:
        population = [n for n in _generate(args.jobs)
                      if not args.only or any(fnmatch.fnmatchcase(n, g)
                                              for g in args.only)]
        names = draw(population, args.sample, args.seed)
        print('mutation: %d mutants drawn (seed %d) of %d'
              % (len(names), args.seed, len(population)))
    try:
        mutmut_main.cli(['run', '--max-children', str(args.jobs)] + names,
                        standalone_mode=False)
    except SystemExit as e:
        if e.code not in (0, None):
            print('mutation: mutmut stopped (exit %s)' % e.code)
            return 2
    print()
    killed, tried = report(selected(_results(paths), args.only),
                           sampled=bool(args.sample))
    return 0 if tried else 2


if __name__ == '__main__':
    sys.exit(main())
