"""VFs carved for OpenStack Nova: the configuration read against the host,
and our record of what was carved.

A *carving* (``[nova]/carved``, one ``[nova_<name>]`` section each, declared
in ``libvirt_gpu.conf.nova``) says: on the GPUs ``gpus`` (addresses of
physical GPUs, or vendor:product ids of a model: ``objects.GpuSelector``),
write the vGPU type ``vgpu_type`` to ``count`` VFs, for Nova's PCI
passthrough.  ``resolve`` reads the carvings against the host's GPUs and
returns one ``CarvedGpu`` per GPU: which VFs (the ``count``
lowest-numbered ones, always the same, so the PCI records Nova keeps of
them stay valid across reboots), their PCI ids, the resource class and
the alias Nova will know them by.  It refuses, naming the option, the GPU
and what it offers: a type the GPU does not offer, more VFs than the GPU
holds of the type, a GPU two carvings claim, a GPU that
``[gpu]/enabled_vgpu_types`` also enables (a GPU can't be claimed by two
routes), a GPU without a vendor interface on its VFs.

Carving writes a type to VFs and nothing else: where the vGPU lands on
the GPU (time-sliced, MIG-backed, a mixed-size placement) is the driver's
choice, so a carving does not depend on how the GPU is laid out.  A GPU
in a layout (``[gpu]/layouts``, ``devices.layout``) may be carved: the
layout sets its mode (``restore`` applies it before carving), the
carving writes the type, and the GPU is Nova's (what the layout enables
for our own route is then left out everywhere a carved GPU is).

What ``libvirt-gpu restore`` carved is recorded in
``<state_dir>/nova-carved.json`` (``store.carved.CarveRecord``)::

    {"version": 1, "vfs": {"0000:bd:00.4": {
        "gpu": "0000:bd:00.0", "type_id": "nvidia-1153",
        "type_name": "NVIDIA L40S-12Q", "carving": "l40s_12q"}}}

The type's name is kept because a GPU whose capacity the carved VFs
take whole lists no creatable type any more, and a VF names only the
number of the type it holds: without NVML the name (and so the default
resource class and alias) is then known from the record alone.

The record is what the parts that run without the configuration read
(the qemu hook, the allocator it builds): a recorded VF is Nova's, never
handed to another guest, and so is the GPU it is a VF of on this host,
never offered by us (``on_host``: the one rule the allocator, the hook's
release and the pass-through check follow).  A record that cannot be
read (``store.carved.DamagedRecord``, its message saying to run
``restore``, which sets it aside and rebuilds it) names nothing, and
every GPU that could be carved is held as Nova's meanwhile; other GPUs
are unaffected.  ``Carved``
holds both views, the planned and the recorded (``environment.Environment.
carved``).  No oslo.config here: ``conf`` reads like a ConfigOpts or the
CLI's snapshot of one.
"""

from __future__ import annotations

from libvirt_gpu.devices import capabilities
from libvirt_gpu import exception
from libvirt_gpu.devices import capacity
from libvirt_gpu.util import logs
from libvirt_gpu import objects
from libvirt_gpu.devices import selectors as selectors_mod
from libvirt_gpu.util import records
from libvirt_gpu.store import carved as record_mod

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Protocol

    class _Sysfs(Protocol):         # sysfs.Sysfs, what ``on_host`` reads
        def physfn(self, address: objects.PciAddress
                   ) -> objects.PciAddress | None: ...

LOG = logs.getLogger(__name__)

SECTION_PREFIX = 'nova_'
# the alias's pattern (``re`` imported where it is used: the qemu hook
# imports this module and reads no configuration)
_ALIAS = r'[A-Za-z0-9][A-Za-z0-9_.-]{0,63}'


def section(name):
    """``l40s_12q`` -> ``nova_l40s_12q``: the section of a carving."""
    return SECTION_PREFIX + name


@records.record
class Carving:
    """One ``[nova_<name>]`` section, its values parsed."""

    name: str
    selectors: tuple[objects.GpuSelector, ...]
    type_id: objects.TypeId
    count: int
    resource_class: str | None = None    # None: from the type's name
    alias: str | None = None             # None: from the type's name

    @property
    def section(self):
        return section(self.name)


@records.record
class CarvedGpu:
    """One GPU of a carving, resolved against the host: the VFs that hold
    (or will hold) the type for Nova, in address order."""

    carving: Carving
    gpu: objects.PciAddress
    vfs: tuple[objects.PciAddress, ...]
    type_name: str | None                # 'NVIDIA L40S-12Q'
    vendor_id: str                       # the VFs' PCI ids
    product_id: str
    resource_class: str
    alias: str

    @property
    def type_id(self):
        return self.carving.type_id


@records.record
class Carved:
    """What is Nova's on a host: the carvings resolved from the
    configuration (``planned``; empty without one, as in the hook), the
    VFs the record names (``recorded``) and the physical GPUs the record
    makes Nova's on this host (``holding``: ``on_host``, the one rule)."""

    planned: tuple[CarvedGpu, ...] = ()
    recorded: tuple[record_mod.CarvedVf, ...] = ()
    holding: frozenset = frozenset()
    damaged: object = None           # the DamagedRecord, when unreadable

    @property
    def held_gpus(self) -> frozenset[objects.PciAddress]:
        """The physical GPUs nothing of ours may be given: those that are
        Nova's (planned or recorded, and every GPU that holds a recorded
        VF on this host), and while the record cannot be read every GPU
        that could be carved (the allocator's and pass-through's
        view)."""
        return frozenset([c.gpu for c in self.planned]
                         + [r.gpu for r in self.recorded]) | self.holding

    @property
    def gpus(self):
        """``held_gpus`` for what is reported to Placement and Cyborg:
        DamagedRecord while the record cannot be read (a report does not
        guess which GPUs are Nova's)."""
        if self.damaged is not None:
            raise self.damaged
        return self.held_gpus

    @property
    def vfs(self) -> frozenset[objects.PciAddress]:
        """The VFs that are Nova's (planned or recorded)."""
        found = {vf for c in self.planned for vf in c.vfs}
        found.update(r.vf for r in self.recorded)
        return frozenset(found)

    def of_gpu(self, gpu):
        """The planned ``CarvedGpu`` of the physical GPU ``gpu``, or
        None."""
        for carved in self.planned:
            if carved.gpu == gpu:
                return carved
        return None

    def withheld(self):
        """``(vf, CarvedGpu)`` of each planned VF the record does not hold
        as Nova's with the planned type (``restore`` left it out: a guest
        of ours holds a vGPU there, it holds another type, or the record
        is damaged), in address order: Nova must not be given it."""
        recorded = {r.vf: r.type_id for r in self.recorded}
        return tuple(sorted((vf, c) for c in self.planned for vf in c.vfs
                            if recorded.get(vf) != c.type_id))


def on_host(state_dir: str, sysfs: _Sysfs,
            kind_classes: Iterable[type[object]]) -> Carved:
    """``Carved`` of the record of ``state_dir`` read against the host
    ``sysfs`` (nothing planned: ``records.replace`` adds it), the one rule
    every part that judges the record by GPU or by VF follows:

    - a recorded VF is Nova's, and so is the physical GPU it is a VF of on
      this host, whatever GPU the entry names (an entry that no longer
      matches the host keeps both Nova's: nothing handed out there can
      then be a VF that is judged Nova's when its guest stops);
    - a record that cannot be read (``DamagedRecord``) names nothing, and
      every GPU that could be carved (an SR-IOV GPU whose VFs have a
      vGPU kind that carves, ``kind_classes``) is held as Nova's until
      ``restore`` rebuilds it; GPUs nothing can carve are unaffected.
    """
    try:
        entries = record_mod.CarveRecord(state_dir).read()
    except record_mod.DamagedRecord as e:
        return Carved(holding=carvable_gpus(sysfs, kind_classes), damaged=e)
    holding = set()
    for vf in entries:
        pf = sysfs.physfn(vf)
        if pf is not None:
            holding.add(pf)
    return Carved(recorded=tuple(entries[vf] for vf in sorted(entries)),
                  holding=frozenset(holding))


def carvable_gpus(sysfs, kind_classes):
    """The physical GPUs of the host ``sysfs`` whose VFs a vGPU kind of
    ``kind_classes`` could carve."""
    found = set()
    for kind in kind_classes:
        if not (issubclass(kind, capabilities.Carvable)
                and issubclass(kind, capabilities.WatchedParents)):
            continue
        for name in kind.parents_now(sysfs):
            try:
                pf = sysfs.physfn(name)
            except exception.InvalidInput:     # no VF's name: none
                continue
            if pf is not None:
                found.add(pf)
    return frozenset(found)


# --- the configuration -------------------------------------------------------

def _error(name, option, reason):
    return exception.ConfigError(reason='[%s]/%s%s' % (section(name), option,
                                                       reason))


def carvings(conf):
    """The carvings of ``[nova]/carved``, parsed where the configuration
    enters the program; ConfigError naming the option for a missing or
    malformed value."""
    nova = getattr(conf, 'nova', None)
    if nova is None:
        return ()
    found = []
    for name in nova.carved:
        values = conf[section(name)]
        selectors = selectors_mod.parse('[%s]/gpus' % section(name),
                                        values.gpus, required=True)
        if not values.vgpu_type:
            raise _error(name, 'vgpu_type', ' is not set: name the vGPU '
                         'type to write to the VFs (`libvirt-gpu types '
                         '<GPU>` lists them)')
        try:
            type_id = objects.TypeId.parse(values.vgpu_type)
        except exception.InvalidTypeId as e:
            raise _error(name, 'vgpu_type', ': %s' % e)
        if values.count is None:
            raise _error(name, 'count', ' is not set: say how many VFs of '
                         'each GPU get the type')
        rc = values.resource_class
        if rc is not None and not objects.is_custom_name(rc):
            raise _error(name, 'resource_class', ' %r is not a CUSTOM_ '
                         'resource class (CUSTOM_ then upper-case letters, '
                         'digits, "_"; e.g. CUSTOM_NVIDIA_L40S_12Q)' % rc)
        alias = values.alias
        import re
        if alias is not None and re.fullmatch(_ALIAS, alias) is None:
            raise _error(name, 'alias', ' %r is not an alias name (letters, '
                         'digits, ".", "_" and "-"; no ":" or ",", which a '
                         'flavor\'s pci_passthrough:alias uses)' % alias)
        found.append(Carving(name=name, selectors=selectors,
                             type_id=type_id, count=values.count,
                             resource_class=rc, alias=alias))
    return tuple(found)


def default_resource_class(type_name):
    """``NVIDIA L40S-12Q`` -> ``CUSTOM_NVIDIA_L40S_12Q``: the type's name
    through the one normalizer (``objects.custom_name``: what
    ``os_resource_classes.normalize_name`` makes of it, and the form
    Nova's own documentation uses)."""
    return objects.custom_name(type_name)


def default_alias(type_name):
    """``NVIDIA L40S-12Q`` -> ``l40s-12q``: the name without its leading
    vendor word (``objects.type_word``), lower-cased, every run of other
    characters one dash."""
    import re
    return re.sub(r'[^a-z0-9]+', '-',
                  objects.type_word(type_name).lower()).strip('-')


def matching(found, gpus):
    """``{PciAddress: Carving}`` of the physical GPUs the carvings
    ``found`` name, from the GPUs' addresses and PCI ids alone (what
    ``restore`` knows before their VFs are enabled).  ConfigError for an
    address where this host has no GPU, the address of a VF, and a GPU two
    carvings claim; a model no GPU of this host is passes (one
    configuration serves hosts of several models)."""
    claimed = {}
    for carving in found:
        for selector, named in selectors_mod.resolve(
                '[%s]/gpus' % carving.section, carving.selectors, gpus,
                vf_hint=' (the VFs are chosen by count)'):
            if not named:
                LOG.info('[%s]/gpus: no GPU of model %s on this host',
                         carving.section, selector)
            for gpu in named:
                other = claimed.get(gpu.address)
                if other is not None and other.name != carving.name:
                    raise exception.ConfigError(
                        reason='the GPU %s is claimed by two carvings, [%s] '
                               'and [%s]; give each GPU to one carving'
                               % (gpu.address, other.section,
                                  carving.section))
                claimed[gpu.address] = carving
    return claimed


def resolve(conf, gpus, enabled, layouts, known_names=None):
    """The ``CarvedGpu``s of the configuration ``conf`` on a host whose
    GPUs (``objects.Gpu``, PFs with their VFs) are ``gpus``, whose own
    vGPU route enables ``enabled`` (``{PciAddress: EnabledType}``) and
    whose layouts are ``layouts`` (``{PciAddress: Layout}``,
    ``Environment.layouts``), in address order; ConfigError for what the
    module doc lists.
    ``known_names``: ``{type_id: name}`` for types the GPUs list without
    a name (the record's)."""
    found = carvings(conf)
    if not found:
        return ()
    by_address = {gpu.address: gpu for gpu in gpus}
    carved = []
    for address, carving in sorted(matching(found, gpus).items()):
        setting = enabled.get(address)
        if setting is not None and address not in layouts:
            raise exception.ConfigError(
                reason='a GPU can\'t be claimed by two routes: [%s] carves '
                       '%s for Nova and [gpu]/enabled_vgpu_types enables %s '
                       'on it for libvirt-gpu\'s own guests; give it to one '
                       'route (docs/admin/nova.md, "Moving a GPU between '
                       'routes")' % (carving.section, address,
                                     setting.type_id))
        carved.append(_carve(carving, by_address[address],
                             known_names or {}))
    _check_names(carved)
    return tuple(carved)


def _carve(carving, gpu, known_names):
    """The ``CarvedGpu`` of ``carving`` on the physical GPU ``gpu``."""
    where = '[%s]' % carving.section
    interface = gpu.vgpu_interface
    if interface == objects.MDEV_INTERFACE:
        raise exception.ConfigError(
            reason='%s names the GPU %s, whose vGPUs are mdevs: a carving '
                   'writes a type to VFs through a vendor interface (NVIDIA '
                   'vGPU 17+ on a kernel >= 6.8); give this GPU to Nova\'s '
                   'mdev route ([devices]/enabled_mdev_types) instead'
                   % (where, gpu.address))
    mtype = gpu.offered_type(carving.type_id)
    if mtype is None:
        offered = ', '.join('%s (%s)' % (t.id, t.name) if t.name else t.id
                            for t in gpu.offered_types()) or 'none'
        held = sorted({t for f in gpu.functions for t in f.used_type_ids})
        hint = ''
        if held:
            hint = ('; its VFs hold %s now, and a GPU in equal-size mode '
                    'offers only types of that size' % ', '.join(held))
        elif not gpu.vf_gpus:
            hint = ('; its VFs are not enabled (driver %s): `libvirt-gpu '
                    'restore` enables them' % (gpu.driver or 'none'))
        raise exception.ConfigError(
            reason='%s/vgpu_type = %s: the GPU %s does not offer it (it '
                   'offers: %s)%s' % (where, carving.type_id, gpu.address,
                                      offered, hint))
    vfs = tuple(sorted(gpu.virtfns))[:carving.count]
    if len(vfs) < carving.count:
        raise exception.ConfigError(
            reason='%s/count = %d: the GPU %s has %d VFs enabled'
            % (where, carving.count, gpu.address, len(vfs)))
    others = sum(f.used_type_ids.count(carving.type_id)
                 for f in gpu.vf_gpus if f.address not in vfs)
    if capacity.exceeds(mtype, carving.count, others):
        most = capacity.limit(mtype)
        held = (' besides the %d its other VFs hold' % others
                if others else '')
        raise exception.ConfigError(
            reason='%s/count = %d: the GPU %s holds at most %d vGPUs of %s '
                   '(%s)%s; lower the count' % (
                       where, carving.count, gpu.address, most,
                       carving.type_id, mtype.name or 'unnamed', held))
    type_name = mtype.name or known_names.get(carving.type_id)
    by_vf = {f.address: f for f in gpu.vf_gpus}
    first = by_vf.get(vfs[0])
    vendor_id = first.vendor_id if first is not None else gpu.vendor_id
    product_id = first.product_id if first is not None else gpu.product_id
    if (carving.resource_class is None or carving.alias is None) \
            and not type_name:
        raise exception.ConfigError(
            reason='%s: the GPU %s lists %s without a name, so neither '
                   'resource_class nor alias can be derived from it; set '
                   'both' % (where, gpu.address, carving.type_id))
    return CarvedGpu(
        carving=carving, gpu=gpu.address, vfs=vfs, type_name=type_name,
        vendor_id=vendor_id, product_id=product_id,
        resource_class=(carving.resource_class
                        or default_resource_class(type_name)),
        alias=carving.alias or default_alias(type_name))


def _check_names(carved):
    """One resource class names one type; one alias names one resource
    class and one model (Nova's PCI in Placement takes one spec per
    alias)."""
    by_rc, by_alias = {}, {}
    for c in carved:
        seen = by_rc.setdefault(c.resource_class, c)
        if seen.type_id != c.type_id:
            raise exception.ConfigError(
                reason='resource class %s names two types: %s ([%s]) and %s '
                       '([%s]); give each type its own resource_class'
                       % (c.resource_class, seen.type_id,
                          seen.carving.section, c.type_id,
                          c.carving.section))
        key = (c.resource_class, c.vendor_id, c.product_id)
        seen = by_alias.setdefault(c.alias, (key, c))
        if seen[0] != key:
            raise exception.ConfigError(
                reason='alias %s names two kinds of VF: %s on %s:%s ([%s]) '
                       'and %s on %s:%s ([%s]); give each its own alias'
                       % ((c.alias,) + seen[0] + (seen[1].carving.section,)
                          + key + (c.carving.section,)))
