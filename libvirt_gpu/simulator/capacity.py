"""How many more vGPUs of a type a simulated GPU can hold.

Three rules, as NVIDIA's driver applies them (``profile`` says which GPU
follows which: a device's ``mdev_types`` or its ``vgpu_types``):

1. Time-sliced vGPU before vGPU 17 on a GPU without SR-IOV (T4, V100): every
   vGPU on one physical GPU is of the same type, so::

       available_instances(type) = max_instance(type) - len(mdevs)
           if every existing mdev on the parent is of that type (or none)
       available_instances(type) = 0
           otherwise

2. The same GPUs' successors with SR-IOV (Ampere: A100, A16, A40 ...), where
   each VF is an mdev parent that holds **one** vGPU.  ``max_instance`` in a
   VF's type description is the whole GPU's (NVIDIA prints the GPU figure on
   every VF), so a VF shows::

       available_instances(type) = 1
           if the VF holds no mdev, every mdev on the GPU's VFs is of that
           type, and there are fewer than max_instance of them
       available_instances(type) = 0
           otherwise

   Creating on one VF lowers what the others show.  (A profile may mark a
   PF ``vf_capacity: per-vf`` to give each VF its own capacity: only the
   synthetic benchmark host does, to have many independent parents.)

3. vGPU 17+ vendor interface (Ada, Hopper, Blackwell on kernel >= 6.8), in
   the GPU's default equal-size mode: vGPUs of different types may share a
   GPU as long as they have the same framebuffer size.  A free VF lists in
   ``CREATABLE_TYPES``::

       every type, while the GPU holds no vGPU;
       the types of the framebuffer size in use whose max_instance is above
       the number of vGPUs on the GPU, once it holds some;
       nothing, once the GPU is full.

   A VF that holds a vGPU lists nothing (an assumption: we have seen no
   listing of a busy VF).  On a GPU whose profile entry has a ``gpu``
   section, MIG mode and mixed-size mode (``nvidia-smi vgpu -shm 1``) are
   simulated too: ``mig``'s rules, which use this one in equal-size mode.
"""

from libvirt_gpu import exception


def _type_of(mdev):
    """``(uuid, type_id)`` pair or an object with ``type_id``."""
    type_id = getattr(mdev, 'type_id', None)
    if type_id is None:
        type_id = mdev[1]
    return type_id


def available_instances(device, type_id, mdevs, gpu_mdevs=None):
    """``available_instances`` of ``type_id`` on ``device``.

    ``device`` is a :class:`~libvirt_gpu.simulator.profile.SimDevice` (its
    ``mdev_types`` and ``physfn`` are read); ``mdevs`` are the mdevs that
    exist on it now, as ``(uuid, type_id)`` pairs (``SimMdev``) or
    ``objects.Mdev``.  On a VF, ``gpu_mdevs`` are the mdevs on every VF of
    its GPU (rule 2; ``Profile.gpu_mdevs``); None: the VF is judged alone.
    """
    mtype = None
    for candidate in device.mdev_types:
        if candidate.id == type_id:
            mtype = candidate
            break
    if mtype is None:
        raise exception.SimulatorError(
            reason='device %s does not offer mdev type %s'
            % (device.address, type_id))
    mdevs = list(mdevs)
    if any(_type_of(m) != type_id for m in mdevs):
        return 0
    if getattr(device, 'physfn', None) is not None:
        if mdevs:
            return 0                       # one vGPU per VF
        if gpu_mdevs is None:
            return min(1, mtype.max_instance)
        on_gpu = list(gpu_mdevs)
        if any(_type_of(m) != type_id for m in on_gpu):
            return 0
        return 1 if len(on_gpu) < mtype.max_instance else 0
    return max(0, mtype.max_instance - len(mdevs))


def vf_creatable(vf, current_by_vf):
    """The types ``vf`` lists in ``nvidia/CREATABLE_TYPES`` (rule 3).

    ``vf``: a SimDevice with ``vgpu_types``; ``current_by_vf``: ``{VF
    address: type id or None}`` of every enabled VF of its GPU
    (``Profile.gpu_current_types``), ``vf`` included.
    """
    if current_by_vf.get(vf.address):
        return ()
    used = [t for t in current_by_vf.values() if t]
    if not used:
        return tuple(vf.vgpu_types)
    sizes = set()
    for type_id in used:
        mtype = vf.vgpu_type(type_id)
        if mtype is None:
            raise exception.SimulatorError(
                reason='VF %s does not know type %s held on its GPU'
                % (vf.address, type_id))
        sizes.add(mtype.framebuffer)
    return tuple(t for t in vf.vgpu_types
                 if t.framebuffer in sizes and len(used) < t.max_instance)
