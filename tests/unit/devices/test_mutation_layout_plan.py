"""What ``layout_plan.plan`` promises that test_layout_plan left open:
each test here fails on a change ``make mutation`` made to
devices/layout_plan.py that the rest stayed green on
(docs/dev/mutation.md): every step of a plan as ``layout plan --json``
shows it, details included, from a few starting states."""

import pytest

from libvirt_gpu.devices import layout
from libvirt_gpu.devices import layout_plan as lp
from libvirt_gpu import objects
from libvirt_gpu.util import records
from tests.unit.devices import test_layout as tl

ADDRESS = objects.PciAddress.parse(tl.H100)
BEST = layout.Scheduler('best-effort')
EQUAL4 = layout.Scheduler('equal-share', 4)


def gi(gid, profile, compute=None, scheduler=None):
    return layout.GpuInstance(id=gid, profile_id=profile,
                              scheduler=scheduler, compute=compute)


def state(mig=True, vfs=20, gis=(), mixed=None, scheduler=None):
    return layout.GpuState(address=ADDRESS, mig=mig, vfs=vfs, vfs_total=20,
                           gpu_instances=tuple(gis), mixed_size=mixed,
                           scheduler=scheduler)


MIG = tl.layout_of()      # 4 x 1g.10gb (19) + 1 x 3g.40gb (9)
MIXED = tl.layout_of(mode='mixed-size', gis=(), types=(1160,),
                     scheduler='equal-share', time_slice=4)
SLICED = tl.layout_of(mode='time-sliced', gis=(), types=(1160,),
                      scheduler='best-effort')
MIG_SLICED = tl.layout_of(mode='mig-time-sliced', gis=(('1g.10gb', 1),),
                          types=(1150,), scheduler='equal-share',
                          time_slice=4)
TWO_SMALL = tl.layout_of(gis=(('1g.10gb', 1), ('1g.20gb', 1)),
                         types=(1150,))
CASES = {
    'no mig mode read, partial vfs, an unknown gi': (
        MIG, state(mig=None, vfs=4, gis=[gi(1, 99)])),
    'mig off, no vfs': (MIG, state(mig=False, vfs=0)),
    'mig on, partial vfs, gis kept': (
        MIG, state(vfs=4, gis=[gi(1, 19), gi(2, 9)])),
    'mig to mixed-size': (
        MIXED, state(gis=[gi(1, 19)], scheduler=BEST)),
    'mixed-size to time-sliced': (
        SLICED, state(mig=False, mixed=True)),
    'time-sliced to mixed-size, scheduler unread': (
        MIXED, state(mig=False, mixed=None)),
    'mig-time-sliced, gi scheduler differs': (
        MIG_SLICED, state(gis=[gi(1, 19, scheduler=BEST)])),
    'mig-time-sliced at its layout': (
        MIG_SLICED, state(gis=[gi(1, 19, scheduler=EQUAL4)])),
    'gis without compute or not asked for': (
        MIG, state(gis=[gi(1, 19, compute=False), gi(2, 19, compute=True),
                        gi(3, 0), gi(4, 9)])),
    'equal slices, more memory first': (TWO_SMALL, state()),
}


def step(action, detail, **more):
    return dict(action=action, detail=detail, **more)


PLANS = {
    'no mig mode read, partial vfs, an unknown gi': [
        step('destroy-gi', 'destroy GPU instance 1 (profile 99)', gi_id=1),
        step('disable-vfs', 'disable the 4 VFs (the driver changes MIG '
                            'mode only without VFs)'),
        step('mig-mode', 'turn MIG mode on', on=True),
        step('enable-vfs', 'enable 20 VFs', count=20),
        step('create-gi', 'create a 3g.40gb GPU instance (with its compute '
                          'instance)', profile_id=9),
        step('create-gi', 'create a 1g.10gb GPU instance (with its compute '
                          'instance)', profile_id=19),
        step('create-gi', 'create a 1g.10gb GPU instance (with its compute '
                          'instance)', profile_id=19),
        step('create-gi', 'create a 1g.10gb GPU instance (with its compute '
                          'instance)', profile_id=19),
        step('create-gi', 'create a 1g.10gb GPU instance (with its compute '
                          'instance)', profile_id=19),
    ],
    'mig off, no vfs': [
        step('mig-mode', 'turn MIG mode on', on=True),
        step('enable-vfs', 'enable 20 VFs', count=20),
        step('create-gi', 'create a 3g.40gb GPU instance (with its compute '
                          'instance)', profile_id=9),
        step('create-gi', 'create a 1g.10gb GPU instance (with its compute '
                          'instance)', profile_id=19),
        step('create-gi', 'create a 1g.10gb GPU instance (with its compute '
                          'instance)', profile_id=19),
        step('create-gi', 'create a 1g.10gb GPU instance (with its compute '
                          'instance)', profile_id=19),
        step('create-gi', 'create a 1g.10gb GPU instance (with its compute '
                          'instance)', profile_id=19),
    ],
    'mig on, partial vfs, gis kept': [
        step('disable-vfs', 'disable the 4 of 20 VFs enabled'),
        step('enable-vfs', 'enable 20 VFs (this destroys every GPU '
                           'instance)', count=20),
        step('create-gi', 'create a 3g.40gb GPU instance (with its compute '
                          'instance)', profile_id=9),
        step('create-gi', 'create a 1g.10gb GPU instance (with its compute '
                          'instance)', profile_id=19),
        step('create-gi', 'create a 1g.10gb GPU instance (with its compute '
                          'instance)', profile_id=19),
        step('create-gi', 'create a 1g.10gb GPU instance (with its compute '
                          'instance)', profile_id=19),
        step('create-gi', 'create a 1g.10gb GPU instance (with its compute '
                          'instance)', profile_id=19),
    ],
    'mig to mixed-size': [
        step('destroy-gi', 'destroy GPU instance 1 (1g.10gb)', gi_id=1),
        step('disable-vfs', 'disable the 20 VFs (the driver changes MIG '
                            'mode only without VFs)'),
        step('mig-mode', 'turn MIG mode off', on=False),
        step('enable-vfs', 'enable 20 VFs', count=20),
        step('mixed-size', 'turn mixed-size mode on', on=True),
        step('scheduler', 'set the vGPU scheduler to equal-share, 4 ms '
                          '(now best-effort)',
                          scheduler='equal-share', time_slice_ms=4),
    ],
    'mixed-size to time-sliced': [
        step('mixed-size', 'turn mixed-size mode off', on=False),
        step('scheduler', 'set the vGPU scheduler to best-effort',
                          scheduler='best-effort', time_slice_ms=None),
    ],
    'time-sliced to mixed-size, scheduler unread': [
        step('mixed-size', 'turn mixed-size mode on', on=True),
        step('scheduler', 'set the vGPU scheduler to equal-share, 4 ms',
                          scheduler='equal-share', time_slice_ms=4),
    ],
    'mig-time-sliced, gi scheduler differs': [
        step('gi-scheduler', 'set the vGPU scheduler of each GPU instance '
                             'to equal-share, 4 ms',
                             scheduler='equal-share', time_slice_ms=4),
    ],
    'mig-time-sliced at its layout': [
    ],
    'gis without compute or not asked for': [
        step('destroy-gi', 'destroy GPU instance 1 (1g.10gb): it has no '
                           'compute instance (left by a failed apply): it '
                           'is made again', gi_id=1),
        step('destroy-gi', 'destroy GPU instance 3 (7g.80gb): not in the '
                           'layout', gi_id=3),
        step('create-gi', 'create a 1g.10gb GPU instance (with its compute '
                          'instance)', profile_id=19),
        step('create-gi', 'create a 1g.10gb GPU instance (with its compute '
                          'instance)', profile_id=19),
        step('create-gi', 'create a 1g.10gb GPU instance (with its compute '
                          'instance)', profile_id=19),
    ],
    'equal slices, more memory first': [
        step('create-gi', 'create a 1g.20gb GPU instance (with its compute '
                          'instance)', profile_id=15),
        step('create-gi', 'create a 1g.10gb GPU instance (with its compute '
                          'instance)', profile_id=19),
    ],
}


@pytest.mark.parametrize('case', sorted(CASES))
def test_each_step_in_full(case):
    lay, st = CASES[case]
    got = lp.plan(lay, tl.h100_facts(), st)
    assert [s.to_json() for s in got.steps] == PLANS[case]
    assert got.converged == (not PLANS[case])


def test_the_plan_names_its_layout_and_gpu():
    got = lp.plan(MIG, tl.h100_facts(), state())
    assert (got.layout, got.address) == ('one', ADDRESS)


def test_a_gpu_without_vfs_still_gets_its_gis():
    st = layout.GpuState(address=ADDRESS, mig=False, vfs=0, vfs_total=0)
    got = [s.action for s in lp.plan(TWO_SMALL, tl.h100_facts(), st).steps]
    assert got == ['mig-mode', 'create-gi', 'create-gi']


def _placed_facts():
    facts = tl.h100_facts()
    spots = {19: tuple((i, 1) for i in range(7)), 9: ((0, 4), (4, 4))}
    profiles = tuple(records.replace(p, placements=spots.get(p.id, ()))
                     for p in facts.profiles)
    return records.replace(facts, profiles=profiles)


def _kept(start):
    return layout.GpuInstance(id=1, profile_id=19, start=start, size=1,
                              compute=True)


def test_gis_are_placed_beside_the_kept_one():
    got = lp.plan(MIG, _placed_facts(), state(gis=[_kept(0)]))
    assert [s.detail for s in got.steps] == [
        'create a 3g.40gb GPU instance at memory slice 4 (with its compute '
        'instance)'] + [
        'create a 1g.10gb GPU instance at memory slice %d (with its compute '
        'instance)' % i for i in (1, 2, 3)]


def test_gis_that_cannot_sit_beside_the_kept_one_are_refused_whole():
    with pytest.raises(layout.LayoutError) as e:
        lp.plan(MIG, _placed_facts(), state(gis=[_kept(4)]))
    assert str(e.value) == (
        'layout one, GPU 0000:41:00.0: the GPU cannot place 3g.40gb, '
        '1g.10gb, 1g.10gb, 1g.10gb together beside the GPU instances kept: '
        'its placements do not allow it; ask for fewer or smaller GPU '
        'instances')
