"""Property-based fuzzing (hypothesis) of the exporter's inputs: what the
hook and the tasks record in the state directory (``hook-figures.json``,
``outcome-<task>.json``: near-valid documents with hostile values, or
files that are links, FIFOs, garbage), the lease file, the PCI ID
database that names the GPUs and the type names sysfs gives, on a
simulated T4 host.  For each example one whole scrape, in this process
under a hang alarm:

- no traceback: the collector yields, and a part it cannot read is said
  (``read_ok`` 0, a one-line warning), never raised;
- the exposition is valid: prometheus_client's parser reads it back, and
  it is one renderer's (``render``) for ``--once`` and HTTP alike, with
  no raw control character in it;
- no hang: the scrape ends within the alarm;
- nothing outside the state directory is written (a planted link leads
  to a file outside, which keeps its bytes).

Examples are few and derandomized (``FUZZ_EXAMPLES`` searches further).
"""

import json
import logging
import os
import shutil
import tempfile

from hypothesis import configuration
from hypothesis import given
from hypothesis import HealthCheck
from hypothesis import settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
import pytest

from libvirt_gpu import conf as conf_mod
from libvirt_gpu import environment
from libvirt_gpu import exporter
from libvirt_gpu.devices import sysfs as sysfs_mod
from libvirt_gpu.store import figures
from libvirt_gpu.store import state
from tests.doubles import hang
from tests.doubles import trees

configuration.set_hypothesis_home_dir(os.path.join(
    tempfile.gettempdir(), 'libvirt-gpu-hypothesis-%d' % os.getuid()))

MAX_EXAMPLES = int(os.environ.get('FUZZ_EXAMPLES', '25'))
HANG = 120                    # seconds for all examples: a hang detector
SECRET = b'outside-the-state-dir\n'
A = '0000:3b:00.0'
B = '0000:af:00.0'
# what must never reach a terminal (``--once``) raw: C0 but the newline,
# DEL, C1, the bidirectional overrides
CONTROLS = ([chr(c) for c in range(32) if chr(c) != '\n']
            + [chr(c) for c in range(0x7f, 0xa0)]
            + [chr(c) for c in range(0x202a, 0x202f)]
            + [chr(c) for c in range(0x2066, 0x206a)])

odd_numbers = st.one_of(
    st.integers(-2 ** 70, 2 ** 70), st.floats(allow_nan=True),
    st.sampled_from([True, None, '1', [], {}, 1e308, -0.0]))
odd_text = st.one_of(
    st.text(max_size=40),
    st.sampled_from(['\ud800', 'a\tb', '\u202egpu', 'x\ny', '"}\\', 'a\x7f',
                     '\x9b31m', '\u2066x',
                     '\x1b[31m', '{__name__="x"}', '']))
counts = st.lists(odd_numbers, min_size=0, max_size=14)


@st.composite
def hook_documents(draw):
    """A hook figures document as the hook writes it, some values odd."""
    operations = {}
    for op in draw(st.lists(st.one_of(st.sampled_from(
            figures.OPERATIONS), odd_text), max_size=5)):
        operations[op] = draw(st.one_of(st.fixed_dictionaries({
            'calls': odd_numbers, 'refusals': odd_numbers,
            'errors': odd_numbers, 'seconds_sum': odd_numbers,
            'counts': st.one_of(counts, st.just(
                [1] * (len(figures.BUCKETS) + 1)))}), odd_numbers))
    return {'version': figures.VERSION, 'buckets': list(figures.BUCKETS),
            'operations': operations}


@st.composite
def outcome_documents(draw):
    doc = {'version': figures.VERSION}
    for key in ('runs', 'failures', 'last_changes', 'changes_total',
                'last_run', 'last_success', 'last_error_time'):
        if draw(st.booleans()):
            doc[key] = draw(odd_numbers)
    doc['last_error'] = draw(st.one_of(odd_text, odd_numbers))
    return doc


def _json_bytes(doc):
    # Infinity/NaN and lone surrogates as a careless writer leaves them
    return json.dumps(doc).encode('utf-8', 'surrogatepass')


files = st.one_of(
    st.tuples(st.just('doc'), st.none()),
    st.tuples(st.sampled_from(['garbage', 'link', 'fifo', 'directory']),
              st.binary(max_size=100)))


def _write(path, kind, data, victim):
    if os.path.lexists(path):
        os.remove(path)
    if kind in ('doc', 'garbage'):
        with open(path, 'wb') as f:
            f.write(data)
        os.chmod(path, 0o600)
    elif kind == 'link':
        os.symlink(victim, path)
    elif kind == 'fifo':
        os.mkfifo(path, 0o600)
    else:
        os.mkdir(path, 0o700)


@pytest.fixture
def host(tmp_path):
    with hang.alarm(HANG):
        with trees.simulated_tree('t4') as (root, _):
            yield root, tmp_path


def _setup(root, base, names):
    top = tempfile.mkdtemp(dir=str(base))
    sysfs_root = os.path.join(top, 'sys')
    shutil.copytree(root, sysfs_root, symlinks=True)
    outside = os.path.join(top, 'outside')
    os.mkdir(outside)
    victim = os.path.join(outside, 'victim')
    with open(victim, 'wb') as f:
        f.write(SECRET)
    state_dir = os.path.join(top, 'state')
    os.mkdir(state_dir, 0o700)
    pci_ids = os.path.join(top, 'pci.ids')
    vendor, device = names
    with open(pci_ids, 'wb') as f:
        f.write(('# pci.ids\n10de  %s\n\t1eb8  %s\n'
                 % (vendor, device)).encode('utf-8', 'surrogatepass'))
    config = os.path.join(top, 'libvirt-gpu.conf')
    with open(config, 'w') as f:
        f.write('[DEFAULT]\nsysfs_root = %s\nstate_dir = %s\n'
                'pci_ids_file = %s\n[gpu]\nenabled_vgpu_types = nvidia-223\n'
                % (sysfs_root, state_dir, pci_ids))
    return config, sysfs_root, state_dir, outside, victim


def _scrape(config, sysfs_root):
    env = environment.Environment.from_conf(
        conf_mod.load(config), sysfs=sysfs_mod.Sysfs(sysfs_root))
    text = exporter.exposition(exporter.HostCollector(env))
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, frozenset(sample.labels.items()))] = \
                sample.value
    return text, found


@settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow])
@given(hook=hook_documents(), hook_file=files,
       outcome=outcome_documents(), outcome_file=files,
       lease_file=st.one_of(st.none(), st.binary(max_size=120)),
       names=st.tuples(odd_text, odd_text), type_name=odd_text)
def test_a_scrape_of_hostile_inputs(host, caplog, hook, hook_file, outcome,
                                    outcome_file, lease_file, names,
                                    type_name):
    root, base = host
    config, sysfs_root, state_dir, outside, victim = _setup(root, base,
                                                            names)
    kind, data = hook_file
    _write(os.path.join(state_dir, figures.HOOK_FIGURES), kind,
           _json_bytes(hook) if kind == 'doc' else data, victim)
    kind, data = outcome_file
    _write(os.path.join(state_dir, figures.OUTCOME % figures.RESTORE), kind,
           _json_bytes(outcome) if kind == 'doc' else data, victim)
    if lease_file is not None:
        _write(os.path.join(state_dir, state.DB_NAME), 'garbage', lease_file,
               victim)
    for gpu in (A, B):        # (one model: its type text is read once)
        type_dir = os.path.join(os.path.realpath(os.path.join(
            sysfs_root, 'bus', 'pci', 'devices', gpu)),
            'mdev_supported_types', 'nvidia-223')
        with open(os.path.join(type_dir, 'name'), 'wb') as f:
            f.write(type_name.encode('utf-8', 'surrogatepass'))

    caplog.clear()
    with caplog.at_level(logging.WARNING):
        text, found = _scrape(config, sysfs_root)
    assert not [c for c in CONTROLS if c in text], repr(text[:300])
    assert ('libvirt_gpu_exporter_read_ok',
            frozenset({('part', 'hook')})) in found
    for record in caplog.records:
        assert '\n' not in record.getMessage()
    with open(victim, 'rb') as f:
        assert f.read() == SECRET
    assert os.listdir(outside) == ['victim']


def test_a_del_in_a_name_is_escaped(host):
    """What the fuzz found: DEL (0x7f), a control character like the C0
    and C1 ones, reached the exposition raw."""
    root, base = host
    config, sysfs_root, _, _, _ = _setup(root, base, ('NVIDIA', 'T4\x7f'))
    text, found = _scrape(config, sysfs_root)
    assert '\x7f' not in text
    assert 'product="T4\\\\x7f"' in text
