"""The record of the VFs ``libvirt-gpu restore`` carved for Nova:
``<state_dir>/nova-carved.json`` (``CarveRecord``, a ``recordfile.
RecordFile``)::

    {"version": 1, "vfs": {"0000:bd:00.4": {
        "gpu": "0000:bd:00.0", "type_id": "nvidia-1153",
        "type_name": "NVIDIA L40S-12Q", "carving": "l40s_12q"}}}

What the record means for the host (which GPUs and VFs are Nova's) is
``devices.carving``'s (``on_host``); a record that cannot be read is a
``DamagedRecord`` whose message says to run ``restore``, which moves it
aside (``CarveRecord.set_aside``) and rebuilds it.
"""

from __future__ import annotations

import os

from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.util import records
from libvirt_gpu.store import recordfile

RECORD_NAME = 'nova-carved.json'
LOCK_NAME = 'nova-carved.lock'
RECORD_VERSION = 1
REMEDY = ('run `libvirt-gpu restore`: it moves the file aside and '
          'rebuilds it from the configuration')


class DamagedRecord(exception.StateError):
    """The record cannot be read (``kwargs['damage']``: why); its message
    says what to do (``REMEDY``)."""


@records.record
class CarvedVf:
    """One VF ``restore`` carved (an entry of the record)."""

    vf: objects.PciAddress
    gpu: objects.PciAddress
    type_id: objects.TypeId
    carving: str
    type_name: str | None = None

    def to_json(self) -> dict[str, str | None]:
        return {'gpu': str(self.gpu), 'type_id': str(self.type_id),
                'type_name': self.type_name, 'carving': self.carving}


class CarveRecord(recordfile.RecordFile[objects.PciAddress, CarvedVf]):
    """``<state_dir>/nova-carved.json``: ``{vf: CarvedVf}``, the VFs
    ``restore`` carved.  Read without its lock (the hook reads it on
    every guest start, and nothing is created), changed under an
    exclusive ``flock`` of ``nova-carved.lock``."""

    name = RECORD_NAME
    lock_name = LOCK_NAME
    version = RECORD_VERSION
    key = 'vfs'
    max_bytes = 1024 * 1024

    def damaged(self, reason: str,
                error: exception.StateError | None = None
                ) -> DamagedRecord:
        return DamagedRecord(path=self.path, damage=reason,
                             reason='%s; %s' % (reason, REMEDY))

    def load_entry(self, key: str, value: object
                   ) -> tuple[objects.PciAddress, CarvedVf]:
        if not isinstance(value, dict):
            raise TypeError('not an object')
        entry: dict[str, object] = value
        vf = objects.PciAddress.parse(key)
        carving = entry['carving']
        type_name = entry.get('type_name')
        if not isinstance(carving, str) or not isinstance(
                type_name, (str, type(None))):
            raise TypeError('carving or type_name')
        return vf, CarvedVf(
            vf=vf, gpu=objects.PciAddress.parse(entry['gpu']),
            type_id=objects.TypeId.parse(entry['type_id']),
            carving=carving, type_name=type_name)

    def read(self) -> dict[objects.PciAddress, CarvedVf]:
        """``{vf: CarvedVf}``; empty without a record.  DamagedRecord,
        saying what to do, when it cannot be read or is not a record."""
        return self.load()

    def set_aside(self, now: float | None = None) -> str | None:
        """Rename a record that cannot be read to
        ``nova-carved.json.damaged-<UTC time>`` (under the record's lock:
        no ``restore`` writes it meanwhile); returns the new path, or None
        when it reads now (another run rebuilt it).  OSError when it
        cannot be renamed."""
        import time
        stamp = time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(now))
        aside = '%s.damaged-%s' % (self.path, stamp)
        with self.lock():
            try:
                self.read()
                return None
            except DamagedRecord:
                pass
            n = 1
            while os.path.lexists(aside):
                n += 1
                aside = '%s.damaged-%s.%d' % (self.path, stamp, n)
            os.rename(self.path, aside)
            return aside
