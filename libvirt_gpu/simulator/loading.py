"""Simulated hosts loaded and validated from JSON: the profile format.

A profile file looks like this (``profiles/t4.json``)::

    {
      "name": "t4", "description": "...", "hostname": "gpu-t4-01",
      "no_capacity_errno": "EINVAL",
      "type_catalogues": {
        "t4": [{"id": "nvidia-223", "name": "GRID T4-2B",
                "description": "num_heads=4, ..., max_instance=8",
                "max_instance": 8}, ...]
      },
      "devices": [
        {"address": "0000:af:00.0", "vendor_id": "10de",
         "product_id": "1eb8", "class_code": "0x030200",
         "driver": "nvidia", "numa_node": 1, "iommu_group": 58,
         "parent_bridge": "0000:ae:00.0", "mdev_types": "t4",
         "mdevs": [{"uuid": "...", "type_id": "nvidia-223"}]}
      ]
    }

``busy_remove`` (optional) says what removing a vGPU that a guest still
uses does on this host: ``"block"`` (the default: the write waits until
the guest lets go, as vfio makes it since kernel 5.16) or ``"ebusy"`` (it
answers EBUSY at once, as older kernels' vendor ``remove`` callbacks did).
Only the live simulator (``kernel.SimKernel``) acts on it.

``mdev_types`` names a catalogue (so 17 types are not repeated per GPU) or
is an inline list of type entries.  Bridges named by ``parent_bridge`` that
are not listed as devices are implied (an Intel root port each).

SR-IOV: a PF lists its VFs in ``virtfns`` (each VF names it in ``physfn``)
and may say ``"sriov_numvfs": 0`` - its VFs exist only once enabled (what a
host looks like at boot, before ``sriov-manage -e``); by default all listed
VFs are enabled.  A VF of a GPU with NVIDIA's vGPU 17+ vendor interface
names its types in ``vgpu_types`` (a catalogue or a list, type ids
``nvidia-<n>`` with ``framebuffer_mb``) instead of ``mdev_types``, and the
type of the vGPU it holds, if any, in ``held_type``::

    {"address": "0000:3d:00.4", ..., "physfn": "0000:3d:00.0",
     "vgpu_types": "l40s", "held_type": "nvidia-1145"}

A vendor-interface GPU's PF may have a ``gpu`` section (its name and
memory as NVML says them, its MIG GI profile table by name from
``gi_profile_tables``, MIG mode at boot, mixed-size slots, scheduler
policies; ``_gpu``); its VFs' MIG-backed types then name their GI profile
(``gi_profile_id``, ``max_per_gi``) and time-sliced ones may have a
mixed-size ``placement_size``.  The rules those follow are ``mig``'s.

How VFs share their GPU's capacity is ``capacity``'s business.
"""

from __future__ import annotations

import collections
import errno
import json
import os
import re

from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.simulator import mig
from libvirt_gpu.simulator.profile import (
    BUSY_BLOCK, BUSY_REMOVE_MODES, DEFAULT_DRIVER_VERSION, Profile,
    SimDevice, SimMdev, SimType, VF_CAPACITIES, VF_SHARED)

PROFILE_DIR_NAME = 'profiles'
_HEX4_RE = re.compile(r'[0-9a-f]{4}')
_CLASS_RE = re.compile(r'0x[0-9a-f]{6}')
_NAME_RE = re.compile(r'[A-Za-z0-9][A-Za-z0-9_.-]{0,63}')
_DRIVER_RE = re.compile(r'[A-Za-z0-9][A-Za-z0-9_.-]{0,63}')
# NVIDIA's driver versions: branch.minor[.patch] (580.95.02, 550.127.05)
_DRIVER_VERSION_RE = re.compile(r'[0-9]{1,4}\.[0-9]{1,4}(\.[0-9]{1,4})?')
_DEVICE_APIS = ('vfio-pci', 'vfio-ccw', 'vfio-ap')
_MAX_FILE_BYTES = 16 * 1024 * 1024


def profile_dir():
    """Directory of the bundled profiles (next to this module)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)),
                        PROFILE_DIR_NAME)


def list_profiles():
    """Names of the bundled profiles, sorted."""
    return sorted(entry[:-len('.json')] for entry in os.listdir(profile_dir())
                  if entry.endswith('.json'))


def load_profile(name_or_path):
    """Load a bundled profile by name, or a ``.json`` file by path."""
    if isinstance(name_or_path, Profile):
        return name_or_path
    text = os.fspath(name_or_path)
    if _NAME_RE.fullmatch(text) and not text.endswith('.json'):
        if text not in list_profiles():
            raise exception.SimulatorError(
                reason='no bundled profile %r; bundled profiles: %s' % (
                    text, ', '.join(list_profiles())))
        path = os.path.join(profile_dir(), text + '.json')
    else:
        path = text
    try:
        with open(path, 'rb') as f:
            raw = f.read(_MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise exception.SimulatorError(
            reason='cannot read profile %s: %s' % (path, exc.strerror))
    if len(raw) > _MAX_FILE_BYTES:
        raise exception.SimulatorError(
            reason='profile %s is larger than %d bytes' % (
                path, _MAX_FILE_BYTES))
    try:
        data = json.loads(raw.decode('utf-8'))
    except (UnicodeDecodeError, ValueError) as exc:
        raise exception.SimulatorError(
            reason='profile %s is not valid JSON: %s' % (path, exc))
    return profile_from_dict(data, source=path)


def profile_from_dict(data, source='<dict>'):
    """Validate a decoded profile document and build the records."""
    ctx = _Ctx(source)
    ctx.check_keys(data, 'profile', required=('name', 'devices'),
                   optional=('description', 'hostname', 'no_capacity_errno',
                             'busy_remove', 'type_catalogues',
                             'gi_profile_tables', 'driver_version'))
    name = ctx.string(data, 'name', 'profile')
    if _NAME_RE.fullmatch(name) is None:
        ctx.fail('profile name %r: use letters, digits, ".", "-", "_"'
                 % name)
    errno_name = ctx.string(data, 'no_capacity_errno', 'profile',
                            default='EINVAL')
    if not isinstance(getattr(errno, errno_name, None), int) \
            or not errno_name.startswith('E'):
        ctx.fail('no_capacity_errno %r is not an errno name such as '
                 'EINVAL or EUSERS' % errno_name)
    busy_remove = data.get('busy_remove', BUSY_BLOCK)
    if busy_remove not in BUSY_REMOVE_MODES:
        ctx.fail('busy_remove %r is not one of %s ("block": removing a '
                 'vGPU a guest uses waits for the guest, as kernels since '
                 '5.16 do; "ebusy": it answers EBUSY at once, as older '
                 'ones did)' % (busy_remove, ', '.join(
                     repr(m) for m in BUSY_REMOVE_MODES)))
    driver_version = ctx.string(
        data, 'driver_version', 'profile', default=DEFAULT_DRIVER_VERSION)
    if _DRIVER_VERSION_RE.fullmatch(driver_version) is None:
        ctx.fail('driver_version %r is not a driver version such as '
                 '580.95.02' % driver_version[:40])
    catalogues = _catalogues(ctx, data.get('type_catalogues', {}))
    tables = _gi_tables(ctx, data.get('gi_profile_tables', {}))
    raw_devices = data['devices']
    if not isinstance(raw_devices, list) or not raw_devices:
        ctx.fail('"devices" must be a non-empty list')
    devices = tuple(_device(ctx, i, raw, catalogues, tables)
                    for i, raw in enumerate(raw_devices))
    profile = Profile(
        name=name,
        description=ctx.string(data, 'description', 'profile', default=''),
        hostname=ctx.string(data, 'hostname', 'profile',
                            default='sim-' + name),
        no_capacity_errno=errno_name,
        devices=devices,
        busy_remove=busy_remove, driver_version=driver_version)
    _check_host(ctx, profile)
    return profile


class _Ctx:
    """Error reporting with the profile's source in every message."""

    def __init__(self, source):
        self.source = source

    def fail(self, reason):
        raise exception.SimulatorError(
            reason='profile %s: %s' % (self.source, reason))

    def check_keys(self, data, where, required, optional=()):
        if not isinstance(data, dict):
            self.fail('%s must be a JSON object, not %s'
                      % (where, type(data).__name__))
        missing = [k for k in required if k not in data]
        if missing:
            self.fail('%s lacks %s' % (where, ', '.join(
                repr(k) for k in missing)))
        unknown = sorted(set(data) - set(required) - set(optional))
        if unknown:
            self.fail('%s has unknown key(s) %s; allowed: %s' % (
                where, ', '.join(repr(k) for k in unknown),
                ', '.join(sorted(set(required) | set(optional)))))

    def string(self, data, key, where, default=None, nullable=False):
        """``data[key]`` as a string; ``default`` when absent."""
        if key not in data:
            return default
        value = data[key]
        if value is None and nullable:
            return None
        if not isinstance(value, str):
            self.fail('%s: %r must be a string, not %r' % (where, key, value))
        return value

    def integer(self, data, key, where, minimum, default=None,
                nullable=False):
        """``data[key]`` as an int >= ``minimum``; ``default`` when absent."""
        value = data.get(key, default)
        if value is None and nullable:
            return None
        if isinstance(value, bool) or not isinstance(value, int) \
                or value < minimum:
            self.fail('%s: %r must be an integer >= %d, not %r'
                      % (where, key, minimum, value))
        return value

    def address(self, value, where, key):
        try:
            return str(objects.PciAddress.parse(value))
        except exception.InvalidInput:
            self.fail('%s: %r is %r, not a PCI address like 0000:af:00.0'
                      % (where, key, value))

    def hex4(self, data, key, where, default=None):
        value = self.string(data, key, where, default=default)
        if value is None:
            self.fail('%s lacks %r' % (where, key))
        value = value.lower()
        if value.startswith('0x'):
            value = value[2:]
        if _HEX4_RE.fullmatch(value) is None:
            self.fail('%s: %r is %r, not a 4-digit hex id like 10de'
                      % (where, key, value))
        return value


def _catalogues(ctx, raw):
    if not isinstance(raw, dict):
        ctx.fail('"type_catalogues" must map a catalogue name to a list '
                 'of types')
    return {name: _types(ctx, entries, 'catalogue %r' % name)
            for name, entries in raw.items()}


def _types(ctx, entries, where):
    if not isinstance(entries, list) or not entries:
        ctx.fail('%s must be a non-empty list of types' % where)
    types = []
    for i, entry in enumerate(entries):
        here = '%s type #%d' % (where, i)
        ctx.check_keys(entry, here, required=('id', 'max_instance'),
                       optional=('name', 'description', 'device_api',
                                 'framebuffer_mb', 'gi_profile_id',
                                 'max_per_gi', 'placement_size'))
        type_id = ctx.string(entry, 'id', here)
        try:
            objects.TypeId.parse(type_id)
        except exception.InvalidInput as exc:
            ctx.fail('%s: %s' % (here, exc))
        api = ctx.string(entry, 'device_api', here, default='vfio-pci')
        if api not in _DEVICE_APIS:
            ctx.fail('%s: device_api %r is not one of %s'
                     % (here, api, ', '.join(_DEVICE_APIS)))
        description = ctx.string(entry, 'description', here, nullable=True)
        max_instance = ctx.integer(entry, 'max_instance', here, 1)
        described = objects.parse_description(description).get(
            'max_instance')
        if described is not None and described != str(max_instance):
            ctx.fail('%s (%s): description says max_instance=%s but '
                     '"max_instance" is %d' % (here, type_id, described,
                                               max_instance))
        types.append(SimType(
            id=type_id,
            name=ctx.string(entry, 'name', here, nullable=True),
            description=description, device_api=api,
            max_instance=max_instance,
            framebuffer_mb=ctx.integer(entry, 'framebuffer_mb', here, 1,
                                       nullable=True),
            gi_profile_id=ctx.integer(entry, 'gi_profile_id', here, 0,
                                      nullable=True),
            max_per_gi=ctx.integer(entry, 'max_per_gi', here, 1,
                                   nullable=True),
            placement_size=ctx.integer(entry, 'placement_size', here, 1,
                                       nullable=True)))
        if (types[-1].gi_profile_id is None) != \
                (types[-1].max_per_gi is None):
            ctx.fail('%s (%s): a MIG-backed type has both "gi_profile_id" '
                     'and "max_per_gi", a time-sliced one neither'
                     % (here, type_id))
    ids = [t.id for t in types]
    dups = sorted({i for i in ids if ids.count(i) > 1})
    if dups:
        ctx.fail('%s lists type(s) %s twice' % (where, ', '.join(dups)))
    return tuple(types)


_DEVICE_KEYS = ('vendor_id', 'product_id', 'class_code',
                'subsystem_vendor_id', 'subsystem_device_id', 'vendor_name',
                'product_name', 'driver', 'numa_node', 'iommu_group',
                'parent_bridge', 'mdev_types', 'mdevs', 'sriov_totalvfs',
                'virtfns', 'physfn', 'sriov_numvfs', 'vgpu_types',
                'held_type', 'vf_capacity', 'gpu')


def _gi_tables(ctx, raw):
    """``gi_profile_tables``: ``{name: {"compute_slices": 7,
    "memory_slices": 8, "profiles": [{"id": 19, "nvml_profile": 0,
    "name": "1g.10gb", "slices": 1, "memory_mb": 9984, "instances": 7,
    "placements": [0, 1, 2, 3, 4, 5, 6], "placement_size": 1, "sm": 16,
    ...}]}}`` (``nvidia-smi mig -lgip`` and ``-lgipp``)."""
    if not isinstance(raw, dict):
        ctx.fail('"gi_profile_tables" must map a name to a GI profile '
                 'table')
    tables = {}
    for name, table in raw.items():
        where = 'GI profile table %r' % name
        ctx.check_keys(table, where, required=(
            'compute_slices', 'memory_slices', 'profiles'))
        compute = ctx.integer(table, 'compute_slices', where, 1)
        memory = ctx.integer(table, 'memory_slices', where, 1)
        if not isinstance(table['profiles'], list) or not table['profiles']:
            ctx.fail('%s: "profiles" must be a non-empty list' % where)
        profiles = []
        for i, entry in enumerate(table['profiles']):
            here = '%s profile #%d' % (where, i)
            ctx.check_keys(entry, here, required=(
                'id', 'nvml_profile', 'name', 'slices', 'memory_mb',
                'instances', 'placements', 'placement_size'), optional=(
                'sm', 'ce', 'dec', 'enc', 'jpeg', 'ofa', 'p2p'))
            placements = entry['placements']
            if not isinstance(placements, list) or not placements or any(
                    isinstance(p, bool) or not isinstance(p, int) or p < 0
                    for p in placements):
                ctx.fail('%s: "placements" must list slice numbers' % here)
            size = ctx.integer(entry, 'placement_size', here, 1)
            if max(placements) + size > memory:
                ctx.fail('%s: a placement at %d of %d slices passes the '
                         'GPU\'s %d memory slices' % (
                             here, max(placements), size, memory))
            profile = mig.GiProfile(
                id=ctx.integer(entry, 'id', here, 0),
                nvml_profile=ctx.integer(entry, 'nvml_profile', here, 0),
                name=ctx.string(entry, 'name', here),
                slices=ctx.integer(entry, 'slices', here, 1),
                memory_mb=ctx.integer(entry, 'memory_mb', here, 1),
                instances=ctx.integer(entry, 'instances', here, 1),
                placements=tuple(placements), placement_size=size,
                **{k: ctx.integer(entry, k, here, 0, default=0)
                   for k in ('sm', 'ce', 'dec', 'enc', 'jpeg', 'ofa')},
                p2p=bool(entry.get('p2p', False)))
            if profile.slices > compute:
                ctx.fail('%s: %d slices on a GPU of %d' % (
                    here, profile.slices, compute))
            profiles.append(profile)
        ids = [p.id for p in profiles]
        if len(set(ids)) != len(ids):
            ctx.fail('%s lists a profile id twice' % where)
        tables[name] = mig.GiTable(compute_slices=compute,
                                   memory_slices=memory,
                                   profiles=tuple(profiles))
    return tables


def _gpu(ctx, where, raw, tables):
    """A PF's ``gpu`` section: ``{"name": "NVIDIA H100 80GB HBM3",
    "memory_mib": 81559, "mig": "<table>", "mig_mode": 0,
    "mixed_slots": 48, "policies": [1, 2, 3]}``."""
    if raw is None:
        return None
    here = '%s gpu' % where
    ctx.check_keys(raw, here, required=('name', 'memory_mib'), optional=(
        'mig', 'mig_mode', 'mixed_slots', 'policies'))
    table = None
    if raw.get('mig') is not None:
        table = tables.get(raw['mig'])
        if table is None:
            ctx.fail('%s: "mig" names GI profile table %r, which '
                     '"gi_profile_tables" does not define (it has: %s)' % (
                         here, raw['mig'], ', '.join(sorted(tables))
                         or 'none'))
    mode = ctx.integer(raw, 'mig_mode', here, 0, default=0)
    if mode not in (0, 1) or (mode and table is None):
        ctx.fail('%s: "mig_mode" is 0, or 1 on a GPU with "mig"' % here)
    policies = raw.get('policies', list(mig.POLICIES))
    if not isinstance(policies, list) or any(
            p not in mig.POLICIES for p in policies):
        ctx.fail('%s: "policies" lists scheduler policies among %s' % (
            here, ', '.join(str(p) for p in mig.POLICIES)))
    return mig.SimGpu(name=ctx.string(raw, 'name', here),
                      memory_mib=ctx.integer(raw, 'memory_mib', here, 1),
                      gi_table=table, mig_mode=mode,
                      mixed_slots=ctx.integer(raw, 'mixed_slots', here, 0,
                                              default=0),
                      policies=tuple(policies))


def _device(ctx, index, raw, catalogues, tables):
    where = 'device #%d' % index
    ctx.check_keys(raw, where, required=('address', 'vendor_id',
                                         'product_id', 'class_code'),
                   optional=_DEVICE_KEYS)
    address = ctx.address(raw['address'], where, 'address')
    where = 'device %s' % address
    vendor_id = ctx.hex4(raw, 'vendor_id', where)
    product_id = ctx.hex4(raw, 'product_id', where)
    class_code = ctx.string(raw, 'class_code', where).lower()
    if _CLASS_RE.fullmatch(class_code) is None:
        ctx.fail('%s: class_code %r is not like 0x030200'
                 % (where, class_code))
    driver = ctx.string(raw, 'driver', where, nullable=True)
    if driver is not None and _DRIVER_RE.fullmatch(driver) is None:
        ctx.fail('%s: driver %r is not a driver name' % (where, driver))
    parent_bridge = raw.get('parent_bridge')
    if parent_bridge is not None:
        parent_bridge = ctx.address(parent_bridge, where, 'parent_bridge')
    mdev_types = _device_types(ctx, where, raw.get('mdev_types'), catalogues)
    mdevs = _mdevs(ctx, where, raw.get('mdevs', []), mdev_types)
    virtfns = raw.get('virtfns', [])
    if not isinstance(virtfns, list):
        ctx.fail('%s: "virtfns" must be a list of PCI addresses' % where)
    virtfns = tuple(ctx.address(vf, where, 'virtfns') for vf in virtfns)
    totalvfs = ctx.integer(raw, 'sriov_totalvfs', where, 0, nullable=True)
    if virtfns and totalvfs is None:
        ctx.fail('%s has "virtfns" but no "sriov_totalvfs"' % where)
    if totalvfs is not None and len(virtfns) > totalvfs:
        ctx.fail('%s: %d virtfns exceed sriov_totalvfs %d'
                 % (where, len(virtfns), totalvfs))
    physfn = raw.get('physfn')
    if physfn is not None:
        physfn = ctx.address(physfn, where, 'physfn')
    numvfs = ctx.integer(raw, 'sriov_numvfs', where, 0, nullable=True)
    if numvfs is not None and (totalvfs is None or numvfs > len(virtfns)):
        ctx.fail('%s: sriov_numvfs %d needs "sriov_totalvfs" and at most '
                 'the %d listed virtfns' % (where, numvfs, len(virtfns)))
    vgpu_types = _device_types(ctx, where, raw.get('vgpu_types'),
                               catalogues)
    for mtype in vgpu_types:
        try:
            mtype.number
        except exception.InvalidInput:
            ctx.fail('%s: vendor-interface type %r must be named '
                     'nvidia-<number>' % (where, mtype.id))
        if mtype.framebuffer is None:
            ctx.fail('%s: vendor-interface type %s needs "framebuffer_mb"'
                     % (where, mtype.id))
    if vgpu_types and (physfn is None or mdev_types):
        ctx.fail('%s: "vgpu_types" (the vGPU 17+ vendor interface) belong '
                 'on a VF without "mdev_types"' % where)
    vf_capacity = ctx.string(raw, 'vf_capacity', where, default=VF_SHARED)
    if vf_capacity not in VF_CAPACITIES:
        ctx.fail('%s: vf_capacity %r is not one of %s'
                 % (where, vf_capacity, ', '.join(VF_CAPACITIES)))
    gpu = _gpu(ctx, where, raw.get('gpu'), tables)
    if gpu is not None and physfn is not None:
        ctx.fail('%s: "gpu" belongs on the physical function, not a VF'
                 % where)
    current = ctx.string(raw, 'held_type', where, nullable=True)
    if current is not None and not any(t.id == current for t in vgpu_types):
        ctx.fail('%s: held_type %r is not one of its vgpu_types'
                 % (where, current))
    return SimDevice(
        address=address, vendor_id=vendor_id, product_id=product_id,
        class_code=class_code,
        subsystem_vendor_id=ctx.hex4(raw, 'subsystem_vendor_id', where,
                                     default=vendor_id),
        subsystem_device_id=ctx.hex4(raw, 'subsystem_device_id', where,
                                     default='0000'),
        vendor_name=ctx.string(raw, 'vendor_name', where, nullable=True),
        product_name=ctx.string(raw, 'product_name', where, nullable=True),
        driver=driver,
        numa_node=ctx.integer(raw, 'numa_node', where, -1, default=-1),
        iommu_group=ctx.integer(raw, 'iommu_group', where, 0,
                                nullable=True),
        parent_bridge=parent_bridge, mdev_types=mdev_types, mdevs=mdevs,
        sriov_totalvfs=totalvfs, virtfns=virtfns, physfn=physfn,
        sriov_numvfs=numvfs, vgpu_types=vgpu_types,
        held_type=current, vf_capacity=vf_capacity, gpu=gpu)


def _device_types(ctx, where, raw, catalogues):
    if raw is None:
        return ()
    if isinstance(raw, str):
        if raw not in catalogues:
            ctx.fail('%s: mdev_types names catalogue %r, which '
                     '"type_catalogues" does not define (it has: %s)'
                     % (where, raw, ', '.join(sorted(catalogues)) or 'none'))
        return catalogues[raw]
    if isinstance(raw, list) and not raw:
        return ()
    return _types(ctx, raw, '%s mdev_types' % where)


def _mdevs(ctx, where, raw, mdev_types):
    if not isinstance(raw, list):
        ctx.fail('%s: "mdevs" must be a list' % where)
    if raw and not mdev_types:
        ctx.fail('%s has mdevs but offers no mdev_types' % where)
    mdevs = []
    for i, entry in enumerate(raw):
        here = '%s mdev #%d' % (where, i)
        ctx.check_keys(entry, here, required=('uuid', 'type_id'))
        try:
            uuid = objects.Uuid.parse(entry['uuid'])
        except exception.InvalidInput as exc:
            ctx.fail('%s: %s' % (here, exc))
        type_id = ctx.string(entry, 'type_id', here)
        if not any(t.id == type_id for t in mdev_types):
            ctx.fail('%s: type %r is not one of this device\'s types'
                     % (here, type_id))
        mdevs.append(SimMdev(uuid, type_id))
    return tuple(mdevs)


def _check_host(ctx, profile):
    """Cross-device rules: unique addresses/UUIDs, SR-IOV links, capacity."""
    from libvirt_gpu.simulator import capacity

    by_addr = {}
    for dev in profile.devices:
        if dev.address in by_addr:
            ctx.fail('device %s is listed twice' % dev.address)
        by_addr[dev.address] = dev
    counts = collections.Counter(
        m.uuid for dev in profile.devices for m in dev.mdevs)
    dups = sorted(u for u, n in counts.items() if n > 1)
    if dups:
        ctx.fail('mdev UUID(s) %s used more than once (the kernel answers '
                 'EEXIST)' % ', '.join(dups))
    for dev in profile.devices:
        _check_parent_chain(ctx, dev, by_addr)
        for vf in dev.virtfns:
            if vf not in by_addr or by_addr[vf].physfn != dev.address:
                ctx.fail('device %s lists VF %s, which is not a listed '
                         'device with "physfn": "%s"'
                         % (dev.address, vf, dev.address))
        if dev.physfn is not None:
            pf = by_addr.get(dev.physfn)
            if pf is None or dev.address not in pf.virtfns:
                ctx.fail('device %s names physfn %s, which does not list '
                         'it in "virtfns"' % (dev.address, dev.physfn))
        if dev.physfn is None and dev.numvfs < len(dev.virtfns):
            for vf in dev.virtfns[dev.numvfs:]:
                vdev = by_addr.get(vf)
                if vdev is not None and (vdev.mdevs
                                         or vdev.held_type):
                    ctx.fail('VF %s holds vGPUs but its PF %s has not '
                             'enabled it (sriov_numvfs %d)'
                             % (vf, dev.address, dev.numvfs))
        if dev.mdevs and dev.physfn is None:
            type_id = dev.mdevs[0].type_id
            if capacity.available_instances(dev, type_id, dev.mdevs[1:]) < 1:
                ctx.fail('device %s: its mdevs %s exceed what the GPU can '
                         'hold (one type per GPU, max_instance each)'
                         % (dev.address, ', '.join(
                             '%s (%s)' % m for m in dev.mdevs)))
    _check_sriov_capacity(ctx, profile, by_addr)
    _check_gpus(ctx, profile, by_addr)


def _check_gpus(ctx, profile, by_addr):
    """MIG-backed types name a GI profile of their GPU's table; no vGPU
    at boot on a GPU with MIG on (GIs do not survive a reboot)."""
    for dev in profile.devices:
        if not dev.vgpu_types:
            continue
        pf = by_addr.get(dev.physfn)
        gpu = pf.gpu if pf is not None else None
        table = gpu.gi_table if gpu is not None else None
        for mtype in dev.vgpu_types:
            if mtype.gi_profile_id is None:
                continue
            if table is None or table.profile(mtype.gi_profile_id) is None:
                ctx.fail('VF %s: MIG-backed type %s names GI profile %d, '
                         'which its GPU %s does not have (give the PF a '
                         '"gpu" with a "mig" table that has it)' % (
                             dev.address, mtype.id, mtype.gi_profile_id,
                             dev.physfn))
        if dev.held_type is not None and gpu is not None and gpu.mig_mode:
            ctx.fail('VF %s holds a vGPU at boot, but MIG is on on its GPU '
                     '%s: GPU instances do not survive a reboot'
                     % (dev.address, dev.physfn))


def _check_sriov_capacity(ctx, profile, by_addr):
    """Replay the vGPUs on the VFs of each physical GPU, in profile order,
    through ``capacity``'s rules: each must have fitted when it was made."""
    from libvirt_gpu.simulator import capacity

    for pf in profile.devices:
        if not pf.virtfns:
            continue
        shared = pf.vf_capacity == VF_SHARED
        made = []
        current = {}
        for vf in pf.virtfns[:pf.numvfs]:
            vdev = by_addr.get(vf)
            if vdev is None:
                continue
            for i, mdev in enumerate(vdev.mdevs):
                if capacity.available_instances(
                        vdev, mdev.type_id, vdev.mdevs[:i],
                        gpu_mdevs=made if shared else None) < 1:
                    ctx.fail('VF %s: mdev %s (%s) exceeds what its GPU %s '
                             'can hold (one vGPU per VF, one type per GPU, '
                             'max_instance per GPU)' % (
                                 vf, mdev.uuid, mdev.type_id, pf.address))
                made.append(mdev)
            if vdev.vgpu_types:
                current[vf] = None
        for vf in list(current):
            wanted = by_addr[vf].held_type
            if wanted is None:
                continue
            creatable = capacity.vf_creatable(by_addr[vf], current)
            if not any(t.id == wanted for t in creatable):
                ctx.fail('VF %s: vGPU %s does not fit on GPU %s next to %s '
                         '(equal-size mode: one framebuffer size per GPU, '
                         'max_instance per GPU)' % (
                             vf, wanted, pf.address, ', '.join(
                                 sorted(t for t in current.values() if t))
                             or 'nothing'))
            current[vf] = wanted


def _check_parent_chain(ctx, dev, by_addr):
    seen = {dev.address}
    current = dev
    while current.parent_bridge is not None:
        bridge = current.parent_bridge
        if bridge in seen:
            ctx.fail('device %s: parent_bridge chain loops at %s'
                     % (dev.address, bridge))
        seen.add(bridge)
        if bridge not in by_addr:
            return
        current = by_addr[bridge]


# --- synthetic hosts ------------------------------------------------------
