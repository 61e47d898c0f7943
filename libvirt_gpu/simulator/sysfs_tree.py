"""Write a profile as a directory tree shaped like Linux's ``/sys``.

For the T4 at ``0000:af:00.0`` behind the root port ``0000:ae:00.0`` the
tree holds (``root`` stands in for ``/sys``)::

    devices/pci0000:ae/0000:ae:00.0/0000:af:00.0/
        vendor            0x10de
        device            0x1eb8
        class             0x030200
        numa_node         1
        uevent            DRIVER=nvidia, PCI_CLASS=30200, PCI_ID=10DE:1EB8...
        driver         -> ../../../../bus/pci/drivers/nvidia
        iommu_group    -> ../../../../kernel/iommu_groups/58
        subsystem      -> ../../../../bus/pci
        mdev_supported_types/nvidia-223/{name, description, device_api,
                                         available_instances, create, devices/}
        <uuid>/{mdev_type -> ../mdev_supported_types/nvidia-223, ...}
    bus/pci/devices/0000:af:00.0 -> ../../../devices/pci0000:ae/...
    bus/pci/drivers/nvidia/0000:af:00.0 -> ../../../../devices/...
    bus/mdev/devices/<uuid> -> ../../../devices/.../0000:af:00.0/<uuid>
    class/mdev_bus/0000:af:00.0 -> ../../devices/...
    kernel/iommu_groups/58/devices/0000:af:00.0 -> ../../../../devices/...

An SR-IOV PF has ``sriov_totalvfs``, ``sriov_numvfs`` and ``virtfnN`` links
to its enabled VFs (each with ``physfn``); a VF with NVIDIA's vGPU 17+
vendor interface has ``nvidia/{creatable_vgpu_types, current_vgpu_type,
vgpu_params}`` instead of ``mdev_supported_types``.

Every link is relative (``os.path.relpath``), as the kernel's are, so the
tree can be moved or bind-mounted over ``/sys``.

``WriteThroughSysfs`` is a ``Sysfs`` over such a tree whose writes act the
way the kernel's do (create/remove an mdev, set ``current_vgpu_type``,
enable VFs through ``sriov_numvfs``), for tests that need a host that
changes without the FUSE tree (``simulator.live``).
"""

import dataclasses
import errno
import json
import os
import re
import shutil
import threading

from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu import sysfs as sysfs_mod
from libvirt_gpu.simulator import capacity
from libvirt_gpu.simulator import profile as profile_mod

# A file at the top of every tree we write; its presence lets us rewrite it.
MARKER = '.libvirt-gpu-simulator'
WRITE_ONLY = 0o200
READ_WRITE = 0o644
READ_ONLY = 0o444


def device_dirs(profile):
    """``{address: 'devices/pci0000:ae/0000:ae:00.0/0000:af:00.0'}``.

    A device sits under its ``parent_bridge``; a device without one (and
    every implied bridge) sits on its root bus ``devices/pci<dom>:<bus>``.
    """
    devices = {dev.address: dev for dev in profile.all_pci_devices()}
    dirs = {}

    def path_of(address):
        if address not in dirs:
            dev = devices[address]
            if dev.parent_bridge in devices:
                parent = path_of(dev.parent_bridge)
            else:
                domain, bus = address.split(':')[:2]
                parent = 'devices/pci%s:%s' % (domain, bus)
            dirs[address] = parent + '/' + address
        return dirs[address]

    for address in devices:
        path_of(address)
    return dirs


def mdev_dir(profile, uuid):
    """``devices/.../0000:af:00.0/<uuid>`` of an existing mdev."""
    dirs = device_dirs(profile)
    for dev in profile.devices:
        for mdev in dev.mdevs:
            if mdev.uuid == uuid:
                return dirs[dev.address] + '/' + uuid
    raise exception.SimulatorError(
        reason='profile %s has no mdev %s' % (profile.name, uuid))


def write_sysfs(profile, root):
    """Write ``profile`` under ``root`` (created; a previous tree replaced).

    A non-empty ``root`` without our marker file is refused, so a mistaken
    ``root`` such as ``/sys`` or a home directory is never touched.
    """
    root = _prepare_root(root)
    for top in ('devices', 'bus/pci/devices', 'bus/pci/drivers',
                'kernel/iommu_groups', 'class'):
        os.makedirs(os.path.join(root, top), exist_ok=True)
    for name in ('drivers_probe', 'rescan'):
        _write(os.path.join(root, 'bus/pci', name), '', WRITE_ONLY)
    dirs = device_dirs(profile)
    mdev_groups = profile.mdev_iommu_groups()
    for dev in profile.pci_devices():
        _write_function(root, dirs, dev, profile, mdev_groups)
    _write(os.path.join(root, MARKER),
           json.dumps({'profile': profile.name}) + '\n', READ_WRITE)


def _write_function(root, dirs, dev, profile, mdev_groups):
    """One PCI function and, when it has them, its vGPU files."""
    _write_pci_device(root, dirs, dev)
    if dev.mdev_types:
        _write_mdev_parent(root, dirs[dev.address], dev, mdev_groups,
                           profile)
    if dev.vgpu_types:
        write_vendor_vf(root, dirs[dev.address], dev, profile)


def _prepare_root(root):
    root = os.path.abspath(os.fspath(root))
    if os.path.islink(root) or (os.path.exists(root)
                                and not os.path.isdir(root)):
        raise exception.SimulatorError(
            reason='sysfs root %s exists and is not a directory' % root)
    if not os.path.isdir(root):
        os.makedirs(root)
        return root
    entries = os.listdir(root)
    if entries and MARKER not in entries:
        raise exception.SimulatorError(
            reason='refusing to write a simulated sysfs into %s: it is not '
            'empty and holds no %s from an earlier simulator run'
            % (root, MARKER))
    for entry in entries:
        path = os.path.join(root, entry)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    return root


def _write(path, text, mode=READ_WRITE):
    """Create (or rewrite) ``path`` holding ``text`` with permission bits
    ``mode``: one ``open`` with the mode, a ``fchmod`` only when the umask
    would have taken bits away (trees have thousands of files)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC,
                 mode)
    try:
        os.write(fd, text.encode('utf-8'))
        if mode & _UMASK:
            os.fchmod(fd, mode)
    finally:
        os.close(fd)


def _umask():
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _umask()


def _link(path, target):
    """``path -> target`` as a link relative to ``path``'s directory."""
    os.symlink(os.path.relpath(target, os.path.dirname(path)), path)


def uevent(dev):
    """The ``uevent`` text of a PCI device, as the kernel writes it::

        DRIVER=nvidia
        PCI_CLASS=30200
        PCI_ID=10DE:1EB8
        PCI_SUBSYS_ID=10DE:12A2
        PCI_SLOT_NAME=0000:af:00.0
        MODALIAS=pci:v000010DEd00001EB8sv000010DEsd000012A2bc03sc02i00
    """
    lines = ['DRIVER=%s' % dev.driver] if dev.driver else []
    lines += [
        'PCI_CLASS=%X' % int(dev.class_code, 16),
        'PCI_ID=%s:%s' % (dev.vendor_id.upper(), dev.product_id.upper()),
        'PCI_SUBSYS_ID=%s:%s' % (dev.subsystem_vendor_id.upper(),
                                 dev.subsystem_device_id.upper()),
        'PCI_SLOT_NAME=%s' % dev.address,
        'MODALIAS=%s' % modalias(dev),
    ]
    return '\n'.join(lines) + '\n'


def modalias(dev):
    """``pci:v000010DEd00001EB8sv000010DEsd000012A2bc03sc02i00``."""
    cls = int(dev.class_code, 16)
    return 'pci:v%08Xd%08Xsv%08Xsd%08Xbc%02Xsc%02Xi%02X' % (
        int(dev.vendor_id, 16), int(dev.product_id, 16),
        int(dev.subsystem_vendor_id, 16), int(dev.subsystem_device_id, 16),
        cls >> 16, (cls >> 8) & 0xff, cls & 0xff)


def _write_pci_device(root, dirs, dev):
    """One PCI function: its attribute files and the links to and from it."""
    devdir = os.path.join(root, dirs[dev.address])
    os.makedirs(devdir)
    files = {
        'vendor': '0x%s\n' % dev.vendor_id,
        'device': '0x%s\n' % dev.product_id,
        'class': '%s\n' % dev.class_code,
        'subsystem_vendor': '0x%s\n' % dev.subsystem_vendor_id,
        'subsystem_device': '0x%s\n' % dev.subsystem_device_id,
        'numa_node': '%d\n' % dev.numa_node,
        'uevent': uevent(dev),
        'modalias': modalias(dev) + '\n',
        'driver_override': '(null)\n',
    }
    for name, text in files.items():
        _write(os.path.join(devdir, name), text,
               READ_WRITE if name in ('driver_override', 'uevent')
               else READ_ONLY)
    _link(os.path.join(devdir, 'subsystem'),
          os.path.join(root, 'bus/pci'))
    _link(os.path.join(root, 'bus/pci/devices', dev.address), devdir)
    if dev.driver:
        drvdir = _driver_dir(root, dev.driver)
        _link(os.path.join(devdir, 'driver'), drvdir)
        _link(os.path.join(drvdir, dev.address), devdir)
    if dev.iommu_group is not None:
        groupdir = _iommu_group_dir(root, dev.iommu_group)
        _link(os.path.join(devdir, 'iommu_group'), groupdir)
        _link(os.path.join(groupdir, 'devices', dev.address), devdir)
    if dev.sriov_totalvfs is not None:
        _write(os.path.join(devdir, 'sriov_totalvfs'),
               '%d\n' % dev.sriov_totalvfs, READ_ONLY)
        _write(os.path.join(devdir, 'sriov_numvfs'),
               '%d\n' % dev.numvfs, READ_WRITE)
        for i, vf in enumerate(dev.enabled_virtfns):
            _link(os.path.join(devdir, 'virtfn%d' % i),
                  os.path.join(root, dirs[vf]))
    if dev.physfn is not None:
        _link(os.path.join(devdir, 'physfn'),
              os.path.join(root, dirs[dev.physfn]))


def _driver_dir(root, driver):
    """``bus/pci/drivers/<driver>/{bind, unbind, new_id, remove_id}``."""
    drvdir = os.path.join(root, 'bus/pci/drivers', driver)
    if not os.path.isdir(drvdir):
        os.makedirs(drvdir)
        for name in ('bind', 'unbind', 'new_id', 'remove_id'):
            _write(os.path.join(drvdir, name), '', WRITE_ONLY)
    return drvdir


def _iommu_group_dir(root, group):
    """``kernel/iommu_groups/<n>/{type, devices/}``."""
    groupdir = os.path.join(root, 'kernel/iommu_groups', str(group))
    if not os.path.isdir(groupdir):
        os.makedirs(os.path.join(groupdir, 'devices'))
        _write(os.path.join(groupdir, 'type'), 'DMA\n', READ_ONLY)
    return groupdir


def _write_mdev_parent(root, reldir, dev, mdev_groups, profile=None):
    """``mdev_supported_types/<type>/...``, the mdevs, and their links."""
    gpu_mdevs = profile.gpu_mdevs(dev) if profile is not None else None
    devdir = os.path.join(root, reldir)
    os.makedirs(os.path.join(root, 'class/mdev_bus'), exist_ok=True)
    os.makedirs(os.path.join(root, 'bus/mdev/devices'), exist_ok=True)
    _link(os.path.join(root, 'class/mdev_bus', dev.address), devdir)
    for mtype in dev.mdev_types:
        typedir = os.path.join(devdir, 'mdev_supported_types', mtype.id)
        os.makedirs(os.path.join(typedir, 'devices'))
        if mtype.name is not None:
            _write(os.path.join(typedir, 'name'), mtype.name + '\n',
                   READ_ONLY)
        if mtype.description is not None:
            _write(os.path.join(typedir, 'description'),
                   mtype.description + '\n', READ_ONLY)
        _write(os.path.join(typedir, 'device_api'), mtype.device_api + '\n',
               READ_ONLY)
        _write(os.path.join(typedir, 'available_instances'),
               '%d\n' % capacity.available_instances(
                   dev, mtype.id, dev.mdevs, gpu_mdevs=gpu_mdevs),
               READ_ONLY)
        _write(os.path.join(typedir, 'create'), '', WRITE_ONLY)
    for mdev in dev.mdevs:
        write_mdev(root, reldir, mdev.uuid, mdev.type_id,
                   mdev_groups[mdev.uuid])


def write_mdev(root, parent_reldir, uuid, type_id, iommu_group):
    """One existing mdev under its parent's directory::

        <parent>/<uuid>/mdev_type   -> ../mdev_supported_types/<type>
        <parent>/<uuid>/iommu_group -> ../../../../../kernel/iommu_groups/<n>
        <parent>/<uuid>/subsystem   -> ../../../../../bus/mdev
        <parent>/<uuid>/{remove, uevent (MDEV_TYPE=<type>)}
        <parent>/mdev_supported_types/<type>/devices/<uuid> -> ../../../<uuid>
        bus/mdev/devices/<uuid>     -> ../../../devices/.../<parent>/<uuid>
    """
    parentdir = os.path.join(root, parent_reldir)
    mdevdir = os.path.join(parentdir, uuid)
    typedir = os.path.join(parentdir, 'mdev_supported_types', type_id)
    os.makedirs(mdevdir)
    _write(os.path.join(mdevdir, 'uevent'), 'MDEV_TYPE=%s\n' % type_id)
    _write(os.path.join(mdevdir, 'remove'), '', WRITE_ONLY)
    _link(os.path.join(mdevdir, 'mdev_type'), typedir)
    _link(os.path.join(mdevdir, 'subsystem'),
          os.path.join(root, 'bus/mdev'))
    _link(os.path.join(typedir, 'devices', uuid), mdevdir)
    os.makedirs(os.path.join(root, 'bus/mdev/devices'), exist_ok=True)
    _link(os.path.join(root, 'bus/mdev/devices', uuid), mdevdir)
    groupdir = _iommu_group_dir(root, iommu_group)
    _link(os.path.join(mdevdir, 'iommu_group'), groupdir)
    _link(os.path.join(groupdir, 'devices', uuid), mdevdir)


# --- the vGPU 17+ vendor interface -------------------------------------------

CREATABLE_HEADER = 'ID    : vGPU Name'


def creatable_text(types):
    """``creatable_vgpu_types`` as the driver prints it::

        ID    : vGPU Name
        1145  : NVIDIA L40S-1B

    An empty file when nothing is creatable (the GPU is full).
    """
    if not types:
        return ''
    lines = [CREATABLE_HEADER] + ['%-6d: %s' % (t.number, t.name or '')
                                  for t in types]
    return '\n'.join(lines) + '\n'


def write_vendor_vf(root, reldir, dev, profile):
    """``<VF>/nvidia/{creatable_vgpu_types, current_vgpu_type,
    vgpu_params}`` of a VF with vendor-interface types."""
    nvdir = os.path.join(root, reldir, 'nvidia')
    os.makedirs(nvdir, exist_ok=True)
    current = dev.current_vgpu_type
    _write(os.path.join(nvdir, 'current_vgpu_type'), '%d\n' % (
        dev.vgpu_type(current).number if current else 0), READ_WRITE)
    _write(os.path.join(nvdir, 'vgpu_params'), '', READ_WRITE)
    refresh_vendor_vf(root, reldir, dev, profile)


def refresh_vendor_vf(root, reldir, dev, profile):
    """Rewrite a VF's ``creatable_vgpu_types`` from the GPU's state."""
    types = capacity.creatable_vgpu_types(
        dev, profile.gpu_current_types(dev))
    _write(os.path.join(root, reldir, 'nvidia', 'creatable_vgpu_types'),
           creatable_text(types), READ_ONLY)


def refresh_gpu(root, profile, dev):
    """Rewrite what every enabled function of ``dev``'s GPU shows about
    capacity (``available_instances``, ``creatable_vgpu_types``)."""
    dirs = device_dirs(profile)
    present = {d.address for d in profile.pci_devices()}
    for function in profile.gpu_functions(dev):
        if function.address not in present:
            continue
        reldir = dirs[function.address]
        gpu_mdevs = profile.gpu_mdevs(function)
        for mtype in function.mdev_types:
            _write(os.path.join(root, reldir, 'mdev_supported_types',
                                mtype.id, 'available_instances'),
                   '%d\n' % capacity.available_instances(
                       function, mtype.id, function.mdevs,
                       gpu_mdevs=gpu_mdevs), READ_ONLY)
        if function.vgpu_types:
            refresh_vendor_vf(root, reldir, function, profile)


# --- a tree whose writes act like the kernel's -------------------------------

_ADDR = r'[0-9a-f]{4,8}:[0-9a-f]{2}:[01][0-9a-f]\.[0-7]'
_UUID = r'[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}'
_NUMVFS_RE = re.compile(r'.*/(%s)/sriov_numvfs' % _ADDR)
_CURRENT_RE = re.compile(r'.*/(%s)/nvidia/current_vgpu_type' % _ADDR)
_PARAMS_RE = re.compile(r'.*/(%s)/nvidia/vgpu_params' % _ADDR)
_CREATE_RE = re.compile(r'.*/(%s)/mdev_supported_types/([^/]+)/create'
                        % _ADDR)
_REMOVE_RE = re.compile(r'.*/(%s)/(%s)/remove' % (_ADDR, _UUID))


def _oserror(code, path):
    return OSError(code, os.strerror(code), path)


class WriteThroughSysfs(sysfs_mod.Sysfs):
    """A ``Sysfs`` over a tree written from ``profile`` whose writes change
    the simulated host the way the kernel and NVIDIA's driver would:

    ``<PF>/sriov_numvfs`` <- N
        The kernel's rules (``sriov_numvfs_store``): N above
        ``sriov_totalvfs`` is ERANGE, N equal to the current count does
        nothing, another N while VFs are enabled is EBUSY; 0 removes the
        VFs (EBUSY while one holds a vGPU: our assumption of what the vGPU
        manager does), N > 0 creates the first N listed VFs, empty.
    ``<VF>/nvidia/current_vgpu_type`` <- n
        A type the VF lists as creatable: the vGPU exists; 0: it is
        destroyed (no-op on a free VF).  Not a number, or a type the VF does
        not list now: EINVAL; a type on a VF that holds one: EBUSY (both
        assumed: NVIDIA does not document its answers).  ``busy(vf, n)``
        makes the next n writes answer EBUSY, as the driver does while it is
        still tearing down a guest's vGPU.
    ``<parent>/mdev_supported_types/<type>/create`` <- UUID
        EEXIST for a UUID in use, the profile's ``no_capacity_errno`` when
        ``available_instances`` is 0 (VFs of one GPU share it).
    ``bus/mdev/devices/<uuid>/remove`` <- 1
        The mdev goes away.

    Anything else is written as a plain file.  One lock serialises the
    writes.  ``profile`` (the current state, a ``Profile``) changes with
    every accepted write.
    """

    def __init__(self, profile, root):
        super().__init__(root)
        self.profile = profile_mod.load_profile(profile)
        self._lock = threading.RLock()
        self._busy = {}
        self.writes = []          # (path relative to the root, data)

    def busy(self, vf, count=1):
        """The next ``count`` writes to ``vf``'s ``current_vgpu_type``
        answer EBUSY."""
        self._busy[str(objects.PciAddress.parse(vf))] = count

    def write(self, path, data):
        real = self.resolved_under_root(path)
        rel = os.path.relpath(real, self.root)
        with self._lock:
            self.writes.append((rel, data))
            for regex, handler in ((_NUMVFS_RE, self._numvfs),
                                   (_CURRENT_RE, self._current),
                                   (_PARAMS_RE, self._params),
                                   (_CREATE_RE, self._create),
                                   (_REMOVE_RE, self._remove)):
                m = regex.fullmatch(rel)
                if m is not None:
                    try:
                        handler(data, *m.groups())
                    except OSError as e:
                        raise exception.SysfsWriteError(
                            path=path, reason=e.strerror, errno=e.errno)
                    return
            super().write(path, data)

    # -- state ----------------------------------------------------------------

    def _replace(self, *changed):
        by_addr = {d.address: d for d in changed}
        devices = tuple(by_addr.get(d.address, d)
                        for d in self.profile.devices)
        self.profile = dataclasses.replace(self.profile, devices=devices)

    def _dir(self, address):
        return os.path.join(self.root, device_dirs(self.profile)[address])

    @staticmethod
    def _number(data, path):
        text = data.strip()
        if not re.fullmatch(r'\d{1,9}', text):
            raise _oserror(errno.EINVAL, path)
        return int(text)

    # -- SR-IOV -----------------------------------------------------------

    def _numvfs(self, data, pf):
        dev = self.profile.device(pf)
        path = self._dir(pf) + '/sriov_numvfs'
        count = self._number(data, path)
        total = dev.sriov_totalvfs or 0
        if count > total:
            raise _oserror(errno.ERANGE, path)
        if count == dev.numvfs:
            return
        if dev.numvfs and count:
            raise _oserror(errno.EBUSY, path)
        if count > len(dev.virtfns):
            raise _oserror(errno.ENOSPC, path)   # the profile lists fewer
        old = dev.enabled_virtfns
        if not count:
            vfs = [self.profile.device(vf) for vf in old]
            if any(v.mdevs or v.current_vgpu_type for v in vfs):
                raise _oserror(errno.EBUSY, path)
        self._replace(dataclasses.replace(dev, sriov_numvfs=count))
        dev = self.profile.device(pf)
        _write(path, '%d\n' % count, READ_WRITE)
        if not count:
            for i, vf in enumerate(old):
                self._remove_function(vf)
                os.unlink(os.path.join(self._dir(pf), 'virtfn%d' % i))
            return
        dirs = device_dirs(self.profile)
        groups = self.profile.mdev_iommu_groups()
        for i, vf in enumerate(dev.enabled_virtfns):
            vdev = self.profile.device(vf)
            _write_function(self.root, dirs, vdev, self.profile, groups)
            _link(os.path.join(self._dir(pf), 'virtfn%d' % i),
                  os.path.join(self.root, dirs[vf]))

    def _remove_function(self, address):
        dev = self.profile.device(address)
        devdir = self._dir(address)
        for sub in ('bus/pci/devices', 'class/mdev_bus'):
            link = os.path.join(self.root, sub, address)
            if os.path.lexists(link):
                os.unlink(link)
        if dev.driver:
            link = os.path.join(self.root, 'bus/pci/drivers', dev.driver,
                                address)
            if os.path.lexists(link):
                os.unlink(link)
        if dev.iommu_group is not None:
            link = os.path.join(self.root, 'kernel/iommu_groups',
                                str(dev.iommu_group), 'devices', address)
            if os.path.lexists(link):
                os.unlink(link)
        shutil.rmtree(devdir)

    # -- vendor interface -----------------------------------------------------

    def _current(self, data, vf):
        dev = self.profile.device(vf)
        path = self._dir(vf) + '/nvidia/current_vgpu_type'
        number = self._number(data, path)
        if self._busy.get(vf):
            self._busy[vf] -= 1
            raise _oserror(errno.EBUSY, path)
        if number == 0:
            if dev.current_vgpu_type is None:
                return
            self._replace(dataclasses.replace(dev, current_vgpu_type=None))
        else:
            if dev.current_vgpu_type is not None:
                raise _oserror(errno.EBUSY, path)
            creatable = capacity.creatable_vgpu_types(
                dev, self.profile.gpu_current_types(dev))
            found = [t for t in creatable if t.number == number]
            if not found:
                raise _oserror(errno.EINVAL, path)
            self._replace(dataclasses.replace(
                dev, current_vgpu_type=found[0].id))
        _write(path, '%d\n' % number, READ_WRITE)
        refresh_gpu(self.root, self.profile, self.profile.device(vf))

    def _params(self, data, vf):
        _write(self._dir(vf) + '/nvidia/vgpu_params', data, READ_WRITE)

    # -- mdev -----------------------------------------------------------------

    def _create(self, data, parent, type_id):
        dev = self.profile.device(parent)
        path = self._dir(parent) + '/mdev_supported_types/%s/create' % type_id
        text = data.strip().lower()
        if not re.fullmatch(_UUID, text):
            raise _oserror(errno.EINVAL, path)
        if any(m.uuid == text for d in self.profile.devices
               for m in d.mdevs):
            raise _oserror(errno.EEXIST, path)
        if dev.mdev_type(type_id) is None:
            raise _oserror(errno.ENOENT, path)
        if capacity.available_instances(
                dev, type_id, dev.mdevs,
                gpu_mdevs=self.profile.gpu_mdevs(dev)) < 1:
            raise _oserror(getattr(errno, self.profile.no_capacity_errno),
                           path)
        mdev = profile_mod.SimMdev(text, type_id)
        self._replace(dataclasses.replace(dev, mdevs=dev.mdevs + (mdev,)))
        write_mdev(self.root, device_dirs(self.profile)[parent], text,
                   type_id, self._fresh_group())
        refresh_gpu(self.root, self.profile, self.profile.device(parent))

    def _fresh_group(self):
        groups = os.path.join(self.root, 'kernel/iommu_groups')
        used = {int(n) for n in os.listdir(groups) if n.isdigit()}
        group = max(used) + 1 if used else 0
        return group

    def _remove(self, data, parent, uuid):
        path = os.path.join(self._dir(parent), uuid, 'remove')
        if not self._number(data, path):
            return
        dev = self.profile.device(parent)
        mdev = [m for m in dev.mdevs if m.uuid == uuid]
        if not mdev:
            raise _oserror(errno.ENOENT, path)
        self._replace(dataclasses.replace(
            dev, mdevs=tuple(m for m in dev.mdevs if m.uuid != uuid)))
        mdevdir = os.path.join(self._dir(parent), uuid)
        typedir = os.path.join(self._dir(parent), 'mdev_supported_types',
                               mdev[0].type_id)
        group = os.path.basename(os.readlink(os.path.join(mdevdir,
                                                          'iommu_group')))
        for link in (os.path.join(typedir, 'devices', uuid),
                     os.path.join(self.root, 'bus/mdev/devices', uuid),
                     os.path.join(self.root, 'kernel/iommu_groups', group,
                                  'devices', uuid)):
            if os.path.lexists(link):
                os.unlink(link)
        shutil.rmtree(mdevdir)
        refresh_gpu(self.root, self.profile, self.profile.device(parent))
