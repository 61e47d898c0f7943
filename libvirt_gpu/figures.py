"""Figures that short-lived processes leave in the state directory for
``libvirt-gpu exporter`` to serve: the hook's calls and latencies, and the
outcome of the last Placement sync and restore.

Standard library only (the qemu hook imports this on every guest start).
Each file is a small JSON document replaced whole (write a temporary file,
then ``rename``), so a reader never sees half of one and takes no lock.
Writers of the hook's file serialise on ``hook-figures.lock`` (an
exclusive ``flock`` held for one read-modify-write, well under a
millisecond), which only other hook calls ever take: the exporter never
does, so a scrape cannot hold up a guest start.

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

import fcntl
import json
import os
import time

VERSION = 1
HOOK_FIGURES = 'hook-figures.json'
HOOK_LOCK = 'hook-figures.lock'
OUTCOME = 'outcome-%s.json'
PLACEMENT_SYNC = 'placement-sync'
RESTORE = 'restore'
TASKS = (PLACEMENT_SYNC, RESTORE)
# The hook's operations, each served from the first scrape on (at 0), so
# that the first error is an increase Prometheus sees (kept equal to
# hook.HANDLED by a test).
OPERATIONS = ('prepare', 'release', 'reconnect')
# Upper bounds, in seconds, of the hook's latency histogram: a call that
# finds nothing to do takes about a millisecond, a prepare that creates
# vGPUs tens of milliseconds, one that waits for the lease lock longer.
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
           2.5, 5.0, 10.0, 30.0)
# What one hook call ended in.
OK = 'ok'
REFUSED = 'refused'     # the input or the guest refused, with a reason
ERROR = 'error'         # an internal error, or a release that failed
OUTCOMES = (OK, REFUSED, ERROR)
MAX_BYTES = 64 * 1024   # a figures file is never larger; bigger is junk


def _read(path):
    """The JSON document at ``path``, or None when there is none or it is
    not one of ours (a reader treats that as "nothing recorded yet")."""
    try:
        with open(path, 'rb') as f:
            data = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return None
    if len(data) > MAX_BYTES:
        return None
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get('version') != VERSION:
        return None
    return doc


def _replace(path, doc):
    tmp = '%s.%d.tmp' % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC,
                 0o644)
    try:
        os.write(fd, json.dumps(doc, separators=(',', ':')).encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _bucket(seconds):
    for index, bound in enumerate(BUCKETS):
        if seconds <= bound:
            return index
    return len(BUCKETS)


def _operation(doc, operation):
    ops = doc.setdefault('operations', {})
    entry = ops.get(operation)
    if not (isinstance(entry, dict) and isinstance(entry.get('counts'), list)
            and len(entry['counts']) == len(BUCKETS) + 1):
        entry = ops[operation] = _zero()
    return entry


def record_hook_call(state_dir, operation, outcome, seconds):
    """Count one hook call of ``operation`` that ended in ``outcome`` (one
    of ``OUTCOMES``) after ``seconds``.  Raises OSError when the state
    directory cannot be written (the hook logs it and goes on)."""
    path = os.path.join(state_dir, HOOK_FIGURES)
    lock = os.path.join(state_dir, HOOK_LOCK)
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except FileNotFoundError:
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        doc = _read(path)
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
        _replace(path, doc)
    finally:
        os.close(fd)        # also drops the flock


class HookTimer(object):
    """Times one hook call: ``timer = HookTimer(operation)`` when it
    starts, ``timer.done(state_dir, outcome)`` when it ends."""

    def __init__(self, operation):
        self.operation = operation
        self.started = time.monotonic()

    def done(self, state_dir, outcome):
        record_hook_call(state_dir, self.operation, outcome,
                         time.monotonic() - self.started)


def _zero():
    return {'calls': 0, 'refusals': 0, 'errors': 0, 'seconds_sum': 0.0,
            'counts': [0] * (len(BUCKETS) + 1)}


def hook_figures(state_dir):
    """``{operation: {calls, refusals, errors, seconds_sum, counts}}`` as
    recorded, every one of ``OPERATIONS`` at least (at 0)."""
    found = {operation: _zero() for operation in OPERATIONS}
    doc = _read(os.path.join(state_dir, HOOK_FIGURES))
    if doc is None or doc.get('buckets') != list(BUCKETS):
        return found
    for operation, entry in sorted(doc.get('operations', {}).items()):
        try:
            counts = [int(c) for c in entry['counts']]
            found[str(operation)] = {
                'calls': int(entry['calls']),
                'refusals': int(entry['refusals']),
                'errors': int(entry['errors']),
                'seconds_sum': float(entry['seconds_sum']),
                'counts': counts}
        except (KeyError, TypeError, ValueError):
            continue        # a damaged entry: the others still count
    return found


def record_outcome(state_dir, task, error=None, changes=0, now=None):
    """Record one run of ``task`` (``TASKS``): ``error`` (text) when it
    failed, else how many ``changes`` it made.  Never raises for a state
    directory that cannot be written: the figures are for watching, the
    task's own result is what counts."""
    path = os.path.join(state_dir, OUTCOME % task)
    now = time.time() if now is None else now
    doc = _read(path) or {'version': VERSION, 'runs': 0, 'failures': 0,
                          'last_success': None, 'last_error': None,
                          'last_error_time': None, 'last_changes': 0,
                          'changes_total': 0}
    doc['runs'] = int(doc.get('runs', 0)) + 1
    doc['last_run'] = now
    if error is not None:
        doc['failures'] = int(doc.get('failures', 0)) + 1
        doc['last_error'] = str(error)[:500]
        doc['last_error_time'] = now
    else:
        doc['last_success'] = now
        doc['last_changes'] = int(changes)
        doc['changes_total'] = int(doc.get('changes_total', 0)) + changes
    try:
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        _replace(path, doc)
    except OSError:
        return False
    return True


def outcome(state_dir, task):
    """The recorded outcome document of ``task``, or None."""
    return _read(os.path.join(state_dir, OUTCOME % task))
