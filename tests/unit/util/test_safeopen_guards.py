"""safeopen behaviours no other test pinned (issue 30, section 6): the
fallback walk never follows a link in the last component, and the
``openat2`` path refuses a link even one that stays inside the root
(``RESOLVE_NO_SYMLINKS``, not only ``RESOLVE_BENEATH``)."""

import errno
import os

import pytest

from libvirt_gpu.util import safeopen

REFUSED = (errno.ELOOP, errno.EXDEV, errno.ENOTDIR)


@pytest.fixture
def tree(tmp_path):
    """``root/sub/file``, ``root/sub/inside`` (a link to ``file``),
    ``root/sub/outside`` (a link to a file out of the root) and
    ``root/dirlink`` (a link to ``sub``); yields a descriptor of root."""
    root = tmp_path / 'root'
    (root / 'sub').mkdir(parents=True)
    (root / 'sub' / 'file').write_text('inside\n')
    (tmp_path / 'secret').write_text('outside\n')
    os.symlink('file', root / 'sub' / 'inside')
    os.symlink(str(tmp_path / 'secret'), root / 'sub' / 'outside')
    os.symlink('sub', root / 'dirlink')
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield fd
    finally:
        os.close(fd)


def _read(fd):
    try:
        return os.read(fd, 100)
    finally:
        os.close(fd)


@pytest.fixture(params=[False, True], ids=['walk', 'openat2'])
def use_openat2(request):
    if request.param and not safeopen._load_openat2():
        pytest.skip('this kernel has no openat2')
    return request.param


def test_a_plain_path_opens(tree, use_openat2):
    assert _read(safeopen.open_beneath(
        tree, 'sub/file', os.O_RDONLY, use_openat2=use_openat2)) == \
        b'inside\n'


@pytest.mark.parametrize('name', ['sub/inside', 'sub/outside'])
def test_a_link_in_the_last_component_is_never_followed(
        tree, use_openat2, name):
    """Broken (the walk) by opening the last component without
    ``O_NOFOLLOW``."""
    with pytest.raises(OSError) as e:
        _read(safeopen.open_beneath(tree, name, os.O_RDONLY,
                                    use_openat2=use_openat2))
    assert e.value.errno in REFUSED


def test_a_link_in_the_last_component_is_not_written_through(tree,
                                                             tmp_path):
    with pytest.raises(OSError):
        os.close(safeopen.open_beneath(tree, 'sub/outside', os.O_WRONLY,
                                       use_openat2=False))
    assert (tmp_path / 'secret').read_text() == 'outside\n'


def test_a_link_on_the_way_is_refused(tree, use_openat2):
    """A directory link that stays inside the root is refused as well:
    the ``openat2`` call carries ``RESOLVE_NO_SYMLINKS`` (broken by
    leaving it out: ``RESOLVE_BENEATH`` alone lets an inside link
    through)."""
    with pytest.raises(OSError) as e:
        _read(safeopen.open_beneath(tree, 'dirlink/file', os.O_RDONLY,
                                    use_openat2=use_openat2))
    assert e.value.errno in REFUSED


@pytest.mark.parametrize('bad', ['', '/', '../x', 'sub/../sub/file',
                                 './sub/file'])
def test_dot_components_are_refused(tree, bad):
    with pytest.raises(OSError) as e:
        safeopen.open_beneath(tree, bad, os.O_RDONLY)
    assert e.value.errno == errno.EINVAL
