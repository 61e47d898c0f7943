"""What the sysfs reader promises that its other tests left open: each
test here fails on a change ``make mutation`` made to
devices/sysfs/{devices,reader,parsers}.py, util/bounds.py or
util/safeopen.py that the rest stayed green on (docs/dev/mutation.md):
the whole refusal a user reads, the bounds of each number, the order of
what is listed, what a cache keeps, the flags a file is opened with.

Every test builds its own small tree in ``tmp_path`` (a GPU, its types,
its links), so each says exactly which file it is about."""

import logging
import os

import pytest

from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.devices.sysfs import devices as devices_mod
from libvirt_gpu.devices.sysfs import parsers
from libvirt_gpu.devices.sysfs import reader as reader_mod
from libvirt_gpu.util import bounds
from libvirt_gpu.util import safeopen

GPU = '0000:41:00.0'
VF1 = '0000:41:00.4'
VF2 = '0000:41:00.5'
VF10 = '0000:41:01.6'
OTHER = '0000:42:00.0'
TYPE = 'nvidia-1160'
TYPE2 = 'nvidia-1161'
UUID = '6f1f1d4c-3b5a-4a3e-9c6e-1a2b3c4d5e6f'
UUID2 = '0a1f1d4c-3b5a-4a3e-9c6e-1a2b3c4d5e6f'


class Tree:
    """A hand-made sysfs: ``devices/pci0000:00/<address>`` with the
    ``bus/pci/devices/<address>`` link the kernel makes."""

    def __init__(self, top):
        self.root = os.path.realpath(str(top / 'sys'))
        os.makedirs(os.path.join(self.root, 'bus', 'pci', 'devices'))
        os.makedirs(os.path.join(self.root, 'bus', 'pci', 'drivers',
                                 'nvidia'))

    def real(self, address):
        return os.path.join(self.root, 'devices', 'pci0000:00', address)

    def pci(self, address):
        return os.path.join(self.root, 'bus', 'pci', 'devices', address)

    def device(self, address, vendor='0x10de', device='0x2331',
               klass='0x030200', **files):
        os.makedirs(self.real(address))
        os.symlink('../../../devices/pci0000:00/' + address,
                   self.pci(address))
        self.write(address, vendor=vendor, device=device, **{'class': klass})
        self.write(address, **files)
        return self.pci(address)

    def write(self, address, **files):
        for name, text in files.items():
            with open(os.path.join(self.real(address), name), 'w') as f:
                f.write(text + '\n')

    def link(self, address, name, target):
        os.symlink(target, os.path.join(self.real(address), name))

    def vf_links(self, pf, vfs):
        for n, vf in vfs.items():
            self.link(pf, 'virtfn%s' % n, '../' + vf)
            self.link(vf, 'physfn', '../' + pf)

    def mdev_type(self, address, type_id, available='4', name='GRID A',
                  description='num_heads=4, max_instance=4',
                  device_api='vfio-pci'):
        path = os.path.join(self.real(address), reader_mod.TYPES_DIR,
                            type_id)
        os.makedirs(path)
        for attr, text in (('available_instances', available),
                           ('name', name), ('description', description),
                           ('device_api', device_api)):
            if text is not None:
                with open(os.path.join(path, attr), 'w') as f:
                    f.write(text + '\n')
        return path

    def mdev(self, parent, uuid, type_id):
        path = os.path.join(self.real(parent), uuid)
        os.makedirs(path)
        os.symlink('../%s/%s' % (reader_mod.TYPES_DIR, type_id),
                   os.path.join(path, 'mdev_type'))
        bus = os.path.join(self.root, 'bus', 'mdev', 'devices')
        os.makedirs(bus, exist_ok=True)
        link = os.path.join(bus, uuid)
        os.symlink(os.path.relpath(path, bus), link)
        return link


@pytest.fixture
def tree(tmp_path):
    return Tree(tmp_path)


@pytest.fixture
def gpu(tree):
    """A GPU with every file ``read_gpu`` reads."""
    tree.device(GPU, numa_node='1', local_cpulist='0-7,16-23')
    tree.link(GPU, 'driver', '../../../bus/pci/drivers/nvidia')
    tree.link(GPU, 'iommu_group', '../../../kernel/iommu_groups/7')
    return tree


def _sysfs(tree):
    return devices_mod.Sysfs(tree.root)


def _messages(errors):
    return [str(e) for e in errors]


# -- read_gpu ---------------------------------------------------------------

def test_read_gpu_reads_every_file_as_a_record(gpu):
    gpu.mdev_type(GPU, TYPE)
    found = _sysfs(gpu).read_gpu(GPU, mdevs_by_parent={})
    assert found == objects.Gpu(
        address=objects.PciAddress.parse(GPU), vendor_id='10de',
        product_id='2331', class_code='0x030200', driver='nvidia',
        numa_node=1, iommu_group=7, physfn=None, virtfns=(),
        mdev_types=(objects.VgpuType(
            objects.TypeId.parse(TYPE), 'GRID A',
            'num_heads=4, max_instance=4', 'vfio-pci', 4),),
        mdevs=(), local_cpulist='0-7,16-23')
    # not compared by Gpu's equality: asked for by name
    assert found.mdev_types[0].description == 'num_heads=4, max_instance=4'
    assert found.local_cpulist == '0-7,16-23'


def test_read_gpu_leaves_optional_files_none(tree):
    tree.device(GPU)
    found = _sysfs(tree).read_gpu(GPU, mdevs_by_parent={})
    assert (found.driver, found.numa_node, found.iommu_group, found.physfn,
            found.virtfns, found.mdev_types, found.local_cpulist) == (
        None, None, None, None, (), (), None)


def test_read_gpu_requires_vendor_device_and_class(tree):
    tree.device(GPU)
    os.unlink(os.path.join(tree.real(GPU), 'class'))
    with pytest.raises(exception.SysfsReadError) as e:
        _sysfs(tree).read_gpu(GPU, mdevs_by_parent={})
    assert str(e.value) == 'cannot read %s: no such file' % os.path.join(
        tree.pci(GPU), 'class')


def test_read_gpu_names_a_bad_vendor_id(tree):
    tree.device(GPU, vendor='nvidia')
    with pytest.raises(exception.SysfsBadNumber) as e:
        _sysfs(tree).read_gpu(GPU, mdevs_by_parent={})
    assert str(e.value) == (
        "cannot read %s: expected a 4-digit hex PCI id, read 'nvidia'"
        % os.path.join(tree.pci(GPU), 'vendor'))


@pytest.mark.parametrize('text, node', [
    ('-1', None), ('0', 0), ('1023', 1023)])
def test_read_gpu_numa_node_bounds(tree, text, node):
    tree.device(GPU, numa_node=text)
    skipped = []
    found = _sysfs(tree).read_gpu(GPU, mdevs_by_parent={}, skipped=skipped)
    assert found.numa_node == node and skipped == []


def test_read_gpu_numa_node_past_the_kernels_bound_is_said(tree, caplog):
    tree.device(GPU, numa_node='1024')
    skipped = []
    found = _sysfs(tree).read_gpu(GPU, mdevs_by_parent={}, skipped=skipped)
    assert found.numa_node is None
    assert _messages(skipped) == [
        'sysfs: %s: 1024 is no NUMA node (Linux numbers them below 1024): '
        "the GPU's node is taken as unknown"
        % os.path.join(tree.pci(GPU), 'numa_node')]
    # without a list to take it, the same is logged
    with caplog.at_level(logging.WARNING):
        assert _sysfs(tree).read_gpu(
            GPU, mdevs_by_parent={}).numa_node is None
    assert 'is no NUMA node' in caplog.text


def test_read_gpu_refuses_a_numa_node_below_minus_one(tree):
    tree.device(GPU, numa_node='-2')
    with pytest.raises(exception.SysfsBadNumber) as e:
        _sysfs(tree).read_gpu(GPU, mdevs_by_parent={})
    assert str(e.value) == (
        "cannot read %s: expected a number of at least -1, read '-2'"
        % os.path.join(tree.pci(GPU), 'numa_node'))


def test_an_iommu_group_that_is_no_number_is_none(tree):
    tree.device(GPU)
    tree.link(GPU, 'iommu_group', '../../../kernel/iommu_groups/x7')
    assert _sysfs(tree).read_gpu(
        GPU, mdevs_by_parent={}).iommu_group is None


def test_iommu_group_zero_is_a_group(tree):
    tree.device(GPU)
    tree.link(GPU, 'iommu_group', '../../../kernel/iommu_groups/0')
    assert _sysfs(tree).read_gpu(GPU, mdevs_by_parent={}).iommu_group == 0


def test_read_gpu_lists_vfs_in_virtfn_number_order(tree):
    tree.device(GPU)
    for vf in (VF1, VF2, VF10):
        tree.device(vf)
    # virtfn10 sorts before virtfn2 as text: the number orders them
    tree.vf_links(GPU, {2: VF2, 10: VF10, 1: VF1})
    tree.link(GPU, 'virtfnx', '../' + OTHER)     # no VF: not a number
    expected = tuple(objects.PciAddress.parse(a) for a in (VF1, VF2, VF10))
    sysfs = _sysfs(tree)
    assert sysfs.read_gpu(GPU, mdevs_by_parent={}).virtfns == expected
    assert sysfs.virtfns(GPU) == expected
    vf = sysfs.read_gpu(VF2, mdevs_by_parent={})
    assert vf.physfn == objects.PciAddress.parse(GPU)
    assert sysfs.physfn(VF2) == objects.PciAddress.parse(GPU)


def test_read_gpu_drops_links_to_itself_and_says_so(tree):
    tree.device(GPU)
    tree.device(VF1)
    tree.link(GPU, 'physfn', '../' + GPU)
    tree.link(GPU, 'virtfn0', '../' + GPU)
    tree.link(GPU, 'virtfn1', '../' + VF1)
    skipped = []
    found = _sysfs(tree).read_gpu(GPU, mdevs_by_parent={}, skipped=skipped)
    assert found.physfn is None
    assert found.virtfns == (objects.PciAddress.parse(VF1),)
    assert sorted(_messages(skipped)) == sorted(
        'sysfs: %s: the GPU %s links to itself as its own SR-IOV function; '
        'the link is ignored' % (os.path.join(tree.pci(GPU), name), GPU)
        for name in ('physfn', 'virtfn0'))


def test_physfn_is_none_without_a_link(tree):
    tree.device(GPU)
    assert _sysfs(tree).physfn(GPU) is None


def test_physfn_to_itself_is_none_and_said(tree, caplog):
    tree.device(GPU)
    tree.link(GPU, 'physfn', '../' + GPU)
    with caplog.at_level(logging.WARNING):
        assert _sysfs(tree).physfn(GPU) is None
    assert ('the GPU %s links to itself as its own SR-IOV function'
            % GPU) in caplog.text


def test_physfn_to_no_pci_device_is_named(tree):
    tree.device(GPU)
    tree.link(GPU, 'physfn', '../' + 'x' * 100)
    with pytest.raises(exception.SysfsReadError) as e:
        _sysfs(tree).physfn(GPU)
    assert str(e.value) == (
        'cannot read %s: expected a link to a PCI device, found %r'
        % (os.path.join(tree.pci(GPU), 'physfn'), 'x' * 80))


def test_virtfns_drops_a_link_to_itself(tree, caplog):
    tree.device(GPU)
    tree.device(VF1)
    tree.link(GPU, 'virtfn0', '../' + GPU)
    tree.link(GPU, 'virtfn1', '../' + VF1)
    with caplog.at_level(logging.WARNING):
        assert _sysfs(tree).virtfns(GPU) == (objects.PciAddress.parse(VF1),)
    assert 'links to itself' in caplog.text


def test_class_filter_passes_the_class_it_read(tree):
    tree.device(GPU)
    seen = []

    def gpus_only(text):
        seen.append(text)
        return text.startswith('0x03')
    sysfs = _sysfs(tree)
    found = sysfs.read_gpu(GPU, mdevs_by_parent={}, class_filter=gpus_only)
    assert found.class_code == '0x030200' and seen == ['0x030200']
    tree.write(GPU, **{'class': '0x020000'})
    assert sysfs.read_gpu(GPU, mdevs_by_parent={},
                          class_filter=gpus_only) is None


def test_read_gpu_finds_its_mdevs_itself_when_not_given(tree):
    tree.device(GPU)
    tree.mdev_type(GPU, TYPE)
    tree.mdev(GPU, UUID, TYPE)
    tree.mdev(GPU, UUID2, TYPE)
    found = _sysfs(tree).read_gpu(GPU)
    assert found.mdevs == tuple(sorted(
        objects.Mdev(uuid=objects.Uuid.parse(u),
                     type_id=objects.TypeId.parse(TYPE))
        for u in (UUID, UUID2)))
    assert found.mdevs[0].uuid == objects.Uuid.parse(UUID2)


def test_pci_class_and_addresses(tree):
    tree.device(OTHER, klass='0x020000')
    tree.device(GPU)
    os.makedirs(os.path.join(tree.root, 'bus', 'pci', 'devices', 'junk'))
    sysfs = _sysfs(tree)
    assert sysfs.pci_addresses() == [objects.PciAddress.parse(GPU),
                                     objects.PciAddress.parse(OTHER)]
    assert sysfs.pci_class(OTHER) == '0x020000'


# -- locality ---------------------------------------------------------------

def test_locality_reads_node_and_cpus(gpu):
    node, cpus = _sysfs(gpu).locality(GPU)
    assert node == 1
    assert cpus == bounds.parse_cpulist('0-7,16-23')


@pytest.mark.parametrize('text, node', [('-1', None), ('0', 0),
                                        ('1023', 1023), ('1024', None)])
def test_locality_node_bounds(tree, text, node):
    tree.device(GPU, numa_node=text, local_cpulist='0-3')
    assert _sysfs(tree).locality(GPU)[0] == node


def test_locality_takes_a_node_that_is_no_number_as_unknown(tree, caplog):
    tree.device(GPU, numa_node='near', local_cpulist='0-3')
    with caplog.at_level(logging.WARNING):
        node, cpus = _sysfs(tree).locality(GPU)
    assert node is None and cpus == bounds.parse_cpulist('0-3')
    assert ("cannot read %s: expected a number of at least -1, read 'near': "
            'the node is taken as unknown'
            % os.path.join(tree.pci(GPU), 'numa_node')) in caplog.text


def test_locality_takes_a_bad_cpulist_as_none(tree):
    tree.device(GPU, numa_node='0', local_cpulist='0-x')
    node, cpus = _sysfs(tree).locality(GPU)
    assert node == 0 and cpus == bounds.parse_cpulist('')


def test_locality_of_a_device_without_the_files(tree):
    tree.device(GPU)
    assert _sysfs(tree).locality(GPU) == (None, bounds.parse_cpulist(''))


# -- IOMMU groups, functions ------------------------------------------------

@pytest.mark.parametrize('group', [-1, True, '3', None])
def test_iommu_group_addresses_refuses_what_is_no_group(tree, group):
    with pytest.raises(exception.InvalidInput) as e:
        _sysfs(tree).iommu_group_addresses(group)
    assert str(e.value) == ('Invalid input: an IOMMU group is a number, '
                            'not %r' % (group,))


def test_iommu_group_addresses_lists_the_group_sorted(tree):
    base = os.path.join(tree.root, 'kernel', 'iommu_groups', '0', 'devices')
    os.makedirs(base)
    for name in (OTHER, GPU, 'junk'):
        os.makedirs(os.path.join(base, name))
    assert _sysfs(tree).iommu_group_addresses(0) == [
        objects.PciAddress.parse(GPU), objects.PciAddress.parse(OTHER)]


def test_pci_function_reads_ids_class_and_driver(gpu):
    assert _sysfs(gpu).pci_function(GPU) == objects.IommuMember(
        address=objects.PciAddress.parse(GPU), vendor_id='10de',
        product_id='2331', class_code='0x030200', driver='nvidia')


def test_pci_function_leaves_missing_and_empty_files_none(tree):
    tree.device(GPU, vendor='')
    for name in ('device', 'class'):
        os.unlink(os.path.join(tree.real(GPU), name))
    assert _sysfs(tree).pci_function(GPU) == objects.IommuMember(
        address=objects.PciAddress.parse(GPU), vendor_id=None,
        product_id=None, class_code=None, driver=None)


def test_pci_function_names_a_bad_id(tree):
    tree.device(GPU, device='0xzz')
    with pytest.raises(exception.SysfsBadNumber) as e:
        _sysfs(tree).pci_function(GPU)
    assert os.path.join(tree.pci(GPU), 'device') in str(e.value)


# -- mdev types -------------------------------------------------------------

def test_mdev_type_ids_lists_only_type_ids_sorted(tree):
    tree.device(GPU)
    tree.mdev_type(GPU, TYPE2)
    tree.mdev_type(GPU, TYPE)
    os.makedirs(os.path.join(tree.real(GPU), reader_mod.TYPES_DIR, '-x'))
    sysfs = _sysfs(tree)
    assert sysfs.mdev_type_ids(GPU) == [objects.TypeId.parse(TYPE),
                                        objects.TypeId.parse(TYPE2)]
    tree.device(OTHER)
    assert sysfs.mdev_type_ids(OTHER) == []
    assert sysfs.types_dir(GPU) == os.path.join(tree.pci(GPU),
                                                reader_mod.TYPES_DIR)


def test_mdev_types_reads_each_type_in_order(tree):
    tree.device(GPU)
    tree.mdev_type(GPU, TYPE2, available='0', name=None, description=None)
    tree.mdev_type(GPU, TYPE, available='2')
    found = _sysfs(tree).mdev_types(GPU)
    assert [(t.id, t.name, t.description, t.device_api,
             t.available_instances) for t in found] == [
        (TYPE, 'GRID A', 'num_heads=4, max_instance=4', 'vfio-pci', 2),
        (TYPE2, None, None, 'vfio-pci', 0)]


def test_mdev_types_of_a_device_without_types_is_empty(tree):
    tree.device(GPU)
    assert _sysfs(tree).mdev_types(GPU) == ()


@pytest.mark.parametrize('available, ok', [
    (str(bounds.MAX_INSTANCES), True), (str(bounds.MAX_INSTANCES + 1), False)])
def test_available_instances_bound(tree, available, ok):
    tree.device(GPU)
    path = tree.mdev_type(GPU, TYPE, available=available)
    sysfs = _sysfs(tree)
    if ok:
        assert sysfs.mdev_types(GPU)[0].available_instances == int(available)
        return
    with pytest.raises(exception.SysfsBadNumber) as e:
        sysfs.mdev_types(GPU)
    assert str(e.value) == (
        "cannot read %s: expected a number of at most %d, read '%d'"
        % (os.path.join(tree.pci(GPU), reader_mod.TYPES_DIR, TYPE,
                        'available_instances'),
           bounds.MAX_INSTANCES, bounds.MAX_INSTANCES + 1))
    assert os.path.realpath(path).startswith(tree.root)


def test_available_instances_must_be_a_count(tree):
    tree.device(GPU)
    tree.mdev_type(GPU, TYPE, available='-1')
    with pytest.raises(exception.SysfsBadNumber) as e:
        _sysfs(tree).mdev_types(GPU)
    assert str(e.value) == (
        "cannot read %s: expected a number of at least 0, read '-1'"
        % os.path.join(tree.pci(GPU), reader_mod.TYPES_DIR, TYPE,
                       'available_instances'))


def test_device_api_is_required(tree):
    tree.device(GPU)
    tree.mdev_type(GPU, TYPE, device_api=None)
    with pytest.raises(exception.SysfsReadError) as e:
        _sysfs(tree).mdev_types(GPU)
    assert str(e.value) == 'cannot read %s: no such file' % os.path.join(
        tree.pci(GPU), reader_mod.TYPES_DIR, TYPE, 'device_api')


def test_a_bad_type_is_skipped_with_its_error_and_the_rest_read(tree):
    tree.device(GPU)
    tree.mdev_type(GPU, TYPE, available='many')
    tree.mdev_type(GPU, TYPE2)
    skipped = []
    found = _sysfs(tree).mdev_types(GPU, skipped=skipped)
    assert [t.id for t in found] == [TYPE2]
    assert _messages(skipped) == [
        "cannot read %s: expected a number of at least 0, read 'many'"
        % os.path.join(tree.pci(GPU), reader_mod.TYPES_DIR, TYPE,
                       'available_instances')]


def test_a_type_named_no_type_id_is_named(tree):
    tree.device(GPU)
    tree.mdev_type(GPU, '-bad')
    skipped = []
    assert _sysfs(tree).mdev_types(GPU, skipped=skipped) == ()
    path = os.path.join(tree.pci(GPU), reader_mod.TYPES_DIR, '-bad')
    assert len(skipped) == 1
    assert str(skipped[0]).startswith('cannot read %s: ' % path)
    assert 'is not a valid vGPU type id' in str(skipped[0])


def test_a_type_that_is_no_directory_is_named(tree):
    tree.device(GPU)
    tree.mdev_type(GPU, TYPE2)
    with open(os.path.join(tree.real(GPU), reader_mod.TYPES_DIR, TYPE),
              'w') as f:
        f.write('x')
    skipped = []
    found = _sysfs(tree).mdev_types(GPU, skipped=skipped)
    assert [t.id for t in found] == [TYPE2]
    assert _messages(skipped) == ['cannot read %s: Not a directory'
                                  % os.path.join(tree.pci(GPU),
                                                 reader_mod.TYPES_DIR, TYPE)]


def test_type_ids_are_remembered_up_to_the_bound(tree, monkeypatch):
    tree.device(GPU)
    tree.mdev_type(GPU, TYPE)
    tree.mdev_type(GPU, TYPE2)
    known = {}
    monkeypatch.setattr(devices_mod, '_KNOWN_TYPE_IDS', known)
    monkeypatch.setattr(devices_mod, '_MAX_KNOWN_TYPE_IDS', 1)
    _sysfs(tree).mdev_types(GPU)
    assert known == {TYPE: objects.TypeId.parse(TYPE)}


def test_the_text_cache_keeps_a_models_texts(tree):
    """The second parent of one model is shown the first one's texts (the
    driver's table), its own count; another model reads its own."""
    tree.device(GPU)
    tree.device(OTHER)
    tree.mdev_type(GPU, TYPE, available='3')
    tree.mdev_type(OTHER, TYPE, available='1', name='other name',
                   description='other', device_api='other-api')
    sysfs = _sysfs(tree)
    cache = {}
    first = sysfs.mdev_types(GPU, cache, model='m')
    assert first[0].available_instances == 3
    assert cache['m'][TYPE] == ('GRID A', 'num_heads=4, max_instance=4',
                                'vfio-pci')
    second = sysfs.mdev_types(OTHER, cache, model='m')
    assert [(t.name, t.description, t.device_api, t.available_instances)
            for t in second] == [
        ('GRID A', 'num_heads=4, max_instance=4', 'vfio-pci', 1)]
    third = sysfs.mdev_types(OTHER, cache, model='n')
    assert [(t.name, t.description, t.device_api) for t in third] == [
        ('other name', 'other', 'other-api')]
    # no model: nothing is cached, each parent reads its own
    fourth = sysfs.mdev_types(OTHER, cache, model=None)
    assert fourth[0].name == 'other name'
    assert set(cache) == {'m', 'n'}


def test_a_warm_pass_shares_one_record_per_count(tree):
    tree.device(GPU)
    tree.device(OTHER)
    tree.mdev_type(GPU, TYPE, available='3')
    tree.mdev_type(OTHER, TYPE, available='3')
    sysfs = _sysfs(tree)
    cache = {}
    sysfs.mdev_types(GPU, cache, model='m')
    warm = sysfs.mdev_types(GPU, cache, model='m')
    again = sysfs.mdev_types(OTHER, cache, model='m')
    assert warm[0] is again[0]
    assert warm[0] == objects.VgpuType(
        objects.TypeId.parse(TYPE), 'GRID A', 'num_heads=4, max_instance=4',
        'vfio-pci', 3)
    assert warm[0].description == 'num_heads=4, max_instance=4'
    with open(os.path.join(tree.real(OTHER), reader_mod.TYPES_DIR, TYPE,
                           'available_instances'), 'w') as f:
        f.write('2\n')
    assert sysfs.mdev_types(OTHER, cache, model='m')[0] \
        .available_instances == 2


def test_a_warm_pass_reads_a_bad_count_the_thorough_way(tree):
    tree.device(GPU)
    tree.mdev_type(GPU, TYPE, available='3')
    sysfs = _sysfs(tree)
    cache = {}
    sysfs.mdev_types(GPU, cache, model='m')
    with open(os.path.join(tree.real(GPU), reader_mod.TYPES_DIR, TYPE,
                           'available_instances'), 'w') as f:
        f.write('%d\n' % (bounds.MAX_INSTANCES + 1))
    with pytest.raises(exception.SysfsBadNumber):
        sysfs.mdev_types(GPU, cache, model='m')
    skipped = []
    assert sysfs.mdev_types(GPU, cache, model='m', skipped=skipped) == ()
    assert 'expected a number of at most 4096' in str(skipped[0])


def test_read_gpu_uses_the_text_cache_with_its_model(tree):
    tree.device(GPU)
    tree.device(OTHER, device='0x2322')
    tree.link(GPU, 'driver', '../../../bus/pci/drivers/nvidia')
    tree.mdev_type(GPU, TYPE, available='3')
    tree.mdev_type(OTHER, TYPE, name='other name')
    cache = {}
    sysfs = _sysfs(tree)
    sysfs.read_gpu(GPU, mdevs_by_parent={}, static_cache=cache)
    assert list(cache) == [('nvidia', '10de', '2331', False)]
    found = sysfs.read_gpu(OTHER, mdevs_by_parent={}, static_cache=cache)
    assert found.mdev_types[0].name == 'other name'   # another model


def test_a_linked_types_directory_is_read_where_it_leads(tree):
    tree.device(GPU)
    tree.device(OTHER)
    tree.mdev_type(OTHER, TYPE, available='2')
    tree.link(GPU, reader_mod.TYPES_DIR,
              '../%s/%s' % (OTHER, reader_mod.TYPES_DIR))
    cache = {}
    found = _sysfs(tree).read_gpu(GPU, mdevs_by_parent={}, static_cache=cache)
    assert [(t.id, t.available_instances) for t in found.mdev_types] == [
        (TYPE, 2)]
    # read the thorough way, the texts are still kept for the model
    assert cache[(None, '10de', '2331', False)][TYPE] == (
        'GRID A', 'num_heads=4, max_instance=4', 'vfio-pci')


# -- mdevs ------------------------------------------------------------------

def test_mdevs_by_parent_groups_mdevs_by_parent(tree):
    tree.device(GPU)
    tree.device(OTHER)
    tree.mdev_type(GPU, TYPE)
    tree.mdev_type(OTHER, TYPE2)
    tree.mdev(GPU, UUID, TYPE)
    tree.mdev(OTHER, UUID2, TYPE2)
    bus = os.path.join(tree.root, 'bus', 'mdev', 'devices')
    os.makedirs(os.path.join(bus, 'not-a-uuid'))
    skipped = []
    assert _sysfs(tree).mdevs_by_parent(skipped) == {
        objects.PciAddress.parse(GPU): [objects.Mdev(
            uuid=objects.Uuid.parse(UUID),
            type_id=objects.TypeId.parse(TYPE))],
        objects.PciAddress.parse(OTHER): [objects.Mdev(
            uuid=objects.Uuid.parse(UUID2),
            type_id=objects.TypeId.parse(TYPE2))]}
    assert skipped == []


def test_mdevs_by_parent_without_a_bus_is_empty(tree):
    assert _sysfs(tree).mdevs_by_parent() == {}


def test_an_mdev_without_a_type_link_is_skipped_and_logged(tree, caplog):
    tree.device(GPU)
    tree.mdev_type(GPU, TYPE)
    link = tree.mdev(GPU, UUID, TYPE)
    os.unlink(os.path.join(link, 'mdev_type'))
    with caplog.at_level(logging.WARNING):
        assert _sysfs(tree).mdevs_by_parent() == {}
    assert ('mdev skipped: cannot read %s: mdev without a type link'
            % os.path.join(link, 'mdev_type')) in caplog.text


def test_an_mdev_type_link_to_no_type_id_is_named(tree):
    tree.device(GPU)
    link = tree.mdev(GPU, UUID, '-bad')
    skipped = []
    assert _sysfs(tree).mdevs_by_parent(skipped) == {}
    assert len(skipped) == 1
    assert str(skipped[0]).startswith(
        'cannot read %s: ' % os.path.join(link, 'mdev_type'))
    assert 'is not a valid vGPU type id' in str(skipped[0])


def test_an_mdev_entry_that_is_no_link_is_named(tree):
    bus = os.path.join(tree.root, 'bus', 'mdev', 'devices')
    os.makedirs(os.path.join(bus, UUID))
    skipped = []
    assert _sysfs(tree).mdevs_by_parent(skipped) == {}
    assert _messages(skipped) == ['cannot read %s: Invalid argument'
                                  % os.path.join(bus, UUID)]


def test_an_mdev_whose_parent_is_no_pci_device_is_left_out(tree):
    parent = os.path.join(tree.root, 'devices', 'platform', 'mdev-host')
    os.makedirs(os.path.join(parent, UUID))
    os.symlink('../' + reader_mod.TYPES_DIR + '/' + TYPE,
               os.path.join(parent, UUID, 'mdev_type'))
    bus = os.path.join(tree.root, 'bus', 'mdev', 'devices')
    os.makedirs(bus)
    os.symlink(os.path.relpath(os.path.join(parent, UUID), bus),
               os.path.join(bus, UUID))
    skipped = []
    assert _sysfs(tree).mdevs_by_parent(skipped) == {} and skipped == []


def test_an_mdev_link_to_nowhere_under_the_root_is_read_by_realpath(tree):
    """A link to no directory takes the realpath way: still named."""
    bus = os.path.join(tree.root, 'bus', 'mdev', 'devices')
    os.makedirs(bus)
    os.symlink('../../../devices/pci0000:00/%s/%s' % (GPU, UUID),
               os.path.join(bus, UUID))
    skipped = []
    assert _sysfs(tree).mdevs_by_parent(skipped) == {}
    assert _messages(skipped) == [
        'cannot read %s: mdev without a type link'
        % os.path.join(bus, UUID, 'mdev_type')]


# -- SR-IOV counts ----------------------------------------------------------

def test_sriov_counts_read_and_written(tree):
    tree.device(GPU, sriov_totalvfs='16', sriov_numvfs='0')
    sysfs = _sysfs(tree)
    assert (sysfs.sriov_totalvfs(GPU), sysfs.sriov_numvfs(GPU)) == (16, 0)
    sysfs.set_sriov_numvfs(GPU, 0)
    sysfs.set_sriov_numvfs(GPU, 16)
    assert sysfs.sriov_numvfs(GPU) == 16
    tree.device(OTHER)
    assert (sysfs.sriov_totalvfs(OTHER), sysfs.sriov_numvfs(OTHER)) == (
        None, None)


@pytest.mark.parametrize('count', [-1, True, '4', 1.0])
def test_set_sriov_numvfs_refuses_what_is_no_count(tree, count):
    tree.device(GPU, sriov_numvfs='0')
    with pytest.raises(exception.InvalidInput) as e:
        _sysfs(tree).set_sriov_numvfs(GPU, count)
    assert str(e.value) == ('Invalid input: sriov_numvfs must be a count, '
                            'not %r' % (count,))
    assert _sysfs(tree).sriov_numvfs(GPU) == 0


# -- parsers ----------------------------------------------------------------

@pytest.mark.parametrize('text, base, minimum, value', [
    ('9' * 19, 10, 0, int('9' * 19)),
    ('-5', 10, None, -5),
    ('-5', 10, -5, -5),
    ('0', 10, 0, 0),
    ('f' * 16, 16, 0, int('f' * 16, 16)),
    ('0x10', 16, 0, 16),
    ('0X1f', 16, 0, 31),
    ('Ab', 16, 0, 0xab),
    ('0x1', 16, 0, 1),
    ('f', 16, 0, 15),
])
def test_parse_number_takes(text, base, minimum, value):
    assert parsers.parse_number(text, 'p', minimum=minimum,
                                base=base) == value


@pytest.mark.parametrize('text, base, minimum, expected', [
    ('9' * 20, 10, 0, 'a number of at least 0'),
    ('', 10, 0, 'a number of at least 0'),
    ('-', 10, None, 'a number'),
    ('-6', 10, -5, 'a number of at least -5'),
    ('1', 10, 2, 'a number of at least 2'),
    ('f' * 17, 16, 0, 'a number of at least 0'),
    ('0x', 16, 0, 'a number of at least 0'),
    ('g', 16, 0, 'a number of at least 0'),
    ('1a', 10, 0, 'a number of at least 0'),
    ('+1', 10, None, 'a number'),
    ('x' * 50, 10, 0, 'a number of at least 0'),
])
def test_parse_number_refuses(text, base, minimum, expected):
    with pytest.raises(exception.SysfsBadNumber) as e:
        parsers.parse_number(text, '/sys/x', minimum=minimum, base=base)
    assert str(e.value) == 'cannot read /sys/x: expected %s, read %r' % (
        expected, text[:40])


def test_parse_number_defaults_to_decimal_counts():
    assert parsers.parse_number('10', 'p') == 10
    with pytest.raises(exception.SysfsBadNumber):
        parsers.parse_number('-1', 'p')
    with pytest.raises(exception.SysfsBadNumber):
        parsers.parse_number('a', 'p')


def test_parse_hex_id():
    assert parsers.parse_hex_id('0x10DE', 'p') == '10de'
    with pytest.raises(exception.SysfsBadNumber) as e:
        parsers.parse_hex_id('0x' + 'z' * 60, '/sys/vendor')
    assert str(e.value) == (
        "cannot read /sys/vendor: expected a 4-digit hex PCI id, read %r"
        % ('0x' + 'z' * 38))


# -- reader: paths ----------------------------------------------------------

@pytest.mark.parametrize('root, path, inside', [
    ('/sys', '/sys', True), ('/sys', '/sys/x', True),
    ('/sys', '/sys2', False), ('/sys', '/sy', False), ('/sys', '/', False),
    ('/', '/x', True), ('/', '/', True)])
def test_is_inside_compares_components(root, path, inside):
    assert reader_mod.is_inside(root, path) is inside
    reader = reader_mod.Reader('/')
    reader.root = root
    assert reader._inside(path) is inside


def test_the_root_is_resolved_and_shown(tree, tmp_path):
    os.symlink(tree.root, str(tmp_path / 'alias'))
    reader = reader_mod.Reader(tmp_path / 'alias')
    assert reader.root == tree.root
    assert repr(reader) == 'Sysfs(%r)' % tree.root
    assert reader.pci_dir(objects.PciAddress.parse(GPU)) == tree.pci(GPU)
    assert reader.pci_dir(GPU.upper()) == tree.pci(GPU)
    assert reader.mdev_dir(UUID.upper()) == os.path.join(
        tree.root, 'bus', 'mdev', 'devices', UUID)
    assert reader.path('a', 'b.c') == os.path.join(tree.root, 'a', 'b.c')


@pytest.mark.parametrize('part', ['', '.', '..', 'a/b', 'a\0b', 'a\nb'])
def test_path_refuses_a_part_that_is_no_name(tree, part):
    with pytest.raises(exception.UnsafePath) as e:
        reader_mod.Reader(tree.root).path('bus', part)
    assert str(e.value) == ('refusing path %s: it leaves the sysfs root '
                            '(any)' % part)


def test_is_host_sysfs(tree):
    assert reader_mod.Reader.is_host_sysfs('/sys')
    assert reader_mod.Reader.is_host_sysfs('/sys/')
    assert not reader_mod.Reader.is_host_sysfs(tree.root)


def test_resolved_under_root(tree, tmp_path):
    tree.device(GPU)
    reader = reader_mod.Reader(tree.root)
    assert reader.resolved_under_root(tree.pci(GPU)) == tree.real(GPU)
    os.symlink(str(tmp_path), os.path.join(tree.root, 'out'))
    path = os.path.join(tree.root, 'out')
    with pytest.raises(exception.UnsafePath) as e:
        reader.resolved_under_root(path)
    assert str(e.value) == ('refusing path %s: it leaves the sysfs root %s'
                            % (path, tree.root))


# -- reader: reading --------------------------------------------------------

def test_read_strips_and_reads_through_links(tree):
    tree.device(GPU)
    tree.write(GPU, label='  spaced \n\n')
    os.symlink('label', os.path.join(tree.real(GPU), 'alias'))
    reader = reader_mod.Reader(tree.root)
    assert reader.read(os.path.join(tree.pci(GPU), 'label')) == 'spaced'
    assert reader.read(os.path.join(tree.real(GPU), 'alias')) == 'spaced'
    with open(os.path.join(tree.real(GPU), 'bad'), 'wb') as f:
        f.write(b'a\xffb')
    assert reader.read(os.path.join(tree.real(GPU), 'bad')) == 'a\ufffdb'


def test_read_of_a_missing_file(tree):
    tree.device(GPU)
    reader = reader_mod.Reader(tree.root)
    path = os.path.join(tree.pci(GPU), 'none')
    assert reader.read(path, optional=True) is None
    assert reader.read_int(path, optional=True) is None
    with pytest.raises(exception.SysfsReadError) as e:
        reader.read(path)
    assert str(e.value) == 'cannot read %s: no such file' % path


@pytest.mark.parametrize('size, ok', [
    (reader_mod.MAX_ATTRIBUTE_BYTES, True),
    (reader_mod.MAX_ATTRIBUTE_BYTES + 1, False)])
def test_read_bound(tree, size, ok):
    tree.device(GPU)
    with open(os.path.join(tree.real(GPU), 'big'), 'w') as f:
        f.write('x' * size)
    with open(os.path.join(tree.real(GPU), 'mdev_supported_types'),
              'w') as f:
        f.write('x' * size)
    reader = devices_mod.Sysfs(tree.root)
    for path, read in (
            (os.path.join(tree.pci(GPU), 'big'), reader.read),
            (os.path.join(tree.real(GPU), 'big'), reader.read)):
        if ok:
            assert read(path) == 'x' * size
            continue
        with pytest.raises(exception.SysfsFileTooLarge) as e:
            read(path)
        assert str(e.value) == (
            'refusing to read %s: it holds more than 65536 bytes, which no '
            'sysfs attribute does' % path)
    # read relative to the device's directory, the same bound
    tree.write(GPU, vendor='0x10de')
    os.unlink(os.path.join(tree.real(GPU), 'class'))
    with open(os.path.join(tree.real(GPU), 'class'), 'w') as f:
        f.write('0' * size)
    if ok:
        assert reader.pci_class(GPU) == '0' * size
    else:
        with pytest.raises(exception.SysfsFileTooLarge) as e:
            reader.pci_class(GPU)
        assert str(e.value).startswith(
            'refusing to read %s: ' % os.path.join(tree.pci(GPU), 'class'))


def test_read_refuses_a_fifo_and_a_directory(tree):
    tree.device(GPU)
    os.mkfifo(os.path.join(tree.real(GPU), 'fifo'))
    os.makedirs(os.path.join(tree.real(GPU), 'dir'))
    reader = devices_mod.Sysfs(tree.root)
    for name, kind in (('fifo', 'a FIFO'), ('dir', 'a directory')):
        path = os.path.join(tree.pci(GPU), name)
        with pytest.raises(exception.SysfsNotRegularFile) as e:
            reader.read(path)
        assert str(e.value) == (
            'refusing to read %s: it is %s, not a regular file as every '
            'sysfs attribute is' % (path, kind))


def test_read_refuses_a_link_out_of_the_root(tree, tmp_path):
    tree.device(GPU)
    outside = tmp_path / 'secret'
    outside.write_text('42\n')
    os.symlink(str(outside), os.path.join(tree.real(GPU), 'vendor2'))
    reader = devices_mod.Sysfs(tree.root)
    path = os.path.join(tree.pci(GPU), 'vendor2')
    with pytest.raises(exception.SysfsOutsideRoot) as e:
        reader.read(path)
    assert str(e.value) == (
        'refusing to read %s: it resolves to %s, outside the sysfs root %s'
        % (path, outside, tree.root))
    # a device's own attribute linked out: read relative to the device
    os.unlink(os.path.join(tree.real(GPU), 'class'))
    os.symlink(str(outside), os.path.join(tree.real(GPU), 'class'))
    with pytest.raises(exception.SysfsOutsideRoot) as e:
        reader.pci_class(GPU)
    assert str(e.value).startswith('refusing to read %s: it resolves to'
                                   % os.path.join(tree.real(GPU), 'class'))


def test_read_refuses_a_link_loop(tree):
    tree.device(GPU)
    loop = os.path.join(tree.real(GPU), 'loop')
    os.symlink('loop', loop)
    reader = devices_mod.Sysfs(tree.root)
    with pytest.raises(exception.SysfsReadError) as e:
        reader.read(loop)
    assert str(e.value) == 'cannot read %s: %s' % (loop, os.strerror(40))


def test_a_chain_past_the_kernels_bound_is_named(tree):
    tree.device(GPU, label='yes')
    previous = 'label'
    for n in range(reader_mod.MAX_LINKS + 1):
        name = 'l%d' % n
        os.symlink(previous, os.path.join(tree.real(GPU), name))
        previous = name
    reader = devices_mod.Sysfs(tree.root)
    inside = os.path.join(tree.real(GPU), 'l%d' % (reader_mod.MAX_LINKS - 1))
    assert reader.read(inside) == 'yes'
    path = os.path.join(tree.real(GPU), previous)
    with pytest.raises(exception.SysfsReadError) as e:
        reader.read(path)
    assert str(e.value) == (
        'cannot read %s: more than 40 symbolic links lead to it (a loop, or '
        'a chain no kernel makes)' % path)


@pytest.mark.parametrize('text, base, minimum, value', [
    ('0x1f', 16, 0, 31), ('-1', 10, -1, -1), ('-7', 10, None, -7)])
def test_read_int_passes_base_and_minimum(tree, text, base, minimum, value):
    tree.device(GPU, n=text)
    path = os.path.join(tree.pci(GPU), 'n')
    reader = reader_mod.Reader(tree.root)
    assert reader.read_int(path, base=base, minimum=minimum) == value
    with pytest.raises(exception.SysfsBadNumber):
        reader.read_int(path)


# -- reader: links ----------------------------------------------------------

def test_link_name_and_address(tree):
    tree.device(GPU)
    tree.device(VF1)
    tree.link(VF1, 'physfn', '../' + GPU)
    tree.link(VF1, 'odd', '../nothing-pci')
    reader = reader_mod.Reader(tree.root)
    base = tree.pci(VF1)
    assert reader.link_address(os.path.join(base, 'physfn')) == \
        objects.PciAddress.parse(GPU)
    assert reader.link_name(os.path.join(base, 'vendor')) is None
    assert reader.link_name(os.path.join(base, 'none')) is None
    for name, found in (('odd', "'nothing-pci'"), ('none', 'None')):
        path = os.path.join(base, name)
        with pytest.raises(exception.SysfsReadError) as e:
            reader.link_address(path)
        assert str(e.value) == ('cannot read %s: expected a link to a PCI '
                                'device, found %s' % (path, found))


def test_a_link_read_through_a_loop_is_named(tree):
    tree.device(GPU)
    os.symlink('loop', os.path.join(tree.real(GPU), 'loop'))
    reader = reader_mod.Reader(tree.root)
    path = os.path.join(tree.real(GPU), 'loop', 'x')
    with pytest.raises(exception.SysfsReadError) as e:
        reader.link_name(path)
    assert str(e.value) == (
        'cannot read %s: more than 40 symbolic links lead to it (a loop, or '
        'a chain no kernel makes)' % path)
    path = os.path.join(tree.real(GPU), 'vendor', 'x')
    with pytest.raises(exception.SysfsReadError) as e:
        reader.link_name(path)
    assert str(e.value) == 'cannot read %s: Not a directory' % path


def test_a_virtfn_link_to_no_pci_device_is_named_by_read_gpu(tree):
    tree.device(GPU)
    tree.link(GPU, 'virtfn0', '../' + 'y' * 100)
    with pytest.raises(exception.SysfsReadError) as e:
        devices_mod.Sysfs(tree.root).read_gpu(GPU, mdevs_by_parent={})
    assert str(e.value) == (
        'cannot read %s: expected a link to a PCI device, found %r'
        % (os.path.join(tree.pci(GPU), 'virtfn0'), 'y' * 80))


# -- reader: directories ----------------------------------------------------

def test_listdir(tree, tmp_path):
    tree.device(GPU)
    reader = reader_mod.Reader(tree.root)
    assert sorted(reader.listdir(os.path.join(tree.root, 'bus', 'pci',
                                              'devices'))) == [GPU]
    missing = os.path.join(tree.root, 'missing')
    assert reader.listdir(missing, optional=True) == []
    with pytest.raises(exception.SysfsReadError) as e:
        reader.listdir(missing)
    assert str(e.value) == 'cannot read %s: no such directory' % missing
    path = os.path.join(tree.pci(GPU), 'vendor')
    with pytest.raises(exception.SysfsReadError) as e:
        reader.listdir(path, optional=True)
    assert str(e.value) == 'cannot read %s: not a directory' % path
    os.symlink(str(tmp_path), os.path.join(tree.root, 'out'))
    path = os.path.join(tree.root, 'out')
    with pytest.raises(exception.SysfsOutsideRoot) as e:
        reader.listdir(path)
    assert str(e.value) == (
        'refusing to read %s: it resolves to %s, outside the sysfs root %s'
        % (path, tmp_path, tree.root))


def test_isdir_and_functions_with(tree):
    reader = reader_mod.Reader(tree.root)
    assert reader.functions_with('sriov_totalvfs') == []
    tree.device(OTHER, sriov_totalvfs='4')
    tree.device(GPU, sriov_totalvfs='16')
    tree.device(VF1)
    assert reader.functions_with('sriov_totalvfs') == [GPU, OTHER]
    assert reader.isdir(tree.pci(GPU))
    assert not reader.isdir(os.path.join(tree.pci(GPU), 'vendor'))
    with pytest.raises(exception.UnsafePath):
        reader.functions_with('..')
    empty = reader_mod.Reader(os.path.join(tree.root, 'devices'))
    assert empty.functions_with('vendor') == []


def test_type_entries_are_sorted_and_tell_links(tree):
    tree.device(GPU)
    tree.mdev_type(GPU, TYPE2)
    tree.mdev_type(GPU, TYPE)
    types = os.path.join(tree.real(GPU), reader_mod.TYPES_DIR)
    os.symlink(TYPE, os.path.join(types, 'nvidia-1'))
    fd = os.open(types, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert reader_mod._type_entries(fd) == [
            ('nvidia-1', False), (TYPE, True), (TYPE2, True)]
    finally:
        os.close(fd)


def test_a_linked_type_is_read_where_it_leads_under_the_root(tree, tmp_path):
    tree.device(GPU)
    tree.device(OTHER)
    tree.mdev_type(OTHER, TYPE, available='2')
    types = os.path.join(tree.real(GPU), reader_mod.TYPES_DIR)
    os.makedirs(types)
    os.symlink(os.path.join(tree.real(OTHER), reader_mod.TYPES_DIR, TYPE),
               os.path.join(types, TYPE))
    reader = devices_mod.Sysfs(tree.root)
    assert [(t.id, t.available_instances)
            for t in reader.mdev_types(GPU)] == [(TYPE, 2)]
    os.symlink(str(tmp_path), os.path.join(types, TYPE2))
    skipped = []
    reader.mdev_types(GPU, skipped=skipped)
    assert _messages(skipped) == [
        'refusing to read %s: it resolves to %s, outside the sysfs root %s'
        % (os.path.join(tree.real(GPU), reader_mod.TYPES_DIR, TYPE2),
           tmp_path, tree.root)]


def test_a_linked_attribute_in_a_type_is_read_under_the_root(tree, tmp_path):
    tree.device(GPU)
    path = tree.mdev_type(GPU, TYPE, name=None)
    os.symlink('description', os.path.join(path, 'name'))
    reader = devices_mod.Sysfs(tree.root)
    assert reader.mdev_types(GPU)[0].name == 'num_heads=4, max_instance=4'
    os.unlink(os.path.join(path, 'description'))
    os.mkfifo(os.path.join(path, 'description'))
    with pytest.raises(exception.SysfsNotRegularFile) as e:
        reader.mdev_types(GPU)
    assert str(e.value).startswith('refusing to read %s: it is a FIFO' % (
        os.path.join(tree.pci(GPU), reader_mod.TYPES_DIR, TYPE, 'name')))


# -- reader: writing --------------------------------------------------------

def test_write_writes_the_file_it_resolves_to(tree):
    tree.device(GPU, sriov_numvfs='0')
    reader = reader_mod.Reader(tree.root)
    reader.write(os.path.join(tree.pci(GPU), 'sriov_numvfs'), '8')
    with open(os.path.join(tree.real(GPU), 'sriov_numvfs')) as f:
        assert f.read().strip() == '8'


def test_write_refusals(tree, tmp_path):
    tree.device(GPU)
    reader = reader_mod.Reader(tree.root)
    missing = os.path.join(tree.pci(GPU), 'none')
    with pytest.raises(exception.SysfsWriteError) as e:
        reader.write(missing, '1')
    assert str(e.value) == ('cannot write %s: No such file or directory'
                            % missing)
    assert e.value.kwargs['errno'] == 2
    os.mkfifo(os.path.join(tree.real(GPU), 'fifo'))
    fifo = os.path.join(tree.pci(GPU), 'fifo')
    with pytest.raises(exception.SysfsWriteError) as e:
        reader.write(fifo, '1')
    assert str(e.value) == ('cannot write %s: it is a FIFO, not a regular '
                            'file' % fifo)
    os.makedirs(os.path.join(tree.real(GPU), 'dir'))
    folder = os.path.join(tree.pci(GPU), 'dir')
    with pytest.raises(exception.SysfsWriteError) as e:
        reader.write(folder, '1')
    assert e.value.kwargs['errno'] == 21
    outside = tmp_path / 'secret'
    outside.write_text('0\n')
    os.symlink(str(outside), os.path.join(tree.real(GPU), 'out'))
    path = os.path.join(tree.pci(GPU), 'out')
    with pytest.raises(exception.UnsafePath) as e:
        reader.write(path, '1')
    assert str(e.value) == ('refusing path %s: it leaves the sysfs root %s'
                            % (path, tree.root))
    assert outside.read_text() == '0\n'


def test_own_file(tree):
    tree.device(GPU, remove='0')
    tree.device(OTHER, remove='0')
    reader = reader_mod.Reader(tree.root)
    assert reader.own_file(tree.pci(GPU), 'remove') == (
        os.path.join(tree.pci(GPU), 'remove'),
        os.path.join(tree.real(GPU), 'remove'))
    os.unlink(os.path.join(tree.real(GPU), 'remove'))
    os.symlink('../%s/remove' % OTHER,
               os.path.join(tree.real(GPU), 'remove'))
    with pytest.raises(exception.SysfsError) as e:
        reader.own_file(tree.pci(GPU), 'remove')
    assert str(e.value) == (
        'sysfs: %s: it leads to %s, not to the file of %s itself; nothing '
        'written' % (os.path.join(tree.pci(GPU), 'remove'),
                     os.path.join(tree.real(OTHER), 'remove'),
                     tree.real(GPU)))


# -- reader: errors met past the checks ------------------------------------

def test_a_path_too_long_to_open_is_named(tree):
    reader = reader_mod.Reader(tree.root)
    path = os.path.join(tree.root, *['x' * 200] * 25)
    with pytest.raises(exception.SysfsReadError) as e:
        reader.listdir(path)
    assert str(e.value) == 'cannot read %s: File name too long' % path


def test_a_read_that_fails_names_the_file(tmp_path):
    """``_read_fd`` on a descriptor the kernel refuses to read from."""
    fd = os.open(str(tmp_path / 'f'), os.O_WRONLY | os.O_CREAT)
    with pytest.raises(exception.SysfsReadError) as e:
        reader_mod._read_fd(fd, '/sys/x', 'vendor')
    assert str(e.value) == 'cannot read /sys/x/vendor: Bad file descriptor'


def test_a_link_read_in_a_directory_that_fails_is_named(tree):
    tree.device(GPU)
    reader = reader_mod.Reader(tree.root)
    dfd = os.open(tree.real(GPU), os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(exception.SysfsReadError) as e:
            reader._link_name_in(dfd, tree.pci(GPU), 'vendor/x')
    finally:
        os.close(dfd)
    assert str(e.value) == 'cannot read %s: Not a directory' % os.path.join(
        tree.pci(GPU), 'vendor/x')


def test_an_entry_the_file_system_cannot_type_is_not_plain():
    class Entry:
        def is_dir(self, follow_symlinks=True):
            raise OSError(5, 'Input/output error')
    assert reader_mod._plain_dir(Entry()) is False


def test_a_tree_that_changes_under_a_write_is_named(tree):
    class Racing(reader_mod.Reader):
        def resolved_under_root(self, path):
            raise FileNotFoundError(2, 'No such file or directory')
    path = os.path.join(tree.root, 'gone')
    with pytest.raises(exception.SysfsWriteError) as e:
        Racing(tree.root).write(path, '1')
    assert str(e.value) == 'cannot write %s: No such file or directory' % path
    assert e.value.kwargs['errno'] == 2


# -- safeopen (the walk under the root that ``write`` takes) ---------------

@pytest.mark.parametrize('relative', ['a/../b', '.', '', '/'])
def test_open_beneath_names_a_path_that_is_not_plain(tmp_path, relative):
    top = os.open(str(tmp_path), os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(OSError) as e:
            safeopen.open_beneath(top, relative, os.O_RDONLY)
    finally:
        os.close(top)
    assert str(e.value) == ('[Errno 22] not a plain relative path: %r'
                            % relative)


@pytest.mark.parametrize('use_openat2', [False, True])
def test_open_beneath_opens_with_the_flags_asked(tmp_path, use_openat2):
    (tmp_path / 'd').mkdir()
    (tmp_path / 'd' / 'f').write_text('0\n')
    top = os.open(str(tmp_path), os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd = safeopen.open_beneath(top, 'd/f', os.O_WRONLY | os.O_TRUNC,
                                   use_openat2=use_openat2)
    finally:
        os.close(top)
    try:
        os.write(fd, b'7')
    finally:
        os.close(fd)
    assert (tmp_path / 'd' / 'f').read_text() == '7'


# -- what is read relative to an open directory -----------------------------

def test_the_types_read_are_the_devices_own_whatever_the_cwd(
        tree, monkeypatch):
    tree.device(GPU)
    tree.device(OTHER)
    tree.mdev_type(GPU, TYPE)
    tree.mdev_type(OTHER, TYPE2)
    monkeypatch.chdir(tree.real(OTHER))
    found = _sysfs(tree).read_gpu(GPU, mdevs_by_parent={})
    assert [t.id for t in found.mdev_types] == [TYPE]


def test_pci_function_reads_an_attribute_linked_under_the_root(tree):
    tree.device(GPU)
    tree.write(GPU, ids='0x10de')
    os.unlink(os.path.join(tree.real(GPU), 'vendor'))
    os.symlink('ids', os.path.join(tree.real(GPU), 'vendor'))
    assert _sysfs(tree).pci_function(GPU).vendor_id == '10de'


def test_pci_function_names_a_class_that_is_no_file(tree):
    tree.device(GPU)
    os.unlink(os.path.join(tree.real(GPU), 'class'))
    os.mkfifo(os.path.join(tree.real(GPU), 'class'))
    with pytest.raises(exception.SysfsNotRegularFile) as e:
        _sysfs(tree).pci_function(GPU)
    assert str(e.value) == (
        'refusing to read %s: it is a FIFO, not a regular file as every '
        'sysfs attribute is' % os.path.join(tree.pci(GPU), 'class'))


def test_a_types_count_and_api_linked_under_the_root_are_read(tree):
    tree.device(GPU)
    path = tree.mdev_type(GPU, TYPE, available=None, device_api=None)
    tree.write(GPU, count='3', api='vfio-pci')
    os.symlink('../../count', os.path.join(path, 'available_instances'))
    os.symlink('../../api', os.path.join(path, 'device_api'))
    found = _sysfs(tree).mdev_types(GPU)
    assert [(t.available_instances, t.device_api) for t in found] == [
        (3, 'vfio-pci')]


def test_a_linked_type_on_a_warm_pass_takes_the_models_texts(tree):
    """A type read the thorough way (its directory a link) still takes
    the text its model's first parent showed."""
    tree.device(GPU)
    tree.device(OTHER)
    tree.mdev_type(GPU, TYPE, available='3')
    elsewhere = tree.mdev_type(VF1, TYPE, available='1', name='other name')
    os.makedirs(os.path.join(tree.real(OTHER), reader_mod.TYPES_DIR))
    os.symlink(elsewhere, os.path.join(tree.real(OTHER),
                                       reader_mod.TYPES_DIR, TYPE))
    sysfs = _sysfs(tree)
    cache = {}
    sysfs.mdev_types(GPU, cache, model='m')
    found = sysfs.mdev_types(OTHER, cache, model='m')
    assert [(t.name, t.available_instances) for t in found] == [
        ('GRID A', 1)]


def test_a_file_swapped_for_a_link_after_the_check_is_not_written(tree):
    """The check resolved the path; by the open its file is a link (a
    racer's): refused as a path leaving the root, nothing written."""
    tree.device(GPU, sriov_numvfs='0')
    alias = os.path.join(tree.real(GPU), 'alias')
    os.symlink('sriov_numvfs', alias)

    class Racing(reader_mod.Reader):
        def resolved_under_root(self, path):
            return alias
    path = os.path.join(tree.pci(GPU), 'sriov_numvfs')
    with pytest.raises(exception.UnsafePath) as e:
        Racing(tree.root).write(path, '4')
    assert str(e.value) == ('refusing path %s: it leaves the sysfs root %s'
                            % (path, tree.root))
    with open(os.path.join(tree.real(GPU), 'sriov_numvfs')) as f:
        assert f.read() == '0\n'


def test_a_file_in_a_directory_linked_out_of_the_root_is_refused(
        tree, tmp_path):
    outside = tmp_path / 'outside'
    outside.mkdir()
    (outside / 'vendor').write_text('0x10de\n')
    os.symlink(str(outside), os.path.join(tree.root, 'out'))
    path = os.path.join(tree.root, 'out', 'vendor')
    with pytest.raises(exception.SysfsOutsideRoot) as e:
        reader_mod.Reader(tree.root).read(path)
    assert str(e.value) == (
        'refusing to read %s: it resolves to %s, outside the sysfs root %s'
        % (path, outside / 'vendor', tree.root))


def test_a_read_is_the_trees_own_whatever_the_cwd(tree, monkeypatch):
    tree.device(GPU, label='gpu')
    tree.device(OTHER, label='other')
    monkeypatch.chdir(tree.real(OTHER))
    assert reader_mod.Reader(tree.root).read(
        os.path.join(tree.pci(GPU), 'label')) == 'gpu'


def test_a_socket_is_refused_by_name(tree, monkeypatch):
    import socket
    tree.device(GPU)
    monkeypatch.chdir(tree.real(GPU))
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind('sock')
        path = os.path.join(tree.pci(GPU), 'sock')
        with pytest.raises(exception.SysfsNotRegularFile) as e:
            reader_mod.Reader(tree.root).read(path)
    finally:
        sock.close()
    assert str(e.value) == (
        'refusing to read %s: it is a socket, not a regular file as every '
        'sysfs attribute is' % path)


def test_a_linked_file_over_the_bound_is_named_by_its_link(tree):
    tree.device(GPU)
    with open(os.path.join(tree.real(GPU), 'big'), 'w') as f:
        f.write('x' * (reader_mod.MAX_ATTRIBUTE_BYTES + 1))
    alias = os.path.join(tree.real(GPU), 'alias')
    os.symlink('big', alias)
    with pytest.raises(exception.SysfsFileTooLarge) as e:
        reader_mod.Reader(tree.root).read(alias)
    assert str(e.value) == (
        'refusing to read %s: it holds more than 65536 bytes, which no '
        'sysfs attribute does' % alias)


def test_a_physfn_that_is_no_link_is_named(tree):
    tree.device(GPU, physfn='0000:41:00.0')
    with pytest.raises(exception.SysfsReadError) as e:
        _sysfs(tree).read_gpu(GPU, mdevs_by_parent={})
    assert str(e.value) == (
        'cannot read %s: expected a link to a PCI device, found None'
        % os.path.join(tree.pci(GPU), 'physfn'))


def test_functions_with_on_a_tree_whose_pci_devices_is_a_file(tmp_path):
    os.makedirs(str(tmp_path / 'bus' / 'pci'))
    (tmp_path / 'bus' / 'pci' / 'devices').write_text('')
    assert reader_mod.Reader(tmp_path).functions_with('vendor') == []


def test_write_refuses_a_fifo_with_a_reader(tree):
    tree.device(GPU)
    fifo = os.path.join(tree.real(GPU), 'fifo')
    os.mkfifo(fifo)
    readable = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        path = os.path.join(tree.pci(GPU), 'fifo')
        with pytest.raises(exception.SysfsWriteError) as e:
            reader_mod.Reader(tree.root).write(path, '1')
        assert os.read(readable, 10) == b''     # nothing was written
    finally:
        os.close(readable)
    assert str(e.value) == ('cannot write %s: it is a FIFO, not a regular '
                            'file' % path)
    assert e.value.kwargs['errno'] is None


def test_the_kernels_refusal_of_a_write_is_passed_on(tree, monkeypatch):
    """sysfs answers a write it refuses (``create`` of a type with no
    room: EINVAL, a busy device: EBUSY) with an errno: it is kept."""
    import errno
    tree.device(GPU, create='')
    target = os.path.join(tree.real(GPU), 'create')
    real_write = os.write

    def write(fd, data):
        if os.readlink('/proc/self/fd/%d' % fd) == target:
            raise OSError(errno.EBUSY, os.strerror(errno.EBUSY))
        return real_write(fd, data)
    monkeypatch.setattr(reader_mod.os, 'write', write)
    path = os.path.join(tree.pci(GPU), 'create')
    with pytest.raises(exception.SysfsWriteError) as e:
        reader_mod.Reader(tree.root).write(path, UUID)
    assert str(e.value) == ('cannot write %s: Device or resource busy'
                            % path)
    assert e.value.kwargs['errno'] == errno.EBUSY


def test_own_file_of_a_tree_that_changes_under_it(tree):
    class Racing(reader_mod.Reader):
        def resolved_under_root(self, path):
            raise FileNotFoundError(2, 'No such file or directory')
    with pytest.raises(exception.SysfsError) as e:
        Racing(tree.root).own_file(tree.pci(GPU), 'remove')
    assert str(e.value) == ('sysfs: %s: No such file or directory'
                            % os.path.join(tree.pci(GPU), 'remove'))


def test_a_device_that_is_not_there_is_named(tree):
    sysfs = _sysfs(tree)
    path = tree.pci(GPU)
    for read in (sysfs.pci_class, sysfs.read_gpu, sysfs.pci_function):
        with pytest.raises(exception.SysfsReadError) as e:
            read(GPU)
        assert str(e.value) == 'cannot read %s: no such directory' % path


# -- bounds.CpuList and parse_cpulist (what ``locality`` returns) -----------

def _cpus(text):
    return bounds.parse_cpulist(text)


def test_a_cpu_list_answers_membership_at_every_edge():
    cpus = _cpus('0-3,8-11,20,30-31')
    inside = set(range(0, 4)) | set(range(8, 12)) | {20, 30, 31}
    for n in range(0, 40):
        assert (n in cpus) is (n in inside), n
    assert 5 not in _cpus('')
    assert len(cpus) == 11 and len(_cpus('5')) == 1 and len(_cpus('')) == 0
    assert bool(cpus) and not _cpus('') and not bounds.EMPTY
    assert bounds.EMPTY == _cpus('')


def test_a_cpu_list_compares_with_sets_by_members():
    cpus = _cpus('0-2,5')
    assert cpus == {0, 1, 2, 5} and cpus == frozenset({0, 1, 2, 5})
    assert cpus != {0, 1, 2} and cpus != {0, 1, 2, 6}
    assert cpus != {0, 1, 2, 5, 6}
    assert cpus != [0, 1, 2, 5] and cpus != '0-2,5'
    assert cpus != _cpus('0-2')


@pytest.mark.parametrize('a, b, shared', [
    ('0-3', '4-7', False), ('0-3', '3-7', True), ('4-7', '0-4', True),
    ('0-1,10-11', '2-9,12', False), ('0-1,10-11', '2-9,11', True),
    ('2-9,11', '0-1,10-11', True), ('5', '0-4,6-9', False),
    ('5', '0-1,5,9', True), ('0-1,5,9', '5', True),
    ('', '0-9', False), ('0-9', '', False)])
def test_cpu_lists_intersect(a, b, shared):
    assert _cpus(a).intersects(_cpus(b)) is shared
    assert _cpus(a).intersects(set(_cpus_members(b))) is shared


def _cpus_members(text):
    return [n for first, last in _cpus(text).ranges
            for n in range(first, last + 1)]


@pytest.mark.parametrize('text, ranges', [
    (' 0 - 3 , 5 ', ((0, 3), (5, 5))),
    ('0-9,^0', ((1, 9),)),
    ('0-9,^9', ((0, 8),)),
    ('0-9,^3-5,^7', ((0, 2), (6, 6), (8, 9))),
    ('0-3,8-11,^2-9', ((0, 1), (10, 11))),
    ('^2,0-4', ((0, 1), (3, 4))),
    ('0-3,^0-3', ()),
    ('0-3,^5', ((0, 3),)),
    ('5-9,^0-2', ((5, 9),)),
    ('0-2,4-6,^1,^5', ((0, 0), (2, 2), (4, 4), (6, 6))),
    (',,1,,', ((1, 1),)),
    ('', ()),
    (None, ()),
    ('3-3', ((3, 3),)),
])
def test_cpu_lists_are_read_as_ranges(text, ranges):
    assert bounds.parse_cpulist(text).ranges == ranges


@pytest.mark.parametrize('bad', [
    '3-2', '-1', '1-', '^', 'a', '1-a', '1--2', '0x1', '0000001',
    '0-0000001', '\u0661', '%d' % bounds.MAX_CPU, '0-%d' % bounds.MAX_CPU])
def test_cpu_list_refusals_say_what_a_list_is(bad):
    with pytest.raises(exception.InvalidInput) as e:
        bounds.parse_cpulist('0,' + bad, 'cpuset')
    assert str(e.value) == (
        'Invalid input: cpuset %r is not a list of numbers and ranges '
        '(0-15,32) below %d' % (('0,' + bad)[:40], bounds.MAX_CPU))


def test_cpu_list_length_refusals_name_the_counts():
    text = '0' * (bounds.MAX_CPULIST_CHARS + 1)
    with pytest.raises(exception.InvalidInput) as e:
        bounds.parse_cpulist(text, 'nodeset')
    assert str(e.value) == (
        'Invalid input: nodeset is %d characters long, more than the %d '
        'allowed' % (bounds.MAX_CPULIST_CHARS + 1, bounds.MAX_CPULIST_CHARS))
    text = ',' * bounds.MAX_CPULIST_PARTS
    with pytest.raises(exception.InvalidInput) as e:
        bounds.parse_cpulist(text, 'nodeset')
    assert str(e.value) == (
        'Invalid input: nodeset has %d parts, more than the %d allowed'
        % (bounds.MAX_CPULIST_PARTS + 1, bounds.MAX_CPULIST_PARTS))
    assert bounds.parse_cpulist(',' * (bounds.MAX_CPULIST_PARTS - 1)) \
        == bounds.EMPTY


def test_check_instances_says_the_bound():
    with pytest.raises(exception.InvalidInput) as e:
        bounds.check_instances(bounds.MAX_INSTANCES + 1, 'max_instance')
    assert str(e.value) == (
        'Invalid input: max_instance is %d, more than the %d instances of '
        'one type a GPU can hold' % (bounds.MAX_INSTANCES + 1,
                                     bounds.MAX_INSTANCES))


def _open_fds():
    return len(os.listdir('/proc/self/fd'))


@pytest.mark.parametrize('use_openat2', [False, True])
def test_open_beneath_leaves_only_the_descriptor_it_returns(
        tmp_path, use_openat2):
    (tmp_path / 'a' / 'b').mkdir(parents=True)
    (tmp_path / 'a' / 'b' / 'f').write_text('x')
    os.symlink('b', str(tmp_path / 'a' / 'l'))
    top = os.open(str(tmp_path), os.O_RDONLY | os.O_DIRECTORY)
    try:
        before = _open_fds()
        fd = safeopen.open_beneath(top, 'a/b/f', os.O_RDONLY,
                                   use_openat2=use_openat2)
        assert _open_fds() == before + 1
        assert os.read(fd, 10) == b'x'
        os.close(fd)
        for refused in ('a/l/f', 'a/b/none'):
            with pytest.raises(OSError):
                safeopen.open_beneath(top, refused, os.O_RDONLY,
                                      use_openat2=use_openat2)
            assert _open_fds() == before
    finally:
        os.close(top)


def test_a_kernel_without_openat2_gets_the_walk(tmp_path, monkeypatch):
    import errno

    def enosys(dir_fd, path, flags):
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS), path)
    monkeypatch.setattr(safeopen, '_openat2', enosys)
    (tmp_path / 'f').write_text('x')
    top = os.open(str(tmp_path), os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd = safeopen.open_beneath(top, 'f', os.O_RDONLY, use_openat2=True)
        os.close(fd)
    finally:
        os.close(top)
    assert safeopen._openat2 is False     # not tried again


@pytest.fixture
def fresh_openat2(monkeypatch):
    """``open_beneath`` as on the first call of a process: openat2 not
    looked up yet."""
    monkeypatch.setattr(safeopen, '_openat2', None)


@pytest.fixture
def beneath(tmp_path):
    (tmp_path / 'a' / 'b').mkdir(parents=True)
    (tmp_path / 'a' / 'b' / 'f').write_text('0\n')
    os.symlink('b', str(tmp_path / 'a' / 'l'))
    os.symlink(str(tmp_path / 'a' / 'b'), str(tmp_path / 'a' / 'abs'))
    os.symlink('f', str(tmp_path / 'a' / 'b' / 'lf'))
    top = os.open(str(tmp_path), os.O_RDONLY | os.O_DIRECTORY)
    yield top
    os.close(top)


def test_openat2_looked_up_opens_with_the_flags_asked(fresh_openat2,
                                                      beneath, tmp_path):
    fd = safeopen.open_beneath(beneath, 'a/b/f', os.O_WRONLY | os.O_TRUNC,
                               use_openat2=True)
    try:
        os.write(fd, b'5')
    finally:
        os.close(fd)
    assert (tmp_path / 'a' / 'b' / 'f').read_text() == '5'
    assert callable(safeopen._openat2)        # looked up once, kept


@pytest.mark.parametrize('relative', ['a/l/f', 'a/abs/f', 'a/b/lf'])
def test_openat2_refuses_every_link_on_the_way(fresh_openat2, beneath,
                                               relative):
    """openat2 says ELOOP for a link anywhere on the way (the walk says
    ENOTDIR for one before the end), naming the path."""
    with pytest.raises(OSError) as e:
        safeopen.open_beneath(beneath, relative, os.O_RDONLY,
                              use_openat2=True)
    assert str(e.value) == '[Errno 40] %s: %r' % (os.strerror(40), relative)


@pytest.mark.parametrize('use_openat2', [False, True])
def test_open_beneath_descriptors_close_on_exec(fresh_openat2, beneath,
                                                use_openat2):
    import fcntl
    fd = safeopen.open_beneath(beneath, 'a/b/f', os.O_RDONLY,
                               use_openat2=use_openat2)
    try:
        assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
    finally:
        os.close(fd)


def test_open_beneath_walks_unless_asked_for_openat2(fresh_openat2,
                                                     beneath):
    """The walk (the default) meets the link as a directory it may not
    follow: ENOTDIR naming the component, where openat2 says ELOOP."""
    with pytest.raises(OSError) as e:
        safeopen.open_beneath(beneath, 'a/l/f', os.O_RDONLY)
    assert str(e.value) == "[Errno 20] Not a directory: 'l'"
    assert safeopen._openat2 is None          # never looked up
