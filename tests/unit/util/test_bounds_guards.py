"""bounds behaviours no other test pinned (issue 30, section 6): adjacent
ranges merged, and exactly MAX_INSTANCES accepted wherever a count is
read (bounds, libvirt's node devices, sysfs)."""

import os

import pytest

from libvirt_gpu import objects
from libvirt_gpu.util import bounds
from libvirt_gpu.devices import discovery
from libvirt_gpu import exception
from libvirt_gpu.virt import nodedev
from libvirt_gpu.devices import sysfs as sysfs_mod
from tests.doubles import kinds
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
                sysfs, share_type_text=share_type_text,
                kinds=kinds.registered()).gpu(objects.PciAddress.parse(B))
            found = {t.id: t.available_instances for t in gpu.mdev_types}
            if kept:
                assert found['nvidia-223'] == top
            else:
                assert 'nvidia-223' not in found


# --- found by `make mutation` on bounds.py ----------------------------------

@pytest.mark.parametrize('text, ranges', [
    ('0-15,^3-5,^10', ((0, 2), (6, 9), (11, 15))),
    ('0-3,8-11,^2-9', ((0, 1), (10, 11))),
    ('0-3,^0-3', ()),
    ('0-3,^5', ((0, 3),)),
    ('4-7,^0-4', ((5, 7),)),
    ('0-9,^3,^4,^5', ((0, 2), (6, 9))),
    ('0-1,3-4,6-7,^1-6', ((0, 0), (7, 7))),
    ('0-2,^2', ((0, 1),)),
    ('0-1,10-20,^2-3,^11,^15', ((0, 1), (10, 10), (12, 14), (16, 20))),
    ('0-1,20-30,^2,^4,^6,^25', ((0, 1), (20, 24), (26, 30))),
    ('5,^5', ()),
    (' 0 - 3 , 5 ', ((0, 3), (5, 5))),
    ('0-3,,5', ((0, 3), (5, 5))),
    ('', ()),
    (None, ()),
])
def test_exclusions_are_cut_out_of_the_ranges(text, ranges):
    assert bounds.parse_cpulist(text).ranges == ranges


def test_the_largest_cpu_number_is_accepted_and_one_more_refused():
    top = bounds.MAX_CPU - 1
    assert bounds.parse_cpulist('%d' % top).ranges == ((top, top),)
    assert bounds.parse_cpulist('0-%d' % top).ranges == ((0, top),)
    with pytest.raises(exception.InvalidInput) as e:
        bounds.parse_cpulist('%d' % bounds.MAX_CPU, 'cpuset')
    assert str(e.value).endswith(
        "cpuset '%d' is not a list of numbers and ranges (0-15,32) below %d"
        % (bounds.MAX_CPU, bounds.MAX_CPU))


@pytest.mark.parametrize('bad', [
    '1-', '-1', 'a', '1-a', '3-1', '1.5', '١', '0000001', '1-0000002',
    '1--2', '^'])
def test_what_is_not_a_number_or_range_is_refused(bad):
    with pytest.raises(exception.InvalidInput) as e:
        bounds.parse_cpulist(bad, 'nodeset')
    assert "nodeset %r is not a list of numbers" % bad in str(e.value)


def test_the_default_name_in_a_refusal():
    with pytest.raises(exception.InvalidInput) as e:
        bounds.parse_cpulist('x' * 50)
    assert str(e.value).endswith(
        "cpulist %r is not a list of numbers and ranges (0-15,32) below %d"
        % ('x' * 40, bounds.MAX_CPU))


def test_six_digits_are_read():
    assert bounds.parse_cpulist('000001-000002').ranges == ((1, 2),)


def test_the_longest_text_is_accepted_and_one_character_more_refused():
    longest = ('0,' * bounds.MAX_CPULIST_PARTS)[:bounds.MAX_CPULIST_CHARS]
    longest = longest.rstrip(',').ljust(bounds.MAX_CPULIST_CHARS, ' ')
    assert bounds.parse_cpulist(longest).ranges == ((0, 0),)
    with pytest.raises(exception.InvalidInput) as e:
        bounds.parse_cpulist(longest + ' ', 'cpuset')
    assert str(e.value).endswith(
        'cpuset is %d characters long, more than the %d allowed'
        % (bounds.MAX_CPULIST_CHARS + 1, bounds.MAX_CPULIST_CHARS))


def test_the_most_parts_are_accepted_and_one_more_refused():
    most = ','.join(['1'] * bounds.MAX_CPULIST_PARTS)
    assert bounds.parse_cpulist(most).ranges == ((1, 1),)
    with pytest.raises(exception.InvalidInput) as e:
        bounds.parse_cpulist(most + ',1', 'cpuset')
    assert str(e.value).endswith(
        'cpuset has %d parts, more than the %d allowed'
        % (bounds.MAX_CPULIST_PARTS + 1, bounds.MAX_CPULIST_PARTS))


def test_the_instances_message_names_the_count_and_the_bound():
    with pytest.raises(exception.InvalidInput) as e:
        bounds.check_instances(bounds.MAX_INSTANCES + 1, 'max_instance')
    assert str(e.value).endswith(
        'max_instance is %d, more than the %d instances of one type a GPU '
        'can hold' % (bounds.MAX_INSTANCES + 1, bounds.MAX_INSTANCES))


def test_a_cpu_list_answers_membership_overlap_and_length():
    cpus = bounds.parse_cpulist('0-3,8-11,20')
    members = [n for n in range(25) if n in cpus]
    assert members == [0, 1, 2, 3, 8, 9, 10, 11, 20]
    assert len(cpus) == 9 and cpus and not bounds.EMPTY
    assert cpus == {0, 1, 2, 3, 8, 9, 10, 11, 20}
    assert cpus != {0, 1, 2, 3, 8, 9, 10, 11, 21}
    assert cpus != {0, 1, 2, 3, 8, 9, 10, 11}
    assert (cpus == 'x') is False
    assert cpus.intersects(bounds.parse_cpulist('4-8'))
    assert cpus.intersects(bounds.parse_cpulist('12-19,20'))
    assert not cpus.intersects(bounds.parse_cpulist('4-7,12-19,21'))
    assert not bounds.parse_cpulist('4-7').intersects(cpus)
    assert cpus.intersects({11}) and not cpus.intersects({12, 13})
    assert not cpus.intersects(bounds.EMPTY)
    assert repr(bounds.parse_cpulist('1-2')) == 'CpuList(((1, 2),))'
    assert hash(cpus) != hash(bounds.parse_cpulist('0-3'))
