"""Trait names of a GPU provider.  Names as data, one normalizing function.

pGPU:  OWNER_CYBORG, CUSTOM_<VENDOR>_<PRODUCT>         CUSTOM_NVIDIA_1EB8
vGPU:  OWNER_CYBORG, CUSTOM_<VENDOR>_<PRODUCT>_<TYPE>  CUSTOM_NVIDIA_1EB8_T4_2B
       plus, when enabled, the os-traits GPU traits its description supports
       (num_heads=4 -> HW_GPU_MAX_DISPLAY_HEADS_4, max_resolution=3840x2160 ->
       HW_GPU_RESOLUTION_W3840H2160), only where os-traits defines them.
"""

import os_traits

from libvirt_gpu import objects

OWNER = os_traits.OWNER_CYBORG

VENDOR_NAMES = {
    objects.NVIDIA_VENDOR_ID: 'NVIDIA',
    '1002': 'AMD',
    '8086': 'INTEL',
}

_KNOWN = frozenset(os_traits.get_traits())


def custom(*words):
    """``custom('NVIDIA', '1eb8', 'T4-2B')`` -> ``CUSTOM_NVIDIA_1EB8_T4_2B``.

    ``objects.custom_name``, the one normalizer (``os_traits.
    normalize_name``'s result, cut to Placement's 255 characters).
    """
    return objects.custom_name('_'.join(words))


def vendor_word(vendor_id):
    return VENDOR_NAMES.get(vendor_id, vendor_id)


def vgpu_type_word(mdev_type):
    """The type part of a trait: the name without its leading vendor word
    (``objects.type_word``).

    ``GRID T4-2B`` -> ``T4-2B``; ``NVIDIA RTX Pro 6000 Blackwell DC-48C`` ->
    ``RTX Pro 6000 Blackwell DC-48C``; no name -> the type id.
    """
    return objects.type_word(mdev_type.name) or mdev_type.id


def pgpu_traits(gpu):
    return frozenset({OWNER, custom(vendor_word(gpu.vendor_id),
                                    gpu.product_id)})


def description_traits(mdev_type):
    """Standard GPU traits that a type's description supports."""
    found = set()
    desc = objects.parse_description(mdev_type.description)
    heads = desc.get('num_heads')
    if heads and heads.isdigit():
        found.add('HW_GPU_MAX_DISPLAY_HEADS_%d' % int(heads))
    resolution = desc.get('max_resolution', '')
    w, _, h = resolution.partition('x')
    if w.isdigit() and h.isdigit():
        found.add('HW_GPU_RESOLUTION_W%dH%d' % (int(w), int(h)))
    return frozenset(found & _KNOWN)


def vgpu_traits(gpu, mdev_type, gpu_traits=True):
    traits = {OWNER, custom(vendor_word(gpu.vendor_id), gpu.product_id,
                            vgpu_type_word(mdev_type))}
    if gpu_traits:
        traits |= description_traits(mdev_type)
    return frozenset(traits)
