"""A simulated sysfs tree whose kernel is ``SimKernel``, without FUSE.

``simulator.write_sysfs`` writes plain files: a UUID written to ``create``
would just be stored.  Here the writes the kernel answers go through
``libvirt_gpu.simulator.kernel.SimKernel`` (the same rule book the live
FUSE tree serves), and its answer is both the errno and the change of the
tree::

    <parent>/mdev_supported_types/<type>/create  <- UUID   create_mdev
    bus/mdev/devices/<uuid>/remove               <- 1      remove_mdev
    <VF>/nvidia/CURRENT_TYPE                <- n      set_vgpu_type
    <PF>/sriov_numvfs                            <- n      set_numvfs

After each of them every capacity file of the GPU concerned
(``available_instances``, ``CREATABLE_TYPES``) is rewritten from the
kernel, which computes them as the real one does on each read.

All state is the tree: before each write the kernel's state is read back
from it (``TreeKernel.state``) under an flock on ``<root>/.sim-kernel.lock``
(the kernel's own lock), so any number of processes emulating the kernel
on one tree agree with each other, and one killed mid-way leaves a tree
another can go on with.  (The kernel's notion of "busy", a guest holding a
device, is not in the tree: the live FUSE tree simulates it.)

Two ways in:

* ``KernelSysfs(root, profile)``: a ``Sysfs`` whose ``write`` to those
  attributes is answered in-process with the kernel's errno
  (``SysfsWriteError(errno=...)``); ``writes`` records every write.
* ``KernelWatcher(root, profile)``: a thread that watches the ``create``
  and ``remove`` files with inotify and applies writes made by *other*
  processes (the qemu hook run as libvirtd runs it) after they close the
  file.  A writer cannot be told an errno this way; refused writes are
  recorded in ``watcher.errors``.
"""

import contextlib
import ctypes
import errno
import fcntl
import os
import select
import struct
import threading
import typing

from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.devices import sysfs as sysfs_mod
from libvirt_gpu.simulator import kernel as kernel_mod
from libvirt_gpu.simulator import loading
from libvirt_gpu.simulator import sysfs_tree
from tests.doubles import poll
from libvirt_gpu.devices.backends.nvidia_vgpu import names as vendor_names

LOCK_NAME = sysfs_tree.LOCK_NAME
TYPES_DIR = sysfs_tree.TYPES_DIR

CREATE = 'create'
REMOVE = 'remove'
CURRENT_VGPU_TYPE = vendor_names.CURRENT_TYPE
SRIOV_NUMVFS = 'sriov_numvfs'
FILE = 'file'              # any other write: stored as a plain file


class KernelWrite(typing.NamedTuple):
    """One write through ``KernelSysfs``.

    ``detail``: ``(parent, type)`` for a create, ``(uuid,)`` for a remove,
    ``(address, data)`` for ``CURRENT_TYPE``/``sriov_numvfs``,
    ``(path relative to the root,)`` for a plain file; ``errno``: the
    kernel's answer, 0 when it took the write.
    """

    kind: str
    detail: tuple
    errno: int


class TreeKernel(object):
    """``SimKernel`` over the simulated tree at ``root`` (see module doc).
    """

    def __init__(self, root, profile):
        self.root = os.path.realpath(os.fspath(root))
        self.profile = loading.load_profile(profile)
        self.kernel = kernel_mod.SimKernel(self.profile)
        self.dirs = sysfs_tree.device_dirs(self.profile)
        self._by_dir = {os.path.join(self.root, d): a
                        for a, d in self.dirs.items()}
        self._changed = []
        self.kernel.subscribe(self._apply)

    @contextlib.contextmanager
    def _locked(self):
        fd = os.open(os.path.join(self.root, LOCK_NAME),
                     os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    # -- the tree's state ---------------------------------------------------

    def mdevs(self):
        """``{uuid: (parent PciAddress, type_id)}`` of every mdev."""
        return {m.uuid: (objects.PciAddress.parse(m.parent), m.type_id)
                for m in self._tree_mdevs()}

    def _tree_mdevs(self):
        return sysfs_tree.tree_mdevs(self.root)

    def state(self):
        """What the tree shows of the kernel's state (``KernelState``)."""
        return sysfs_tree.read_state(self.root, self.profile)

    # -- kernel events -> files ---------------------------------------------

    def _apply(self, event):
        if isinstance(event, kernel_mod.MdevAdded):
            m = event.mdev
            sysfs_tree.write_mdev(self.root, self.dirs[m.parent], m.uuid,
                                  m.type_id, m.iommu_group)
            self._changed.append(m.parent)
        elif isinstance(event, kernel_mod.MdevRemoved):
            m = event.mdev
            sysfs_tree.remove_mdev(self.root, self.dirs[m.parent], m.uuid,
                                   m.type_id, m.iommu_group)
            self._changed.append(m.parent)
        elif isinstance(event, kernel_mod.VgpuTypeSet):
            dev = self.profile.device(event.vf)
            number = dev.vgpu_type(event.type_id).number \
                if event.type_id else 0
            sysfs_tree.write_vf_type(
                self.root, self.dirs[event.vf], number)
            self._changed.append(event.vf)
        elif isinstance(event, kernel_mod.VfsEnabled):
            sysfs_tree.write_vfs(self.root, self.profile, event.pf,
                                 event.vfs)
            self._changed.append(event.pf)
        elif isinstance(event, kernel_mod.VfsDisabled):
            sysfs_tree.remove_vfs(self.root, self.profile, event.pf,
                                  event.vfs)
        elif isinstance(event, kernel_mod.DriverChanged):
            sysfs_tree.write_driver_state(self.root, event.state)
        else:
            raise exception.SimulatorError(
                reason='the in-process kernel does not apply %r' % (event,))

    def _refresh(self, address):
        """Rewrite the capacity files of every enabled function of
        ``address``'s GPU from the kernel."""
        dev = self.profile.device(address)
        parents = set(self.kernel.parents())
        vendor = set(self.kernel.vendor_vfs())
        for function in self.profile.gpu_functions(dev):
            reldir = self.dirs[function.address]
            if function.address in parents:
                for mtype in function.mdev_types:
                    sysfs_tree.write_available(
                        self.root, reldir, mtype.id,
                        self.kernel.available_instances(function.address,
                                                        mtype.id))
            if function.address in vendor:
                sysfs_tree.write_creatable(
                    self.root, reldir,
                    self.kernel.vf_creatable(function.address))

    @contextlib.contextmanager
    def _write(self, address):
        """The kernel, holding the tree's state, for one write about
        ``address``; afterwards (refused or not: the kernel computes the
        capacity files on each read, none may stay stale) the capacity
        files of the GPUs concerned are rewritten."""
        with self._locked():
            self.kernel.restore(self.state())
            self._changed = [address]
            try:
                yield self.kernel
            finally:
                for changed in sorted(set(self._changed)):
                    self._refresh(changed)

    # -- the writes ---------------------------------------------------------

    def create(self, parent, type_id, data):
        """A write of ``data`` to ``<parent>/.../<type_id>/create``;
        returns the UUID."""
        parent = str(objects.PciAddress.parse(parent))
        with self._write(parent) as kernel:
            return kernel.create_mdev(parent, type_id, data).uuid

    def remove(self, uuid, data='1'):
        """A write of ``data`` to ``bus/mdev/devices/<uuid>/remove``;
        False when ``data`` is 0."""
        with self._locked():
            mdev = {m.uuid: m for m in self._tree_mdevs()}.get(uuid)
        if mdev is None:
            raise OSError(errno.ENOENT, 'remove: no such mdev')
        with self._write(mdev.parent) as kernel:
            return kernel.remove_mdev(uuid, data)

    def set_vgpu_type(self, vf, data):
        """A write of ``data`` to ``<VF>/nvidia/CURRENT_TYPE``."""
        vf = str(objects.PciAddress.parse(vf))
        with self._write(vf) as kernel:
            return kernel.set_vgpu_type(vf, data)

    def set_numvfs(self, pf, data):
        """A write of ``data`` to ``<PF>/sriov_numvfs``."""
        pf = str(objects.PciAddress.parse(pf))
        with self._write(pf) as kernel:
            return kernel.set_numvfs(pf, data)

    def classify(self, real):
        """What a write to the real path ``real`` (inside the tree) is:
        ``(CREATE, parent, type)``, ``(REMOVE, uuid)``,
        ``(CURRENT_VGPU_TYPE, vf)``, ``(SRIOV_NUMVFS, pf)`` or None."""
        name = os.path.basename(real)
        directory = os.path.dirname(real)
        if name == CREATE and os.path.basename(
                os.path.dirname(directory)) == TYPES_DIR:
            address = self._by_dir.get(os.path.dirname(os.path.dirname(
                directory)))
            if address is not None:
                return (CREATE, address, os.path.basename(directory))
        if name == REMOVE and os.path.dirname(directory) in self._by_dir:
            try:
                return (REMOVE, objects.Uuid.parse(
                    os.path.basename(directory)))
            except exception.InvalidUuid:
                return None
        if name == CURRENT_VGPU_TYPE and os.path.basename(
                directory) == 'nvidia':
            address = self._by_dir.get(os.path.dirname(directory))
            if address is not None:
                return (CURRENT_VGPU_TYPE, address)
        if name == SRIOV_NUMVFS and directory in self._by_dir:
            return (SRIOV_NUMVFS, self._by_dir[directory])
        return None

    def apply(self, what, data):
        """The write ``what`` (``classify``) of ``data``: the kernel's
        result, or ``OSError`` with its errno."""
        kind = what[0]
        if kind == CREATE:
            return self.create(what[1], what[2], data)
        if kind == REMOVE:
            return self.remove(what[1], data)
        if kind == CURRENT_VGPU_TYPE:
            return self.set_vgpu_type(what[1], data)
        return self.set_numvfs(what[1], data)


class KernelSysfs(sysfs_mod.Sysfs):
    """A ``Sysfs`` whose writes the kernel answers (``TreeKernel``).

    ``busy(vf, n)`` makes the next ``n`` writes to ``vf``'s
    ``CURRENT_TYPE`` answer EBUSY before they reach the kernel, as
    NVIDIA's driver does while it still tears a guest's vGPU down.
    """

    def __init__(self, root, profile):
        super().__init__(root)
        self.kernel = TreeKernel(self.root, profile)
        self.writes = []        # KernelWrite, in order
        self._busy = {}

    @property
    def profile(self):
        return self.kernel.profile

    def busy(self, vf, count=1):
        self._busy[str(objects.PciAddress.parse(vf))] = count

    def write(self, path, data):
        real = self.resolved_under_root(path)
        what = self.kernel.classify(real)
        if what is None:
            self.writes.append(KernelWrite(
                FILE, (os.path.relpath(real, self.root),), 0))
            return super().write(path, data)
        detail = what[1:]
        if what[0] in (CURRENT_VGPU_TYPE, SRIOV_NUMVFS):
            detail = (what[1], data)
        try:
            if what[0] == CURRENT_VGPU_TYPE and self._busy.get(what[1]):
                self._busy[what[1]] -= 1
                raise OSError(errno.EBUSY, 'the driver is busy')
            self.kernel.apply(what, data)
        except OSError as e:
            self.writes.append(KernelWrite(what[0], detail, e.errno))
            raise exception.SysfsWriteError(
                path=path, reason=os.strerror(e.errno), errno=e.errno)
        self.writes.append(KernelWrite(what[0], detail, 0))


# --- inotify watcher -----------------------------------------------------

IN_CLOSE_WRITE = 0x00000008
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
_EVENT = struct.Struct('iIII')


class KernelWatcher(object):
    """Applies writes made by other processes to the tree (see module doc).

    ``events``: ``[('create', uuid, parent, type) | ('remove', uuid)]`` in
    order; ``errors``: ``[(kind, detail, errno name)]``.  A context
    manager.
    """

    def __init__(self, root, profile):
        self.kernel = TreeKernel(root, profile)
        self.events = []
        self.errors = []
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._fd = self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), 'inotify_init1')
        self._watches = {}
        self._stop = threading.Event()
        self._thread = None
        self._watch_tree()

    def _watch(self, path):
        wd = self._libc.inotify_add_watch(self._fd, os.fsencode(path),
                                          IN_CLOSE_WRITE)
        if wd < 0:
            raise OSError(ctypes.get_errno(), 'inotify_add_watch', path)
        self._watches[wd] = path

    def _watch_tree(self):
        root = self.kernel.root
        base = os.path.join(root, 'class', 'mdev_bus')
        for parent in sorted(os.listdir(base)):
            types = os.path.join(os.path.realpath(os.path.join(base, parent)),
                                 TYPES_DIR)
            for type_id in sorted(os.listdir(types)):
                self._watch(os.path.join(types, type_id, CREATE))
        for uuid in self.kernel.mdevs():
            self._watch_remove(uuid)

    def _watch_remove(self, uuid):
        self._watch(os.path.realpath(os.path.join(
            self.kernel.root, 'bus', 'mdev', 'devices', uuid, REMOVE)))

    def start(self):
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name='sim-kernel-watcher')
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        os.close(self._fd)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def _run(self):
        while not self._stop.is_set():
            ready, _, _ = select.select([self._fd], [], [], 0.05)
            if not ready:
                continue
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                continue
            offset = 0
            while offset < len(data):
                wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
                offset += _EVENT.size + length
                path = self._watches.get(wd)
                if path is not None and mask & IN_CLOSE_WRITE:
                    self._take(path)

    def _take(self, path):
        # Read-only open and truncate by path: neither makes another
        # IN_CLOSE_WRITE event (a read-write open would, forever).
        try:
            with open(path, 'r') as f:
                text = f.read()
            if text:
                os.truncate(path, 0)
        except FileNotFoundError:
            return       # a removed mdev's remove file
        if not text:
            return
        what = self.kernel.classify(os.path.realpath(path))
        try:
            if what[0] == CREATE:
                uuid = self.kernel.create(what[1], what[2], text)
                self.events.append((CREATE, uuid, what[1], what[2]))
                self._watch_remove(uuid)
                # A remove written before the watch existed made no event.
                self._take(self._watches[max(self._watches)])
            elif self.kernel.remove(what[1], text):
                self.events.append((REMOVE, what[1]))
        except OSError as e:
            self.errors.append((what[0], what[1:],
                                errno.errorcode.get(e.errno, e.errno)))

    def wait_for(self, predicate, timeout=10.0):
        """``predicate(self)`` polled until true (``poll.wait_for``)."""
        return poll.wait_for(lambda: predicate(self), timeout, 0.01)
