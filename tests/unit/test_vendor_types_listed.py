"""No invented vGPU types: on a host whose driver numbers its types
differently from any table (type ids change between driver releases), and
whose VFs list one creatable type, ``types --json`` lists exactly that type,
named as the host names it and given NVIDIA's maximum by that NAME.

The host is the simulated L40S (libvirt_gpu/simulator/profiles/l40s.json)
with every VF's ``nvidia/creatable_vgpu_types`` rewritten to one type of a
number no release used, and no vGPU held."""

import json
import os

import pytest

from libvirt_gpu.cmd import main as cli
from tests.doubles import trees

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
        with open(os.path.join(nvidia, 'creatable_vgpu_types'), 'w') as f:
            f.write('ID    : vGPU Name\n%-6d: %s\n' % (NUMBER, NAME))
        with open(os.path.join(nvidia, 'current_vgpu_type'), 'w') as f:
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
