"""What the configuration's snapshot promises that test_confcache left
open: each test here fails on a change ``make mutation`` made to
confcache.py that the rest stayed green on (docs/dev/mutation.md): which
snapshot file is trusted (owner, mode, size, kind of file), the bounds of
each size limit, the exact key, and which values survive JSON."""

import contextlib
import hashlib
import os
import signal

import pytest

from libvirt_gpu import confcache
from libvirt_gpu import conffile

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
    environ = {confcache.CACHE_ENV: str(tmp_path / 'cache')}
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
    assert confcache.read(config, {confcache.CACHE_ENV: ''}) is None
    assert confcache.write(config, confcache.key(config), VALUES,
                           {confcache.CACHE_ENV: ''}) is False
    assert confcache.read(config, {confcache.CACHE_ENV: str(
        tmp_path / 'none')}) is None


def test_a_cache_directory_that_cannot_be_made_is_quietly_nothing(
        tmp_path):
    blocker = tmp_path / 'file'
    blocker.write_text('')
    config = str(tmp_path / 'c.conf')
    assert confcache.write(config, confcache.key(config), VALUES,
                           {confcache.CACHE_ENV: str(blocker)}) is False
    assert confcache.write(config, confcache.key(config), VALUES,
                           {confcache.CACHE_ENV: str(blocker / 'x')}) is False


def test_the_snapshot_is_the_document_in_sorted_json(cached):
    config, environ, snap = cached
    with open(snap) as f:
        text = f.read()
    assert text.startswith('{"groups": {"gpu": {"nvml": "auto"}}, "key": {')
    assert '"options": {"debug": false, "state_dir": "/s"}' in text


def test_cache_dir_for_root_and_for_other_users(monkeypatch):
    assert confcache.cache_dir({confcache.CACHE_ENV: 'x'}) == 'x'
    monkeypatch.setattr(os, 'geteuid', lambda: 0)
    assert confcache.cache_dir({}) == '/var/cache/libvirt-gpu'
    monkeypatch.setattr(os, 'geteuid', lambda: 1000)
    assert confcache.cache_dir({'XDG_CACHE_HOME': '/xdg'}) == \
        '/xdg/libvirt-gpu'
    monkeypatch.setenv('HOME', '/home/u')
    assert confcache.cache_dir({'XDG_CACHE_HOME': ''}) == \
        '/home/u/.cache/libvirt-gpu'
    assert confcache.cache_dir({}) == '/home/u/.cache/libvirt-gpu'
    monkeypatch.setenv(confcache.CACHE_ENV, '/from/env')
    assert confcache.cache_dir() == '/from/env'


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
