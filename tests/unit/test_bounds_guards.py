"""bounds behaviours no other test pinned (issue 30, section 6): adjacent
ranges merged, and exactly MAX_INSTANCES accepted wherever a count is
read (bounds, libvirt's node devices, sysfs)."""

import os

import pytest

from libvirt_gpu import bounds
from libvirt_gpu import discovery
from libvirt_gpu import exception
from libvirt_gpu import nodedev
from libvirt_gpu import sysfs as sysfs_mod
from tests.doubles import trees

B = '0000:af:00.0'


@pytest.mark.parametrize('text, ranges', [
    ('0-3,4-7', ((0, 7),)),
    ('4-7,0-3', ((0, 7),)),
    ('0,1,2,3', ((0, 3),)),
    ('0-3,5-7', ((0, 3), (5, 7))),
    ('0-7,^4', ((0, 3), (5, 7))),
    ('0-3,2-9,10', ((0, 10),)),
])
def test_adjacent_and_overlapping_ranges_are_merged(text, ranges):
    """Adjacent ranges become one (broken by merging only overlapping
    ones: ``first <= last`` instead of ``first <= last + 1``)."""
    found = bounds.parse_cpulist(text)
    assert found.ranges == ranges
    assert found == bounds.parse_cpulist(
        ','.join('%d-%d' % r for r in ranges))


def test_merged_lists_compare_and_hash_equal():
    a, b = bounds.parse_cpulist('0-3,4-7'), bounds.parse_cpulist('0-7')
    assert a == b and hash(a) == hash(b) and len(a) == 8


def test_exactly_max_instances_is_accepted():
    """The bound is inclusive (broken by ``>=``)."""
    top = bounds.MAX_INSTANCES
    assert bounds.check_instances(top, 'x') == top
    with pytest.raises(exception.InvalidInput) as e:
        bounds.check_instances(top + 1, 'available_instances')
    assert 'available_instances is %d' % (top + 1) in str(e.value)


def _node_xml(count):
    return ("<device><name>pci_0000_af_00_0</name><capability type='pci'>"
            "<domain>0</domain><bus>175</bus><slot>0</slot>"
            "<function>0</function><product id='0x1eb8'/>"
            "<vendor id='0x10de'/><capability type='mdev_types'>"
            "<type id='nvidia-223'><name>GRID T4-2B</name>"
            "<deviceAPI>vfio-pci</deviceAPI>"
            "<availableInstances>%d</availableInstances></type>"
            "</capability></capability></device>" % count)


def test_libvirt_saying_exactly_max_instances_is_accepted():
    top = bounds.MAX_INSTANCES
    (mtype,) = nodedev.parse_pci(_node_xml(top)).mdev_types
    assert mtype.available_instances == top
    with pytest.raises(exception.InvalidInput):
        nodedev.parse_pci(_node_xml(top + 1))


@pytest.mark.parametrize('share_type_text', [True, False])
def test_sysfs_saying_exactly_max_instances_is_accepted(share_type_text):
    """Both sysfs readers (the fast one and the thorough one) keep a type
    whose ``available_instances`` is the bound, and skip one above it."""
    top = bounds.MAX_INSTANCES
    with trees.simulated_tree('t4') as (root, _):
        sysfs = sysfs_mod.Sysfs(root)
        types = os.path.join(sysfs.pci_dir(B), 'mdev_supported_types')
        path = os.path.join(types, 'nvidia-223', 'available_instances')
        for count, kept in ((top, True), (top + 1, False)):
            with open(path, 'w') as f:
                f.write('%d\n' % count)
            gpu = discovery.from_sysfs(
                sysfs, share_type_text=share_type_text).gpu(B)
            found = {t.id: t.available_instances for t in gpu.mdev_types}
            if kept:
                assert found['nvidia-223'] == top
            else:
                assert 'nvidia-223' not in found
