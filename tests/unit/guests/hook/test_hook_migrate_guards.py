"""The destination's ``migrate``: behaviours no other test pinned (issue
30, section 6).  A kind mismatch (a VF on the source, an mdev here)
leaves no reservation; UUIDs are compared whatever their case; another
domain's reservation of the same UUID, pending from its own migrate or
from a prepare under way, is never taken over: the incoming vGPU gets a
new UUID.  On the simulated T4 host of test_hook_migrate.py."""

import time

import pytest

from libvirt_gpu import objects
from libvirt_gpu.store import state
from tests.doubles import t4_hook as th
from tests.doubles import t4_migrate as tm
from tests.doubles.t4_migrate import _vf_xml

A, DOM = th.A, th.DOM
DOM2 = objects.Uuid.parse('6a8a3b1e-9d0b-4a55-9d84-3c7f0f3f4e21')


def test_a_kind_mismatch_leaves_no_reservation(env):
    """A VF on the source, an mdev type here: refused, and the
    reservation just made is dropped again (broken by leaving out the
    ``forget`` of the refusal)."""
    uuid = th.new_uuid()
    rc, out, err = tm.migrate(env, _vf_xml(uuid))
    assert (rc, out) == (1, b'')
    assert 'is a VF (vendor interface) on the source but an mdev here' \
        in err
    assert env.leases() == []
    # and the room is all there for the next one
    assert tm.migrate(env, tm.incoming_xml(th.new_uuid()))[0] == 0
    assert len(env.leases()) == 1


@pytest.mark.parametrize('where', ['both', 'metadata', 'hostdev'])
def test_uuids_are_compared_whatever_their_case(env, where):
    """libvirt and nova may write a UUID in capitals (broken by comparing
    the strings as they are: the hostdev or the metadata entry is then
    not found)."""
    uuid = th.new_uuid()
    xml = tm.incoming_xml(uuid)
    upper = uuid.upper().encode()
    if where in ('both', 'metadata'):
        xml = xml.replace(b"<g:vgpu  uuid='%s'" % uuid.encode(),
                          b"<g:vgpu  uuid='%s'" % upper)
    if where in ('both', 'hostdev'):
        xml = xml.replace(b"<address  uuid='%s'" % uuid.encode(),
                          b"<address  uuid='%s'" % upper)
    assert uuid.encode() in xml or where == 'both'
    rc, out, err = tm.migrate(env, xml)
    assert (rc, err) == (0, '')
    assert out == xml.replace(
        ("parent='%s'" % tm.SOURCE_GPU).encode(),
        ("parent='%s'" % A).encode())
    (lease,) = env.leases()
    assert (lease.vgpu_uuid, lease.domain_uuid, str(lease.parent)) == (
        uuid, DOM, A)


def _lease(env, uuid):
    return next(lease for lease in env.leases() if lease.vgpu_uuid == uuid)


def _new_uuid_in(out, old):
    """The UUID the metadata entry and the hostdev carry now."""
    text = out.decode()
    assert old not in text
    start = text.index("<g:vgpu  uuid='") + len("<g:vgpu  uuid='")
    new = text[start:start + 36]
    assert "<address  uuid='%s'" % new in text
    return new


def test_another_domains_pending_reservation_is_never_taken_over(env):
    """Two domains migrating in with one UUID (broken by renewing any
    domain's reservation of the UUID as a retry of this one's)."""
    uuid = th.new_uuid()
    xml = tm.incoming_xml(uuid)
    assert tm.migrate(env, xml)[0] == 0
    first = _lease(env, uuid)
    time.sleep(0.01)
    rc, out, err = tm.migrate(env, xml.replace(DOM.encode(), DOM2.encode()))
    assert (rc, err) == (0, '')
    new = _new_uuid_in(out, uuid)
    assert _lease(env, uuid) == first           # untouched
    second = _lease(env, new)
    assert (second.domain_uuid, second.state) == (DOM2, state.RESERVED)
    assert len(env.leases()) == 2


def test_a_uuid_reserved_here_by_another_domain_gets_a_new_uuid(env):
    """A prepare of another domain has reserved the UUID and not made its
    vGPU yet (no mdev: only the lease says so); broken by judging a UUID
    free by its mdev alone."""
    uuid = th.new_uuid()
    with state.LeaseStore(env.state_dir).transaction() as txn:
        txn.add(uuid, DOM2, objects.PciAddress.parse(A),
                objects.TypeId.parse('nvidia-223'), state.RESERVED)
    before = _lease(env, uuid)
    rc, out, err = tm.migrate(env, tm.incoming_xml(uuid))
    assert (rc, err) == (0, '')
    new = _new_uuid_in(out, uuid)
    assert _lease(env, uuid) == before
    assert (_lease(env, new).domain_uuid, _lease(env, new).state) == (
        DOM, state.RESERVED)
    assert 'was %s on the source' % uuid in env.log()


def test_a_reservation_of_this_domain_for_another_type_is_not_renewed(env):
    uuid = th.new_uuid()
    assert tm.migrate(env, tm.incoming_xml(uuid))[0] == 0
    with state.LeaseStore(env.state_dir).transaction() as txn:
        txn._db.execute("UPDATE leases SET type_id = 'nvidia-224'")
    rc, out, err = tm.migrate(env, tm.incoming_xml(uuid))
    assert (rc, err) == (0, '')
    new = _new_uuid_in(out, uuid)
    # this retry replaces the earlier try's reservation it cannot use
    (lease,) = env.leases()
    assert (lease.vgpu_uuid, lease.type_id) == (new, 'nvidia-223')
