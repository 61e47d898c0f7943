"""The CLI end to end on simulated hosts: golden JSON, tables, errors."""

import json
import os
import subprocess
import sys

import pytest

from libvirt_gpu import simulator
from libvirt_gpu.cmd import main as cli
from libvirt_gpu.cmd import simulate_live
from tests.doubles import tables
from tests.doubles import paths
from libvirt_gpu.cmd import main as main_mod
import argparse
import libvirt_gpu
from libvirt_gpu.cmd import nova_cmds
from libvirt_gpu.devices import carving
from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.util import records
from tests.doubles import fakes

GOLDEN = os.path.join(paths.TESTS, 'data',
                      'golden')
T4_CONF = os.path.join(GOLDEN, 't4.conf')
T4_CYBORG_CONF = os.path.join(GOLDEN, 't4-cyborg.conf')


@pytest.fixture(scope='module')
def t4(tmp_path_factory):
    root = tmp_path_factory.mktemp('t4')
    node_xml = simulator.write_host(simulator.load_profile('t4'), root)
    return str(root), 'test://' + node_xml


def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def golden(name):
    with open(os.path.join(GOLDEN, name)) as f:
        return json.load(f)


@pytest.mark.parametrize('command,golden_file,conf', [
    (['list'], 't4-list.json', T4_CONF),
    (['placement', 'show'], 't4-placement.json', T4_CONF),
    (['discover'], 't4-discover.json', T4_CYBORG_CONF),
])
def test_golden_json_sysfs(capsys, t4, command, golden_file, conf):
    root, _ = t4
    code, out, err = run(capsys, '--config-file', conf, '--hostname',
                         'sim-t4', '--sysfs-root', root, *command, '--json')
    assert code == 0, err
    assert json.loads(out) == golden(golden_file)


def test_golden_placement_through_libvirt(capsys, t4):
    root, uri = t4
    code, out, err = run(capsys, '--config-file', T4_CONF, '--hostname',
                         'sim-t4', '-c', uri, '--sysfs-root', root,
                         'placement', 'show', '--json')
    assert code == 0, err
    assert json.loads(out) == golden('t4-placement.json')
    assert 'source: libvirt' in err


def test_list_through_libvirt_adds_names(capsys, t4):
    root, uri = t4
    code, out, _ = run(capsys, '--config-file', T4_CONF, '-c', uri,
                       '--sysfs-root', root, 'list', '--json')
    assert code == 0
    gpus = json.loads(out)
    assert {g['product_name'] for g in gpus} == {'TU104GL [Tesla T4]'}
    # The names sysfs gets from the PCI ID database are libvirt's.
    assert gpus == golden('t4-list.json')


def test_list_json_contract(capsys, t4):
    root, _ = t4
    _, out, _ = run(capsys, '--config-file', T4_CONF, '--sysfs-root', root,
                    'list', '--json')
    for gpu in json.loads(out):
        assert {'address', 'vendor_id', 'product_id', 'driver', 'numa_node',
                'iommu_group', 'mode', 'enabled_type', 'mdev_types',
                'mdevs'} <= set(gpu)
        for t in gpu['mdev_types']:
            assert set(t) == {'id', 'name', 'description', 'device_api',
                              'available_instances'}


def test_tables(capsys, t4):
    root, _ = t4
    code, out, _ = run(capsys, '--config-file', T4_CONF, '--sysfs-root',
                       root, 'list')
    assert code == 0
    assert 'source: sysfs' in out
    line = tables.row(out, '0000:af:00.0')
    assert [line[c] for c in ('MODE', 'ENABLED TYPE', 'CAPACITY',
                              'TYPES')] == ['vgpu', 'nvidia-223', '8', '17']
    code, out, _ = run(capsys, '--config-file', T4_CONF, '--sysfs-root',
                       root, 'types', '0000:af:00.0')
    assert 'GRID T4-2B ' in out and 'nvidia-321' in out
    code, out, _ = run(capsys, '--config-file', T4_CONF, '--hostname', 'h',
                       '--sysfs-root', root, 'placement', 'show')
    assert 'inventory VGPU total=8' in out
    assert 'CUSTOM_NVIDIA_1EB8_T4_2B' in out


def test_unknown_gpu_address(capsys, t4):
    root, _ = t4
    code, out, err = run(capsys, '--sysfs-root', root, 'types',
                         '0000:01:00.0')
    assert code == 1 and out == ''
    assert 'No GPU at 0000:01:00.0' in err and 'libvirt-gpu list' in err


def test_config_error_exit(capsys, t4, tmp_path):
    root, _ = t4
    conf = tmp_path / 'bad.conf'
    conf.write_text('[gpu]\nenabled_vgpu_types = nvidia-223\n'
                    '[vgpu_nvidia-223]\ndevice_addresses = 0000:3b:00.0, '
                    '0000:aa:00.0\n')
    code, out, err = run(capsys, '--config-file', str(conf), '--sysfs-root',
                         root, 'list')
    assert code == 1 and out == ''
    assert err.startswith('libvirt-gpu: error: Configuration error:')
    assert '0000:aa:00.0' in err


def test_simulate_command(capsys, tmp_path):
    code, out, _ = run(capsys, 'simulate', '--list')
    assert code == 0 and 't4' in out.split()
    code, out, _ = run(capsys, 'simulate', 'mixed', str(tmp_path / 's'),
                       '--json')
    assert code == 0
    doc = json.loads(out)
    assert os.path.isfile(doc['node_xml'])
    assert os.path.isdir(tmp_path / 's' / 'bus' / 'pci' / 'devices')
    code, _, err = run(capsys, 'simulate', 'no-such-profile',
                       str(tmp_path / 'x'))
    assert code == 1 and 'no-such-profile' in err


def test_console_script_help():
    out = subprocess.run([sys.executable, '-m', 'libvirt_gpu.cmd.main',
                          '--help'], capture_output=True, text=True,
                         check=True).stdout
    for word in ('list', 'types', 'placement', 'discover', 'simulate',
                 '--connect', '--sysfs-root', 'LIBVIRT_GPU_CONFIG'):
        assert word in out


def test_live_option_defaults_match_the_simulator():
    from libvirt_gpu.simulator import kernel
    from libvirt_gpu.simulator import live
    assert simulate_live.LIVE_BUSY_MODES == kernel.BUSY_MODES
    assert simulate_live.LIVE_PROBE_DELAY == live.PROBE_DELAY


def test_simulate_live_help():
    out = subprocess.run([sys.executable, '-m', 'libvirt_gpu.cmd.main',
                          'simulate', '--help'], capture_output=True,
                         text=True, check=True).stdout
    for word in ('--live', '--busy-remove', '--no-uevents', 'mount point'):
        assert word in out


def test_version_is_the_package_version():
    import libvirt_gpu
    from importlib import metadata
    out = subprocess.run([sys.executable, '-m', 'libvirt_gpu.cmd.main',
                          '--version'], capture_output=True, text=True,
                         check=True).stdout
    assert out == 'libvirt-gpu %s\n' % libvirt_gpu.__version__
    # setup.py takes it from the package: what pip installed says the same
    assert metadata.version('libvirt-gpu') == libvirt_gpu.__version__


# --- What ``make mutation`` found open (docs/dev/mutation.md) ---
# Behaviours a random sample of ``make mutation`` over the round's modules
# found unguarded, in modules whose own tests run the program as another
# process (which never runs a mutant): each pinned here in the test's own
# process.

# --- cmd.main ----------------------------------------------------------------

@pytest.mark.parametrize('value', ['0', '-3', 'wide', ''])
def test_columns_not_a_positive_count_fall_back(monkeypatch, value):
    monkeypatch.setenv('COLUMNS', value)
    monkeypatch.setattr(os, 'get_terminal_size',
                        lambda fd: os.terminal_size((132, 40)))
    assert main_mod._columns() == 132


def test_columns_from_the_environment_win(monkeypatch):
    monkeypatch.setenv('COLUMNS', '1')
    monkeypatch.setattr(os, 'get_terminal_size',
                        lambda fd: os.terminal_size((132, 40)))
    assert main_mod._columns() == 1


# --- what make mutation found ----------------------------------------------
#
# The CLI's behaviours a sample of ``make mutation`` found unguarded:
# nova-config's texts, bounds and parsing of a Nova file, the judging of
# each carved VF and alias (exact lines, first match wins), and the parsers'
# options, defaults and refusals.  In process (``main(argv)``) and on hand-
# built records: every test here is fast and runs alone.

PF = objects.PciAddress.parse('0000:af:00.0')
VF4 = objects.PciAddress.parse('0000:af:00.4')
VF5 = objects.PciAddress.parse('0000:af:00.5')
TYPE = objects.TypeId.parse('nvidia-1153')
OTHER = objects.TypeId.parse('nvidia-1154')
RC = 'CUSTOM_NVIDIA_L40S_12Q'
CARVING = carving.Carving(name='l40s_12q', selectors=(), type_id=TYPE,
                          count=2)


def _uuid(n):
    return objects.Uuid.parse('00000000-0000-0000-0000-%012d' % n)


def _vf(address, *held):
    return records.replace(
        fakes.gpu(str(address), types=(), product_id='26b9',
                  mdevs=tuple(objects.Mdev(uuid=_uuid(n), type_id=t)
                              for n, t in enumerate(held, 1))),
        physfn=PF)


def _pf(*vfs):
    return records.replace(fakes.gpu(str(PF), types=(), product_id='26b9'),
                           virtfns=tuple(v.address for v in vfs),
                           vf_gpus=tuple(vfs))


def _carved(*vfs, **changes):
    found = carving.CarvedGpu(
        carving=CARVING, gpu=PF, vfs=tuple(vfs), type_name='NVIDIA L40S-12Q',
        vendor_id='10de', product_id='26b9', resource_class=RC,
        alias='l40s-12q')
    return records.replace(found, **changes) if changes else found


def _config(*carved, versions=None):
    return nova_cmds.nova_config(
        carved, versions or nova_cmds.Versions(libvirt=9000000,
                                               qemu=8000000),
        'compute-1', '/etc/libvirt-gpu/libvirt-gpu.conf')


def _spec(address=VF4, **changes):
    found = {'vendor_id': '10de', 'product_id': '26b9',
             'address': str(address), 'managed': 'no', 'resource_class': RC}
    found.update(changes)
    return {k: v for k, v in found.items() if v is not None}


ALIAS = {'name': 'l40s-12q', 'device_type': 'type-VF', 'resource_class': RC,
         'vendor_id': '10de', 'product_id': '26b9'}


def _file(specs=(), aliases=(), problems=()):
    return nova_cmds.NovaFile(
        specs=tuple(nova_cmds.NovaEntry(key='device_spec', line=n, value=v)
                    for n, v in specs),
        aliases=tuple(nova_cmds.NovaEntry(key='alias', line=n, value=v)
                      for n, v in aliases),
        problems=tuple(problems))


# --- versions ----------------------------------------------------------------

@pytest.mark.parametrize('number, text', [
    (None, '?'), (10000000, '10.0.0'), (8002002, '8.2.2'),
    (12345678, '12.345.678'), (0, '0.0.0')])
def test_version_text(number, text):
    assert nova_cmds.version_text(number) == text


@pytest.mark.parametrize('libvirt, qemu, migratable', [
    (10000000, 8002002, True),
    (9999999, 8002002, False),
    (10000000, 8002001, False),
    (None, 8002002, False),
    (10000000, None, False),
])
def test_live_migratable_bounds(libvirt, qemu, migratable):
    assert nova_cmds.Versions(libvirt=libvirt,
                              qemu=qemu).live_migratable is migratable


def test_versions_describe_each_way():
    assert nova_cmds.Versions(libvirt=10000000, qemu=8002002).describe() == (
        'libvirt 10.0.0, QEMU 8.2.2: "live_migratable": "yes" (Nova needs '
        'libvirt >= 10.0.0 and QEMU >= 8.2.2)')
    assert nova_cmds.Versions(libvirt=9001000, qemu=8002002).describe() == (
        'libvirt 9.1.0, QEMU 8.2.2: "live_migratable" left out (Nova needs '
        'libvirt >= 10.0.0 and QEMU >= 8.2.2)')
    assert nova_cmds.Versions(error='no socket').describe() == (
        'libvirt and QEMU versions unknown (no socket): "live_migratable" '
        'left out')


def test_host_versions_of_a_libvirt_that_answers_and_one_that_does_not(
        tmp_path):
    found = nova_cmds.host_versions('test:///default')
    assert found.error is None
    assert found.libvirt > 0 and found.qemu is not None
    uri = 'qemu+unix:///system?socket=%s/none' % tmp_path
    gone = nova_cmds.host_versions(uri)
    assert (gone.libvirt, gone.qemu) == (None, None)
    assert gone.error.startswith('libvirt at %s: cannot connect to libvirt '
                                 'at %s: ' % (uri, uri))
    assert '\n' not in gone.error


# --- what nova-config prints -------------------------------------------------

def test_device_spec_and_alias_records():
    spec = nova_cmds.DeviceSpec(vendor_id='10de', product_id='26b9',
                                address=VF4, resource_class=RC)
    assert spec.to_json() == _spec()
    assert records.replace(spec, live_migratable=True).to_json() == dict(
        _spec(), live_migratable='yes')
    assert nova_cmds.Alias(name='l40s-12q', resource_class=RC,
                           vendor_id='10de',
                           product_id='26b9').to_json() == ALIAS


def test_nova_config_one_spec_per_vf_one_alias_per_name_sorted():
    other = _carved(VF5, alias='a-first', resource_class='CUSTOM_A',
                    product_id='26ba')
    again = _carved(VF4, resource_class='CUSTOM_SECOND')
    config = _config(_carved(VF4), other, again,
                     versions=nova_cmds.Versions(libvirt=10000000,
                                                 qemu=8002002))
    assert [s.to_json() for s in config.device_specs] == [
        dict(_spec(), live_migratable='yes'),
        dict(_spec(VF5, resource_class='CUSTOM_A', product_id='26ba'),
             live_migratable='yes'),
        dict(_spec(resource_class='CUSTOM_SECOND'), live_migratable='yes')]
    # one alias per name, the first carving's, in name order
    assert [a.to_json() for a in config.aliases] == [
        dict(ALIAS, name='a-first', resource_class='CUSTOM_A',
             product_id='26ba'), ALIAS]
    assert config.hostname == 'compute-1'
    assert config.source == '/etc/libvirt-gpu/libvirt-gpu.conf'
    assert len(config.carved) == 3


def test_the_text_line_by_line():
    config = _config(_carved(VF4, VF5), _carved(VF5, type_name=None))
    assert config.text().splitlines() == [
        '# Generated by `libvirt-gpu nova-config` on compute-1 from the '
        'carvings',
        '# of /etc/libvirt-gpu/libvirt-gpu.conf ([nova]/carved); do not '
        'edit: generate it again after',
        '# a change and check a file with `libvirt-gpu nova-config '
        '--check FILE`.',
        '# Drop it into /etc/nova/nova.conf.d/ and restart nova-compute; '
        'set',
        '# [pci] report_in_placement = true here and [filter_scheduler]',
        '# pci_in_placement = true on the schedulers.',
        '# libvirt 9.0.0, QEMU 8.0.0: "live_migratable" left out (Nova '
        'needs libvirt >= 10.0.0 and QEMU >= 8.2.2)',
        '# [nova_l40s_12q]: nvidia-1153 (NVIDIA L40S-12Q) on 0000:af:00.0: '
        '0000:af:00.4, 0000:af:00.5',
        '# [nova_l40s_12q]: nvidia-1153 (unnamed) on 0000:af:00.0: '
        '0000:af:00.5',
        '[pci]',
        'device_spec = %s' % json.dumps(_spec()),
        'device_spec = %s' % json.dumps(_spec(VF5)),
        'device_spec = %s' % json.dumps(_spec(VF5)),
        'alias = %s' % json.dumps(ALIAS)]


def test_the_text_of_nothing_carved():
    lines = _config().text().splitlines()
    assert lines[-2:] == ['# nothing is carved for Nova on this host',
                          '[pci]']


def test_the_json_document():
    config = _config(_carved(VF4, VF5),
                     versions=nova_cmds.Versions(error='down'))
    assert config.to_json() == {
        'hostname': 'compute-1',
        'versions': {'libvirt': '?', 'qemu': '?', 'error': 'down'},
        'live_migratable': False,
        'carved': [{'carving': 'l40s_12q', 'gpu': str(PF),
                    'type_id': 'nvidia-1153', 'type_name': 'NVIDIA L40S-12Q',
                    'resource_class': RC, 'alias': 'l40s-12q',
                    'vfs': [str(VF4), str(VF5)]}],
        'device_spec': [_spec(), _spec(VF5)],
        'alias': [ALIAS], 'withheld': []}
    assert _config(versions=nova_cmds.Versions(
        libvirt=10000000, qemu=8002002)).to_json()['versions'] == {
            'libvirt': '10.0.0', 'qemu': '8.2.2', 'error': None}


# --- reading a Nova file -----------------------------------------------------

@pytest.mark.parametrize('value, plain', [
    ('"x"', 'x'), ("'x'", 'x'), ('  "x"  ', 'x'), ('"x\'', '"x\''),
    ('"', '"'), ('""', ''), ('x"', 'x"'), ('ab', 'ab'), ('XabX', 'XabX')])
def test_unquote(value, plain):
    assert nova_cmds._unquote(value) == plain


def test_assignments_as_oslo_config_reads_them():
    text = ('top = 1\n'
            '[ pci ]\n'
            'alias = {"a":\n'
            '   1,\n'
            '\t"b": 2}\n'
            '#comment = 3\n'
            ';other = 4\n'
            'not an assignment\n'
            'key: value\n'
            '  # an indented comment ends the value\n'
            'last=x\n'
            '  more\n'
            '  ;an indented comment\n'
            'end = 1')
    assert list(nova_cmds._assignments(text)) == [
        (None, 'top', '1', 1),
        ('pci', 'alias', '{"a":\n1,\n"b": 2}', 3),
        ('pci', 'key', 'value', 9),
        ('pci', 'last', 'x\nmore', 11),
        ('pci', 'end', '1', 14)]


def test_a_blank_line_ends_a_value():
    assert list(nova_cmds._assignments('a = 1\n\n  b\n')) == [
        (None, 'a', '1', 1)]


def test_read_nova_file_takes_both_spec_names_lists_and_reports_problems(
        tmp_path):
    path = tmp_path / 'nova.conf'
    path.write_text(
        '[DEFAULT]\n'
        'alias = {"name": "elsewhere"}\n'
        '[pci]\n'
        'device_spec = {"address": "0000:af:00.4"}\n'
        'passthrough_whitelist = [{"address": "0000:af:00.5"}, 7, {}]\n'
        'alias = \'{"name": "x"}\'\n'
        'alias = {not json\n'
        'other = {"name": "y"}\n'
        'alias = {"name": "z"}\n')
    found = nova_cmds.read_nova_file(str(path))
    assert found.specs == (
        nova_cmds.NovaEntry(key='device_spec', line=4,
                            value={'address': '0000:af:00.4'}),
        nova_cmds.NovaEntry(key='passthrough_whitelist', line=5,
                            value={'address': '0000:af:00.5'}),
        nova_cmds.NovaEntry(key='passthrough_whitelist', line=5, value={}))
    assert found.aliases == (
        nova_cmds.NovaEntry(key='alias', line=6, value={'name': 'x'}),
        nova_cmds.NovaEntry(key='alias', line=9, value={'name': 'z'}))
    assert found.problems[0] == ('line 5: [pci] passthrough_whitelist holds '
                                 'int, not a JSON object')
    assert found.problems[1].startswith('line 7: [pci] alias is not JSON (')
    assert len(found.problems) == 2


def test_read_nova_file_size_bound(tmp_path):
    path = tmp_path / 'nova.conf'
    head = '[pci]\nalias = {"name": "x"}\n'
    path.write_text(head + '#' * (nova_cmds._MAX_FILE_BYTES - len(head)))
    assert len(nova_cmds.read_nova_file(str(path)).aliases) == 1
    path.write_text(head + '#' * (nova_cmds._MAX_FILE_BYTES - len(head) + 1))
    with pytest.raises(exception.InvalidInput) as raised:
        nova_cmds.read_nova_file(str(path))
    assert raised.value.kwargs['reason'] == (
        '--check %s: larger than 1048576 bytes' % path)


def test_read_nova_file_that_is_not_there(tmp_path):
    path = tmp_path / 'none.conf'
    with pytest.raises(exception.InvalidInput) as raised:
        nova_cmds.read_nova_file(str(path))
    assert raised.value.kwargs['reason'] == (
        '--check %s: No such file or directory' % path)


def test_read_nova_file_replaces_what_is_not_utf8(tmp_path):
    path = tmp_path / 'nova.conf'
    path.write_bytes(b'[pci]\nalias = {"name": "x\xff"}\n')
    assert nova_cmds.read_nova_file(str(path)).aliases[0].value == {
        'name': 'x\ufffd'}


# --- Nova's matching ---------------------------------------------------------

@pytest.mark.parametrize('text, fields', [
    ('ffff:ff:1f.7', [0xffff, 0xff, 0x1f, 7]),
    ('ff:1f.7', [None, 0xff, 0x1f, 7]),
    ('1f.', [None, None, 0x1f, None]),
    ('', [None, None, None, None]),
    ('*:*:*.*', [None, None, None, None]),
    (' af :00.4', [None, 0xaf, 0, 4]),
])
def test_glob_fields_up_to_novas_bounds(text, fields):
    assert nova_cmds._glob_fields(text) == fields


@pytest.mark.parametrize('text', ['10000:ff:1f.7', '100:1f.7', '20.7',
                                  '1f.8', '0:0:0:0.0', '-1:00.0'])
def test_glob_fields_past_the_bounds_are_refused(text):
    with pytest.raises(exception.InvalidInput) as raised:
        nova_cmds._glob_fields(text)
    assert raised.value.kwargs['reason'] == 'address %r' % text


def test_a_regex_address_defaults_each_field_to_any():
    assert nova_cmds.address_matches({}, VF4, PF, {PF})
    assert nova_cmds.address_matches({'domain': '0000', 'slot': '00',
                                      'function': '[4-5]'}, VF4, PF, {PF})
    assert not nova_cmds.address_matches({'domain': '0001'}, VF4, PF, {PF})
    assert not nova_cmds.address_matches({'slot': '01'}, VF4, PF, {PF})
    assert not nova_cmds.address_matches({'function': '5'}, VF4, PF, {PF})
    with pytest.raises(exception.InvalidInput) as raised:
        nova_cmds.address_matches({'slot': '['}, VF4, PF, {PF})
    assert raised.value.kwargs['reason'] == "address {'slot': '['}"


def test_a_pf_address_stands_for_its_own_vfs_only():
    other_pf = objects.PciAddress.parse('0000:b0:00.0')
    assert nova_cmds.address_matches(str(PF), VF4, PF, {PF})
    assert not nova_cmds.address_matches(str(other_pf), VF4, PF,
                                         {PF, other_pf})
    # a PF is matched by its own address, not as the PF of itself
    assert nova_cmds.address_matches(str(PF), PF, None, {PF})
    assert not nova_cmds.address_matches(str(PF), VF4, None, {PF})
    assert not nova_cmds.address_matches('0000:af:00.*', VF4, PF,
                                         set()) is False


@pytest.mark.parametrize('value, found', [
    (None, None), ('*', None), (' * ', None), ('10DE', '10de'),
    ('de', '00de'), (' 26b9 ', '26b9'), (0x10, '0016')])
def test_hex_id(value, found):
    assert nova_cmds._hex_id(value) == found


@pytest.mark.parametrize('value', ['', 'x', '0x', '**'])
def test_hex_id_refusal_names_it(value):
    with pytest.raises(exception.InvalidInput) as raised:
        nova_cmds._hex_id(value)
    assert raised.value.kwargs['reason'] == 'PCI id %r' % value


@pytest.mark.parametrize('value', ['yes', 'true', 'on', '1', 'y', 't',
                                   ' YES ', 'True', True, 1])
def test_flag_true(value):
    assert nova_cmds._flag(value, None) is True


@pytest.mark.parametrize('value', ['no', 'false', 'off', '0', 'n', 'f',
                                   ' NO ', 'False', False, 0])
def test_flag_false(value):
    assert nova_cmds._flag(value, None) is False


def test_flag_default_and_unknown():
    assert nova_cmds._flag(None, True) is True
    assert nova_cmds._flag(None, False) is False
    assert nova_cmds._flag('maybe', True) is None
    assert nova_cmds._flag('', False) is None


@pytest.mark.parametrize('rc, found', [
    (None, 'CUSTOM_PCI_10DE_26B9'), ('', 'CUSTOM_PCI_10DE_26B9'),
    ('custom_x', 'CUSTOM_X'), ('vgpu', 'VGPU'), ('foo-bar', 'CUSTOM_FOO_BAR'),
    ('CUSTOM_A-B', 'CUSTOM_A-B')])
def test_nova_resource_class(rc, found):
    assert nova_cmds.nova_resource_class({'resource_class': rc},
                                         _vf(VF4)) == found


# --- judging a Nova file -----------------------------------------------------

def _host(*vfs):
    return (_pf(*vfs),) + vfs


WHAT = 'carved VF 0000:af:00.4 (NVIDIA L40S-12Q, [nova_l40s_12q])'


def test_what_matches_is_quiet():
    vf = _vf(VF4, TYPE)
    assert nova_cmds.differences(
        _config(_carved(VF4)), _file([(3, _spec())], [(4, ALIAS)]),
        _host(vf)) == []


def test_a_carved_vf_that_holds_another_type_or_none():
    config = _config(_carved(VF4))
    nova = _file([(3, _spec())], [(4, ALIAS)])
    assert nova_cmds.differences(config, nova, _host(_vf(VF4, OTHER))) == [
        '%s holds nvidia-1154 now, not nvidia-1153: run `libvirt-gpu '
        'restore`' % WHAT]
    assert nova_cmds.differences(config, nova, _host(_vf(VF4))) == [
        '%s holds no vGPU now, not nvidia-1153: run `libvirt-gpu '
        'restore`' % WHAT]
    assert nova_cmds.differences(config, nova,
                                 _host(_vf(VF4, TYPE, TYPE))) == [
        '%s holds nvidia-1153, nvidia-1153 now, not nvidia-1153: run '
        '`libvirt-gpu restore`' % WHAT]


def test_a_carved_vf_without_a_spec_names_the_type_id_when_unnamed():
    config = _config(_carved(VF4, type_name=None))
    assert nova_cmds.differences(config, _file([], [(4, ALIAS)]),
                                 _host(_vf(VF4))) == [
        'carved VF 0000:af:00.4 (nvidia-1153, [nova_l40s_12q]) holds no '
        'vGPU now, not nvidia-1153: run `libvirt-gpu restore`',
        'carved VF 0000:af:00.4 (nvidia-1153, [nova_l40s_12q]) is missing: '
        'no [pci] device_spec matches it']


@pytest.mark.parametrize('managed, shown', [
    ('yes', '"yes"'), ('maybe', '"maybe"'), (True, 'true')])
def test_managed_must_be_no(managed, shown):
    found = nova_cmds.differences(
        _config(_carved(VF4)),
        _file([(7, _spec(managed=managed))], [(8, ALIAS)]),
        _host(_vf(VF4, TYPE)))
    assert found == ['line 7: device_spec of %s has "managed": %s; it must '
                     'be "no" (the VF stays on NVIDIA\'s driver)'
                     % (WHAT, shown)]


def test_managed_left_out_is_novas_yes():
    found = nova_cmds.differences(
        _config(_carved(VF4)),
        _file([(7, _spec(managed=None))], [(8, ALIAS)]),
        _host(_vf(VF4, TYPE)))
    assert found == ['line 7: device_spec of %s leaves out "managed", which '
                     'Nova takes as "yes": Nova would take the VF from '
                     'NVIDIA\'s driver; add "managed": "no"' % WHAT]


def test_nova_takes_the_first_spec_that_matches():
    specs = [(3, _spec(address='0000:b0:00.4')),
             (5, _spec(resource_class='CUSTOM_OTHER')),
             (6, _spec())]
    assert nova_cmds.differences(
        _config(_carved(VF4)), _file(specs, [(9, ALIAS)]),
        _host(_vf(VF4, TYPE))) == [
        'line 5: device_spec of %s reports resource class CUSTOM_OTHER; '
        'this host carves it as %s' % (WHAT, RC)]


@pytest.mark.parametrize('migratable, versions, shown', [
    (None, (10000000, 8002002), '"no (absent)"'),
    ('no', (10000000, 8002002), '"no"'),
    ('yes', (9000000, 8002002), '"yes"'),
    ('maybe', (9000000, 8002002), '"maybe"'),
])
def test_live_migratable_must_follow_the_versions(migratable, versions,
                                                  shown):
    v = nova_cmds.Versions(libvirt=versions[0], qemu=versions[1])
    found = nova_cmds.differences(
        _config(_carved(VF4), versions=v),
        _file([(2, _spec(live_migratable=migratable))], [(8, ALIAS)]),
        _host(_vf(VF4, TYPE)))
    assert found == ['line 2: device_spec of %s has "live_migratable": %s; '
                     '%s' % (WHAT, shown, v.describe())]


def test_live_migratable_yes_when_the_versions_allow_it_is_quiet():
    v = nova_cmds.Versions(libvirt=10000000, qemu=8002002)
    assert nova_cmds.differences(
        _config(_carved(VF4), versions=v),
        _file([(2, _spec(live_migratable='yes'))], [(8, ALIAS)]),
        _host(_vf(VF4, TYPE))) == []


def test_a_spec_matching_what_is_not_carved_names_the_first_line():
    pf_spec = _spec(address=str(PF))
    found = nova_cmds.differences(
        _config(_carved(VF4)),
        _file([(2, _spec()), (3, pf_spec), (4, pf_spec)], [(8, ALIAS)]),
        _host(_vf(VF4, TYPE), _vf(VF5, OTHER)))
    # the PF's own address matches the PF too (in address order)
    assert found == [
        'line 3: device_spec matches GPU 0000:af:00.0 (holds no vGPU), '
        'which is not carved for Nova',
        'line 3: device_spec matches VF 0000:af:00.5 (holds nvidia-1154), '
        'which is not carved for Nova']


def test_a_spec_matching_a_gpu_that_is_not_a_vf():
    found = nova_cmds.differences(
        _config(), _file([(2, _spec(address='*:*:*.*'))]),
        (fakes.gpu('0000:3b:00.0', product_id='26b9'),))
    assert found == ['line 2: device_spec matches GPU 0000:3b:00.0 (holds '
                     'no vGPU), which is not carved for Nova']


def test_a_spec_nova_refuses_is_named_and_left_out():
    found = nova_cmds.differences(
        _config(_carved(VF4)),
        _file([(2, _spec(vendor_id='xyz')), (3, _spec())], [(8, ALIAS)],
              problems=['line 1: first']),
        _host(_vf(VF4, TYPE)))
    assert found == ['line 1: first',
                     "line 2: [pci] device_spec: Nova refuses its PCI id "
                     "'xyz'"]


def test_a_carved_vf_gone_from_the_host():
    found = nova_cmds.differences(
        _config(_carved(VF4, VF5)),
        _file([(2, _spec())], [(8, ALIAS)]), _host(_vf(VF4, TYPE)))
    assert found == ['carved VF 0000:af:00.5 ([nova_l40s_12q]) is not on '
                     'the host now: run `libvirt-gpu restore`']


def test_the_functions_are_judged_in_address_order():
    found = nova_cmds.differences(
        _config(_carved(VF4, VF5)), _file([], [(8, ALIAS)]),
        tuple(reversed(_host(_vf(VF4, TYPE), _vf(VF5, TYPE)))))
    assert [line.split(' (')[0] for line in found] == [
        'carved VF 0000:af:00.4', 'carved VF 0000:af:00.5']


def test_aliases_missing_repeated_and_wrong():
    config = _config(_carved(VF4), _carved(VF5, alias='b',
                                           resource_class='CUSTOM_B'))
    aliases = [(10, dict(ALIAS, name=' l40s-12q ', device_type='type-PF',
                         resource_class='custom_other', vendor_id='1002',
                         product_id='*')),
               (12, ALIAS)]
    assert nova_cmds._judge_aliases(config, _file([], aliases)) == [
        'alias b (resource class CUSTOM_B) is missing from [pci] alias',
        'lines 10, 12: alias l40s-12q is defined 2 times; Nova\'s PCI in '
        'Placement takes one spec per alias',
        'line 10: alias l40s-12q has "device_type": "type-PF"; it must be '
        '"type-VF"',
        'line 10: alias l40s-12q asks for resource class CUSTOM_OTHER; the '
        'VFs are reported as %s' % RC,
        'line 10: alias l40s-12q has "vendor_id": "1002"; the VFs have 10de']


def test_an_alias_without_class_or_type_and_with_odd_ids():
    config = _config(_carved(VF4))
    alias = {'name': 'l40s-12q', 'vendor_id': 'zz', 'product_id': '26B9'}
    assert nova_cmds._judge_aliases(config, _file([], [(3, alias)])) == [
        'line 3: alias l40s-12q has "device_type": null; it must be '
        '"type-VF"',
        'line 3: alias l40s-12q asks for resource class (none); the VFs '
        'are reported as %s' % RC,
        'line 3: alias l40s-12q has "vendor_id": "zz"; the VFs have 10de']
    nameless = {'device_type': 'type-VF', 'resource_class': RC}
    assert nova_cmds._judge_aliases(config, _file([], [(3, nameless)])) == [
        'alias l40s-12q (resource class %s) is missing from [pci] alias'
        % RC]


# --- the parsers -------------------------------------------------------------

GOLDEN_PARSERS = os.path.join(paths.DATA, 'golden', 'cli-parsers.json')


def _name(value):
    return getattr(value, '__name__', value)


def _parser_doc(parser):
    """What a parser offers, as data: every option and command with its
    names, default, metavar, help and requiredness, the parser's
    description, epilog and formatter.  Read from argparse's records
    rather than from ``format_help``, whose layout changes with Python's
    version."""
    arguments = []
    for action in parser._actions:
        entry = {'action': type(action).__name__,
                 'options': list(action.option_strings),
                 'dest': action.dest, 'nargs': action.nargs,
                 'const': action.const, 'default': _name(action.default),
                 'type': _name(action.type), 'required': action.required,
                 'help': action.help, 'metavar': action.metavar}
        if isinstance(action, argparse._VersionAction):
            entry['version'] = action.version.replace(
                libvirt_gpu.__version__, 'VERSION')
        if isinstance(action, argparse._SubParsersAction):
            entry['choices'] = {name: _parser_doc(p)
                                for name, p in action.choices.items()}
            entry['listed'] = [[a.dest, a.help]
                               for a in action._choices_actions]
        elif action.choices is not None:
            entry['choices'] = list(action.choices)
        arguments.append(entry)
    return {
        'prog': parser.prog, 'description': parser.description,
        'epilog': parser.epilog,
        'formatter': parser.formatter_class.__name__,
        'defaults': {k: _name(v) for k, v in sorted(
            parser._defaults.items())},
        'groups': [[g.title, g.description,
                    [a.dest for a in g._group_actions]]
                   for g in parser._action_groups],
        'exclusive': [[g.required, [a.dest for a in g._group_actions]]
                      for g in parser._mutually_exclusive_groups],
        'arguments': arguments}


def test_every_command_option_default_and_help_as_recorded():
    """The CLI's whole interface (tests/data/golden/cli-parsers.json):
    a change of an option, a default or a help text shows here.  When the
    change is meant, write the file again with
    ``LIBVIRT_GPU_WRITE_GOLDEN=1 pytest tests/unit/cmd/test_main.py``
    and review its diff."""
    found = json.loads(json.dumps(_parser_doc(cli.build_parser())))
    if os.environ.get('LIBVIRT_GPU_WRITE_GOLDEN'):
        with open(GOLDEN_PARSERS, 'w') as f:
            json.dump(found, f, indent=1, sort_keys=True)
            f.write('\n')
    with open(GOLDEN_PARSERS) as f:
        assert found == json.load(f)


@pytest.mark.parametrize('name', [name for name, _ in cli.COMMANDS])
def test_one_command_parser_is_the_full_ones(name):
    whole = _parser_doc(cli.build_parser())
    one = _parser_doc(cli.build_parser(only=name))
    command = [a for a in whole['arguments'] if 'listed' in a][0]
    alone = [a for a in one['arguments'] if 'listed' in a][0]
    assert alone['choices'] == {name: command['choices'][name]}


# --- list, types, discover, simulate -----------------------------------------

T4_CONF_m = os.path.join(os.path.dirname(GOLDEN_PARSERS), 't4.conf')


class _Hosts(dict):
    """Simulated hosts by profile name, each written when first asked."""

    def __init__(self, factory):
        super().__init__()
        self.factory = factory

    def __missing__(self, name):
        from libvirt_gpu import simulator
        root = self.factory.mktemp(name)
        simulator.write_host(simulator.load_profile(name), root)
        self[name] = str(root)
        return self[name]


@pytest.fixture(scope='module')
def hosts(tmp_path_factory):
    return _Hosts(tmp_path_factory)


@pytest.fixture
def empty_conf(tmp_path):
    path = tmp_path / 'empty.conf'
    path.write_text('')
    return str(path)


def _cli(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _table(out):
    """The lines of a text table and what follows, without the source
    line, each stripped of trailing blanks."""
    return [line.rstrip() for line in out.splitlines()
            if not line.startswith('source: ')]


def test_list_table_of_a_sliced_and_a_whole_gpu(capsys, hosts):
    code, out, err = _cli(capsys, '--config-file', T4_CONF_m, '--sysfs-root',
                          hosts['t4'], 'list')
    assert code == 0
    assert _table(out) == [
        # T4_CONF_m: every GPU on our own route
        'ADDRESS       ID         PRODUCT             DRIVER  NUMA  CPUS  '
        'IOMMU  GROUP MEMBERS  MODE  ROUTE        ENABLED TYPE  CAPACITY  '
        'TYPES  VGPUS  VFS',
        '------------  ---------  ------------------  ------  ----  ----  '
        '-----  -------------  ----  -----------  ------------  --------  '
        '-----  -----  ---',
        '0000:3b:00.0  10de:1eb8  TU104GL [Tesla T4]  nvidia  0     -     '
        '28     -              pgpu  libvirt-gpu  -             1         '
        '17     0      -',
        '0000:af:00.0  10de:1eb8  TU104GL [Tesla T4]  nvidia  1     -     '
        '58     -              vgpu  libvirt-gpu  nvidia-223    8         '
        '17     2      -',
        '',
        'VGPU                                  TYPE        GPU           '
        'PARENT        ROUTE        DOMAIN',
        '------------------------------------  ----------  ------------  '
        '------------  -----------  ------',
        '4b20d080-1b54-4048-85b3-a6a62d165c01  nvidia-223  0000:af:00.0  '
        '0000:af:00.0  libvirt-gpu  -',
        'b1ae8bf6-38b0-4c81-9d44-78ce3f520496  nvidia-223  0000:af:00.0  '
        '0000:af:00.0  libvirt-gpu  -']


def test_list_names_what_is_not_offered_whole(capsys, hosts, empty_conf):
    code, out, _ = _cli(capsys, '--config-file', empty_conf, '--sysfs-root',
                        hosts['mixed'], 'list')
    assert code == 0
    lines = _table(out)
    lines = lines[:lines.index('')]       # the vGPUs' table follows
    assert lines[2] == (
        '0000:03:00.0  1a03:2000  ASPEED Graphics Family          ast       '
        '0     -     16     -              pgpu  libvirt-gpu  -             '
        '0         0      0      -')
    assert lines[-2].startswith('0000:d8:00.0  10de:2230  GA102GL [RTX '
                                'A6000]')
    assert '     70     0000:d8:00.1   pgpu' in lines[-2]
    assert lines[-1] == ('0000:03:00.0: not offered whole: its vendor 1a03 '
                         'is not in [gpu]/pgpu_vendor_ids')


def test_list_counts_vfs_and_the_used_ones(capsys, hosts, empty_conf):
    from tests.doubles import tables
    code, out, _ = _cli(capsys, '--config-file', empty_conf, '--sysfs-root',
                        hosts['l40s'], 'list')
    assert code == 0
    assert [(r['ADDRESS'], r['VFS'], r['VGPUS'], r['TYPES'])
            for r in tables.rows(out)] == [
        ('0000:3d:00.0', '32 (2 used)', '2', '3'),
        ('0000:bd:00.0', '32 (0 used)', '0', '23')]


def test_list_json_of_a_gpu_not_offered_whole(capsys, hosts, empty_conf):
    code, out, _ = _cli(capsys, '--config-file', empty_conf, '--sysfs-root',
                        hosts['mixed'], 'list', '--json')
    assert code == 0
    doc = {g['address']: g for g in json.loads(out)}
    assert doc['0000:03:00.0']['not_assignable'] == (
        'its vendor 1a03 is not in [gpu]/pgpu_vendor_ids')
    assert doc['0000:5e:00.0']['not_assignable'] is None


def test_list_json_of_a_vf_shows_its_gpus_setting(capsys, hosts, tmp_path):
    conf = tmp_path / 'a100.conf'
    conf.write_text('[gpu]\nenabled_vgpu_types = nvidia-472\n'
                    '[vgpu_nvidia-472]\ndevice_addresses = 0000:41:00.0\n')
    code, out, _ = _cli(capsys, '--config-file', str(conf), '--sysfs-root',
                        hosts['a100'], 'list', '--json')
    assert code == 0
    doc = json.loads(out)
    vfs = [g for g in doc if g.get('physfn') == '0000:41:00.0']
    assert len(vfs) == 16
    assert {(g['mode'], g['enabled_type'], g['not_assignable'])
            for g in vfs} == {('vgpu', 'nvidia-472', None)}
    (gpu,) = [g for g in doc if g['address'] == '0000:41:00.0']
    assert (gpu['mode'], gpu['enabled_type'], gpu['not_assignable']) == (
        'vgpu', 'nvidia-472', None)
    code, out, _ = _cli(capsys, '--config-file', str(conf), '--sysfs-root',
                        hosts['a100'], 'list')
    row = [line for line in out.splitlines()
           if line.startswith('0000:41:00.0')][0]
    assert row.split()[-10:] == ['-', 'vgpu', 'libvirt-gpu', 'nvidia-472',
                                 '2', '6', '1', '16', '(1', 'used)']


def test_types_table_json_and_nothing_offered(capsys, hosts):
    code, out, _ = _cli(capsys, '--sysfs-root', hosts['mixed'], 'types')
    assert code == 0
    assert _table(out)[:4] == [
        'GPU           TYPE        NAME        API       AVAILABLE  '
        'DESCRIPTION',
        '------------  ----------  ----------  --------  ---------  '
        '-------------------------------------------------------------------'
        '--------------------',
        '0000:3b:00.0  nvidia-223  GRID T4-2B  vfio-pci  0          '
        'num_heads=4, frl_config=45, framebuffer=2048M, '
        'max_resolution=5120x2880, max_instance=8',
        '0000:3b:00.0  nvidia-231  GRID T4-2Q  vfio-pci  7          '
        'num_heads=4, frl_config=60, framebuffer=2048M, '
        'max_resolution=5120x2880, max_instance=8']
    assert len(_table(out)) == 6
    code, out, _ = _cli(capsys, '--sysfs-root', hosts['mixed'], 'types',
                        '0000:5e:00.0')
    assert code == 0
    assert _table(out) == [
        'GPU  TYPE  NAME  API  AVAILABLE  DESCRIPTION',
        '---  ----  ----  ---  ---------  -----------',
        'no vGPU types offered (is the GPU bound to a vGPU-capable driver '
        'such as nvidia? are its SR-IOV VFs enabled?)']
    code, out, _ = _cli(capsys, '--sysfs-root', hosts['mixed'], 'types',
                        '--json')
    doc = json.loads(out)
    assert list(doc) == ['0000:3b:00.0']
    assert doc['0000:3b:00.0'][1] == {
        'available_instances': 7, 'id': 'nvidia-231', 'name': 'GRID T4-2Q',
        'device_api': 'vfio-pci',
        'description': 'num_heads=4, frl_config=60, framebuffer=2048M, '
                       'max_resolution=5120x2880, max_instance=8'}


def test_types_of_a_gpu_with_vfs_count_what_the_whole_gpu_can_take(
        capsys, hosts):
    code, out, _ = _cli(capsys, '--sysfs-root', hosts['l40s'], 'types',
                        '--json', '0000:3d:00.0')
    assert code == 0
    assert [(t['id'], t['available_instances'])
            for t in json.loads(out)['0000:3d:00.0']] == [
        ('nvidia-1145', 30), ('nvidia-1147', 30), ('nvidia-1157', 30)]
    code, out, _ = _cli(capsys, '--sysfs-root', hosts['l40s'], 'types',
                        '--json', '0000:3d:00.4')
    vf_types = json.loads(out)['0000:3d:00.4']
    assert vf_types and all(t['available_instances'] in (0, 1)
                            for t in vf_types)


def test_discover_names_what_is_withheld(capsys, hosts, empty_conf,
                                         tmp_path):
    code, out, err = _cli(capsys, '--config-file', empty_conf,
                          '--sysfs-root', hosts['mixed'], 'discover')
    assert code == 0
    # no GPU given to Cyborg: each is said so
    assert out.splitlines()[-1] == (
        '0000:d8:00.0: nothing offered to Cyborg: not given to Cyborg '
        '([routes]/cyborg does not name it): libvirt-gpu\'s own guests')
    empty_conf = str(tmp_path / 'cyborg.conf')
    with open(empty_conf, 'w') as f:
        f.write('[routes]\ncyborg = all\n')
    code, out, err = _cli(capsys, '--config-file', empty_conf,
                          '--sysfs-root', hosts['mixed'], 'discover')
    assert code == 0
    assert out.splitlines()[-1] == (
        '0000:3b:00.0: nothing offered to Cyborg: not offered whole: it '
        'holds vGPUs now (Cyborg could not reserve it)')
    code, out, err = _cli(capsys, '--config-file', empty_conf,
                          '--sysfs-root', hosts['mixed'], 'discover',
                          '--json')
    assert code == 0
    assert [d['vendor'] for d in json.loads(out)][:2] == ['10de', '10de']
    assert err.splitlines()[-1] == (
        '0000:3b:00.0: nothing offered to Cyborg: not offered whole: it '
        'holds vGPUs now (Cyborg could not reserve it)')


def test_simulate_text_json_list_and_refusals(capsys, tmp_path):
    from libvirt_gpu import simulator
    code, out, _ = _cli(capsys, 'simulate', '--list')
    assert (code, out.split()) == (0, list(simulator.list_profiles()))
    where = str(tmp_path / 's')
    code, out, _ = _cli(capsys, 'simulate', 't4', where)
    node_xml = os.path.join(where, 'node.xml')
    assert code == 0
    assert out == ("wrote simulated host 't4' to %s\n"
                   "  sysfs:  libvirt-gpu --sysfs-root %s list\n"
                   "  libvirt: libvirt-gpu -c test://%s list\n"
                   % (where, where, node_xml))
    code, out, _ = _cli(capsys, 'simulate', 't4', where, '--json')
    assert json.loads(out) == {'profile': 't4', 'sysfs_root': where,
                               'node_xml': node_xml,
                               'test_uri': 'test://' + node_xml}
    for argv in (['simulate'], ['simulate', 't4']):
        code, out, err = _cli(capsys, *argv)
        assert (code, out) == (1, '')
        assert err == ('libvirt-gpu: error: Invalid input: simulate needs '
                       'PROFILE and DIR (or --list)\n')
    blocker = tmp_path / 'file'
    blocker.write_text('')
    code, out, err = _cli(capsys, 'simulate', 't4', str(blocker / 'x'))
    assert (code, out) == (1, '')
    assert err == ('libvirt-gpu: error: Simulator: cannot write the '
                   'simulated host to %s: Not a directory; name a directory '
                   'you may write to\n' % (blocker / 'x'))


def test_simulate_live_hands_every_option_to_the_live_tree(
        monkeypatch, capsys):
    """``--live`` serves a FUSE tree (root and /dev/fuse): here, what the
    command hands it."""
    from libvirt_gpu.cmd import simulate_live
    calls = []

    def run_live(*args, **kwargs):
        calls.append((args, kwargs))
        return 7
    monkeypatch.setattr(simulate_live, 'run_live', run_live)
    assert cli.main(['simulate', 't4', '/mnt/x', '--live']) == 7
    assert calls.pop() == (('t4', '/mnt/x'), {
        'busy_remove': None, 'uevents': True, 'control_stdio': False,
        'workdir': None, 'probe_delay': simulate_live.LIVE_PROBE_DELAY})
    assert cli.main(['simulate', 't4', '/mnt/x', '--live', '--busy-remove',
                     'ebusy', '--no-uevents', '--control-stdio',
                     '--workdir', '/w', '--probe-delay', '0.5']) == 7
    assert calls.pop() == (('t4', '/mnt/x'), {
        'busy_remove': 'ebusy', 'uevents': False, 'control_stdio': True,
        'workdir': '/w', 'probe_delay': 0.5})
    assert capsys.readouterr() == ('', '')


def test_types_table_of_a_gpu_with_vfs(capsys, hosts):
    code, out, _ = _cli(capsys, '--sysfs-root', hosts['l40s'], 'types',
                        '0000:3d:00.0')
    assert code == 0
    assert [line.split()[:2] + [line.split()[-2]]
            for line in _table(out)[2:]] == [
        ['0000:3d:00.0', 'nvidia-1145', '30'],
        ['0000:3d:00.0', 'nvidia-1147', '30'],
        ['0000:3d:00.0', 'nvidia-1157', '30']]


# --- main's edge -------------------------------------------------------------

@pytest.mark.parametrize('argv, word', [
    (['--connect=test:///default', 'list'], 'list'),
    (['--sysfs-root=/x', '--debug', 'types'], 'types'),
    (['-c', 'u', '--hostname', 'h', 'discover'], 'discover'),
    (['--config-file', 'f', '--sysfs-root', 'r', 'layout', 'plan'],
     'layout'),
    (['--json'], None), (['-x', 'list'], None), (['--sysfs-root'], None),
    (['--bogus=1', 'list'], None), ([], None)])
def test_command_word(argv, word):
    assert cli._command_word(argv) == word


@pytest.mark.parametrize('columns, width', [
    ('100', 100), ('1', 1), ('0', 80), ('-3', 80), ('wide', 80), ('', 80)])
def test_columns_from_the_environment(monkeypatch, columns, width):
    def no_terminal(fd):
        raise OSError(25, 'Inappropriate ioctl for device')
    monkeypatch.setenv('COLUMNS', columns)
    monkeypatch.setattr(cli.os, 'get_terminal_size', no_terminal)
    assert cli._columns() == width


def test_columns_of_the_terminal_when_columns_is_unset(monkeypatch):
    def terminal(fd):
        return cli.os.terminal_size((120, 40))
    monkeypatch.delenv('COLUMNS', raising=False)
    monkeypatch.setattr(cli.os, 'get_terminal_size', terminal)
    assert cli._columns() == 120


def test_help_is_as_wide_as_columns_less_two(monkeypatch):
    monkeypatch.setenv('COLUMNS', '52')
    assert cli._HelpFormatter('p')._width == 50
    assert cli._RawDescriptionHelpFormatter('p')._width == 50
    assert cli._HelpFormatter('p', width=30)._width == 30
    formatter = cli._HelpFormatter('p', indent_increment=3,
                                   max_help_position=11)
    assert (formatter._indent_increment, formatter._max_help_position) == (
        3, 11)


@pytest.mark.parametrize('raised, code, err', [
    (exception.InvalidInput(reason='bad'), 1,
     'libvirt-gpu: error: Invalid input: bad\n'),
    (KeyboardInterrupt(), 130, ''),
    (FileNotFoundError(2, 'No such file or directory', '/x'), 1, None),
    (ValueError('odd'), 1, None),
])
def test_main_turns_each_failure_into_its_exit_status(monkeypatch, capsys,
                                                      raised, code, err):
    from libvirt_gpu.cmd import host_cmds

    def fail(ctx):
        raise raised
    monkeypatch.setattr(host_cmds, 'cmd_simulate', fail)
    assert cli.main(['simulate', '--list']) == code
    out, found = capsys.readouterr()
    assert out == ''
    if err is not None:
        assert found == err
    else:
        assert len(found.splitlines()) == 1
        assert found.startswith('libvirt-gpu: ')
    if code == 1:
        with pytest.raises(type(raised)):
            cli.main(['--debug', 'simulate', '--list'])


def test_main_closes_stderr_when_the_reader_left(monkeypatch):
    from libvirt_gpu.cmd import host_cmds

    class Err(object):
        closed = False

        def close(self):
            self.closed = True
    err = Err()
    monkeypatch.setattr(cli.sys, 'stderr', err)

    def fail(ctx):
        raise BrokenPipeError()
    monkeypatch.setattr(host_cmds, 'cmd_simulate', fail)
    assert cli.main(['simulate', '--list']) == 0
    assert err.closed


# --- guests, services, Placement, repairs ------------------------------------

def test_domgpus_of_a_domain_without_gpus(capsys):
    code, out, _ = _cli(capsys, '-c', 'test:///default', 'domgpus', 'test')
    assert code == 0
    assert out.splitlines()[1:] == [
        'KIND  UUID  TYPE  GPU  ROUTE  EXISTS  LEASE  SOURCE',
        '----  ----  ----  ---  -----  ------  -----  ------']
    code, out, _ = _cli(capsys, '-c', 'test:///default', 'domgpus', 'test',
                        '--json')
    assert json.loads(out) == {
        'active': True, 'domain': 'test',
        'domain_uuid': '6695eb01-f6a4-8304-79aa-97f2502e193f',
        'inactive_xml': False, 'pgpus': [], 'vgpus': []}
    code, out, _ = _cli(capsys, '-c', 'test:///default', 'domgpus', 'test',
                        '--inactive', '--json')
    assert json.loads(out)['inactive_xml'] is True


@pytest.mark.parametrize('command', ['attach', 'detach'])
@pytest.mark.parametrize('flag', ['--live', '--config'])
def test_current_is_refused_with_live_or_config(capsys, command, flag):
    code, out, err = _cli(capsys, '-c', 'test:///nowhere', command, 'test',
                          '--vgpu-type', 'nvidia-1', '--current', flag)
    assert (code, out) == (1, '')
    assert err == ('libvirt-gpu: error: Invalid input: --current cannot be '
                   'combined with --live or --config\n')


@pytest.mark.parametrize('text, port', [('1', 1), ('65535', 65535),
                                        ('9851', 9851)])
def test_port_bounds(text, port):
    from libvirt_gpu.cmd import service_cmds
    assert service_cmds._port(text) == port


@pytest.mark.parametrize('text', ['0', '65536', 'x', '0x10', '-1'])
def test_port_refused_saying_what_is_taken(text):
    from libvirt_gpu.cmd import service_cmds
    with pytest.raises(argparse.ArgumentTypeError) as raised:
        service_cmds._port(text)
    assert str(raised.value) == ('%r is not a TCP port: give a number from '
                                 '1 to 65535' % text)


@pytest.mark.parametrize('number, port, why', [
    ('EADDRINUSE', 9851, ' (another process listens there: stop it, or '
     'pick another --port)'),
    ('EACCES', 1023, ' (ports below 1024 need root: pick a --port above '
     '1023)'),
    ('EPERM', 80, ' (ports below 1024 need root: pick a --port above '
     '1023)'),
    ('EACCES', 1024, ' (not allowed here: pick another --port or '
     '--address)'),
    ('EADDRNOTAVAIL', 9851, ' (no such address on this host: give one of '
     'its own addresses to --address, or 0.0.0.0)'),
    ('EAFNOSUPPORT', 9851, ' (no such address on this host: give one of '
     'its own addresses to --address, or 0.0.0.0)'),
    ('ENOMEM', 9851, ''),
])
def test_listen_error_says_what_to_do(number, port, why):
    import errno
    from libvirt_gpu.cmd import service_cmds
    code = getattr(errno, number)
    found = service_cmds._listen_error('10.0.0.1', port,
                                       OSError(code, 'Refused'))
    assert isinstance(found, exception.ListenError)
    assert str(found) == ('cannot listen on 10.0.0.1 port %d: Refused%s'
                          % (port, why))


def test_listen_error_without_strerror():
    from libvirt_gpu.cmd import service_cmds
    found = service_cmds._listen_error('::', 1, OSError('plain'))
    assert str(found) == 'cannot listen on :: port 1: plain'


def test_exporter_once_without_libvirt(capsys, hosts, empty_conf):
    code, out, _ = _cli(capsys, '--config-file', empty_conf, '--sysfs-root',
                        hosts['t4'], 'exporter', '--once', '--no-libvirt')
    assert code == 0
    assert ('libvirt_gpu_gpu_info{enabled_type="",gpu="0000:3b:00.0",'
            'mode="pgpu",product="TU104GL [Tesla T4]",product_id="1eb8",'
            'route="libvirt-gpu",vendor_id="10de"} 1.0') in out.splitlines()


def test_no_survey_on_libvirts_test_driver():
    from libvirt_gpu.cmd import service_cmds
    assert service_cmds._survey(None, 'test:///default') is None
    assert callable(service_cmds._survey(None, 'qemu:///system'))


def test_hook_install_text_and_json(capsys, tmp_path, empty_conf):
    code, out, _ = _cli(capsys, '--config-file', empty_conf, 'hook',
                        'install', '--dir', str(tmp_path), '--python',
                        sys.executable, '--json')
    assert code == 0
    doc = json.loads(out)
    hook = tmp_path / 'qemu.d' / 'libvirt-gpu'
    assert hook.is_file()
    assert str(hook) in json.dumps(doc)
    text = hook.read_text()
    assert sys.executable in text and empty_conf in text
    code, out, _ = _cli(capsys, '--config-file', empty_conf, 'hook',
                        'install', '--dir', str(tmp_path))
    assert code == 0 and str(hook) in out


@pytest.mark.parametrize('url', [None, 'http://placement:8778',
                                 'https://p/placement'])
def test_placement_url_taken(url):
    from libvirt_gpu.cmd import openstack_cmds
    assert openstack_cmds._check_url(url) is None


@pytest.mark.parametrize('url', ['placement:8778', 'ftp://p', 'http://',
                                 'http:/p', 'p'])
def test_placement_url_refused(url):
    from libvirt_gpu.cmd import openstack_cmds
    with pytest.raises(exception.InvalidInput) as raised:
        openstack_cmds._check_url(url)
    assert raised.value.kwargs['reason'] == (
        '--url %s: the URL must be http(s)://HOST[:PORT][/PATH], e.g. '
        'http://placement:8778' % url)


@pytest.mark.parametrize('argv', [['placement', 'sync', '--url', 'p'],
                                  ['agent', '--once', '--url', 'p']])
def test_a_bad_url_is_refused_before_placement_is_asked(capsys, hosts,
                                                        empty_conf, argv):
    code, out, err = _cli(capsys, '--config-file', empty_conf,
                          '--sysfs-root', hosts['t4'], *argv)
    assert (code, out) == (1, '')
    assert err.startswith('libvirt-gpu: error: Invalid input: --url p: ')


def test_placement_show_text(capsys, hosts):
    code, out, _ = _cli(capsys, '--config-file', T4_CONF_m, '--hostname', 'h',
                        '--sysfs-root', hosts['t4'], 'placement', 'show')
    assert code == 0
    assert out.splitlines()[0].startswith('source: sysfs')
    assert 'inventory VGPU total=8' in out


def test_a_dir_option_naming_a_file(tmp_path):
    from libvirt_gpu.cmd import recovery_cmds
    path = tmp_path / 'f'
    path.write_text('')
    with pytest.raises(exception.InvalidInput) as raised:
        recovery_cmds._check_dir_option('--mdevctl-dir', str(path))
    assert raised.value.kwargs['reason'] == (
        '--mdevctl-dir %s is not a directory; name a directory' % path)
    assert recovery_cmds._check_dir_option('--x', str(tmp_path)) is None
    assert recovery_cmds._check_dir_option('--x',
                                           str(tmp_path / 'no')) is None


def test_restore_dry_run_without_libvirt(capsys, hosts, empty_conf,
                                         tmp_path):
    argv = ['--config-file', empty_conf, '--sysfs-root', hosts['t4'],
            'restore', '--no-libvirt', '--dry-run', '--mdevctl-dir',
            str(tmp_path / 'mdevctl')]
    code, out, _ = _cli(capsys, *argv)
    assert (code, out) == (0, '0 change(s), 0 failure(s)\n')
    code, out, _ = _cli(capsys, *(argv + ['--json']))
    assert json.loads(out) == {'actions': [], 'changed': 0, 'failed': 0}


# --- nova-config as a command ------------------------------------------------

@pytest.fixture
def libvirt_test_driver_conf(tmp_path):
    path = tmp_path / 'lgpu.conf'
    path.write_text('[libvirt]\nconnection_uri = test:///default\n')
    return str(path)


def _nova(capsys, hosts, conf, *argv):
    return _cli(capsys, '--config-file', conf, '--sysfs-root', hosts['t4'],
                '--hostname', 'h', 'nova-config', *argv)


def test_nova_config_names_its_configuration_file(capsys, hosts,
                                                  libvirt_test_driver_conf):
    code, out, _ = _nova(capsys, hosts, libvirt_test_driver_conf)
    lines = out.splitlines()
    assert code == 0
    assert lines[:2] == [
        '# Generated by `libvirt-gpu nova-config` on h from the carvings',
        '# of %s ([nova]/carved); do not edit: generate it again after'
        % libvirt_test_driver_conf]
    assert lines[-2:] == ['# nothing is carved for Nova on this host',
                          '[pci]']
    code, out, _ = _nova(capsys, hosts, libvirt_test_driver_conf, '--json')
    doc = json.loads(out)
    # one line, its keys in the order written
    assert list(doc) == ['hostname', 'versions', 'live_migratable',
                         'carved', 'device_spec', 'alias', 'withheld']
    assert (code, doc['hostname'], doc['carved'], doc['device_spec']) == (
        0, 'h', [], [])
    assert doc['versions']['error'] is None


def test_nova_config_check_exit_status_and_json(
        capsys, hosts, libvirt_test_driver_conf, tmp_path):
    nova = tmp_path / 'nova.conf'
    nova.write_text('[pci]\ndevice_spec = {"address": "0000:3b:00.0"}\n')
    line = ('line 2: device_spec matches GPU 0000:3b:00.0 (holds no vGPU), '
            'which is not carved for Nova')
    code, out, _ = _nova(capsys, hosts, libvirt_test_driver_conf, '--check',
                         str(nova))
    assert (code, out) == (1, line + '\n')
    two = tmp_path / 'two.conf'
    two.write_text('[pci]\ndevice_spec = {"address": "0000:3b:00.0"}\n'
                   'device_spec = {"address": "0000:af:00.0"}\n')
    code, out, _ = _nova(capsys, hosts, libvirt_test_driver_conf, '--check',
                         str(two))
    assert (code, out.splitlines()) == (1, [
        line, 'line 3: device_spec matches GPU 0000:af:00.0 (holds '
        'nvidia-223, nvidia-223), which is not carved for Nova'])
    code, out, _ = _nova(capsys, hosts, libvirt_test_driver_conf, '--check',
                         str(nova), '--json')
    assert code == 1
    assert json.loads(out) == {'file': str(nova), 'matches': False,
                               'differences': [line], 'notes': [],
                               'withheld': []}
    nova.write_text('[pci]\n')
    code, out, _ = _nova(capsys, hosts, libvirt_test_driver_conf, '--check',
                         str(nova))
    assert (code, out) == (0, '%s matches the VFs carved for Nova on h\n'
                           % nova)
    code, out, _ = _nova(capsys, hosts, libvirt_test_driver_conf, '--check',
                         str(nova), '--json')
    assert (code, json.loads(out)) == (0, {'file': str(nova),
                                           'matches': True,
                                           'differences': [], 'notes': [],
                                           'withheld': []})
    # one line, its keys in the order written
    assert out == ('{"file":"%s","matches":true,"differences":[],'
                   '"notes":[],"withheld":[]}\n' % nova)


# --- migrate, detach, layout on libvirt's test driver ------------------------

QEMU_OLD = ('0.0.2 (VFIO migration needs QEMU >= 8.1.0: upgrade it on the '
            '%s host)')


def test_migrate_dry_run_prints_every_check_and_fails_on_a_no(capsys):
    code, out, _ = _cli(capsys, '-c', 'test:///default', 'migrate', 'test',
                        'test:///default', '--dry-run')
    assert code == 1
    assert out.splitlines() == [
        'checks for migrating test to test:///default:',
        '  ok   source libvirt: 9.0.0',
        '  NO   source QEMU: ' + QEMU_OLD % 'source',
        '  ok   destination libvirt: 9.0.0',
        '  NO   destination QEMU: ' + QEMU_OLD % 'destination',
        '  ok   post-copy: not asked for',
        '  ok   guest running: yes']
    code, out, _ = _cli(capsys, '-c', 'test:///default', 'migrate', 'test',
                        'test:///default', '--dry-run', '--json')
    doc = json.loads(out)
    assert (code, doc['ok'], doc['domain'], doc['destination']) == (
        1, False, 'test', 'test:///default')
    assert doc['checks'][1] == {'what': 'source QEMU', 'ok': False,
                                'detail': QEMU_OLD % 'source'}


def test_detach_names_what_the_domain_does_not_hold(capsys):
    code, out, err = _cli(capsys, '-c', 'test:///default', 'detach', 'test',
                          '--uuid', '00000000-0000-0000-0000-000000000001')
    assert (code, out) == (1, '')
    assert err == ('libvirt-gpu: error: Domain test (6695eb01-f6a4-8304-'
                   '79aa-97f2502e193f) holds no vGPU 00000000-0000-0000-'
                   '0000-000000000001\n')


def test_layout_progress_is_one_line_on_stderr(capsys):
    import types
    from libvirt_gpu.cmd import layout_cmds
    layout_cmds._progress(types.SimpleNamespace(
        status='done', address=PF, action='enable MIG', detail='took 2 s'))
    assert capsys.readouterr() == (
        '', 'done 0000:af:00.0 enable MIG: took 2 s\n')


def test_layout_names_libvirts_domains_or_none(tmp_path):
    import types
    from libvirt_gpu.cmd import layout_cmds
    ctx = types.SimpleNamespace(libvirt_uri=lambda: 'test:///default')
    assert layout_cmds._domain_names(ctx) == {
        objects.Uuid.parse('6695eb01-f6a4-8304-79aa-97f2502e193f'): 'test'}
    gone = 'qemu+unix:///system?socket=%s/none' % tmp_path
    ctx = types.SimpleNamespace(libvirt_uri=lambda: gone)
    assert layout_cmds._domain_names(ctx) == {}


def test_exporter_once_through_libvirt_reports_whole_gpu_use(
        capsys, hosts, libvirt_test_driver_conf):
    used = 'libvirt_gpu_gpu_used{gpu="0000:3b:00.0",mode="pgpu",type=""} 0.0'
    read = 'libvirt_gpu_exporter_read_ok{part="libvirt"} 1.0'
    code, out, _ = _cli(capsys, '--config-file', libvirt_test_driver_conf,
                        '--sysfs-root', hosts['t4'], 'exporter', '--once')
    assert code == 0
    assert {used, read} <= set(out.splitlines())
    code, out, _ = _cli(capsys, '--config-file', libvirt_test_driver_conf,
                        '--sysfs-root', hosts['t4'], 'exporter', '--once',
                        '--no-libvirt')
    assert code == 0
    assert not {used, read} & set(out.splitlines())


def test_restore_dry_run_asks_libvirt_unless_told_not_to(
        capsys, hosts, libvirt_test_driver_conf, tmp_path):
    code, out, _ = _cli(capsys, '--config-file', libvirt_test_driver_conf,
                        '--sysfs-root', hosts['t4'], 'restore', '--dry-run',
                        '--mdevctl-dir', str(tmp_path / 'mdevctl'))
    assert (code, out) == (0, '0 change(s), 0 failure(s)\n')


def test_a_regex_address_reads_the_fields_in_lower_case_hex():
    address = objects.PciAddress.parse('00ab:cd:1e.4')
    assert nova_cmds.address_matches(
        {'domain': '00ab', 'bus': 'cd', 'slot': '1e', 'function': '4'},
        address, None, set())
    for field, upper in (('domain', '00AB'), ('bus', 'CD'), ('slot', '1E')):
        assert not nova_cmds.address_matches({field: upper + '$'}, address,
                                             None, set())


def test_a_spec_without_a_class_is_reported_under_novas_default():
    found = nova_cmds.differences(
        _config(_carved(VF4)), _file([(2, _spec(resource_class=None))],
                                     [(8, ALIAS)]),
        _host(_vf(VF4, TYPE)))
    assert found == ['line 2: device_spec of %s reports resource class '
                     'CUSTOM_PCI_10DE_26B9; this host carves it as %s'
                     % (WHAT, RC)]


def test_a_vf_not_carved_holding_two_vgpus_names_both():
    found = nova_cmds.differences(
        _config(), _file([(2, _spec(address=str(VF5)))]),
        _host(_vf(VF5, TYPE, OTHER)))
    assert found == ['line 2: device_spec matches VF 0000:af:00.5 (holds '
                     'nvidia-1153, nvidia-1154), which is not carved for '
                     'Nova']


def test_an_alias_entry_without_a_name_is_no_alias_named_none():
    config = _config(_carved(VF4, alias='None'))
    del_name = {k: v for k, v in ALIAS.items() if k != 'name'}
    assert nova_cmds._judge_aliases(config, _file([], [(3, del_name)])) == [
        'alias None (resource class %s) is missing from [pci] alias' % RC]


def test_an_alias_for_another_product():
    config = _config(_carved(VF4))
    assert nova_cmds._judge_aliases(config, _file([], [(3, dict(
        ALIAS, product_id='26BA'))])) == [
        'line 3: alias l40s-12q has "product_id": "26BA"; the VFs have 26b9']


def test_list_json_judges_whole_use_only_of_gpus_not_sliced(capsys, hosts,
                                                            tmp_path):
    conf = tmp_path / 'amd-only.conf'
    with open(T4_CONF_m) as f:
        conf.write_text(f.read().replace(
            '[gpu]\n', '[gpu]\npgpu_vendor_ids = 1002\n'))
    code, out, _ = _cli(capsys, '--config-file', str(conf), '--sysfs-root',
                        hosts['t4'], 'list', '--json')
    assert code == 0
    assert {g['address']: (g['mode'], g['not_assignable'])
            for g in json.loads(out)} == {
        '0000:3b:00.0': ('pgpu', 'its vendor 10de is not in '
                                 '[gpu]/pgpu_vendor_ids'),
        '0000:af:00.0': ('vgpu', None)}


def test_agent_once_names_a_placement_it_cannot_reach(capsys, hosts,
                                                      empty_conf):
    code, out, err = _cli(capsys, '--config-file', empty_conf,
                          '--sysfs-root', hosts['t4'], 'agent', '--once',
                          '--url', 'http://127.0.0.1:1')
    assert (code, out) == (1, '')
    assert err.startswith('libvirt-gpu: error: Cannot reach Placement at '
                          'http://127.0.0.1:1: ')
    assert len(err.splitlines()) == 1


def test_list_names_every_group_member_and_what_the_host_uses(capsys,
                                                              tmp_path):
    from tests.doubles import h100
    root = h100.copy_capture(tmp_path / 'sys')
    h100.add_function(root, h100.AUDIO, '0x10de', '0x22ba', '0x040300',
                      'snd_hda_intel')
    h100._group_all(root, [h100.GPU, h100.AUDIO, h100.NIC])
    code, out, _ = _cli(capsys, '--sysfs-root', root, 'list')
    assert code == 0
    row, refusal, note = _table(out)[2:]
    assert ' 6      %s,%s  pgpu ' % (h100.NIC, h100.AUDIO) in row
    assert refusal.startswith('%s: not offered whole: its IOMMU group 6 '
                              'also holds %s' % (h100.GPU, h100.NIC))
    assert note == ('%s: IOMMU group 6 also holds %s (network controller, '
                    'driver virtio-pci), which the host uses'
                    % (h100.GPU, h100.NIC))


def test_list_notes_no_refusal_of_a_sliced_gpu(capsys, hosts, tmp_path):
    conf = tmp_path / 'amd-only.conf'
    with open(T4_CONF_m) as f:
        conf.write_text(f.read().replace(
            '[gpu]\n', '[gpu]\npgpu_vendor_ids = 1002\n'))
    code, out, _ = _cli(capsys, '--config-file', str(conf), '--sysfs-root',
                        hosts['t4'], 'list')
    assert code == 0
    assert [line for line in out.splitlines() if ': not offered' in line] == [
        '0000:3b:00.0: not offered whole: its vendor 10de is not in '
        '[gpu]/pgpu_vendor_ids']


def test_list_of_a_host_without_gpus_says_so(capsys, tmp_path):
    (tmp_path / 'bus' / 'pci' / 'devices').mkdir(parents=True)
    code, out, _ = _cli(capsys, '--sysfs-root', str(tmp_path), 'list')
    assert code == 0
    assert out.splitlines()[-1] == 'no GPU (PCI class 0x03xxxx) found'
