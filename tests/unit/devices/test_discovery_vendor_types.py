"""No invented vGPU types: on a host whose driver numbers its types
differently from any table (type ids change between driver releases), and
whose VFs list one creatable type, ``types --json`` lists exactly that type,
named as the host names it and given NVIDIA's maximum by that NAME.

The host is the simulated L40S (libvirt_gpu/simulator/profiles/l40s.json)
with every VF's ``nvidia/CREATABLE_TYPES`` rewritten to one type of a
number no release used, and no vGPU held."""

import json
import os

import pytest

from libvirt_gpu.cmd import main as cli
from libvirt_gpu.devices import discovery
from libvirt_gpu.devices import nvml
from libvirt_gpu import objects
from libvirt_gpu.devices import sysfs as sysfs_mod
from tests.doubles import kinds
from tests.doubles import nvml_fake
from tests.doubles import trees
from libvirt_gpu.devices.backends.nvidia_vgpu import names as vendor_names

NUMBER = 4711
NAME = 'NVIDIA L40S-4Q'


def _one_type_host(root):
    devices = os.path.join(root, 'bus', 'pci', 'devices')
    vfs = []
    for name in sorted(os.listdir(devices)):
        nvidia = os.path.join(devices, name, 'nvidia')
        if not os.path.isdir(nvidia):
            continue
        vfs.append(name)
        with open(os.path.join(nvidia, vendor_names.CREATABLE_TYPES),
                  'w') as f:
            f.write('ID    : vGPU Name\n%-6d: %s\n' % (NUMBER, NAME))
        with open(os.path.join(nvidia, vendor_names.CURRENT_TYPE), 'w') as f:
            f.write('0\n')
    return vfs


@pytest.fixture
def l40s_one_type():
    with trees.simulated_tree('l40s', without_mdevs=True) as (root, _):
        assert _one_type_host(root)
        yield root


def test_types_lists_exactly_what_the_host_lists(capsys, l40s_one_type):
    code = cli.main(['--sysfs-root', l40s_one_type, 'types', '--json'])
    out, err = capsys.readouterr()
    assert code == 0, err
    listed = json.loads(out)                  # {GPU: [type, ...]}
    assert sorted(listed) == ['0000:3d:00.0', '0000:bd:00.0']
    for gpu, types in listed.items():
        assert [(t['id'], t['name']) for t in types] == [
            ('nvidia-%d' % NUMBER, NAME)], gpu
        # 32 free VFs list it, NVIDIA's maximum of an L40S-4Q (48 GB /
        # 4 GB, found by its name) caps it
        assert types[0]['available_instances'] == 12, gpu


def test_nvml_names_and_counts_only_the_types_the_host_lists(l40s_one_type):
    """NVML (a fake answering as NVML's API reference describes a vGPU
    host: nvmlDeviceGetSupportedVgpus, nvmlVgpuTypeGetName,
    nvmlVgpuTypeGetMaxInstances) names a type sysfs gives only as a number
    (a VF's ``CURRENT_TYPE``) and gives the maximum; a type NVML
    supports but no VF lists is not added."""
    held_vf = '0000:3d:00.4'
    with open(os.path.join(l40s_one_type, 'bus', 'pci', 'devices', held_vf,
                           'nvidia', vendor_names.CURRENT_TYPE), 'w') as f:
        f.write('4712\n')
    fake = nvml_fake.module({'gpus': [{
        'name': 'NVIDIA L40S', 'bus_id': '00000000:3D:00.0',
        'memory_total_mib': 46068, 'virtualization_mode': 3,
        'mig_mode': nvml_fake.NOT_SUPPORTED,
        'supported_vgpus': [NUMBER, 4712, 9999],
        'creatable_vgpus': [NUMBER],
        'vgpu_types': {
            NUMBER: {'name': NAME, 'framebuffer_mib': 4096,
                     'max_instances': 11},
            4712: {'name': 'NVIDIA L40S-2Q', 'framebuffer_mib': 2048,
                   'max_instances': 24},
            9999: {'name': 'NVIDIA L40S-48Q', 'framebuffer_mib': 49152,
                   'max_instances': 1},
        }}]})
    result = discovery.with_nvml(
        discovery.from_sysfs(sysfs_mod.Sysfs(l40s_one_type),
                             kinds=kinds.registered()),
        nvml.Nvml(fake), kinds=kinds.registered())
    pf = result.gpu(objects.PciAddress.parse('0000:3d:00.0'))
    assert pf.nvml is not None
    assert sorted((t.id, t.name, t.max_instance)
                  for t in pf.offered_types()) == [
        ('nvidia-%d' % NUMBER, NAME, 11),            # NVML's maximum
        ('nvidia-4712', 'NVIDIA L40S-2Q', 24)]       # NVML's name
    # the other L40S (NVML did not answer for it): the table, by name
    other = result.gpu(objects.PciAddress.parse('0000:bd:00.0'))
    assert [(t.id, t.name, t.max_instance) for t in other.offered_types()
            ] == [('nvidia-%d' % NUMBER, NAME, 12)]
