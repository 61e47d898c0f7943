"""What ``[layout_<name>]``'s reading promises that test_layout left open:
each test here fails on a change ``make mutation`` made to
devices/layout.py that the rest stayed green on (docs/dev/mutation.md):
the whole refusal a user reads, and the bounds of each number.

``read_layout`` takes anything that reads like a ConfigOpts (the CLI's
snapshot included), so the checks oslo.config would make first (a mode
or scheduler of its choices, a time slice in range) are reached here
with plain groups."""

import types

import pytest

from libvirt_gpu.devices import layout
from libvirt_gpu import exception
from libvirt_gpu import objects

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


GPUS = [_gpu('0000:41:00.0'), _gpu('0000:41:00.4', True, '0000:41:00.0')]


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
        layout.claims(layouts, GPUS)
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
