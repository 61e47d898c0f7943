"""The suite's own shape.  What makes a test look run when it is not: a
fixture named like a test (``def test_x`` under ``@pytest.fixture``) reads
as a test in a listing, and pytest never collects it.  tests/unit/
mirrors the package, and no test file imports another (both below)."""

import ast
import os
import re

from tests.doubles import paths

ROOT = paths.ROOT
# a fixture decorator, maybe more decorators, then a def named test...
_FIXTURE_TEST = re.compile(
    r'^@(?:pytest\.)?fixture\b[^\n]*\n(?:(?:@|\s)[^\n]*\n)*?'
    r'def (test\w*)\(', re.M)


def fixtures_named_like_tests(top):
    found = []
    for folder, dirs, files in os.walk(top):
        dirs[:] = sorted(d for d in dirs if d not in ('data', '__pycache__'))
        for name in sorted(files):
            if name.endswith('.py'):
                path = os.path.join(folder, name)
                with open(path) as f:
                    found += ['%s::%s' % (os.path.relpath(path, top), m)
                              for m in _FIXTURE_TEST.findall(f.read())]
    return found


def test_no_fixture_is_named_like_a_test():
    assert fixtures_named_like_tests(os.path.join(ROOT, 'tests')) == []


def test_the_fixture_check_sees_one(tmp_path):
    (tmp_path / 'test_x.py').write_text(
        'import pytest\n\n\n@pytest.fixture\ndef test_conf(tmp_path):\n'
        '    return tmp_path\n\n\n@pytest.fixture(scope="module")\n'
        'def test_other():\n    pass\n\n\ndef test_real(test_conf):\n'
        '    pass\n')
    assert fixtures_named_like_tests(str(tmp_path)) == [
        'test_x.py::test_conf', 'test_x.py::test_other']


def test_a_socket_binds_below_the_af_unix_limit(tmp_path):
    # tests/doubles/sockets.py: a socket file at a path longer than an
    # AF_UNIX address may be, as a clone under /tmp makes tmp_path
    import stat
    from tests.doubles import sockets
    deep = tmp_path / ('d' * 60) / ('e' * 60)
    deep.mkdir(parents=True)
    path = deep / 'nova.sock'
    assert len(str(path)) > 108
    with sockets.unix_socket(path) as sock:
        assert stat.S_ISSOCK(os.lstat(path).st_mode)
        sock.listen(1)
    assert stat.S_ISSOCK(os.lstat(sockets.make_socket_file(
        deep / 'other')).st_mode)


# --- tests/unit/ mirrors the package -----------------------------------------
#
# tests/unit/<folder>/test_<module>.py tests libvirt_gpu/<folder>/<module>.py
# (test_<module>_<aspect>.py for a further file of the same module), a
# package's __init__ is tested by test_<package>*.py in its own folder, and
# the root modules' tests are at the top.  tests/unit/doubles/ and
# tests/unit/tools/ mirror tests/doubles/ and tests/tools/ the same way.
# The mutation-killing tests of a module are in its file, never in a
# test_mutation_* file of their own.

UNIT = os.path.join(ROOT, 'tests', 'unit')
MIRRORED = {'doubles': os.path.join(ROOT, 'tests', 'doubles'),
            'tools': os.path.join(ROOT, 'tests', 'tools')}

# Files that test no one module: the project's own checks and the fuzzing
# of several modules' inputs at once.
CROSS_CUTTING = {
    'project/test_alert_rules.py',     # etc/ alert rules under promtool
    'project/test_architecture.py',    # the rooms and doors of the package
    'project/test_bench.py',           # bench/ runs as documented
    'project/test_dashboard.py',       # the Grafana dashboard's queries
    'project/test_docs.py',            # README and docs/ against the code
    'project/test_edge.py',            # values parsed at every edge
    'project/test_hardening.py',       # bounded work on every input
    'project/test_rules_once.py',      # each rule written in one place
    'project/test_suite_hygiene.py',   # this file
    'project/test_typed_values.py',    # typed values below the edges
    'project/test_types.py',           # mypy over the typed packages
    'project/test_vm_channel.py',      # tests/kernel's VM channel
    'fuzz/test_fuzz.py',               # domain XML and sysfs trees
    'fuzz/test_fuzz_exporter.py',
    'fuzz/test_fuzz_layout.py',
    'fuzz/test_fuzz_migrate.py',
    'fuzz/test_fuzz_nova.py',
    'fuzz/test_fuzz_state.py',
}


def test_files(unit):
    """Every ``test_*.py`` under ``unit``, relative to it."""
    found = []
    for folder, dirs, files in os.walk(unit):
        dirs[:] = sorted(d for d in dirs if d != '__pycache__')
        found += [os.path.relpath(os.path.join(folder, name), unit)
                  for name in sorted(files)
                  if name.startswith('test_') and name.endswith('.py')]
    return found


test_files.__test__ = False          # a helper, not a test


def mutation_files(unit):
    return [rel for rel in test_files(unit)
            if os.path.basename(rel).startswith('test_mutation_')]


def _modules_of(folder):
    """The names a test file of ``folder`` (a path of the package, or a
    mirrored folder of tests/) may start with, or None: no such folder."""
    top = folder.split(os.sep)[0] if folder else ''
    if top in MIRRORED:
        base = os.path.join(MIRRORED[top], *folder.split(os.sep)[1:])
        if not os.path.isdir(base):
            return None
    else:
        base = os.path.join(ROOT, 'libvirt_gpu', folder)
        if not os.path.isfile(os.path.join(base, '__init__.py')):
            return None
    names = {name[:-3] for name in os.listdir(base)
             if name.endswith('.py') and name != '__init__.py'}
    if folder:
        names.add(os.path.basename(folder))      # the package's __init__
    return names


def unmirrored(unit, allowed):
    """The test files of ``unit`` named after no module of the folder they
    mirror, less those ``allowed``."""
    found = []
    for rel in test_files(unit):
        if rel in allowed:
            continue
        folder, name = os.path.split(rel)
        modules = _modules_of(folder)
        stem = name[len('test_'):-len('.py')]
        if not modules or not any(stem == m or stem.startswith(m + '_')
                                  for m in modules):
            found.append(rel)
    return found


def test_no_test_mutation_file_is_added():
    # a module's mutation-killing tests go in its own test file
    assert mutation_files(UNIT) == []


def test_every_unit_test_file_mirrors_a_module():
    assert unmirrored(UNIT, CROSS_CUTTING) == []
    assert set(CROSS_CUTTING) <= set(test_files(UNIT))


def test_the_mirror_check_sees_a_stray_file(tmp_path):
    unit = tmp_path / 'unit'
    for rel in ('devices/test_layout.py', 'devices/test_layout_apply.py',
                'devices/test_nowhere.py',
                'devices/test_mutation_layout.py',
                'nonesuch/test_layout.py', 'test_objects_validators.py',
                'test_devices.py', 'guests/hook/test_hook_leases.py',
                'guests/hook/test_guests.py', 'tools/test_mutation.py',
                'doubles/test_nothing.py', 'project/test_docs.py'):
        (unit / rel).parent.mkdir(parents=True, exist_ok=True)
        (unit / rel).write_text('')
    assert unmirrored(str(unit), {'project/test_docs.py'}) == [
        'test_devices.py', 'devices/test_mutation_layout.py',
        'devices/test_nowhere.py', 'doubles/test_nothing.py',
        'guests/hook/test_guests.py', 'nonesuch/test_layout.py']
    assert mutation_files(str(unit)) == ['devices/test_mutation_layout.py']


# --- no test file imports another ----------------------------------------
#
# What two test files share is a double (tests/doubles/) or a fixture of a
# conftest, never one test file's module imported by another: an import
# runs the other file's module-level code and its fixtures leak in under
# their names.

# Test files that still take helpers from another test file, each to lose
# its entry once those helpers are doubles or fixtures.  Empty: every
# helper two test files share is a double or a conftest's fixture.  Add
# to it never.
STILL_IMPORTING = set()


def test_files_imported(path):
    """The test modules (``tests.unit...test_x``, ``tests.functional.
    test_x``) the file at ``path`` imports, at any depth."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + ['%s.%s' % (node.module, alias.name)
                                     for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split('.')
            if parts[:2] not in (['tests', 'unit'], ['tests', 'functional']):
                continue
            for i, part in enumerate(parts[2:], 2):
                if part.startswith('test_'):
                    found.add('.'.join(parts[:i + 1]))
                    break
    return found


test_files_imported.__test__ = False     # a helper, not a test


def importing_files(tests):
    """``{path under tests: test modules it imports}`` of unit and
    functional files that import one."""
    found = {}
    for layer in ('unit', 'functional'):
        for folder, dirs, files in os.walk(os.path.join(tests, layer)):
            dirs[:] = sorted(d for d in dirs if d != '__pycache__')
            for name in sorted(files):
                if name.endswith('.py'):
                    path = os.path.join(folder, name)
                    names = test_files_imported(path)
                    if names:
                        found[os.path.relpath(path, tests)] = sorted(names)
    return found


def test_no_test_file_imports_another():
    found = importing_files(os.path.join(ROOT, 'tests'))
    assert {k: v for k, v in found.items()
            if k not in STILL_IMPORTING} == {}


def test_the_still_importing_list_holds_only_importers():
    # a file that no longer imports a test file leaves the list
    assert STILL_IMPORTING - set(importing_files(
        os.path.join(ROOT, 'tests'))) == set()


def test_the_import_check_sees_each_form(tmp_path):
    unit = tmp_path / 'unit' / 'devices'
    unit.mkdir(parents=True)
    (tmp_path / 'functional').mkdir()
    (unit / 'test_a.py').write_text(
        'from tests.unit import test_hook as th\n'
        'from tests.unit.devices.test_b import helper\n'
        'def f():\n    import tests.functional.test_c\n'
        'from tests.doubles import t4_hook\n'
        'from tests.unit import conftest\n')
    (tmp_path / 'functional' / 'test_d.py').write_text(
        'from tests.functional import libvirtd\n')
    assert importing_files(str(tmp_path)) == {'unit/devices/test_a.py': [
        'tests.functional.test_c', 'tests.unit.devices.test_b',
        'tests.unit.test_hook']}
