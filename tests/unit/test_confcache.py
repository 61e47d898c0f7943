"""The CLI's settings snapshot (libvirt_gpu.confcache): values without
oslo.config, never stale, never from a bad file."""

import json
import os
import subprocess
import sys

import pytest

from libvirt_gpu import confcache
from libvirt_gpu.util import cachefiles
from libvirt_gpu import exception
from libvirt_gpu.devices import nvml
from libvirt_gpu import objects
from libvirt_gpu import simulator
from tests.doubles import paths
import contextlib
import hashlib
import signal
from libvirt_gpu import conffile

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
    assert cachefiles.cache_dir() is None


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


# --- What ``make mutation`` found open (docs/dev/mutation.md) ---
# What the configuration's snapshot promises that test_confcache left open:
# each test here fails on a change ``make mutation`` made to confcache.py
# that the rest stayed green on (docs/dev/mutation.md): which snapshot file
# is trusted (owner, mode, size, kind of file), the bounds of each size
# limit, the exact key, and which values survive JSON.

VALUES = confcache.Values({'state_dir': '/s', 'debug': False},
                          {'gpu': {'nvml': 'auto'}})


@contextlib.contextmanager
def _no_wait(seconds=2.0):
    """Fail, rather than hang, when the code under test waits (an open of
    a FIFO without O_NONBLOCK waits for a writer for ever, and uses no
    CPU time that mutmut's timeout would count)."""
    def waited(signum, frame):
        raise AssertionError('waited %.0f s: opened a FIFO blocking?'
                             % seconds)
    old = signal.signal(signal.SIGALRM, waited)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture
def cached(tmp_path):
    """A configuration file, its snapshot written, and the environment
    that points at the snapshot's directory."""
    config = tmp_path / 'libvirt-gpu.conf'
    config.write_text('[DEFAULT]\n')
    environ = {cachefiles.CACHE_ENV: str(tmp_path / 'cache')}
    assert confcache.write(str(config), confcache.key(str(config)), VALUES,
                           environ)
    snap = confcache.snapshot_path(str(tmp_path / 'cache'), str(config))
    return str(config), environ, snap


def test_a_written_snapshot_reads_back(cached):
    config, environ, snap = cached
    assert os.stat(os.path.dirname(snap)).st_mode & 0o777 == 0o700
    assert os.stat(snap).st_mode & 0o777 == 0o600
    values = confcache.read(config, environ)
    assert values.plain() == VALUES.plain()


@pytest.mark.parametrize('mode,read', [
    (0o600, True), (0o644, True), (0o604, True), (0o711, True),
    (0o620, False),
    (0o602, False), (0o622, False)])
def test_a_snapshot_others_can_write_is_not_trusted(cached, mode, read):
    config, environ, snap = cached
    os.chmod(snap, mode)
    assert (confcache.read(config, environ) is not None) is read


@pytest.mark.skipif(os.geteuid() != 0, reason='only root gives files away')
def test_a_snapshot_of_another_owner_is_not_trusted(cached):
    config, environ, snap = cached
    os.chown(snap, 4242, -1)
    assert confcache.read(config, environ) is None


def test_a_snapshot_that_is_not_utf8_is_none(cached):
    config, environ, snap = cached
    with open(snap, 'wb') as f:
        f.write(b'{"key": "\xff"}')
    assert confcache.read(config, environ) is None


def test_a_link_or_a_directory_in_its_place_is_not_read(cached, tmp_path):
    config, environ, snap = cached
    real = str(tmp_path / 'real.json')
    os.rename(snap, real)
    os.symlink(real, snap)
    assert confcache.read(config, environ) is None
    os.unlink(snap)
    os.mkdir(snap)
    assert confcache.read(config, environ) is None


def test_a_fifo_in_its_place_is_not_waited_for(cached):
    config, environ, snap = cached
    os.unlink(snap)
    os.mkfifo(snap, 0o600)
    with _no_wait():
        assert confcache.read(config, environ) is None


@pytest.mark.parametrize('extra,read', [(0, True), (1, False)])
def test_the_snapshot_size_limit_is_inclusive(cached, extra, read):
    config, environ, snap = cached
    with open(snap, 'rb') as f:
        data = f.read()
    # padded in front: the document's last byte is the file's last
    with open(snap, 'wb') as f:
        f.write(data.rjust(confcache._MAX_SNAPSHOT_BYTES + extra))
    assert (confcache.read(config, environ) is not None) is read


def test_no_cache_directory_means_no_snapshot(cached, tmp_path):
    config, environ, snap = cached
    assert confcache.read(config, {cachefiles.CACHE_ENV: ''}) is None
    assert confcache.write(config, confcache.key(config), VALUES,
                           {cachefiles.CACHE_ENV: ''}) is False
    assert confcache.read(config, {cachefiles.CACHE_ENV: str(
        tmp_path / 'none')}) is None


def test_a_cache_directory_that_cannot_be_made_is_quietly_nothing(
        tmp_path):
    blocker = tmp_path / 'file'
    blocker.write_text('')
    config = str(tmp_path / 'c.conf')
    assert confcache.write(config, confcache.key(config), VALUES,
                           {cachefiles.CACHE_ENV: str(blocker)}) is False
    assert confcache.write(config, confcache.key(config), VALUES,
                           {cachefiles.CACHE_ENV: str(blocker / 'x')}) is False


def test_the_snapshot_is_the_document_in_sorted_json(cached):
    config, environ, snap = cached
    with open(snap) as f:
        text = f.read()
    assert text.startswith('{"groups": {"gpu": {"nvml": "auto"}}, "key": {')
    assert '"options": {"debug": false, "state_dir": "/s"}' in text


def test_snapshot_path_is_named_after_the_path_s_digest():
    digest = hashlib.sha256(b'/etc/libvirt-gpu/x.conf').hexdigest()[:8]
    assert confcache.snapshot_path('/c', '/etc/libvirt-gpu/x.conf') == \
        '/c/conf-%s.json' % digest


def test_file_key_is_the_file_s_identity_and_digest(tmp_path):
    path = tmp_path / 'c.conf'
    data = b'[DEFAULT]\n' + b'#' * 70000 + b'\n'
    path.write_bytes(data)
    st = os.stat(path)
    assert confcache.file_key(str(path)) == [
        st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns,
        hashlib.sha256(data).hexdigest()]


@pytest.mark.parametrize('extra,keyed', [(0, True), (1, False)])
def test_file_key_size_limit_is_inclusive(tmp_path, extra, keyed):
    path = tmp_path / 'c.conf'
    path.write_bytes(b'#' * (conffile.MAX_CONFIG_BYTES + extra))
    assert (confcache.file_key(str(path)) is not None) is keyed


def test_file_key_of_what_is_not_a_readable_file_is_none(tmp_path):
    assert confcache.file_key(str(tmp_path / 'missing')) is None
    assert confcache.file_key(str(tmp_path)) is None
    assert confcache.file_key('/dev/null') is None
    fifo = str(tmp_path / 'fifo')
    os.mkfifo(fifo)
    with _no_wait():
        assert confcache.file_key(fifo) is None


def test_the_key_names_each_input(tmp_path):
    path = str(tmp_path / 'c.conf')
    found = confcache.key(path)
    assert found['version'] == 2
    assert found['config_file'] == path
    assert found['file'] is None
    assert found['hostname'] == os.uname().nodename
    conf_dir = os.path.join(os.path.dirname(confcache.__file__), 'conf')
    modules = sorted(n for n in os.listdir(conf_dir) if n.endswith('.py'))
    assert list(found['options']) == modules and modules
    st = os.stat(os.path.join(conf_dir, modules[0]))
    assert found['options'][modules[0]] == [st.st_size, st.st_mtime_ns]
    assert sorted(found) == ['config_file', 'file', 'hostname', 'options',
                             'version']


def test_document_keeps_extra_only_when_given():
    doc = confcache.document({'k': 1}, VALUES)
    assert doc == {'key': {'k': 1}, 'options': {'state_dir': '/s',
                                                'debug': False},
                   'groups': {'gpu': {'nvml': 'auto'}}}
    assert confcache.document({'k': 1}, VALUES, extra=[])['extra'] == []


def _as_is(value):
    return value


def _conf(nvml='auto', **values):
    from oslo_config import cfg
    conf = cfg.ConfigOpts()
    conf.register_opts([cfg.Opt(name, type=_as_is, default=value)
                        for name, value in values.items()])
    conf.register_opts([cfg.Opt('nvml', type=_as_is, default=nvml)],
                       group='gpu')
    conf([], use_env=False, default_config_files=[])
    return conf


@pytest.mark.parametrize('value,kept', [
    (None, True), ('a', True), (1, True), (1.5, True), (True, True),
    ([1, ['a', None]], True), ({'a': [1], 'b': {'c': 2.0}}, True),
    ((1,), False), ([1, (2,)], False), ({1: 'a'}, False),
    ({'a': object()}, False), (b'x', False)])
def test_only_values_that_survive_json_are_snapshotted(value, kept):
    found = confcache.values_of(_conf(x=value))
    if kept:
        assert found[0]['x'] == value
        assert found[1] == {'gpu': {'nvml': 'auto'}}
        doc = confcache.document({}, _conf(x=value))
        assert doc['options'] == found[0]
        assert doc['groups'] == found[1]
    else:
        assert found is None
        assert confcache.document({}, _conf(x=value)) is None


def test_a_group_value_that_would_not_survive_json_is_no_snapshot():
    assert confcache.values_of(_conf(nvml=('a',))) is None
    assert confcache.document({}, _conf(nvml=('a',))) is None


@pytest.mark.parametrize('text', [
    b'\xff', b'[' * 100000, b'[]', b'{"key": 1}'])
def test_parse_refuses_what_is_not_a_current_snapshot(tmp_path, text):
    assert confcache.parse(text, str(tmp_path / 'c.conf')) is None


@pytest.mark.parametrize('options,groups', [
    ([], {}), ({}, []), ({}, {'gpu': 1}), (None, {})])
def test_parse_refuses_values_of_the_wrong_shape(tmp_path, options, groups):
    import json
    path = str(tmp_path / 'c.conf')
    doc = {'key': confcache.key(path), 'options': options, 'groups': groups}
    assert confcache.parse(json.dumps(doc), path) is None
    good = dict(doc, options={}, groups={'gpu': {}}, extra={'e': 1})
    found = confcache.parse(json.dumps(good), path)
    assert found.extra == {'e': 1} and found.key == confcache.key(path)
    assert found.values.plain() == ({}, {'gpu': {}})


def test_values_read_like_a_config_object():
    values = confcache.Values({'a': 1}, {'g': {'b': 2}})
    assert values.a == 1 and values['a'] == 1
    assert values.g.b == 2 and values['g']['b'] == 2
    with pytest.raises(AttributeError) as info:
        values.missing
    assert str(info.value) == "no option or group 'missing'"
    with pytest.raises(AttributeError) as info:
        values._private
    assert str(info.value) == '_private'
    with pytest.raises(KeyError):
        values['missing']
    assert confcache.Values({'a': 1}).plain() == ({'a': 1}, {})
