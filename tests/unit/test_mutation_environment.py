"""What the composition root promises that test_environment left open:
each test here fails on a change ``make mutation`` made to environment.py
that the rest stayed green on (docs/dev/mutation.md): every argument
carried over by ``replace`` and ``rediscover``, the whole refusal of an
unknown place, and the parts that exist only with a configuration."""

import pytest

from libvirt_gpu.devices.backends import base
from libvirt_gpu.devices.backends import mdev as mdev_backend
from libvirt_gpu.devices.backends import registry
from libvirt_gpu.devices import sysfs as sysfs_mod
from libvirt_gpu import environment
from libvirt_gpu import objects
from libvirt_gpu.devices import routes as routes_mod
from libvirt_gpu.virt import host as host_mod
from tests.unit import test_environment

# the simulated T4 host with nvidia-223 enabled, one fixture for both files
t4_env = test_environment.t4_env

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
    kinds = ('tests.unit.test_mutation_environment:TwoPlaces',)
    with pytest.raises(TypeError) as info:
        environment.Environment(str(tmp_path), sysfs_root=str(tmp_path),
                                kinds=kinds, c_dir='c')
    assert str(info.value) == (
        'Environment() got unexpected keyword argument(s) c_dir: no vGPU '
        'kind declares such a place (known: a_dir, b_dir)')
    env = environment.Environment(str(tmp_path), sysfs_root=str(tmp_path),
                                  kinds=kinds, a_dir='/given')
    assert env.places == {'a_dir': '/given', 'b_dir': '/b'}
