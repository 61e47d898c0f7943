"""What the CLI imports and how it writes: the cold-start rules.

``list --json`` on a large host must not pay for what it does not use
(keystoneauth1 costs ~100 ms to import, libvirt is for libvirt sources,
the simulator for ``simulate``, ``logging`` for a command that logs, and
neither lxml, dataclasses nor typing is needed at all); its JSON is one
compact document for scripts and an indented one on a terminal.
"""

import io
import json
import os
import subprocess
import sys

import pytest

from libvirt_gpu import simulator
from libvirt_gpu.cmd import output
from tests.doubles import paths

GOLDEN = os.path.join(paths.TESTS, 'data',
                      'golden')
NOT_FOR_LIST = ('keystoneauth1', 'libvirt', 'lxml', 'libvirt_gpu.simulator',
                'libvirt_gpu.openstack.cyborg_objects',
                'libvirt_gpu.virt.host')
# Once the settings snapshot is written (the first run loads oslo.config,
# which imports logging and typing itself), not even these.
NOT_FOR_WARM_LIST = NOT_FOR_LIST + ('oslo_config', 'logging', 'dataclasses',
                                    'typing')

# Runs the CLI in a fresh interpreter, then names on stderr which of the
# modules above it imported.
PROBE = '''
import json, sys
from libvirt_gpu.cmd import main
code = main.main(sys.argv[2:])
sys.stdout.flush()
sys.stderr.write('\\nIMPORTED %s\\n' % json.dumps(
    sorted(m for m in json.loads(sys.argv[1]) if m in sys.modules)))
sys.exit(code)
'''


@pytest.fixture(scope='module')
def t4(tmp_path_factory):
    root = tmp_path_factory.mktemp('t4')
    node_xml = simulator.write_host(simulator.load_profile('t4'), root)
    return str(root), 'test://' + node_xml


def _probe(*argv, unwanted=NOT_FOR_LIST):
    done = subprocess.run(
        [sys.executable, '-c', PROBE, json.dumps(unwanted)] + list(argv),
        capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    imported = json.loads(done.stderr.rsplit('IMPORTED ', 1)[1])
    return done.stdout, imported


def test_list_json_imports_only_what_it_uses(t4):
    t4_root, _ = t4
    # With a configuration that enables a type, as on a real host.
    out, imported = _probe('--config-file', os.path.join(GOLDEN, 't4.conf'),
                           '--sysfs-root', t4_root, 'list', '--json')
    assert imported == []
    warm_out, imported = _probe(
        '--config-file', os.path.join(GOLDEN, 't4.conf'), '--sysfs-root',
        t4_root, 'list', '--json', unwanted=NOT_FOR_WARM_LIST)
    assert imported == []
    assert warm_out == out
    gpus = json.loads(out)
    assert {g['address']: g['mode'] for g in gpus} == {
        '0000:af:00.0': 'vgpu', '0000:3b:00.0': 'pgpu'}


def test_probe_sees_imports(t4):
    t4_root, t4_uri = t4
    # The probe itself can fail: a libvirt source does import libvirt.
    _, imported = _probe('--config-file', os.path.join(GOLDEN, 't4.conf'),
                         '-c', t4_uri, '--sysfs-root', t4_root, 'list',
                         '--json')
    assert 'libvirt' in imported


class _Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize('stream_class,lines', [(io.StringIO, 1),
                                                (_Terminal, 10)])
def test_json_compact_for_scripts_indented_on_a_terminal(stream_class,
                                                         lines):
    # a stream of its own at each run (mutmut runs a test more than once
    # in one process)
    stream = stream_class()
    document = {'b': [1, {'y': None, 'x': 'é'}], 'a': True}
    output.emit_json(document, stream)
    text = stream.getvalue()
    assert text.endswith('\n')
    assert len(text.splitlines()) == lines
    assert json.loads(text) == document
    assert text.index('"a"') < text.index('"b"')       # sorted keys


def test_report_text_has_one_shape():
    class Report:
        COLUMNS = ('ACTION', 'WHAT')

        def summary(self):
            return '1 change(s)'

        def rows(self):
            return [('created', None)]

        def details(self):
            return ['more']

    assert output.report_text(Report()).splitlines() == [
        '1 change(s)', 'ACTION   WHAT', '-------  ----', 'created  -', 'more']


def test_json_reaches_a_terminal_escaped_once():
    """emit_json bypasses cmd.term's escaping (json.dumps has escaped every
    control character already) and the terminal still sees no control
    character."""
    from libvirt_gpu.cmd import term
    under = _Terminal()
    document = {'name': 'GPU\x1b]0;owned\x07\u202e', 'ok': 'é'}
    output.emit_json(document, term.EscapingStream(under))
    text = under.getvalue()
    assert json.loads(text) == document
    assert text.isascii() and '\x1b' not in text and '\\u001b' in text
    assert all(c == '\n' or ' ' <= c <= '~' for c in text)


@pytest.mark.parametrize('profile', simulator.list_profiles())
def test_list_json_is_written_with_sorted_keys(tmp_path, profile):
    """list --json builds its dicts with sorted keys and skips the
    encoder's sort: the text must be what sort_keys=True writes."""
    root = tmp_path / 'sys'
    simulator.write_host(simulator.load_profile(profile), root)
    out, _ = _probe('--sysfs-root', str(root), 'list', '--json')
    document = json.loads(out)
    assert document and any(g['mdev_types'] or g['iommu_members']
                            for g in document)
    assert out == json.dumps(document, sort_keys=True,
                             separators=(',', ':')) + '\n'


@pytest.mark.parametrize('documents', [
    [],
    [{'mdev_types': []}],
    [{'address': 'a', 'mdev_types': [{'id': 'x'}]}],
    [{'mdev_types': [{'id': 'x'}], 'mdevs': []}],
    # names that look like the key, quotes, controls and non-ASCII
    [{'a': '"mdev_types":[', 'mdev_types': [{'id': '],"z":"\x1b\u202e'}],
      'z': {'mdev_types': ['}']}}],
])
def test_gpus_json_text_is_the_encoders_text(documents):
    shared = {'id': 'shared', 'available_instances': 1}
    documents = documents + [{'b': 1, 'mdev_types': [shared, shared],
                              'n': None}] * 3
    assert output.gpus_json_text(documents) == json.dumps(
        documents, separators=(',', ':'))


def test_type_memo_changes_nothing_in_the_document(tmp_path):
    from libvirt_gpu.devices import discovery
    from tests.doubles import kinds
    from libvirt_gpu.devices import sysfs
    root = tmp_path / 'sys'
    simulator.write_host(simulator.synthetic_profile(8, types=5), root)
    gpus = discovery.from_sysfs(sysfs.Sysfs(root),
                                kinds=kinds.registered()).gpus
    memo = {}
    with_memo = [output.gpu_to_json(g, type_memo=memo) for g in gpus]
    assert with_memo == [output.gpu_to_json(g) for g in gpus]
    # parents of one model share records, so the memo holds fewer dicts
    # than the document has types
    assert 0 < len(memo) < sum(len(g['mdev_types']) for g in with_memo)
