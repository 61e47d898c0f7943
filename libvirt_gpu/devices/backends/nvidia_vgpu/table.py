"""What NVIDIA publishes about the GPUs of its vGPU 17+ vendor interface:
the models, their framebuffers and maximums, and how a type the host lists
is completed from them (``complete_types``).  Data and pure rules: no I/O.
"""

from __future__ import annotations

from libvirt_gpu import objects
from libvirt_gpu.util import records

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence


# --- what NVIDIA publishes about its GPUs ----------------------------------
#
# Only what a type the host lists lacks is filled in from here, by the type's
# NAME (type numbers change between driver releases, and
# ``creatable_vgpu_types`` lists only what is creatable now): a type the host
# does not list is never added.

@records.record
class GpuModel:
    """A GPU model of the vendor interface, as NVIDIA documents it.

    ``name``: the model as its type names begin (``NVIDIA L40S`` of
    ``NVIDIA L40S-4Q``); ``framebuffer_gb``: memory of the GPU;
    ``max_vgpus``: the most vGPUs one GPU holds (its smallest types are
    capped there).
    """

    name: str
    framebuffer_gb: int
    max_vgpus: int


# NVIDIA L40S (10de:26b9, Ada, 48 GB).  NVIDIA's per-GPU maximums in
# equal-size mode are 48 GB / the type's framebuffer, at most 32 (the
# L40S-1B description of vGPU 16 reads ``max_instance=32``).
L40S = GpuModel('NVIDIA L40S', 48, 32)

KNOWN_GPUS = {model.name: model for model in (L40S,)}

# "NVIDIA L40S-12Q" -> 12 (GB of framebuffer), time-sliced series only;
# MIG-backed names ("NVIDIA H100-1-10C") have their own maximums.
# (A pattern: ``re`` is imported and compiles it when first used, since
# the qemu hook imports this module.)
_TIME_SLICED_RE = r'-(\d+)([ABCQ])$'


def type_framebuffer_gb(name: str | None) -> int | None:
    """Framebuffer (GB) of a time-sliced type from its name, or None."""
    if not name:
        return None
    import re
    last = name.split()[-1]
    if re.search(r'-\d+-\d+[A-Z]+$', last):
        return None                    # MIG-backed
    m = re.search(_TIME_SLICED_RE, last)
    if m is None or int(m.group(1)) < 1:
        return None
    return int(m.group(1))


def model_of(name: str | None) -> GpuModel | None:
    """The GpuModel a type name belongs to (``NVIDIA L40S-4Q`` -> L40S), or
    None."""
    if not name or '-' not in name:
        return None
    return KNOWN_GPUS.get(name.rsplit('-', 1)[0])


def published_max(name: str | None,
                  visible_names: Iterable[str] = ()) -> int | None:
    """NVIDIA's per-GPU maximum of the type named ``name``, in equal-size
    mode.

    A known model: ``min(max_vgpus, framebuffer / type framebuffer)``.  An
    unknown one: the same division by the largest framebuffer among
    ``visible_names`` (the types the GPU lists now), which is the GPU's own
    while it is empty and smaller once it holds vGPUs - an estimate that can
    only be low, never high.  None when the name gives no framebuffer.
    """
    size = type_framebuffer_gb(name)
    if size is None:
        return None
    model = model_of(name)
    if model is not None:
        return max(1, min(model.max_vgpus, model.framebuffer_gb // size))
    sizes = [s for s in (type_framebuffer_gb(n) for n in visible_names) if s]
    if not sizes:
        return None
    return max(1, max(sizes) // size)


def complete_types(pf: objects.Gpu,
                   vfs: Sequence[objects.Gpu]) -> list[objects.Gpu]:
    """The VF Gpu records of one physical GPU with their vendor types
    completed: every type named (from any VF's list - a VF's current type
    is a number only - else NVML's name of that id) and given its maximum
    (NVML's ``nvmlVgpuTypeGetMaxInstances`` where NVML answered for the
    GPU, ``pf.nvml``; else NVIDIA's published one, by name).  Only the
    types the VFs list, never one NVML or a table adds; VFs without the
    vendor interface are returned unchanged."""
    names: dict[objects.TypeId, str | None] = {}
    for vf in vfs:
        if vf.vendor_vf is not None \
                and vf.vendor_vf.interface == objects.VENDOR_INTERFACE:
            for mtype in vf.vendor_vf.creatable:
                names.setdefault(mtype.id, mtype.name)
    visible = tuple(n for n in names.values() if n)

    by_nvml = {objects.vendor_type_id(t.id): t
               for t in (pf.nvml.vgpu_types if pf.nvml is not None else ())}

    def complete(mtype: objects.VgpuType) -> objects.VgpuType:
        nvml = by_nvml.get(mtype.id)
        name = mtype.name or names.get(mtype.id) or (
            nvml.name if nvml is not None else None)
        return records.replace(
            mtype, name=name,
            published_max=(nvml.max_instances if nvml is not None
                           and nvml.max_instances > 0
                           else published_max(name, visible)))

    done = []
    for vf in vfs:
        state = vf.vendor_vf
        if state is not None and state.interface == objects.VENDOR_INTERFACE:
            state = objects.VendorVf(
                creatable=tuple(complete(t) for t in state.creatable),
                current=complete(state.current) if state.current else None)
            vf = records.replace(vf, vendor_vf=state)
        done.append(vf)
    return done
