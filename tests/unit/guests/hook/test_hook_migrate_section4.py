"""The destination's ``migrate`` and the messages around it (issue 30,
section 4), on the simulated T4 host of test_hook_migrate.py (14 vGPUs of
``nvidia-223`` fit: 8 on 0000:3b:00.0, 6 on 0000:af:00.0).

- one domain carries at most ``MAX_VGPUS_PER_DOMAIN`` vGPUs: more is
  refused before the lease lock, and a domain's claims read each GPU's
  room once (not once per claim);
- a retried migration reserves nothing more: it renews its own pending
  reservations, and drops those the retry no longer asks for;
- a refused migrate leaves no reservation (all or nothing);
- input that is not UTF-8 is refused, and what is printed is always
  well-formed;
- two ``<metadata>`` elements: a refusal, not an internal error;
- a local start refused for room names the incoming reservations that
  hold it, and ``reconcile --dry-run`` lists them;
- "asks for 15 ... 14 fit", one wording for ``prepare`` and ``migrate``;
- a domain name's control characters never reach ``hook.log`` raw.
"""

import io
import os
import re
import time

import pytest

from libvirt_gpu import environment
from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.guests import hook
from libvirt_gpu.guests import reconcile
from libvirt_gpu.guests.hook import incoming
from libvirt_gpu.guests.hook import operations
from libvirt_gpu.guests.hook import settings as settings_mod
from libvirt_gpu.host import allocator
from libvirt_gpu.store import state
from libvirt_gpu.util import xmlutil
from libvirt_gpu.virt import host as host_mod
from tests.doubles import fake_libvirt
from tests.doubles import t4_hook as th
from tests.doubles import t4_migrate as tm

A, B, DOM, EXISTING = th.A, th.B, th.DOM, th.EXISTING
DOM2 = objects.Uuid.parse('6a8a3b1e-9d0b-4a55-9d84-3c7f0f3f4e21')
TYPE = objects.TypeId.parse('nvidia-223')


def many(n, parent=tm.SOURCE_GPU, uuid=DOM):
    return th.domain_xml([(th.new_uuid(), 'nvidia-223', parent)
                          for _ in range(n)], uuid=uuid)


def refused(env, xml, name='vm1', locked=True):
    """A refused migrate: exit 1, nothing printed, one line, no lease
    added (``locked``: the leases are read before and after)."""
    before = env.leases() if locked else []
    out, err = io.BytesIO(), io.StringIO()
    rc = hook.run(['qemu', name, 'migrate', 'begin', '-'], xml,
                  config_file=env.config, settings_file=env.settings_file,
                  sysfs=env.sysfs, stderr=err, mdevctl_dir=env.mdevctl_dir,
                  stdout=out)
    assert (rc, out.getvalue()) == (1, b'')
    text = err.getvalue()
    assert text.count('\n') == 1, text
    assert 'internal error' not in text and 'Traceback' not in text
    if locked:
        assert env.leases() == before
    return text


def allocator_of(env):
    settings, _ = settings_mod.load_settings(env.config, env.settings_file)
    return environment.Environment.for_hook(
        settings, env.sysfs, mdevctl_dir=env.mdevctl_dir).allocator


# --- a domain's size: bounded, and each GPU read once ------------------------

def _no_lock(*args, **kwargs):
    raise AssertionError('the lease lock was taken')


def test_a_1000_vgpu_domain_is_refused_before_the_lease_lock(env, monkeypatch):
    """The 1,000-vGPU incoming domain that held the lock 92 s (broken by
    dropping the count check: the lock is then taken)."""
    with monkeypatch.context() as m:
        m.setattr(state.LeaseStore, 'transaction', _no_lock)
        err = refused(env, many(1000), locked=False)
    assert env.leases() == []
    assert 'it carries 1000 vGPUs and this host gives one domain at most ' \
        '%d' % allocator.MAX_VGPUS_PER_DOMAIN in err


@pytest.mark.parametrize('reserve', ['reserve', 'reserve_incoming'])
def test_the_allocator_refuses_more_claims_than_the_cap(
        env, monkeypatch, reserve):
    """prepare and the allocator's API hold the same bound, before the
    lock; exactly the cap is judged on room (NoCapacity here: 14 fit)."""
    alloc = allocator_of(env)
    claims = [allocator.VgpuClaim(uuid=th.new_uuid(), type_id=TYPE)
              for _ in range(allocator.MAX_VGPUS_PER_DOMAIN + 1)]
    args = (DOM, claims) + ((time.time() + 60,) if reserve ==
                            'reserve_incoming' else ())
    with monkeypatch.context() as m:
        m.setattr(state.LeaseStore, 'transaction', _no_lock)
        with pytest.raises(exception.InvalidInput) as e:
            getattr(alloc, reserve)(*args)
    assert 'asks for %d vGPUs and one domain may hold at most %d' % (
        len(claims), allocator.MAX_VGPUS_PER_DOMAIN) in str(e.value)
    with pytest.raises(exception.NoCapacity):
        getattr(alloc, reserve)(args[0], claims[:-1], *args[2:])
    assert env.leases() == []


def test_prepare_of_too_many_vgpus_is_refused_in_one_line(env):
    rc, err = env.run('prepare', many(allocator.MAX_VGPUS_PER_DOMAIN + 1,
                                      parent=None))
    assert rc == 1 and err.count('\n') == 1
    assert 'one domain may hold at most %d' \
        % allocator.MAX_VGPUS_PER_DOMAIN in err
    assert env.leases() == [] and env.sysfs.writes == []


@pytest.mark.parametrize('op', ['migrate', 'prepare'])
def test_each_gpu_is_read_once_per_domain_not_once_per_claim(env,
                                                             monkeypatch,
                                                             op):
    """14 claims on 2 GPUs: 2 reads of a GPU's room (broken by reading
    the room again for every claim: 28; the lock is then held O(n^2))."""
    calls = []
    real = allocator.Allocator.free

    def counted(self, *args):
        calls.append(args[1])
        return real(self, *args)
    monkeypatch.setattr(allocator.Allocator, 'free', counted)
    xml = many(14, parent=None)
    if op == 'migrate':
        assert tm.migrate(env, xml)[0] == 0
    else:
        assert env.run(op, xml) == (0, '')
    assert len(env.leases()) == 14
    assert sorted(str(a) for a in calls) == [A, B]


def test_the_room_counted_down_matches_the_room_read_again(env):
    """What the one-read count gives equals what the lease file says:
    the same GPUs for 14 claims as 14 domains of one claim each."""
    assert tm.migrate(env, many(14, parent=None))[0] == 0
    together = sorted(str(lease.parent) for lease in env.leases())
    with state.LeaseStore(env.state_dir).transaction() as txn:
        for lease in txn.all():
            txn.delete(lease.vgpu_uuid)
    for _ in range(14):
        assert tm.migrate(env, many(1, parent=None,
                                    uuid=objects.Uuid.new()))[0] == 0
    assert sorted(str(lease.parent) for lease in env.leases()) == together
    assert together == [A] * 8 + [B] * 6


# --- retries -----------------------------------------------------------------

def test_retries_of_a_taken_uuid_reserve_one_slot(env):
    """EXISTING is a vGPU here: each try names it anew, yet three tries
    hold one lease (broken by reserving a new UUID at every try: 3)."""
    xml = tm.incoming_xml(EXISTING)
    outs = []
    for _ in range(3):
        rc, out, err = tm.migrate(env, xml)
        assert (rc, err) == (0, '')
        outs.append(out)
        time.sleep(0.01)
    (lease,) = env.leases()
    assert lease.vgpu_uuid != EXISTING
    assert outs[0] == outs[1] == outs[2]       # the same UUID and GPU
    assert lease.vgpu_uuid.encode() in outs[0]
    assert lease.expires_at > lease.created_at + incoming.HOLD_SECONDS


def test_a_retry_asking_for_fewer_drops_the_rest(env):
    uuids = [th.new_uuid() for _ in range(3)]
    assert tm.migrate(env, th.domain_xml(
        [(u, 'nvidia-223', None) for u in uuids]))[0] == 0
    assert tm.migrate(env, th.domain_xml(
        [(uuids[0], 'nvidia-223', None)]))[0] == 0
    assert [lease.vgpu_uuid for lease in env.leases()] == [uuids[0]]


def test_another_domains_pending_reservations_are_not_reused(env):
    """Only this domain's own earlier tries are reused."""
    assert tm.migrate(env, th.domain_xml(
        [(th.new_uuid(), 'nvidia-223', None)], uuid=DOM2))[0] == 0
    other = env.leases()
    rc, out, _ = tm.migrate(env, tm.incoming_xml(EXISTING))
    assert rc == 0
    assert len(env.leases()) == 2
    assert [lease for lease in env.leases()
            if lease.domain_uuid == DOM2] == other


def test_a_prepare_taking_the_reservation_ends_the_retries(env):
    """A reservation prepare took over (no expiry any more) is no pending
    one: a later migrate of the same domain does not renew nor drop it."""
    rc, out, _ = tm.migrate(env, tm.incoming_xml(EXISTING))
    assert rc == 0 and env.run('prepare', out) == (0, '')
    (made,) = env.leases()
    assert (made.state, made.expires_at) == (state.CREATED, None)
    assert tm.migrate(env, tm.incoming_xml(th.new_uuid()))[0] == 0
    assert made in env.leases() and len(env.leases()) == 2


# --- all or nothing ----------------------------------------------------------

def _two_on_one_vf(uuid1, uuid2):
    return (
        "<domain type='kvm'><name>vm1</name><uuid>%s</uuid><metadata>"
        "<g:gpus xmlns:g='urn:libvirt-gpu:1'>"
        "<g:vgpu uuid='%s' type='nvidia-223' parent='0000:65:00.5'/>"
        "<g:vgpu uuid='%s' type='nvidia-223' parent='0000:65:00.5'/>"
        "</g:gpus></metadata><devices>"
        "<hostdev mode='subsystem' type='pci' managed='no'><source>"
        "<address domain='0x0000' bus='0x65' slot='0x00' function='0x5'/>"
        "</source></hostdev></devices></domain>" % (DOM, uuid1, uuid2)
    ).encode()


def test_two_vgpus_on_one_vf_are_refused_and_reserve_nothing(env):
    u1, u2 = th.new_uuid(), th.new_uuid()
    err = refused(env, _two_on_one_vf(u1, u2))
    assert err.endswith(
        'Migration refused: vGPUs %s and %s both name the hostdev of '
        '0000:65:00.5; each vGPU needs its own (one vGPU per VF)\n'
        % (u1, u2))


def test_what_fails_after_the_choice_undoes_the_reservation(
        env, monkeypatch):
    """An edit that fails once GPUs were chosen (broken by committing the
    reservation before the edits and checks)."""
    def broken(doc, target, device):
        raise exception.InvalidXml(reason='two edits of bytes 1-2')
    monkeypatch.setattr(incoming, '_edit', broken)
    assert 'two edits of bytes' in refused(env, many(3, parent=None))


def test_a_failing_check_rolls_back_renewals_and_drops_too(env):
    """A retry that fails keeps the earlier try's reservations as they
    were: nothing renewed, nothing dropped, nothing added."""
    uuids = [th.new_uuid() for _ in range(2)]
    assert tm.migrate(env, th.domain_xml(
        [(u, 'nvidia-223', None) for u in uuids]))[0] == 0
    before = env.leases()
    claims = [allocator.VgpuClaim(uuid=uuids[0], type_id=TYPE),
              allocator.VgpuClaim(uuid=EXISTING, type_id=TYPE),
              allocator.VgpuClaim(uuid=th.new_uuid(), type_id=TYPE)]

    def check(grants):
        assert len(grants) == 3
        raise exception.MigrationRefused(reason='no')
    with pytest.raises(exception.MigrationRefused):
        allocator_of(env).reserve_incoming(DOM, claims, time.time() + 999,
                                           check=check)
    assert env.leases() == before


# --- the input's encoding, the output's form ---------------------------------

@pytest.mark.parametrize('encode, said', [
    (lambda x: x.decode().encode('utf-16'), 'is UTF-16'),
    (lambda x: x.decode().encode('utf-32'), 'is UTF-32'),
    (lambda x: x.decode().encode('utf-16-le'), 'holds a NUL byte'),
    (lambda x: b'<?xml version="1.0" encoding="ISO-8859-1"?>\n' + x,
     'declares the encoding ISO-8859-1'),
    (lambda x: x.replace(b'vm1', b'vm\xe9'), 'is not UTF-8 (byte 0xe9'),
])
def test_input_that_is_not_utf8_is_refused(env, encode, said):
    """UTF-16 with its byte order mark was read by expat and edited at
    UTF-8 offsets: not well-formed XML printed with exit 0."""
    err = refused(env, encode(tm.incoming_xml(th.new_uuid())))
    assert said in err and 'only UTF-8 is read' in err


@pytest.mark.parametrize('encoding', ['utf-16', 'utf-32'])
def test_the_installed_hook_refuses_utf16_too(env, tmp_path, encoding):
    """The script's byte search before any import cannot see our namespace
    in UTF-16: a NUL byte sends the input on to be refused (broken by
    dropping b'\\x00' from its MARKERS: exit 0, the guest migrates with
    nothing reserved)."""
    import subprocess
    done = hook.install(str(tmp_path / 'hooks'), env.config)
    r = subprocess.run(
        [done.path, 'vm1', 'migrate', 'begin', '-'],
        input=tm.incoming_xml(th.new_uuid()).decode().encode(encoding),
        capture_output=True, timeout=60,
        env={'LC_ALL': 'C', 'PATH': '/usr/bin:/bin', 'HOME': '/root'})
    assert (r.returncode, r.stdout) == (1, b'')
    assert b'only UTF-8 is read' in r.stderr
    assert env.leases() == []


def test_utf8_with_its_bom_and_declaration_is_read(env):
    xml = (b'\xef\xbb\xbf<?xml version="1.0" encoding="UTF-8"?>\n'
           + tm.incoming_xml(th.new_uuid()))
    rc, out, err = tm.migrate(env, xml)
    assert (rc, err) == (0, '') and out.startswith(b'\xef\xbb\xbf<?xml')
    xmlutil.parse(out)


def test_the_hook_never_prints_xml_that_is_not_well_formed(env):
    """The edge's own check, whatever an operation returns (broken by
    printing the document unchecked)."""
    def breaks(hook_, req):
        req.document.replace(req.document.root.find('devices'), '<oops>')
        return req.document
    table = (operations.Operation(
        name='migrate', function=breaks, reads=(operations.DEVICES,
                                                operations.METADATA,
                                                operations.DOCUMENT),
        rewrites=True, may_refuse=True, failure='cannot migrate in'),)
    out, err = io.BytesIO(), io.StringIO()
    rc = hook.run(['qemu', 'vm1', 'migrate', 'begin', '-'],
                  tm.incoming_xml(th.new_uuid()), config_file=env.config,
                  settings_file=env.settings_file, sysfs=env.sysfs,
                  stderr=err, mdevctl_dir=env.mdevctl_dir, stdout=out,
                  table=table)
    assert (rc, out.getvalue()) == (1, b'')
    assert 'nothing printed' in err.getvalue()
    assert 'the rewritten domain XML is malformed' in err.getvalue()


# --- two <metadata> ----------------------------------------------------------

@pytest.mark.parametrize('ours_first', [True, False])
@pytest.mark.parametrize('op', ['migrate', 'prepare'])
def test_two_metadata_elements_are_refused_clearly(env, ours_first, op):
    xml = tm.incoming_xml(th.new_uuid())
    other = b"<metadata><x:y xmlns:x='urn:other'/></metadata>"
    at = (xml.index(b'</metadata>') + len(b'</metadata>') if ours_first
          else xml.index(b'<metadata>'))
    xml = xml[:at] + other + xml[at:]
    assert xml.count(b'<metadata>') == 2
    if op == 'migrate':
        err = refused(env, xml)
    else:
        rc, err = env.run(op, xml)
        assert rc == 1 and env.leases() == []
    assert 'the domain has 2 <metadata> elements and libvirt reads only ' \
        'the first' in err
    assert 'StopIteration' not in err and 'internal error' not in err


def test_two_metadata_elements_without_ours_are_not_our_business(env):
    xml = th.domain_xml(hostdevs=[]).replace(
        b'<devices>', b'<metadata/><metadata/><devices>')
    assert tm.migrate(env, xml) == (0, b'', '')


# --- incoming reservations, as a local start and reconcile see them ----------

def test_a_start_refused_for_room_names_the_incoming_reservations(env):
    assert tm.migrate(env, many(14, parent=None))[0] == 0
    rc, err = env.run('prepare', th.domain_xml(
        [(th.new_uuid(), 'nvidia-223', None)], uuid=DOM2))
    assert rc == 1 and err.count('\n') == 1
    assert '(0 free)' in err
    assert '14 slot(s) are reserved for incoming live migration(s): 14 ' \
        'for domain %s until ' % DOM in err
    assert 'reconcile --dry-run' in err


def test_a_domains_own_reservations_are_not_named_to_it(env):
    """Its own pending reservations are what its retry renews."""
    assert tm.migrate(env, many(14, parent=None))[0] == 0
    rc, err = env.run('prepare', th.domain_xml(
        [(th.new_uuid(), 'nvidia-223', None)]))
    assert rc == 1 and 'reserved for incoming' not in err


def _reconcile(env, tmp_path, dry_run=True):
    conn = fake_libvirt.FakeConnection(tmp_path / 'doms')
    return reconcile.reconcile(environment.Environment(
        env.state_dir, sysfs=env.sysfs,
        host=host_mod.Host.from_connection(conn),
        mdevctl_dir=env.mdevctl_dir), dry_run=dry_run)


def test_reconcile_dry_run_lists_the_incoming_reservations(env, tmp_path):
    assert tm.migrate(env, many(3, parent=None))[0] == 0
    report = _reconcile(env, tmp_path)
    found = [f for f in report.findings if f.what == 'lease']
    assert [f.action for f in found] == [reconcile.INCOMING] * 3
    assert {f.uuid for f in found} == {
        lease.vgpu_uuid for lease in env.leases()}
    assert {f.domain_uuid for f in found} == {DOM}
    assert all('reserved for the incoming live migration of domain %s '
               'until' % DOM in f.reason for f in found)
    assert '3 incoming' in report.summary()
    assert report.stuck == []
    assert len(env.leases()) == 3                       # kept


def test_reconcile_dry_run_says_what_it_does_with_expired_ones(
        env, tmp_path):
    assert tm.migrate(env, many(2, parent=None))[0] == 0
    with state.LeaseStore(env.state_dir).transaction() as txn:
        txn._db.execute('UPDATE leases SET pid = ?, pid_start = NULL, '
                        'updated_at = updated_at - 10, expires_at = ?',
                        (tm.GONE_PID, time.time() - 5))
    report = _reconcile(env, tmp_path)
    found = [f for f in report.findings if f.what == 'lease']
    assert [f.action for f in found] == [reconcile.WOULD_REMOVE] * 2
    assert all('the incoming live migration of domain %s reserved it until'
               % DOM in f.reason and 'its prepare never came' in f.reason
               for f in found)
    assert len(env.leases()) == 2


# --- one wording for "no room" -----------------------------------------------

def test_15_where_14_fit_reads_the_same_for_prepare_and_migrate(env):
    xml = many(15, parent=None)
    rc, err = env.run('prepare', xml)
    assert rc == 1 and env.leases() == []
    migrated = refused(env, xml)
    said = 'the domain asks for 15 vGPUs of this type and 14 fit (8 on %s, ' \
        '6 on %s)' % (A, B)
    assert said in err and said in migrated
    assert err.split('No capacity left', 1)[1] == \
        migrated.split('No capacity left', 1)[1]


def test_none_fits_is_said_as_such(env):
    assert tm.migrate(env, many(14, parent=None, uuid=DOM2))[0] == 0
    err = refused(env, many(2, parent=None))
    assert 'asks for 2 vGPUs of this type and none fits' in err


# --- the log -----------------------------------------------------------------

HOSTILE_NAME = 'vm\x1b]0;owned\x07\r\x1b[2J\x00\x85\x9b\u202eevil\n'
_RAW = re.compile('[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]')


@pytest.mark.parametrize('op', ['migrate', 'prepare', 'release'])
def test_a_domain_names_control_characters_never_reach_the_log(env, op):
    """ESC, BEL, CR, NUL, C1 and U+202E in the name (argv[1]): escaped in
    every line, its head included (broken by writing the head raw)."""
    xml = tm.incoming_xml(th.new_uuid())
    for _ in range(2):         # a success, then (same UUIDs) a refusal
        err = io.StringIO()
        hook.run(['qemu', HOSTILE_NAME, op, 'begin', '-'], xml,
                 config_file=env.config, settings_file=env.settings_file,
                 sysfs=env.sysfs, stderr=err, mdevctl_dir=env.mdevctl_dir,
                 stdout=io.BytesIO())
        assert not _RAW.search(err.getvalue().replace('\n', ''))
    with open(os.path.join(env.state_dir, hook.LOG_NAME), 'rb') as f:
        text = f.read().decode('utf-8')
    assert text and '\\x1b]0;owned\\x07\\x0d' in text and '\\u202e' in text
    for line in text.splitlines():
        assert not _RAW.search(line), line


def test_only_dropped_errors_and_warnings_are_counted_on_stderr():
    """Past LOG_MAX_LINES info lines a successful call still prints
    nothing on stderr (libvirt shows a hook's stderr); dropped warnings
    are counted there (broken by counting every dropped line)."""
    quiet = hook.HookLog(['qemu', 'vm1', 'migrate', 'begin'], io.StringIO())
    for i in range(hook.LOG_MAX_LINES + 5):
        quiet.info('line %d' % i)
    quiet.flush()
    assert quiet.stderr.getvalue() == ''
    loud = hook.HookLog(['qemu', 'vm1', 'migrate', 'begin'], io.StringIO())
    for i in range(hook.LOG_MAX_LINES):
        loud.info('line %d' % i)
    for i in range(3):
        loud.warning('w %d' % i)
    loud.flush()
    assert loud.stderr.getvalue() == \
        'libvirt-gpu: ... and 3 more line(s) not shown\n'


# --- what mutation testing found unguarded -----------------------------------

def _reserve_for(env, domains):
    """Incoming reservations: ``[(domain, count, expires_at)]``, on A
    then B."""
    gpus = ([objects.PciAddress.parse(A)] * 8
            + [objects.PciAddress.parse(B)] * 6)
    with state.LeaseStore(env.state_dir).transaction() as txn:
        for domain, count, expires_at in domains:
            for _ in range(count):
                txn.add(th.new_uuid(), domain, gpus.pop(0), TYPE,
                        state.RESERVED, expires_at=expires_at)


def test_the_incoming_note_names_five_domains_then_counts(env):
    """Sorted by domain UUID, each with its count and its latest expiry,
    five named, the rest counted (broken by a wrong sort, count, time or
    bound)."""
    now = time.time()
    doms = [objects.Uuid.parse('00000000-0000-4000-8000-%012d' % i)
            for i in (6, 2, 5, 1, 4, 3)]
    _reserve_for(env, [(d, 2, now + 100 + i) for i, d in enumerate(doms)]
                 + [(doms[3], 2, now + 50)])
    rc, err = env.run('prepare', th.domain_xml(
        [(th.new_uuid(), 'nvidia-223', None)], uuid=DOM2))
    assert rc == 1

    def until(i):
        return time.strftime('%H:%M:%S', time.localtime(now + 100 + i))
    named = ', '.join('%d for domain %s until %s' % (
        4 if d == doms[3] else 2, d, until(doms.index(d)))
        for d in sorted(doms)[:5])
    assert ('looked at %s (0 free), %s (0 free); 14 slot(s) are reserved '
            'for incoming live migration(s): %s and 1 more domain(s) (their '
            'prepare takes them, else they are freed when they expire; '
            '`libvirt-gpu reconcile --dry-run` lists them)\n' % (A, B, named)
            ) in err


def test_five_domains_are_all_named(env):
    now = time.time()
    doms = [objects.Uuid.parse('00000000-0000-4000-8000-%012d' % i)
            for i in range(5)]
    _reserve_for(env, [(d, 2, now + 100) for d in doms]
                 + [(doms[0], 4, now + 100)])
    rc, err = env.run('prepare', th.domain_xml(
        [(th.new_uuid(), 'nvidia-223', None)], uuid=DOM2))
    assert rc == 1 and 'more domain' not in err
    assert all(str(d) in err for d in doms)


def test_one_vgpu_refused_for_room_says_no_count(env):
    """"asks for N" only when the domain asks for more than one of the
    type (broken by saying "asks for 1 vGPUs")."""
    assert tm.migrate(env, many(14, parent=None, uuid=DOM2))[0] == 0
    err = refused(env, many(1, parent=None))
    assert 'asks for' not in err and 'looked at %s (0 free)' % A in err


def test_a_vf_hostdev_whose_address_lacks_a_number_is_refused(env):
    """An ``<address>`` without ``function=``: refused where the domain is
    read, before any target is looked for (so ``incoming._pci_key``'s
    fallback for a missing number serves a caller that skipped that)."""
    xml = _two_on_one_vf(th.new_uuid(), th.new_uuid()).replace(
        b" function='0x5'", b'')
    assert "source address lacks function" in refused(env, xml)


def test_the_whole_gpu_refusal_in_full(env):
    xml = tm.incoming_xml(th.new_uuid(), pgpu="<g:pgpu address='%s'/>" % A)
    assert refused(env, xml).endswith(
        'Migration refused: it holds the whole GPU %s, which VFIO cannot '
        'migrate; detach it (`libvirt-gpu detach`) or stop the guest\n' % A)


def test_the_kind_mismatch_refusal_in_full(env):
    uuid = th.new_uuid()
    assert refused(env, tm._vf_xml(uuid)).endswith(
        'Migration refused: vGPU %s (nvidia-223) is a VF (vendor interface) '
        'on the source but an mdev here; both hosts must offer the type the '
        'same way\n' % uuid)


def test_hostdevs_and_entries_that_are_no_target_are_skipped(env):
    """A hostdev of mode='capabilities', an entry without hostdev:
    skipped, and those after them still reserved (broken by stopping at
    the first one skipped, or by reading any mode)."""
    skipped, kept = th.new_uuid(), th.new_uuid()
    xml = th.domain_xml([(skipped, 'nvidia-223', None),
                         (kept, 'nvidia-223', None)], hostdevs=[kept])
    xml = xml.replace(b'<devices>', (
        "<devices>"
        "<hostdev mode='capabilities' type='mdev'><source><address "
        "uuid='%s'/></source></hostdev>" % skipped).encode(), 1)
    rc, out, err = tm.migrate(env, xml)
    assert (rc, err) == (0, '')
    assert [lease.vgpu_uuid for lease in env.leases()] == [kept]


def test_targets_never_guess_between_two_metadata(env):
    """``targets`` refuses two <metadata> itself, whoever parsed the
    metadata before it (the hook's parse refuses them first)."""
    from libvirt_gpu.guests.hook import incoming as inc
    from libvirt_gpu.util import xmledit
    from libvirt_gpu.virt import metadata
    uuid = th.new_uuid()
    xml = tm.incoming_xml(uuid)
    for extra in (b'<metadata/>', b"<metadata><g:gpus xmlns:g="
                  b"'urn:libvirt-gpu:1'/></metadata>"):
        two = xml.replace(b'<devices>', extra + b'<devices>')
        req = operations.Request(
            operation='migrate', domain=operations.config_xml.read_domain(
                xmlutil.parse(xml)),
            meta=metadata.GpuMetadata(vgpus=(metadata.VgpuEntry(
                uuid=uuid, type_id=TYPE),)),
            document=xmledit.Document.parse(two))
        with pytest.raises(exception.MigrationRefused) as e:
            inc.targets(req)
        assert str(e.value) == ('Migration refused: the domain XML has 2 '
                                '<metadata> elements and libvirt reads only '
                                'the first')


def test_several_uuids_taken_here_each_get_a_new_one(env):
    """EXISTING (a vGPU here) and a UUID another domain leased: both new,
    in one call, and the free one kept (broken by stopping at the first
    taken UUID with no earlier try to reuse)."""
    leased, free = th.new_uuid(), th.new_uuid()
    _reserve_for(env, [(DOM2, 1, None)])
    with state.LeaseStore(env.state_dir).transaction() as txn:
        txn._db.execute('UPDATE leases SET mdev_uuid = ?', (leased,))
    claims = [allocator.VgpuClaim(uuid=u, type_id=TYPE)
              for u in (EXISTING, leased, free)]
    grants = allocator_of(env).reserve_incoming(DOM, claims,
                                                time.time() + 60)
    uuids = [g.device.uuid for g in grants]
    assert uuids[2] == free
    assert len(set(uuids)) == 3 and not {EXISTING, leased} & set(uuids)
    leases = {lease.vgpu_uuid: lease for lease in env.leases()}
    for grant in grants:              # what was stored, as stored
        assert (grant.existed, grant.lease) == (
            False, leases[grant.device.uuid])


def test_one_uuid_claimed_twice_gets_a_second_uuid(env):
    uuid = th.new_uuid()
    claims = [allocator.VgpuClaim(uuid=uuid, type_id=TYPE)] * 2
    grants = allocator_of(env).reserve_incoming(DOM, claims,
                                                time.time() + 60)
    assert grants[0].device.uuid == uuid != grants[1].device.uuid
    assert len(env.leases()) == 2


def test_a_prepare_under_way_of_the_domain_is_no_earlier_try(env):
    """This domain's lease without expiry (a prepare's, not a migrate's)
    is neither reused nor dropped by a migrate of the domain (broken by
    taking any reserved lease, or any lease without its vGPU, for an
    earlier try's)."""
    _reserve_for(env, [(DOM, 1, None)])
    (prepared,) = env.leases()
    rc, out, err = tm.migrate(env, tm.incoming_xml(EXISTING))
    assert (rc, err) == (0, '')
    assert prepared in env.leases() and len(env.leases()) == 2
    assert prepared.vgpu_uuid.encode() not in out


def _log_lines(env):
    return [line.split(': ', 1)[1] for line in env.log().splitlines()]


def test_each_reservation_is_logged_in_one_exact_line(env):
    kept = th.new_uuid()
    assert tm.migrate(env, tm.incoming_xml(kept))[0] == 0
    assert 'incoming vGPU %s (nvidia-223) reserved on %s' % (kept, A) \
        in _log_lines(env)
    rc, out, _ = tm.migrate(env, th.domain_xml(
        [(EXISTING, 'nvidia-223', None)], uuid=DOM2))
    (new,) = [lease.vgpu_uuid for lease in env.leases()
              if lease.domain_uuid == DOM2]
    assert 'incoming vGPU %s (nvidia-223) reserved on %s (was %s on the ' \
        'source, taken here)' % (new, A, EXISTING) in _log_lines(env)


def test_exactly_the_cap_is_judged_on_room_and_one_more_refused(env):
    cap = allocator.MAX_VGPUS_PER_DOMAIN
    assert 'No capacity left' in refused(env, many(cap, parent=None))
    assert refused(env, many(cap + 1)).endswith(
        'Migration refused: it carries %d vGPUs and this host gives one '
        'domain at most %d; give the guest fewer vGPUs before migrating it\n'
        % (cap + 1, cap))


def test_a_pinned_guest_gets_the_gpu_near_it(env):
    """NUMA node 1 holds 0000:af:00.0 (fewer free than 0000:3b:00.0):
    chosen for a guest pinned there (broken by not handing the pinning
    to the reservation)."""
    xml = tm.incoming_xml(th.new_uuid()).replace(
        b'<devices>', b"<numatune><memory nodeset='1'/></numatune><devices>")
    rc, out, err = tm.migrate(env, xml)
    assert (rc, err) == (0, '')
    (lease,) = env.leases()
    assert str(lease.parent) == B


def test_a_hostdev_without_mode_is_a_subsystem_one(env):
    """libvirt's default mode (broken by skipping a hostdev that does not
    say mode='subsystem')."""
    uuid = th.new_uuid()
    xml = tm.incoming_xml(uuid).replace(b"mode='subsystem' ", b'')
    assert b'mode=' not in xml
    assert tm.migrate(env, xml)[0] == 0
    assert [lease.vgpu_uuid for lease in env.leases()] == [uuid]


def test_an_edit_that_breaks_the_xml_undoes_the_reservation(
        env, monkeypatch):
    """The operation parses what it edited before the reservation
    commits (the edge's check would come after the commit)."""
    def breaks(doc, target, device):
        doc.replace(doc.root.find('devices'), '<oops>')
    monkeypatch.setattr(incoming, '_edit', breaks)
    assert 'Refused XML: the rewritten domain XML is malformed' in \
        refused(env, many(1, parent=None))


def test_an_mdev_on_the_source_that_is_a_vf_here_is_refused(tmp_path):
    from tests.doubles import vendor_world as tv
    world = tv.World('l40s', str(tmp_path), 'nvidia-1145',
                     '%s, %s' % (tv.L1, tv.L2))
    uuid = th.new_uuid()
    xml = tm.incoming_xml(uuid).replace(b'nvidia-223', b'nvidia-1145')
    out, err = io.BytesIO(), io.StringIO()
    rc = hook.run(['qemu', 'vm1', 'migrate', 'begin', '-'], xml,
                  config_file=world.config, sysfs=world.sysfs, stderr=err,
                  mdevctl_dir=world.mdevctl, stdout=out)
    assert (rc, out.getvalue()) == (1, b'')
    assert err.getvalue().endswith(
        'Migration refused: vGPU %s (nvidia-1145) is an mdev on the source '
        'but a VF (vendor interface) here; both hosts must offer the type '
        'the same way\n' % uuid)
    assert world.leases() == []
