"""The composition root (``environment.Environment``): what it keeps, and
the places the vGPU kinds declare (``VgpuKind.places``), which it hands on
without naming them."""

import pytest

from libvirt_gpu.devices.backends import mdev as mdev_backend
from libvirt_gpu.devices.backends import registry
from libvirt_gpu import environment
from libvirt_gpu.devices.backends import base
from libvirt_gpu.devices import sysfs as sysfs_mod
from libvirt_gpu import objects
from libvirt_gpu.devices import routes as routes_mod
from libvirt_gpu.virt import host as host_mod


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


# --- what make mutation found ----------------------------------------------
#
# What the composition root promises that test_environment left open:
# each test here fails on a change ``make mutation`` made to environment.py
# that the rest stayed green on (docs/dev/mutation.md): every argument
# carried over by ``replace`` and ``rediscover``, the whole refusal of an
# unknown place, and the parts that exist only with a configuration.

# the simulated T4 host with nvidia-223 enabled, one fixture for both files

MDEV_ONLY = ('libvirt_gpu.devices.backends.mdev:MdevBackend',)


def _arguments_seen(env):
    """What a host built from ``env`` was given, read back through the
    public attributes."""
    return dict(state_dir=env.state_dir, sysfs_root=env.sysfs_root,
                host=env.host, conf=env.conf,
                kinds=tuple(env.kind_classes),
                remove_timeout=env.remove_timeout, source=env.source,
                parallel=env.parallel, places=env.places)


@pytest.fixture
def full_env(tmp_path):
    sysfs = sysfs_mod.Sysfs(str(tmp_path / 'sys'))
    host = host_mod.Host.from_connection(object())
    return environment.Environment(
        str(tmp_path / 'state'), sysfs=sysfs, host=host,
        conf=None, kinds=MDEV_ONLY, remove_timeout=7.5,
        source=environment.Source('qemu:///x', fallback=False,
                                  sysfs_root='/elsewhere'),
        parallel=True, mdevctl_dir=str(tmp_path / 'mdevctl'),
        enabled={})


def test_full_env_is_what_it_was_given(full_env, tmp_path):
    assert _arguments_seen(full_env) == dict(
        state_dir=str(tmp_path / 'state'), sysfs_root=str(tmp_path / 'sys'),
        host=full_env.host, conf=None,
        kinds=(mdev_backend.MdevBackend,), remove_timeout=7.5,
        source=environment.Source('qemu:///x', False, '/elsewhere'),
        parallel=True, places={'mdevctl_dir': str(tmp_path / 'mdevctl')})


@pytest.mark.parametrize('how', ['replace', 'rediscover'])
def test_every_argument_is_carried_over(full_env, how):
    again = (full_env.replace(conf=None) if how == 'replace'
             else full_env.rediscover())
    assert _arguments_seen(again) == _arguments_seen(full_env)
    assert again.sysfs is full_env.sysfs
    assert again.host is full_env.host
    assert again.enabled == {}


def test_replace_changes_only_what_it_is_given(full_env):
    again = full_env.replace(remove_timeout=1.0, parallel=False)
    seen = _arguments_seen(again)
    assert (seen['remove_timeout'], seen['parallel']) == (1.0, False)
    seen.update(remove_timeout=7.5, parallel=True)
    assert seen == _arguments_seen(full_env)


def test_replace_wraps_a_libvirt_connection_as_a_host(full_env):
    conn = object()
    again = full_env.replace(host=conn)
    assert isinstance(again.host, host_mod.Host)
    assert again.host._conn is conn
    assert full_env.replace(host=None).host is None


def test_an_unknown_place_is_refused_whole(tmp_path):
    with pytest.raises(TypeError) as info:
        environment.Environment(str(tmp_path), sysfs_root=str(tmp_path),
                                zz_dir='a', aa_dir='b')
    assert str(info.value) == (
        'Environment() got unexpected keyword argument(s) aa_dir, zz_dir: no '
        'vGPU kind declares such a place (known: mdevctl_dir)')


def test_without_a_sysfs_the_root_is_read(tmp_path):
    env = environment.Environment(str(tmp_path), sysfs_root=str(tmp_path))
    assert env.sysfs_root == str(tmp_path)
    assert env.sysfs.root == str(tmp_path)
    bare = environment.Environment(str(tmp_path))
    assert bare.sysfs_root == '/sys'
    assert (bare.host, bare.conf, bare.remove_timeout, bare.source,
            bare.parallel) == (None, None, None, None, False)


def test_given_enabled_types_are_a_copy_of_their_kind(tmp_path):
    class Enabled(dict):
        pass
    given = Enabled(a=1)
    env = environment.Environment(str(tmp_path), sysfs_root=str(tmp_path),
                                  enabled=given)
    assert env.enabled == {'a': 1} and env.enabled is not given
    assert type(env.enabled) is Enabled
    pairs = environment.Environment(str(tmp_path), sysfs_root=str(tmp_path),
                                    enabled=[('b', 2)])
    assert pairs.enabled == {'b': 2}


def test_without_a_configuration_no_names_and_no_nvml(tmp_path):
    env = environment.Environment(str(tmp_path), sysfs_root=str(tmp_path))
    assert env.pci_ids is None
    assert env.nvml is None
    assert env.kind_classes == registry.kind_classes()


def test_for_hook_takes_the_settings_snapshot(tmp_path):
    class Settings:
        state_dir = str(tmp_path / 'state')
        enabled = {'x': 1}
        routes = routes_mod.Routes(owners={
            objects.PciAddress.parse('0000:3b:00.0'): routes_mod.CYBORG})
        nvml = 'off'
    sysfs = sysfs_mod.Sysfs(str(tmp_path))
    env = environment.Environment.for_hook(
        Settings, sysfs, mdevctl_dir=str(tmp_path / 'm'))
    assert env.state_dir == str(tmp_path / 'state')
    assert env.sysfs is sysfs and env.sysfs_root == str(tmp_path)
    assert env.enabled == {'x': 1}
    assert env.routes is Settings.routes
    assert objects.PciAddress.parse('0000:3b:00.0') in env.allocator.carved
    assert env.place('mdevctl_dir') == str(tmp_path / 'm')
    assert env.host is None and env.conf is None
    assert env.nvml_setting == 'off' and env.nvml is None


class _Conf:
    state_dir = '/conf/state'
    sysfs_root = '/conf/sys'


def test_from_conf_takes_the_configuration_unless_overridden():
    env = environment.Environment.from_conf(_Conf)
    assert (env.state_dir, env.sysfs_root, env.conf, env.host) == (
        '/conf/state', '/conf/sys', _Conf, None)
    conn = object()
    env = environment.Environment.from_conf(
        _Conf, conn=conn, sysfs_root='/cli/sys', state_dir='/cli/state',
        remove_timeout=3.0)
    assert (env.state_dir, env.sysfs_root, env.remove_timeout) == (
        '/cli/state', '/cli/sys', 3.0)
    assert env.host._conn is conn


def test_a_host_given_as_a_host_is_kept():
    host = host_mod.Host.from_connection(object())
    assert environment.Environment.from_conf(_Conf, conn=host).host is host


@pytest.mark.parametrize('name', ['sysfs', 'sysfs_root', 'conf', 'kinds',
                                  'source'])
def test_replace_resolves_enabled_again_after_each_host_input(
        t4_env, monkeypatch, name):
    from libvirt_gpu.devices import enablement
    enabled = t4_env.enabled
    calls = []
    real = enablement.resolve
    monkeypatch.setattr(enablement, 'resolve',
                        lambda *a: calls.append(a) or real(*a))
    same = {'sysfs': t4_env.sysfs, 'sysfs_root': t4_env.sysfs_root,
            'conf': t4_env.conf, 'kinds': None, 'source': None}
    assert t4_env.replace(**{name: same[name]}).enabled == enabled
    assert len(calls) == 1
    kept = t4_env.replace(remove_timeout=2.0, parallel=True, host=None)
    assert kept.enabled == enabled
    assert len(calls) == 1


class TwoPlaces(mdev_backend.MdevBackend):
    """A kind that declares two places of its own (``kinds`` by spec)."""

    name = 'two-places'
    places = (base.Place('b_dir', '/b'),
              base.Place('a_dir', '/a'))


def test_the_refusal_lists_every_known_place_sorted(tmp_path):
    kinds = ('tests.unit.test_environment:TwoPlaces',)
    with pytest.raises(TypeError) as info:
        environment.Environment(str(tmp_path), sysfs_root=str(tmp_path),
                                kinds=kinds, c_dir='c')
    assert str(info.value) == (
        'Environment() got unexpected keyword argument(s) c_dir: no vGPU '
        'kind declares such a place (known: a_dir, b_dir)')
    env = environment.Environment(str(tmp_path), sysfs_root=str(tmp_path),
                                  kinds=kinds, a_dir='/given')
    assert env.places == {'a_dir': '/given', 'b_dir': '/b'}
