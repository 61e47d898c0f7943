"""The hook and leases left by dead processes, mdevs someone else made, and
hook.log's size: each on a simulated T4 host built by the test."""

import os


from libvirt_gpu.host import allocator
from libvirt_gpu.guests import hook
from libvirt_gpu import objects
from libvirt_gpu.store import state
from tests.doubles import t4_hook as th

T_NVIDIA_223 = objects.TypeId.parse('nvidia-223')

A, B, EXISTING = th.A, th.B, th.EXISTING
OTHER_DOM = objects.Uuid.parse('9b1c2d3e-4f50-4a6b-8c7d-0e1f2a3b4c5d')
GONE_PID = 2 ** 22 + 7          # above pid_max's default: no such process


def _dead_leases(env, parent, count, st=state.RESERVED):
    """``count`` leases on ``parent`` whose holder (a killed prepare) is
    gone."""
    uuids = [th.new_uuid() for _ in range(count)]
    with state.LeaseStore(env.state_dir).transaction() as txn:
        for u in uuids:
            txn.add(u, OTHER_DOM, objects.PciAddress.parse(parent),
                    T_NVIDIA_223, st)
            txn._db.execute('UPDATE leases SET pid = ?, pid_start = NULL '
                            'WHERE mdev_uuid = ?', (GONE_PID, u))
    return uuids


def test_capacity_error_names_leases_of_dead_processes(env):
    # T4-2B: 8 per GPU; B holds two already.  A prepare killed mid-way
    # left reservations for every other instance.
    stale = _dead_leases(env, A, 8) + _dead_leases(env, B, 6)
    rc, err = env.run('prepare', th.domain_xml([(th.new_uuid(),
                                                 'nvidia-223', None)]))
    assert rc == 1
    assert 'No capacity left' in err
    assert '14 lease(s) left by processes that died' in err
    # the first few are named, the rest counted
    assert sum(u in err for u in stale) == allocator.STALE_LISTED
    assert 'and %d more' % (14 - allocator.STALE_LISTED) in err
    assert 'process %d, gone' % GONE_PID in err
    assert 'libvirt-gpu reconcile' in err
    assert err.count('\n') == 1


def test_capacity_error_without_stale_leases_does_not_mention_them(env):
    for _ in range(14):
        rc, err = env.run('prepare', th.domain_xml(
            [(th.new_uuid(), 'nvidia-223', None)], uuid=th.new_uuid()))
        assert rc == 0, err
    rc, err = env.run('prepare', th.domain_xml([(th.new_uuid(),
                                                 'nvidia-223', None)]))
    assert rc == 1 and 'No capacity left' in err
    assert 'died' not in err and 'reconcile' not in err


def test_created_leases_of_exited_hooks_are_not_called_stale(env):
    # a prepare that finished leaves 'created' leases whose process exited:
    # normal, not stale
    _dead_leases(env, A, 8, st=state.CREATED)
    _dead_leases(env, B, 6, st=state.CREATED)
    rc, err = env.run('prepare', th.domain_xml([(th.new_uuid(),
                                                 'nvidia-223', None)]))
    assert rc == 1 and 'No capacity left' in err
    assert 'died' not in err


def test_two_domains_cannot_share_an_existing_unleased_mdev(env):
    first = th.domain_xml([(EXISTING, 'nvidia-223', B)])
    second = th.domain_xml([(EXISTING, 'nvidia-223', B)],
                           uuid=OTHER_DOM, name='vm2')
    assert env.run('prepare', first) == (0, '')
    assert env.run('prepare', first) == (0, '')        # same domain again
    rc, err = env.run('prepare', second)
    assert rc == 1
    assert EXISTING in err and th.DOM in err
    # release of the first gives it back, and never removes it (it is not
    # ours): then the second may use it
    assert env.run('release', first)[0] == 0
    assert EXISTING in env.mdevs()
    assert env.run('prepare', second) == (0, '')
    assert env.leases() == []
    assert EXISTING in env.mdevs()
    assert env.run('prepare', first)[0] == 1


def _log_size(env):
    return os.path.getsize(os.path.join(env.state_dir, hook.LOG_NAME))


def test_hook_log_stays_under_its_cap(env):
    assert env.run('prepare', th.domain_xml([]))[0] == 0
    os.makedirs(env.state_dir, exist_ok=True)
    path = os.path.join(env.state_dir, hook.LOG_NAME)
    with open(path, 'w') as f:
        f.write('x' * (hook.LOG_MAX_BYTES - 50) + '\n')
    u = th.new_uuid()
    assert env.run('prepare', th.domain_xml([(u, 'nvidia-223', A)]))[0] == 0
    assert _log_size(env) <= hook.LOG_MAX_BYTES
    with open(path) as f:
        assert u in f.read()                # the new entry is in the log
    assert os.path.getsize(path + '.1') == hook.LOG_MAX_BYTES - 49


def test_a_10000_entry_xml_keeps_the_log_small(env):
    # metadata naming 10,000 vGPUs without their <hostdev>: one warning
    # each, if nothing capped them
    entries = [(th.new_uuid(), 'nvidia-223', None) for _ in range(10000)]
    rc, err = env.run('prepare', th.domain_xml(entries, hostdevs=[]))
    assert rc == 0
    assert _log_size(env) <= hook.LOG_MAX_BYTES
    with open(os.path.join(env.state_dir, hook.LOG_NAME)) as f:
        lines = f.read().splitlines()
    assert len(lines) <= hook.LOG_MAX_LINES + 1
    # the first LOG_MAX_LINES lines (a settings note, then warnings) and
    # a count of the rest
    warned = [line for line in lines if 'it is not created' in line]
    dropped = int(lines[-1].split('... and ')[1].split()[0])
    assert len(warned) + dropped == 10000
    assert lines[-1].endswith('more line(s) not logged')
    assert len(err.splitlines()) <= hook.LOG_MAX_LINES + 1


def test_reconnect_of_10000_missing_vgpus_logs_a_summary(env):
    uuids = [th.new_uuid() for _ in range(10000)]
    xml = th.domain_xml([], hostdevs=uuids)
    rc, err = env.run('reconnect', xml)
    assert rc == 0
    with open(os.path.join(env.state_dir, hook.LOG_NAME)) as f:
        text = f.read()
    lines = text.splitlines()
    named = [line for line in lines if 'which does not exist' in line]
    assert len(named) == hook.RECONNECT_LISTED
    assert len(lines) <= hook.RECONNECT_LISTED + 3
    assert 'uses %d more vGPUs that do not exist'  \
        % (10000 - hook.RECONNECT_LISTED) in text
    assert 'reconnect: 10000 vGPU(s) in use, 10000 missing' in lines[-1]


def test_a_refused_start_gives_the_existing_mdev_back(env):
    # vm1 names the existing mdev and a new vGPU on A whose creation the
    # kernel refuses: the start is refused, and vm2 may then use the mdev
    real_create = env.sysfs.kernel.create

    def refuse_on_a(parent, type_id, data):
        if str(parent) == A:
            raise OSError(28, 'No space left on device')
        return real_create(parent, type_id, data)
    env.sysfs.kernel.create = refuse_on_a
    first = th.domain_xml([(EXISTING, 'nvidia-223', B),
                           (th.new_uuid(), 'nvidia-223', A)])
    rc, err = env.run('prepare', first)
    assert rc == 1 and 'cannot start' in err
    env.sysfs.kernel.create = real_create
    second = th.domain_xml([(EXISTING, 'nvidia-223', B)],
                           uuid=OTHER_DOM, name='vm2')
    assert env.run('prepare', second) == (0, '')
    assert env.leases() == []
