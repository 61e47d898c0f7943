"""What the configuration enables on each GPU: ``resolve``.

The rules that read ``[gpu]/enabled_vgpu_types`` and the ``[vgpu_<type>]``
sections against the discovered GPUs.  No oslo.config here: ``conf`` is
anything that reads like a ConfigOpts (``conf.gpu.enabled_vgpu_types``,
``conf['vgpu_<type>'].device_addresses``), the CLI's settings snapshot
(``confcache.Values``) included.  The options themselves are declared in
``libvirt_gpu.conf.vgpu``.

A GPU in a layout (``[gpu]/layouts``, ``devices.layout``) offers its
layout's types: the first is its ``EnabledType``, the others that
record's ``others``; no ``[vgpu_<type>]/device_addresses`` may name it.
"""

from __future__ import annotations

from libvirt_gpu import exception
from libvirt_gpu.util import logs
from libvirt_gpu import objects
from libvirt_gpu.devices import selectors
from libvirt_gpu.util import records

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

LOG = logs.getLogger(__name__)


def group_name(type_id: str) -> str:
    return 'vgpu_%s' % type_id


class Enabled(dict[objects.PciAddress, objects.EnabledType]):
    """``resolve``'s answer: ``{PciAddress: EnabledType}``, and
    ``configured``: every type ``[gpu]/enabled_vgpu_types`` names, in its
    order, offered by a GPU here or not, so that a refusal can tell a type
    not enabled from one enabled that no GPU of this host offers.  A copy
    (``Enabled(enabled)``) keeps ``configured``."""

    def __init__(self,
                 items: (Mapping[objects.PciAddress, objects.EnabledType]
                         | Iterable[tuple[objects.PciAddress,
                                          objects.EnabledType]]) = (),
                 configured: Iterable[objects.TypeId] | None = None
                 ) -> None:
        super().__init__(items)
        if configured is None:
            configured = getattr(items, 'configured', ())
        self.configured = tuple(configured)


def _resource_class(type_id, value):
    # imported here: the qemu hook imports this module for ``Enabled``
    import os_resource_classes
    if value in os_resource_classes.STANDARDS or \
            objects.is_custom_name(value):
        return value
    raise exception.ConfigError(
        reason='[%s]/resource_class %r is neither a standard resource class '
               '(VGPU) nor a valid CUSTOM_ name' % (group_name(type_id),
                                                    value))


def _offers(gpus):
    """What each physical GPU offers, GPUs that offer the same listed
    together: ``0000:3b:00.0 and 0000:af:00.0 offer nvidia-222,
    nvidia-223; 0000:5e:00.0 offers no vGPU type``."""
    by_offer = {}
    for gpu in gpus:
        if gpu.is_vf:
            continue
        offered = tuple(sorted({t.id for t in gpu.offered_types()}))
        by_offer.setdefault(offered, []).append(str(gpu.address))
    said = []
    for offered, addresses in sorted(by_offer.items(),
                                     key=lambda item: item[1]):
        said.append('%s %s %s' % (
            ' and '.join(sorted(addresses)),
            'offers' if len(addresses) == 1 else 'offer',
            ', '.join(offered) or 'no vGPU type'))
    return '; '.join(said) or 'this host has no GPU'


def _warn_not_offered(type_id, gpus):
    """A single enabled type, without addresses, that no GPU offers: every
    GPU stays whole (PGPU), which is rarely what was meant.  Each GPU is
    named with what it offers."""
    LOG.warning('[gpu]/enabled_vgpu_types names %s, but no GPU of this host '
                'offers it, so every GPU is offered whole (PGPU): %s',
                type_id, _offers(gpus))


def device_addresses(conf, type_id):
    """``[vgpu_<type_id>]/device_addresses`` parsed, where the
    configuration enters the program: a list of ``objects.PciAddress``
    (empty: every GPU); ConfigError naming the option for a bad one."""
    found = []
    for raw in conf[group_name(type_id)].device_addresses:
        try:
            found.append(objects.PciAddress.parse(raw))
        except exception.InvalidPciAddress as e:
            raise exception.ConfigError(
                reason='[%s]/device_addresses: %s'
                % (group_name(type_id), e))
    return found


def resolve(conf, gpus, layouts):
    """Map each GPU address to what configuration enables on it.

    ``gpus`` are the discovered ``objects.Gpu``; ``layouts`` the
    configuration's layouts resolved against them (``{PciAddress:
    Layout}``, ``Environment.layouts``: read once, by the caller).
    Returns an ``Enabled`` ``{PciAddress: EnabledType}``, keyed by
    *physical* GPU: a GPU with SR-IOV is named by its PF address, and the
    type counts as offered when the PF or any of its VFs offers it
    (``Gpu.offered_type``).  Raises
    ConfigError for: an invalid address, an address claimed by two types, a
    type the GPU at an address does not offer (or no GPU there), the
    address of a VF (name its physical GPU instead: capacity, the Placement
    provider and the configuration are per physical GPU), several
    enabled types of which one lists no addresses, and a GPU in a layout
    and in ``device_addresses``.
    """
    types = list(conf.gpu.enabled_vgpu_types)
    if len(set(types)) != len(types):
        raise exception.ConfigError(
            reason='[gpu]/enabled_vgpu_types lists a type twice: %s'
            % ', '.join(types))
    by_address = {gpu.address: gpu for gpu in gpus}
    enabled = {}
    claimed_by = {}
    for type_id in types:
        setting = _configured(conf, type_id)
        if not conf[group_name(type_id)].device_addresses:
            if len(types) > 1:
                raise exception.ConfigError(
                    reason='several types are enabled (%s) but [%s] lists no '
                           'device_addresses; with more than one type each '
                           'needs its own list of GPUs'
                           % (', '.join(types), group_name(type_id)))
            for gpu in gpus:
                if not gpu.is_vf and gpu.offered_type(type_id) is not None:
                    enabled[gpu.address] = setting
            if not enabled:
                _warn_not_offered(type_id, gpus)
            continue
        for address in device_addresses(conf, type_id):
            if claimed_by.get(address) == type_id:
                raise exception.ConfigError(
                    reason='[%s]/device_addresses lists the GPU %s twice; '
                           'list each GPU once' % (group_name(type_id),
                                                   address))
            if address in claimed_by:
                raise exception.ConfigError(
                    reason='GPU %s is claimed by two types: %s and %s; give '
                           'each GPU to one type only'
                           % (address, claimed_by[address], type_id))
            claimed_by[address] = type_id
            _not_in_layout(type_id, address, layouts)
            gpu = selectors.physical(
                '[%s]/device_addresses' % group_name(type_id), address,
                by_address, vf_hint=': its VFs are used as one')
            if gpu.offered_type(type_id) is None:
                offered = ', '.join(t.id for t in gpu.offered_types()) \
                    or 'none'
                hint = ''
                if not gpu.offered_types():
                    hint = ('; if its vGPUs live on SR-IOV VFs (Ampere and '
                            'later), are the VFs enabled? (`libvirt-gpu '
                            'restore`, or NVIDIA\'s sriov-manage -e %s)'
                            % address)
                raise exception.ConfigError(
                    reason='the GPU at %s does not offer type %s (it offers: '
                           '%s)%s' % (address, type_id, offered, hint))
            enabled[address] = setting
    enabled.update(_layout_types(conf, layouts))
    return Enabled(enabled, configured=types)


# --- layouts (devices.layout) ------------------------------------------------

def _not_in_layout(type_id, address, in_layout):
    layout = in_layout.get(address)
    if layout is not None:
        raise exception.ConfigError(
            reason='[%s]/device_addresses names %s, which is in layout [%s]; '
                   'a GPU in a layout offers the layout\'s vgpu_types: '
                   'remove it from one of them'
                   % (group_name(type_id), address, layout.section))


def _layout_types(conf, in_layout):
    """``{PciAddress: EnabledType}`` of the GPUs in a layout: the layout's
    first vGPU type, the others in its ``others``, each with the resource
    class and limit of its ``[vgpu_<type>]`` section when the type is also
    in ``[gpu]/enabled_vgpu_types`` (VGPU otherwise), and the count the
    layout gives it as a further limit.  What the GPU can hold is checked
    against the GPU itself by ``layout plan``/``apply``."""
    enabled = {}
    for address, layout in in_layout.items():
        first, *others = [_layout_type(conf, layout, type_id)
                          for type_id in layout.vgpu_types]
        enabled[address] = records.replace(first, others=tuple(others))
    return enabled


def _configured(conf, type_id):
    """The ``EnabledType`` of ``type_id`` as ``[vgpu_<type_id>]`` sets it:
    its resource class and limit."""
    section = conf[group_name(type_id)]
    return objects.EnabledType(
        type_id=objects.TypeId.parse(type_id),
        resource_class=_resource_class(type_id, section.resource_class),
        max_instances=section.max_instances)


def _layout_type(conf, layout, type_id):
    setting = objects.EnabledType(type_id)
    if type_id in conf.gpu.enabled_vgpu_types:
        setting = _configured(conf, type_id)
    limits = [n for n in (layout.count(type_id), setting.max_instances)
              if n is not None]
    return records.replace(setting, max_instances=min(limits)
                           if limits else None)
