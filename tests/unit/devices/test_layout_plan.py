"""The planner (devices/layout_plan.py): each rule of the driver's order,
and only what differs, on records."""

import pytest

from libvirt_gpu.devices import layout
from libvirt_gpu.devices import layout_plan as lp
from libvirt_gpu import objects
from libvirt_gpu.util import records
from tests.doubles import layout_facts as tl

ADDRESS = objects.PciAddress.parse(tl.H100)
EQUAL = layout.Scheduler('equal-share')


def state(mig=True, vfs=20, gis=(), mixed=None, scheduler=None, vgpus=()):
    return layout.GpuState(
        address=ADDRESS, mig=mig, vfs=vfs, vfs_total=20,
        gpu_instances=tuple(layout.GpuInstance(i, p, s)
                            for i, p, s in gis),
        mixed_size=mixed, scheduler=scheduler, vgpus=tuple(vgpus))


def actions(lay, st, facts=None):
    return [s.action for s in lp.plan(lay, facts or tl.h100_facts(),
                                      st).steps]


MIG = tl.layout_of()      # 4 x 1g.10gb (19) + 1 x 3g.40gb (9)
AT_MIG = ((1, 19, None), (2, 19, None), (3, 19, None), (4, 19, None),
          (5, 9, None))


def test_a_gpu_at_its_layout_plans_nothing():
    assert lp.plan(MIG, tl.h100_facts(), state(gis=AT_MIG)).converged
    time_sliced = tl.layout_of(mode='time-sliced', gis=(), types=(1160,),
                               scheduler='equal-share')
    assert lp.plan(time_sliced, tl.h100_facts(False),
                   state(mig=False, mixed=False, scheduler=EQUAL)).converged


def test_from_nothing_the_drivers_order():
    # MIG off, no VFs: MIG on, then VFs, then the GIs largest first
    steps = lp.plan(MIG, tl.h100_facts(False),
                    state(mig=False, vfs=0)).steps
    assert [s.action for s in steps] == [
        lp.MIG_MODE, lp.ENABLE_VFS] + [lp.CREATE_GI] * 5
    assert steps[0].on is True and steps[1].count == 20
    assert [s.profile_id for s in steps[2:]] == [9, 19, 19, 19, 19]


def test_mig_mode_changes_only_without_vfs_and_gis():
    lay = tl.layout_of(mode='time-sliced', gis=(), types=(1160,))
    assert actions(lay, state(gis=AT_MIG[:1])) == [
        lp.DESTROY_GI, lp.DISABLE_VFS, lp.MIG_MODE, lp.ENABLE_VFS]


def test_enabling_vfs_counts_no_gi_after_it():
    # GIs made before the VFs: sriov-manage -e destroys them, so the plan
    # makes all of them after it
    assert actions(MIG, state(vfs=0, gis=AT_MIG)) == [
        lp.ENABLE_VFS] + [lp.CREATE_GI] * 5


def test_a_partial_set_of_vfs_is_disabled_then_enabled():
    assert actions(MIG, state(vfs=3, gis=AT_MIG))[:2] == [
        lp.DISABLE_VFS, lp.ENABLE_VFS]


def test_only_the_missing_gis_are_made():
    steps = lp.plan(MIG, tl.h100_facts(), state(gis=AT_MIG[1:])).steps
    assert [(s.action, s.profile_id) for s in steps] == [(lp.CREATE_GI, 19)]


def test_the_largest_profile_is_made_first_whatever_its_id():
    facts = layout.GpuFacts(
        address=ADDRESS, mig=True, profiles=(
            tl.profile(1, '1g.10gb', 1, 7, 9.75),
            tl.profile(2, '4g.40gb', 4, 1, 39.5),
            tl.profile(3, '2g.20gb', 2, 3, 19.625)),
        types=tl.H100_TYPES)
    lay = tl.layout_of(gis=(('1g.10gb', 1), ('2g.20gb', 1), ('4g.40gb', 1)),
                       types=())
    steps = lp.plan(lay, facts, state()).steps
    assert [s.profile_id for s in steps] == [2, 3, 1]


def test_gis_not_in_the_layout_are_destroyed_before_any_is_made():
    gis = AT_MIG[:4] + ((7, 14, None),)          # a 2g.20gb instead
    steps = lp.plan(MIG, tl.h100_facts(), state(gis=gis)).steps
    assert [(s.action, s.gi_id or s.profile_id) for s in steps] == [
        (lp.DESTROY_GI, 7), (lp.CREATE_GI, 9)]


def test_gis_beyond_the_count_are_destroyed():
    gis = AT_MIG + ((6, 19, None),)
    steps = lp.plan(MIG, tl.h100_facts(), state(gis=gis)).steps
    assert [(s.action, s.gi_id) for s in steps] == [(lp.DESTROY_GI, 6)]


def test_mixed_size_mode_on_and_off():
    mixed = tl.layout_of(mode='mixed-size', gis=(), types=(1160, 1161))
    facts = tl.h100_facts(False)
    steps = lp.plan(mixed, facts, state(mig=False, mixed=False)).steps
    assert [(s.action, s.on) for s in steps] == [(lp.MIXED_SIZE, True)]
    assert actions(mixed, state(mig=False, mixed=True), facts) == []
    single = tl.layout_of(mode='time-sliced', gis=(), types=(1160,))
    steps = lp.plan(single, facts, state(mig=False, mixed=True)).steps
    assert [(s.action, s.on) for s in steps] == [(lp.MIXED_SIZE, False)]


def test_enabling_vfs_clears_mixed_size_mode():
    mixed = tl.layout_of(mode='mixed-size', gis=(), types=(1160, 1161))
    assert actions(mixed, state(mig=False, vfs=0, mixed=True),
                   tl.h100_facts(False)) == [lp.ENABLE_VFS, lp.MIXED_SIZE]


def test_mixed_size_is_not_touched_on_a_mig_gpu():
    assert lp.MIXED_SIZE not in actions(MIG, state(gis=AT_MIG, mixed=True))


def test_the_scheduler_only_when_it_differs():
    lay = tl.layout_of(mode='time-sliced', gis=(), types=(1160,),
                       scheduler='equal-share', time_slice=4)
    facts = tl.h100_facts(False)
    steps = lp.plan(lay, facts, state(mig=False, mixed=False,
                                      scheduler=EQUAL)).steps
    assert [(s.action, s.scheduler) for s in steps] == [
        (lp.SCHEDULER, layout.Scheduler('equal-share', 4))]
    assert actions(lay, state(mig=False, mixed=False, scheduler=layout.
                              Scheduler('equal-share', 4)), facts) == []
    # no time slice asked: the driver's is fine
    lay = tl.layout_of(mode='time-sliced', gis=(), types=(1160,),
                       scheduler='equal-share')
    assert actions(lay, state(mig=False, mixed=False, scheduler=layout.
                              Scheduler('equal-share', 2)), facts) == []


def test_no_scheduler_asked_leaves_it_alone():
    lay = tl.layout_of(mode='time-sliced', gis=(), types=(1160,))
    assert actions(lay, state(mig=False, mixed=False, scheduler=layout.
                              Scheduler('fixed-share')),
                   tl.h100_facts(False)) == []


def test_the_scheduler_comes_last_and_per_gi_in_mig_time_sliced():
    lay = tl.layout_of(mode='mig-time-sliced', scheduler='equal-share')
    assert actions(lay, state(vfs=0)) == [
        lp.ENABLE_VFS] + [lp.CREATE_GI] * 5 + [lp.GI_SCHEDULER]
    at = tuple((i, p, EQUAL) for i, p, _ in AT_MIG)
    assert actions(lay, state(gis=at)) == []
    assert actions(lay, state(gis=at[:4] + ((5, 9, None),))) == [
        lp.GI_SCHEDULER]


def test_the_plan_keeps_the_vgpus_that_forbid_it():
    vf = objects.PciAddress.parse('0000:41:00.4')
    plan = lp.plan(MIG, tl.h100_facts(), state(gis=AT_MIG[1:], vgpus=[vf]))
    assert plan.vgpus == (vf,) and not plan.converged


def test_steps_say_what_they_do_in_json():
    steps = lp.plan(MIG, tl.h100_facts(False), state(mig=False, vfs=0)).steps
    assert steps[0].to_json() == {'action': 'mig-mode', 'on': True,
                                  'detail': 'turn MIG mode on'}
    assert steps[2].to_json()['detail'] == (
        'create a 3g.40gb GPU instance (with its compute instance)')


# --- where each GPU instance goes -------------------------------------------

# The A100/H100 placements (nvidia-smi mig -lgipp): 8 memory slices, 1g at
# 0-6, 2g at 0, 2, 4, 3g at 0 and 4, 4g at 0, 7g at 0.
_PLACES = {19: tuple((s, 1) for s in range(7)), 20: tuple(
    (s, 1) for s in range(7)), 15: ((0, 2), (2, 2), (4, 2), (6, 2)),
    14: ((0, 2), (2, 2), (4, 2)), 9: ((0, 4), (4, 4)), 5: ((0, 4),),
    0: ((0, 8),)}


def placed_facts():
    facts = tl.h100_facts()
    return records.replace(facts, profiles=tuple(
        records.replace(p, placements=_PLACES[p.id])
        for p in facts.profiles))


def creates(plan):
    return [(s.profile_id, s.start) for s in plan.steps
            if s.action == lp.CREATE_GI]


def test_gpu_instances_are_placed_so_that_all_fit():
    # largest first, but at a slice that leaves the four 1g.10gb room: the
    # driver left to choose may put the 3g.40gb at 0
    plan = lp.plan(MIG, placed_facts(), state())
    assert creates(plan) == [(9, 4), (19, 0), (19, 1), (19, 2), (19, 3)]
    assert 'at memory slice 4' in plan.steps[0].detail
    assert plan.steps[0].to_json()['start'] == 4


def test_placements_go_around_the_gpu_instances_kept():
    # a 1g.10gb kept at slice 2: the 3g.40gb goes at 4, the three other
    # 1g.10gb at 0, 1 and 3
    kept = (layout.GpuInstance(7, 19, None, start=2, size=1),)
    st = records.replace(state(), gpu_instances=kept)
    assert creates(lp.plan(MIG, placed_facts(), st)) == [
        (9, 4), (19, 0), (19, 1), (19, 3)]


def test_a_layout_no_arrangement_holds_is_refused_naming_the_gpu():
    # 4g.40gb only at 0 and a 1g.10gb kept at 2: nothing can hold it
    lay = tl.layout_of(gis=(('4g.40gb', 1), ('1g.10gb', 1)))
    kept = (layout.GpuInstance(7, 19, None, start=2, size=1),)
    st = records.replace(state(), gpu_instances=kept)
    with pytest.raises(layout.LayoutError) as e:
        lp.plan(lay, placed_facts(), st)
    assert 'cannot place 4g.40gb together beside the GPU instances kept' \
        in str(e.value)
    assert tl.H100 in str(e.value)


def test_without_placements_the_driver_chooses():
    plan = lp.plan(MIG, tl.h100_facts(), state())
    assert creates(plan) == [(9, None)] + [(19, None)] * 4
    assert 'memory slice' not in plan.steps[0].detail
    assert 'start' not in plan.steps[0].to_json()


def test_a_gpu_instance_about_to_be_destroyed_takes_no_placement():
    # a 4g.40gb at slices 0-3, not in the layout: destroyed first, so
    # the four 1g.10gb go where it was (counted as still there, nothing
    # could hold them beside the 3g.40gb)
    doomed = layout.GpuInstance(8, 5, None, start=0, size=4)
    st = records.replace(state(), gpu_instances=(doomed,))
    plan = lp.plan(MIG, placed_facts(), st)
    assert [(s.action, s.gi_id) for s in plan.steps][:1] == [
        (lp.DESTROY_GI, 8)]
    assert creates(plan) == [(9, 4), (19, 0), (19, 1), (19, 2), (19, 3)]
    # one left without its compute instance is made again, where it was
    # or elsewhere: its own placement is free too
    broken = (layout.GpuInstance(1, 19, None, start=0, size=1,
                                 compute=False),
              layout.GpuInstance(2, 9, None, start=4, size=4))
    st = records.replace(state(), gpu_instances=broken)
    plan = lp.plan(MIG, placed_facts(), st)
    assert [(s.action, s.gi_id) for s in plan.steps][:1] == [
        (lp.DESTROY_GI, 1)]
    assert creates(plan) == [(19, 0), (19, 1), (19, 2), (19, 3)]


# --- what make mutation found ----------------------------------------------
#
# What ``layout_plan.plan`` promises that test_layout_plan left open:
# each test here fails on a change ``make mutation`` made to
# devices/layout_plan.py that the rest stayed green on
# (docs/dev/mutation.md): every step of a plan as ``layout plan --json``
# shows it, details included, from a few starting states.

BEST = layout.Scheduler('best-effort')
EQUAL4 = layout.Scheduler('equal-share', 4)


def gi(gid, profile, compute=None, scheduler=None):
    return layout.GpuInstance(id=gid, profile_id=profile,
                              scheduler=scheduler, compute=compute)


def state_m(mig=True, vfs=20, gis=(), mixed=None, scheduler=None):
    return layout.GpuState(address=ADDRESS, mig=mig, vfs=vfs, vfs_total=20,
                           gpu_instances=tuple(gis), mixed_size=mixed,
                           scheduler=scheduler)


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
        MIG, state_m(mig=None, vfs=4, gis=[gi(1, 99)])),
    'mig off, no vfs': (MIG, state_m(mig=False, vfs=0)),
    'mig on, partial vfs, gis kept': (
        MIG, state_m(vfs=4, gis=[gi(1, 19), gi(2, 9)])),
    'mig to mixed-size': (
        MIXED, state_m(gis=[gi(1, 19)], scheduler=BEST)),
    'mixed-size to time-sliced': (
        SLICED, state_m(mig=False, mixed=True)),
    'time-sliced to mixed-size, scheduler unread': (
        MIXED, state_m(mig=False, mixed=None)),
    'mig-time-sliced, gi scheduler differs': (
        MIG_SLICED, state_m(gis=[gi(1, 19, scheduler=BEST)])),
    'mig-time-sliced at its layout': (
        MIG_SLICED, state_m(gis=[gi(1, 19, scheduler=EQUAL4)])),
    'gis without compute or not asked for': (
        MIG, state_m(gis=[gi(1, 19, compute=False), gi(2, 19, compute=True),
                          gi(3, 0), gi(4, 9)])),
    'equal slices, more memory first': (TWO_SMALL, state_m()),
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
    got = lp.plan(MIG, tl.h100_facts(), state_m())
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
    got = lp.plan(MIG, _placed_facts(), state_m(gis=[_kept(0)]))
    assert [s.detail for s in got.steps] == [
        'create a 3g.40gb GPU instance at memory slice 4 (with its compute '
        'instance)'] + [
        'create a 1g.10gb GPU instance at memory slice %d (with its compute '
        'instance)' % i for i in (1, 2, 3)]


def test_gis_that_cannot_sit_beside_the_kept_one_are_refused_whole():
    with pytest.raises(layout.LayoutError) as e:
        lp.plan(MIG, _placed_facts(), state_m(gis=[_kept(4)]))
    assert str(e.value) == (
        'layout one, GPU 0000:41:00.0: the GPU cannot place 3g.40gb, '
        '1g.10gb, 1g.10gb, 1g.10gb together beside the GPU instances kept: '
        'its placements do not allow it; ask for fewer or smaller GPU '
        'instances')
