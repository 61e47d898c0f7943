"""The one-way doors between the rooms of libvirt_gpu
(docs/dev/architecture.md).

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
import re
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
ENTRY = ('guests.api', 'guests.hook', 'guests.reconcile', 'guests.restore',
         'openstack.agent', 'exporter', 'openstack.cyborg_driver', 'cmd')

# room -> the rooms of ours it must never import (prefixes, package-relative)
FORBIDDEN = {
    'devices.backends': ENTRY + ('store.allocator', 'store.state',
                                 'environment', 'openstack.placement',
                                 'virt.host', 'virt.guest', 'simulator'),
    'openstack.placement': ENTRY + ('devices.backends', 'store.allocator',
                                    'store.state', 'environment',
                                    'virt.host', 'virt.guest',
                                    'devices.discovery', 'simulator'),
    'simulator': ENTRY + ('devices.backends', 'store.allocator',
                          'store.state', 'environment',
                          'openstack.placement', 'virt.host', 'virt.guest',
                          'devices.discovery', 'devices.sysfs', 'conf'),
    'store.allocator': ENTRY + ('environment', 'virt.host', 'virt.guest',
                                'openstack.placement'),
    'store.state': ENTRY + ('devices.backends', 'store.allocator',
                            'environment', 'virt.host', 'virt.guest',
                            'openstack.placement'),
    'environment': ENTRY,
    'devices.discovery': ENTRY + ('store.allocator', 'store.state',
                                  'environment', 'openstack.placement'),
    'conf': ENTRY + ('devices.backends', 'store.allocator', 'store.state',
                     'environment', 'openstack.placement', 'virt.host',
                     'virt.guest', 'devices.discovery'),
}

# The one door into a forbidden room: the simulator builds and serves a
# vGPU kind's sysfs interface, so it takes the file names from the kind's
# ``names`` module (data only, importing nothing), never spelling them.
NAME_DOORS = {('simulator', 'devices.backends.nvidia_vgpu.names')}

# rooms at the floor -> the only rooms of ours they may import
ONLY = {
    'exception': (),
    'util.records': (),
    'util.logs': (),
    'devices.capacity': (),
    'util.fileutil': (),
    'util.jsonutil': (),
    'store.figures': ('exception', 'util.fileutil', 'util.jsonutil',
                      'store.statedir'),
    'util.fanout': (),
    'util.safeopen': (),
    'util.filetype': (),
    'util.textutil': (),
    'devices.pciids': (),
    'objects': ('exception', 'util.records', 'util.bounds'),
    'util.xmlutil': ('exception',),
    'store.statedir': ('exception', 'util.fileutil', 'util.filetype',
                       'util.jsonutil', 'util.textutil'),
    'util.bounds': ('exception',),
    'util.xmledit': ('exception', 'util.xmlutil'),
    'devices.backends.nvidia_vgpu.names': (),
}

# The rooms from the floor up, as docs/dev/architecture.md's table lists them
# (rooms on one row share a rank): a room imports only rooms of its rank or
# below, with no exception.
LEVELS = (
    ('exception', 'util.records', 'util.logs', 'util.bounds'), ('objects',),
    ('devices.capacity',),
    ('util.fileutil', 'util.filetype', 'util.textutil', 'util.fanout',
     'util.safeopen', 'util.jsonutil'),
    ('util.xmlutil', 'store.statedir', 'util.xmledit', 'conffile',
     'devices.enablement', 'devices.carving', 'devices.routes',
     'devices.layout', 'devices.layout_plan'),
    ('store.figures',), ('devices.pci_classes', 'devices.pciids'),
    ('devices.sysfs',), ('virt.nodedev',), ('virt.config_xml',),
    ('virt.metadata',), ('virt.host', 'virt.guest'), ('devices.nvml',),
    ('devices.discovery',), ('conf', 'confcache'), ('devices.backends',),
    ('devices.layout_apply',),
    ('store.state',), ('store.allocator',), ('openstack.placement',),
    ('environment',), ('guests.migration', 'guests.holders'),
    ('guests.api',), ('guests.hook',),
    ('guests.reconcile',), ('guests.restore',), ('openstack.agent',),
    ('exporter',), ('openstack.cyborg_driver',), ('simulator',), ('cmd',),
)
# discovery, below the kinds, takes them from its caller (an Environment's
# kind_classes) and imports no kind and no registry (issue 27).

# The folders that group the rooms by layer: packages that hold rooms and
# nothing else (their __init__ is a docstring), so no room of their own.
FOLDERS = {'util': 'helpers that know nothing of GPUs or libvirt',
           'virt': 'the libvirt layer: connection, domain, XML',
           'devices': 'the host side: its GPUs and the vGPU kinds',
           'store': "the host's state: leases, the allocator, figures",
           'guests': 'the guest side: API, migration, hook, recovery',
           'openstack': 'the OpenStack side: Placement, Cyborg, the agent'}

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
                               if m in modules and m not in (name, PACKAGE)
                               and _short(m) not in FOLDERS}
    graph.pop(_short(PACKAGE))
    for folder in FOLDERS:
        graph.pop(folder, None)
    return graph


def _short(name):
    return name[len(PACKAGE) + 1:]


def _in(name, room):
    return name == room or name.startswith(room + '.')


def _room_of(name):
    """The room ``name`` belongs to: the longest room of LEVELS it is in
    (``devices.backends.mdev`` -> ``devices.backends``)."""
    found = [room for rank in LEVELS for room in rank if _in(name, room)]
    return max(found, key=len) if found else name.split('.')[0]


def test_the_walk_sees_the_package():
    graph = door_graph()
    assert len(graph) > 40
    # edges known to exist, at module level and inside functions
    assert 'store.allocator' in graph['guests.api']
    # in a property
    assert 'devices.backends.registry' in graph['environment']
    assert 'devices.discovery' in graph['store.allocator']
    assert 'guests.hook.operations' in graph['guests.hook.__main__']


def test_the_walk_resolves_relative_and_nested_imports(tmp_path):
    probe = tmp_path / 'probe.py'
    probe.write_text('from .devices import capacity\n'
                     'def f():\n'
                     '    from .devices.backends import mdev\n'
                     '    import libvirt_gpu.guests.api\n')
    names = imports_of(str(probe), 'libvirt_gpu')
    assert {'libvirt_gpu.devices.capacity',
            'libvirt_gpu.devices.backends.mdev',
            'libvirt_gpu.guests.api'} <= names


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


# The one door into the simulator by name: ``[gpu]/nvml = simulated`` makes
# the composition root (environment.py, through ``devices.nvml.source``)
# import the simulator's NVML (nvidia-ml-py over the simulated driver of a
# simulated host) with importlib, only when so configured, so that a
# simulated host answers NVML from the same state as its sysfs and nothing
# of the product imports the simulator statically.
SIMULATOR_BY_NAME = {('devices.nvml', 'libvirt_gpu.simulator.nvml')}


def simulator_named_in(modules):
    """``{(module, name)}``: each string constant naming a module of the
    simulator (``libvirt_gpu.simulator...``) in ``modules`` (``{short
    name: path}``)."""
    found = set()
    for name, path in modules.items():
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(
                    node.value, str) and re.fullmatch(
                        r'libvirt_gpu\.simulator(\.\w+)*', node.value):
                found.add((name, node.value))
    return found


def test_the_product_names_the_simulator_only_through_its_door():
    product = {_short(m): path for m, path in _our_modules().items()
               if m != PACKAGE and _room_of(_short(m)) not in (
                   'cmd', 'simulator')}
    assert simulator_named_in(product) == SIMULATOR_BY_NAME


def test_the_door_check_sees_a_name(tmp_path):
    sneaky = tmp_path / 'sneaky.py'
    sneaky.write_text('import importlib\n'
                      'importlib.import_module("libvirt_gpu.simulator.live")'
                      '\n')
    assert simulator_named_in({'exporter': str(sneaky)}) == {
        ('exporter', 'libvirt_gpu.simulator.live')}


def test_importing_the_hook_loads_no_oslo_config_or_libvirt():
    # A fresh interpreter: this test process has loaded all of them.
    code = ('import sys\n'
            'import libvirt_gpu.guests.hook\n'
            'import libvirt_gpu.guests.hook.__main__\n'
            'import libvirt_gpu.guests.hook.operations\n'
            'import libvirt_gpu.guests.hook.settings\n'
            'import libvirt_gpu.guests.hook.log\n'
            'import libvirt_gpu.guests.hook.installer\n'
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
    assert importers == {'openstack.cyborg_driver': False}


def test_importing_the_cyborg_driver_loads_no_cyborg():
    code = ('import sys\n'
            'import libvirt_gpu.openstack.cyborg_driver as d\n'
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
    raise AssertionError('room %s is not in LEVELS (docs/dev/architecture.md '
                         'lists every room): add it' % room)


def test_rooms_import_only_rooms_below_them():
    graph = door_graph()
    upward = {(m, target) for m, targets in graph.items()
              for target in targets if _rank(target) > _rank(m)}
    assert upward == set(), (
        'an upward import (at any depth, inside a function too): move the '
        'work to the higher room, or hand the lower one what it needs as an '
        'argument, as discovery takes the kinds')


def import_circles(graph):
    """The import circles of ``graph`` (``{module: {modules}}``): each a
    sorted list of the modules that reach each other, sorted.  ``from pkg
    import sub`` names ``pkg`` as a namespace only, so an edge from a
    module to a package it is inside is no edge here."""
    def ancestors(name):
        parts = name.split('.')
        return {'.'.join(parts[:i]) for i in range(1, len(parts))}
    edges = {m: sorted(t for t in targets if t not in ancestors(m))
             for m, targets in graph.items()}
    # Tarjan's strongly connected components, without recursion
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            targets = edges.get(node, ())
            if i < len(targets):
                work.append((node, i + 1))
                target = targets[i]
                if target not in index:
                    work.append((target, 0))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return sorted(found)


def test_no_import_circle():
    assert import_circles(door_graph()) == []


def test_the_circle_check_sees_a_circle():
    assert import_circles({'a': {'b'}, 'b': {'c'}, 'c': {'a'}, 'd': {'a'},
                           'e': set()}) == [['a', 'b', 'c']]
    assert import_circles({
        'devices.discovery': {'devices.backends.registry'},
        'devices.backends.registry': {'devices.discovery'}}) == \
        [['devices.backends.registry', 'devices.discovery']]
    # a package's module importing its siblings through the package
    assert import_circles({'guests.hook': {'guests.hook.operations'},
                           'guests.hook.operations': {'guests.hook'}}) == []


# --- the modules that never name a vGPU kind ---------------------------------

# The composition root and the entry points that drive every kind alike:
# they talk to ``registry.Vgpus`` and the kinds' hooks (backends.base),
# never to one kind.
KIND_AGNOSTIC = ('environment', 'guests.hook', 'guests.restore',
                 'guests.reconcile')
# Words of a kind's own vocabulary (classic mdev, mdevctl, NVIDIA's
# vendor interface), in an identifier split at '_' and case changes.
KIND_WORDS = {'mdev', 'mdevs', 'mdevctl', 'nvidia', 'vendor'}
# libvirt's vocabulary, not a kind's: the UUIDs of a domain's
# ``<hostdev type='mdev'>`` (config_xml.DomainDevices), which every kind
# whose hostdev names a UUID uses.
KIND_WORDS_ALLOWED = {'mdev_uuids'}
# What of backends/ they may import: the contract, the registry, and
# whole GPUs (``backends.pci``: a device backend, no vGPU kind).
KIND_CONTRACT = ('devices.backends', 'devices.backends.base',
                 'devices.backends.registry', 'devices.backends.pci')


def _words(identifier):
    return {w.lower() for w in re.split(r'_|(?<=[a-z0-9])(?=[A-Z])',
                                        identifier) if w}


def _docstrings(tree):
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                             ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(
                    first.value, ast.Constant):
                found.add(id(first.value))
    return found


def kind_names_in(path, package):
    """``line: what`` for each place ``path`` names a vGPU kind: an import
    of a kind's module (anything of ``backends`` but the contract), an
    identifier of a kind's vocabulary (``KIND_WORDS``), mdevctl in a
    string that is not a docstring, or a kind asked for by its name
    (``vgpus.kind('mdev')``)."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    found = set()
    for name in imports_of(path, package):
        short = name[len(PACKAGE) + 1:] if name.startswith(
            PACKAGE + '.') else None
        if short and _in(short, 'devices.backends') \
                and short not in KIND_CONTRACT:
            found.add('import %s' % name)
    docs = _docstrings(tree)
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Name):
            names = [node.id]
        elif isinstance(node, ast.Attribute):
            names = [node.attr]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                               ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, ast.arg):
            names = [node.arg]
        elif isinstance(node, ast.keyword) and node.arg:
            names = [node.arg]
        elif isinstance(node, ast.alias):
            names = [(node.asname or node.name).split('.')[-1]]
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and id(node) not in docs and 'mdevctl' in node.value.lower()):
            found.add('%d: string %r' % (node.lineno, node.value[:40]))
        elif (isinstance(node, ast.Call)
              and isinstance(node.func, ast.Attribute)
              and node.func.attr == 'kind' and node.args
              and isinstance(node.args[0], ast.Constant)):
            found.add('%d: kind(%r)' % (node.lineno, node.args[0].value))
        for name in names:
            if name not in KIND_WORDS_ALLOWED and _words(name) & KIND_WORDS:
                found.add('%d: %s' % (node.lineno, name))
    return sorted(found)


def test_the_kind_agnostic_modules_name_no_kind():
    found = {}
    for name, path in _our_modules().items():
        short = _short(name) if name != PACKAGE else ''
        if not any(_in(short, room) for room in KIND_AGNOSTIC):
            continue
        package = (name if path.endswith('__init__.py')
                   else name.rpartition('.')[0])
        names = kind_names_in(path, package)
        if names:
            found[short] = names
    assert found == {}
    assert len([m for m in door_graph()
                if any(_in(m, r) for r in KIND_AGNOSTIC)]) > 6


def test_the_kind_name_check_can_fail(tmp_path):
    probe = tmp_path / 'probe.py'
    probe.write_text(
        '"""mdevctl in a docstring is prose."""\n'
        'from libvirt_gpu.devices.backends import mdev as mdev_backend\n'
        'from libvirt_gpu.devices.backends import registry\n'
        'def f(env, devices, mdevctl_dir):\n'
        '    """Reads mdevctl\'s directory."""\n'
        '    env.vgpus.kind("mdev")\n'
        '    vendorState = devices.mdev_uuids\n'
        '    return "defined by mdevctl", NVIDIA_VENDOR\n')
    found = kind_names_in(str(probe), 'libvirt_gpu')
    assert found == sorted([
        'import libvirt_gpu.devices.backends.mdev', '2: mdev_backend',
        '4: mdevctl_dir', '6: kind(\'mdev\')', '7: vendorState',
        "8: string 'defined by mdevctl'", '8: NVIDIA_VENDOR'])


# --- the tests' own layers ---------------------------------------------------

TESTS = os.path.join(ROOT, 'tests')


def _test_modules(package):
    base = os.path.join(TESTS, package)
    return sorted(os.path.join(folder, name)
                  for folder, _, names in os.walk(base)
                  for name in names if name.endswith('.py'))


@pytest.mark.parametrize('package, forbidden', [
    ('unit', ('tests.functional',)),
    ('doubles', ('tests.functional', 'tests.unit'))])
def test_no_test_module_imports_a_layer_above(package, forbidden):
    found = {os.path.relpath(path, TESTS): sorted(
        name for name in imports_of(path, '.'.join(
            ['tests'] + os.path.relpath(os.path.dirname(path),
                                        TESTS).split(os.sep)))
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

SKIP_DIRS = {'.git', '.venv', '.venv-placement', '.venv-cyborg', '.venv-nova',
             '.cache', '.tox', 'build', '__pycache__', '.pytest_cache',
             'mutants'}


def _repository_files():
    for directory, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS
                   and not d.endswith('.egg-info')]
        for name in files:
            yield os.path.join(directory, name)


def _kind_home(cls):
    """The file of a kind's module, or the package directory when the kind
    is a package of ``backends/`` (its class in one of the package's
    modules)."""
    path = os.path.abspath(sys.modules[cls.__module__].__file__)
    backends = os.path.join(PACKAGE_DIR, 'devices', 'backends')
    parent = os.path.dirname(path)
    if os.path.basename(path) == '__init__.py' or os.path.dirname(
            parent) == backends:
        return parent + os.sep
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
    from libvirt_gpu.devices.backends import registry
    kinds = registry.kind_classes()
    assert any(cls.sysfs_names for cls in kinds)
    assert names_outside_kinds(kinds) == []


def test_the_name_check_sees_a_kind_s_names(tmp_path):
    """The check can fail: a kind whose home is elsewhere is caught by its
    names where they really are."""
    from libvirt_gpu.devices.backends import nvidia_vgpu

    class Elsewhere(nvidia_vgpu.NvidiaVgpuBackend):
        pass

    Elsewhere.__module__ = 'libvirt_gpu.devices.backends.mdev'
    found = names_outside_kinds([Elsewhere])
    assert any(line.startswith(
        'libvirt_gpu/devices/backends/nvidia_vgpu/names.py')
               for line in found)


# Calls that open, list or look at a file.
FILE_CALLS = {'open', 'io.open', 'os.open', 'os.listdir', 'os.scandir',
              'os.readlink', 'os.access', 'os.stat', 'os.lstat', 'os.walk',
              'glob.glob', 'os.path.exists', 'os.path.lexists',
              'os.path.isdir', 'os.path.isfile', 'os.path.islink',
              'os.path.realpath'}
# The safe reader, and the simulator, which writes and serves the trees.
READERS = ('devices.sysfs.reader', 'simulator')


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
        if not _in(_short(name), 'devices.sysfs') \
                or _short(name) == 'devices.sysfs.reader':
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
    assert 'devices.sysfs.devices' in door_graph()


def test_the_reader_check_sees_a_direct_read(tmp_path):
    probe = tmp_path / 'probe.py'
    probe.write_text('import os\n'
                     'def f(sysfs, conf):\n'
                     '    os.listdir(os.path.join(conf.sysfs_root, "x"))\n'
                     '    open(sysfs.pci_dir(1))\n'
                     '    open("/etc/hosts")\n')
    assert [c.split(':')[0] for c in sysfs_file_calls(str(probe))] == \
        ['3', '4']


# --- one composition root ----------------------------------------------------

# What only the composition root builds (environment.Environment keeps
# each: the host as discovered, the PCI names, NVML, the enabled types
# resolved against the host, the allocator): a call of one of these
# anywhere else is an entry point building its own host.
ROOT_CALLS = ('enablement.resolve', 'carving.resolve', 'discovery.from_sysfs',
              'discovery.from_libvirt', 'discovery.discover',
              'pciids.PciIds', 'nvml.source', 'Allocator')
ROOT_MODULE = 'environment'
# Modules allowed to build a part of the host besides the root: none.
ROOT_CALLS_ELSEWHERE = set()


def root_calls(path):
    """``line: call`` of each call in ``path`` that builds a part of the
    host only the composition root builds (``ROOT_CALLS``; a module
    alias such as ``allocator_mod.Allocator`` or ``nvml_mod.source``
    counts)."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        dotted = _dotted(node.func)
        if dotted is None:
            continue
        parts = dotted.split('.')
        for name in ROOT_CALLS:
            module, _, attr = name.rpartition('.')
            if parts[-1] != attr:
                continue
            if not module or (len(parts) > 1 and parts[-2].split('_')[0]
                              == module):
                found.append('%d: %s' % (node.lineno, dotted))
    return found


def test_only_the_composition_root_builds_the_host():
    found = {}
    for name, path in _our_modules().items():
        short = _short(name) if name != PACKAGE else ''
        if short in (ROOT_MODULE, 'store.allocator', 'devices.discovery') \
                or short in ROOT_CALLS_ELSEWHERE:
            continue
        calls = root_calls(path)
        if calls:
            found[short] = calls
    assert found == {}
    # and the root does build them (from_libvirt through discover)
    built = ' '.join(root_calls(os.path.join(PACKAGE_DIR, 'environment.py')))
    for name in set(ROOT_CALLS) - {'discovery.from_libvirt'}:
        assert name.rsplit('.', 1)[-1] in built, name


def test_the_root_check_sees_an_entry_point_building_its_own(tmp_path):
    probe = tmp_path / 'probe.py'
    probe.write_text(
        'def scrape(env, conf, gpus):\n'
        '    allocator_mod.Allocator(env.vgpus, env.store, {})\n'
        '    enablement.resolve(conf, gpus)\n'
        '    discovery.from_sysfs(env.sysfs)\n'
        '    nvml_mod.source("auto")\n'
        '    env.allocator.free()\n'
        '    model.resolve(1)\n')
    assert root_calls(str(probe)) == [
        '2: allocator_mod.Allocator', '3: enablement.resolve',
        '4: discovery.from_sysfs', '5: nvml_mod.source']


# --- the folders say what the layers are -------------------------------------

# The modules left at the package root: the shared vocabulary (errors,
# records), the composition root, the configuration file's choice and its
# snapshot (read by the hook without the conf package's oslo.config), and
# the exporter (an entry point of its own).
ROOT_MODULES = {'__init__', 'exception', 'objects', 'environment',
                'conffile', 'confcache', 'exporter'}


def test_the_package_root_holds_only_the_shared_modules():
    found = {name[:-len('.py')] for name in os.listdir(PACKAGE_DIR)
             if name.endswith('.py')}
    assert found == ROOT_MODULES


@pytest.mark.parametrize('folder', sorted(FOLDERS))
def test_each_layer_folder_is_a_docstring_and_its_rooms(folder):
    path = os.path.join(PACKAGE_DIR, folder, '__init__.py')
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    # a docstring, nothing else: the folder is no room of its own
    assert len(tree.body) == 1 and isinstance(tree.body[0], ast.Expr), path
    rooms = [room for rank in LEVELS for room in rank
             if _in(room, folder)]
    assert rooms, 'folder %s holds no room of LEVELS' % folder
