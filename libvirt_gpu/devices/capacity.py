"""How many vGPUs a GPU can hold: the rules, in one place, without I/O.

Placement's inventory (``placement.model``) and the allocator's free count
(``allocator.Allocator.free``) both come from here, so what Placement is
told a GPU can hold and what the allocator lets it hold cannot drift apart.

``vgpu_total(gpu, enabled)`` is the capacity of one physical GPU
(``objects.Gpu``, read with its VFs) for its enabled type:

* a GPU without VFs (T4): ``available_instances`` of the type plus the
  vGPUs of the type it holds (``parent_total``);
* a GPU whose vGPUs live on VFs, one each (Ampere mdev on VFs, NVIDIA's
  vGPU 17+ vendor interface): the vGPUs of the type on all its functions
  plus the free functions that can take one now.

Either way never above the limit (``limit``), never below what exists.
Without any limit a VF-based GPU reports what exists plus one: summing free
VFs would over-report (16 VFs of an A100 are not 16 vGPUs), and an
under-report is the safe mistake.

``free(total, used, pending, other_types)`` is what the allocator can still
give once it knows the GPU's leases.
"""

NO_IOMMU_GROUP = (
    'no IOMMU group, so VFIO cannot hand it to a guest: turn the IOMMU on '
    '(VT-d / AMD-Vi in the firmware, intel_iommu=on on Intel hosts) and '
    'reboot')


def pgpu_refusal(gpu):
    """Why ``gpu`` cannot be given whole to a guest (its whole-GPU capacity
    is then 0), or None: it has no IOMMU group, or its group also holds a
    device the host uses (VFIO hands a guest the whole group, so that
    device would be taken from the host).  vGPUs need no group of their
    parent: each mdev or VF gets its own."""
    if gpu.iommu_group is None:
        return NO_IOMMU_GROUP
    used = [m for m in gpu.iommu_members if m.host_uses]
    if used:
        return ('its IOMMU group %d also holds %s, which the host uses; VFIO '
                'hands a guest the whole group: put the GPU in a slot with a '
                'group of its own' % (gpu.iommu_group, ', '.join(
                    '%s (%s, driver %s)' % (
                        m.address, m.host_class or m.class_code, m.driver)
                    for m in used)))
    return None


def pgpu_companions(gpu):
    """The functions of ``gpu``'s IOMMU group that go to a guest with it
    (its HDMI audio function), sorted."""
    return tuple(sorted(m.address for m in gpu.iommu_members
                        if m.companion))


def limit(mtype, enabled):
    """The smaller of NVIDIA's per-GPU maximum (``max_instance`` of the
    description, or the published one) and ``[vgpu_<type>]/max_instances``;
    None when neither is known.  The setting can lower the maximum, never
    raise it above the driver's."""
    limits = [v for v in (mtype.max_instance, enabled.max_instances)
              if v is not None]
    return min(limits) if limits else None


def parent_total(mtype, used, enabled):
    """Capacity of one mdev parent without VFs for the type ``mtype``
    (``objects.VgpuType`` as the parent lists it, or None when it does not)
    of which it holds ``used`` vGPUs."""
    if mtype is None:
        return 0
    total = mtype.available_instances + used
    cap = limit(mtype, enabled)
    if cap is not None:
        total = min(total, max(cap, used))
    return total


def vgpu_total(gpu, enabled):
    """Capacity of ``enabled`` (``objects.EnabledType``) on the physical GPU
    ``gpu`` (see the module doc)."""
    type_id = enabled.type_id
    if not gpu.vf_gpus:
        used = sum(1 for m in gpu.mdevs if m.type_id == type_id)
        return parent_total(gpu.mdev_type(type_id), used, enabled)
    mtype = gpu.offered_type(type_id)
    if mtype is None:
        return 0
    used = 0
    offering = 0
    for function in gpu.functions:
        held = function.used_type_ids
        used += sum(1 for t in held if t == type_id)
        if function.is_vf and held:
            continue                     # a VF holds one vGPU
        for candidate in function.vgpu_types:
            if candidate.id == type_id and candidate.available_instances > 0:
                offering += (1 if function.is_vf
                             else candidate.available_instances)
                break
    cap = limit(mtype, enabled)
    if cap is None:
        import logging      # not on the qemu hook's path otherwise
        logging.getLogger(__name__).warning(
            'no maximum known for vGPU type %s on GPU %s (no max_instance in '
            'its description, no published one): reporting %d; set '
            '[vgpu_%s]/max_instances', type_id, gpu.address,
            used + min(offering, 1), type_id)
        return used + min(offering, 1)
    return min(used + offering, max(cap, used))


def free(total, used, pending=0, other_types=False):
    """What a GPU of capacity ``total`` can still give: less the vGPUs it
    holds (``used``) and the leases not created yet (``pending``); 0 while
    a vGPU of another type blocks it (``other_types``: NVIDIA's time-sliced
    vGPUs share one type per GPU).  On a GPU without VFs any vGPU or lease
    of another type blocks it; on a GPU whose vGPUs live on VFs only a
    lease not created yet does, since each VF lists what the driver still
    lets it make."""
    if other_types:
        return 0
    return max(0, total - used - pending)
