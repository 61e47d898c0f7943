"""fanout: parts of a list computed by forked processes, with the answer
(and any error) of one process; and discovery read that way."""

import logging
import os
import threading

import pytest

from libvirt_gpu.devices import discovery
from libvirt_gpu.util import fanout
from libvirt_gpu import simulator
from libvirt_gpu.devices import sysfs as sysfs_mod
from tests.doubles import hostile_sysfs as hostile
from tests.doubles import kinds
from tests.doubles import trees

PARENT = os.getpid()


def _open_fds():
    return set(os.listdir('/proc/self/fd'))


@pytest.fixture(autouse=True)
def forks(monkeypatch):
    """The children fanout forks (their pids), each checked to be reaped
    after the test.  Other tests of the suite leave threads running, which
    would keep fanout from forking at all: here it may (its children take
    no lock such a thread could hold; CPython renews the import and
    logging locks in a child).  The thread rule has its own test."""
    pids = []
    real_fork = os.fork

    def fork():
        pid = real_fork()
        if pid:
            pids.append(pid)
        return pid
    monkeypatch.setattr(os, 'fork', fork)
    monkeypatch.setattr(fanout, '_may_fork', lambda: True)
    yield pids
    for pid in pids:
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)      # reaped already


@pytest.mark.parametrize('count,parts', [
    (0, 1), (1, 3), (5, 2), (7, 3), (64, 4), (65, 4), (3, 8)])
def test_split_keeps_order_and_leaves_no_part_empty(count, parts):
    items = list(range(count))
    got = fanout.split(items, parts)
    assert [i for part in got for i in part] == items
    assert len(got) == max(1, min(parts, count))
    assert all(got) or count == 0
    sizes = [len(p) for p in got]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes,
                                                            reverse=True)


@pytest.mark.parametrize('count,cpus,expected', [
    (10, 8, 1), (63, 8, 1), (128, 8, 2), (256, 2, 2), (272, 8, 4),
    (10000, 64, fanout.MAX_WORKERS), (10000, 1, 1)])
def test_workers_for(count, cpus, expected):
    assert fanout.workers_for(count, cpus=cpus, load=0.0) == expected


@pytest.mark.parametrize('cpus,load,expected', [
    # one runnable task is this command (or the one a script ran just
    # before): it leaves every CPU to the reading
    (2, 1.0, 2), (2, 1.5, 2), (4, 1.0, 4),
    # the rest are other work: the CPUs it leaves, to the nearest one
    (2, 1.6, 1), (2, 2.0, 1), (2, 4.7, 1), (8, 6.5, 3), (8, 6.6, 2),
    (16, 13.0, 4), (16, 40.0, 1)])
def test_workers_for_leaves_the_cpus_other_work_takes(cpus, load, expected):
    assert fanout.workers_for(10000, cpus=cpus, load=load) == expected


def test_workers_for_reads_the_load_average(monkeypatch):
    monkeypatch.setattr(os, 'getloadavg', lambda: (3.0, 0.0, 0.0))
    assert fanout.workers_for(10000, cpus=4) == 2
    monkeypatch.setattr(os, 'getloadavg', lambda: (0.0, 9.0, 9.0))
    assert fanout.workers_for(10000, cpus=4) == 4


def test_workers_for_without_a_load_average(monkeypatch):
    def unknown():
        raise OSError('getloadavg: not available')
    monkeypatch.setattr(os, 'getloadavg', unknown)
    assert fanout.workers_for(10000, cpus=4) == 4


def _pids(part):
    return [(item, os.getpid()) for item in part]


def test_parts_after_the_first_are_computed_by_children(forks):
    before = _open_fds()
    got = fanout.map_parts(_pids, range(10), 3)
    assert [item for part in got for item, _ in part] == list(range(10))
    pids = [{pid for _, pid in part} for part in got]
    assert pids[0] == {PARENT}
    assert all(len(p) == 1 and PARENT not in p for p in pids[1:])
    assert len(set.union(*pids)) == 3
    assert set.union(*pids[1:]) == set(forks)
    assert _open_fds() == before


def _fails_in_children(part):
    if os.getpid() != PARENT:
        raise RuntimeError('only in a child')
    return _pids(part)


def _exits_in_children(part):
    if os.getpid() != PARENT:
        os._exit(3)
    return _pids(part)


@pytest.mark.parametrize('func', [_fails_in_children, _exits_in_children])
def test_a_child_without_an_answer_has_its_part_computed_here(func):
    before = _open_fds()
    got = fanout.map_parts(func, range(9), 3)
    assert got == [_pids(p) for p in fanout.split(list(range(9)), 3)]
    assert _open_fds() == before


def _fails_everywhere(part):
    raise ValueError('part %s' % part)


def test_an_error_is_the_one_process_error():
    before = _open_fds()
    with pytest.raises(ValueError, match=r'part \[0, 1, 2\]'):
        fanout.map_parts(_fails_everywhere, range(8), 3)
    assert _open_fds() == before


def test_no_fork_while_another_thread_runs(monkeypatch):
    monkeypatch.undo()               # the real os.fork and thread rule
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        got = fanout.map_parts(_pids, range(6), 3)
    finally:
        stop.set()
        thread.join()
    assert {pid for part in got for _, pid in part} == {PARENT}


def test_a_refused_fork_leaves_the_work_here(monkeypatch):
    def refuse():
        raise BlockingIOError(11, 'Resource temporarily unavailable')
    monkeypatch.setattr(os, 'fork', refuse)
    before = _open_fds()
    got = fanout.map_parts(_pids, range(6), 3)
    assert {pid for part in got for _, pid in part} == {PARENT}
    assert _open_fds() == before


# --- discovery in several processes ------------------------------------------

@pytest.fixture
def three_workers(monkeypatch):
    """Split even a small host in three (the CPU count and the 64 devices
    per worker would read it in one process)."""
    calls = []

    def workers_for(count, cpus=None, load=None):
        calls.append(count)
        return 3
    monkeypatch.setattr(fanout, 'workers_for', workers_for)
    return calls


@pytest.mark.parametrize('profile', simulator.list_profiles())
def test_parallel_discovery_equals_serial(tmp_path, profile, three_workers):
    simulator.write_host(simulator.load_profile(profile), tmp_path)
    reader = sysfs_mod.Sysfs(tmp_path)
    serial = discovery.from_sysfs(reader, kinds=kinds.registered())
    assert discovery.from_sysfs(reader, parallel=True,
                                kinds=kinds.registered()) == serial
    assert three_workers and serial.gpus


def test_parallel_discovery_of_a_large_host(tmp_path, forks, monkeypatch):
    # two CPUs, nothing else running: workers_for's own answer is two
    monkeypatch.setattr(os, 'sched_getaffinity', lambda pid: {0, 1})
    monkeypatch.setattr(os, 'getloadavg', lambda: (0.0, 0.0, 0.0))
    simulator.write_host(simulator.synthetic_profile(130, types=3),
                         tmp_path)
    reader = sysfs_mod.Sysfs(tmp_path)
    serial = discovery.from_sysfs(reader, kinds=kinds.registered())
    assert sum(len(g.mdev_types) for g in serial.gpus) == 130 * 3
    assert not forks
    assert discovery.from_sysfs(reader, parallel=True,
                                kinds=kinds.registered()) == serial
    assert len(forks) == 1


def test_discovery_of_a_large_host_on_busy_cpus_forks_nothing(
        tmp_path, forks, monkeypatch):
    monkeypatch.setattr(os, 'sched_getaffinity', lambda pid: {0, 1})
    monkeypatch.setattr(os, 'getloadavg', lambda: (4.7, 4.0, 3.0))
    simulator.write_host(simulator.synthetic_profile(130, types=3),
                         tmp_path)
    reader = sysfs_mod.Sysfs(tmp_path)
    serial = discovery.from_sysfs(reader, kinds=kinds.registered())
    assert discovery.from_sysfs(reader, parallel=True,
                                kinds=kinds.registered()) == serial
    assert forks == []


@pytest.mark.parametrize('case', hostile.CASES,
                         ids=[c.name for c in hostile.CASES])
def test_parallel_discovery_warns_as_serial(case, three_workers, caplog,
                                            tmp_path):
    with trees.simulated_tree('t4') as (root, profile):
        case.apply(hostile.Tree(root, profile, str(tmp_path / 'state')))
        reader = sysfs_mod.Sysfs(root)
        with caplog.at_level(logging.WARNING, logger='libvirt_gpu'):
            serial = discovery.from_sysfs(reader, kinds=kinds.registered())
            serial_log = [r.getMessage() for r in caplog.records]
            caplog.clear()
            parallel = discovery.from_sysfs(reader, parallel=True,
                                            kinds=kinds.registered())
            parallel_log = [r.getMessage() for r in caplog.records]
    assert parallel == serial
    assert parallel_log == serial_log and serial_log
