"""Which GPUs an option names: the one parse of a GPU list and the one
resolver against the host, with the one set of refusals.

An option that names GPUs (``[layout_<name>]/gpus``, ``[nova_<name>]/
gpus``, ``[routes]/cyborg``) lists selectors (``objects.GpuSelector``: a
PCI address, ``0000:41:00.0``, or the vendor:product ids of a model,
``10de:2331``), or, where the option allows it, ``all`` alone (every
physical GPU).  ``parse`` reads the list once, where the configuration
enters; ``resolve`` reads it against the host's GPUs: an address must be
a physical GPU of this host, a model may match none (one configuration
serves hosts of several models).  Each refusal is a ConfigError whose
message starts with the option.
"""

from __future__ import annotations

from libvirt_gpu import exception
from libvirt_gpu import objects

ALL = 'all'


def _refuse(option, reason):
    return exception.ConfigError(reason='%s%s' % (option, reason))


def parse(option, values, required=False, allow_all=False):
    """The selectors of ``values`` (a configuration list) for the option
    ``option`` (``'[routes]/cyborg'``), in order; ``ALL`` for ``all``
    alone where ``allow_all``.  ConfigError for an empty list when
    ``required``, ``all`` beside GPUs, and an entry that names no GPU."""
    values = [v.strip() if isinstance(v, str) else v for v in values]
    if not values:
        if required:
            raise _refuse(option, ' is empty: name the GPUs by PCI address '
                                  '(0000:41:00.0) or by model, their '
                                  'vendor:product ids (10de:2331)')
        return ()
    if allow_all and ALL in values:
        if values == [ALL]:
            return ALL
        raise _refuse(option, ': "all" stands alone (every GPU no other '
                              'route claims); or list the GPUs')
    try:
        return objects.GpuSelector.parse_list(values)
    except exception.InvalidInput as e:
        raise _refuse(option, ': %s' % e.kwargs['reason'])


def resolve(option, selectors, gpus, vf_hint=''):
    """``((selector, (Gpu, ...)), ...)``: each selector of ``selectors``
    (``parse``'s answer) with the physical GPUs of ``gpus`` (``objects.
    Gpu``, PFs with their VFs) it names, in order (``ALL``: one pair,
    ``(None, every physical GPU)``).  ConfigError for an address where
    this host has no GPU and the address of a VF (``vf_hint``: what the
    caller adds to "name the physical GPU")."""
    if selectors == ALL:
        return ((None, tuple(g for g in gpus if not g.is_vf)),)
    by_address = {gpu.address: gpu for gpu in gpus}
    found = []
    for selector in selectors:
        if selector.by_model:
            found.append((selector, tuple(
                g for g in gpus if not g.is_vf and selector.matches(g))))
        else:
            found.append((selector, (physical(
                option, selector.address, by_address, vf_hint),)))
    return tuple(found)


def physical(option, address, by_address, vf_hint=''):
    """The physical GPU at ``address`` (``by_address``: ``{PciAddress:
    Gpu}`` of the host), which ``option`` names; ConfigError when this
    host has no GPU there or it is a VF (``vf_hint`` as ``resolve``'s)."""
    gpu = by_address.get(address)
    if gpu is None:
        raise _refuse(option, ' names %s, but this host has no GPU there '
                              '(`libvirt-gpu list` shows the GPUs)' % address)
    if gpu.is_vf:
        raise _refuse(option, ' names %s, a VF of the GPU %s; name the '
                              'physical GPU%s' % (address, gpu.physfn,
                                                  vf_hint))
    return gpu
