"""Our Cyborg driver's objects against Cyborg 17's own nvidia_gpu_driver.

``tests/data/cyborg/golden.json`` is what Cyborg's driver reported on each
simulated host (``tests/tools/capture_cyborg_golden.py`` captured it, and
says how to regenerate it).  Here, without Cyborg, our driver reads the
same hosts with the same configuration, and every object must be equal
field by field, JSON strings byte for byte, except where Cyborg's driver
is wrong; each such difference is named (docs/admin/cyborg.md, "What is
reported") and checked to be what it says:

- ``vf``: Cyborg reports every SR-IOV VF as a whole GPU of its own (its
  ``[gpu_devices]/filter_sriov_vfs`` is off by default); a VF is part of
  its physical GPU, never a device;
- ``not offered``: a whole GPU with no IOMMU group, or with a device the
  host uses in its group (``tests/data/cyborg/t4-grouped.json``): Cyborg
  offers it, we leave it out;
- ``holds vgpus``: a whole GPU that holds vGPUs now: Cyborg offers it as
  free, we leave it out (our own tree reserves it);
- ``total 0``: a GPU whose enabled type has no room left: Cyborg reports a
  deployable of 0 accelerators (an inventory Placement refuses), we leave
  it out;
- ``model``: lspci names a GPU from pci.ids alone (``NVIDIA Corporation
  Device`` for one it does not know); libvirt, through udev's hardware
  database, may know it (the L40S here), and the name is then ours;
- ``display traits``: with ``[gpu]/report_gpu_traits`` on, a vGPU
  deployable has os-traits GPU traits after Cyborg's two.
"""

import json
import os
import uuid as uuidlib

import pytest

from libvirt_gpu import cyborg_driver
from libvirt_gpu import discovery
from libvirt_gpu import objects
from libvirt_gpu.placement import cyborg_objects
from libvirt_gpu.placement import model
from libvirt_gpu import simulator
from libvirt_gpu import sysfs as sysfs_mod

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
GOLDEN = os.path.join(REPO, 'tests', 'data', 'cyborg', 'golden.json')

with open(GOLDEN) as _f:
    CAPTURED = json.load(_f)
CASES = CAPTURED['cases']


def write_conf(path, root, node_xml, enabled, gpu_traits=False):
    lines = ['[DEFAULT]', 'sysfs_root = %s' % root,
             'state_dir = %s' % os.path.join(os.path.dirname(path), 'state'),
             '[libvirt]', 'connection_uri = test://%s' % node_xml,
             '[gpu]', 'nvml = off',
             'report_gpu_traits = %s' % str(gpu_traits).lower(),
             'enabled_vgpu_types = %s' % ', '.join(enabled)]
    for type_id, addresses in enabled.items():
        lines += ['[vgpu_%s]' % type_id,
                  'device_addresses = %s' % ', '.join(addresses)]
    with open(path, 'w') as f:
        f.write('\n'.join(lines) + '\n')
    return path


@pytest.fixture(scope='module')
def hosts(tmp_path_factory):
    """profile -> (sysfs root, node.xml), written once per module."""
    made = {}

    def get(profile):
        if profile not in made:
            root = tmp_path_factory.mktemp(
                os.path.basename(profile).replace('.json', ''))
            path = profile
            if profile.endswith('.json'):     # test data, not bundled
                path = os.path.join(REPO, profile)
            made[profile] = (str(root), simulator.write_host(
                simulator.load_profile(path), root))
        return made[profile]
    return get


def ours(tmp_path, hosts, case, gpu_traits=False):
    root, node_xml = hosts(case['profile'])
    conf = write_conf(str(tmp_path / 'libvirt-gpu.conf'), root, node_xml,
                      case['enabled'], gpu_traits)
    found = cyborg_driver.discover_records(case['hostname'], conf)
    return [cyborg_objects.to_primitive(d) for d in found]


def address_of(device):
    info = json.loads(device['controlpath_id']['cpid_info'])
    return '%(domain)s:%(bus)s:%(device)s.%(function)s' % info


def named_difference(gpu, device, type_id):
    """Why Cyborg's ``device`` for ``gpu`` is not ours (None: it must be).
    ``type_id``: the vGPU type enabled on it, or None."""
    if gpu.is_vf:
        return 'vf'
    if type_id is None:
        if model.pgpu_refusal(gpu) is not None:
            return 'not offered'
        if model.holds_vgpus(gpu):
            return 'holds vgpus'
    elif device['deployable_list'][0]['num_accelerators'] == 0:
        # and our own capacity rule agrees there is no room
        assert model.vgpu_total(
            gpu, objects.EnabledType(type_id)) == 0
        return 'total 0'
    return None


def expected(case, gpus):
    """Cyborg's devices less the named differences: {reason: [addr]}."""
    by_address = {str(g.address): g for g in gpus}
    kept, left_out = [], {}
    for device in case['devices']:
        address = address_of(device)
        type_id = next((t for t, a in case['enabled'].items()
                        if address in a), None)
        why = named_difference(by_address[address], device, type_id)
        if why is None:
            kept.append(device)
        else:
            left_out.setdefault(why, []).append(address)
    return kept, left_out


def sysfs_gpus(hosts, profile):
    root, _ = hosts(profile)
    return discovery.from_sysfs(sysfs_mod.Sysfs(root)).gpus


@pytest.mark.parametrize('name', sorted(CASES))
def test_equal_to_cyborgs_driver_but_where_named(tmp_path, hosts, name):
    case = CASES[name]
    want, _ = expected(case, sysfs_gpus(hosts, case['profile']))
    got = ours(tmp_path, hosts, case)
    assert [address_of(d) for d in got] == [address_of(d) for d in want]
    for mine, cyborgs in zip(got, want):
        if mine['model'] != cyborgs['model']:
            # lspci names a GPU from pci.ids alone; libvirt (udev's hwdb)
            # knows newer GPUs (the L40S) that this pci.ids calls Device.
            assert cyborgs['model'] == 'NVIDIA Corporation Device'
            mine = dict(mine, model=cyborgs['model'])
        assert mine == cyborgs, address_of(cyborgs)


def test_every_profile_is_captured():
    assert CAPTURED['cyborg'] == '17.0.0'
    assert {c['profile'] for c in CASES.values()} >= set(
        simulator.list_profiles())


def test_the_named_differences_happen(hosts):
    # Each difference is met on the captured hosts, so the comparison above
    # covers it: VFs (A100, A16, L40S), whole GPUs that cannot be offered.
    left = {}
    for name, case in CASES.items():
        _, left_out = expected(case, sysfs_gpus(hosts, case['profile']))
        for why, addresses in left_out.items():
            left.setdefault(why, set()).update(
                '%s %s' % (name, a) for a in addresses)
    assert {a.split()[0] for a in left['vf']} == {
        'a100-pgpu', 'a16-pgpu', 'l40s-pgpu'}
    assert len(left['vf']) == 16 + 64 + 64
    assert left['not offered'] == {
        't4-grouped-pgpu 0000:3b:00.0',         # no IOMMU group
        't4-grouped-pgpu 0000:af:00.0'}         # a NIC in its group
    assert 't4-pgpu 0000:af:00.0' in left['holds vgpus']
    assert left['total 0'] == {'domain-vgpu 0001:01:00.0'}


def test_vgpus_as_cyborg_writes_them(tmp_path, hosts):
    # The T4 with GRID T4-2B: 8 MDEV handles (6 available + 2 existing),
    # traits in Cyborg's order; in_use always False.
    case = CASES['t4-vgpu']
    af = [d for d in ours(tmp_path, hosts, case)
          if address_of(d) == '0000:af:00.0'][0]
    dep = af['deployable_list'][0]
    assert dep['name'] == 'compute-1_0000:af:00.0'
    assert dep['num_accelerators'] == 8
    assert [a['value'] for a in dep['attribute_list']] == [
        'VGPU', 'OWNER_CYBORG', 'CUSTOM_NVIDIA_1EB8_T4_2B']
    assert [json.loads(h['attach_info'])['vgpu_mark']
            for h in dep['attach_handle_list']] == [
                'nvidia-223_%d' % i for i in range(8)]
    assert not any(h['in_use'] for h in dep['attach_handle_list'])


def test_display_traits_come_after_cyborgs(tmp_path, hosts):
    case = CASES['t4-vgpu']
    got = ours(tmp_path, hosts, case, gpu_traits=True)
    dep = got[1]['deployable_list'][0]
    assert [a['key'] for a in dep['attribute_list']] == [
        'rc', 'trait0', 'trait1', 'trait2']
    assert [a['value'] for a in dep['attribute_list']][1:] == [
        'OWNER_CYBORG', 'CUSTOM_NVIDIA_1EB8_T4_2B',
        'HW_GPU_MAX_DISPLAY_HEADS_4']
    # Everything else is Cyborg's.
    dep['attribute_list'] = dep['attribute_list'][:3]
    assert got[1] == CASES['t4-vgpu']['devices'][1]


def test_vendor_interface_vgpus_are_not_offered_to_cyborg(tmp_path, hosts):
    # L40S, vGPU 17+: nothing in Cyborg would set a VF's vGPU type, so the
    # GPU whose type is enabled is left out, with a warning; its whole
    # neighbour is still reported.
    gpus = sysfs_gpus(hosts, 'l40s')
    pf = [g for g in gpus if not g.is_vf and g.vf_gpus][0]
    type_id = next(t.id for vf in pf.vf_gpus for t in vf.vgpu_types)
    case = {'profile': 'l40s', 'hostname': 'compute-1',
            'enabled': {type_id: [str(pf.address)]}}
    got = ours(tmp_path, hosts, case)
    assert str(pf.address) not in [address_of(d) for d in got]
    assert got, 'the other L40S is still reported whole'
    why = cyborg_objects.vendor_interface_refusal(
        pf, objects.EnabledType(type_id))
    assert 'vendor interface' in why and str(pf.address) in why


def test_a_gpu_without_capacity_is_left_out_never_total_0(tmp_path, hosts):
    # mixed: the T4 at 3b:00.0 holds a GRID T4-2Q; T4-1B then has no room.
    case = {'profile': 'mixed', 'hostname': 'compute-1',
            'enabled': {'nvidia-223': ['0000:3b:00.0']}}
    got = ours(tmp_path, hosts, case)
    assert '0000:3b:00.0' not in [address_of(d) for d in got]
    assert all(d['deployable_list'][0]['num_accelerators'] > 0 for d in got)


def test_mdevs_on_vfs_get_one_handle_per_vf(tmp_path, hosts):
    # A16 (classic vGPU on SR-IOV VFs): Cyborg creates a handle's vGPU
    # under the address the handle names, so each handle names a VF that
    # lists the type, never the PF (which has no mdev_supported_types).
    gpus = sysfs_gpus(hosts, 'a16')
    pf = [g for g in gpus if str(g.address) == '0000:24:00.0'][0]
    type_id = pf.vf_gpus[0].mdev_types[0].id
    case = {'profile': 'a16', 'hostname': 'compute-1',
            'enabled': {type_id: [str(pf.address)]}}
    got = [d for d in ours(tmp_path, hosts, case)
           if address_of(d) == str(pf.address)][0]
    dep = got['deployable_list'][0]
    infos = [json.loads(h['attach_info'])
             for h in dep['attach_handle_list']]
    assert len(infos) == dep['num_accelerators'] > 1
    named = ['%(domain)s:%(bus)s:%(device)s.%(function)s' % i for i in infos]
    vfs = {str(vf.address): vf for vf in pf.vf_gpus}
    assert len(set(named)) == len(named)
    assert all(vfs[a].mdev_type(type_id) is not None for a in named)
    assert [i['vgpu_mark'] for i in infos] == [
        '%s_%d' % (type_id, n) for n in range(len(infos))]
    assert {h['attach_type'] for h in dep['attach_handle_list']} == {'MDEV'}


def _tree_and_records(tmp_path, hosts, case):
    from libvirt_gpu import conf as conf_mod
    from libvirt_gpu import enablement
    root, node_xml = hosts(case['profile'])
    path = write_conf(str(tmp_path / 'libvirt-gpu.conf'), root, node_xml,
                      case['enabled'], gpu_traits=True)
    conf = conf_mod.load(path)
    gpus = discovery.from_sysfs(sysfs_mod.Sysfs(root)).gpus
    tree = model.build_tree(case['hostname'], gpus,
                            enablement.resolve(conf, gpus), True,
                            conf.gpu.pgpu_vendor_ids)
    return tree, cyborg_driver.discover_records(case['hostname'], path)


@pytest.mark.parametrize('name', sorted(CASES))
def test_cyborgs_providers_are_our_own_trees(tmp_path, hosts, name):
    # What Cyborg's conductor makes of each deployable (provider
    # uuid3(NAMESPACE_DNS, name), inventory rc: num_accelerators, the
    # traits) is the child our own sync makes, on every captured host;
    # our tree says more only for a whole GPU holding vGPUs (reserved).
    tree, found = _tree_and_records(tmp_path, hosts, CASES[name])
    from_cyborg = {}
    for device in found:
        for dep in device.deployable_list:
            attrs = [a.value for a in dep.attribute_list]
            from_cyborg[dep.name] = (
                str(uuidlib.uuid3(uuidlib.NAMESPACE_DNS, dep.name)),
                {attrs[0]: dep.num_accelerators}, set(attrs[1:]))
    ours_only = {c.name for c in tree.children
                 if any(i.reserved for i in c.inventories)}
    from_tree = {c.name: (c.uuid, {i.resource_class: i.total
                                   for i in c.inventories}, set(c.traits))
                 for c in tree.children if c.name not in ours_only}
    assert from_cyborg == from_tree
    if name == 't4-pgpu':
        assert ours_only == {'compute-1_0000:af:00.0'}


def test_no_lspci_nor_any_other_program(tmp_path, hosts, monkeypatch):
    # Cyborg's driver parses `lspci -nn -D` (through privsep); ours reads
    # libvirt and sysfs and starts no program at all.
    import subprocess

    def refuse(*args, **kwargs):
        raise AssertionError('the driver started a program: %r' % (args,))
    for name in ('Popen', 'run', 'check_output', 'call'):
        monkeypatch.setattr(subprocess, name, refuse)
    monkeypatch.setattr(os, 'system', refuse)
    monkeypatch.setattr(os, 'fork', refuse)
    got = ours(tmp_path, hosts, CASES['t4-vgpu'])
    assert [address_of(d) for d in got] == ['0000:3b:00.0', '0000:af:00.0']
