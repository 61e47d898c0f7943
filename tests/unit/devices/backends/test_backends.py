"""backends.mdev and backends.pci against a simulated T4 host whose kernel
answers come from the simulator's kernel (tests/doubles/kernel_sysfs.py)."""

import errno
import json
import os

import pytest

from libvirt_gpu.devices.backends import base
from libvirt_gpu.devices.backends import mdev
from libvirt_gpu.devices.backends import pci
from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.devices import sysfs as sysfs_mod
from tests.doubles import kernel_sysfs
from tests.doubles import mdev_host

T_NVIDIA_222 = objects.TypeId.parse('nvidia-222')
T_NVIDIA_223 = objects.TypeId.parse('nvidia-223')
T_NVIDIA_999 = objects.TypeId.parse('nvidia-999')

GPU_A = '0000:3b:00.0'     # empty
GPU_B = '0000:af:00.0'     # holds two nvidia-223
EXISTING = objects.Uuid.parse('4b20d080-1b54-4048-85b3-a6a62d165c01')


tree = mdev_host.tree
sysfs = mdev_host.sysfs
backend = mdev_host.backend


def new_uuid():
    return objects.Uuid.new()


def vgpu(parent=GPU_A, type_id=objects.TypeId.parse('nvidia-223'), uuid=None):
    return base.VgpuDevice(uuid=objects.Uuid.parse(uuid or new_uuid()),
                           parent=objects.PciAddress.parse(parent),
                           type_id=objects.TypeId.parse(type_id))


def pgpu(address):
    return base.PgpuDevice(objects.PciAddress.parse(address))


# --- create ------------------------------------------------------------------

def test_create_makes_the_device_and_takes_capacity(backend, sysfs):
    dev = vgpu()
    assert backend.available(GPU_A, 'nvidia-223') == 8
    assert backend.prepare(dev) is True
    assert backend.lookup(dev.uuid) == dev
    assert backend.exists(dev)
    assert backend.available(GPU_A, 'nvidia-223') == 7
    # NVIDIA: one type per GPU, every other type has no room now
    assert backend.available(GPU_A, 'nvidia-222') == 0
    assert sysfs.writes == [('create', (GPU_A, 'nvidia-223'), 0)]


def test_create_is_idempotent_for_same_type_and_parent(backend, sysfs):
    dev = vgpu()
    assert backend.prepare(dev) is True
    assert backend.prepare(dev) is False
    assert len(sysfs.writes) == 1          # no second write reached the kernel


def test_create_existing_uuid_with_other_type_is_conflict(backend):
    with pytest.raises(exception.MdevConflict, match='nvidia-223') as e:
        backend.prepare(vgpu(parent=GPU_B, type_id=T_NVIDIA_222,
                             uuid=EXISTING))
    assert 'nvidia-222' in str(e.value)


def test_create_existing_uuid_on_other_parent_is_conflict(backend):
    with pytest.raises(exception.MdevConflict, match=GPU_B):
        backend.prepare(vgpu(parent=GPU_A, uuid=EXISTING))


def test_unknown_type_checked_after_parent(backend, sysfs):
    with pytest.raises(exception.UnknownType, match='nvidia-999'):
        backend.prepare(vgpu(type_id=objects.TypeId.parse('nvidia-999')))
    with pytest.raises(exception.ParentGone, match='0000:5e:00.0'):
        backend.prepare(vgpu(parent='0000:5e:00.0', type_id=T_NVIDIA_999))
    assert sysfs.writes == []


def test_no_capacity_before_the_write(backend, sysfs):
    # GPU_B holds nvidia-223 vGPUs: NVIDIA offers no other type on it
    with pytest.raises(exception.NoCapacity, match='available_instances'):
        backend.prepare(vgpu(parent=GPU_B, type_id=T_NVIDIA_222))
    assert sysfs.writes == []


def test_kernel_answer_is_the_truth(backend, sysfs, tree):
    # A stale available_instances says 1; the kernel (EINVAL, NVIDIA's
    # answer) knows better.
    for _ in range(6):
        backend.prepare(vgpu(parent=GPU_B))
    path = os.path.join(sysfs.types_dir(GPU_B), 'nvidia-223',
                        'available_instances')
    with open(path, 'w') as f:
        f.write('1\n')
    with pytest.raises(exception.NoCapacity, match='EINVAL'):
        backend.prepare(vgpu(parent=GPU_B))
    assert sysfs.writes[-1] == ('create', (GPU_B, 'nvidia-223'),
                                errno.EINVAL)


def test_parent_gone_between_check_and_write(backend, sysfs):
    class Vanishing(kernel_sysfs.KernelSysfs):
        def write(self, path, data):
            if path.endswith('/create'):
                os.unlink(self.path('class', 'mdev_bus', GPU_A))
                raise exception.SysfsWriteError(path=path, reason='gone',
                                                errno=errno.ENODEV)
            return super().write(path, data)
    b = mdev.MdevBackend(Vanishing(sysfs.root, sysfs.profile))
    with pytest.raises(exception.ParentGone, match='ENODEV'):
        b.prepare(vgpu())


def test_eexist_race_with_same_device_is_success(backend, sysfs):
    dev = vgpu()

    class Racer(kernel_sysfs.KernelSysfs):
        def write(self, path, data):
            if path.endswith('/create'):
                super().write(path, data)         # someone else was faster
                raise exception.SysfsWriteError(path=path, reason='exists',
                                                errno=errno.EEXIST)
            return super().write(path, data)
    b = mdev.MdevBackend(Racer(sysfs.root, sysfs.profile))
    assert b.prepare(dev) is False
    assert b.lookup(dev.uuid) == dev


def test_transient_errors_are_retried_then_succeed(sysfs):
    answers = [errno.EBUSY, errno.EAGAIN]

    class Busy(kernel_sysfs.KernelSysfs):
        def write(self, path, data):
            if path.endswith('/create') and answers:
                raise exception.SysfsWriteError(path=path, reason='busy',
                                                errno=answers.pop(0))
            return super().write(path, data)
    b = mdev.MdevBackend(Busy(sysfs.root, sysfs.profile),
                         retry_stop=2)
    dev = vgpu()
    assert b.prepare(dev) is True
    assert answers == []


def test_transient_retry_stops(sysfs):
    calls = []

    class AlwaysBusy(kernel_sysfs.KernelSysfs):
        def write(self, path, data):
            calls.append(path)
            raise exception.SysfsWriteError(path=path, reason='busy',
                                            errno=errno.EBUSY)
    b = mdev.MdevBackend(AlwaysBusy(sysfs.root, sysfs.profile),
                         retry_stop=0.3)
    with pytest.raises(exception.MdevCreateFailed, match='EBUSY'):
        b.prepare(vgpu())
    assert 2 <= len(calls) < 50


def test_other_errors_are_not_retried(sysfs):
    calls = []

    class Denied(kernel_sysfs.KernelSysfs):
        def write(self, path, data):
            calls.append(path)
            raise exception.SysfsWriteError(path=path, reason='denied',
                                            errno=errno.EACCES)
    b = mdev.MdevBackend(Denied(sysfs.root, sysfs.profile))
    with pytest.raises(exception.MdevCreateFailed, match='EACCES'):
        b.prepare(vgpu())
    assert len(calls) == 1


def test_plain_tree_without_kernel_times_out_clearly(tree):
    # A write the kernel never answers: the device never appears.
    b = mdev.MdevBackend(sysfs_mod.Sysfs(tree[0]), appear_timeout=0.05)
    with pytest.raises(exception.MdevCreateFailed, match='did not appear'):
        b.prepare(vgpu())


# Bad UUIDs and type ids are refused where they enter the program (the
# API, the hook's input, state files: tests/unit/project/test_edge.py);
# the device
# records only refuse a value of the wrong type.  A device that holds one
# anyway never gets it into a sysfs path.

BAD_UUIDS = ['../../../etc/passwd', 'x' * 36, EXISTING + '\n',
             EXISTING[:-1] + '/']
BAD_TYPES = ['../nvidia-223', 'nvidia-223\n', '', 'a/b']


@pytest.mark.parametrize('bad', BAD_UUIDS)
def test_bad_uuid_refused_before_any_path(backend, sysfs, bad):
    with pytest.raises(exception.InvalidInput):
        backend.prepare(vgpu(uuid=bad))
    assert sysfs.writes == []


@pytest.mark.parametrize('bad', BAD_TYPES)
def test_bad_type_refused(backend, sysfs, bad):
    with pytest.raises(exception.InvalidTypeId):
        backend.prepare(vgpu(type_id=bad))
    with pytest.raises(exception.InvalidTypeId):
        backend.define(vgpu(type_id=bad))
    assert sysfs.writes == []
    assert not os.path.exists(backend.mdevctl_dir)


def test_device_records_refuse_untyped_values():
    address = objects.PciAddress.parse(GPU_A)
    with pytest.raises(TypeError, match=r'^VgpuDevice\.parent must be an '
                       r'objects\.PciAddress, not str .*'
                       r'objects\.PciAddress\.parse'):
        base.VgpuDevice(uuid=new_uuid(), parent=GPU_A,
                        type_id=objects.TypeId.parse('nvidia-223'))
    with pytest.raises(TypeError, match=r'^VgpuDevice\.uuid .*'
                                        r'objects\.Uuid\.parse'):
        base.VgpuDevice(uuid=None, parent=address, type_id=T_NVIDIA_223)
    with pytest.raises(TypeError, match=r'^VgpuDevice\.type_id .*'
                                        r'objects\.TypeId\.parse'):
        base.VgpuDevice(uuid=new_uuid(), parent=address, type_id=223)
    with pytest.raises(TypeError, match=r'^PgpuDevice\.address must be an '
                       r'objects\.PciAddress, not str .*'
                       r'objects\.PciAddress\.parse'):
        base.PgpuDevice(GPU_A)
    with pytest.raises(TypeError, match=r'PgpuDevice\.address'):
        base.PgpuDevice(None)
    # Typed values are kept as given: nothing is parsed again.
    dev = base.VgpuDevice(uuid=EXISTING, parent=address,
                          type_id=objects.TypeId.parse('nvidia-223'))
    assert dev.parent is address
    assert base.PgpuDevice(address).address is address


def test_lookup_refuses_an_mdev_type_link_that_is_no_type_id(tree, backend):
    # sysfs is where an existing mdev's type enters the program: its
    # mdev_type link's name is parsed there, as a type id given to the API
    # would be.
    link = os.path.join(tree[0], 'bus', 'mdev', 'devices', EXISTING,
                        'mdev_type')
    os.unlink(link)
    os.symlink('../mdev_supported_types/nvidia+223', link)
    with pytest.raises(exception.InvalidTypeId) as e:
        backend.lookup(EXISTING)
    assert str(e.value) == str(exception.InvalidTypeId(value='nvidia+223'))


def test_kernel_emulation_refuses_bad_uuid(sysfs):
    path = os.path.join(sysfs.types_dir(GPU_A), 'nvidia-223', 'create')
    with pytest.raises(exception.SysfsWriteError) as e:
        sysfs.write(path, 'not-a-uuid-at-all-but-36-characters')
    assert e.value.kwargs['errno'] == errno.EINVAL


# --- remove ------------------------------------------------------------------

def test_remove(backend):
    dev = vgpu()
    backend.prepare(dev)
    assert backend.release(dev) is True
    assert backend.lookup(dev.uuid) is None
    assert backend.release(dev) is False
    assert backend.available(GPU_A, 'nvidia-222') == 16


def test_remove_while_vendor_driver_removes_it(sysfs):
    class VendorCleanup(kernel_sysfs.KernelSysfs):
        def write(self, path, data):
            if path.endswith('/remove'):
                super().write(path, data)      # the driver's own cleanup
                raise exception.SysfsWriteError(path=path, reason='gone',
                                                errno=errno.ENODEV)
            return super().write(path, data)
    b = mdev.MdevBackend(VendorCleanup(sysfs.root, sysfs.profile))
    assert b.remove(EXISTING) is True
    assert b.lookup(EXISTING) is None


def test_remove_that_never_happens_fails(tree):
    b = mdev.MdevBackend(sysfs_mod.Sysfs(tree[0]), remove_timeout=0.05)
    with pytest.raises(exception.MdevRemoveFailed, match='still present'):
        b.remove(EXISTING)


def test_lookup_refuses_link_leaving_the_root(tree, sysfs):
    evil = '11111111-2222-3333-4444-555555555555'
    os.symlink('/etc', os.path.join(tree[0], 'bus', 'mdev', 'devices', evil))
    with pytest.raises(exception.UnsafePath):
        mdev.MdevBackend(sysfs).lookup(evil)


# --- libvirt path ------------------------------------------------------------

class FakeHost(object):
    """host.Host's node-device calls, recording the XML."""

    def __init__(self, sysfs, answer=None):
        self.sysfs = sysfs
        self.answer = answer
        self.created = []
        self.destroyed = []

    def create_mdev(self, xml):
        self.created.append(xml)
        if self.answer is not None:
            raise self.answer
        # libvirt (via mdevctl) writes the same create attribute
        from lxml import etree
        root = etree.fromstring(xml)
        parent = objects.PciAddress.from_libvirt_name(root.findtext('parent'))
        self.sysfs.kernel.create(parent, root.find('capability/type').get(
            'id'), root.findtext('capability/uuid'))
        return 'mdev_x'

    def destroy_mdev(self, uuid):
        self.destroyed.append(uuid)
        if self.answer is not None:
            raise self.answer
        self.sysfs.kernel.remove(uuid)
        return True


def test_libvirt_create_and_destroy(sysfs):
    host = FakeHost(sysfs)
    b = mdev.MdevBackend(sysfs, host=host)
    dev = vgpu()
    assert b.prepare(dev) is True
    assert "<uuid>%s</uuid>" % dev.uuid in host.created[0]
    assert '<parent>pci_0000_3b_00_0</parent>' in host.created[0]
    assert sysfs.writes == []              # libvirt did it, not us
    assert b.remove(dev.uuid) is True
    assert host.destroyed == [dev.uuid]


def test_libvirt_without_mdev_support_falls_back_to_sysfs(sysfs):
    host = FakeHost(sysfs, answer=exception.NotSupported(what='x',
                                                         reason='y'))
    b = mdev.MdevBackend(sysfs, host=host)
    dev = vgpu()
    assert b.prepare(dev) is True
    assert sysfs.writes == [('create', (GPU_A, 'nvidia-223'), 0)]
    assert b.remove(dev.uuid) is True
    assert sysfs.writes[-1][0] == 'remove'


def test_libvirt_failure_falls_back_to_the_kernel(sysfs):
    # e.g. "invalid parent device 'pci_0000_3b_00_0'": libvirt has not seen
    # the GPU; the kernel's answer is the one that counts
    host = FakeHost(sysfs, answer=exception.LibvirtError(
        reason="unsupported configuration: invalid parent device"))
    b = mdev.MdevBackend(sysfs, host=host)
    dev = vgpu()
    assert b.prepare(dev) is True
    assert len(host.created) == 1
    assert sysfs.writes == [('create', (GPU_A, 'nvidia-223'), 0)]
    # and the kernel's refusal is the typed error
    with pytest.raises(exception.NoCapacity):
        b.prepare(vgpu(parent=GPU_B, type_id=T_NVIDIA_222))


def test_libvirt_timeout_is_retried(sysfs):
    host = FakeHost(sysfs)
    timeouts = [exception.LibvirtTimeout(reason='timed out')]
    create = host.create_mdev

    def flaky(xml):
        if timeouts:
            raise timeouts.pop()
        return create(xml)
    host.create_mdev = flaky
    b = mdev.MdevBackend(sysfs, host=host, retry_stop=2)
    assert b.prepare(vgpu()) is True
    assert timeouts == []


# --- persistent definitions (mdevctl files) ----------------------------------

def test_define_writes_mdevctl_json_and_undefine_removes(backend, tmp_path):
    dev = vgpu()
    backend.define(dev, start='auto')
    path = tmp_path / 'mdevctl.d' / GPU_A / dev.uuid
    assert json.loads(path.read_text()) == {
        'mdev_type': 'nvidia-223', 'start': 'auto', 'attrs': []}
    assert oct(path.stat().st_mode & 0o777) == '0o644'
    found = backend.definition(dev.uuid)
    assert found == mdev.MdevDefinition(uuid=dev.uuid,
                                        parent=objects.PciAddress.parse(
                                            GPU_A),
                                        type_id=T_NVIDIA_223, start='auto',
                                        source='mdevctl (%s)'
                                        % backend.mdevctl_dir)
    with pytest.raises(exception.MdevConflict):
        backend.define(vgpu(uuid=dev.uuid, type_id=T_NVIDIA_222))
    assert backend.undefine(dev.uuid) is True
    assert not path.exists()
    assert backend.undefine(dev.uuid) is False


def test_define_checks_the_type(backend):
    with pytest.raises(exception.UnknownType):
        backend.define(vgpu(type_id=objects.TypeId.parse('nvidia-999')))


@pytest.mark.parametrize('content,match', [
    ('{"mdev_type": "../x", "start": "auto"}', 'not a valid vGPU type'),
    ('{"mdev_type": "nvidia-223", "start": "sometimes"}', 'auto or manual'),
    ('not json', 'not JSON'),
    ('[1]', 'not a JSON object'),
])
def test_bad_mdevctl_definitions_are_refused(backend, tmp_path, content,
                                             match):
    dev = vgpu()
    d = tmp_path / 'mdevctl.d' / GPU_A
    d.mkdir(parents=True)
    (d / dev.uuid).write_text(content)
    with pytest.raises(exception.ConfigError, match=match):
        backend.definition(dev.uuid)


def test_definitions_under_non_pci_parents_are_skipped(backend, tmp_path):
    dev = vgpu()
    d = tmp_path / 'mdevctl.d' / '0.0.0033'      # a ccw parent
    d.mkdir(parents=True)
    (d / dev.uuid).write_text('{"mdev_type": "vfio_ccw-io"}')
    assert backend.definition(dev.uuid) is None


# --- whole GPUs --------------------------------------------------------------

def test_pci_backend_checks_the_gpu(sysfs):
    b = pci.PciBackend(sysfs)
    assert b.prepare(pgpu(GPU_A)) is False
    assert b.exists(pgpu(GPU_A))
    with pytest.raises(exception.GpuInUse, match='holds 2 vGPU'):
        b.prepare(pgpu(GPU_B))
    with pytest.raises(exception.DeviceNotFound):
        b.prepare(pgpu('0000:ae:00.0'))    # a bridge
    with pytest.raises(exception.DeviceNotFound):
        b.prepare(pgpu('0000:99:00.0'))    # nothing there
    assert "managed='yes'" in b.hostdev_xml(pgpu(GPU_A))
    assert b.release(pgpu(GPU_A)) is False
