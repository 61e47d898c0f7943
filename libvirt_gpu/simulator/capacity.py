"""How many more mdevs of a type a simulated parent can hold.

The rule of NVIDIA's time-sliced vGPU before vGPU 17 (T4, V100, and each VF
of an Ampere GPU): every vGPU on one physical GPU is of the same type, so

    available_instances(type) = max_instance(type) - len(mdevs)
        if every existing mdev on the parent is of that type (or none exist)
    available_instances(type) = 0
        otherwise

which is the number the kernel shows in
``mdev_supported_types/<type>/available_instances``.
"""

from libvirt_gpu import exception


def _type_of(mdev):
    """``(uuid, type_id)`` pair or an object with ``type_id``."""
    type_id = getattr(mdev, 'type_id', None)
    if type_id is None:
        type_id = mdev[1]
    return type_id


def available_instances(device, type_id, mdevs):
    """``available_instances`` of ``type_id`` on ``device``.

    ``device`` is a :class:`~libvirt_gpu.simulator.profile.SimDevice` (only
    its ``mdev_types`` are read); ``mdevs`` are the mdevs that exist on it
    now, as ``(uuid, type_id)`` pairs (``SimMdev``) or ``objects.Mdev``.
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
    return max(0, mtype.max_instance - len(mdevs))
