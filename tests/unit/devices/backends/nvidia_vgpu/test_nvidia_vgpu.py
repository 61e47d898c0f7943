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
import errno
import shutil
import tempfile
import time
from libvirt_gpu.devices import capacity
from libvirt_gpu.devices import nvml
from libvirt_gpu.devices.backends.nvidia_vgpu import files
from libvirt_gpu.devices.backends.nvidia_vgpu import names
from libvirt_gpu import simulator
from libvirt_gpu.simulator import loading
from libvirt_gpu.simulator import nvml as sim_nvml
from libvirt_gpu.util import records
from tests.doubles.l40s_vendor import GPU1
from tests.doubles.l40s_vendor import GPU2
from tests.doubles.l40s_vendor import VF2
from tests.doubles.l40s_vendor import VF_BUSY
from tests.doubles.l40s_vendor import VF_FREE
from tests.doubles.l40s_vendor import vgpu

T_NVIDIA_1156 = objects.TypeId.parse('nvidia-1156')
T_NVIDIA_223 = objects.TypeId.parse('nvidia-223')
SCHEMAS = '/usr/share/libvirt/schemas'


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


# --- what make mutation found ----------------------------------------------
#
# What the vendor interface (``backends/nvidia_vgpu``: ``files``, the
# VF's files; ``kind``, ``NvidiaVgpuBackend``) promises that
# test_nvidia_vgpu left open: each test here fails on a change ``make
# mutation`` made to files.py or kind.py that the rest stayed green on
# (docs/dev/mutation.md): the whole refusal a user reads, the bound of each
# number, which VF is touched and what is kept of our record.
#
# The host is a small L40S (``MINI``: two GPUs, four VFs on the first, two
# of them holding an L40S-1B that is not ours, two empty VFs on the
# second), written from the bundled profile so that a test pays for six
# VFs, not sixty-four; its kernel answers the writes as the driver does
# (``kernel_sysfs.KernelSysfs``).  ``Answering`` makes that kernel give one
# VF the errno a test needs (ENODEV, EIO, ...), which the simulated driver
# never gives on its own.

HELD1 = objects.PciAddress.parse('0000:3d:00.4')      # 1145, not ours
HELD2 = objects.PciAddress.parse('0000:3d:00.5')      # 1145, not ours
FREE1 = objects.PciAddress.parse('0000:3d:00.6')
FREE2 = objects.PciAddress.parse('0000:3d:00.7')
GPU2_m = objects.PciAddress.parse('0000:bd:00.0')       # empty
EMPTY1 = objects.PciAddress.parse('0000:bd:00.4')
EMPTY2 = objects.PciAddress.parse('0000:bd:00.5')
MINI = {str(a) for a in (HELD1, HELD2, FREE1, FREE2, EMPTY1, EMPTY2)}
T1145 = objects.TypeId.parse('nvidia-1145')            # L40S-1B
T1146 = objects.TypeId.parse('nvidia-1146')            # L40S-2B
T1156 = objects.TypeId.parse('nvidia-1156')            # L40S-48Q
UUID1 = objects.Uuid.parse('11111111-2222-4333-8444-555555555555')
UUID2 = objects.Uuid.parse('22222222-2222-4333-8444-555555555555')
UUID3 = objects.Uuid.parse('33333333-2222-4333-8444-555555555555')
# what a free VF of the first GPU lists: it holds 1 GB vGPUs (equal size)
ONE_GB = ((1145, 'NVIDIA L40S-1B'), (1147, 'NVIDIA L40S-1Q'),
          (1157, 'NVIDIA L40S-1A'))


class Answering(kernel_sysfs.KernelSysfs):
    """The simulated kernel, except that a write of ``CURRENT_TYPE`` to a
    VF in ``answers`` is refused with that errno (``None``: taken and
    dropped, the file unchanged), after ``then()`` when set."""

    def __init__(self, root, profile):
        super().__init__(root, profile)
        self.answers = {}
        self.then = None

    def write(self, path, data):
        for vf, code in self.answers.items():
            if path == os.path.join(self.pci_dir(vf), names.VENDOR_DIR,
                                    names.CURRENT_TYPE):
                if self.then is not None:
                    self.then()
                if code is None:
                    return
                raise exception.SysfsWriteError(
                    path=path, reason=os.strerror(code), errno=code)
        return super().write(path, data)


def small(profile, vfs, path):
    """The bundled ``profile`` with only the VFs ``vfs`` (and their
    GPUs), written to ``path`` and loaded."""
    with open(os.path.join(loading.profile_dir(), profile + '.json')) as f:
        data = json.load(f)
    kept = []
    for device in data['devices']:
        if 'virtfns' in device:
            device['virtfns'] = [v for v in device['virtfns'] if v in vfs]
            device['sriov_totalvfs'] = len(device['virtfns'])
            kept.append(device)
        elif device['address'] in vfs:
            kept.append(device)
    data['devices'] = kept
    with open(path, 'w') as f:
        json.dump(data, f)
    return simulator.load_profile(path)


@pytest.fixture(scope='module')
def mini_profile():
    path = tempfile.mkdtemp(prefix='lgpu-mutnv-profile-')
    yield small('l40s', MINI, os.path.join(path, 'mini.json'))
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def top():
    # a private directory: a state directory below one anyone can write
    # is refused (statedir.check_dir)
    path = tempfile.mkdtemp(prefix='lgpu-mutnv-')
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def mini(mini_profile, top):
    root = os.path.join(top, 'sys')
    simulator.write_sysfs(mini_profile, root)
    return Answering(root, mini_profile)


@pytest.fixture
def mini_be(mini, top):
    return nvidia_vgpu.NvidiaVgpuBackend(
        mini, os.path.join(top, 'state'), remove_timeout=0.3,
        retry_stop=0.3)


def vgpu_m(parent=FREE1, type_id=T1145, uuid=UUID1):
    return base.VgpuDevice(uuid=uuid, parent=parent, type_id=type_id)


def vendor_file(mini, vf, name):
    return os.path.join(mini.root, 'bus/pci/devices', str(vf),
                        names.VENDOR_DIR, name)


def put(mini, vf, name, text):
    with open(vendor_file(mini, vf, name), 'w') as f:
        f.write(text)


def content(mini, vf, name):
    with open(vendor_file(mini, vf, name)) as f:
        return f.read()


def type_writes(mini):
    """The writes of ``CURRENT_TYPE`` the kernel took."""
    return [w.detail for w in mini.writes
            if w.kind == kernel_sysfs.CURRENT_VGPU_TYPE and not w.errno]


def state_file(mini_be):
    with open(mini_be.state.path) as f:
        return json.load(f)['vgpus']


# --- files: parse_creatable_types ------------------------------------------

@pytest.mark.parametrize('number', ['1', '999999999'])
def test_a_type_number_from_1_to_the_bound_is_read(number):
    assert files.parse_creatable_types(number + ' : T\n', 'p') == (
        (int(number), 'T'),)


@pytest.mark.parametrize('number', ['0', '1000000000'])
def test_a_type_number_out_of_bounds_is_refused_whole(number):
    with pytest.raises(exception.SysfsReadError) as e:
        files.parse_creatable_types('\n' + number + ' : T\n', '/p')
    assert str(e.value) == (
        'cannot read /p: line 2 is not "<type id> : <name>": %r'
        % (number + ' : T'))


def test_a_long_line_is_quoted_in_its_first_80_characters():
    raw = '1145 ' + 'x' * 100
    with pytest.raises(exception.SysfsReadError) as e:
        files.parse_creatable_types(raw, '/p')
    assert str(e.value) == (
        'cannot read /p: line 1 is not "<type id> : <name>": %r' % raw[:80])


def test_a_repeated_type_names_its_line_and_number():
    with pytest.raises(exception.SysfsReadError) as e:
        files.parse_creatable_types(
            'ID : vGPU Name\n1145 : A\n\n1145 : B\n', '/p')
    assert str(e.value) == 'cannot read /p: line 4 repeats type 1145'


def test_only_a_first_line_is_the_header():
    assert files.parse_creatable_types('id : vGPU Name\n7 : A\n', 'p') == (
        (7, 'A'),)
    with pytest.raises(exception.SysfsReadError, match='line 2 is not'):
        files.parse_creatable_types('7 : A\nID : vGPU Name\n', 'p')
    with pytest.raises(exception.SysfsReadError, match='line 1 is not'):
        files.parse_creatable_types('ID\n7 : A\n', 'p')


def test_a_second_header_is_refused():
    with pytest.raises(exception.SysfsReadError, match='line 2 is not'):
        files.parse_creatable_types('ID : vGPU Name\nID : again\n', 'p')


def test_the_first_colon_ends_the_number():
    assert files.parse_creatable_types('7 : NVIDIA A:B\n', 'p') == (
        (7, 'NVIDIA A:B'),)


def test_no_text_lists_nothing():
    assert files.parse_creatable_types(None, 'p') == ()


# --- files: the VF's files --------------------------------------------------

def test_the_interface_is_on_the_vfs_only(mini):
    found = files.VendorFiles(mini)
    assert found.vendor_dir(FREE1) == os.path.join(
        mini.pci_dir(FREE1), 'nvidia')
    assert found.has_interface(FREE1) is True
    assert found.has_interface(GPU1) is False
    assert found.vf_names() == sorted(MINI)
    assert found.vf_addresses() == sorted(
        objects.PciAddress.parse(a) for a in MINI)


def test_a_list_the_parser_refuses_names_its_file(mini):
    put(mini, FREE1, names.CREATABLE_TYPES, 'garbage\n')
    path = vendor_file(mini, FREE1, names.CREATABLE_TYPES)
    with pytest.raises(exception.SysfsReadError) as e:
        files.VendorFiles(mini).creatable_types(FREE1)
    assert str(e.value) == (
        "cannot read %s: line 1 is not \"<type id> : <name>\": 'garbage'"
        % path)


def test_a_function_that_is_no_pci_address_is_skipped(mini):
    os.makedirs(os.path.join(mini.root, 'bus/pci/devices/0000-not-a-vf',
                             names.VENDOR_DIR))
    found = files.VendorFiles(mini)
    assert found.vf_names()[0] == '0000-not-a-vf'     # listed first
    assert found.vf_addresses() == sorted(
        objects.PciAddress.parse(a) for a in MINI)


def test_the_type_file_is_read_and_written(mini):
    found = files.VendorFiles(mini)
    assert found.creatable_types(FREE1) == ONE_GB
    assert found.current_type(HELD1) == 1145
    assert found.current_type(FREE1) == 0
    found.set_current_type(FREE1, 1147)
    assert type_writes(mini) == [(str(FREE1), '1147')]
    assert found.current_type(FREE1) == 1147
    found.set_current_type(FREE1, 0)
    assert found.current_type(FREE1) == 0


@pytest.mark.parametrize('number', [True, False, -1, '1145', 1145.0, None])
def test_a_type_number_that_is_none_is_refused_unwritten(mini, number):
    with pytest.raises(exception.InvalidInput) as e:
        files.VendorFiles(mini).set_current_type(FREE1, number)
    assert str(e.value) == (
        'Invalid input: %s takes a type number, not %r'
        % (names.CURRENT_TYPE, number))
    assert mini.writes == []


@pytest.mark.parametrize('params,written', [
    ('frame_rate_limiter=0', 'frame_rate_limiter=0'),
    ('', ' '),                      # a single space clears them
    ('x' * 4096, 'x' * 4096),
])
def test_params_are_written_as_given(mini, params, written):
    files.VendorFiles(mini).write_params(FREE1, params)
    assert content(mini, FREE1, names.VGPU_PARAMS) == written


@pytest.mark.parametrize('params', [
    'a=1\nb=2', 'a=1\0', 'x' * 4097, None, b'a=1'])
def test_params_that_are_not_one_line_are_refused_unwritten(mini, params):
    with pytest.raises(exception.InvalidInput) as e:
        files.VendorFiles(mini).write_params(FREE1, params)
    assert str(e.value) == (
        'Invalid input: %s must be one line of key=value pairs'
        % names.VGPU_PARAMS)
    assert content(mini, FREE1, names.VGPU_PARAMS) == ''


def test_where_reads_each_file_in_its_own_place(mini):
    found = files.VendorFiles(mini)
    assert found.where(FREE1) == (None, None)      # a driver without them
    put(mini, FREE1, names.PLACEMENT_ID, '8\n')
    assert found.where(FREE1) == (None, 8)
    put(mini, FREE1, names.GPU_INSTANCE_ID, '3\n')
    assert found.where(FREE1) == (3, 8)


def test_where_takes_the_drivers_read_error_as_no_answer(mini, monkeypatch):
    read_int = mini.read_int

    def enxio(path, optional=False):
        if path.endswith(names.GPU_INSTANCE_ID):
            raise exception.SysfsReadError(path=path, reason='ENXIO')
        return read_int(path, optional=optional)
    monkeypatch.setattr(mini, 'read_int', enxio)
    put(mini, FREE1, names.PLACEMENT_ID, '8\n')
    assert files.VendorFiles(mini).where(FREE1) == (None, 8)
    put(mini, FREE1, names.PLACEMENT_ID, 'N/A\n')
    with pytest.raises(exception.SysfsBadNumber, match=names.PLACEMENT_ID):
        files.VendorFiles(mini).where(FREE1)


def test_read_vf_of_a_free_a_held_and_no_vf(mini):
    found = files.VendorFiles(mini)
    assert found.read_vf(GPU1) is None
    free = found.read_vf(FREE1)
    assert free.current is None
    assert free.creatable == tuple(
        objects.VgpuType(id=objects.vendor_type_id(n), name=name,
                         description=None, device_api='vfio-pci',
                         available_instances=1)
        for n, name in ONE_GB)
    held = found.read_vf(HELD1)
    assert held.creatable == ()
    assert held.current == objects.VgpuType(
        id=T1145, name=None, description=None, device_api='vfio-pci',
        available_instances=0)


def test_read_vf_names_the_held_type_from_its_own_list(mini):
    # a driver that lists the held type on the VF that holds it
    put(mini, HELD1, names.CREATABLE_TYPES,
        'ID : vGPU Name\n1147 : NVIDIA L40S-1Q\n1145 : NVIDIA L40S-1B\n')
    held = files.VendorFiles(mini).read_vf(HELD1)
    assert held.current == objects.VgpuType(
        id=T1145, name='NVIDIA L40S-1B', description=None,
        device_api='vfio-pci', available_instances=0)
    assert [t.available_instances for t in held.creatable] == [0, 0]


# --- kind: the backend's settings and readers -------------------------------

def test_from_parts_takes_the_hosts_parts(mini, top):
    from libvirt_gpu.devices.backends import base
    parts = base.KindParts(sysfs=mini, state_dir=top, nvml='nvml')
    made = nvidia_vgpu.NvidiaVgpuBackend.from_parts(parts)
    assert (made.sysfs, made.nvml, made.state.state_dir) == (
        mini, 'nvml', top)
    assert (made.remove_timeout, made.retry_stop) == (10.0, 5.0)
    assert nvidia_vgpu.NvidiaVgpuBackend.from_parts(records.replace(
        parts, remove_timeout=2.5)).remove_timeout == 2.5
    assert nvidia_vgpu.NvidiaVgpuBackend(mini, top).nvml is None


def test_the_class_readers_see_the_vfs(mini):
    kind = nvidia_vgpu.NvidiaVgpuBackend
    assert kind.parents_now(mini) == sorted(MINI)
    assert kind.sriov_pfs(mini) == base.nvidia_sriov_pfs(mini)
    assert kind.read_function(mini, FREE1) == files.VendorFiles(
        mini).read_vf(FREE1)
    assert kind.read_function(mini, GPU1) is None


def test_the_hostdev_is_the_vf_unmanaged(mini_be):
    assert mini_be.hostdev_xml(vgpu_m(parent=FREE2)) == nvidia_vgpu.vf_hostdev(
        FREE2)
    assert "managed='no'" in mini_be.hostdev_xml(vgpu_m())


@pytest.mark.parametrize('call,what', [
    (lambda b: b.is_parent(str(FREE1)), 'address'),
    (lambda b: b.check_type(str(FREE1), T1145), 'parent'),
    (lambda b: b.available(str(FREE1), T1145), 'parent'),
    (lambda b: b.lookup(str(UUID1)), 'uuid'),
    (lambda b: b.choose_vf(str(GPU1), T1145), 'gpu'),
    (lambda b: b.choose_vf(GPU1, T1145, exclude=[str(FREE1)]), r'exclude\[\]'),
    (lambda b: b.held_type(str(FREE1)), 'parent'),
    (lambda b: b.write_type(str(FREE1), T1145), 'parent'),
    (lambda b: b.clear_type(str(FREE1)), 'parent'),
    (lambda b: b.remove(str(UUID1)), 'uuid'),
    (lambda b: b.reset_vf(str(FREE1)), 'vf'),
    (lambda b: b.undefine(str(UUID1)), 'uuid'),
    (lambda b: b.room(str(GPU1), T1145), 'gpu'),
])
def test_text_where_a_parsed_value_belongs_is_refused_by_name(
        mini_be, call, what):
    with pytest.raises(TypeError, match='^%s must be an objects.' % what):
        call(mini_be)


def test_check_type_refusals(mini_be):
    with pytest.raises(exception.ParentGone) as e:
        mini_be.check_type(GPU1, T1145)
    assert str(e.value) == (
        'The GPU 0000:3d:00.0 is not an mdev parent (any more): 0000:3d:00.0 '
        'has no nvidia/ directory (are its VFs enabled and the vGPU manager '
        'loaded?)')
    assert e.value.kwargs['uuid'] is None
    with pytest.raises(exception.UnknownType) as e:
        mini_be.check_type(FREE1, objects.TypeId.parse('grid-1145'))
    assert str(e.value) == (
        'The GPU at 0000:3d:00.6 does not offer vGPU type grid-1145; '
        '`libvirt-gpu types 0000:3d:00.6` lists the types it offers')
    with pytest.raises(exception.UnknownType) as e:
        mini_be.check_type(EMPTY1, objects.TypeId.parse('nvidia-99999'))
    assert str(e.value) == (
        'The GPU at 0000:bd:00.4 does not offer vGPU type nvidia-99999; '
        '`libvirt-gpu types 0000:bd:00.4` lists the types it offers')


def test_check_type_leaves_a_gpu_holding_vgpus_to_the_kernel(mini_be):
    # the first GPU holds 1 GB vGPUs: its free VFs list only 1 GB types,
    # and whether a 48 GB one is unknown or does not fit is the kernel's
    mini_be.check_type(FREE1, T1156)
    mini_be.check_type(FREE1, objects.TypeId.parse('nvidia-99999'))
    mini_be.check_type(FREE1, T1145)           # listed
    mini_be.check_type(HELD1, T1145)           # held
    mini_be.check_type(EMPTY1, T1156)          # listed on an empty GPU


def test_a_gpu_holds_vgpus_when_one_of_its_vfs_does(mini_be, mini):
    # one vGPU on the empty GPU's second VF: its first VF's check passes
    bogus = objects.TypeId.parse('nvidia-99999')
    with pytest.raises(exception.UnknownType):
        mini_be.check_type(EMPTY1, bogus)
    files.VendorFiles(mini).set_current_type(EMPTY2, 1145)
    mini_be.check_type(EMPTY1, bogus)
    files.VendorFiles(mini).set_current_type(EMPTY2, 0)
    with pytest.raises(exception.UnknownType):
        mini_be.check_type(EMPTY1, bogus)


def test_a_vf_without_its_gpu_asks_only_itself(mini_be, mini, monkeypatch):
    bogus = objects.TypeId.parse('nvidia-99999')
    monkeypatch.setattr(mini, 'physfn', lambda vf: None)
    with pytest.raises(exception.UnknownType):
        mini_be.check_type(EMPTY1, bogus)
    files.VendorFiles(mini).set_current_type(EMPTY2, 1145)
    with pytest.raises(exception.UnknownType):      # its sibling is not asked
        mini_be.check_type(EMPTY1, bogus)
    mini_be.check_type(EMPTY2, bogus)               # it holds one itself


def test_available_is_one_on_a_free_vf_listing_the_type(mini_be):
    assert mini_be.available(FREE1, T1145) == 1
    assert mini_be.available(FREE1, T1156) == 0     # not listed
    assert mini_be.available(HELD1, T1145) == 0     # holds one
    assert type(mini_be.available(FREE1, T1145)) is int
    assert mini_be.vgpu_type(FREE1, T1145) == objects.VgpuType(
        id=T1145, name='NVIDIA L40S-1B', description=None,
        device_api='vfio-pci', available_instances=1)
    assert mini_be.vgpu_type(FREE1, T1156) == objects.VgpuType(
        id=T1156, name=None, description=None, device_api='vfio-pci',
        available_instances=0)


def test_held_type_and_clear_type(mini_be, mini):
    assert mini_be.held_type(HELD1) == T1145
    assert mini_be.held_type(FREE1) is None
    mini_be.clear_type(HELD1)
    assert mini_be.held_type(HELD1) is None
    assert type_writes(mini) == [(str(HELD1), '0')]


# --- kind: our record, read back --------------------------------------------

def test_lookup_answers_only_a_vgpu_that_exists_as_recorded(mini_be, mini):
    assert mini_be.lookup(UUID1) is None                  # not ours
    mini_be.define(vgpu_m(), start='manual')
    assert mini_be.lookup(UUID1) is None                  # defined, not made
    assert mini_be.existing() == {}
    mini_be.prepare(vgpu_m())
    assert mini_be.lookup(UUID1) == vgpu_m()
    assert mini_be.existing() == {UUID1: (FREE1, T1145)}
    assert mini_be.exists(vgpu_m()) is True
    assert mini_be.exists(vgpu_m(parent=FREE2)) is False
    assert mini_be.exists(vgpu_m(type_id=T1146)) is False
    assert mini_be.exists(vgpu_m(uuid=UUID2)) is False
    files.VendorFiles(mini).set_current_type(FREE1, 0)
    files.VendorFiles(mini).set_current_type(FREE1, 1147)   # someone else's
    assert mini_be.lookup(UUID1) is None
    shutil.rmtree(files.VendorFiles(mini).vendor_dir(FREE1))
    assert mini_be.lookup(UUID1) is None                  # the VF went away


def test_what_we_record_is_asked_of_the_state_file(mini_be):
    assert (mini_be.owns(UUID1), mini_be.recorded(UUID1)) == (False, False)
    mini_be.prepare(vgpu_m())
    mini_be.define(vgpu_m(parent=EMPTY1, uuid=UUID2), start='auto')
    mini_be.define(vgpu_m(parent=FREE2, uuid=UUID3), start='manual')
    assert (mini_be.owns(UUID1), mini_be.recorded(UUID1)) == (True, True)
    assert mini_be.reserved_parents() == {
        FREE1: UUID1, EMPTY1: UUID2, FREE2: UUID3}
    assert set(mini_be.vgpus()) == {UUID1, UUID2, UUID3}
    assert [r.device for r in mini_be.restorable()] == [
        vgpu_m(parent=EMPTY1, uuid=UUID2)]
    assert sorted(mini_be.recorded_gpus()) == [GPU1, GPU1, GPU2_m]


def test_restorable_is_in_uuid_order(mini_be):
    mini_be.define(vgpu_m(parent=FREE2, uuid=UUID3), start='auto')
    mini_be.define(vgpu_m(parent=FREE1, uuid=UUID1), start='auto')
    assert mini_be.restorable() == (
        base.Restorable(uuid=UUID1, device=vgpu_m(parent=FREE1, uuid=UUID1),
                        detail='%s on VF %s' % (vgpu_m().type_id, FREE1)),
        base.Restorable(uuid=UUID3, device=vgpu_m(parent=FREE2, uuid=UUID3),
                        detail='%s on VF %s' % (vgpu_m().type_id, FREE2)))


def test_a_recorded_vf_without_its_gpu_names_none(mini_be, mini, monkeypatch):
    monkeypatch.setattr(mini, 'physfn', lambda vf: None)
    mini_be.define(vgpu_m(parent=FREE1), start='auto')
    assert mini_be.recorded_gpus() == ()
    assert state_file(mini_be)[UUID1]['gpu'] is None


def test_a_definition_is_a_persistent_entry(mini_be):
    assert mini_be.definition(UUID1) is None
    mini_be.prepare(vgpu_m())
    assert mini_be.definition(UUID1) is None           # transient
    mini_be.define(vgpu_m(), start='manual')
    assert mini_be.definition(UUID1) == base.VgpuDefinition(
        uuid=UUID1, parent=FREE1, type_id=T1145, start='manual',
        source='the state file %s' % mini_be.state.path)


# --- kind: choosing a VF ----------------------------------------------------

def test_choose_vf_takes_the_first_free_vf_listing_the_type(mini_be):
    assert mini_be.choose_parent(GPU1, T1145) == FREE1
    assert mini_be.choose_vf(GPU1, T1145, exclude=[FREE1]) == FREE2
    mini_be.define(vgpu_m(parent=FREE1), start='manual')      # recorded
    assert mini_be.choose_vf(GPU1, T1145) == FREE2
    assert mini_be.choose_vf(GPU2_m, T1156) == EMPTY1


def test_choose_vf_refusal_counts_the_free_vfs(mini_be):
    with pytest.raises(exception.NoCapacity) as e:
        mini_be.choose_vf(GPU1, T1156)
    assert str(e.value) == (
        'No capacity left for vGPU type nvidia-1156 on the GPU 0000:3d:00.0: '
        'none of its 2 free VFs lists the type as creatable (the GPU is '
        'full, or holds vGPUs of another framebuffer size)')
    assert e.value.kwargs['uuid'] is None
    with pytest.raises(exception.NoCapacity, match='none of its 1 free VFs'):
        mini_be.choose_vf(GPU1, T1156, exclude=[FREE2])
    mini_be.define(vgpu_m(parent=FREE1), start='manual')
    with pytest.raises(exception.NoCapacity, match='none of its 0 free VFs'):
        mini_be.choose_vf(GPU1, T1145, exclude=[FREE2])


def test_choose_vf_skips_a_vf_without_the_interface(mini_be, mini):
    shutil.rmtree(files.VendorFiles(mini).vendor_dir(EMPTY1))
    assert mini_be.choose_vf(GPU2_m, T1145) == EMPTY2


# --- kind: create -----------------------------------------------------------

def test_prepare_makes_then_finds_its_vgpu(mini_be, mini):
    assert mini_be.prepare(vgpu_m()) is True
    assert mini_be.prepare(vgpu_m()) is False                # ours, made
    assert type_writes(mini) == [(str(FREE1), '1145')]
    assert state_file(mini_be) == {UUID1: {
        'vf': str(FREE1), 'gpu': str(GPU1), 'type_id': 'nvidia-1145',
        'start': None, 'params': None}}
    # no parameters recorded: the VF's are left as they are
    assert content(mini, FREE1, names.VGPU_PARAMS) == ''


def test_prepare_makes_a_defined_vgpu(mini_be, mini):
    mini_be.define(vgpu_m(), start='manual', params='frame_rate_limiter=0')
    assert type_writes(mini) == []
    assert mini_be.prepare(vgpu_m()) is True
    assert content(mini, FREE1, names.VGPU_PARAMS) == 'frame_rate_limiter=0'
    assert state_file(mini_be)[UUID1] == {
        'vf': str(FREE1), 'gpu': str(GPU1), 'type_id': 'nvidia-1145',
        'start': 'manual', 'params': 'frame_rate_limiter=0'}


def test_prepare_keeps_what_it_is_given(mini_be, mini):
    assert mini_be.prepare(vgpu_m(), start='auto', params='disable_vnc=1')
    assert content(mini, FREE1, names.VGPU_PARAMS) == 'disable_vnc=1'
    assert mini_be.definition(UUID1).start == 'auto'


def test_an_empty_params_entry_writes_nothing(mini_be, mini):
    mini_be.define(vgpu_m(), start='manual', params='')
    mini_be.prepare(vgpu_m())
    assert [w for w in mini.writes if w.kind == kernel_sysfs.FILE] == []


def test_a_vf_holding_someone_elses_vgpu_is_a_conflict_left_alone(
        mini_be, mini):
    with pytest.raises(exception.MdevConflict) as e:
        mini_be.prepare(vgpu_m(parent=HELD1))
    assert str(e.value) == (
        'vGPU 11111111-2222-4333-8444-555555555555 already exists as type '
        'nvidia-1145 on 0000:3d:00.4, but type nvidia-1145 on 0000:3d:00.4 '
        'was asked for; pick another UUID or remove the existing vGPU')
    assert type_writes(mini) == []
    assert mini_be.vgpus() == {}                      # the claim rolled back


def test_a_defined_vf_holding_another_type_is_a_conflict(mini_be, mini):
    mini_be.define(vgpu_m(), start='manual')
    files.VendorFiles(mini).set_current_type(FREE1, 1147)
    with pytest.raises(exception.MdevConflict, match='as type nvidia-1147'):
        mini_be.prepare(vgpu_m())
    assert mini_be.definition(UUID1).start == 'manual'   # defined: kept


def test_a_failed_create_keeps_only_a_definition(mini_be):
    with pytest.raises(exception.NoCapacity):
        mini_be.prepare(vgpu_m(type_id=T1156))
    assert mini_be.vgpus() == {}
    mini_be.define(vgpu_m(type_id=T1156), start='manual')
    with pytest.raises(exception.NoCapacity):
        mini_be.prepare(vgpu_m(type_id=T1156))
    assert set(mini_be.vgpus()) == {UUID1}


def test_claims_that_clash(mini_be):
    mini_be.prepare(vgpu_m())
    with pytest.raises(exception.MdevConflict) as e:
        mini_be.prepare(vgpu_m(uuid=UUID2))
    assert str(e.value) == (
        'vGPU 22222222-2222-4333-8444-555555555555 already exists as type '
        'nvidia-1145 on 0000:3d:00.6 (as vGPU '
        '11111111-2222-4333-8444-555555555555), but type nvidia-1145 on '
        '0000:3d:00.6 was asked for; pick another UUID or remove the '
        'existing vGPU')
    with pytest.raises(exception.MdevConflict) as e:
        mini_be.prepare(vgpu_m(parent=FREE2))
    assert str(e.value) == (
        'vGPU 11111111-2222-4333-8444-555555555555 already exists as type '
        'nvidia-1145 on 0000:3d:00.6, but type nvidia-1145 on 0000:3d:00.7 '
        'was asked for; pick another UUID or remove the existing vGPU')
    with pytest.raises(exception.MdevConflict) as e:
        mini_be.prepare(vgpu_m(type_id=objects.TypeId.parse('nvidia-1147')))
    assert str(e.value) == (
        'vGPU 11111111-2222-4333-8444-555555555555 already exists as type '
        'nvidia-1145 on 0000:3d:00.6, but type nvidia-1147 on 0000:3d:00.6 '
        'was asked for; pick another UUID or remove the existing vGPU')
    assert mini_be.vgpus()[UUID1].vf == FREE1          # the first kept


def test_a_claim_again_keeps_its_start_and_params_unless_given(mini_be):
    mini_be.define(vgpu_m(), start='manual', params='a=1')
    mini_be.define(vgpu_m())
    assert state_file(mini_be)[UUID1]['start'] == 'auto'
    assert state_file(mini_be)[UUID1]['params'] == 'a=1'
    mini_be.define(vgpu_m(), start='manual', params='b=2')
    mini_be.prepare(vgpu_m())
    assert (state_file(mini_be)[UUID1]['start'],
            state_file(mini_be)[UUID1]['params']) == ('manual', 'b=2')


def test_the_driver_placement_is_kept_with_the_record(mini_be, mini):
    put(mini, FREE1, names.PLACEMENT_ID, '8\n')
    mini_be.prepare(vgpu_m())
    entry = mini_be.vgpus()[UUID1]
    assert (entry.gi_id, entry.placement) == (None, 8)
    put(mini, FREE2, names.GPU_INSTANCE_ID, '3\n')
    mini_be.prepare(vgpu_m(parent=FREE2, uuid=UUID2))
    entry = mini_be.vgpus()[UUID2]
    assert (entry.gi_id, entry.placement) == (3, None)
    assert mini_be.vgpus()[UUID1].placement == 8


def test_where_read_for_a_record_gone_records_nothing(mini_be, mini,
                                                      monkeypatch):
    put(mini, FREE1, names.PLACEMENT_ID, '8\n')
    mini_be.prepare(vgpu_m())
    mini_be.remove(UUID1)
    mini_be._record_where(UUID1, FREE1)
    assert mini_be.vgpus() == {}


@pytest.mark.parametrize('code', [errno.ENODEV, errno.ENOENT])
def test_a_create_the_driver_answers_gone_is_parent_gone(mini_be, mini, code):
    mini.answers[FREE1] = code
    with pytest.raises(exception.ParentGone) as e:
        mini_be.prepare(vgpu_m())
    assert str(e.value) == (
        'The GPU 0000:3d:00.6 is not an mdev parent (any more): the driver '
        'answered %s' % errno.errorcode[code])
    assert e.value.kwargs['uuid'] == UUID1
    assert mini_be.vgpus() == {}


def test_a_create_whose_vf_vanished_is_parent_gone(mini_be, mini):
    mini.answers[FREE1] = errno.EIO
    mini.then = lambda: shutil.rmtree(
        files.VendorFiles(mini).vendor_dir(FREE1))
    with pytest.raises(exception.ParentGone, match='the driver answered EIO'):
        mini_be.prepare(vgpu_m())


def test_a_create_refused_with_the_type_still_listed_failed(mini_be, mini):
    mini.answers[FREE1] = errno.EIO
    with pytest.raises(exception.MdevCreateFailed) as e:
        mini_be.prepare(vgpu_m())
    assert str(e.value) == (
        'Cannot create vGPU 11111111-2222-4333-8444-555555555555 (type '
        'nvidia-1145 on 0000:3d:00.6): the driver answered EIO')
    mini.answers[FREE1] = 999
    with pytest.raises(exception.MdevCreateFailed,
                       match='the driver answered 999$'):
        mini_be.prepare(vgpu_m())


def test_a_create_refused_without_room_is_no_capacity(mini_be):
    with pytest.raises(exception.NoCapacity) as e:
        mini_be.prepare(vgpu_m(type_id=T1156))
    assert str(e.value) == (
        'No capacity left for vGPU type nvidia-1156 on the GPU of VF '
        '0000:3d:00.6: the driver answered EINVAL and no longer lists the '
        'type as creatable')
    assert e.value.kwargs['uuid'] == UUID1


def test_a_create_the_file_does_not_show_failed(mini_be, mini):
    mini.answers[FREE1] = None
    with pytest.raises(exception.MdevCreateFailed) as e:
        mini_be.prepare(vgpu_m())
    assert str(e.value) == (
        'Cannot create vGPU 11111111-2222-4333-8444-555555555555 (type '
        'nvidia-1145 on 0000:3d:00.6): %s does not read 1145 '
        'after the write' % names.CURRENT_TYPE)


def test_a_busy_create_is_retried_for_retry_stop(mini_be, mini):
    mini.busy(FREE1, count=2)
    assert mini_be.prepare(vgpu_m()) is True
    assert [(w.detail, w.errno) for w in mini.writes] == [
        ((str(FREE1), '1145'), errno.EBUSY)] * 2 + [
        ((str(FREE1), '1145'), 0)]
    mini.busy(FREE2, count=10 ** 6)
    mini_be.retry_stop = 0.2
    started = time.monotonic()
    with pytest.raises(exception.MdevCreateFailed, match='EBUSY'):
        mini_be.prepare(vgpu_m(parent=FREE2, uuid=UUID2))
    assert time.monotonic() - started < 3     # retry_stop, not a default


# --- kind: carving for another program ---------------------------------------

def test_write_type_writes_and_records_nothing(mini_be, mini):
    mini_be.write_type(FREE1, T1145)
    assert mini_be.held_type(FREE1) == T1145
    assert mini_be.vgpus() == {}
    with pytest.raises(exception.UnknownType):
        mini_be.write_type(EMPTY1, objects.TypeId.parse('nvidia-99999'))


def test_write_type_refusals(mini_be, mini):
    mini.answers[FREE1] = errno.EIO
    with pytest.raises(exception.MdevCreateFailed) as e:
        mini_be.write_type(FREE1, T1145)
    assert str(e.value) == (
        'Cannot create vGPU for Nova (type nvidia-1145 on 0000:3d:00.6): the '
        'driver answered EIO')
    mini.answers[FREE1] = 999
    with pytest.raises(exception.MdevCreateFailed,
                       match='the driver answered 999$'):
        mini_be.write_type(FREE1, T1145)
    mini.answers[FREE1] = None
    with pytest.raises(exception.MdevCreateFailed) as e:
        mini_be.write_type(FREE1, T1145)
    assert str(e.value) == (
        'Cannot create vGPU for Nova (type nvidia-1145 on 0000:3d:00.6): '
        '%s does not read 1145 after the write' % names.CURRENT_TYPE)


def test_write_type_retries_a_busy_driver(mini_be, mini):
    mini.busy(FREE1, count=2)
    mini_be.write_type(FREE1, T1145)
    assert mini_be.held_type(FREE1) == T1145
    mini.busy(FREE2, count=10 ** 6)
    mini_be.retry_stop = 0.2
    started = time.monotonic()
    with pytest.raises(exception.MdevCreateFailed, match='EBUSY'):
        mini_be.write_type(FREE2, T1145)
    assert time.monotonic() - started < 3     # retry_stop, not a default


# --- kind: remove -----------------------------------------------------------

def test_remove_resets_only_our_vgpu(mini_be, mini):
    assert mini_be.remove(UUID1) is False
    mini_be.prepare(vgpu_m())
    assert mini_be.release(vgpu_m()) is True
    assert mini_be.held_type(FREE1) is None
    assert mini_be.vgpus() == {}
    # recorded, but the VF holds another type now: not ours to reset
    mini_be.prepare(vgpu_m())
    files.VendorFiles(mini).set_current_type(FREE1, 0)
    files.VendorFiles(mini).set_current_type(FREE1, 1147)
    assert mini_be.remove(UUID1) is False
    assert mini_be.held_type(FREE1) == objects.TypeId.parse('nvidia-1147')
    assert mini_be.vgpus() == {}                  # transient: forgotten


def test_remove_keeps_a_persistent_entry(mini_be, mini):
    mini_be.define(vgpu_m(), start='manual')
    mini_be.prepare(vgpu_m())
    assert mini_be.remove(UUID1) is True
    assert mini_be.definition(UUID1).start == 'manual'
    assert mini_be.remove(UUID1) is False


def test_remove_of_a_vgpu_whose_vf_went_away(mini_be, mini):
    mini_be.prepare(vgpu_m())
    shutil.rmtree(files.VendorFiles(mini).vendor_dir(FREE1))
    assert mini_be.remove(UUID1) is False
    assert mini_be.vgpus() == {}


@pytest.mark.parametrize('code', [errno.ENODEV, errno.ENOENT])
def test_a_reset_the_driver_answers_gone_is_done(mini_be, mini, code):
    mini_be.prepare(vgpu_m())
    mini.answers[FREE1] = code
    assert mini_be.remove(UUID1) is True
    assert mini_be.vgpus() == {}


def test_reset_refusals_name_the_vgpu_or_the_vf(mini_be, mini):
    mini_be.prepare(vgpu_m())
    mini_be.remove_timeout = 1.0
    mini.answers[FREE1] = errno.EIO
    with pytest.raises(exception.MdevRemoveFailed) as e:
        mini_be.remove(UUID1)
    assert str(e.value) == (
        'Cannot remove vGPU 11111111-2222-4333-8444-555555555555: the driver '
        'answered EIO for 1 s; is a guest still using VF 0000:3d:00.6?')
    mini.answers[FREE1] = 999
    with pytest.raises(exception.MdevRemoveFailed) as e:
        mini_be.reset_vf(FREE1)
    assert str(e.value) == (
        'Cannot remove vGPU on VF 0000:3d:00.6: the driver answered 999 for '
        '1 s; is a guest still using VF 0000:3d:00.6?')
    mini_be.remove_timeout = 0.1
    mini.answers[FREE1] = None
    with pytest.raises(exception.MdevRemoveFailed) as e:
        mini_be.reset_vf(FREE1)
    assert str(e.value) == (
        'Cannot remove vGPU on VF 0000:3d:00.6: %s of '
        '0000:3d:00.6 is not 0 after the write' % names.CURRENT_TYPE)
    assert mini_be.held_type(FREE1) == T1145


def test_a_reset_waits_for_the_file_to_read_0(mini_be, mini, monkeypatch):
    mini_be.prepare(vgpu_m())
    read = mini_be.files.current_type
    late = [1145, 1145]

    def current_type(vf):          # the driver shows 0 a little later
        return late.pop() if late else read(vf)
    monkeypatch.setattr(mini_be.files, 'current_type', current_type)
    mini_be.remove_timeout = 5.0
    started = time.monotonic()
    mini_be.reset_vf(FREE1)
    assert late == [] and read(FREE1) == 0
    assert time.monotonic() - started < 1.5   # two short polls


def test_a_busy_reset_is_retried_for_remove_timeout(mini_be, mini):
    mini_be.prepare(vgpu_m())
    mini.busy(FREE1, count=10 ** 6)
    mini_be.remove_timeout = 0.2
    started = time.monotonic()
    with pytest.raises(exception.MdevRemoveFailed, match='EBUSY for 0 s'):
        mini_be.remove(UUID1)
    assert time.monotonic() - started < 3     # remove_timeout, no default
    assert mini_be.held_type(FREE1) == T1145


# --- kind: persistence ------------------------------------------------------

def test_define_refuses_a_start_it_does_not_know(mini_be):
    with pytest.raises(exception.InvalidInput) as e:
        mini_be.define(vgpu_m(), start='boot')
    assert str(e.value) == (
        "Invalid input: start must be auto or manual, not 'boot'")
    with pytest.raises(exception.UnknownType):
        mini_be.define(vgpu_m(parent=EMPTY1,
                              type_id=objects.TypeId.parse('nvidia-99999')))
    assert mini_be.vgpus() == {}
    mini_be.define(vgpu_m())
    assert mini_be.definition(UUID1).start == 'auto'


def test_undefine(mini_be):
    assert mini_be.undefine(UUID1) is False
    mini_be.prepare(vgpu_m())
    assert mini_be.undefine(UUID1) is False                # transient
    mini_be.define(vgpu_m(), start='auto')
    assert mini_be.undefine(UUID1) is True
    assert state_file(mini_be)[UUID1]['start'] is None     # made: transient
    assert mini_be.lookup(UUID1) == vgpu_m()
    mini_be.define(vgpu_m(parent=FREE2, uuid=UUID2), start='manual')
    assert mini_be.undefine(UUID2) is True
    assert set(mini_be.vgpus()) == {UUID1}                 # not made: gone


# --- kind: after a reboot ---------------------------------------------------

def notes_of(notes):
    return [(n.action, n.target, n.detail) for n in notes]


NOT_OURS = [
    ('skipped', '0000:3d:00.4', 'holds nvidia-1145, not one of ours: left '
     'alone'),
    ('skipped', '0000:3d:00.5', 'holds nvidia-1145, not one of ours: left '
     'alone')]


def test_boot_cleanup_of_a_host_with_nothing_of_ours(mini_be, mini):
    assert notes_of(mini_be.boot_cleanup(lambda uuid: False)) == NOT_OURS
    assert type_writes(mini) == []


def test_boot_cleanup_resets_a_transient_vgpu_without_a_guest(mini_be, mini):
    mini_be.prepare(vgpu_m())
    asked = []

    def running(uuid):
        asked.append(uuid)
        return False
    assert notes_of(mini_be.boot_cleanup(running)) == NOT_OURS + [
        ('reset', UUID1, 'reset VF 0000:3d:00.6 (held nvidia-1145 for a '
         'guest that is not running)')]
    assert asked == [UUID1]
    assert mini_be.held_type(FREE1) is None
    assert mini_be.vgpus() == {}


def test_boot_cleanup_judges_by_the_guest(mini_be, mini):
    mini_be.prepare(vgpu_m())
    assert notes_of(mini_be.boot_cleanup(lambda uuid: True))[2:] == [
        ('ok', UUID1, 'nvidia-1145 on VF 0000:3d:00.6 is in use by a running '
         'guest')]
    assert notes_of(mini_be.boot_cleanup(lambda uuid: None))[2:] == [
        ('skipped', UUID1, 'nvidia-1145 on VF 0000:3d:00.6: cannot tell '
         'whether its guest runs; kept')]
    assert notes_of(mini_be.boot_cleanup(lambda uuid: False,
                                         dry_run=True))[2:] == [
        ('would', UUID1, 'would reset VF 0000:3d:00.6 (write 0 to its '
         '%s: it holds nvidia-1145 for a guest that is not '
         'running)' % names.CURRENT_TYPE)]
    assert mini_be.held_type(FREE1) == T1145
    assert set(mini_be.vgpus()) == {UUID1}


def test_boot_cleanup_notes_a_reset_that_failed(mini_be, mini):
    mini_be.prepare(vgpu_m())
    mini.answers[FREE1] = None
    mini_be.remove_timeout = 0.1
    assert notes_of(mini_be.boot_cleanup(lambda uuid: False))[2:] == [
        ('failed', UUID1, 'Cannot remove vGPU %s: %s of '
         '0000:3d:00.6 is not 0 after the write'
         % (UUID1, names.CURRENT_TYPE))]


def test_boot_cleanup_leaves_persistent_vgpus_to_restore(mini_be, mini):
    mini_be.define(vgpu_m(), start='manual')
    mini_be.prepare(vgpu_m())
    assert notes_of(mini_be.boot_cleanup(lambda uuid: False)) == NOT_OURS
    assert mini_be.held_type(FREE1) == T1145


def test_boot_cleanup_names_a_vf_it_cannot_read(mini_be, mini, monkeypatch):
    mini_be.prepare(vgpu_m())
    mini_be.prepare(vgpu_m(parent=EMPTY1, uuid=UUID2))
    read = mini_be.files.current_type
    path = vendor_file(mini, FREE1, names.CURRENT_TYPE)

    def current_type(vf):       # what read_int says of a file of garbage
        if vf == FREE1:
            raise exception.SysfsBadNumber(path=path, expected='a number',
                                           text='lots')
        return read(vf)
    monkeypatch.setattr(mini_be.files, 'current_type', current_type)
    notes = notes_of(mini_be.boot_cleanup(lambda uuid: False))
    assert notes[2][:2] == ('failed', str(FREE1))
    assert names.CURRENT_TYPE in notes[2][2]
    # the VFs after it are still looked at; its entry is not forgotten
    assert notes[3:] == [('reset', UUID2, 'reset VF 0000:bd:00.4 (held '
                          'nvidia-1145 for a guest that is not running)')]
    assert set(mini_be.vgpus()) == {UUID1}


def test_boot_cleanup_forgets_a_transient_entry_whose_vf_is_empty(
        mini_be, mini):
    mini_be.prepare(vgpu_m())
    mini_be.prepare(vgpu_m(parent=EMPTY1, uuid=UUID2))
    mini_be.define(vgpu_m(parent=FREE2, uuid=UUID3), start='manual')
    for vf in (FREE1, EMPTY1):
        files.VendorFiles(mini).set_current_type(vf, 0)
    assert notes_of(mini_be.boot_cleanup(lambda uuid: False,
                                         dry_run=True)) == NOT_OURS + [
        ('would', UUID1, 'would forget it: its VF 0000:3d:00.6 holds no vGPU '
         'any more'),
        ('would', UUID2, 'would forget it: its VF 0000:bd:00.4 holds no vGPU '
         'any more')]
    assert set(mini_be.vgpus()) == {UUID1, UUID2, UUID3}
    assert notes_of(mini_be.boot_cleanup(lambda uuid: False)) == NOT_OURS + [
        ('forgot', UUID1, 'its VF 0000:3d:00.6 holds no vGPU any more'),
        ('forgot', UUID2, 'its VF 0000:bd:00.4 holds no vGPU any more')]
    assert set(mini_be.vgpus()) == {UUID3}


def test_boot_cleanup_forgets_past_an_entry_still_held(mini_be, mini):
    mini_be.prepare(vgpu_m())                              # its guest runs
    mini_be.prepare(vgpu_m(parent=EMPTY1, uuid=UUID2))
    files.VendorFiles(mini).set_current_type(EMPTY1, 0)
    assert notes_of(mini_be.boot_cleanup(lambda uuid: True))[2:] == [
        ('ok', UUID1, 'nvidia-1145 on VF 0000:3d:00.6 is in use by a running '
         'guest'),
        ('forgot', UUID2, 'its VF 0000:bd:00.4 holds no vGPU any more')]
    assert set(mini_be.vgpus()) == {UUID1}


def test_boot_cleanup_forgets_an_entry_whose_vf_is_gone(mini_be, mini):
    mini_be.prepare(vgpu_m())
    shutil.rmtree(files.VendorFiles(mini).vendor_dir(FREE1))
    assert notes_of(mini_be.boot_cleanup(lambda uuid: False)) == NOT_OURS + [
        ('forgot', UUID1, 'its VF 0000:3d:00.6 holds no vGPU any more')]
    assert mini_be.vgpus() == {}


def test_boot_cleanup_sees_only_vfs_of_a_gpu(mini_be, mini, monkeypatch):
    physfn = mini.physfn
    monkeypatch.setattr(mini, 'physfn',
                        lambda a: None if a == HELD1 else physfn(a))
    assert notes_of(mini_be.boot_cleanup(lambda uuid: False)) == NOT_OURS[1:]


# --- kind: the driver's room ------------------------------------------------

T1153 = objects.TypeId.parse('nvidia-1153')            # L40S-12Q: 8 slots


class NoNvml(object):
    def session(self):
        raise nvml.NvmlUnavailable(reason='no driver')


@pytest.fixture
def with_nvml(mini_be, mini):
    mini_be.nvml = nvml.Nvml(sim_nvml.module(sysfs_root=mini.root))
    return mini_be


def mixed_size(mini_be, mini, gpu):
    with mini_be.nvml.session() as session:
        session.set_mixed_size(gpu, True)
    with mini.kernel._write(str(gpu)):      # the VFs' lists, rewritten
        pass


def test_an_equal_size_gpu_has_no_room_of_the_drivers(with_nvml):
    assert with_nvml.room(GPU2_m, T1153) is None


def test_a_mixed_size_room_is_the_creatable_placements(with_nvml, mini):
    mixed_size(with_nvml, mini, GPU2_m)
    assert with_nvml.room(GPU2_m, T1153) == capacity.DriverRoom(
        mode=capacity.MODE_MIXED, type_id=T1153, used=0, placement_size=8,
        placements=(0, 8, 16, 24))
    with_nvml.prepare(vgpu_m(parent=EMPTY2, type_id=T1153))
    assert with_nvml.room(GPU2_m, T1153) == capacity.DriverRoom(
        mode=capacity.MODE_MIXED, type_id=T1153, used=1, placement_size=8,
        placements=(8, 16, 24))
    assert with_nvml.room(GPU2_m, T1145).used == 0
    with_nvml.nvml = NoNvml()
    assert with_nvml.room(GPU2_m, T1153) is None
    with_nvml.nvml = None
    assert with_nvml.room(GPU2_m, T1153) is None


def test_a_type_without_placements_has_none(with_nvml, mini, monkeypatch):
    mixed_size(with_nvml, mini, GPU2_m)
    monkeypatch.setattr(nvml.Session, 'creatable_placements',
                        lambda self, gpu, number: None)
    assert with_nvml.room(GPU2_m, T1153) == capacity.DriverRoom(
        mode=capacity.MODE_MIXED, type_id=T1153, used=0,
        placement_size=None, placements=())


def test_a_gpu_without_vfs_has_no_room(with_nvml, mini):
    mini.write(os.path.join(mini.pci_dir(GPU2_m), 'sriov_numvfs'), '0')
    with_nvml.nvml = NoNvml()
    assert with_nvml.room(GPU2_m, T1153) is None


H100 = objects.PciAddress.parse('0000:4e:00.0')
H100_VFS = ('0000:4e:00.4', '0000:4e:00.5', '0000:4e:00.6')
T1308 = objects.TypeId.parse('nvidia-1308')        # H100-1-10C: 1g.10gb
T1310 = objects.TypeId.parse('nvidia-1310')        # H100-1-20C: 1g.20gb
GI_1G_10GB, GI_3G_40GB = 19, 9


@pytest.fixture
def mig(top):
    """A small H100 in MIG mode with three VFs and the GPU instances
    3g.40gb (id 2), 1g.10gb (7), 1g.10gb (8), and its vendor kind."""
    root = os.path.join(top, 'sys')
    profile = small('h100-80gb', H100_VFS, os.path.join(top, 'h100.json'))
    simulator.write_sysfs(profile, root)
    mini = kernel_sysfs.KernelSysfs(root, profile)
    made = nvidia_vgpu.NvidiaVgpuBackend(
        mini, os.path.join(top, 'state'),
        nvml=nvml.Nvml(sim_nvml.module(sysfs_root=root)))
    numvfs = os.path.join(mini.pci_dir(H100), 'sriov_numvfs')
    mini.write(numvfs, '0')
    with made.nvml.session() as session:
        session.set_mig_mode(H100, True)
    mini.write(numvfs, '3')
    with made.nvml.session() as session:
        profiles = {p.id: p for p in session.gi_profiles(H100)}
        for profile_id in (GI_1G_10GB, GI_1G_10GB, GI_3G_40GB):
            session.create_gpu_instance(H100, profiles[profile_id])
    with mini.kernel._write(str(H100)):     # the VFs' lists, rewritten
        pass
    return made


def gi_rooms(room):
    return [(g.id, g.profile_id, g.profile, g.used, g.capacity)
            for g in room.gis]


def test_a_mig_room_is_its_gpu_instances(mig):
    room = mig.room(H100, T1308)
    assert (room.mode, room.type_id, room.used) == (
        capacity.MODE_MIG, T1308, 0)
    assert gi_rooms(room) == [(2, 9, '3g.40gb', 0, 0),
                              (7, 19, '1g.10gb', 0, 1),
                              (8, 19, '1g.10gb', 0, 1)]
    vf = mig.choose_vf(H100, T1308)
    mig.prepare(vgpu_m(parent=vf, type_id=T1308))
    room = mig.room(H100, T1308)
    assert room.used == 1
    assert gi_rooms(room) == [(2, 9, '3g.40gb', 0, 0),
                              (7, 19, '1g.10gb', 1, 1),
                              (8, 19, '1g.10gb', 0, 1)]
    # a type of no GPU instance here: no room, the held vGPU still seen
    room = mig.room(H100, T1310)
    assert room.used == 0
    assert gi_rooms(room) == [(2, 9, '3g.40gb', 0, 0),
                              (7, 19, '1g.10gb', 1, 0),
                              (8, 19, '1g.10gb', 0, 0)]
    unknown = objects.TypeId.parse('nvidia-99999')
    assert gi_rooms(mig.room(H100, unknown)) == gi_rooms(room)


def test_a_held_type_nvml_does_not_know_takes_no_size(mig, monkeypatch):
    before = gi_rooms(mig.room(H100, T1308))
    # a VF holding a type NVML does not list for the GPU (someone else's,
    # of a driver the catalogue predates): counted as held, of no size
    held = objects.PciAddress.parse(H100_VFS[2])
    read = mig.files.current_type
    monkeypatch.setattr(mig.files, 'current_type',
                        lambda vf: 99999 if vf == held else read(vf))
    room = mig.room(H100, T1308)
    assert (room.used, gi_rooms(room)) == (0, before)
