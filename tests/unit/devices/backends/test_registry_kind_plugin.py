"""A vGPU kind is a plugin: the test-only toy kind (tests/doubles/
toy_kind.py, its own made-up sysfs interface) registered through an entry
point of a test-only distribution flows through ``list``, ``types``,
``placement show``, ``discover``, the hook's ``prepare``/``release`` and
``reconcile``, none of which names it; with the core of the contract only
(``toy_kind.ToyKind``), the hook and reconcile still drive it.

The host is the simulated L40S one whose second GPU's VFs trade NVIDIA's
vendor interface for the toy one (the test's stand-in for a driver).
"""

import io
import json
import os
import shutil
import sys

import pytest

from libvirt_gpu.devices.backends import base
from libvirt_gpu.devices import capabilities
from libvirt_gpu.devices.backends import registry
from libvirt_gpu.cmd import main
from libvirt_gpu.virt import config_xml
from libvirt_gpu import environment
from libvirt_gpu import exception
from libvirt_gpu.guests import hook
from libvirt_gpu.virt import host as host_mod
from libvirt_gpu import objects
from libvirt_gpu.guests import reconcile
from libvirt_gpu.host import restore
from libvirt_gpu import simulator
from libvirt_gpu.store import state
from libvirt_gpu.devices import sysfs as sysfs_mod
from tests.doubles import domains
from tests.doubles import fake_libvirt
from tests.doubles import kinds
from tests.doubles import tables
from tests.doubles import toy_kind
from tests.doubles import architecture

GPU = '0000:bd:00.0'
TOY_VFS = tuple(objects.PciAddress.parse(a) for a in (
    "0000:bd:00.4", "0000:bd:00.5", "0000:bd:00.6", "0000:bd:00.7"))
TYPE = objects.TypeId.parse('toy-1')
DOM = objects.Uuid.parse('c7a5fdbd-cdaf-9455-926a-d65c16db1809')


@pytest.fixture
def toy(tmp_path, monkeypatch):
    root = str(tmp_path / 'sys')
    simulator.write_sysfs(simulator.load_profile('l40s'), root)
    sysfs = sysfs_mod.Sysfs(root)
    for vf in sysfs.virtfns(GPU):
        shutil.rmtree(os.path.join(sysfs.pci_dir(vf), 'nvidia'))
    for vf in TOY_VFS:
        toy_kind.make_toy_vf(root, vf)
    # The one registration of a new kind: an entry point
    registration = kinds.register(monkeypatch, tmp_path / 'site', 'toy',
                                  toy_kind.SPEC)
    state_dir = str(tmp_path / 'state')
    config = str(tmp_path / 'libvirt-gpu.conf')
    with open(config, 'w') as f:
        f.write('[DEFAULT]\nsysfs_root = %s\nstate_dir = %s\n'
                '[gpu]\nenabled_vgpu_types = %s\n' % (root, state_dir, TYPE))
    return root, state_dir, config, registration


def cli(toy, capsys, *argv):
    root, _, config, _ = toy
    capsys.readouterr()
    rc = main.main(['--config-file', config, '--sysfs-root', root]
                   + list(argv))
    out = capsys.readouterr().out
    assert rc == 0, out
    return out


def test_list_and_types_show_the_toy_types(toy, capsys):
    gpus = {g['address']: g for g in json.loads(cli(toy, capsys, 'list',
                                                    '--json'))}
    assert (gpus[GPU]['mode'], gpus[GPU]['enabled_type']) == ('vgpu', TYPE)
    row = tables.row(cli(toy, capsys, 'list'), GPU)
    assert (row['ENABLED TYPE'], row['CAPACITY'], row['TYPES']) == \
        (TYPE, '4', '2')
    types = json.loads(cli(toy, capsys, 'types', '--json'))
    assert [(t['id'], t['name'], t['available_instances'])
            for t in types[GPU]] == [('toy-1', 'Toy-1G', 4),
                                     ('toy-2', 'Toy-2G', 2)]
    # the other GPU keeps NVIDIA's vendor types
    assert 'nvidia-1145' in [t['id'] for t in types['0000:3d:00.0']]


def test_placement_and_cyborg_views_count_the_toy_vfs(toy, capsys):
    tree = json.loads(cli(toy, capsys, 'placement', 'show', '--json'))
    by_name = {p['name']: p for p in tree['resource_providers']}
    toy_rp = by_name['vm_0000:bd:00.0']
    # the published maximum of toy-1 (4), on the GPU's four toy VFs
    assert toy_rp['inventories']['VGPU']['total'] == 4
    assert 'CUSTOM_NVIDIA_26B9_TOY_1G' in toy_rp['traits']
    # Cyborg's view: the toy GPU is a device with nothing to offer, as
    # any GPU whose vGPUs a vendor interface of its VFs makes
    report = json.loads(cli(toy, capsys, 'discover', '--json'))
    by_bus = {json.loads(d['controlpath_id']['cpid_info'])['bus']: d
              for d in report}
    assert by_bus['bd']['deployable_list'] == []


def test_without_its_registration_the_toy_kind_is_unseen(toy, capsys):
    """The proof above is the plugin's doing: the same host with the toy
    distribution uninstalled shows no toy type anywhere."""
    assert toy_kind.FullToyKind in kinds.registered()
    toy[3].uninstall()
    assert [cls.name for cls in kinds.registered()] == ['nvidia', 'mdev']
    types = json.loads(cli(toy, capsys, 'types', '--json'))
    assert all(not t['id'].startswith('toy-')
               for found in types.values() for t in found)


def _domain(uuid, vf):
    return ((
        "<domain type='kvm'><name>vm1</name><uuid>%s</uuid><metadata>"
        "<gpu:gpus xmlns:gpu='urn:libvirt-gpu:1'><gpu:vgpu uuid='%s' "
        "type='%s' parent='%s'/></gpu:gpus></metadata><devices>%s"
        "</devices></domain>")
        % (DOM, uuid, TYPE, vf, config_xml.pci_hostdev(vf, managed=False))
    ).encode()


def test_the_hook_creates_and_removes_a_toy_vgpu(toy):
    root, state_dir, config, _ = toy
    uuid = objects.Uuid.new()
    xml = _domain(uuid, TOY_VFS[1])
    sysfs = sysfs_mod.Sysfs(root)
    files = toy_kind.ToyFiles(sysfs)
    err = io.StringIO()
    assert hook.run(['qemu', 'vm1', 'prepare', 'begin', '-'], xml,
                    config_file=config, stderr=err,
                    mdevctl_dir=os.path.join(state_dir, 'mdevctl')) == 0, \
        err.getvalue()
    assert files.current(TOY_VFS[1]) == 1
    assert [(lease.vgpu_uuid, lease.parent) for lease in
            state.LeaseStore(state_dir).leases()] == [(uuid, TOY_VFS[1])]
    assert hook.run(['qemu', 'vm1', 'release', 'end', '-'], xml,
                    config_file=config, stderr=err,
                    mdevctl_dir=os.path.join(state_dir, 'mdevctl')) == 0
    assert files.current(TOY_VFS[1]) == 0
    assert state.LeaseStore(state_dir).leases() == []


def test_a_kind_of_the_core_only_is_driven_by_the_hook_and_reconcile(
        tmp_path, monkeypatch):
    """The capabilities are optional: the toy kind with the core of the
    contract only (``toy_kind.ToyKind``, no capability declared), on a
    GPU without SR-IOV (a T4 whose first GPU has the toy interface), is
    prepared and released by the hook and judged by reconcile.  (Discovery
    asks only kinds with ``VendorFunctions``, so it shows none of its
    types and the configuration cannot enable them: here the enabled
    types are given; and an SR-IOV GPU is counted as discovery reads its
    VFs, so a kind on VFs declares ``VendorFunctions``.)"""
    root = str(tmp_path / 'sys')
    simulator.write_sysfs(simulator.load_profile('t4'), root)
    gpu = objects.PciAddress.parse('0000:3b:00.0')
    toy_kind.make_toy_vf(root, gpu)
    kinds.register(monkeypatch, tmp_path / 'site', 'toy', toy_kind.CORE_SPEC)
    assert toy_kind.ToyKind in kinds.registered()
    assert base.VgpuKind.__abstractmethods__ <= set(
        toy_kind.ToyKind.__dict__)
    assert capabilities.declared(toy_kind.ToyKind) == ()
    conn = fake_libvirt.FakeConnection(str(tmp_path / 'doms'))
    conn.define(domains.tiny_domain_xml('vm1'), active=False)
    env = environment.Environment(
        str(tmp_path / 'state'), sysfs=sysfs_mod.Sysfs(root),
        host=host_mod.Host.from_connection(conn),
        mdevctl_dir=str(tmp_path / 'mdevctl'),
        enabled={gpu: objects.EnabledType(TYPE)})
    assert type(env.vgpus.kind('toy')) is toy_kind.ToyKind
    files = toy_kind.ToyFiles(env.sysfs)
    uuid = objects.Uuid.new()
    xml = _domain(uuid, gpu)
    operations = hook.Hook(env, hook.HookLog(
        ['qemu', 'vm1', 'prepare', 'begin'], io.StringIO()))
    assert operations.prepare(hook.parse_request('prepare', xml)) is None
    assert files.current(gpu) == 1
    assert env.vgpus.kind('toy').existing() == {uuid: (gpu, TYPE)}
    assert operations.release(hook.parse_request('release', xml)) is None
    assert files.current(gpu) == 0
    assert env.store.leases() == []
    # left behind by a guest that is gone: reconcile removes it
    assert operations.prepare(hook.parse_request('prepare', xml)) is None
    assert files.current(gpu) == 1
    report = reconcile.reconcile(env.replace())
    assert uuid in [f.uuid for f in report.findings]
    assert files.current(gpu) == 0
    assert env.store.leases() == []


def test_reconcile_removes_a_toy_vgpu_no_guest_uses(toy, tmp_path):
    root, state_dir, config, _ = toy
    uuid = objects.Uuid.new()
    xml = _domain(uuid, TOY_VFS[0])
    assert hook.run(['qemu', 'vm1', 'prepare', 'begin', '-'], xml,
                    config_file=config, stderr=io.StringIO(),
                    mdevctl_dir=str(tmp_path / 'mdevctl')) == 0
    conn = fake_libvirt.FakeConnection(str(tmp_path / 'doms'))
    conn.define(domains.tiny_domain_xml('vm1'), active=False)
    env = environment.Environment(state_dir, sysfs=sysfs_mod.Sysfs(root),
                                  host=host_mod.Host.from_connection(conn),
                                  mdevctl_dir=str(tmp_path / 'mdevctl'))
    report = reconcile.reconcile(env)
    assert uuid in [f.uuid for f in report.findings]
    assert toy_kind.ToyFiles(env.sysfs).current(TOY_VFS[0]) == 0
    assert env.store.leases() == []


def test_nothing_outside_the_toy_module_names_its_interface():
    assert architecture.names_outside_kinds(
        [toy_kind.FullToyKind]) == []


def test_restore_recreates_and_resets_toy_vgpus(toy, tmp_path):
    """After a reboot: the toy kind's persistent vGPU is created again on
    its VF, and a transient one whose guest no longer runs is reset."""
    root, state_dir, _, _ = toy
    sysfs = sysfs_mod.Sysfs(root)
    files = toy_kind.ToyFiles(sysfs)
    env = environment.Environment(state_dir, sysfs=sysfs,
                                  mdevctl_dir=str(tmp_path / 'mdevctl'))
    kind = env.vgpus.kind(toy_kind.INTERFACE)
    keep, stale = objects.Uuid.new(), objects.Uuid.new()
    kind.define(base.VgpuDevice(uuid=keep, parent=TOY_VFS[2],
                                type_id=TYPE), start='auto')
    kind.prepare(base.VgpuDevice(uuid=stale, parent=TOY_VFS[3],
                                 type_id=TYPE))
    assert (files.current(TOY_VFS[2]), files.current(TOY_VFS[3])) == (0, 1)
    report = restore.restore(env, owner_running=lambda uuid: False)
    done = {(a.action, a.target) for a in report.actions}
    assert {(restore.CREATED, keep), (restore.RESET, stale)} <= done
    assert (files.current(TOY_VFS[2]), files.current(TOY_VFS[3])) == (1, 0)
    # and the GPU its records mention is one whose VFs restore enables
    assert objects.PciAddress.parse(GPU) in kind.recorded_gpus()
    # a second run changes nothing
    again = restore.restore(env.replace(),
                            owner_running=lambda uuid: False)
    assert not [a for a in again.actions if a.action in restore.CHANGES]


def test_cyborg_is_not_offered_the_toy_vgpus(toy):
    # Our Cyborg driver offers vGPUs only as mdevs (Cyborg creates nothing
    # else): a new kind of the vendor-interface shape is reported with
    # nothing to offer, with its reason, without the driver naming it,
    # while our own tree offers it (above).  (The other L40S holds vGPUs:
    # not offered whole either.)
    from libvirt_gpu.openstack import cyborg_driver
    from libvirt_gpu.devices import discovery
    from libvirt_gpu.openstack import cyborg_objects
    root, _, config, _ = toy
    found = cyborg_driver.discover_records('vm', config)
    assert [d.deployable_list for d in found] == [(), ()]
    gpus = discovery.from_sysfs(sysfs_mod.Sysfs(root),
                                kinds=kinds.registered()).gpus
    toy_gpu = [g for g in gpus if str(g.address) == GPU][0]
    why = cyborg_objects.vendor_interface_refusal(
        toy_gpu, objects.EnabledType(TYPE))
    assert 'through the toy vendor interface' in why


# --- finding the kinds: entry points, kept as data (registry.installed) ----

def _scans(monkeypatch):
    """The calls of ``registry.scan`` from now on (each still made)."""
    calls = []
    real = registry.scan

    def counted():
        calls.append(1)
        return real()
    monkeypatch.setattr(registry, 'scan', counted)
    return calls


def test_the_kinds_are_read_once_and_kept_beside_the_snapshot(
        tmp_path, monkeypatch):
    cache = tmp_path / 'cache'
    monkeypatch.setenv('LIBVIRT_GPU_CACHE_DIR', str(cache))
    monkeypatch.setattr(registry, '_installed', {})
    scans = _scans(monkeypatch)
    builtin = (('nvidia', 'libvirt_gpu.devices.backends.nvidia_vgpu:'
                'NvidiaVgpuBackend'),
               ('mdev', 'libvirt_gpu.devices.backends.mdev:MdevBackend'))
    assert registry.installed() == builtin and len(scans) == 1
    kept = cache / registry.CACHE_NAME
    assert oct(kept.stat().st_mode & 0o777) == '0o600'
    assert json.loads(kept.read_text())['kinds'] == [list(p) for p in builtin]
    # this process keeps them, and a new one reads the cache file
    assert registry.installed() == builtin and len(scans) == 1
    monkeypatch.setattr(registry, '_installed', {})
    assert registry.installed() == builtin and len(scans) == 1
    # a package installed on the import path: read again, and kept
    kinds.register(monkeypatch, tmp_path / 'site', 'toy', toy_kind.SPEC)
    assert [name for name, _ in registry.installed()] == [
        'nvidia', 'toy', 'mdev'] and len(scans) == 2
    monkeypatch.setattr(registry, '_installed', {})
    assert len(registry.installed()) == 3 and len(scans) == 2


@pytest.mark.parametrize('spoil', ['others-write', 'damaged', 'link'])
def test_a_cache_file_others_steer_or_that_is_damaged_is_not_used(
        tmp_path, monkeypatch, spoil):
    cache = tmp_path / 'cache'
    monkeypatch.setenv('LIBVIRT_GPU_CACHE_DIR', str(cache))
    monkeypatch.setattr(registry, '_installed', {})
    registry.installed()
    kept = cache / registry.CACHE_NAME
    data = json.loads(kept.read_text())
    data['kinds'].insert(0, ['evil', 'os:system'])
    if spoil == 'others-write':
        kept.write_text(json.dumps(data))
        kept.chmod(0o622)
    elif spoil == 'damaged':
        kept.write_text('{"version": 1, "path": ')
    else:
        other = tmp_path / 'elsewhere.json'
        other.write_text(json.dumps(data))
        kept.unlink()
        kept.symlink_to(other)
    monkeypatch.setattr(registry, '_installed', {})
    scans = _scans(monkeypatch)
    assert [name for name, _ in registry.installed()] == ['nvidia', 'mdev']
    assert len(scans) == 1


def test_the_kinds_are_asked_by_name_and_the_fallback_last():
    assert registry.ordered([('mdev', 'm:M'), ('zeta', 'z:Z'),
                             ('alpha', 'a:A'), ('alpha', 'a:A')]) == (
        ('alpha', 'a:A'), ('zeta', 'z:Z'), ('mdev', 'm:M'))
    with pytest.raises(exception.ConfigError) as e:
        registry.ordered([('toy', 'a:A'), ('toy', 'b:B')])
    assert str(e.value) == (
        "Configuration error: two vGPU kinds are named 'toy' (a:A and b:B, "
        "entry points of libvirt_gpu.vgpu_kinds): uninstall one")


def test_a_kind_that_cannot_be_loaded_or_none_at_all_says_what_to_do(
        tmp_path, monkeypatch):
    with pytest.raises(exception.ConfigError) as e:
        registry.load_kind('tests.doubles.no_such_kind:Kind')
    assert str(e.value) == (
        "Configuration error: the vGPU kind tests.doubles.no_such_kind:Kind "
        "cannot be loaded (No module named 'tests.doubles.no_such_kind'); "
        "reinstall the package that declares it, or uninstall it")
    monkeypatch.setattr(registry, '_installed', {})
    monkeypatch.setattr(registry, 'scan', lambda: ())
    monkeypatch.setenv('LIBVIRT_GPU_CACHE_DIR', '')
    with pytest.raises(exception.ConfigError) as e:
        registry.installed()
    assert str(e.value) == (
        'Configuration error: no vGPU kind is installed (no entry point of '
        'libvirt_gpu.vgpu_kinds): reinstall libvirt-gpu')


def test_a_record_holds_while_the_readers_import_path_is_unchanged(
        tmp_path, monkeypatch):
    """The qemu hook takes the kinds from its settings snapshot, written
    by the installing command, whose import path holds more: each of the
    hook's directories must be in it, unchanged."""
    monkeypatch.setattr(registry, '_installed', {})
    extra = tmp_path / 'extra'
    extra.mkdir()
    monkeypatch.syspath_prepend(str(extra))
    kept = registry.record((('toy', toy_kind.SPEC), ('mdev', 'm:M')))
    monkeypatch.setattr('sys.path', [p for p in sys.path if p != str(extra)])
    assert registry.remember(kept)
    assert registry.installed() == (('toy', toy_kind.SPEC), ('mdev', 'm:M'))
    # a directory the record does not know, or one changed since
    monkeypatch.setattr(registry, '_installed', {})
    other = tmp_path / 'other'
    other.mkdir()
    monkeypatch.syspath_prepend(str(other))
    assert not registry.remember(kept)
    kept = registry.record((('mdev', 'm:M'),))
    (other / 'pkg-0.dist-info').mkdir()
    assert not registry.remember(kept)
    for spoiled in (None, [], {'version': 2}, dict(kept, kinds=[['a']])):
        assert not registry.remember(spoiled)
    assert registry._installed == {}


def test_discovery_reads_the_interface_only_of_a_kind_that_declares_it(
        toy):
    from libvirt_gpu.devices import discovery
    sysfs = sysfs_mod.Sysfs(toy[0])

    def interfaces(kind):
        gpus = discovery.from_sysfs(sysfs, kinds=(kind,)).gpus
        return {g.address: g.vendor_vf.interface for g in gpus
                if g.vendor_vf is not None}
    assert interfaces(toy_kind.FullToyKind) == {
        vf: toy_kind.INTERFACE for vf in TOY_VFS}
    assert interfaces(toy_kind.ToyKind) == {}
