"""One capacity rule: what Placement is told a GPU holds and what the
allocator lets it hold both come from ``libvirt_gpu.devices.capacity``, on
every simulated profile (``libvirt-gpu simulate --list``)."""

import os
import shutil
import tempfile

import pytest

from libvirt_gpu.devices import capacity
from libvirt_gpu.devices import discovery
from libvirt_gpu import environment
from libvirt_gpu import objects
from libvirt_gpu import simulator
from libvirt_gpu.devices import sysfs as sysfs_mod
from libvirt_gpu.openstack.placement import model
from libvirt_gpu.simulator import loading
from tests.doubles import kinds

HOSTNAME = 'cn1'


@pytest.fixture(scope='module')
def hosts():
    """``{profile: (Environment, gpus)}`` of every bundled profile, written
    to a plain directory (no leases, no vendor state)."""
    # not /dev/shm: a state directory below a directory anyone can write
    # (sticky) is refused (statedir.check_dir)
    tmp = tempfile.mkdtemp(prefix='lgpu-capacity-')
    found = {}
    for name in loading.list_profiles():
        root = os.path.join(tmp, name, 'sys')
        simulator.write_sysfs(simulator.load_profile(name), root)
        sysfs = sysfs_mod.Sysfs(root)
        env = environment.Environment(os.path.join(tmp, name, 'state'),
                                      sysfs=sysfs, enabled={})
        found[name] = (env, discovery.from_sysfs(
            sysfs, kinds=kinds.registered()).gpus)
    yield found
    shutil.rmtree(tmp, ignore_errors=True)


def _cases(gpus):
    """(physical GPU, EnabledType) for every type each GPU offers."""
    for gpu in gpus:
        if gpu.is_vf:
            continue
        for mtype in gpu.offered_types():
            yield gpu, objects.EnabledType(mtype.id)


def _placement_total(gpu, enabled):
    """VGPU total of the GPU's provider in the tree Placement is sent."""
    built = model.build_tree(HOSTNAME, (gpu,), {gpu.address: enabled})
    totals = [inv.total for child in built.children
              for inv in child.inventories]
    return totals[0] if totals else 0


def _allocator_free(env, gpu, enabled):
    env.enabled = {gpu.address: enabled}
    allocator = env.allocator
    with env.store.transaction() as txn:
        return allocator.free(txn, gpu.address, enabled.type_id,
                              env.sysfs.mdevs_by_parent())


def _held(gpu, type_id):
    """(vGPUs of the type, whether one of another type blocks it).  A GPU
    whose vGPUs live on VFs is not blocked by what exists: each VF lists
    what the driver still lets it make (``capacity.free``)."""
    used = [t for f in gpu.functions for t in f.used_type_ids]
    other = not gpu.vf_gpus and any(t != type_id for t in used)
    return used.count(type_id), other


@pytest.mark.parametrize('name', loading.list_profiles())
def test_placement_and_allocator_agree_on_every_profile(hosts, name):
    env, gpus = hosts[name]
    checked = 0
    for gpu, enabled in _cases(gpus):
        total = capacity.vgpu_total(gpu, enabled)
        assert _placement_total(gpu, enabled) == total
        used, other = _held(gpu, enabled.type_id)
        assert _allocator_free(env, gpu, enabled) == capacity.free(
            total, used, 0, other_types=other), (gpu.address, enabled)
        checked += 1
    assert checked > 0


@pytest.mark.parametrize('name', loading.list_profiles())
def test_both_follow_the_one_rule(hosts, name, monkeypatch):
    """Change the rule (a limit of one vGPU per GPU) and both answers
    change with it: neither computes capacity on its own."""
    env, gpus = hosts[name]
    monkeypatch.setattr(capacity, 'limit', lambda mtype, enabled: 1)
    checked = 0
    for gpu, enabled in _cases(gpus):
        used, other = _held(gpu, enabled.type_id)
        expected_total = max(1, used) if capacity.vgpu_total(
            gpu, enabled) else 0
        assert _placement_total(gpu, enabled) == expected_total
        free = _allocator_free(env, gpu, enabled)
        assert free == capacity.free(expected_total, used, 0,
                                     other_types=other)
        assert free <= 1
        checked += 1
    assert checked > 0


def test_an_unknown_maximum_is_said_by_reports_not_by_the_allocator(
        hosts, caplog, monkeypatch):
    """Without a maximum only what exists plus one is counted: a report of
    the total warns (set max_instances), the allocator (whose refusal is
    the one line a guest start shows) does not, and both count alike."""
    monkeypatch.setattr(capacity, 'limit', lambda mtype, enabled: None)
    checked = 0
    for name in loading.list_profiles():
        env, gpus = hosts[name]
        for gpu, enabled in _cases(gpus):
            if not gpu.vf_gpus:
                continue
            caplog.clear()
            with caplog.at_level('WARNING'):
                quiet = capacity.vgpu_total(gpu, enabled, warn=False)
            assert caplog.records == []
            with caplog.at_level('WARNING'):
                said = capacity.vgpu_total(gpu, enabled)
            assert said == quiet
            assert any('no maximum known for vGPU type %s' % enabled.type_id
                       in r.getMessage() for r in caplog.records)
            caplog.clear()
            with caplog.at_level('WARNING'):
                _allocator_free(env, gpu, enabled)
            assert not any('no maximum known' in r.getMessage()
                           for r in caplog.records)
            checked += 1
    assert checked > 0
