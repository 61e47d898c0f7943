"""The lease file: behaviours no other test pinned (issue 30, section 6).
The schema version is written (so a later release knows what it reads),
and a file cut below SQLite's 100-byte header gets the explicit message
(SQLite alone would say "file is not a database", or read it as empty)."""

import os
import sqlite3

import pytest

from libvirt_gpu import objects
from libvirt_gpu import exception
from libvirt_gpu.store import state

U1 = objects.Uuid.parse('4b20d080-1b54-4048-85b3-a6a62d165c01')
DOM = objects.Uuid.parse('c7a5fdbd-cdaf-9455-926a-d65c16db1809')
A = objects.PciAddress.parse('0000:3b:00.0')


def _user_version(path):
    db = sqlite3.connect(path)
    try:
        return db.execute('PRAGMA user_version').fetchone()[0]
    finally:
        db.close()


def _written(tmp_path):
    store = state.LeaseStore(tmp_path / 'state', lock_timeout=5)
    with store.transaction() as txn:
        txn.add(U1, DOM, A, objects.TypeId.parse('nvidia-223'))
    store.close()
    for suffix in ('-wal', '-shm'):
        if os.path.exists(store.db_path + suffix):
            os.unlink(store.db_path + suffix)
    return store


def test_a_new_lease_file_records_its_schema_version(tmp_path):
    """Broken by leaving out ``PRAGMA user_version = SCHEMA_VERSION``:
    the file then says version 0, and no later release can tell which
    columns it has."""
    store = _written(tmp_path)
    assert _user_version(store.db_path) == state.SCHEMA_VERSION
    assert [lease.vgpu_uuid for lease in
            state.LeaseStore(store.state_dir).leases()] == [U1]


def test_an_older_lease_file_is_raised_to_this_schema_version(tmp_path):
    store = _written(tmp_path)
    db = sqlite3.connect(store.db_path)
    db.execute('PRAGMA user_version = 1')
    db.commit()
    db.close()
    assert state.LeaseStore(store.state_dir).leases()
    assert _user_version(store.db_path) == state.SCHEMA_VERSION


@pytest.mark.parametrize('size', [1, 16, 99])
def test_a_file_cut_below_the_sqlite_header_is_named(tmp_path, size):
    """Broken by refusing only an empty file: then SQLite's own words
    (or no leases at all) instead of what happened and what to do."""
    store = _written(tmp_path)
    os.truncate(store.db_path, size)
    with pytest.raises(exception.StateError) as e:
        state.LeaseStore(store.state_dir).leases()
    said = str(e.value)
    assert 'it is truncated (%d bytes), so the leases it held are lost' \
        % size in said
    assert 'mv %s %s.broken' % (store.db_path, store.db_path) in said
    assert 'libvirt-gpu reconcile --dry-run' in said
