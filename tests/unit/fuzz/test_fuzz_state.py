"""Property-based fuzzing (hypothesis) of the state directory's files:
random and hostile contents for the lease file (and its lock), the hook's
figures and settings snapshot, the owner file and the recorded boot id
(also as a FIFO, a directory, a link or a hard link to a file outside,
a sparse file of gigabytes, another program's SQLite file), then every
reader and writer of them, in this process under a hang alarm:

- no traceback: a call returns, or raises one of our errors whose message
  is one line;
- no hang: every call returns within the alarm (a lock waited on, a FIFO
  read, a file read to its end would not);
- nothing outside the state directory is written: the file outside, which
  planted links lead to, keeps its bytes and mode, and nothing appears
  beside it.

Examples are few and derandomized, so ``make test`` sees the same ones
every run (``FUZZ_EXAMPLES`` searches further); a few seconds in all.
"""

import os
import sqlite3
import stat
import tempfile

from hypothesis import configuration
from hypothesis import given
from hypothesis import HealthCheck
from hypothesis import settings
from hypothesis import strategies as st
import pytest

from libvirt_gpu import exception
from libvirt_gpu.devices.backends.nvidia_vgpu import statefile
from libvirt_gpu import objects
from libvirt_gpu.guests.hook import settings as hook_settings
from libvirt_gpu.store import figures
from libvirt_gpu.store import state
from libvirt_gpu.store import statedir
from tests.doubles import hang

configuration.set_hypothesis_home_dir(os.path.join(
    tempfile.gettempdir(), 'libvirt-gpu-hypothesis-%d' % os.getuid()))

MAX_EXAMPLES = int(os.environ.get('FUZZ_EXAMPLES', '40'))
HANG = 60                     # seconds for all examples: a hang detector
SECRET = b'outside-the-state-dir\n'
FILES = (state.DB_NAME, state.LOCK_NAME, figures.HOOK_FIGURES,
         hook_settings.SETTINGS_NAME, statedir.OWNER_NAME,
         state.BOOT_ID_NAME, figures.OUTCOME % figures.RESTORE,
         statefile.STATE_NAME, statefile.LOCK_NAME)

DEEP_ARRAY = b'[' * 5000 + b']' * 5000
contents = st.one_of(
    st.binary(max_size=300),
    st.text(max_size=200).map(lambda t: t.encode('utf-8', 'surrogatepass')),
    st.sampled_from([
        b'', b'{}', b'[]', b'null', b'{"version": 1}',
        b'{"version": 1, "prepare": {"calls": {"ok": -1}}}',
        b'{"version": 1, "prepare": {"calls": {"ok": 1e999}}}',
        b'{"version": 1, "prepare": {"seconds_sum": NaN}}',
        b'{"key": {}, "options": {}, "groups": {}, "extra": []}',
        b'"\\ud800"', b'SQLite format 3\x00', b'sysfs_root=/\n',
        b'sysfs_root=' + b'x' * 5000, b'\xff\xfe{\x00}\x00',
        DEEP_ARRAY]))
DEEP = b'{"a": ' * 5000 + b'1' + b'}' * 5000
kinds = st.sampled_from(['bytes', 'bytes', 'bytes', 'fifo', 'directory',
                         'symlink', 'hardlink', 'sparse', 'sqlite'])


def _plant(path, kind, data, victim):
    if kind == 'bytes':
        with open(path, 'wb') as f:
            f.write(data)
    elif kind == 'fifo':
        os.mkfifo(path, 0o600)
    elif kind == 'directory':
        os.mkdir(path, 0o700)
    elif kind == 'symlink':
        os.symlink(victim, path)
    elif kind == 'hardlink':
        os.link(victim, path)
    elif kind == 'sparse':
        with open(path, 'wb') as f:
            f.truncate(3 << 30)       # 3 GiB of nothing, no disk used
    else:
        db = sqlite3.connect(path)
        db.executescript('CREATE TABLE leases (x); CREATE VIEW v AS '
                         'SELECT 1; CREATE TRIGGER t AFTER INSERT ON leases '
                         'BEGIN DELETE FROM leases; END;')
        db.close()
    if kind in ('bytes', 'sparse', 'sqlite'):
        os.chmod(path, 0o600)


def _one_line(call, allowed=()):
    """Run ``call``: it returns, or raises one of our errors (a
    LibvirtGpuError; statedir.Refused is also an OSError), or one of
    ``allowed`` its caller handles, in one line."""
    try:
        return call()
    except (exception.LibvirtGpuError,) + allowed as e:
        said = str(e)
        assert said and '\n' not in said, repr(said)
        assert len(said) < 2000, said[:200]
    return None


def _reserve(store):
    with store.transaction() as txn:
        txn.add(objects.Uuid.new(), objects.Uuid.new(),
                objects.PciAddress.parse('0000:af:00.0'),
                objects.TypeId.parse('nvidia-223'))
        return txn.all()


def _snapshot(store):
    try:
        with store.snapshot() as txn:
            return txn.all()
    finally:
        store.close()


def _outside_unchanged(outside, victim):
    assert sorted(os.listdir(outside)) == ['victim']
    with open(victim, 'rb') as f:
        assert f.read() == SECRET
    assert stat.S_IMODE(os.stat(victim).st_mode) == 0o644


@pytest.fixture
def base(tmp_path):
    with hang.alarm(HANG):
        yield tmp_path


def _dirs(base):
    top = tempfile.mkdtemp(dir=str(base))
    outside = os.path.join(top, 'outside')
    os.mkdir(outside)
    victim = os.path.join(outside, 'victim')
    with open(victim, 'wb') as f:
        f.write(SECRET)
    os.chmod(victim, 0o644)
    state_dir = os.path.join(top, 'state')
    os.mkdir(state_dir, 0o700)
    sysfs_root = os.path.join(top, 'sys')
    os.makedirs(os.path.join(sysfs_root, 'bus', 'pci', 'devices'))
    return top, outside, victim, state_dir, sysfs_root


@settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow])
@given(name=st.sampled_from(FILES), kind=kinds, data=contents)
def test_a_hostile_state_file(base, name, kind, data):
    top, outside, victim, state_dir, sysfs_root = _dirs(base)
    _plant(os.path.join(state_dir, name), kind, data, victim)

    store = state.LeaseStore(state_dir, lock_timeout=0.5,
                             sysfs_root=sysfs_root)
    _one_line(store.leases)
    _one_line(lambda: _reserve(store))
    store.close()
    _one_line(lambda: _snapshot(state.LeaseStore(state_dir,
                                                 lock_timeout=0.5)))

    dropped = []
    _one_line(lambda: figures.hook_figures(state_dir, dropped))
    assert all('\n' not in d for d in dropped)
    # (OSError: documented, the hook logs it and goes on)
    _one_line(lambda: figures.record_hook_call(state_dir, 'prepare',
                                               figures.OK, 0.003),
              allowed=(OSError,))
    _one_line(lambda: figures.hook_figures(state_dir))
    _one_line(lambda: figures.record_outcome(state_dir, figures.RESTORE,
                                             error='x\ud800'))
    _one_line(lambda: figures.outcome(state_dir, figures.RESTORE, []))

    _one_line(statefile.VendorState(state_dir).read)

    config = os.path.join(top, 'libvirt-gpu.conf')
    with open(config, 'w') as f:
        f.write('[DEFAULT]\nsysfs_root = %s\nstate_dir = %s\n'
                % (sysfs_root, state_dir))
    snapshot = os.path.join(state_dir, hook_settings.SETTINGS_NAME)
    found = _one_line(lambda: hook_settings.load_settings(config, snapshot))
    if found is not None:
        assert found[0].state_dir == state_dir
    _outside_unchanged(outside, victim)


@pytest.mark.parametrize('name', [figures.HOOK_FIGURES,
                                  hook_settings.SETTINGS_NAME,
                                  statefile.STATE_NAME])
def test_json_nested_past_the_parsers_depth(base, name):
    """What the fuzz found: JSON nested 5,000 deep made ``json.loads``
    raise RecursionError, a traceback in the hook and the exporter."""
    top, outside, victim, state_dir, sysfs_root = _dirs(base)
    _plant(os.path.join(state_dir, name), 'bytes', DEEP, victim)
    assert figures.hook_figures(state_dir)['prepare']['calls'] == 0
    figures.record_hook_call(state_dir, 'prepare', figures.OK, 0.003)
    if name == statefile.STATE_NAME:
        with pytest.raises(exception.StateError, match='nested too deeply'):
            statefile.VendorState(state_dir).read()
    config = os.path.join(top, 'libvirt-gpu.conf')
    with open(config, 'w') as f:
        f.write('[DEFAULT]\nsysfs_root = %s\nstate_dir = %s\n'
                % (sysfs_root, state_dir))
    snapshot = os.path.join(state_dir, hook_settings.SETTINGS_NAME)
    found, note = hook_settings.load_settings(config, snapshot)
    assert found.state_dir == state_dir and note


def test_an_mdevctl_definition_nested_past_the_parsers_depth(tmp_path):
    from libvirt_gpu.devices.backends import mdev
    uuid = objects.Uuid.new()
    where = tmp_path / 'mdevctl.d' / '0000:af:00.0'
    where.mkdir(parents=True)
    (where / uuid).write_bytes(DEEP)
    backend = mdev.MdevBackend(None, mdevctl_dir=str(tmp_path / 'mdevctl.d'))
    with pytest.raises(exception.ConfigError, match='nested too deeply'):
        backend.definition(uuid)
