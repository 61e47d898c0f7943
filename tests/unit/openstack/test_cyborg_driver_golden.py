"""Our Cyborg driver's objects against Cyborg 17's own nvidia_gpu_driver.

Two sources of Cyborg's own values, each compared field by field, JSON
strings byte for byte:

- ``tests/data/cyborg/cyborg-unit-tests.json``: Cyborg 17.0.0's own unit
  tests of its NVIDIA driver, a P100 passed through whole and a T4 sliced
  into vGPUs (``cyborg/tests/unit/accelerator/drivers/gpu/test_utils.py``,
  ``TestGPUDriverUtils.test_discover_gpus_report_pGPU`` and
  ``test_discover_gpus_report_vGPU``): their inputs (the ``lspci -nn -D``
  line, the host name, ``[gpu_devices]``, what their mocks answer for
  sysfs), what they assert, and every field of what Cyborg's driver returns
  under those mocks (``tests/data/cyborg/capture_unit_tests.py``).  A host
  with the same facts is simulated here, and ours must equal Cyborg's with
  no exception.
- ``tests/data/cyborg/golden.json``: what Cyborg's driver reported on each
  simulated host (``tests/tools/capture_cyborg_golden.py`` captured it, and
  says how to regenerate it).  Our driver reads the same hosts with the
  same configuration, and every object must be equal, except where
  Cyborg's driver is wrong; each such difference is named
  (``openstack/cyborg_objects.py``, docs/admin/cyborg.md) and checked to
  be what it says:

  - ``vf``: Cyborg reports every SR-IOV VF as a whole GPU of its own (its
    ``[gpu_devices]/filter_sriov_vfs`` is off by default); a VF is part of
    its physical GPU, never a device;
  - the GPU is reported, with Cyborg's own device fields, but with no
    deployable: ``not offered`` (a whole GPU with no IOMMU group, or with
    a device the host uses in its group:
    ``tests/data/cyborg/t4-grouped.json``), ``holds vgpus`` (a whole GPU
    that holds vGPUs now: Cyborg offers it as free, our own tree reserves
    it), ``total 0`` (an enabled type with no room left: Cyborg reports a
    deployable of 0 accelerators, an inventory Placement refuses);
  - ``model``: lspci names a GPU from pci.ids alone (``NVIDIA Corporation
    Device`` for one it does not know); libvirt, through udev's hardware
    database, may know it (the L40S here), and the name is then ours;
  - ``display traits``: with ``[gpu]/report_gpu_traits`` on, a vGPU
    deployable has os-traits GPU traits after Cyborg's two.

``libvirt-gpu discover --json`` prints the same records as the driver
reports (``test_discover_json_is_what_the_driver_reports``), and a wrong
value in any field of any record fails a test here
(``test_a_wrong_value_in_any_field_fails``).
"""

import json
import os
import re
import uuid as uuidlib

import pytest

from libvirt_gpu.openstack import cyborg_driver
from libvirt_gpu.devices import discovery
from libvirt_gpu.cmd import main as cli
from libvirt_gpu import objects
from libvirt_gpu.openstack import cyborg_objects
from libvirt_gpu.openstack.placement import model
from libvirt_gpu.util import records
from libvirt_gpu import simulator
from libvirt_gpu.devices import sysfs as sysfs_mod
from tests.doubles import kinds
from tests.doubles import layouts
from tests.doubles import paths

REPO = paths.ROOT
DATA = os.path.join(REPO, 'tests', 'data')
GOLDEN = os.path.join(DATA, 'cyborg', 'golden.json')
# Cyborg 17.0.0's own unit-test data (module doc).
UNIT_TESTS = os.path.join(DATA, 'cyborg', 'cyborg-unit-tests.json')
T4_DISCOVER = os.path.join(DATA, 'golden', 't4-discover.json')

with open(GOLDEN) as _f:
    CAPTURED = json.load(_f)
CASES = CAPTURED['cases']
with open(UNIT_TESTS) as _f:
    CYBORG_UNIT = json.load(_f)


def write_conf(path, root, node_xml, enabled, gpu_traits=False):
    lines = ['[DEFAULT]', 'sysfs_root = %s' % root,
             'state_dir = %s' % os.path.join(os.path.dirname(path), 'state'),
             '[libvirt]', 'connection_uri = test://%s' % node_xml,
             '[gpu]', 'nvml = off',
             'report_gpu_traits = %s' % str(gpu_traits).lower(),
             'enabled_vgpu_types = %s' % ', '.join(enabled),
             # the whole host is Cyborg's, as Cyborg's own driver reports it
             '[routes]', 'cyborg = all']
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
    """Cyborg's devices as ours must be, less the VFs, and which differ
    from Cyborg's: (devices, {reason: [address]})."""
    by_address = {str(g.address): g for g in gpus}
    kept, named = [], {}
    for device in case['devices']:
        address = address_of(device)
        type_id = next((t for t, a in case['enabled'].items()
                        if address in a), None)
        why = named_difference(by_address[address], device, type_id)
        if why is not None:
            named.setdefault(why, []).append(address)
        if why == 'vf':
            continue
        if why is not None:
            # the GPU is Cyborg's device, with nothing to offer
            device = dict(device, deployable_list=[])
        kept.append(cyborg_vgpu_class(device))
    return kept, named


def cyborg_vgpu_class(device):
    """Cyborg's ``device`` with the one difference every vGPU deployable
    of ours has: resource class CUSTOM_CYBORG_VGPU, not VGPU (a Nova-native
    request for VGPU must never find Cyborg's provider)."""
    deployables = []
    for dep in device['deployable_list']:
        attrs = [dict(a, value=cyborg_objects.CYBORG_VGPU_RC)
                 if a['key'] == 'rc' and a['value'] == 'VGPU' else a
                 for a in dep['attribute_list']]
        deployables.append(dict(dep, attribute_list=attrs))
    return dict(device, deployable_list=deployables)


def differences(got, want, path=''):
    """The paths at which ``got`` and ``want`` (plain data) differ, field
    by field: ``[0].deployable_list[0].num_accelerators``."""
    if isinstance(want, dict) and isinstance(got, dict):
        found = []
        for key in sorted(set(want) | set(got)):
            if key not in got or key not in want:
                found.append('%s.%s (missing)' % (path, key))
            else:
                found += differences(got[key], want[key],
                                     '%s.%s' % (path, key))
        return found
    if isinstance(want, list) and isinstance(got, list):
        if len(got) != len(want):
            return ['%s (%d items, not %d)' % (path, len(got), len(want))]
        found = []
        for i, (g, w) in enumerate(zip(got, want)):
            found += differences(g, w, '%s[%d]' % (path, i))
        return found
    if type(got) is not type(want) or got != want:
        return ['%s: %r, not %r' % (path, got, want)]
    return []


def sysfs_gpus(hosts, profile):
    root, _ = hosts(profile)
    return discovery.from_sysfs(sysfs_mod.Sysfs(root),
                                kinds=kinds.registered()).gpus


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
        assert differences(mine, cyborgs) == [], address_of(cyborgs)


def test_every_profile_is_captured():
    assert CAPTURED['cyborg'] == '17.0.0'
    assert {c['profile'] for c in CASES.values()} >= set(
        simulator.list_profiles())


def test_the_named_differences_happen(hosts):
    # Each difference is met on the captured hosts, so the comparison above
    # covers it: VFs (A100s, A16, L40S, H100, RTX PRO 6000), whole GPUs
    # that cannot be offered.
    left = {}
    for name, case in CASES.items():
        _, named = expected(case, sysfs_gpus(hosts, case['profile']))
        for why, addresses in named.items():
            left.setdefault(why, set()).update(
                '%s %s' % (name, a) for a in addresses)
    assert {a.split()[0] for a in left['vf']} == {
        'a100-pgpu', 'a16-pgpu', 'l40s-pgpu', 'a100-40gb-pgpu',
        'h100-80gb-pgpu', 'rtx-pro-6000-pgpu'}
    assert len(left['vf']) == 16 + 64 + 64 + 16 + 32 + 32
    assert left['not offered'] == {
        't4-grouped-pgpu 0000:3b:00.0',         # no IOMMU group
        't4-grouped-pgpu 0000:af:00.0'}         # a NIC in its group
    assert 't4-pgpu 0000:af:00.0' in left['holds vgpus']
    assert left['total 0'] == {'domain-vgpu 0001:01:00.0'}


def test_a_withheld_gpu_says_why(tmp_path, hosts):
    # The device is Cyborg's, its deployable is gone, and the reason is
    # the rule's own.
    root, _ = hosts('tests/data/cyborg/t4-grouped.json')
    gpus = discovery.from_sysfs(sysfs_mod.Sysfs(root),
                                kinds=kinds.registered()).gpus
    assert {str(a): w for a, w in cyborg_objects.withheld_gpus(
        gpus, {}).items()} == {
        str(g.address): 'not offered whole: %s' % model.pgpu_refusal(g)
        for g in gpus}


# -- Cyborg's own unit-test data ---------------------------------------------

_LSPCI = re.compile(  # Cyborg's _PCI_DEVICE_PATTERN, the fields used here
    r'(?P<address>\S+) (?P<class_name>.*?) \[(?P<class_id>[0-9a-f]{4})\]: '
    r'(?P<device_name>.*?) \[(?P<vendor_id>[0-9a-f]{4}):'
    r'(?P<device_id>[0-9a-f]{4})\]')
NVIDIA = 'NVIDIA Corporation'       # pci.ids' name of vendor 10de


def unit_case_profile(name, case):
    """A simulated host with the facts Cyborg's unit test gives its
    driver: the GPU of its lspci line (names split as pci.ids has them)
    and, for a vGPU test, the types, the type's name, its free count and
    its vGPUs that the test's mocks answer.  Facts the test does not give
    (IOMMU group, NUMA node, driver) are a plain host's."""
    line = _LSPCI.match(case['lspci']).groupdict()
    assert line['device_name'].startswith(NVIDIA + ' ')
    device = {'address': line['address'], 'vendor_id': line['vendor_id'],
              'vendor_name': NVIDIA, 'product_id': line['device_id'],
              'product_name': line['device_name'][len(NVIDIA) + 1:],
              'class_code': '0x%s00' % line['class_id'], 'driver': 'nvidia',
              'numa_node': 0, 'iommu_group': 1}
    profile = {'name': name, 'devices': [device]}
    if case['enabled']:
        facts = case['sysfs']
        (type_id,) = case['enabled']
        most = len(facts['devices']) + facts['available_instances']
        profile['type_catalogues'] = {'asked': [
            dict({'id': t, 'max_instance': most},
                 **({'name': facts['name']} if t == type_id else {}))
            for t in facts['mdev_supported_types']]}
        device['mdev_types'] = 'asked'
        device['mdevs'] = [
            {'uuid': '00000000-0000-4000-8000-%012d' % i, 'type_id': type_id}
            for i in range(len(facts['devices']))]
    return profile


@pytest.fixture(scope='module')
def unit_hosts(tmp_path_factory):
    """case name -> (sysfs root, node.xml) of Cyborg's unit-test hosts."""
    made = {}
    for name, case in CYBORG_UNIT['cases'].items():
        where = tmp_path_factory.mktemp(name)
        path = str(where / 'profile.json')
        with open(path, 'w') as f:
            json.dump(unit_case_profile(name, case), f)
        root = str(where / 'sys')
        made[name] = (root, simulator.write_host(
            simulator.load_profile(path), root))
    return made


def ours_on_unit_case(tmp_path, unit_hosts, name):
    case = CYBORG_UNIT['cases'][name]
    root, node_xml = unit_hosts[name]
    conf = write_conf(str(tmp_path / 'libvirt-gpu.conf'), root, node_xml,
                      case['enabled'])
    return [cyborg_objects.to_primitive(d) for d in
            cyborg_driver.discover_records(case['host'], conf)]


def test_cyborgs_unit_test_data_is_cyborg_17s():
    assert CYBORG_UNIT['cyborg'] == CAPTURED['cyborg'] == '17.0.0'
    assert sorted(CYBORG_UNIT['cases']) == ['p100-pgpu', 't4-vgpu']


@pytest.mark.parametrize('name', sorted(CYBORG_UNIT['cases']))
def test_equal_to_cyborgs_own_unit_tests(tmp_path, unit_hosts, name):
    case = CYBORG_UNIT['cases'][name]
    got = ours_on_unit_case(tmp_path, unit_hosts, name)
    # every field of every object, as Cyborg's driver returns them (but
    # the resource class of a vGPU: cyborg_vgpu_class)
    assert differences(got, [cyborg_vgpu_class(d)
                             for d in case['reported']]) == []
    # and what Cyborg's test asserts, checked as it checks it
    want = json.loads(json.dumps(case['expected']).replace(
        '"VGPU"', '"%s"' % cyborg_objects.CYBORG_VGPU_RC))
    (device,) = got
    dep, = device['deployable_list']
    mine = dict(
        device, std_board_info=json.loads(device['std_board_info']),
        vendor_board_info=json.loads(device['vendor_board_info']),
        deployable_list=[dict(
            dep, attach_handle_list=dep['attach_handle_list'][:1],
            attribute_list=sorted(dep['attribute_list'],
                                  key=lambda a: a['key']))])
    for field, value in want.items():
        assert differences(mine[field], value, field) == []


def test_cyborgs_p100_and_t4_values():
    # The values the issue found wrong, spelled out: lspci's vendor and
    # device names, lspci's class name, a PCI handle's four fields.
    p100 = CYBORG_UNIT['cases']['p100-pgpu']['reported'][0]
    t4 = CYBORG_UNIT['cases']['t4-vgpu']['reported'][0]
    assert p100['model'] == (
        'NVIDIA Corporation GP100GL [Tesla P100 PCIe 12GB]')
    assert t4['model'] == 'NVIDIA Corporation TU104GL [Tesla T4]'
    assert p100['std_board_info'] == (
        '{"product_id": "15f7", "controller": "3D controller"}')
    (handle,) = p100['deployable_list'][0]['attach_handle_list']
    assert handle == {'attach_type': 'PCI', 'in_use': False, 'attach_info':
                      '{"bus": "00", "device": "06", "domain": "0000", '
                      '"function": "0"}'}


RECORD_TYPES = (cyborg_objects.DriverDevice, cyborg_objects.DriverDeployable,
                cyborg_objects.DriverAttribute,
                cyborg_objects.DriverAttachHandle,
                cyborg_objects.DriverControlPathID)
FIELDS = [(cls.__name__, f.name) for cls in RECORD_TYPES
          for f in records.fields(cls)]


def wrong(value):
    """A value of the same type that is not ``value``."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, str):
        return value + ' '
    if isinstance(value, tuple):
        return value[:-1]
    if value is None:
        return 'NVIDIA'
    if records.is_record(value):            # one of its own fields
        first = records.fields(value)[0].name
        return records.replace(value, **{first: wrong(getattr(value, first))})
    raise AssertionError(value)


def test_every_field_is_mutated():
    assert len(FIELDS) == 8 + 5 + 2 + 3 + 2


@pytest.mark.parametrize('record,field', FIELDS)
def test_a_wrong_value_in_any_field_fails(tmp_path, unit_hosts, monkeypatch,
                                          record, field):
    # Every record of one type is built with a wrong value in one field:
    # the comparison with Cyborg's unit-test data catches it (on the P100,
    # a PCI handle; on the T4, MDEV handles).
    cls = getattr(cyborg_objects, record)

    def build(*args, **kwargs):
        made = cls(*args, **kwargs)
        return records.replace(made, **{field: wrong(getattr(made, field))})
    monkeypatch.setattr(cyborg_objects, record, build)
    found = []
    for name, case in sorted(CYBORG_UNIT['cases'].items()):
        found += differences(ours_on_unit_case(tmp_path, unit_hosts, name),
                             case['reported'])
    assert found, '%s.%s: a wrong value went unnoticed' % (record, field)


# -- discover --json is the driver's report -----------------------------------

def _cli_json(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out), err


@pytest.mark.parametrize('source', ['libvirt', 'sysfs'])
def test_discover_json_is_what_the_driver_reports(tmp_path, hosts, capsys,
                                                  source):
    # The T4 host of the golden files, af:00.0 sliced into GRID T4-2B
    # (tests/data/golden/t4.conf), display traits on (the default).
    root, node_xml = hosts('t4')
    conf = write_conf(str(tmp_path / 'libvirt-gpu.conf'), root, node_xml,
                      {'nvidia-223': ['0000:af:00.0']}, gpu_traits=True)
    reported = [cyborg_objects.to_primitive(d) for d in
                cyborg_driver.discover_records('sim-t4', conf)]
    argv = ['--config-file', conf, '--hostname', 'sim-t4']
    if source == 'sysfs':
        argv += ['--sysfs-root', root]
    printed, err = _cli_json(capsys, *argv, 'discover', '--json')
    assert 'source: %s' % source in err
    assert differences(printed, reported) == []
    with open(T4_DISCOVER) as f:
        assert differences(printed, json.load(f)) == []
    # what our objects hold is what Cyborg's (JSON) fields would hold
    assert [address_of(d) for d in printed] == ['0000:3b:00.0',
                                                '0000:af:00.0']


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
        cyborg_objects.CYBORG_VGPU_RC, 'OWNER_CYBORG',
        'CUSTOM_NVIDIA_1EB8_T4_2B']
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
    assert got[1] == cyborg_vgpu_class(CASES['t4-vgpu']['devices'][1])


def test_vendor_interface_vgpus_are_reported_with_nothing_to_offer(
        tmp_path, hosts, capsys, caplog):
    # L40S, vGPU 17+: nothing in Cyborg or Nova would set a VF's vGPU type,
    # and Nova would pass a VF from Cyborg managed: the GPU whose type is
    # enabled is Cyborg's device with no deployable, with a warning (the
    # driver) or a note (discover) that says why; its whole neighbour is
    # still offered.  discover --json says the same as the driver.
    gpus = sysfs_gpus(hosts, 'l40s')
    pf = [g for g in gpus if not g.is_vf and g.vf_gpus][0]
    type_id = next(t.id for vf in pf.vf_gpus for t in vf.vgpu_types)
    case = {'profile': 'l40s', 'hostname': 'compute-1',
            'enabled': {type_id: [str(pf.address)]}}
    with caplog.at_level('WARNING'):
        got = ours(tmp_path, hosts, case)
    by_address = {address_of(d): d for d in got}
    assert by_address[str(pf.address)]['deployable_list'] == []
    whole = [d for a, d in by_address.items() if a != str(pf.address)]
    assert [d['deployable_list'][0]['attribute_list'][0]['value']
            for d in whole] == ['PGPU']
    why = cyborg_objects.vendor_interface_refusal(
        pf, objects.EnabledType(type_id))
    assert 'vendor interface' in why and 'managed' in why
    assert '%s: reported to Cyborg with nothing to offer: %s' % (
        pf.address, why) in caplog.text
    root, node_xml = hosts('l40s')
    printed, err = _cli_json(capsys, '--config-file',
                             str(tmp_path / 'libvirt-gpu.conf'),
                             '--hostname', 'compute-1', 'discover', '--json')
    assert differences(printed, got) == []
    assert '%s: nothing offered to Cyborg: %s' % (pf.address, why) in err


def test_a_gpu_without_capacity_has_no_deployable_never_total_0(
        tmp_path, hosts):
    # mixed: the T4 at 3b:00.0 holds a GRID T4-2Q; T4-1B then has no room.
    case = {'profile': 'mixed', 'hostname': 'compute-1',
            'enabled': {'nvidia-223': ['0000:3b:00.0']}}
    got = {address_of(d): d for d in ours(tmp_path, hosts, case)}
    assert got['0000:3b:00.0']['deployable_list'] == []
    assert all(dep['num_accelerators'] > 0 for d in got.values()
               for dep in d['deployable_list'])


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
    root, node_xml = hosts(case['profile'])
    path = write_conf(str(tmp_path / 'libvirt-gpu.conf'), root, node_xml,
                      case['enabled'], gpu_traits=True)
    conf = conf_mod.load(path)
    gpus = discovery.from_sysfs(sysfs_mod.Sysfs(root),
                                kinds=kinds.registered()).gpus
    tree = model.build_tree(case['hostname'], gpus,
                            layouts.enabled(conf, gpus), True,
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
    # the one difference: Cyborg's vGPU providers are CUSTOM_CYBORG_VGPU
    # where our own route's are VGPU (cyborg_vgpu_class)
    rc = {'VGPU': cyborg_objects.CYBORG_VGPU_RC}
    from_tree = {c.name: (c.uuid, {rc.get(i.resource_class,
                                          i.resource_class): i.total
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


def test_one_cyborg_model():
    # openstack/cyborg_objects.py, beside the driver, is the one Cyborg
    # model: the look-alike (placement/cyborg.py, what discover printed)
    # is gone for good, and Placement's folder holds nothing of Cyborg's.
    openstack_dir = os.path.join(REPO, 'libvirt_gpu', 'openstack')
    assert sorted(n for n in os.listdir(openstack_dir)
                  if n.startswith('cyborg')) == ['cyborg_driver.py',
                                                 'cyborg_objects.py']
    assert [n for n in os.listdir(os.path.join(openstack_dir, 'placement'))
            if 'cyborg' in n] == []


def test_discover_text_names_every_device_and_why(tmp_path, hosts, capsys):
    # t4-grouped: two T4s that cannot be passed through whole: each is a
    # row with no deployable ('-'), and a note says why.
    root, node_xml = hosts('tests/data/cyborg/t4-grouped.json')
    conf = write_conf(str(tmp_path / 'libvirt-gpu.conf'), root, node_xml, {})
    code = cli.main(['--config-file', conf, '--hostname', 'h', 'discover'])
    out, err = capsys.readouterr()
    assert code == 0, err
    rows = [line.split() for line in out.splitlines()
            if re.fullmatch(r'0000:..:00\.0', line.split(' ')[0])]
    assert [(r[0], r[-4:]) for r in rows] == [
        ('0000:3b:00.0', ['-'] * 4), ('0000:af:00.0', ['-'] * 4)]
    notes = [line for line in out.splitlines() if 'nothing offered' in line]
    assert [n.split(':', 3)[:3] for n in notes] == [
        ['0000', '3b', '00.0'], ['0000', 'af', '00.0']]
    assert 'not offered whole: ' in notes[0]
