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
from tests.doubles import t4_hook as th
from tests.doubles.migration_conns import Conn
from tests.doubles.migration_conns import Domain
from tests.doubles.migration_conns import check
from tests.doubles.migration_conns import gpu_xml
from tests.doubles.migration_conns import v

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


# --- what make mutation found ----------------------------------------------
#
# What ``migration.check`` tells an operator that the migration tests
# left open: each test here fails on a change ``make mutation`` made to
# guests/migration.py that the rest stayed green on
# (docs/dev/mutation.md): every check's whole text, in order, and the
# vGPUs on VFs that the destination's libvirt does not list.

U1 = '4b20d080-1b54-4048-85b3-a6a62d165c01'
U2 = 'b1ae8bf6-38b0-4c81-9d44-78ce3f520496'
U3 = '0f0e7a1c-77a4-4a55-9c4d-2b8c2f9f1e11'


class Named(Conn):
    """A source that finds the guest by its name, vm1, only."""

    def lookupByName(self, name):
        assert name == 'vm1', name
        return self.domain

    def lookupByUUIDString(self, uuid):
        raise AssertionError('looked up by UUID: %s' % uuid)


def _checks(plan):
    return [(c.what, c.ok, c.detail) for c in plan.checks]


def test_a_plan_that_passes_every_check_in_order():
    source = Conn((v(9, 1, 2), v(8, 2, 3)), domain=Domain(th.domain_xml(
        [(U1, 'nvidia-224', None), (U2, 'nvidia-223', None),
         (U3, 'nvidia-224', None)])))
    dest = Conn((v(10, 0, 0), v(9, 0, 1)), gpus=[
        gpu_xml(0x3b, {'nvidia-223': 1, 'nvidia-224': 1}),
        gpu_xml(0x5e, {'nvidia-224': 5})])
    plan = check(source, dest)
    assert _checks(plan) == [
        ('source libvirt', True, '9.1.2'),
        ('source QEMU', True, '8.2.3'),
        ('destination libvirt', True, '10.0.0'),
        ('destination QEMU', True, '9.0.1'),
        ('post-copy', True, 'not asked for'),
        ('guest running', True, 'yes'),
        ('destination room for nvidia-223', True, '1 needed, 1 available'),
        ('destination room for nvidia-224', True, '2 needed, 6 available')]
    assert plan.vgpus == (('nvidia-223', 1), ('nvidia-224', 2))
    assert (plan.domain, plan.dest_uri) == ('vm1', 'qemu+ssh://b/system')
    assert plan.ok and plan.refusals == []


@pytest.mark.parametrize('side', ['source', 'destination'])
def test_a_version_refusal_reads_whole(side):
    old = (v(8, 5, 9), v(8, 0, 12))
    source = Conn(old if side == 'source' else (v(9, 0, 0), v(8, 2, 0)),
                  domain=Domain(th.domain_xml()))
    dest = Conn(old if side == 'destination' else (v(9, 0, 0), v(8, 2, 0)))
    plan = check(source, dest)
    assert [(c.what, c.detail) for c in plan.refusals] == [
        ('%s libvirt' % side, '8.5.9 (VFIO migration needs libvirt >= 8.6.0: '
                              'upgrade it on the %s host)' % side),
        ('%s QEMU' % side, '8.0.12 (VFIO migration needs QEMU >= 8.1.0: '
                           'upgrade it on the %s host)' % side)]
    assert not plan.ok


def test_post_copy_a_stopped_guest_and_a_whole_gpu_are_refused_whole():
    source = Conn(domain=Domain(th.domain_xml(pgpus=['0000:3b:00.0']),
                                active=False))
    plan = migration.check(host_mod.Host.from_connection(source),
                           host_mod.Host.from_connection(Conn()),
                           'qemu+ssh://b/system', 'vm1', postcopy=True)
    assert _checks(plan)[4:] == [
        ('post-copy', False, 'asked for, but QEMU refuses VFIO devices with '
                             'post-copy: migrate with pre-copy (leave '
                             'post-copy out)'),
        ('guest running', False, 'no: a stopped guest is not migrated live; '
                                 'start it, or move its definition instead'),
        ('whole GPU 0000:3b:00.0', False,
         'VFIO cannot migrate a whole GPU: detach it (`libvirt-gpu detach '
         '--address 0000:3b:00.0`) first')]
    assert [c.what for c in plan.refusals] == [
        'post-copy', 'guest running', 'whole GPU 0000:3b:00.0']
    assert plan.vgpus == ()


def test_a_type_the_destination_lacks_reads_whole():
    plan = check(Conn(domain=Domain(th.domain_xml(
        [(U1, 'nvidia-223', None)]))),
        Conn(gpus=[gpu_xml(0x3b, {'nvidia-224': 8})]))
    assert _checks(plan)[-1] == (
        'destination room for nvidia-223', False,
        'the destination offers no nvidia-223 (libvirt lists no GPU with '
        'that mdev type there)')


def test_a_node_device_that_is_not_a_readable_gpu_gives_no_room():
    dest = Conn(gpus=[
        "<device><name>net_eth0</name><capability type='net'/></device>",
        gpu_xml(0x3b, {'nvidia-223': 99999}),
        gpu_xml(0x5e, {'nvidia-223': 2})])
    plan = check(Conn(domain=Domain(th.domain_xml(
        [(U1, 'nvidia-223', None)]))), dest)
    assert _checks(plan)[-1] == ('destination room for nvidia-223', True,
                                 '1 needed, 2 available')


def _vf_domain(parent_listed):
    """A guest with a vendor-interface vGPU (its VF a PCI hostdev) and an
    mdev vGPU."""
    vf = ("<hostdev mode='subsystem' type='pci' managed='no'><source>"
          "<address domain='0x0000' bus='0x3b' slot='0x00' function='0x4'/>"
          "</source></hostdev>" if parent_listed else '')
    return ("<domain type='kvm'><name>vm1</name><uuid>%s</uuid><metadata>"
            "<gpu:gpus xmlns:gpu='urn:libvirt-gpu:1'>"
            "<gpu:vgpu uuid='%s' type='nvidia-1160' parent='0000:3b:00.4'/>"
            "<gpu:vgpu uuid='%s' type='nvidia-1160' parent='0000:3b:00.4'/>"
            "<gpu:vgpu uuid='%s' type='nvidia-223'/>"
            "</gpu:gpus></metadata><devices>%s"
            "<hostdev mode='subsystem' type='mdev' managed='no' "
            "model='vfio-pci'><source><address uuid='%s'/></source>"
            "</hostdev></devices></domain>"
            % (th.DOM, U1, U2, U3, vf, U3)).encode()


def test_vgpus_on_vfs_are_left_to_the_destination_s_hook():
    plan = check(Conn(domain=Domain(_vf_domain(True))),
                 Conn(gpus=[gpu_xml(0x5e, {'nvidia-223': 1})]))
    assert _checks(plan)[-2:] == [
        ('destination room for nvidia-1160', True,
         "2 needed, on VFs (vendor interface): libvirt does not list them; "
         "the destination's hook checks the room"),
        ('destination room for nvidia-223', True, '1 needed, 1 available')]
    assert plan.vgpus == (('nvidia-1160', 2), ('nvidia-223', 1))


def test_a_parent_that_is_no_hostdev_of_the_guest_is_an_mdev_parent():
    plan = check(Conn(domain=Domain(_vf_domain(False))),
                 Conn(gpus=[gpu_xml(0x5e, {'nvidia-223': 1})]))
    assert [c.what for c in plan.refusals] == [
        'destination room for nvidia-1160']


def test_only_vgpus_on_vfs_never_read_the_destination_s_devices():
    class Blind(Conn):
        def listAllDevices(self, flags):
            raise AssertionError('the destination was asked for its GPUs')
    xml = _vf_domain(True).replace(
        b"<gpu:vgpu uuid='%s' type='nvidia-223'/>" % U3.encode(), b'')
    assert check(Conn(domain=Domain(xml)), Blind()).ok


@pytest.mark.parametrize('number,parts', [
    (8006000, (8, 6, 0)), (1002003, (1, 2, 3)), (10000999, (10, 0, 999)),
    (999, (0, 0, 999))])
def test_version_decodes_each_part(number, parts):
    assert migration.version(number) == parts


def test_migrate_moves_the_guest_it_was_named():
    source = Named(domain=Domain(stats={'downtime': 5}))
    outcome = migration.migrate(host_mod.Host.from_connection(source),
                                host_mod.Host.from_connection(Conn()),
                                'qemu+ssh://b/system', 'vm1', poll=0.01)
    assert (outcome.done, outcome.downtime_ms) == (True, 5)


def test_check_looks_at_the_guest_it_was_named():
    plan = check(Named(domain=Domain(th.domain_xml())), Conn())
    assert plan.ok and plan.domain == 'vm1'
