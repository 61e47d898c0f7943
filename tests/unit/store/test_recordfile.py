"""store/recordfile.py: a versioned JSON record file, read bounded and
refused whole, with the reason a user reads, when any part of it is not a
record; changed under its lock, the wait bounded; written sorted and
private."""

import json
import os
import stat

import pytest

from libvirt_gpu import exception
from libvirt_gpu.store import recordfile
from libvirt_gpu.store import statedir


class Notes(recordfile.RecordFile):
    """A record file of this test's own: ``{name: int}``."""

    name = 'notes.json'
    lock_name = 'notes.lock'
    version = 3
    key = 'notes'
    max_bytes = 200
    noun = 'note file'

    def load_entry(self, key, value):
        if not isinstance(value, int):
            raise TypeError('not a number')
        return key, value

    def dump_entry(self, entry):
        return entry


def _write(notes, text):
    os.makedirs(notes.state_dir, exist_ok=True)
    with open(notes.path, 'w') as f:
        f.write(text)


def test_the_paths_are_the_subclass_s_names_in_the_state_directory(
        tmp_path):
    notes = Notes(str(tmp_path))
    assert notes.path == str(tmp_path / 'notes.json')
    assert notes.lock_path == str(tmp_path / 'notes.lock')


def test_a_record_file_round_trip(tmp_path):
    notes = Notes(str(tmp_path / 'state'))
    assert notes.load() == {}
    assert not os.path.exists(notes.state_dir)       # nothing created
    with notes.locked() as entries:
        entries['b'] = 2
        entries['a'] = 1
    with open(notes.path) as f:
        text = f.read()
    assert json.loads(text) == {'version': 3, 'notes': {'a': 1, 'b': 2}}
    assert text.index('"a"') < text.index('"b"')     # sorted by id
    assert stat.S_IMODE(os.stat(notes.path).st_mode) == 0o600
    assert os.path.exists(notes.lock_path)
    assert notes.load() == {'a': 1, 'b': 2}
    mtime = os.stat(notes.path).st_mtime_ns
    with notes.locked():
        pass                                           # unchanged: not saved
    assert os.stat(notes.path).st_mtime_ns == mtime


@pytest.mark.parametrize('text, said', [
    ('{"version": 2, "notes": {}}', 'not a version 3 note file'),
    ('{"notes": {}}', 'not a version 3 note file'),
    ('{"version": "3", "notes": {}}', 'not a version 3 note file'),
    ('{"version": 3}', 'not a version 3 note file'),
    ('{"version": 3, "notes": []}', 'not a version 3 note file'),
    ('[]', 'not a version 3 note file'),
    ('{"version": 3, "notes": {"a": 1, "b": "x"}}',
     "entry 'b' is invalid: not a number"),
    ('{"version": 3, "notes": {"a": %s}}' % ('1' * 300),
     'larger than 200 bytes'),
])
def test_a_record_file_that_is_not_one_is_refused(tmp_path, text, said):
    notes = Notes(str(tmp_path))
    _write(notes, text)
    with pytest.raises(exception.StateError) as e:
        notes.load()
    assert e.value.kwargs['reason'] == said
    assert e.value.kwargs['path'] == notes.path
    assert notes.path in str(e.value)


def test_what_is_not_json_is_refused_as_such(tmp_path):
    notes = Notes(str(tmp_path))
    _write(notes, '{')
    with pytest.raises(exception.StateError) as e:
        notes.load()
    assert e.value.kwargs['reason'].startswith('not JSON')


def test_the_size_limit_is_inclusive(tmp_path):
    notes = Notes(str(tmp_path))
    _write(notes, json.dumps({'version': 3, 'notes': {}}).ljust(200))
    assert notes.load() == {}


@pytest.mark.parametrize('state_dir', ['', 'relative/state', None])
def test_a_record_file_needs_an_absolute_state_dir(state_dir):
    with pytest.raises(exception.ConfigError, match='must be an absolute'):
        Notes(state_dir)


def test_the_lock_of_a_record_file_is_bounded(tmp_path):
    notes = Notes(str(tmp_path))
    with notes.lock():
        with pytest.raises(exception.StateError, match='still locked after'):
            with notes.locked(timeout=0.01):
                pass


def test_locked_waits_at_most_a_minute_unless_told(tmp_path, monkeypatch):
    notes = Notes(str(tmp_path))
    waits = []
    real = statedir.locked_entries

    def spy(*args, **kwargs):
        waits.append(kwargs['timeout'])
        return real(*args, **kwargs)
    monkeypatch.setattr(statedir, 'locked_entries', spy)
    with notes.locked():
        pass
    with notes.locked(timeout=2.5):
        pass
    assert waits == [60.0, 2.5]
