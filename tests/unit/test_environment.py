"""The composition root (``environment.Environment``): what it keeps, and
the places the vGPU kinds declare (``VgpuKind.places``), which it hands on
without naming them."""

import pytest

from libvirt_gpu.devices.backends import mdev as mdev_backend
from libvirt_gpu.devices.backends import registry
from libvirt_gpu import environment


def test_a_kind_s_place_defaults_to_what_the_kind_declares(tmp_path):
    env = environment.Environment(str(tmp_path / 'state'),
                                  sysfs_root=str(tmp_path))
    assert env.place('mdevctl_dir') == mdev_backend.MDEVCTL_DIR
    assert env.vgpus.kind(mdev_backend.MdevBackend.name).mdevctl_dir == \
        mdev_backend.MDEVCTL_DIR


def test_a_kind_s_place_given_reaches_the_kind_and_survives_replace(
        tmp_path):
    where = str(tmp_path / 'mdevctl.d')
    env = environment.Environment(str(tmp_path / 'state'),
                                  sysfs_root=str(tmp_path), mdevctl_dir=where)
    assert env.place('mdevctl_dir') == where
    assert env.vgpus.kind(mdev_backend.MdevBackend.name).mdevctl_dir == where
    again = env.replace(remove_timeout=1.0)
    assert again.place('mdevctl_dir') == where
    # None (a command-line option not given) is the kind's default
    assert env.replace(mdevctl_dir=None).place('mdevctl_dir') == \
        mdev_backend.MDEVCTL_DIR


def test_a_place_no_kind_declares_is_refused(tmp_path):
    with pytest.raises(TypeError, match='mdevctl_dirr.*known: mdevctl_dir'):
        environment.Environment(str(tmp_path), sysfs_root=str(tmp_path),
                                mdevctl_dirr=str(tmp_path))


def test_places_are_the_registered_kinds_own(tmp_path):
    declared = {place.name for cls in registry.kind_classes()
                for place in cls.places}
    env = environment.Environment(str(tmp_path), sysfs_root=str(tmp_path))
    assert set(env.places) == declared and declared


def test_discovery_sees_a_kind_s_functions_only_through_the_kinds_given():
    """Discovery names no kind: the VFs of NVIDIA's vendor interface are
    read by the kinds its caller hands it, and by none without them."""
    from libvirt_gpu.devices import discovery
    from libvirt_gpu.devices import sysfs as sysfs_mod
    from tests.doubles import trees
    with trees.simulated_tree('l40s', without_mdevs=True) as (root, _):
        sysfs = sysfs_mod.Sysfs(root)
        kinds = environment.Environment(root, sysfs=sysfs).kind_classes
        seen = discovery.from_sysfs(sysfs, kinds=kinds).gpus
        unseen = discovery.from_sysfs(sysfs, kinds=()).gpus
    assert any(g.vendor_vf is not None for g in seen)
    assert all(g.vendor_vf is None for g in unseen)


# --- the parts it keeps ------------------------------------------------------

PARTS = ('sysfs', 'discovered', 'layouts', 'enabled', 'vgpus', 'pci',
         'store', 'allocator', 'pci_ids', 'nvml')


@pytest.fixture
def t4_env(tmp_path):
    from tests.doubles import trees
    from libvirt_gpu import conf as conf_mod
    with trees.simulated_tree('t4') as (root, _):
        config = tmp_path / 'libvirt-gpu.conf'
        config.write_text('[DEFAULT]\nsysfs_root = %s\nstate_dir = %s\n'
                          '[gpu]\nenabled_vgpu_types = nvidia-223\n'
                          % (root, tmp_path / 'state'))
        yield environment.Environment.from_conf(conf_mod.load(str(config)))


@pytest.mark.parametrize('part', PARTS)
def test_a_part_is_built_once_and_kept(t4_env, part):
    assert getattr(t4_env, part) is getattr(t4_env, part)


def test_the_enabled_types_are_resolved_once(t4_env, monkeypatch):
    from libvirt_gpu.devices import enablement
    calls = []
    real = enablement.resolve
    monkeypatch.setattr(enablement, 'resolve',
                        lambda *a: calls.append(a) or real(*a))
    assert t4_env.enabled and t4_env.allocator.enabled == t4_env.enabled
    t4_env.enabled
    t4_env.allocator
    assert len(calls) == 1


def test_the_layouts_are_read_once_and_every_rule_takes_them(
        tmp_path, monkeypatch):
    """``[gpu]/layouts`` read and resolved against the host once: the
    enabled types, the carvings and ``layout plan`` take ``layouts``."""
    from tests.doubles import layouts as layouts_double
    from tests.doubles import trees
    from libvirt_gpu import conf as conf_mod
    from libvirt_gpu import objects
    from libvirt_gpu.devices import layout
    from libvirt_gpu.devices import nvml
    h100 = objects.PciAddress.parse('0000:4e:00.0')
    calls = []
    real = layout.read_layouts
    monkeypatch.setattr(layout, 'read_layouts',
                        lambda conf: calls.append(conf) or real(conf))
    with trees.simulated_tree('h100-80gb') as (root, _):
        config = tmp_path / 'libvirt-gpu.conf'
        config.write_text(
            '[DEFAULT]\nsysfs_root = %s\nstate_dir = %s\n[gpu]\n'
            'nvml = off\nlayouts = one\n[layout_one]\ngpus = %s\n'
            'mode = mig\ngpu_instances = 1g.10gb:2\n'
            'vgpu_types = nvidia-1308\n' % (root, tmp_path / 'state', h100))
        conf = conf_mod.load(str(config))
        calls.clear()                    # the load checks them on its own
        env = environment.Environment.from_conf(conf)
        assert [(str(a), lay.name) for a, lay in env.layouts.items()] == [
            (str(h100), 'one')]
        assert env.enabled[h100].type_id == 'nvidia-1308'
        assert env.carved.planned == ()
        # layout plan reads them from the same part (NVML off: refused
        # after the layouts were taken)
        with pytest.raises(nvml.NvmlUnavailable):
            layouts_double.converge(env, dry_run=True)
        assert len(calls) == 1
        # without a configuration (the hook): none
        bare = environment.Environment(str(tmp_path), sysfs_root=root)
        assert bare.layouts == {}
        assert len(calls) == 1


def test_rediscover_keeps_the_host_and_forgets_what_was_discovered(t4_env):
    before = {part: getattr(t4_env, part) for part in PARTS}
    again = t4_env.rediscover()
    for part in ('sysfs', 'vgpus', 'store', 'pci_ids', 'nvml'):
        assert getattr(again, part) is before[part], part
    # the whole-GPU backend follows the routes, which follow the GPUs
    for part in ('discovered', 'layouts', 'enabled', 'allocator', 'pci'):
        assert getattr(again, part) is not before[part], part
    assert again.enabled == before['enabled']


def test_given_enabled_types_survive_rediscover(tmp_path):
    given = {}
    env = environment.Environment(str(tmp_path), sysfs_root=str(tmp_path),
                                  enabled=given)
    assert env.rediscover().enabled == given
    assert env.replace(sysfs_root=str(tmp_path / 'x')).enabled == given


def test_replace_resolves_again_when_the_host_read_changes(
        t4_env, monkeypatch):
    from libvirt_gpu.devices import enablement
    enabled = t4_env.enabled
    calls = []
    real = enablement.resolve
    monkeypatch.setattr(enablement, 'resolve',
                        lambda *a: calls.append(a) or real(*a))
    assert t4_env.replace(remove_timeout=1.0).enabled == enabled
    assert calls == []
    assert t4_env.replace(source=None, parallel=False).enabled == enabled
    assert len(calls) == 1


def test_the_api_takes_the_environment_as_its_connection(t4_env):
    from libvirt_gpu.guests import api
    # without a libvirt host the API cannot act: said at once
    with pytest.raises(TypeError, match='no libvirt host'):
        api.list_devices(t4_env, 'guest')
    with pytest.raises(TypeError, match='not both'):
        api.list_devices(t4_env, 'guest', env=t4_env)


def test_the_cli_builds_one_environment(t4_env, tmp_path):
    from libvirt_gpu.cmd import context
    from libvirt_gpu.cmd import main as cli
    args = cli.build_parser().parse_args(
        ['--sysfs-root', t4_env.sysfs_root, 'list'])
    args.config_file = None
    ctx = context.Context(args)
    assert ctx.env is ctx.env
    assert ctx.result is ctx.env.discovered
    assert ctx.enabled is ctx.env.enabled
    # the lifecycle commands get the same host read from its sysfs
    lifecycle = ctx.environment()
    assert lifecycle.source is None and lifecycle.sysfs_root == \
        ctx.env.sysfs_root
