"""statedir behaviours no other test pinned (issue 30, section 6): a
group-writable directory refused, ownership judged by the owner (not the
group), and an empty owner file (a crash between its create and its
write) recovered from.

Written against the public calls (``check_dir``, ``ensure_dir``,
``check_owner``); the state directory under test is made private first,
so stricter checks of its parents (issue 30, section 1) leave it usable.
"""

import os

import pytest

from libvirt_gpu import exception
from libvirt_gpu.store import statedir

OTHER = 4242            # a uid and gid nobody here has

as_root = pytest.mark.skipif(os.geteuid() != 0,
                             reason='changing a directory\'s owner needs '
                                    'root')


@pytest.fixture
def state_dir(tmp_path):
    path = tmp_path / 'state'
    path.mkdir()
    os.chmod(path, 0o700)
    statedir.check_dir(str(path))       # usable as it is
    return str(path)


@pytest.mark.parametrize('mode', [0o770, 0o730, 0o720, 0o707, 0o702, 0o777])
def test_writable_by_group_or_others_is_refused(state_dir, mode):
    """Broken by checking only the others' write bit."""
    os.chmod(state_dir, mode)
    with pytest.raises(exception.StateError) as e:
        statedir.check_dir(state_dir)
    assert 'writable by group or others' in str(e.value)
    assert 'chmod go-w %s' % state_dir in str(e.value)


@pytest.mark.parametrize('mode', [0o700, 0o750, 0o755, 0o711])
def test_readable_by_others_is_accepted(state_dir, mode):
    os.chmod(state_dir, mode)
    statedir.check_dir(state_dir)


@as_root
def test_owned_by_another_user_is_refused_whatever_its_group(state_dir):
    """The owner is ``st_uid`` (broken by reading ``st_gid``)."""
    os.chown(state_dir, OTHER, 0)
    with pytest.raises(exception.StateError) as e:
        statedir.check_dir(state_dir)
    assert 'owned by uid %d' % OTHER in str(e.value)


@as_root
def test_owned_by_root_with_another_group_is_accepted(state_dir):
    os.chown(state_dir, 0, OTHER)
    statedir.check_dir(state_dir)
    statedir.ensure_dir(state_dir)


def test_an_empty_owner_file_is_recovered_from(state_dir):
    """A crash between creating the owner file and writing it leaves it
    empty: the next call writes it (broken by taking only a missing file
    as new; then every later call refused the host's own leases)."""
    path = os.path.join(state_dir, statedir.OWNER_NAME)
    open(path, 'w').close()
    owner = statedir.owner_text('/sys')
    statedir.check_owner(state_dir, owner)
    with open(path) as f:
        assert f.read() == owner
    statedir.check_owner(state_dir, owner)         # and it stands


def test_another_hosts_owner_file_is_refused(state_dir):
    statedir.check_owner(state_dir, statedir.owner_text('/sys'))
    with pytest.raises(exception.StateError) as e:
        statedir.check_owner(state_dir, statedir.owner_text('/tmp/sim'))
    assert 'sysfs_root=/sys' in str(e.value)
    assert 'sysfs_root=/tmp/sim' in str(e.value)
