"""A UUID, a vGPU type id and a PCI address are parsed once, where they
enter the program, into ``objects.Uuid``, ``objects.TypeId`` and
``objects.PciAddress``; the layers below take those values and never parse
text again (docs/dev/architecture.md).

An AST walk over libvirt_gpu/ finds every reference to a parser (a call,
or the function taken as a value); only the edge modules listed here may
hold one.  A failure names the module and the line.
"""

import ast
import os
import pickle

import pytest

import libvirt_gpu
from libvirt_gpu import exception
from libvirt_gpu import objects

PACKAGE_DIR = os.path.dirname(os.path.abspath(libvirt_gpu.__file__))

# What parses text into one of the three types.
PARSERS = ('Uuid.parse', 'TypeId.parse', 'PciAddress.parse',
           'validate_uuid', 'validate_type_id')

# module (package-relative) -> why it is an edge: where text enters.
EDGES = {
    # defines the types; vendor_type_id makes a TypeId of a number,
    # PciAddress.from_libvirt_name reads libvirt's pci_DDDD_BB_SS_F
    'objects': 'the types themselves',
    # [gpu]/enabled_vgpu_types, checked as the groups are registered
    'conf.vgpu': 'the configuration',
    # [vgpu_<type>]/device_addresses and the enabled type ids
    'devices.enablement': 'the configuration',
    # [nova_<name>]/gpus, vgpu_type
    'devices.carving': 'the configuration',
    # the record of carved VFs (nova-carved.json)
    'store.carved': 'the record of carved VFs',
    # [routes]/cyborg, nova.conf's device_addresses, the hook snapshot's
    'devices.routes': 'the routes of the configuration and of nova.conf',
    # the hook's settings snapshot (a JSON file of resolved settings)
    'guests.hook.settings': "the hook's configuration snapshot",
    # bus/pci/devices, mdev_supported_types, bus/mdev/devices, links
    'devices.sysfs.devices': 'sysfs',
    'devices.sysfs.reader': 'sysfs (paths built from a caller\'s value)',
    # the mdev's sysfs links (parent, mdev_type) and mdevctl's files
    'devices.backends.mdev': "sysfs links and mdevctl's definition files",
    # names of the PCI functions with NVIDIA's vendor interface
    'devices.backends.nvidia_vgpu.files': "the vendor interface's sysfs",
    # the kind's own JSON state file
    'devices.backends.nvidia_vgpu.statefile': "the kind's state file",
    # NVML's bus ids and mdev UUIDs
    'devices.nvml': 'NVML',
    # libvirt's node-device XML
    'virt.nodedev': "libvirt's node-device XML",
    # the domain XML (<uuid>, <hostdev> sources)
    'virt.config_xml': 'domain XML',
    # our <gpu:gpus> metadata inside the domain XML
    'virt.metadata': 'domain XML (our metadata)',
    # a domain named on the command line (UUID or name)
    'virt.host': "a domain's name or UUID as the user gave it",
    # virDomainGetUUIDString
    'virt.guest': "libvirt's answer",
    # rows of the lease store (SQLite text)
    'store.state': 'the lease store',
    # the public API's arguments (attach/detach)
    'guests.api': "the API's arguments",
    # `libvirt-gpu types ADDRESS`
    'cmd.host_cmds': 'command-line arguments (types ADDRESS)',
    # `libvirt-gpu layout apply --gpu ADDRESS`, and libvirt's domain UUIDs
    'cmd.layout_cmds': "command-line arguments and libvirt's answer",
    # [layout_<name>]/vgpu_types
    'devices.layout': 'the configuration',
    # provider names read back from Placement
    'openstack.placement.model': "Placement's provider names",
    # the simulator stands in for the kernel: its profile files, and
    # what is written to its files
    'simulator.kernel': 'the simulated kernel\'s input',
    'simulator.live': 'the simulated kernel\'s input (FUSE writes)',
    'simulator.loading': 'the simulator\'s profile files',
    'simulator.nodexml': 'the simulator\'s profile files',
    'simulator.profile': 'the simulator\'s profile files',
}


def _dotted(node):
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return '.'.join(reversed(parts))
    return None


def parser_references(path):
    """``line: name`` of each reference to a parser in ``path`` (a call or
    the function itself: an alias counts)."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Attribute, ast.Name)):
            dotted = _dotted(node)
            if dotted is None:
                continue
            for name in PARSERS:
                if dotted == name or dotted.endswith('.' + name):
                    found.append('%d: %s' % (node.lineno, dotted))
    return sorted(set(found), key=lambda s: (int(s.split(':')[0]), s))


def _modules():
    found = {}
    for dirpath, dirnames, filenames in os.walk(PACKAGE_DIR):
        dirnames[:] = [d for d in dirnames if d != '__pycache__']
        for filename in filenames:
            if not filename.endswith('.py'):
                continue
            path = os.path.join(dirpath, filename)
            rel = os.path.relpath(path, PACKAGE_DIR)[:-3].replace(os.sep, '.')
            if rel.endswith('.__init__'):
                rel = rel[:-len('.__init__')]
            found[rel] = path
    return found


def test_only_the_edges_parse_text():
    found = {}
    for name, path in _modules().items():
        if name in EDGES:
            continue
        refs = parser_references(path)
        if refs:
            found[name] = refs
    assert found == {}, (
        'these modules parse text again; take an objects.Uuid / TypeId / '
        'PciAddress from the caller (or, for a new edge, list it in EDGES '
        'with the reason)')


def test_every_listed_edge_exists_and_parses():
    modules = _modules()
    for name in EDGES:
        assert name in modules, name
        assert parser_references(modules[name]), (
            '%s parses nothing: take it off EDGES' % name)


def test_the_walk_sees_calls_and_aliases(tmp_path):
    probe = tmp_path / 'probe.py'
    probe.write_text(
        'from libvirt_gpu import objects\n'
        'def f(uuid, parent):\n'
        '    uuid = objects.Uuid.parse(uuid)\n'
        '    parse = objects.PciAddress.parse\n'
        '    return objects.TypeId.parse("x"), validate_uuid(uuid)\n'
        'objects.typed(1, objects.Uuid, "u")\n')
    assert parser_references(str(probe)) == [
        '3: objects.Uuid.parse', '4: objects.PciAddress.parse',
        '5: objects.TypeId.parse', '5: validate_uuid']   # line, then name


def test_an_inner_module_that_parses_fails_the_check(tmp_path, monkeypatch):
    inner = tmp_path / 'inner.py'
    inner.write_text('from libvirt_gpu import objects\n'
                     'def get(uuid):\n'
                     '    return objects.Uuid.parse(uuid)\n')
    real = _modules()
    monkeypatch.setitem(globals(), '_modules',
                        lambda: dict(real, **{'store.probe': str(inner)}))
    with pytest.raises(AssertionError, match='store.probe'):
        test_only_the_edges_parse_text()


# --- the types ---------------------------------------------------------------

U = '4B20D080-1B54-4048-85B3-A6A62D165C01'


def test_a_uuid_is_made_by_parse_only_and_kept_as_is():
    u = objects.Uuid.parse(U)
    assert u == U.lower() and type(u) is objects.Uuid
    assert objects.Uuid.parse(u) is u           # no second parse
    assert isinstance(u, str) and {u: 1}[U.lower()] == 1
    with pytest.raises(TypeError, match=r'Uuid\.parse'):
        objects.Uuid(U)
    with pytest.raises(exception.InvalidUuid):
        objects.Uuid.parse(U + '\n')
    assert pickle.loads(pickle.dumps(u)) == u
    assert type(pickle.loads(pickle.dumps(u))) is objects.Uuid
    new = objects.Uuid.new()
    assert type(new) is objects.Uuid and objects.Uuid.parse(str(new)) == new
    assert not hasattr(u, '__dict__')


def test_a_type_id_is_made_by_parse_only_and_kept_as_is():
    t = objects.TypeId.parse('nvidia-223')
    assert t == 'nvidia-223' and type(t) is objects.TypeId
    assert objects.TypeId.parse(t) is t
    with pytest.raises(TypeError, match=r'TypeId\.parse'):
        objects.TypeId('nvidia-223')
    with pytest.raises(exception.InvalidTypeId):
        objects.TypeId.parse('../nvidia-223')
    assert type(objects.vendor_type_id(1145)) is objects.TypeId


def test_inner_layers_refuse_raw_text():
    u = objects.Uuid.parse(U)
    assert objects.typed(u, objects.Uuid, 'uuid') is u
    with pytest.raises(TypeError, match=r'uuid must be an objects\.Uuid, '
                                        r'not str .*objects\.Uuid\.parse'):
        objects.typed(str(u), objects.Uuid, 'uuid')
