"""What libvirt's node-device XML becomes that the host tests left open:
each test here fails on a change ``make mutation`` made to
virt/nodedev.py that the rest stayed green on (docs/dev/mutation.md):
every field of each record, the bounds of a count, the whole refusal."""

import pytest

from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.virt import nodedev

UUID = '4b20d080-1b54-4048-85b3-a6a62d165c01'
A = objects.PciAddress.parse

GPU_XML = '''<device>
  <name>pci_0000_af_00_0</name>
  <parent>pci_0000_ae_00_0</parent>
  <driver><name> nvidia </name></driver>
  <capability type='pci'>
    <class>0x030200</class>
    <domain>1</domain><bus>175</bus><slot>2</slot><function>3</function>
    <product id='0x1EB8'> TU104GL [Tesla T4] </product>
    <vendor id='0x10de'>NVIDIA Corporation</vendor>
    <capability type='mdev_types'>
      <type id='nvidia-224'><name>GRID T4-2B4</name>
        <deviceAPI>vfio-pci</deviceAPI>
        <availableInstances> 4 </availableInstances></type>
      <type id='nvidia-223'><name>GRID T4-2B</name>
        <deviceAPI>vfio-pci</deviceAPI></type>
    </capability>
    <capability type='virt_functions' maxCount='16'>
      <address domain='0x0001' bus='0xaf' slot='0x00' function='0x5'/>
      <address domain='0x0001' bus='0xaf' slot='0x00' function='0x4'/>
    </capability>
    <capability type='phys_function'>
      <address domain='0x0002' bus='0x3b' slot='0x1f' function='0x7'/>
    </capability>
    <iommuGroup number='58'>
      <address domain='0x0001' bus='0xaf' slot='0x02' function='0x3'/>
      <address domain='0x0001' bus='0xaf' slot='0x02' function='0x1'/>
    </iommuGroup>
    <numa node='%s'/>
  </capability>
</device>'''


def _gpu(numa='1'):
    return nodedev.parse_pci(GPU_XML % numa)


def test_every_field_of_a_gpu():
    gpu = nodedev.parse_pci(GPU_XML % '1', {
        objects.TypeId.parse('nvidia-223'): 'two gigabytes'})
    assert gpu.address == objects.PciAddress(1, 175, 2, 3)
    assert (gpu.vendor_id, gpu.product_id) == ('10de', '1eb8')
    assert gpu.class_code == '0x030200'
    assert gpu.driver == 'nvidia'
    assert gpu.numa_node == 1
    assert gpu.iommu_group == 58
    assert gpu.vendor_name == 'NVIDIA Corporation'
    assert gpu.product_name == 'TU104GL [Tesla T4]'
    assert gpu.physfn == A('0002:3b:1f.7')
    assert gpu.virtfns == (A('0001:af:00.4'), A('0001:af:00.5'))
    assert [m.address for m in gpu.iommu_members] == [
        A('0001:af:02.1'), A('0001:af:02.3')]
    assert all((m.vendor_id, m.product_id, m.class_code, m.driver) ==
               (None, None, None, None) for m in gpu.iommu_members)
    first, second = gpu.mdev_types
    assert (str(first.id), first.name, first.device_api,
            first.available_instances, first.description) == (
        'nvidia-223', 'GRID T4-2B', 'vfio-pci', 0, 'two gigabytes')
    assert (str(second.id), second.name, second.device_api,
            second.available_instances, second.description) == (
        'nvidia-224', 'GRID T4-2B4', 'vfio-pci', 4, None)


@pytest.mark.parametrize('numa,node', [('-1', None), ('0', 0), ('3', 3)])
def test_numa_node_minus_one_is_unknown(numa, node):
    assert _gpu(numa).numa_node == node


def test_what_libvirt_leaves_out_is_none():
    gpu = nodedev.parse_pci('''<device><name>pci_0000_01_00_0</name>
      <capability type='pci'><domain>0</domain><bus>1</bus><slot>0</slot>
      <function>0</function><product id='0x1eb8'/>
      <vendor id='0x10de'> </vendor></capability></device>''')
    assert gpu.address == A('0000:01:00.0')
    assert (gpu.class_code, gpu.driver, gpu.numa_node, gpu.iommu_group,
            gpu.vendor_name, gpu.product_name, gpu.physfn) == (None,) * 7
    assert (gpu.virtfns, gpu.mdev_types, gpu.iommu_members) == ((), (), ())


def test_not_a_pci_device_is_refused():
    xml = "<device><name>net_eth0</name><capability type='net'/></device>"
    with pytest.raises(ValueError) as info:
        nodedev.parse_pci(xml)
    assert str(info.value) == 'net_eth0 is not a PCI device'
    with pytest.raises(ValueError) as info:
        nodedev.parse_function(xml)
    assert str(info.value) == 'net_eth0 is not a PCI device'


def _type_xml(count):
    return ('''<device><name>pci_0000_01_00_0</name>
      <capability type='pci'><domain>0</domain><bus>1</bus><slot>0</slot>
      <function>0</function><product id='0x1eb8'/><vendor id='0x10de'/>
      <capability type='mdev_types'><type id='nvidia-223'>
      <availableInstances>%s</availableInstances></type></capability>
      </capability></device>''' % count)


@pytest.mark.parametrize('count,found', [
    ('0', 0), ('4096', 4096), ('', 0), ('007', 7)])
def test_available_instances_up_to_the_bound(count, found):
    gpu = nodedev.parse_pci(_type_xml(count))
    assert gpu.mdev_types[0].available_instances == found


@pytest.mark.parametrize('count,reason', [
    ('4097', 'availableInstances of vGPU type nvidia-223 is 4097, more than '
             'the 4096 instances of one type a GPU can hold'),
    ('9' * 19, 'availableInstances of vGPU type nvidia-223 is %s, more than '
               'the 4096 instances of one type a GPU can hold' % ('9' * 19)),
    ('1' * 20, "availableInstances of vGPU type nvidia-223 is '%s', not a "
               "count" % ('1' * 20)),
    ('-1', "availableInstances of vGPU type nvidia-223 is '-1', not a count"),
    ('\u0663', "availableInstances of vGPU type nvidia-223 is '\u0663', not "
               "a count"),
    ('x' * 50, "availableInstances of vGPU type nvidia-223 is '%s', not a "
               "count" % ('x' * 40)),
])
def test_available_instances_refusal_reads_whole(count, reason):
    with pytest.raises(exception.InvalidInput) as info:
        nodedev.parse_pci(_type_xml(count))
    assert str(info.value) == 'Invalid input: ' + reason


def test_pci_class():
    assert nodedev.pci_class(GPU_XML % '0') == '0x030200'
    assert nodedev.pci_class('<device><capability type="net"><class>x'
                             '</class></capability></device>') is None


def test_parse_function_every_field():
    member = nodedev.parse_function(GPU_XML % '0')
    assert member == objects.IommuMember(
        address=objects.PciAddress(1, 175, 2, 3), vendor_id='10de',
        product_id='1eb8', class_code='0x030200', driver='nvidia')
    bare = nodedev.parse_function(
        "<device><name>pci_0000_01_00_1</name><capability type='pci'>"
        "<domain>0</domain><bus>1</bus><slot>0</slot><function>1</function>"
        "</capability></device>")
    assert bare == objects.IommuMember(
        address=A('0000:01:00.1'), vendor_id=None, product_id=None,
        class_code=None, driver=None)


def _mdev_xml(name, parent='pci_0000_af_00_0', uuid=None):
    return ("<device><name>%s</name><parent>%s</parent>"
            "<capability type='mdev'><type id='nvidia-223'/>%s"
            "<iommuGroup number='1'/></capability></device>"
            % (name, parent,
               '<uuid> %s </uuid>' % uuid if uuid is not None else ''))


def test_an_mdev_with_its_uuid_element():
    node = nodedev.parse_mdev(_mdev_xml('mdev_x', uuid=UUID.upper()))
    assert node == nodedev.MdevNode(
        name='mdev_x', parent=A('0000:af:00.0'),
        mdev=objects.Mdev(uuid=objects.Uuid.parse(UUID),
                          type_id=objects.TypeId.parse('nvidia-223')))


@pytest.mark.parametrize('name', [
    'mdev_' + UUID.replace('-', '_'),
    'mdev_' + UUID.replace('-', '_') + '_0000_af_00_0'])
def test_an_mdev_without_uuid_element_takes_it_from_its_name(name):
    node = nodedev.parse_mdev(_mdev_xml(name))
    assert node.name == name
    assert node.mdev.uuid == objects.Uuid.parse(UUID)


def test_an_mdev_whose_parent_libvirt_did_not_see_has_none():
    node = nodedev.parse_mdev(_mdev_xml('mdev_x', parent='computer',
                                        uuid=UUID))
    assert node.parent is None


def test_not_an_mdev_is_refused():
    with pytest.raises(ValueError) as info:
        nodedev.parse_mdev(GPU_XML % '0')
    assert str(info.value) == 'pci_0000_af_00_0 is not an mdev'


@pytest.mark.parametrize('parse', [nodedev.parse_pci, nodedev.parse_function,
                                   nodedev.parse_mdev, nodedev.pci_class])
def test_malformed_xml_is_refused_as_node_device_xml(parse):
    with pytest.raises(exception.InvalidXml) as info:
        parse('<device>')
    assert str(info.value) == ('Refused XML: node-device XML is malformed: '
                               'no element found: line 1, column 8')


def test_names_without_text_are_none():
    gpu = nodedev.parse_pci('''<device><name>pci_0000_01_00_0</name>
      <capability type='pci'><domain>0</domain><bus>1</bus><slot>0</slot>
      <function>0</function><product id='0x1eb8'> </product>
      <vendor id='0x10de'/></capability></device>''')
    assert (gpu.vendor_name, gpu.product_name) == (None, None)


@pytest.mark.parametrize('cut, named', [
    ('<domain>1</domain>', 'node-device XML has no domain'),
    ('<function>3</function>', 'node-device XML has no function'),
    ("<vendor id='0x10de'>NVIDIA Corporation</vendor>",
     'node-device XML has no vendor'),
    ("<product id='0x1EB8'> TU104GL [Tesla T4] </product>",
     'node-device XML has no product'),
])
def test_an_element_libvirt_always_writes_is_named_when_missing(cut, named):
    # libvirt writes these; a document without one is no node device of
    # libvirt's, said by name rather than failing in int(None)
    with pytest.raises(ValueError) as e:
        nodedev.parse_pci((GPU_XML % '1').replace(cut, ''))
    assert str(e.value) == named


def test_an_iommu_group_without_its_number_is_named():
    xml = (GPU_XML % '1').replace("<iommuGroup number='58'>", '<iommuGroup>')
    with pytest.raises(ValueError) as e:
        nodedev.parse_pci(xml)
    assert str(e.value) == 'node-device XML: <iommuGroup> has no number'


def test_an_mdev_without_its_type_or_name_is_named():
    xml = _mdev_xml('mdev_' + UUID.replace('-', '_'), uuid=UUID)
    with pytest.raises(ValueError) as e:
        nodedev.parse_mdev(xml.replace("<type id='nvidia-223'/>", ''))
    assert str(e.value) == 'node-device XML has no type'
    with pytest.raises(ValueError) as e:
        nodedev.parse_mdev(xml.replace(
            '<name>mdev_%s</name>' % UUID.replace('-', '_'), ''))
    assert str(e.value) == 'node-device XML has no name'
