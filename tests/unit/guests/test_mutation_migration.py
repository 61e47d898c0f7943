"""What ``migration.check`` tells an operator that the migration tests
left open: each test here fails on a change ``make mutation`` made to
guests/migration.py that the rest stayed green on
(docs/dev/mutation.md): every check's whole text, in order, and the
vGPUs on VFs that the destination's libvirt does not list."""

import pytest

from libvirt_gpu.guests import migration
from libvirt_gpu.virt import host as host_mod
from tests.doubles import t4_hook as th
from tests.unit.guests.test_migration_check_guards import Conn
from tests.unit.guests.test_migration_check_guards import Domain
from tests.unit.guests.test_migration_check_guards import check
from tests.unit.guests.test_migration_check_guards import gpu_xml
from tests.unit.guests.test_migration_check_guards import v

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
