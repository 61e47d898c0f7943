"""What ``conffile`` promises that its other tests left open: each test here
fails on a change ``make mutation`` made that the rest stayed green on
(docs/dev/mutation.md).  Called here in this process: the tests that run
the CLI as a program test the installed code, never a mutant."""

import os

import pytest

from libvirt_gpu import conffile
from libvirt_gpu import exception
from tests.doubles import sockets


def _refused(call, *args):
    with pytest.raises(exception.ConfigError) as e:
        call(*args)
    return str(e.value)


# --- which file --------------------------------------------------------------

def test_a_named_file_must_exist_and_wins_over_the_environment():
    environ = {conffile.CONFIG_ENV: '/from/env.conf'}
    assert conffile.config_path('/named.conf', environ) == \
        ('/named.conf', True)


def test_the_environment_names_a_file_that_must_exist():
    assert conffile.config_path(None, {conffile.CONFIG_ENV: '/e.conf'}) == \
        ('/e.conf', True)


def test_the_default_file_may_be_missing():
    assert conffile.config_path(None, {}) == \
        (conffile.DEFAULT_CONFIG_FILE, False)
    assert conffile.config_path(None, {conffile.CONFIG_ENV: ''}) == \
        (conffile.DEFAULT_CONFIG_FILE, False)


def test_the_process_environment_is_read_when_none_is_given(monkeypatch):
    monkeypatch.setenv(conffile.CONFIG_ENV, '/p.conf')
    assert conffile.config_path() == ('/p.conf', True)


# --- whether it is one -------------------------------------------------------

def test_a_missing_file_is_refused_only_when_required(tmp_path):
    path = str(tmp_path / 'none.conf')
    assert conffile.check_config_file(path, False) is False
    assert _refused(conffile.check_config_file, path, True) == \
        'Configuration error: config file %s does not exist' % path


def test_an_unopenable_path_says_why(tmp_path):
    (tmp_path / 'file').write_text('')
    path = str(tmp_path / 'file' / 'x.conf')
    assert _refused(conffile.check_config_file, path, False) == (
        'cannot read the configuration file %s: Not a '
        'directory (name a readable file with --config-file)' % path)


def test_dev_null_is_no_settings_and_dev_zero_is_refused():
    assert conffile.check_config_file(os.devnull, True) is False
    assert _refused(conffile.check_config_file, '/dev/zero', True) == (
        'cannot read the configuration file /dev/zero: '
        'it is a character device, not a regular file (name a readable file '
        'with --config-file)')


def test_without_a_dev_null_no_device_passes_for_it(monkeypatch, tmp_path):
    monkeypatch.setattr(os, 'devnull', str(tmp_path / 'no-null'))
    with pytest.raises(exception.ConfigFileUnreadable):
        conffile.check_config_file('/dev/null', True)


@pytest.mark.parametrize('make, kind', [
    (os.mkfifo, 'a FIFO'), (os.mkdir, 'a directory')])
def test_what_is_no_regular_file_is_named(tmp_path, make, kind):
    path = str(tmp_path / 'c.conf')
    make(path)
    assert _refused(conffile.check_config_file, path, True) == (
        'cannot read the configuration file %s: it is '
        '%s, not a regular file (name a readable file with --config-file)'
        % (path, kind))


def test_a_socket_is_named(tmp_path):
    path = str(tmp_path / 's.conf')
    with sockets.unix_socket(path):
        assert 'it is a socket, not a regular file' in \
            _refused(conffile.check_config_file, path, True)


def test_the_size_limit_is_inclusive(tmp_path):
    path = tmp_path / 'big.conf'
    with open(path, 'wb') as f:
        f.truncate(conffile.MAX_CONFIG_BYTES)
    assert conffile.check_config_file(str(path), True) is True
    with open(path, 'ab') as f:
        f.write(b'x')
    assert _refused(conffile.check_config_file, str(path), True) == (
        'cannot read the configuration file %s: it is '
        '%d bytes, more than the %d a configuration file can be; is it the '
        'right file? (name a readable file with --config-file)'
        % (path, conffile.MAX_CONFIG_BYTES + 1, conffile.MAX_CONFIG_BYTES))


# --- state_dir ---------------------------------------------------------------

def test_a_state_dir_that_is_a_file(tmp_path):
    state = tmp_path / 'state'
    state.write_text('')
    assert _refused(conffile.check_state_dir, str(state), '/x.conf') == (
        'Configuration error: /x.conf: [DEFAULT]/state_dir = %s is not a '
        'directory; name a directory (it is created when missing)' % state)


def test_a_link_to_a_foreign_directory_in_it_is_not_followed(tmp_path):
    other = tmp_path / 'other'
    (other / 'inner').mkdir(parents=True)
    state = tmp_path / 'state'
    state.mkdir()
    os.symlink(str(other), str(state / 'link'))
    conffile.check_state_dir(str(state), '/x.conf')
