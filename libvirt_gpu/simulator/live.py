"""A live simulated sysfs: a FUSE filesystem with the kernel's behaviour.

``libvirt-gpu simulate --live PROFILE MOUNTPOINT`` mounts a tree laid out
exactly as :func:`~libvirt_gpu.simulator.write_sysfs` writes it (the static
tree is written once into a private backing directory and served through
FUSE), but the files answer as the kernel does (``kernel.SimKernel``)::

    .../mdev_supported_types/<type>/create      write a UUID: EINVAL, EEXIST,
                                                ENODEV, no-capacity errno; or
                                                the mdev appears (below)
    .../mdev_supported_types/<type>/available_instances
                                                computed on every read
    bus/mdev/devices/<uuid>/remove              write 1: it goes (a busy one
                                                blocks or answers EBUSY, as
                                                the profile's busy_remove
                                                says)
    bus/pci/drivers/<driver>/unbind, bind       write a parent's address: it
                                                stops / starts being an
                                                mdev parent
    <device>/uevent                             read: the kernel's text;
                                                write "add"/"change"/...:
                                                that uevent is broadcast
    <device>/config                             PCI config space (256 bytes:
                                                ids, class, header type)
    <VF>/nvidia/CURRENT_TYPE               vGPU 17+ vendor interface:
                                                write a type number / 0;
    <VF>/nvidia/CREATABLE_TYPES            what fits now, on every read
    <PF>/sriov_numvfs                           write a count: the VFs
                                                appear (``add`` uevents) or
                                                go (``remove``)
    <VF>/nvidia/<GPU_INSTANCE_ID>, <PLACEMENT_ID>
                                                where the driver put the
                                                VF's vGPU; ENXIO without one
    .libvirt-gpu-simulator-nvml                 the simulated driver's NVML
                                                channel (``simulator.nvml``:
                                                write a request, read the
                                                reply on the same open file)

A new mdev appears under its parent (``<uuid>/{mdev_type@, iommu_group@,
subsystem@, remove, uevent}``), in ``bus/mdev/devices``, in its type's
``devices/`` and in a fresh IOMMU group, all as real relative links, and
an ``add`` uevent (libudev format, ``uevent.py``) is broadcast so a real
libvirtd notices; a removed one goes the same way with ``remove``.

Attributes read as sysfs reads them: text with a trailing newline, size
4096 in ``stat``, no page cache (``direct_io``), and no dentry or attribute
caching, so a new device is visible at once.  Opening a read-only attribute
for writing, or a write-only one (``create``, ``remove``) for reading,
fails with EACCES as kernfs makes it, even for root.

Not simulated: VFIO (nothing can open an mdev; "busy" is set through the
control channel), the kernel's own uevents (group 1: only udevd's
re-broadcast is sent), the mdev ``bind`` uevent, uevents of refused creates
(since 5.16 a vendor probe that refuses follows an ``add`` with a
``remove``), the vendor driver removing its own mdevs after a guest
exits, PCI hot-unplug,
``new_id``/``remove_id``/``driver_override`` taking effect, PCI Express
capabilities in ``config``, and sysfs's ``SYSFS_MAGIC`` (libudev must be
told ``SYSTEMD_DEVICE_VERIFY_SYSFS=0``).

The ``--control-stdio`` mode (for tests) reads commands on stdin, one per
line, and answers one line each on stdout: ``busy UUID|VF`` / ``idle
UUID|VF`` (a guest holds / lets go of an mdev or a VF's vGPU), ``state``,
``sent``, ``uevents on|off``, ``reboot`` (what a host restart leaves:
MIG mode kept, mdevs, vGPUs, VFs and GPU instances gone), ``quit``.  It
stops when stdin closes, so a test process that dies leaves no mount
behind.
"""

import errno
import json
import os
import shutil
import signal
import stat
import struct
import sys
import tempfile
import threading
import time

from libvirt_gpu import exception
from libvirt_gpu.util import logs
from libvirt_gpu import objects
from libvirt_gpu.simulator import kernel as kernel_mod
from libvirt_gpu.simulator import loading
from libvirt_gpu.simulator import nvml as nvml_mod
from libvirt_gpu.simulator import sysfs_tree
from libvirt_gpu.simulator import uevent as uevent_mod
from libvirt_gpu.util import records
import libvirt_gpu.devices.backends.nvidia_vgpu.names as vendor_names

LOG = logs.getLogger(__name__)

ATTR_SIZE = 4096               # what sysfs reports for every attribute
CONFIG_SIZE = 256
FAST_TMP = '/dev/shm'
STASH = 'stash'                # types of unbound parents, outside the tree
TYPES_DIR = 'mdev_supported_types'
SYNTH_ACTIONS = ('add', 'remove', 'change', 'move', 'online', 'offline',
                 'bind', 'unbind')
_NOOP_WRITES = ('rescan', 'drivers_probe')
# Seconds a successful create takes after its add uevent (the vendor
# driver's probe; NVIDIA's takes longer).
PROBE_DELAY = 0.1
FUSE_OPTIONS = dict(foreground=True, allow_other=True,
                    fsname='libvirt-gpu-sim', subtype='libvirt-gpu-sim',
                    entry_timeout=0, attr_timeout=0, negative_timeout=0,
                    direct_io=True)


def pci_config(dev):
    """256 bytes of PCI configuration space: vendor, device, class,
    revision, header type (1 for a bridge), subsystem ids of an endpoint.
    No capability list (so no PCI Express capability)."""
    config = bytearray(CONFIG_SIZE)
    cls = int(dev.class_code, 16)
    struct.pack_into('<HH', config, 0x00, int(dev.vendor_id, 16),
                     int(dev.product_id, 16))
    struct.pack_into('<HH', config, 0x04, 0x0006, 0x0000)  # mem, master
    config[0x08] = 0xa1
    config[0x09] = cls & 0xff
    config[0x0a] = (cls >> 8) & 0xff
    config[0x0b] = (cls >> 16) & 0xff
    if dev.is_bridge:
        config[0x0e] = 0x01
    else:
        struct.pack_into('<HH', config, 0x2c,
                         int(dev.subsystem_vendor_id, 16),
                         int(dev.subsystem_device_id, 16))
    return bytes(config)


def _props(text):
    """``KEY=value`` lines as ordered pairs."""
    return [tuple(line.split('=', 1)) for line in text.splitlines()
            if '=' in line]


class LiveTree(object):
    """The backing tree, the kernel and the uevent sender of one mount.

    Everything but the FUSE glue (``make_operations``).
    """

    def __init__(self, profile, busy_remove=None, uevents=True,
                 workdir=None, probe_delay=PROBE_DELAY):
        self.profile = loading.load_profile(profile)
        self.probe_delay = probe_delay
        self.kernel = kernel_mod.SimKernel(self.profile,
                                           busy_remove=busy_remove)
        if workdir is None and os.access(FAST_TMP, os.W_OK):
            workdir = FAST_TMP
        self.top = tempfile.mkdtemp(prefix='libvirt-gpu-live-', dir=workdir)
        self.root = os.path.join(self.top, 'sys')
        self.stash = os.path.join(self.top, STASH)
        try:
            sysfs_tree.write_sysfs(self.profile, self.root)
            os.mkdir(self.stash)
            self.dirs = sysfs_tree.device_dirs(self.profile)
            self.by_dir = {d: a for a, d in self.dirs.items()}
            self.devices = {d.address: d for d in self.profile.pci_devices()}
            for address, dev in self.devices.items():
                self._write_file(os.path.join(self.dirs[address], 'config'),
                                 pci_config(dev), 0o644)
                self._vendor_placeholders(address)
            self._write_file(nvml_mod.CONTROL_NAME, b'', 0o600)
            self.replies = {}          # NVML channel: open file -> reply
            self._next_fh = 1
            self._fh_lock = threading.Lock()
            self.sender = uevent_mod.UeventSender() if uevents else None
        except BaseException:
            shutil.rmtree(self.top, ignore_errors=True)
            raise
        self.kernel.subscribe(self._apply)

    def close(self):
        self.kernel.close()
        if self.sender is not None:
            self.sender.close()
        shutil.rmtree(self.top, ignore_errors=True)

    def _vendor_placeholders(self, address):
        """A vendor VF's GI and placement files (their content is the
        kernel's, computed on each read)."""
        if not self.devices[address].vgpu_types:
            return
        for name in (vendor_names.GPU_INSTANCE_ID, vendor_names.PLACEMENT_ID):
            self._write_file(os.path.join(self.dirs[address],
                                          vendor_names.VENDOR_DIR, name),
                             b'', 0o444)

    # -- the NVML channel -----------------------------------------------------

    def nvml_open(self):
        with self._fh_lock:
            fh = self._next_fh
            self._next_fh += 1
            self.replies[fh] = b''
            return fh

    def nvml_request(self, fh, data):
        """A request written to the NVML channel: its reply is what the
        same open file reads next."""
        self.replies[fh] = nvml_mod.serve_request(self.kernel, data)
        return len(data)

    def nvml_release(self, fh):
        self.replies.pop(fh, None)

    # -- paths ----------------------------------------------------------------

    def backing(self, path):
        """The backing file of a FUSE path (``/devices/...``)."""
        rel = path.lstrip('/')
        parts = rel.split('/') if rel else []
        if any(p in ('', '.', '..') for p in parts):
            raise OSError(errno.ENOENT, 'bad path')
        return os.path.join(self.root, *parts)

    def _write_file(self, rel, data, mode):
        path = os.path.join(self.root, rel)
        with open(path, 'wb') as f:
            f.write(data)
        os.chmod(path, mode)

    def _link(self, rel, target_rel):
        path = os.path.join(self.root, rel)
        os.symlink(os.path.relpath(os.path.join(self.root, target_rel),
                                   os.path.dirname(path)), path)

    def _unlink(self, rel):
        try:
            os.unlink(os.path.join(self.root, rel))
        except FileNotFoundError:
            pass

    def classify(self, path):
        """What a FUSE path is to the kernel: ``(kind, ...)`` or None.

        ``('create'|'available', address, type)``, ``('remove', uuid)``,
        ``('pci-uevent', address)``, ``('mdev-uevent', uuid)``,
        ``('driver_override', address)``, ``('bind'|'unbind', driver)``,
        ``(CURRENT_TYPE|CREATABLE_TYPES|VGPU_PARAMS, vf)`` (``vendor_names``),
        ``('sriov_numvfs', pf)``.
        """
        parts = path.strip('/').split('/')
        name = parts[-1]
        if len(parts) >= 4 and parts[-3] == TYPES_DIR and \
                name in ('create', 'available_instances'):
            address = self.by_dir.get('/'.join(parts[:-3]))
            if address is not None:
                kind = 'create' if name == 'create' else 'available'
                return (kind, address, parts[-2])
        directory = '/'.join(parts[:-1])
        if directory in self.by_dir:
            if name == 'uevent':
                return ('pci-uevent', self.by_dir[directory])
            if name == 'driver_override':
                return ('driver_override', self.by_dir[directory])
            if name == 'sriov_numvfs':
                return ('sriov_numvfs', self.by_dir[directory])
        if len(parts) >= 2 and '/'.join(parts[:-2]) in self.by_dir and \
                name in ('remove', 'uevent'):
            try:
                uuid = objects.Uuid.parse(parts[-2])
            except exception.InvalidUuid:
                return None
            return ('remove' if name == 'remove' else 'mdev-uevent', uuid)
        if len(parts) >= 3 and parts[-2] == 'nvidia' and \
                '/'.join(parts[:-2]) in self.by_dir and name in (
                    vendor_names.CURRENT_TYPE, vendor_names.CREATABLE_TYPES,
                    vendor_names.VGPU_PARAMS, vendor_names.GPU_INSTANCE_ID,
                    vendor_names.PLACEMENT_ID):
            return (name, self.by_dir['/'.join(parts[:-2])])
        if parts == [nvml_mod.CONTROL_NAME]:
            return ('nvml',)
        if len(parts) == 5 and parts[:3] == ['bus', 'pci', 'drivers'] and \
                name in ('bind', 'unbind'):
            return (name, parts[3])
        return None

    # -- reads ----------------------------------------------------------------

    def current_driver(self, address):
        dev = self.devices[address]
        if address in self.kernel.parents() and \
                self.kernel.parent_state(address) == kernel_mod.UNBOUND:
            return None
        return dev.driver

    def pci_uevent(self, address):
        """The ``uevent`` text of a PCI device, with its driver now."""
        dev = self.devices[address]
        driver = self.current_driver(address)
        if driver != dev.driver:
            dev = records.replace(dev, driver=driver)
        return sysfs_tree.uevent(dev)

    def content(self, path):
        """The bytes a read of ``path`` returns (from its start)."""
        what = self.classify(path)
        if what is not None:
            if what[0] == 'available':
                return b'%d\n' % self.kernel.available_instances(what[1],
                                                                 what[2])
            if what[0] == 'pci-uevent':
                return self.pci_uevent(what[1]).encode()
            if what[0] == vendor_names.CURRENT_TYPE:
                current = self.kernel.vf_type(what[1])
                number = objects.vendor_type_number(current) if current \
                    else 0
                return b'%d\n' % number
            if what[0] == vendor_names.CREATABLE_TYPES:
                return sysfs_tree.creatable_text(
                    self.kernel.vf_creatable(what[1])).encode()
            if what[0] == 'sriov_numvfs':
                return b'%d\n' % self.kernel.numvfs(what[1])
            if what[0] == vendor_names.GPU_INSTANCE_ID:
                return b'%d\n' % self.kernel.vf_gi(what[1])
            if what[0] == vendor_names.PLACEMENT_ID:
                return b'%d\n' % self.kernel.vf_placement(what[1])
        with open(self.backing(path), 'rb') as f:
            return f.read()

    # -- writes ---------------------------------------------------------------

    def write(self, path, data):
        """A ``write(2)`` of ``data`` to ``path``: the kernel's effect, or
        ``OSError`` with its errno.  Returns the count written."""
        what = self.classify(path)
        kind = what[0] if what else None
        if kind == 'create':
            self.kernel.create_mdev(what[1], what[2], data)
            # The add uevent is out (device_add); the vendor driver's probe
            # runs before the write returns.  Without that pause libvirtd,
            # which looks for the new device as soon as mdevctl exits, often
            # looks before it handled the uevent, and then sleeps 5 s.
            if self.probe_delay:
                time.sleep(self.probe_delay)
        elif kind == 'remove':
            self.kernel.remove_mdev(what[1], data)
        elif kind in ('bind', 'unbind'):
            self._driver_write(kind, what[1], data)
        elif kind in ('pci-uevent', 'mdev-uevent'):
            self._synth_uevent(kind, what[1], data)
        elif kind == vendor_names.CURRENT_TYPE:
            self.kernel.set_vgpu_type(what[1], data)
        elif kind == 'sriov_numvfs':
            self.kernel.set_numvfs(what[1], data)
        elif kind == vendor_names.VGPU_PARAMS:
            self._write_file(self.backing(path)[len(self.root) + 1:], data,
                             0o644)
        elif kind == 'driver_override':
            # "" or "\n" clears it: reads "(null)" again
            value = data.decode('ascii', 'replace').rstrip('\n')
            self._write_file(self.backing(path)[len(self.root) + 1:],
                             (value or '(null)').encode() + b'\n', 0o644)
        elif os.path.basename(path) in _NOOP_WRITES:
            pass                       # nothing new to find or probe
        else:
            raise OSError(errno.EOPNOTSUPP, 'not simulated: %s' % path)
        return len(data)

    def _driver_write(self, kind, driver, data):
        try:
            address = str(objects.PciAddress.parse(
                data.decode('ascii', 'replace').strip()))
        except exception.InvalidPciAddress:
            raise OSError(errno.ENODEV, 'no such device')
        if address not in self.devices:
            raise OSError(errno.ENODEV, 'no such device')
        dev = self.devices[address]
        if address not in self.kernel.parents():
            if kind == 'unbind' and dev.driver != driver:
                raise OSError(errno.ENODEV, 'not bound to %s' % driver)
            raise OSError(errno.EOPNOTSUPP, 'only mdev parents rebind here')
        if dev.driver != driver:
            raise OSError(errno.ENODEV, '%s is not a %s device'
                          % (address, driver))
        if kind == 'unbind':
            if self.kernel.parent_state(address) == kernel_mod.UNBOUND:
                raise OSError(errno.ENODEV, 'not bound')
            self.kernel.unbind_parent(address)
        else:
            self.kernel.bind_parent(address)

    def _synth_uevent(self, kind, key, data):
        # kobject_synth_uevent(): "<action> [UUID [KEY=value ...]]"
        words = data.decode('ascii', 'replace').split()
        if not words or words[0] not in SYNTH_ACTIONS:
            raise OSError(errno.EINVAL, 'unknown uevent action')
        if self.sender is None:
            return
        if kind == 'pci-uevent':
            self.sender.send(words[0], '/' + self.dirs[key], 'pci',
                             _props(self.pci_uevent(key)))
        else:
            mdev = self.kernel.mdev(key)
            if mdev is None:
                raise OSError(errno.ENOENT, 'no such mdev')
            self._mdev_uevent(words[0], mdev)

    # -- kernel events -> files and uevents -----------------------------------

    def _mdev_uevent(self, action, mdev):
        if self.sender is not None:
            self.sender.send(action, '/%s/%s' % (self.dirs[mdev.parent],
                                                 mdev.uuid), 'mdev',
                             [('MDEV_TYPE', mdev.type_id)])

    def _pci_uevent(self, action, address):
        if self.sender is not None:
            self.sender.send(action, '/' + self.dirs[address], 'pci',
                             _props(self.pci_uevent(address)))

    def _apply(self, event):
        if isinstance(event, kernel_mod.MdevAdded):
            m = event.mdev
            sysfs_tree.write_mdev(self.root, self.dirs[m.parent], m.uuid,
                                  m.type_id, m.iommu_group)
            self._mdev_uevent('add', m)
        elif isinstance(event, kernel_mod.MdevRemoved):
            m = event.mdev
            sysfs_tree.remove_mdev(self.root, self.dirs[m.parent], m.uuid,
                                   m.type_id, m.iommu_group)
            self._mdev_uevent('remove', event.mdev)
        elif isinstance(event, kernel_mod.ParentGoing):
            self._unlink(os.path.join('class', 'mdev_bus', event.parent))
        elif isinstance(event, kernel_mod.ParentUnbound):
            self._unbind_files(event.parent, event.driver)
            if self.sender is not None:
                self.sender.send('unbind', '/' + self.dirs[event.parent],
                                 'pci', _props(self.pci_uevent(event.parent)))
        elif isinstance(event, kernel_mod.VfsEnabled):
            sysfs_tree.write_vfs(self.root, self.profile, event.pf,
                                 event.vfs)
            for vf in event.vfs:
                dev = self.profile.device(vf)
                self.devices[vf] = dev
                self._write_file(os.path.join(self.dirs[vf], 'config'),
                                 pci_config(dev), 0o644)
                self._vendor_placeholders(vf)
                self._pci_uevent('add', vf)
        elif isinstance(event, kernel_mod.VfsDisabled):
            for vf in event.vfs:
                self._pci_uevent('remove', vf)
            sysfs_tree.remove_vfs(self.root, self.profile, event.pf,
                                  event.vfs)
            for vf in event.vfs:
                del self.devices[vf]
        elif isinstance(event, kernel_mod.DriverChanged):
            # the driver's state beside the tree, as a static tree keeps
            # it (its VFs' files are computed on each read here)
            sysfs_tree.write_driver_state(self.root, event.state,
                                          vf_files=False)
        elif isinstance(event, kernel_mod.ParentBound):
            self._bind_files(event.parent, event.driver)
            if self.sender is not None:
                self.sender.send('bind', '/' + self.dirs[event.parent],
                                 'pci', _props(self.pci_uevent(event.parent)))

    def _unbind_files(self, address, driver):
        reldir = self.dirs[address]
        os.rename(os.path.join(self.root, reldir, TYPES_DIR),
                  os.path.join(self.stash, address))
        self._unlink(os.path.join(reldir, 'driver'))
        if driver:
            self._unlink(os.path.join('bus', 'pci', 'drivers', driver,
                                      address))

    def _bind_files(self, address, driver):
        reldir = self.dirs[address]
        os.rename(os.path.join(self.stash, address),
                  os.path.join(self.root, reldir, TYPES_DIR))
        if driver:
            drv = os.path.join('bus', 'pci', 'drivers', driver)
            self._link(os.path.join(reldir, 'driver'), drv)
            self._link(os.path.join(drv, address), reldir)
        self._link(os.path.join('class', 'mdev_bus', address), reldir)

    # -- control --------------------------------------------------------------

    def state(self):
        """What the kernel holds, as JSON-able data."""
        k = self.kernel
        return {
            'mdevs': [{'uuid': m.uuid, 'parent': m.parent,
                       'type_id': m.type_id, 'iommu_group': m.iommu_group}
                      for m in k.mdevs()],
            'busy': k.busy(),
            'vgpus': {vf: k.vf_type(vf) for vf in k.vendor_vfs()},
            'parents': {a: k.parent_state(a) for a in k.parents()},
            'busy_remove': k.busy_remove,
            'uevents': bool(self.sender and self.sender.enabled),
            'driver': k.driver_state(),
        }

    def command(self, line):
        """One control command; returns the reply line."""
        words = line.split()
        if not words:
            return 'error empty command'
        cmd, args = words[0], words[1:]
        try:
            if cmd in ('busy', 'idle') and len(args) == 1:
                try:
                    uuid = objects.Uuid.parse(args[0])
                except exception.InvalidUuid:
                    uuid = str(objects.PciAddress.parse(args[0]))
                if cmd == 'busy':
                    self.kernel.mark_busy(uuid)
                else:
                    self.kernel.mark_idle(uuid)
                return 'ok'
            if cmd == 'state' and not args:
                return 'ok ' + json.dumps(self.state(), sort_keys=True)
            if cmd == 'reboot' and not args:
                self.kernel.reboot()
                return 'ok'
            if cmd == 'sent' and not args:
                return 'ok ' + json.dumps(self.sender.sent
                                          if self.sender else [])
            if cmd == 'uevents' and args in (['on'], ['off']):
                if self.sender is None:
                    return 'error uevents were disabled at start'
                self.sender.enabled = args[0] == 'on'
                return 'ok'
        except (OSError, exception.LibvirtGpuError) as e:
            return 'error %s' % e
        return 'error unknown command %r' % line.strip()


# --- FUSE --------------------------------------------------------------------

def import_fuse_binding():
    # mfusepy takes libfuse 2 when both are installed; we mean Debian's
    # fuse3 (libfuse3.so.3)
    os.environ.setdefault('FUSE_LIBRARY_NAME', 'fuse3')
    try:
        import mfusepy
    except (ImportError, OSError, EnvironmentError) as e:
        raise exception.SimulatorError(
            reason='the live simulator needs the Python package mfusepy and '
                   'libfuse3 (Debian: fuse3): %s' % e)
    return mfusepy


def make_operations(tree, on_ready=None):
    """The FUSE operations object serving ``tree`` (a LiveTree)."""
    mfusepy = import_fuse_binding()

    def refuse(code):
        def op(self, *args, **kwargs):
            raise mfusepy.FuseOSError(code)
        return op

    class LiveOperations(mfusepy.Operations):
        use_ns = True

        def init(self, path):
            if on_ready is not None:
                on_ready()

        def getattr(self, path, fh=None):
            st = os.lstat(tree.backing(path))
            attrs = {key: getattr(st, key) for key in (
                'st_mode', 'st_nlink', 'st_uid', 'st_gid', 'st_size',
                'st_atime_ns', 'st_mtime_ns', 'st_ctime_ns')}
            for key in ('st_atime', 'st_mtime', 'st_ctime'):
                attrs[key] = attrs.pop(key + '_ns')
            # sysfs: every attribute 4096 bytes, directories and links 0
            attrs['st_size'] = ATTR_SIZE if stat.S_ISREG(st.st_mode) else 0
            return attrs

        def readlink(self, path):
            return os.readlink(tree.backing(path))

        def readdir(self, path, fh):
            entries = [('.', {'st_mode': stat.S_IFDIR}, 0),
                       ('..', {'st_mode': stat.S_IFDIR}, 0)]
            with os.scandir(tree.backing(path)) as it:
                for entry in it:
                    if entry.is_symlink():
                        mode = stat.S_IFLNK
                    elif entry.is_dir(follow_symlinks=False):
                        mode = stat.S_IFDIR
                    else:
                        mode = stat.S_IFREG
                    entries.append((entry.name, {'st_mode': mode}, 0))
            return entries

        def open(self, path, flags):
            st = os.lstat(tree.backing(path))
            accmode = flags & os.O_ACCMODE
            # kernfs_fop_open(): no show -> no read, no store -> no write
            if accmode in (os.O_WRONLY, os.O_RDWR) and \
                    not st.st_mode & 0o222:
                raise mfusepy.FuseOSError(errno.EACCES)
            if accmode in (os.O_RDONLY, os.O_RDWR) and \
                    not st.st_mode & 0o444:
                raise mfusepy.FuseOSError(errno.EACCES)
            if tree.classify(path) == ('nvml',):
                return tree.nvml_open()
            return 0

        def read(self, path, size, offset, fh):
            if fh in tree.replies and tree.classify(path) == ('nvml',):
                return tree.replies[fh][offset:offset + size]
            return tree.content(path)[offset:offset + size]

        def write(self, path, data, offset, fh):
            if fh in tree.replies and tree.classify(path) == ('nvml',):
                if len(data) > nvml_mod.MAX_REQUEST:
                    raise mfusepy.FuseOSError(errno.E2BIG)
                return tree.nvml_request(fh, data)
            return tree.write(path, data)

        def release(self, path, fh):
            tree.nvml_release(fh)
            return 0

        def truncate(self, path, length, fh=None):
            # O_TRUNC on an attribute: accepted and ignored, as by kernfs
            if not os.path.exists(tree.backing(path)):
                raise mfusepy.FuseOSError(errno.ENOENT)
            return 0

        def utimens(self, path, times=None):
            return 0

        create = refuse(errno.EACCES)
        mknod = refuse(errno.EPERM)
        mkdir = refuse(errno.EPERM)
        rmdir = refuse(errno.EPERM)
        unlink = refuse(errno.EPERM)
        symlink = refuse(errno.EPERM)
        rename = refuse(errno.EPERM)
        link = refuse(errno.EPERM)
        chmod = refuse(errno.EPERM)
        chown = refuse(errno.EPERM)

    return LiveOperations()


def _block_stop_signals():
    """Stop signals go to the main thread (libfuse's loop) only."""
    signal.pthread_sigmask(signal.SIG_BLOCK,
                           {signal.SIGTERM, signal.SIGINT, signal.SIGHUP})


def _control_loop(tree, stdin, stdout, stop):
    _block_stop_signals()
    for raw in stdin:
        line = raw.decode('utf-8', 'replace').strip()
        if line == 'quit':
            stdout.write(b'ok\n')
            stdout.flush()
            break
        reply = tree.command(line)
        stdout.write(reply.encode('utf-8', 'replace') + b'\n')
        stdout.flush()
    stop()


def serve(profile, mountpoint, busy_remove=None, uevents=True,
          control_stdio=False, workdir=None, probe_delay=PROBE_DELAY):
    """Mount the live tree at ``mountpoint`` and serve it until SIGINT or
    SIGTERM (or, with ``control_stdio``, until stdin closes or ``quit``).
    Unmounts before it returns 0."""
    mfusepy = import_fuse_binding()
    mountpoint = os.path.abspath(os.fspath(mountpoint))
    if not os.path.isdir(mountpoint):
        raise exception.SimulatorError(
            reason='mount point %s is not a directory' % mountpoint)
    if os.path.ismount(mountpoint):
        raise exception.SimulatorError(
            reason='%s is a mount point already' % mountpoint)
    tree = LiveTree(profile, busy_remove=busy_remove, uevents=uevents,
                    workdir=workdir, probe_delay=probe_delay)
    stopping = threading.Event()
    mounted = threading.Event()

    def stop():
        if not stopping.is_set():
            stopping.set()
            tree.kernel.close()          # wake writers blocked on a busy mdev
            os.kill(os.getpid(), signal.SIGTERM)

    if control_stdio:
        # The one way to stop besides a signal: stdin closing (the test
        # process that started us ended, however it ended).
        stdout = os.fdopen(os.dup(sys.stdout.fileno()), 'wb')
        # nothing else may write to the control channel
        os.dup2(sys.stderr.fileno(), sys.stdout.fileno())

        def ready():
            mounted.set()
            stdout.write(('ready %s\n' % json.dumps(
                {'pid': os.getpid(), 'backing': tree.root})).encode())
            stdout.flush()

        threading.Thread(target=_control_loop, name='live-sysfs-control',
                         args=(tree, sys.stdin.buffer, stdout, stop),
                         daemon=True).start()
    else:
        def ready():
            mounted.set()
            LOG.info('live simulated host %s mounted at %s',
                     tree.profile.name, mountpoint)
    try:
        operations = make_operations(tree, on_ready=ready)
        try:
            mfusepy.FUSE(operations, mountpoint, **FUSE_OPTIONS)
            # libfuse gave the stop signals back to their default action:
            # a second one must not cut the clean-up short
            _block_stop_signals()
        except RuntimeError as e:
            _block_stop_signals()
            # fuse_main() answers non-zero when its loop ended on a signal
            # too; only an error before the mount is one.
            if not mounted.is_set():
                raise exception.SimulatorError(
                    reason='FUSE mount of %s failed (%s)' % (mountpoint, e))
    finally:
        tree.close()
    return 0
