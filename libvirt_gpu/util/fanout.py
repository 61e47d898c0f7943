"""One function over the parts of a list, the parts read by forked
processes at once.

Discovery of a large host is a long run of small system calls (~45 per
PCI device, 4 per vGPU type: ~34,000 for 256 mdev parents of 20 types),
each waiting on the kernel and none on another.  ``map_parts`` splits the
list, forks one child per part after the first, computes the first part
itself meanwhile, and takes each child's answer back through a pipe
(pickled: the records of ``objects`` are plain values).  A child costs
CPU time, not only wall time: the fork, and a copy of every page of the
parent's heap that either process then writes (reference counts are
writes): 7-10 ms of CPU for a child reading half of 256 mdev parents,
some 13 % of the reading (bench/discovery.py, docs/dev/benchmarks.md).
So only a long list is worth splitting, and only onto CPUs that no other
work keeps busy (``workers_for``): on a machine whose CPUs are all
taken, a second process only makes the same work dearer and later.

The answer and any error are the serial one's: a child that cannot be
started, fails, or answers nothing readable has its part computed here
after all.  A child never runs the caller's code after its part: it
writes its answer and leaves with ``os._exit`` (no ``atexit``, no
buffered output written twice).  Only a process with no other thread may
fork (a thread holding a lock at the fork would leave it held in the
child), so ``map_parts`` falls back to one process when another thread
runs.  ``pickle`` (its C half) and ``signal`` are imported only when it
forks: a small host, or one CPU, reads in one process and never needs
them.
"""

import os
import sys

# One process per this many items at least: below it the fork costs more
# than the second process saves.
ITEMS_PER_WORKER = 64
MAX_WORKERS = 4


def workers_for(count, cpus=None, load=None):
    """How many processes to read ``count`` items with: one per
    ITEMS_PER_WORKER items, at most one per CPU this process may run on
    (``cpus``), at most MAX_WORKERS, and no more than the CPUs that other
    work leaves, to the nearest whole one: ``cpus`` less the system's load
    (``load``: the 1-minute load average, as ``make -l`` reads it), one
    runnable task of which is taken to be this command itself (or the one
    run just before it by the same script).  1 (no fork) when the CPUs
    are busy."""
    if cpus is None:
        try:
            cpus = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cpus = os.cpu_count() or 1
    if load is None:
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):
            load = 0.0
    free = int(cpus + 1.5 - load)    # to the nearest CPU; 0 or less: none
    return max(1, min(count // ITEMS_PER_WORKER, cpus, MAX_WORKERS, free))


def split(items, parts):
    """``items`` in ``parts`` consecutive slices of near-equal length (the
    longer ones first), none empty."""
    parts = max(1, min(parts, len(items)))
    size, extra = divmod(len(items), parts)
    slices = []
    start = 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        slices.append(items[start:end])
        start = end
    return slices


def map_parts(func, items, workers):
    """``[func(part) for part in split(items, workers)]``, the parts after
    the first computed by forked children while this process computes the
    first."""
    parts = split(list(items), workers)
    if len(parts) < 2 or not _may_fork():
        return [func(part) for part in parts]
    children = [None] * (len(parts) - 1)
    try:
        for i, part in enumerate(parts[1:]):
            children[i] = _start(func, part)
        results = [func(parts[0])]
        for i, part in enumerate(parts[1:]):
            child, children[i] = children[i], None
            answer = _collect(child)
            results.append(answer[0] if answer is not None else func(part))
        return results
    finally:
        for child in children:
            _abandon(child)


def _may_fork():
    threading = sys.modules.get('threading')
    return hasattr(os, 'fork') and (threading is None
                                    or threading.active_count() == 1)


def _start(func, part):
    """``(pid, read end)`` of a child computing ``func(part)``, or None
    when no child can be started."""
    pickle = _pickle()    # before the fork: the child inherits it
    try:
        read_fd, write_fd = os.pipe()
    except OSError:
        return None
    try:
        pid = os.fork()
    except OSError:
        os.close(read_fd)
        os.close(write_fd)
        return None
    if pid == 0:                                   # the child
        status = 1
        try:
            os.close(read_fd)
            data = pickle.dumps((func(part),), -1)     # the highest
            view = memoryview(data)
            while view:
                view = view[os.write(write_fd, view):]
            status = 0
        finally:
            os._exit(status)
    os.close(write_fd)
    return pid, read_fd


def _collect(child):
    """The child's answer as a 1-tuple, or None when it has none."""
    if child is None:
        return None
    pid, read_fd = child
    chunks = []
    try:
        while True:
            chunk = os.read(read_fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
    except OSError:
        chunks = None
    finally:
        os.close(read_fd)
    _, status = os.waitpid(pid, 0)
    if chunks is None or status != 0:
        return None
    # complete (the child exited 0 only after writing it all) and ours
    return _pickle().loads(b''.join(chunks))


def _pickle():
    """The C module that ``pickle`` re-exports (``dumps``, ``loads``):
    its Python half, needed only to subclass a Pickler, costs another
    millisecond to import (``struct``, the classes)."""
    try:
        import _pickle as pickle
    except ImportError:       # an interpreter without the accelerator
        import pickle
    return pickle


def _abandon(child):
    """Stop a child whose answer is no longer wanted (this process is
    leaving with an error) and reap it."""
    if child is None:
        return
    pid, read_fd = child
    import signal
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
    os.close(read_fd)
    try:
        os.waitpid(pid, 0)
    except OSError:
        pass
