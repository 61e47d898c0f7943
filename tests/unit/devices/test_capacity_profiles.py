"""Placement inventory of the simulated A100, L40S and A16 hosts equals the
capacity NVIDIA publishes per physical GPU.

Sources of the expected numbers (maximum vGPUs per GPU):
* A100 PCIe 40GB (10de:20f1), time-sliced C-series, NVIDIA vGPU user guide
  "Virtual GPU Types for Supported GPUs": A100-4C 10, A100-5C 8, A100-8C 5,
  A100-10C 4, A100-20C 2, A100-40C 1 (40 GB / the type's framebuffer); the
  same numbers are the max_instance of the types' descriptions.
* A16 (10de:25b6), per GPU of the board (16 GB each; 4 GPUs per board, so a
  board holds 4x): 1B/1Q/1A 16, 2B/2Q/2A 8, 4Q/4A/4C 4, 8Q/8A/8C 2,
  16Q/16A/16C 1.
* L40S (10de:26b9, 48 GB), equal-size mode: 1B/1Q/1A 32 (the per-GPU cap;
  the vGPU 16 description of L40S-1B reads max_instance=32), 2B/2Q/2A 24,
  3B/3Q/3A 16, 4Q/4A 12, 6Q/6A 8, 8Q/8A 6, 12Q/12A 4, 16Q/16A 3, 24Q/24A 2,
  48Q/48A 1.
Never the number of VFs (16 on an A100, 32 on an L40S): that is the
over-report this project exists to avoid.
"""

import json
import os
import shutil
import tempfile

import pytest

from libvirt_gpu.devices import discovery
from libvirt_gpu import objects
from libvirt_gpu import simulator
from libvirt_gpu.devices import sysfs as sysfs_mod
from libvirt_gpu.openstack.placement import model
from libvirt_gpu.simulator import loading
from tests.doubles import kinds

A100 = {'nvidia-468': 10, 'nvidia-469': 8, 'nvidia-470': 5,
        'nvidia-471': 4, 'nvidia-472': 2, 'nvidia-473': 1}
A16 = {'nvidia-709': 16, 'nvidia-710': 8, 'nvidia-711': 16, 'nvidia-712': 8,
       'nvidia-713': 4, 'nvidia-714': 2, 'nvidia-715': 1, 'nvidia-716': 16,
       'nvidia-717': 8, 'nvidia-718': 4, 'nvidia-719': 2, 'nvidia-720': 1,
       'nvidia-721': 4, 'nvidia-722': 2, 'nvidia-723': 1}
L40S = {'nvidia-1145': 32, 'nvidia-1146': 24, 'nvidia-2164': 16,
        'nvidia-1147': 32, 'nvidia-1148': 24, 'nvidia-1149': 16,
        'nvidia-1150': 12, 'nvidia-1151': 8, 'nvidia-1152': 6,
        'nvidia-1153': 4, 'nvidia-1154': 3, 'nvidia-1155': 2,
        'nvidia-1156': 1, 'nvidia-1157': 32, 'nvidia-1158': 24,
        'nvidia-1159': 16, 'nvidia-1160': 12, 'nvidia-1161': 8,
        'nvidia-1162': 6, 'nvidia-1163': 4, 'nvidia-1164': 3,
        'nvidia-1165': 2, 'nvidia-1166': 1}
EXPECTED = {'a100': A100, 'a16': A16, 'l40s': L40S}
GPUS = {'a100': 2, 'a16': 4, 'l40s': 2}


@pytest.fixture(scope='module')
def fast_dir():
    # not /dev/shm: a state directory below a directory anyone can write
    # (sticky) is refused (statedir.check_dir)
    path = tempfile.mkdtemp(prefix='lgpu-cap-')
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _empty(name):
    """The bundled profile with every VF enabled and no vGPU anywhere."""
    with open(os.path.join(loading.profile_dir(), name + '.json')) as f:
        data = json.load(f)
    for dev in data['devices']:
        dev.pop('mdevs', None)
        dev.pop('held_type', None)
        dev.pop('sriov_numvfs', None)
    return loading.profile_from_dict(data, source=name + '-empty')


def _discover(profile, root):
    simulator.write_sysfs(profile, root)
    return discovery.from_sysfs(sysfs_mod.Sysfs(root),
                                kinds=kinds.registered()).gpus


@pytest.fixture(scope='module')
def empty_hosts(fast_dir):
    return {name: _discover(_empty(name), os.path.join(fast_dir, name))
            for name in EXPECTED}


def _inventory(gpus, type_id, max_instances=None):
    pfs = [g for g in gpus if not g.is_vf]
    enabled = {g.address: objects.EnabledType(type_id,
                                              max_instances=max_instances)
               for g in pfs}
    tree = model.build_tree('h', gpus, enabled)
    return {p.name: p.inventories_api()['VGPU']['total']
            for p in tree.children}


@pytest.mark.parametrize('name,type_id,per_gpu', [
    (name, type_id, count) for name, table in sorted(EXPECTED.items())
    for type_id, count in sorted(table.items())])
def test_empty_gpu_inventory_is_nvidias_maximum(empty_hosts, name, type_id,
                                                per_gpu):
    totals = _inventory(empty_hosts[name], type_id)
    # one provider per physical GPU (never per VF), each at the maximum
    assert len(totals) == GPUS[name]
    assert set(totals.values()) == {per_gpu}


def test_board_total_of_an_a16(empty_hosts):
    # NVIDIA: A16-1B, 64 per board (16 per GPU x 4 GPUs)
    assert sum(_inventory(empty_hosts['a16'], 'nvidia-709').values()) == 64


def test_max_instances_setting_lowers_never_raises(empty_hosts):
    gpus = empty_hosts['a100']
    assert set(_inventory(gpus, 'nvidia-472', 1).values()) == {1}
    assert set(_inventory(gpus, 'nvidia-472', 50).values()) == {2}
    assert set(_inventory(empty_hosts['l40s'], 'nvidia-1145', 4).values()) \
        == {4}


@pytest.fixture(scope='module')
def bundled(fast_dir):
    return {name: _discover(simulator.load_profile(name),
                            os.path.join(fast_dir, 'bundled-' + name))
            for name in EXPECTED}


def test_bundled_a100(bundled):
    # 0000:41:00.0 holds one A100-20C on a VF: 2 in all (1 used, 1 free);
    # 0000:c1:00.0 has no VFs enabled yet: no capacity, no provider (never
    # an inventory of total 0).
    assert _inventory(bundled['a100'], 'nvidia-472') == {
        'h_0000:41:00.0': 2}
    # another type does not fit next to the A100-20C (one type per GPU)
    assert _inventory(bundled['a100'], 'nvidia-468') == {}


def test_bundled_l40s(bundled):
    # two L40S-1B exist on 0000:3d:00.0: still 32 in all on each GPU
    assert _inventory(bundled['l40s'], 'nvidia-1145') == {
        'h_0000:3d:00.0': 32, 'h_0000:bd:00.0': 32}
    # a 1 GB type of another series shares the GPU (equal-size mode), in
    # the 30 slots the two L40S-1B leave ...
    assert _inventory(bundled['l40s'], 'nvidia-1147')[
        'h_0000:3d:00.0'] == 30
    # ... a 4 GB one does not: only the empty GPU offers it (12)
    assert _inventory(bundled['l40s'], 'nvidia-1150') == {
        'h_0000:bd:00.0': 12}


def test_bundled_a16(bundled):
    # the first GPU holds two A16-2Q: 8 in all, like its three siblings
    assert _inventory(bundled['a16'], 'nvidia-712') == {
        'h_0000:23:00.0': 8, 'h_0000:24:00.0': 8,
        'h_0000:25:00.0': 8, 'h_0000:26:00.0': 8}
    assert 'h_0000:23:00.0' not in _inventory(bundled['a16'],
                                              'nvidia-709')
