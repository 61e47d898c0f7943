"""The sysfs reader's fast paths refuse what its thorough paths refuse.

Discovery reads a type's ``available_instances`` the short way once the
type's id is validated and its text known for the model (``_count_in``),
opens ``mdev_supported_types`` and reads links relative to the device
directory it already checked, and can skip a non-GPU after reading its
class.  Each short way must end where the thorough one does: a bad
entry found on it is read again the thorough way, which names it.  The
hostile cases of ``test_sysfs_hostile`` only break the first GPU of a
fresh pass, which the thorough way reads; here they are met on a warm
pass, which takes the short way.
"""

import os
import stat

import pytest

from libvirt_gpu.devices import discovery
from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu import simulator
from libvirt_gpu.devices import sysfs as sysfs_mod
from tests.doubles import kinds
from tests.doubles import trees
from tests.doubles import hostile_sysfs as hostile

A, TYPE, ENABLED = hostile.A, hostile.TYPE, hostile.ENABLED

# Cases whose bad file a warm pass still reads: the count, or the type
# directory itself.  (A type's name, description and device_api are read
# once per model, so a warm pass does not look at them again.)
WARM_CASES = [c for c in hostile.CASES if c.scope != 'device' and (
    'available_instances' in ' '.join(c.says)
    or c.name in ('link-loop-type-dir', 'control-characters-in-names'))]
WARM_IDS = [c.name for c in WARM_CASES]


@pytest.fixture
def tree(tmp_path):
    with trees.simulated_tree('t4') as (root, profile):
        yield hostile.Tree(root, profile, str(tmp_path / 'state'))


def _model(reader, address):
    gpu = reader.read_gpu(address, mdevs_by_parent={})
    return (gpu.driver, gpu.vendor_id, gpu.product_id, gpu.physfn is not None)


@pytest.mark.parametrize('case', WARM_CASES, ids=WARM_IDS)
def test_a_warm_pass_refuses_what_a_cold_one_does(tree, case, monkeypatch):
    short = []

    def count_in(dir_fd, type_id):
        short.append(type_id)
        return real_count_in(dir_fd, type_id)
    real_count_in = sysfs_mod.reader._count_in
    monkeypatch.setattr(sysfs_mod.reader, '_count_in', count_in)
    reader = sysfs_mod.Sysfs(tree.root)
    cache = {}
    model = _model(reader, A)
    healthy = reader.mdev_types(A, cache, model=model)
    assert TYPE in {t.id for t in healthy} and cache
    case.apply(tree)

    skipped = []
    del short[:]
    warm = reader.mdev_types(A, cache, model=model, skipped=skipped)
    assert ENABLED in short      # the warm pass took the short way
    if case.scope == 'type':
        assert TYPE in short     # and met the bad type on it
    cold_skipped = []
    cold = reader.mdev_types(A, skipped=cold_skipped)
    assert [t.id for t in warm] == [t.id for t in cold]
    assert [str(e) for e in skipped] == [str(e) for e in cold_skipped]
    ids = {t.id for t in warm}
    assert (TYPE in ids) == (case.scope == 'other-type')
    message = ' '.join(str(e) for e in skipped).replace('\x1b', '\\x1b')
    for fragment in case.says:
        assert fragment in message
    with pytest.raises(exception.SysfsReadError):
        reader.mdev_types(A, cache, model=model)


def test_a_warm_discovery_equals_a_cold_one(tree):
    reader = sysfs_mod.Sysfs(tree.root)
    cold = discovery.from_sysfs(reader, share_type_text=False,
                                kinds=kinds.registered())
    assert discovery.from_sysfs(reader, kinds=kinds.registered()) == cold
    assert discovery.from_sysfs(reader, kinds=kinds.registered()) == cold


def test_synthetic_host_reads_the_same_every_way(tmp_path):
    simulator.write_host(simulator.synthetic_profile(6, types=5), tmp_path)
    reader = sysfs_mod.Sysfs(tmp_path)
    cold = discovery.from_sysfs(reader, share_type_text=False,
                                kinds=kinds.registered())
    assert sum(len(g.mdev_types) for g in cold.gpus) == 6 * 5
    assert discovery.from_sysfs(reader, kinds=kinds.registered()) == cold
    for gpu in cold.gpus:
        assert reader.read_gpu(gpu.address, class_filter=lambda c: True) \
            == reader.read_gpu(gpu.address)


# --- _count_in -------------------------------------------------------------

@pytest.fixture
def types_dir(tmp_path):
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield str(tmp_path), fd
    finally:
        os.close(fd)


def _type(top, text, name='nvidia-1'):
    os.mkdir(os.path.join(top, name))
    path = os.path.join(top, name, 'available_instances')
    if text is not None:
        with open(path, 'wb') as f:
            f.write(text)
    return path


@pytest.mark.parametrize('text,value', [
    (b'0\n', 0), (b'16\n', 16), (b' 7 \n', 7), (b'007', 7),
    (b'4096', 4096), (b' ' * 61 + b'5\n', 5),
    # past bounds.MAX_INSTANCES: left to the thorough reader, which refuses
    (b'4097', None), (b'9' * 19, None)])
def test_count_in_reads_a_plain_count(types_dir, text, value):
    top, fd = types_dir
    _type(top, text)
    assert sysfs_mod.reader._count_in(fd, 'nvidia-1') == value


@pytest.mark.parametrize('text', [
    b'', b'\n', b'-1\n', b'+3\n', b'1.5\n', b'1_000\n', b'0x10\n',
    b'9' * 20, '\u0663\n'.encode(), b'3\x00', b'1 2\n',
    b' ' * 62 + b'5\n', b'1' * (sysfs_mod.MAX_ATTRIBUTE_BYTES + 1)])
def test_count_in_leaves_anything_else_to_the_thorough_reader(types_dir,
                                                              text):
    top, fd = types_dir
    _type(top, text)
    assert sysfs_mod.reader._count_in(fd, 'nvidia-1') is None


def test_a_count_left_to_the_thorough_reader_is_read_by_it(tree):
    """A count padded past what ``_count_in`` reads is still a count."""
    reader = sysfs_mod.Sysfs(tree.root)
    cache = {}
    model = _model(reader, A)
    reader.mdev_types(A, cache, model=model)
    tree.write(tree.attr('available_instances', TYPE), b' ' * 100 + b'3\n')
    warm = {t.id: t for t in reader.mdev_types(A, cache, model=model)}
    assert warm[TYPE].available_instances == 3


def test_count_in_opens_no_link_and_no_special_file(types_dir):
    top, fd = types_dir
    _type(top, b'3\n', 'real')
    os.symlink('real', os.path.join(top, 'link'))
    assert sysfs_mod.reader._count_in(fd, 'real') == 3
    # a linked type directory is never given to _count_in: the listing
    # says it is no plain directory (next test)
    linked = _type(top, None, 'linked-file')
    os.symlink(os.path.join(top, 'real', 'available_instances'), linked)
    assert sysfs_mod.reader._count_in(fd, 'linked-file') is None
    os.mkfifo(_type(top, None, 'fifo'))
    assert sysfs_mod.reader._count_in(fd, 'fifo') is None  # at once, no hang
    _type(top, None, 'missing')
    assert sysfs_mod.reader._count_in(fd, 'missing') is None
    assert sysfs_mod.reader._count_in(fd, 'absent') is None


def test_type_entries_tell_plain_directories_from_the_rest(types_dir):
    top, fd = types_dir
    _type(top, b'3\n', 'real')
    os.symlink('real', os.path.join(top, 'link'))
    os.symlink('nowhere', os.path.join(top, 'dangling'))
    with open(os.path.join(top, 'file'), 'w'):
        pass
    os.mkfifo(os.path.join(top, 'fifo'))
    assert sysfs_mod.reader._type_entries(fd) == [
        ('dangling', False), ('fifo', False), ('file', False),
        ('link', False), ('real', True)]
    # the descriptor is listed again from its start
    assert [n for n, _ in sysfs_mod.reader._type_entries(fd)][-1] == 'real'


def test_a_linked_type_directory_is_read_the_thorough_way(tree,
                                                          monkeypatch):
    """A type directory swapped for a link to a healthy one, met on a warm
    pass: not read the short way, and the same answer as a cold pass."""
    short = []
    real_count_in = sysfs_mod.reader._count_in
    monkeypatch.setattr(sysfs_mod.reader, '_count_in',
                        lambda fd, type_id: short.append(type_id)
                        or real_count_in(fd, type_id))
    reader = sysfs_mod.Sysfs(tree.root)
    cache = {}
    model = _model(reader, A)
    reader.mdev_types(A, cache, model=model)
    type_dir = os.path.dirname(tree.attr('available_instances', TYPE))
    os.rename(type_dir, type_dir + '.moved')
    os.symlink(os.path.basename(type_dir) + '.moved', type_dir)
    del short[:]
    skipped, cold_skipped = [], []
    warm = reader.mdev_types(A, cache, model=model, skipped=skipped)
    assert TYPE not in short and ENABLED in short
    cold = reader.mdev_types(A, skipped=cold_skipped)
    assert warm == cold
    assert [str(e) for e in skipped] == [str(e) for e in cold_skipped]


def test_count_in_leaves_no_descriptor_open(types_dir):
    top, fd = types_dir
    _type(top, b'3\n', 'ok')
    os.mkfifo(_type(top, None, 'fifo'))
    _type(top, b'x\n', 'bad')
    before = set(os.listdir('/proc/self/fd'))
    for name in ('ok', 'fifo', 'bad', 'absent') * 10:
        sysfs_mod.reader._count_in(fd, name)
    assert set(os.listdir('/proc/self/fd')) == before


# --- containment, class filter, links --------------------------------------

def test_containment_prefix_is_made_for_the_root_given():
    reader = sysfs_mod.Sysfs('/')
    assert reader._inside('/') and reader._inside('/sys2')
    reader.root = '/sys'
    assert reader._inside('/sys') and reader._inside('/sys/bus')
    assert not reader._inside('/sys2') and not reader._inside('/')
    assert sysfs_mod.is_inside('/sys', '/sys/')
    assert not sysfs_mod.is_inside('/sys', 'sys/bus')


def test_class_filter_reads_a_non_gpu_no_further(tree):
    reader = sysfs_mod.Sysfs(tree.root)
    assert reader.read_gpu(A, mdevs_by_parent={},
                           class_filter=lambda c: False) is None
    seen = []
    gpu = reader.read_gpu(A, mdevs_by_parent={},
                          class_filter=lambda c: seen.append(c) or True)
    assert seen == [reader.pci_class(A)] == [gpu.class_code]
    assert gpu == reader.read_gpu(A, mdevs_by_parent={})
    # the class is read first: a FIFO there is refused before anything
    tree.replace(tree.attr('class'), os.mkfifo)
    with pytest.raises(exception.SysfsNotRegularFile, match='/class'):
        reader.read_gpu(A, class_filter=objects.is_gpu_class)


def test_a_physfn_link_to_no_pci_device_is_named(tree):
    os.symlink('../nothing-pci', tree.attr('physfn'))
    with pytest.raises(exception.SysfsReadError,
                       match=r'physfn: .*nothing-pci'):
        sysfs_mod.Sysfs(tree.root).read_gpu(A, mdevs_by_parent={})


def test_a_driver_that_is_no_link_is_no_driver(tree):
    os.remove(tree.attr('driver'))
    with open(tree.attr('driver'), 'w') as f:
        f.write('nvidia\n')
    assert stat.S_ISREG(os.lstat(tree.attr('driver')).st_mode)
    gpu = sysfs_mod.Sysfs(tree.root).read_gpu(A, mdevs_by_parent={})
    assert gpu.driver is None


# --- bus/mdev/devices --------------------------------------------------------

UUID = objects.Uuid.parse('6b5d5a36-3f0e-4a33-a39b-6f6a2a1c0c01')


@pytest.mark.parametrize('target,says', [
    (lambda t: os.path.join(t.sibling, 'types'), 'outside the sysfs root'),
    (lambda t: os.path.join(t.elsewhere, 'types'), 'outside the sysfs root'),
    (lambda t: UUID, 'symbolic links'),                 # a loop
    (lambda t: t.attr('vendor'), 'Not a directory'),    # a file
    (lambda t: t.types_dir(), 'mdev without a type link'),
    (lambda t: os.path.join(t.gpu_dir(), 'gone'), 'mdev without a type link'),
], ids=['sibling', 'elsewhere', 'loop', 'file', 'no-type-link', 'dangling'])
def test_a_bad_mdev_entry_is_skipped_and_named(tree, target, says,
                                               caplog):
    devices = os.path.join(tree.root, 'bus', 'mdev', 'devices')
    good = sorted(os.listdir(devices))
    os.symlink(target(tree), os.path.join(devices, UUID))
    reader = sysfs_mod.Sysfs(tree.root)
    skipped = []
    found = reader.mdevs_by_parent(skipped=skipped)
    assert sorted(str(m.uuid) for ms in found.values() for m in ms) == good
    assert len(skipped) == 1 and UUID in str(skipped[0])
    assert says in str(skipped[0])
    # every reader (the allocator, reconcile, the hook) the same way:
    # skipped and named in a warning, never a refusal of the whole host
    assert reader.mdevs_by_parent() == found
    assert 'mdev skipped' in caplog.text and says in caplog.text
