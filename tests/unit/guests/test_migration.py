"""``migration.migrate``: the progress it reports, the abort on Ctrl-C and
the downtime it reads, driven through ``host.Host``/``guest.Guest`` over a
stand-in ``virDomain`` whose migration runs until released or aborted (a
real migration needs two hosts with VFIO migration: not in unit tests; the
checks run against a real libvirtd in tests/functional)."""

import re
import threading

import libvirt
import pytest

from libvirt_gpu.cmd import output
from libvirt_gpu import exception
from libvirt_gpu.virt import host as host_mod
from libvirt_gpu.guests import migration

DOM_UUID = 'c7a5fdbd-cdaf-9455-926a-d65c16db1809'
GIB = 1 << 30


class StandInDomain(object):
    """The few virDomain calls a migration makes; ``migrateToURI3`` blocks
    until ``finish`` or ``abortJob``."""

    def __init__(self):
        self.released = threading.Event()
        self.aborted = threading.Event()
        self.calls = []
        self.polls = 0

    def UUIDString(self):
        return DOM_UUID

    def name(self):
        return 'vm1'

    def migrateToURI3(self, uri, params, flags):
        self.calls.append(('migrate', uri, params, flags))
        while not (self.released.wait(0.01) or self.aborted.is_set()):
            pass
        if self.aborted.is_set():
            raise libvirt.libvirtError('operation aborted: migration out '
                                       'job: canceled by client')

    def jobStats(self, flags=0):
        if flags & libvirt.VIR_DOMAIN_JOB_STATS_COMPLETED:
            return {'downtime': 42, 'data_total': 2 * GIB,
                    'time_elapsed': 3500}
        self.polls += 1
        return {'data_processed': self.polls * GIB // 4,
                'data_remaining': 2 * GIB - self.polls * GIB // 4,
                'data_total': 2 * GIB}

    def abortJob(self):
        self.calls.append(('abort',))
        self.aborted.set()


class StandInConnection(object):
    def __init__(self, domain):
        self.domain = domain

    def lookupByName(self, name):
        return self.domain

    def lookupByUUIDString(self, uuid):
        return self.domain


def hosts(domain):
    conn = StandInConnection(domain)
    return (host_mod.Host.from_connection(conn),
            host_mod.Host.from_connection(conn))


def test_progress_then_the_downtime():
    dom = StandInDomain()
    seen = []

    def progress(stats):
        seen.append(stats)
        if len(seen) == 3:
            dom.released.set()

    outcome = migration.migrate(*hosts(dom), 'qemu+ssh://b/system', 'vm1',
                                progress=progress, poll=0.01)
    assert outcome == migration.Outcome(done=True, downtime_ms=42,
                                        data_total=2 * GIB, elapsed_ms=3500)
    plan = migration.Plan(domain='vm1', dest_uri='b', checks=())
    assert output.migration_outcome_text(plan, outcome) == (
        'migrated vm1 to b; downtime 42 ms; took 3.5 s')
    assert len(seen) >= 3
    (call,) = dom.calls
    assert call[:3] == ('migrate', 'qemu+ssh://b/system', {})
    assert call[3] == libvirt.VIR_MIGRATE_LIVE | libvirt.VIR_MIGRATE_PEER2PEER
    assert output.migration_progress_text(seen[0]) == (
        'migrating:  12%  256.0 MiB processed, 1792.0 MiB remaining')


def test_a_migration_uri_goes_to_libvirt_as_its_parameter():
    dom = StandInDomain()
    dom.released.set()
    outcome = migration.migrate(*hosts(dom), 'qemu+ssh://b/system', 'vm1',
                                poll=0.01,
                                migrate_uri='tcp://10.0.0.2:49152')
    assert outcome.done
    (call,) = dom.calls
    assert call[2] == {libvirt.VIR_MIGRATE_PARAM_URI: 'tcp://10.0.0.2:49152'}


def test_ctrl_c_aborts_the_job_and_waits_for_it():
    dom = StandInDomain()

    def progress(stats):
        raise KeyboardInterrupt       # what Ctrl-C raises in the main thread

    outcome = migration.migrate(*hosts(dom), 'qemu+ssh://b/system', 'vm1',
                                progress=progress, poll=0.01)
    assert outcome == migration.Outcome(done=False)
    assert dom.calls[-1] == ('abort',)
    assert 'aborted' in output.migration_outcome_text(
        migration.Plan(domain='vm1', dest_uri='x', checks=()), outcome)


class LibvirtSays(libvirt.libvirtError):
    """A libvirt error with its own code and message: a plain
    libvirtError takes them from libvirt's last error of the thread that
    makes it (what an earlier test left there)."""

    def __init__(self, message, code=libvirt.VIR_ERR_CONFIG_UNSUPPORTED):
        super().__init__(message)
        self.message, self.code = message, code

    def get_error_code(self):
        return self.code

    def get_error_message(self):
        return self.message


def HookRefused(message):
    """What libvirt raises when the destination's qemu hook exits 1."""
    return LibvirtSays(message, libvirt.VIR_ERR_HOOK_SCRIPT_FAILED)


def refused_by_libvirt(error):
    """The LibvirtError ``migration.migrate`` raises when libvirt's
    migration call raises ``error``."""
    dom = StandInDomain()

    def refuse(uri, params, flags):
        raise error

    dom.migrateToURI3 = refuse
    with pytest.raises(exception.LibvirtError) as e:
        migration.migrate(*hosts(dom), 'qemu+ssh://b/system', 'vm1',
                          poll=0.01)
    return str(e.value)


def test_libvirts_failure_is_raised_with_its_reason():
    said = refused_by_libvirt(LibvirtSays(
        'unsupported configuration: VFIO migration is not supported'))
    assert re.search('migration to qemu\\+ssh://b/system: '
                     'unsupported configuration', said), said


def test_a_hooks_refusal_is_said_in_the_hooks_own_words():
    said = ("libvirt-gpu: cannot migrate in domain 'vm1': No capacity left "
            "for vGPU type nvidia-223 on any GPU of this host")
    message = refused_by_libvirt(HookRefused(
        'Hook script execution failed: internal error: Child process '
        '(LC_ALL=C PATH=/usr/bin HOME=/root /etc/libvirt/hooks/qemu.d/'
        'libvirt-gpu vm1 migrate begin -) unexpected exit status 1: '
        + said + '\n'))
    assert message == ('libvirt: migration to qemu+ssh://b/system: a '
                       'qemu hook refused it: ' + said)


def test_a_hook_failure_worded_otherwise_is_said_whole():
    said = refused_by_libvirt(HookRefused(
        'Hook script execution failed: cannot execute'))
    assert re.search('a qemu hook refused it: Hook script execution '
                     'failed: cannot execute$', said), said


def test_versions_decode():
    assert migration.version(8006000) == (8, 6, 0)
    assert migration.version(10000001) == (10, 0, 1)
    assert migration.version(8001000) >= migration.MIN_QEMU
    assert migration.version(8000999) < migration.MIN_QEMU


def test_progress_before_any_copy_says_the_destination_prepares():
    assert output.migration_progress_text(
        {'data_total': 0, 'data_processed': 0, 'data_remaining': 0}) == (
        'migrating: preparing the destination')


class PastAborting(libvirt.libvirtError):
    """What libvirt raises for an abort that comes too late."""

    def get_error_code(self):
        return libvirt.VIR_ERR_OPERATION_INVALID

    def get_error_message(self):
        # libvirtError fills its own from libvirt's last error otherwise
        return 'too late'


def test_an_abort_libvirt_refused_is_said_with_its_reason():
    dom = StandInDomain()

    def refuse():
        dom.released.set()
        raise PastAborting('too late')

    def progress(stats):
        raise KeyboardInterrupt

    dom.abortJob = refuse
    outcome = migration.migrate(*hosts(dom), 'qemu+ssh://b/system', 'vm1',
                                progress=progress, poll=0.01)
    assert outcome.done and outcome.abort_refused == 'too late'
    text = output.migration_outcome_text(
        migration.Plan(domain='vm1', dest_uri='b', checks=()), outcome)
    assert text.startswith('Ctrl-C came too late (too late): migrated vm1')


def test_an_abort_libvirt_took_without_an_error_is_seen_in_the_guest():
    # libvirt 9.0, aborted while the destination prepares: the migration
    # call then returns without an error and the guest runs on here.
    dom = StandInDomain()
    dom.migrateToURI3 = lambda uri, params, flags: dom.aborted.wait(5)
    dom.isActive = lambda: 1

    def progress(stats):
        raise KeyboardInterrupt

    outcome = migration.migrate(*hosts(dom), 'qemu+ssh://b/system', 'vm1',
                                progress=progress, poll=0.01)
    assert outcome == migration.Outcome(done=False)
