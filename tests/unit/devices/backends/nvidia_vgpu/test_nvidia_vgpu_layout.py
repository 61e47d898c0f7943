"""Late binding on a MIG-backed or mixed-size GPU (the hook's
``prepare``): the type is written to a free VF, the driver picks the GPU
instance or placement, and the vendor kind reads both back into its
record of the vGPU (``gi_id``, ``placement``)."""

import json
import os

import pytest

from libvirt_gpu.devices.backends.nvidia_vgpu import names
from libvirt_gpu import exception
from tests.doubles.l40s_vendor import VF_FREE
from tests.doubles.l40s_vendor import vgpu


def _vendor_file(host, vf, name, text):
    path = os.path.join(host.root, 'bus/pci/devices', str(vf),
                        names.VENDOR_DIR, name)
    with open(path, 'w') as f:
        f.write(text)


def _state(fast_tmp):
    with open(os.path.join(fast_tmp, 'state', 'nvidia-vgpu.json')) as f:
        return json.load(f)['vgpus']


def test_prepare_records_where_the_driver_put_the_vgpu(backend, host,
                                                       fast_tmp):
    # what the driver shows once it has made the vGPU on the VF
    _vendor_file(host, VF_FREE, names.GPU_INSTANCE_ID, '3\n')
    _vendor_file(host, VF_FREE, names.PLACEMENT_ID, '8\n')
    device = vgpu()
    assert backend.prepare(device) is True
    entry = _state(fast_tmp)[device.uuid]
    assert entry['gi_id'] == 3 and entry['placement'] == 8
    assert backend.state.read()[device.uuid].gi_id == 3


def test_a_driver_without_the_files_records_nothing_more(backend, fast_tmp):
    device = vgpu()
    backend.prepare(device)
    entry = _state(fast_tmp)[device.uuid]
    assert 'gi_id' not in entry and 'placement' not in entry


def test_a_garbage_id_is_a_typed_error(backend, host):
    _vendor_file(host, VF_FREE, names.GPU_INSTANCE_ID, 'N/A\n')
    with pytest.raises(exception.SysfsReadError, match=names.GPU_INSTANCE_ID):
        backend.files.where(VF_FREE)


def test_a_state_file_with_a_bad_id_is_refused(backend, fast_tmp):
    device = vgpu()
    backend.prepare(device)
    path = os.path.join(fast_tmp, 'state', 'nvidia-vgpu.json')
    with open(path) as f:
        data = json.load(f)
    data['vgpus'][device.uuid]['gi_id'] = -1
    with open(path, 'w') as f:
        json.dump(data, f)
    with pytest.raises(exception.StateError, match='gi_id'):
        backend.state.read()
