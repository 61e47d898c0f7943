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
``<state_dir>/nova-carved.json`` (``CarveRecord``)::

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
read (``DamagedRecord``, its message saying to run ``restore``, which
sets it aside and rebuilds it) names nothing, and every GPU that could
be carved is held as Nova's meanwhile; other GPUs are unaffected.  ``Carved``
holds both views, the planned and the recorded (``environment.Environment.
carved``).  No oslo.config here: ``conf`` reads like a ConfigOpts or the
CLI's snapshot of one.
"""

from __future__ import annotations

import os

# the capabilities alone (they import nothing of ours), not the kinds'
# package: this room sits below the kinds
import libvirt_gpu.devices.backends.capabilities as capabilities
from libvirt_gpu import exception
from libvirt_gpu.util import logs
from libvirt_gpu import objects
from libvirt_gpu.util import records
from libvirt_gpu.store import statedir

LOG = logs.getLogger(__name__)

RECORD_NAME = 'nova-carved.json'
LOCK_NAME = 'nova-carved.lock'
RECORD_VERSION = 1
SECTION_PREFIX = 'nova_'
_MAX_RECORD_BYTES = 1024 * 1024
# patterns (``re`` imported where they are used: the qemu hook imports this
# module and reads no configuration)
_CUSTOM_RC = r'CUSTOM_[A-Z0-9_]{1,248}'
_ALIAS = r'[A-Za-z0-9][A-Za-z0-9_.-]{0,63}'
# The word NVIDIA puts before a type's size ("NVIDIA L40S-12Q").
_NAME_PREFIXES = ('NVIDIA', 'GRID')


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
class CarvedVf:
    """One VF ``restore`` carved (an entry of the record)."""

    vf: objects.PciAddress
    gpu: objects.PciAddress
    type_id: objects.TypeId
    carving: str
    type_name: str | None = None

    def to_json(self):
        return {'gpu': str(self.gpu), 'type_id': str(self.type_id),
                'type_name': self.type_name, 'carving': self.carving}


@records.record
class Carved:
    """What is Nova's on a host: the carvings resolved from the
    configuration (``planned``; empty without one, as in the hook), the
    VFs the record names (``recorded``) and the physical GPUs the record
    makes Nova's on this host (``holding``: ``on_host``, the one rule)."""

    planned: tuple[CarvedGpu, ...] = ()
    recorded: tuple[CarvedVf, ...] = ()
    holding: frozenset = frozenset()
    damaged: object = None           # the DamagedRecord, when unreadable

    @property
    def held_gpus(self):
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
    def vfs(self):
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


def on_host(state_dir, sysfs, kind_classes):
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
        entries = CarveRecord(state_dir).read()
    except DamagedRecord as e:
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
        if not values.gpus:
            raise _error(name, 'gpus', ' is empty: name the GPUs to carve '
                         '(0000:3d:00.0) or their model (10de:26b9)')
        try:
            selectors = objects.GpuSelector.parse_list(values.gpus)
        except exception.InvalidInput as e:
            raise _error(name, 'gpus', ': %s' % e.kwargs['reason'])
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
        import re
        rc = values.resource_class
        if rc is not None and re.fullmatch(_CUSTOM_RC, rc) is None:
            raise _error(name, 'resource_class', ' %r is not a CUSTOM_ '
                         'resource class (CUSTOM_ then upper-case letters, '
                         'digits, "_"; e.g. CUSTOM_NVIDIA_L40S_12Q)' % rc)
        alias = values.alias
        if alias is not None and re.fullmatch(_ALIAS, alias) is None:
            raise _error(name, 'alias', ' %r is not an alias name (letters, '
                         'digits, ".", "_" and "-"; no ":" or ",", which a '
                         'flavor\'s pci_passthrough:alias uses)' % alias)
        found.append(Carving(name=name, selectors=selectors,
                             type_id=type_id, count=values.count,
                             resource_class=rc, alias=alias))
    return tuple(found)


def default_resource_class(type_name):
    """``NVIDIA L40S-12Q`` -> ``CUSTOM_NVIDIA_L40S_12Q``: CUSTOM_ and the
    type's name upper-cased, every run of other characters one
    underscore (what ``os_resource_classes.normalize_name`` makes of it,
    and the form Nova's own documentation uses)."""
    import re
    return 'CUSTOM_' + re.sub(r'[^A-Z0-9_]+', '_', type_name.upper())


def default_alias(type_name):
    """``NVIDIA L40S-12Q`` -> ``l40s-12q``: the name without its leading
    NVIDIA word, lower-cased, every run of other characters one dash."""
    first, _, rest = type_name.strip().partition(' ')
    if first.upper() in _NAME_PREFIXES and rest.strip():
        type_name = rest
    import re
    return re.sub(r'[^a-z0-9]+', '-', type_name.lower()).strip('-')


def matching(found, gpus):
    """``{PciAddress: Carving}`` of the physical GPUs the carvings
    ``found`` name, from the GPUs' addresses and PCI ids alone (what
    ``restore`` knows before their VFs are enabled).  ConfigError for an
    address where this host has no GPU, the address of a VF, and a GPU two
    carvings claim; a model no GPU of this host is passes (one
    configuration serves hosts of several models)."""
    by_address = {gpu.address: gpu for gpu in gpus}
    claimed = {}
    for carving in found:
        for selector in carving.selectors:
            if selector.by_model:
                named = [g for g in gpus
                         if not g.is_vf and selector.matches(g)]
                if not named:
                    LOG.info('[%s]/gpus: no GPU of model %s on this host',
                             carving.section, selector)
            else:
                gpu = by_address.get(selector.address)
                if gpu is None:
                    raise _error(carving.name, 'gpus', ' names %s, but this '
                                 'host has no GPU there (`libvirt-gpu list` '
                                 'shows the GPUs)' % selector.address)
                if gpu.is_vf:
                    raise _error(carving.name, 'gpus', ' names %s, a VF of '
                                 'the GPU %s; name the physical GPU (the '
                                 'VFs are chosen by count)'
                                 % (selector.address, gpu.physfn))
                named = [gpu]
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


def resolve(conf, gpus, enabled, known_names=None):
    """The ``CarvedGpu``s of the configuration ``conf`` on a host whose
    GPUs (``objects.Gpu``, PFs with their VFs) are ``gpus`` and whose own
    vGPU route enables ``enabled`` (``{PciAddress: EnabledType}``), in
    address order; ConfigError for what the module doc lists.
    ``known_names``: ``{type_id: name}`` for types the GPUs list without
    a name (the record's)."""
    found = carvings(conf)
    if not found:
        return ()
    from libvirt_gpu.devices import layout as layout_mod
    in_layout = layout_mod.claims(layout_mod.read_layouts(conf), gpus)
    by_address = {gpu.address: gpu for gpu in gpus}
    carved = []
    for address, carving in sorted(matching(found, gpus).items()):
        setting = enabled.get(address)
        if setting is not None and address not in in_layout:
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
    most = mtype.max_instance
    if most is not None and carving.count + others > most:
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


# --- the record --------------------------------------------------------------

REMEDY = ('run `libvirt-gpu restore`: it moves the file aside and '
          'rebuilds it from the configuration')


class DamagedRecord(exception.StateError):
    """The record cannot be read (``kwargs['damage']``: why); its message
    says what to do (``REMEDY``)."""


class CarveRecord(object):
    """``<state_dir>/nova-carved.json``: the VFs ``restore`` carved.
    Changed under an exclusive ``flock`` of ``nova-carved.lock``, written
    to a temporary file and renamed (a reader never sees half of it)."""

    def __init__(self, state_dir):
        if not state_dir or not os.path.isabs(os.fspath(state_dir)):
            raise exception.ConfigError(
                reason='state_dir %r must be an absolute path' % (state_dir,))
        self.state_dir = os.fspath(state_dir)
        self.path = os.path.join(self.state_dir, RECORD_NAME)
        self.lock_path = os.path.join(self.state_dir, LOCK_NAME)

    def _error(self, reason):
        return DamagedRecord(path=self.path, damage=reason,
                             reason='%s; %s' % (reason, REMEDY))

    def read(self):
        """``{vf: CarvedVf}``; empty without a record (nothing is created:
        the hook reads this on every guest start).  DamagedRecord, saying
        what to do, when it cannot be read or is not a record."""
        try:
            data = statedir.read_json(self.path, _MAX_RECORD_BYTES)
        except exception.StateError as e:
            raise self._error(e.kwargs['reason'])
        if data is None:
            return {}
        if not isinstance(data, dict) or data.get('version') != \
                RECORD_VERSION or not isinstance(data.get('vfs'), dict):
            raise self._error('not a version %d record' % RECORD_VERSION)
        found = {}
        for key, entry in data['vfs'].items():
            try:
                vf = objects.PciAddress.parse(key)
                carving = entry['carving']
                type_name = entry.get('type_name')
                if not isinstance(carving, str) or not isinstance(
                        type_name, (str, type(None))):
                    raise TypeError('carving or type_name')
                found[vf] = CarvedVf(
                    vf=vf, gpu=objects.PciAddress.parse(entry['gpu']),
                    type_id=objects.TypeId.parse(entry['type_id']),
                    carving=carving, type_name=type_name)
            except (exception.InvalidInput, KeyError, TypeError) as e:
                raise self._error('entry %r is invalid: %s' % (key, e))
        return found

    def set_aside(self, now=None):
        """Rename a record that cannot be read to
        ``nova-carved.json.damaged-<UTC time>`` (under the record's lock:
        no ``restore`` writes it meanwhile); returns the new path, or None
        when it reads now (another run rebuilt it).  OSError when it
        cannot be renamed."""
        import time
        stamp = time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(now))
        aside = '%s.damaged-%s' % (self.path, stamp)
        statedir.ensure_dir(self.state_dir)
        fd = statedir.open_file(self.lock_path, os.O_RDWR | os.O_CREAT)
        try:
            statedir.lock(fd, self.lock_path)
            try:
                self.read()
                return None
            except DamagedRecord:
                pass
            n = 1
            while os.path.lexists(aside):
                n += 1
                aside = '%s.damaged-%s.%d' % (self.path, stamp, n)
            os.rename(self.path, aside)
            return aside
        finally:
            os.close(fd)

    def locked(self):
        """``{vf: CarvedVf}`` to read and change; saved on exit."""
        return statedir.locked_entries(self.state_dir, self.lock_path,
                                       self.read, self._save)

    def _save(self, entries):
        statedir.write_json(self.path, {
            'version': RECORD_VERSION,
            'vfs': {str(vf): e.to_json()
                    for vf, e in sorted(entries.items())}})
