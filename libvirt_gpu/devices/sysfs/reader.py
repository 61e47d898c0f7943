"""The only module that opens files under sysfs: ``Reader``.

``Reader(root)`` (``devices.Sysfs`` adds what the files mean) stands for
``/sys`` (or a simulated tree).  Every path is
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

from __future__ import annotations

import errno
import os
import stat

from libvirt_gpu.util import bounds
from libvirt_gpu import exception
from libvirt_gpu.util import filetype
from libvirt_gpu import objects
from libvirt_gpu.util import safeopen
from libvirt_gpu.devices.sysfs import parsers

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Literal, overload

PCI_DEVICES = ('bus', 'pci', 'devices')
MDEV_DEVICES = ('bus', 'mdev', 'devices')
MDEV_BUS = ('class', 'mdev_bus')
# The running kernel's sysfs (every other root is a simulated tree).
HOST_ROOT = '/sys'
TYPES_DIR = 'mdev_supported_types'


# The kernel follows at most 40 links resolving one path (MAXSYMLINKS);
# ``realpath`` alone would follow any number.  One bound for every reader:
# a path that needs more is refused wherever it is read (discovery, the
# allocator, the hook), with the same words.
MAX_LINKS = 40
TOO_MANY_LINKS = ('more than %d symbolic links lead to it (a loop, or a '
                  'chain no kernel makes)' % MAX_LINKS)

# Real sysfs attributes are one page (4 KiB); a bigger file is no attribute.
MAX_ATTRIBUTE_BYTES = 65536
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
_WRITE_FLAGS = os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
_ROOT_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_DIR_FOLLOW_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


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


def _check_links(path):
    """SysfsReadError when the kernel would not resolve ``path`` (more
    than MAX_LINKS links), as it does when the path is opened."""
    try:
        os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise exception.SysfsReadError(path=path, reason=TOO_MANY_LINKS)


def _link_error(error, path):
    """The SysfsReadError of a ``readlink`` of ``path`` that failed."""
    if error.errno == errno.ELOOP:
        return exception.SysfsReadError(path=path, reason=TOO_MANY_LINKS)
    return exception.SysfsReadError(path=path, reason=error.strerror)


def _joined(path, name):
    return path if name is None else os.path.join(path, name)


_MAX_DIGITS = 19     # as parsers.parse_number
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
        entries = list(listing)
    try:
        # the kernel's listing says what each entry is: no call per entry
        # (~5,000 a pass on a large host), and so no frame either
        found = [(e.name, e.is_dir(follow_symlinks=False)) for e in entries]
    except OSError:     # one had to be asked for and failed: as _plain_dir
        found = [(e.name, _plain_dir(e)) for e in entries]
    found.sort()
    return found


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


class Reader(object):
    """Reads and writes a sysfs tree rooted at ``root``: the file rules
    (containment, file types, sizes); ``devices.Sysfs`` adds what the
    files mean."""

    def __init__(self, root: str | os.PathLike[str] = HOST_ROOT) -> None:
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

    def path(self, *parts: str) -> str:
        """Join validated ``parts`` under the root (no '..', no '/')."""
        for part in parts:
            _check_part(part)
        return os.path.join(self.root, *parts)

    def pci_dir(self, address: objects.PciAddress | str) -> str:
        """``<root>/bus/pci/devices/0000:af:00.0``"""
        return self._pci_prefix + str(objects.PciAddress.parse(address))

    def mdev_dir(self, uuid: objects.Uuid | str) -> str:
        """``<root>/bus/mdev/devices/<uuid>``"""
        return os.path.join(self.root, *MDEV_DEVICES,
                            objects.Uuid.parse(uuid))

    def resolved_under_root(self, path: str) -> str:
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
        _check_links(path)
        return real

    if TYPE_CHECKING:
        @overload
        def read(self, path: str, optional: Literal[False] = False) -> str:
            ...

        @overload
        def read(self, path: str, optional: bool) -> str | None: ...

    def read(self, path: str, optional: bool = False) -> str | None:
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

    if TYPE_CHECKING:
        @overload
        def read_int(self, path: str, optional: Literal[False] = False,
                     base: int = 10, minimum: int | None = 0) -> int: ...

        @overload
        def read_int(self, path: str, optional: bool, base: int = 10,
                     minimum: int | None = 0) -> int | None: ...

    def read_int(self, path: str, optional: bool = False, base: int = 10,
                 minimum: int | None = 0) -> int | None:
        """An attribute as a number >= ``minimum`` (None: any sign)."""
        text = self.read(path, optional=optional)
        if text is None:
            return None
        return parsers.parse_number(text, path, minimum=minimum, base=base)

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
            raise _link_error(e, os.path.join(dir_path, name))

    def readlink(self, path):
        """The target of the link ``path`` (OSError as ``os.readlink``)."""
        return os.readlink(path)

    def _open_plain_dir_in(self, dir_fd, name):
        """The descriptor of the directory ``name`` in the directory open
        as ``dir_fd``, following no link (OSError as ``os.open``)."""
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)

    def link_name(self, path: str) -> str | None:
        """Basename of a symlink's target (``driver`` -> ``nvidia``)."""
        try:
            return os.path.basename(os.readlink(path))
        except FileNotFoundError:
            return None
        except OSError as e:
            if e.errno == errno.EINVAL:   # not a link
                return None
            raise _link_error(e, path)

    def listdir(self, path: str, optional: bool = False) -> list[str]:
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

    def own_file(self, directory: str, *parts: str) -> tuple[str, str]:
        """``(path, real path)`` of the file ``parts`` of ``directory``
        (a device's own ``remove``, a type's own ``create``): the
        directory may be reached through links (``bus/mdev/devices/<uuid>``
        is one), but nothing from it to the file may be a link, so the
        file is the directory's own.  SysfsError naming where it leads
        otherwise (an mdev's ``remove`` linked to another mdev's would
        remove that one; a GPU's ``create`` linked to another GPU's would
        make the vGPU there).  ``write`` then opens the real path
        without following a link."""
        path = os.path.join(directory, *parts)
        try:
            real_dir = self.resolved_under_root(directory)
            real = os.path.realpath(path)
        except OSError as e:
            raise exception.SysfsError(path=path, reason=e.strerror)
        if real != os.path.join(real_dir, *parts):
            raise exception.SysfsError(
                path=path, reason='it leads to %s, not to the file of %s '
                                  'itself; nothing written' % (real, real_dir))
        return path, real

    def write(self, path: str, data: str) -> None:
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
            top = os.open(self.root, _ROOT_FLAGS)
            try:
                fd = safeopen.open_beneath(top,
                                           os.path.relpath(real, self.root),
                                           _WRITE_FLAGS)
            finally:
                os.close(top)
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

    @staticmethod
    def is_host_sysfs(root):
        """Whether ``root`` is the running kernel's ``/sys`` (and not a
        simulated tree)."""
        return os.path.realpath(os.fspath(root)) == HOST_ROOT

    def isdir(self, path: str) -> bool:
        """Whether ``path`` (under the root) is a directory now."""
        return os.path.isdir(path)

    def functions_with(self, entry: str) -> list[str]:
        """Names under ``<root>/bus/pci/devices`` that have ``entry``
        (a file or directory a vGPU kind looks for), sorted.

        One readdir and one access() per PCI function, relative to the
        directory (no exception per miss).
        """
        _check_part(entry)
        try:
            fd = os.open(self._pci_prefix.rstrip('/'),
                         os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            return []
        try:
            access, exists = os.access, os.F_OK
            suffix = '/' + entry
            return sorted(n for n in os.listdir(fd)
                          if access(n + suffix, exists, dir_fd=fd))
        finally:
            os.close(fd)
