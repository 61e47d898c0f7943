"""The one-way doors between the rooms of libvirt_gpu
(docs/dev/architecture.md).

A walk over every module's imports (``import`` statements at any depth,
so an import inside a function counts too) checks that no room imports
one it must not: vGPU kinds know nothing of their callers, the pure rules
(``capacity``, ``objects``, ``exception``) import nothing above them, the
entry points are imported only by the CLI, the product never imports the
simulator, and the hook's start-up path stays free of oslo.config and
libvirt.  A failure names the importing module and the module it reached.
Over the folders, the same walk checks that no folder imports a folder
that imports it.

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

from tests.doubles.architecture import FOLDERS
from tests.doubles.architecture import FOLDER_ARROWS_EXCUSED
from tests.doubles.architecture import LEVELS
from tests.doubles.architecture import PACKAGE
from tests.doubles.architecture import PACKAGE_DIR
from tests.doubles.architecture import ROOT
from tests.doubles.architecture import _in
from tests.doubles.architecture import our_modules
from tests.doubles.architecture import _short
from tests.doubles.architecture import door_graph
from tests.doubles.architecture import folder_graph
from tests.doubles.architecture import folder_of
from tests.doubles.architecture import imports_of
from tests.doubles.architecture import names_outside_kinds

# The entry points: they receive an environment.Environment and drive the
# rooms below; only the CLI (cmd) reaches them.  cyborg_driver is reached
# by nothing of ours: Cyborg's agent loads it (entry point
# libvirt_gpu_driver in cyborg.accelerator.driver).
ENTRY = ('guests.api', 'guests.hook', 'guests.reconcile', 'host.restore',
         'openstack.agent', 'exporter', 'openstack.cyborg_driver', 'cmd')

# room -> the rooms of ours it must never import (prefixes, package-relative)
FORBIDDEN = {
    'devices.backends': ENTRY + ('host.allocator', 'store.state',
                                 'environment', 'openstack.placement',
                                 'virt.host', 'virt.guest', 'simulator'),
    'openstack.placement': ENTRY + ('devices.backends', 'host.allocator',
                                    'store.state', 'environment',
                                    'virt.host', 'virt.guest',
                                    'devices.discovery', 'simulator'),
    # Cyborg's objects, as plain records: the same doors as Placement's
    'openstack.cyborg_objects': ENTRY + (
        'devices.backends', 'host.allocator', 'store.state', 'environment',
        'virt.host', 'virt.guest', 'devices.discovery', 'simulator'),
    'simulator': ENTRY + ('devices.backends', 'host.allocator',
                          'store.state', 'environment',
                          'openstack.placement', 'virt.host', 'virt.guest',
                          'devices.discovery', 'devices.sysfs', 'conf'),
    'host.allocator': ENTRY + ('environment', 'virt.host', 'virt.guest',
                               'openstack.placement'),
    'store.state': ENTRY + ('devices.backends', 'host.allocator',
                            'environment', 'virt.host', 'virt.guest',
                            'openstack.placement'),
    'environment': ENTRY,
    'devices.discovery': ENTRY + ('host.allocator', 'store.state',
                                  'environment', 'openstack.placement'),
    'conf': ENTRY + ('devices.backends', 'host.allocator', 'store.state',
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
    'devices.capabilities': (),
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

# What the hook may not load when Python imports it (every guest start pays
# for what it imports).
HOOK_MUST_NOT_LOAD = ('oslo_config', 'libvirt', 'keystoneauth1', 'tenacity')


def _room_of(name):
    """The room ``name`` belongs to: the longest room of LEVELS it is in
    (``devices.backends.mdev`` -> ``devices.backends``)."""
    found = [room for rank in LEVELS for room in rank if _in(name, room)]
    return max(found, key=len) if found else name.split('.')[0]


def test_the_walk_sees_the_package():
    graph = door_graph()
    assert len(graph) > 40
    # edges known to exist, at module level and inside functions
    assert 'host.allocator' in graph['guests.api']
    # in a property
    assert 'devices.backends.registry' in graph['environment']
    assert 'devices.discovery' in graph['host.allocator']
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
    product = {_short(m): path for m, path in our_modules().items()
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
    for name, path in our_modules().items():
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


def test_store_imports_nothing_of_devices():
    """devices/ builds on store/ (the leases, the state directory, the
    record files), never the other way: no circle between the two
    folders (the allocator, which chooses by devices' rules, is
    ``host.allocator``)."""
    graph = door_graph()
    upward = {module: sorted(m for m in imported if _in(m, 'devices'))
              for module, imported in graph.items() if _in(module, 'store')}
    assert {m: found for m, found in upward.items() if found} == {}
    # the walk sees the store modules and the direction that is allowed
    assert {'store.carved', 'store.vendor_vgpus'} <= set(upward)
    assert 'store.carved' in graph['devices.carving']
    assert 'store.state' in graph['host.allocator']


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


# --- the folders: arrows only downwards --------------------------------------

def folder_circles(graph, top=False, excused=()):
    """Each folder circle of the module graph ``graph`` (folders that
    reach each other), with the imports that tie it: ``[(folders,
    ['module -> module', ...]), ...]``."""
    folders = folder_graph(graph, top, excused)
    # named by path (devices/backends), since import_circles takes an
    # arrow to a dotted prefix for a package's namespace: here devices/'s
    # own modules are a folder as real as any
    circles = [[c.replace('/', '.') for c in circle]
               for circle in import_circles({
                   a.replace('.', '/'): {t.replace('.', '/') for t in b}
                   for a, b in folders.items()})]
    return [(circle, sorted('%s -> %s' % pair
                            for a in circle for b in circle
                            for pair in folders.get(a, {}).get(b, ())))
            for circle in circles]


@pytest.mark.parametrize('top', [True, False], ids=['layer', 'any-depth'])
def test_no_folder_imports_a_folder_that_imports_it(top):
    """The folders under the package root (``layer``: util, devices,
    store, ...) and every folder at any depth (``any-depth``: devices/
    beside devices/backends/nvidia_vgpu/) import each other one way only:
    no folder reaches a folder that reaches it."""
    excused = {(folder_of(a, top), folder_of(b, top))
               for a, b in FOLDER_ARROWS_EXCUSED}
    circles = folder_circles(door_graph(), top, excused)
    assert circles == [], (
        'folders that import each other (and the imports that tie them): '
        '%s; move the module to the folder it belongs with, or hand the '
        'lower one what it needs as an argument' % circles)


def test_each_excused_folder_arrow_is_still_there():
    """An excused arrow back up that is gone is taken off the list, so
    that no new one hides behind it (the list is empty now: every folder
    imports only folders below it)."""
    graph = door_graph()
    for excused in FOLDER_ARROWS_EXCUSED:
        importer, imported = excused
        folders = folder_graph(graph, top='.' not in importer + imported)
        assert imported in folders.get(importer, {}) and importer in \
            folders.get(imported, {}), (
                '%s and %s no longer import each other: remove %r from '
                'FOLDER_ARROWS_EXCUSED' % (importer, imported, excused))


def test_the_folder_check_sees_a_circle():
    # two layer folders through their modules, at any depth
    graph = {'devices.carving': {'store.statedir'},
             'store.allocator': {'devices.capacity'},
             'store.statedir': {'util.fileutil'}}
    assert folder_circles(graph, top=True) == [(['devices', 'store'], [
        'devices.carving -> store.statedir',
        'store.allocator -> devices.capacity'])]
    assert folder_circles(graph, top=True,
                          excused={('devices', 'store')}) == []
    # a folder and one inside it, which the layer check does not see
    graph = {'devices.layout_apply': {'devices.backends.nvidia_vgpu.files'},
             'devices.backends.nvidia_vgpu.kind': {'devices.nvml'}}
    assert folder_circles(graph, top=True) == []
    assert folder_circles(graph) == [(
        ['devices', 'devices.backends.nvidia_vgpu'],
        ['devices.backends.nvidia_vgpu.kind -> devices.nvml',
         'devices.layout_apply -> devices.backends.nvidia_vgpu.files'])]
    # three folders in a ring, none importing the other back directly
    ring = {'virt.host': {'store.state'}, 'store.state': {'guests.api'},
            'guests.api': {'virt.guest'}}
    assert [c for c, _ in folder_circles(ring, top=True)] == [
        ['guests', 'store', 'virt']]
    # a package's module naming its own package is no arrow; a package's
    # __init__ is in the folder it is
    assert folder_circles({'devices.backends.nvidia_vgpu.kind': {
        'devices.backends'}, 'devices.backends': {
        'devices.backends.nvidia_vgpu'}}) == []
    assert folder_of('devices.backends') == 'devices.backends'
    assert folder_of('devices.backends.mdev') == 'devices.backends'
    assert folder_of('devices.backends.mdev', top=True) == 'devices'
    assert folder_of('exporter') == 'exporter'


# --- the modules that never name a vGPU kind ---------------------------------

# The composition root and the entry points that drive every kind alike:
# they talk to ``registry.Vgpus`` and the kinds' hooks (backends.base),
# never to one kind.
KIND_AGNOSTIC = ('environment', 'guests.hook', 'host.restore',
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
                 'devices.capabilities',
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
    for name, path in our_modules().items():
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

def test_no_file_outside_a_kind_names_its_sysfs_files():
    from libvirt_gpu.devices import capabilities
    from libvirt_gpu.devices.backends import registry
    kinds = registry.having(registry.kind_classes(),
                            capabilities.VendorFunctions)
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
    for name, path in our_modules().items():
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
    for name, path in our_modules().items():
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
# each: the host as discovered, the PCI names, NVML, the layouts and the
# enabled types resolved against the host, the allocator): a call of one of
# these anywhere else is an entry point building its own host.
ROOT_CALLS = ('enablement.resolve', 'carving.resolve', 'discovery.from_sysfs',
              'discovery.from_libvirt', 'discovery.discover',
              'pciids.PciIds', 'nvml.source', 'Allocator', 'layout.claims')
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
    for name, path in our_modules().items():
        short = _short(name) if name != PACKAGE else ''
        if short in (ROOT_MODULE, 'host.allocator', 'devices.discovery') \
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


# --- the root stays at the edges ---------------------------------------------

# The rooms below the composition root never receive an Environment: an
# entry point hands them the parts they use (``layout_apply.converge``
# its layouts, GPUs, NVML, sysfs and lease holders; ``model.host_tree``
# its GPUs, enabled types, rooms ...), so every dependency is an argument
# the import rules see.  A function of a lower room with a parameter named
# ``env``, or one that reads ``env.<part>``, is a service locator.
# The vGPU kinds too: they are built from a ``base.KindParts`` the root
# makes (``Environment.kind_parts``).  No exception.


def env_receivers(path):
    """``{function: [what]}`` of ``path``: each function (by its qualified
    name, ``Class.method``; ``<module>`` outside any) with a parameter
    named ``env`` or that reads ``env.<part>`` (``self.env.<part>``
    too)."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    found = {}

    def walk(node, scope):
        for child in ast.iter_child_nodes(node):
            inner = scope
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                  ast.ClassDef)):
                inner = scope + (child.name,)
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                  ast.Lambda)):
                args = child.args
                for arg in (args.posonlyargs + args.args + args.kwonlyargs
                            + [args.vararg, args.kwarg]):
                    if arg is not None and arg.arg == 'env':
                        name = '.'.join(inner) or '<module>'
                        found.setdefault(name, []).append(
                            '%d: parameter env' % child.lineno)
            if isinstance(child, ast.Attribute) and (
                    isinstance(child.value, ast.Name)
                    and child.value.id == 'env'
                    or isinstance(child.value, ast.Attribute)
                    and child.value.attr == 'env'):
                name = '.'.join(scope) or '<module>'
                found.setdefault(name, []).append(
                    '%d: reads %s' % (child.lineno, _dotted(child)
                                      or 'env.' + child.attr))
            walk(child, inner)
    walk(tree, ())
    return found


def test_no_lower_room_receives_an_environment():
    floor = _rank(ROOT_MODULE)
    found = {}
    for name, path in our_modules().items():
        short = _short(name) if name != PACKAGE else ''
        if short in FOLDERS or not short or _rank(short) >= floor:
            continue
        for function, what in env_receivers(path).items():
            found[(short, function)] = what
    assert found == {}, (
        'a room below the composition root receives an Environment: hand '
        'it the parts it uses instead (as layout_apply.converge takes the '
        'layouts, GPUs, NVML, sysfs and lease holders, and a kind a '
        'base.KindParts): %s' % found)


def test_the_environment_check_sees_a_receiver(tmp_path):
    probe = tmp_path / 'probe.py'
    probe.write_text(
        'def converge(env, only=None):\n'
        '    return only\n'
        'class Tree:\n'
        '    def build(self, hostname, host=None):\n'
        '        env = host\n'
        '        return env.discovered.gpus\n'
        'def fine(environment, gpus):\n'
        '    return gpus\n'
        'f = lambda env: 1\n'
        'class Kept:\n'
        '    def run(self):\n'
        '        return self.env.store\n')
    assert env_receivers(str(probe)) == {
        'converge': ['1: parameter env'],
        'Tree.build': ['6: reads env.discovered'],
        '<module>': ['9: parameter env'],
        'Kept.run': ['12: reads self.env.store']}


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


# --- each rule written once (issue 40) ---------------------------------------
#
# Each rule that was written two or three times lives in one module now
# (``tests/unit/project/test_rules_once.py`` tests each one); a second
# copy of it fails here.

def _tree(path):
    with open(path, encoding='utf-8') as f:
        return ast.parse(f.read(), path)


def _strings_in(tree):
    """The string constants of ``tree`` that are not docstrings (parts of
    an f-string and of implicit concatenations come joined)."""
    skip = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and id(node) not in skip:
            yield node.value


def _attribute_calls_in(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and isinstance(
                    func.value, ast.Name):
                yield '%s.%s' % (func.value.id, func.attr)


def _product_files():
    for path in sorted(our_modules().values()):
        yield os.path.relpath(path, PACKAGE_DIR), path


def copies(check, files=None):
    """``{path relative to the package: [what]}`` of the product modules
    where ``check`` (``tree -> [what]``) finds something."""
    found = {}
    for rel, path in (files if files is not None else _product_files()):
        hits = check(_tree(path))
        if hits:
            found[rel] = hits
    return found


# each rule: what its copies look like, and the one module allowed them
def _custom_patterns(tree):
    return [s for s in _strings_in(tree)
            if s.startswith('CUSTOM_[')
            or s in ('[^A-Z0-9_]+', '[^0-9A-Za-z]+')]


def _normalizer_calls(tree):
    return [c for c in _attribute_calls_in(tree)
            if c.endswith('.normalize_name')]


def _vendor_words(tree):
    return [s for s in _strings_in(tree) if s == 'GRID']


def _selector_messages(tree):
    return [s for s in _strings_in(tree)
            if 'has no GPU there' in s or 'a VF of the GPU' in s
            or 'virtual function of' in s or '"all" stands alone' in s]


def _flocks(tree):
    return [c for c in _attribute_calls_in(tree) if c == 'fcntl.flock']


def _json_records(tree):
    return [c for c in _attribute_calls_in(tree)
            if c in ('statedir.read_json', 'statedir.write_json',
                     'statedir.locked_entries')]


RULES_ONCE = [
    ('the CUSTOM_ pattern and normalizer', _custom_patterns, set()),
    # Nova's own _get_rc_for_dev, reproduced as Nova runs it (nova-config
    # compares what Nova will make of a device)
    ('a CUSTOM_ normalizer call', _normalizer_calls, {'cmd/nova_cmds.py'}),
    ('the NVIDIA/GRID word', _vendor_words, {'objects.py'}),
    ('the GPU selector refusals', _selector_messages,
     {'devices/selectors.py'}),
    # the simulated NVIDIA library's own lock, no state file of ours
    ('a flock', _flocks, {'store/statedir.py', 'simulator/nvml.py'}),
    ('a versioned JSON record', _json_records, {'store/recordfile.py'}),
]


@pytest.mark.parametrize('what, check, allowed', RULES_ONCE,
                         ids=[r[0] for r in RULES_ONCE])
def test_each_rule_is_written_once(what, check, allowed):
    found = copies(check)
    assert set(found) <= allowed, (
        '%s written again (the one copy: %s): %s'
        % (what, sorted(allowed) or 'objects.py, by hand', found))
    # and the one copy is there
    for rel in allowed - {'cmd/nova_cmds.py', 'simulator/nvml.py'}:
        assert rel in found, (what, rel)


def test_the_copy_check_sees_a_copy(tmp_path):
    probe = tmp_path / 'probe.py'
    probe.write_text(
        '"""GRID in a docstring is no copy."""\n'
        'import fcntl, re\n'
        "RC = r'CUSTOM_[A-Z0-9_]+'\n"
        "WORDS = ('NVIDIA', 'GRID')\n"
        'def f(fd, statedir, os_traits):\n'
        "    fcntl.flock(fd, 2)\n"
        "    os_traits.normalize_name('x')\n"
        "    statedir.read_json('p', 1)\n"
        "    return 'names %s, but this host has no GPU there'\n")
    files = [('probe.py', str(probe))]
    for what, check, _allowed in RULES_ONCE:
        assert list(copies(check, files)) == ['probe.py'], what
    # a docstring naming a word is no copy of its rule
    probe.write_text('"""GRID T4-2B, fcntl.flock"""\n')
    for what, check, _allowed in RULES_ONCE:
        assert copies(check, files) == {}, what


# --- the kind contract: a core and declared capabilities ---------------------

def contract_faults(cls):
    """What is wrong with the vGPU kind ``cls`` against the contract: a
    core member (``base.CORE``) it lacks, a declared capability's member
    it leaves abstract, and a member of a capability it does not declare
    that it defines anyway (so that no caller could find it but by
    ``getattr``)."""
    from libvirt_gpu.devices.backends import base
    from libvirt_gpu.devices import capabilities
    faults = ['core: %s' % name for name in base.CORE
              if name not in dir(cls)]
    faults += ['abstract: %s' % name
               for name in sorted(getattr(cls, '__abstractmethods__', ()))]
    declared = capabilities.declared(cls)
    own = set()
    for klass in cls.__mro__:
        if klass in (base.VgpuKind, base.DeviceBackend, object) or \
                issubclass(klass, capabilities.Capability):
            continue
        own.update(klass.__dict__)
    for capability in capabilities.CAPABILITIES:
        if capability in declared:
            continue
        members = set(capability.MEMBERS) - {
            m for c in declared for m in c.MEMBERS}
        faults += ['undeclared %s: %s' % (capability.__name__, name)
                   for name in sorted(members & own)]
    return faults


def _kinds_to_check():
    from libvirt_gpu.devices.backends import registry
    from tests.doubles import toy_kind
    return list(registry.kind_classes()) + [toy_kind.ToyKind,
                                            toy_kind.FullToyKind]


def test_every_kind_holds_the_core_and_exactly_what_it_declares():
    from libvirt_gpu.devices import capabilities
    kinds = _kinds_to_check()
    assert {cls.__name__: contract_faults(cls) for cls in kinds} == {
        cls.__name__: [] for cls in kinds}
    # the capabilities are each some kind's, and each is small
    declared = {c for cls in kinds for c in capabilities.declared(cls)}
    assert declared == set(capabilities.CAPABILITIES)
    assert all(1 <= len(c.MEMBERS) <= 6 for c in capabilities.CAPABILITIES)


def test_the_core_is_about_a_dozen_members():
    from libvirt_gpu.devices.backends import base
    assert len(base.CORE) <= 13
    assert set(base.CORE) >= base.VgpuKind.__abstractmethods__


def test_the_contract_check_can_fail():
    """A kind that lacks a core member, leaves a declared capability's
    member abstract, or defines a capability's member without declaring
    it is caught."""
    from libvirt_gpu.devices import capabilities
    from tests.doubles import toy_kind

    class Rooms(toy_kind.ToyKind):
        def room(self, gpu, type_id):
            return None

    class Carves(toy_kind.ToyKind, capabilities.Carvable):
        def held_type(self, parent):
            return None

    class Hollow(toy_kind.ToyKind):
        in_devices = None

    del Hollow.in_devices
    Hollow.__abstractmethods__ = frozenset({'in_devices'})
    assert contract_faults(Rooms) == ['undeclared DriverRooms: room']
    assert contract_faults(Carves) == ['abstract: clear_type',
                                       'abstract: write_type']
    assert 'abstract: in_devices' in contract_faults(Hollow)


def test_each_kind_is_named_as_its_entry_point():
    from libvirt_gpu.devices.backends import registry
    found = registry.installed()
    assert [name for name, _ in found][-1] == registry.FALLBACK
    assert [(name, registry.load_kind(spec).name) for name, spec in found] \
        == [(name, name) for name, _ in found]


def test_layout_apply_imports_no_kind():
    path = os.path.join(PACKAGE_DIR, 'host', 'layout_apply.py')
    kinds = [name for name in imports_of(path, PACKAGE)
             if _in(name[len(PACKAGE) + 1:], 'devices.backends')
             and name[len(PACKAGE) + 1:] not in KIND_CONTRACT]
    assert kinds == []


# The members of the contract: no module asks a kind for one by name
# (``name``, which every record has, aside).
def _contract_members():
    from libvirt_gpu.devices.backends import base
    from libvirt_gpu.devices import capabilities
    return (set(base.CORE) | {m for c in capabilities.CAPABILITIES
                              for m in c.MEMBERS}) - {'name'}


def asked_by_name(path, members):
    """``line: call`` of each ``getattr``/``hasattr`` in ``path`` whose
    name is a member of the kind contract (a caller that asks instead of
    dispatching by the declared capability)."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    return sorted(
        '%d: %s(%r)' % (node.lineno, node.func.id, node.args[1].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        and node.func.id in ('getattr', 'hasattr') and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
        and node.args[1].value in members)


def test_no_module_asks_a_kind_for_a_member_by_name(tmp_path):
    members = _contract_members()
    found = {name: asked_by_name(path, members)
             for name, path in our_modules().items()}
    assert {name: calls for name, calls in found.items() if calls} == {}
    probe = tmp_path / 'probe.py'
    probe.write_text("def f(kind):\n"
                     "    read = getattr(kind, 'room', None)\n"
                     "    return hasattr(kind, 'held_type')\n")
    assert asked_by_name(str(probe), members) == [
        "2: getattr('room')", "3: hasattr('held_type')"]
