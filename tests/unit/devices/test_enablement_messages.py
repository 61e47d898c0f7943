"""Three messages that confused (issue 30, section 5), on a simulated T4
host, through the configuration as every command reads it:

- a GPU listed twice by one type is not "claimed by two types: nvidia-223
  and nvidia-223";
- a type that ``[gpu]/enabled_vgpu_types`` names but no GPU here offers
  is not "not enabled (...: none)", from the CLI's environment and from
  the hook's settings snapshot alike;
- a type no GPU offers: each GPU is named with what it offers.
"""

import logging

import pytest

from libvirt_gpu import conf as conf_mod
from libvirt_gpu import environment
from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.devices import enablement
from libvirt_gpu.guests.hook import settings as settings_mod
from libvirt_gpu.host import allocator as allocator_mod
from libvirt_gpu.util import records
from tests.doubles import trees

A = '0000:3b:00.0'
B = '0000:af:00.0'


@pytest.fixture
def root():
    with trees.simulated_tree('t4') as (root, _):
        yield root


def _conf(tmp_path, root, text):
    path = tmp_path / 'libvirt-gpu.conf'
    path.write_text('[DEFAULT]\nsysfs_root = %s\nstate_dir = %s\n%s'
                    % (root, tmp_path / 'state', text))
    return str(path)


def _env(tmp_path, root, text):
    return environment.Environment.from_conf(
        conf_mod.load(_conf(tmp_path, root, text)))


@pytest.mark.parametrize('second', [B, B.upper()])
def test_a_gpu_listed_twice_by_one_type(tmp_path, root, second):
    env = _env(tmp_path, root, '[gpu]\nenabled_vgpu_types = nvidia-223\n'
               '[vgpu_nvidia-223]\ndevice_addresses = %s, %s\n'
               % (B, second))
    with pytest.raises(exception.ConfigError) as e:
        env.enabled
    said = str(e.value)
    assert '[vgpu_nvidia-223]/device_addresses lists the GPU %s twice; ' \
        'list each GPU once' % B in said
    assert 'two types' not in said


def test_a_gpu_claimed_by_two_types_still_names_both(tmp_path, root):
    env = _env(tmp_path, root, '[gpu]\nenabled_vgpu_types = nvidia-223, '
               'nvidia-224\n[vgpu_nvidia-223]\ndevice_addresses = %s\n'
               '[vgpu_nvidia-224]\ndevice_addresses = %s\n' % (B, B))
    with pytest.raises(exception.ConfigError,
                       match='claimed by two types: nvidia-223 and '
                             'nvidia-224'):
        env.enabled


def _refusal(env, type_id):
    claim = allocator_mod.VgpuClaim(uuid=objects.Uuid.new(),
                                    type_id=objects.TypeId.parse(type_id))
    with pytest.raises(exception.TypeNotEnabled) as e:
        env.allocator.reserve(objects.Uuid.new(), [claim])
    return str(e.value)


def test_a_type_enabled_but_offered_by_no_gpu_is_said_so(tmp_path, root):
    env = _env(tmp_path, root, '[gpu]\nenabled_vgpu_types = nvidia-999\n')
    said = _refusal(env, 'nvidia-999')
    assert '([gpu]/enabled_vgpu_types: nvidia-999, which no GPU of this ' \
        'host offers (`libvirt-gpu types` lists what they offer))' in said
    assert ': none)' not in said


def test_a_type_not_enabled_names_what_is(tmp_path, root):
    env = _env(tmp_path, root, '[gpu]\nenabled_vgpu_types = nvidia-223\n')
    assert '([gpu]/enabled_vgpu_types: nvidia-223)' in _refusal(
        env, 'nvidia-224')
    env = _env(tmp_path, root, '')
    assert '([gpu]/enabled_vgpu_types: none)' in _refusal(env, 'nvidia-224')


def test_the_hooks_snapshot_keeps_the_types_configured(tmp_path, root):
    """The hook reads its settings snapshot, not the configuration: the
    types named there travel with it."""
    config = _conf(tmp_path, root, '[gpu]\nenabled_vgpu_types = nvidia-999\n')
    snapshot = str(tmp_path / 'hook-settings.json')
    first, _ = settings_mod.load_settings(config, snapshot)
    again, note = settings_mod.load_settings(config, snapshot)
    assert note is None                       # from the snapshot
    for found in (first, again):
        assert found.enabled == {}
        assert found.enabled.configured == ('nvidia-999',)
    from libvirt_gpu.devices import sysfs as sysfs_mod
    env = environment.Environment.for_hook(again, sysfs_mod.Sysfs(root))
    assert 'nvidia-999, which no GPU of this host offers' in _refusal(
        env, 'nvidia-999')


def test_a_type_no_gpu_offers_names_each_gpu(tmp_path, root, caplog):
    env = _env(tmp_path, root, '[gpu]\nenabled_vgpu_types = nvidia-999\n')
    with caplog.at_level(logging.WARNING):
        assert env.enabled == {}
    said = caplog.text
    assert 'names nvidia-999, but no GPU of this host offers it, so every ' \
        'GPU is offered whole (PGPU): %s and %s offer nvidia-222, ' \
        'nvidia-223' % (A, B) in said


def test_gpus_that_offer_differently_are_named_apart():
    gpu = objects.Gpu(address=objects.PciAddress.parse(A), vendor_id='10de',
                      product_id='1eb8', class_code='0x030200', driver=None,
                      numa_node=None, iommu_group=None)
    typed = objects.VgpuType(id=objects.TypeId.parse('nvidia-223'),
                             name='T4-2B', description=None,
                             device_api='vfio-pci', available_instances=8)
    other = records.replace(gpu, address=objects.PciAddress.parse(B),
                            mdev_types=(typed,))
    assert enablement._offers([gpu, other]) == (
        '%s offers no vGPU type; %s offers nvidia-223' % (A, B))
    assert enablement._offers([]) == 'this host has no GPU'
