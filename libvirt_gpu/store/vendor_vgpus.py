"""The NVIDIA vendor interface's state file, ``<state_dir>/nvidia-vgpu.json``:
which of our vGPUs lives on which VF (``VendorState``, a ``recordfile.
RecordFile``)::

    {"version": 1, "vgpus": {"<uuid>": {"vf": "0000:41:00.4",
        "gpu": "0000:41:00.0", "type_id": "nvidia-1153", "start": "auto",
        "params": null, "gi_id": 1, "placement": 0}}}

changed under an exclusive ``flock`` of ``<state_dir>/nvidia-vgpu.lock``.
Its entries (``VendorVgpu``) are the kind's
(``devices.backends.nvidia_vgpu.statefile``: it names how one is read).
"""

from __future__ import annotations

import os

from libvirt_gpu import objects
from libvirt_gpu.store import recordfile

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import TypeVar

    # the kind's entry (``VendorVgpu``: the kind names how one is read)
    _Vgpu = TypeVar('_Vgpu')
else:
    _Vgpu = None

STATE_NAME = 'nvidia-vgpu.json'
LOCK_NAME = 'nvidia-vgpu.lock'
STATE_VERSION = 1


class VendorStateFile(recordfile.RecordFile[objects.Uuid, _Vgpu]):
    """``<state_dir>/nvidia-vgpu.json`` under an exclusive ``flock`` of
    ``<state_dir>/nvidia-vgpu.lock``: ``{uuid: entry}``, read under the
    lock."""

    name = STATE_NAME
    lock_name = LOCK_NAME
    version = STATE_VERSION
    key = 'vgpus'
    max_bytes = 4 * 1024 * 1024
    noun = 'state file'

    def read(self) -> dict[objects.Uuid, _Vgpu]:
        """A snapshot, read under the lock ({} without creating anything
        when there is no state file yet)."""
        if not os.path.exists(self.path):
            return {}
        with self.locked() as entries:
            return dict(entries)
