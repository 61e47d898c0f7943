"""What the CLI prints, pinned whole: each test here fails on a change
``make mutation`` made to cmd/output.py that the rest stayed green on
(docs/dev/mutation.md).

The renderers are called in this process with the records the commands
hand them (guests.api's ``Attachment``/``DomainGpus``, the installer's
``Installed``, capacity's ``DriverRoom``, migration's ``Plan`` and
``Outcome``, Placement's tree, the Cyborg driver's devices); the CLI's own
tests run it as a program, which a mutant of this module never reaches."""

import errno
import io
import json
import sys

import pytest

from libvirt_gpu import objects
from libvirt_gpu.cmd import output
from libvirt_gpu.devices import capacity
from libvirt_gpu.guests import api
from libvirt_gpu.guests import migration
from libvirt_gpu.guests.hook import installer
from libvirt_gpu.openstack import cyborg_objects
from libvirt_gpu.openstack.placement import model
from libvirt_gpu.openstack.placement import tree as tree_mod
from libvirt_gpu.util import records

GPU = objects.PciAddress.parse('0000:af:00.0')
OTHER = objects.PciAddress.parse('0000:3b:00.0')
VM = '5a1b0d2e-6f3c-4d8e-9a7b-0c1d2e3f4a5b'
U1 = '4b20d080-1b54-4048-85b3-a6a62d165c01'
U2 = '4b20d080-1b54-4048-85b3-a6a62d165c02'


class _Terminal(io.StringIO):
    def isatty(self):
        return True


# --- writers -----------------------------------------------------------------

def test_dumps_compact_and_pretty_with_sorted_keys_unless_told():
    document = {'b': 1, 'a': [1, 2]}
    assert output.dumps(document) == '{"a":[1,2],"b":1}'
    assert output.dumps(document, keys_sorted=True) == '{"b":1,"a":[1,2]}'
    assert output.dumps(document, pretty=True) == (
        '{\n  "a": [\n    1,\n    2\n  ],\n  "b": 1\n}')
    assert output.dumps(document, pretty=True, keys_sorted=True) == (
        '{\n  "b": 1,\n  "a": [\n    1,\n    2\n  ]\n}')


def test_emit_json_keeps_the_order_it_is_told_is_sorted():
    stream = io.StringIO()
    output.emit_json({'b': 1, 'a': 2}, stream, keys_sorted=True)
    assert stream.getvalue() == '{"b":1,"a":2}\n'
    terminal = _Terminal()
    output.emit_json({'b': 1, 'a': 2}, terminal, keys_sorted=True)
    assert terminal.getvalue() == '{\n  "b": 1,\n  "a": 2\n}\n'


def test_emit_json_writes_to_stdout_by_default(capsys):
    output.emit_json({'b': None, 'a': 'x'})
    assert capsys.readouterr() == ('{"a":"x","b":null}\n', '')


DOCUMENTS = [{'address': 'a', 'mdev_types': [{'id': 'x'}], 'z': 1}]


def test_emit_gpus_json_one_line_for_scripts(capsys):
    stream = io.StringIO()
    output.emit_gpus_json(DOCUMENTS, stream)
    assert stream.getvalue() == (
        '[{"address":"a","mdev_types":[{"id":"x"}],"z":1}]\n')
    output.emit_gpus_json(DOCUMENTS)
    assert capsys.readouterr() == (
        '[{"address":"a","mdev_types":[{"id":"x"}],"z":1}]\n', '')


def test_emit_gpus_json_indented_on_a_terminal_in_its_own_order():
    terminal = _Terminal()
    output.emit_gpus_json([{'z': 1, 'mdev_types': []}], terminal)
    assert terminal.getvalue() == (
        '[\n  {\n    "z": 1,\n    "mdev_types": []\n  }\n]\n')


def test_gpus_json_text_keys_around_the_types():
    shared = {'id': 'nvidia-222', 'available_instances': 16}
    documents = [{'address': 'a', 'mdev_types': [shared, shared],
                  'mdevs': [], 'mode': 'vgpu'},
                 {'address': 'b', 'mdev_types': [shared]}]
    assert output.gpus_json_text(documents) == (
        '[{"address":"a","mdev_types":[{"id":"nvidia-222",'
        '"available_instances":16},{"id":"nvidia-222",'
        '"available_instances":16}],"mdevs":[],"mode":"vgpu"},'
        '{"address":"b","mdev_types":[{"id":"nvidia-222",'
        '"available_instances":16}]}]')


def test_notes_errors_and_internal_errors(capsys):
    output.emit_text('one\ntwo')
    output.emit_note('aside')
    assert capsys.readouterr() == ('one\ntwo\naside\n', '')
    output.emit_note('aside', as_json=True)
    output.emit_error('libvirt-gpu', 'no such GPU')
    output.emit_internal_error('libvirt-gpu', ValueError('bad'))
    assert capsys.readouterr() == ('', (
        'aside\n'
        'libvirt-gpu: error: no such GPU\n'
        'libvirt-gpu: internal error: ValueError: bad (run with --debug '
        'for the traceback)\n'))


class _Report:
    COLUMNS = ('ACTION', 'WHAT')

    def summary(self):
        return '1 change(s)'

    def rows(self):
        return [('created', 'x')]

    def details(self):
        return ['more']

    def to_json(self):
        return {'changes': 1, 'actions': ['created']}


def test_emit_report_text_or_json(capsys):
    output.emit_report(_Report())
    assert capsys.readouterr() == (
        '1 change(s)\nACTION   WHAT\n-------  ----\ncreated  x\nmore\n', '')
    output.emit_report(_Report(), as_json=True)
    assert capsys.readouterr() == (
        '{"actions":["created"],"changes":1}\n', '')


def test_a_report_without_rows_has_no_table():
    class Empty(_Report):
        def rows(self):
            return []

    assert output.report_text(Empty()) == '1 change(s)\nmore'


class _Flushed(io.StringIO):
    def __init__(self):
        super().__init__()
        self.flushes = 0

    def flush(self):
        self.flushes += 1


def test_the_removal_plan_is_flushed_where_it_went(monkeypatch):
    """``reconcile`` says what it removes before it does: the plan's
    stream is flushed (stdout with text, stderr next to JSON)."""
    from libvirt_gpu.guests import reconcile
    plan = [reconcile.Finding(reconcile.WOULD_REMOVE, 'lease', 'u-2',
                              'idle')]
    for as_json in (False, True):
        out, err = _Flushed(), _Flushed()
        monkeypatch.setattr(sys, 'stdout', out)
        monkeypatch.setattr(sys, 'stderr', err)
        output.emit_removal_plan(plan, as_json=as_json)
        said, other = (err, out) if as_json else (out, err)
        assert said.getvalue() == 'will remove lease u-2: idle\n'
        assert (said.flushes, other.flushes, other.getvalue()) == (1, 0, '')


def test_emit_section_heads_a_demo_step(capsys):
    output.emit_section('list the GPUs')
    assert capsys.readouterr() == ('\n== list the GPUs\n\n', '')


# --- text --------------------------------------------------------------------

def test_table_columns_as_wide_as_their_widest_cell():
    assert output.table(['A', 'LONGER'], [['wide cell', None], ['x', 7]]) == (
        'A          LONGER\n'
        '---------  ------\n'
        'wide cell  -\n'
        'x          7')


def test_table_escapes_what_sysfs_names_hold():
    # a newline in a cell too: a row stays one line
    assert output.table(['NAME'], [['a\nb\x1b']]) == (
        'NAME\n--------\na\\nb\\x1b')


def _tree(enabled):
    gpus = (
        objects.Gpu(address=GPU, vendor_id='10de', product_id='1eb8',
                    class_code='0x030200', driver='nvidia', numa_node=0,
                    iommu_group=40, product_name='TU104GL [Tesla T4]',
                    mdev_types=(T4_TYPE,)),
        objects.Gpu(address=OTHER, vendor_id='10de', product_id='1eb8',
                    class_code='0x030200', driver='vfio-pci', numa_node=1,
                    iommu_group=41, product_name='TU104GL [Tesla T4]'))
    return gpus, model.build_tree('host1', gpus, enabled)


T4_TYPE = objects.VgpuType(
    id=objects.TypeId.parse('nvidia-222'), name='GRID T4-1B',
    description='num_heads=4, frl_config=45, framebuffer=1024M, '
                'max_resolution=5120x2880, max_instance=16',
    device_api='vfio-pci', available_instances=16)


def test_provider_tree_text_draws_each_gpu_under_its_host():
    _, tree = _tree({GPU: objects.EnabledType(T4_TYPE.id)})
    assert output.provider_tree_text(tree) == (
        'host1  (1a209530-6339-3234-8783-8f4ae7ea46f6)\n'
        '├── host1_0000:3b:00.0  (f0b12aaf-2a54-33da-9726-d0097892fba0)\n'
        '│       inventory PGPU total=1 reserved=0 max_unit=1\n'
        '│       traits    CUSTOM_NVIDIA_1EB8, OWNER_CYBORG\n'
        '└── host1_0000:af:00.0  (dd5a1323-e8b3-3e38-afda-6b683d395b79)\n'
        '        inventory VGPU total=16 reserved=0 max_unit=16\n'
        '        traits    CUSTOM_NVIDIA_1EB8_T4_1B, '
        'HW_GPU_MAX_DISPLAY_HEADS_4, OWNER_CYBORG')


def test_provider_tree_text_every_number_of_an_inventory():
    root = tree_mod.ResourceProvider(name='h', uuid='r',
                                     parent_provider_uuid=None)
    child = tree_mod.ResourceProvider(
        name='h_gpu', uuid='c', parent_provider_uuid='r',
        inventories=(
            tree_mod.Inventory('CUSTOM_A', total=8, reserved=3, max_unit=2),
            tree_mod.Inventory('CUSTOM_B', total=5)),
        traits=frozenset({'Z', 'A'}))
    assert output.provider_tree_text(tree_mod.ProviderTree(
        root=root, children=(child,))) == (
        'h  (r)\n'
        '└── h_gpu  (c)\n'
        '        inventory CUSTOM_A total=8 reserved=3 max_unit=2\n'
        '        inventory CUSTOM_B total=5 reserved=0 max_unit=5\n'
        '        traits    A, Z')


def test_provider_tree_text_of_a_host_without_gpus():
    _, tree = _tree({})
    tree = type(tree)(root=tree.root)
    assert output.provider_tree_text(tree) == (
        'host1  (%s)\n(no GPU providers)' % tree.root.uuid)


def test_cyborg_devices_text_one_row_per_deployable():
    gpus, _ = _tree({})
    devices = cyborg_objects.driver_devices(
        'host1', gpus, {GPU: objects.EnabledType(T4_TYPE.id)})
    assert output.cyborg_devices_text(devices) == (
        'DEVICE        MODEL               DEPLOYABLE          RC    COUNT  '
        'ATTACH\n'
        '------------  ------------------  ------------------  ----  -----  '
        '------\n'
        '0000:3b:00.0  TU104GL [Tesla T4]  host1_0000:3b:00.0  PGPU  1      '
        'PCI\n'
        '0000:af:00.0  TU104GL [Tesla T4]  host1_0000:af:00.0  VGPU  16     '
        'MDEV')


def test_cyborg_devices_text_a_device_without_deployable():
    gpus, _ = _tree({})
    devices = cyborg_objects.host_devices(
        'host1', gpus, {}, _GpuOptions(), carved={OTHER})[0]
    assert output.cyborg_devices_text(devices).splitlines()[2] == (
        '0000:3b:00.0  TU104GL [Tesla T4]  -                   -     -      -')


def test_cyborg_devices_text_lists_each_kind_of_handle_once():
    gpus, _ = _tree({})
    (device,) = cyborg_objects.driver_devices(
        'host1', gpus[:1], {GPU: objects.EnabledType(T4_TYPE.id)})
    (dep,) = device.deployable_list
    handles = dep.attach_handle_list
    dep = records.replace(dep, attach_handle_list=handles + tuple(
        records.replace(h, attach_type='PCI') for h in handles))
    device = records.replace(device, deployable_list=(dep,))
    assert output.cyborg_devices_text([device]).splitlines()[2].endswith(
        '  VGPU  16     MDEV,PCI')


def test_cyborg_devices_to_json_field_for_field():
    gpus, _ = _tree({})
    devices = cyborg_objects.driver_devices('host1', gpus[1:], {})
    pci = json.dumps({'bus': '3b', 'device': '00', 'domain': '0000',
                      'function': '0'}, sort_keys=True)
    assert output.cyborg_devices_to_json(iter(devices)) == [{
        'vendor': '10de', 'model': 'TU104GL [Tesla T4]', 'type': 'GPU',
        'std_board_info': json.dumps({'product_id': '1eb8',
                                      'controller': '3D controller'}),
        'vendor_board_info': json.dumps({'vendor_info': 'gpu_vb_info'}),
        'controlpath_id': {'cpid_type': 'PCI', 'cpid_info': pci},
        'deployable_list': [{
            'name': 'host1_0000:3b:00.0', 'num_accelerators': 1,
            'attribute_list': [
                {'key': 'rc', 'value': 'PGPU'},
                {'key': 'trait0', 'value': 'OWNER_CYBORG'},
                {'key': 'trait1', 'value': 'CUSTOM_NVIDIA_1EB8'}],
            'attach_handle_list': [{'attach_type': 'PCI',
                                    'attach_info': pci, 'in_use': False}],
            'driver_name': 'NVIDIA'}],
        'stub': False}]


class _GpuOptions:
    report_gpu_traits = True
    pgpu_vendor_ids = model.DEFAULT_PGPU_VENDORS


def _attachment(**changes):
    values = dict(domain_uuid=VM, domain_name='vm1', kind=api.VGPU,
                  live=True, config=False, uuid=U1,
                  type_id=objects.TypeId.parse('nvidia-222'), parent=GPU)
    values.update(changes)
    return api.Attachment(**values)


@pytest.mark.parametrize('verb,changes,text', [
    ('attached', {},
     'attached vGPU %s (nvidia-222 on 0000:af:00.0) to vm1 (live)' % U1),
    ('detached', {'live': False, 'config': True},
     'detached vGPU %s (nvidia-222 on 0000:af:00.0) from vm1 (config)' % U1),
    ('attached', {'config': True, 'parent': None},
     'attached vGPU %s (nvidia-222 on GPU chosen at the next start) to vm1 '
     '(live, config)' % U1),
    ('attached', {'type_id': None},
     'attached vGPU %s (? on 0000:af:00.0) to vm1 (live)' % U1),
    ('attached', {'kind': api.PGPU, 'uuid': None, 'type_id': None,
                  'parent': None, 'address': OTHER},
     'attached GPU 0000:3b:00.0 to vm1 (live)'),
    ('detached', {'note': 'the release hook removes the vGPU'},
     'detached vGPU %s (nvidia-222 on 0000:af:00.0) from vm1 (live)\n'
     'note: the release hook removes the vGPU' % U1),
])
def test_attachment_text(verb, changes, text):
    assert output.attachment_text(verb, _attachment(**changes)) == text


def test_attachment_to_json_vgpu_and_pgpu():
    assert output.attachment_to_json(_attachment(note='n')) == {
        'domain_uuid': VM, 'domain': 'vm1', 'kind': 'vgpu', 'live': True,
        'config': False, 'uuid': U1, 'type': 'nvidia-222',
        'parent': '0000:af:00.0', 'address': None, 'note': 'n'}
    assert output.attachment_to_json(_attachment(
        kind=api.PGPU, uuid=None, type_id=None, parent=None,
        address=OTHER, config=True)) == {
        'domain_uuid': VM, 'domain': 'vm1', 'kind': 'pgpu', 'live': True,
        'config': True, 'uuid': None, 'type': None, 'parent': None,
        'address': '0000:3b:00.0', 'note': None}


def _domain(active=True, inactive_xml=False):
    return api.DomainGpus(
        domain_uuid=VM, domain_name='vm1', active=active,
        inactive_xml=inactive_xml,
        vgpus=(api.VgpuState(uuid=U1,
                             type_id=objects.TypeId.parse('nvidia-222'),
                             parent=GPU, in_metadata=True, in_devices=True,
                             exists=True, leased='active'),
               api.VgpuState(uuid=U2, type_id=None, parent=None,
                             in_metadata=False, in_devices=True,
                             exists=False, leased=None)),
        pgpus=(OTHER,))


def test_domain_devices_text_running_live():
    assert output.domain_devices_text(_domain(), {U1: 'cyborg'}) == (
        'domain vm1 (%s), running; live XML\n'
        'KIND  UUID                                  TYPE        GPU        '
        '   ROUTE   EXISTS  LEASE   SOURCE\n'
        '----  ------------------------------------  ----------  -----------'
        '-  ------  ------  ------  ------------\n'
        'vgpu  %s  nvidia-222  0000:af:00.0  cyborg  yes     active  '
        'metadata\n'
        'vgpu  %s  -           -             -       no      -       '
        'hostdev only\n'
        'pgpu  -                                     -           '
        '0000:3b:00.0  -       -       -       -' % (VM, U1, U2))


def test_domain_devices_text_shut_off_persistent():
    head = output.domain_devices_text(
        _domain(active=False, inactive_xml=True)).splitlines()[0]
    assert head == 'domain vm1 (%s), shut off; persistent XML' % VM


def test_domain_devices_to_json():
    assert output.domain_devices_to_json(_domain(), {U1: 'nova-vgpu'}) == {
        'domain_uuid': VM, 'domain': 'vm1', 'active': True,
        'inactive_xml': False,
        'vgpus': [
            {'uuid': U1, 'type': 'nvidia-222', 'parent': '0000:af:00.0',
             'in_metadata': True, 'in_devices': True, 'exists': True,
             'lease': 'active', 'route': 'nova-vgpu'},
            # no GPU known: no route
            {'uuid': U2, 'type': None, 'parent': None, 'in_metadata': False,
             'in_devices': True, 'exists': False, 'lease': None,
             'route': None}],
        'pgpus': ['0000:3b:00.0']}


@pytest.mark.parametrize('error,text', [
    (OSError(errno.EACCES, 'Permission denied', '/etc/x'),
     '/etc/x: Permission denied (run as a user allowed to write there, '
     'e.g. root)'),
    (OSError(errno.EPERM, 'Operation not permitted', '/a', None, '/b'),
     '/a -> /b: Operation not permitted (run as a user allowed to write '
     'there, e.g. root)'),
    (OSError(errno.ENOENT, 'No such file or directory', '/a'),
     '/a: No such file or directory'),
    (OSError(errno.ENOENT, 'No such file or directory'),
     'No such file or directory'),
    (OSError('plain'), 'plain'),
])
def test_os_error_text(error, text):
    assert output.os_error_text(error) == text


def _installed(restart_needed):
    return installer.Installed(
        path='/etc/libvirt/hooks/qemu', python='/usr/bin/python3',
        config_file='/etc/libvirt-gpu/libvirt-gpu.conf',
        settings_file='/var/lib/libvirt-gpu/hook-settings.json',
        restart_needed=restart_needed)


def test_installed_text_says_whether_to_restart_libvirtd():
    common = (
        'installed /etc/libvirt/hooks/qemu (root-owned, mode 0755)\n'
        '  python:   /usr/bin/python3 -IS\n'
        '  config:   /etc/libvirt-gpu/libvirt-gpu.conf\n'
        '  settings: /var/lib/libvirt-gpu/hook-settings.json (rebuilt when '
        'the config or the GPUs change)\n')
    assert output.installed_text(_installed(True)) == common + (
        'libvirtd had no qemu hook when it started and only looks for hooks '
        'then: restart libvirtd (or send it SIGHUP) before starting guests '
        'with vGPUs')
    assert output.installed_text(_installed(False)) == common + (
        'libvirtd already runs qemu hooks: nothing to restart')


def test_installed_to_json():
    assert output.installed_to_json(_installed(True)) == {
        'path': '/etc/libvirt/hooks/qemu', 'python': '/usr/bin/python3',
        'config_file': '/etc/libvirt-gpu/libvirt-gpu.conf',
        'settings_file': '/var/lib/libvirt-gpu/hook-settings.json',
        'restart_needed': True}


# --- rooms and list --json ---------------------------------------------------

MIG_ROOM = capacity.DriverRoom(
    mode=capacity.MODE_MIG, type_id='nvidia-1160', used=1,
    gis=(capacity.GiRoom(id=1, profile_id=14, profile='1g.10gb', used=1,
                         capacity=2),
         capacity.GiRoom(id=5, profile_id=5, profile='2g.20gb', used=0,
                         capacity=0)))
MIXED_ROOM = capacity.DriverRoom(
    mode=capacity.MODE_MIXED, type_id='nvidia-1153', used=2,
    placement_size=4, placements=(8, 12))


def test_room_text_mig_and_mixed():
    assert output.room_text(GPU, MIG_ROOM) == (
        '0000:af:00.0: mig-backed nvidia-1160: GI 1 1g.10gb 1 used 1 free, '
        'GI 5 2g.20gb 0 used 0 free')
    assert output.room_text(GPU, MIXED_ROOM) == (
        '0000:af:00.0: mixed-size nvidia-1153: 4-slot placements, 2 used, '
        'free at 8,12')


def test_room_text_nothing_left():
    assert output.room_text(GPU, capacity.DriverRoom(
        mode=capacity.MODE_MIG, type_id='nvidia-1160', used=0)) == (
        '0000:af:00.0: mig-backed nvidia-1160: no GI')
    assert output.room_text(GPU, capacity.DriverRoom(
        mode=capacity.MODE_MIXED, type_id='nvidia-1153', used=3)) == (
        '0000:af:00.0: mixed-size nvidia-1153: 0-slot placements, 3 used, '
        'free at none')


def test_room_to_json_mig_and_mixed():
    enabled = objects.EnabledType(objects.TypeId.parse('nvidia-1160'))
    assert output.room_to_json(MIG_ROOM, enabled) == {
        'vgpu_mode': 'mig-backed', 'capacity': 2,
        'gpu_instances': [
            {'id': 1, 'profile': '1g.10gb', 'profile_id': 14, 'used': 1,
             'free': 1},
            {'id': 5, 'profile': '2g.20gb', 'profile_id': 5, 'used': 0,
             'free': 0}]}
    assert output.room_to_json(MIXED_ROOM, objects.EnabledType(
        objects.TypeId.parse('nvidia-1153'), max_instances=3)) == {
        'vgpu_mode': 'mixed-size', 'capacity': 3,
        'placements': {'size': 4, 'used': 2, 'free': [8, 12]}}


def _h100(**changes):
    values = dict(
        address=GPU, vendor_id='10de', product_id='2331',
        class_code='0x030200', driver='nvidia', numa_node=1,
        iommu_group=40, vendor_name='NVIDIA Corporation',
        product_name='GH100 [H100 PCIe]',
        virtfns=(objects.PciAddress.parse('0000:af:00.4'),),
        mdev_types=(T4_TYPE,),
        mdevs=(objects.Mdev(uuid=objects.Uuid.parse(U1),
                            type_id=T4_TYPE.id),),
        iommu_members=(
            objects.IommuMember(address=GPU, vendor_id='10de',
                                product_id='2331', class_code='0x030200',
                                driver='nvidia'),
            objects.IommuMember(address=OTHER, vendor_id='8086',
                                product_id='1572', class_code='0x020000',
                                driver='i40e', host_uses=True,
                                host_class='network controller')),
        local_cpulist='16-31',
        nvml=objects.NvmlGpu(
            name='NVIDIA H100 PCIe', memory_total_mib=81559,
            virtualization_mode='vgpu_host', mig_enabled=False,
            vgpu_types=(objects.NvmlVgpuType(
                id=1160, name='NVIDIA H100-1-10C', framebuffer_mib=10240,
                max_instances=7, creatable=True),)))
    values.update(changes)
    return objects.Gpu(**values)


TYPE_JSON = {'available_instances': 16,
             'description': T4_TYPE.description, 'device_api': 'vfio-pci',
             'id': 'nvidia-222', 'name': 'GRID T4-1B'}


def test_gpu_to_json_whole_entry_of_a_vgpu_gpu():
    enabled = objects.EnabledType(T4_TYPE.id)
    document = output.gpu_to_json(_h100(), enabled, route='cyborg',
                                  holders={U1: ('vm1', VM)})
    assert document == {
        'address': '0000:af:00.0', 'vendor_id': '10de',
        'product_id': '2331', 'vendor_name': 'NVIDIA Corporation',
        'product_name': 'GH100 [H100 PCIe]', 'class': '0x030200',
        'driver': 'nvidia', 'numa_node': 1, 'local_cpulist': '16-31',
        'iommu_group': 40,
        'iommu_members': [
            {'address': '0000:af:00.0', 'vendor_id': '10de',
             'product_id': '2331', 'class': '0x030200', 'driver': 'nvidia',
             'companion': False, 'host_uses': False},
            {'address': '0000:3b:00.0', 'vendor_id': '8086',
             'product_id': '1572', 'class': '0x020000', 'driver': 'i40e',
             'companion': False, 'host_uses': True}],
        'nvml': {'name': 'NVIDIA H100 PCIe', 'memory_total_mib': 81559,
                 'virtualization_mode': 'vgpu_host', 'mig_enabled': False,
                 'vgpu_types': [{'creatable': True, 'framebuffer_mib': 10240,
                                 'id': 1160, 'max_instances': 7,
                                 'name': 'NVIDIA H100-1-10C'}]},
        'mode': 'vgpu', 'enabled_type': 'nvidia-222', 'physfn': None,
        'virtfns': ['0000:af:00.4'], 'mdev_types': [TYPE_JSON],
        'mdevs': [{'type': 'nvidia-222', 'uuid': U1, 'route': 'cyborg',
                   'domain': 'vm1', 'domain_uuid': VM}],
        'not_assignable': None, 'route': 'cyborg'}
    # its keys and those of every dict in it sorted: list --json skips the
    # encoder's sort
    text = json.dumps(document, separators=(',', ':'))
    assert text == json.dumps(document, sort_keys=True,
                              separators=(',', ':'))


def test_gpu_to_json_of_a_pgpu_and_of_a_vf():
    vf = output.gpu_to_json(_h100(physfn=OTHER, virtfns=(), nvml=None),
                            not_assignable='held by the host')
    assert (vf['mode'], vf['enabled_type'], vf['physfn'], vf['nvml'],
            vf['not_assignable']) == ('pgpu', None, '0000:3b:00.0', None,
                                      'held by the host')


def test_gpu_to_json_adds_the_room_and_the_capacities():
    first = objects.TypeId.parse('nvidia-1153')
    second = objects.TypeId.parse('nvidia-1154')
    third = objects.TypeId.parse('nvidia-1155')
    enabled = objects.EnabledType(first, others=(
        objects.EnabledType(second), objects.EnabledType(third)))
    document = output.gpu_to_json(
        _h100(), enabled, room=MIXED_ROOM,
        capacities={third: 1, first: 4})
    assert document['enabled_types'] == [
        {'type': 'nvidia-1153', 'capacity': 4},
        {'type': 'nvidia-1155', 'capacity': 1}]
    assert (document['vgpu_mode'], document['capacity'],
            document['placements']) == (
        'mixed-size', 4, {'size': 4, 'used': 2, 'free': [8, 12]})
    assert list(document) == sorted(document)
    plain = output.gpu_to_json(_h100(), enabled, capacities={})
    assert 'enabled_types' not in plain and 'vgpu_mode' not in plain


def test_type_memo_converts_a_shared_type_once():
    memo = {}
    first = output.gpu_to_json(_h100(), type_memo=memo)
    second = output.gpu_to_json(_h100(address=OTHER), type_memo=memo)
    assert first['mdev_types'] == [TYPE_JSON]
    assert first['mdev_types'][0] is second['mdev_types'][0]
    assert list(memo.values()) == [(T4_TYPE, TYPE_JSON)]


def test_nvml_to_json_none_when_not_asked():
    assert output.nvml_to_json(None) is None


# --- live migration ----------------------------------------------------------

PLAN = migration.Plan(
    domain='vm1', dest_uri='qemu+ssh://b/system',
    checks=(migration.Check(what='destination libvirt', ok=True,
                            detail='10.0.0'),
            migration.Check(what='vGPU room', ok=False,
                            detail='nvidia-222: 0 free')),
    vgpus=(('nvidia-222', 2),))


def test_migration_checks_text():
    assert output.migration_checks_text(PLAN) == (
        'checks for migrating vm1 to qemu+ssh://b/system:\n'
        '  ok   destination libvirt: 10.0.0\n'
        '  NO   vGPU room: nvidia-222: 0 free')


def test_migration_to_json_dry_run_and_done():
    dry = api.Migration(plan=PLAN)
    assert output.migration_to_json(dry) == {
        'domain': 'vm1', 'destination': 'qemu+ssh://b/system', 'ok': False,
        'checks': [
            {'what': 'destination libvirt', 'ok': True, 'detail': '10.0.0'},
            {'what': 'vGPU room', 'ok': False,
             'detail': 'nvidia-222: 0 free'}],
        'vgpus': {'nvidia-222': 2}, 'nvidia': [], 'layout': []}
    done = output.migration_to_json(api.Migration(
        plan=PLAN, outcome=migration.Outcome(
            done=True, downtime_ms=42, data_total=1 << 31,
            elapsed_ms=3500)))
    assert {k: done[k] for k in done if k not in
            ('domain', 'destination', 'ok', 'checks', 'vgpus',
             'nvidia', 'layout')} == {
        'migrated': True, 'downtime_ms': 42, 'data_total': 1 << 31,
        'elapsed_ms': 3500}
    late = output.migration_to_json(api.Migration(
        plan=PLAN, outcome=migration.Outcome(
            done=True, abort_refused='past the switchover')))
    assert late['abort_refused'] == 'past the switchover'


@pytest.mark.parametrize('stats,text', [
    ({}, 'migrating: preparing the destination'),
    ({'data_total': 0, 'data_processed': 0, 'data_remaining': 0},
     'migrating: preparing the destination'),
    ({'data_total': 4 << 20}, 'migrating: 100%  0.0 MiB processed, '
                              '0.0 MiB remaining'),
    ({'data_processed': 1 << 20},
     'migrating: 100%  1.0 MiB processed, 0.0 MiB remaining'),
    ({'data_remaining': 3 << 20},
     'migrating:   0%  0.0 MiB processed, 3.0 MiB remaining'),
    ({'data_processed': 1 << 20, 'data_remaining': 3 << 20},
     'migrating:  25%  1.0 MiB processed, 3.0 MiB remaining'),
    # pages dirtied again are sent again: processed passes the total
    ({'data_total': 4 << 20, 'data_processed': 6 << 20,
      'data_remaining': 1 << 20},
     'migrating:  75%  6.0 MiB processed, 1.0 MiB remaining'),
    ({'data_total': 3, 'data_processed': 1, 'data_remaining': 2},
     'migrating:  33%  0.0 MiB processed, 0.0 MiB remaining'),
    # rounded down: 99.5% is not done
    ({'data_total': 200 << 20, 'data_processed': 199 << 20,
      'data_remaining': 1 << 20},
     'migrating:  99%  199.0 MiB processed, 1.0 MiB remaining'),
    # stats that do not add up never show more than 100%
    ({'data_total': 4 << 20, 'data_processed': 5 << 20,
      'data_remaining': -(1 << 20)},
     'migrating: 100%  5.0 MiB processed, -1.0 MiB remaining'),
])
def test_migration_progress_text(stats, text):
    assert output.migration_progress_text(stats) == text


@pytest.mark.parametrize('outcome,text', [
    (migration.Outcome(done=False),
     'migration of vm1 aborted: it runs on here with its vGPUs'),
    (migration.Outcome(done=True),
     'migrated vm1 to qemu+ssh://b/system; downtime not reported by '
     'libvirt'),
    (migration.Outcome(done=True, downtime_ms=0, elapsed_ms=0),
     'migrated vm1 to qemu+ssh://b/system; downtime 0 ms; took 0.0 s'),
    (migration.Outcome(done=True, downtime_ms=300, elapsed_ms=100000),
     'migrated vm1 to qemu+ssh://b/system; downtime 300 ms; took 100.0 s'),
    (migration.Outcome(done=True, downtime_ms=7, elapsed_ms=1250,
                       abort_refused='past the switchover'),
     'Ctrl-C came too late (past the switchover): migrated vm1 to '
     'qemu+ssh://b/system; downtime 7 ms; took 1.2 s'),
])
def test_migration_outcome_text(outcome, text):
    assert output.migration_outcome_text(PLAN, outcome) == text


def test_progress_lines_flush_to_stderr(capsys):
    output.emit_progress('migrating: 1%')
    output.end_progress()
    output.emit_exposition('x 1\n')
    assert capsys.readouterr() == ('x 1\n', '\rmigrating: 1%\n')


# --- What ``make mutation`` found open (docs/dev/mutation.md) ---
# Behaviours a random sample of ``make mutation`` over the round's modules
# found unguarded, in modules whose own tests run the program as another
# process (which never runs a mutant): each pinned here in the test's own
# process.

# --- cmd.output --------------------------------------------------------------

def test_mib_divides_by_two_to_the_twentieth():
    assert output._mib(0) == '0.0 MiB'
    assert output._mib(1048576) == '1.0 MiB'
    assert output._mib(1 << 40) == '1048576.0 MiB'


@pytest.mark.parametrize('stats, text', [
    ({}, 'migrating: preparing the destination'),
    ({'data_total': 0, 'data_processed': 0, 'data_remaining': 0},
     'migrating: preparing the destination'),
    # libvirt gave no total yet but has copied: progress, not "preparing"
    ({'data_processed': 1048576, 'data_remaining': 3145728},
     'migrating:  25%  1.0 MiB processed, 3.0 MiB remaining'),
    ({'data_total': 4194304, 'data_processed': 0,
      'data_remaining': 4194304},
     'migrating:   0%  0.0 MiB processed, 4.0 MiB remaining'),
    ({'data_total': 4194304, 'data_processed': 4194304,
      'data_remaining': 0},
     'migrating: 100%  4.0 MiB processed, 0.0 MiB remaining'),
])
def test_migration_progress(stats, text):
    assert output.migration_progress_text(stats) == text
