"""A small, faithful stand-in for the kernel's mdev interface.

The simulated sysfs tree (``libvirt_gpu.simulator.write_sysfs``) is plain
files: writing a UUID to ``create`` just stores it.  ``KernelModel`` gives
those writes the kernel's effect and answers, on the tree itself::

    <parent>/mdev_supported_types/<type>/create   <- "<uuid>"
        EINVAL  not 36/37 bytes or not a UUID (the mdev core's guid_parse)
        EEXIST  the UUID is used by an mdev on any parent
        ENODEV  the parent is not (any more) in class/mdev_bus
        profile.no_capacity_errno (NVIDIA: EINVAL)  available_instances 0
        else: the mdev directory and its links appear exactly as the
        simulator writes them, and every type's available_instances of the
        parent is recomputed (simulator.available_instances)
    bus/mdev/devices/<uuid>/remove                <- "1"
        the mdev and its links go; ENOENT when it does not exist

All state is the tree, and each operation holds an flock on
``<root>/.fake-kernel.lock`` (the kernel's own mutex), so any number of
processes emulating the kernel on one tree agree with each other.

Two ways in:

* ``FakeKernelSysfs(root, profile)``: a ``Sysfs`` whose ``write`` to a
  ``create``/``remove`` attribute is answered by the model, in-process,
  with the kernel's errno (``SysfsWriteError(errno=...)``) - for unit tests
  and for worker processes of the reliability tests.
* ``KernelWatcher(root, profile)``: a thread that watches the tree with
  inotify and applies writes made by *other* processes (the qemu hook run by
  a real libvirtd) after they close the file.  A writer cannot be told an
  errno this way; refused writes are recorded in ``watcher.errors``.  The
  backend waits for the device to appear, as it does on a real kernel.

The FUSE simulator of a later issue will replace both.

Worker entry point (for the reliability tests)::

    python -m tests.functional.fake_kernel attach|prepare|release ...
"""

import argparse
import contextlib
import ctypes
import errno
import fcntl
import json
import os
import select
import shutil
import struct
import sys
import threading
import time

from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu import simulator
from libvirt_gpu import sysfs as sysfs_mod
from libvirt_gpu.simulator import sysfs_tree

LOCK_NAME = '.fake-kernel.lock'


def _oserror(code, path):
    return OSError(code, os.strerror(code), path)


class KernelModel(object):
    """The kernel's mdev rules applied to a simulated tree at ``root``."""

    def __init__(self, root, profile):
        self.root = os.path.realpath(os.fspath(root))
        self.profile = simulator.load_profile(profile)

    @contextlib.contextmanager
    def _locked(self):
        fd = os.open(os.path.join(self.root, LOCK_NAME),
                     os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    # -- what the tree says ---------------------------------------------

    def parent_dir(self, parent):
        link = os.path.join(self.root, 'class', 'mdev_bus', str(parent))
        if not os.path.lexists(link):
            return None
        return os.path.realpath(link)

    def mdevs(self):
        """``{uuid: (parent address, type_id)}`` of every mdev."""
        base = os.path.join(self.root, 'bus', 'mdev', 'devices')
        found = {}
        for uuid in (os.listdir(base) if os.path.isdir(base) else ()):
            real = os.path.realpath(os.path.join(base, uuid))
            type_id = os.path.basename(os.readlink(
                os.path.join(real, 'mdev_type')))
            found[uuid] = (objects.PciAddress.parse(
                os.path.basename(os.path.dirname(real))), type_id)
        return found

    def _on_parent(self, parent, mdevs):
        return [simulator.SimMdev(u, t) for u, (p, t) in sorted(
            mdevs.items()) if p == parent]

    def _refresh_available(self, parent, mdevs):
        device = self.profile.device(str(parent))
        types_dir = os.path.join(self.parent_dir(parent),
                                 'mdev_supported_types')
        on_parent = self._on_parent(parent, mdevs)
        for mtype in device.mdev_types:
            text = b'%d\n' % simulator.available_instances(
                device, mtype.id, on_parent)
            # Overwrite, then cut to length: truncating an ext4 file to 0
            # first makes its close flush to disk (auto_da_alloc), ~1 ms.
            fd = os.open(os.path.join(types_dir, mtype.id,
                                      'available_instances'), os.O_WRONLY)
            try:
                os.write(fd, text)
                os.ftruncate(fd, len(text))
            finally:
                os.close(fd)

    def _fresh_iommu_group(self):
        groups = os.path.join(self.root, 'kernel', 'iommu_groups')
        used = [int(n) for n in os.listdir(groups) if n.isdigit()]
        return max(used) + 1 if used else 0

    # -- the two writes -------------------------------------------------

    def create(self, parent, type_id, data):
        """A write of ``data`` to ``<parent>/.../<type_id>/create``."""
        path = 'create'
        text = data.decode('ascii', 'replace') if isinstance(
            data, bytes) else data
        if len(text) not in (36, 37):
            raise _oserror(errno.EINVAL, path)
        try:
            uuid = objects.validate_uuid(text.strip())
        except exception.InvalidUuid:
            raise _oserror(errno.EINVAL, path)
        parent = objects.PciAddress.parse(parent)
        with self._locked():
            parent_dir = self.parent_dir(parent)
            if parent_dir is None:
                raise _oserror(errno.ENODEV, path)
            mdevs = self.mdevs()
            if uuid in mdevs:
                raise _oserror(errno.EEXIST, path)
            device = self.profile.device(str(parent))
            if device.mdev_type(type_id) is None:
                raise _oserror(errno.ENOENT, path)
            if simulator.available_instances(
                    device, type_id, self._on_parent(parent, mdevs)) < 1:
                # The kernel computes available_instances on each read; a
                # file here must not keep a stale number after a refusal.
                self._refresh_available(parent, mdevs)
                raise _oserror(getattr(errno, self.profile.no_capacity_errno),
                               path)
            sysfs_tree.write_mdev(self.root,
                                  os.path.relpath(parent_dir, self.root),
                                  uuid, type_id, self._fresh_iommu_group())
            mdevs[uuid] = (parent, type_id)
            self._refresh_available(parent, mdevs)
        return uuid

    def remove(self, uuid, data='1'):
        """A write of ``data`` to ``bus/mdev/devices/<uuid>/remove``."""
        path = 'remove'
        text = data.decode() if isinstance(data, bytes) else data
        try:
            value = int(text.strip(), 0)
        except ValueError:
            raise _oserror(errno.EINVAL, path)
        if not value:
            return False
        with self._locked():
            mdevs = self.mdevs()
            if uuid not in mdevs:
                raise _oserror(errno.ENOENT, path)
            parent, type_id = mdevs.pop(uuid)
            link = os.path.join(self.root, 'bus', 'mdev', 'devices', uuid)
            real = os.path.realpath(link)
            group = os.path.realpath(os.path.join(real, 'iommu_group'))
            os.unlink(os.path.join(real, '..', 'mdev_supported_types',
                                   type_id, 'devices', uuid))
            os.unlink(os.path.join(group, 'devices', uuid))
            if not os.listdir(os.path.join(group, 'devices')):
                shutil.rmtree(group)
            os.unlink(link)
            shutil.rmtree(real)
            self._refresh_available(parent, mdevs)
        return True

    def classify(self, path):
        """``('create', parent, type)`` / ``('remove', uuid)`` / None for a
        real path inside the tree."""
        real = os.path.realpath(path)
        name = os.path.basename(real)
        directory = os.path.dirname(real)
        if name == 'create' and os.path.basename(os.path.dirname(
                directory)) == 'mdev_supported_types':
            return ('create', os.path.basename(os.path.dirname(
                os.path.dirname(directory))), os.path.basename(directory))
        if name == 'remove':
            uuid = os.path.basename(directory)
            try:
                return ('remove', objects.validate_uuid(uuid))
            except exception.InvalidUuid:
                return None
        return None


class FakeKernelSysfs(sysfs_mod.Sysfs):
    """A ``Sysfs`` whose mdev writes are answered by ``KernelModel``."""

    def __init__(self, root, profile):
        super().__init__(root)
        self.model = KernelModel(self.root, profile)
        self.writes = []     # (kind, detail, errno or 0), for assertions

    def write(self, path, data):
        real = self.resolved_under_root(path)
        what = self.model.classify(real)
        if what is None:
            return super().write(path, data)
        try:
            if what[0] == 'create':
                self.model.create(what[1], what[2], data)
            else:
                self.model.remove(what[1], data)
        except OSError as e:
            self.writes.append((what[0], what[1:], e.errno))
            raise exception.SysfsWriteError(path=path, reason=e.strerror,
                                            errno=e.errno)
        self.writes.append((what[0], what[1:], 0))


# --- inotify watcher -----------------------------------------------------

IN_CLOSE_WRITE = 0x00000008
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
_EVENT = struct.Struct('iIII')


class KernelWatcher(object):
    """Applies writes made by other processes to the tree (see module doc).

    ``events``: ``[('create', uuid, parent, type) | ('remove', uuid)]`` in
    order; ``errors``: ``[(kind, detail, errno name)]``.
    """

    def __init__(self, root, profile):
        self.model = KernelModel(root, profile)
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
        base = os.path.join(self.model.root, 'class', 'mdev_bus')
        for parent in os.listdir(base):
            types = os.path.join(os.path.realpath(os.path.join(base, parent)),
                                 'mdev_supported_types')
            for type_id in os.listdir(types):
                self._watch(os.path.join(types, type_id, 'create'))
        for uuid in self.model.mdevs():
            self._watch_remove(uuid)

    def _watch_remove(self, uuid):
        self._watch(os.path.realpath(os.path.join(
            self.model.root, 'bus', 'mdev', 'devices', uuid, 'remove')))

    def start(self):
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name='fake-kernel')
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
                    self._apply(path)

    def _apply(self, path):
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
        what = self.model.classify(path)
        try:
            if what[0] == 'create':
                uuid = self.model.create(what[1], what[2], text)
                self.events.append(('create', uuid, what[1], what[2]))
                self._watch_remove(uuid)
                # A remove written before the watch existed made no event.
                self._apply(self._watches[max(self._watches)])
            elif self.model.remove(what[1], text):
                self.events.append(('remove', what[1]))
        except OSError as e:
            self.errors.append((what[0], what[1:],
                                errno.errorcode.get(e.errno, e.errno)))

    def wait_for(self, predicate, timeout=10.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate(self):
                return True
            time.sleep(0.01)
        return predicate(self)


# --- worker processes for the reliability tests --------------------------

def profile_file(name, path, without_mdevs=False):
    """Write bundled profile ``name`` as a JSON file at ``path`` (optionally
    without its pre-existing mdevs) and return ``path``: workers load it with
    ``simulator.load_profile(path)``."""
    from libvirt_gpu.simulator import profile as profile_mod
    with open(os.path.join(profile_mod.profile_dir(), name + '.json')) as f:
        data = json.load(f)
    if without_mdevs:
        for device in data['devices']:
            device.pop('mdevs', None)
    with open(path, 'w') as f:
        json.dump(data, f)
    return os.fspath(path)


def _worker(argv=None):
    """``attach``: api.attach one vGPU to a fake running domain;
    ``prepare``/``release``: run the hook for a domain XML file.

    Prints one JSON line: {"ok": bool, "error": class name, "message": ...}.
    """
    from libvirt_gpu import api
    from libvirt_gpu import conf as conf_mod
    from libvirt_gpu import hook
    from tests.doubles import fake_libvirt

    p = argparse.ArgumentParser()
    p.add_argument('action', choices=('attach', 'prepare', 'release'))
    p.add_argument('--root', required=True)
    p.add_argument('--profile', required=True, help='profile JSON file')
    p.add_argument('--config', required=True)
    p.add_argument('--domains', help='fake libvirt directory (attach)')
    p.add_argument('--domain', help='domain UUID (attach) or XML file')
    p.add_argument('--vgpu-type')
    p.add_argument('--go', help='wait until this file exists, then start')
    args = p.parse_args(argv)
    sysfs = FakeKernelSysfs(args.root, args.profile)
    conf = conf_mod.load(args.config)     # before the start line: the race
    print('ready', flush=True)            # is about the allocation
    if args.go:
        while not os.path.exists(args.go):
            time.sleep(0.001)
    result = {'ok': True}
    try:
        if args.action == 'attach':
            conn = fake_libvirt.FakeConnection(args.domains)
            done = api.attach(conn, args.domain, vgpu_type=args.vgpu_type,
                              live=True, conf=conf, sysfs=sysfs)
            result['uuid'] = done.uuid
            result['parent'] = str(done.parent)
            result['domain'] = done.domain_uuid
        else:
            with open(args.domain, 'rb') as f:
                xml = f.read()
            rc = hook.run(['qemu', 'vm', args.action, 'begin', '-'], xml,
                          config_file=args.config, sysfs=sysfs)
            result['ok'] = rc == 0
            result['rc'] = rc
    except exception.LibvirtGpuError as e:
        result = {'ok': False, 'error': type(e).__name__, 'message': str(e)}
    print(json.dumps(result))
    sys.stdout.flush()
    return 0


if __name__ == '__main__':
    sys.exit(_worker())


# --- trees for tests -------------------------------------------------------

FAST_TMP = '/dev/shm'


@contextlib.contextmanager
def simulated_tree(profile='t4', without_mdevs=False, base=None):
    """A fresh simulated sysfs tree (``(root, profile path)``), removed
    afterwards.  Made under /dev/shm when there is one: on ext4 every mkdir,
    symlink and truncate of the tree costs about a millisecond."""
    import tempfile
    if base is None and os.access(FAST_TMP, os.W_OK):
        base = FAST_TMP
    top = tempfile.mkdtemp(prefix='libvirt-gpu-sim-', dir=base)
    try:
        profile_path = profile_file(profile, os.path.join(top, 'profile.json'),
                                    without_mdevs=without_mdevs)
        root = os.path.join(top, 'sys')
        simulator.write_sysfs(simulator.load_profile(profile_path), root)
        yield root, profile_path
    finally:
        shutil.rmtree(top, ignore_errors=True)


class SimulatedHost(object):
    """A simulated host for the hook run by a real libvirtd: the sysfs tree
    (its kernel emulated by a ``KernelWatcher``), a configuration file
    pointing the hook at it, and a state dir.  A context manager."""

    def __init__(self, workdir, profile='t4', types='nvidia-223',
                 extra_conf='', without_mdevs=False):
        self.workdir = os.fspath(workdir)
        self.profile_name = profile
        self.types = types
        self.extra_conf = extra_conf
        self.without_mdevs = without_mdevs
        self.state_dir = os.path.join(self.workdir, 'state')
        self.config = os.path.join(self.workdir, 'libvirt-gpu.conf')
        self._tree = None
        self.root = self.profile = self.watcher = None

    def __enter__(self):
        self._tree = simulated_tree(self.profile_name,
                                    without_mdevs=self.without_mdevs)
        self.root, self.profile = self._tree.__enter__()
        with open(self.config, 'w') as f:
            f.write('[DEFAULT]\nsysfs_root = %s\nstate_dir = %s\n'
                    '[gpu]\nenabled_vgpu_types = %s\n%s'
                    % (self.root, self.state_dir, self.types,
                       self.extra_conf))
        self.watcher = KernelWatcher(self.root, self.profile).start()
        return self

    def __exit__(self, *exc):
        self.watcher.stop()
        self._tree.__exit__(*exc)

    def mdevs(self):
        return self.watcher.model.mdevs()

    def leases(self):
        from libvirt_gpu import state
        return state.LeaseStore(self.state_dir).leases()

    def hook_log(self):
        try:
            with open(os.path.join(self.state_dir, 'hook.log')) as f:
                return f.read()
        except FileNotFoundError:
            return ''
