"""The one-way doors between the rooms of libvirt_gpu (docs/architecture.md).

A walk over every module's imports (``import`` statements at any depth,
so an import inside a function counts too) checks that no room imports
one it must not: vGPU kinds know nothing of their callers, the pure rules
(``capacity``, ``objects``, ``exception``) import nothing above them, the
entry points are imported only by the CLI, the product never imports the
simulator, and the hook's start-up path stays free of oslo.config and
libvirt.  A failure names the importing module and the module it reached.

The same walk keeps the tests' own layers: unit tests and the shared
doubles never import the functional tests (which need root, a real
libvirtd, FUSE ...), nor the doubles the unit tests.
"""

import ast
import os
import subprocess
import sys

import pytest

import libvirt_gpu

PACKAGE_DIR = os.path.dirname(os.path.abspath(libvirt_gpu.__file__))
ROOT = os.path.dirname(PACKAGE_DIR)
PACKAGE = 'libvirt_gpu'

# The entry points: they receive an environment.Environment and drive the
# rooms below; only the CLI (cmd) reaches them.  cyborg_driver is reached
# by nothing of ours: Cyborg's agent loads it (entry point
# libvirt_gpu_driver in cyborg.accelerator.driver).
ENTRY = ('api', 'hook', 'reconcile', 'restore', 'agent', 'exporter',
         'cyborg_driver', 'cmd')

# room -> the rooms of ours it must never import (prefixes, package-relative)
FORBIDDEN = {
    'backends': ENTRY + ('allocator', 'state', 'environment', 'placement',
                         'host', 'guest', 'simulator'),
    'placement': ENTRY + ('backends', 'allocator', 'state', 'environment',
                          'host', 'guest', 'discovery', 'simulator'),
    'simulator': ENTRY + ('backends', 'allocator', 'state', 'environment',
                          'placement', 'host', 'guest', 'discovery',
                          'sysfs', 'conf'),
    'allocator': ENTRY + ('environment', 'host', 'guest', 'placement'),
    'state': ENTRY + ('backends', 'allocator', 'environment', 'host',
                      'guest', 'placement'),
    'environment': ENTRY,
    'discovery': ENTRY + ('allocator', 'state', 'environment', 'placement'),
    'conf': ENTRY + ('backends', 'allocator', 'state', 'environment',
                     'placement', 'host', 'guest', 'discovery'),
}

# The one door into a forbidden room: the simulator builds and serves a
# vGPU kind's sysfs interface, so it takes the file names from the kind's
# ``names`` module (data only, importing nothing), never spelling them.
NAME_DOORS = {('simulator', 'backends.nvidia_vgpu.names')}

# rooms at the floor -> the only rooms of ours they may import
ONLY = {
    'exception': (),
    'records': (),
    'logs': (),
    'capacity': (),
    'fileutil': (),
    'figures': ('exception', 'fileutil', 'statedir'),
    'fanout': (),
    'safeopen': (),
    'filetype': (),
    'textutil': (),
    'pciids': (),
    'objects': ('exception', 'records', 'bounds'),
    'xmlutil': ('exception',),
    'statedir': ('exception', 'filetype', 'textutil'),
    'bounds': ('exception',),
    'xmledit': ('exception', 'xmlutil'),
    'backends.nvidia_vgpu.names': (),
}

# The rooms from the floor up, as docs/architecture.md's table lists them
# (rooms on one row share a rank): a room imports only rooms of its rank or
# below, but for the door in LEVEL_EXCEPTIONS.
LEVELS = (
    ('exception', 'records', 'logs', 'bounds'), ('objects',), ('capacity',),
    ('fileutil', 'filetype', 'textutil', 'fanout', 'safeopen'),
    ('xmlutil', 'statedir', 'xmledit', 'conffile', 'enablement'),
    ('figures',),
    ('pci_classes', 'pciids'),
    ('sysfs',), ('nodedev',), ('config_xml',), ('metadata',),
    ('host', 'guest'), ('nvml',), ('discovery',), ('conf', 'confcache'),
    ('backends',), ('state',), ('allocator',), ('placement',),
    ('environment',), ('migration',), ('api',), ('hook',), ('reconcile',),
    ('restore',),
    ('agent',), ('exporter',), ('cyborg_driver',), ('simulator',), ('cmd',),
)
# discovery asks every registered vGPU kind to read a VF's vendor
# interface and to complete its types (inside functions): it never names
# a kind.
LEVEL_EXCEPTIONS = {('discovery', 'backends'),
                    ('discovery', 'backends.registry')}

# What the hook may not load when Python imports it (every guest start pays
# for what it imports).
HOOK_MUST_NOT_LOAD = ('oslo_config', 'libvirt', 'keystoneauth1', 'tenacity')


def _module_name(path):
    rel = os.path.relpath(path, ROOT)[:-len('.py')].split(os.sep)
    if rel[-1] == '__init__':
        rel = rel[:-1]
    return '.'.join(rel)


def _our_modules():
    found = {}
    for directory, _, files in os.walk(PACKAGE_DIR):
        for name in files:
            if name.endswith('.py'):
                path = os.path.join(directory, name)
                found[_module_name(path)] = path
    return found


def imports_of(path, package):
    """Every module name ``path`` imports, at any depth: ``from a import
    b`` gives ``a`` and ``a.b`` (b may be a module); relative imports are
    resolved against ``package``."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ''
            if node.level:
                parts = package.split('.')
                parts = parts[:len(parts) - node.level + 1]
                base = '.'.join(parts + ([base] if base else []))
            names.add(base)
            names.update('%s.%s' % (base, alias.name) for alias in node.names)
    return names


def door_graph():
    """``{module: {our modules it imports}}`` over libvirt_gpu, names
    relative to the package (``backends.mdev``)."""
    modules = _our_modules()
    graph = {}
    for name, path in modules.items():
        package = (name if path.endswith('__init__.py')
                   else name.rpartition('.')[0])
        # ``from libvirt_gpu import x`` names the package itself too: the
        # package's __init__ holds nothing, so it is no room.
        graph[_short(name)] = {_short(m) for m in imports_of(path, package)
                               if m in modules and m not in (name, PACKAGE)}
    graph.pop(_short(PACKAGE))
    return graph


def _short(name):
    return name[len(PACKAGE) + 1:]


def _in(name, room):
    return name == room or name.startswith(room + '.')


def _room_of(name):
    return name.split('.')[0]


def test_the_walk_sees_the_package():
    graph = door_graph()
    assert len(graph) > 40
    # edges known to exist, at module level and inside functions
    assert 'allocator' in graph['api']
    assert 'backends.mdev' in graph['environment']
    assert 'backends.registry' in graph['environment']   # in a property
    assert 'hook.operations' in graph['hook.__main__']


def test_the_walk_resolves_relative_and_nested_imports(tmp_path):
    probe = tmp_path / 'probe.py'
    probe.write_text('from . import capacity\n'
                     'def f():\n'
                     '    from .backends import mdev\n'
                     '    import libvirt_gpu.api\n')
    names = imports_of(str(probe), 'libvirt_gpu')
    assert {'libvirt_gpu.capacity', 'libvirt_gpu.backends.mdev',
            'libvirt_gpu.api'} <= names


@pytest.mark.parametrize('room', sorted(FORBIDDEN))
def test_no_room_opens_a_forbidden_door(room):
    graph = door_graph()
    members = [m for m in graph if _in(m, room)]
    assert members, 'no module in room %s' % room
    wrong = sorted('%s imports %s' % (m, target)
                   for m in members for target in graph[m]
                   if any(_in(target, f) for f in FORBIDDEN[room])
                   and not _in(target, room)
                   and (room, target) not in NAME_DOORS)
    assert wrong == []


@pytest.mark.parametrize('room', sorted(ONLY))
def test_the_floor_imports_nothing_above_it(room):
    graph = door_graph()
    wrong = sorted('%s imports %s' % (room, target)
                   for target in graph[room]
                   if not any(_in(target, a) for a in ONLY[room]))
    assert wrong == []


def test_entry_points_are_reached_only_from_the_cli():
    graph = door_graph()
    wrong = sorted('%s imports %s' % (m, target)
                   for m, targets in graph.items() for target in targets
                   if _room_of(target) in ENTRY
                   and _room_of(m) not in ('cmd', _room_of(target)))
    assert wrong == []


def test_the_product_never_imports_the_simulator():
    graph = door_graph()
    wrong = sorted('%s imports %s' % (m, target)
                   for m, targets in graph.items() for target in targets
                   if _in(target, 'simulator')
                   and _room_of(m) not in ('cmd', 'simulator'))
    assert wrong == []


def test_importing_the_hook_loads_no_oslo_config_or_libvirt():
    # A fresh interpreter: this test process has loaded all of them.
    code = ('import sys\n'
            'import libvirt_gpu.hook, libvirt_gpu.hook.__main__\n'
            'import libvirt_gpu.hook.operations, libvirt_gpu.hook.settings\n'
            'import libvirt_gpu.hook.log, libvirt_gpu.hook.installer\n'
            'print(" ".join(sorted(m for m in %r if m in sys.modules)))\n'
            % (HOOK_MUST_NOT_LOAD,))
    env = dict(os.environ, PYTHONPATH=ROOT)
    done = subprocess.run([sys.executable, '-c', code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == []
    # and the check can see such a module when one is loaded
    seen = subprocess.run(
        [sys.executable, '-c', 'import sys, oslo_config.cfg; print('
         '"oslo_config" in sys.modules)'], env=env, capture_output=True,
        text=True, timeout=120)
    assert seen.stdout.strip() == 'True'


def _third_party_imports(path):
    """-> {top-level name: at module level?} of what ``path`` imports."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    top = set(id(n) for n in tree.body)
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or '']
        else:
            continue
        for name in names:
            first = name.split('.')[0]
            found[first] = found.get(first, False) or id(node) in top
    return found


def test_only_the_cyborg_driver_imports_cyborg_and_lazily():
    # Cyborg is no requirement of ours: one module imports it, inside
    # functions only, so importing that module needs no Cyborg.
    importers = {}
    for name, path in _our_modules().items():
        found = _third_party_imports(path)
        if 'cyborg' in found:
            importers[_short(name)] = found['cyborg']
    assert importers == {'cyborg_driver': False}


def test_importing_the_cyborg_driver_loads_no_cyborg():
    code = ('import sys\n'
            'import libvirt_gpu.cyborg_driver as d\n'
            'print(d.ENTRY_POINT, "cyborg" in sys.modules)\n')
    env = dict(os.environ, PYTHONPATH=ROOT)
    done = subprocess.run([sys.executable, '-c', code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ['libvirt_gpu_driver', 'False']


def _rank(name):
    room = _room_of(name)
    for rank, rooms in enumerate(LEVELS):
        if room in rooms:
            return rank
    raise AssertionError('room %s is not in LEVELS (docs/architecture.md '
                         'lists every room): add it' % room)


def test_rooms_import_only_rooms_below_them():
    graph = door_graph()
    upward = {(m, target) for m, targets in graph.items()
              for target in targets if _rank(target) > _rank(m)}
    assert upward == LEVEL_EXCEPTIONS


# --- the tests' own layers ---------------------------------------------------

TESTS = os.path.join(ROOT, 'tests')


def _test_modules(package):
    base = os.path.join(TESTS, package)
    return sorted(os.path.join(base, name) for name in os.listdir(base)
                  if name.endswith('.py'))


@pytest.mark.parametrize('package, forbidden', [
    ('unit', ('tests.functional',)),
    ('doubles', ('tests.functional', 'tests.unit'))])
def test_no_test_module_imports_a_layer_above(package, forbidden):
    found = {os.path.basename(path): sorted(
        name for name in imports_of(path, 'tests.' + package)
        if any(name == f or name.startswith(f + '.') for f in forbidden))
        for path in _test_modules(package)}
    assert {k: v for k, v in found.items() if v} == {}
    assert len(found) > 3            # the walk saw the package's files


def test_the_layer_check_sees_imports_inside_functions(tmp_path):
    path = tmp_path / 'probe.py'
    path.write_text('def f():\n    from tests.functional import libvirtd\n'
                    'def g():\n    from ..functional import live_sysfs\n')
    names = imports_of(str(path), 'tests.unit')
    assert {'tests.functional.libvirtd',
            'tests.functional.live_sysfs'} <= names


# --- a vGPU kind's sysfs interface, and who opens files under the root ------

SKIP_DIRS = {'.git', '.venv', '.venv-placement', '.venv-cyborg', '.cache',
             '.tox', 'build', '__pycache__', '.pytest_cache'}


def _repository_files():
    for directory, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS
                   and not d.endswith('.egg-info')]
        for name in files:
            yield os.path.join(directory, name)


def _kind_home(cls):
    """The file, or the package directory, of a kind's module."""
    path = os.path.abspath(sys.modules[cls.__module__].__file__)
    if os.path.basename(path) == '__init__.py':
        return os.path.dirname(path) + os.sep
    return path


def names_outside_kinds(kinds):
    """``path: name`` for every file of the repository outside a kind's
    module that spells one of that kind's ``sysfs_names``."""
    found = []
    for path in _repository_files():
        try:
            with open(path, encoding='utf-8') as f:
                text = f.read()
        except (UnicodeDecodeError, OSError):
            continue                    # binary files
        for cls in kinds:
            home = _kind_home(cls)
            if path == home or path.startswith(home):
                continue
            found.extend('%s: %s' % (os.path.relpath(path, ROOT), name)
                         for name in cls.sysfs_names if name in text)
    return sorted(found)


def test_no_file_outside_a_kind_names_its_sysfs_files():
    from libvirt_gpu.backends import registry
    kinds = registry.kind_classes()
    assert any(cls.sysfs_names for cls in kinds)
    assert names_outside_kinds(kinds) == []


def test_the_name_check_sees_a_kind_s_names(tmp_path):
    """The check can fail: a kind whose home is elsewhere is caught by its
    names where they really are."""
    from libvirt_gpu.backends import nvidia_vgpu

    class Elsewhere(nvidia_vgpu.NvidiaVgpuBackend):
        pass

    Elsewhere.__module__ = 'libvirt_gpu.backends.mdev'
    found = names_outside_kinds([Elsewhere])
    assert any(line.startswith('libvirt_gpu/backends/nvidia_vgpu/names.py')
               for line in found)


# Calls that open, list or look at a file.
FILE_CALLS = {'open', 'io.open', 'os.open', 'os.listdir', 'os.scandir',
              'os.readlink', 'os.access', 'os.stat', 'os.lstat', 'os.walk',
              'glob.glob', 'os.path.exists', 'os.path.lexists',
              'os.path.isdir', 'os.path.isfile', 'os.path.islink',
              'os.path.realpath'}
# The safe reader, and the simulator, which writes and serves the trees.
READERS = ('sysfs.reader', 'simulator')


def _dotted(node):
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return base and '%s.%s' % (base, node.attr)
    return None


def _names_sysfs(node):
    """Whether an expression is built from a sysfs or its root."""
    for part in ast.walk(node):
        name = (part.id if isinstance(part, ast.Name) else
                part.attr if isinstance(part, ast.Attribute) else '')
        if 'sysfs' in name.lower() or name == 'root':
            return True
    return False


def sysfs_file_calls(path):
    """``line: call`` of every file call of ``path`` whose argument is
    derived from a sysfs (a ``Sysfs``, its root, ``sysfs_root``)."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    return ['%d: %s' % (node.lineno, ast.unparse(node)[:80])
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and _dotted(node.func) in FILE_CALLS
            and any(_names_sysfs(a) for a in node.args)]


def test_only_the_reader_opens_files_under_the_sysfs_root():
    found = {}
    for name, path in _our_modules().items():
        if any(_in(_short(name), r) for r in READERS):
            continue
        calls = sysfs_file_calls(path)
        if calls:
            found[_short(name)] = calls
    assert found == {}


def test_the_rest_of_sysfs_opens_nothing_itself():
    """What the files mean (``sysfs.devices``) and what their text says
    (``sysfs.parsers``) go through the reader for every file."""
    found = {}
    for name, path in _our_modules().items():
        if not _in(_short(name), 'sysfs') or _short(name) == 'sysfs.reader':
            continue
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        calls = sorted('%d: %s' % (node.lineno, _dotted(node.func))
                       for node in ast.walk(tree)
                       if isinstance(node, ast.Call)
                       and _dotted(node.func) in FILE_CALLS)
        if calls:
            found[_short(name)] = calls
    assert found == {}
    assert 'sysfs.devices' in door_graph()


def test_the_reader_check_sees_a_direct_read(tmp_path):
    probe = tmp_path / 'probe.py'
    probe.write_text('import os\n'
                     'def f(sysfs, conf):\n'
                     '    os.listdir(os.path.join(conf.sysfs_root, "x"))\n'
                     '    open(sysfs.pci_dir(1))\n'
                     '    open("/etc/hosts")\n')
    assert [c.split(':')[0] for c in sysfs_file_calls(str(probe))] == \
        ['3', '4']
