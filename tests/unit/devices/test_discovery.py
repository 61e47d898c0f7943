"""Discovery: sysfs and libvirt (test driver) agree on every profile."""

import os

import pytest

from libvirt_gpu.devices import discovery
from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.virt import host
from libvirt_gpu import simulator
from libvirt_gpu.devices import sysfs as sysfs_mod
from libvirt_gpu.util import records
from tests.doubles import kinds

PROFILES = simulator.list_profiles()


def _without(gpus, *fields):
    blank = {f: None for f in fields if f != 'description'}
    result = []
    for gpu in gpus:
        gpu = records.replace(gpu, **blank)
        if 'driver' in fields:
            # A group member's driver too, and what is judged from it.
            gpu = records.replace(gpu, iommu_members=tuple(
                records.replace(m, driver=None, host_uses=False)
                for m in gpu.iommu_members))
        if 'description' in fields:
            gpu = records.replace(gpu, mdev_types=tuple(
                records.replace(t, description=None)
                for t in gpu.mdev_types))
        result.append(gpu)
    return result


@pytest.fixture(params=PROFILES + ['synthetic-40'])
def sim_host(request, tmp_path):
    if request.param == 'synthetic-40':
        profile = simulator.synthetic_profile(40)
    else:
        profile = simulator.load_profile(request.param)
    node_xml = simulator.write_host(profile, tmp_path)
    return profile, str(tmp_path), 'test://' + node_xml


def test_parity_libvirt_with_sysfs(sim_host):
    profile, root, uri = sim_host
    by_sysfs = discovery.from_sysfs(sysfs_mod.Sysfs(root),
                                    kinds=kinds.registered())
    with host.Host(uri, read_only=True) as h:
        by_libvirt = discovery.from_libvirt(h, sysfs_mod.Sysfs(root),
                                            kinds=kinds.registered())
    assert by_sysfs.source == 'sysfs' and by_libvirt.source == 'libvirt'
    assert by_sysfs.gpus, 'profile %s has GPUs' % profile.name
    # Names come from libvirt only (sysfs has no pci.ids); all else equal.
    assert _without(by_libvirt.gpus, 'vendor_name', 'product_name') == \
        list(by_sysfs.gpus)
    assert all(g.product_name for g in by_libvirt.gpus)


def test_parity_libvirt_alone(sim_host):
    """Without sysfs, libvirt lacks descriptions and (test driver) drivers
    but agrees on everything else."""
    _profile, root, uri = sim_host
    by_sysfs = discovery.from_sysfs(sysfs_mod.Sysfs(root),
                                    kinds=kinds.registered())
    with host.Host(uri, read_only=True) as h:
        alone = discovery.from_libvirt(h, kinds=kinds.registered())
    assert _without(alone.gpus, 'vendor_name', 'product_name', 'driver',
                    'description') == \
        _without(by_sysfs.gpus, 'driver', 'description')


def test_shared_type_text_equals_full_read(sim_host):
    _profile, root, _uri = sim_host
    tree = sysfs_mod.Sysfs(root)
    assert discovery.from_sysfs(tree, share_type_text=True,
                                kinds=kinds.registered()) == \
        discovery.from_sysfs(tree, share_type_text=False,
                             kinds=kinds.registered())


def test_gpu_classes_only_and_fields(tmp_path):
    simulator.write_host(simulator.load_profile('mixed'), tmp_path)
    result = discovery.from_sysfs(sysfs_mod.Sysfs(tmp_path),
                                  kinds=kinds.registered())
    assert all(g.class_code.startswith('0x03') for g in result.gpus)
    assert '8086' not in {g.vendor_id for g in result.gpus}
    drivers = {str(g.address): g.driver for g in result.gpus}
    assert None in drivers.values() and 'vfio-pci' in drivers.values()
    nameless = [t for g in result.gpus for t in g.mdev_types
                if t.name is None]
    assert nameless and all(t.description is None for t in nameless)


def test_non_zero_domain(tmp_path):
    simulator.write_host(simulator.load_profile('domain'), tmp_path)
    result = discovery.from_sysfs(sysfs_mod.Sysfs(tmp_path),
                                  kinds=kinds.registered())
    assert '0001:01:00.0' in {str(g.address) for g in result.gpus}
    assert result.gpu(objects.PciAddress.parse('0001:01:00.0')).mdevs


def _hand_made_tree(root):
    """A sysfs tree as a kernel makes it, not as our simulator does:
    only the files discovery needs, different bridge layout, no uevent."""
    dev = os.path.join(root, 'devices', 'pci0000:00', '0000:00:02.0',
                       '0000:01:00.0')
    tdir = os.path.join(dev, 'mdev_supported_types', 'nvidia-63')
    os.makedirs(os.path.join(tdir, 'devices'))
    for name, text in [('vendor', '0x10de'), ('device', '0x1bb3'),
                       ('class', '0x030200'), ('numa_node', '-1')]:
        with open(os.path.join(dev, name), 'w') as f:
            f.write(text + '\n')
    for name, text in [('name', 'GRID P4-1Q'), ('device_api', 'vfio-pci'),
                       ('available_instances', '8')]:
        with open(os.path.join(tdir, name), 'w') as f:
            f.write(text + '\n')
    os.makedirs(os.path.join(root, 'bus', 'pci', 'devices'))
    os.symlink('../../../devices/pci0000:00/0000:00:02.0/0000:01:00.0',
               os.path.join(root, 'bus', 'pci', 'devices', '0000:01:00.0'))


def test_any_sysfs_shaped_tree(tmp_path):
    _hand_made_tree(str(tmp_path))
    result = discovery.from_sysfs(sysfs_mod.Sysfs(tmp_path),
                                  kinds=kinds.registered())
    (gpu,) = result.gpus
    assert (str(gpu.address), gpu.product_id, gpu.driver, gpu.numa_node,
            gpu.iommu_group, gpu.mdevs) == ('0000:01:00.0', '1bb3', None,
                                            None, None, ())
    (mtype,) = gpu.mdev_types
    assert (mtype.id, mtype.name, mtype.description,
            mtype.available_instances) == ('nvidia-63', 'GRID P4-1Q', None, 8)


def test_unreadable_file_is_typed_error_naming_path(tmp_path, caplog):
    _hand_made_tree(str(tmp_path))
    avail = os.path.join(str(tmp_path), 'devices', 'pci0000:00',
                         '0000:00:02.0', '0000:01:00.0',
                         'mdev_supported_types', 'nvidia-63',
                         'available_instances')
    os.remove(avail)
    os.mkdir(avail)   # reading a directory fails with EISDIR
    tree = sysfs_mod.Sysfs(tmp_path)
    with pytest.raises(exception.SysfsReadError,
                       match='available_instances'):
        tree.mdev_types('0000:01:00.0')
    # discovery skips the type (one bad type must not hide the host) and
    # warns with the same error
    (gpu,) = discovery.from_sysfs(tree, kinds=kinds.registered()).gpus
    assert gpu.mdev_types == ()
    assert 'nvidia-63/available_instances' in caplog.text


def test_garbage_number_is_typed_error(tmp_path, caplog):
    _hand_made_tree(str(tmp_path))
    numa = os.path.join(str(tmp_path), 'devices', 'pci0000:00',
                        '0000:00:02.0', '0000:01:00.0', 'numa_node')
    with open(numa, 'w') as f:
        f.write('lots\n')
    tree = sysfs_mod.Sysfs(tmp_path)
    with pytest.raises(exception.SysfsReadError, match='numa_node'):
        tree.read_gpu('0000:01:00.0')
    # discovery skips the device and warns with the same error
    assert discovery.from_sysfs(tree, kinds=kinds.registered()).gpus == ()
    assert 'numa_node' in caplog.text and "'lots'" in caplog.text


def test_discover_falls_back_to_sysfs(tmp_path):
    simulator.write_host(simulator.load_profile('t4'), tmp_path)
    result = discovery.discover(
        default_uri='qemu:///system?socket=%s/none' % tmp_path,
        default_sysfs_root=str(tmp_path), kinds=kinds.registered())
    assert result.source == 'sysfs'
    assert len(result.gpus) == 2


def test_explicit_uri_does_not_fall_back(tmp_path):
    with pytest.raises(exception.LibvirtUnavailable, match='sysfs-root'):
        discovery.discover(uri='qemu:///system?socket=%s/none' % tmp_path,
                           kinds=kinds.registered())


# Discovery sits below the kinds and imports none: each public function
# that reads or regroups VFs takes them from its caller.
TAKE_KINDS = ('from_sysfs', 'from_libvirt', 'discover', 'with_names',
              'with_nvml', 'group_sriov', 'gpu_view')


def test_discovery_takes_the_kinds_and_defaults_none():
    import inspect
    for name in TAKE_KINDS:
        param = inspect.signature(getattr(discovery, name)).parameters[
            'kinds']
        assert param.default is inspect.Parameter.empty, name


def test_discovery_refuses_no_kinds(tmp_path):
    simulator.write_host(simulator.load_profile('t4'), tmp_path)
    tree = sysfs_mod.Sysfs(tmp_path)
    found = discovery.from_sysfs(tree, kinds=())
    for call in (lambda: discovery.from_sysfs(tree, kinds=None),
                 lambda: discovery.discover(sysfs_root=str(tmp_path),
                                            kinds=None),
                 lambda: discovery.with_names(found, None, None),
                 lambda: discovery.with_nvml(found, None, None)):
        with pytest.raises(TypeError, match="pass kinds= an Environment"):
            call()


def test_sysfs_path_refuses_traversal(tmp_path):
    tree = sysfs_mod.Sysfs(tmp_path)
    for part in ('..', '../etc', '/etc', 'a/b', ''):
        with pytest.raises(exception.UnsafePath):
            tree.path('bus', part)
    outside = tmp_path / 'link'
    os.symlink('/etc/hostname', outside)
    with pytest.raises(exception.UnsafePath):
        tree.write(str(outside), 'x')
