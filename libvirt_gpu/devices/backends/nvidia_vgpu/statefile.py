"""The vendor interface's state file: which of our vGPUs lives on which VF.

A vGPU of the vendor interface has no UUID of its own: ours (the one in
the domain's ``<gpu:vgpu uuid=...>``) is kept with the VF it lives on in
``<state_dir>/nvidia-vgpu.json`` (see the package's doc for its form),
under an exclusive ``flock`` of ``<state_dir>/nvidia-vgpu.lock``.  Its
values are parsed here, where they enter the program.
"""

from __future__ import annotations

import os

from libvirt_gpu.devices.backends import base
from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.util import records
from libvirt_gpu.store import statedir


STATE_NAME = 'nvidia-vgpu.json'
LOCK_NAME = 'nvidia-vgpu.lock'
STATE_VERSION = 1
STARTS = ('auto', 'manual')
_MAX_STATE_BYTES = 4 * 1024 * 1024


@records.record
class VendorVgpu:
    """One of our vGPUs on the vendor interface (a state file entry)."""

    uuid: str
    vf: objects.PciAddress
    gpu: objects.PciAddress | None
    type_id: str
    start: str | None = None       # None: transient
    params: str | None = None      # vgpu_params to write
    # where the driver put it, read back once made (MIG-backed: its GPU
    # instance; mixed-size: its placement); None: not answered
    gi_id: int | None = None
    placement: int | None = None

    @property
    def persistent(self):
        return self.start is not None

    def device(self):
        return base.VgpuDevice(uuid=self.uuid, parent=self.vf,
                               type_id=self.type_id)

    def to_json(self):
        found = {'vf': str(self.vf),
                 'gpu': str(self.gpu) if self.gpu else None,
                 'type_id': self.type_id, 'start': self.start,
                 'params': self.params}
        for name in ('gi_id', 'placement'):
            if getattr(self, name) is not None:
                found[name] = getattr(self, name)
        return found


class VendorState(object):
    """``<state_dir>/nvidia-vgpu.json`` under an exclusive ``flock`` of
    ``<state_dir>/nvidia-vgpu.lock``; written to a temporary file and
    renamed, so a crash leaves the old or the new file, never half of one.
    """

    def __init__(self, state_dir):
        if not state_dir or not os.path.isabs(os.fspath(state_dir)):
            raise exception.ConfigError(
                reason='state_dir %r must be an absolute path' % (state_dir,))
        self.state_dir = os.fspath(state_dir)
        self.path = os.path.join(self.state_dir, STATE_NAME)
        self.lock_path = os.path.join(self.state_dir, LOCK_NAME)

    def _error(self, reason):
        return exception.StateError(path=self.path, reason=reason)

    def locked(self):
        """``{uuid: VendorVgpu}`` to read and change; saved on exit."""
        # the state directory only root steers; no link, no FIFO; the
        # wait bounded, its holder named (a stopped holder at once)
        return statedir.locked_entries(self.state_dir, self.lock_path,
                                       self._load, self._save)

    def read(self):
        """A snapshot, read under the lock ({} without creating anything
        when there is no state file yet)."""
        if not os.path.exists(self.path):
            return {}
        with self.locked() as entries:
            return dict(entries)

    def _load(self):
        data = statedir.read_json(self.path, _MAX_STATE_BYTES)
        if data is None:
            return {}
        if not isinstance(data, dict) or data.get('version') != \
                STATE_VERSION or not isinstance(data.get('vgpus'), dict):
            raise self._error('not a version %d state file' % STATE_VERSION)
        entries = {}
        for uuid, entry in data['vgpus'].items():
            try:
                uuid = objects.Uuid.parse(uuid)
                start = entry.get('start')
                if start is not None and start not in STARTS:
                    raise exception.InvalidInput(reason='start %r' % start)
                params = entry.get('params')
                if params is not None and not isinstance(params, str):
                    raise exception.InvalidInput(reason='params')
                where = [entry.get(name) for name in ('gi_id', 'placement')]
                if any(v is not None and (type(v) is not int or v < 0)
                       for v in where):
                    raise exception.InvalidInput(reason='gi_id or placement')
                entries[uuid] = VendorVgpu(
                    uuid=uuid, vf=objects.PciAddress.parse(entry['vf']),
                    gpu=(objects.PciAddress.parse(entry['gpu'])
                         if entry.get('gpu') else None),
                    type_id=objects.TypeId.parse(entry['type_id']),
                    start=start, params=params, gi_id=where[0],
                    placement=where[1])
            except (exception.InvalidInput, KeyError, TypeError,
                    AttributeError) as e:
                raise self._error('entry %r is invalid: %s' % (uuid, e))
        return entries

    def _save(self, entries):
        data = {'version': STATE_VERSION,
                'vgpus': {u: e.to_json() for u, e in sorted(entries.items())}}
        statedir.write_json(self.path, data)
