"""Cyborg driver objects: behaviours no other test pinned (issue 30,
section 6).  An MDEV attach handle names only a VF that offers the
enabled type (Cyborg creates the handle's vGPU under the address it
names), and a deployable's ``num_accelerators`` is its number of handles
(Cyborg binds a request to a free handle: a count above them promises
vGPUs nothing can make).

Written against the public ``cyborg_objects.driver_devices`` on an
SR-IOV host of the simulator: an A100 whose three VFs are mdev parents.
"""

import json
import os
import shutil

import pytest

from libvirt_gpu.devices import discovery
from libvirt_gpu import objects
from libvirt_gpu.openstack import cyborg_objects
from libvirt_gpu import simulator
from libvirt_gpu.devices import sysfs as sysfs_mod
from tests.doubles import kinds
from tests.doubles import trees

PF = '0000:3d:00.0'
VFS = ('0000:3d:00.4', '0000:3d:00.5', '0000:3d:00.6')
TYPE = 'nvidia-692'          # GRID A100-20C: 2 per GPU, one per VF
OTHER = 'nvidia-693'         # GRID A100-40C


def _sriov(tmp_path, held=None):
    """The Sysfs of the A100 with a third VF; ``held``: the type of a
    vGPU its first VF holds."""
    tmp_path.mkdir(exist_ok=True)
    with open(trees.sriov_profile_file(tmp_path)) as f:
        data = json.load(f)
    devices = data['devices']
    pf = next(d for d in devices if d['address'] == PF)
    pf['virtfns'] = list(VFS)
    vf = next(d for d in devices if d['address'] == VFS[0])
    devices.append(dict(vf, address=VFS[2], iommu_group=39))
    if held is not None:
        vf['mdevs'] = [{'uuid': '4b20d080-1b54-4048-85b3-a6a62d165c01',
                        'type_id': held}]
    path = tmp_path / 'sriov3.json'
    path.write_text(json.dumps(data))
    root = str(tmp_path / 'sys')
    simulator.write_sysfs(simulator.load_profile(str(path)), root)
    return sysfs_mod.Sysfs(root)


@pytest.fixture
def sriov(tmp_path):
    return _sriov(tmp_path)


def _deployable(sysfs):
    gpus = discovery.from_sysfs(sysfs, kinds=kinds.registered()).gpus
    pf = next(g for g in gpus if str(g.address) == PF)
    (device,) = [d for d in cyborg_objects.driver_devices(
        'host1', gpus, {pf.address: objects.EnabledType(TYPE)})
        if json.loads(d.controlpath_id.cpid_info)['bus'] == '3d']
    (dep,) = device.deployable_list
    return dep


def _handle_vfs(dep):
    found = []
    for handle in dep.attach_handle_list:
        assert handle.attach_type == cyborg_objects.AH_MDEV
        info = json.loads(handle.attach_info)
        assert info['asked_type'] == TYPE
        found.append('%s:%s:%s.%s' % (info['domain'], info['bus'],
                                      info['device'], info['function']))
    return found


def _drop_type(sysfs, vf, type_id):
    shutil.rmtree(os.path.join(sysfs.pci_dir(vf), 'mdev_supported_types',
                               type_id))


def test_every_vf_of_the_type_gets_one_handle(sriov):
    dep = _deployable(sriov)
    assert _handle_vfs(dep) == list(VFS[:2])      # 2 per GPU: the first two
    assert dep.num_accelerators == 2


def test_mdev_handles_name_only_vfs_that_offer_the_type(sriov):
    """The middle VF does not list the type: the handles skip it
    (broken by handing out any free VF)."""
    _drop_type(sriov, VFS[1], TYPE)
    dep = _deployable(sriov)
    assert _handle_vfs(dep) == [VFS[0], VFS[2]]
    assert dep.num_accelerators == 2


def test_num_accelerators_is_the_number_of_handles(sriov, monkeypatch):
    """More capacity than usable VFs (the model's total can count what
    no handle names): the deployable promises only its handles (broken
    by reporting the total)."""
    monkeypatch.setattr(cyborg_objects.model, 'vgpu_total',
                        lambda gpu, setting: 5)
    dep = _deployable(sriov)
    assert _handle_vfs(dep) == list(VFS)
    assert dep.num_accelerators == len(dep.attach_handle_list) == 3


def test_a_vf_that_holds_a_vgpu_of_the_type_keeps_its_handle(tmp_path):
    """A VF holds one vGPU: the one holding an A100-20C is the first
    handle, one more free VF makes the second."""
    dep = _deployable(_sriov(tmp_path, held=TYPE))
    assert _handle_vfs(dep) == list(VFS[:2])
    assert dep.num_accelerators == 2
