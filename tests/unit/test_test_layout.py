"""The tests' own layering: unit tests and the shared doubles never import
the functional tests (which need root, a real libvirtd, FUSE ...)."""

import ast
import os

import pytest

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _imported(path):
    """Every module name ``path`` imports (``from a import b``: a and
    a.b), at any depth (imports inside functions too)."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update('%s.%s' % (node.module, alias.name)
                         for alias in node.names)
    return names


def _modules(package):
    base = os.path.join(TESTS, package)
    return sorted(os.path.join(base, name) for name in os.listdir(base)
                  if name.endswith('.py'))


@pytest.mark.parametrize('package, forbidden', [
    ('unit', ('tests.functional',)),
    ('doubles', ('tests.functional', 'tests.unit'))])
def test_no_import_of_a_layer_above(package, forbidden):
    found = {os.path.basename(path): sorted(
        name for name in _imported(path)
        if any(name == f or name.startswith(f + '.') for f in forbidden))
        for path in _modules(package)}
    assert {k: v for k, v in found.items() if v} == {}
    assert len(found) > 3            # the walk saw the package's files


def test_the_check_sees_imports_inside_functions(tmp_path):
    path = tmp_path / 'probe.py'
    path.write_text('def f():\n    from tests.functional import libvirtd\n')
    assert 'tests.functional.libvirtd' in _imported(str(path))
