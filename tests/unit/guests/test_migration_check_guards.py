"""``migration.check`` and the downtime ``migration.migrate`` reads, on
two stand-in connections (issue 30, section 6: check had no unit test and
its functional test uses one libvirtd for both sides, so a check reading
the wrong side passed).  Version boundaries (exactly 8.6.0 and 8.1.0
pass), exactly enough room passes, room summed over the destination's
GPUs, each side's versions read from that side, the downtime read from
the side that has it."""

import pytest

from libvirt_gpu.virt import host as host_mod
from libvirt_gpu.guests import migration

from tests.doubles.migration_conns import (
    DEST_URI, GOOD, Conn, Domain, by_what, check, gpu_xml, v, vgpu_domain)


# --- versions ---------------------------------------------------------------

@pytest.mark.parametrize('side', ['source', 'destination'])
def test_exactly_the_minimum_versions_pass(side):
    """Broken by ``>`` for ``>=``."""
    low = (v(*migration.MIN_LIBVIRT), v(*migration.MIN_QEMU))
    source = Conn(low if side == 'source' else GOOD, domain=vgpu_domain(1))
    dest = Conn(low if side == 'destination' else GOOD,
                gpus=[gpu_xml(0x3b, {'nvidia-223': 1})])
    plan = check(source, dest)
    found = by_what(plan)
    assert found['%s libvirt' % side].ok
    assert found['%s libvirt' % side].detail == '8.6.0'
    assert found['%s QEMU' % side].ok
    assert found['%s QEMU' % side].detail == '8.1.0'
    assert plan.ok


@pytest.mark.parametrize('side', ['source', 'destination'])
@pytest.mark.parametrize('which, versions', [
    ('libvirt', (v(8, 5, 999), GOOD[1])),
    ('QEMU', (GOOD[0], v(8, 0, 999)))])
def test_one_release_below_the_minimum_is_refused(side, which, versions):
    source = Conn(versions if side == 'source' else GOOD,
                  domain=vgpu_domain(1))
    dest = Conn(versions if side == 'destination' else GOOD,
                gpus=[gpu_xml(0x3b, {'nvidia-223': 1})])
    plan = check(source, dest)
    assert [c.what for c in plan.refusals] == ['%s %s' % (side, which)]
    assert 'upgrade it on the %s host' % side in plan.refusals[0].detail


def test_each_sides_versions_are_read_from_that_side():
    """Broken by reading the destination's versions through the source's
    connection (one libvirtd for both sides could not tell)."""
    source = Conn((v(10, 0, 0), v(9, 0, 0)), domain=vgpu_domain(1))
    dest = Conn((v(8, 7, 0), v(8, 2, 1)),
                gpus=[gpu_xml(0x3b, {'nvidia-223': 1})])
    found = by_what(check(source, dest))
    assert [found[w].detail for w in (
        'source libvirt', 'source QEMU', 'destination libvirt',
        'destination QEMU')] == ['10.0.0', '9.0.0', '8.7.0', '8.2.1']


# --- room at the destination ------------------------------------------------

def test_exactly_enough_room_passes():
    """Broken by ``>`` for ``>=``."""
    plan = check(Conn(domain=vgpu_domain(2)),
                 Conn(gpus=[gpu_xml(0x3b, {'nvidia-223': 2})]))
    room = by_what(plan)['destination room for nvidia-223']
    assert (room.ok, room.detail) == (True, '2 needed, 2 available')
    assert plan.ok and plan.vgpus == (('nvidia-223', 2),)


def test_one_short_is_refused():
    plan = check(Conn(domain=vgpu_domain(3)),
                 Conn(gpus=[gpu_xml(0x3b, {'nvidia-223': 2})]))
    room = by_what(plan)['destination room for nvidia-223']
    assert not room.ok
    assert room.detail == '3 needed, 2 available: free vGPUs there first'


def test_room_is_summed_over_the_destinations_gpus():
    """Broken by keeping one GPU's count (the first, the last or the
    largest) instead of the sum."""
    dest = Conn(gpus=[gpu_xml(0x3b, {'nvidia-223': 1, 'nvidia-224': 4}),
                      gpu_xml(0x5e, {'nvidia-223': 2}),
                      gpu_xml(0xaf, {'nvidia-223': 1})])
    plan = check(Conn(domain=vgpu_domain(4)), dest)
    room = by_what(plan)['destination room for nvidia-223']
    assert (room.ok, room.detail) == (True, '4 needed, 4 available')


def test_a_type_the_destination_lacks_is_refused():
    plan = check(Conn(domain=vgpu_domain(1)),
                 Conn(gpus=[gpu_xml(0x3b, {'nvidia-224': 8})]))
    assert [c.what for c in plan.refusals] == [
        'destination room for nvidia-223']
    assert 'offers no nvidia-223' in plan.refusals[0].detail


# --- the downtime, after the migration --------------------------------------

def _migrate(source_stats, dest_stats):
    source = Conn(domain=Domain(stats=source_stats))
    dest = Conn(domain=Domain(stats=dest_stats)
                if dest_stats is not None else None)
    return migration.migrate(host_mod.Host.from_connection(source),
                             host_mod.Host.from_connection(dest),
                             DEST_URI, 'vm1', poll=0.01)


def test_the_downtime_is_read_from_the_source_when_it_has_it():
    """The destination is not asked (its domain lookup would fail)."""
    outcome = _migrate({'downtime': 42, 'data_total': 7,
                        'time_elapsed': 3500}, None)
    assert (outcome.done, outcome.downtime_ms, outcome.data_total,
            outcome.elapsed_ms) == (True, 42, 7, 3500)


def test_the_downtime_is_read_from_the_destination_when_only_it_has_it():
    """Broken by reading the source's statistics only (or the
    destination's always)."""
    outcome = _migrate({'data_total': 7, 'time_elapsed': 3500},
                       {'downtime': 17, 'data_total': 7,
                        'time_elapsed': 3400})
    assert (outcome.done, outcome.downtime_ms) == (True, 17)
