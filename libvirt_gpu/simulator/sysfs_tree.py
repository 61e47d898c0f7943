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
vendor interface has ``nvidia/{CREATABLE_TYPES, CURRENT_TYPE,
VGPU_PARAMS}`` instead of ``mdev_supported_types``.

Every link is relative (``os.path.relpath``), as the kernel's are, so the
tree can be moved or bind-mounted over ``/sys``.

The ``write_*``/``remove_*`` functions below change a written tree the way
the kernel changes ``/sys`` (an mdev appears, VFs go); what changes and
when is ``kernel.SimKernel``'s business: the live FUSE tree
(``simulator.live``) and the tests' in-process kernel apply its events
with them.
"""

import functools
import json
import os
import shutil

from libvirt_gpu import exception
from libvirt_gpu.simulator import capacity
from libvirt_gpu.util import records
import libvirt_gpu.devices.backends.nvidia_vgpu.names as vendor_names

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
    if any(dev.gpu is not None for dev in profile.devices):
        write_driver_state(root, boot_kernel(profile).driver_state())
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


@functools.lru_cache(maxsize=4)
def boot_kernel(profile):
    """A ``kernel.SimKernel`` of ``profile`` as booted (read only: the
    rules that compute what a static tree shows at first)."""
    from libvirt_gpu.simulator import kernel as kernel_mod
    return kernel_mod.SimKernel(profile)


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


def _replace(path, text, mode=READ_ONLY):
    """Rewrite the attribute ``path`` as one step (a temp file renamed over
    it), so that a reader never sees it empty or half written: a kernel
    attribute is computed whole on each read."""
    tmp = '%s.%d.tmp' % (path, os.getpid())
    _write(tmp, text, mode)
    os.replace(tmp, path)


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
    """``CREATABLE_TYPES`` as the driver prints it::

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
    """``<VF>/nvidia/{CREATABLE_TYPES, CURRENT_TYPE,
    VGPU_PARAMS}`` (``vendor_names``) of a VF with vendor-interface types."""
    nvdir = os.path.join(root, reldir, 'nvidia')
    os.makedirs(nvdir, exist_ok=True)
    current = dev.held_type
    _write(os.path.join(nvdir, vendor_names.CURRENT_TYPE), '%d\n' % (
        dev.vgpu_type(current).number if current else 0), READ_WRITE)
    _write(os.path.join(nvdir, vendor_names.VGPU_PARAMS), '', READ_WRITE)
    refresh_vendor_vf(root, reldir, dev, profile)


def refresh_vendor_vf(root, reldir, dev, profile):
    """Rewrite a VF's ``CREATABLE_TYPES`` from the GPU's state."""
    if profile.device(dev.physfn).gpu is not None:
        # MIG, mixed-size mode: the driver's rules (mig.py), at boot
        types = boot_kernel(profile).vf_creatable(dev.address)
    else:
        types = capacity.vf_creatable(
            dev, profile.gpu_current_types(dev))
    _replace(os.path.join(root, reldir, vendor_names.VENDOR_DIR,
                          vendor_names.CREATABLE_TYPES),
             creatable_text(types), READ_ONLY)


def write_available(root, parent_reldir, type_id, count):
    """Rewrite ``<parent>/mdev_supported_types/<type>/available_instances``.
    """
    _replace(os.path.join(root, parent_reldir, 'mdev_supported_types',
                          type_id, 'available_instances'),
             '%d\n' % count, READ_ONLY)


def write_creatable(root, vf_reldir, types):
    """Rewrite ``<VF>/nvidia/CREATABLE_TYPES`` listing ``types``."""
    _replace(os.path.join(root, vf_reldir, vendor_names.VENDOR_DIR,
                          vendor_names.CREATABLE_TYPES),
             creatable_text(types), READ_ONLY)


def write_vf_type(root, vf_reldir, number):
    """Rewrite ``<VF>/nvidia/CURRENT_TYPE`` (0: no vGPU)."""
    _write(os.path.join(root, vf_reldir, 'nvidia', vendor_names.CURRENT_TYPE),
           '%d\n' % number, READ_WRITE)


def _unlink(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def remove_mdev(root, parent_reldir, uuid, type_id, iommu_group):
    """The reverse of :func:`write_mdev`: the mdev's directory and links
    go, and its IOMMU group once no device is left in it."""
    parentdir = os.path.join(root, parent_reldir)
    _unlink(os.path.join(parentdir, 'mdev_supported_types', type_id,
                         'devices', uuid))
    _unlink(os.path.join(root, 'bus/mdev/devices', uuid))
    _leave_group(root, iommu_group, uuid)
    shutil.rmtree(os.path.join(parentdir, uuid))


def _leave_group(root, group, name):
    """Device ``name`` leaves IOMMU group ``group``; the group goes with
    its last device, as the kernel's does."""
    groupdir = os.path.join(root, 'kernel/iommu_groups', str(group))
    _unlink(os.path.join(groupdir, 'devices', name))
    if os.path.isdir(groupdir) and not os.listdir(
            os.path.join(groupdir, 'devices')):
        shutil.rmtree(groupdir)


def write_vfs(root, profile, pf, vfs):
    """Enabled VFs ``vfs`` of ``pf``: ``sriov_numvfs``, the VFs' own
    files (no vGPU yet) and the PF's ``virtfnN`` links."""
    dirs = device_dirs(profile)
    pfdir = os.path.join(root, dirs[pf])
    _write(os.path.join(pfdir, 'sriov_numvfs'), '%d\n' % len(vfs),
           READ_WRITE)
    for i, vf in enumerate(vfs):
        dev = records.replace(profile.device(vf), mdevs=(),
                              held_type=None)
        _write_pci_device(root, dirs, dev)
        if dev.mdev_types:
            _write_mdev_parent(root, dirs[vf], dev, {})
        if dev.vgpu_types:
            nvdir = os.path.join(root, dirs[vf], 'nvidia')
            os.makedirs(nvdir, exist_ok=True)
            write_vf_type(root, dirs[vf], 0)
            _write(os.path.join(nvdir, vendor_names.VGPU_PARAMS), '',
                   READ_WRITE)
            write_creatable(root, dirs[vf], ())
        _link(os.path.join(pfdir, 'virtfn%d' % i),
              os.path.join(root, dirs[vf]))


def remove_vfs(root, profile, pf, vfs):
    """The reverse of :func:`write_vfs` (``sriov_numvfs`` reads 0)."""
    dirs = device_dirs(profile)
    pfdir = os.path.join(root, dirs[pf])
    _write(os.path.join(pfdir, 'sriov_numvfs'), '0\n', READ_WRITE)
    for i, vf in enumerate(vfs):
        dev = profile.device(vf)
        _unlink(os.path.join(pfdir, 'virtfn%d' % i))
        for sub in ('bus/pci/devices', 'class/mdev_bus'):
            _unlink(os.path.join(root, sub, vf))
        if dev.driver:
            _unlink(os.path.join(root, 'bus/pci/drivers', dev.driver, vf))
        if dev.iommu_group is not None:
            _leave_group(root, dev.iommu_group, vf)
        shutil.rmtree(os.path.join(root, dirs[vf]))


# --- the kernel's and the driver's state, read back from a tree --------------

# What NVIDIA's driver holds beyond sysfs (MIG mode, GPU instances,
# mixed-size mode, scheduler, where each vGPU sits): kept next to a static
# tree, as ``kernel.SimKernel.driver_state()`` gives it.
DRIVER_STATE = '.libvirt-gpu-simulator-driver.json'
# The kernel's own lock over a static tree (flock): every process that
# emulates the kernel or the driver on one tree takes it.
LOCK_NAME = '.sim-kernel.lock'
TYPES_DIR = 'mdev_supported_types'


def write_driver_state(root, state, vf_files=True):
    """Keep ``state`` (``SimKernel.driver_state()``) with the tree and,
    with ``vf_files``, write the GI / placement files of the VFs whose
    vGPU has one: present with the number while it has, removed once the
    vGPU that had one is gone (a static tree cannot answer ENXIO; absent
    reads ENOENT).  Files of other VFs are left as they are.  (A live
    tree computes those files on each read: it keeps the state only.)"""
    before = read_driver_state(root)
    _replace(os.path.join(root, DRIVER_STATE),
             json.dumps(state, sort_keys=True) + '\n', READ_WRITE)
    if not vf_files:
        return
    was = before['placed'] if before is not None else {}
    now = state['placed']
    dirs = None
    for vf in sorted(set(was) | set(now)):
        for name, index in ((vendor_names.GPU_INSTANCE_ID, 1),
                            (vendor_names.PLACEMENT_ID, 2)):
            old = was.get(vf, [None] * 3)[index]
            new = now.get(vf, [None] * 3)[index]
            if old == new:
                continue
            if dirs is None:
                dirs = _vendor_dirs(root)
            if vf not in dirs:
                continue                # the VF went (VFs disabled)
            path = os.path.join(root, dirs[vf], vendor_names.VENDOR_DIR, name)
            if new is not None:
                _replace(path, '%d\n' % new, READ_ONLY)
            else:
                _unlink(path)


def _vendor_dirs(root):
    """``{VF address: its directory}`` of the enabled vendor VFs."""
    found = {}
    base = os.path.join(root, 'bus', 'pci', 'devices')
    for name in os.listdir(base):
        real = os.path.realpath(os.path.join(base, name))
        if os.path.isdir(os.path.join(real, vendor_names.VENDOR_DIR)):
            found[name] = os.path.relpath(real, root)
    return found


def read_driver_state(root):
    """The driver's state kept with the tree, or None (as at boot)."""
    try:
        with open(os.path.join(root, DRIVER_STATE)) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def tree_mdevs(root):
    """The mdevs a tree shows (``kernel.KMdev``), sorted by UUID."""
    from libvirt_gpu.simulator import kernel as kernel_mod

    base = os.path.join(root, 'bus', 'mdev', 'devices')
    found = []
    for uuid in (sorted(os.listdir(base)) if os.path.isdir(base) else ()):
        real = os.path.realpath(os.path.join(base, uuid))
        try:
            found.append(kernel_mod.KMdev(
                uuid, os.path.basename(os.path.dirname(real)),
                os.path.basename(os.readlink(os.path.join(real,
                                                          'mdev_type'))),
                int(os.path.basename(os.readlink(
                    os.path.join(real, 'iommu_group'))))))
        except (OSError, ValueError):
            # an entry a test planted that no kernel would make: not one
            # of the kernel's mdevs
            continue
    return found


def read_state(root, profile):
    """What the tree at ``root`` shows of the kernel's and the driver's
    state (``kernel.KernelState``)."""
    from libvirt_gpu.simulator import kernel as kernel_mod

    dirs = device_dirs(profile)

    def read(address, *names):
        try:
            with open(os.path.join(root, dirs[address], *names)) as f:
                return f.read().strip()
        except FileNotFoundError:
            return None

    numvfs = []
    for dev in profile.devices:
        if dev.sriov_totalvfs is not None:
            text = read(dev.address, 'sriov_numvfs')
            if text is not None:
                numvfs.append((dev.address, int(text)))
    vgpus, going = [], []
    for dev in profile.devices:
        if dev.vgpu_types:
            text = read(dev.address, vendor_names.VENDOR_DIR,
                        vendor_names.CURRENT_TYPE)
            if text not in (None, '0'):
                found = [t.id for t in dev.vgpu_types
                         if t.number == int(text)]
                vgpus.append((dev.address, found[0]))
        if dev.mdev_types and os.path.isdir(os.path.join(
                root, dirs[dev.address], TYPES_DIR)) and \
                not os.path.lexists(os.path.join(
                    root, 'class', 'mdev_bus', dev.address)):
            going.append(dev.address)     # unregistering: ENODEV
    return kernel_mod.KernelState(
        mdevs=tuple(tree_mdevs(root)), vgpus=tuple(vgpus),
        numvfs=tuple(numvfs), going=tuple(going),
        driver=read_driver_state(root))


def reboot(root, profile):
    """The static tree at ``root`` after its host restarts: written anew as
    ``profile`` boots, but with every SR-IOV PF's VFs disabled (nothing
    enabled them yet), no vGPU or mdev, and of the driver's state only
    each GPU's MIG mode, which persists (``SimKernel.reboot``)."""
    from libvirt_gpu.simulator import kernel as kernel_mod

    kernel = kernel_mod.SimKernel(profile)
    kernel.restore(read_state(root, profile))
    kernel.reboot()
    booted = records.replace(profile, devices=tuple(
        records.replace(dev, mdevs=(), held_type=None,
                        sriov_numvfs=(0 if dev.sriov_totalvfs is not None
                                      else dev.sriov_numvfs))
        for dev in profile.devices))
    write_sysfs(booted, root)
    write_driver_state(root, kernel.driver_state())
