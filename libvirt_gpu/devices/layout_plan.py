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
   profile first (so small ones do not split the space a large one needs),
   each with its compute instance;
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
    gi_id: int | None = None         # DESTROY_GI
    scheduler: layout_mod.Scheduler | None = None

    def to_json(self):
        found = {'action': self.action, 'detail': self.detail}
        for name in ('on', 'count', 'profile_id', 'gi_id'):
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


def _gi_steps(layout, facts, gis):
    wanted = layout_mod.wanted_gpu_instances(layout, facts)
    kept = collections.Counter()
    steps = []
    for gi in sorted(gis, key=lambda g: g.id):
        if kept[gi.profile_id] < wanted.get(gi.profile_id, 0):
            kept[gi.profile_id] += 1
            continue
        steps.append(Step(DESTROY_GI, 'destroy GPU instance %d (%s): not in '
                          'the layout' % (gi.id, _profile_name(
                              facts, gi.profile_id)), gi_id=gi.id))

    def size(profile_id):
        profile = facts.profile_by_id(profile_id)
        return (-profile.slices, -profile.memory_mib, profile_id)
    for profile_id in sorted(wanted, key=size):
        for _ in range(wanted[profile_id] - kept[profile_id]):
            steps.append(Step(CREATE_GI, 'create a %s GPU instance (with its '
                              'compute instance)' % _profile_name(
                                  facts, profile_id),
                              profile_id=profile_id))
    return steps
