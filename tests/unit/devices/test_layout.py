"""A GPU's layout in the configuration: every rule of ``[layout_<name>]``
(devices/layout.py, conf/layout.py), on the configuration alone, against
the host's GPUs, and against what a GPU reports (``GpuFacts``, as NVML
gives them; the H100's GI profiles are those of a real H100, ``nvidia-smi
mig -lgip``)."""

import textwrap

import pytest

from libvirt_gpu import conf as conf_mod
from libvirt_gpu.devices import layout
from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.util import records
from tests.doubles import fakes
from tests.doubles import layouts
import types
from tests.doubles.layout_facts import (
    H100, H100_B, H100_TYPES, L40S, h100_facts, layout_of, vtype)


def load(tmp_path, text):
    path = tmp_path / 'libvirt-gpu.conf'
    path.write_text(textwrap.dedent(text))
    return conf_mod.load(str(path))


def one(tmp_path, body, layouts='one'):
    conf = load(tmp_path, '[gpu]\nlayouts = %s\n[layout_one]\n%s'
                % (layouts, textwrap.dedent(body)))
    return layout.read_layouts(conf)[0]


MIG = textwrap.dedent("""
    gpus = 10de:2331
    mode = mig
    gpu_instances = 1g.10gb:4, 3g.40gb:1
    vgpu_types = nvidia-1150, nvidia-1152
    """)


# --- the configuration alone ----------------------------------------------

def test_a_layout_is_read_into_records(tmp_path):
    found = one(tmp_path, MIG)
    assert found.mode == layout.MIG and found.mig
    assert found.gpus == (objects.GpuSelector.parse('10de:2331'),)
    assert found.gpu_instances == (layout.GiCount('1g.10gb', 4),
                                   layout.GiCount('3g.40gb', 1))
    assert found.vgpu_types == ('nvidia-1150', 'nvidia-1152')
    assert found.scheduler is None


def refused(tmp_path, body, match):
    with pytest.raises(exception.ConfigError, match=match) as e:
        one(tmp_path, body)
    assert '\n' not in str(e.value)
    return str(e.value)


def test_the_error_names_the_file_and_the_option(tmp_path):
    message = refused(tmp_path, MIG + 'scheduler = equal-share\n',
                      r'\[layout_one\]/scheduler')
    assert str(tmp_path / 'libvirt-gpu.conf') in message


def test_a_scheduler_on_a_mig_mode_is_refused(tmp_path):
    refused(tmp_path, MIG + 'scheduler = best-effort\n',
            'mode mig gives each vGPU a GPU instance of its own')


def test_a_scheduler_on_mig_time_sliced_is_taken(tmp_path):
    found = one(tmp_path, MIG.replace('mode = mig', 'mode = mig-time-sliced')
                + 'scheduler = equal-share\ntime_slice_ms = 4\n')
    assert layout.wanted_scheduler(found) == layout.Scheduler(
        'equal-share', 4)


def test_fixed_share_with_mixed_sizes_is_refused(tmp_path):
    refused(tmp_path, """
        gpus = 0000:61:00.0
        mode = mixed-size
        vgpu_types = nvidia-1160:2, nvidia-1161:2
        scheduler = fixed-share
        """, 'fixed-share does not work with mixed sizes')


def test_gpu_instances_outside_the_mig_modes_are_refused(tmp_path):
    refused(tmp_path, """
        gpus = 0000:61:00.0
        mode = time-sliced
        gpu_instances = 1g.10gb:1
        vgpu_types = nvidia-1160
        """, 'exist only in the MIG modes')


def test_a_mig_mode_without_gpu_instances_is_refused(tmp_path):
    refused(tmp_path, """
        gpus = 10de:2331
        mode = mig
        vgpu_types = nvidia-1150
        """, 'needs GPU instances')


def test_a_layout_without_types_is_refused(tmp_path):
    refused(tmp_path, """
        gpus = 10de:2331
        mode = time-sliced
        """, r'vgpu_types: names no vGPU type')


def test_a_layout_without_gpus_is_refused(tmp_path):
    refused(tmp_path, """
        mode = time-sliced
        vgpu_types = nvidia-1160
        """, r'gpus is empty: name the GPUs')


def test_a_bad_gpu_is_refused_naming_the_option(tmp_path):
    with pytest.raises(exception.ConfigError, match=r'\[layout_one\]/gpus'):
        one(tmp_path, 'gpus = nvidia\nvgpu_types = nvidia-1160\n')


@pytest.mark.parametrize('text', ['1g.10gb:0', '1g.10gb:x', ':3',
                                  # digits that are not ASCII: int()
                                  # refuses the first, reads the second
                                  # as 3
                                  '1g.10gb:\u00b2', '1g.10gb:\u0663',
                                  '1g.10gb:65', '1g.10gb:' + '9' * 4000])
def test_a_bad_gi_count_is_refused(tmp_path, text):
    refused(tmp_path, MIG.replace('1g.10gb:4, 3g.40gb:1', text),
            r'gpu_instances: .* is not <profile>:<count>')


def test_a_profile_twice_is_refused(tmp_path):
    refused(tmp_path, MIG.replace('3g.40gb:1', '1g.10gb:1'),
            'lists 1g.10gb twice')


def test_a_time_slice_needs_equal_or_fixed_share(tmp_path):
    refused(tmp_path, """
        gpus = 0000:61:00.0
        vgpu_types = nvidia-1160
        scheduler = best-effort
        time_slice_ms = 4
        """, 'a time slice needs scheduler = equal-share or fixed-share')


def test_a_time_slice_out_of_range_is_refused(tmp_path):
    with pytest.raises(exception.ConfigError, match='time_slice_ms'):
        one(tmp_path, 'gpus = 0000:61:00.0\nvgpu_types = nvidia-1160\n'
                      'scheduler = equal-share\ntime_slice_ms = 31\n')


def test_a_bad_layout_name_is_refused(tmp_path):
    with pytest.raises(exception.ConfigError, match='not a layout name'):
        load(tmp_path, '[gpu]\nlayouts = Bad/Name\n')


def test_a_typo_in_a_layout_section_is_named(tmp_path):
    with pytest.raises(exception.ConfigError,
                       match='unknown option .*gpu_instance; did you mean '
                             'gpu_instances'):
        one(tmp_path, MIG + 'gpu_instance = 1g.10gb:1\n')


def test_a_section_of_no_listed_layout_is_refused(tmp_path):
    with pytest.raises(exception.ConfigError,
                       match=r'unknown section \[layout_two\]'):
        load(tmp_path, '[gpu]\nlayouts = one\n[layout_one]\n%s'
                       '[layout_two]\ngpus = 10de:2331\n'
                       % textwrap.dedent(MIG))


# --- against the host's GPUs ------------------------------------------------

GPUS = (fakes.gpu(H100, types=(), product_id='2331'),
        fakes.gpu(H100_B, types=(), product_id='2331'),
        fakes.gpu(L40S, types=(), product_id='26b9'))


def two(tmp_path, first, second, extra=''):
    return load(tmp_path, '[gpu]\nlayouts = one, two\n%s[layout_one]\n%s'
                '[layout_two]\n%s' % (extra, textwrap.dedent(first),
                                      textwrap.dedent(second)))


L40S_BODY = textwrap.dedent("""
    gpus = 0000:61:00.0
    mode = mixed-size
    vgpu_types = nvidia-1160:2, nvidia-1161:2
    """)


def test_claims_by_model_and_by_address(tmp_path):
    conf = two(tmp_path, MIG, L40S_BODY)
    claimed = layout.claims(layout.read_layouts(conf), GPUS)
    assert {str(a): lay.name for a, lay in claimed.items()} == {
        H100: 'one', H100_B: 'one', L40S: 'two'}


def test_one_layout_naming_a_gpu_by_address_and_by_model_holds_it_once(
        tmp_path):
    """Defined, not refused: the GPU is in that one layout (a GPU is
    refused only when two layouts match it)."""
    conf = load(tmp_path, '[gpu]\nlayouts = one\n[layout_one]\n%s'
                % textwrap.dedent(MIG).replace(
                    'gpus = 10de:2331', 'gpus = %s, 10de:2331' % H100))
    (lay,) = layout.read_layouts(conf)
    assert [str(s) for s in lay.gpus] == [H100, '10de:2331']
    claimed = layout.claims((lay,), GPUS)
    assert {str(a): found.name for a, found in claimed.items()} == {
        H100: 'one', H100_B: 'one'}
    # and by its address in one layout, by its model in another: refused
    conf = two(tmp_path, MIG, L40S_BODY.replace('0000:61:00.0', H100))
    with pytest.raises(exception.ConfigError, match='matched by two'):
        layout.claims(layout.read_layouts(conf), GPUS)


def test_a_gpu_matched_by_two_layouts_is_refused(tmp_path):
    conf = two(tmp_path, MIG, L40S_BODY.replace('0000:61:00.0', H100))
    with pytest.raises(exception.ConfigError,
                       match='GPU 0000:41:00.0 is matched by two layouts, '
                             r'\[layout_one\] and \[layout_two\]'):
        layout.claims(layout.read_layouts(conf), GPUS)


def test_an_address_with_no_gpu_is_refused(tmp_path):
    conf = two(tmp_path, MIG, L40S_BODY.replace('61', '62'))
    with pytest.raises(exception.ConfigError,
                       match=r'\[layout_two\]/gpus names 0000:62:00.0, but '
                             'this host has no GPU there'):
        layout.claims(layout.read_layouts(conf), GPUS)


def test_a_gpu_in_a_layout_offers_the_layouts_type(tmp_path):
    conf = two(tmp_path, MIG, L40S_BODY)
    enabled = layouts.enabled(conf, GPUS)
    # the first type is the GPU's, the others follow it
    assert enabled[objects.PciAddress.parse(H100)] == objects.EnabledType(
        objects.TypeId.parse('nvidia-1150'), others=(objects.EnabledType(
            objects.TypeId.parse('nvidia-1152')),))
    # a mixed-size layout's counts are the types' limits
    mixed = enabled[objects.PciAddress.parse(L40S)]
    assert mixed.type_ids == ('nvidia-1160', 'nvidia-1161')
    assert [t.max_instances for t in mixed.types] == [2, 2]


def test_a_layout_type_takes_its_vgpu_section(tmp_path):
    conf = two(tmp_path, MIG, L40S_BODY, extra=(
        'enabled_vgpu_types = nvidia-1150\n[vgpu_nvidia-1150]\n'
        'resource_class = CUSTOM_H100_1_10C\nmax_instances = 3\n'))
    enabled = layouts.enabled(conf, GPUS)
    assert enabled[objects.PciAddress.parse(H100)] == objects.EnabledType(
        objects.TypeId.parse('nvidia-1150'), 'CUSTOM_H100_1_10C', 3,
        others=(objects.EnabledType(objects.TypeId.parse('nvidia-1152')),))


@pytest.mark.parametrize('limit, taken', [(1, 1), (2, 2), (5, 2)])
def test_the_smaller_of_a_count_and_max_instances_is_the_limit(
        tmp_path, limit, taken):
    conf = two(tmp_path, MIG, L40S_BODY, extra=(
        'enabled_vgpu_types = nvidia-1161\n[vgpu_nvidia-1161]\n'
        'resource_class = CUSTOM_L40S_2Q\nmax_instances = %d\n' % limit))
    mixed = layouts.enabled(conf, GPUS)[objects.PciAddress.parse(L40S)]
    assert [(t.type_id, t.resource_class, t.max_instances)
            for t in mixed.types] == [('nvidia-1160', 'VGPU', 2),
                                      ('nvidia-1161', 'CUSTOM_L40S_2Q', taken)]


def test_a_gpu_in_a_layout_and_in_device_addresses_is_refused(tmp_path):
    conf = two(tmp_path, MIG, L40S_BODY, extra=(
        'enabled_vgpu_types = nvidia-1160\n[vgpu_nvidia-1160]\n'
        'device_addresses = 0000:61:00.0\n'))
    with pytest.raises(exception.ConfigError,
                       match=r'names 0000:61:00.0, which is in layout '
                             r'\[layout_two\]'):
        layouts.enabled(conf, GPUS)


def test_a_type_everywhere_leaves_the_layout_gpus_alone(tmp_path):
    # both GPUs offer nvidia-223; the one in a layout gets the layout's type
    gpus = (fakes.gpu(H100, product_id='2331'), fakes.gpu('0000:81:00.0'))
    conf = load(tmp_path, '[gpu]\nenabled_vgpu_types = nvidia-223\n'
                'layouts = one\n[layout_one]\n' + MIG)
    enabled = layouts.enabled(conf, gpus)
    assert enabled[objects.PciAddress.parse('0000:81:00.0')].type_id == \
        'nvidia-223'
    assert enabled[objects.PciAddress.parse(H100)].type_id == 'nvidia-1150'


def test_no_layouts_resolve_as_before(tmp_path):
    conf = load(tmp_path, '[gpu]\nenabled_vgpu_types = nvidia-223\n')
    assert set(layouts.enabled(conf, [fakes.gpu()])) == {
        objects.PciAddress.parse('0000:af:00.0')}


# --- against what the GPU reports -------------------------------------------

def test_a_layout_the_gpu_holds_passes():
    assert layout.check(layout_of(), h100_facts()) == layout_of()
    # every slice and memory slice used: 4 + 3 compute, 4 + 4 memory
    layout.check(layout_of(gis=(('4g.40gb', 1), ('3g.40gb', 1)),
                           types=(1152,)), h100_facts())
    layout.check(layout_of(gis=(('1g.10gb', 7),), types=(1150,)),
                 h100_facts())


def refused_by_gpu(lay, match, facts=None):
    with pytest.raises(layout.LayoutError, match=match) as e:
        layout.check(lay, facts or h100_facts())
    assert '0000:41:00.0' in str(e.value) and '\n' not in str(e.value)
    return str(e.value)


def test_a_profile_the_gpu_lacks_is_refused_naming_its_profiles():
    message = refused_by_gpu(layout_of(gis=(('1g.5gb', 1),), types=()),
                             'has no GI profile 1g.5gb')
    assert '1g.10gb+me' in message and '7g.80gb' in message


def test_more_of_a_profile_than_the_gpu_holds_is_refused():
    refused_by_gpu(layout_of(gis=(('1g.10gb+me', 2),), types=()),
                   r'2 x 1g.10gb\+me, but the GPU holds at most 1')


def test_too_many_compute_slices_are_refused():
    refused_by_gpu(layout_of(gis=(('4g.40gb', 1), ('2g.20gb', 2)),
                             types=()),
                   'needs 8 compute slices and 8 memory slices; the GPU '
                   'has 7 and 8')


def test_too_much_memory_is_refused():
    # 3 + 3 + 1 compute slices fit, 4 + 4 + 1 memory slices do not
    refused_by_gpu(layout_of(gis=(('3g.40gb', 2), ('1g.10gb', 1)),
                             types=()),
                   'needs 7 compute slices and 9 memory slices')


def test_a_type_the_gpu_does_not_support_is_refused_naming_its_types():
    message = refused_by_gpu(layout_of(types=(9999,)),
                             'does not support nvidia-9999')
    assert 'nvidia-1150 (NVIDIA H100-1-10C)' in message
    assert 'nvidia-1160' not in message      # a time-sliced one


def test_a_time_sliced_type_on_a_mig_gpu_is_refused():
    refused_by_gpu(layout_of(types=(1150, 1160)),
                   'nvidia-1160 is time-sliced, and with MIG on the GPU '
                   'offers only MIG-backed types')


def test_a_mig_backed_type_on_a_time_sliced_gpu_is_refused():
    refused_by_gpu(layout_of(mode='time-sliced', gis=(), types=(1150,)),
                   'nvidia-1150 is MIG-backed', facts=h100_facts(mig=False))


def test_a_type_whose_gi_profile_is_not_in_the_layout_is_refused():
    refused_by_gpu(layout_of(types=(1150, 1153)),
                   'nvidia-1153 lives in 2g.20gb GPU instances, and '
                   r'\[layout_one\]/gpu_instances makes none')


def test_time_sliced_types_of_two_sizes_need_mixed_size():
    lay = layout_of(mode='time-sliced', gis=(), types=(1160, 1161))
    refused_by_gpu(lay, 'use mode mixed-size', facts=h100_facts(mig=False))
    layout.check(layout_of(mode='mixed-size', gis=(), types=(1160, 1161)),
                 h100_facts(mig=False))


def test_mig_on_a_gpu_without_profiles_is_refused():
    facts = layout.GpuFacts(address=objects.PciAddress.parse(H100),
                            mig=None, types=H100_TYPES)
    refused_by_gpu(layout_of(), 'reports no GPU-instance profiles',
                   facts=facts)


# --- the scheduler at module load --------------------------------------------

def test_rmpvmrl_values():
    assert layout.rmpvmrl(layout.Scheduler('best-effort')) == 0x00
    assert layout.rmpvmrl(layout.Scheduler('equal-share')) == 0x01
    assert layout.rmpvmrl(layout.Scheduler('fixed-share')) == 0x11
    assert layout.rmpvmrl(layout.Scheduler('equal-share', 3)) == 0x00030001
    assert layout.rmpvmrl(layout.Scheduler('fixed-share', 30)) == 0x001E0011


def test_the_module_option_line():
    a = objects.PciAddress.parse(H100)
    b = objects.PciAddress.parse(L40S)
    equal = layout.Scheduler('equal-share')
    assert layout.module_option({}) is None
    assert layout.module_option({a: equal, b: equal}, every_gpu=True) == \
        'options nvidia NVreg_RegistryDwords="RmPVMRL=0x1"'
    assert layout.module_option({a: equal, b: equal}) == (
        'options nvidia NVreg_RegistryDwordsPerDevice="pci=0000:41:00.0;'
        'RmPVMRL=0x1;pci=0000:61:00.0;RmPVMRL=0x1"')
    assert 'RmPVMRL=0x11' in layout.module_option(
        {a: equal, b: layout.Scheduler('fixed-share')}, every_gpu=True)


# --- several types on one GPU ----------------------------------------------

MIXED = textwrap.dedent("""
    gpus = 10de:2331
    mode = mixed-size
    """)


def test_types_take_counts(tmp_path):
    found = one(tmp_path,
                MIXED + 'vgpu_types = nvidia-1160:3, nvidia-1161:2\n')
    assert found.vgpu_types == ('nvidia-1160', 'nvidia-1161')
    assert found.type_counts == (3, 2)
    assert found.count(objects.TypeId.parse('nvidia-1161')) == 2
    assert found.count(objects.TypeId.parse('nvidia-1162')) is None
    # a count is optional where one type is listed
    assert one(tmp_path, MIXED + 'vgpu_types = nvidia-1160\n'
               ).type_counts == (None,)


@pytest.mark.parametrize('text', ['nvidia-1160:0', 'nvidia-1160:x',
                                  'nvidia-1160:-1', 'nvidia-1160:1025',
                                  'nvidia-1160:', 'nvidia-1160:\u00b2',
                                  'nvidia-1160:\u0663',
                                  'nvidia-1160:\uff13'])
def test_a_bad_count_is_refused(tmp_path, text):
    refused(tmp_path, MIXED + 'vgpu_types = %s\n' % text,
            r'\[layout_one\]/vgpu_types: .* not <type>:<count>')


def test_the_largest_count_is_taken(tmp_path):
    found = one(tmp_path, MIXED + 'vgpu_types = nvidia-1160:1024\n')
    assert found.type_counts == (1024,)


def test_mixed_size_types_without_counts_are_refused(tmp_path):
    message = refused(tmp_path, MIXED + 'vgpu_types = nvidia-1160:2, '
                      'nvidia-1161\n', r'give each a count')
    assert 'nvidia-1160:<count>, nvidia-1161:<count>' in message


def test_time_sliced_offers_one_type(tmp_path):
    refused(tmp_path, 'gpus = 10de:2331\nmode = time-sliced\n'
            'vgpu_types = nvidia-1160, nvidia-1162\n',
            r'one type at a time: list one, or use mode mixed-size')
    assert one(tmp_path, 'gpus = 10de:2331\nmode = time-sliced\n'
               'vgpu_types = nvidia-1160\n').vgpu_types == ('nvidia-1160',)


def test_two_types_of_one_gi_profile_are_refused():
    facts = records.replace(h100_facts(), types=H100_TYPES + (
        vtype(1170, 'NVIDIA H100-1-10Q', 10, gi=19, per_gi=1),))
    message = refused_by_gpu(layout_of(types=(1150, 1152, 1170)),
                             r'nvidia-1150 and nvidia-1170 both live in '
                             r'1g.10gb GPU instances', facts=facts)
    assert 'one type per GI profile' in message
    # in mig-time-sliced too
    refused_by_gpu(layout_of(mode='mig-time-sliced', types=(1170, 1150)),
                   r'nvidia-1170 and nvidia-1150 both live', facts=facts)


def test_blocked_counts_overlapping_placements_only():
    # placements of 4 slots at 0, 4, 8: a 3-slot vGPU at 3 spans 3..5
    assert layout.blocked(3, 3, (0, 4, 8), 4) == 2
    # ends are exclusive: 2 slots at 2 touch the 4-slot placement at 4
    # without overlapping it, and 4..7 does not reach 8
    assert layout.blocked(2, 2, (0, 4, 8), 4) == 1
    assert layout.blocked(4, 4, (0, 4, 8), 4) == 1
    assert layout.blocked(0, 12, (0, 4, 8), 4) == 3
    assert layout.blocked(12, 1, (0, 4, 8), 4) == 0


def _mixed_type(number, size, slots=32):
    return vtype(number, 'T%d' % number, size, size=size, slots=slots)


def test_worst_block_is_the_most_one_vgpu_can_take():
    one_slot, three, four = (_mixed_type(1, 1), _mixed_type(3, 3),
                             _mixed_type(4, 4))
    assert layout.worst_block(one_slot, four) == 1
    assert layout.worst_block(three, four) == 2      # 3..5 or 6..8 ...
    assert layout.worst_block(four, three) == 2      # 4..7: 3..5, 6..8
    assert layout.worst_block(four, four) == 1
    assert layout.worst_block(four, one_slot) == 4
    # a window that meets the GPU's first slot: the vGPU's own size and
    # the other type's size are not interchangeable (with them swapped,
    # 2 slots at 0 would be said to take 1 of the one-slot placements)
    two_at_0 = records.replace(_mixed_type(2, 2), placements=(0,))
    three_at_0 = records.replace(_mixed_type(3, 3), placements=(0,))
    assert layout.worst_block(two_at_0, one_slot) == 2
    assert layout.worst_block(one_slot, two_at_0) == 1
    assert layout.worst_block(three_at_0, one_slot) == 3
    assert layout.worst_block(two_at_0, three_at_0) == 1


def test_counts_fit_exactly_at_the_limit():
    # 32 one-slot placements and two of 16 slots (L40S-1B, L40S-24Q): a
    # one-slot vGPU may sit in either half, so beside one 16-slot vGPU
    # only one of them is sure to leave the other half free
    small, big = _mixed_type(1, 1), _mixed_type(16, 16)
    assert layout.placements_fit([(small, 1), (big, 1)]) is None
    assert layout.placements_fit([(small, 2), (big, 1)]) is big
    # two big ones fill the GPU: no small one fits beside them
    assert layout.placements_fit([(big, 2)]) is None
    assert layout.placements_fit([(big, 2), (small, 1)]) is big
    assert layout.placements_fit([(big, 3)]) is big
    assert layout.placements_fit([(small, 32)]) is None
    assert layout.placements_fit([(small, 33)]) is small


def test_counts_that_may_not_fit_are_refused_naming_the_type():
    # 1160: 1 slot at 0..7; 1161: 2 slots at 0, 2, 4, 6.  Two 1161 and
    # two 1160 (each 1160 taking at most one 1161 placement) leave a
    # third 1161 nowhere sure
    lay = layout_of(mode='mixed-size', gis=(), types=(1160, 1161),
                    counts=(2, 3))
    message = refused_by_gpu(lay, r'nvidia-1160:2, nvidia-1161:3 do not '
                             r'always fit together', facts=h100_facts(
                                 mig=False))
    assert 'nvidia-1161 (2 slots, 4 placements)' in message
    for counts in ((2, 2), (3, 1)):
        layout.check(layout_of(mode='mixed-size', gis=(), types=(1160, 1161),
                               counts=counts), h100_facts(mig=False))


def test_counts_without_placements_from_the_gpu_are_refused():
    facts = records.replace(h100_facts(mig=False), types=tuple(
        records.replace(t, placements=()) for t in H100_TYPES))
    refused_by_gpu(layout_of(mode='mixed-size', gis=(), types=(1160, 1161)),
                   'reports no mixed-size placements for nvidia-1160',
                   facts=facts)
    # one type needs none
    layout.check(layout_of(mode='mixed-size', gis=(), types=(1160,)), facts)


# --- the checks layout plan makes before the first step ----------------------

def test_check_before_steps_refuses_mig_on_a_gpu_without_it_in_one_line():
    facts = records.replace(h100_facts(), mig=None)
    with pytest.raises(layout.LayoutError) as e:
        layout.check_before_steps(layout_of(), facts)
    assert str(e.value) == (
        'layout one, GPU 0000:41:00.0: mode mig needs MIG, and this GPU has '
        'no MIG mode; use mode time-sliced or mixed-size')


def test_check_before_steps_checks_in_the_gpus_own_mode_whatever_it_lists():
    """MIG on, as the layout wants, but the GPU lists no MIG-backed type:
    checked all the same (not only where ``reports_for`` says)."""
    sliced = tuple(t for t in H100_TYPES if not t.mig_backed)
    facts = records.replace(h100_facts(mig=True), types=sliced)
    assert not layout.reports_for(layout_of(), facts)
    with pytest.raises(layout.LayoutError, match='does not support '
                                                 'nvidia-1150'):
        layout.check_before_steps(layout_of(), facts)
    # a time-sliced layout, MIG off, no time-sliced type listed
    mig_only = tuple(t for t in H100_TYPES if t.mig_backed)
    facts = records.replace(h100_facts(mig=False), types=mig_only)
    with pytest.raises(layout.LayoutError, match='does not support '
                                                 'nvidia-1160'):
        layout.check_before_steps(
            layout_of(mode='time-sliced', gis=(), types=(1160,)), facts)
    # MIG still to change, and nothing of the layout's kind listed: left
    # for once MIG mode changed
    assert layout.check_before_steps(layout_of(), records.replace(
        h100_facts(mig=False), types=sliced)) == layout_of()


def test_a_gi_profile_the_gpu_does_not_report_is_refused_naming_them():
    lay = layout_of(gis=(('5g.50gb', 1),))
    with pytest.raises(layout.LayoutError) as e:
        layout.wanted_gpu_instances(lay, h100_facts())
    assert str(e.value) == (
        'layout one, GPU 0000:41:00.0: [layout_one]/gpu_instances: the GPU '
        'reports no GI profile 5g.50gb (it reports: 1g.10gb, 1g.10gb+me, '
        '1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb)')
    with pytest.raises(layout.LayoutError) as e:
        layout.wanted_gpu_instances(lay, records.replace(h100_facts(),
                                                         profiles=()))
    assert str(e.value).endswith('no GI profile 5g.50gb (it reports: none)')


# --- what make mutation found ----------------------------------------------
#
# What ``[layout_<name>]``'s reading promises that test_layout left open:
# each test here fails on a change ``make mutation`` made to
# devices/layout.py that the rest stayed green on (docs/dev/mutation.md):
# the whole refusal a user reads, and the bounds of each number.
#
# ``read_layout`` takes anything that reads like a ConfigOpts (the CLI's
# snapshot included), so the checks oslo.config would make first (a mode
# or scheduler of its choices, a time slice in range) are reached here
# with plain groups.

BASE = dict(gpus=['10de:2331'], mode='time-sliced', vgpu_types=['nvidia-1160'],
            gpu_instances=[], scheduler=None, time_slice_ms=None)


def _read(**changes):
    group = dict(BASE)
    group.update(changes)
    return layout.read_layout(
        {'layout_one': types.SimpleNamespace(**group)}, 'one')


REFUSALS = [
    ({'gpus': []},
     'Configuration error: [layout_one]/gpus is empty: name the GPUs by '
     'PCI address (0000:41:00.0) or by model, their vendor:product ids '
     '(10de:2331)'),
    ({'gpus': ['nonsense']},
     "Configuration error: [layout_one]/gpus: 'nonsense' names no GPU: "
     'give a PCI address (0000:41:00.0) or the vendor:product ids of a '
     'model (10de:2331)'),
    ({'mode': 'mig-ish'},
     "Configuration error: [layout_one]/mode: 'mig-ish' is none of "
     'time-sliced, mixed-size, mig, mig-time-sliced'),
    ({'vgpu_types': ['nvidia-1160', 'nvidia-1160']},
     'Configuration error: [layout_one]/vgpu_types: lists nvidia-1160 twice'),
    ({'vgpu_types': ['bad type']},
     "Configuration error: [layout_one]/vgpu_types: 'bad type' is not a "
     "valid vGPU type id (1 to 64 letters, digits, '-', '_' or '.', "
     'starting with a letter or digit, e.g. nvidia-223)'),
    ({'vgpu_types': ['nvidia-1160:0']},
     "Configuration error: [layout_one]/vgpu_types: 'nvidia-1160:0' is not "
     '<type>:<count> with a count from 1 to 1024 in ASCII digits (e.g. '
     'nvidia-1153:2)'),
    ({'vgpu_types': ['nvidia-1160:1025']},
     "Configuration error: [layout_one]/vgpu_types: 'nvidia-1160:1025' is "
     'not <type>:<count> with a count from 1 to 1024 in ASCII digits (e.g. '
     'nvidia-1153:2)'),
    ({'vgpu_types': []},
     'Configuration error: [layout_one]/vgpu_types: names no vGPU type: '
     'list the types the GPU offers (`libvirt-gpu layout plan` lists those '
     'it supports)'),
    ({'vgpu_types': ['nvidia-1160', 'nvidia-1161']},
     'Configuration error: [layout_one]/vgpu_types: lists nvidia-1160, '
     'nvidia-1161; in mode time-sliced a GPU holds vGPUs of one type at a '
     'time: list one, or use mode mixed-size (several sizes, a count each)'),
    ({'mode': 'mixed-size', 'vgpu_types': ['nvidia-1160:2', 'nvidia-1161']},
     'Configuration error: [layout_one]/vgpu_types: lists several types in '
     'mode mixed-size; give each a count (nvidia-1160:<count>, '
     'nvidia-1161:<count>): each type is its own Placement provider with '
     'that total, and `layout plan` checks that the counts fit on the GPU '
     'together'),
    ({'mode': 'mig', 'gpu_instances': ['1g.10gb:1', '1G.10gb:2']},
     'Configuration error: [layout_one]/gpu_instances: lists 1g.10gb '
     'twice: give one count per profile'),
    ({'mode': 'mig', 'gpu_instances': []},
     'Configuration error: [layout_one]/gpu_instances: mode mig needs GPU '
     'instances (e.g. 1g.10gb:4, 3g.40gb:1)'),
    ({'gpu_instances': ['1g.10gb:1']},
     'Configuration error: [layout_one]/gpu_instances: GPU instances exist '
     'only in the MIG modes (mig, mig-time-sliced), not time-sliced'),
    ({'gpu_instances': ['1g.10gb:65'], 'mode': 'mig'},
     "Configuration error: [layout_one]/gpu_instances: '1g.10gb:65' is not "
     '<profile>:<count> with a count from 1 to 64 in ASCII digits (e.g. '
     '1g.10gb:4)'),
    ({'gpu_instances': ['xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx:1'], 'mode': 'mig'},
     'Configuration error: [layout_one]/gpu_instances: '
     "'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx:1' is not <profile>:<count> with a "
     'count from 1 to 64 in ASCII digits (e.g. 1g.10gb:4)'),
    ({'scheduler': 'round-robin'},
     "Configuration error: [layout_one]/scheduler: 'round-robin' is none "
     'of best-effort, equal-share, fixed-share'),
    ({'mode': 'mig', 'gpu_instances': ['1g.10gb'], 'scheduler': 'equal-share'},
     'Configuration error: [layout_one]/scheduler: the vGPU scheduler '
     'shares a GPU in time; mode mig gives each vGPU a GPU instance of its '
     'own: remove the option, or use mode mig-time-sliced'),
    ({'mode': 'mixed-size', 'scheduler': 'fixed-share'},
     'Configuration error: [layout_one]/scheduler: fixed-share does not '
     'work with mixed sizes (the driver refuses it): use equal-share or '
     'best-effort, or mode time-sliced'),
    ({'scheduler': 'equal-share', 'time_slice_ms': 0},
     'Configuration error: [layout_one]/time_slice_ms: 0 is outside 1..30'),
    ({'scheduler': 'equal-share', 'time_slice_ms': 31},
     'Configuration error: [layout_one]/time_slice_ms: 31 is outside 1..30'),
    ({'scheduler': 'best-effort', 'time_slice_ms': 5},
     'Configuration error: [layout_one]/time_slice_ms: a time slice needs '
     'scheduler = equal-share or fixed-share'),
    ({'time_slice_ms': 5},
     'Configuration error: [layout_one]/time_slice_ms: a time slice needs '
     'scheduler = equal-share or fixed-share'),
]


@pytest.mark.parametrize('changes, message', REFUSALS)
def test_each_refusal_is_whole(changes, message):
    with pytest.raises(exception.ConfigError) as e:
        _read(**changes)
    assert str(e.value) == message


@pytest.mark.parametrize('changes', [
    dict(scheduler='equal-share', time_slice_ms=1),
    dict(scheduler='fixed-share', time_slice_ms=30),
    dict(vgpu_types=['nvidia-1160:1']),
    dict(vgpu_types=['nvidia-1160:1024']),
    dict(mode='mig', gpu_instances=['1g.10gb:64']),
    dict(mode='mig', gpu_instances=['x' * 32 + ':1']),
])
def test_the_bounds_themselves_are_taken(changes):
    assert _read(**changes).name == 'one'


def test_a_count_is_read_and_kept_in_order():
    got = _read(mode='mixed-size', vgpu_types=['nvidia-1161:1',
                                               'nvidia-1160:1024'])
    assert got.type_counts == (1, 1024)
    assert got.count(objects.TypeId.parse('nvidia-1160')) == 1024


@pytest.mark.parametrize('text, profile, count', [
    ('1g.10gb', '1g.10gb', 1),
    ('MIG 1g.10gb:2', '1g.10gb', 2),
    ('mig 3g.40gb', '3g.40gb', 1),
    ('a:b:3', 'a:b', 3),
])
def test_gi_counts_are_read(text, profile, count):
    got = layout.parse_gi_count('one', text)
    assert (got.profile, got.count) == (profile, count)


def test_a_layout_named_twice_is_refused_whole():
    conf = types.SimpleNamespace(gpu=types.SimpleNamespace(
        layouts=['a', 'b', 'a']))
    with pytest.raises(exception.ConfigError) as e:
        layout.read_layouts(conf)
    assert str(e.value) == ('Configuration error: [gpu]/layouts lists a '
                            'layout twice: a, b, a')


def test_str_of_the_records():
    assert str(layout.GiCount(profile='1g.10gb', count=4)) == '1g.10gb:4'
    assert str(layout.Scheduler(policy='equal-share',
                                time_slice_ms=4)) == 'equal-share, 4 ms'
    assert str(layout.Scheduler(policy='best-effort')) == 'best-effort'


def test_no_layouts_option_is_no_layout():
    conf = types.SimpleNamespace(gpu=types.SimpleNamespace())
    assert layout.read_layouts(conf) == ()


def _gpu(address, is_vf=False, physfn=None):
    return types.SimpleNamespace(
        address=objects.PciAddress.parse(address), is_vf=is_vf,
        physfn=physfn and objects.PciAddress.parse(physfn),
        vendor_id='10de', product_id='2331')


def _layout(name, *gpus):
    return layout.Layout(
        name=name, gpus=tuple(objects.GpuSelector.parse(g) for g in gpus),
        mode='time-sliced', vgpu_types=(objects.TypeId.parse('nvidia-1'),))


GPUS_m = [_gpu('0000:41:00.0'), _gpu('0000:41:00.4', True, '0000:41:00.0')]


@pytest.mark.parametrize('layouts, message', [
    ([_layout('one', '0000:99:00.0')],
     'Configuration error: [layout_one]/gpus names 0000:99:00.0, but this '
     'host has no GPU there (`libvirt-gpu list` shows the GPUs)'),
    ([_layout('one', '0000:41:00.4')],
     'Configuration error: [layout_one]/gpus names 0000:41:00.4, a VF of '
     'the GPU 0000:41:00.0; name the physical GPU'),
    ([_layout('one', '10de:2331'), _layout('two', '0000:41:00.0')],
     'Configuration error: GPU 0000:41:00.0 is matched by two layouts, '
     '[layout_one] and [layout_two]; give each GPU one layout (name it by '
     'address in one, or split the model)'),
])
def test_each_claims_refusal_is_whole(layouts, message):
    with pytest.raises(exception.ConfigError) as e:
        layout.claims(layouts, GPUS_m)
    assert str(e.value) == message


def test_memory_slices_of_a_gpu_without_profiles_are_none():
    assert layout._memory_slices(81152, 0) == 0
    assert layout._memory_slices(81152, 9984) == 8


def _spans(size, starts):
    return layout.TypeFacts(type_id=objects.TypeId.parse('nvidia-%d' % size),
                            name=None, framebuffer_mib=size * 1024,
                            placement_size=size, placements=tuple(starts))


def test_a_type_without_placements_blocks_none():
    assert layout.worst_block(_spans(1, ()), _spans(2, (0, 2))) == 0


def test_fit_multiplies_each_vgpu_by_what_it_can_take():
    overlapping = _spans(2, (0, 1, 2))     # one at 1 takes all three
    assert layout.placements_fit([(overlapping, 2)]) is overlapping
    assert layout.placements_fit([(overlapping, 1)]) is None
    small, large = _spans(1, (0, 1, 2, 3)), _spans(2, (0, 2))
    # two large ones take 2 x 2 of small's 4 placements
    assert layout.placements_fit([(small, 1), (large, 2)]) is small


# --- what make mutation found ----------------------------------------------
#
# What ``layout.check`` promises that test_layout left open: each test
# here fails on a change ``make mutation`` made to devices/layout.py that
# the rest stayed green on (docs/dev/mutation.md): the whole refusal a user
# reads for each rule a GPU's facts can break (the H100 of test_layout).

T = objects.TypeId.parse
SELECT = (objects.GpuSelector.parse('10de:2331'),)


def lay(mode, types, gis=(), counts=None):
    return layout.Layout(
        name='one', gpus=SELECT, mode=mode,
        vgpu_types=tuple(T(t) for t in types),
        gpu_instances=tuple(layout.GiCount(profile=p, count=c)
                            for p, c in gis),
        type_counts=tuple(counts or [None] * len(types)))


def facts(**changes):
    f = h100_facts()
    fields = dict(address=f.address, mig=f.mig, profiles=f.profiles,
                  types=f.types, vfs_total=20)
    fields.update(changes)
    return layout.GpuFacts(**fields)


def extra(*types):
    return facts(types=H100_TYPES + types)


NAMELESS = layout.TypeFacts(type_id=T('nvidia-9'), name=None,
                            framebuffer_mib=1024)
MIG1 = [('1g.10gb', 1)]
CASES = {
    'no profiles': lambda: (lay('mig', ['nvidia-1150'], MIG1),
                            facts(profiles=())),
    'unknown profile': lambda: (lay('mig', ['nvidia-1150'],
                                    [('5g.50gb', 1)]), facts()),
    'too many': lambda: (lay('mig', ['nvidia-1150'], [('3g.40gb', 3)]),
                         facts()),
    'slices': lambda: (lay('mig', ['nvidia-1150'],
                           [('3g.40gb', 2), ('1g.10gb', 2)]), facts()),
    'memory': lambda: (lay('mig', ['nvidia-1150'],
                           [('1g.20gb', 4), ('1g.10gb', 1)]), facts()),
    'unsupported mig': lambda: (lay('mig', ['nvidia-7'], MIG1), facts()),
    'unsupported ts': lambda: (lay('time-sliced', ['nvidia-7']),
                               extra(NAMELESS)),
    'ts on mig': lambda: (lay('mig', ['nvidia-1160'], MIG1), facts()),
    'mig on ts': lambda: (lay('time-sliced', ['nvidia-1150']), facts()),
    'no gi made': lambda: (lay('mig', ['nvidia-1152'], MIG1), facts()),
    'two of a profile': lambda: (
        lay('mig', ['nvidia-1150', 'nvidia-8'], MIG1),
        extra(vtype(8, 'X', 10, gi=19, per_gi=1))),
    'sizes': lambda: (lay('time-sliced', ['nvidia-1160', 'nvidia-1161']),
                      facts(mig=False)),
    'no placements': lambda: (
        lay('mixed-size', ['nvidia-1160', 'nvidia-8'], counts=[1, 1]),
        extra(vtype(8, 'X', 10))),
    'no fit': lambda: (lay('mixed-size', ['nvidia-1160', 'nvidia-1161'],
                           counts=[4, 2]), facts()),
    'no fit at the bound': lambda: (
        lay('mixed-size', ['nvidia-1160', 'nvidia-1161'], counts=[4, 1]),
        facts()),
}
GPU = 'layout one, GPU 0000:41:00.0: '
REFUSALS_m = [
    ('no profiles',
     GPU + ('mode mig needs MIG, and this GPU reports no GPU-instance '
            'profiles; use mode time-sliced or mixed-size')),
    ('unknown profile',
     GPU + ('[layout_one]/gpu_instances: the GPU has no GI profile 5g.50gb '
            '(it has: 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, '
            '4g.40gb, 7g.80gb)')),
    ('too many',
     GPU + ('[layout_one]/gpu_instances: 3 x 3g.40gb, but the GPU holds at '
            'most 2 of them')),
    ('slices',
     GPU + ('[layout_one]/gpu_instances: 3g.40gb:2, 1g.10gb:2 needs 8 '
            'compute slices and 10 memory slices; the GPU has 7 and 8 '
            '(profiles: 1g.10gb 1 slice(s), 1g.10gb+me 1 slice(s), 1g.20gb '
            '1 slice(s), 2g.20gb 2 slice(s), 3g.40gb 3 slice(s), 4g.40gb 4 '
            'slice(s), 7g.80gb 7 slice(s))')),
    ('memory',
     GPU + ('[layout_one]/gpu_instances: 1g.20gb:4, 1g.10gb:1 needs 5 '
            'compute slices and 9 memory slices; the GPU has 7 and 8 '
            '(profiles: 1g.10gb 1 slice(s), 1g.10gb+me 1 slice(s), 1g.20gb '
            '1 slice(s), 2g.20gb 2 slice(s), 3g.40gb 3 slice(s), 4g.40gb 4 '
            'slice(s), 7g.80gb 7 slice(s))')),
    ('unsupported mig',
     GPU + ('[layout_one]/vgpu_types: the GPU does not support nvidia-7 '
            '(it supports: nvidia-1150 (NVIDIA H100-1-10C), nvidia-1151 '
            '(NVIDIA H100-1-10CME), nvidia-1152 (NVIDIA H100-3-40C), '
            'nvidia-1153 (NVIDIA H100-2-20C))')),
    ('unsupported ts',
     GPU + ('[layout_one]/vgpu_types: the GPU does not support nvidia-7 '
            '(it supports: nvidia-1160 (NVIDIA H100-10C), nvidia-1161 '
            '(NVIDIA H100-20C), nvidia-1162 (NVIDIA H100-10Q), nvidia-9)')),
    ('ts on mig',
     GPU + ('[layout_one]/vgpu_types: nvidia-1160 is time-sliced, and with '
            'MIG on the GPU offers only MIG-backed types (nvidia-1150 '
            '(NVIDIA H100-1-10C), nvidia-1151 (NVIDIA H100-1-10CME), '
            'nvidia-1152 (NVIDIA H100-3-40C), nvidia-1153 (NVIDIA '
            'H100-2-20C))')),
    ('mig on ts',
     GPU + ('[layout_one]/vgpu_types: nvidia-1150 is MIG-backed; mode '
            'time-sliced offers time-sliced types (nvidia-1160 (NVIDIA '
            'H100-10C), nvidia-1161 (NVIDIA H100-20C), nvidia-1162 (NVIDIA '
            'H100-10Q)), or use mode mig')),
    ('no gi made',
     GPU + ('[layout_one]/vgpu_types: nvidia-1152 lives in 3g.40gb GPU '
            'instances, and [layout_one]/gpu_instances makes none')),
    ('two of a profile',
     GPU + ('[layout_one]/vgpu_types: nvidia-1150 and nvidia-8 both live '
            'in 1g.10gb GPU instances, which they would share (each is '
            'told to Placement apart); list one type per GI profile')),
    ('sizes',
     GPU + ('[layout_one]/vgpu_types: nvidia-1160, nvidia-1161 have '
            'different frame buffer sizes; time-sliced holds one size per '
            'GPU: use mode mixed-size')),
    ('no placements',
     GPU + ('[layout_one]/vgpu_types: the GPU reports no mixed-size '
            'placements for nvidia-8, so the counts cannot be checked to '
            'fit; list one type')),
    ('no fit',
     GPU + ('[layout_one]/vgpu_types: nvidia-1160:4, nvidia-1161:2 do not '
            'always fit together: the driver picks where each vGPU sits, '
            'and nvidia-1161 (2 slots, 4 placements) may then find none '
            'free; lower the counts')),
    ('no fit at the bound',
     GPU + ('[layout_one]/vgpu_types: nvidia-1160:4, nvidia-1161:1 do not '
            'always fit together: the driver picks where each vGPU sits, '
            'and nvidia-1161 (2 slots, 4 placements) may then find none '
            'free; lower the counts')),
]


@pytest.mark.parametrize('case, message', REFUSALS_m)
def test_each_refusal_is_whole_mutation(case, message):
    with pytest.raises(layout.LayoutError) as e:
        layout.check(*CASES[case]())
    assert str(e.value) == message


def test_a_type_of_a_profile_the_gpu_does_not_list():
    """The refusal names the profile by number."""
    with pytest.raises(layout.LayoutError) as e:
        layout.check(lay('mig', ['nvidia-8'], MIG1),
                     extra(vtype(8, 'X', 10, gi=77, per_gi=1)))
    assert str(e.value).endswith(
        '[layout_one]/vgpu_types: nvidia-8 lives in profile 77 GPU '
        'instances, and [layout_one]/gpu_instances makes none')


@pytest.mark.parametrize('counts', [[3, 1], [1, 3]])
def test_mixed_size_counts_just_below_the_bound_fit(counts):
    got = lay('mixed-size', ['nvidia-1160', 'nvidia-1161'], counts=counts)
    assert layout.check(got, facts()) is got


def test_one_time_sliced_type_and_a_full_mig_layout_pass():
    one = lay('time-sliced', ['nvidia-1160'])
    assert layout.check(one, facts(mig=False)) is one
    full = lay('mig', ['nvidia-1150'], [('1g.10gb', 7)])
    assert layout.check(full, facts()) is full


def test_a_gpu_offering_no_type_of_the_mode_says_none():
    with pytest.raises(layout.LayoutError) as e:
        layout.check(lay('time-sliced', ['nvidia-7']),
                     facts(types=H100_TYPES[:4]))     # the MIG-backed ones
    assert str(e.value).endswith('does not support nvidia-7 (it supports: '
                                 'none)')
