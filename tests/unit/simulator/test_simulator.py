"""Simulated hosts: profiles, the sysfs tree, node XML, the capacity rule."""

import json
import os
import xml.etree.ElementTree as ET

import pytest

from libvirt_gpu import exception
from libvirt_gpu import simulator
from libvirt_gpu.simulator import nodexml
from libvirt_gpu.simulator import sysfs_tree

T4_PARENT = '0000:af:00.0'
T4_DIR = 'devices/pci0000:ae/0000:ae:00.0/0000:af:00.0'
T4_MDEVS = ('4b20d080-1b54-4048-85b3-a6a62d165c01',
            'b1ae8bf6-38b0-4c81-9d44-78ce3f520496')
NODEDEV_RNG = '/usr/share/libvirt/schemas/nodedev.rng'


@pytest.fixture(scope='module')
def t4():
    return simulator.load_profile('t4')


@pytest.fixture(scope='module')
def t4_root(tmp_path_factory, t4):
    root = tmp_path_factory.mktemp('t4') / 'sys'
    simulator.write_host(t4, root)
    return root


def _read(path):
    with open(path) as f:
        return f.read()


def _minimal(**overrides):
    """A one-GPU profile document to break in validation tests."""
    device = {
        'address': '0000:af:00.0', 'vendor_id': '10de', 'product_id': '1eb8',
        'class_code': '0x030200', 'driver': 'nvidia', 'mdev_types': 'cat',
    }
    device.update(overrides.pop('device', {}))
    doc = {
        'name': 'mini',
        'type_catalogues': {'cat': [
            {'id': 'nvidia-223', 'name': 'GRID T4-2B', 'max_instance': 8}]},
        'devices': [device],
    }
    doc.update(overrides)
    return doc


def _load_doc(tmp_path, doc):
    path = tmp_path / 'p.json'
    path.write_text(json.dumps(doc))
    return simulator.load_profile(str(path))


# --- profiles -----------------------------------------------------------

def test_bundled_profiles_listed_and_load():
    names = simulator.list_profiles()
    assert names == sorted(names)
    assert {'t4', 'mixed', 'domain'} <= set(names)
    for name in names:
        assert simulator.load_profile(name).name == name


def test_t4_profile_content(t4):
    assert [d.address for d in t4.devices] == ['0000:3b:00.0', T4_PARENT]
    gpu = t4.device(T4_PARENT)
    assert (gpu.vendor_id, gpu.product_id, gpu.class_code) == (
        '10de', '1eb8', '0x030200')
    assert gpu.product_name == 'TU104GL [Tesla T4]'
    assert (gpu.driver, gpu.numa_node, gpu.iommu_group) == ('nvidia', 1, 58)
    assert gpu.parent_bridge == '0000:ae:00.0'
    assert len(gpu.mdev_types) == 17
    assert gpu.mdev_type('nvidia-223').name == 'GRID T4-2B'
    assert gpu.mdev_type('nvidia-223').description == (
        'num_heads=4, frl_config=45, framebuffer=2048M, '
        'max_resolution=5120x2880, max_instance=8')
    assert gpu.mdev_type('nvidia-225').description.startswith(
        'num_heads=1, frl_config=60, framebuffer=1024M, '
        'max_resolution=1280x1024')
    assert gpu.mdev_type('nvidia-321').max_instance == 1
    assert [m.type_id for m in gpu.mdevs] == ['nvidia-223', 'nvidia-223']
    assert tuple(m.uuid for m in gpu.mdevs) == T4_MDEVS
    assert t4.no_capacity_errno == 'EINVAL'


def test_mixed_profile_content():
    mixed = simulator.load_profile('mixed')
    by_class = {d.class_code for d in mixed.devices}
    assert {'0x030200', '0x030000', '0x020000'} <= by_class
    drivers = {d.driver for d in mixed.devices}
    assert {'nvidia', 'vfio-pci', None} <= drivers
    nic = mixed.device('0000:18:00.0')
    assert (nic.vendor_id, nic.product_id) == ('8086', '1572')
    nameless = [t for d in mixed.devices for t in d.mdev_types
                if t.name is None and t.description is None]
    assert [t.id for t in nameless] == ['nvidia-319']
    vfio = [d for d in mixed.devices if d.driver == 'vfio-pci']
    assert all(not d.mdev_types for d in vfio)


def test_domain_profile_has_nonzero_domain():
    domain = simulator.load_profile('domain')
    assert any(d.pci_address.domain != 0 for d in domain.devices)


def test_load_profile_by_path(tmp_path):
    profile = _load_doc(tmp_path, _minimal())
    assert profile.name == 'mini'
    assert profile.hostname == 'sim-mini'
    assert profile.device('0000:af:00.0').mdev_types[0].max_instance == 8


@pytest.mark.parametrize('doc, message', [
    (_minimal(device={'address': '0000:AF:00'}), 'not a PCI address'),
    (_minimal(device={'vendor_id': 'nvidia'}), '4-digit hex'),
    (_minimal(device={'class_code': '3D'}), 'class_code'),
    (_minimal(device={'mdev_types': 'nope'}), "catalogue 'nope'"),
    (_minimal(device={'colour': 'green'}), "unknown key(s) 'colour'"),
    (_minimal(device={'numa_node': -2}), "'numa_node' must be an integer"),
    (_minimal(device={'mdevs': [{'uuid': 'xyz', 'type_id': 'nvidia-223'}]}),
     'not a UUID'),
    (_minimal(device={'mdevs': [
        {'uuid': '4b20d080-1b54-4048-85b3-a6a62d165c01',
         'type_id': 'nvidia-999'}]}), "type 'nvidia-999' is not one"),
    (_minimal(device={'mdevs': [
        {'uuid': '4b20d080-1b54-4048-85b3-a6a62d165c0%d' % i,
         'type_id': 'nvidia-223'} for i in range(9)]}),
     'exceed what the GPU can hold'),
    (_minimal(device={'virtfns': ['0000:af:00.4']}), 'no "sriov_totalvfs"'),
    (_minimal(device={'virtfns': ['0000:af:00.4'], 'sriov_totalvfs': 4}),
     'lists VF 0000:af:00.4'),
    (_minimal(device={'physfn': '0000:3b:00.0'}), 'names physfn'),
    (_minimal(no_capacity_errno='ENOSUCH'), 'errno name'),
    (_minimal(devices=[]), 'non-empty list'),
    (_minimal(type_catalogues={'cat': [
        {'id': 'nvidia-223', 'max_instance': 8,
         'description': 'num_heads=4, max_instance=4'}]}),
     'description says max_instance=4'),
    ({'devices': []}, "lacks 'name'"),
])
def test_profile_validation_errors(tmp_path, doc, message):
    with pytest.raises(exception.SimulatorError) as info:
        _load_doc(tmp_path, doc)
    assert message in str(info.value)
    assert str(tmp_path / 'p.json') in str(info.value)


def test_duplicate_address_and_uuid_refused(tmp_path):
    doc = _minimal()
    doc['devices'].append(dict(doc['devices'][0]))
    with pytest.raises(exception.SimulatorError, match='listed twice'):
        _load_doc(tmp_path, doc)
    uuid = '4b20d080-1b54-4048-85b3-a6a62d165c01'
    doc['devices'][1]['address'] = '0000:3b:00.0'
    for dev in doc['devices']:
        dev['mdevs'] = [{'uuid': uuid, 'type_id': 'nvidia-223'}]
    with pytest.raises(exception.SimulatorError, match='EEXIST'):
        _load_doc(tmp_path, doc)


def test_load_profile_missing_and_bad_json(tmp_path):
    with pytest.raises(exception.SimulatorError, match='no bundled profile'):
        simulator.load_profile('no-such-profile')
    bad = tmp_path / 'bad.json'
    bad.write_text('{"name": ')
    with pytest.raises(exception.SimulatorError, match='not valid JSON'):
        simulator.load_profile(str(bad))
    with pytest.raises(exception.SimulatorError, match='cannot read'):
        simulator.load_profile(str(tmp_path / 'absent.json'))


# --- capacity -------------------------------------------------------------

def test_capacity_rule(t4):
    gpu = t4.device(T4_PARENT)
    two = gpu.mdevs
    assert simulator.available_instances(gpu, 'nvidia-223', ()) == 8
    assert simulator.available_instances(gpu, 'nvidia-223', two) == 6
    # another type cannot join a GPU that already runs nvidia-223
    assert simulator.available_instances(gpu, 'nvidia-222', two) == 0
    assert simulator.available_instances(gpu, 'nvidia-234', ()) == 1
    full = [('%032x' % i, 'nvidia-234') for i in range(1)]
    assert simulator.available_instances(gpu, 'nvidia-234', full) == 0
    over = [('u%d' % i, 'nvidia-223') for i in range(9)]
    assert simulator.available_instances(gpu, 'nvidia-223', over) == 0
    with pytest.raises(exception.SimulatorError, match='does not offer'):
        simulator.available_instances(gpu, 'nvidia-999', ())


# --- sysfs tree -----------------------------------------------------------

def test_sysfs_device_files(t4_root):
    dev = t4_root / T4_DIR
    assert _read(dev / 'vendor') == '0x10de\n'
    assert _read(dev / 'device') == '0x1eb8\n'
    assert _read(dev / 'class') == '0x030200\n'
    assert _read(dev / 'subsystem_vendor') == '0x10de\n'
    assert _read(dev / 'subsystem_device') == '0x12a2\n'
    assert _read(dev / 'numa_node') == '1\n'
    assert _read(dev / 'driver_override') == '(null)\n'
    assert _read(dev / 'uevent').splitlines() == [
        'DRIVER=nvidia', 'PCI_CLASS=30200', 'PCI_ID=10DE:1EB8',
        'PCI_SUBSYS_ID=10DE:12A2', 'PCI_SLOT_NAME=0000:af:00.0',
        'MODALIAS=pci:v000010DEd00001EB8sv000010DEsd000012A2bc03sc02i00']


def test_sysfs_pci_links(t4_root):
    dev = t4_root / T4_DIR
    assert os.readlink(dev / 'driver') == '../../../../bus/pci/drivers/nvidia'
    assert os.readlink(dev / 'iommu_group') == (
        '../../../../kernel/iommu_groups/58')
    assert os.readlink(dev / 'subsystem') == '../../../../bus/pci'
    assert os.path.realpath(t4_root / 'bus/pci/devices' / T4_PARENT) == \
        os.path.realpath(dev)
    assert os.path.realpath(
        t4_root / 'bus/pci/drivers/nvidia' / T4_PARENT) == str(dev)
    assert os.path.realpath(
        t4_root / 'kernel/iommu_groups/58/devices' / T4_PARENT) == str(dev)
    assert os.path.realpath(t4_root / 'class/mdev_bus' / T4_PARENT) == \
        str(dev)
    # the implied root port is a PCI device too, one level up
    bridge = t4_root / 'bus/pci/devices/0000:ae:00.0'
    assert _read(bridge / 'class') == '0x060400\n'
    assert os.readlink(bridge / 'subsystem') == '../../../bus/pci'


def test_sysfs_no_dangling_links(t4_root):
    links = []
    for dirpath, dirnames, filenames in os.walk(t4_root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            if os.path.islink(path):
                links.append(path)
                assert os.path.exists(path), path
                assert os.path.realpath(path).startswith(str(t4_root) + '/')
                assert not os.path.isabs(os.readlink(path))
    assert len(links) > 30


def test_sysfs_mdev_types(t4_root):
    types = t4_root / T4_DIR / 'mdev_supported_types'
    assert len(os.listdir(types)) == 17
    t223 = types / 'nvidia-223'
    assert _read(t223 / 'name') == 'GRID T4-2B\n'
    assert _read(t223 / 'device_api') == 'vfio-pci\n'
    assert _read(t223 / 'available_instances') == '6\n'
    assert _read(types / 'nvidia-222/available_instances') == '0\n'
    assert (t223 / 'create').is_file()
    assert (t223 / 'create').stat().st_mode & 0o777 == 0o200
    assert sorted(os.listdir(t223 / 'devices')) == list(T4_MDEVS)
    other = t4_root / 'devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0'
    assert _read(other / 'mdev_supported_types/nvidia-222/'
                 'available_instances') == '16\n'


def test_sysfs_mdevs(t4_root, t4):
    groups = t4.mdev_iommu_groups()
    for uuid in T4_MDEVS:
        mdev = t4_root / T4_DIR / uuid
        assert os.readlink(mdev / 'mdev_type') == (
            '../mdev_supported_types/nvidia-223')
        assert os.readlink(mdev / 'subsystem') == '../../../../../bus/mdev'
        assert os.readlink(mdev / 'iommu_group') == (
            '../../../../../kernel/iommu_groups/%d' % groups[uuid])
        assert _read(mdev / 'uevent') == 'MDEV_TYPE=nvidia-223\n'
        assert (mdev / 'remove').is_file()
        assert os.path.realpath(t4_root / 'bus/mdev/devices' / uuid) == \
            str(mdev)
        assert os.path.realpath(
            t4_root / T4_DIR / 'mdev_supported_types/nvidia-223/devices' /
            uuid) == str(mdev)
    # each mdev has its own fresh group, above every PCI device's
    assert len(set(groups.values())) == 2
    assert min(groups.values()) > 58


def test_sysfs_no_driver_and_nameless_type(tmp_path):
    mixed = simulator.load_profile('mixed')
    root = tmp_path / 'sys'
    simulator.write_sysfs(mixed, root)
    v100 = root / 'bus/pci/devices/0000:5e:00.0'
    assert not os.path.lexists(v100 / 'driver')
    assert 'DRIVER=' not in _read(v100 / 'uevent')
    vfio = root / 'bus/pci/devices/0000:86:00.0'
    assert os.readlink(vfio / 'driver') == (
        '../../../../bus/pci/drivers/vfio-pci')
    assert not (vfio / 'mdev_supported_types').exists()
    assert sorted(os.listdir(root / 'class/mdev_bus')) == ['0000:3b:00.0']
    nameless = root / 'class/mdev_bus/0000:3b:00.0/mdev_supported_types/' \
        'nvidia-319'
    assert sorted(os.listdir(nameless)) == [
        'available_instances', 'create', 'device_api', 'devices']
    # the VGA function and its audio function share IOMMU group 70
    assert sorted(os.listdir(root / 'kernel/iommu_groups/70/devices')) == [
        '0000:d8:00.0', '0000:d8:00.1']


def test_sysfs_nonzero_domain(tmp_path):
    root = tmp_path / 'sys'
    simulator.write_sysfs(simulator.load_profile('domain'), root)
    dev = root / 'devices/pci0001:00/0001:00:00.0/0001:01:00.0'
    assert os.path.realpath(root / 'bus/pci/devices/0001:01:00.0') == str(dev)
    assert 'PCI_SLOT_NAME=0001:01:00.0' in _read(dev / 'uevent')


def test_sysfs_sriov_links(tmp_path):
    profile = simulator.synthetic_profile(12, types=2)
    root = tmp_path / 'sys'
    simulator.write_sysfs(profile, root)
    pf = profile.devices[0]
    assert pf.virtfns
    pfdir = root / 'bus/pci/devices' / pf.address
    assert _read(pfdir / 'sriov_totalvfs') == '32\n'
    assert _read(pfdir / 'sriov_numvfs') == '%d\n' % len(pf.virtfns)
    for i, vf in enumerate(pf.virtfns):
        assert os.readlink(pfdir / ('virtfn%d' % i)) == '../' + vf
        vfdir = root / 'bus/pci/devices' / vf
        assert os.path.realpath(vfdir / 'physfn') == os.path.realpath(pfdir)
        assert (vfdir / 'mdev_supported_types/nvidia-500').is_dir()
    assert not (pfdir / 'mdev_supported_types').exists()


def test_write_sysfs_refuses_foreign_root_and_rewrites_own(tmp_path, t4):
    foreign = tmp_path / 'home'
    foreign.mkdir()
    (foreign / 'precious').write_text('keep me')
    with pytest.raises(exception.SimulatorError, match='not empty'):
        simulator.write_sysfs(t4, foreign)
    assert (foreign / 'precious').read_text() == 'keep me'

    root = tmp_path / 'sys'
    simulator.write_sysfs(t4, root)
    simulator.write_sysfs(simulator.load_profile('domain'), root)
    assert (root / 'bus/pci/devices/0001:01:00.0').exists()
    assert not os.path.lexists(root / 'bus/pci/devices/0000:af:00.0')

    a_file = tmp_path / 'file'
    a_file.write_text('')
    with pytest.raises(exception.SimulatorError, match='not a directory'):
        simulator.write_sysfs(t4, a_file)


# --- node XML -------------------------------------------------------------

def _devices(xml):
    return {d.findtext('name'): d for d in ET.fromstring(xml)}


def test_node_xml_fields(t4):
    devices = _devices(simulator.node_xml(t4))
    gpu = devices['pci_0000_af_00_0']
    assert gpu.findtext('parent') == 'pci_0000_ae_00_0'
    assert gpu.findtext('driver/name') == 'nvidia'
    cap = gpu.find("capability[@type='pci']")
    assert [cap.findtext(t) for t in ('class', 'domain', 'bus', 'slot',
                                      'function')] == [
        '0x030200', '0', '175', '0', '0']
    assert cap.find('product').attrib == {'id': '0x1eb8'}
    assert cap.findtext('vendor') == 'NVIDIA Corporation'
    types = cap.findall("capability[@type='mdev_types']/type")
    assert len(types) == 17
    t223 = cap.find("capability[@type='mdev_types']/type[@id='nvidia-223']")
    assert t223.findtext('name') == 'GRID T4-2B'
    assert t223.findtext('deviceAPI') == 'vfio-pci'
    assert t223.findtext('availableInstances') == '6'
    assert cap.find('iommuGroup').get('number') == '58'
    assert cap.find('iommuGroup/address').attrib == {
        'domain': '0x0000', 'bus': '0xaf', 'slot': '0x00', 'function': '0x0'}
    assert cap.find('numa').get('node') == '1'
    mdev = devices[nodexml.mdev_name(T4_MDEVS[0])]
    assert mdev.findtext('name') == \
        'mdev_4b20d080_1b54_4048_85b3_a6a62d165c01'
    assert mdev.findtext('parent') == 'pci_0000_af_00_0'
    assert mdev.find("capability[@type='mdev']/type").get('id') == \
        'nvidia-223'
    assert mdev.findtext("capability[@type='mdev']/uuid") == T4_MDEVS[0]
    assert devices['pci_0000_ae_00_0'].findtext('parent') == 'computer'


def test_node_xml_mixed_omissions():
    devices = _devices(simulator.node_xml(simulator.load_profile('mixed')))
    assert 'pci_0000_18_00_0' in devices   # the NIC is a node device too
    v100 = devices['pci_0000_5e_00_0']
    assert v100.find('driver') is None
    assert v100.find(".//capability[@type='mdev_types']") is None
    t4 = devices['pci_0000_3b_00_0']
    nameless = t4.find(".//type[@id='nvidia-319']")
    assert nameless.find('name') is None
    assert nameless.findtext('availableInstances') == '0'
    group = devices['pci_0000_d8_00_0'].findall('.//iommuGroup/address')
    assert [a.get('function') for a in group] == ['0x0', '0x1']


def test_node_xml_sriov_and_synthetic_sizes():
    small = simulator.synthetic_profile(4, types=3)
    assert len(small.devices) == 4
    assert all(len(d.mdev_types) == 3 and not d.virtfns
               for d in small.devices)
    big = simulator.synthetic_profile(256)
    parents = [d for d in big.devices if d.mdev_types]
    pfs = [d for d in big.devices if d.virtfns]
    assert len(parents) == 256 and len(pfs) == 8
    assert all(len(pf.virtfns) == 32 for pf in pfs)
    assert all(len(p.mdev_types) == 20 for p in parents)
    assert all(p.physfn is not None for p in parents)
    assert all(t.max_instance == 1 for t in parents[0].mdev_types)
    assert sum(len(p.mdevs) for p in parents) == 64
    odd = simulator.synthetic_profile(13, types=1)
    assert len([d for d in odd.devices if d.physfn]) == 13
    devices = _devices(simulator.node_xml(odd))
    pf = odd.devices[0]
    vfs = devices[pf.libvirt_name].find(
        "capability/capability[@type='virt_functions']")
    assert vfs.get('maxCount') == '32'
    assert len(vfs.findall('address')) == len(pf.virtfns) == 2
    vf = devices[odd.device(pf.virtfns[0]).libvirt_name]
    assert vf.find("capability/capability[@type='phys_function']/address"
                   ).get('bus') == '0x%02x' % pf.pci_address.bus
    with pytest.raises(exception.SimulatorError):
        simulator.synthetic_profile(0)


PROFILES = ['t4', 'mixed', 'domain', 'synthetic']


def _profile(name):
    if name == 'synthetic':
        return simulator.synthetic_profile(12, types=2)
    return simulator.load_profile(name)


@pytest.mark.parametrize('name', PROFILES)
def test_node_xml_valid_per_nodedev_rng(name):
    etree = pytest.importorskip('lxml.etree')
    if not os.path.exists(NODEDEV_RNG):
        pytest.skip('libvirt schemas not installed')
    schema = etree.RelaxNG(etree.parse(NODEDEV_RNG))
    node = etree.fromstring(simulator.node_xml(_profile(name)).encode())
    assert len(node) > 2
    for device in node:
        assert schema.validate(device), (device.findtext('name'),
                                         schema.error_log)


def _canonical(element):
    """Element -> nested tuples, whitespace and attribute order ignored."""
    return (element.tag, sorted(element.attrib.items()),
            (element.text or '').strip(),
            [_canonical(child) for child in element])


@pytest.mark.parametrize('name', PROFILES)
def test_libvirt_test_driver_loads_node_xml(tmp_path, name):
    libvirt = pytest.importorskip('libvirt')
    libvirt.registerErrorHandler(lambda ctx, err: None, None)
    profile = _profile(name)
    path = simulator.write_host(profile, tmp_path / 'sys')
    assert path == str(tmp_path / 'sys' / 'node.xml')
    ours = _devices(_read(path))
    conn = libvirt.open('test://' + path)
    try:
        listed = {d.name(): d for d in conn.listAllDevices()}
        assert set(listed) == set(ours)
        for dev_name, element in ours.items():
            got = ET.fromstring(listed[dev_name].XMLDesc())
            # libvirt 9.0's test driver does not parse <driver>
            for driver in element.findall('driver'):
                element.remove(driver)
            assert _canonical(got) == _canonical(element), dev_name
        mdevs = conn.listAllDevices(
            libvirt.VIR_CONNECT_LIST_NODE_DEVICES_CAP_MDEV)
        assert sorted(ET.fromstring(d.XMLDesc()).findtext(
            'capability/uuid') for d in mdevs) == sorted(
            m.uuid for d in profile.devices for m in d.mdevs)
        parents = conn.listAllDevices(
            libvirt.VIR_CONNECT_LIST_NODE_DEVICES_CAP_MDEV_TYPES)
        assert len(parents) == sum(1 for d in profile.devices
                                   if d.mdev_types)
    finally:
        conn.close()


def test_device_dirs_nest_under_listed_bridges(tmp_path):
    doc = _minimal(device={'parent_bridge': '0000:ae:00.0'})
    doc['devices'].insert(0, {
        'address': '0000:ae:00.0', 'vendor_id': '10b5', 'product_id': '8747',
        'class_code': '0x060400', 'parent_bridge': '0000:ad:00.0'})
    profile = _load_doc(tmp_path, doc)
    dirs = sysfs_tree.device_dirs(profile)
    assert dirs['0000:af:00.0'] == (
        'devices/pci0000:ad/0000:ad:00.0/0000:ae:00.0/0000:af:00.0')
    assert [b.address for b in profile.bridges()] == ['0000:ad:00.0']
    root = tmp_path / 'sys'
    simulator.write_sysfs(profile, root)
    assert os.readlink(root / dirs['0000:af:00.0'] / 'subsystem') == \
        '../../../../../bus/pci'
    loop = _minimal(device={'parent_bridge': '0000:af:00.0'})
    with pytest.raises(exception.SimulatorError, match='loops'):
        _load_doc(tmp_path, loop)
