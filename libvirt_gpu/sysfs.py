"""The only module that touches sysfs.

``Sysfs(root)`` stands for ``/sys`` (or a simulated tree).  Every path is
built from validated parts (a PCI address, a UUID, a type id that was listed
by the kernel) joined under the root; nothing absolute or relative-upward is
ever joined.  Reading is tuned for discovery of hundreds of mdev parents: one
``listdir`` per device tells which optional files exist, so a missing file
costs no exception.  A directory resolved and checked once is read
relative to its descriptor, and a path is joined only for an error.  A
type's ``available_instances``, read for every type of every parent, has
a short way (``_count_in``): for a type the listing shows as a plain
directory, one ``openat`` of ``<type>/available_instances`` that follows
no link at its end, with the same checks of the file and no path built;
what it does not expect is read again the thorough way, which names it.

Sysfs is input, and a tree (a simulated one, a root given by mistake, a
container's) may hold anything, so the reader trusts nothing in it:

* a path is resolved (links inside sysfs are normal: ``bus/pci/devices/*``,
  ``driver``, ``physfn``) and must stay under the root, compared path
  component by path component (``/sys2`` is not under ``/sys``);
* a file is opened ``O_NONBLOCK | O_NOFOLLOW`` and read only when ``fstat``
  says it is a regular file, so a FIFO, socket or device is refused at once
  instead of hanging or streaming;
* at most ``MAX_ATTRIBUTE_BYTES`` are read, numbers must be plain decimal
  within their range;
* every refusal is a ``SysfsError`` naming the path.
"""

import errno
import os
import re
import stat

from libvirt_gpu import bounds
from libvirt_gpu import exception
from libvirt_gpu import filetype
from libvirt_gpu import logs
from libvirt_gpu import objects
from libvirt_gpu import safeopen

PCI_DEVICES = ('bus', 'pci', 'devices')
MDEV_DEVICES = ('bus', 'mdev', 'devices')
MDEV_BUS = ('class', 'mdev_bus')
TYPES_DIR = 'mdev_supported_types'


# Real sysfs attributes are one page (4 KiB); a bigger file is no attribute.
MAX_ATTRIBUTE_BYTES = 65536
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
_WRITE_FLAGS = os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_DIR_FOLLOW_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
# A count or an id: decimal digits (a leading '-' where the caller allows
# negative values), at most 19 of them (fits a 64-bit kernel value).
_NUMBER = re.compile(r'-?[0-9]{1,19}\Z')
_HEX_NUMBER = re.compile(r'(0[xX])?[0-9a-fA-F]{1,16}\Z')


def is_inside(root, path):
    """Whether the absolute, resolved ``path`` is ``root`` or lies beneath
    it, compared by path components: ``/sys2/x`` is not inside ``/sys``.

    Both must be normalized absolute paths (``realpath`` and the kernel's
    ``/proc/self/fd`` links give nothing else): then "``root`` itself, or
    ``root`` followed by ``/``" is exactly the component comparison,
    without splitting either path."""
    return path == root or path.startswith(_dir_prefix(root))


def _dir_prefix(root):
    """``root`` with one trailing ``/`` (``/`` stays ``/``)."""
    return root if root.endswith('/') else root + '/'


def _check_part(part):
    if (not part or part in ('.', '..') or '/' in part or '\0' in part
            or '\n' in part):
        raise exception.UnsafePath(path=part, root='(any)')
    return part


def _open_refused(error, path, real):
    """The SysfsReadError for an ``os.open`` of ``real`` that failed."""
    kind = filetype.kind_behind(error, real)
    if kind:
        return exception.SysfsNotRegularFile(path=path, kind=kind)
    return exception.SysfsReadError(path=path, reason=error.strerror)


def _read_fd(fd, path, name=None):
    """Read and close ``fd``: a regular file of at most
    MAX_ATTRIBUTE_BYTES, as text.  Errors name ``path`` (with ``name``:
    that entry of directory ``path``, joined only for an error)."""
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise exception.SysfsNotRegularFile(
                path=_joined(path, name), kind=filetype.kind(mode))
        data = os.read(fd, MAX_ATTRIBUTE_BYTES + 1)
    except OSError as e:
        raise exception.SysfsReadError(path=_joined(path, name),
                                       reason=e.strerror)
    finally:
        os.close(fd)
    if len(data) > MAX_ATTRIBUTE_BYTES:
        raise exception.SysfsFileTooLarge(path=_joined(path, name),
                                          limit=MAX_ATTRIBUTE_BYTES)
    return data.decode('utf-8', 'replace').strip()


def _joined(path, name):
    return path if name is None else os.path.join(path, name)


# Type ids that passed objects.validate_type_id (the kernel lists the same
# few dozen under every parent of a model); bounded, as a long-lived
# process may meet many.
_KNOWN_TYPE_IDS = set()
_MAX_KNOWN_TYPE_IDS = 4096
_MAX_DIGITS = 19     # as _NUMBER
# What _count_in reads: a count, its newline and some blanks fit; a read
# that fills it is left to the thorough reader (a smaller buffer than
# MAX_ATTRIBUTE_BYTES + 1 is cheaper to allocate, 5000 times a pass).
_COUNT_READ = 64


def _count_in(dir_fd, type_id, _open=os.open, _close=os.close,
              _fstat=os.fstat, _read=os.read, _is_reg=stat.S_ISREG):
    """``available_instances`` of the type directory ``type_id`` of the
    open directory ``dir_fd``, in the common case only: the file opened
    without following a link, regular, a plain decimal count in fewer
    than _COUNT_READ bytes.  None for anything else (the caller then
    reads it the thorough way, which names what is wrong, and reads up to
    MAX_ATTRIBUTE_BYTES).

    The caller has seen ``type_id`` listed as a directory, not a link
    (``_type_entries``), so the file is opened by its two-part path in one
    call instead of opening the type directory first: a third of the
    system calls of a discovery pass on a large host.  Should the entry be
    swapped for a link between the listing and the open (never on a real
    sysfs, whose entries only the kernel makes), the most this can read is
    another regular file named ``available_instances``, 64 bytes, taken
    only if it is a plain count: nothing a writer of the tree could not
    have written here.  (The ``os`` functions are bound as defaults: this
    runs once per type of every parent, ~5,000 times on a large host.)"""
    try:
        fd = _open(type_id + _COUNT_FILE, _READ_FLAGS, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        if not _is_reg(_fstat(fd).st_mode):
            return None
        data = _read(fd, _COUNT_READ)
    except OSError:
        return None
    finally:
        _close(fd)
    if len(data) >= _COUNT_READ:     # maybe more: the thorough way
        return None
    data = data.strip()
    # bytes.isdigit: ASCII 0-9 only; at least one digit, as parse_number
    if not data.isdigit() or len(data) > _MAX_DIGITS:
        return None
    count = int(data)
    # past the bound: the thorough reader names the file and refuses it
    return count if count <= bounds.MAX_INSTANCES else None


_COUNT_FILE = '/available_instances'


def _type_entries(fd):
    """``[(name, plain)]`` of the types directory open as ``fd``, sorted by
    name; ``plain``: the kernel listed the entry as a directory, not a
    link (the type of each entry comes with the listing, no call per
    entry).  The descriptor itself is listed, so what ``plain`` says is
    about the directory whose entries are then opened."""
    with os.scandir(fd) as listing:
        return sorted((e.name, _plain_dir(e)) for e in listing)


def _plain_dir(entry):
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:         # asked the file system, which failed: not plain
        return False


def _names(fd, real):
    """Names in the directory open as ``fd``, which the kernel said is at
    ``real``.  Listed by that path: ``os.listdir(fd)`` duplicates the
    descriptor and costs eight system calls, the path five.  The names
    only tell what to try; every entry is then opened relative to ``fd``
    (the directory checked), so a directory swapped in between is never
    read from.  Should the path no longer be a directory, the descriptor
    is listed."""
    try:
        return os.listdir(real)
    except OSError:
        return os.listdir(fd)


def parse_number(text, path, minimum=0, base=10):
    """``text`` (an attribute's content) as an int >= ``minimum`` (None:
    any), else a SysfsBadNumber naming ``path`` and what was read."""
    pattern = _HEX_NUMBER if base == 16 else _NUMBER
    expected = ('a number' if minimum is None
                else 'a number of at least %d' % minimum)
    if not pattern.match(text) or (minimum is not None
                                   and int(text, base) < minimum):
        raise exception.SysfsBadNumber(path=path, expected=expected,
                                       text=text[:40])
    return int(text, base)


class Sysfs(object):
    """Reads and writes a sysfs tree rooted at ``root``."""

    def __init__(self, root='/sys'):
        self.root = os.path.realpath(os.fspath(root))

    @property
    def root(self):
        return self._root

    @root.setter
    def root(self, value):
        self._root = value
        self._root_prefix = _dir_prefix(value)   # see _inside
        self._pci_prefix = os.path.join(value, *PCI_DEVICES, '')

    def __repr__(self):
        return 'Sysfs(%r)' % self.root

    def _inside(self, real):
        """``is_inside(root, real)`` with the root's prefix made once."""
        return real == self._root or real.startswith(self._root_prefix)

    # -- paths -------------------------------------------------------------

    def path(self, *parts):
        """Join validated ``parts`` under the root (no '..', no '/')."""
        for part in parts:
            _check_part(part)
        return os.path.join(self.root, *parts)

    def pci_dir(self, address):
        """``<root>/bus/pci/devices/0000:af:00.0``"""
        return self._pci_prefix + str(objects.PciAddress.parse(address))

    def mdev_dir(self, uuid):
        """``<root>/bus/mdev/devices/<uuid>``"""
        return os.path.join(self.root, *MDEV_DEVICES,
                            objects.validate_uuid(uuid))

    def resolved_under_root(self, path):
        """Return the real path of ``path`` or raise UnsafePath if it
        leaves the root.  Links are followed (a link loop is left as it is
        and fails when opened)."""
        real = os.path.realpath(path)
        if not self._inside(real):
            raise exception.UnsafePath(path=path, root=self.root)
        return real

    def _readable(self, path):
        """``resolved_under_root`` for reading: SysfsOutsideRoot (a
        SysfsReadError) when ``path`` leaves the root."""
        real = os.path.realpath(path)
        if not self._inside(real):
            raise exception.SysfsOutsideRoot(path=path, real=real,
                                             root=self.root)
        if os.path.islink(real):
            # realpath leaves a link loop as it is
            raise exception.SysfsReadError(path=path,
                                           reason=os.strerror(errno.ELOOP))
        return real

    # -- primitives --------------------------------------------------------

    def read(self, path, optional=False):
        """Return the stripped text of a sysfs attribute.

        A missing file returns None when ``optional``; anything else that
        stops the read (a path resolving outside the root, a FIFO, socket or
        device, a file over MAX_ATTRIBUTE_BYTES) is a SysfsError naming the
        path.
        """
        fd = self._open_file_fast(path)
        if fd is not None:
            return _read_fd(fd, path)
        real = self._readable(path)
        try:
            fd = os.open(real, _READ_FLAGS)
        except FileNotFoundError:
            if optional:
                return None
            raise exception.SysfsReadError(path=path, reason='no such file')
        except OSError as e:
            raise _open_refused(e, path, real)
        return _read_fd(fd, path)

    def _open_file_fast(self, path):
        """The common case of ``read`` without ``realpath``: the parent
        directory opened and judged as in ``_open_dir`` (the kernel says
        what was opened), then the file opened in it without following a
        link.  None for anything else (a link, a missing file, no /proc),
        which ``read`` then handles the ``realpath`` way, with its errors.
        """
        directory, name = os.path.split(path)
        if name in ('', '.', '..'):
            return None
        try:
            dfd = os.open(directory, _DIR_FOLLOW_FLAGS)
        except OSError:
            return None
        try:
            real = os.readlink('/proc/self/fd/%d' % dfd)
            if not os.path.isabs(real) or not self._inside(real):
                return None
            return os.open(name, _READ_FLAGS, dir_fd=dfd)
        except OSError:
            return None
        finally:
            os.close(dfd)

    def read_int(self, path, optional=False, base=10, minimum=0):
        """An attribute as a number >= ``minimum`` (None: any sign)."""
        text = self.read(path, optional=optional)
        if text is None:
            return None
        return parse_number(text, path, minimum=minimum, base=base)

    def read_hex_id(self, path):
        """A 4-digit PCI id attribute (``vendor``, ``device``), normalized
        (``10de``)."""
        text = self.read(path)
        try:
            return objects.normalize_hex_id(text)
        except exception.InvalidInput:
            raise exception.SysfsBadNumber(
                path=path, expected='a 4-digit hex PCI id', text=text[:40])

    def link_address(self, path):
        """The PCI address a link (``physfn``, ``virtfn0``) points at."""
        name = self.link_name(path)
        try:
            return objects.PciAddress.parse(name)
        except exception.InvalidPciAddress:
            raise exception.SysfsReadError(
                path=path, reason='expected a link to a PCI device, found '
                '%r' % (name[:80] if name else name))

    def _link_address_in(self, dir_fd, dir_path, name):
        """``link_address`` of entry ``name`` of the open directory
        ``dir_fd`` (named ``dir_path``)."""
        target = self._link_name_in(dir_fd, dir_path, name)
        try:
            return objects.PciAddress.parse(target)
        except exception.InvalidPciAddress:
            raise exception.SysfsReadError(
                path=os.path.join(dir_path, name),
                reason='expected a link to a PCI device, found %r'
                % (target[:80] if target else target))

    def _link_name_in(self, dir_fd, dir_path, name):
        """``link_name`` of entry ``name`` of the open directory ``dir_fd``
        (named ``dir_path``, joined only for an error): the link is read
        in the directory already resolved and checked, not by walking its
        path again."""
        try:
            return os.path.basename(os.readlink(name, dir_fd=dir_fd))
        except FileNotFoundError:
            return None
        except OSError as e:
            if e.errno == errno.EINVAL:   # not a link
                return None
            raise exception.SysfsReadError(path=os.path.join(dir_path, name),
                                           reason=e.strerror)

    def link_name(self, path):
        """Basename of a symlink's target (``driver`` -> ``nvidia``)."""
        try:
            return os.path.basename(os.readlink(path))
        except FileNotFoundError:
            return None
        except OSError as e:
            if e.errno == errno.EINVAL:   # not a link
                return None
            raise exception.SysfsReadError(path=path, reason=e.strerror)

    def listdir(self, path, optional=False):
        """Names in a directory that resolves under the root."""
        fd, real = self._open_dir(path, optional=optional)
        if fd is None:
            return []
        try:
            return _names(fd, real)
        except OSError as e:
            raise exception.SysfsReadError(path=path, reason=e.strerror)
        finally:
            os.close(fd)

    def write(self, path, data):
        """Write ``data`` to an attribute that must resolve under the root.

        Raises SysfsWriteError carrying ``errno`` (the kernel's answer).
        """
        try:
            real = self.resolved_under_root(path)
        except OSError as e:      # the tree changed under realpath
            raise exception.SysfsWriteError(path=path, reason=e.strerror,
                                            errno=e.errno)
        # Opened by its real location relative to the root, walked without
        # following a link (safeopen): a directory swapped for a link after
        # the check above fails the open instead of leading outside.
        try:
            fd = safeopen.open_beneath(self.root,
                                       os.path.relpath(real, self.root),
                                       _WRITE_FLAGS)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.EXDEV):
                raise exception.UnsafePath(path=path, root=self.root)
            raise exception.SysfsWriteError(
                path=path, reason=filetype.open_error(e, real),
                errno=e.errno)
        try:
            refused = filetype.not_regular(os.fstat(fd).st_mode)
            if refused:
                raise exception.SysfsWriteError(path=path, reason=refused,
                                                errno=None)
            os.write(fd, data.encode('ascii'))
        except OSError as e:
            raise exception.SysfsWriteError(path=path, reason=e.strerror,
                                            errno=e.errno)
        finally:
            os.close(fd)

    # -- PCI ---------------------------------------------------------------

    def pci_addresses(self):
        """Every device under ``bus/pci/devices`` whose name is an address."""
        found = []
        for name in self.listdir(os.path.join(self.root, *PCI_DEVICES)):
            try:
                found.append(objects.PciAddress.parse(name))
            except exception.InvalidPciAddress:
                continue   # not a PCI device entry; real sysfs has none
        return sorted(found)

    def pci_class(self, address):
        """``class`` of a device, e.g. ``0x030200``."""
        base = self.pci_dir(address)
        dfd, real = self._open_dir(base)
        try:
            return self._read_in(dfd, real, base, 'class')
        finally:
            os.close(dfd)

    def read_gpu(self, address, mdevs_by_parent=None, static_cache=None,
                 skipped=None, class_filter=None):
        """Build a Gpu from ``bus/pci/devices/<address>/``.

        Reads (all optional but vendor, device and class):
        ``vendor device class driver@ numa_node local_cpulist iommu_group@
        physfn@ virtfnN@ mdev_supported_types/<type>/{name,description,
        device_api,available_instances}`` (@ = symlink, only its target's
        name is used).  ``numa_node`` -1 (the kernel's "no node") becomes
        None, as does a missing file.  The group's members are left to
        discovery (``iommu_group_addresses``, ``pci_function``).
        Anything malformed is a SysfsError naming the file; ``skipped``: see
        ``mdev_types``.

        ``class_filter``: a test of the ``class`` text (``is_gpu_class``);
        a device that fails it is None, read no further.  Discovery then
        opens each device's directory once, not once for ``pci_class`` and
        again here.
        """
        address = objects.PciAddress.parse(address)
        base = self.pci_dir(address)
        # The device's directory is resolved (and checked to lie under the
        # root) once; its attributes are read relative to it, each opened
        # without following a link (``_read_in``).
        dfd, real = self._open_dir(base)
        try:
            class_code = None
            if class_filter is not None:
                class_code = self._read_in(dfd, real, base, 'class')
                if not class_filter(class_code):
                    return None
            return self._read_gpu_in(dfd, real, base, address,
                                     mdevs_by_parent, static_cache, skipped,
                                     class_code)
        finally:
            os.close(dfd)

    def _open_dir_fast(self, path):
        """The fast path of ``_open_dir``: ``(fd, real path)``, or
        ``(None, None)`` for the ``realpath`` way; SysfsOutsideRoot when
        the directory opened lies outside the root."""
        try:
            fd = os.open(path, _DIR_FOLLOW_FLAGS)
        except OSError:
            return None, None
        try:
            real = os.readlink('/proc/self/fd/%d' % fd)
        except OSError:
            real = None
        if real is not None and os.path.isabs(real):
            if self._inside(real):
                return fd, real
            os.close(fd)
            raise exception.SysfsOutsideRoot(path=path, real=real,
                                             root=self.root)
        os.close(fd)
        return None, None

    def _open_dir(self, path, optional=False):
        """``(fd, real path)`` of a directory that resolves under the root
        (``(None, None)`` when it is missing and ``optional``); errors as
        ``listdir``'s.

        Fast path: open it (links followed; ``O_DIRECTORY`` refuses
        anything else before it is opened) and ask the kernel what was
        opened (``/proc/self/fd``), then check that lies under the root.
        That is one ``open`` and one ``readlink`` instead of ``realpath``'s
        ``lstat`` of every component, and it checks the directory actually
        opened.  Anything unusual (no /proc, a failed open) takes the
        ``realpath`` way, with its errors."""
        fd, real = self._open_dir_fast(path)
        if fd is not None:
            return fd, real
        real = self._readable(path)
        try:
            return os.open(real, _DIR_FLAGS), real
        except FileNotFoundError:
            if optional:
                return None, None
            raise exception.SysfsReadError(path=path, reason='no such '
                                           'directory')
        except NotADirectoryError:
            raise exception.SysfsReadError(path=path, reason='not a '
                                           'directory')
        except OSError as e:
            raise exception.SysfsReadError(path=path, reason=e.strerror)

    def _read_gpu_in(self, dfd, real, base, address, mdevs_by_parent,
                     static_cache, skipped, class_code):
        entries = set(_names(dfd, real))
        j = os.path.join

        def read(name, optional=False):
            return self._read_in(dfd, real, base, name, optional=optional)

        def link(name):
            return self._link_name_in(dfd, base, name)

        def address_of(name):
            return self._link_address_in(dfd, base, name)

        def hex_id(name):
            text = read(name)
            try:
                return objects.normalize_hex_id(text)
            except exception.InvalidInput:
                raise exception.SysfsBadNumber(
                    path=j(base, name), expected='a 4-digit hex PCI id',
                    text=text[:40])

        # -1: no NUMA affinity
        numa = read('numa_node', optional=True)
        if numa is not None:
            numa = parse_number(numa, j(base, 'numa_node'), minimum=-1)
        group = None
        if 'iommu_group' in entries:
            name = link('iommu_group')
            group = int(name) if name and name.isdigit() else None
        physfn = None
        if 'physfn' in entries:
            physfn = address_of('physfn')
        virtfns = []
        for entry in entries:
            if entry.startswith('virtfn') and entry[6:].isdigit():
                virtfns.append((int(entry[6:]), address_of(entry)))
        vendor_id = hex_id('vendor')
        product_id = hex_id('device')
        driver = link('driver') if 'driver' in entries else None
        mdev_types = ()
        if TYPES_DIR in entries:
            mdev_types = self._mdev_types_of(
                dfd, real, base, address, static_cache,
                (driver, vendor_id, product_id, physfn is not None),
                skipped)
        if mdevs_by_parent is None:
            mdevs_by_parent = self.mdevs_by_parent()
        return objects.Gpu(
            address=address,
            vendor_id=vendor_id,
            product_id=product_id,
            class_code=read('class') if class_code is None else class_code,
            driver=driver,
            numa_node=None if numa is None or numa < 0 else numa,
            iommu_group=group,
            physfn=physfn,
            virtfns=tuple(a for _, a in sorted(virtfns)),
            mdev_types=mdev_types,
            mdevs=tuple(sorted(mdevs_by_parent.get(address, ()))),
            local_cpulist=(read('local_cpulist')
                           if 'local_cpulist' in entries else None),
        )

    def locality(self, address):
        """``(numa_node, local CPUs)`` of a PCI function: its node (None:
        unknown, -1 or missing) and ``local_cpulist`` as a
        ``bounds.CpuList`` (empty when missing or unreadable as a list; its
        bounds are checked before it is parsed, and it is never expanded).
        """
        base = self.pci_dir(address)
        numa = self.read_int(os.path.join(base, 'numa_node'), optional=True,
                             minimum=-1)
        text = self.read(os.path.join(base, 'local_cpulist'), optional=True)
        try:
            cpus = objects.parse_cpulist(text, 'local_cpulist')
        except exception.InvalidInput:
            cpus = objects.parse_cpulist('')
        return (None if numa is None or numa < 0 else numa), cpus

    # -- IOMMU groups ------------------------------------------------------
    #
    #   kernel/iommu_groups/<n>/devices/<address> -> ../../../../devices/..
    #   bus/pci/devices/<address>/iommu_group
    #       -> ../../../kernel/iommu_groups/<n>

    def iommu_group_addresses(self, group):
        """The PCI addresses in IOMMU group ``group`` (sorted); an entry
        that is not a PCI address (none on real hosts) is skipped."""
        if isinstance(group, bool) or not isinstance(group, int) \
                or group < 0:
            raise exception.InvalidInput(
                reason='an IOMMU group is a number, not %r' % (group,))
        base = os.path.join(self.root, 'kernel', 'iommu_groups', str(group),
                            'devices')
        found = []
        for name in self.listdir(base):
            try:
                found.append(objects.PciAddress.parse(name))
            except exception.InvalidPciAddress:
                continue
        return sorted(found)

    def pci_function(self, address):
        """An IommuMember of any PCI function: ids, class and driver (each
        None when its file is missing); companion/host_uses left False
        for discovery to judge."""
        address = objects.PciAddress.parse(address)
        base = self.pci_dir(address)
        dfd, real = self._open_dir(base)     # resolved once, as read_gpu
        try:
            entries = set(_names(dfd, real))

            def read(name):
                return (self._read_in(dfd, real, base, name)
                        if name in entries else None)

            def hex_id(name):
                text = read(name)
                return objects.normalize_hex_id(text) if text else None
            return objects.IommuMember(
                address=address, vendor_id=hex_id('vendor'),
                product_id=hex_id('device'), class_code=read('class'),
                driver=(self._link_name_in(dfd, base, 'driver')
                        if 'driver' in entries else None))
        finally:
            os.close(dfd)

    # -- mdev --------------------------------------------------------------

    def types_dir(self, address):
        return os.path.join(self.pci_dir(address), TYPES_DIR)

    def mdev_type_ids(self, address):
        """Type ids the kernel lists for a parent (sorted)."""
        return sorted(self.listdir(self.types_dir(address), optional=True))

    def _open_in(self, dir_fd, dir_real, name, flags):
        """``(fd, real path)`` of entry ``name`` of the open directory
        ``dir_fd`` (real path ``dir_real``).  The common case is one
        ``openat`` that follows no link; an entry that is a link is resolved
        and must stay under the root."""
        try:
            return (os.open(name, flags, dir_fd=dir_fd),
                    os.path.join(dir_real, name))
        except OSError as e:
            # O_NOFOLLOW met a link: ELOOP, or ENOTDIR with O_DIRECTORY
            if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
        return self._open_link_in(dir_real, name, flags)

    def _open_link_in(self, dir_real, name, flags):
        """``_open_in`` of an entry that is a link: resolved, it must stay
        under the root."""
        real = self._readable(os.path.join(dir_real, name))
        return os.open(real, flags), real

    def _read_in(self, dir_fd, dir_real, dir_path, name, optional=False):
        """Read attribute ``name`` of the open directory ``dir_fd``
        (``dir_path`` as the caller named it, ``dir_real`` resolved).  The
        common case is one ``openat`` that follows no link, and builds no
        path: they are joined only for a link or an error."""
        try:
            fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
        except OSError as e:
            fd = self._open_failed_in(e, dir_real, dir_path, name, optional)
            if fd is None:
                return None
        return _read_fd(fd, dir_path, name)

    def _open_failed_in(self, error, dir_real, dir_path, name, optional):
        """``_read_in`` after its ``openat`` failed with ``error``: an
        entry that is a link is resolved and opened (under the root); a
        missing file is None when ``optional``; anything else a SysfsError
        naming the path."""
        path = os.path.join(dir_path, name)
        try:
            # O_NOFOLLOW met a link: ELOOP (ENOTDIR: as _open_in)
            if error.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise error
            return self._open_link_in(dir_real, name, _READ_FLAGS)[0]
        except FileNotFoundError:
            if optional:
                return None
            raise exception.SysfsReadError(path=path, reason='no such file')
        except OSError as e:
            raise _open_refused(e, path, os.path.join(dir_real, name))

    def mdev_types(self, address, static_cache=None, model=None,
                   skipped=None):
        """Every ``mdev_supported_types/<type>`` of a parent as VgpuType.

        Files are read relative to the open type directory (``dir_fd``):
        the parent's path, which crosses the ``bus/pci/devices`` link, is
        resolved once per parent instead of once per file.

        ``static_cache`` (a dict) with ``model`` (a hashable naming the
        driver and device model) lets a discovery pass read a type's
        ``name``, ``description`` and ``device_api`` once per model: the
        vendor driver fills them from its table of types for that model,
        so every parent of one model shows the same text.
        ``available_instances`` is per parent and always read.

        ``skipped`` (a list): a type that cannot be read (a bad file, a
        malformed number, a name that is no type id) is left out and its
        SysfsError appended, so that one bad type does not hide the
        others; without it, the error is raised.
        """
        base = self.types_dir(address)
        dfd, real = self._open_dir(base, optional=True)
        if dfd is None:
            return ()
        try:
            return self._mdev_types_in(dfd, real, base, static_cache, model,
                                       skipped)
        finally:
            os.close(dfd)

    def _mdev_types_of(self, dev_fd, dev_real, dev_path, address,
                       static_cache, model, skipped):
        """``mdev_types`` of the device whose directory is open as
        ``dev_fd`` (resolved and checked as ``dev_real``): a types
        directory that is a plain directory in it is opened there, without
        resolving its path again; anything else (a link) the way of
        ``mdev_types``, which checks where it leads."""
        try:
            dfd = os.open(TYPES_DIR, _DIR_FLAGS, dir_fd=dev_fd)
        except OSError:
            return self.mdev_types(address, static_cache, model=model,
                                   skipped=skipped)
        try:
            return self._mdev_types_in(
                dfd, os.path.join(dev_real, TYPES_DIR),
                os.path.join(dev_path, TYPES_DIR), static_cache, model,
                skipped)
        finally:
            os.close(dfd)

    def _mdev_types_in(self, dfd, real, base, static_cache, model, skipped):
        """``mdev_types`` of the types directory open as ``dfd``."""
        result = []
        known = _KNOWN_TYPE_IDS
        texts = (static_cache.get(model)
                 if static_cache is not None and model is not None else None)
        for type_id, plain in _type_entries(dfd):
            # The common case (a type id seen before, listed as a plain
            # directory, its text known for this model, a plain count)
            # costs no Python frame beyond _count_in and builds no path;
            # anything else is read again the thorough way, which names
            # what is wrong.
            static = texts.get(type_id) if texts is not None else None
            if static is not None and plain and type_id in known:
                available = _count_in(dfd, type_id)
                if available is not None:
                    # Records are immutable: parents of one model whose
                    # type has the same count share one (the text cache
                    # also keeps them, keyed by (type id, count)).
                    made = texts.get((type_id, available))
                    if made is None:
                        made = texts[type_id, available] = objects.VgpuType(
                            type_id, static[0], static[1], static[2],
                            available)
                    result.append(made)
                    continue
            try:
                result.append(self._mdev_type(
                    dfd, real, base, type_id, static_cache, model))
            except exception.SysfsError as e:
                if skipped is None:
                    raise
                skipped.append(e)
        return tuple(result)

    def _mdev_type(self, types_fd, types_real, types_path, type_id,
                   static_cache, model):
        path = os.path.join(types_path, type_id)
        try:
            objects.validate_type_id(type_id)
        except exception.InvalidTypeId as e:
            raise exception.SysfsReadError(path=path, reason=e)
        if len(_KNOWN_TYPE_IDS) < _MAX_KNOWN_TYPE_IDS:
            _KNOWN_TYPE_IDS.add(type_id)
        try:
            tfd, real = self._open_in(types_fd, types_real, type_id,
                                      _DIR_FLAGS)
        except OSError as e:
            raise exception.SysfsReadError(path=path, reason=e.strerror)
        try:
            available = parse_number(
                self._read_in(tfd, real, path, 'available_instances'),
                os.path.join(path, 'available_instances'))
            if available > bounds.MAX_INSTANCES:
                raise exception.SysfsBadNumber(
                    path=os.path.join(path, 'available_instances'),
                    expected='a number of at most %d' % bounds.MAX_INSTANCES,
                    text=str(available)[:40])
            # static_cache: {model: {type id: (name, description, api)}}
            texts = (static_cache.setdefault(model, {})
                     if static_cache is not None and model is not None
                     else {})
            static = texts.get(type_id)
            if static is None:
                static = texts[type_id] = (
                    self._read_in(tfd, real, path, 'name', optional=True),
                    self._read_in(tfd, real, path, 'description',
                                  optional=True),
                    self._read_in(tfd, real, path, 'device_api'))
        finally:
            os.close(tfd)
        return objects.VgpuType(
            id=type_id, name=static[0], description=static[1],
            device_api=static[2], available_instances=available)

    def mdevs_by_parent(self, skipped=None):
        """``{parent PciAddress: [Mdev]}`` from ``bus/mdev/devices``.

        Each entry is a link into the parent's tree
        (``../../../devices/pci0000:ae/0000:ae:00.0/0000:af:00.0/<uuid>``)
        with ``mdev_type`` linking to the type directory.  One rule for
        every reader (discovery, the allocator, reconcile, the hook): an
        entry that cannot be read is left out, and its SysfsError appended
        to ``skipped`` (a list) or, without one, logged as a warning.  One
        bad entry costs only that entry.
        """
        if skipped is None:
            skipped = []
            result = self.mdevs_by_parent(skipped)
            for error in skipped:
                logs.getLogger(__name__).warning('mdev skipped: %s', error)
            return result
        base = os.path.join(self.root, *MDEV_DEVICES)
        result = {}
        for name in self.listdir(base, optional=True):
            try:
                uuid = objects.validate_uuid(name)
            except exception.InvalidUuid:
                continue
            try:
                found = self._mdev_entry(os.path.join(base, name), uuid)
            except exception.SysfsError as e:
                skipped.append(e)
                continue
            if found is not None:
                result.setdefault(found[0], []).append(found[1])
        return result

    def _mdev_entry(self, link, uuid):
        """``(parent, Mdev)`` of ``bus/mdev/devices/<uuid>``, or None for
        an mdev whose parent is not a PCI device."""
        try:
            target = os.readlink(link)
        except OSError as e:
            raise exception.SysfsReadError(path=link, reason=e.strerror)
        # where the link leads must lie under the root: checked on the
        # directory opened (as _open_dir), else the realpath way, which
        # also takes a link that leads to no directory
        dfd, _ = self._open_dir_fast(link)
        if dfd is None:
            self._readable(link)
        try:
            parent_name = os.path.basename(os.path.dirname(target))
            try:
                parent = objects.PciAddress.parse(parent_name)
            except exception.InvalidPciAddress:
                return None
            type_id = (self.link_name(os.path.join(link, 'mdev_type'))
                       if dfd is None else
                       self._link_name_in(dfd, link, 'mdev_type'))
        finally:
            if dfd is not None:
                os.close(dfd)
        if type_id is None:
            raise exception.SysfsReadError(
                path=os.path.join(link, 'mdev_type'),
                reason='mdev without a type link')
        return parent, objects.Mdev(uuid=uuid, type_id=type_id)

    # -- SR-IOV --------------------------------------------------------------
    #
    #   bus/pci/devices/<PF>/sriov_totalvfs   16
    #   bus/pci/devices/<PF>/sriov_numvfs     0 (VFs off) or 16
    #   bus/pci/devices/<PF>/virtfn<N>     -> ../<VF>
    #   bus/pci/devices/<VF>/physfn        -> ../<PF>

    def sriov_totalvfs(self, address):
        """``sriov_totalvfs`` of a PF, or None when it is no SR-IOV PF."""
        return self.read_int(os.path.join(self.pci_dir(address),
                                          'sriov_totalvfs'), optional=True)

    def sriov_numvfs(self, address):
        """``sriov_numvfs`` of a PF (VFs enabled now), or None."""
        return self.read_int(os.path.join(self.pci_dir(address),
                                          'sriov_numvfs'), optional=True)

    def set_sriov_numvfs(self, address, count):
        """Write ``count`` to ``sriov_numvfs`` (the kernel's generic way to
        enable VFs; NVIDIA's ``sriov-manage -e`` ends in the same write)."""
        if isinstance(count, bool) or not isinstance(count, int) \
                or count < 0:
            raise exception.InvalidInput(
                reason='sriov_numvfs must be a count, not %r' % (count,))
        self.write(os.path.join(self.pci_dir(address), 'sriov_numvfs'),
                   str(count))

    def virtfns(self, address):
        """The VF addresses of a PF, in ``virtfn<N>`` order."""
        base = self.pci_dir(address)
        found = []
        for entry in self.listdir(base, optional=True):
            if entry.startswith('virtfn') and entry[6:].isdigit():
                found.append((int(entry[6:]), objects.PciAddress.parse(
                    self.link_name(os.path.join(base, entry)))))
        return tuple(a for _, a in sorted(found))

    def physfn(self, address):
        """The PF of a VF, or None."""
        name = self.link_name(os.path.join(self.pci_dir(address), 'physfn'))
        return objects.PciAddress.parse(name) if name else None

    # -- NVIDIA vGPU 17+ vendor interface ---------------------------------
    #
    #   bus/pci/devices/<VF>/nvidia/creatable_vgpu_types   (read)
    #       ID    : vGPU Name
    #       1145  : NVIDIA L40S-1B
    #   bus/pci/devices/<VF>/nvidia/current_vgpu_type      (read/write)
    #       0 | 1145
    #   bus/pci/devices/<VF>/nvidia/vgpu_params            (write)
    #       frame_rate_limiter=0, disable_vnc=1

    def nvidia_dir(self, address):
        """``<root>/bus/pci/devices/<VF>/nvidia``"""
        return os.path.join(self.pci_dir(address), NVIDIA_DIR)

    def has_vendor_interface(self, address):
        return os.path.isdir(self.nvidia_dir(address))

    def creatable_vgpu_types(self, address):
        """``((1145, 'NVIDIA L40S-1B'), ...)`` creatable on a VF now; empty
        when the GPU is full (see ``parse_creatable_vgpu_types``)."""
        path = os.path.join(self.nvidia_dir(address), CREATABLE_TYPES)
        return parse_creatable_vgpu_types(self.read(path), path)

    def current_vgpu_type(self, address):
        """The type number of the vGPU on a VF, 0 when it holds none."""
        return self.read_int(os.path.join(self.nvidia_dir(address),
                                          CURRENT_TYPE))

    def set_current_vgpu_type(self, address, number):
        """Write a type number (create a vGPU) or 0 (destroy it) to
        ``current_vgpu_type``; SysfsWriteError carries the kernel's errno."""
        if isinstance(number, bool) or not isinstance(number, int) \
                or number < 0:
            raise exception.InvalidInput(
                reason='current_vgpu_type takes a type number, not %r'
                % (number,))
        self.write(os.path.join(self.nvidia_dir(address), CURRENT_TYPE),
                   str(number))

    def write_vgpu_params(self, address, params):
        """Write plugin parameters (``key=value, ...``) to ``vgpu_params``;
        a single space clears them (NVIDIA's convention)."""
        if not isinstance(params, str) or '\n' in params or '\0' in params \
                or len(params) > 4096:
            raise exception.InvalidInput(
                reason='vgpu_params must be one line of key=value pairs')
        self.write(os.path.join(self.nvidia_dir(address), VGPU_PARAMS),
                   params or ' ')

    def read_vendor_vf(self, address):
        """``objects.VendorVf`` of a VF, or None when it has no
        ``nvidia/`` directory (no vendor interface).

        Each creatable type becomes an VgpuType ``nvidia-<n>`` with
        available_instances 1 (a VF holds one vGPU).  The type the VF holds
        is named from its own list when it is there, else left unnamed:
        discovery names it from the other VFs or the vendor's table.
        """
        if not self.has_vendor_interface(address):
            return None
        current = self.current_vgpu_type(address)
        creatable = tuple(
            objects.VgpuType(id=objects.vendor_type_id(number), name=name,
                             description=None, device_api='vfio-pci',
                             available_instances=0 if current else 1)
            for number, name in self.creatable_vgpu_types(address))
        held = None
        if current:
            type_id = objects.vendor_type_id(current)
            named = [t.name for t in creatable if t.id == type_id]
            held = objects.VgpuType(id=type_id,
                                    name=named[0] if named else None,
                                    description=None, device_api='vfio-pci',
                                    available_instances=0)
        return objects.VendorVf(creatable=creatable, current=held)


NVIDIA_DIR = 'nvidia'
CREATABLE_TYPES = 'creatable_vgpu_types'
CURRENT_TYPE = 'current_vgpu_type'
VGPU_PARAMS = 'vgpu_params'
_MAX_VENDOR_TYPE = 10 ** 9


def parse_creatable_vgpu_types(text, path):
    """Parse ``nvidia/creatable_vgpu_types``::

        ID    : vGPU Name
        1145  : NVIDIA L40S-1B
        1155  : NVIDIA L40S-24Q

    Returns ``((1145, 'NVIDIA L40S-1B'), ...)`` in file order.  Blank lines
    and the header (a first line ``ID : ...``) are skipped; an empty file
    (the GPU is full) gives ``()``.  Names keep their inner spaces.  Any
    other line, a repeated id or an unnamed id is a SysfsReadError naming
    ``path`` and the line: a driver that changed its format must be noticed,
    not half-read.
    """
    rows = []
    seen = set()
    first = True
    for lineno, raw in enumerate((text or '').splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        number, sep, name = line.partition(':')
        number, name = number.strip(), ' '.join(name.split())
        if first and sep and number.upper() == 'ID':
            first = False
            continue      # the header
        first = False
        if not sep or not number.isdigit() or not name \
                or int(number) < 1 or int(number) >= _MAX_VENDOR_TYPE:
            raise exception.SysfsReadError(
                path=path, reason='line %d is not "<type id> : <name>": %r'
                % (lineno, raw[:80]))
        value = int(number)
        if value in seen:
            raise exception.SysfsReadError(
                path=path, reason='line %d repeats type %d' % (lineno, value))
        seen.add(value)
        rows.append((value, name))
    return tuple(rows)
