"""NVIDIA's migration rule between two live simulated H100 hosts, each a
FUSE tree with its own real libvirtd (its own host UUID) and our hook
(``[gpu]/nvml = simulated``): a guest migrates live from the source
(driver 580.95.02) to a destination of another driver branch (550.127.05,
refused) or of the same one (migrated as before).

The guest holds no hostdev (this host has no VFIO); its metadata names
its vGPU on a VF whose type the test writes on the source, so NVIDIA's
driver there has the vGPU instance whose metadata ``libvirt-gpu migrate``
(or ``migrate --stamp`` before a ``virsh migrate``) writes into the
domain.  The destination's ``migrate`` hook refuses in libvirt's prepare
step, before QEMU starts there or any memory is copied.

Each destination libvirtd is reached through libvirt's ``ext`` transport
(``tests/functional/ext_relay.py`` relays it to the daemon's socket): a
peer-to-peer migration refuses a URI without a host name, and ``unix``
takes none."""

import json
import os
import subprocess
import sys
import uuid as uuidlib

import pytest

from libvirt_gpu import objects
from libvirt_gpu.virt import metadata
from libvirt_gpu.devices.backends.nvidia_vgpu.files import (
    VendorFiles as vendor)
from libvirt_gpu.simulator import loading
from tests.functional import hook_guests as hg
from tests.functional import libvirtd as libvirtd_mod
from tests.functional import live_sysfs as ls
from tests.functional.migration_hosts import Host
from tests.functional.migration_hosts import MIGRATE_URI
from tests.functional.migration_hosts import migrate
from tests.functional.migration_hosts import on

TYPE = 'nvidia-1300'
VF = '0000:4e:00.4'
GPU = '0000:4e:00.0'

missing = ls.live_host_requirements()
pytestmark = pytest.mark.skipif(bool(missing), reason='; '.join(missing))


class Setup(hg.HookSetup):
    """Our hook with NVML simulated over the host's live tree."""

    def hooks(self, live):
        found = super().hooks(live)
        with open(self.config, 'a') as f:
            f.write('nvml = simulated\n')
        return found


def _host(tmp_path_factory, name, driver_version):
    workdir = str(tmp_path_factory.mktemp(name))
    profile = os.path.join(workdir, 'profile.json')
    with open(os.path.join(loading.profile_dir(), 'h100-80gb.json')) as f:
        data = json.load(f)
    data['driver_version'] = driver_version
    with open(profile, 'w') as f:
        json.dump(data, f)
    setup = Setup(workdir, TYPE)
    host = Host(workdir, profile=profile, hooks=setup.hooks)
    host.setup = setup
    return host


@pytest.fixture(scope='module')
def source(tmp_path_factory):
    with _host(tmp_path_factory, 'source', '580.95.02') as h:
        vendor(h.live.sysfs).set_current_type(VF, 1300)
        yield h


@pytest.fixture(scope='module')
def other_branch(tmp_path_factory):
    with _host(tmp_path_factory, 'other-branch', '550.127.05') as h:
        yield h


@pytest.fixture(scope='module')
def same_branch(tmp_path_factory):
    with _host(tmp_path_factory, 'same-branch', '580.105.08') as h:
        yield h


@pytest.fixture
def guest(source):
    name = 'nv-%s' % uuidlib.uuid4().hex[:8]
    conn = source.daemon.connect()
    meta = metadata.render_document(metadata.GpuMetadata(vgpus=(
        metadata.VgpuEntry(objects.Uuid.new(), objects.TypeId.parse(TYPE),
                           objects.PciAddress.parse(VF)),)))
    dom = conn.createXML(libvirtd_mod.tiny_domain_xml(name, metadata=meta),
                         0)
    yield name, dom
    import libvirt
    try:
        dom.destroy()
    except libvirt.libvirtError as e:   # it left for the destination
        assert e.get_error_code() in (libvirt.VIR_ERR_NO_DOMAIN,
                                      libvirt.VIR_ERR_OPERATION_INVALID)


def cli(host, *args):
    return subprocess.run(
        [sys.executable, '-m', 'libvirt_gpu.cmd.main', '--config-file',
         host.setup.config, '-c', host.uri] + list(args),
        cwd=ls.REPO, capture_output=True, text=True, timeout=120)


REFUSAL = ("NVIDIA's driver allows no live migration to GPU %s (no kind at "
           "all): limited by the host driver (the source runs 580.95.02, "
           "this host 550.127.05)" % GPU)


def test_libvirt_gpu_migrate_is_refused_with_nvidia_s_reason(
        source, other_branch, guest):
    from libvirt_gpu import exception
    name, dom = guest
    dry = cli(source, 'migrate', name, other_branch.ext_uri, '--dry-run',
              '--json')
    (answer,) = json.loads(dry.stdout)['nvidia']
    assert (answer['type'], answer['metadata_read'],
            answer['host_driver']) == (TYPE, True, '580.95.02')
    # and the destination-layout question: an equal-size vGPU here
    (layout,) = json.loads(dry.stdout)['layout']
    assert (layout['type'], layout['mode'], layout['needs']) == (
        TYPE, 'time-sliced', 'room for the type (equal-size)')
    with pytest.raises(exception.LibvirtError) as refused:
        migrate(source, other_branch, name)
    assert REFUSAL in str(refused.value)
    assert dom.isActive() and on(other_branch, name) == []
    assert hg.leases(other_branch) == []
    # the hook refused in libvirt's prepare step: QEMU never started there
    assert REFUSAL in hg.hook_log(other_branch)
    assert other_branch.daemon.qemu_log(name) == ''


def test_virsh_migrate_is_refused_after_a_stamp(source, other_branch,
                                                guest):
    name, dom = guest
    r = cli(source, 'migrate', name, other_branch.ext_uri, '--stamp')
    assert r.returncode == 0 and 'metadata of 1 of 1 vGPU(s)' in r.stdout
    v = subprocess.run(
        ['virsh', '-c', source.uri, 'migrate', '--live', name,
         other_branch.ext_uri, '--migrateuri', MIGRATE_URI],
        capture_output=True, text=True, timeout=120)
    assert v.returncode != 0 and REFUSAL in v.stderr, v.stderr
    assert dom.isActive() and on(other_branch, name) == []
    assert hg.leases(other_branch) == []


def test_the_same_branch_migrates_as_before(source, same_branch, guest):
    name, _ = guest
    assert migrate(source, same_branch, name).done
    assert on(same_branch, name) == [name] and on(source, name) == []
    assert ("NVIDIA's driver allows a live migration to GPU %s" % GPU) in \
        hg.hook_log(same_branch)
    same_branch.daemon.connect().lookupByName(name).destroy()


def test_a_stamp_that_reads_nothing_says_so(source):
    # a guest whose vGPU NVIDIA's driver does not know (its VF untyped)
    name = 'nv-none-%s' % uuidlib.uuid4().hex[:6]
    meta = metadata.render_document(metadata.GpuMetadata(vgpus=(
        metadata.VgpuEntry(objects.Uuid.new(), objects.TypeId.parse(TYPE),
                           objects.PciAddress.parse('0000:4e:00.7')),)))
    dom = source.daemon.connect().createXML(
        libvirtd_mod.tiny_domain_xml(name, metadata=meta), 0)
    try:
        r = cli(source, 'migrate', name, source.uri, '--stamp')
        assert r.returncode == 1, r.stderr
        assert r.stdout == ("%s: NVIDIA's metadata of 0 of 1 vGPU(s) in its "
                            "live metadata\n" % name)
        assert 'nvidia-metadata' not in dom.XMLDesc(0)
    finally:
        dom.destroy()
