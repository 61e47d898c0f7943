"""What ``layout.check`` promises that test_layout left open: each test
here fails on a change ``make mutation`` made to devices/layout.py that
the rest stayed green on (docs/dev/mutation.md): the whole refusal a user
reads for each rule a GPU's facts can break (the H100 of test_layout)."""

import pytest

from libvirt_gpu.devices import layout
from libvirt_gpu import objects
from tests.unit.devices.test_layout import H100_TYPES, h100_facts, vtype

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
REFUSALS = [
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


@pytest.mark.parametrize('case, message', REFUSALS)
def test_each_refusal_is_whole(case, message):
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
