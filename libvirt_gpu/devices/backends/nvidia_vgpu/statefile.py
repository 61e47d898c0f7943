"""The vendor interface's state file: which of our vGPUs lives on which VF.

A vGPU of the vendor interface has no UUID of its own: ours (the one in
the domain's ``<gpu:vgpu uuid=...>``) is kept with the VF it lives on in
``<state_dir>/nvidia-vgpu.json`` (see the package's doc for its form).
The file is the store's (``store.vendor_vgpus.VendorStateFile``, a
``store.recordfile.RecordFile``: versioned, under an exclusive ``flock``,
read bounded, private); its entries (``VendorVgpu``) are this kind's,
parsed here, where they enter the program.
"""

from __future__ import annotations

from libvirt_gpu.devices.backends import base
from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.util import records
from libvirt_gpu.store import vendor_vgpus
# the file's names, as the package has always exported them
from libvirt_gpu.store.vendor_vgpus import (  # noqa: F401
    LOCK_NAME as LOCK_NAME, STATE_NAME as STATE_NAME,
    STATE_VERSION as STATE_VERSION)


STARTS = ('auto', 'manual')


@records.record
class VendorVgpu:
    """One of our vGPUs on the vendor interface (a state file entry)."""

    uuid: objects.Uuid
    vf: objects.PciAddress
    gpu: objects.PciAddress | None
    type_id: objects.TypeId
    start: str | None = None       # None: transient
    params: str | None = None      # vgpu_params to write
    # where the driver put it, read back once made (MIG-backed: its GPU
    # instance; mixed-size: its placement); None: not answered
    gi_id: int | None = None
    placement: int | None = None

    @property
    def persistent(self) -> bool:
        return self.start is not None

    def device(self) -> base.VgpuDevice:
        return base.VgpuDevice(uuid=self.uuid, parent=self.vf,
                               type_id=self.type_id)

    def to_json(self) -> dict[str, object]:
        found: dict[str, object] = {
            'vf': str(self.vf), 'gpu': str(self.gpu) if self.gpu else None,
            'type_id': self.type_id, 'start': self.start,
            'params': self.params}
        for name in ('gi_id', 'placement'):
            if getattr(self, name) is not None:
                found[name] = getattr(self, name)
        return found


class VendorState(vendor_vgpus.VendorStateFile[VendorVgpu]):
    """``<state_dir>/nvidia-vgpu.json``: ``{uuid: VendorVgpu}`` (``locked``
    to change them, ``read`` for a snapshot)."""

    def load_entry(self, key: str,
                   entry: object) -> tuple[objects.Uuid, VendorVgpu]:
        if not isinstance(entry, dict):
            raise exception.InvalidInput(reason='not a JSON object')
        uuid = objects.Uuid.parse(key)
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
        return uuid, VendorVgpu(
            uuid=uuid, vf=objects.PciAddress.parse(entry['vf']),
            gpu=(objects.PciAddress.parse(entry['gpu'])
                 if entry.get('gpu') else None),
            type_id=objects.TypeId.parse(entry['type_id']),
            start=start, params=params, gi_id=where[0],
            placement=where[1])
