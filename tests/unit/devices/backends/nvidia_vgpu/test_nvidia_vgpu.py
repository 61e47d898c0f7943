"""NVIDIA vGPU 17+ vendor interface: the CREATABLE_TYPES parser, the
Sysfs reader, and backends.nvidia_vgpu against the simulated L40S host
(kernel_sysfs.KernelSysfs answers writes as the driver would)."""

import json
import os

import pytest

from libvirt_gpu.devices.backends import base
from libvirt_gpu.devices.backends import nvidia_vgpu
from libvirt_gpu import exception
from libvirt_gpu import objects
from tests.doubles import kernel_sysfs
from libvirt_gpu.devices.backends.nvidia_vgpu.files import (
    VendorFiles as vendor)
from libvirt_gpu.devices.backends.nvidia_vgpu import files as vendor_files
from libvirt_gpu.devices.backends.nvidia_vgpu import names as vendor_names

T_NVIDIA_1156 = objects.TypeId.parse('nvidia-1156')
T_NVIDIA_223 = objects.TypeId.parse('nvidia-223')

# holds two L40S-1B (1145) on 3d:00.4, 3d:00.5
GPU1 = objects.PciAddress.parse('0000:3d:00.0')
GPU2 = objects.PciAddress.parse('0000:bd:00.0')          # empty
VF_BUSY = objects.PciAddress.parse('0000:3d:00.4')
VF_FREE = objects.PciAddress.parse('0000:3d:00.6')
VF2 = objects.PciAddress.parse('0000:bd:00.4')
SCHEMAS = '/usr/share/libvirt/schemas'


def new_uuid():
    return objects.Uuid.new()


def vgpu(vf=VF_FREE, type_id=objects.TypeId.parse('nvidia-1145'), uuid=None):
    return base.VgpuDevice(uuid=uuid or new_uuid(),
                           parent=objects.PciAddress.parse(vf),
                           type_id=type_id)


# --- the parser --------------------------------------------------------------

REAL = ('ID    : vGPU Name\n'
        '1145  : NVIDIA L40S-1B\n'
        '1155  : NVIDIA L40S-24Q\n'
        '2164  : NVIDIA L40S-3B\n')


def test_parse_real_listing():
    assert vendor_files.parse_creatable_types(REAL, 'p') == (
        (1145, 'NVIDIA L40S-1B'), (1155, 'NVIDIA L40S-24Q'),
        (2164, 'NVIDIA L40S-3B'))


@pytest.mark.parametrize('text', ['', '\n', '   \n\n', 'ID    : vGPU Name\n'])
def test_parse_empty_when_full(text):
    assert vendor_files.parse_creatable_types(text, 'p') == ()


def test_parse_names_with_spaces_and_loose_spacing():
    text = ('\n  ID:vGPU Name\n'
            '3401 :   NVIDIA RTX Pro 6000   Blackwell DC-48C  \n'
            '\t17:NVIDIA H100-1-10C\n')
    assert vendor_files.parse_creatable_types(text, 'p') == (
        (3401, 'NVIDIA RTX Pro 6000 Blackwell DC-48C'),
        (17, 'NVIDIA H100-1-10C'))


@pytest.mark.parametrize('text,why', [
    ('ID : vGPU Name\nfoo bar\n', 'line 2'),
    ('1145 NVIDIA L40S-1B\n', 'line 1'),             # no colon
    ('ID : vGPU Name\n1145 :\n', 'line 2'),          # no name
    ('x145 : NVIDIA L40S-1B\n', 'line 1'),           # not a number
    ('-3 : NVIDIA L40S-1B\n', 'line 1'),
    ('0 : NVIDIA L40S-1B\n', 'line 1'),              # 0 means "none"
    ('1145 : A\n1145 : B\n', 'repeats type 1145'),
    ('1145 : A\nID : vGPU Name\n', 'line 2'),        # header not first
])
def test_parse_garbage_is_typed_error_naming_path(text, why):
    with pytest.raises(exception.SysfsReadError) as info:
        vendor_files.parse_creatable_types(
            text, '/sys/bus/pci/devices/0000:3d:00.4/nvidia/'
                  + vendor_names.CREATABLE_TYPES)
    assert '0000:3d:00.4/nvidia/' + vendor_names.CREATABLE_TYPES in \
        str(info.value)
    assert why in str(info.value)


def test_type_ids_map_to_mdev_form():
    assert objects.vendor_type_id(1145) == 'nvidia-1145'
    assert objects.vendor_type_number('nvidia-1145') == 1145
    for bad in ('1145', 'nvidia-', 'nvidia-0', 'nvidia-01', 'grid-1145',
                'nvidia-1145/..', 'nvidia-12345678901'):
        with pytest.raises(exception.InvalidInput):
            objects.vendor_type_number(bad)


# --- the Sysfs reader ------------------------------------------------------

def test_sysfs_reads_vendor_interface(host):
    busy = vendor(host).read_vf(VF_BUSY)
    assert busy.current.id == 'nvidia-1145'
    assert busy.creatable == ()                  # a VF holding one lists none
    free = vendor(host).read_vf(VF_FREE)
    assert free.current is None
    # equal-size mode: the GPU holds 1 GB vGPUs, so only 1 GB types fit
    assert [(t.id, t.name) for t in free.creatable] == [
        ('nvidia-1145', 'NVIDIA L40S-1B'), ('nvidia-1147', 'NVIDIA L40S-1Q'),
        ('nvidia-1157', 'NVIDIA L40S-1A')]
    assert all(t.available_instances == 1 for t in free.creatable)
    assert len(vendor(host).read_vf(VF2).creatable) == 23
    assert vendor(host).read_vf(GPU1) is None      # the PF has no nvidia/


def test_sysfs_garbage_current_type_is_typed_error(host):
    with open(os.path.join(vendor(host).vendor_dir(VF_FREE),
                           vendor_names.CURRENT_TYPE), 'w') as f:
        f.write('lots\n')
    with pytest.raises(exception.SysfsReadError,
                       match=vendor_names.CURRENT_TYPE):
        vendor(host).current_type(VF_FREE)


# --- the backend ------------------------------------------------------------

def test_create_writes_type_and_shares_capacity(backend, host):
    dev = vgpu(vf=VF2, type_id=T_NVIDIA_1156)          # L40S-48Q: 1 per GPU
    assert backend.available(VF2, 'nvidia-1156') == 1
    assert backend.prepare(dev) is True
    assert vendor(host).current_type(VF2) == 1156
    assert backend.lookup(dev.uuid) == dev and backend.exists(dev)
    # the GPU is full now: every other VF of it lists nothing
    assert vendor(host).creatable_types('0000:bd:00.5') == ()
    assert backend.available(objects.PciAddress.parse('0000:bd:00.5'),
                             'nvidia-1156') == 0
    # the other GPU is not affected
    assert backend.available(VF_FREE, 'nvidia-1145') == 1
    assert [w.detail[1] for w in host.writes
            if w.kind == kernel_sysfs.CURRENT_VGPU_TYPE] == ['1156']
    with pytest.raises(exception.NoCapacity, match='none of its'):
        backend.choose_vf(GPU2, 'nvidia-1156')


def test_create_is_idempotent(backend, host):
    dev = vgpu()
    assert backend.prepare(dev) is True
    writes = len(host.writes)
    assert backend.prepare(dev) is False
    assert len(host.writes) == writes


def test_no_capacity_other_size_is_typed(backend):
    # GPU1 holds 1 GB vGPUs: a 48 GB one does not fit (equal-size mode)
    with pytest.raises(exception.NoCapacity):
        backend.prepare(vgpu(type_id=objects.TypeId.parse('nvidia-1156')))
    assert backend.vgpus() == {}                   # nothing left recorded


def test_unknown_type_and_non_vendor_parent(backend):
    with pytest.raises(exception.UnknownType):            # a T4 type on an
        backend.prepare(vgpu(vf=VF2, type_id=T_NVIDIA_223))  # empty GPU
    # a GPU that holds vGPUs lists only what fits beside them: a type it
    # does not list is then the kernel's to refuse
    with pytest.raises(exception.NoCapacity, match='no longer lists'):
        backend.prepare(vgpu(type_id=objects.TypeId.parse('nvidia-223')))
    assert backend.vgpus() == {}
    with pytest.raises(exception.UnknownType):
        backend.check_type(VF_FREE, 'not-nvidia')
    with pytest.raises(exception.ParentGone):
        backend.prepare(vgpu(vf=GPU1))                    # the PF


def test_vf_of_someone_else_is_a_conflict(backend):
    with pytest.raises(exception.MdevConflict):
        backend.prepare(vgpu(vf=VF_BUSY))
    dev = vgpu()
    backend.prepare(dev)
    with pytest.raises(exception.MdevConflict):
        backend.prepare(vgpu(vf=VF_FREE))                 # our VF, other uuid
    with pytest.raises(exception.MdevConflict):
        backend.prepare(vgpu(vf='0000:3d:00.7', uuid=dev.uuid))


def test_destroy_writes_zero_and_retries_while_busy(backend, host):
    dev = vgpu()
    backend.prepare(dev)
    host.busy(VF_FREE, count=3)              # the driver is still tearing down
    assert backend.release(dev) is True
    assert vendor(host).current_type(VF_FREE) == 0
    zeros = [w for w in host.writes if w.kind == kernel_sysfs.CURRENT_VGPU_TYPE
             and w.detail == (str(VF_FREE), '0')]
    assert len(zeros) == 4                   # 3 EBUSY answers, then success
    assert backend.lookup(dev.uuid) is None
    assert backend.vgpus() == {}             # transient: forgotten
    assert backend.release(dev) is False     # idempotent


def test_destroy_gives_up_after_a_bounded_while(backend, host):
    dev = vgpu()
    backend.prepare(dev)
    backend.remove_timeout = 0.3
    host.busy(VF_FREE, count=10 ** 6)
    with pytest.raises(exception.MdevRemoveFailed, match='EBUSY'):
        backend.remove(dev.uuid)
    assert vendor(host).current_type(VF_FREE) == 1145       # still there


def test_create_retries_busy_then_succeeds(backend, host):
    host.busy(VF_FREE, count=2)
    assert backend.prepare(vgpu()) is True
    assert vendor(host).current_type(VF_FREE) == 1145


def test_hostdev_is_unmanaged_pci_of_the_vf(backend):
    xml = backend.hostdev_xml(vgpu(vf='0001:3d:01.7'))
    assert "type='pci'" in xml and "managed='no'" in xml
    assert ("<address domain='0x0001' bus='0x3d' slot='0x01' "
            "function='0x7'/>") in xml


@pytest.mark.skipif(not os.path.isfile(os.path.join(SCHEMAS, 'domain.rng')),
                    reason='libvirt schemas not installed')
def test_hostdev_validates_against_domain_rng(backend):
    from lxml import etree
    schema = etree.RelaxNG(etree.parse(os.path.join(SCHEMAS, 'domain.rng')))
    domain = etree.fromstring(
        "<domain type='kvm'><name>g</name><memory>65536</memory>"
        "<os><type>hvm</type></os><devices>%s</devices></domain>"
        % backend.hostdev_xml(vgpu()))
    assert schema.validate(domain), schema.error_log


def test_state_file_and_persistence(backend, host, fast_tmp):
    dev = vgpu()
    backend.define(dev, start='auto', params='frame_rate_limiter=0')
    assert backend.lookup(dev.uuid) is None       # defined, not created
    assert backend.prepare(dev) is True
    params = os.path.join(vendor(host).vendor_dir(VF_FREE),
                          vendor_names.VGPU_PARAMS)
    with open(params) as f:
        assert f.read() == 'frame_rate_limiter=0'
    with open(os.path.join(fast_tmp, 'state', 'nvidia-vgpu.json')) as f:
        data = json.load(f)
    assert data['vgpus'][dev.uuid] == {
        'vf': str(VF_FREE), 'gpu': str(GPU1), 'type_id': 'nvidia-1145',
        'start': 'auto', 'params': 'frame_rate_limiter=0'}
    assert backend.remove(dev.uuid) is True
    assert dev.uuid in backend.vgpus()            # persistent: still defined
    assert backend.undefine(dev.uuid) is True
    assert backend.vgpus() == {}
    assert backend.undefine(dev.uuid) is False


@pytest.mark.parametrize('start', ['auto', 'manual'])
def test_a_defined_vgpu_is_a_definition_with_its_start(backend, start):
    dev = vgpu()
    assert backend.definition(dev.uuid) is None
    backend.define(dev, start=start)
    found = backend.definition(dev.uuid)
    assert (found.uuid, found.parent, found.type_id, found.start) == (
        dev.uuid, dev.parent, dev.type_id, start)
    assert found.source == 'the state file %s' % backend.state.path
    assert backend.prepare(dev) is True
    assert backend.definition(dev.uuid).start == start
    backend.undefine(dev.uuid)
    assert backend.definition(dev.uuid) is None


def test_after_a_boot_a_stale_vgpu_is_reset_and_an_unreadable_vf_named(
        backend, host, monkeypatch):
    dev = vgpu()
    assert backend.prepare(dev) is True              # transient
    path = os.path.join(vendor(host).vendor_dir(VF2),
                        vendor_names.CURRENT_TYPE)
    read = backend.files.current_type

    def current_type(vf):
        if vf == VF2:           # what read_int says of a file it cannot read
            raise exception.SysfsBadNumber(path=path, expected='a number',
                                           text='garbage')
        return read(vf)
    monkeypatch.setattr(backend.files, 'current_type', current_type)
    notes = backend.boot_cleanup(lambda uuid: False)
    by_target = {n.target: n for n in notes}
    assert (by_target[dev.uuid].action, by_target[str(VF2)].action) == (
        'reset', 'failed')
    assert path in by_target[str(VF2)].detail
    assert vendor(host).current_type(VF_FREE) == 0


def test_corrupt_state_is_typed_error(backend, fast_tmp):
    os.makedirs(os.path.join(fast_tmp, 'state'))
    with open(os.path.join(fast_tmp, 'state', 'nvidia-vgpu.json'), 'w') as f:
        f.write('{"version": 1, "vgpus": {"x": {}}}')
    with pytest.raises(exception.StateError, match='nvidia-vgpu.json'):
        backend.vgpus()


def test_choose_vf_skips_busy_and_recorded(backend):
    assert str(backend.choose_vf(GPU1, 'nvidia-1145')) == '0000:3d:00.6'
    backend.define(vgpu(vf=objects.PciAddress.parse('0000:3d:00.6')),
                   start='manual')
    assert str(backend.choose_vf(GPU1, 'nvidia-1145')) == '0000:3d:00.7'
    assert str(backend.choose_vf(GPU1, 'nvidia-1145',
                                 exclude=[objects.PciAddress.parse(
                                     '0000:3d:00.7')])) == '0000:3d:01.0'


def test_published_maximums_follow_nvidia_rule():
    # L40S: 48 GB; NVIDIA's per-GPU maximums: 1 GB types 32 (the cap, the
    # vGPU 16 description of L40S-1B reads max_instance=32), 2 GB 24, 3 GB
    # 16, 4 GB 12, 6 GB 8, 8 GB 6, 12 GB 4, 16 GB 3, 24 GB 2, 48 GB 1.
    expected = {'1B': 32, '2B': 24, '3B': 16, '1Q': 32, '2Q': 24, '3Q': 16,
                '4Q': 12, '6Q': 8, '8Q': 6, '12Q': 4, '16Q': 3, '24Q': 2,
                '48Q': 1, '48A': 1, '8A': 6}
    for suffix, count in expected.items():
        assert nvidia_vgpu.published_max('NVIDIA L40S-' + suffix) \
            == count, suffix
    # an unknown model: estimated from the largest type it lists, never
    # above it; MIG-backed names give no estimate
    assert nvidia_vgpu.published_max(
        'NVIDIA X-8Q', ['NVIDIA X-8Q', 'NVIDIA X-24Q']) == 3
    assert nvidia_vgpu.published_max('NVIDIA X-8Q', []) is None
    assert nvidia_vgpu.published_max(
        'NVIDIA H100-1-10C', ['NVIDIA H100-80C']) is None
