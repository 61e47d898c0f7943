"""libvirt_gpu's rooms as docs/dev/architecture.md draws them, and the
walk over their imports that tests/unit/project/test_architecture.py
checks them by: ``LEVELS`` (the rooms from the floor up), ``FOLDERS``
(the folders under the package root), ``FOLDER_ARROWS_EXCUSED``,
``imports_of`` (every import of a file, at any depth), ``door_graph``
(the package's modules and the modules of ours each imports),
``folder_graph`` (the same between folders), and ``names_outside_kinds``
(the files that spell a vGPU kind's sysfs names outside its module)."""

import ast
import os
import sys

import libvirt_gpu

PACKAGE_DIR = os.path.dirname(os.path.abspath(libvirt_gpu.__file__))
ROOT = os.path.dirname(PACKAGE_DIR)
PACKAGE = 'libvirt_gpu'

# The rooms from the floor up, as docs/dev/architecture.md's table lists them
# (rooms on one row share a rank): a room imports only rooms of its rank or
# below, with no exception.
LEVELS = (
    ('exception', 'util.records', 'util.logs', 'util.bounds'), ('objects',),
    ('devices.capacity', 'devices.capabilities'),
    ('util.fileutil', 'util.filetype', 'util.textutil', 'util.fanout',
     'util.safeopen', 'util.jsonutil'),
    ('util.xmlutil', 'store.statedir', 'util.xmledit', 'util.cachefiles',
     'conffile',
     'devices.enablement', 'devices.carving', 'devices.routes',
     'devices.layout', 'devices.layout_plan', 'devices.selectors',
     'store.recordfile', 'store.carved', 'store.vendor_vgpus'),
    ('store.figures',), ('devices.pci_classes', 'devices.pciids'),
    ('devices.sysfs',), ('virt.nodedev',), ('virt.config_xml',),
    ('virt.metadata',), ('virt.host', 'virt.guest'), ('devices.nvml',),
    ('devices.discovery',), ('conf', 'confcache'), ('devices.backends',),
    ('host.layout_apply',),
    ('store.state',), ('host.allocator',), ('openstack.placement',),
    ('openstack.cyborg_objects',),
    ('environment',), ('guests.migration', 'guests.holders'),
    ('guests.api',), ('guests.hook',),
    ('guests.reconcile',), ('host.restore',), ('openstack.agent',),
    ('exporter',), ('openstack.cyborg_driver',), ('simulator',), ('cmd',),
)
# discovery, below the kinds, takes them from its caller (an Environment's
# kind_classes) and imports no kind and no registry (issue 27).

# The folders that group the rooms by what they are about (not by layer:
# a folder holds rooms of several ranks): packages that hold rooms and
# nothing else (their __init__ is a docstring), so no room of their own.
FOLDERS = {'util': 'helpers below every layer: records, files, XML, bounds',
           'virt': 'the libvirt layer: connection, domain, XML',
           'devices': 'the host side: its GPUs and the vGPU kinds',
           'store': "the host's state: leases, figures, the record files",
           'guests': 'the guest side: API, migration, hook, reconcile',
           'host': 'the host as a whole: its capacity handed out, restore',
           'openstack': 'the OpenStack side: Placement, Cyborg, the agent'}


def _module_name(path):
    rel = os.path.relpath(path, ROOT)[:-len('.py')].split(os.sep)
    if rel[-1] == '__init__':
        rel = rel[:-1]
    return '.'.join(rel)


def our_modules():
    """``{module name: path}`` of every module of the package."""
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
    modules = our_modules()
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


# Known arrows back up between two folders, as (importer, imported): the
# folder-level circle check drops the importer's arrows into the imported
# folder, and fails once one is gone, so that the tuple is emptied as
# they are removed.  Empty it; add to it never.
FOLDER_ARROWS_EXCUSED = ()


def folder_of(name, top=False):
    """The folder module ``name`` (package-relative, dotted) is in: the
    package it is (a folder's ``__init__``) or the package it is in; with
    ``top``, the folder under the package root.  A module at the package
    root is a folder of its own."""
    parts = name.split('.')
    if top or len(parts) == 1:
        return parts[0]
    if os.path.isdir(os.path.join(PACKAGE_DIR, *parts)):
        return name
    return '.'.join(parts[:-1])


def folder_graph(graph, top=False, excused=()):
    """``{folder: {folder: [(module, module it imports), ...]}}`` of the
    module graph ``graph``: an arrow from one folder to another for each
    import between their modules (at any depth: ``door_graph``'s), but an
    import of a package the importer is inside (its namespace, as in
    ``import_circles``) and the arrows of ``excused`` ((importer,
    imported) folders)."""
    found = {}
    for module, targets in graph.items():
        for target in targets:
            if _in(module, target):
                continue                # the package the module is in
            a, b = folder_of(module, top), folder_of(target, top)
            if a == b or (a, b) in excused:
                continue
            found.setdefault(a, {}).setdefault(b, []).append(
                (module, target))
    return found


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
