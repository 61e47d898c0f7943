"""Figures that short-lived processes leave in the state directory for
``libvirt-gpu exporter`` to serve: the hook's calls and latencies, and the
outcome of the last Placement sync and restore.

The standard library, ``statedir``, ``fileutil`` and ``jsonutil`` only
(the qemu hook imports this on every guest start); every file is opened by
``statedir.open_file``, as every state file is (no link followed, no wait
on a FIFO, only a regular file of the directory's owner with one link).
The hook's file is private (0600: no other user can open it to hold its
lock) and every wait for its lock is bounded (``statedir.lock``,
``LOCK_TIMEOUT``), naming the holder when it ends.
The hook's file is one small JSON document that each hook call rewrites in
place under an exclusive ``flock`` of the file (one small
read-modify-write; ``bench/hook.py`` measures it); the exporter reads it
under a shared one, held for one read.  Nothing else takes that lock: a
scrape waits at most for one hook call's write, never for the lease
lock.  The outcome files are
replaced whole (a temporary file, then ``rename``): their writers are not
on a guest's path.

``<state_dir>/hook-figures.json``::

    {"version": 1, "buckets": [0.005, ...],
     "operations": {"prepare": {"calls": 3, "refusals": 1, "errors": 0,
                                "seconds_sum": 0.12,
                                "counts": [0, 2, 1, ...]}}}

``counts`` has one entry per bucket (calls that took at most that many
seconds and more than the bucket before) and a last one for longer calls.

``<state_dir>/outcome-<task>.json`` (``placement-sync``, ``restore``)::

    {"version": 1, "runs": 5, "failures": 1, "last_run": 1700000000.0,
     "last_success": 1700000000.0, "last_error": null,
     "last_error_time": 1699990000.0, "last_changes": 2,
     "changes_total": 7}
"""

from __future__ import annotations

import math
import os
import time

from libvirt_gpu import exception
from libvirt_gpu.util import fileutil
from libvirt_gpu.util import jsonutil
from libvirt_gpu.store import statedir

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, TypedDict

    # a JSON document as read: its values are checked where they are used
    Document = dict[str, Any]

    class HookEntry(TypedDict):
        """One operation's figures (``_entry``: each value checked)."""
        calls: int
        refusals: int
        errors: int
        seconds_sum: float
        counts: list[int]

VERSION = 1
HOOK_FIGURES = 'hook-figures.json'
OUTCOME = 'outcome-%s.json'
PLACEMENT_SYNC = 'placement-sync'
RESTORE = 'restore'
TASKS = (PLACEMENT_SYNC, RESTORE)
# The hook's operations, each served from the first scrape on (at 0), so
# that the first error is an increase Prometheus sees (kept equal to
# hook.HANDLED by a test).
OPERATIONS = ('prepare', 'release', 'reconnect', 'migrate')
# Upper bounds, in seconds, of the hook's latency histogram: from a call
# that finds nothing to do to a prepare that waits for the lease lock
# (bench/hook.py measures the ones in between).
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
           2.5, 5.0, 10.0, 30.0)
# What one hook call ended in.
OK = 'ok'
REFUSED = 'refused'     # the input or the guest refused, with a reason
ERROR = 'error'         # an internal error, or a release that failed
OUTCOMES = (OK, REFUSED, ERROR)
MAX_BYTES = 64 * 1024   # a figures file is never larger; bigger is junk
# The longest a hook call or a scrape waits for the figures' lock (each
# holder keeps it for one small read or write): then it gives up, naming
# the holder, rather than hold up a guest's start.
LOCK_TIMEOUT = 2.0


def _parse(data: bytes) -> Document | None:
    """The JSON document in ``data`` (bytes), or None when it is not one
    of ours (a reader treats that as "nothing recorded yet")."""
    if not data or len(data) > MAX_BYTES:     # not data: a new file
        return None
    try:
        doc = jsonutil.loads(data)
    except (ValueError, RecursionError):     # RecursionError: nested deep
        return None
    if not isinstance(doc, dict) or doc.get('version') != VERSION:
        return None
    return doc


def _read(path: str) -> Document | None:
    """The document at ``path``, or None (none, or not one of ours)."""
    try:
        fd = statedir.open_file(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        return _parse(os.pread(fd, MAX_BYTES + 1, 0))
    finally:
        os.close(fd)


def _replace(path: str, doc: Document) -> None:
    # the directory's checks first: a temporary file is never made in a
    # directory that is not to be trusted
    os.close(statedir.open_dir(os.path.dirname(path))[0])
    fileutil.write_atomic(path, jsonutil.dumps(doc, separators=(',', ':')),
                          mode=0o600)


def _bucket(seconds: float) -> int:
    for index, bound in enumerate(BUCKETS):
        if seconds <= bound:
            return index
    return len(BUCKETS)


def _count(value: object, what: str) -> int:
    """``value`` when it is a count (an int, 0 or more), else ValueError
    naming ``what``: JSON also holds ``Infinity``, ``-1``, ``true``."""
    if type(value) is not int or value < 0:
        raise ValueError('%s is %s, not a count (0 or more)'
                         % (what, _json(value)))
    return value


def _json(value: object) -> str:
    """``value`` as the file holds it (``Infinity``, ``true``, ``"\\ud800"``:
    ASCII only), at most 100 characters."""
    return jsonutil.dumps(value)[:100]


def _seconds(value: object, what: str) -> float:
    """``value`` as a float when it is a finite number of seconds, 0 or
    more, else ValueError naming ``what``."""
    if not (type(value) is int or type(value) is float) \
            or not math.isfinite(value) or value < 0:
        raise ValueError('%s is %s, not a number of seconds (0 or more)'
                         % (what, _json(value)))
    return float(value)


def _entry(operation: str, entry: object) -> HookEntry:
    """The hook's figures of ``operation`` as served (a new dict), or
    ValueError saying which value is not one the hook writes."""
    if operation not in OPERATIONS:
        raise ValueError('operation %s is not one of the hook\'s (%s)'
                         % (_json(operation), ', '.join(OPERATIONS)))
    if not isinstance(entry, dict):
        raise ValueError('%s: %s is not an object' % (operation,
                                                      _json(entry)))
    counts = entry.get('counts')
    if not isinstance(counts, list) or len(counts) != len(BUCKETS) + 1:
        raise ValueError('%s: counts is not a list of %d counts'
                         % (operation, len(BUCKETS) + 1))
    return {'calls': _count(entry.get('calls'), operation + ': calls'),
            'refusals': _count(entry.get('refusals'),
                               operation + ': refusals'),
            'errors': _count(entry.get('errors'), operation + ': errors'),
            'seconds_sum': _seconds(entry.get('seconds_sum'),
                                    operation + ': seconds_sum'),
            'counts': [_count(c, operation + ': counts') for c in counts]}


def _operation(doc: Document, operation: str) -> HookEntry:
    ops = doc.get('operations')
    if not isinstance(ops, dict):
        ops = doc['operations'] = {}
    for other in set(ops) - set(OPERATIONS):
        del ops[other]          # not the hook's: never served, dropped
    try:
        entry = ops[operation] = _entry(operation, ops.get(operation))
    except ValueError:
        # not a value the hook writes (damaged, or planted): counted
        # afresh, so that one bad value does not stay for ever
        entry = ops[operation] = _zero()
    return entry


def record_hook_call(state_dir: str, operation: str, outcome: str,
                     seconds: float) -> None:
    """Count one hook call of ``operation`` that ended in ``outcome`` (one
    of ``OUTCOMES``) after ``seconds``.  Raises OSError when the state
    directory cannot be written, StateError when something other than a
    regular file stands in the file's place (the hook logs either and goes
    on).

    The file is rewritten in place under an exclusive ``flock`` of its
    own, never renamed over nor truncated: on ext4 either makes the
    kernel write the new data out first (``auto_da_alloc``), which a
    guest start would wait for on a busy disk (``bench/hook.py``).  A
    shorter document is padded with spaces (JSON allows them)."""
    path = os.path.join(state_dir, HOOK_FIGURES)
    flags = os.O_RDWR | os.O_CREAT
    try:
        fd = statedir.open_file(path, flags, 0o600)
    except FileNotFoundError:
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        fd = statedir.open_file(path, flags, 0o600)
    try:
        statedir.lock(fd, path, exclusive=True, timeout=LOCK_TIMEOUT)
        old = os.pread(fd, MAX_BYTES + 1, 0)
        doc = _parse(old)
        if doc is None or doc.get('buckets') != list(BUCKETS):
            doc = {'version': VERSION, 'buckets': list(BUCKETS)}
        entry = _operation(doc, operation)
        entry['calls'] += 1
        if outcome == REFUSED:
            entry['refusals'] += 1
        elif outcome == ERROR:
            entry['errors'] += 1
        entry['seconds_sum'] += seconds
        entry['counts'][_bucket(seconds)] += 1
        data = jsonutil.dumps(doc, separators=(',', ':')).encode()
        if len(old) > MAX_BYTES:
            os.ftruncate(fd, 0)         # junk: start afresh (rare)
        elif len(data) < len(old):
            data = data.ljust(len(old))
        os.pwrite(fd, data, 0)
    finally:
        os.close(fd)        # also drops the flock


class HookTimer(object):
    """Times one hook call: ``timer = HookTimer(operation)`` when it
    starts, ``timer.done(state_dir, outcome)`` when it ends."""

    def __init__(self, operation: str) -> None:
        self.operation = operation
        self.started = time.monotonic()

    def done(self, state_dir: str, outcome: str) -> None:
        record_hook_call(state_dir, self.operation, outcome,
                         time.monotonic() - self.started)


def _zero() -> HookEntry:
    return {'calls': 0, 'refusals': 0, 'errors': 0, 'seconds_sum': 0.0,
            'counts': [0] * (len(BUCKETS) + 1)}


def hook_figures(state_dir: str, dropped: list[str] | None = None
                 ) -> dict[str, HookEntry]:
    """``{operation: {calls, refusals, errors, seconds_sum, counts}}`` as
    recorded, every one of ``OPERATIONS`` at least (at 0).  Read under a
    shared ``flock`` of the file, held for one read: it waits at most for
    one hook call's write, and a hook call waits at most for one read.

    An operation whose figures are not values the hook writes (not a
    count, ``Infinity``, below 0, an operation the hook does not have) is
    left out, and what was wrong appended to ``dropped`` (a list) when
    given: the others are still served."""
    found = {operation: _zero() for operation in OPERATIONS}
    path = os.path.join(state_dir, HOOK_FIGURES)
    try:
        fd = statedir.open_file(path, os.O_RDONLY)
    except FileNotFoundError:
        return found
    try:
        statedir.lock(fd, path, exclusive=False, timeout=LOCK_TIMEOUT)
        doc = _parse(os.pread(fd, MAX_BYTES + 1, 0))
    finally:
        os.close(fd)
    if doc is None or doc.get('buckets') != list(BUCKETS):
        return found
    operations = doc.get('operations', {})
    if not isinstance(operations, dict):
        operations = {}
        _note(dropped, '%s: operations is not an object' % HOOK_FIGURES)
    for operation, entry in sorted(operations.items()):
        try:
            found[operation] = _entry(operation, entry)
        except ValueError as e:
            found.pop(operation, None)      # absent, not a counter reset
            _note(dropped, '%s: %s' % (HOOK_FIGURES, e))
    return found


def _note(dropped: list[str] | None, text: str) -> None:
    if dropped is not None:
        dropped.append(text)


def record_outcome(state_dir: str, task: str, error: object = None,
                   changes: int = 0, now: float | None = None) -> bool:
    """Record one run of ``task`` (``TASKS``): ``error`` (text) when it
    failed, else how many ``changes`` it made.  Never raises for a state
    directory that cannot be written: the figures are for watching, the
    task's own result is what counts."""
    path = os.path.join(state_dir, OUTCOME % task)
    now = time.time() if now is None else now
    try:
        doc = _read(path)
    except (OSError, exception.StateError):
        return False
    # a value that is not one we write (damaged, planted) starts afresh
    doc = dict({'version': VERSION, 'runs': 0, 'failures': 0,
                'last_success': None, 'last_error': None,
                'last_error_time': None, 'last_changes': 0,
                'changes_total': 0}, **_valid_outcome(doc or {}))
    doc['runs'] += 1
    doc['last_run'] = now
    if error is not None:
        doc['failures'] += 1
        doc['last_error'] = str(error)[:500]
        doc['last_error_time'] = now
    else:
        doc['last_success'] = now
        doc['last_changes'] = int(changes)
        doc['changes_total'] += int(changes)
    try:
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        _replace(path, doc)
    except (OSError, exception.StateError):
        return False
    return True


# an outcome document's values: what each must be
_COUNTS = ('runs', 'failures', 'last_changes', 'changes_total')
_TIMES = ('last_run', 'last_success', 'last_error_time')


def _valid_outcome(doc: Document, dropped: list[str] | None = None
                   ) -> Document:
    """The values of an outcome document that are ones we write (counts
    0 or more, finite times or null, an error text or null); the others
    left out, what was wrong appended to ``dropped``."""
    valid: Document = {'version': VERSION}
    for key in _COUNTS + _TIMES + ('last_error',):
        if key not in doc:
            continue
        value = doc[key]
        try:
            if key in _COUNTS:
                valid[key] = _count(value, key)
            elif value is None:
                valid[key] = None
            elif key in _TIMES:
                valid[key] = _seconds(value, key)
            elif isinstance(value, str):
                valid[key] = value
            else:
                raise ValueError('last_error is %s, not a text'
                                 % _json(value))
        except ValueError as e:
            _note(dropped, str(e))
    return valid


def outcome(state_dir: str, task: str, dropped: list[str] | None = None
            ) -> Document | None:
    """The recorded outcome document of ``task``, or None.  A value that
    is not one we write is left out, and what was wrong appended to
    ``dropped`` (a list) when given."""
    doc = _read(os.path.join(state_dir, OUTCOME % task))
    if doc is None:
        return None
    notes: list[str] = []
    doc = _valid_outcome(doc, notes)
    for note in notes:
        _note(dropped, '%s: %s' % (OUTCOME % task, note))
    return doc
