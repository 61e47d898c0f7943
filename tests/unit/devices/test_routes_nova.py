"""A GPU carved for Nova is Nova's alone: our Placement tree and our
Cyborg driver leave it out, nothing we report looks like Nova's own
providers, the allocator never gives it out, the hook leaves a domain
with a carved VF to Nova, and neither reconcile nor restore's clean-up
touches a carved VF (simulated L40S host, ``kernel_sysfs``)."""

import os
import shutil
import tempfile

import pytest

from libvirt_gpu.cmd import openstack_cmds
from libvirt_gpu import environment
from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.guests import reconcile
from libvirt_gpu.openstack import cyborg_driver
from libvirt_gpu.openstack import cyborg_objects
from libvirt_gpu.openstack.placement import model
from libvirt_gpu.openstack.placement import tree as tree_mod
from libvirt_gpu.host import allocator as allocator_mod
from libvirt_gpu.store import state
from tests.doubles import fake_libvirt
from tests.doubles.carved_host import CARVING
from tests.doubles.carved_host import Host
from tests.doubles.carved_host import L1
from tests.doubles.carved_host import L2
from tests.doubles.carved_host import hook_log
from tests.doubles.carved_host import run_hook
from tests.doubles.carved_host import vfs
from tests.doubles.vendor_world \
        import vf_domain_xml

HOST = 'compute-1'
T_1B = objects.TypeId.parse('nvidia-1145')
DOM = objects.Uuid.parse('0f6b2f4e-5d0b-4a55-9d4e-3f9c6f1b6a01')


@pytest.fixture(scope='module')
def carved():
    """0000:bd:00.0 carved (2 VFs of L40S-12Q) and restored; one host for
    the module (a test that changes its configuration puts it back)."""
    tmp = tempfile.mkdtemp(prefix='lgpu-nova-routes-')
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv('LIBVIRT_GPU_CACHE_DIR', '')
        host = Host(tmp, CARVING % (L2, 2))
        assert host.restore().failed == ()
        yield host
    shutil.rmtree(tmp, ignore_errors=True)


def names(provider_tree):
    return sorted(p.name for p in provider_tree.children)


# --- Placement ---------------------------------------------------------------

def test_our_tree_leaves_a_carved_gpu_out(fast_tmp):
    host = Host(fast_tmp, '')
    assert names(openstack_cmds.provider_tree(host.env(), HOST)) == [
        'compute-1_0000:3d:00.0', 'compute-1_0000:bd:00.0']
    host.write_config(CARVING % (L2, 2))      # planned: before any restore
    assert names(openstack_cmds.provider_tree(host.env(), HOST)) == [
        'compute-1_0000:3d:00.0']


def test_a_gpu_still_recorded_as_carved_stays_out_of_our_tree(carved):
    carved.write_config('')                   # carving gone, VFs held
    try:
        assert names(openstack_cmds.provider_tree(carved.env(), HOST)) == [
            'compute-1_0000:3d:00.0']
    finally:
        carved.write_config(CARVING % (L2, 2))


def child(name, traits=()):
    return tree_mod.ResourceProvider(
        name=name, uuid=tree_mod.provider_uuid(name),
        parent_provider_uuid=tree_mod.provider_uuid(HOST),
        inventories=(tree_mod.Inventory('PGPU', total=1),),
        traits=frozenset(traits))


@pytest.mark.parametrize('provider, carved_gpus, reason', [
    (child('compute-1_pci_0000_bd_00_0'), (),
     'Nova names its vGPU providers <host>_pci_<address>'),
    (child('compute-1_0000:3d:00.0', ['OWNER_NOVA']), (),
     'the trait OWNER_NOVA marks Nova\'s own providers'),
    # Nova's PCI provider of the carved GPU is compute-1_0000:BD:00.0;
    # Placement may compare names without case
    (child('compute-1_0000:bd:00.0'), (L2,),
     'its GPU is carved for Nova, whose PCI provider of it has that name'),
])
def test_nothing_we_report_looks_like_nova_s_own(provider, carved_gpus,
                                                 reason):
    root = tree_mod.ResourceProvider(name=HOST,
                                     uuid=tree_mod.provider_uuid(HOST),
                                     parent_provider_uuid=None)
    found = tree_mod.ProviderTree(root=root, children=(provider,))
    with pytest.raises(model.NovaProviderClash) as e:
        model.check_not_novas(found, carved_gpus)
    assert reason in str(e.value)
    # the same provider for a GPU that is not carved, without Nova's
    # marks, passes
    model.check_not_novas(tree_mod.ProviderTree(
        root=root, children=(child('compute-1_0000:3d:00.0'),)), (L2,))


def test_nova_s_pci_provider_name():
    assert model.nova_pci_provider_name(HOST, L2) == 'compute-1_0000:BD:00.0'


# --- Cyborg ------------------------------------------------------------------

def deployables(devices):
    """``{control path: deployables}`` (the path as Cyborg keys it)."""
    return {d.controlpath_id.cpid_info: len(d.deployable_list)
            for d in devices}


def test_cyborg_reports_a_carved_gpu_with_nothing_to_offer(
        fast_tmp):
    every = '[routes]\ncyborg = all\n'     # the host is Cyborg's
    host = Host(fast_tmp, '')
    host.write_config(every)
    before = deployables(cyborg_driver.discover_records(
        HOST, config_file=host.config))
    l2 = cyborg_objects.pci_info(L2)
    assert before[l2] == 1                     # offered whole
    host.write_config(CARVING % (L2, 2) + every)
    devices = cyborg_driver.discover_records(HOST, config_file=host.config)
    assert deployables(devices) == {**before, l2: 0}
    env = host.env()
    _, withheld = cyborg_objects.host_devices(
        HOST, env.discovered.gpus, env.enabled, env.conf.gpu,
        carved=env.carved.gpus)
    assert withheld[L2] == cyborg_objects.CARVED


# --- the allocator, as the hook builds it (no configuration) -----------------

def hook_env(host, enabled):
    return environment.Environment(
        host.state_dir, sysfs=host.sysfs, enabled=enabled,
        mdevctl_dir=os.path.join(host.tmp, 'mdevctl.d'))


def test_the_allocator_never_gives_out_a_carved_gpu(fast_tmp):
    # 2 VFs of L40S-1B carved: the GPU could hold 30 more of them
    carved = Host(fast_tmp, CARVING.replace('nvidia-1153', 'nvidia-1145')
                  % (L2, 2))
    assert carved.restore().failed == ()
    # a configuration that also enables the type there (refused by the
    # configuration's own check; the hook's snapshot does not make it)
    enabled = {L2: objects.EnabledType(T_1B), L1: objects.EnabledType(T_1B)}
    assert hook_env(carved, {}).carved.gpus == {L2}
    env = hook_env(carved, enabled)
    assert env.allocator.capacity(T_1B)[L2] == 0
    claim = allocator_mod.VgpuClaim(objects.Uuid.new(), T_1B,
                                    parent=vfs(L2, 8)[0])
    with pytest.raises(exception.GpuInUse) as e:
        env.allocator.reserve(DOM, [claim])
    assert 'carved for Nova' in str(e.value)
    # a vGPU without a parent goes elsewhere
    (grant,) = env.allocator.reserve(DOM, [allocator_mod.VgpuClaim(
        objects.Uuid.new(), T_1B)])
    assert env.vgpus.physical(grant.device.parent) == L1
    # with only the carved GPU enabled, the refusal says why
    env = hook_env(carved, {L2: objects.EnabledType(T_1B)})
    with pytest.raises(exception.NoCapacity) as e:
        env.allocator.reserve(DOM, [allocator_mod.VgpuClaim(
            objects.Uuid.new(), T_1B)])
    assert 'looked at 0000:bd:00.0 (carved for Nova)' in str(e.value)


# --- the hook ----------------------------------------------------------------

NOVA_XML = (
    "<domain type='kvm'><name>instance-00000001</name><uuid>%s</uuid>"
    "<memory unit='KiB'>65536</memory><devices>"
    "<hostdev mode='subsystem' type='pci' managed='no'><source><address "
    "domain='0x0000' bus='0xbd' slot='0x00' function='0x4'/></source>"
    "</hostdev></devices></domain>" % DOM).encode()


def test_the_hook_leaves_a_domain_with_a_carved_vf_to_nova(carved):
    for op in ('prepare', 'release', 'migrate', 'reconnect'):
        # Nova's own XML (no metadata of ours) is not even read
        assert run_hook(carved, op, NOVA_XML) == (0, '', b'')
        assert carved.held(vfs(L2, 4)[0]) == 1153
    for op in ('release', 'reconnect'):
        # our metadata naming the carved VF: nothing of ours to undo there
        xml = vf_domain_xml(objects.Uuid.new(), '0000:bd:00.4', dom=DOM)
        assert (op, run_hook(carved, op, xml)) == (op, (0, '', b''))
        assert state.LeaseStore(carved.state_dir).leases() == []
        assert carved.held(vfs(L2, 4)[0]) == 1153
    assert hook_log(carved).count(
        'uses VF(s) carved for Nova (0000:bd:00.4): left to Nova') == 2


def test_the_hook_never_gives_a_guest_of_ours_a_carved_vf(carved):
    for op in ('prepare', 'migrate'):
        xml = vf_domain_xml(objects.Uuid.new(), '0000:bd:00.4', dom=DOM)
        code, err, out = run_hook(carved, op, xml)
        assert code == 1 and out == b'', (op, code, out)
        if op == 'prepare':
            assert ('0000:bd:00.4' in err and 'carved for Nova' in err), err
        assert state.LeaseStore(carved.state_dir).leases() == []
        assert carved.held(vfs(L2, 4)[0]) == 1153


# --- reconcile and restore's clean-up ----------------------------------------

def test_reconcile_never_removes_a_carved_vf_s_vgpu(carved):
    from libvirt_gpu.virt import host as host_mod
    conn = fake_libvirt.FakeConnection(os.path.join(carved.tmp, 'doms'))
    report = reconcile.reconcile(environment.Environment(
        carved.state_dir, sysfs=carved.sysfs,
        host=host_mod.Host.from_connection(conn),
        mdevctl_dir=os.path.join(carved.tmp, 'mdevctl.d')))
    assert [f for f in report.findings
            if f.parent in set(vfs(L2, 4, 5))] == []
    assert [carved.held(vf) for vf in vfs(L2, 4, 5)] == [1153, 1153]


def test_restore_s_clean_up_does_not_report_carved_vfs(carved):
    report = carved.restore()
    assert [a for a in report.actions if a.what == 'vgpu'
            and a.target in ('0000:bd:00.4', '0000:bd:00.5')] == []
    # someone else's vGPUs are still reported
    assert ('skipped', '0000:3d:00.4') in [
        (a.action, a.target) for a in report.actions if a.what == 'vgpu']


def test_a_carved_gpu_is_never_passed_through_whole(carved):
    xml = ("<domain type='kvm'><name>vm1</name><uuid>%s</uuid><metadata>"
           "<gpu:gpus xmlns:gpu='urn:libvirt-gpu:1'><gpu:pgpu address='%s'/>"
           "</gpu:gpus></metadata><memory unit='KiB'>65536</memory>"
           "<devices><hostdev mode='subsystem' type='pci' managed='yes'>"
           "<source><address domain='0x0000' bus='0xbd' slot='0x00' "
           "function='0x0'/></source></hostdev></devices></domain>"
           % (DOM, L2)).encode()
    rc, err, _ = run_hook(carved, 'prepare', xml)
    assert rc == 1
    assert ('The GPU 0000:bd:00.0 cannot be used: it is carved for Nova '
            '([nova]/carved)') in err


# --- one rule for prepare and release ----------------------------------------

def test_a_record_entry_that_no_longer_matches_the_host_holds_its_vf(
        fast_tmp):
    # our own route on 0000:bd:00.0, and a record whose entry names
    # bd:00.4 under another GPU (a host changed under it, a hand edit)
    host = Host(fast_tmp, 'enabled_vgpu_types = nvidia-1145\n'
                '[vgpu_nvidia-1145]\ndevice_addresses = %s\n' % L2)
    os.makedirs(host.state_dir, mode=0o700)
    with open(os.path.join(host.state_dir, 'nova-carved.json'), 'w') as f:
        f.write('{"version": 1, "vfs": {"0000:bd:00.4": {"gpu": '
                '"0000:3d:00.0", "type_id": "nvidia-1145", "carving": '
                '"gone"}}}')
    vf = vfs(L2, 4)[0]
    xml = vf_domain_xml(objects.Uuid.new(), str(vf), dom=DOM)
    # the VF is Nova's for release, so prepare never hands it out
    code, err, _ = run_hook(host, 'prepare', xml)
    assert code == 1
    assert ('0000:bd:00.4' in err and 'carved for Nova' in err), err
    assert state.LeaseStore(host.state_dir).leases() == []
    assert host.held(vf) == 0
    # nor any other VF of its GPU, which is Nova's
    other = vf_domain_xml(objects.Uuid.new(), str(vfs(L2, 9)[0]), dom=DOM)
    assert run_hook(host, 'prepare', other)[0] == 1
    # nor the GPU whole
    env = hook_env(host, {})
    assert env.carved.gpus == {L1, L2} and env.carved.vfs == {vf}
    from libvirt_gpu.devices.backends import base
    with pytest.raises(exception.GpuInUse) as e:
        env.pci.check(base.PgpuDevice(L2))
    assert 'carved for Nova' in str(e.value)


def test_a_damaged_record_is_reported_to_no_one_but_said(
        fast_tmp):
    # Placement and Cyborg are told nothing while the record cannot be
    # read (which GPUs are Nova's is not known): one line, what to do
    host = Host(fast_tmp, '')
    os.makedirs(host.state_dir, mode=0o700)
    with open(os.path.join(host.state_dir, 'nova-carved.json'), 'w') as f:
        f.write('{"version": 1')
    with pytest.raises(exception.StateError) as e:
        openstack_cmds.provider_tree(host.env(), HOST)
    assert str(e.value).endswith('; run `libvirt-gpu restore`: it moves the '
                                 'file aside and rebuilds it from the '
                                 'configuration')
    # the allocator holds every GPU that could be carved meanwhile
    assert host.env().carved.held_gpus == {L1, L2}
