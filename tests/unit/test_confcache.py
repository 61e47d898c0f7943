"""The CLI's settings snapshot (libvirt_gpu.confcache): values without
oslo.config, never stale, never from a bad file."""

import json
import os
import subprocess
import sys

import pytest

from libvirt_gpu import confcache
from libvirt_gpu import exception
from libvirt_gpu.devices import nvml
from libvirt_gpu import objects
from libvirt_gpu import simulator
from tests.doubles import paths

ROOT = paths.ROOT

# Runs the CLI in a fresh interpreter and says, on stderr's last line,
# whether oslo.config was imported.
_PROBE = '''
import sys
from libvirt_gpu.cmd import main
code = main.main(sys.argv[1:])
sys.stderr.write('\\noslo_config imported: %s\\n'
                 % ('oslo_config' in sys.modules))
sys.exit(code)
'''


@pytest.fixture
def sim(tmp_path):
    root = str(tmp_path / 'sim')
    simulator.write_host(simulator.load_profile('t4'), root)
    return root


def _cli(conf_file, sysfs_root, *args):
    done = subprocess.run(
        [sys.executable, '-c', _PROBE, '--config-file', str(conf_file),
         '--sysfs-root', sysfs_root] + list(args),
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        universal_newlines=True)
    last = done.stderr.strip().splitlines()[-1]
    return done.returncode, done.stdout, done.stderr, last.endswith('True')


def test_second_run_skips_oslo_and_a_change_is_seen(tmp_path, sim):
    conf = tmp_path / 'a.conf'
    conf.write_text('[gpu]\nenabled_vgpu_types = nvidia-222\n')
    code, out, _, oslo = _cli(conf, sim, 'list', '--json')
    assert code == 0 and oslo
    first = json.loads(out)
    code, out, _, oslo = _cli(conf, sim, 'list', '--json')
    assert code == 0 and not oslo
    assert json.loads(out) == first
    # Same size, written at once (same second, maybe the same tick): the
    # content is part of the key.
    conf.write_text('[gpu]\nenabled_vgpu_types = nvidia-223\n')
    code, out, _, oslo = _cli(conf, sim, 'list', '--json')
    assert code == 0 and oslo
    assert json.loads(out) != first
    code, again, _, oslo = _cli(conf, sim, 'list', '--json')
    assert not oslo and again == out


def test_bad_file_gets_no_snapshot(tmp_path, sim, settings_snapshot_dir):
    conf = tmp_path / 'bad.conf'
    conf.write_text('[agent]\nsync_interval = -1\n')
    for _ in range(2):
        code, out, err, oslo = _cli(conf, sim, 'list', '--json')
        assert code == 1 and out == '' and oslo
        assert 'sync_interval' in err
    assert not settings_snapshot_dir.exists() or \
        os.listdir(str(settings_snapshot_dir)) == []


def test_commands_needing_oslo_never_use_it(tmp_path):
    conf = tmp_path / 'a.conf'
    conf.write_text('')
    confcache.load(str(conf))
    from libvirt_gpu.cmd import context
    from libvirt_gpu.cmd import main
    args = main.build_parser().parse_args(
        ['--config-file', str(conf), 'placement', 'sync', '--dry-run'])
    from oslo_config import cfg
    assert isinstance(context.Context(args).conf, cfg.ConfigOpts)


def test_values_match_oslo(tmp_path):
    conf = tmp_path / 'a.conf'
    conf.write_text('[DEFAULT]\nsysfs_root = /tmp/x\n'
                    '[gpu]\nenabled_vgpu_types = nvidia-222\nnvml = off\n'
                    '[vgpu_nvidia-222]\nmax_instances = 3\n'
                    'device_addresses = 0000:af:00.0\n')
    loaded = confcache.load(str(conf))
    values = confcache.load(str(conf))
    assert isinstance(values, confcache.Values)
    for read in (lambda c: c.sysfs_root, lambda c: c.host,
                 lambda c: c.gpu.nvml, lambda c: c.gpu.enabled_vgpu_types,
                 lambda c: c['vgpu_nvidia-222'].max_instances,
                 lambda c: c['vgpu_nvidia-222'].device_addresses,
                 lambda c: c.libvirt.connection_uri,
                 lambda c: c.agent.sync_interval):
        assert read(values) == read(loaded)
    with pytest.raises(AttributeError):
        values.no_such_option


def test_missing_file_is_its_own_key(tmp_path, monkeypatch):
    monkeypatch.setenv('LIBVIRT_GPU_CONFIG', str(tmp_path / 'other.conf'))
    (tmp_path / 'other.conf').write_text('[DEFAULT]\nsysfs_root = /a\n')
    assert confcache.load().sysfs_root == '/a'
    monkeypatch.delenv('LIBVIRT_GPU_CONFIG')
    monkeypatch.setattr(confcache.conffile, 'DEFAULT_CONFIG_FILE',
                        str(tmp_path / 'absent.conf'))
    assert confcache.load().sysfs_root == '/sys'
    assert isinstance(confcache.load(), confcache.Values)
    assert confcache.load().sysfs_root == '/sys'


def test_state_dir_checked_on_the_snapshot_path(tmp_path):
    state = tmp_path / 'state'
    conf = tmp_path / 'a.conf'
    conf.write_text('[DEFAULT]\nstate_dir = %s\n' % state)
    confcache.load(str(conf))
    assert isinstance(confcache.load(str(conf)), confcache.Values)
    state.write_text('')
    with pytest.raises(exception.ConfigError, match='not a directory'):
        confcache.load(str(conf))


def test_unwritable_cache_is_no_error(tmp_path, monkeypatch):
    blocker = tmp_path / 'file'
    blocker.write_text('')
    monkeypatch.setenv('LIBVIRT_GPU_CACHE_DIR', str(blocker / 'sub'))
    conf = tmp_path / 'a.conf'
    conf.write_text('')
    from oslo_config import cfg
    for _ in range(2):
        assert isinstance(confcache.load(str(conf)), cfg.ConfigOpts)
    monkeypatch.setenv('LIBVIRT_GPU_CACHE_DIR', '')
    assert confcache.cache_dir() is None


def test_snapshot_of_another_owner_or_mode_is_ignored(tmp_path,
                                                      settings_snapshot_dir):
    conf = tmp_path / 'a.conf'
    conf.write_text('')
    confcache.load(str(conf))
    (snapshot,) = os.listdir(str(settings_snapshot_dir))
    path = settings_snapshot_dir / snapshot
    assert isinstance(confcache.load(str(conf)), confcache.Values)
    os.chmod(str(path), 0o622)
    assert confcache.read(str(conf)) is None
    os.chmod(str(path), 0o600)
    assert confcache.read(str(conf)) is not None
    data = json.loads(path.read_text())
    data['key']['options'] = {}
    path.write_text(json.dumps(data))
    assert confcache.read(str(conf)) is None


def test_cache_dir_choice(monkeypatch):
    env = {'XDG_CACHE_HOME': '/home/u/.xdg'}
    if os.geteuid() == 0:
        assert confcache.cache_dir(env) == confcache.ROOT_CACHE_DIR
    else:
        assert confcache.cache_dir(env) == '/home/u/.xdg/libvirt-gpu'
    assert confcache.cache_dir({confcache.CACHE_ENV: '/c'}) == '/c'


def test_nvml_only_for_this_hosts_sysfs(tmp_path):
    assert nvml.source('auto', sysfs_root=str(tmp_path)) is None
    assert isinstance(nvml.source('auto', sysfs_root='/sys'), nvml.Nvml)
    assert isinstance(nvml.source('auto', sysfs_root=None), nvml.Nvml)
    with pytest.raises(exception.ConfigError, match=r'\[gpu\]/nvml'):
        nvml.source('on', sysfs_root=str(tmp_path))


def test_simulated_tree_never_imports_pynvml(tmp_path, sim):
    conf = tmp_path / 'a.conf'
    conf.write_text('')
    probe = _PROBE.replace("'oslo_config' in", "'pynvml' in")
    done = subprocess.run(
        [sys.executable, '-c', probe, '--config-file', str(conf),
         '--sysfs-root', sim, 'list', '--json'], cwd=ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        universal_newlines=True)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().endswith('imported: False')


def test_host_name_change_is_seen(tmp_path, monkeypatch):
    """[DEFAULT]/host defaults to the host name: a renamed host must not
    be served the old name from the snapshot."""
    import types
    conf = tmp_path / 'a.conf'
    conf.write_text('')
    confcache.load(str(conf))
    assert isinstance(confcache.load(str(conf)), confcache.Values)
    monkeypatch.setattr(os, 'uname', lambda: types.SimpleNamespace(
        nodename='renamed-host'))
    assert not isinstance(confcache.load(str(conf)), confcache.Values)
    assert isinstance(confcache.load(str(conf)), confcache.Values)


def test_the_hook_keeps_the_same_snapshot_under_the_same_key(tmp_path,
                                                             sim):
    """One snapshot: the hook's settings file is a confcache document,
    current by confcache's one rule, readable as the CLI reads its own."""
    from libvirt_gpu.guests import hook
    state_dir = tmp_path / 'state'
    conf = tmp_path / 'a.conf'
    conf.write_text('[DEFAULT]\nsysfs_root = %s\nstate_dir = %s\n[gpu]\n'
                    'enabled_vgpu_types = nvidia-223\n' % (sim, state_dir))
    settings_file = str(state_dir / hook.SETTINGS_NAME)
    settings, note = hook.load_settings(str(conf), settings_file)
    with open(settings_file, 'rb') as f:
        raw = f.read()
    found = confcache.parse(raw, str(conf))
    assert found is not None and found.key == confcache.key(str(conf))
    assert found.values.sysfs_root == sim == settings.sysfs_root
    assert found.values.gpu.enabled_vgpu_types == ['nvidia-223']
    assert sorted(found.extra['enabled']) == sorted(map(str,
                                                        settings.enabled))
    # the same edit makes both stale
    conf.write_text(conf.read_text().replace('223', '222'))
    assert confcache.parse(raw, str(conf)) is None
    assert hook.load_settings(str(conf), settings_file)[1] is not None


def test_one_sha256_one_key():
    """The configuration's key and its SHA-256 import are confcache's
    alone (the hook had its own copy of both)."""
    import ast
    package = os.path.join(ROOT, 'libvirt_gpu')
    found = []
    for directory, _, files in os.walk(package):
        for name in files:
            path = os.path.join(directory, name)
            if not name.endswith('.py') or path.endswith(
                    os.path.join('libvirt_gpu', 'confcache.py')):
                continue
            with open(path) as f:
                tree = ast.parse(f.read(), path)
            for node in ast.walk(tree):
                names = ([a.name for a in node.names]
                         if isinstance(node, ast.Import) else
                         [node.module or ''] if isinstance(
                             node, ast.ImportFrom) else [])
                found.extend('%s: %s' % (os.path.relpath(path, ROOT), n)
                             for n in names
                             if n in ('hashlib', '_sha2', '_sha256'))
                if isinstance(node, ast.FunctionDef) and node.name in (
                        '_config_key', 'file_key', '_file_key'):
                    found.append('%s: def %s' % (
                        os.path.relpath(path, ROOT), node.name))
    assert found == []


def test_the_hooks_snapshot_keeps_every_type_of_a_gpu(tmp_path):
    """A GPU whose layout offers several types: the snapshot the hook
    reads on its next calls gives the same types and limits as the
    configuration."""
    from libvirt_gpu.guests import hook
    root = str(tmp_path / 'sim')
    simulator.write_host(simulator.load_profile('l40s'), root)
    state_dir = tmp_path / 'state'
    conf = tmp_path / 'a.conf'
    conf.write_text(
        '[DEFAULT]\nsysfs_root = %s\nstate_dir = %s\n[gpu]\nlayouts = one\n'
        'enabled_vgpu_types = nvidia-1145\n[vgpu_nvidia-1145]\n'
        'resource_class = CUSTOM_L40S_1B\nmax_instances = 1\n'
        '[layout_one]\ngpus = 0000:bd:00.0\nmode = mixed-size\n'
        'vgpu_types = nvidia-1153:3, nvidia-1145:2\n' % (root, state_dir))
    settings_file = str(state_dir / hook.SETTINGS_NAME)
    first, note = hook.load_settings(str(conf), settings_file)
    assert 'read from' in note
    again, note = hook.load_settings(str(conf), settings_file)
    assert note is None                      # from the snapshot
    gpu = objects.PciAddress.parse('0000:bd:00.0')
    assert again.enabled[gpu] == first.enabled[gpu]
    assert [(t.type_id, t.resource_class, t.max_instances)
            for t in again.enabled[gpu].types] == [
        ('nvidia-1153', 'VGPU', 3), ('nvidia-1145', 'CUSTOM_L40S_1B', 1)]
    assert again.enabled_types() == ['nvidia-1145', 'nvidia-1153']
