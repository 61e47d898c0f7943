"""The real H100 host (tests/data/h100-passthrough) and copies of it with
IOMMU groups added (tests/h100.py): IOMMU groups, NUMA, names."""

import json
import re

from libvirt_gpu.devices import discovery
from libvirt_gpu.virt import nodedev
from libvirt_gpu import objects
from libvirt_gpu.devices import pciids
from libvirt_gpu import simulator
from libvirt_gpu.devices import sysfs as sysfs_mod
from libvirt_gpu.cmd import main as cli
from libvirt_gpu.openstack import cyborg_objects
from libvirt_gpu.openstack.placement import model
from tests.doubles import h100
from tests.doubles import tables
from tests.doubles import fakes
from tests.doubles import kinds
from libvirt_gpu.util import records

NAME = re.compile(r'GH100 ?\[H100 SXM5 80GB\]')   # see test_pciids


def _gpus(root):
    return discovery.from_sysfs(sysfs_mod.Sysfs(root),
                                pci_ids=pciids.PciIds(),
                                kinds=kinds.registered()).gpus


def _cli(capsys, root, *argv):
    code = cli.main(['--config-file', '/dev/null', '--hostname', 'h100',
                     '--sysfs-root', root] + list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


# -- the capture as it is -------------------------------------------------

def test_capture_reads_as_captured(h100_sysfs):
    (gpu,) = _gpus(h100_sysfs)
    assert (str(gpu.address), gpu.vendor_id, gpu.product_id, gpu.class_code,
            gpu.driver) == (h100.GPU, '10de', '2330', '0x030200', 'nvidia')
    assert gpu.iommu_group is None and gpu.iommu_members == ()
    assert gpu.numa_node is None            # numa_node -1: unknown
    assert gpu.local_cpulist == '0-15'
    assert gpu.vendor_name == 'NVIDIA Corporation'
    assert NAME.fullmatch(gpu.product_name)
    assert not gpu.mdev_types and not gpu.virtfns


def test_no_iommu_group_is_not_offered(h100_sysfs):
    gpus = _gpus(h100_sysfs)
    assert model.pgpu_refusal(gpus[0]) == model.NO_IOMMU_GROUP
    tree = model.build_tree('h100', gpus, {})
    assert tree.children == ()
    # Cyborg gets the GPU with nothing to offer, and we say why
    (device,) = cyborg_objects.driver_devices('h100', gpus, {})
    assert device.deployable_list == ()
    assert cyborg_objects.withheld_gpus(gpus, {}) == {
        gpus[0].address: 'not offered whole: %s' % model.NO_IOMMU_GROUP}


def test_vgpu_parent_needs_no_group():
    """mdevs and VFs get IOMMU groups of their own: a vGPU parent is
    offered without one."""
    gpu = records.replace(fakes.gpu(), iommu_group=None)
    enabled = objects.EnabledType('nvidia-223')
    assert model.offered(gpu, enabled)
    tree = model.build_tree('h', [gpu], {gpu.address: enabled})
    (child,) = tree.children
    assert child.inventories[0].resource_class == 'VGPU'
    assert not model.offered(gpu, None)


def test_cli_list_table(capsys, h100_sysfs):
    out = _cli(capsys, h100_sysfs, 'list')
    row = tables.row(out, h100.GPU)
    assert NAME.fullmatch(row['PRODUCT'])
    assert (row['NUMA'], row['CPUS'], row['IOMMU'], row['GROUP MEMBERS'],
            row['CAPACITY']) == ('-', '0-15', '-', '-', '0')
    assert '%s: not offered whole: no IOMMU group' % h100.GPU in out
    assert 'intel_iommu=on' in out


def test_cli_list_json(capsys, h100_sysfs):
    (gpu,) = json.loads(_cli(capsys, h100_sysfs, 'list', '--json'))
    assert NAME.fullmatch(gpu['product_name'])
    assert (gpu['numa_node'], gpu['local_cpulist'], gpu['iommu_group'],
            gpu['iommu_members']) == (None, '0-15', None, [])
    assert gpu['not_assignable'] == model.NO_IOMMU_GROUP


def test_cli_placement_and_discover(capsys, h100_sysfs):
    doc = json.loads(_cli(capsys, h100_sysfs, 'placement', 'show', '--json'))
    assert [p['name'] for p in doc['resource_providers']] == ['h100']
    doc = json.loads(_cli(capsys, h100_sysfs, 'discover', '--json'))
    (device,) = doc
    assert device['deployable_list'] == []
    vendor, _, product = device['model'].partition(' Corporation ')
    assert vendor == 'NVIDIA' and NAME.fullmatch(product)


# -- with IOMMU groups added --------------------------------------------------

def test_audio_function_is_a_companion(h100_audio_sysfs):
    (gpu,) = _gpus(h100_audio_sysfs)
    assert gpu.iommu_group == h100.GPU_GROUP
    assert [(str(m.address), m.class_code, m.driver, m.companion,
             m.host_uses) for m in gpu.iommu_members] == [
        (h100.GPU, '0x030200', 'nvidia', False, False),
        (h100.AUDIO, '0x040300', 'snd_hda_intel', True, False)]
    (child,) = model.build_tree('h100', [gpu], {}).children
    assert (child.inventories[0].resource_class,
            child.inventories[0].total) == ('PGPU', 1)


def test_audio_group_in_list(capsys, h100_audio_sysfs):
    out = _cli(capsys, h100_audio_sysfs, 'list')
    row = tables.row(out, h100.GPU)
    assert (row['IOMMU'], row['GROUP MEMBERS'], row['CAPACITY']) == (
        str(h100.GPU_GROUP), h100.AUDIO, '1')
    assert 'not offered' not in out and 'host uses' not in out
    (gpu,) = json.loads(_cli(capsys, h100_audio_sysfs, 'list', '--json'))
    assert gpu['not_assignable'] is None
    assert gpu['iommu_members'][1] == {
        'address': h100.AUDIO, 'vendor_id': '10de', 'product_id': '22ba',
        'class': '0x040300', 'driver': 'snd_hda_intel', 'companion': True,
        'host_uses': False}


def test_nic_in_the_group_is_a_host_device(capsys, h100_nic_sysfs):
    (gpu,) = _gpus(h100_nic_sysfs)
    nic = [m for m in gpu.iommu_members if str(m.address) == h100.NIC]
    assert [(m.class_code, m.driver, m.companion, m.host_uses)
            for m in nic] == [('0x020000', 'virtio-pci', False, True)]
    out = _cli(capsys, h100_nic_sysfs, 'list')
    assert tables.row(out, h100.GPU)['GROUP MEMBERS'] == h100.NIC
    assert ('%s: IOMMU group %d also holds %s (network controller, driver '
            'virtio-pci), which the host uses'
            % (h100.GPU, h100.GPU_GROUP, h100.NIC)) in out


def test_a_nic_bound_to_vfio_is_not_the_hosts(tmp_path):
    root = h100.copy_capture(tmp_path / 'sys')
    h100.add_function(root, '0000:00:07.0', '0x8086', '0x1572', '0x020000',
                      'vfio-pci')
    h100.put_in_group(root, 3, [h100.GPU, '0000:00:07.0'])
    (gpu,) = _gpus(root)
    assert [m.host_uses for m in gpu.iommu_members] == [False, False]


def test_libvirt_reports_the_same_members(tmp_path):
    """The mixed profile's RTX A6000 and its audio function share a group;
    libvirt (test driver, members from <iommuGroup><address/>) and sysfs
    agree on the members and their judgement."""
    node_xml = simulator.write_host(simulator.load_profile('mixed'),
                                    tmp_path)
    from libvirt_gpu.virt import host
    by_sysfs = discovery.from_sysfs(sysfs_mod.Sysfs(tmp_path),
                                    kinds=kinds.registered())
    with host.Host('test://' + node_xml, read_only=True) as h:
        by_libvirt = discovery.from_libvirt(h, sysfs_mod.Sysfs(tmp_path),
                                            kinds=kinds.registered())
    for result in (by_sysfs, by_libvirt):
        gpu = result.gpu(objects.PciAddress.parse('0000:d8:00.0'))
        assert [(str(m.address), m.companion, m.host_uses)
                for m in gpu.iommu_members] == [
            ('0000:d8:00.0', False, False), ('0000:d8:00.1', True, False)]
        assert gpu.iommu_members[1].class_code == '0x040300'


def test_libvirt_numa_minus_one_is_unknown():
    xml = '''<device><name>pci_0000_00_06_0</name>
      <capability type='pci'><class>0x030200</class>
        <domain>0</domain><bus>0</bus><slot>6</slot><function>0</function>
        <product id='0x2330'/><vendor id='0x10de'/>
        <numa node='-1'/></capability></device>'''
    gpu = nodedev.parse_pci(xml)
    assert gpu.numa_node is None and gpu.iommu_members == ()
