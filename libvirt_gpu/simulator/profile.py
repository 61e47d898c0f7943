"""Simulated hosts as frozen records, loaded and validated from JSON.

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

How VFs share their GPU's capacity is ``capacity``'s business.
"""

from __future__ import annotations

import collections
import math
import errno
import functools
import json
import os
import re
import typing

from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu import records

PROFILE_DIR_NAME = 'profiles'
_HEX4_RE = re.compile(r'[0-9a-f]{4}')
_CLASS_RE = re.compile(r'0x[0-9a-f]{6}')
_NAME_RE = re.compile(r'[A-Za-z0-9][A-Za-z0-9_.-]{0,63}')
_DRIVER_RE = re.compile(r'[A-Za-z0-9][A-Za-z0-9_.-]{0,63}')
_DEVICE_APIS = ('vfio-pci', 'vfio-ccw', 'vfio-ap')
_MAX_FILE_BYTES = 16 * 1024 * 1024

# What an implied upstream port looks like (Skylake-SP root port).
BRIDGE_VENDOR_ID = '8086'
BRIDGE_PRODUCT_ID = '2030'
BRIDGE_CLASS = '0x060400'
BRIDGE_VENDOR_NAME = 'Intel Corporation'
BRIDGE_PRODUCT_NAME = 'Sky Lake-E PCI Express Root Port A'
BRIDGE_DRIVER = 'pcieport'

BUSY_BLOCK = 'block'
BUSY_EBUSY = 'ebusy'
BUSY_REMOVE_MODES = (BUSY_BLOCK, BUSY_EBUSY)

VF_SHARED = 'shared'
VF_PER_VF = 'per-vf'
VF_CAPACITIES = (VF_SHARED, VF_PER_VF)


@records.record
class SimType:
    """One ``mdev_supported_types/<id>`` entry of a parent."""

    id: str
    name: str | None
    description: str | None
    device_api: str
    max_instance: int
    framebuffer_mb: int | None = None   # vendor-interface types

    @property
    def framebuffer(self):
        """Framebuffer in MB: ``framebuffer_mb``, else the description's
        ``framebuffer=2048M``, else None."""
        if self.framebuffer_mb is not None:
            return self.framebuffer_mb
        value = objects.parse_description(self.description).get(
            'framebuffer', '')
        return int(value[:-1]) if value.endswith('M') and \
            value[:-1].isdigit() else None

    @property
    def number(self):
        """``nvidia-1145`` -> 1145 (the vendor interface's type number)."""
        return objects.vendor_type_number(self.id)


class SimMdev(typing.NamedTuple):
    """An existing mdev: ``(uuid, type_id)``."""

    uuid: str
    type_id: str


@records.record
class SimDevice:
    """One PCI function of the simulated host."""

    address: str                    # '0000:af:00.0', canonical lowercase
    vendor_id: str                  # '10de'
    product_id: str                 # '1eb8'
    class_code: str                 # '0x030200'
    subsystem_vendor_id: str        # '10de'
    subsystem_device_id: str        # '12a2'
    vendor_name: str | None
    product_name: str | None
    driver: str | None    # 'nvidia', 'vfio-pci', None
    numa_node: int                  # -1: none
    iommu_group: int | None
    parent_bridge: str | None   # upstream port; None: root bus
    mdev_types: tuple[SimType, ...] = ()
    mdevs: tuple[SimMdev, ...] = ()
    sriov_totalvfs: int | None = None   # set on an SR-IOV PF
    virtfns: tuple[str, ...] = ()          # VF addresses, in order
    physfn: str | None = None           # set on a VF
    sriov_numvfs: int | None = None     # None: every listed VF
    # On a PF: how its VFs' vGPUs share the GPU.  'shared' (the driver's
    # way): max_instance counts every vGPU on every VF of the GPU.
    # 'per-vf': each VF on its own (the synthetic benchmark host only).
    vf_capacity: str = 'shared'
    vgpu_types: tuple[SimType, ...] = ()   # vendor interface (a VF)
    held_type: str | None = None

    @property
    def numvfs(self):
        """How many VFs are enabled (``sriov_numvfs``)."""
        if self.sriov_numvfs is None:
            return len(self.virtfns)
        return self.sriov_numvfs

    @property
    def enabled_virtfns(self):
        """The VFs that exist now: the first ``numvfs`` listed."""
        return self.virtfns[:self.numvfs]

    def vgpu_type(self, type_id):
        for mtype in self.vgpu_types:
            if mtype.id == type_id:
                return mtype
        return None

    @property
    def pci_address(self):
        return objects.PciAddress.parse(self.address)

    @property
    def libvirt_name(self):
        return self.pci_address.libvirt_name

    @property
    def is_bridge(self):
        return self.class_code.startswith('0x0604')

    def mdev_type(self, type_id):
        for mtype in self.mdev_types:
            if mtype.id == type_id:
                return mtype
        return None


@records.record
class Profile:
    """A simulated host: its PCI devices, types and existing mdevs."""

    name: str
    description: str
    hostname: str
    no_capacity_errno: str          # 'EINVAL' (NVIDIA), 'EUSERS', ...
    devices: tuple[SimDevice, ...]
    # removing a vGPU a guest uses: 'block' (kernel >= 5.16) or 'ebusy'
    busy_remove: str = BUSY_BLOCK

    def device(self, address):
        """The device (listed or implied bridge) at ``address``."""
        address = str(objects.PciAddress.parse(address))
        dev = self._by_address.get(address)
        if dev is not None:
            return dev
        raise exception.SimulatorError(
            reason='profile %s has no PCI device %s' % (self.name, address))

    @functools.cached_property
    def _by_address(self):
        return {dev.address: dev for dev in self.all_pci_devices()}

    def bridges(self):
        """Implied upstream ports: ``parent_bridge`` values not listed."""
        return self._bridges

    @functools.cached_property
    def _bridges(self):
        listed = {dev.address for dev in self.devices}
        found = {}
        for dev in self.devices:
            bridge = dev.parent_bridge
            if bridge is None or bridge in listed or bridge in found:
                continue
            found[bridge] = SimDevice(
                address=bridge, vendor_id=BRIDGE_VENDOR_ID,
                product_id=BRIDGE_PRODUCT_ID, class_code=BRIDGE_CLASS,
                subsystem_vendor_id=BRIDGE_VENDOR_ID,
                subsystem_device_id='0000',
                vendor_name=BRIDGE_VENDOR_NAME,
                product_name=BRIDGE_PRODUCT_NAME, driver=BRIDGE_DRIVER,
                numa_node=dev.numa_node, iommu_group=None,
                parent_bridge=None)
        groups = self._fresh_groups(len(found))
        return tuple(records.replace(bridge, iommu_group=group)
                     for bridge, group in zip(found.values(), groups))

    def pci_devices(self):
        """Implied bridges first, then the listed devices that exist now
        (a VF whose PF has not enabled it is left out)."""
        return self._present

    @functools.cached_property
    def _present(self):
        disabled = {vf for dev in self.devices
                    for vf in dev.virtfns[dev.numvfs:]}
        return self.bridges() + tuple(d for d in self.devices
                                      if d.address not in disabled)

    def all_pci_devices(self):
        """Implied bridges and every listed device, enabled or not."""
        return self.bridges() + self.devices

    def physical(self, dev):
        """The device of ``dev``'s physical GPU: its PF, or itself."""
        if dev.physfn is not None:
            return self.device(dev.physfn)
        return dev

    def gpu_functions(self, dev):
        """Every listed PCI function of ``dev``'s physical GPU: the PF
        first, then its VFs in order (enabled or not)."""
        pf = self.physical(dev)
        return (pf,) + tuple(self.device(vf) for vf in pf.virtfns)

    def gpu_mdevs(self, dev):
        """The mdevs on every function of ``dev``'s physical GPU, or None
        when its VFs do not share capacity (``vf_capacity`` 'per-vf') or it
        has no VFs."""
        pf = self.physical(dev)
        if not pf.virtfns or pf.vf_capacity != VF_SHARED:
            return None
        return tuple(m for f in self.gpu_functions(dev) for m in f.mdevs)

    def gpu_current_types(self, dev):
        """``{VF address: type id or None}`` of the enabled VFs of
        ``dev``'s physical GPU that have the vendor interface."""
        pf = self.physical(dev)
        found = {}
        for vf in pf.enabled_virtfns:
            vdev = self.device(vf)
            if vdev.vgpu_types:
                found[vf] = vdev.held_type
        return found

    def mdev_iommu_groups(self):
        """``{uuid: group}``: each mdev gets a fresh group, as NVIDIA's do.

        Numbered after every group a PCI device (or implied bridge) uses,
        in profile order, so sysfs and node XML agree.
        """
        uuids = [mdev.uuid for dev in self.devices for mdev in dev.mdevs]
        n_bridges = len(self.bridges())
        groups = self._fresh_groups(n_bridges + len(uuids))[n_bridges:]
        return dict(zip(uuids, groups))

    def _fresh_groups(self, count):
        used = [dev.iommu_group for dev in self.devices
                if dev.iommu_group is not None]
        start = max(used) + 1 if used else 0
        return list(range(start, start + count))


# --- loading -------------------------------------------------------------

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
                             'busy_remove', 'type_catalogues'))
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
    catalogues = _catalogues(ctx, data.get('type_catalogues', {}))
    raw_devices = data['devices']
    if not isinstance(raw_devices, list) or not raw_devices:
        ctx.fail('"devices" must be a non-empty list')
    devices = tuple(_device(ctx, i, raw, catalogues)
                    for i, raw in enumerate(raw_devices))
    profile = Profile(
        name=name,
        description=ctx.string(data, 'description', 'profile', default=''),
        hostname=ctx.string(data, 'hostname', 'profile',
                            default='sim-' + name),
        no_capacity_errno=errno_name,
        devices=devices,
        busy_remove=busy_remove)
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
                                 'framebuffer_mb'))
        type_id = ctx.string(entry, 'id', here)
        try:
            objects.validate_type_id(type_id)
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
                                       nullable=True)))
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
                'held_type', 'vf_capacity')


def _device(ctx, index, raw, catalogues):
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
        held_type=current, vf_capacity=vf_capacity)


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
            uuid = objects.validate_uuid(entry['uuid'])
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

_VFS_PER_PF = 32
_PFS_PER_DOMAIN = 120
_SYNTH_UUID_NS = '8c5b4a3e-0f5e-4a8e-9d77-1f2b3c4d5e6f'


def synthetic_profile(parents, types=20):
    """A host with ``parents`` mdev parents, for benchmarks.

    Up to 8 parents: that many T4-style GPUs, each an mdev parent.  More:
    ``max(8, ceil(parents / 32))`` A100-style SR-IOV PFs (no types of their
    own, ``sriov_totalvfs`` 32) whose VFs are the parents, one vGPU each,
    as with NVIDIA's Ampere GPUs before vGPU 17.  Every fourth parent holds
    one mdev of the first type.  Each parent offers ``types`` types.
    """
    import uuid as uuidlib

    for value, what in ((parents, 'parents'), (types, 'types')):
        if isinstance(value, bool) or not isinstance(value, int) \
                or value < 1:
            raise exception.SimulatorError(
                reason='synthetic_profile: %s must be an integer >= 1, not '
                '%r' % (what, value))
    sriov = parents > 8
    heads = (16, 8, 4, 2, 1)
    catalogue = [{
        'id': 'nvidia-%d' % (500 + i),
        'name': 'NVIDIA SIM-%dQ' % (i + 1),
        'description': ('num_heads=4, frl_config=60, framebuffer=%dM, '
                        'max_resolution=5120x2880, max_instance=%d'
                        % (1024 * (i % 5 + 1),
                           1 if sriov else heads[i % 5])),
        'max_instance': 1 if sriov else heads[i % 5],
    } for i in range(types)]
    first_type = catalogue[0]['id']
    namespace = uuidlib.UUID(_SYNTH_UUID_NS)
    devices = []
    group = [10]
    n_parents = [0]

    def next_group():
        group[0] += 1
        return group[0] - 1

    def parent_fields(address):
        fields = {'mdev_types': 'sim', 'iommu_group': next_group()}
        if n_parents[0] % 4 == 0:
            fields['mdevs'] = [{
                'uuid': str(uuidlib.uuid5(namespace, address)),
                'type_id': first_type}]
        n_parents[0] += 1
        return fields

    n_gpus = max(8, math.ceil(parents / _VFS_PER_PF)) if sriov else parents
    for k in range(n_gpus):
        domain, j = divmod(k, _PFS_PER_DOMAIN)
        bridge = '%04x:%02x:00.0' % (domain, 0x10 + 2 * j)
        address = '%04x:%02x:00.0' % (domain, 0x11 + 2 * j)
        gpu = {
            'address': address, 'vendor_id': '10de',
            'class_code': '0x030200', 'subsystem_vendor_id': '10de',
            'vendor_name': 'NVIDIA Corporation', 'driver': 'nvidia',
            'numa_node': k % 2, 'parent_bridge': bridge,
        }
        if not sriov:
            gpu.update(product_id='1eb8', subsystem_device_id='12a2',
                       product_name='TU104GL [Tesla T4]',
                       **parent_fields(address))
            devices.append(gpu)
            continue
        n_vfs = parents // n_gpus + (1 if k < parents % n_gpus else 0)
        vfs = []
        for v in range(n_vfs):
            devfn = 4 + v
            vfs.append('%04x:%02x:%02x.%x' % (domain, 0x11 + 2 * j, devfn >> 3,
                                              devfn & 7))
        # Each VF here stands for an mdev parent of its own, so the VFs do
        # not share capacity ('per-vf'): the benchmark wants many parents,
        # not a model of one GPU (the a100 profile is that).
        gpu.update(product_id='20f1', subsystem_device_id='145f',
                   product_name='GA100 [A100 PCIe 40GB]',
                   iommu_group=next_group(), sriov_totalvfs=_VFS_PER_PF,
                   virtfns=vfs, vf_capacity=VF_PER_VF)
        devices.append(gpu)
        vf_fields = {k: v for k, v in gpu.items() if k != 'vf_capacity'}
        for vf in vfs:
            devices.append(dict(vf_fields, address=vf, sriov_totalvfs=None,
                                virtfns=[], physfn=address,
                                **parent_fields(vf)))
    return profile_from_dict({
        'name': 'synthetic-%d' % parents,
        'description': 'generated: %d mdev parents, %d types each'
                       % (parents, types),
        'hostname': 'sim-synthetic-%d' % parents,
        'no_capacity_errno': 'EINVAL',
        'type_catalogues': {'sim': catalogue},
        'devices': devices,
    }, source='synthetic_profile(%d, %d)' % (parents, types))
