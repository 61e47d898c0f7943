"""The tests' in-process kernel (tests/doubles/kernel_sysfs.py) answers as
SimKernel, the one rule book, does.

Each test pins a rule of the kernel that a simpler emulation gets wrong
(earlier ones here did), and that the tree it leaves is the one
``write_sysfs`` writes for the same state.
"""

import errno
import json
import os

import pytest

from libvirt_gpu import exception
from libvirt_gpu import simulator
from libvirt_gpu.simulator import loading
from tests.doubles import kernel_sysfs
from tests.doubles import trees
from libvirt_gpu.devices.backends.nvidia_vgpu.files import (
    VendorFiles as vendor)

A = '0000:3b:00.0'          # T4, empty
B = '0000:af:00.0'          # T4, holds two nvidia-223
EXISTING = '4b20d080-1b54-4048-85b3-a6a62d165c01'
NEW = '5b2b1d6a-1c2e-4c3e-9c1f-3f1a7c0e6d21'
A100 = '0000:41:00.0'
A100_OFF = '0000:c1:00.0'   # its 16 VFs are not enabled in the profile


@pytest.fixture
def t4():
    with trees.simulated_tree('t4') as (root, profile):
        yield kernel_sysfs.KernelSysfs(root, profile)


@pytest.fixture
def a100():
    with trees.simulated_tree('a100') as (root, profile):
        yield kernel_sysfs.KernelSysfs(root, profile)


def create(sysfs, parent, data, type_id='nvidia-223'):
    sysfs.write(os.path.join(sysfs.types_dir(parent), type_id, 'create'),
                data)


def remove(sysfs, uuid, data='1'):
    sysfs.write(os.path.join(sysfs.mdev_dir(uuid), 'remove'), data)


def numvfs(sysfs, pf, data):
    sysfs.write(os.path.join(sysfs.pci_dir(pf), 'sriov_numvfs'), data)


def refused(call, *args):
    with pytest.raises(exception.SysfsWriteError) as info:
        call(*args)
    return info.value.kwargs['errno']


def test_create_parses_the_uuid_as_guid_parse_does(t4):
    # hex digits in either case: created, named in lowercase
    create(t4, A, NEW.upper())
    assert NEW in t4.kernel.mdevs()
    # a 37th byte is ignored whatever it is, not only a newline
    other = '6b2b1d6a-1c2e-4c3e-9c1f-3f1a7c0e6d21'
    create(t4, A, other + 'x')
    assert other in t4.kernel.mdevs()
    # more than 37 bytes is EINVAL, even when the rest is whitespace
    third = '7b2b1d6a-1c2e-4c3e-9c1f-3f1a7c0e6d21'
    assert refused(create, t4, A, '  ' + third + '\n') == errno.EINVAL
    assert third not in t4.kernel.mdevs()


def test_remove_parses_as_kstrtoul(t4):
    # kstrtoul(buf, 0): "01" (octal) and "0x1" remove; "0" does nothing;
    # anything else is EINVAL
    create(t4, A, NEW)
    remove(t4, NEW, '0')
    assert NEW in t4.kernel.mdevs()
    assert refused(remove, t4, NEW, 'yes') == errno.EINVAL
    remove(t4, NEW, '01\n')
    assert NEW not in t4.kernel.mdevs()
    remove(t4, EXISTING, '0x1')
    assert EXISTING not in t4.kernel.mdevs()


def test_an_mdev_group_goes_with_its_last_device(t4):
    # an empty group does not stay behind
    create(t4, A, NEW)
    group = os.path.basename(os.readlink(os.path.join(t4.mdev_dir(NEW),
                                                      'iommu_group')))
    groups = os.path.join(t4.root, 'kernel', 'iommu_groups')
    assert os.listdir(os.path.join(groups, group, 'devices')) == [NEW]
    remove(t4, NEW)
    assert group not in os.listdir(groups)


def test_a_new_group_is_the_lowest_free_one(t4):
    # The kernel's group ids come from an IDA: a freed id is used again
    # (not the highest in use + 1).
    def group(uuid):
        return int(os.path.basename(os.readlink(
            os.path.join(t4.mdev_dir(uuid), 'iommu_group'))))
    first, second = NEW, '6b2b1d6a-1c2e-4c3e-9c1f-3f1a7c0e6d21'
    create(t4, A, first)
    create(t4, A, second)
    freed = group(first)
    assert group(second) > freed
    remove(t4, first)
    create(t4, A, '7b2b1d6a-1c2e-4c3e-9c1f-3f1a7c0e6d21')
    assert group('7b2b1d6a-1c2e-4c3e-9c1f-3f1a7c0e6d21') == freed


def test_a_parent_being_unregistered_answers_enodev(t4):
    # class/mdev_bus/<parent> goes first when its driver unbinds
    os.unlink(os.path.join(t4.root, 'class', 'mdev_bus', A))
    assert refused(create, t4, A, NEW) == errno.ENODEV
    assert t4.writes[-1] == ('create', (A, 'nvidia-223'), errno.ENODEV)


def test_a_refused_create_leaves_no_stale_count(t4):
    path = os.path.join(t4.types_dir(B), 'nvidia-223', 'available_instances')
    for i in range(6):
        create(t4, B, '%08x-1c2e-4c3e-9c1f-3f1a7c0e6d21' % i)
    with open(path, 'w') as f:
        f.write('1\n')
    assert refused(create, t4, B, NEW) == errno.EINVAL   # NVIDIA's answer
    assert t4.read_int(path) == 0


def test_vfs_share_their_gpu_in_every_file(a100):
    # creating on one VF lowers what its sibling VFs' files show
    # (not only the parent's own files, judged alone)
    vfs = [str(vf) for vf in a100.virtfns(A100)]
    free = [vf for vf in vfs if not os.path.exists(os.path.join(
        a100.types_dir(vf), 'nvidia-472', 'devices')) or not os.listdir(
        os.path.join(a100.types_dir(vf), 'nvidia-472', 'devices'))]

    def avail(vf):
        return a100.read_int(os.path.join(a100.types_dir(vf), 'nvidia-472',
                                          'available_instances'))
    assert avail(free[1]) == 1
    create(a100, free[0], NEW, type_id='nvidia-472')
    assert {avail(vf) for vf in vfs} == {0}       # A100-20C: 2 per GPU
    remove(a100, NEW)
    assert avail(free[1]) == 1


def test_sriov_numvfs_parses_as_kstrtou16(a100):
    # base 0 as well, not decimal digits only; above u16 is ERANGE
    assert refused(numvfs, a100, A100_OFF, '0x11') == errno.ERANGE
    assert refused(numvfs, a100, A100_OFF, '70000') == \
        errno.ERANGE
    assert refused(numvfs, a100, A100_OFF, 'two') == errno.EINVAL
    numvfs(a100, A100_OFF, '0x2')
    assert len(a100.virtfns(A100_OFF)) == 2
    assert a100.writes[-1] == ('sriov_numvfs', (A100_OFF, '0x2'), 0)


def test_enabled_vfs_are_parents_with_full_capacity(a100):
    a100.set_sriov_numvfs(A100_OFF, 2)
    vf = str(a100.virtfns(A100_OFF)[0])
    create(a100, vf, NEW, type_id='nvidia-472')
    assert a100.kernel.mdevs()[NEW][1] == 'nvidia-472'
    assert refused(a100.set_sriov_numvfs, A100_OFF, 0) == errno.EBUSY
    remove(a100, NEW)
    a100.set_sriov_numvfs(A100_OFF, 0)
    assert not os.path.exists(os.path.join(a100.root, 'class', 'mdev_bus',
                                           vf))


def test_two_processes_share_one_kernel(t4):
    # Another KernelSysfs on the tree (another process) sees this one's
    # mdevs: the state is the tree, the rules are SimKernel's.
    other = kernel_sysfs.KernelSysfs(t4.root, t4.profile)
    create(t4, A, NEW)
    assert refused(create, other, A, NEW) == errno.EEXIST
    remove(other, NEW)
    assert NEW not in t4.kernel.mdevs()


# --- the tree after writes is the static writer's tree of that state --------

def _static(tmp_path, name, change):
    """``write_sysfs``'s tree of bundled profile ``name`` after
    ``change(data)``, as a snapshot."""
    with open(os.path.join(loading.profile_dir(), name + '.json')) as f:
        data = json.load(f)
    change(data)
    root = str(tmp_path / name)
    simulator.write_sysfs(loading.profile_from_dict(data), root)
    return trees.snapshot(root)


def _entry(data, address):
    (entry,) = [d for d in data['devices'] if d['address'] == address]
    return entry


def _snapshot(sysfs):
    return trees.snapshot(sysfs.root, skip=('config', kernel_sysfs.LOCK_NAME))


def test_a100_tree_after_writes_is_the_static_writers(tmp_path):
    with trees.simulated_tree('a100') as (root, profile):
        sysfs = kernel_sysfs.KernelSysfs(root, profile)
        vf = str(sysfs.virtfns(A100)[5])
        create(sysfs, vf, NEW, type_id='nvidia-472')
        numvfs(sysfs, A100_OFF, '16')

        def change(data):
            _entry(data, vf)['mdevs'] = [{'uuid': NEW,
                                          'type_id': 'nvidia-472'}]
            _entry(data, A100_OFF)['sriov_numvfs'] = 16
        assert _snapshot(sysfs) == _static(tmp_path, 'a100', change)


def test_l40s_tree_after_writes_is_the_static_writers(tmp_path):
    with trees.simulated_tree('l40s') as (root, profile):
        sysfs = kernel_sysfs.KernelSysfs(root, profile)
        vf = str(sysfs.virtfns('0000:bd:00.0')[2])
        vendor(sysfs).set_current_type(vf, 1155)

        def change(data):
            _entry(data, vf)['held_type'] = 'nvidia-1155'
        assert _snapshot(sysfs) == _static(tmp_path, 'l40s', change)


def test_t4_tree_after_create_and_remove_is_the_static_writers(tmp_path):
    # (the static writer numbers mdev groups in profile order, the kernel
    # takes the lowest free one: this sequence keeps them the same)
    other = '6b2b1d6a-1c2e-4c3e-9c1f-3f1a7c0e6d21'
    with trees.simulated_tree('t4') as (root, profile):
        sysfs = kernel_sysfs.KernelSysfs(root, profile)
        create(sysfs, B, NEW)
        create(sysfs, A, other, type_id='nvidia-222')
        remove(sysfs, other)

        def change(data):
            _entry(data, B)['mdevs'].append({'uuid': NEW,
                                             'type_id': 'nvidia-223'})
        assert _snapshot(sysfs) == _static(tmp_path, 't4', change)
