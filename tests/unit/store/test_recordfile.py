"""store/recordfile.py: a versioned JSON record file, read bounded and
refused whole when any part of it is not a record, changed under its
lock, written sorted and private."""

import json
import os

import pytest

from libvirt_gpu import exception
from libvirt_gpu.store import recordfile
from libvirt_gpu.store import statedir


class Points(recordfile.RecordFile):
    """A record file of this test's own: ``{name: int}``."""

    name = 'points.json'
    lock_name = 'points.lock'
    version = 3
    key = 'points'
    max_bytes = 64
    noun = 'table'

    def load_entry(self, key, value):
        if not isinstance(value, int):
            raise TypeError('not a number')
        return key, value

    def dump_entry(self, entry):
        return entry


@pytest.fixture
def points(tmp_path):
    return Points(str(tmp_path / 'state'))


def _write(points, data):
    os.makedirs(points.state_dir, exist_ok=True)
    with open(points.path, 'w') as f:
        f.write(data if isinstance(data, str) else json.dumps(data))


def _refusal(points):
    with pytest.raises(exception.StateError) as e:
        points.load()
    assert e.value.kwargs['path'] == points.path
    return e.value.kwargs['reason']


def test_the_paths_are_the_subclass_s_names_in_the_state_directory(points):
    assert points.path == os.path.join(points.state_dir, 'points.json')
    assert points.lock_path == os.path.join(points.state_dir, 'points.lock')


@pytest.mark.parametrize('state_dir', ['', 'relative/state', None])
def test_a_state_directory_that_is_not_absolute_is_refused(state_dir):
    with pytest.raises(exception.ConfigError) as e:
        Points(state_dir)
    assert 'must be an absolute path' in str(e.value)


def test_no_file_is_no_entries_and_nothing_is_made(points):
    assert points.load() == {}
    assert not os.path.exists(points.state_dir)


def test_what_is_saved_reads_back_sorted_under_its_version(points):
    os.makedirs(points.state_dir)
    points.save({'b': 2, 'a': 1})
    with open(points.path) as f:
        text = f.read()
    assert json.loads(text) == {'version': 3, 'points': {'a': 1, 'b': 2}}
    assert text.index('"a"') < text.index('"b"')
    assert os.stat(points.path).st_mode & 0o777 == 0o600
    assert points.load() == {'a': 1, 'b': 2}


@pytest.mark.parametrize('data', [
    {'version': 2, 'points': {}},                  # another version
    {'points': {}},                                # no version
    {'version': 3},                                # no entries
    {'version': 3, 'points': []},                  # entries not an object
    [3, {}],                                       # not an object at all
    {'version': '3', 'points': {}}])               # the version as text
def test_what_is_not_a_record_of_this_version_is_refused(points, data):
    _write(points, data)
    assert _refusal(points) == 'not a version 3 table'


def test_one_bad_entry_refuses_the_whole_file_and_names_it(points):
    _write(points, {'version': 3, 'points': {'a': 1, 'b': 'two'}})
    assert _refusal(points) == "entry 'b' is invalid: not a number"


def test_the_state_directory_s_refusal_is_passed_on(points):
    _write(points, '{"version": 3, "points"')
    assert _refusal(points).startswith('not JSON')
    _write(points, json.dumps({'version': 3, 'points': {}}).ljust(65))
    assert _refusal(points) == 'larger than 64 bytes'


def test_the_size_limit_is_inclusive(points):
    text = json.dumps({'version': 3, 'points': {}})
    _write(points, text.ljust(64))
    assert points.load() == {}


def test_locked_saves_what_changed_under_the_lock(points):
    with points.locked() as entries:
        assert entries == {}
        entries['c'] = 3
    assert points.load() == {'c': 3}
    assert os.path.exists(points.lock_path)


def test_locked_waits_at_most_a_minute_unless_told(points, monkeypatch):
    waits = []
    real = statedir.locked_entries

    def spy(*args, **kwargs):
        waits.append(kwargs['timeout'])
        return real(*args, **kwargs)
    monkeypatch.setattr(statedir, 'locked_entries', spy)
    with points.locked():
        pass
    with points.locked(timeout=2.5):
        pass
    assert waits == [60.0, 2.5]
