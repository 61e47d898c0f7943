"""Leases: which vGPU (by UUID, any kind) is held for which domain, and by
whom.

One SQLite file per host, ``<state_dir>/leases.sqlite3``, next to a lock
file ``<state_dir>/leases.lock`` and ``<state_dir>/boot_id`` (leases are
only meaningful within one boot: mdevs do not survive a reboot).  Every
change happens inside ``LeaseStore.transaction()``: an exclusive ``flock``
on the lock file (so processes queue in the kernel, and a process killed
while holding it lets go at once), then ``BEGIN IMMEDIATE`` ... ``COMMIT``
(so a process killed in the middle leaves the file as it was before the
transaction).

A lease row::

    mdev_uuid   4b20d080-1b54-4048-85b3-a6a62d165c01   (primary key; the
                vGPU's UUID, of any kind: ``Lease.vgpu_uuid``)
    domain_uuid c7a5fdbd-cdaf-9455-926a-d65c16db1809   (NULL: reconcile's)
    parent      0000:af:00.0
    type_id     nvidia-223
    state       reserved | created | removing
    pid, pid_start   the process working on it (start time guards against
                     PID reuse); once it has exited the lease is settled
    created_at, updated_at   seconds since the epoch
    expires_at  NULL, or (a reservation for an incoming live migration,
                made by the destination's ``migrate`` hook, whose process
                exits at once) the time until which the reservation stands
                although its holder is gone; any later change of the lease
                (``prepare`` taking it over) ends it

``reserved``: capacity taken, the mdev may not exist yet.  ``created``: the
mdev exists for the domain.  ``removing``: reconcile is removing it.  A
process killed mid-way leaves its lease behind with a dead holder; the
allocator still counts it (never over-commit) and ``reconcile`` resolves it.

Test-only crash points: ``crash_point('attach:created')`` kills the process
with SIGKILL when the environment variable ``LIBVIRT_GPU_TEST_CRASH_AT``
names that step (``attach:created``, or ``attach:created@2`` for its second
occurrence).  Unset, it costs one dictionary lookup.
"""

from __future__ import annotations

import contextlib
import os
import time

from libvirt_gpu import exception
from libvirt_gpu.util import fileutil
from libvirt_gpu.util import filetype
from libvirt_gpu import objects
from libvirt_gpu.util import records
from libvirt_gpu.store import statedir
from libvirt_gpu.util import textutil

TYPE_CHECKING = False
if TYPE_CHECKING:
    import sqlite3
    from collections.abc import Iterable, Iterator
    from typing import Any
else:
    try:
        # The C module that ``sqlite3`` re-exports (connect, the errors,
        # Row): ``sqlite3.dbapi2`` adds only the datetime adapters, and
        # importing it (with ``datetime``) costs every guest start (the
        # hook) about 2 ms for adapters these tables, which keep times as
        # REAL, never use.
        import _sqlite3 as sqlite3
    except ImportError:
        import sqlite3

DB_NAME = 'leases.sqlite3'
LOCK_NAME = 'leases.lock'
BOOT_ID_NAME = 'boot_id'
BOOT_ID_PATH = '/proc/sys/kernel/random/boot_id'
SCHEMA_VERSION = 2
# A boot id is 36 characters and a newline; a longer file is not one.
_MAX_BOOT_ID_BYTES = 64
# what <state_dir>/boot_id may hold: a boot id as _boot_id_text writes it
# (each byte at most 4 characters) and its newline
_MAX_RECORDED_BOOT_ID_BYTES = 4 * _MAX_BOOT_ID_BYTES + 1
# A SQLite file is at least its 100-byte header (in practice a page).
_SQLITE_HEADER_BYTES = 100

RESERVED = 'reserved'
CREATED = 'created'
REMOVING = 'removing'
STATES = (RESERVED, CREATED, REMOVING)

CRASH_ENV = 'LIBVIRT_GPU_TEST_CRASH_AT'
_crash_counts: dict[str, int] = {}

_SCHEMA = """
CREATE TABLE IF NOT EXISTS leases (
    mdev_uuid   TEXT PRIMARY KEY NOT NULL,
    domain_uuid TEXT,
    parent      TEXT NOT NULL,
    type_id     TEXT NOT NULL,
    state       TEXT NOT NULL CHECK (state IN ('reserved', 'created',
                                               'removing')),
    pid         INTEGER NOT NULL,
    pid_start   INTEGER,
    created_at  REAL NOT NULL,
    updated_at  REAL NOT NULL,
    expires_at  REAL
);
CREATE INDEX IF NOT EXISTS leases_domain ON leases (domain_uuid);
CREATE INDEX IF NOT EXISTS leases_parent ON leases (parent);
CREATE TABLE IF NOT EXISTS borrowed (
    mdev_uuid   TEXT PRIMARY KEY NOT NULL,
    domain_uuid TEXT NOT NULL,
    created_at  REAL NOT NULL
);
"""
_COLUMNS = ('mdev_uuid', 'domain_uuid', 'parent', 'type_id', 'state', 'pid',
            'pid_start', 'created_at', 'updated_at', 'expires_at')
# The Lease fields of those columns: a vGPU of any kind is keyed by its
# UUID; the column keeps its first name so existing lease files still open.
_FIELDS = ('vgpu_uuid',) + _COLUMNS[1:]


def crash_point(step: str) -> None:
    """Test-only: SIGKILL this process at ``step`` (see module doc)."""
    wanted = os.environ.get(CRASH_ENV)
    if not wanted:
        return
    name, _, nth = wanted.partition('@')
    if name != step:
        return
    _crash_counts[step] = _crash_counts.get(step, 0) + 1
    if _crash_counts[step] == (int(nth) if nth.isdigit() else 1):
        import signal     # only here: the hook does not pay for it
        os.kill(os.getpid(), signal.SIGKILL)


def process_start(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (``/proc/<pid>/stat``
    field 22), or None when there is no such process."""
    try:
        with open('/proc/%d/stat' % pid, 'rb') as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        return None
    # "pid (comm) state ppid ..." - comm may hold spaces and parentheses.
    fields = stat.rsplit(b')', 1)[-1].split()
    try:
        if fields[0] == b'Z':
            return None      # a zombie holds nothing any more
        return int(fields[19])
    except (IndexError, ValueError):
        return None


_my_start_cache: dict[int, int | None] = {}


def _my_start() -> int | None:
    pid = os.getpid()
    if pid not in _my_start_cache:
        _my_start_cache[pid] = process_start(pid)
    return _my_start_cache[pid]


@records.record
class Lease:
    vgpu_uuid: objects.Uuid
    domain_uuid: objects.Uuid | None
    parent: objects.PciAddress
    # None when the row's text is no type id (``bad_type_id`` holds it):
    # the row can still be listed and cleaned by reconcile; whoever would
    # use its type refuses it (``Lease.checked_type_id``).
    type_id: objects.TypeId | None
    state: str
    pid: int
    pid_start: int | None
    created_at: float
    updated_at: float
    expires_at: float | None = None
    bad_type_id: str | None = None

    def checked_type_id(self) -> objects.TypeId:
        """``type_id``, or InvalidTypeId naming the row's text."""
        if self.type_id is None:
            raise exception.InvalidTypeId(value=self.bad_type_id)
        return self.type_id

    def held(self, now: float) -> bool:
        """Whether an incoming migration's reservation still stands at
        ``now`` (its holder, the ``migrate`` hook, has exited by design)."""
        return self.expires_at is not None and now < self.expires_at

    def holder_alive(self) -> bool:
        """Whether the process that last worked on this lease still runs."""
        start = process_start(self.pid)
        return start is not None and (self.pid_start is None
                                      or start == self.pid_start)

    def held_by_me(self) -> bool:
        return self.pid == os.getpid() and self.holder_alive()


def _row_to_lease(row: tuple[Any, ...]) -> Lease:
    # The lease store is an edge: what SQLite holds is text, parsed here
    # once into the values the rest of the program takes.
    values: dict[str, Any] = dict(zip(_FIELDS, row))
    values['vgpu_uuid'] = objects.Uuid.parse(values['vgpu_uuid'])
    if values['domain_uuid'] is not None:
        values['domain_uuid'] = objects.Uuid.parse(values['domain_uuid'])
    values['parent'] = objects.PciAddress.parse(values['parent'])
    try:
        values['type_id'] = objects.TypeId.parse(values['type_id'])
    except exception.InvalidTypeId:
        values['bad_type_id'] = values['type_id']
        values['type_id'] = None
    return Lease(**values)


def _uuid(value: object, what: str = 'vgpu_uuid') -> objects.Uuid:
    return objects.typed(value, objects.Uuid, what)


class Transaction(object):
    """Reads and writes of one locked transaction (``LeaseStore``)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db
        self.now = time.time()
        self.pid = os.getpid()
        self.pid_start = _my_start()

    def _select(self, where: str = '',
                args: tuple[object, ...] = ()) -> list[Lease]:
        rows = self._db.execute(
            'SELECT %s FROM leases %s ORDER BY created_at, mdev_uuid'
            % (', '.join(_COLUMNS), where), args).fetchall()
        return [_row_to_lease(r) for r in rows]

    def all(self) -> list[Lease]:
        return self._select()

    def get(self, vgpu_uuid: objects.Uuid) -> Lease | None:
        found = self._select('WHERE mdev_uuid = ?',
                             (_uuid(vgpu_uuid),))
        return found[0] if found else None

    def for_domain(self, domain_uuid: objects.Uuid) -> list[Lease]:
        return self._select('WHERE domain_uuid = ?',
                            (_uuid(domain_uuid, 'domain_uuid'),))

    def for_parent(self, parent: objects.PciAddress) -> list[Lease]:
        return self._select('WHERE parent = ?',
                            (str(objects.typed(parent, objects.PciAddress,
                                               'parent')),))

    def add(self, vgpu_uuid: objects.Uuid, domain_uuid: objects.Uuid | None,
            parent: objects.PciAddress, type_id: objects.TypeId,
            state: str = RESERVED, expires_at: float | None = None) -> Lease:
        """Insert a lease held by this process (and, with ``expires_at``,
        until then whatever becomes of it); a UUID already leased is a
        LeaseConflict."""
        if state not in STATES:
            raise ValueError(state)
        lease = Lease(
            vgpu_uuid=_uuid(vgpu_uuid),
            domain_uuid=(_uuid(domain_uuid, 'domain_uuid')
                         if domain_uuid is not None else None),
            parent=objects.typed(parent, objects.PciAddress, 'parent'),
            type_id=objects.typed(type_id, objects.TypeId, 'type_id'),
            state=state,
            pid=self.pid, pid_start=self.pid_start, created_at=self.now,
            updated_at=self.now, expires_at=expires_at)
        try:
            self._db.execute(
                'INSERT INTO leases (%s) VALUES (%s)'
                % (', '.join(_COLUMNS), ', '.join('?' * len(_COLUMNS))),
                (lease.vgpu_uuid, lease.domain_uuid, str(lease.parent),
                 lease.type_id, lease.state, lease.pid, lease.pid_start,
                 lease.created_at, lease.updated_at, lease.expires_at))
        except sqlite3.IntegrityError:
            other = self.get(lease.vgpu_uuid)
            raise exception.LeaseConflict(
                uuid=lease.vgpu_uuid,
                holder='domain %s' % (other.domain_uuid if other else '?'))
        return lease

    def update(self, vgpu_uuid: objects.Uuid, **changes: object) -> Lease:
        """Change fields of a lease and take it over (pid = this process).
        Returns the new lease; a missing lease is a StateError.  The
        lease's ``expires_at`` is cleared unless given: the process taking
        it over holds it now."""
        allowed = {'domain_uuid', 'parent', 'type_id', 'state', 'expires_at'}
        if set(changes) - allowed:
            raise ValueError(sorted(set(changes) - allowed))
        if changes.get('state', RESERVED) not in STATES:
            raise ValueError(changes['state'])
        if 'parent' in changes:
            changes['parent'] = str(objects.typed(
                changes['parent'], objects.PciAddress, 'parent'))
        if 'type_id' in changes:
            objects.typed(changes['type_id'], objects.TypeId, 'type_id')
        if changes.get('domain_uuid') is not None:
            _uuid(changes['domain_uuid'], 'domain_uuid')
        changes.setdefault('expires_at', None)
        changes.update(pid=self.pid, pid_start=self.pid_start,
                       updated_at=self.now)
        names = sorted(changes)
        cur = self._db.execute(
            'UPDATE leases SET %s WHERE mdev_uuid = ?'
            % ', '.join('%s = ?' % n for n in names),
            [changes[n] for n in names] + [_uuid(vgpu_uuid)])
        updated = self.get(vgpu_uuid) if cur.rowcount == 1 else None
        if updated is None:
            raise exception.StateError(path='leases',
                                       reason='no lease for %s' % vgpu_uuid)
        return updated

    # An mdev someone else made (no lease) that a domain uses: recorded so
    # that a second domain naming it is refused.  Never removed by us.

    def borrower(self, vgpu_uuid: objects.Uuid) -> objects.Uuid | None:
        """The domain UUID that uses the unleased mdev, or None."""
        row = self._db.execute(
            'SELECT domain_uuid FROM borrowed WHERE mdev_uuid = ?',
            (_uuid(vgpu_uuid),)).fetchone()
        return objects.Uuid.parse(row[0]) if row else None

    def borrow(self, vgpu_uuid: objects.Uuid,
               domain_uuid: objects.Uuid) -> None:
        self._db.execute(
            'INSERT OR REPLACE INTO borrowed (mdev_uuid, domain_uuid, '
            'created_at) VALUES (?, ?, ?)',
            (_uuid(vgpu_uuid), _uuid(domain_uuid, 'domain_uuid'), self.now))

    def give_back(self, domain_uuid: objects.Uuid,
                  vgpu_uuids: Iterable[objects.Uuid] | None = None) -> None:
        """Forget what ``domain_uuid`` borrowed (only ``vgpu_uuids`` when
        given)."""
        _uuid(domain_uuid, 'domain_uuid')
        if vgpu_uuids is None:
            self._db.execute('DELETE FROM borrowed WHERE domain_uuid = ?',
                             (domain_uuid,))
            return
        for uuid in vgpu_uuids:
            self._db.execute('DELETE FROM borrowed WHERE domain_uuid = ? '
                             'AND mdev_uuid = ?',
                             (domain_uuid, _uuid(uuid)))

    def borrowed(self) -> dict[objects.Uuid, tuple[objects.Uuid, float]]:
        """``{vgpu_uuid: (domain_uuid, created_at)}`` of every borrowed
        mdev."""
        return {objects.Uuid.parse(u): (objects.Uuid.parse(d), t)
                for u, d, t in self._db.execute(
            'SELECT mdev_uuid, domain_uuid, created_at FROM borrowed')}

    def delete(self, vgpu_uuid: objects.Uuid) -> bool:
        """Drop a lease; True when there was one."""
        cur = self._db.execute('DELETE FROM leases WHERE mdev_uuid = ?',
                               (_uuid(vgpu_uuid),))
        return cur.rowcount == 1


# What a path keeps unquoted in an SQLite URI (RFC 3986's unreserved
# characters and the separator); ``?``, ``#`` and ``%`` would end or
# change it.
_URI_SAFE = frozenset(b'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz'
                      b'0123456789-._~/')


def _uri_path(path: str) -> str:
    """``path`` percent-encoded for a ``file:`` URI (byte for byte, as
    ``urllib.parse.quote`` does, without importing it: the hook imports
    this module on every guest start)."""
    return ''.join(chr(b) if b in _URI_SAFE else '%%%02X' % b
                   for b in os.fsencode(path))


def _add_missing_columns(db: sqlite3.Connection) -> None:
    """A lease file of schema 1 (no ``expires_at``) gains the column; its
    leases keep NULL (no migration reservation)."""
    have = {row[1] for row in db.execute('PRAGMA table_info(leases)')}
    if 'expires_at' not in have:
        db.execute('ALTER TABLE leases ADD COLUMN expires_at REAL')


_MAX_HOLDER_BYTES = 512


def _record_holder(fd: int) -> None:
    """Write this process (PID and command) into the lock file it has
    just locked, so that one waiting for it can name it."""
    try:
        with open('/proc/self/cmdline', 'rb') as f:
            command = f.read(400).replace(b'\0', b' ').strip()
    except OSError:
        command = b'?'
    line = b'%d %s\n' % (os.getpid(), command[:400])
    try:
        # Written over the last holder's line, then cut to its length:
        # never truncated to zero first, which on ext4 (auto_da_alloc)
        # flushes the file at close, milliseconds per transaction.
        os.pwrite(fd, line, 0)
        os.ftruncate(fd, len(line))
    except OSError:
        pass                # naming the holder is a courtesy


def _recorded_holder(fd: int) -> int | None:
    """The PID the lock file records (``_record_holder``), or None.  Only
    a fallback where the kernel does not say who holds the lock
    (``statedir.lock_holders``): a holder stopped before writing its PID
    leaves its predecessor's there."""
    try:
        pid = os.pread(fd, 32, 0).split(b' ', 1)[0]
    except OSError:
        return None
    return int(pid) if pid.isdigit() else None


def _holder(fd: int, path: str) -> str:
    """Who holds the lock, in words, with what to run."""
    pids = statedir.lock_holders(fd)
    return statedir.describe_holder(
        pids[0] if pids else _recorded_holder(fd), path)


# What ``_SCHEMA`` makes (and SQLite for its primary keys): a lease file
# holding anything else is another program's, or was altered (a view, a
# trigger that deletes leases or sleeps under the lock): never used.
_OBJECTS = {('table', 'leases'), ('table', 'borrowed'),
            ('index', 'leases_domain'), ('index', 'leases_parent'),
            ('index', 'sqlite_autoindex_leases_1'),
            ('index', 'sqlite_autoindex_borrowed_1')}
# Columns each table must have (``expires_at`` is added to a schema 1
# file by _add_missing_columns).
_REQUIRED_COLUMNS = {'leases': set(_COLUMNS) - {'expires_at'},
                     'borrowed': {'mdev_uuid', 'domain_uuid', 'created_at'}}


def _move_aside(path: str) -> str:
    return ('move it aside (`mv %s %s.broken`), then run `libvirt-gpu '
            'reconcile --dry-run`' % (path, path))


def _schema_refusal(db: sqlite3.Connection, path: str) -> str | None:
    """Why the SQLite file open as ``db`` is not a lease file this
    libvirt-gpu may use, or None (ours, or new and empty)."""
    # a view, a trigger first: named before the tables they stand on
    objects_ = db.execute('SELECT type, name, tbl_name FROM sqlite_master '
                          'ORDER BY type = \'table\', type, name').fetchall()
    for kind, name, table in objects_:
        if (kind, name) in _OBJECTS and table in _REQUIRED_COLUMNS:
            continue
        if kind == 'table' and name.startswith('sqlite_stat'):
            continue        # ANALYZE's statistics: harmless
        return ('it holds %s %s that libvirt-gpu never makes, so it is '
                'another program\'s file or was altered; %s'
                % ('an index' if kind == 'index' else 'a ' + kind,
                   textutil.escape(str(name)[:80], newline=True),
                   _move_aside(path)))
    for table, required in sorted(_REQUIRED_COLUMNS.items()):
        have = {row[1] for row in db.execute('PRAGMA table_info(%s)'
                                             % table)}
        if not have:
            # ``borrowed`` came after the first lease files: _SCHEMA makes
            # it; a file of other things without ``leases`` is not ours
            if objects_ and table == 'leases':
                return ('it has no table %s, so it is not a lease file of '
                        'libvirt-gpu; %s' % (table, _move_aside(path)))
            continue        # a new, empty file: made below
        missing = sorted(required - have)
        if missing:
            return ('its table %s lacks the column(s) %s, so it is not a '
                    'lease file of libvirt-gpu; %s'
                    % (table, ', '.join(missing), _move_aside(path)))
    return None


def _sqlite_reason(error: sqlite3.Error, path: str) -> str:
    """A SQLite error in words that say what to do."""
    text = str(error)
    if 'file is not a database' in text or 'file is encrypted' in text:
        return ('it is not a SQLite file (garbage, or another program\'s); '
                + _move_aside(path))
    if 'malformed' in text or 'corrupt' in text:
        return 'it is damaged; ' + _move_aside(path)
    return 'SQLite failed on it (%s)' % text[:200]


def _boot_id_text(data: bytes) -> str:
    """A boot id as read, as text that reads back the same once written
    to ``<state_dir>/boot_id``: a byte that is not ASCII (no kernel's id
    has one) as ``\\xNN``, not as U+FFFD, which would be written as three
    bytes and read back as three replacement characters: another boot's
    id at every open."""
    return data.decode('ascii', 'backslashreplace').strip()


class LeaseStore(object):
    """The lease file of one host (``[DEFAULT]/state_dir``)."""

    def __init__(self, state_dir: str | os.PathLike[str],
                 lock_timeout: float = 60.0, boot_id_path: str = BOOT_ID_PATH,
                 sysfs_root: str | os.PathLike[str] | None = None) -> None:
        self.state_dir = os.path.abspath(os.fspath(state_dir))
        # The host the leases belong to (statedir.check_owner); None: any
        # (a reader that does not act on the host, such as a test).
        self.owner = (statedir.owner_text(sysfs_root)
                      if sysfs_root is not None else None)
        self._owner_checked = False
        self.boot_id_path = boot_id_path
        self.db_path = os.path.join(self.state_dir, DB_NAME)
        self.lock_path = os.path.join(self.state_dir, LOCK_NAME)
        self.lock_timeout = lock_timeout
        self._ready = False
        self._db: sqlite3.Connection | None = None
        self._db_pid: int | None = None

    def __repr__(self) -> str:
        return 'LeaseStore(%r)' % self.state_dir

    def _open_dir(self) -> None:
        statedir.ensure_dir(self.state_dir)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self._open_dir()
        try:
            # private (0600), ours, one link, created O_EXCL (statedir)
            fd = statedir.open_file(self.lock_path, os.O_RDWR | os.O_CREAT)
        except exception.StateError:
            raise
        except OSError as e:
            raise exception.StateError(path=self.lock_path,
                                       reason=e.strerror)
        try:
            # bounded; the holder named by the kernel (/proc/locks), so a
            # stopped one is seen at once even before it wrote its PID
            statedir.lock(fd, self.lock_path, timeout=self.lock_timeout,
                          holder=_recorded_holder)
            _record_holder(fd)
            if self.owner is not None and not self._owner_checked:
                statedir.check_owner(self.state_dir, self.owner)
                self._owner_checked = True
            yield
        finally:
            os.close(fd)    # also drops the flock

    def _check_boot(self) -> None:
        """Set the lease file of an earlier boot aside (under the lock).

        ``<state_dir>/boot_id`` holds the kernel's boot id of the boot that
        wrote the leases; when it differs from the current one, every lease
        is void (its mdev is gone) and the file, however it was left by the
        power cut or crash that ended that boot, is renamed to
        ``leases.sqlite3.previous-boot``.
        """
        if self._ready:
            return
        current = self._kernel_boot_id()
        if current is None:
            return          # no boot id (not Linux?): nothing to compare
        marker = os.path.join(self.state_dir, BOOT_ID_NAME)
        recorded = self._recorded_boot_id()
        if recorded == current:
            return
        try:
            if os.path.exists(self.db_path):
                for suffix in ('', '-wal', '-shm'):
                    if os.path.exists(self.db_path + suffix):
                        os.replace(self.db_path + suffix, self.db_path
                                   + '.previous-boot' + suffix)
            fileutil.write_atomic(marker, current + '\n')
        except OSError as e:
            raise exception.StateError(path=self.state_dir,
                                       reason=e.strerror)

    def _kernel_boot_id(self) -> str | None:
        """This boot's id (bounded read of a regular file: a FIFO or a
        device in its place is refused, never waited on nor read to the
        end), or None when there is none."""
        try:
            data = statedir.read_system_file(self.boot_id_path,
                                             _MAX_BOOT_ID_BYTES)
        except exception.StateError:
            raise
        except OSError:
            return None
        if len(data) > _MAX_BOOT_ID_BYTES:
            raise exception.StateError(
                path=self.boot_id_path,
                reason='longer than a boot id (%d bytes or more)'
                       % _MAX_BOOT_ID_BYTES)
        return _boot_id_text(data)

    def _recorded_boot_id(self) -> str | None:
        """The boot id ``<state_dir>/boot_id`` records (a state file:
        ``statedir.read_file``), None when missing; a longer file reads
        as another boot's."""
        marker = os.path.join(self.state_dir, BOOT_ID_NAME)
        try:
            data = statedir.read_file(marker, _MAX_RECORDED_BOOT_ID_BYTES)
        except FileNotFoundError:
            return None
        except exception.StateError:
            raise
        except OSError as e:
            raise exception.StateError(path=marker, reason=e.strerror)
        if len(data) > _MAX_RECORDED_BOOT_ID_BYTES:
            return ''
        return _boot_id_text(data)

    def _connect(self) -> sqlite3.Connection:
        self._check_boot()
        try:
            # Created private before SQLite opens it (its WAL and shm files
            # take the same mode).  Only when missing (O_EXCL): closing any
            # descriptor of a database file would drop the POSIX locks a
            # SQLite connection of this process holds on it.
            os.close(os.open(self.db_path, os.O_RDWR | os.O_CREAT
                             | os.O_EXCL | os.O_CLOEXEC, 0o600))
        except FileExistsError:
            if not self._ready:
                self._check_db_file()
        except OSError as e:
            raise exception.StateError(path=self.db_path, reason=e.strerror)
        try:
            db = sqlite3.connect(self.db_path, timeout=self.lock_timeout,
                                 isolation_level=None)
        except sqlite3.Error as e:
            raise exception.StateError(path=self.db_path,
                                       reason=_sqlite_reason(e, self.db_path))
        try:
            if not self._ready:
                # before anything writes to it: a foreign or altered file
                # is refused, never adopted nor "upgraded"
                reason = _schema_refusal(db, self.db_path)
                if reason is not None:
                    raise exception.StateError(path=self.db_path,
                                               reason=reason)
            # WAL without fsync: a commit is one append to the page cache,
            # which a killed process cannot take back; a half-written one
            # fails its checksum and is rolled back.  Only a power cut could
            # hurt the file, and after a reboot it is set aside unread
            # (_check_boot): mdevs do not survive a reboot, nor do leases.
            db.execute('PRAGMA journal_mode = WAL')
            db.execute('PRAGMA synchronous = OFF')
            if not self._ready:
                version = db.execute('PRAGMA user_version').fetchone()[0]
                if version > SCHEMA_VERSION:
                    raise exception.StateError(
                        path=self.db_path,
                        reason='written by a newer libvirt-gpu (schema %d, '
                               'this one knows %d)'
                               % (version, SCHEMA_VERSION))
                db.executescript(_SCHEMA)
                _add_missing_columns(db)
                db.execute('PRAGMA user_version = %d' % SCHEMA_VERSION)
                self._ready = True
        except sqlite3.Error as e:
            db.close()
            raise exception.StateError(path=self.db_path,
                                       reason=_sqlite_reason(e, self.db_path))
        except BaseException:
            db.close()
            raise
        return db

    def _check_db_file(self) -> None:
        """An existing lease file must be a regular file and not empty:
        SQLite would read an emptied (truncated) file as "no leases" and
        every vGPU it held would be handed out again.  Checked by ``lstat``:
        opening it here and closing that descriptor would drop the POSIX
        locks another connection of this process holds on it."""
        try:
            owner = os.stat(self.state_dir).st_uid
            st = os.lstat(self.db_path)
        except OSError as e:
            raise exception.StateError(path=self.db_path, reason=e.strerror)
        self._check_db_companion(self.db_path, st, owner)
        for suffix in ('-wal', '-shm'):
            try:
                other = os.lstat(self.db_path + suffix)
            except FileNotFoundError:
                continue
            except OSError as e:
                raise exception.StateError(path=self.db_path + suffix,
                                           reason=e.strerror)
            self._check_db_companion(self.db_path + suffix, other, owner)
        if st.st_size < _SQLITE_HEADER_BYTES:
            raise exception.StateError(
                path=self.db_path,
                reason='it is %s (%d bytes), so the leases it held are '
                       'lost; move it aside (`mv %s %s.broken`), then run '
                       '`libvirt-gpu reconcile --dry-run`'
                       % ('empty' if st.st_size == 0 else 'truncated',
                          st.st_size, self.db_path, self.db_path))

    @staticmethod
    def _check_db_companion(path: str, st: os.stat_result,
                            owner: int) -> None:
        """The lease file (or its WAL, its shm) as ``statedir.open_at``
        wants a state file: regular, the directory owner's, one link."""
        reason = filetype.not_regular(st.st_mode)
        if reason is None and st.st_uid != owner:
            reason = ('it is owned by uid %d, not uid %d (the owner of its '
                      'directory): another user\'s file is not trusted'
                      % (st.st_uid, owner))
        if reason is None and st.st_nlink != 1:
            reason = ('it has %d hard links: writing it would write a '
                      'file elsewhere' % st.st_nlink)
        if reason is not None:
            raise exception.StateError(path=path, reason='%s; remove it'
                                       % reason)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Transaction]:
        """``with store.transaction() as txn:`` under the lock; commits on
        success, rolls back on any exception (and on SIGKILL, by SQLite's
        journal)."""
        with self._locked():
            # One connection per store and process, opened on first use.
            if self._db is None or self._db_pid != os.getpid():
                self._db = self._connect()
                self._db_pid = os.getpid()
            db = self._db
            try:
                db.execute('BEGIN IMMEDIATE')
                txn = Transaction(db)
                try:
                    yield txn
                except BaseException:
                    db.execute('ROLLBACK')
                    raise
                db.execute('COMMIT')
            except sqlite3.Error as e:
                self.close()
                raise exception.StateError(
                    path=self.db_path, reason=_sqlite_reason(e, self.db_path))

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[Transaction]:
        """``with store.snapshot() as txn:`` reads the leases as they are
        now without the lock: no flock, a read-only SQLite connection
        whose read transaction (WAL) never holds up a writer.  Writing
        through it fails.  For readers that must never block a guest
        start (``libvirt-gpu exporter``, ``reconcile --dry-run``).  No
        lease file, or one of an earlier boot (set aside by the next
        writer), reads as no leases."""
        if self._current_boot():
            try:
                db = sqlite3.connect('file:%s?mode=ro' % _uri_path(
                    self.db_path), uri=True, timeout=self.lock_timeout,
                    isolation_level=None)
            except sqlite3.Error as e:
                raise exception.StateError(
                    path=self.db_path, reason=_sqlite_reason(e, self.db_path))
            try:
                reason = _schema_refusal(db, self.db_path)
            except sqlite3.Error as e:
                reason = _sqlite_reason(e, self.db_path)
            if reason is not None:
                db.close()
                raise exception.StateError(path=self.db_path, reason=reason)
        else:
            db = sqlite3.connect(':memory:', isolation_level=None)
            db.executescript(_SCHEMA)
        try:
            db.execute('BEGIN')
            yield Transaction(db)
            db.execute('ROLLBACK')
        except sqlite3.Error as e:
            raise exception.StateError(path=self.db_path,
                                       reason=_sqlite_reason(e, self.db_path))
        finally:
            db.close()

    def _current_boot(self) -> bool:
        """Whether a lease file exists and was written in this boot; what
        stands in its place and is no regular file (a directory, a link,
        a FIFO) is refused, not read as "no leases"."""
        try:
            st = os.lstat(self.db_path)
        except FileNotFoundError:
            return False
        except OSError as e:
            raise exception.StateError(path=self.db_path, reason=e.strerror)
        reason = filetype.not_regular(st.st_mode)
        if reason is not None:
            raise exception.StateError(path=self.db_path,
                                       reason='%s; remove it' % reason)
        current = self._kernel_boot_id()
        if current is None:
            return True         # no boot id (not Linux?): nothing to compare
        try:
            return self._recorded_boot_id() == current
        except exception.StateError:
            raise
        except OSError:
            return False

    def close(self) -> None:
        if self._db is not None:
            try:
                self._db.close()
            except sqlite3.Error:
                pass        # closing a broken connection: nothing to keep
            self._db = None

    def leases(self) -> list[Lease]:
        """Every lease, read in one (locked) transaction."""
        with self.transaction() as txn:
            return txn.all()
