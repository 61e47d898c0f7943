"""What the hook's figures and the outcome files promise that the hook and
exporter tests left open: each test here fails on a change ``make
mutation`` made to store/figures.py that the rest stayed green on
(docs/dev/mutation.md): the bounds of each bucket and of the file size,
what each outcome counts, and the whole note a dropped value leaves."""

import json
import os
import stat

import pytest

from libvirt_gpu.store import figures

ZERO = {'calls': 0, 'refusals': 0, 'errors': 0, 'seconds_sum': 0.0,
        'counts': [0] * 15}


def _entry(**changes):
    entry = dict(ZERO, counts=[0] * 15)
    entry.update(changes)
    return entry


def _write(state_dir, doc, name=figures.HOOK_FIGURES):
    path = os.path.join(state_dir, name)
    with open(path, 'w') as f:
        f.write(doc if isinstance(doc, str) else json.dumps(doc))
    os.chmod(path, 0o600)
    return path


def _hook_doc(operations, buckets=figures.BUCKETS):
    return {'version': 1, 'buckets': list(buckets), 'operations': operations}


def _on_disk(state_dir, name=figures.HOOK_FIGURES):
    with open(os.path.join(state_dir, name)) as f:
        return json.loads(f.read())


@pytest.mark.parametrize('seconds,index', [
    (0.0, 0), (0.001, 0), (0.0011, 1), (0.0025, 1), (1.0, 9), (1.01, 10),
    (30.0, 13), (30.01, 14), (1e9, 14)])
def test_a_call_lands_in_the_first_bucket_it_fits(tmp_path, seconds, index):
    figures.record_hook_call(str(tmp_path), 'release', figures.OK, seconds)
    counts = figures.hook_figures(str(tmp_path))['release']['counts']
    assert counts == [0] * index + [1] + [0] * (14 - index)


@pytest.mark.parametrize('outcome,refusals,errors', [
    (figures.OK, 0, 0), (figures.REFUSED, 1, 0), (figures.ERROR, 0, 1)])
def test_each_outcome_counts_once_where_it_belongs(tmp_path, outcome,
                                                   refusals, errors):
    sd = str(tmp_path)
    figures.record_hook_call(sd, 'migrate', outcome, 0.5)
    figures.record_hook_call(sd, 'migrate', outcome, 0.25)
    figures.record_hook_call(sd, 'migrate', outcome, 0.25)
    found = figures.hook_figures(sd)
    assert found['migrate'] == _entry(
        calls=3, refusals=3 * refusals, errors=3 * errors, seconds_sum=1.0,
        counts=[0] * 7 + [2, 1] + [0] * 6)
    assert found['prepare'] == ZERO


def test_the_state_directory_is_made_private_and_the_file_too(tmp_path):
    sd = tmp_path / 'made' / 'here'
    figures.record_hook_call(str(sd), 'prepare', figures.OK, 0.01)
    assert stat.S_IMODE(os.stat(sd).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(sd / figures.HOOK_FIGURES).st_mode) == 0o600
    assert figures.hook_figures(str(sd))['prepare']['calls'] == 1


def test_a_new_file_in_an_existing_directory_is_private(tmp_path):
    figures.record_hook_call(str(tmp_path), 'prepare', figures.OK, 0.01)
    path = tmp_path / figures.HOOK_FIGURES
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with open(path) as f:
        assert f.read() == (
            '{"version":1,"buckets":[0.001,0.0025,0.005,0.01,0.025,0.05,'
            '0.1,0.25,0.5,1.0,2.5,5.0,10.0,30.0],"operations":{"prepare":'
            '{"calls":1,"refusals":0,"errors":0,"seconds_sum":0.01,'
            '"counts":[0,0,0,1,0,0,0,0,0,0,0,0,0,0,0]}}}')


def test_the_file_is_rewritten_in_place_padded_not_shortened(tmp_path):
    sd = str(tmp_path)
    long_doc = _hook_doc({'prepare': _entry(calls=123456789)})
    path = _write(sd, json.dumps(long_doc) + ' ' * 50)
    size = os.path.getsize(path)
    inode = os.stat(path).st_ino
    # an operation the hook does not have is dropped: the document shrinks
    long_doc['operations']['prepare'] = _entry(calls=0)
    _write(sd, json.dumps(long_doc).ljust(size))
    figures.record_hook_call(sd, 'prepare', figures.OK, 0.01)
    assert os.path.getsize(path) == size
    assert os.stat(path).st_ino == inode
    with open(path) as f:
        text = f.read()
    assert text.endswith(' ' * 10)
    assert json.loads(text)['operations']['prepare']['calls'] == 1


def test_junk_over_the_size_limit_starts_afresh(tmp_path):
    sd = str(tmp_path)
    path = _write(sd, 'x' * (figures.MAX_BYTES + 10))
    figures.record_hook_call(sd, 'prepare', figures.OK, 0.01)
    assert os.path.getsize(path) < 1000
    assert _on_disk(sd)['operations'] == {'prepare': _entry(
        calls=1, seconds_sum=0.01, counts=[0, 0, 0, 1] + [0] * 11)}


@pytest.mark.parametrize('size,read', [
    (figures.MAX_BYTES, True), (figures.MAX_BYTES + 1, False)])
def test_the_size_limit_is_inclusive(tmp_path, size, read):
    sd = str(tmp_path)
    doc = json.dumps(_hook_doc({'prepare': _entry(calls=7)}))
    # padded in front: the document's last byte is the file's last
    path = _write(sd, doc.rjust(size))
    assert figures.hook_figures(sd)['prepare']['calls'] == (7 if read else 0)
    figures.record_hook_call(sd, 'prepare', figures.OK, 0.01)
    assert _on_disk(sd)['operations']['prepare']['calls'] == (
        8 if read else 1)
    # a document of ours is rewritten in place, padded to its size; junk
    # is cut first
    if read:
        assert os.path.getsize(path) == size
    else:
        assert os.path.getsize(path) < 1000


@pytest.mark.parametrize('doc', [
    '', '[1]', '{"version": 2, "buckets": []}', '[' * 100000,
    json.dumps(_hook_doc({'prepare': _entry(calls=7)}, buckets=(1.0,))),
    json.dumps({'version': 1, 'operations': {'prepare': _entry(calls=7)}}),
])
def test_a_document_not_ours_is_nothing_recorded_and_replaced(tmp_path, doc):
    sd = str(tmp_path)
    _write(sd, doc[:figures.MAX_BYTES])
    dropped = []
    assert figures.hook_figures(sd, dropped) == {
        op: ZERO for op in figures.OPERATIONS}
    assert dropped == []
    figures.record_hook_call(sd, 'reconnect', figures.OK, 0.01)
    on_disk = _on_disk(sd)
    assert on_disk['version'] == 1
    assert on_disk['buckets'] == list(figures.BUCKETS)
    assert list(on_disk['operations']) == ['reconnect']


def test_record_drops_foreign_operations_and_resets_a_bad_one(tmp_path):
    sd = str(tmp_path)
    _write(sd, _hook_doc({'bogus': _entry(calls=3),
                          'prepare': _entry(calls=-1),
                          'release': _entry(calls=4)}))
    figures.record_hook_call(sd, 'prepare', figures.OK, 0.01)
    ops = _on_disk(sd)['operations']
    assert sorted(ops) == ['prepare', 'release']
    assert ops['prepare']['calls'] == 1
    assert ops['release']['calls'] == 4


def test_record_replaces_operations_that_are_not_an_object(tmp_path):
    sd = str(tmp_path)
    _write(sd, _hook_doc(['prepare']))
    figures.record_hook_call(sd, 'prepare', figures.OK, 0.01)
    assert list(_on_disk(sd)['operations']) == ['prepare']


def test_hook_figures_leaves_out_each_bad_operation_with_a_note(tmp_path):
    sd = str(tmp_path)
    _write(sd, _hook_doc({
        'prepare': _entry(calls=-1),
        'bogus': {},
        'release': [1],
        'migrate': {'counts': [0]},
        'reconnect': _entry(seconds_sum=float('inf'))}))
    dropped = []
    assert figures.hook_figures(sd, dropped) == {}
    assert dropped == [
        'hook-figures.json: operation "bogus" is not one of the hook\'s '
        '(prepare, release, reconnect, migrate)',
        'hook-figures.json: migrate: counts is not a list of 15 counts',
        'hook-figures.json: prepare: calls is -1, not a count (0 or more)',
        'hook-figures.json: reconnect: seconds_sum is Infinity, not a number '
        'of seconds (0 or more)',
        'hook-figures.json: release: [1] is not an object']
    # without a list to note in, the same figures
    assert figures.hook_figures(sd) == {}


@pytest.mark.parametrize('changes,note', [
    ({'refusals': True}, 'prepare: refusals is true, not a count'),
    ({'errors': 1.0}, 'prepare: errors is 1.0, not a count'),
    ({'calls': None}, 'prepare: calls is null, not a count'),
    ({'counts': [0] * 14 + [-2]}, 'prepare: counts is -2, not a count'),
    ({'counts': [0] * 16}, 'prepare: counts is not a list of 15 counts'),
    ({'counts': {}}, 'prepare: counts is not a list of 15 counts'),
    ({'seconds_sum': -0.5}, 'prepare: seconds_sum is -0.5, not a number'),
    ({'seconds_sum': '1'}, 'prepare: seconds_sum is "1", not a number'),
    ({'seconds_sum': 'x' * 200},
     'prepare: seconds_sum is "%s, not a number' % ('x' * 99)),
])
def test_each_value_is_checked(tmp_path, changes, note):
    sd = str(tmp_path)
    _write(sd, _hook_doc({'prepare': _entry(**changes),
                          'release': _entry(calls=2, seconds_sum=1)}))
    dropped = []
    found = figures.hook_figures(sd, dropped)
    assert 'prepare' not in found
    assert found['release'] == _entry(calls=2, seconds_sum=1.0)
    assert type(found['release']['seconds_sum']) is float
    assert len(dropped) == 1
    assert dropped[0].startswith('hook-figures.json: ' + note)


def test_a_document_without_operations_is_zeros_without_a_note(tmp_path):
    sd = str(tmp_path)
    _write(sd, {'version': 1, 'buckets': list(figures.BUCKETS)})
    dropped = []
    assert figures.hook_figures(sd, dropped) == {
        op: ZERO for op in figures.OPERATIONS}
    assert dropped == []


def test_operations_not_an_object_is_noted(tmp_path):
    sd = str(tmp_path)
    _write(sd, _hook_doc([]))
    dropped = []
    assert figures.hook_figures(sd, dropped) == {
        op: ZERO for op in figures.OPERATIONS}
    assert dropped == ['hook-figures.json: operations is not an object']


def test_the_timer_records_its_operation(tmp_path):
    timer = figures.HookTimer('reconnect')
    assert timer.operation == 'reconnect'
    timer.done(str(tmp_path), figures.REFUSED)
    found = figures.hook_figures(str(tmp_path))['reconnect']
    assert (found['calls'], found['refusals']) == (1, 1)
    assert 0 <= found['seconds_sum'] < 30


# outcome files

def test_outcomes_accumulate(tmp_path):
    sd = str(tmp_path / 'new')
    assert figures.outcome(sd, figures.RESTORE) is None
    assert figures.record_outcome(sd, figures.RESTORE, changes=2, now=10.0)
    assert figures.record_outcome(sd, figures.RESTORE, changes=3, now=20.0)
    assert figures.record_outcome(sd, figures.RESTORE, error='y',
                                  changes=9, now=25.0)
    assert figures.record_outcome(sd, figures.RESTORE, error='x' * 600,
                                  changes=9, now=30.0)
    assert stat.S_IMODE(os.stat(sd).st_mode) == 0o700
    path = os.path.join(sd, 'outcome-restore.json')
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert figures.outcome(sd, figures.RESTORE) == {
        'version': 1, 'runs': 4, 'failures': 2, 'last_run': 30.0,
        'last_success': 20.0, 'last_error': 'x' * 500,
        'last_error_time': 30.0, 'last_changes': 3, 'changes_total': 5}
    assert figures.outcome(sd, figures.PLACEMENT_SYNC) is None


def test_an_outcome_is_written_compact(tmp_path):
    sd = str(tmp_path)
    figures.record_outcome(sd, figures.PLACEMENT_SYNC, changes=1, now=1.0)
    with open(os.path.join(sd, 'outcome-placement-sync.json')) as f:
        assert f.read() == (
            '{"version":1,"runs":1,"failures":0,"last_success":1.0,'
            '"last_error":null,"last_error_time":null,"last_changes":1,'
            '"changes_total":1,"last_run":1.0}')


def test_an_outcome_without_now_takes_the_clock(tmp_path):
    sd = str(tmp_path)
    import time
    before = time.time()
    figures.record_outcome(sd, figures.RESTORE)
    found = figures.outcome(sd, figures.RESTORE)
    assert before <= found['last_run'] == found['last_success'] <= \
        time.time()
    assert (found['last_changes'], found['changes_total']) == (0, 0)


def test_an_outcome_never_raises_for_a_directory_it_cannot_use(tmp_path):
    blocker = tmp_path / 'file'
    blocker.write_text('')
    assert figures.record_outcome(str(blocker), figures.RESTORE) is False
    assert figures.record_outcome(str(blocker / 'below'),
                                  figures.RESTORE) is False
    # a directory in the file's place: read fails, nothing written
    (tmp_path / 'outcome-restore.json').mkdir()
    assert figures.record_outcome(str(tmp_path), figures.RESTORE) is False


def test_an_outcome_with_bad_values_keeps_the_good_ones(tmp_path):
    sd = str(tmp_path)
    _write(sd, {'version': 1, 'runs': 4, 'failures': -1, 'last_run': 5,
                'last_success': None, 'last_error': 7,
                'last_error_time': float('inf'), 'last_changes': 'a',
                'changes_total': 6, 'other': 1}, name='outcome-restore.json')
    dropped = []
    assert figures.outcome(sd, figures.RESTORE, dropped) == {
        'version': 1, 'runs': 4, 'last_run': 5.0, 'last_success': None,
        'changes_total': 6}
    assert dropped == [
        'outcome-restore.json: failures is -1, not a count (0 or more)',
        'outcome-restore.json: last_changes is "a", not a count (0 or more)',
        'outcome-restore.json: last_error_time is Infinity, not a number of '
        'seconds (0 or more)',
        'outcome-restore.json: last_error is 7, not a text']
    # a run counts on from the good values, the bad ones start afresh
    assert figures.record_outcome(sd, figures.RESTORE, error=ValueError('b'),
                                  now=8.0)
    assert figures.outcome(sd, figures.RESTORE) == {
        'version': 1, 'runs': 5, 'failures': 1, 'last_run': 8.0,
        'last_success': None, 'last_error': 'b', 'last_error_time': 8.0,
        'last_changes': 0, 'changes_total': 6}


def test_an_outcome_error_text_and_null_times_are_kept(tmp_path):
    sd = str(tmp_path)
    _write(sd, {'version': 1, 'last_error': 'broke', 'last_run': None,
                'last_error_time': 3},
           name='outcome-restore.json')
    dropped = []
    assert figures.outcome(sd, figures.RESTORE, dropped) == {
        'version': 1, 'last_error': 'broke', 'last_run': None,
        'last_error_time': 3.0}
    assert dropped == []
    assert figures.outcome(sd, figures.RESTORE) == {
        'version': 1, 'last_error': 'broke', 'last_run': None,
        'last_error_time': 3.0}


def test_an_outcome_not_ours_is_none(tmp_path):
    sd = str(tmp_path)
    _write(sd, {'version': 2, 'runs': 1}, name='outcome-restore.json')
    assert figures.outcome(sd, figures.RESTORE) is None
    assert figures.record_outcome(sd, figures.RESTORE, changes=1, now=2.0)
    assert figures.outcome(sd, figures.RESTORE)['runs'] == 1


def _held(state_dir, operation):
    """Another open file of the hook's figures, holding a ``flock``."""
    import fcntl
    figures.record_hook_call(state_dir, 'prepare', figures.OK, 0.01)
    fd = os.open(os.path.join(state_dir, figures.HOOK_FIGURES), os.O_RDONLY)
    fcntl.flock(fd, operation)
    return fd


def test_a_scrape_reads_beside_another_reader(tmp_path, monkeypatch):
    import fcntl
    monkeypatch.setattr(figures, 'LOCK_TIMEOUT', 0.2)
    fd = _held(str(tmp_path), fcntl.LOCK_SH)
    try:
        assert figures.hook_figures(str(tmp_path))['prepare']['calls'] == 1
    finally:
        os.close(fd)


def test_a_scrape_held_up_names_the_file(tmp_path, monkeypatch):
    import fcntl
    from libvirt_gpu import exception
    monkeypatch.setattr(figures, 'LOCK_TIMEOUT', 0.05)
    fd = _held(str(tmp_path), fcntl.LOCK_EX)
    try:
        with pytest.raises(exception.StateError) as info:
            figures.hook_figures(str(tmp_path))
    finally:
        os.close(fd)
    assert str(info.value).startswith(
        'State file %s: still locked after 0 s by '
        % (tmp_path / figures.HOOK_FIGURES))


def test_a_hook_call_takes_the_lock_alone_and_names_the_file(
        tmp_path, monkeypatch):
    import fcntl
    from libvirt_gpu import exception
    monkeypatch.setattr(figures, 'LOCK_TIMEOUT', 0.05)
    fd = _held(str(tmp_path), fcntl.LOCK_SH)
    try:
        with pytest.raises(exception.StateError) as info:
            figures.record_hook_call(str(tmp_path), 'prepare', figures.OK,
                                     0.01)
    finally:
        os.close(fd)
    assert str(info.value).startswith(
        'State file %s: still locked after 0 s by '
        % (tmp_path / figures.HOOK_FIGURES))
    assert figures.hook_figures(str(tmp_path))['prepare']['calls'] == 1


def test_an_outcome_that_cannot_be_written_is_false():
    # read: no such directory (nothing recorded); write: cannot be made
    assert figures.record_outcome('/proc/libvirt-gpu-no-such-dir',
                                  figures.RESTORE) is False
