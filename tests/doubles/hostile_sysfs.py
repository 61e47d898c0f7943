"""Hostile sysfs trees: a simulated T4 host whose GPU ``A`` a case makes
hostile while ``B`` stays healthy (``Tree``: the host under ``top/sys``
with ``top/sys2``, a sibling of the root, and ``top/etc``, elsewhere,
holding secrets), and the cases (``CASES``): a FIFO, socket or character
device where an attribute should be, a link outside the root or in a
loop, an oversize file, a bad number, a malformed type directory,
control characters in names; each says what is skipped and the warning's
fragments."""

import os
import shutil
import stat

from libvirt_gpu.devices import sysfs as sysfs_mod
from libvirt_gpu.util import records
from tests.doubles import sockets

A = '0000:3b:00.0'   # the GPU made hostile
B = '0000:af:00.0'   # the healthy one
TYPE = 'nvidia-224'  # a type of A that a case breaks
ENABLED = 'nvidia-223'
SECRET = 'TOP-SECRET-2b7e1516'


class Tree(object):
    """A simulated T4 host under ``top/sys`` with ``top/sys2`` (a sibling
    of the root) and ``top/etc`` (elsewhere) holding secrets."""

    def __init__(self, root, profile, state_dir):
        self.root = root
        # the caller's (its tmp_path): not beside the tree on /dev/shm, as
        # a state directory below a directory anyone can write is refused
        # (statedir.check_dir)
        self.state_dir = state_dir
        self.profile = profile
        self.top = os.path.dirname(root)
        self.sibling = os.path.join(self.top, 'sys2')
        self.elsewhere = os.path.join(self.top, 'etc')
        for d in (self.sibling, self.elsewhere):
            os.makedirs(d)
            with open(os.path.join(d, 'secret'), 'w') as f:
                f.write(SECRET + '\n')
            _fake_type(os.path.join(d, 'types', 'nvidia-666'))

    def gpu_dir(self, address=A):
        return os.path.realpath(os.path.join(self.root, 'bus', 'pci',
                                             'devices', address))

    def types_dir(self, address=A):
        return os.path.join(self.gpu_dir(address), 'mdev_supported_types')

    def attr(self, name, type_id=None, address=A):
        if type_id is None:
            return os.path.join(self.gpu_dir(address), name)
        return os.path.join(self.types_dir(address), type_id, name)

    def replace(self, path, make):
        os.remove(path)
        make(path)

    def write(self, path, data):
        if os.path.lexists(path):
            os.remove(path)
        with open(path, 'wb') as f:
            f.write(data)


def _fake_type(path):
    """A readable type directory (what a walk outside the root finds)."""
    os.makedirs(path)
    for name, text in (('name', SECRET), ('description', SECRET),
                       ('device_api', 'vfio-pci'),
                       ('available_instances', '7')):
        with open(os.path.join(path, name), 'w') as f:
            f.write(text + '\n')


def _bind_socket(path):
    sockets.make_socket_file(path)


def _mknod_zero(path):
    os.mknod(path, stat.S_IFCHR | 0o444, os.makedev(1, 5))  # like /dev/zero


@records.record(frozen=False)
class Case:
    name: str
    apply: object      # f(tree)
    # what is skipped: 'device' (GPU A), 'type' (type TYPE of A) or
    # 'other-type' (a type directory the case adds to A)
    scope: str
    says: tuple        # fragments of the warning


def _types_dir_to_sibling(t):
    shutil.rmtree(t.types_dir())
    os.symlink(os.path.join(t.sibling, 'types'), t.types_dir())


def _types_dir_elsewhere(t):
    shutil.rmtree(t.types_dir())
    os.symlink(os.path.join(t.elsewhere, 'types'), t.types_dir())


def _control_characters(t):
    # a type directory whose name is an escape sequence (no type id: it is
    # skipped, and the warning quoting it must not reach the terminal raw)
    _fake_type(os.path.join(t.types_dir(), 'nvidia-\x1b[2J'))
    for address in (A, B):
        t.write(t.attr('name', ENABLED, address),
                b'GRID T4-2B\x1b]0;pwned\x07\xc2\x9b31m\n')
    drivers = os.path.join(t.root, 'bus', 'pci', 'drivers')
    evil = os.path.join(drivers, 'nv\x1b[31midia')
    os.makedirs(evil)
    os.remove(t.attr('driver'))
    os.symlink(evil, t.attr('driver'))


CASES = [
    Case('fifo-available-instances',
         lambda t: t.replace(t.attr('available_instances', TYPE),
                             os.mkfifo),
         'type', (TYPE + '/available_instances', 'a FIFO')),
    Case('fifo-vendor', lambda t: t.replace(t.attr('vendor'), os.mkfifo),
         'device', ('/vendor', 'a FIFO')),
    Case('fifo-class', lambda t: t.replace(t.attr('class'), os.mkfifo),
         'device', ('/class', 'a FIFO')),
    Case('socket-description',
         lambda t: t.replace(t.attr('description', TYPE), _bind_socket),
         'type', (TYPE + '/description', 'a socket')),
    Case('char-device-vendor',
         lambda t: t.replace(t.attr('vendor'), _mknod_zero),
         'device', ('/vendor', 'a character device')),
    Case('link-to-dev-zero',
         lambda t: t.replace(t.attr('vendor'),
                             lambda p: os.symlink('/dev/zero', p)),
         'device', ('/vendor', 'outside the sysfs root')),
    Case('link-to-dev-urandom',
         lambda t: t.replace(t.attr('description', TYPE),
                             lambda p: os.symlink('/dev/urandom', p)),
         'type', (TYPE + '/description', 'outside the sysfs root')),
    Case('link-to-file-elsewhere',
         lambda t: t.replace(t.attr('description', TYPE), lambda p: (
             os.symlink(os.path.join(t.elsewhere, 'secret'), p))),
         'type', (TYPE + '/description', 'outside the sysfs root')),
    Case('link-to-file-in-sibling-of-root',
         lambda t: t.replace(t.attr('description', TYPE), lambda p: (
             os.symlink(os.path.join(t.sibling, 'secret'), p))),
         'type', (TYPE + '/description', 'outside the sysfs root')),
    Case('types-dir-linked-elsewhere', _types_dir_elsewhere,
         'device', ('mdev_supported_types', 'outside the sysfs root')),
    Case('types-dir-linked-into-sibling-of-root', _types_dir_to_sibling,
         'device', ('mdev_supported_types', 'outside the sysfs root')),
    Case('link-loop-file',
         lambda t: t.replace(t.attr('description', TYPE),
                             lambda p: os.symlink('description', p)),
         'type', (TYPE + '/description', 'symbolic links')),
    Case('link-loop-type-dir',
         lambda t: os.symlink('nvidia-667',
                              os.path.join(t.types_dir(), 'nvidia-667')),
         'other-type', ('nvidia-667', 'symbolic links')),
    Case('oversize-description',
         lambda t: t.write(t.attr('description', TYPE), b'x' * (
             sysfs_mod.MAX_ATTRIBUTE_BYTES + 1)),
         'type', (TYPE + '/description', 'more than 65536 bytes')),
    Case('negative-available-instances',
         lambda t: t.write(t.attr('available_instances', TYPE), b'-1\n'),
         'type', (TYPE + '/available_instances', 'at least 0', "'-1'")),
    Case('non-numeric-available-instances',
         lambda t: t.write(t.attr('available_instances', TYPE), b'many\n'),
         'type', (TYPE + '/available_instances', "'many'")),
    Case('malformed-type-dir',
         lambda t: os.makedirs(os.path.join(t.types_dir(), TYPE + '0')),
         'other-type', (TYPE + '0/available_instances', 'no such file')),
    Case('control-characters-in-names', _control_characters,
         'other-type', ('nvidia-\\x1b[2J',)),
]
