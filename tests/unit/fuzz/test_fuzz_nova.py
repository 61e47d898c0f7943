"""Property-based fuzzing (hypothesis) of what carving for Nova reads that
someone else may have written: the carve record ``nova-carved.json``
(random and hostile bytes, a FIFO, a directory where it should be) and
the Nova file ``nova-config --check`` reads (INI text with ``[pci]``
values built from Nova's forms, hostile regexes and nesting among them),
on the simulated L40S host with two carved VFs, under a hang alarm:

- no traceback: the record reads, or refuses with one line that says
  what to do; ``carving.on_host`` (what the hook and the allocator take)
  never raises on it;
- ``--check`` reads the file or refuses it in one line, and every
  difference it names is one line;
- no hang: every call returns within the alarm (a FIFO read, a regex
  that backtracks for ever would not).

Examples are few and derandomized, so ``make test`` sees the same ones
every run (``FUZZ_EXAMPLES`` searches further).
"""

import json
import os
import shutil
import tempfile

from hypothesis import configuration
from hypothesis import given
from hypothesis import HealthCheck
from hypothesis import settings
from hypothesis import strategies as st
import pytest

from libvirt_gpu.cmd import nova_cmds
from libvirt_gpu.devices import carving
from libvirt_gpu.store import carved as carve_record
from libvirt_gpu import exception
from tests.doubles import hang
from tests.doubles.carved_host import CARVING
from tests.doubles.carved_host import Host
from tests.doubles.carved_host import L2

configuration.set_hypothesis_home_dir(os.path.join(
    tempfile.gettempdir(), 'libvirt-gpu-hypothesis-%d' % os.getuid()))

MAX_EXAMPLES = int(os.environ.get('FUZZ_EXAMPLES', '40'))
HANG = 120                    # seconds for all examples: a hang detector
FUZZ = settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow,
                                       HealthCheck.data_too_large])


@pytest.fixture(scope='module')
def host():
    tmp = tempfile.mkdtemp(prefix='lgpu-nova-fuzz-')
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv('LIBVIRT_GPU_CACHE_DIR', '')
        found = Host(tmp, CARVING % (L2, 2))
        assert found.restore().failed == ()
        yield found
    shutil.rmtree(tmp, ignore_errors=True)


def one_line(text):
    assert text and '\n' not in text, repr(text)
    assert len(text) < 4000, text[:200]


# --- the carve record --------------------------------------------------------

addresses = st.sampled_from(['0000:bd:00.4', '0000:bd:00.5', '0000:3d:00.4',
                             '0000:bd:00.0', '0000:ff:1f.7', 'bd:00.4', '',
                             '0000:bd:00.4\n', '\u0660000:bd:00.4'])
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats()
    | st.text(max_size=20) | addresses,
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10)
entries = st.fixed_dictionaries({}, optional={
    'gpu': addresses | json_values, 'type_id': st.sampled_from(
        ['nvidia-1153', 'nvidia-', 'x' * 80]) | json_values,
    'carving': st.text(max_size=10) | json_values,
    'type_name': st.text(max_size=10) | json_values})
records = st.fixed_dictionaries({
    'version': st.sampled_from([1, 1, 2, '1', None]),
    'vfs': st.dictionaries(addresses, entries | json_values, max_size=3)
    | json_values})
record_bytes = st.one_of(
    records.map(lambda r: json.dumps(r).encode()),
    records.map(lambda r: b'\xef\xbb\xbf' + json.dumps(r).encode()),
    records.map(lambda r: json.dumps(r).encode('utf-16')),
    records.map(lambda r: json.dumps(r).encode()[:-3]),
    st.binary(max_size=200),
    st.sampled_from([b'', b'[' * 5000 + b']' * 5000,
                     b'{"a": ' * 5000 + b'1' + b'}' * 5000,
                     b'{"version": 1, "vfs": {}}' + b' ' * (1 << 20)]))
kinds = st.sampled_from(['bytes'] * 6 + ['fifo', 'directory'])


def _remove(path):
    if os.path.isdir(path):
        os.rmdir(path)
    elif os.path.lexists(path):
        os.unlink(path)


def _plant(path, kind, data):
    _remove(path)
    if kind == 'fifo':
        os.mkfifo(path, 0o600)
    elif kind == 'directory':
        os.mkdir(path, 0o700)
    else:
        with open(path, 'wb') as f:
            f.write(data)
        os.chmod(path, 0o600)


@FUZZ
@given(kind=kinds, data=record_bytes)
def test_any_carve_record_reads_or_says_what_to_do(host, kind, data):
    path = os.path.join(host.state_dir, carve_record.RECORD_NAME)
    saved = carve_record.CarveRecord(host.state_dir).read()
    try:
        _plant(path, kind, data)
        with hang.alarm(HANG):
            try:
                found = carve_record.CarveRecord(host.state_dir).read()
            except carve_record.DamagedRecord as e:
                one_line(str(e))
                assert str(e).endswith(carve_record.REMEDY)
                found = None
            on_host = carving.on_host(host.state_dir, host.sysfs,
                                      host.env().kind_classes)
        if found is None:
            # nothing is known: every GPU that could be carved is held
            assert on_host.recorded == () and L2 in on_host.held_gpus
            with pytest.raises(carve_record.DamagedRecord):
                on_host.gpus
        else:
            assert all(isinstance(e, carve_record.CarvedVf)
                       for e in found.values())
            assert on_host.recorded == tuple(found[vf]
                                             for vf in sorted(found))
            # a VF recorded is Nova's, and so is the GPU it is under
            for vf in found:
                pf = host.sysfs.physfn(vf)
                assert pf is None or pf in on_host.gpus == \
                    on_host.held_gpus
    finally:
        _remove(path)
        with carve_record.CarveRecord(host.state_dir).locked() as entries:
            entries.update(saved)


# --- the Nova file of --check ------------------------------------------------

REGEXES = ['bd', '0000', '0[0-9]', '[4-7]', '.*', '((((((.*)*)*)*)*)*)x',
           '(a|a?)+$', '(.?){30}x', '0{99999999999}', '(', '[', 'x' * 40,
           '(?P<x>a)(?(x)b*|c)+', '(' + '|'.join('.' * 14) + ')*x']
globs = st.sampled_from(['0000:bd:00.4', '0000:bd:00.*', '*:bd:00.*',
                         ':00.', '0000:bd:00.0', 'bd:00.4', '0000:bd:20.4',
                         '0000:xx:00.4', '', '*', '0:0:bd:00.4', '.'])
address_dicts = st.fixed_dictionaries({}, optional={
    field: st.sampled_from(REGEXES) | st.text(max_size=12)
    for field in ('domain', 'bus', 'slot', 'function')})
specs = st.fixed_dictionaries({}, optional={
    'vendor_id': st.sampled_from(['10de', '0x10de', '*', 'xyz', '10DE']),
    'product_id': st.sampled_from(['26b9', '*', '', 'zz']),
    'address': globs | address_dicts | json_values,
    'managed': st.sampled_from(['no', 'yes', 'false', 'maybe', 0]),
    'resource_class': st.sampled_from(['CUSTOM_NVIDIA_L40S_12Q', 'vgpu',
                                       'PCI_DEVICE', '']),
    'live_migratable': st.sampled_from(['yes', 'no', 'x']),
    'devname': st.sampled_from(['eth0', '']),
}) | json_values
aliases = st.fixed_dictionaries({}, optional={
    'name': st.sampled_from(['l40s-12q', 'other']) | json_values,
    'device_type': st.sampled_from(['type-VF', 'type-PCI']),
    'resource_class': st.sampled_from(['CUSTOM_NVIDIA_L40S_12Q', 'x']),
    'vendor_id': st.sampled_from(['10de', 'zz']) | json_values,
    'product_id': st.sampled_from(['26b9', '*']) | json_values,
}) | json_values


@st.composite
def nova_lines(draw):
    key = draw(st.sampled_from(['device_spec', 'passthrough_whitelist',
                                'alias', 'other']))
    value = draw(aliases if key == 'alias' else specs)
    if draw(st.booleans()):
        value = [value, draw(specs)]
    text = json.dumps(value)
    form = draw(st.sampled_from(['plain', 'quoted', 'folded', 'cut']))
    if form == 'quoted':
        text = "'%s'" % text
    elif form == 'folded':
        text = text.replace(', ', ',\n    ')
    elif form == 'cut':
        text = text[:len(text) // 2]
    return '%s %s %s' % (key, draw(st.sampled_from(['=', ':'])), text)


nova_texts = st.one_of(
    st.lists(nova_lines(), max_size=6).map(
        lambda lines: '[DEFAULT]\ndebug = true\n[pci]\n' + '\n'.join(lines)
        + '\n'),
    st.text(max_size=300),
    st.sampled_from(['[pci]\ndevice_spec = ' + '[' * 100000 + ']' * 100000,
                     '[pci]\n' + 'device_spec = {"address": {"bus": "'
                     '((((((.*)*)*)*)*)*)x"}}\n' * 300,
                     '[pci\ndevice_spec = {}', '\ufeff[pci]\nalias = {}']))


@FUZZ
@given(text=nova_texts, encoding=st.sampled_from(['utf-8', 'utf-8',
                                                  'utf-16', 'latin-1']))
def test_check_of_any_nova_file_is_one_line_per_difference(host, text,
                                                           encoding):
    env = host.env()
    expected = nova_cmds.nova_config(
        env.carved.planned, nova_cmds.Versions(error='not asked'), 'h',
        host.config, nova_cmds.withheld(env.carved,
                                        env.vgpus.reserved_parents()))
    path = os.path.join(host.tmp, 'nova.conf')
    with open(path, 'wb') as f:
        f.write(text.encode(encoding, 'replace' if encoding == 'latin-1'
                            else 'surrogatepass'))
    with hang.alarm(HANG):
        try:
            nova_file = nova_cmds.read_nova_file(path)
        except exception.InvalidInput as e:
            one_line(str(e))
            return
        found = nova_cmds.differences(expected, nova_file,
                                      env.discovered.gpus)
        said = nova_cmds.notes(nova_file)
    for line in found + said:
        one_line(line)
