"""Hardening: bounded work on every input, a state directory only root
steers, and the behaviours no other test guarded (issue 18).

Each test names the kind of failure it covers.
"""

import fcntl
import os
import subprocess
import sys
import time

import pytest

from libvirt_gpu.host import allocator as allocator_mod
from libvirt_gpu.devices.backends import mdev
from libvirt_gpu.util import bounds
from libvirt_gpu.devices import discovery
from libvirt_gpu import environment
from libvirt_gpu import exception
from libvirt_gpu.guests import hook
from libvirt_gpu.virt import nodedev
from libvirt_gpu import objects
from libvirt_gpu.store import state
from libvirt_gpu.devices import sysfs as sysfs_mod
from tests.doubles import kernel_sysfs
from tests.doubles import kinds
from tests.doubles import trees
from tests.doubles import paths
from tests.doubles import t4_hook as th

T_NVIDIA_223 = objects.TypeId.parse('nvidia-223')

ROOT = paths.ROOT
A = objects.PciAddress.parse('0000:3b:00.0')
B = objects.PciAddress.parse('0000:af:00.0')


# --- unbounded work ----------------------------------------------------------

def test_cpulist_is_judged_by_ranges_never_expanded():
    # 100 copies of every CPU number: kept as one range, not 6.5 M members
    cpus = objects.parse_cpulist(','.join(['0-65535'] * 100), 'cpuset')
    assert cpus.ranges == ((0, 65535),)
    assert 65535 in cpus and 65536 not in cpus
    cpus = objects.parse_cpulist('0-7,^3,16,^40-50', 'cpuset')
    assert cpus.ranges == ((0, 2), (4, 7), (16, 16))
    assert cpus.intersects(objects.parse_cpulist('3,16'))
    assert not cpus.intersects(objects.parse_cpulist('3,8-15'))


@pytest.mark.parametrize('text,bound', [
    (','.join(['1'] * (bounds.MAX_CPULIST_PARTS + 1)), 'parts'),
    ('0-1,' * (bounds.MAX_CPULIST_CHARS // 4 + 1), 'characters'),
    ('0-%d' % bounds.MAX_CPU, 'below'),
    ('0-99999999999999999999', 'below')])
def test_cpulist_past_a_bound_is_refused(text, bound):
    with pytest.raises(exception.InvalidInput, match=bound):
        objects.parse_cpulist(text, '<vcpu> cpuset')


def test_huge_cpuset_refused_by_the_hook_in_bounded_time(tmp_path):
    """A cpuset under the 4 MiB XML cap that names billions of members:
    prepare refuses it, release and reconnect exit 0, each in a process
    judged by a timeout (the old parser expanded it for half an hour)."""
    with trees.simulated_tree('t4') as (root, profile):
        env = th.Env(root, profile, tmp_path)
        cpuset = ','.join(['0-65535'] * 400000)      # 3.2 MiB
        xml = th.domain_xml([(th.new_uuid(), 'nvidia-223', None)]).replace(
            b'<devices>', b"<vcpu cpuset='%s'>2</vcpu><devices>"
            % cpuset.encode())
        code = ('import sys; from libvirt_gpu.guests import hook; '
                'sys.exit(hook.run(["qemu", "vm1", sys.argv[1], "begin", '
                '"-"], sys.stdin.buffer.read(), config_file=%r, '
                'settings_file=None))' % env.config)
        for op, rc in (('prepare', 1), ('release', 0), ('reconnect', 0)):
            done = subprocess.run([sys.executable, '-c', code, op],
                                  input=xml, capture_output=True,
                                  timeout=60, cwd=ROOT)
            assert done.returncode == rc, (op, done.stderr[-500:])
            assert b'more than the' in done.stderr, done.stderr[-500:]


def test_local_cpulist_is_read_outside_the_lease_lock(tmp_path):
    """A long local_cpulist is parsed before the lock is taken: nothing
    that grows with input runs inside it."""
    with trees.simulated_tree('t4') as tree:
        backend = mdev.MdevBackend(kernel_sysfs.KernelSysfs(*tree))
        store = state.LeaseStore(tmp_path / 'state')
        store.leases()                       # the state dir and lock file
        held = []
        real = backend.sysfs.locality

        def locality(address):
            fd = os.open(store.lock_path, os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held.append(False)
            except BlockingIOError:
                held.append(True)
            finally:
                os.close(fd)
            return real(address)

        backend.sysfs.locality = locality
        alloc = allocator_mod.Allocator(backend, store, {
            a: objects.EnabledType('nvidia-223') for a in (A, B)})
        pinning = objects.NumaPinning(nodes=objects.parse_cpulist('1'))
        alloc.reserve(th.DOM, [allocator_mod.VgpuClaim(
            uuid=th.new_uuid(), type_id=T_NVIDIA_223)], pinning=pinning)
        assert held and not any(held)


def _write(path, text):
    with open(path, 'w') as f:
        f.write(text)


def test_available_instances_in_the_billions_skips_the_type(caplog):
    with trees.simulated_tree('t4') as (root, _):
        sysfs = sysfs_mod.Sysfs(root)
        types = os.path.join(sysfs.pci_dir(B), 'mdev_supported_types')
        _write(os.path.join(types, 'nvidia-223', 'available_instances'),
               '3000000000\n')
        gpu = discovery.from_sysfs(sysfs, kinds=kinds.registered()).gpu(B)
        assert 'nvidia-223' not in [t.id for t in gpu.mdev_types]
        assert gpu.mdev_types                # the others are still there
        assert 'at most %d' % bounds.MAX_INSTANCES in caplog.text


def test_available_instances_in_the_billions_from_libvirt_refused():
    xml = ("<device><name>pci_0000_af_00_0</name><capability type='pci'>"
           "<domain>0</domain><bus>175</bus><slot>0</slot>"
           "<function>0</function><product id='0x1eb8'/>"
           "<vendor id='0x10de'/><capability type='mdev_types'>"
           "<type id='nvidia-223'><name>GRID T4-2B</name>"
           "<deviceAPI>vfio-pci</deviceAPI>"
           "<availableInstances>3000000000</availableInstances></type>"
           "</capability></capability></device>")
    with pytest.raises(exception.InvalidInput, match='at most|more than'):
        nodedev.parse_pci(xml)


# --- the state directory ---------------------------------------------------

def test_fifo_in_place_of_the_hook_log_is_refused_not_waited_on(tmp_path):
    fifo = str(tmp_path / 'hook.log')
    os.mkfifo(fifo)
    code = ('import sys; from libvirt_gpu.guests import hook; '
            'log = hook.HookLog(["qemu", "vm1", "release", "end"], '
            'sys.stderr); log.path = %r; log.info("x"); log.flush()' % fifo)
    done = subprocess.run([sys.executable, '-c', code], capture_output=True,
                          timeout=60, cwd=ROOT)
    assert done.returncode == 0
    assert b'a FIFO, not a regular file' in done.stderr, done.stderr


def test_link_in_place_of_the_hook_log_is_not_followed(tmp_path):
    target = tmp_path / 'elsewhere'
    target.write_text('')
    os.symlink(target, tmp_path / 'hook.log')
    log = hook.HookLog(['qemu', 'vm1', 'release', 'end'], sys.stderr)
    log.path = str(tmp_path / 'hook.log')
    log.info('x')
    log.flush()
    assert target.read_text() == ''


def test_fifo_in_place_of_the_vendor_state_file_is_refused(tmp_path):
    """NVIDIA's vendor-interface vGPUs are recorded in the state directory
    too: a FIFO there is refused at once (in a child process, judged by a
    timeout: the old open waited for a writer forever)."""
    state_dir = tmp_path / 'state'
    state_dir.mkdir(mode=0o700)
    os.mkfifo(state_dir / 'nvidia-vgpu.json')
    code = ('from libvirt_gpu.devices.backends import nvidia_vgpu; '
            'from libvirt_gpu import exception\n'
            'try:\n    nvidia_vgpu.VendorState(%r).read()\n'
            'except exception.StateError as e:\n    print(e)' % str(state_dir))
    done = subprocess.run([sys.executable, '-c', code], capture_output=True,
                          timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert b'a FIFO, not a regular file' in done.stdout


def test_state_dir_others_can_write_is_refused(env):
    os.makedirs(env.state_dir)
    os.chmod(env.state_dir, 0o777)
    xml = th.domain_xml([(th.new_uuid(), 'nvidia-223', None)])
    before = env.mdevs()
    rc, err = env.run('prepare', xml)
    assert rc == 1
    assert 'writable by group or others' in err
    assert 'chmod go-w %s' % env.state_dir in err
    assert env.mdevs() == before                # nothing made
    assert os.listdir(env.state_dir) == []      # no log, no lease, no lock
    rc, err = env.run('release', xml)
    assert rc == 0 and 'chmod go-w' in err


def test_lease_store_refuses_another_host(tmp_path):
    with trees.simulated_tree('t4') as (one, _), \
            trees.simulated_tree('t4') as (two, _):
        state_dir = str(tmp_path / 'state')
        environment.Environment(state_dir, sysfs_root=one).store.leases()
        with pytest.raises(exception.StateError,
                           match='its own \\[DEFAULT\\]/state_dir'):
            environment.Environment(state_dir,
                                    sysfs_root=two).store.leases()
        # the first host still uses it
        environment.Environment(state_dir, sysfs_root=one).store.leases()


def test_emptied_lease_file_is_an_error_not_no_leases(tmp_path):
    store = state.LeaseStore(tmp_path / 'state')
    with store.transaction() as txn:
        txn.add(th.new_uuid(), th.DOM, A, objects.TypeId.parse('nvidia-223'))
    store.close()
    for suffix in ('-wal', '-shm'):
        if os.path.exists(store.db_path + suffix):
            os.unlink(store.db_path + suffix)
    os.truncate(store.db_path, 0)
    with pytest.raises(exception.StateError, match='it is empty'):
        state.LeaseStore(tmp_path / 'state').leases()


# --- the unguarded behaviours ------------------------------------------------

def test_settings_snapshot_notices_a_same_size_edit_in_one_tick(env):
    """An edit that keeps the size and lands within one tick of the file
    system's clock (mtime and ctime as before) still refreshes the
    snapshot."""
    settings, note = hook.load_settings(env.config, env.settings_file)
    assert settings.enabled_types() == ['nvidia-223']
    settings, note = hook.load_settings(env.config, env.settings_file)
    assert note is None                        # the snapshot is used
    st = os.stat(env.config)
    with open(env.config) as f:
        text = f.read()
    edited = text.replace('nvidia-223', 'nvidia-224')
    assert len(edited) == len(text)
    with open(env.config, 'r+') as f:          # same inode, same size
        f.write(edited)
    os.utime(env.config, ns=(st.st_atime_ns, st.st_mtime_ns))
    settings, note = hook.load_settings(env.config, env.settings_file)
    assert note is not None and settings.enabled_types() == ['nvidia-224']


def test_detaching_one_of_two_vgpus_leaves_the_other_lease(tmp_path):
    with trees.simulated_tree('t4') as tree:
        backend = mdev.MdevBackend(kernel_sysfs.KernelSysfs(*tree))
        store = state.LeaseStore(tmp_path / 'state')
        alloc = allocator_mod.Allocator(backend, store, {
            a: objects.EnabledType('nvidia-223') for a in (A, B)})
        one, two = th.new_uuid(), th.new_uuid()
        alloc.reserve(th.DOM, [
            allocator_mod.VgpuClaim(uuid=u, type_id=T_NVIDIA_223, parent=A)
            for u in (one, two)])
        alloc.mark_created([one, two])
        before = {lease.vgpu_uuid: lease for lease in store.leases()}
        taken = alloc.begin_release(th.DOM, [one])
        assert [lease.vgpu_uuid for lease in taken] == [one]
        alloc.forget([one])
        after = {lease.vgpu_uuid: lease for lease in store.leases()}
        assert list(after) == [two]
        assert after[two].state == state.CREATED
        assert after[two].domain_uuid == th.DOM
        assert after[two].updated_at == before[two].updated_at


# --- operator mistakes -------------------------------------------------------

@pytest.mark.parametrize('text,expected', [
    ('[gpu]\nenabled_vgpu_type = nvidia-223\n',
     'unknown option [gpu]/enabled_vgpu_type; did you mean '
     'enabled_vgpu_types?'),
    ('[gpus]\nenabled_vgpu_types = nvidia-223\n',
     'unknown section [gpus]; did you mean gpu?'),
    ('[DEFAULT]\nstate_dri = /var/lib/x\n',
     'unknown option [DEFAULT]/state_dri; did you mean state_dir?'),
    ('[gpu]\nenabled_vgpu_types = nvidia-223\n[vgpu_nvidia-223]\n'
     'device_adresses = 0000:af:00.0\n',
     'did you mean device_addresses?')])
def test_config_typos_are_errors_naming_the_nearest(tmp_path, text,
                                                    expected):
    from libvirt_gpu import conf as conf_mod
    path = tmp_path / 'libvirt-gpu.conf'
    path.write_text(text)
    with pytest.raises(exception.ConfigError) as e:
        conf_mod.load(str(path))
    assert expected in str(e.value)


def _lock_holder(tmp_path, seconds):
    """A lease store and a child process holding its lock (for at most
    ``seconds``), returned once the child says it holds it."""
    store = state.LeaseStore(tmp_path / 'state')
    store.leases()
    holder = subprocess.Popen([sys.executable, '-c', (
        'import time\nfrom libvirt_gpu.store import state\n'
        's = state.LeaseStore(%r)\n'
        'with s.transaction():\n'
        '    print("locked", flush=True)\n'
        '    time.sleep(%d)\n' % (store.state_dir, seconds))],
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == 'locked'
    except BaseException:
        holder.kill()
        holder.wait()
        raise
    return store, holder


def test_a_lock_wait_names_the_holder_and_what_to_run(tmp_path):
    store, holder = _lock_holder(tmp_path, 60)
    try:
        impatient = state.LeaseStore(store.state_dir, lock_timeout=0.2)
        with pytest.raises(exception.StateError) as e:
            impatient.leases()
        message = str(e.value)
        assert 'process %d (' % holder.pid in message
        # its command
        assert 'from libvirt_gpu.store import state' in message
        assert 'ps -o pid,stat,args -p %d' % holder.pid in message
    finally:
        holder.kill()
        holder.wait()


# --- writes that cannot escape -----------------------------------------------

@pytest.mark.parametrize('use_openat2', [True, False])
def test_open_beneath_follows_no_link(tmp_path, use_openat2):
    from libvirt_gpu.util import safeopen
    (tmp_path / 'root' / 'a').mkdir(parents=True)
    (tmp_path / 'outside').mkdir()
    (tmp_path / 'outside' / 'f').write_text('')
    (tmp_path / 'root' / 'a' / 'f').write_text('')
    top = os.open(tmp_path / 'root', os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.close(safeopen.open_beneath(top, 'a/f', os.O_WRONLY,
                                       use_openat2=use_openat2))
        os.symlink(tmp_path / 'outside', tmp_path / 'root' / 'b')
        for relative in ('b/f', '../outside/f', 'a/../b/f'):
            with pytest.raises(OSError):
                safeopen.open_beneath(top, relative, os.O_WRONLY,
                                      use_openat2=use_openat2)
    finally:
        os.close(top)


def test_a_racer_swapping_a_directory_for_a_link_cannot_move_a_write(
        tmp_path):
    """A racer thread swaps a directory of the path for a link to a
    directory outside the root, over and over, while writes go on: no
    write ever lands outside."""
    import threading
    root = tmp_path / 'root'
    victim = root / 'devices' / 'gpu'
    victim.mkdir(parents=True)
    (victim / 'remove').write_text('')
    outside = tmp_path / 'outside'
    outside.mkdir()
    (outside / 'remove').write_text('')
    aside = root / 'devices' / 'gpu.real'
    sysfs = sysfs_mod.Sysfs(str(root))
    stop = threading.Event()

    def racer():
        while not stop.is_set():
            os.rename(victim, aside)
            os.symlink(outside, victim)
            os.unlink(victim)
            os.rename(aside, victim)
            time.sleep(0)             # let the writer see the real tree too

    thread = threading.Thread(target=racer)
    thread.start()
    outcomes = set()
    try:
        # at least 3000 writes, and on until one went through the real
        # directory (under load the racer may hold the tree for long)
        for attempt in range(30000):
            if attempt >= 3000 and 'written' in outcomes:
                break
            try:
                sysfs.write(str(victim / 'remove'), '1')
                outcomes.add('written')
            except (exception.SysfsError, OSError) as e:
                outcomes.add(type(e).__name__)
    finally:
        stop.set()
        thread.join()
    assert (outside / 'remove').read_text() == '', outcomes
    assert 'written' in outcomes, outcomes
    # every refusal a SysfsError that names the path, no bare OSError
    assert all(o == 'written' or o.startswith('Sysfs') or o == 'UnsafePath'
               for o in outcomes), outcomes


def test_a_vgpu_is_removed_only_through_its_own_directory(tmp_path):
    with trees.simulated_tree('t4') as tree:
        ksysfs = kernel_sysfs.KernelSysfs(*tree)
        backend = mdev.MdevBackend(ksysfs)
        mine, other = th.new_uuid(), th.new_uuid()
        from libvirt_gpu.devices.backends import base
        backend.prepare(base.VgpuDevice(uuid=other, parent=A,
                                        type_id=T_NVIDIA_223))
        # a link bus/mdev/devices/<mine> that leads to the other vGPU
        link = ksysfs.mdev_dir(mine)
        os.symlink(os.path.realpath(ksysfs.mdev_dir(other)), link)
        with pytest.raises(exception.MdevRemoveFailed,
                           match='not to a directory of that vGPU'):
            backend.remove(mine)
        assert backend.lookup(other) is not None


# --- one reading of the host -------------------------------------------------

def test_one_bad_mdev_entry_costs_only_that_entry(env):
    """An entry under bus/mdev/devices that cannot be read (a directory
    where the kernel makes a link) is skipped with a warning by discovery
    and by the allocator alike: other guests still start."""
    base = os.path.join(env.root, 'bus', 'mdev', 'devices')
    # a directory where the kernel makes a link: unreadable
    os.mkdir(os.path.join(base, th.new_uuid()))
    gpus = discovery.from_sysfs(sysfs_mod.Sysfs(env.root),
                                kinds=kinds.registered()).gpus
    assert gpus
    uuid = th.new_uuid()
    rc, err = env.run('prepare', th.domain_xml([(uuid, 'nvidia-223', None)]))
    assert rc == 0, err
    assert uuid in env.mdevs()


def test_duplicate_pci_addresses_are_refused(caplog):
    """Two entries for one address (upper- and lowercase names in a
    tree): neither is trusted, so no GPU gets two providers."""
    with trees.simulated_tree('t4') as (root, _):
        devices = os.path.join(root, 'bus', 'pci', 'devices')
        os.symlink(os.readlink(os.path.join(devices, str(B))),
                   os.path.join(devices, str(B).upper()))
        result = discovery.from_sysfs(sysfs_mod.Sysfs(root),
                                      kinds=kinds.registered())
        addresses = [g.address for g in result.gpus]
        assert B not in addresses and A in addresses
        assert caplog.text.count('listed 2 times') == 1


# --- real data ---------------------------------------------------------------

def _sim_uri(tmp_path, strip_class=False):
    from libvirt_gpu import simulator
    node_xml = simulator.write_host(simulator.load_profile('t4'), tmp_path)
    if strip_class:
        import re
        with open(node_xml) as f:
            text = f.read()
        text, count = re.subn(r'\s*<class>[^<]*</class>', '', text)
        assert count
        with open(node_xml, 'w') as f:
            f.write(text)
    return 'test://' + node_xml


def test_gpus_recognised_without_class_in_node_device_xml(tmp_path):
    """libvirt < 5.2 writes no <class>: NVIDIA GPUs are still found, by
    their class in sysfs where it has them, else by vendor and function
    or mdev capability; their audio functions are not taken for GPUs."""
    from libvirt_gpu.virt import host
    with host.Host(_sim_uri(tmp_path), read_only=True) as h:
        expected = [g.address for g in discovery.from_libvirt(
            h, kinds=kinds.registered()).gpus]
    assert expected
    classless = tmp_path / 'classless'
    classless.mkdir()
    with host.Host(_sim_uri(classless, strip_class=True),
                   read_only=True) as h:
        alone = [g.address for g in discovery.from_libvirt(
            h, kinds=kinds.registered()).gpus]
        beside = discovery.from_libvirt(h, sysfs_mod.Sysfs(str(classless)),
                                        kinds=kinds.registered())
    assert alone == expected
    assert [g.address for g in beside.gpus] == expected
    assert all(g.class_code for g in beside.gpus)


def test_every_command_reads_gpus_without_class(tmp_path, capsys):
    """libvirt < 5.2, no sysfs beside it: the GPUs have no class code;
    ``discover`` (and its ``--json``, Cyborg's records) names their
    controller by the display class, as ``list`` shows them."""
    import json
    from libvirt_gpu.cmd import main as cli
    uri = _sim_uri(tmp_path, strip_class=True)
    conf = tmp_path / 'libvirt-gpu.conf'
    conf.write_text('[DEFAULT]\nstate_dir = %s\n' % (tmp_path / 'state'))
    argv = ['--config-file', str(conf), '-c', uri]
    for command in (['list'], ['discover'], ['discover', '--json']):
        assert cli.main(argv + command) == 0, capsys.readouterr().err
        out = capsys.readouterr().out
    boards = [json.loads(d['std_board_info']) for d in json.loads(out)]
    assert boards == [{'product_id': '1eb8',
                       'controller': 'Display controller'}] * 2


@pytest.mark.parametrize('uri,local', [
    ('qemu:///system', True), ('qemu+unix:///system', True),
    ('qemu:///session', True), ('qemu+ssh://other-host/system', False),
    ('qemu://other-host/system', False), ('qemu+tcp://h/system', False),
    ('test:///default', False), ('test:///tmp/node.xml', False)])
def test_which_uri_is_this_machine(uri, local):
    assert discovery.is_local_uri(uri) is local


def test_connect_uri_reads_libvirt_only(tmp_path):
    """-c URI of a host that is not this machine: this machine's sysfs is
    not mixed in (the test driver keeps no <driver>: none comes back)."""
    uri = _sim_uri(tmp_path)
    alone = discovery.discover(uri=uri, default_sysfs_root=str(tmp_path),
                               kinds=kinds.registered())
    assert alone.gpus and all(g.driver is None for g in alone.gpus)
    both = discovery.discover(uri=uri, sysfs_root=str(tmp_path),
                              kinds=kinds.registered())
    assert all(g.driver for g in both.gpus)


def test_list_takes_whole_gpu_eligibility_from_placement_rule(
        tmp_path, capsys, monkeypatch):
    """A GPU whose vendor is not in [gpu]/pgpu_vendor_ids (a BMC's VGA
    console) gets no PGPU provider: list must not show it as capacity 1."""
    import json
    from libvirt_gpu import simulator
    from libvirt_gpu.cmd import main as cli
    monkeypatch.setenv('LIBVIRT_GPU_CACHE_DIR', '')
    root = tmp_path / 'sim'
    simulator.write_host(simulator.load_profile('mixed'), root)
    config = tmp_path / 'libvirt-gpu.conf'
    config.write_text('[DEFAULT]\nstate_dir = %s\n' % (tmp_path / 'state'))
    argv = ['--config-file', str(config), '--sysfs-root', str(root)]
    assert cli.main(argv + ['list', '--json']) == 0
    gpus = {g['address']: g for g in json.loads(capsys.readouterr().out)}
    aspeed = gpus['0000:03:00.0']
    assert aspeed['vendor_id'] == '1a03'
    assert 'pgpu_vendor_ids' in aspeed['not_assignable']
    assert cli.main(argv + ['list']) == 0
    row = [line for line in capsys.readouterr().out.splitlines()
           if line.startswith('0000:03:00.0 ')][0]
    assert row.split()[-4] == '0'                      # CAPACITY
    assert cli.main(argv + ['placement', 'show', '--json']) == 0
    names = [p['name'] for p in json.loads(
        capsys.readouterr().out)['resource_providers']]
    assert not any(n.endswith('0000_03_00_0') for n in names)


def test_a_libvirt_parse_error_is_not_blamed_on_libvirtd(tmp_path, capsys):
    from libvirt_gpu.cmd import main as cli
    bad = tmp_path / 'node.xml'
    bad.write_text('<node><device>')
    code = cli.main(['--config-file', '/dev/null', '-c', 'test://%s' % bad,
                     'list'])
    err = capsys.readouterr().err
    assert code == 1
    assert 'cannot parse XML' in err and 'libvirtd running' not in err
    assert len(err.strip().splitlines()) == 1


def test_a_stopped_lock_holder_is_named_at_once(tmp_path):
    """A holder stopped with SIGSTOP never lets go by itself: the wait
    ends when it is seen stopped, naming it and `kill -CONT`, instead of
    after the whole timeout (here an hour: the test would hang)."""
    import signal
    store, holder = _lock_holder(tmp_path, 600)
    try:
        os.kill(holder.pid, signal.SIGSTOP)
        code = ('from libvirt_gpu.store import state\n'
                'try:\n'
                '    state.LeaseStore(%r, lock_timeout=3600).leases()\n'
                'except Exception as e:\n'
                '    print(e)\n' % store.state_dir)
        done = subprocess.run([sys.executable, '-c', code],
                              capture_output=True, text=True, timeout=60,
                              cwd=ROOT)
        assert 'locked by a stopped process %d' % holder.pid in done.stdout
        assert 'kill -CONT %d' % holder.pid in done.stdout
    finally:
        holder.kill()
        holder.wait()
