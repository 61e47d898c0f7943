"""The kernel's mdev rules as a state machine (no files, no FUSE).

``SimKernel(profile)`` holds what a Linux kernel with NVIDIA's vGPU manager
holds for a host: which GPUs are mdev parents, which mdevs exist (UUID,
parent, type, IOMMU group), which are in use by a guest.  Its methods are
the sysfs writes, with the kernel's answers as ``OSError(errno)``::

    <parent>/mdev_supported_types/<type>/create  <- "<uuid>"  create_mdev()
    <mdev>/remove                                <- "1"       remove_mdev()
    bus/pci/drivers/<driver>/unbind              <- address   unbind_parent()
    bus/pci/drivers/<driver>/bind                <- address   bind_parent()

What a create is answered with, in the kernel's order (``mdev_core.c``
``create_store`` / ``mdev_device_create``, then the vendor driver's probe):

    EINVAL  fewer than 36 or more than 37 bytes, or not a UUID (guid_parse;
            a 37th byte is ignored, hex digits may be uppercase)
    EEXIST  the UUID is used by an mdev on any parent
    ENODEV  the parent is being unregistered (its driver is unbinding)
    ENOENT  the parent does not offer the type (no such ``create`` file)
    profile.no_capacity_errno   no capacity left: ``available_instances``
            of the type is 0 (NVIDIA: EINVAL, the mdev core: EUSERS).
            NVIDIA's time-sliced GPUs hold one type at a time, so another
            type on a GPU that has vGPUs is refused the same way
            (``capacity.available_instances``).

``available_instances`` is computed when asked, from the mdevs that exist
now, for every type of the parent (they share one GPU) and, on an SR-IOV
VF, of every VF of the same GPU (``capacity``'s rules).

Removing an mdev that a guest uses (``mark_busy``) either blocks until the
guest lets go (``busy_remove='block'``: the kernel since 5.16, where vfio
waits for the device to be released) or answers EBUSY at once
(``'ebusy'``: older kernels, whose vendor ``remove`` callback refused).
The profile's ``busy_remove`` says which; the ``busy_remove`` argument,
when given, overrides it.

Unbinding a parent's driver (``unbind_parent``, "the GPU goes away") makes
new creates on it fail with ENODEV at once, removes its mdevs (waiting for
busy ones in ``'block'`` mode, forcing them in ``'ebusy'`` mode, as
``mdev_unregister_parent`` does) and then its ``mdev_supported_types``.

NVIDIA's vGPU 17+ interface (a VF with ``vgpu_types``, no mdev)::

    <VF>/nvidia/CURRENT_TYPE  <- "<n>"   set_vgpu_type()

``n`` among the VF's ``CREATABLE_TYPES`` (``capacity``'s equal-size
rule over every VF of the GPU) makes the vGPU; ``0`` destroys it (a no-op
on a free VF).  EINVAL: not a number, or not creatable now; EBUSY: the VF
holds a vGPU already.  Destroying one a guest uses (``mark_busy(vf)``)
blocks or answers EBUSY as ``busy_remove`` says.  (NVIDIA documents none
of these answers: they are assumptions, kept in this one place.)  A VF
that is not enabled has no ``nvidia/`` directory: ENOENT.

SR-IOV (``sriov_numvfs_store`` in ``drivers/pci/iov.c``)::

    <PF>/sriov_numvfs  <- "<n>"   set_numvfs()

``kstrtou16``: not a number is EINVAL, above 65535 or above
``sriov_totalvfs`` is ERANGE; the current count is a no-op; 0 disables
the VFs (EBUSY while one holds an mdev or a vGPU: our assumption of what
NVIDIA's ``sriov_configure`` answers); another count while VFs are enabled
is EBUSY; else the first ``n`` VFs the profile lists appear (ENOSPC: it
lists fewer).  A VF that is not enabled is ``absent``: it has no files,
so writes to it are ENOENT.

Every change is reported, in order and under the kernel's lock, to the
callables given to ``subscribe`` (the live tree applies it to its files and
broadcasts the uevent).  One lock serialises everything, as the kernel's
``mdev_list_lock`` does, so two creators racing for the last instance get
exactly one success.

Failures a test injects (``inject``): the ``nth`` call of a point from
now on fails once with the error given, before it changes anything; the
points are the writes above to ``sriov_numvfs`` and a VF's
``CURRENT_TYPE`` (``SYSFS_POINTS``, by their file names; answered with
that errno) and the simulated NVML's C functions (``simulator.nvml``,
answered with that NVML return code).  Armed faults are part of
``driver_state()`` (so a static tree keeps them in its driver file and
every process emulating it counts the same calls); each call that counts
one down is announced as a ``DriverChanged``.

``restore(KernelState)`` replaces what the kernel holds (mdevs, vGPUs,
enabled VFs, parents being unregistered) with what a sysfs tree shows:
processes that share one tree and its lock rebuild the state from the
tree before each write, so they agree as one kernel would.
"""

import errno
import re
import threading

from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.simulator import capacity
from libvirt_gpu.simulator import loading
from libvirt_gpu.simulator import mig
from libvirt_gpu.simulator import profile as profile_mod
from libvirt_gpu.util import records
import libvirt_gpu.devices.backends.nvidia_vgpu.names as vendor_names

UUID_STRING_LEN = 36

BUSY_BLOCK = profile_mod.BUSY_BLOCK
BUSY_EBUSY = profile_mod.BUSY_EBUSY
BUSY_MODES = profile_mod.BUSY_REMOVE_MODES

# Parent states: bound to its vGPU driver; unbinding ("going": creates get
# ENODEV, its mdevs are being removed); unbound (no types, no mdevs).
BOUND = 'bound'
GOING = 'going'
UNBOUND = 'unbound'
ABSENT = 'absent'          # a VF that is not enabled: no files at all
U16_MAX = 0xffff

# The sysfs writes a failure can be injected at (``SimKernel.inject``).
SYSFS_POINTS = ('sriov_numvfs', vendor_names.CURRENT_TYPE)

# uuid_is_valid(): hex digits (either case) and dashes at 8, 13, 18, 23.
_GUID_RE = re.compile(r'[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}')


def _error(code, what):
    return OSError(code, '%s: %s' % (what, errno.errorcode.get(code, code)))


@records.record
class KMdev:
    """An mdev the kernel holds."""

    uuid: str
    parent: str          # '0000:af:00.0'
    type_id: str
    iommu_group: int


# -- events (what subscribers are told) ---------------------------------------

@records.record
class MdevAdded:
    mdev: KMdev


@records.record
class MdevRemoved:
    mdev: KMdev


@records.record
class VgpuTypeSet:
    """A vendor-interface VF's vGPU was made (``type_id``) or destroyed
    (``type_id`` None)."""

    vf: str
    type_id: object


@records.record
class ParentGoing:
    """Unbinding started: ``class/mdev_bus/<parent>`` is gone."""

    parent: str


@records.record
class ParentUnbound:
    """The parent's driver let go: no types, no ``driver`` link."""

    parent: str
    driver: str


@records.record
class ParentBound:
    """The parent's driver is back: types and ``class/mdev_bus`` link."""

    parent: str
    driver: str


@records.record
class VfsEnabled:
    """``sriov_numvfs`` of ``pf`` went from 0 to ``len(vfs)``."""

    pf: str
    vfs: tuple


@records.record
class VfsDisabled:
    """The VFs ``vfs`` of ``pf`` went away (``sriov_numvfs`` 0)."""

    pf: str
    vfs: tuple


@records.record
class DriverChanged:
    """The driver's state beyond sysfs changed (MIG mode, GPU instances,
    mixed-size mode, scheduler, where vGPUs sit): ``state`` is
    ``SimKernel.driver_state()``."""

    state: dict


@records.record
class KernelState:
    """What a sysfs tree shows of the kernel's state (``restore``)."""

    mdevs: tuple = ()        # KMdev
    vgpus: tuple = ()        # (VF address, type id) of VFs holding a vGPU
    numvfs: tuple = ()       # (PF address, sriov_numvfs)
    going: tuple = ()        # parents whose class/mdev_bus link is gone
    driver: dict | None = None   # driver_state(); None: as at boot


def parse_create(data):
    """The UUID a write of ``data`` to ``create`` names (lowercase), or
    ``OSError(EINVAL)`` as the kernel answers."""
    if isinstance(data, str):
        data = data.encode('utf-8', 'surrogateescape')
    if len(data) < UUID_STRING_LEN or len(data) > UUID_STRING_LEN + 1:
        raise _error(errno.EINVAL, 'create')
    text = data[:UUID_STRING_LEN].decode('ascii', 'replace')
    if _GUID_RE.fullmatch(text) is None:
        raise _error(errno.EINVAL, 'create')
    return text.lower()


def parse_ulong(data, what='remove', limit=None):
    """``kstrtoul(buf, 0)``: decimal, 0x hex or 0 octal, one optional
    trailing newline; else ``OSError(EINVAL)``.  Above ``limit``
    (``kstrtou16``...): ``OSError(ERANGE)``."""
    value = _parse_ulong(data, what)
    if limit is not None and value > limit:
        raise _error(errno.ERANGE, what)
    return value


def _parse_ulong(data, what):
    if isinstance(data, bytes):
        data = data.decode('ascii', 'replace')
    if data.endswith('\n'):
        data = data[:-1]
    body = data[1:] if data.startswith('+') else data
    if re.fullmatch(r'0[xX][0-9a-fA-F]+', body):
        return int(body, 16)
    if re.fullmatch(r'0[0-7]*', body):
        return int(body, 8)
    if re.fullmatch(r'[1-9][0-9]*', body):
        return int(body, 10)
    raise _error(errno.EINVAL, what)


class SimKernel(object):
    """See the module doc.  Thread-safe; every method may be called from
    any thread (the FUSE server runs one thread per request)."""

    def __init__(self, profile, busy_remove=None):
        self.profile = loading.load_profile(profile)
        if busy_remove is None:
            busy_remove = self.profile.busy_remove
        if busy_remove not in BUSY_MODES:
            raise exception.SimulatorError(
                reason='busy_remove must be one of %s, not %r'
                % (', '.join(BUSY_MODES), busy_remove))
        self.busy_remove = busy_remove
        self.no_capacity_errno = getattr(errno,
                                         self.profile.no_capacity_errno)
        self._cond = threading.Condition(threading.RLock())
        # Every listed function that can be a parent, enabled or not; one
        # whose PF has not enabled it is ABSENT.
        self._parents = {dev.address: dev for dev in self.profile.devices
                         if dev.mdev_types}
        self._pfs = {dev.address: dev for dev in self.profile.devices
                     if dev.sriov_totalvfs is not None}
        self._numvfs = {a: dev.numvfs for a, dev in self._pfs.items()}
        self._state = {}
        # parent -> addresses of every function of its physical GPU, for
        # the VFs that share their GPU's capacity (capacity.py, rule 2)
        self._shared_gpu = {
            address: frozenset(f.address
                               for f in self.profile.gpu_functions(dev))
            for address, dev in self._parents.items()
            if self.profile.gpu_mdevs(dev) is not None}
        self._pci_groups = {dev.iommu_group
                            for dev in self.profile.all_pci_devices()
                            if dev.iommu_group is not None}
        groups = self.profile.mdev_iommu_groups()
        self._mdevs = {}
        for dev in self.profile.devices:
            for mdev in dev.mdevs:
                self._mdevs[mdev.uuid] = KMdev(mdev.uuid, dev.address,
                                               mdev.type_id,
                                               groups[mdev.uuid])
        self._vendor_vfs = {dev.address: dev for dev in self.profile.devices
                            if dev.vgpu_types}
        self._current = {a: dev.held_type
                         for a, dev in self._vendor_vfs.items()}
        # The driver's state beyond sysfs, per physical GPU with a ``gpu``
        # section (mig.py's rules), and where each of its vGPUs sits.
        self._gpus = {dev.address: dev.gpu for dev in self.profile.devices
                      if dev.gpu is not None}
        self._driver = {a: mig.GpuState(mig_mode=gpu.mig_mode)
                        for a, gpu in self._gpus.items()}
        self._placed = {}
        # injected failures: point -> [calls until the failing one, error]
        self._faults = {}
        self._set_presence()
        self._place_held()
        self._busy = set()
        self._subscribers = []
        self._closed = False

    # -- observers ----------------------------------------------------------

    def subscribe(self, callback):
        """``callback(event)`` for every change, in order, under the lock
        (it must not call back into a method that waits)."""
        with self._cond:
            self._subscribers.append(callback)

    def _emit(self, event):
        for callback in list(self._subscribers):
            callback(event)

    # -- what the kernel shows ----------------------------------------------

    def _enabled(self, address):
        """Whether the function ``address`` exists now (a VF: its PF has
        enabled it)."""
        dev = self.profile.device(address)
        if dev.physfn is None or dev.physfn not in self._numvfs:
            return True
        pf = self._pfs[dev.physfn]
        return address in pf.virtfns[:self._numvfs[dev.physfn]]

    def _set_presence(self):
        """Parents: BOUND when enabled, ABSENT when not (the others keep
        their state); vGPUs of absent VFs are gone."""
        for address in self._parents:
            enabled = self._enabled(address)
            if not enabled:
                self._state[address] = ABSENT
            elif self._state.get(address) in (None, ABSENT):
                self._state[address] = BOUND
        for address in self._vendor_vfs:
            if not self._enabled(address):
                self._current[address] = None

    def parents(self):
        """Addresses of every GPU that can be an mdev parent now (not the
        VFs that are not enabled)."""
        with self._cond:
            return sorted(a for a, st in self._state.items()
                          if st != ABSENT)

    def parent_state(self, address):
        """``bound``, ``going``, ``unbound`` or ``absent`` (KeyError: not a
        parent)."""
        with self._cond:
            return self._state[str(address)]

    def device(self, address):
        return self._parents[str(address)]

    def mdevs(self, parent=None):
        """Every mdev (of ``parent``), sorted by UUID."""
        with self._cond:
            return [m for _, m in sorted(self._mdevs.items())
                    if parent is None or m.parent == str(parent)]

    def mdev(self, uuid):
        with self._cond:
            return self._mdevs.get(uuid)

    def busy(self):
        with self._cond:
            return sorted(self._busy)

    def available_instances(self, parent, type_id):
        """What ``<parent>/mdev_supported_types/<type>/available_instances``
        reads now (0 while the parent is not bound)."""
        parent = str(parent)
        with self._cond:
            if self._state.get(parent) != BOUND:
                return 0
            kwargs = {}
            gpu_mdevs = self._gpu_mdevs(parent)
            if gpu_mdevs is not None:
                kwargs['gpu_mdevs'] = gpu_mdevs
            return capacity.available_instances(
                self._parents[parent], type_id,
                [(m.uuid, m.type_id) for m in self._mdevs.values()
                 if m.parent == parent], **kwargs)

    def _gpu_mdevs(self, parent):
        """The mdevs the kernel holds now on every function of
        ``parent``'s physical GPU when its VFs share the GPU's capacity,
        else None: ``Profile.gpu_mdevs`` of the profile's devices, with
        this kernel's mdevs instead of the profile's initial ones."""
        functions = self._shared_gpu.get(parent)
        if functions is None:
            return None
        return [(m.uuid, m.type_id) for m in self._mdevs.values()
                if m.parent in functions]

    # -- writes -------------------------------------------------------------

    def create_mdev(self, parent, type_id, data):
        """A write of ``data`` to ``<parent>/.../<type_id>/create``.

        Returns the new mdev; raises ``OSError`` with the kernel's errno
        (see the module doc).
        """
        uuid = parse_create(data)
        parent = str(objects.PciAddress.parse(parent))
        with self._cond:
            self._check_open()
            if uuid in self._mdevs:
                raise _error(errno.EEXIST, 'create')
            state = self._state.get(parent)
            if state in (None, UNBOUND, ABSENT):
                # no mdev_supported_types: there is no create file
                raise _error(errno.ENOENT, 'create')
            if state == GOING:
                raise _error(errno.ENODEV, 'create')
            device = self._parents[parent]
            if device.mdev_type(type_id) is None:
                raise _error(errno.ENOENT, 'create')
            if self.available_instances(parent, type_id) < 1:
                raise _error(self.no_capacity_errno, 'create')
            mdev = KMdev(uuid, parent, type_id, self._fresh_group())
            self._mdevs[uuid] = mdev
            self._emit(MdevAdded(mdev))
            return mdev

    def _fresh_group(self):
        # The kernel's IOMMU group ids come from an IDA: the lowest free
        # one.  Ours start after the PCI devices' groups.
        used = self._pci_groups | {m.iommu_group for m in
                                   self._mdevs.values()}
        group = max(self._pci_groups) + 1 if self._pci_groups else 0
        while group in used:
            group += 1
        return group

    def remove_mdev(self, uuid, data=b'1'):
        """A write of ``data`` to ``bus/mdev/devices/<uuid>/remove``.

        ``0`` does nothing (False).  A busy mdev blocks the writer until it
        is idle, or answers EBUSY (``busy_remove``).  ENOENT: no such mdev.
        True: removed (also when another writer removed it while this one
        waited, as the kernel's ``device_remove_file_self`` makes it).
        """
        if not parse_ulong(data):
            return False
        with self._cond:
            self._check_open()
            if uuid not in self._mdevs:
                raise _error(errno.ENOENT, 'remove')
            while uuid in self._busy:
                if self.busy_remove == BUSY_EBUSY:
                    raise _error(errno.EBUSY, 'remove')
                self._cond.wait()
                self._check_open()
                if uuid not in self._mdevs:
                    return True
            self._remove(uuid)
            return True

    def _remove(self, uuid):
        mdev = self._mdevs.pop(uuid)
        self._busy.discard(uuid)
        self._emit(MdevRemoved(mdev))
        self._cond.notify_all()

    def mark_busy(self, key):
        """A guest uses the mdev ``key`` (a UUID: vfio holds it open), or
        the vGPU of the vendor-interface VF ``key`` (an address)."""
        with self._cond:
            if key not in self._mdevs and not self._current.get(key):
                raise _error(errno.ENOENT, 'busy')
            self._busy.add(key)

    def mark_idle(self, key):
        """The guest let go: a blocked remove proceeds."""
        with self._cond:
            self._busy.discard(key)
            self._cond.notify_all()

    def unbind_parent(self, address):
        """The GPU's driver unbinds (``mdev_unregister_parent``): creates
        fail with ENODEV, its mdevs go (busy ones: see the module doc),
        then its types.  ENODEV: not a bound parent."""
        address = str(objects.PciAddress.parse(address))
        with self._cond:
            self._check_open()
            if self._state.get(address) != BOUND:
                raise _error(errno.ENODEV, 'unbind')
            self._state[address] = GOING
            self._emit(ParentGoing(address))
            while True:
                mine = [u for u, m in sorted(self._mdevs.items())
                        if m.parent == address]
                if not mine:
                    break
                idle = [u for u in mine if u not in self._busy]
                if idle or self.busy_remove == BUSY_EBUSY:
                    self._remove((idle or mine)[0])
                    continue
                self._cond.wait()
                self._check_open()
            self._state[address] = UNBOUND
            self._emit(ParentUnbound(address,
                                     self._parents[address].driver))

    def bind_parent(self, address):
        """The GPU's vGPU driver binds again: its types come back (with
        full capacity: its mdevs did not survive).  EBUSY: bound or
        unbinding; ENODEV: not an mdev parent of this host."""
        address = str(objects.PciAddress.parse(address))
        with self._cond:
            self._check_open()
            state = self._state.get(address)
            if state in (None, ABSENT):
                raise _error(errno.ENODEV, 'bind')
            if state != UNBOUND:
                raise _error(errno.EBUSY, 'bind')
            self._state[address] = BOUND
            self._emit(ParentBound(address, self._parents[address].driver))

    # -- vGPU 17+ vendor interface ----------------------------------------

    def vendor_vfs(self):
        """Addresses of the enabled VFs with NVIDIA's vendor interface."""
        with self._cond:
            return sorted(a for a in self._vendor_vfs if self._enabled(a))

    def vf_type(self, vf):
        """The type id of the vGPU ``vf`` holds, or None."""
        with self._cond:
            return self._current[str(vf)]

    def vf_creatable(self, vf):
        """What ``<VF>/nvidia/CREATABLE_TYPES`` lists now (SimTypes).
        """
        vf = str(vf)
        with self._cond:
            dev = self._vendor_vfs[vf]
            # Profile.gpu_current_types, with this kernel's vGPUs: the
            # enabled vendor-interface VFs of the same physical GPU
            gpu = {f.address for f in self.profile.gpu_functions(dev)}
            current = {a: t for a, t in self._current.items() if a in gpu}
            if dev.physfn not in self._gpus:
                return capacity.vf_creatable(dev, current)
            if current.get(vf):
                return ()
            return mig.creatable(
                self._gpus[dev.physfn], self._driver[dev.physfn],
                dev.vgpu_types, self._gpu_placed(dev.physfn),
                lambda: capacity.vf_creatable(dev, current))

    def set_vgpu_type(self, vf, data):
        """A write of ``data`` to ``<VF>/nvidia/CURRENT_TYPE``."""
        vf = str(objects.PciAddress.parse(vf))
        text = data.decode('ascii', 'replace') if isinstance(
            data, bytes) else data
        text = text.strip()
        if not re.fullmatch(r'[0-9]{1,9}', text):
            raise _error(errno.EINVAL, vendor_names.CURRENT_TYPE)
        number = int(text)
        with self._cond:
            self._check_open()
            self._strike_sysfs(vendor_names.CURRENT_TYPE)
            if vf not in self._vendor_vfs or not self._enabled(vf):
                raise _error(errno.ENOENT, vendor_names.CURRENT_TYPE)
            if number == 0:
                if self._current[vf] is None:
                    return None
                while vf in self._busy:
                    if self.busy_remove == BUSY_EBUSY:
                        raise _error(errno.EBUSY, vendor_names.CURRENT_TYPE)
                    self._cond.wait()
                    self._check_open()
                    if self._current[vf] is None:
                        return None
                self._current[vf] = None
                self._placed.pop(vf, None)
                self._busy.discard(vf)
                self._emit(VgpuTypeSet(vf, None))
                self._driver_changed(self._vendor_vfs[vf].physfn)
                self._cond.notify_all()
                return None
            if self._current[vf] is not None:
                raise _error(errno.EBUSY, vendor_names.CURRENT_TYPE)
            found = [t for t in self.vf_creatable(vf)
                     if t.number == number]
            if not found:
                raise _error(self._refused_errno(vf),
                             vendor_names.CURRENT_TYPE)
            self._current[vf] = found[0].id
            pf = self._vendor_vfs[vf].physfn
            if pf in self._gpus:
                dev = self._vendor_vfs[vf]
                self._placed[vf] = mig.place(
                    self._gpus[pf], self._driver[pf], found[0],
                    self._gpu_placed(pf),
                    {t.id: t for t in dev.vgpu_types})
            self._emit(VgpuTypeSet(vf, found[0].id))
            self._driver_changed(pf)
            return found[0].id

    def _refused_errno(self, vf):
        """A type write that does not fit: EINVAL, or EIO on a GPU with
        MIG on (NVRM's error 0x38, as after ``sriov-manage -e`` destroyed
        the GPU instances)."""
        pf = self._vendor_vfs[vf].physfn
        state = self._driver.get(pf)
        if state is not None and state.mig_mode == mig.NVML_DEVICE_MIG_ENABLE:
            return errno.EIO
        return errno.EINVAL

    def vf_gi(self, vf):
        """What ``<VF>/nvidia/<GPU_INSTANCE_ID>`` reads: the GI of the
        VF's MIG-backed vGPU; ENXIO while it holds none (or a time-sliced
        one: an assumption)."""
        with self._cond:
            placed = self._placed.get(str(vf))
            if placed is None or placed.gi is None:
                raise _error(errno.ENXIO, vendor_names.GPU_INSTANCE_ID)
            return placed.gi

    def vf_placement(self, vf):
        """What ``<VF>/nvidia/<PLACEMENT_ID>`` reads: the placement of the
        VF's mixed-size vGPU; ENXIO while it holds none (or one in
        equal-size mode, or a MIG-backed one: assumptions)."""
        with self._cond:
            placed = self._placed.get(str(vf))
            if placed is None or placed.placement is None:
                raise _error(errno.ENXIO, vendor_names.PLACEMENT_ID)
            return placed.placement

    # -- SR-IOV -------------------------------------------------------------

    def numvfs(self, pf):
        """What ``<PF>/sriov_numvfs`` reads (KeyError: not an SR-IOV PF)."""
        with self._cond:
            return self._numvfs[str(pf)]

    def set_numvfs(self, pf, data):
        """A write of ``data`` to ``<PF>/sriov_numvfs`` (see the module
        doc).  Returns the VFs that appeared or went, in order."""
        pf = str(objects.PciAddress.parse(pf))
        if pf not in self._pfs:
            raise _error(errno.ENOENT, 'sriov_numvfs')
        count = parse_ulong(data, 'sriov_numvfs', limit=U16_MAX)
        dev = self._pfs[pf]
        if count > (dev.sriov_totalvfs or 0):
            raise _error(errno.ERANGE, 'sriov_numvfs')
        with self._cond:
            self._check_open()
            self._strike_sysfs('sriov_numvfs')
            now = self._numvfs[pf]
            if count == now:
                return ()
            if count and now:
                raise _error(errno.EBUSY, 'sriov_numvfs')
            if count > len(dev.virtfns):
                raise _error(errno.ENOSPC, 'sriov_numvfs')
            if not count:
                vfs = dev.virtfns[:now]
                if any(m.parent in vfs for m in self._mdevs.values()) or \
                        any(self._current.get(vf) for vf in vfs):
                    raise _error(errno.EBUSY, 'sriov_numvfs')
                self._numvfs[pf] = 0
                self._set_presence()
                self._emit(VfsDisabled(pf, tuple(vfs)))
                return tuple(vfs)
            vfs = dev.virtfns[:count]
            self._numvfs[pf] = count
            self._set_presence()
            state = self._driver.get(pf)
            if state is not None:
                # sriov-manage -e: every GPU instance goes, mixed-size
                # mode is cleared
                state.gis.clear()
                state.heterogeneous = False
            self._emit(VfsEnabled(pf, tuple(vfs)))
            self._driver_changed(pf)
            return tuple(vfs)

    # -- state from a tree --------------------------------------------------

    def restore(self, state):
        """Hold what ``state`` (a ``KernelState``) says instead of what
        this kernel held: its mdevs, vGPUs, enabled VFs and parents being
        unregistered.  Unbound parents stay unbound; busy marks of mdevs
        that are gone are dropped.  No event is sent."""
        with self._cond:
            self._numvfs.update(dict(state.numvfs))
            self._mdevs = {m.uuid: m for m in state.mdevs}
            vgpus = dict(state.vgpus)
            self._current = {a: vgpus.get(a) for a in self._vendor_vfs}
            self._restore_driver(state.driver)
            for address, st in list(self._state.items()):
                if st == GOING:
                    self._state[address] = BOUND
            self._set_presence()
            for address in state.going:
                if self._state.get(address) == BOUND:
                    self._state[address] = GOING
            self._busy = {k for k in self._busy
                          if k in self._mdevs or self._current.get(k)}
            self._place_held()
            self._cond.notify_all()

    # -- the driver's state beyond sysfs (mig.py) -------------------------

    def _gpu_placed(self, pf):
        """The ``mig.Placed`` of every vGPU on ``pf``'s VFs."""
        vfs = set(self._pfs[pf].virtfns) if pf in self._pfs else set()
        return [p for vf, p in sorted(self._placed.items()) if vf in vfs]

    def _place_held(self):
        """Place the vGPUs whose place is not known (a profile's
        ``held_type``, a tree without the driver's file), in VF order."""
        for vf, type_id in sorted(self._current.items()):
            if not type_id or vf in self._placed:
                continue
            dev = self._vendor_vfs[vf]
            if dev.physfn not in self._gpus:
                continue
            types = {t.id: t for t in dev.vgpu_types}
            found = mig.place(self._gpus[dev.physfn],
                              self._driver[dev.physfn], types[type_id],
                              self._gpu_placed(dev.physfn), types)
            if found is None:
                raise exception.SimulatorError(
                    reason='VF %s holds %s, which does not fit its GPU %s '
                    'as the driver holds it' % (vf, type_id, dev.physfn))
            self._placed[vf] = found

    def driver_state(self):
        """The driver's state beyond sysfs as JSON-able data (with
        ``faults``, the injected failures, while one is armed)."""
        with self._cond:
            found = {
                'gpus': {a: s.to_json()
                         for a, s in sorted(self._driver.items())},
                'placed': {vf: [p.type_id, p.gi, p.placement]
                           for vf, p in sorted(self._placed.items())}}
            if self._faults:
                found['faults'] = self.faults()
            return found

    def _restore_driver(self, data):
        self._faults = {point: list(fault) for point, fault in
                        (data or {}).get('faults', {}).items()}
        if data is None:
            self._driver = {a: mig.GpuState(mig_mode=gpu.mig_mode)
                            for a, gpu in self._gpus.items()}
            self._placed = {}
            return
        self._driver = {a: mig.GpuState.from_json(v)
                        for a, v in data['gpus'].items() if a in self._gpus}
        for a, gpu in self._gpus.items():
            self._driver.setdefault(a, mig.GpuState(mig_mode=gpu.mig_mode))
        self._placed = {vf: mig.Placed(*p)
                        for vf, p in data['placed'].items()
                        if self._current.get(vf) == p[0]}

    def _driver_changed(self, pf):
        if pf in self._gpus:
            self._emit(DriverChanged(self.driver_state()))

    # -- injected failures (tests) ----------------------------------------

    def inject(self, point, nth=1, error=None):
        """Make the ``nth`` call of ``point`` from now on fail, once, with
        ``error`` (an errno for a ``SYSFS_POINTS`` write, default EIO; an
        NVML return code for an NVML C function, which ``simulator.nvml``
        checks and defaults); ``nth`` 0 disarms ``point``.  One fault per
        point: a new one replaces the old."""
        if not isinstance(nth, int) or isinstance(nth, bool) or nth < 0:
            raise exception.SimulatorError(
                reason='a fault fails the nth call from now, n >= 1 (0 '
                       'disarms it), not %r' % (nth,))
        if error is None and point in SYSFS_POINTS:
            error = errno.EIO
        if not isinstance(error, int) or isinstance(error, bool):
            raise exception.SimulatorError(
                reason='a fault at %s needs its error as a number, not %r'
                       % (point, error))
        with self._cond:
            if nth:
                self._faults[point] = [nth, error]
            else:
                self._faults.pop(point, None)
            self._emit(DriverChanged(self.driver_state()))

    def faults(self):
        """``{point: [calls until the failing one, error]}`` of the faults
        armed now."""
        with self._cond:
            return {point: list(fault)
                    for point, fault in sorted(self._faults.items())}

    def strike(self, point):
        """One call of ``point``: the error injected for it when this is
        the call that fails (the fault is then gone), else None."""
        with self._cond:
            fault = self._faults.get(point)
            if fault is None:
                return None
            fault[0] -= 1
            if fault[0] <= 0:
                del self._faults[point]
            self._emit(DriverChanged(self.driver_state()))
            return fault[1] if fault[0] <= 0 else None

    def _strike_sysfs(self, name):
        code = self.strike(name)
        if code is not None:
            raise OSError(code, '%s: %s (an injected failure)' % (
                name, errno.errorcode.get(code, code)))

    def gpu(self, pf):
        """``(SimGpu, GpuState)`` of the physical GPU ``pf`` (KeyError:
        it has no ``gpu`` section)."""
        pf = str(pf)
        return self._gpus[pf], self._driver[pf]

    def driver_gpus(self):
        """The PFs whose driver state is simulated, sorted."""
        return sorted(self._gpus)

    def vfs_enabled(self, pf):
        with self._cond:
            return bool(self._numvfs.get(str(pf)))

    def gpu_vgpus(self, pf):
        """``{VF: mig.Placed}`` of the vGPUs on ``pf``'s VFs."""
        with self._cond:
            vfs = set(self._pfs[str(pf)].virtfns)
            return {vf: p for vf, p in sorted(self._placed.items())
                    if vf in vfs}

    def gpu_types(self, pf):
        """The vendor-interface types of ``pf``'s VFs (their first
        VF's list: every VF of a GPU lists the same)."""
        for vf in self._pfs[str(pf)].virtfns:
            dev = self._vendor_vfs.get(vf)
            if dev is not None:
                return dev.vgpu_types
        return ()

    def driver(self, pf, change):
        """Run ``change(gpu, state, placed, running)`` on ``pf``'s
        driver state under the kernel's lock (``mig``'s setters: they
        raise ``mig.DriverError``); the change is announced.  ``running``
        lists the VFs whose vGPU a guest uses."""
        pf = str(pf)
        with self._cond:
            self._check_open()
            gpu, state = self._gpus[pf], self._driver[pf]
            placed = self._gpu_placed(pf)
            vfs = set(self._pfs[pf].virtfns)
            running = sorted(k for k in self._busy if k in vfs)
            before = state.to_json()
            result = change(gpu, state, placed, running)
            if state.to_json() != before:
                self._driver_changed(pf)
            return result

    def reboot(self):
        """The host restarts: mdevs, vGPUs, VFs, GPU instances, mixed-size
        mode and scheduler settings are gone; MIG mode stays (it persists).
        Each thing that goes is announced as when it is removed, so a tree
        follows; busy marks go, unbound parents are bound again."""
        with self._cond:
            self._busy = set()
            for uuid in sorted(self._mdevs):
                self._remove(uuid)
            for vf, type_id in sorted(self._current.items()):
                if type_id:
                    self._current[vf] = None
                    self._placed.pop(vf, None)
                    self._emit(VgpuTypeSet(vf, None))
            for address, st in list(self._state.items()):
                if st in (GOING, UNBOUND):
                    self._state[address] = BOUND
                    if st == UNBOUND:
                        self._emit(ParentBound(
                            address, self._parents[address].driver))
            self._driver = {a: mig.GpuState(mig_mode=s.mig_mode)
                            for a, s in self._driver.items()}
            for pf, now in sorted(self._numvfs.items()):
                if now:
                    vfs = self._pfs[pf].virtfns[:now]
                    self._numvfs[pf] = 0
                    self._set_presence()
                    self._emit(VfsDisabled(pf, tuple(vfs)))
            if self._gpus:
                self._emit(DriverChanged(self.driver_state()))
            self._cond.notify_all()

    # -- shutdown -----------------------------------------------------------

    def close(self):
        """Wake every blocked writer (it gets EINTR); later calls too."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _check_open(self):
        if self._closed:
            raise _error(errno.EINTR, 'the simulated kernel is shutting down')
