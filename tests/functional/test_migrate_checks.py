"""``libvirt-gpu migrate`` / ``api.migrate``: the checks made before a
live migration, through a real libvirtd (the one the tests start, standing
for both hosts: it is the only libvirt here).  The migration itself needs
two hosts with VFIO migration (kernel, QEMU >= 8.1): not here."""

import json
import os
import subprocess
import sys
import uuid as uuidlib

import pytest

from libvirt_gpu import objects
from libvirt_gpu.guests import api
from libvirt_gpu import exception
from libvirt_gpu.virt import metadata
from libvirt_gpu.guests import migration
from tests.functional import libvirtd as libvirtd_mod

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


@pytest.fixture(scope='module')
def libvirtd(libvirtd_requirements):
    """One daemon for the module (each start costs seconds)."""
    with libvirtd_mod.LibvirtDaemon() as daemon:
        yield daemon


@pytest.fixture
def running(libvirtd):
    """A running guest whose metadata lists two vGPUs of one type (no
    hostdev: this host has no GPU, and the checks read the metadata)."""
    meta = metadata.render_document(metadata.GpuMetadata(vgpus=tuple(
        metadata.VgpuEntry(objects.Uuid.new(),
                           objects.TypeId.parse('nvidia-223'))
        for _ in range(2))))
    conn = libvirtd.connect()
    dom = conn.createXML(libvirtd_mod.tiny_domain_xml(
        'mig1', metadata=meta), 0)
    yield conn, dom
    if dom.isActive():
        dom.destroy()


def test_checks_read_both_sides_through_libvirt(libvirtd, running):
    conn, dom = running
    plan = api.migrate(conn, 'mig1', libvirtd.uri, dry_run=True).plan
    checks = {c.what: c for c in plan.checks}
    qemu = migration.version(conn.getVersion())
    lib = migration.version(conn.getLibVersion())
    for side in ('source', 'destination'):
        assert checks['%s libvirt' % side].ok == (lib >= (8, 6, 0))
        assert checks['%s QEMU' % side].ok == (qemu >= (8, 1, 0))
        assert checks['%s QEMU' % side].detail.startswith(
            '%d.%d.%d' % qemu)
    assert checks['post-copy'].ok and checks['guest running'].ok
    # this libvirt lists no GPU offering the type: refused, with why
    room = checks['destination room for nvidia-223']
    assert not room.ok and 'offers no nvidia-223' in room.detail
    assert plan.vgpus == (('nvidia-223', 2),) and not plan.ok


def test_a_refused_check_starts_nothing(libvirtd, running):
    conn, dom = running
    with pytest.raises(exception.MigrationRefused,
                       match='nothing was started'):
        api.migrate(conn, 'mig1', libvirtd.uri)
    assert dom.isActive()
    plan = migration.check(*(2 * [api.migration_host(conn)]),
                           libvirtd.uri, 'mig1', postcopy=True)
    (postcopy,) = [c for c in plan.checks if c.what == 'post-copy']
    assert not postcopy.ok and 'VFIO' in postcopy.detail


def test_cli_dry_run_prints_the_checks(libvirtd, running):
    r = subprocess.run(
        [sys.executable, '-m', 'libvirt_gpu.cmd.main', '-c', libvirtd.uri,
         'migrate', 'mig1', libvirtd.uri, '--dry-run', '--json'],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    doc = json.loads(r.stdout)
    assert r.returncode == 1, r.stderr          # a check refused
    assert doc['domain'] == 'mig1' and doc['ok'] is False
    assert doc['vgpus'] == {'nvidia-223': 2}
    assert 'migrated' not in doc
    r = subprocess.run(
        [sys.executable, '-m', 'libvirt_gpu.cmd.main', '-c', libvirtd.uri,
         'migrate', 'mig1', libvirtd.uri],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert 'NO   destination room for nvidia-223' in r.stdout
    assert 'nothing was started' in r.stderr


def test_libvirts_refusal_says_why_and_the_guest_runs_on(libvirtd, running):
    # past the checks, libvirt itself refuses (the destination is this
    # very host): the error carries libvirt's reason, nothing moved
    conn, dom = running
    host = api.migration_host(conn)
    seen = []
    with pytest.raises(exception.LibvirtError,
                       match='migration to .*same host'):
        migration.migrate(host, host, libvirtd.uri, 'mig1',
                          progress=seen.append, poll=0.05)
    assert dom.isActive()


def test_vendor_interface_vgpus_are_left_to_the_destination_hook(libvirtd):
    # a vGPU on a VF is a PCI hostdev; the destination's libvirt lists no
    # mdev type for it.  (A guest holding a VF cannot start here: the
    # check reads a defined, stopped one and refuses it for that.)
    uuid = str(uuidlib.uuid4())
    meta = metadata.render_document(metadata.GpuMetadata(vgpus=(
        metadata.VgpuEntry(objects.Uuid.parse(uuid),
                           objects.TypeId.parse('nvidia-1145'),
                           objects.PciAddress.parse('0000:bd:00.4')),)))
    vf = ("<hostdev mode='subsystem' type='pci' managed='no'><source>"
          "<address domain='0x0000' bus='0xbd' slot='0x00' function='0x4'/>"
          "</source></hostdev>")
    conn = libvirtd.connect()
    dom = conn.defineXML(libvirtd_mod.tiny_domain_xml(
        'mig2', metadata=meta, extra_devices=vf))
    try:
        plan = api.migrate(conn, 'mig2', libvirtd.uri, dry_run=True).plan
    finally:
        dom.undefine()
    checks = {c.what: c for c in plan.checks}
    assert checks['destination room for nvidia-1145'].ok
    assert "destination's hook checks" in checks[
        'destination room for nvidia-1145'].detail
    assert not checks['guest running'].ok
