"""util/cachefiles.py: where this user's cache lives, and its private
files read only when no one else could have written them."""

import os
import signal

import pytest

from libvirt_gpu.util import cachefiles


def test_cache_dir_choice():
    env = {'XDG_CACHE_HOME': '/home/u/.xdg'}
    if os.geteuid() == 0:
        assert cachefiles.cache_dir(env) == cachefiles.ROOT_CACHE_DIR
    else:
        assert cachefiles.cache_dir(env) == '/home/u/.xdg/libvirt-gpu'
    assert cachefiles.cache_dir({cachefiles.CACHE_ENV: '/c'}) == '/c'
    # set but empty: no cache at all, not the default
    assert cachefiles.cache_dir({cachefiles.CACHE_ENV: ''}) is None


def test_cache_dir_for_root_and_for_other_users(monkeypatch):
    assert cachefiles.cache_dir({cachefiles.CACHE_ENV: 'x'}) == 'x'
    monkeypatch.setattr(os, 'geteuid', lambda: 0)
    assert cachefiles.cache_dir({}) == '/var/cache/libvirt-gpu'
    monkeypatch.setattr(os, 'geteuid', lambda: 1000)
    assert cachefiles.cache_dir({'XDG_CACHE_HOME': '/xdg'}) == \
        '/xdg/libvirt-gpu'
    monkeypatch.setenv('HOME', '/home/u')
    assert cachefiles.cache_dir({'XDG_CACHE_HOME': ''}) == \
        '/home/u/.cache/libvirt-gpu'
    assert cachefiles.cache_dir({}) == '/home/u/.cache/libvirt-gpu'
    monkeypatch.setenv(cachefiles.CACHE_ENV, '/from/env')
    assert cachefiles.cache_dir() == '/from/env'


@pytest.fixture
def written(tmp_path):
    """A private file written into a cache directory not yet made."""
    directory = str(tmp_path / 'cache' / 'sub')
    assert cachefiles.write_private(directory, 'kinds.json', 'data\n')
    return directory, os.path.join(directory, 'kinds.json')


def test_a_written_file_is_private_and_reads_back(written):
    directory, path = written
    assert os.stat(directory).st_mode & 0o777 == 0o700
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert cachefiles.read_private(path) == b'data\n'
    assert os.listdir(directory) == ['kinds.json']     # no temporary left


def test_a_write_replaces_the_file_whole(written):
    directory, path = written
    assert cachefiles.write_private(directory, 'kinds.json', 'x')
    assert cachefiles.read_private(path) == b'x'


@pytest.mark.parametrize('mode,read', [
    (0o600, True), (0o644, True), (0o400, True),
    (0o620, False), (0o602, False), (0o660, False)])
def test_a_file_others_can_write_is_not_read(written, mode, read):
    _, path = written
    os.chmod(path, mode)
    assert (cachefiles.read_private(path) is not None) is read


@pytest.mark.skipif(os.geteuid() != 0, reason='only root gives files away')
def test_a_file_of_another_owner_is_not_read(written):
    _, path = written
    os.chown(path, 4242, -1)
    assert cachefiles.read_private(path) is None


def test_a_link_a_directory_or_nothing_in_its_place_is_not_read(
        written, tmp_path):
    _, path = written
    real = str(tmp_path / 'real')
    os.rename(path, real)
    os.symlink(real, path)
    assert cachefiles.read_private(path) is None
    os.unlink(path)
    assert cachefiles.read_private(path) is None
    os.mkdir(path)
    assert cachefiles.read_private(path) is None


def test_a_fifo_in_its_place_is_not_waited_for(written):
    _, path = written
    os.unlink(path)
    os.mkfifo(path, 0o600)

    def hung(signum, frame):
        raise AssertionError('read_private waited on a FIFO')
    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(10)
    try:
        assert cachefiles.read_private(path) is None
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize('size,read', [(4, True), (5, False)])
def test_the_size_limit_is_inclusive(tmp_path, size, read):
    directory = str(tmp_path)
    assert cachefiles.write_private(directory, 'f', 'x' * size)
    found = cachefiles.read_private(os.path.join(directory, 'f'), limit=4)
    assert found == (b'x' * size if read else None)
    assert cachefiles.MAX_BYTES == 1024 * 1024


def test_a_directory_that_cannot_be_made_is_false(tmp_path):
    blocker = tmp_path / 'file'
    blocker.write_text('')
    assert cachefiles.write_private(str(blocker), 'f', 'x') is False
    assert cachefiles.write_private(str(blocker / 'x'), 'f', 'x') is False
    assert blocker.read_text() == ''
