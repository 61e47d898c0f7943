"""The steps that bring a GPU from what it is (``layout.GpuState``) to its
layout, in the order NVIDIA's driver needs; pure (records in, records
out).

The order (docs/admin/layouts.md says why):

1. MIG mode, when it differs: the GPU instances destroyed and the VFs
   disabled first (the driver refuses a MIG mode change while VFs are
   enabled);
2. VFs: all of ``sriov_totalvfs`` (a partial set is disabled first);
   enabling VFs destroys every GPU instance, so none is counted after it;
3. GPU instances (MIG modes): those of a profile the layout does not ask
   for, or beyond its count, destroyed; the missing ones made, largest
   profile first, each at a placement chosen so that all of them fit
   beside the ones kept (the driver, left to choose, may put a 3g.40gb
   where four 1g.10gb then cannot all go), each with its compute
   instance;
4. mixed-size mode (time-sliced modes; N/A with MIG): on for
   ``mixed-size``, off otherwise; enabling VFs clears it;
5. the vGPU scheduler, when the layout names one and it differs (per GPU
   instance in ``mig-time-sliced``).

Only what differs is a step: a GPU at its layout gets none.
"""

from __future__ import annotations

import collections

from libvirt_gpu.devices import layout as layout_mod
from libvirt_gpu import objects
from libvirt_gpu.util import records

DESTROY_GI = 'destroy-gi'
DISABLE_VFS = 'disable-vfs'
MIG_MODE = 'mig-mode'
ENABLE_VFS = 'enable-vfs'
CREATE_GI = 'create-gi'
MIXED_SIZE = 'mixed-size'
SCHEDULER = 'scheduler'
GI_SCHEDULER = 'gi-scheduler'
ACTIONS = (DESTROY_GI, DISABLE_VFS, MIG_MODE, ENABLE_VFS, CREATE_GI,
           MIXED_SIZE, SCHEDULER, GI_SCHEDULER)


@records.record
class Step:
    """One change to one GPU."""

    action: str                  # one of ACTIONS
    detail: str                  # what it does, for people
    on: bool | None = None       # MIG_MODE, MIXED_SIZE
    count: int | None = None     # ENABLE_VFS
    profile_id: int | None = None    # CREATE_GI
    start: int | None = None         # CREATE_GI: its placement, if known
    gi_id: int | None = None         # DESTROY_GI
    scheduler: layout_mod.Scheduler | None = None

    def to_json(self):
        found = {'action': self.action, 'detail': self.detail}
        for name in ('on', 'count', 'profile_id', 'start', 'gi_id'):
            if getattr(self, name) is not None:
                found[name] = getattr(self, name)
        if self.scheduler is not None:
            found['scheduler'] = self.scheduler.policy
            found['time_slice_ms'] = self.scheduler.time_slice_ms
        return found


@records.record
class GpuPlan:
    """The steps of one GPU, and the vGPUs that forbid running them."""

    layout: str
    address: objects.PciAddress
    steps: tuple          # Step, in order
    vgpus: tuple = ()     # VFs of the GPU that hold a vGPU now

    @property
    def converged(self):
        return not self.steps


def _profile_name(facts, profile_id):
    profile = facts.profile_by_id(profile_id)
    return profile.name if profile is not None else 'profile %d' % profile_id


def _same_scheduler(current, wanted):
    if current is None or current.policy != wanted.policy:
        return False
    return (wanted.time_slice_ms is None
            or current.time_slice_ms == wanted.time_slice_ms)


def plan(layout, facts, state):
    """The ``GpuPlan`` of one GPU (``facts`` and ``state`` read from it)."""
    steps = []
    gis = list(state.gpu_instances)
    vfs = state.vfs
    fresh_vfs = False
    if state.mig is None and layout.mig or \
            state.mig is not None and state.mig != layout.mig:
        for gi in gis:
            steps.append(Step(DESTROY_GI, 'destroy GPU instance %d (%s)' % (
                gi.id, _profile_name(facts, gi.profile_id)), gi_id=gi.id))
        gis = []
        if vfs:
            steps.append(Step(DISABLE_VFS, 'disable the %d VFs (the driver '
                              'changes MIG mode only without VFs)' % vfs))
            vfs = 0
        steps.append(Step(MIG_MODE, 'turn MIG mode %s' % (
            'on' if layout.mig else 'off'), on=layout.mig))
    if state.vfs_total and vfs != state.vfs_total:
        if vfs:
            steps.append(Step(DISABLE_VFS, 'disable the %d of %d VFs enabled'
                              % (vfs, state.vfs_total)))
        steps.append(Step(ENABLE_VFS, 'enable %d VFs%s' % (
            state.vfs_total, ' (this destroys every GPU instance)'
            if gis else ''), count=state.vfs_total))
        gis = []
        fresh_vfs = True
    if layout.mig:
        steps.extend(_gi_steps(layout, facts, gis))
    else:
        current = False if fresh_vfs else state.mixed_size
        wanted = layout.mode == layout_mod.MIXED_SIZE
        if current is None and wanted or \
                current is not None and current != wanted:
            steps.append(Step(MIXED_SIZE, 'turn mixed-size mode %s' % (
                'on' if wanted else 'off'), on=wanted))
    scheduler = layout_mod.wanted_scheduler(layout)
    if scheduler is not None:
        if layout.mode == layout_mod.MIG_TIME_SLICED:
            created = any(s.action == CREATE_GI for s in steps)
            if created or not all(_same_scheduler(gi.scheduler, scheduler)
                                  for gi in gis):
                steps.append(Step(GI_SCHEDULER, 'set the vGPU scheduler of '
                                  'each GPU instance to %s' % scheduler,
                                  scheduler=scheduler))
        elif not _same_scheduler(state.scheduler, scheduler):
            steps.append(Step(SCHEDULER, 'set the vGPU scheduler to %s%s' % (
                scheduler, ' (now %s)' % state.scheduler
                if state.scheduler else ''), scheduler=scheduler))
    return GpuPlan(layout=layout.name, address=state.address,
                   steps=tuple(steps), vgpus=tuple(state.vgpus))


def _placements(layout, facts, kept, todo):
    """A placement (first memory slice) for each GPU instance of ``todo``
    (profile ids, largest first) beside the ``kept`` ones, so that all of
    them fit; Nones where the GPU did not say where its GPU instances can
    sit (the driver then chooses).  LayoutError when no arrangement
    holds them."""
    profiles = [facts.profile_by_id(p) for p in todo]
    if not todo or not all(p.placements for p in profiles) or any(
            gi.start is None or gi.size is None for gi in kept):
        return [None] * len(todo)
    used = set()
    for gi in kept:
        used.update(range(gi.start, gi.start + gi.size))

    def place(index, used):
        if index == len(profiles):
            return []
        for start, width in profiles[index].placements:
            span = set(range(start, start + width))
            if span & used:
                continue
            rest = place(index + 1, used | span)
            if rest is not None:
                return [start] + rest
        return None
    found = place(0, frozenset(used))
    if found is None:
        raise layout_mod.LayoutError(
            layout=layout.name, address=facts.address,
            reason='the GPU cannot place %s together%s: its placements do '
                   'not allow it; ask for fewer or smaller GPU instances'
                   % (', '.join(p.name for p in profiles),
                      ' beside the GPU instances kept' if kept else ''))
    return found


def _gi_steps(layout, facts, gis):
    wanted = layout_mod.wanted_gpu_instances(layout, facts)
    kept = collections.Counter()
    steps = []
    for gi in sorted(gis, key=lambda g: g.id):
        wanted_more = kept[gi.profile_id] < wanted.get(gi.profile_id, 0)
        if wanted_more and gi.compute is not False:
            kept[gi.profile_id] += 1
            continue
        # a GPU instance without its compute instance (a failed apply
        # could not destroy it again) holds no vGPU: made again
        why = ('it has no compute instance (left by a failed apply): it is '
               'made again' if wanted_more else 'not in the layout')
        steps.append(Step(DESTROY_GI, 'destroy GPU instance %d (%s): %s' % (
            gi.id, _profile_name(facts, gi.profile_id), why), gi_id=gi.id))

    def size(profile_id):
        profile = facts.profile_by_id(profile_id)
        return (-profile.slices, -profile.memory_mib, profile_id)
    todo = [profile_id for profile_id in sorted(wanted, key=size)
            for _ in range(wanted[profile_id] - kept[profile_id])]
    starts = _placements(layout, facts, [
        gi for gi in gis if gi.id not in {s.gi_id for s in steps}], todo)
    for profile_id, start in zip(todo, starts):
        where = '' if start is None else ' at memory slice %d' % start
        steps.append(Step(CREATE_GI, 'create a %s GPU instance%s (with its '
                          'compute instance)' % (_profile_name(
                              facts, profile_id), where),
                          profile_id=profile_id, start=start))
    return steps
