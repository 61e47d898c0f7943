"""What backends.mdev, backends.registry and backends.base promise, on the
simulated T4 host of test_backends (tests/doubles/mdev_host.py: 0000:3b:00.0
empty, eight nvidia-223 free; 0000:af:00.0 holding two nvidia-223): each
test here fails on a change ``make mutation`` made that the rest stayed
green on (docs/dev/mutation.md): the kernel's answers to a create turned
into their typed errors, word for word; mdevctl's definitions read and
written; the registry handing each call to the right kind."""

import errno
import json
import os

import pytest

from libvirt_gpu.devices.backends import base
from libvirt_gpu.devices import capabilities
from libvirt_gpu.devices.backends import mdev
from libvirt_gpu.devices.backends import nvidia_vgpu
from libvirt_gpu.devices.backends import registry
from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.devices import sysfs as sysfs_mod
from tests.doubles import kernel_sysfs
from tests.doubles import mdev_host

tree = mdev_host.tree
sysfs = mdev_host.sysfs
backend = mdev_host.backend

GPU_A = objects.PciAddress.parse('0000:3b:00.0')     # empty
GPU_B = objects.PciAddress.parse('0000:af:00.0')     # two nvidia-223
GONE = objects.PciAddress.parse('0000:5e:00.0')      # no such parent
GPU_D8 = objects.PciAddress.parse('0000:d8:00.0')    # neither
T_223 = objects.TypeId.parse('nvidia-223')
T_222 = objects.TypeId.parse('nvidia-222')
T_999 = objects.TypeId.parse('nvidia-999')
EXISTING = objects.Uuid.parse('4b20d080-1b54-4048-85b3-a6a62d165c01')
U1 = objects.Uuid.parse('11111111-1111-4111-8111-111111111111')
U2 = objects.Uuid.parse('22222222-2222-4222-8222-222222222222')
U3 = objects.Uuid.parse('33333333-3333-4333-8333-333333333333')
U4 = objects.Uuid.parse('44444444-4444-4444-8444-444444444444')
U5 = objects.Uuid.parse('55555555-5555-4555-8555-555555555555')


def vgpu(uuid=U1, parent=GPU_A, type_id=T_223):
    return base.VgpuDevice(uuid=uuid, parent=parent, type_id=type_id)


def refused(error, call, *args, **kwargs):
    """The error ``call`` raises, of exactly the class ``error``."""
    with pytest.raises(error) as e:
        call(*args, **kwargs)
    assert type(e.value) is error
    return e.value


def same(err, cls, **kwargs):
    """``err`` is ``cls(**kwargs)``: the same class, the same values (an
    API answer carries them), the same message."""
    assert type(err) is cls
    assert err.kwargs == kwargs
    assert str(err) == str(cls(**kwargs))


def answering(sysfs, answer, reason='refused', then=None):
    """``sysfs`` whose kernel answers ``answer`` (an errno, or None: no
    errno at all) to every create; ``then(sysfs)`` runs first (what
    changed on the host meanwhile)."""
    class Refusing(kernel_sysfs.KernelSysfs):
        def write(self, path, data):
            if path.endswith('/create'):
                if then is not None:
                    then(self)
                extra = {} if answer is None else {'errno': answer}
                raise exception.SysfsWriteError(path=path, reason=reason,
                                                **extra)
            return super().write(path, data)
    return Refusing(sysfs.root, sysfs.profile)


def set_available(sysfs, parent, type_id, count):
    with open(os.path.join(sysfs.types_dir(parent), type_id,
                           'available_instances'), 'w') as f:
        f.write('%d\n' % count)


def made(sysfs, **kwargs):
    kwargs.setdefault('appear_timeout', 0.5)
    kwargs.setdefault('remove_timeout', 0.5)
    kwargs.setdefault('retry_stop', 0.5)
    return mdev.MdevBackend(sysfs, **kwargs)


# --- the kernel's answer to a create (_create_refused) -----------------------

def test_eexist_for_a_uuid_no_mdev_holds_is_a_create_failure(sysfs):
    err = refused(exception.MdevCreateFailed,
                  made(answering(sysfs, errno.EEXIST)).prepare, vgpu())
    same(err, exception.MdevCreateFailed, uuid=U1, type_id=T_223,
         parent=GPU_A, reason='the kernel answered EEXIST: the UUID is in '
                              'use by a device that is not a PCI mdev')


def test_eexist_for_a_uuid_of_another_type_is_a_conflict(sysfs):
    def racer(s):       # someone made U1 as nvidia-222 first
        s.kernel.create(GPU_A, 'nvidia-222', U1)
    err = refused(exception.MdevConflict,
                  made(answering(sysfs, errno.EEXIST, then=racer)).prepare,
                  vgpu())
    same(err, exception.MdevConflict, uuid=U1, existing_type=T_222,
         existing_parent=GPU_A, type_id=T_223, parent=GPU_A)


def test_enodev_is_the_parent_going_away(sysfs):
    err = refused(exception.ParentGone,
                  made(answering(sysfs, errno.ENODEV)).prepare, vgpu())
    same(err, exception.ParentGone, address=GPU_A, uuid=U1,
         reason='the kernel answered ENODEV to the create')


def test_any_answer_from_a_parent_that_left_is_the_parent_going_away(sysfs):
    def leave(s):
        os.unlink(s.path('class', 'mdev_bus', str(GPU_A)))
    err = refused(exception.ParentGone,
                  made(answering(sysfs, errno.EIO, then=leave)).prepare,
                  vgpu())
    same(err, exception.ParentGone, address=GPU_A, uuid=U1,
         reason='the kernel answered EIO to the create')


def test_enoent_is_a_type_the_parent_does_not_offer(sysfs):
    err = refused(exception.UnknownType,
                  made(answering(sysfs, errno.ENOENT)).prepare, vgpu())
    same(err, exception.UnknownType, type_id=T_223, address=GPU_A)


@pytest.mark.parametrize('code', [errno.EUSERS, errno.ENOSPC, errno.EDQUOT])
def test_the_mdev_cores_full_answers_are_no_capacity(sysfs, code):
    err = refused(exception.NoCapacity,
                  made(answering(sysfs, code)).prepare, vgpu())
    same(err, exception.NoCapacity, uuid=U1, type_id=T_223,
         where='the GPU 0000:3b:00.0',
         reason='the kernel answered %s' % errno.errorcode[code])


def test_einval_with_no_room_left_is_no_capacity(sysfs):
    def fill(s):
        set_available(s, GPU_A, 'nvidia-223', 0)
    err = refused(exception.NoCapacity,
                  made(answering(sysfs, errno.EINVAL, then=fill)).prepare,
                  vgpu())
    same(err, exception.NoCapacity, uuid=U1, type_id=T_223,
         where='the GPU 0000:3b:00.0',
         reason='the kernel answered EINVAL and available_instances is now '
                '0 (NVIDIA answers EINVAL when the GPU is full or holds '
                'vGPUs of another type)')


def test_einval_with_exactly_one_left_is_a_create_failure(sysfs):
    set_available(sysfs, GPU_A, 'nvidia-223', 1)
    err = refused(exception.MdevCreateFailed,
                  made(answering(sysfs, errno.EINVAL, 'bad')).prepare,
                  vgpu())
    same(err, exception.MdevCreateFailed, uuid=U1, type_id=T_223,
         parent=GPU_A, reason='the kernel answered EINVAL (bad)')


def test_another_answer_with_no_room_left_is_still_that_answer(sysfs):
    def fill(s):
        set_available(s, GPU_A, 'nvidia-223', 0)
    err = refused(exception.MdevCreateFailed,
                  made(answering(sysfs, errno.EACCES, 'denied',
                                 then=fill)).prepare, vgpu())
    same(err, exception.MdevCreateFailed, uuid=U1, type_id=T_223,
         parent=GPU_A, reason='the kernel answered EACCES (denied)')


def test_an_answer_without_reason_is_explained_by_its_errno(sysfs):
    err = refused(exception.MdevCreateFailed,
                  made(answering(sysfs, errno.EIO, '')).prepare, vgpu())
    assert err.kwargs['reason'] == ('the kernel answered EIO (%s)'
                                    % os.strerror(errno.EIO))


def test_an_errno_python_has_no_name_for_is_given_by_number(sysfs):
    err = refused(exception.MdevCreateFailed,
                  made(answering(sysfs, 9999, '')).prepare, vgpu())
    assert err.kwargs['reason'] == ('the kernel answered 9999 (%s)'
                                    % os.strerror(9999))


def test_a_write_error_without_errno_says_none(sysfs):
    err = refused(exception.MdevCreateFailed,
                  made(answering(sysfs, None, '')).prepare, vgpu())
    assert err.kwargs['reason'] == 'the kernel answered None (%s)' % (
        os.strerror(0))


# --- prepare ----------------------------------------------------------------

def test_exactly_one_available_is_room_for_one(backend, sysfs):
    set_available(sysfs, GPU_A, 'nvidia-223', 1)
    assert backend.prepare(vgpu()) is True
    set_available(sysfs, GPU_A, 'nvidia-223', 0)
    err = refused(exception.NoCapacity, backend.prepare, vgpu(uuid=U2))
    same(err, exception.NoCapacity, uuid=U2, type_id=T_223,
         where='the GPU 0000:3b:00.0', reason='available_instances is 0')
    assert [w[0] for w in sysfs.writes] == ['create']


def test_a_uuid_held_elsewhere_is_a_conflict_before_any_check(backend):
    err = refused(exception.MdevConflict, backend.prepare,
                  vgpu(uuid=EXISTING, parent=GONE, type_id=T_999))
    same(err, exception.MdevConflict, uuid=EXISTING, existing_type=T_223,
         existing_parent=GPU_B, type_id=T_999, parent=GONE)
    assert backend.prepare(vgpu(uuid=EXISTING, parent=GPU_B)) is False


# --- create through sysfs (_create_sysfs) -----------------------------------

def test_a_create_file_linked_to_another_gpus_is_not_written(sysfs):
    create = os.path.join(sysfs.types_dir(GPU_A), 'nvidia-223', 'create')
    os.unlink(create)
    os.symlink(os.path.join(sysfs.types_dir(GPU_B), 'nvidia-223', 'create'),
               create)
    b = made(sysfs)
    err = refused(exception.MdevCreateFailed, b.prepare, vgpu())
    expected = refused(exception.SysfsError, sysfs.own_file,
                       sysfs.pci_dir(GPU_A), sysfs_mod.TYPES_DIR, T_223,
                       'create')
    same(err, exception.MdevCreateFailed, uuid=U1, type_id=T_223,
         parent=GPU_A, reason='%s: %s' % (expected.kwargs['path'],
                                          expected.kwargs['reason']))
    assert sysfs.writes == []
    assert b.lookup(U1) is None


def test_a_create_the_kernel_never_makes_names_the_missing_path(tree):
    b = mdev.MdevBackend(sysfs_mod.Sysfs(tree[0]), appear_timeout=0.01)
    err = refused(exception.MdevCreateFailed, b.prepare, vgpu())
    same(err, exception.MdevCreateFailed, uuid=U1, type_id=T_223,
         parent=GPU_A, reason='the kernel accepted the UUID but %s did not '
         'appear within 0 s' % b.sysfs.mdev_dir(U1))


def test_a_busy_kernel_is_asked_again_until_retry_stop(sysfs):
    busy = [errno.EBUSY]

    class Busy(kernel_sysfs.KernelSysfs):
        def write(self, path, data):
            if busy:
                raise exception.SysfsWriteError(path=path, reason='busy',
                                                errno=busy.pop())
            return super().write(path, data)
    b = made(Busy(sysfs.root, sysfs.profile), retry_stop=5)
    assert b.prepare(vgpu()) is True
    assert b.lookup(U1) == vgpu()


class Slow(kernel_sysfs.KernelSysfs):
    """A kernel that accepts a create or a remove at once and does it a
    few looks later (``bus/mdev/devices/<uuid>`` read three more times)."""

    pending = None
    looks = 0

    def write(self, path, data):
        if path.endswith('/create'):
            self.pending = lambda: self.kernel.create(GPU_A, 'nvidia-223',
                                                      data)
        elif path.endswith('/remove'):
            uuid = os.path.basename(os.path.dirname(path))
            self.pending = lambda: self.kernel.remove(uuid)
        else:
            return super().write(path, data)
        self.looks = 0

    def mdev_dir(self, uuid):
        if self.pending is not None:
            self.looks += 1
            if self.looks > 3:
                self.pending, done = None, self.pending
                done()
        return super().mdev_dir(uuid)


def test_a_vgpu_that_comes_and_goes_a_moment_later_is_waited_for(sysfs):
    b = made(Slow(sysfs.root, sysfs.profile), appear_timeout=30,
             remove_timeout=30)
    assert b.prepare(vgpu()) is True
    assert b.lookup(U1) == vgpu()
    assert b.remove(U1) is True
    assert b.lookup(U1) is None


def test_the_defaults_of_an_mdev_kind(sysfs):
    b = mdev.MdevBackend(sysfs)
    assert (b.host, b.mdevctl_dir, b.appear_timeout, b.remove_timeout,
            b.retry_stop) == (None, '/etc/mdevctl.d', 5.0, 10.0, 5.0)
    assert mdev.MdevBackend.places == (base.Place('mdevctl_dir',
                                                  '/etc/mdevctl.d'),)


# --- check_type, is_parent, available, vgpu_type, max_instance --------------

def test_check_type_names_a_parent_that_is_not_one(backend):
    err = refused(exception.ParentGone, backend.check_type, GONE, T_223)
    same(err, exception.ParentGone, address=GONE, uuid=None,
         reason='no 0000:5e:00.0 in the sysfs class mdev_bus (is the GPU '
                'bound to its vGPU driver?)')


def test_check_type_names_a_type_the_parent_does_not_offer(backend):
    err = refused(exception.UnknownType, backend.check_type, GPU_A, T_999)
    same(err, exception.UnknownType, type_id=T_999, address=GPU_A)
    assert backend.check_type(GPU_A, T_223) is None


def test_check_type_and_is_parent_take_parsed_values_only(backend):
    with pytest.raises(TypeError, match=r'^type_id must be an '
                                        r'objects\.TypeId'):
        backend.check_type(GPU_A, 'nvidia-223')
    with pytest.raises(TypeError, match=r'^address must be an '
                                        r'objects\.PciAddress'):
        backend.is_parent('0000:3b:00.0')
    assert backend.is_parent(GPU_A) and not backend.is_parent(GONE)


def test_type_figures_as_the_parent_lists_them(backend):
    assert backend.available(GPU_A, T_223) == 8
    assert backend.max_instance(GPU_A, T_223) == 8
    assert backend.max_instance(GPU_A, T_222) == 16
    assert backend.max_instance(GPU_A, T_999) is None
    assert backend.vgpu_type(GPU_A, T_222) == objects.VgpuType(
        id=T_222, name=None, description=None, device_api='',
        available_instances=16)
    assert backend.vgpu_type(GPU_A, T_999) is None


def test_exists_needs_the_same_parent_and_type(backend):
    held = vgpu(uuid=EXISTING, parent=GPU_B)
    assert backend.exists(held)
    assert not backend.exists(vgpu(uuid=EXISTING, parent=GPU_A))
    assert not backend.exists(vgpu(uuid=EXISTING, parent=GPU_B,
                                   type_id=T_222))
    assert not backend.exists(vgpu())
    assert backend.owns(EXISTING) and not backend.owns(U1)


def test_existing_mdevs_and_their_hostdev(backend, sysfs):
    from libvirt_gpu.virt import config_xml
    found = backend.existing()
    assert found[EXISTING] == (GPU_B, T_223) and len(found) == 2
    assert backend.existing({GPU_A: []}) == {}
    assert backend.hostdev_xml(vgpu()) == config_xml.mdev_hostdev(U1)


# --- lookup ------------------------------------------------------------------

def test_an_mdev_without_type_link_is_a_read_error(tree, backend):
    path = os.path.join(tree[0], 'bus', 'mdev', 'devices', EXISTING)
    os.unlink(os.path.join(path, 'mdev_type'))
    err = refused(exception.SysfsReadError, backend.lookup, EXISTING)
    same(err, exception.SysfsReadError,
         path=os.path.join(path, 'mdev_type'),
         reason='mdev without a type link')


def test_an_mdev_whose_parent_is_no_pci_device_is_a_read_error(tree,
                                                               backend):
    root = tree[0]
    home = os.path.join(root, 'devices', 'platform', 'vfio', U1)
    os.makedirs(home)
    os.symlink(os.path.join(sysfs_mod.Sysfs(root).types_dir(GPU_A),
                            'nvidia-223'), os.path.join(home, 'mdev_type'))
    link = os.path.join(root, 'bus', 'mdev', 'devices', U1)
    os.symlink(home, link)
    err = refused(exception.SysfsReadError, backend.lookup, U1)
    same(err, exception.SysfsReadError, path=link,
         reason='the parent of this mdev is not a PCI device')


def test_an_mdev_that_goes_while_its_type_is_read_is_none(sysfs):
    class Racing(kernel_sysfs.KernelSysfs):
        def link_name(self, path):
            if path.endswith('/mdev_type'):
                self.kernel.remove(EXISTING)
            return super().link_name(path)
    assert made(Racing(sysfs.root, sysfs.profile)).lookup(EXISTING) is None


# --- remove ------------------------------------------------------------------

def test_remove_takes_a_parsed_uuid_and_is_false_for_none(backend, sysfs):
    with pytest.raises(TypeError, match=r'^uuid must be an objects\.Uuid'):
        backend.remove(str(EXISTING))
    assert backend.remove(U1) is False
    assert sysfs.writes == []


def test_a_remove_that_never_happens_says_how_long_it_waited(tree):
    b = mdev.MdevBackend(sysfs_mod.Sysfs(tree[0]), remove_timeout=0.01)
    err = refused(exception.MdevRemoveFailed, b.remove, EXISTING)
    same(err, exception.MdevRemoveFailed, uuid=EXISTING,
         reason='it is still present 0 s after the remove; is a guest '
                'still using it?')


def test_a_link_to_another_vgpus_directory_removes_nothing(tree, sysfs):
    devices = os.path.join(tree[0], 'bus', 'mdev', 'devices')
    os.symlink(os.readlink(os.path.join(devices, EXISTING)),
               os.path.join(devices, U1))
    b = made(sysfs)
    err = refused(exception.MdevRemoveFailed, b.remove, U1)
    same(err, exception.MdevRemoveFailed, uuid=U1,
         reason='%s leads to %s, not to a directory of that vGPU; nothing '
                'removed' % (sysfs.mdev_dir(U1),
                             os.path.realpath(sysfs.mdev_dir(EXISTING))))
    assert b.lookup(EXISTING) is not None
    assert sysfs.writes == []


def test_a_remove_file_linked_to_another_vgpus_is_not_written(sysfs):
    mine = os.path.realpath(sysfs.mdev_dir(EXISTING))
    other = [u for u in os.listdir(os.path.dirname(mine))
             if u != EXISTING and len(u) == 36][0]
    os.unlink(os.path.join(mine, 'remove'))
    os.symlink(os.path.join(os.path.dirname(mine), other, 'remove'),
               os.path.join(mine, 'remove'))
    b = made(sysfs)
    expected = refused(exception.SysfsError, sysfs.own_file,
                       sysfs.mdev_dir(EXISTING), 'remove')
    err = refused(exception.MdevRemoveFailed, b.remove, EXISTING)
    same(err, exception.MdevRemoveFailed, uuid=EXISTING,
         reason='%s: %s' % (expected.kwargs['path'],
                            expected.kwargs['reason']))
    assert sysfs.writes == []


def test_a_vgpu_directory_that_cannot_be_resolved_any_more_is_kept(sysfs):
    class Changing(kernel_sysfs.KernelSysfs):
        looked = 0

        def resolved_under_root(self, path):
            if path == self.mdev_dir(EXISTING):
                self.looked += 1
                if self.looked > 1:     # the tree changed after lookup
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP))
            return super().resolved_under_root(path)
    b = made(Changing(sysfs.root, sysfs.profile))
    err = refused(exception.MdevRemoveFailed, b.remove, EXISTING)
    same(err, exception.MdevRemoveFailed, uuid=EXISTING,
         reason=os.strerror(errno.ELOOP))
    assert b.sysfs.writes == []


def removing(sysfs, answer, remove=True):
    """``sysfs`` whose kernel answers ``answer`` to a remove, having
    removed the mdev itself first when ``remove``."""
    class Answering(kernel_sysfs.KernelSysfs):
        def write(self, path, data):
            if path.endswith('/remove'):
                if remove:
                    super().write(path, data)
                raise exception.SysfsWriteError(path=path, reason='no',
                                                errno=answer)
            return super().write(path, data)
    return Answering(sysfs.root, sysfs.profile)


@pytest.mark.parametrize('code', [errno.ENOENT, errno.ENODEV])
def test_a_remove_answered_gone_is_done(sysfs, code):
    b = made(removing(sysfs, code))
    assert b.remove(EXISTING) is True
    assert b.lookup(EXISTING) is None


@pytest.mark.parametrize('code,name', [(errno.EACCES, 'EACCES'),
                                       (errno.EIO, 'EIO')])
def test_a_refused_remove_names_the_kernels_answer(sysfs, code, name):
    b = made(removing(sysfs, code, remove=False))
    err = refused(exception.MdevRemoveFailed, b.remove, EXISTING)
    same(err, exception.MdevRemoveFailed, uuid=EXISTING,
         reason='the kernel answered %s' % name)


def test_a_remove_answered_with_an_unnamed_errno_gives_the_error(sysfs):
    b = made(removing(sysfs, 9999, remove=False))
    err = refused(exception.MdevRemoveFailed, b.remove, EXISTING)
    path = os.path.join(sysfs.mdev_dir(EXISTING), 'remove')
    assert err.kwargs['reason'] == 'the kernel answered cannot write %s: ' \
                                   'no' % path


def test_a_busy_remove_is_asked_again_within_remove_timeout(sysfs):
    busy = [errno.EBUSY, errno.EAGAIN]

    class Busy(kernel_sysfs.KernelSysfs):
        def write(self, path, data):
            if busy:
                raise exception.SysfsWriteError(path=path, reason='busy',
                                                errno=busy.pop())
            return super().write(path, data)
    b = made(Busy(sysfs.root, sysfs.profile), remove_timeout=5,
             retry_stop=0)
    assert b.remove(EXISTING) is True
    assert busy == [] and b.lookup(EXISTING) is None


# --- the libvirt path --------------------------------------------------------

class Host(object):
    """``host.Host``'s node-device calls: each answers ``answers[name]``
    (an exception to raise, else a value to return after doing it on the
    simulated kernel), recording what it was asked."""

    def __init__(self, sysfs, **answers):
        self.sysfs = sysfs
        self.answers = answers
        self.calls = []

    def _answer(self, name, *args):
        self.calls.append((name,) + args)
        answer = self.answers.get(name)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def create_mdev(self, xml):
        from lxml import etree
        root = etree.fromstring(xml)
        self.sysfs.kernel.create(
            objects.PciAddress.from_libvirt_name(root.findtext('parent')),
            root.find('capability/type').get('id'),
            root.findtext('capability/uuid'))
        return self._answer('create_mdev', xml)

    def destroy_mdev(self, uuid):
        answer = self._answer('destroy_mdev', uuid)
        if answer:
            self.sysfs.kernel.remove(uuid)
        return answer

    def define_mdev(self, xml, autostart):
        return self._answer('define_mdev', xml, autostart)

    def undefine_mdev(self, uuid):
        return self._answer('undefine_mdev', uuid)


LIBVIRT_FAILED = exception.LibvirtError(reason='internal error')
NO_SUPPORT = exception.NotSupported(what='mdevs', reason='old libvirt')


def test_a_vgpu_libvirt_made_but_called_a_failure_is_made(sysfs):
    b = made(sysfs, host=Host(sysfs, create_mdev=LIBVIRT_FAILED))
    assert b.prepare(vgpu()) is True
    assert sysfs.writes == []
    assert b.lookup(U1) == vgpu()


def test_a_vgpu_libvirt_made_of_another_type_is_a_conflict(sysfs):
    b = made(sysfs, host=Host(sysfs, create_mdev=LIBVIRT_FAILED))
    b.host.create_mdev = lambda xml: (
        sysfs.kernel.create(GPU_A, 'nvidia-222', U1),
        b.host._answer('create_mdev', xml))
    err = refused(exception.MdevConflict, b.prepare, vgpu())
    same(err, exception.MdevConflict, uuid=U1, existing_type=T_222,
         existing_parent=GPU_A, type_id=T_223, parent=GPU_A)


def test_the_kernels_refusal_after_libvirts_names_both(sysfs):
    host = Host(answering(sysfs, errno.ENOSPC))
    host.create_mdev = lambda xml: host._answer('create_mdev', xml)
    host.answers['create_mdev'] = LIBVIRT_FAILED
    b = made(host.sysfs, host=host)
    err = refused(exception.NoCapacity, b.prepare, vgpu())
    kwargs = dict(uuid=U1, type_id=T_223, where='the GPU 0000:3b:00.0',
                  reason='the kernel answered ENOSPC')
    assert err.kwargs == kwargs
    assert str(err) == '%s (libvirt first answered: %s)' % (
        exception.NoCapacity(**kwargs), LIBVIRT_FAILED)


def test_libvirt_removes_what_it_can_and_sysfs_the_rest(sysfs):
    host = Host(sysfs, destroy_mdev=True)
    b = made(sysfs, host=host)
    assert b.remove(EXISTING) is True
    assert host.calls == [('destroy_mdev', EXISTING)]
    assert sysfs.writes == []
    # libvirt answers it removed nothing: the kernel is asked
    host.answers['destroy_mdev'] = False
    b.prepare(vgpu())
    assert b.remove(U1) is True
    assert [w[0] for w in sysfs.writes] == ['remove']
    # libvirt cannot: the kernel is asked
    host.answers['destroy_mdev'] = NO_SUPPORT
    b.prepare(vgpu(uuid=U2))
    assert b.remove(U2) is True
    assert [w[0] for w in sysfs.writes][-1] == 'remove'


def test_a_libvirt_failure_to_remove_what_is_there_is_a_remove_failure(
        sysfs):
    b = made(sysfs, host=Host(sysfs, destroy_mdev=LIBVIRT_FAILED))
    err = refused(exception.MdevRemoveFailed, b.remove, EXISTING)
    same(err, exception.MdevRemoveFailed, uuid=EXISTING,
         reason='libvirt: internal error')
    assert b.lookup(EXISTING) is not None


def test_a_libvirt_failure_to_remove_what_went_meanwhile_is_false(sysfs):
    host = Host(sysfs)

    def destroy(uuid):
        sysfs.kernel.remove(uuid)        # the vendor driver's own cleanup
        raise LIBVIRT_FAILED
    host.destroy_mdev = destroy
    assert made(sysfs, host=host).remove(EXISTING) is False


# --- persistent definitions: define, undefine --------------------------------

def test_define_refuses_a_start_mdevctl_does_not_know(backend):
    err = refused(exception.InvalidInput, backend.define, vgpu(),
                  start='sometimes')
    same(err, exception.InvalidInput,
         reason="start must be auto or manual, not 'sometimes'")
    assert not os.path.exists(backend.mdevctl_dir)


def test_define_writes_mdevctls_file_manual_by_default(backend):
    old = os.umask(0)          # the mode is define's own, not the umask's
    try:
        backend.define(vgpu())
    finally:
        os.umask(old)
    path = os.path.join(backend.mdevctl_dir, str(GPU_A), U1)
    with open(path) as f:
        assert f.read() == json.dumps(
            {'mdev_type': 'nvidia-223', 'start': 'manual', 'attrs': []},
            indent=2) + '\n'
    assert os.stat(os.path.dirname(path)).st_mode & 0o777 == 0o755
    # the same definition again changes nothing
    backend.define(vgpu())
    assert backend.definition(U1).start == 'manual'


def test_define_refuses_the_uuid_defined_on_another_parent(backend):
    backend.define(vgpu(parent=GPU_B))
    err = refused(exception.MdevConflict, backend.define, vgpu())
    same(err, exception.MdevConflict, uuid=U1, existing_type=T_223,
         existing_parent=GPU_B, type_id=T_223, parent=GPU_A)
    assert backend.definitions() == [(GPU_B, U1)]


@pytest.mark.parametrize('start,autostart', [('auto', True),
                                             ('manual', False)])
def test_define_through_libvirt_writes_no_file(sysfs, tmp_path, start,
                                               autostart):
    host = Host(sysfs, define_mdev='mdev_x')
    b = made(sysfs, host=host, mdevctl_dir=str(tmp_path / 'm'))
    assert b.define(vgpu(), start=start) is None
    assert host.calls == [('define_mdev', config_xml_of(vgpu()), autostart)]
    assert not os.path.exists(b.mdevctl_dir)


def config_xml_of(device):
    from libvirt_gpu.virt import config_xml
    return config_xml.mdev_nodedev(device.parent, device.type_id,
                                   device.uuid)


def test_define_without_libvirt_support_writes_the_file(sysfs, tmp_path):
    b = made(sysfs, host=Host(sysfs, define_mdev=NO_SUPPORT,
                              undefine_mdev=NO_SUPPORT),
             mdevctl_dir=str(tmp_path / 'm'))
    b.define(vgpu(), start='auto')
    assert b.definition(U1).start == 'auto'
    assert b.undefine(U1) is True
    assert b.definition(U1) is None
    assert b.undefine(U1) is False


def test_undefine_through_libvirt(sysfs, tmp_path):
    host = Host(sysfs, undefine_mdev=True)
    b = made(sysfs, host=host, mdevctl_dir=str(tmp_path / 'm'))
    assert b.undefine(U1) is True
    assert host.calls == [('undefine_mdev', U1)]
    # libvirt had none: mdevctl's file is looked for
    host.answers['undefine_mdev'] = False
    assert b.undefine(U1) is False
    with pytest.raises(TypeError, match=r'^uuid must be an objects\.Uuid'):
        b.undefine(str(U1))


def test_libvirt_timeouts_are_retried_only_until_retry_stop(sysfs, tmp_path):
    # retry_stop 0.05 s: the first call, then a retry or two; the default
    # (5 s) would make about ten
    slow = exception.LibvirtTimeout(reason='busy')
    host = Host(sysfs, define_mdev=slow, undefine_mdev=slow,
                destroy_mdev=slow)
    b = made(sysfs, host=host, mdevctl_dir=str(tmp_path / 'm'),
             retry_stop=0.05)
    for call, arg in ((b.define, vgpu()), (b.undefine, U1)):
        del host.calls[:]
        assert refused(exception.LibvirtTimeout, call, arg) is slow
        assert 2 <= len(host.calls) <= 3
    del host.calls[:]
    refused(exception.MdevRemoveFailed, b.remove, EXISTING)
    assert 2 <= len(host.calls) <= 3
    host.create_mdev = lambda xml: host._answer('create_mdev', xml)
    host.answers['create_mdev'] = slow
    del host.calls[:]
    assert b.prepare(vgpu()) is True           # the kernel made it
    assert 2 <= len(host.calls) <= 3


def test_a_busy_kernel_is_asked_again_only_until_its_limit(sysfs):
    # create: retry_stop; remove: remove_timeout (0.05 s: the first write,
    # then a retry or two; the 5 s default would make about ten)
    writes = []

    class AlwaysBusy(kernel_sysfs.KernelSysfs):
        def write(self, path, data):
            writes.append(os.path.basename(path))
            raise exception.SysfsWriteError(path=path, reason='busy',
                                            errno=errno.EBUSY)
    b = made(AlwaysBusy(sysfs.root, sysfs.profile), retry_stop=0.05,
             remove_timeout=0.05)
    refused(exception.MdevCreateFailed, b.prepare, vgpu())
    assert 2 <= len(writes) <= 3
    del writes[:]
    err = refused(exception.MdevRemoveFailed, b.remove, EXISTING)
    assert err.kwargs['reason'] == 'the kernel answered EBUSY'
    assert 2 <= len(writes) <= 3


# --- persistent definitions: reading mdevctl's files ------------------------

def write_definition(backend, parent, uuid, text):
    directory = os.path.join(backend.mdevctl_dir, str(parent))
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, uuid)
    with open(path, 'wb' if isinstance(text, bytes) else 'w') as f:
        f.write(text)
    return path


def bad_definition(backend, text):
    path = write_definition(backend, GPU_A, U1, text)
    err = refused(exception.ConfigError, backend.definition, U1)
    prefix = 'mdevctl definition %s: ' % path
    assert err.kwargs['reason'].startswith(prefix)
    return err.kwargs['reason'][len(prefix):]


def test_a_definition_of_exactly_the_size_limit_is_read(backend):
    text = '{"mdev_type": "nvidia-223"}'
    text += ' ' * (64 * 1024 - len(text))
    write_definition(backend, GPU_A, U1, text)
    assert backend.definition(U1).type_id == T_223
    assert bad_definition(backend, text + ' ') == 'larger than 65536 bytes'


def test_definitions_that_are_no_json_object_are_refused(backend):
    assert bad_definition(backend, b'\xff').startswith('not JSON: ')
    assert bad_definition(backend, '{').startswith('not JSON: ')
    assert bad_definition(backend, '[' * 60000) == (
        'not JSON: nested too deeply')
    assert bad_definition(backend, '"x"') == 'not a JSON object'
    assert bad_definition(backend, '{}') == str(
        exception.InvalidTypeId(value=None))
    assert bad_definition(backend, '{"mdev_type": "nvidia-223", '
                          '"start": "never"}') == (
        '"start" is \'never\', not auto or manual')


@pytest.mark.parametrize('attrs', ['[{}]', '[{"a": "1", "b": "2"}]',
                                   '["a=1"]'])
def test_attributes_must_be_one_name_each(backend, attrs):
    assert bad_definition(
        backend, '{"mdev_type": "nvidia-223", "attrs": %s}' % attrs) == (
        '"attrs" entries must be {"name": "value"}')


def test_a_definition_is_read_whole(backend):
    write_definition(backend, GPU_B, U1, json.dumps({
        'mdev_type': 'nvidia-222', 'attrs': [{'a': 1}, {'b': 'x'}]}))
    assert backend.definition(U1) == mdev.MdevDefinition(
        uuid=U1, parent=GPU_B, type_id=T_222, start='manual',
        attrs=(('a', '1'), ('b', 'x')),
        source='mdevctl (%s)' % backend.mdevctl_dir)
    write_definition(backend, GPU_B, U2, '{"mdev_type": "nvidia-222", '
                                         '"attrs": null}')
    assert backend.definition(U2).attrs == ()


def test_definitions_lists_pci_parents_and_uuids_sorted(backend):
    write_definition(backend, GPU_B, U2, '{}')
    write_definition(backend, GPU_B, U1, '{}')
    write_definition(backend, GPU_A, U3, '{}')
    write_definition(backend, GPU_A, 'not-a-uuid', '{}')
    write_definition(backend, '0.0.0033', U4, '{}')
    with open(os.path.join(backend.mdevctl_dir, '0000:00:01.0'), 'w'):
        pass                                   # a stray file
    assert backend.definitions() == [(GPU_A, U3), (GPU_B, U1), (GPU_B, U2)]


def test_an_mdevctl_dir_that_is_a_file_is_a_config_error(backend):
    with open(backend.mdevctl_dir, 'w'):
        pass
    err = refused(exception.ConfigError, backend.definitions)
    same(err, exception.ConfigError, reason='%s: %s' % (
        backend.mdevctl_dir, os.strerror(errno.ENOTDIR)))


def test_no_mdevctl_dir_is_no_definitions(backend):
    with pytest.raises(TypeError, match=r'^uuid must be an objects\.Uuid'):
        backend.definition(str(U1))
    assert backend.definitions() == []
    assert backend.definition(U1) is None
    assert backend.restorable() == ()


def test_restorable_says_what_it_creates_and_what_it_leaves(backend):
    auto = '{"mdev_type": "nvidia-223", "start": "auto"}'
    write_definition(backend, GPU_A, U1, '{"mdev_type": "../x"}')
    write_definition(backend, GPU_A, U2, auto)
    write_definition(backend, GPU_A, U3, '{"mdev_type": "nvidia-223"}')
    write_definition(backend, GPU_A, U4, '{"mdev_type": "nvidia-223", '
                     '"start": "auto", "attrs": [{"a": "b"}]}')
    write_definition(backend, GPU_B, U2, auto)
    write_definition(backend, GPU_D8, U5, auto)
    bad = refused(exception.ConfigError, backend.definition, U1)
    assert backend.restorable() == (
        base.Restorable(uuid=U1, detail=str(bad), failed=True),
        base.Restorable(uuid=U2, detail='nvidia-223 on 0000:3b:00.0',
                        device=vgpu(uuid=U2)),
        base.Restorable(uuid=U3, detail='nvidia-223 on 0000:3b:00.0 is '
                        'defined with start manual: its guest creates it'),
        base.Restorable(uuid=U4, detail='nvidia-223 on 0000:3b:00.0 sets '
                        'attributes: `mdevctl start -u %s` applies them'
                        % U4),
        base.Restorable(uuid=U2, detail='defined under 0000:af:00.0 and '
                        'elsewhere; left to mdevctl'),
        base.Restorable(uuid=U5, detail='nvidia-223 on 0000:d8:00.0',
                        device=vgpu(uuid=U5, parent=GPU_D8)),
    )


def test_a_definition_setting_attributes_is_refused_saying_what_to_do(
        backend):
    write_definition(backend, GPU_A, U1, '{"mdev_type": "nvidia-223", '
                     '"attrs": [{"a": "b"}]}')
    vgpus = registry.Vgpus(backend.sysfs, [backend])
    err = refused(exception.MdevCreateFailed, vgpus.defined_device, U1)
    same(err, exception.MdevCreateFailed, uuid=U1, type_id=T_223,
         parent=GPU_A, reason='its mdevctl definition sets attributes; '
         'start it with `mdevctl start -u %s` instead' % U1)
    write_definition(backend, GPU_A, U2, '{"mdev_type": "nvidia-223"}')
    assert vgpus.defined_device(U2) == vgpu(uuid=U2)
    assert vgpus.defined_device(U3) is None


# --- the registry of kinds (registry.Vgpus) ----------------------------------

class Kind(base.VgpuKind):
    """A kind of the core only that claims the parents and UUIDs it is
    given and answers every call with ``(its name, the call, its
    arguments)``."""

    def __init__(self, name, parents=(), uuids=()):
        self.name = name
        self.parents = parents
        self.uuids = uuids
        self.calls = []

    def _says(self, call, *args):
        self.calls.append((call,) + args)
        return (self.name, call) + args

    @classmethod
    def from_parts(cls, parts):
        return cls('from-parts')

    def is_parent(self, address):
        return address in self.parents

    def owns(self, uuid):
        return uuid in self.uuids

    def hostdev_xml(self, device):
        return self._says('hostdev_xml', device)

    def exists(self, device):
        return self._says('exists', device)

    def prepare(self, device):
        return self._says('prepare', device)

    def lookup(self, uuid):
        return self._says('lookup', uuid)

    def remove(self, uuid):
        return self._says('remove', uuid)

    def check_type(self, parent, type_id):
        return self._says('check_type', parent, type_id)

    def vgpu_type(self, parent, type_id):
        return self._says('vgpu_type', parent, type_id)

    def existing(self, mdevs_by_parent=None):
        return {uuid: (self.name, mdevs_by_parent) for uuid in self.uuids}

    def in_devices(self, devices, uuid, parent):
        return (uuid, parent) in devices


class Defining(Kind, capabilities.Persistent):
    """``Kind`` with definitions of its UUIDs (``Persistent``)."""

    def definition(self, uuid):
        if uuid not in self.uuids:
            return None
        self._says('definition', uuid)
        return base.VgpuDefinition(uuid=uuid, parent=self.parents[0],
                                   type_id=T_223, start='manual',
                                   source=self.name)

    def define(self, device, start='manual'):
        return self._says('define', device, start)

    def undefine(self, uuid):
        return self._says('undefine', uuid)

    def restorable(self):
        return ()


class FullKind(Defining, capabilities.BindsParent, capabilities.Recorded,
               capabilities.DriverRooms):
    """``Defining`` that binds its parents, keeps records and reads the
    driver's room."""

    def __init__(self, name, parents=(), uuids=(), room=None, choose=None,
                 recorded=(), reserved=None):
        super().__init__(name, parents, uuids)
        self._room = room
        self._choose = choose or {}
        self._recorded = recorded
        self._reserved = reserved or {}

    def recorded(self, uuid):
        return uuid in self._recorded

    def recorded_gpus(self):
        return ()

    def boot_cleanup(self, owner_running, dry_run=False):
        return ()

    def reserved_parents(self):
        return dict(self._reserved)

    def room(self, gpu, type_id):
        found = None if self._room is None else self._room.get(gpu)
        return None if found is None else (found, type_id)

    def choose_parent(self, gpu, type_id):
        self.calls.append(('choose_parent', gpu, type_id))
        chosen = self._choose.get(gpu)
        if chosen is None:
            raise exception.NoCapacity(uuid=None, type_id=type_id,
                                       where=str(gpu), reason='full')
        return chosen


P1, P2, P3, P4 = (objects.PciAddress.parse('0000:0%d:00.0' % n)
                  for n in (1, 2, 3, 4))


def three(sysfs, first=Kind, others=Kind):
    """Kinds a (parent P1, UUID U1; of the class ``first``), b (P1 and P2,
    U1 and U2) and the fallback c (P3, U3), both of ``others``."""
    a = first('a', parents=(P1,), uuids=(U1,))
    b = others('b', parents=(P1, P2), uuids=(U1, U2))
    c = others('c', parents=(P3,), uuids=(U3,))
    return registry.Vgpus(sysfs, [a, b, c]), a, b, c


def test_kinds_are_loaded_by_spec_and_must_be_vgpu_kinds(monkeypatch):
    monkeypatch.setattr(registry, '_loaded', {})    # nothing loaded yet
    assert registry.load_kind(
        'libvirt_gpu.devices.backends.mdev:MdevBackend') is mdev.MdevBackend
    for spec in ('libvirt_gpu.objects:PciAddress',
                 'libvirt_gpu.objects:NVIDIA_VENDOR_ID'):
        err = refused(exception.ConfigError, registry.load_kind, spec)
        same(err, exception.ConfigError, reason='%s is not a vGPU kind (a '
             'backends.base.VgpuKind)' % spec)
    mine = ['libvirt_gpu.devices.backends.mdev:MdevBackend']
    assert registry.kind_classes(mine) == [mdev.MdevBackend]
    assert registry.kind_classes(mine) is registry.kind_classes(tuple(mine))
    assert [c.name for c in registry.kind_classes()] == [
        'nvidia', 'mdev']


def test_a_registry_needs_a_kind_and_finds_them_by_name(sysfs):
    err = refused(exception.ConfigError, registry.Vgpus, sysfs, [])
    same(err, exception.ConfigError, reason='no vGPU kind is registered')
    vgpus, a, b, c = three(sysfs)
    assert vgpus.kind('b') is b
    with pytest.raises(KeyError) as e:
        vgpus.kind('d')
    assert e.value.args == ('d',)
    assert vgpus.kind_classes == (Kind, Kind, Kind)


def test_the_first_kind_claiming_a_parent_or_uuid_takes_the_call(sysfs):
    vgpus, a, b, c = three(sysfs)
    assert [vgpus.kind_of(p).name for p in (P1, P2, P3, P4)] == [
        'a', 'b', 'c', 'c']
    assert [vgpus.kind_owning(u).name for u in (U1, U2, U3, U4)] == [
        'a', 'b', 'c', 'c']
    on_p2 = vgpu(parent=P2)
    assert vgpus.hostdev_xml(on_p2) == ('b', 'hostdev_xml', on_p2)
    assert vgpus.exists(on_p2) == ('b', 'exists', on_p2)
    assert vgpus.prepare(on_p2) == ('b', 'prepare', on_p2)
    assert vgpus.release(vgpu(uuid=U2, parent=P1)) == ('b', 'remove', U2)
    assert vgpus.lookup(U2) == ('b', 'lookup', U2)
    assert vgpus.remove(U1) == ('a', 'remove', U1)
    assert vgpus.check_type(P2, T_223) == ('b', 'check_type', P2, T_223)
    assert vgpus.vgpu_type(P2, T_223) == ('b', 'vgpu_type', P2, T_223)
    assert vgpus.vgpu_type(P4, T_223) == ('c', 'vgpu_type', P4, T_223)
    for call in (vgpus.lookup, vgpus.remove):
        with pytest.raises(TypeError, match=r'^uuid must be an '
                                            r'objects\.Uuid'):
            call(str(U1))
    assert vgpus.is_parent(P3) and not vgpus.is_parent(P4)


def test_the_fallbacks_definition_comes_first(sysfs):
    vgpus, a, b, c = three(sysfs, others=Defining)
    assert vgpus.definition(U1).source == 'b'
    assert vgpus.definition(U3).source == 'c'
    assert vgpus.definition(U4) is None
    assert vgpus.defined_device(U1) == vgpu(uuid=U1, parent=P1)
    assert vgpus.defined_device(U4) is None
    # a kind without definitions is not asked
    assert a.calls == []
    assert vgpus.undefine(U1) == ('b', 'undefine', U1)
    assert vgpus.undefine(U4) is False
    # the first kind's view of a UUID wins
    assert vgpus.existing('read') == {U1: ('a', 'read'), U2: ('b', 'read'),
                                      U3: ('c', 'read')}
    assert vgpus.existing() == {U1: ('a', None), U2: ('b', None),
                                U3: ('c', None)}


def test_records_of_every_kind_count(sysfs):
    a = FullKind('a', recorded=(U1,), reserved={P1: U1, P2: U1})
    b = FullKind('b', recorded=(U2,), reserved={P2: U2})
    vgpus = registry.Vgpus(sysfs, [a, b, Kind('c')])
    assert vgpus.recorded(U1) and vgpus.recorded(U2)
    assert not vgpus.recorded(U3)
    assert vgpus.reserved_parents() == {P1: U1, P2: U2}
    assert vgpus.in_devices({(U2, P2)}, U2, P2)
    assert not vgpus.in_devices({(U2, P2)}, U2, P1)


def test_the_room_of_the_first_kind_that_counts_one(sysfs):
    a = FullKind('a', room={P1: None})
    b = FullKind('b', room={P1: 'b-room', P2: 'b-room-2'})
    c = FullKind('c', room={P1: 'c-room', P3: 'c-room'})
    vgpus = registry.Vgpus(sysfs, [a, b, c])
    assert vgpus.room(P1, T_223) == ('b-room', T_223)
    assert vgpus.room(P4, T_223) is None
    # a kind that reads no room (classic mdev) is passed over
    assert registry.Vgpus(sysfs, [mdev.MdevBackend(sysfs), b]).room(
        P1, T_223) == ('b-room', T_223)
    enabled = {P3: objects.EnabledType(type_id=T_223, others=(
        objects.EnabledType(type_id=T_222),)), P4: objects.EnabledType(
        type_id=T_223), P2: objects.EnabledType(type_id=T_222)}
    assert vgpus.rooms(enabled) == {(P2, T_222): ('b-room-2', T_222),
                                    (P3, T_223): ('c-room', T_223),
                                    (P3, T_222): ('c-room', T_222)}


def test_the_hostdev_of_a_vgpu_by_its_parents_kind(sysfs):
    from libvirt_gpu.virt import config_xml
    vgpus, a, b, c = three(sysfs, first=FullKind)
    assert vgpus.hostdev_for(U1, P1, T_223) == (
        'a', 'hostdev_xml', vgpu(uuid=U1, parent=P1))
    assert vgpus.hostdev_for(U2, P2, T_223) == config_xml.mdev_hostdev(U2)
    assert vgpus.hostdev_for(U1) == config_xml.mdev_hostdev(U1)
    assert vgpus.hostdev_function(U1, P1, {(U1, P1)}) == P1
    assert vgpus.hostdev_function(U1, P1, set()) is None
    assert vgpus.hostdev_function(U2, P2, {(U2, P2)}) is None
    assert vgpus.hostdev_function(U1, None, {(U1, None)}) is None
    assert vgpus.binds_parent(P1) and not vgpus.binds_parent(P2)


def test_config_vgpus_are_kept_only_by_kinds_that_bind_the_parent(sysfs):
    vgpus, a, b, c = three(sysfs, first=FullKind)
    assert vgpus.keep_for_config(vgpu(parent=P1)) is True
    assert a.calls == [('define', vgpu(parent=P1), 'manual')]
    assert vgpus.keep_for_config(vgpu(parent=P2)) is False
    vgpus.forget_for_config(U1, P1)
    vgpus.forget_for_config(U2, P2)
    assert a.calls[-1] == ('undefine', U1)
    assert b.calls == []


def test_bind_for_config_chooses_on_the_first_gpu_with_room(sysfs):
    # on the T4 host every GPU is its own parent
    a = FullKind('a', parents=(GPU_A, GPU_B, P2, P3), choose={GPU_B: P2})
    vgpus = registry.Vgpus(sysfs, [a, Kind('c')])
    assert vgpus.bind_for_config([P4, GPU_A, GPU_B], T_223, None,
                                 U1) == P2
    assert a.calls == [('choose_parent', GPU_A, T_223),
                       ('choose_parent', GPU_B, T_223),
                       ('define', vgpu(parent=P2), 'manual')]
    # the caller's own function is taken as it is
    del a.calls[:]
    assert vgpus.bind_for_config([GPU_A, GPU_B], T_223, P3, U1) == P3
    assert a.calls == [('define', vgpu(parent=P3), 'manual')]
    # ... naming the first GPU is choosing on it
    del a.calls[:]
    assert vgpus.bind_for_config([GPU_B], T_223, GPU_B, U1) == P2
    assert a.calls[0] == ('choose_parent', GPU_B, T_223)
    # the first GPU with room is taken, the others not asked
    a._choose[GPU_A] = P3
    del a.calls[:]
    assert vgpus.bind_for_config([GPU_A, GPU_B], T_223, None, U1) == P3
    assert [c[:2] for c in a.calls] == [('choose_parent', GPU_A),
                                        ('define', vgpu(parent=P3))]
    # GPUs of a kind that does not bind the parent: chosen at start
    assert vgpus.bind_for_config([P4], T_223, None, U1) is None


def test_bind_for_config_without_room_names_every_gpus_answer(sysfs):
    a = FullKind('a', parents=(GPU_A, GPU_B))
    vgpus = registry.Vgpus(sysfs, [a, Kind('c')])
    err = refused(exception.NoCapacity, vgpus.bind_for_config,
                  [GPU_A, GPU_B], T_223, None, U1)
    full = [str(exception.NoCapacity(uuid=None, type_id=T_223,
                                     where=str(g), reason='full'))
            for g in (GPU_A, GPU_B)]
    same(err, exception.NoCapacity, uuid=U1, type_id=T_223,
         where='any GPU of this host', reason='; '.join(full))
    assert [c[0] for c in a.calls] == ['choose_parent', 'choose_parent']


def test_physical_gpus_and_their_functions(sysfs):
    assert registry.Vgpus(sysfs, [Kind('c')]).physical(GPU_A) == GPU_A
    vgpus = registry.Vgpus(sysfs, [Kind('c')])
    assert vgpus.parents_of(GPU_B) == (GPU_B,)
    # make 0000:3b:00.0 a VF of 0000:af:00.0
    pf = os.path.realpath(sysfs.pci_dir(GPU_B))
    vf = os.path.realpath(sysfs.pci_dir(GPU_A))
    os.symlink(pf, os.path.join(vf, 'physfn'))
    os.symlink(vf, os.path.join(pf, 'virtfn0'))
    assert vgpus.physical(GPU_A) == GPU_B
    assert vgpus.physical(GPU_B) == GPU_B
    assert vgpus.parents_of(GPU_B) == (GPU_A,)
    with pytest.raises(TypeError, match=r'^address must be'):
        vgpus.physical(str(GPU_A))
    with pytest.raises(TypeError, match=r'^gpu must be'):
        vgpus.parents_of(str(GPU_A))


# --- the contract's defaults and helpers (backends.base) --------------------

def test_the_core_follows_exists_and_release_from_lookup_and_remove(
        sysfs):
    class Found(Kind):
        def lookup(self, uuid):
            return vgpu(uuid=uuid, parent=P1) if uuid in self.uuids else None
    found = Found('f', parents=(P1,), uuids=(U1,))
    assert base.VgpuKind.exists(found, vgpu(uuid=U1, parent=P1))
    assert not base.VgpuKind.exists(found, vgpu(uuid=U1, parent=P2))
    assert not base.VgpuKind.exists(found, vgpu(uuid=U2, parent=P1))
    assert base.VgpuKind.release(found, vgpu(uuid=U2)) == ('f', 'remove',
                                                           U2)
    assert base.VgpuKind.name == '' and base.VgpuKind.places == ()
    assert set(base.CORE) >= base.VgpuKind.__abstractmethods__


def test_a_capabilitys_defaults(sysfs):
    plain = Defining('plain')
    definition = mdev.MdevDefinition(uuid=U1, parent=GPU_A, type_id=T_223,
                                     start='auto', attrs=(('a', 'b'),),
                                     source='its file')
    assert plain.attrs_refusal(definition) == (
        'its definition (its file) sets attributes, which this hook does '
        'not apply')
    assert plain.noun == 'vgpu' and mdev.MdevBackend.noun == 'mdev'
    assert capabilities.declared(plain) == (capabilities.Persistent,)
    assert capabilities.declared(FullKind) == (
        capabilities.Persistent, capabilities.Recorded,
        capabilities.BindsParent, capabilities.DriverRooms)
    assert registry.having([Kind('k'), plain, FullKind],
                           capabilities.Persistent) == (plain, FullKind)


def test_a_guest_holds_a_vgpu_by_uuid_or_a_function_by_address(
        sysfs, tmp_path):
    from types import SimpleNamespace
    devices = SimpleNamespace(mdev_uuids={U1}, pci_addresses={GPU_A, P1})
    by_uuid = mdev.MdevBackend(sysfs)
    assert by_uuid.in_devices(devices, U1, None)
    assert not by_uuid.in_devices(devices, U2, GPU_A)

    class Function(nvidia_vgpu.NvidiaVgpuBackend):
        def is_parent(self, address):
            return address == GPU_A
    function = Function(sysfs, str(tmp_path))
    assert function.in_devices(devices, U2, GPU_A)
    assert not function.in_devices(devices, U1, None)
    assert not function.in_devices(devices, U1, GPU_B)     # not handed over
    assert not function.in_devices(devices, U1, P1)        # no parent


def test_only_transient_answers_are_retried():
    calls = []

    def answers(*errors):
        errors = list(errors)

        def call():
            calls.append(1)
            if errors:
                raise errors.pop(0)
            return 'done'
        return call

    def write_error(code):
        return exception.SysfsWriteError(path='p', reason='r', errno=code)
    assert base.retry_transient(answers(
        write_error(errno.EBUSY), write_error(errno.EAGAIN),
        write_error(errno.EINTR), exception.LibvirtTimeout(reason='slow')),
        first_wait=0.001) == 'done'
    assert len(calls) == 5
    for error in (write_error(errno.EACCES), exception.LibvirtError(
            reason='no'), exception.SysfsReadError(path='p', reason='r')):
        del calls[:]
        with pytest.raises(type(error)) as e:
            base.retry_transient(answers(error, error), first_wait=0.001)
        assert e.value is error and len(calls) == 1
    # a later answer that is no longer transient ends the retries
    del calls[:]
    with pytest.raises(exception.SysfsWriteError) as e:
        base.retry_transient(answers(write_error(errno.EBUSY),
                                     write_error(errno.EIO), 'x'),
                             first_wait=0.001)
    assert e.value.kwargs['errno'] == errno.EIO and len(calls) == 2
    # ever busy: the last answer itself, once stop_after has passed
    busy = write_error(errno.EBUSY)

    def always_busy():
        raise busy
    with pytest.raises(exception.SysfsWriteError) as e:
        base.retry_transient(always_busy, stop_after=0.01, first_wait=0.001)
    assert e.value is busy
    # each wait is at most max_wait: many tries within stop_after (a wait
    # growing without bound would allow about ten in 0.4 s)
    del calls[:]

    def busy_counted():
        calls.append(1)
        raise busy
    with pytest.raises(exception.SysfsWriteError):
        base.retry_transient(busy_counted, stop_after=0.4, first_wait=0.001,
                             max_wait=0.001)
    assert len(calls) >= 20
    # ... and they start at first_wait (0.001 s, doubling: several tries
    # in 0.3 s; a first wait of a second would allow two)
    del calls[:]
    with pytest.raises(exception.SysfsWriteError):
        base.retry_transient(busy_counted, stop_after=0.3, first_wait=0.001,
                             max_wait=0.5)
    assert len(calls) >= 5
    assert base.is_transient(exception.LibvirtTimeout(reason='x'))
    assert not base.is_transient(exception.LibvirtError(reason='x'))
    assert not base.is_transient(exception.SysfsReadError(
        path='p', reason='r', errno=errno.EBUSY))


def write_pci(sysfs, address, name, text):
    with open(os.path.join(sysfs.pci_dir(address), name), 'w') as f:
        f.write(text)


def test_nvidia_sriov_pfs_are_nvidia_gpus_with_vfs_to_enable(sysfs):
    assert mdev.MdevBackend.sriov_pfs(sysfs) == []
    assert not base.is_sriov_pf(sysfs, GPU_A)
    write_pci(sysfs, GPU_B, 'sriov_totalvfs', '4\n')
    write_pci(sysfs, GPU_A, 'sriov_totalvfs', '0\n')
    assert mdev.MdevBackend.sriov_pfs(sysfs) == [GPU_B]
    assert base.is_sriov_pf(sysfs, GPU_B)
    assert not base.is_sriov_pf(sysfs, GPU_A)
    write_pci(sysfs, GPU_A, 'sriov_totalvfs', '2\n')
    assert base.nvidia_sriov_pfs(sysfs) == [GPU_A, GPU_B]
    # a VF is not a PF; an unreadable count is none
    os.symlink(os.path.realpath(sysfs.pci_dir(GPU_B)),
               os.path.join(sysfs.pci_dir(GPU_A), 'physfn'))
    assert not base.is_sriov_pf(sysfs, GPU_A)
    write_pci(sysfs, GPU_B, 'sriov_totalvfs', 'many\n')
    assert not base.is_sriov_pf(sysfs, GPU_B)
    assert base.nvidia_sriov_pfs(sysfs) == []


def test_nvidia_sriov_pfs_skips_other_vendors_drivers_and_bad_files(sysfs):
    write_pci(sysfs, GPU_A, 'sriov_totalvfs', '2\n')
    write_pci(sysfs, GPU_B, 'sriov_totalvfs', '2\n')
    write_pci(sysfs, GPU_A, 'vendor', '0x8086\n')
    assert base.nvidia_sriov_pfs(sysfs) == [GPU_B]
    write_pci(sysfs, GPU_A, 'vendor', 'not hex\n')
    assert base.nvidia_sriov_pfs(sysfs) == [GPU_B]
    write_pci(sysfs, GPU_A, 'vendor', '0x10DE\n')
    assert base.nvidia_sriov_pfs(sysfs) == [GPU_A, GPU_B]
    os.unlink(os.path.join(sysfs.pci_dir(GPU_B), 'vendor'))
    driver = os.path.join(sysfs.pci_dir(GPU_A), 'driver')
    os.unlink(driver)
    os.symlink('../../../../bus/pci/drivers/vfio-pci', driver)
    assert base.nvidia_sriov_pfs(sysfs) == []


def test_device_records_name_the_first_untyped_field():
    with pytest.raises(TypeError) as e:
        base.VgpuDevice(uuid=str(U1), parent=GPU_A, type_id=str(T_223))
    assert str(e.value) == (
        "VgpuDevice.uuid must be an objects.Uuid, not str '%s': parse it "
        "with objects.Uuid.parse where it enters the program (CLI, API, "
        "hook input, state load, sysfs) and pass the result" % U1)
    with pytest.raises(TypeError, match=r'^VgpuDevice\.type_id must be an '
                                        r'objects\.TypeId, not str'):
        base.VgpuDevice(uuid=U1, parent=GPU_A, type_id=str(T_223))
    with pytest.raises(TypeError, match=r'^VgpuDevice\.parent '):
        base.VgpuDevice(uuid=U1, parent=None, type_id=T_223)
    # a field that may be None is passed over
    base.refuse_untyped(vgpu(), optional=('uuid',))
    base.refuse_untyped(base.Restorable(uuid=None, detail='d'),
                        optional=('uuid',))
    with pytest.raises(TypeError, match=r'^Restorable\.uuid must be an '
                                        r'objects\.Uuid, not NoneType'):
        base.refuse_untyped(base.Restorable(uuid=None, detail='d'))


# --- from an Environment ----------------------------------------------------

MDEV_SPEC = 'libvirt_gpu.devices.backends.mdev:MdevBackend'


def test_kinds_are_made_from_the_hosts_parts(sysfs, tmp_path):
    from libvirt_gpu import environment
    host = Host(sysfs)
    env = environment.Environment(str(tmp_path / 'state'), sysfs=sysfs,
                                  host=host, kinds=[MDEV_SPEC],
                                  mdevctl_dir=str(tmp_path / 'm'))
    parts = env.kind_parts
    assert (parts.sysfs, parts.host, parts.state_dir) == (
        sysfs, host, str(tmp_path / 'state'))
    b = mdev.MdevBackend.from_parts(parts)
    assert (b.sysfs, b.host, b.mdevctl_dir, b.remove_timeout) == (
        sysfs, host, str(tmp_path / 'm'), 10.0)
    env.remove_timeout = 3
    assert mdev.MdevBackend.from_parts(env.kind_parts).remove_timeout == 3
    vgpus = registry.Vgpus.from_parts(env.kind_parts, [MDEV_SPEC])
    assert vgpus.sysfs is sysfs
    assert [type(k) for k in vgpus.kinds] == [mdev.MdevBackend]
    assert vgpus.kinds[0].remove_timeout == 3
    assert [k.name for k in registry.Vgpus.from_parts(
        env.kind_parts).kinds] == ['nvidia', 'mdev']
    # the environment's own kinds are built from the same parts
    assert [type(k) for k in env.vgpus.kinds] == [mdev.MdevBackend]
    assert env.vgpus.kinds[0].mdevctl_dir == str(tmp_path / 'm')


def test_the_mdev_parents_now(sysfs, tmp_path):
    assert mdev.MdevBackend.parents_now(sysfs) == ['0000:3b:00.0',
                                                   '0000:af:00.0']
    assert mdev.MdevBackend.parents_now(sysfs_mod.Sysfs(str(tmp_path))) == []


def test_refuse_untyped_looks_at_every_typed_field(tmp_path):
    from libvirt_gpu.util import records

    @records.record
    class Named:
        name: str
        uuid: objects.Uuid

    with pytest.raises(TypeError, match=r'^Named\.uuid must be'):
        base.refuse_untyped(Named(name='n', uuid='raw'))
    # optional: None is allowed, a wrong value still refused
    base.refuse_untyped(Named(name='n', uuid=None), optional=('uuid',))
    with pytest.raises(TypeError, match=r'^Named\.uuid must be'):
        base.refuse_untyped(Named(name='n', uuid='raw'), optional=('uuid',))
    with pytest.raises(TypeError, match=r'^Named\.uuid must be'):
        base.refuse_untyped(Named(name='n', uuid=None), optional=('name',))

    @records.record
    class Pair:
        uuid: objects.Uuid
        type_id: objects.TypeId

    with pytest.raises(TypeError, match=r'^Pair\.type_id must be'):
        base.refuse_untyped(Pair(uuid=None, type_id='raw'),
                            optional=('uuid',))


def test_a_pci_device_whose_vendor_cannot_be_read_is_skipped_saying_so(
        sysfs, caplog):
    write_pci(sysfs, GPU_A, 'sriov_totalvfs', '2\n')
    write_pci(sysfs, GPU_B, 'sriov_totalvfs', '2\n')
    write_pci(sysfs, GPU_A, 'vendor', 'not hex\n')
    with caplog.at_level('WARNING'):
        assert base.nvidia_sriov_pfs(sysfs) == [GPU_B]
    warned = [r for r in caplog.records if r.levelname == 'WARNING']
    assert len(warned) == 1
    assert warned[0].getMessage() == (
        "PCI device 0000:3b:00.0 skipped: Invalid input: 'not hex' is not "
        "a 4-digit hex PCI id")
    # a device without a vendor file is no NVIDIA GPU: skipped silently
    caplog.clear()
    os.unlink(os.path.join(sysfs.pci_dir(GPU_B), 'vendor'))
    with caplog.at_level('WARNING'):
        assert base.nvidia_sriov_pfs(sysfs) == []
    assert not [r for r in caplog.records if '0000:af:00.0' in
                r.getMessage()]
