"""Sysfs findings still open from the round before (issue 30, section 5),
against a simulated T4 host whose kernel answers come from the
simulator's kernel (tests/doubles/kernel_sysfs.py):

- an mdev's ``remove`` linked to another mdev's never removes that one;
- a GPU's ``create`` linked to another GPU's never makes a vGPU there;
- a chain of links: discovery and the allocator's reads refuse it alike,
  at the kernel's bound (40 links);
- an mdev type whose name is no type id (``...``, a ``mdev_type`` link to
  ``..``) is never counted or used;
- ``physfn``/``virtfn0`` leading to the GPU itself: ignored, with a
  warning naming the GPU (it no longer hides the GPU);
- ``numa_node`` out of range: unknown, with a warning.
"""

import logging
import os

import pytest

from libvirt_gpu.devices.backends import base
from libvirt_gpu.devices import discovery
from libvirt_gpu.devices import sysfs as sysfs_mod
from libvirt_gpu.devices.sysfs import devices as devices_mod
from libvirt_gpu.devices.sysfs import reader as reader_mod
from libvirt_gpu import exception
from libvirt_gpu import objects
from tests.doubles import kinds
from tests.doubles import mdev_host

A = objects.PciAddress.parse('0000:3b:00.0')     # no vGPU
B = objects.PciAddress.parse('0000:af:00.0')     # holds two nvidia-223
T223 = objects.TypeId.parse('nvidia-223')
EXISTING = objects.Uuid.parse('4b20d080-1b54-4048-85b3-a6a62d165c01')


tree = mdev_host.tree
sysfs = mdev_host.sysfs
backend = mdev_host.backend


def _gpu_dir(sysfs, address):
    return os.path.realpath(sysfs.pci_dir(address))


def _discover(sysfs):
    return {g.address: g for g in discovery.from_sysfs(
        sysfs, kinds=kinds.registered()).gpus}


def _relink(path, target):
    os.remove(path)
    os.symlink(target, path)


# --- create and remove only through the device's own files -----------------

def test_a_remove_linked_to_another_vgpus_never_removes_it(backend, sysfs):
    mine = base.VgpuDevice(uuid=objects.Uuid.new(), parent=A, type_id=T223)
    assert backend.prepare(mine) is True
    own = os.path.join(os.path.realpath(sysfs.mdev_dir(mine.uuid)), 'remove')
    other = os.path.join(os.path.realpath(sysfs.mdev_dir(EXISTING)),
                         'remove')
    _relink(own, other)
    with pytest.raises(exception.MdevRemoveFailed) as e:
        backend.remove(mine.uuid)
    assert 'leads to %s, not to the file of' % other in str(e.value)
    assert 'nothing written' in str(e.value)
    assert backend.lookup(EXISTING) is not None
    assert all(w.kind != 'remove' for w in sysfs.writes), sysfs.writes


def test_a_create_linked_to_another_gpus_never_makes_a_vgpu_there(
        backend, sysfs):
    own = os.path.join(_gpu_dir(sysfs, A), 'mdev_supported_types',
                       T223, 'create')
    other = os.path.join(_gpu_dir(sysfs, B), 'mdev_supported_types',
                         T223, 'create')
    _relink(own, other)
    before = sysfs.mdevs_by_parent()
    mine = base.VgpuDevice(uuid=objects.Uuid.new(), parent=A, type_id=T223)
    with pytest.raises(exception.MdevCreateFailed) as e:
        backend.prepare(mine)
    assert 'leads to %s' % other in str(e.value)
    assert sysfs.mdevs_by_parent() == before
    assert sysfs.writes == []


def test_the_own_files_are_written(backend, sysfs):
    """The usual case: the create and remove of the device itself."""
    mine = base.VgpuDevice(uuid=objects.Uuid.new(), parent=A, type_id=T223)
    assert backend.prepare(mine) is True
    assert backend.remove(mine.uuid) is True
    assert [w.kind for w in sysfs.writes] == ['create', 'remove']


# --- a chain of links: one rule, one bound ---------------------------------

def _chain(sysfs, address, links):
    """``bus/pci/devices/<address>`` made one link more than ``links``
    chained links to the device's directory."""
    entry = sysfs.pci_dir(address)
    previous = os.path.realpath(entry)
    where = os.path.join(sysfs.root, 'chain')
    os.makedirs(where, exist_ok=True)
    for n in range(links):
        link = os.path.join(where, '%s-%d' % (address, n))
        os.symlink(previous, link)
        previous = link
    _relink(entry, previous)


def _allocator_reads(sysfs, address):
    """What the allocator reads of a GPU (``_sriov_gpu``, ``vgpu_type``,
    ``_near``)."""
    sysfs.physfn(address)
    sysfs.virtfns(address)
    sysfs.read_int(os.path.join(sysfs.types_dir(address), T223,
                                'available_instances'))
    sysfs.locality(address)


def test_a_chain_within_the_kernels_bound_is_read_by_both(sysfs):
    _chain(sysfs, B, reader_mod.MAX_LINKS - 1)    # + the entry: 40
    assert B in _discover(sysfs)
    _allocator_reads(sysfs, B)


def test_a_longer_chain_is_refused_by_both_alike(sysfs, caplog):
    _chain(sysfs, B, reader_mod.MAX_LINKS)        # + the entry: 41
    with caplog.at_level(logging.WARNING):
        found = _discover(sysfs)
    assert B not in found and A in found
    assert reader_mod.TOO_MANY_LINKS in caplog.text
    with pytest.raises(exception.SysfsReadError) as e:
        _allocator_reads(sysfs, B)
    assert reader_mod.TOO_MANY_LINKS in str(e.value)
    assert reader_mod.TOO_MANY_LINKS.startswith('more than 40 symbolic')


# --- names that are no type ids -------------------------------------------

def test_a_type_named_like_a_path_is_never_counted(sysfs, caplog):
    types = os.path.join(_gpu_dir(sysfs, A), 'mdev_supported_types')
    os.makedirs(os.path.join(types, '...'))
    with open(os.path.join(types, '...', 'available_instances'), 'w') as f:
        f.write('99\n')
    assert '...' not in sysfs.mdev_type_ids(A)
    assert T223 in sysfs.mdev_type_ids(A)
    assert all(type(t) is objects.TypeId for t in sysfs.mdev_type_ids(A))
    with caplog.at_level(logging.WARNING):
        gpu = _discover(sysfs)[A]
    assert '...' not in {t.id for t in gpu.mdev_types}
    assert "'...' is not a valid vGPU type id" in caplog.text


def test_an_mdev_whose_type_link_is_dot_dot_is_never_counted(sysfs, caplog):
    link = os.path.join(os.path.realpath(sysfs.mdev_dir(EXISTING)),
                        'mdev_type')
    _relink(link, '..')
    with caplog.at_level(logging.WARNING):
        mdevs = sysfs.mdevs_by_parent()
    assert EXISTING not in {m.uuid for m in mdevs.get(B, [])}
    assert len(mdevs[B]) == 1
    assert 'mdev_type' in caplog.text


# --- links to the GPU itself ----------------------------------------------

def test_a_physfn_leading_to_the_gpu_itself_is_ignored_and_said(
        sysfs, caplog):
    os.symlink('../%s' % A, os.path.join(_gpu_dir(sysfs, A), 'physfn'))
    with caplog.at_level(logging.WARNING):
        gpu = _discover(sysfs)[A]
    assert not gpu.is_vf and gpu.physfn is None
    assert T223 in {t.id for t in gpu.offered_types()}
    said = 'the GPU %s links to itself as its own SR-IOV function' % A
    assert said in caplog.text and '/physfn' in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert sysfs.physfn(A) is None
    assert said in caplog.text


def test_a_virtfn_leading_to_the_gpu_itself_is_ignored_and_said(
        sysfs, caplog):
    os.symlink('../%s' % A, os.path.join(_gpu_dir(sysfs, A), 'virtfn0'))
    with caplog.at_level(logging.WARNING):
        gpu = _discover(sysfs)[A]
    assert gpu.virtfns == () and gpu.vf_gpus == ()
    said = 'the GPU %s links to itself as its own SR-IOV function' % A
    assert said in caplog.text and '/virtfn0' in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert sysfs.virtfns(A) == ()
    assert said in caplog.text


# --- numa_node out of range ------------------------------------------------

@pytest.mark.parametrize('text,node', [
    ('9999999999999999999', None), ('1024', None), ('1023', 1023),
    ('0', 0), ('-1', None)])
def test_an_out_of_range_numa_node_is_unknown(sysfs, caplog, text, node):
    with open(os.path.join(_gpu_dir(sysfs, A), 'numa_node'), 'w') as f:
        f.write(text + '\n')
    with caplog.at_level(logging.WARNING):
        assert _discover(sysfs)[A].numa_node == node
        assert sysfs.locality(A)[0] == node
    out_of_range = node is None and text != '-1'
    assert ('%s is no NUMA node' % text in caplog.text) == out_of_range
    assert devices_mod.MAX_NUMA_NODE == 1023
    assert sysfs_mod.Sysfs(sysfs.root).read_gpu(A).numa_node == node


@pytest.mark.parametrize('text', ['abc', '', '1.5', '-2'])
def test_a_numa_node_that_is_no_number_is_unknown_where_nearness_asks(
        sysfs, caplog, text):
    # the allocator asks locality() of a VF or GPU for a pinned guest:
    # an unreadable node is a lost preference, not a refused reservation
    path = os.path.join(_gpu_dir(sysfs, A), 'numa_node')
    with open(os.path.join(_gpu_dir(sysfs, A), 'local_cpulist'), 'w') as f:
        f.write('0-3,8\n')
    local_cpus = sysfs.locality(A)[1]
    assert local_cpus                       # read before the damage
    with open(path, 'w') as f:
        f.write(text + '\n')
    with caplog.at_level(logging.WARNING):
        node, cpus = sysfs.locality(A)
    assert node is None
    assert cpus == local_cpus               # still read
    assert 'numa_node' in caplog.text
    assert 'the node is taken as unknown' in caplog.text
