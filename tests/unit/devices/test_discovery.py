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
import logging
import textwrap
from libvirt_gpu import conf as conf_mod
from libvirt_gpu.devices import carving
from libvirt_gpu.store import carved as carve_record
from libvirt_gpu.devices import capabilities
from libvirt_gpu.devices import enablement
from tests.doubles import fakes
from tests.doubles import layouts

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


# --- What ``make mutation`` found open (docs/dev/mutation.md) ---
# What discovery (``devices.discovery``), the enabled types
# (``devices.enablement``) and Nova's carvings (``devices.carving``) promise,
# pinned where the rest of the unit tests stayed green on a change ``make
# mutation`` made (docs/dev/mutation.md): the exact refusals, the boundaries,
# which GPU is left out and why. Hand-built records and a configuration file:
# no simulated host, so each test runs alone in milliseconds.

A = '0000:3b:00.0'
B = '0000:af:00.0'
C = '0000:d8:00.0'


def addr(text):
    return objects.PciAddress.parse(text)


def load(tmp_path, text):
    path = tmp_path / 'libvirt-gpu.conf'
    path.write_text(textwrap.dedent(text))
    return conf_mod.load(str(path))


def refusal(call, *args):
    with pytest.raises(exception.ConfigError) as e:
        call(*args)
    text = str(e.value)
    assert '\n' not in text
    return text


def reason(call, *args):
    with pytest.raises(exception.ConfigError) as e:
        call(*args)
    return e.value.kwargs['reason']


def vf_of(pf, function, types=()):
    """A VF of the hand-built GPU ``pf`` at ``function`` of slot 0."""
    address = records.replace(pf.address, function=function)
    return records.replace(fakes.gpu(str(address), types=types),
                           physfn=pf.address)


# --- enablement: resolve -----------------------------------------------------

GPUS = [fakes.gpu(A), fakes.gpu(B), fakes.gpu(C, types=())]


def test_a_type_listed_twice_is_refused_naming_the_list(tmp_path):
    conf = load(tmp_path, """
        [gpu]
        enabled_vgpu_types = nvidia-223, nvidia-319, nvidia-223
        """)
    assert reason(layouts.enabled, conf, GPUS) == (
        '[gpu]/enabled_vgpu_types lists a type twice: nvidia-223, '
        'nvidia-319, nvidia-223')


def test_several_types_and_one_without_addresses_is_refused(tmp_path):
    conf = load(tmp_path, """
        [gpu]
        enabled_vgpu_types = nvidia-223, nvidia-319
        [vgpu_nvidia-319]
        device_addresses = 0000:af:00.0
        """)
    assert reason(layouts.enabled, conf, GPUS) == (
        'several types are enabled (nvidia-223, nvidia-319) but '
        '[vgpu_nvidia-223] lists no device_addresses; with more than one '
        'type each needs its own list of GPUs')


def test_one_type_everywhere_takes_each_offering_pf_never_a_vf(tmp_path):
    pf = fakes.gpu(A, types=())
    pf = records.replace(pf, virtfns=(addr('0000:3b:00.4'),))
    vf = vf_of(pf, 4, types=(fakes.T4_2B,))
    pf = records.replace(pf, vf_gpus=(vf,))
    conf = load(tmp_path, """
        [gpu]
        enabled_vgpu_types = nvidia-223
        [vgpu_nvidia-223]
        resource_class = CUSTOM_T4_2B
        max_instances = 3
        """)
    enabled = layouts.enabled(conf, [pf, vf, fakes.gpu(B),
                                     fakes.gpu(C, types=())])
    # the PF offers it through its VF; the VF itself is not a GPU here
    assert dict(enabled) == {
        addr(A): objects.EnabledType('nvidia-223', 'CUSTOM_T4_2B', 3),
        addr(B): objects.EnabledType('nvidia-223', 'CUSTOM_T4_2B', 3)}
    assert enabled.configured == ('nvidia-223',)


def test_a_type_no_gpu_offers_warns_naming_what_each_offers(
        tmp_path, caplog):
    conf = load(tmp_path, '[gpu]\nenabled_vgpu_types = nvidia-222\n')
    gpus = [fakes.gpu(B), fakes.gpu(A), fakes.gpu(C, types=()),
            fakes.gpu('0000:5e:00.0', types=(fakes.T4_1B,))]
    gpus.append(vf_of(gpus[0], 4, types=(fakes.T4_1B,)))
    with caplog.at_level(logging.WARNING, logger='libvirt_gpu'):
        enabled = layouts.enabled(conf, gpus)
    assert dict(enabled) == {addr('0000:5e:00.0'):
                             objects.EnabledType('nvidia-222')}
    assert not caplog.records

    conf = load(tmp_path, '[gpu]\nenabled_vgpu_types = nvidia-999\n')
    with caplog.at_level(logging.WARNING, logger='libvirt_gpu'):
        enabled = layouts.enabled(conf, gpus)
    assert dict(enabled) == {}
    assert enabled.configured == ('nvidia-999',)
    assert [r.getMessage() for r in caplog.records] == [
        '[gpu]/enabled_vgpu_types names nvidia-999, but no GPU of this '
        'host offers it, so every GPU is offered whole (PGPU): '
        '0000:5e:00.0 offers nvidia-222; 0000:3b:00.0 and 0000:af:00.0 '
        'offer nvidia-223, nvidia-225, nvidia-319; '
        '0000:d8:00.0 offers no vGPU type']


def test_offers_of_a_host_without_gpus():
    assert enablement._offers([]) == 'this host has no GPU'


def test_an_address_listed_twice_by_one_type_is_refused(tmp_path):
    conf = load(tmp_path, """
        [gpu]
        enabled_vgpu_types = nvidia-223
        [vgpu_nvidia-223]
        device_addresses = 0000:af:00.0, 0000:AF:00.0
        """)
    assert reason(layouts.enabled, conf, GPUS) == (
        '[vgpu_nvidia-223]/device_addresses lists the GPU 0000:af:00.0 '
        'twice; list each GPU once')


def test_an_address_of_two_types_names_both_in_order(tmp_path):
    conf = load(tmp_path, """
        [gpu]
        enabled_vgpu_types = nvidia-319, nvidia-223
        [vgpu_nvidia-223]
        device_addresses = 0000:af:00.0
        [vgpu_nvidia-319]
        device_addresses = 0000:3b:00.0, 0000:af:00.0
        """)
    assert reason(layouts.enabled, conf, GPUS) == (
        'GPU 0000:af:00.0 is claimed by two types: nvidia-319 and '
        'nvidia-223; give each GPU to one type only')


def test_an_address_without_a_gpu_is_refused_in_full(tmp_path):
    conf = load(tmp_path, """
        [gpu]
        enabled_vgpu_types = nvidia-223
        [vgpu_nvidia-223]
        device_addresses = 0000:01:00.0
        """)
    assert reason(layouts.enabled, conf, GPUS) == (
        '[vgpu_nvidia-223]/device_addresses names 0000:01:00.0, but this '
        'host has no GPU there (`libvirt-gpu list` shows the GPUs)')


def test_a_bad_address_is_refused_naming_the_option(tmp_path):
    conf = load(tmp_path, """
        [gpu]
        enabled_vgpu_types = nvidia-223
        [vgpu_nvidia-223]
        device_addresses = 0000:af:00.0, af:00.0
        """)
    assert reason(enablement.device_addresses, conf, 'nvidia-223') == (
        "[vgpu_nvidia-223]/device_addresses: 'af:00.0' is not a PCI "
        "address; expected the form DDDD:BB:SS.F in hex digits, e.g. "
        "0000:af:00.0")


def test_device_addresses_parsed_in_order(tmp_path):
    conf = load(tmp_path, """
        [gpu]
        enabled_vgpu_types = nvidia-223
        [vgpu_nvidia-223]
        device_addresses = 0000:AF:00.0, 0000:3b:00.0
        """)
    assert enablement.device_addresses(conf, 'nvidia-223') == [
        addr(B), addr(A)]


def test_the_address_of_a_vf_is_refused_naming_its_pf(tmp_path):
    pf = records.replace(fakes.gpu(B), virtfns=(addr('0000:af:00.4'),))
    vf = vf_of(pf, 4, types=(fakes.T4_2B,))
    conf = load(tmp_path, """
        [gpu]
        enabled_vgpu_types = nvidia-223
        [vgpu_nvidia-223]
        device_addresses = 0000:af:00.4
        """)
    assert reason(layouts.enabled, conf, [pf, vf]) == (
        '[vgpu_nvidia-223]/device_addresses names 0000:af:00.4, a VF of the '
        'GPU 0000:af:00.0; name the physical GPU: its VFs are used as one')


def test_a_type_not_offered_names_what_is(tmp_path):
    conf = load(tmp_path, """
        [gpu]
        enabled_vgpu_types = nvidia-222
        [vgpu_nvidia-222]
        device_addresses = 0000:af:00.0
        """)
    assert reason(layouts.enabled, conf, GPUS) == (
        'the GPU at 0000:af:00.0 does not offer type nvidia-222 (it offers: '
        'nvidia-223, nvidia-319, nvidia-225)')


def test_a_gpu_offering_nothing_asks_whether_its_vfs_are_enabled(tmp_path):
    conf = load(tmp_path, """
        [gpu]
        enabled_vgpu_types = nvidia-222
        [vgpu_nvidia-222]
        device_addresses = 0000:d8:00.0
        """)
    assert reason(layouts.enabled, conf, GPUS) == (
        'the GPU at 0000:d8:00.0 does not offer type nvidia-222 (it offers: '
        'none); if its vGPUs live on SR-IOV VFs (Ampere and later), are '
        'the VFs enabled? (`libvirt-gpu restore`, or NVIDIA\'s '
        'sriov-manage -e 0000:d8:00.0)')


def test_two_types_each_on_its_gpus(tmp_path):
    conf = load(tmp_path, """
        [gpu]
        enabled_vgpu_types = nvidia-223, nvidia-319
        [vgpu_nvidia-223]
        device_addresses = 0000:af:00.0
        resource_class = VGPU
        [vgpu_nvidia-319]
        device_addresses = 0000:3b:00.0
        max_instances = 2
        """)
    enabled = layouts.enabled(conf, GPUS)
    assert dict(enabled) == {
        addr(B): objects.EnabledType('nvidia-223'),
        addr(A): objects.EnabledType('nvidia-319', 'VGPU', 2)}
    assert enabled.configured == ('nvidia-223', 'nvidia-319')
    copy = enablement.Enabled(enabled)
    assert copy == enabled and copy.configured == enabled.configured
    assert enablement.Enabled().configured == ()


@pytest.mark.parametrize('value, ok', [
    ('VGPU', True), ('PGPU', True), ('CUSTOM_A', True),
    ('CUSTOM_' + 'A' * 248, True), ('CUSTOM_' + 'A' * 249, False),
    ('CUSTOM_a', False), ('CUSTOM_', False), ('XCUSTOM_A', False),
    ('vgpu', False)])
def test_resource_class_is_standard_or_a_custom_name(tmp_path, value, ok):
    conf = load(tmp_path, """
        [gpu]
        enabled_vgpu_types = nvidia-223
        [vgpu_nvidia-223]
        resource_class = %s
        """ % value)
    if ok:
        enabled = layouts.enabled(conf, GPUS)
        assert enabled[addr(A)].resource_class == value
    else:
        assert reason(layouts.enabled, conf, GPUS) == (
            '[vgpu_nvidia-223]/resource_class %r is neither a standard '
            'resource class (VGPU) nor a valid CUSTOM_ name' % value)


# --- enablement: layouts -----------------------------------------------------

H100 = '0000:41:00.0'
L40S = '0000:61:00.0'
LAYOUT_GPUS = (fakes.gpu(H100, types=(), product_id='2331'),
               fakes.gpu(L40S, types=(), product_id='26b9'),
               fakes.gpu(B))
LAYOUTS = """
[gpu]
layouts = one, two
%s
[layout_one]
gpus = 10de:2331
mode = mig
gpu_instances = 1g.10gb:4, 3g.40gb:1
vgpu_types = nvidia-1150, nvidia-1152
[layout_two]
gpus = 0000:61:00.0
mode = mixed-size
vgpu_types = nvidia-1160:2, nvidia-1161:3, nvidia-1162:5
"""


def test_a_gpu_in_a_layout_named_in_device_addresses_is_refused(tmp_path):
    conf = load(tmp_path, LAYOUTS % (
        'enabled_vgpu_types = nvidia-223\n[vgpu_nvidia-223]\n'
        'device_addresses = 0000:af:00.0, 0000:61:00.0\n'))
    assert reason(layouts.enabled, conf, LAYOUT_GPUS) == (
        '[vgpu_nvidia-223]/device_addresses names 0000:61:00.0, which is in '
        'layout [layout_two]; a GPU in a layout offers the layout\'s '
        'vgpu_types: remove it from one of them')


def test_layout_types_take_their_counts_and_sections(tmp_path):
    conf = load(tmp_path, LAYOUTS % (
        'enabled_vgpu_types = nvidia-1161, nvidia-1152, nvidia-223\n'
        '[vgpu_nvidia-1161]\ndevice_addresses = 0000:ff:00.0\n'
        'resource_class = CUSTOM_L40S_2Q\nmax_instances = 2\n'
        '[vgpu_nvidia-1152]\ndevice_addresses = 0000:fe:00.0\n'
        'resource_class = CUSTOM_X\nmax_instances = 4\n'
        '[vgpu_nvidia-223]\ndevice_addresses = 0000:af:00.0\n'))
    gpus = LAYOUT_GPUS + (
        fakes.gpu('0000:ff:00.0', types=(objects.VgpuType(
            'nvidia-1161', None, None, 'vfio-pci', 1),)),
        fakes.gpu('0000:fe:00.0', types=(objects.VgpuType(
            'nvidia-1152', None, None, 'vfio-pci', 1),)))
    enabled = layouts.enabled(conf, gpus)
    mixed = enabled[addr(L40S)]
    # the smaller of the layout's count and the section's max_instances
    assert [(t.type_id, t.resource_class, t.max_instances)
            for t in mixed.types] == [
        ('nvidia-1160', 'VGPU', 2), ('nvidia-1161', 'CUSTOM_L40S_2Q', 2),
        ('nvidia-1162', 'VGPU', 5)]
    # no count (mig): the section's limit, else none
    assert enabled[addr(H100)] == objects.EnabledType(
        'nvidia-1150', others=(objects.EnabledType(
            'nvidia-1152', 'CUSTOM_X', 4),))
    assert enabled[addr(B)] == objects.EnabledType('nvidia-223')
    assert enabled.configured == ('nvidia-1161', 'nvidia-1152',
                                  'nvidia-223')


# --- carving: the configuration ----------------------------------------------

L1 = '0000:3d:00.0'
L2 = '0000:bd:00.0'
T_12Q = objects.TypeId.parse('nvidia-1153')
T_24Q = objects.TypeId.parse('nvidia-1154')


def vtype(type_id, name, most):
    return objects.VgpuType(id=objects.TypeId.parse(type_id), name=name,
                            description=None, device_api='vfio-pci',
                            available_instances=1, published_max=most)


TYPE_12Q = vtype('nvidia-1153', 'NVIDIA L40S-12Q', 4)
TYPE_24Q = vtype('nvidia-1154', 'NVIDIA L40S-24Q', 2)


def l40s(address, vfs=6, creatable=(TYPE_12Q, TYPE_24Q), current=None,
         driver='nvidia'):
    """An L40S whose ``vfs`` VFs (functions 4 on, slot 0 and 1) offer
    ``creatable`` through the vendor interface; ``current``:
    ``{function: VgpuType}`` the VFs hold.  The VFs' product id differs
    from the PF's, as a VF's may."""
    pf_address = addr(address)
    current = current or {}
    vf_gpus = []
    for n in range(4, 4 + vfs):
        vf_address = records.replace(pf_address, slot=n // 8,
                                     function=n % 8)
        vf_gpus.append(objects.Gpu(
            address=vf_address, vendor_id='10de', product_id='beef',
            class_code='0x030200', driver='nvidia', numa_node=0,
            iommu_group=None, physfn=pf_address,
            vendor_vf=objects.VendorVf(creatable=creatable,
                                       current=current.get(n))))
    pf = objects.Gpu(
        address=pf_address, vendor_id='10de', product_id='26b9',
        class_code='0x030200', driver=driver, numa_node=0, iommu_group=7,
        virtfns=tuple(v.address for v in reversed(vf_gpus)),
        vf_gpus=tuple(vf_gpus))
    return [pf] + vf_gpus


def nova(tmp_path, *sections, carved=None):
    """A configuration of carvings: ``(name, body)`` each."""
    text = '[nova]\ncarved = %s\n' % (
        carved if carved is not None else ', '.join(n for n, _ in sections))
    for name, body in sections:
        text += '[nova_%s]\n%s\n' % (name, textwrap.dedent(body))
    return load(tmp_path, text)


def carving_body(gpus=L2, vgpu_type='nvidia-1153', count=2, extra=''):
    return 'gpus = %s\nvgpu_type = %s\ncount = %d\n%s' % (
        gpus, vgpu_type, count, extra)


@pytest.mark.parametrize('body, said', [
    ('vgpu_type = nvidia-1153\ncount = 1\n',
     '[nova_a]/gpus is empty: name the GPUs by PCI address (0000:41:00.0) '
     'or by model, their vendor:product ids (10de:2331)'),
    ('gpus = 0000:bd:00.0, bd:00\nvgpu_type = nvidia-1153\ncount = 1\n',
     "[nova_a]/gpus: 'bd:00' names no GPU: give a PCI address "
     "(0000:41:00.0) or the vendor:product ids of a model (10de:2331)"),
    ('gpus = 0000:bd:00.0\ncount = 1\n',
     '[nova_a]/vgpu_type is not set: name the vGPU type to write to the '
     'VFs (`libvirt-gpu types <GPU>` lists them)'),
    ('gpus = 0000:bd:00.0\nvgpu_type = ../x\ncount = 1\n',
     "[nova_a]/vgpu_type: '../x' is not a valid vGPU type id (1 to 64 "
     "letters, digits, '-', '_' or '.', starting with a letter or digit, "
     "e.g. nvidia-223)"),
    ('gpus = 0000:bd:00.0\nvgpu_type = nvidia-1153\n',
     '[nova_a]/count is not set: say how many VFs of each GPU get the '
     'type'),
    (carving_body(extra='resource_class = CUSTOM_' + 'A' * 249),
     "[nova_a]/resource_class 'CUSTOM_%s' is not a CUSTOM_ resource class "
     "(CUSTOM_ then upper-case letters, digits, \"_\"; e.g. "
     "CUSTOM_NVIDIA_L40S_12Q)" % ('A' * 249)),
    (carving_body(extra='resource_class = VGPU'),
     "[nova_a]/resource_class 'VGPU' is not a CUSTOM_ resource class "
     "(CUSTOM_ then upper-case letters, digits, \"_\"; e.g. "
     "CUSTOM_NVIDIA_L40S_12Q)"),
    (carving_body(extra='alias = a' * 1 + 'b' * 64),
     "[nova_a]/alias '%s' is not an alias name (letters, digits, \".\", "
     "\"_\" and \"-\"; no \":\" or \",\", which a flavor's "
     "pci_passthrough:alias uses)" % ('a' + 'b' * 64)),
    (carving_body(extra='alias = -l40s'),
     "[nova_a]/alias '-l40s' is not an alias name (letters, digits, \".\", "
     "\"_\" and \"-\"; no \":\" or \",\", which a flavor's "
     "pci_passthrough:alias uses)"),
])
def test_a_carving_missing_or_malformed_is_refused_naming_it(
        tmp_path, body, said):
    conf = nova(tmp_path, ('a', body))
    assert reason(carving.carvings, conf) == said


def test_a_carving_is_read_into_its_record(tmp_path):
    conf = nova(tmp_path, ('a', carving_body(
        gpus='0000:BD:00.0, 10DE:26B9', count=3,
        extra='resource_class = CUSTOM_%s\nalias = A%s\n'
        % ('B' * 248, 'b' * 63))),
        ('b', carving_body(vgpu_type='nvidia-1154')))
    assert carving.carvings(conf) == (
        carving.Carving(
            name='a', selectors=(objects.GpuSelector(address=addr(L2)),
                                 objects.GpuSelector(vendor_id='10de',
                                                     product_id='26b9')),
            type_id=T_12Q, count=3, resource_class='CUSTOM_' + 'B' * 248,
            alias='A' + 'b' * 63),
        carving.Carving(name='b', selectors=(
            objects.GpuSelector(address=addr(L2)),), type_id=T_24Q,
            count=2))
    assert carving.carvings(conf)[0].section == 'nova_a'
    assert carving.carvings(load(tmp_path, '[gpu]\n')) == ()


@pytest.mark.parametrize('name, rc, alias', [
    ('NVIDIA L40S-12Q', 'CUSTOM_NVIDIA_L40S_12Q', 'l40s-12q'),
    ('GRID T4-1B', 'CUSTOM_GRID_T4_1B', 't4-1b'),
    ('grid  T4 -- 2b', 'CUSTOM_GRID_T4_2B', 't4-2b'),
    ('NVIDIA', 'CUSTOM_NVIDIA', 'nvidia'),
    ('NVIDIA  ', 'CUSTOM_NVIDIA_', 'nvidia'),
    (' A100x_7 ', 'CUSTOM__A100X_7_', 'a100x-7'),
    ('Tesla H100', 'CUSTOM_TESLA_H100', 'tesla-h100'),
])
def test_default_names_from_a_type_name(name, rc, alias):
    assert carving.default_resource_class(name) == rc
    assert carving.default_alias(name) == alias


# --- carving: which GPUs -----------------------------------------------------

def test_matching_by_address_and_by_model(tmp_path, caplog):
    gpus = l40s(L1) + l40s(L2) + [fakes.gpu(B)]
    conf = nova(tmp_path, ('a', carving_body(gpus=L1)),
                ('b', carving_body(gpus='10de:1eb8')),
                ('c', carving_body(gpus='10de:2331')))
    with caplog.at_level(logging.INFO, logger='libvirt_gpu'):
        found = carving.matching(carving.carvings(conf), gpus)
    assert {str(a): c.name for a, c in found.items()} == {L1: 'a', B: 'b'}
    assert [r.getMessage() for r in caplog.records] == [
        '[nova_c]/gpus: no GPU of model 10de:2331 on this host']
    # a model matches the physical GPUs only, never their VFs
    conf = nova(tmp_path, ('a', carving_body(gpus='10de:beef')))
    assert carving.matching(carving.carvings(conf), gpus) == {}
    # one carving naming a GPU twice is no conflict
    conf = nova(tmp_path, ('a', carving_body(gpus='%s, 10de:26b9' % L1)))
    assert sorted(str(a) for a in carving.matching(
        carving.carvings(conf), gpus)) == [L1, L2]


def test_matching_refusals(tmp_path):
    gpus = l40s(L1) + l40s(L2)
    conf = nova(tmp_path, ('a', carving_body(gpus='0000:01:00.0')))
    assert reason(carving.matching, carving.carvings(conf), gpus) == (
        '[nova_a]/gpus names 0000:01:00.0, but this host has no GPU there '
        '(`libvirt-gpu list` shows the GPUs)')
    conf = nova(tmp_path, ('a', carving_body(gpus='0000:bd:00.5')))
    assert reason(carving.matching, carving.carvings(conf), gpus) == (
        '[nova_a]/gpus names 0000:bd:00.5, a VF of the GPU 0000:bd:00.0; '
        'name the physical GPU (the VFs are chosen by count)')
    conf = nova(tmp_path, ('a', carving_body(gpus=L2)),
                ('b', carving_body(gpus='10de:26b9')))
    assert reason(carving.matching, carving.carvings(conf), gpus) == (
        'the GPU 0000:bd:00.0 is claimed by two carvings, [nova_a] and '
        '[nova_b]; give each GPU to one carving')


# --- carving: resolve --------------------------------------------------------

def test_resolve_takes_the_lowest_vfs_in_address_order(tmp_path):
    gpus = l40s(L2) + l40s(L1)
    conf = nova(tmp_path, ('a', carving_body(gpus='10de:26b9', count=3)))
    found = layouts.carved(conf, gpus, {})
    assert [(str(c.gpu), [str(v) for v in c.vfs]) for c in found] == [
        (L1, ['0000:3d:00.4', '0000:3d:00.5', '0000:3d:00.6']),
        (L2, ['0000:bd:00.4', '0000:bd:00.5', '0000:bd:00.6'])]
    first = found[0]
    assert (first.type_name, first.vendor_id, first.product_id,
            first.resource_class, first.alias, first.type_id) == (
        'NVIDIA L40S-12Q', '10de', 'beef', 'CUSTOM_NVIDIA_L40S_12Q',
        'l40s-12q', T_12Q)
    assert layouts.carved(load(tmp_path, '[gpu]\n'), gpus, {}) == ()


def test_a_gpu_carved_and_enabled_is_refused_unless_in_a_layout(tmp_path):
    gpus = l40s(L2)
    conf = nova(tmp_path, ('a', carving_body()))
    enabled = {addr(L2): objects.EnabledType(T_24Q)}
    assert reason(layouts.carved, conf, gpus, enabled) == (
        'a GPU can\'t be claimed by two routes: [nova_a] carves '
        '0000:bd:00.0 for Nova and [gpu]/enabled_vgpu_types enables '
        'nvidia-1154 on it for libvirt-gpu\'s own guests; give it to one '
        'route (docs/admin/nova.md, "Moving a GPU between routes")')
    # another GPU enabled: no conflict
    (found,) = layouts.carved(conf, gpus, {addr(L1): enabled[addr(L2)]})
    assert found.gpu == addr(L2)
    # in a layout, the layout's type yields to the carving
    text = ('[gpu]\nlayouts = one\n[layout_one]\ngpus = 10de:26b9\n'
            'mode = time-sliced\nvgpu_types = nvidia-1154\n'
            '[nova]\ncarved = a\n[nova_a]\n' + carving_body())
    (found,) = layouts.carved(load(tmp_path, text), gpus, enabled)
    assert found.gpu == addr(L2)


def test_an_mdev_gpu_cannot_be_carved(tmp_path):
    conf = nova(tmp_path, ('a', carving_body(gpus=B)))
    assert reason(layouts.carved, conf, [fakes.gpu(B)], {}) == (
        '[nova_a] names the GPU 0000:af:00.0, whose vGPUs are mdevs: a '
        'carving writes a type to VFs through a vendor interface (NVIDIA '
        'vGPU 17+ on a kernel >= 6.8); give this GPU to Nova\'s mdev route '
        '([devices]/enabled_mdev_types) instead')


def test_a_type_not_offered_names_what_is_and_why(tmp_path):
    conf = nova(tmp_path, ('a', carving_body(vgpu_type='nvidia-1155')))
    unnamed = vtype('nvidia-1160', None, None)
    assert reason(layouts.carved, conf,
                  l40s(L2, creatable=(TYPE_12Q, unnamed)), {}) == (
        '[nova_a]/vgpu_type = nvidia-1155: the GPU 0000:bd:00.0 does not '
        'offer it (it offers: nvidia-1153 (NVIDIA L40S-12Q), nvidia-1160)')
    # its VFs hold a type: the GPU offers that size only
    gpus = l40s(L2, creatable=(TYPE_24Q,), current={
        4: TYPE_24Q, 6: TYPE_24Q, 7: TYPE_12Q})
    assert reason(layouts.carved, conf, gpus, {}) == (
        '[nova_a]/vgpu_type = nvidia-1155: the GPU 0000:bd:00.0 does not '
        'offer it (it offers: nvidia-1154 (NVIDIA L40S-24Q), nvidia-1153 '
        '(NVIDIA L40S-12Q)); its VFs hold nvidia-1153, nvidia-1154 now, and '
        'a GPU in equal-size mode offers only types of that size')
    # no VF enabled: restore enables them
    (pf,) = l40s(L2, vfs=0, driver=None)
    assert reason(layouts.carved, conf, [pf], {}) == (
        '[nova_a]/vgpu_type = nvidia-1155: the GPU 0000:bd:00.0 does not '
        'offer it (it offers: none); its VFs are not enabled (driver '
        'none): `libvirt-gpu restore` enables them')
    (pf,) = l40s(L2, vfs=0)
    assert reason(layouts.carved, conf, [pf], {}).endswith(
        '(it offers: none); its VFs are not enabled (driver nvidia): '
        '`libvirt-gpu restore` enables them')
    # VFs enabled that offer nothing: no hint
    assert reason(layouts.carved, conf, l40s(L2, creatable=()), {}) == (
        '[nova_a]/vgpu_type = nvidia-1155: the GPU 0000:bd:00.0 does not '
        'offer it (it offers: none)')


def test_exactly_the_vfs_enabled_fit_and_one_more_is_refused(tmp_path):
    gpus = l40s(L2, vfs=3, creatable=(vtype('nvidia-1153',
                                            'NVIDIA L40S-12Q', 8),))
    conf = nova(tmp_path, ('a', carving_body(count=3)))
    (found,) = layouts.carved(conf, gpus, {})
    assert len(found.vfs) == 3
    conf = nova(tmp_path, ('a', carving_body(count=4)))
    assert reason(layouts.carved, conf, gpus, {}) == (
        '[nova_a]/count = 4: the GPU 0000:bd:00.0 has 3 VFs enabled')


def test_exactly_the_most_of_a_type_fits_with_what_other_vfs_hold(
        tmp_path):
    # 4 L40S-12Q at most; VF 9 (not carved) holds one
    gpus = l40s(L2, vfs=8, current={9: TYPE_12Q, 5: TYPE_24Q})
    conf = nova(tmp_path, ('a', carving_body(count=3)))
    (found,) = layouts.carved(conf, gpus, {})
    assert [str(v) for v in found.vfs] == [
        '0000:bd:00.4', '0000:bd:00.5', '0000:bd:00.6']
    conf = nova(tmp_path, ('a', carving_body(count=4)))
    assert reason(layouts.carved, conf, gpus, {}) == (
        '[nova_a]/count = 4: the GPU 0000:bd:00.0 holds at most 4 vGPUs of '
        'nvidia-1153 (NVIDIA L40S-12Q) besides the 1 its other VFs hold; '
        'lower the count')
    # a carved VF's own vGPU is not counted twice
    gpus = l40s(L2, vfs=8, current={4: TYPE_12Q, 5: TYPE_12Q})
    conf = nova(tmp_path, ('a', carving_body(count=4)))
    (found,) = layouts.carved(conf, gpus, {})
    assert len(found.vfs) == 4
    conf = nova(tmp_path, ('a', carving_body(count=5)))
    assert reason(layouts.carved, conf, gpus, {}) == (
        '[nova_a]/count = 5: the GPU 0000:bd:00.0 holds at most 4 vGPUs of '
        'nvidia-1153 (NVIDIA L40S-12Q); lower the count')


def test_a_type_without_a_name_or_maximum(tmp_path):
    bare = vtype('nvidia-1153', None, None)
    gpus = l40s(L2, vfs=8, creatable=(bare,))
    conf = nova(tmp_path, ('a', carving_body(count=8)))
    assert reason(layouts.carved, conf, gpus, {}) == (
        '[nova_a]: the GPU 0000:bd:00.0 lists nvidia-1153 without a name, '
        'so neither resource_class nor alias can be derived from it; set '
        'both')
    # the record's name serves
    (found,) = layouts.carved(conf, gpus, {},
                              {T_12Q: 'NVIDIA L40S-12Q'})
    assert (found.type_name, found.resource_class, found.alias) == (
        'NVIDIA L40S-12Q', 'CUSTOM_NVIDIA_L40S_12Q', 'l40s-12q')
    # one of the two set is not enough
    conf = nova(tmp_path, ('a', carving_body(
        count=8, extra='resource_class = CUSTOM_X')))
    with pytest.raises(exception.ConfigError):
        layouts.carved(conf, gpus, {})
    conf = nova(tmp_path, ('a', carving_body(count=8, extra='alias = x')))
    with pytest.raises(exception.ConfigError):
        layouts.carved(conf, gpus, {})
    conf = nova(tmp_path, ('a', carving_body(
        count=8, extra='alias = x\nresource_class = CUSTOM_X')))
    (found,) = layouts.carved(conf, gpus, {})
    assert (found.type_name, found.resource_class, found.alias) == (
        None, 'CUSTOM_X', 'x')
    # a maximum of the type exceeded, the type unnamed
    gpus = l40s(L2, vfs=3, creatable=(vtype('nvidia-1153', None, 2),))
    conf = nova(tmp_path, ('a', carving_body(count=3)))
    assert reason(layouts.carved, conf, gpus, {}) == (
        '[nova_a]/count = 3: the GPU 0000:bd:00.0 holds at most 2 vGPUs of '
        'nvidia-1153 (unnamed); lower the count')


def test_one_resource_class_per_type_and_one_alias_per_kind(tmp_path):
    gpus = l40s(L1) + l40s(L2)
    conf = nova(tmp_path, ('a', carving_body(
        gpus=L1, extra='resource_class = CUSTOM_X')),
        ('b', carving_body(vgpu_type='nvidia-1154',
                           extra='resource_class = CUSTOM_X')))
    assert reason(layouts.carved, conf, gpus, {}) == (
        'resource class CUSTOM_X names two types: nvidia-1153 ([nova_a]) '
        'and nvidia-1154 ([nova_b]); give each type its own resource_class')
    conf = nova(tmp_path, ('a', carving_body(gpus=L1, extra='alias = x')),
                ('b', carving_body(vgpu_type='nvidia-1154',
                                   extra='alias = x')))
    assert reason(layouts.carved, conf, gpus, {}) == (
        'alias x names two kinds of VF: CUSTOM_NVIDIA_L40S_12Q on '
        '10de:beef ([nova_a]) and CUSTOM_NVIDIA_L40S_24Q on 10de:beef '
        '([nova_b]); give each its own alias')
    # one type on two GPUs shares both
    conf = nova(tmp_path, ('a', carving_body(gpus=L1, extra='alias = x')),
                ('b', carving_body(extra='alias = x')))
    assert [c.alias for c in layouts.carved(conf, gpus, {})] == ['x', 'x']


# --- carving: the record -----------------------------------------------------

@pytest.mark.parametrize('state_dir', ['', None, 'relative/state'])
def test_a_record_needs_an_absolute_state_dir(state_dir):
    assert refusal(carve_record.CarveRecord, state_dir) == (
        'Configuration error: state_dir %r must be an absolute path'
        % (state_dir,))


def test_a_record_written_reads_back(tmp_path):
    state_dir = tmp_path / 'state'
    record = carve_record.CarveRecord(state_dir)
    assert record.path == str(state_dir / 'nova-carved.json')
    assert record.read() == {}
    vf = addr('0000:bd:00.4')
    entry = carve_record.CarvedVf(vf=vf, gpu=addr(L2), type_id=T_12Q,
                                  carving='a', type_name='NVIDIA L40S-12Q')
    other = carve_record.CarvedVf(vf=addr('0000:3d:00.4'), gpu=addr(L1),
                                  type_id=T_24Q, carving='b')
    with record.locked() as entries:
        entries[vf] = entry
        entries[other.vf] = other
    assert record.read() == {vf: entry, other.vf: other}
    import json
    with open(record.path) as f:
        assert json.load(f) == {'version': 1, 'vfs': {
            '0000:3d:00.4': {'gpu': L1, 'type_id': 'nvidia-1154',
                             'type_name': None, 'carving': 'b'},
            '0000:bd:00.4': {'gpu': L2, 'type_id': 'nvidia-1153',
                             'type_name': 'NVIDIA L40S-12Q',
                             'carving': 'a'}}}


ENTRY = {'gpu': L2, 'type_id': 'nvidia-1153', 'type_name': None,
         'carving': 'a'}


@pytest.mark.parametrize('document, said', [
    ([], 'not a version 1 record'),
    ({'version': 2, 'vfs': {}}, 'not a version 1 record'),
    ({'vfs': {}}, 'not a version 1 record'),
    ({'version': 1, 'vfs': []}, 'not a version 1 record'),
    ({'version': 1}, 'not a version 1 record'),
    ({'version': 1, 'vfs': {'bd:00.4': ENTRY}},
     "entry 'bd:00.4' is invalid: 'bd:00.4' is not a PCI address; "
     "expected the form DDDD:BB:SS.F in hex digits, e.g. 0000:af:00.0"),
    ({'version': 1, 'vfs': {'0000:bd:00.4': dict(ENTRY, carving=1)}},
     "entry '0000:bd:00.4' is invalid: carving or type_name"),
    ({'version': 1, 'vfs': {'0000:bd:00.4': dict(ENTRY, type_name=1)}},
     "entry '0000:bd:00.4' is invalid: carving or type_name"),
    ({'version': 1, 'vfs': {'0000:bd:00.4': {
        k: v for k, v in ENTRY.items() if k != 'carving'}}},
     "entry '0000:bd:00.4' is invalid: 'carving'"),
    ({'version': 1, 'vfs': {'0000:bd:00.4': dict(ENTRY, gpu='x')}},
     "entry '0000:bd:00.4' is invalid: 'x' is not a PCI address; "
     "expected the form DDDD:BB:SS.F in hex digits, e.g. 0000:af:00.0"),
])
def test_a_bad_record_is_refused_naming_the_file(tmp_path, document, said):
    import json
    (tmp_path / 'nova-carved.json').write_text(json.dumps(document))
    record = carve_record.CarveRecord(str(tmp_path))
    with pytest.raises(exception.StateError) as e:
        record.read()
    assert str(e.value) == 'State file %s: %s; %s' % (
        record.path, said, carve_record.REMEDY)


def test_a_record_without_a_type_name_reads_as_none(tmp_path):
    import json
    entry = {k: v for k, v in ENTRY.items() if k != 'type_name'}
    (tmp_path / 'nova-carved.json').write_text(json.dumps(
        {'version': 1, 'vfs': {'0000:BD:00.4': entry}}))
    assert carve_record.CarveRecord(str(tmp_path)).read() == {
        addr('0000:bd:00.4'): carve_record.CarvedVf(
            vf=addr('0000:bd:00.4'), gpu=addr(L2), type_id=T_12Q,
            carving='a')}


def test_carved_views_of_plan_and_record(tmp_path):
    gpus = l40s(L1) + l40s(L2)
    conf = nova(tmp_path, ('a', carving_body(gpus=L1, count=1)))
    planned = layouts.carved(conf, gpus, {})
    recorded = (carve_record.CarvedVf(vf=addr('0000:bd:00.4'),
                                      gpu=addr(L2), type_id=T_12Q,
                                      carving='a'),)
    both = carving.Carved(planned=planned, recorded=recorded)
    assert both.gpus == {addr(L1), addr(L2)}
    assert both.vfs == {addr('0000:3d:00.4'), addr('0000:bd:00.4')}
    assert both.of_gpu(addr(L1)) is planned[0]
    assert both.of_gpu(addr(L2)) is None
    assert carving.section('x') == 'nova_x'


# --- discovery: a hand-written host ------------------------------------------
#
# libvirt's test driver reads a node-device XML written here, and a sysfs
# tree of a few files beside it: each device only with what the test needs.

COMPUTER = ('<device><name>computer</name><capability type="system">'
            '<hardware><vendor>x</vendor><uuid>'
            '2e884e71-9d54-5570-b870-a9fc64b313ac</uuid></hardware>'
            '<firmware><vendor>x</vendor></firmware></capability></device>')


def node_device(address, vendor='10de', product='1eb8', cls='0x030200',
                group=None, members=(), name=None, extra=''):
    """One PCI node device as libvirt writes it (``cls`` None: no
    ``<class>``, as libvirt < 5.2); ``members``: its IOMMU group's
    addresses (itself when empty)."""
    a = addr(address)
    xml = ('<device><name>%s</name><parent>computer</parent>'
           '<capability type="pci">' % (name or a.libvirt_name))
    if cls is not None:
        xml += '<class>%s</class>' % cls
    xml += ('<domain>%d</domain><bus>%d</bus><slot>%d</slot>'
            '<function>%d</function><product id="0x%s">Product %s</product>'
            '<vendor id="0x%s">Vendor %s</vendor>'
            % (a.domain, a.bus, a.slot, a.function, product, product,
               vendor, vendor))
    xml += extra
    if group is not None:
        xml += '<iommuGroup number="%d">' % group
        for m in [addr(t) for t in (members or (address,))]:
            xml += ('<address domain="0x%04x" bus="0x%02x" slot="0x%02x" '
                    'function="0x%x"/>' % (m.domain, m.bus, m.slot,
                                           m.function))
        xml += '</iommuGroup>'
    return xml + '<numa node="0"/></capability></device>'


def write_node_xml(directory, *devices):
    path = directory / 'node.xml'
    path.write_text('<node>%s%s</node>' % (COMPUTER, ''.join(devices)))
    return 'test://%s' % path


def sysfs_device(root, address, vendor='10de', product='1eb8',
                 cls='0x030200', driver=None, group=None, files=None):
    """One PCI function in the sysfs tree at ``root``."""
    import os
    dev = root / 'devices' / 'pci0000:00' / address
    dev.mkdir(parents=True)
    for name, text in [('vendor', '0x' + vendor), ('device', '0x' + product),
                       ('class', cls)] + sorted((files or {}).items()):
        if text is not None:
            (dev / name).write_text(text + '\n')
    if driver is not None:
        os.symlink('../../../bus/pci/drivers/' + driver, dev / 'driver')
    if group is not None:
        groups = root / 'kernel' / 'iommu_groups' / str(group) / 'devices'
        groups.mkdir(parents=True, exist_ok=True)
        os.symlink('../../../kernel/iommu_groups/%d' % group,
                   dev / 'iommu_group')
        os.symlink('../../../../devices/pci0000:00/' + address,
                   groups / address)
    devices = root / 'bus' / 'pci' / 'devices'
    devices.mkdir(parents=True, exist_ok=True)
    os.symlink('../../../devices/pci0000:00/' + address, devices / address)
    return dev


def from_libvirt(uri, root=None):
    from libvirt_gpu.devices import discovery
    from libvirt_gpu.devices import sysfs as sysfs_mod
    from libvirt_gpu.virt import host
    with host.Host(uri, read_only=True) as h:
        return discovery.from_libvirt(
            h, sysfs_mod.Sysfs(str(root)) if root is not None else None,
            kinds=())


def gpu_of(result, address):
    return result.gpu(addr(address))


GPU = '0000:01:00.0'
AUDIO = '0000:01:00.1'
OTHER = '0000:02:00.0'
STORAGE = '0000:00:17.0'


def test_libvirt_group_members_described_and_judged(tmp_path):
    """The group of the GPU lists its audio function (a node device) and a
    device libvirt has no node device of: each is a member; sysfs, given,
    adds the drivers libvirt's test driver keeps none of."""
    group = dict(group=5, members=(GPU, AUDIO, OTHER, STORAGE))
    uri = write_node_xml(
        tmp_path, node_device(AUDIO, product='10fa', cls='0x040300',
                              **group),
        node_device(STORAGE, vendor='8086', product='a282',
                    cls='0x010601', **group),
        node_device(GPU, **group))
    (gpu,) = from_libvirt(uri).gpus
    assert [(str(m.address), m.vendor_id, m.class_code, m.driver,
             m.companion) for m in gpu.iommu_members] == [
        (STORAGE, '8086', '0x010601', None, False),
        (GPU, '10de', '0x030200', None, False),
        (AUDIO, '10de', '0x040300', None, True),
        (OTHER, None, None, None, False)]
    root = tmp_path / 'sys'
    sysfs_device(root, GPU, driver='nvidia', group=5,
                 files={'local_cpulist': '0-7'})
    sysfs_device(root, AUDIO, product='10fa', cls='0x040300',
                 driver='snd_hda_intel', group=5)
    sysfs_device(root, OTHER, vendor='8086', product='2822',
                 cls='0x010601', driver='ahci', group=5)
    sysfs_device(root, STORAGE, vendor='8086', product='a282',
                 cls='0x010601', driver='ahci', group=5)
    (gpu,) = from_libvirt(uri, root).gpus
    assert (gpu.driver, gpu.local_cpulist) == ('nvidia', '0-7')
    assert [(str(m.address), m.driver, m.companion, m.host_uses,
             m.host_class) for m in gpu.iommu_members] == [
        (STORAGE, 'ahci', False, True, 'storage controller'),
        (GPU, 'nvidia', False, False, None),
        (AUDIO, 'snd_hda_intel', True, False, None),
        (OTHER, 'ahci', False, False, None)]


def test_a_gpu_without_a_group_keeps_no_members(tmp_path):
    uri = write_node_xml(tmp_path, node_device(GPU))
    (gpu,) = from_libvirt(uri).gpus
    assert (gpu.iommu_group, gpu.iommu_members) == (None, ())


def test_libvirt_without_class_nvidia_function_zero_only(tmp_path):
    """libvirt < 5.2 writes no ``<class>``: without this machine's sysfs,
    an NVIDIA function 0 is taken for a GPU, its other functions and
    other vendors' devices are not; a class other than a GPU's is never
    one."""
    uri = write_node_xml(
        tmp_path, node_device('0000:04:00.0', cls=None),
        node_device('0000:03:00.1', cls=None),
        node_device('0000:03:00.0', vendor='8086', cls=None),
        node_device('0000:05:00.0', cls='0x020000'),
        node_device('0000:06:00.0', cls='0x030000'),
        # an NVIDIA VF, and a function offering vGPU types
        node_device('0000:04:00.5', cls=None, extra=(
            '<capability type="phys_function"><address domain="0x0000" '
            'bus="0x04" slot="0x00" function="0x0"/></capability>')),
        node_device('0000:04:00.6', cls=None,
                    extra=mdev_types_xml('nvidia-222')),
        node_device('0000:03:00.6', vendor='8086', cls=None,
                    extra=mdev_types_xml('nvidia-222')))
    result = from_libvirt(uri)
    assert result.source == 'libvirt'
    assert [(str(g.address), g.class_code) for g in result.gpus] == [
        ('0000:04:00.0', None), ('0000:04:00.5', None),
        ('0000:04:00.6', None), ('0000:06:00.0', '0x030000')]


def test_libvirt_without_class_reads_the_class_from_sysfs(tmp_path, caplog):
    uri = write_node_xml(
        tmp_path, node_device('0000:04:00.1', cls=None),
        node_device('0000:04:00.0', vendor='8086', cls=None),
        node_device('0000:05:00.0', cls=None),
        node_device('0000:06:00.0', cls=None),
        node_device('0000:07:00.0', cls=None))
    root = tmp_path / 'sys'
    sysfs_device(root, '0000:04:00.1', cls='0x030200')
    sysfs_device(root, '0000:04:00.0', vendor='8086', cls='0x038000')
    sysfs_device(root, '0000:05:00.0', cls='0x040300')
    dev = sysfs_device(root, '0000:06:00.0', cls=None)
    (dev / 'class').mkdir()
    with caplog.at_level(logging.WARNING, logger='libvirt_gpu'):
        result = from_libvirt(uri, root)
    # 07:00.0 has no sysfs entry here: judged as without sysfs
    assert [(str(g.address), g.class_code) for g in result.gpus] == [
        ('0000:04:00.0', '0x038000'), ('0000:04:00.1', '0x030200'),
        ('0000:07:00.0', None)]
    (record,) = caplog.records
    assert record.getMessage().startswith(
        'PCI device 0000:06:00.0 skipped: ')
    assert '0000:06:00.0/class' in record.getMessage()


def test_libvirt_lists_an_address_twice_and_neither_is_kept(
        tmp_path, caplog):
    uri = write_node_xml(tmp_path, node_device(GPU, product='1eb8'),
                         node_device(GPU, product='1eb9', name='pci_again'),
                         node_device(OTHER))
    with caplog.at_level(logging.WARNING, logger='libvirt_gpu'):
        result = from_libvirt(uri)
    assert [str(g.address) for g in result.gpus] == [OTHER]
    assert [r.getMessage() for r in caplog.records] == [
        'PCI device 0000:01:00.0 skipped: it is listed 2 times; which one '
        'is the device cannot be told']


def mdev_types_xml(*type_ids):
    return '<capability type="mdev_types">%s</capability>' % ''.join(
        '<type id="%s"><name>GRID %s</name><deviceAPI>vfio-pci</deviceAPI>'
        '<availableInstances>4</availableInstances></type>' % (t, t)
        for t in type_ids)


def sysfs_type(dev, type_id, description):
    tdir = dev / 'mdev_supported_types' / type_id
    tdir.mkdir(parents=True)
    for name, text in [('name', 'GRID ' + type_id),
                       ('device_api', 'vfio-pci'),
                       ('available_instances', '4'),
                       ('description', description)]:
        if text is not None:
            (tdir / name).write_text(text + '\n')
    return tdir


def test_sysfs_supplies_descriptions_drivers_and_cpus(tmp_path, caplog):
    uri = write_node_xml(
        tmp_path,
        node_device(GPU, extra=mdev_types_xml('nvidia-222', 'nvidia-223',
                                              'nvidia-224')),
        node_device(OTHER, extra=mdev_types_xml('nvidia-222')),
        node_device('0000:03:00.0'), node_device('0000:04:00.0'),
        # more after it: libvirt lists node devices in an order of its own
        *[node_device('0000:%02x:00.0' % n) for n in range(8, 14)])
    root = tmp_path / 'sys'
    dev = sysfs_device(root, GPU, driver='nvidia')
    sysfs_type(dev, 'nvidia-222', 'max_instance=16')
    sysfs_type(dev, 'nvidia-223', None)
    (sysfs_type(dev, 'nvidia-224', 'x') / 'available_instances').unlink()
    (dev / 'mdev_supported_types' / 'nvidia-224' /
     'available_instances').mkdir()
    # a GPU whose sysfs lists no type directory keeps libvirt's types
    sysfs_device(root, OTHER, files={'local_cpulist': '8-15'})
    # its local_cpulist unreadable: the GPU is left out, said
    bad = sysfs_device(root, '0000:03:00.0', driver='nvidia')
    (bad / 'local_cpulist').mkdir()
    with caplog.at_level(logging.WARNING, logger='libvirt_gpu'):
        result = from_libvirt(uri, root)
    gpu = gpu_of(result, GPU)
    assert [(t.id, t.name, t.description) for t in gpu.mdev_types] == [
        ('nvidia-222', 'GRID nvidia-222', 'max_instance=16'),
        ('nvidia-223', 'GRID nvidia-223', None),
        ('nvidia-224', 'GRID nvidia-224', None)]
    assert (gpu.driver, gpu.local_cpulist) == ('nvidia', None)
    other = gpu_of(result, OTHER)
    assert [(t.id, t.description) for t in other.mdev_types] == [
        ('nvidia-222', None)]
    assert (other.driver, other.local_cpulist) == (None, '8-15')
    # no sysfs entry: as libvirt has it
    assert gpu_of(result, '0000:04:00.0').driver is None
    assert [str(g.address) for g in result.gpus] == [
        GPU, OTHER, '0000:04:00.0'] + [
        '0000:%02x:00.0' % n for n in range(8, 14)]
    # (libvirt lists the devices in an order of its own)
    cpus, types = sorted(r.getMessage() for r in caplog.records)
    assert types.startswith('type description skipped: ')
    assert 'nvidia-224/available_instances' in types
    assert cpus.startswith('PCI device 0000:03:00.0 skipped: ')
    assert '0000:03:00.0/local_cpulist' in cpus


# --- discovery: which source -------------------------------------------------

PCI_IDS = ('# pci.ids\n10de  NVIDIA Corporation\n'
           '\t1eb8  TU104GL [Tesla T4]\n\t10fa  GP102 HDMI Audio\n')


def small_host(tmp_path):
    """A T4 known to libvirt (test driver) and to sysfs: ``(uri, root,
    pci_ids)``."""
    from libvirt_gpu.devices import pciids
    uri = write_node_xml(tmp_path, node_device(GPU))
    root = tmp_path / 'sys'
    sysfs_device(root, GPU, driver='nvidia')
    (tmp_path / 'pci.ids').write_text(PCI_IDS)
    return uri, str(root), pciids.PciIds(str(tmp_path / 'pci.ids'))


def names(result):
    return [(result.source, str(g.address), g.driver, g.vendor_name,
             g.product_name) for g in result.gpus]


def test_discover_sysfs_when_named(tmp_path):
    from libvirt_gpu.devices import discovery
    uri, root, ids = small_host(tmp_path)
    assert names(discovery.discover(sysfs_root=root, pci_ids=ids,
                                    default_uri=uri, kinds=())) == [
        ('sysfs', GPU, 'nvidia', 'NVIDIA Corporation',
         'TU104GL [Tesla T4]')]
    assert names(discovery.discover(sysfs_root=root, kinds=())) == [
        ('sysfs', GPU, 'nvidia', None, None)]


def test_discover_libvirt_named_with_the_sysfs_named(tmp_path):
    from libvirt_gpu.devices import discovery
    uri, root, ids = small_host(tmp_path)
    # libvirt names the GPU itself; sysfs adds the driver
    assert names(discovery.discover(uri=uri, sysfs_root=root, pci_ids=ids,
                                    kinds=())) == [
        ('libvirt', GPU, 'nvidia', 'Vendor 10de', 'Product 1eb8')]
    # a test:/// URI describes no host: this machine's sysfs is not read
    assert names(discovery.discover(uri=uri, default_sysfs_root=root,
                                    kinds=())) == [
        ('libvirt', GPU, None, 'Vendor 10de', 'Product 1eb8')]


def test_discover_the_configured_libvirt_with_its_sysfs(tmp_path):
    from libvirt_gpu.devices import discovery
    uri, root, ids = small_host(tmp_path)
    assert names(discovery.discover(default_uri=uri, default_sysfs_root=root,
                                    pci_ids=ids, kinds=())) == [
        ('libvirt', GPU, 'nvidia', 'Vendor 10de', 'Product 1eb8')]


def test_discover_falls_back_to_the_configured_sysfs_and_says_so(
        tmp_path, caplog):
    from libvirt_gpu.devices import discovery
    _uri, root, ids = small_host(tmp_path)
    down = 'qemu:///system?socket=%s/none' % tmp_path
    with caplog.at_level(logging.WARNING, logger='libvirt_gpu'):
        result = discovery.discover(default_uri=down,
                                    default_sysfs_root=root, pci_ids=ids,
                                    kinds=())
    assert names(result) == [('sysfs', GPU, 'nvidia', 'NVIDIA Corporation',
                              'TU104GL [Tesla T4]')]
    (record,) = caplog.records
    assert record.getMessage().startswith('libvirt unavailable (')
    assert record.getMessage().endswith(
        '); reading sysfs at %s instead' % root)


def test_with_names_fills_only_what_is_missing(tmp_path):
    from libvirt_gpu.devices import discovery
    _uri, _root, ids = small_host(tmp_path)
    named = fakes.gpu(GPU)
    named = records.replace(named, vendor_name='V', product_name='P')
    half = records.replace(fakes.gpu(B), vendor_name='V')
    unknown = fakes.gpu(C, vendor_id='1234')
    result = objects.DiscoveryResult(source='libvirt', gpus=(named,))
    assert discovery.with_names(result, ids, ()) is result
    assert discovery.with_names(result, None, ()) is result
    result = objects.DiscoveryResult(source='libvirt',
                                     gpus=(named, half, unknown))
    assert [(g.vendor_name, g.product_name) for g in discovery.with_names(
        result, ids, ()).gpus] == [('V', 'P'), ('V', 'TU104GL [Tesla T4]'),
                                   (None, None)]
    # the VFs regrouped, completed by the kinds
    pf = records.replace(fakes.gpu(A), virtfns=(addr('0000:3b:00.4'),))
    vf = records.replace(vf_of(pf, 4), vendor_vf=objects.VendorVf())
    result = objects.DiscoveryResult(source='sysfs', gpus=(pf, vf))
    pf, vf = discovery.with_names(result, ids, (Completing,)).gpus
    assert (pf.vendor_name, vf.product_name) == (
        'NVIDIA Corporation', 'TU104GL [Tesla T4]+0')
    assert pf.vf_gpus == (vf,)


def test_with_nvml_adds_what_nvml_sees(tmp_path):
    from libvirt_gpu.devices import discovery

    class Nvml(object):
        def __init__(self, found):
            self.found = found

        def query(self):
            return self.found
    info = objects.NvmlGpu(name='NVIDIA T4', memory_total_mib=16384,
                           virtualization_mode='vgpu_host', mig_enabled=None)
    named = records.replace(fakes.gpu(A), product_name='Tesla T4')
    result = objects.DiscoveryResult(source='sysfs', gpus=(
        named, fakes.gpu(B), fakes.gpu(C)))
    assert discovery.with_nvml(result, None, ()) is result
    assert discovery.with_nvml(result, Nvml({}), ()) is result
    found = discovery.with_nvml(result, Nvml({addr(A): info, addr(B): info}),
                                ())
    assert found.source == 'sysfs'
    assert [(g.product_name, g.nvml) for g in found.gpus] == [
        ('Tesla T4', info), ('NVIDIA T4', info), (None, None)]


@pytest.mark.parametrize('uri, local', [
    ('qemu:///system', True), ('qemu+unix:///system', True),
    ('qemu:///session', True), ('qemu+ssh://other/system', False),
    ('qemu://host/system', False), ('qemu+tcp:///system', False),
    ('test:///default', False), ('test+unix:///default', False),
    ('///system', False), ('', False), ('qemu://[::1/system', False)])
def test_is_local_uri(uri, local):
    from libvirt_gpu.devices import discovery
    assert discovery.is_local_uri(uri) is local


# --- discovery: sysfs ------------------------------------------------------

def test_from_sysfs_reads_gpus_with_their_groups_and_says_what_it_skips(
        tmp_path, caplog):
    from libvirt_gpu.devices import discovery
    from libvirt_gpu.devices import sysfs as sysfs_mod
    root = tmp_path / 'sys'
    dev = sysfs_device(root, GPU, cls='0x030000', driver='nvidia', group=5)
    sysfs_type(dev, 'nvidia-222', 'max_instance=16')
    (sysfs_type(dev, 'nvidia-223', None) / 'available_instances').write_text(
        'many\n')
    sysfs_device(root, AUDIO, product='10fa', cls='0x040300',
                 driver='snd_hda_intel', group=5)
    sysfs_device(root, STORAGE, vendor='8086', product='a282',
                 cls='0x010601', driver='ahci', group=5)
    sysfs_device(root, '0000:05:00.0', cls='0x020000', driver='mlx5_core')
    sysfs_device(root, '0000:06:00.0', files={'numa_node': 'lots'})
    sysfs_device(root, '0000:0A:00.0')
    sysfs_device(root, '0000:0a:00.0')
    sysfs_device(root, '0000:07:00.0', product='1eb9', group=9)
    # an mdev entry that is no link
    mdevs = root / 'bus' / 'mdev' / 'devices'
    mdevs.mkdir(parents=True)
    (mdevs / '4b20d080-1b54-4048-85b3-a6a62d165c01').write_text('')
    (tmp_path / 'pci.ids').write_text(PCI_IDS)
    from libvirt_gpu.devices import pciids
    with caplog.at_level(logging.WARNING, logger='libvirt_gpu'):
        result = discovery.from_sysfs(
            sysfs_mod.Sysfs(str(root)),
            pci_ids=pciids.PciIds(str(tmp_path / 'pci.ids')), kinds=())
    assert result.source == 'sysfs'
    assert [(str(g.address), g.class_code, g.driver, g.product_name)
            for g in result.gpus] == [
        (GPU, '0x030000', 'nvidia', 'TU104GL [Tesla T4]'),
        ('0000:07:00.0', '0x030200', None, None)]
    gpu = result.gpus[0]
    assert [t.id for t in gpu.mdev_types] == ['nvidia-222']
    assert [(str(m.address), m.vendor_id, m.product_id, m.class_code,
             m.driver, m.companion, m.host_uses, m.host_class)
            for m in gpu.iommu_members] == [
        (STORAGE, '8086', 'a282', '0x010601', 'ahci', False, True,
         'storage controller'),
        (GPU, '10de', '1eb8', '0x030000', 'nvidia', False, False, None),
        (AUDIO, '10de', '10fa', '0x040300', 'snd_hda_intel', True, False,
         None)]
    assert [str(m.address) for m in result.gpus[1].iommu_members] == [
        '0000:07:00.0']
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0].startswith('PCI device 0000:06:00.0 skipped: ')
    assert "'lots'" in messages[0]
    assert messages[1].startswith('sysfs entry skipped: ')
    assert '4b20d080-1b54-4048-85b3-a6a62d165c01' in messages[1]
    assert messages[2].startswith('sysfs entry skipped: ')
    assert 'nvidia-223/available_instances' in messages[2]
    assert messages[3:] == [
        'PCI device 0000:0a:00.0 skipped: it is listed 2 times; which one '
        'is the device cannot be told']


def test_two_gpus_of_one_group_each_list_both(tmp_path):
    from libvirt_gpu.devices import discovery
    from libvirt_gpu.devices import sysfs as sysfs_mod
    root = tmp_path / 'sys'
    sysfs_device(root, GPU, driver='nvidia', group=5)
    sysfs_device(root, OTHER, product='1eb9', driver='vfio-pci', group=5)
    first, second = discovery.from_sysfs(sysfs_mod.Sysfs(str(root)),
                                         kinds=()).gpus
    assert first.iommu_members == second.iommu_members
    assert [(str(m.address), m.product_id, m.driver)
            for m in first.iommu_members] == [
        (GPU, '1eb8', 'nvidia'), (OTHER, '1eb9', 'vfio-pci')]


# --- discovery: SR-IOV VFs ------------------------------------------------

PF = '0000:01:00.0'
VF4, VF5, VF6 = '0000:01:00.4', '0000:01:00.5', '0000:01:00.6'


def sriov_tree(root, toy_vfs=(VF4,), mdev_vf=VF6):
    """A PF with the VFs 01:00.4-6: ``toy_vfs`` with the toy kind's
    interface, ``mdev_vf`` with an mdev type too."""
    import os
    from tests.doubles import toy_kind
    pf = sysfs_device(root, PF, driver='nvidia')
    for n, vf in enumerate((VF4, VF5, VF6)):
        dev = sysfs_device(root, vf, product='1eb9', driver='nvidia')
        os.symlink('../' + PF, dev / 'physfn')
        os.symlink('../' + vf, pf / ('virtfn%d' % n))
        if vf in toy_vfs:
            toy_kind.make_toy_vf(str(root), vf)
        if vf == mdev_vf:
            sysfs_type(dev, 'nvidia-222', None)
    return str(root)


class Completing(capabilities.VendorFunctions):
    """A kind whose ``complete_types`` marks each VF it sees (the second
    of two kinds sees what the first made)."""

    @classmethod
    def read_function(cls, sysfs, address):
        return None

    @classmethod
    def complete_types(cls, pf, vfs):
        return [records.replace(vf, product_name=(vf.product_name or '')
                                + '+%s' % pf.address.function)
                for vf in vfs]


def toy_kinds():
    from tests.doubles import toy_kind
    return (Completing, toy_kind.FullToyKind, Completing)


def test_a_pf_carries_its_vfs_with_their_vendor_interface(tmp_path):
    from libvirt_gpu.devices import discovery
    from libvirt_gpu.devices import sysfs as sysfs_mod
    root = sriov_tree(tmp_path / 'sys', toy_vfs=(VF4, VF6))
    result = discovery.from_sysfs(sysfs_mod.Sysfs(root), kinds=toy_kinds())
    pf, vf4, vf5, vf6 = result.gpus
    assert [str(v.address) for v in pf.vf_gpus] == [VF4, VF5, VF6]
    assert pf.vf_gpus == (vf4, vf5, vf6)
    # the toy VF read by the second kind, the first reading nothing
    assert vf4.vendor_vf.interface == 'toy'
    assert [t.id for t in vf4.vendor_vf.creatable] == ['toy-1', 'toy-2']
    # a VF with mdev types is never asked; one without an interface has none
    assert (vf5.vendor_vf, vf6.vendor_vf) == (None, None)
    # every kind completes the VFs, in order
    assert [v.product_name for v in pf.vf_gpus] == ['+0+0'] * 3
    assert pf.product_name is None
    # the view of one GPU is discovery's
    assert discovery.gpu_view(sysfs_mod.Sysfs(root), addr(PF),
                              toy_kinds()) == pf
    # no VF with an interface: nothing to complete
    root = sriov_tree(tmp_path / 'plain', toy_vfs=())
    pf = discovery.from_sysfs(sysfs_mod.Sysfs(root),
                              kinds=toy_kinds()).gpus[0]
    assert [v.product_name for v in pf.vf_gpus] == [None] * 3


def test_libvirt_vfs_get_their_vendor_interface_from_sysfs(tmp_path):
    root = sriov_tree(tmp_path / 'sys', toy_vfs=(VF4, VF6))

    def link(kind, *addresses):
        return '<capability type="%s">%s</capability>' % (kind, ''.join(
            '<address domain="0x0000" bus="0x01" slot="0x00" '
            'function="0x%s"/>' % a[-1] for a in addresses))
    uri = write_node_xml(
        tmp_path,
        node_device(PF, extra=link('virt_functions', VF4, VF5, VF6)),
        node_device(VF4, product='1eb9', extra=link('phys_function', PF)),
        node_device(VF5, product='1eb9', extra=link('phys_function', PF)),
        node_device(VF6, product='1eb9', extra=link(
            'phys_function', PF) + mdev_types_xml('nvidia-222')))
    from libvirt_gpu.devices import discovery
    from libvirt_gpu.devices import sysfs as sysfs_mod
    from libvirt_gpu.virt import host
    with host.Host(uri, read_only=True) as h:
        result = discovery.from_libvirt(h, sysfs_mod.Sysfs(root),
                                        kinds=toy_kinds())
    pf, vf4, vf5, vf6 = result.gpus
    assert vf4.vendor_vf.interface == 'toy'
    assert (vf5.vendor_vf, vf6.vendor_vf) == (None, None)
    assert pf.vendor_vf is None
    assert [v.product_name for v in pf.vf_gpus] == ['Product 1eb9+0+0'] * 3


def test_group_members_companions_and_devices_the_host_uses():
    from libvirt_gpu.devices import discovery

    def member(address, cls, driver):
        return objects.IommuMember(addr(address), '10de', '0000', cls,
                                   driver)
    gpu = fakes.gpu('0000:01:02.0')
    members = discovery.with_iommu_members(gpu, [
        member('0000:01:02.1', '0x040300', 'snd_hda_intel'),  # its audio
        member('0000:01:02.2', '0x0c0330', 'xhci_hcd'),       # its USB
        member('0000:01:02.3', '0x020000', 'mlx5_core'),      # a NIC
        member('0000:01:03.1', '0x040300', 'snd_hda_intel'),  # other slot
        member('0000:02:02.1', '0x0c0330', 'xhci_hcd'),       # other bus
        member('0001:01:02.1', '0x0c0330', None),             # other domain
        member('0000:01:02.4', '0x010601', 'vfio-pci'),       # held by VFIO
        member('0000:01:02.0', '0x030200', 'nvidia'),         # itself
    ]).iommu_members
    assert [(str(m.address), m.companion, m.host_uses, m.host_class)
            for m in members] == [
        ('0000:01:02.0', False, False, None),
        ('0000:01:02.1', True, False, None),
        ('0000:01:02.2', True, False, None),
        ('0000:01:02.3', False, True, 'network controller'),
        ('0000:01:02.4', False, False, None),
        ('0000:01:03.1', False, False, None),
        ('0000:02:02.1', False, True, 'USB controller'),
        ('0001:01:02.1', False, False, None)]


def test_libvirt_mdevs_go_to_their_parent_sorted(tmp_path):
    def mdev(uuid, parent, type_id):
        return ('<device><name>mdev_%s</name><parent>%s</parent>'
                '<capability type="mdev"><type id="%s"/><uuid>%s</uuid>'
                '<iommuGroup number="90"/></capability></device>'
                % (uuid.replace('-', '_'), addr(parent).libvirt_name,
                   type_id, uuid))
    u1 = '4b20d080-1b54-4048-85b3-a6a62d165c01'
    u2 = '0a2b8d1c-1111-4222-8333-944445555666'
    u3 = 'ffffffff-1111-4222-8333-944445555666'
    uri = write_node_xml(
        tmp_path, node_device(GPU, extra=mdev_types_xml('nvidia-222')),
        node_device(OTHER, extra=mdev_types_xml('nvidia-222')),
        mdev(u1, GPU, 'nvidia-222'), mdev(u3, OTHER, 'nvidia-222'),
        mdev(u2, GPU, 'nvidia-222'))
    result = from_libvirt(uri)
    assert [(str(g.address), [m.uuid for m in g.mdevs])
            for g in result.gpus] == [(GPU, [u2, u1]), (OTHER, [u3])]


def test_many_devices_read_by_several_processes_read_as_by_one(tmp_path):
    """130 devices: two processes where two CPUs are there (``fanout``);
    the result and the warnings are those of one."""
    from libvirt_gpu.devices import discovery
    from libvirt_gpu.devices import sysfs as sysfs_mod
    root = tmp_path / 'sys'
    for n in range(130):
        sysfs_device(root, '0000:%02x:00.0' % (n + 1),
                     cls='0x030200' if n % 2 else '0x020000')
    tree = sysfs_mod.Sysfs(str(root))
    alone = discovery.from_sysfs(tree, kinds=())
    assert len(alone.gpus) == 65
    assert discovery.from_sysfs(tree, parallel=True, kinds=()) == alone
    assert discovery.discover(sysfs_root=str(root), parallel=True,
                              kinds=()) == alone


def test_the_vf_ids_are_the_gpus_when_the_first_vf_is_not_listed(tmp_path):
    (pf, *_vfs) = l40s(L2, vfs=4)
    pf = records.replace(pf, vf_gpus=(), vendor_vf=objects.VendorVf(
        creatable=(TYPE_12Q,)))
    conf = nova(tmp_path, ('a', carving_body(count=4)))
    (found,) = layouts.carved(conf, [pf], {})
    assert (found.vendor_id, found.product_id) == ('10de', '26b9')


def test_a_record_of_exactly_the_most_bytes_is_read(tmp_path):
    text = '{"version": 1, "vfs": {}}'
    path = tmp_path / 'nova-carved.json'
    path.write_text(text + ' ' * (1024 * 1024 - len(text)))
    record = carve_record.CarveRecord(str(tmp_path))
    assert record.read() == {}
    path.write_text(text + ' ' * (1024 * 1024 + 1 - len(text)))
    with pytest.raises(exception.StateError):
        record.read()
