"""Sysfs is input: hostile trees against the reader, the CLI and the hook.

Each case makes one GPU of a simulated T4 host (A) hostile: a FIFO, socket
or character device where an attribute should be, a link to a file or
directory outside the root (also into a sibling directory of the root,
``sys2`` beside ``sys``, which a string-prefix containment check takes for
inside), a link loop, an oversize file, a negative or non-numeric number,
a malformed type directory, control characters in names.  The other GPU
(B) stays healthy and must stay usable: the bad entry is refused at once
and skipped with a warning naming it, never read, never hanging.

The CLI (``list``, ``types``, ``placement show``, ``discover``,
``restore``) and the installed qemu hook (``prepare``, ``reconnect``,
``release``) run as processes.  Their timeout detects a hang (a FIFO
blocks a reader forever, ``/dev/zero`` never ends); it is no speed claim.
"""

import os
import site
import subprocess
import sys
import uuid as uuidlib

import pytest

from libvirt_gpu.devices import discovery
from libvirt_gpu import exception
from libvirt_gpu.guests import hook
from libvirt_gpu.devices import sysfs as sysfs_mod
from tests.doubles import hang
from tests.doubles import kernel_sysfs
from tests.doubles import kinds
from tests.doubles import trees
from tests.doubles import paths
from tests.doubles.hostile_sysfs import A
from tests.doubles.hostile_sysfs import B
from tests.doubles.hostile_sysfs import CASES
from tests.doubles.hostile_sysfs import ENABLED
from tests.doubles.hostile_sysfs import SECRET
from tests.doubles.hostile_sysfs import TYPE
from tests.doubles.hostile_sysfs import Tree

ROOT = paths.ROOT
CLI = os.path.join(os.path.dirname(sys.executable), 'libvirt-gpu')
HANG = 60            # seconds: a hang detector, not a speed assertion
RAW_CONTROLS = ('\x1b', '\x07', '\x9b')
IDS = [c.name for c in CASES]


@pytest.fixture(autouse=True)
def hang_detector():
    """In-process reads get a hang detector too: SIGALRM interrupts a
    blocked read (a FIFO) and fails the test instead of stopping the
    suite.  Generous: a test runs up to ten processes."""
    with hang.alarm(HANG * 5):
        yield


@pytest.fixture
def tree(tmp_path):
    # made under /dev/shm where there is one (see simulated_tree)
    with trees.simulated_tree('t4') as (root, profile):
        yield Tree(root, profile, str(tmp_path / 'state'))


def _config(t, path):
    """Both GPUs offer ENABLED (no device_addresses)."""
    with open(path, 'w') as f:
        f.write('[DEFAULT]\nsysfs_root = %s\nstate_dir = %s\n'
                '[gpu]\nenabled_vgpu_types = %s\n'
                % (t.root, t.state_dir, ENABLED))
    return path


def _clean(text):
    """No secret read from outside the root, no raw control character."""
    assert SECRET not in text and 'nvidia-666' not in text, text
    raw = [c for c in RAW_CONTROLS if c in text]
    assert not raw, text
    assert 'Traceback' not in text, text


# --- the reader --------------------------------------------------------------

@pytest.mark.parametrize('case', CASES, ids=IDS)
def test_discovery_skips_the_bad_entry_and_names_it(tree, case, caplog):
    case.apply(tree)
    gpus = {str(g.address): g for g in
            discovery.from_sysfs(sysfs_mod.Sysfs(tree.root),
                                 kinds=kinds.registered()).gpus}
    assert B in gpus
    assert ENABLED in {t.id for t in gpus[B].mdev_types}
    if case.scope == 'device':
        assert A not in gpus
    else:
        ids = {t.id for t in gpus[A].mdev_types}
        assert ENABLED in ids and 'nvidia-666' not in ids
        assert (TYPE in ids) == (case.scope == 'other-type')
        assert len(ids) == (17 if case.scope == 'other-type' else 16)
    for fragment in case.says:
        assert fragment in caplog.text.replace('\x1b', '\\x1b')
    assert SECRET not in repr(gpus)


@pytest.mark.parametrize('case', CASES, ids=IDS)
def test_reader_refuses_with_a_typed_error(tree, case):
    """Without ``skipped``, the reader raises what discovery skips."""
    case.apply(tree)
    reader = sysfs_mod.Sysfs(tree.root)
    with pytest.raises(exception.SysfsReadError) as info:
        if case.scope == 'device':
            reader.read_gpu(A)
        else:
            reader.mdev_types(A)
    message = str(info.value).replace('\x1b', '\\x1b')
    for fragment in case.says:
        assert fragment in message


def test_containment_is_by_path_component(tmp_path):
    root = str(tmp_path / 'sys')
    assert sysfs_mod.is_inside(root, root)
    assert sysfs_mod.is_inside(root, root + '/bus/pci')
    assert not sysfs_mod.is_inside(root, root + '2')
    assert not sysfs_mod.is_inside(root, root + '2/secret')
    assert not sysfs_mod.is_inside(root, str(tmp_path))
    assert sysfs_mod.is_inside('/', '/sys2')


@pytest.mark.parametrize('text,minimum,value', [
    ('0', 0, 0), ('16', 0, 16), ('-1', -1, -1), ('-1', None, -1)])
def test_numbers_accepted(text, minimum, value):
    assert sysfs_mod.parse_number(text, 'p', minimum=minimum) == value


@pytest.mark.parametrize('text,minimum', [
    ('-1', 0), ('-2', -1), ('many', 0), ('', 0), ('1.5', 0), ('1_000', 0),
    ('+3', 0), (' 3', 0), ('0x10', 0), ('9' * 20, 0), ('\u0663', 0)])
def test_numbers_refused(text, minimum):
    with pytest.raises(exception.SysfsBadNumber, match='p: expected'):
        sysfs_mod.parse_number(text, 'p', minimum=minimum)


def test_numa_node_minus_one_means_none(tree):
    tree.write(tree.attr('numa_node'), b'-1\n')
    assert sysfs_mod.Sysfs(tree.root).read_gpu(A).numa_node is None
    tree.write(tree.attr('numa_node'), b'-2\n')
    with pytest.raises(exception.SysfsBadNumber, match='numa_node'):
        sysfs_mod.Sysfs(tree.root).read_gpu(A)


def test_write_refuses_a_fifo_at_once(tree):
    """A FIFO where ``create`` should be: opening it for writing would
    block until a reader comes."""
    path = os.path.join(tree.types_dir(B), ENABLED, 'create')
    tree.replace(path, os.mkfifo)
    with pytest.raises(exception.SysfsWriteError, match='a FIFO'):
        sysfs_mod.Sysfs(tree.root).write(path, str(uuidlib.uuid4()))


def test_links_inside_the_root_are_followed(tree):
    """Links are normal in sysfs: an attribute linked to another file
    inside the root is read."""
    other = tree.attr('description', ENABLED)
    tree.replace(tree.attr('description', TYPE),
                 lambda p: os.symlink(other, p))
    types = {t.id: t for t in sysfs_mod.Sysfs(tree.root).mdev_types(A)}
    assert types[TYPE].description == types[ENABLED].description


# --- the CLI, as a process ------------------------------------------------

# The cases the CLI and the hook run (as processes they cost ~1 s a run):
# one of each kind; the reader tests above take every case.
PROCESS_CASES = [c for c in CASES if c.name in (
    'fifo-available-instances', 'fifo-vendor', 'socket-description',
    'char-device-vendor', 'link-to-dev-zero',
    'link-to-file-in-sibling-of-root',
    'types-dir-linked-into-sibling-of-root', 'link-loop-file',
    'oversize-description', 'negative-available-instances',
    'non-numeric-available-instances', 'malformed-type-dir',
    'control-characters-in-names')]
PROCESS_IDS = [c.name for c in PROCESS_CASES]


def cli_runs(config, root, commands):
    """Run CLI ``commands`` (argv lists) side by side; ``[(rc, stdout,
    stderr)]`` in their order."""
    procs = [subprocess.Popen(
        [CLI, '--config-file', config, '--sysfs-root', root] + argv,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE) for argv in commands]
    try:
        results = []
        for p in procs:
            out, err = p.communicate(timeout=HANG)
            results.append((p.returncode, out.decode('utf-8', 'replace'),
                            err.decode('utf-8', 'replace')))
        return results
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _provider(address):
    return 'vm_' + address


@pytest.mark.parametrize('case', PROCESS_CASES, ids=PROCESS_IDS)
def test_cli_commands(tree, case):
    """``list``, ``types``, ``placement show``, ``discover`` and
    ``restore --dry-run`` (which, with no device_addresses configured,
    reads the vendor of every PCI device; its state dir is the tree's)."""
    config = _config(tree, os.path.join(tree.top, 'conf'))
    # discover reports what Cyborg would get: the GPUs given to it
    cyborgs = os.path.join(tree.top, 'cyborg.conf')
    with open(config) as f, open(cyborgs, 'w') as g:
        g.write(f.read() + '[routes]\ncyborg = all\n')
    case.apply(tree)
    gone = case.scope == 'device'
    shows = {'list': lambda a: a, 'types': lambda a: a,
             'placement': _provider, 'discover': _provider}
    commands = [['list'], ['types'], ['placement', 'show'],
                ['--config-file', cyborgs, 'discover'],
                ['restore', '--dry-run', '--no-libvirt', '--sriov-manage',
                 'none',
                 '--mdevctl-dir', os.path.join(tree.top, 'mdevctl.d')]]
    results = dict(zip([argv[-1] if argv[0] == '--config-file' else argv[0]
                        for argv in commands],
                       cli_runs(config, tree.root, commands)))
    for command, (rc, out, err) in results.items():
        assert rc == 0, (command, err)
        _clean(out + err)
        if command == 'restore':
            assert '0 change(s), 0 failure(s)' in out, out
            continue
        show = shows[command]
        assert show(B) in out, (command, out)
        assert (show(A) in out) != gone, (command, out)
        for fragment in case.says:
            assert fragment in err, (command, err)
    _, out, err = results['restore']
    if case.says[0] == '/vendor':
        assert 'PCI device %s skipped' % A in err, err
        assert case.says[1] in err, err
    if not gone:
        rows = [line.split()[1] for line in results['types'][1].splitlines()
                if line.startswith(A)]
        assert ENABLED in rows
        assert (TYPE in rows) == (case.scope == 'other-type'), rows
    if case.name == 'control-characters-in-names':
        assert 'GRID T4-2B\\x1b]0;pwned\\x07\\x9b31m' in results['types'][1]
        assert 'nv\\x1b[31midia' in results['list'][1]


# --- the installed hook, as a process ---------------------------------------

def _domain_xml(mdev_uuid):
    return (
        "<domain type='kvm'><name>vm1</name>"
        "<uuid>c7a5fdbd-cdaf-9455-926a-d65c16db1809</uuid><metadata>"
        "<gpu:gpus xmlns:gpu='urn:libvirt-gpu:1'><gpu:vgpu uuid='%s' "
        "type='%s' parent='%s'/></gpu:gpus></metadata>"
        "<memory unit='KiB'>65536</memory><devices>"
        "<hostdev mode='subsystem' type='mdev' managed='no' "
        "model='vfio-pci'><source><address uuid='%s'/></source></hostdev>"
        "</devices></domain>" % (mdev_uuid, ENABLED, B, mdev_uuid)).encode()


def _hook_script(t, config):
    settings = os.path.join(t.state_dir, hook.SETTINGS_NAME)
    with open(hook.hook_source()) as f:
        text = hook.render_hook(
            f.read(), sys.executable, config, settings,
            [p for p in site.getsitepackages() if os.path.isdir(p)] + [ROOT])
    path = os.path.join(t.top, 'qemu-hook')
    with open(path, 'w') as f:
        f.write(text)
    os.chmod(path, 0o755)
    return path, settings


@pytest.mark.parametrize('case', PROCESS_CASES, ids=PROCESS_IDS)
def test_hook(tree, case):
    """reconnect and release never fail and never hang, prepare creates
    the vGPU on the healthy GPU; each first run of an operation reads the
    whole hostile host (no settings snapshot yet)."""
    config = _config(tree, os.path.join(tree.top, 'conf'))
    script, settings = _hook_script(tree, config)
    env = {'LC_ALL': 'C', 'PATH': '/usr/bin:/bin', 'HOME': '/root'}
    u = str(uuidlib.uuid4())
    xml = _domain_xml(u)
    watcher = kernel_sysfs.KernelWatcher(tree.root, tree.profile).start()
    try:
        case.apply(tree)   # after the watcher set up its inotify watches

        def run(op):
            r = subprocess.run([script, 'vm1', op, 'begin', '-'], input=xml,
                               capture_output=True, env=env, timeout=HANG)
            err = r.stderr.decode('utf-8', 'replace')
            assert 'Traceback' not in err and SECRET not in err, err
            return r.returncode, err

        for op in ('reconnect', 'release', 'prepare'):
            if os.path.exists(settings):
                os.remove(settings)
            rc, err = run(op)
            assert rc == 0, (op, err)
            for fragment in case.says:
                assert fragment in err.replace('\x1b', '\\x1b'), (op, err)
            if op == 'reconnect':
                assert 'vGPU %s, which does not exist' % u in err
        assert u in watcher.kernel.mdevs()
        assert run('release')[0] == 0
        assert u not in watcher.kernel.mdevs()
    finally:
        watcher.stop()


@pytest.mark.parametrize('read', ['read_gpu', 'pci_function'])
def test_a_garbage_pci_id_is_one_typed_error_wherever_read(read):
    """One hex-id parser (``sysfs.parsers.parse_hex_id``): a function's
    ``vendor`` file that is no PCI id is a SysfsBadNumber naming it, for
    discovery's reading of a GPU and for an IOMMU group's member alike."""
    with trees.simulated_tree('t4') as (root, profile):
        address = str(sysfs_mod.Sysfs(root).pci_addresses()[0])
        path = os.path.join(root, 'bus', 'pci', 'devices', address, 'vendor')
        with open(path, 'w') as f:
            f.write('0xnvidia\n')
        with pytest.raises(exception.SysfsBadNumber) as info:
            getattr(sysfs_mod.Sysfs(root), read)(address)
        assert path in str(info.value) and '0xnvidia' in str(info.value)
