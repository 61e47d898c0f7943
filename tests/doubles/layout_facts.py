"""What a GPU reports for its layout (``layout.GpuFacts``: the H100's GI
profiles are those of a real H100, ``nvidia-smi mig -lgip``) and a layout
of the configuration built in code: shared by the layout's, the plan's,
layout_apply's and the exporter's tests."""

from libvirt_gpu.devices import layout
from libvirt_gpu import objects

H100 = '0000:41:00.0'
H100_B = '0000:42:00.0'
L40S = '0000:61:00.0'
GIB = 1024


def profile(pid, name, slices, instances, gib):
    return layout.GiProfile(id=pid, name=name, slices=slices,
                            instances=instances, memory_mib=int(gib * GIB))


# nvidia-smi mig -lgip on an H100 80GB
H100_PROFILES = (
    profile(19, '1g.10gb', 1, 7, 9.75), profile(20, '1g.10gb+me', 1, 1, 9.75),
    profile(15, '1g.20gb', 1, 4, 19.625), profile(14, '2g.20gb', 2, 3, 19.625),
    profile(9, '3g.40gb', 3, 2, 39.5), profile(5, '4g.40gb', 4, 1, 39.5),
    profile(0, '7g.80gb', 7, 1, 79.25))


def vtype(number, name, gib, gi=None, per_gi=None, size=None, slots=None):
    """A type's facts; ``size``: the slots a time-sliced one spans in
    mixed-size mode, at the multiples of ``size`` below ``slots``."""
    return layout.TypeFacts(
        type_id=objects.vendor_type_id(number), name=name,
        framebuffer_mib=gib * GIB, gi_profile_id=gi, max_per_gi=per_gi,
        placement_size=size, placements=tuple(
            range(0, slots - size + 1, size)) if size else ())


H100_TYPES = (
    vtype(1150, 'NVIDIA H100-1-10C', 10, gi=19, per_gi=1),
    vtype(1151, 'NVIDIA H100-1-10CME', 10, gi=20, per_gi=1),
    vtype(1152, 'NVIDIA H100-3-40C', 40, gi=9, per_gi=1),
    vtype(1153, 'NVIDIA H100-2-20C', 20, gi=14, per_gi=1),
    vtype(1160, 'NVIDIA H100-10C', 10, size=1, slots=8),
    vtype(1161, 'NVIDIA H100-20C', 20, size=2, slots=8),
    vtype(1162, 'NVIDIA H100-10Q', 10, size=1, slots=8))


def h100_facts(mig=True):
    return layout.GpuFacts(address=objects.PciAddress.parse(H100), mig=mig,
                           profiles=H100_PROFILES, types=H100_TYPES,
                           vfs_total=20)


def layout_of(mode='mig', gis=(('1g.10gb', 4), ('3g.40gb', 1)),
              types=(1150, 1152), scheduler=None, time_slice=None,
              counts=None):
    """``counts``: each type's (default: 1 each in mode mixed-size)."""
    if counts is None:
        counts = (1 if mode == 'mixed-size' else None,) * len(types)
    return layout.Layout(
        name='one', gpus=(objects.GpuSelector.parse('10de:2331'),),
        mode=mode, vgpu_types=tuple(objects.vendor_type_id(t)
                                    for t in types),
        gpu_instances=tuple(layout.GiCount(p, c) for p, c in gis),
        type_counts=tuple(counts), scheduler=scheduler,
        time_slice_ms=time_slice)
