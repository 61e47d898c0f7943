"""A state file of records: the one way the host's JSON records are kept.

A record file is one JSON document in the state directory::

    {"version": 1, "<key>": {"<id>": {<entry>}, ...}}

read whole and bounded (``max_bytes``), changed under an exclusive
``flock`` of its own lock file, the wait bounded and its holder named,
and written private (0600) to a temporary file renamed over it, so a
reader sees the old or the new file, never half of one: every file is
opened through ``statedir`` (the state directory only root steers, no
link followed, no FIFO waited on).  A subclass names its file (``name``,
``lock_name``, ``version``, ``key``, ``max_bytes``, ``noun``) and how an
entry is read (``load_entry``) and written (``dump_entry``); ``damaged``
says how a file that cannot be read is refused.

The host's record files: ``store/carved.py`` (``nova-carved.json``, the
VFs carved for Nova) and ``store/vendor_vgpus.py`` (``nvidia-vgpu.json``,
the NVIDIA vendor interface's vGPUs).
"""

from __future__ import annotations

import contextlib
import os

from libvirt_gpu import exception
from libvirt_gpu.store import statedir

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from contextlib import AbstractContextManager
    from typing import Generic, TypeVar

    from _typeshed import SupportsRichComparison

    _Id = TypeVar('_Id', bound=SupportsRichComparison)
    _Entry = TypeVar('_Entry')
else:
    class Generic(object):
        """``typing.Generic`` for the checker alone: at run time
        ``RecordFile[Id, Entry]`` is ``RecordFile`` (the hook reads the
        carve record on every guest start and never imports ``typing``)."""

        def __class_getitem__(cls, params):
            return cls

    _Id = _Entry = None

# what a malformed entry raises while it is read (``load_entry``)
ENTRY_ERRORS = (exception.InvalidInput, KeyError, TypeError, AttributeError)


class RecordFile(Generic[_Id, _Entry]):
    """``<state_dir>/<name>``, its records ``{id: entry}`` (see the module
    doc); a subclass names the file and its entries' types
    (``RecordFile[PciAddress, CarvedVf]``)."""

    name: str                   # 'nova-carved.json'
    lock_name: str              # 'nova-carved.lock'
    version = 1
    key: str                    # the entries' key in the document
    max_bytes = 1024 * 1024
    noun = 'record'             # in "not a version 1 record"

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        if not state_dir or not os.path.isabs(os.fspath(state_dir)):
            raise exception.ConfigError(
                reason='state_dir %r must be an absolute path' % (state_dir,))
        self.state_dir = os.fspath(state_dir)
        self.path = os.path.join(self.state_dir, self.name)
        self.lock_path = os.path.join(self.state_dir, self.lock_name)

    # -- a subclass's part --------------------------------------------------

    def load_entry(self, key: str, value: object) -> tuple[_Id, _Entry]:
        """``(id, entry)`` of the document's entry ``key: value``; one of
        ``ENTRY_ERRORS`` when it is not one."""
        raise NotImplementedError

    def dump_entry(self, entry: _Entry) -> object:
        """The JSON value of ``entry`` (its ``to_json()``)."""
        to_json: Callable[[], object] = getattr(entry, 'to_json')
        return to_json()

    def damaged(self, reason: str,
                error: exception.StateError | None = None
                ) -> exception.StateError:
        """What is raised for a file that cannot be read (``reason``; the
        ``statedir`` error, when it was one): that error, else a
        StateError naming the file."""
        if error is not None:
            return error
        return exception.StateError(path=self.path, reason=reason)

    # -- reading and writing ------------------------------------------------

    def load(self) -> dict[_Id, _Entry]:
        """``{id: entry}`` of the file, read without its lock (the file is
        only ever renamed into place); empty without a file (nothing is
        created).  ``damaged`` when it cannot be read, is too large, is
        not JSON or not a version ``version`` document, or holds an entry
        that is not one."""
        try:
            data = statedir.read_json(self.path, self.max_bytes)
        except exception.StateError as e:
            raise self.damaged(e.kwargs.get('reason', str(e)), e)
        if data is None:
            return {}
        if not isinstance(data, dict) or data.get('version') != \
                self.version or not isinstance(data.get(self.key), dict):
            raise self.damaged('not a version %d %s'
                               % (self.version, self.noun))
        entries: dict[_Id, _Entry] = {}
        for key, value in data[self.key].items():
            try:
                ident, entry = self.load_entry(key, value)
            except ENTRY_ERRORS as e:
                raise self.damaged('entry %r is invalid: %s' % (key, e))
            entries[ident] = entry
        return entries

    def save(self, entries: dict[_Id, _Entry]) -> None:
        """Write ``entries`` (``{id: entry}``), sorted by id."""
        statedir.write_json(self.path, {
            'version': self.version,
            self.key: {str(ident): self.dump_entry(entry)
                       for ident, entry in sorted(entries.items())}})

    def locked(self, timeout: float = 60.0
               ) -> AbstractContextManager[dict[_Id, _Entry]]:
        """``{id: entry}`` to read and change under the file's lock (the
        wait bounded by ``timeout``); saved on exit when changed."""
        return statedir.locked_entries(self.state_dir, self.lock_path,
                                       self.load, self.save, timeout=timeout)

    @contextlib.contextmanager
    def lock(self, timeout: float = statedir.LOCK_TIMEOUT) -> Iterator[None]:
        """The file's lock alone, held for the ``with`` block (what moves
        the file aside takes)."""
        statedir.ensure_dir(self.state_dir)
        fd = statedir.open_file(self.lock_path, os.O_RDWR | os.O_CREAT)
        try:
            statedir.lock(fd, self.lock_path, timeout=timeout)
            yield
        finally:
            os.close(fd)
