"""The qemu hook: fast exit, prepare/release/reconnect, refusals, install.

hook.run is called in-process with a KernelSysfs (the simulator's kernel
answers); hooks/qemu itself runs as a process where the import-free fast
path and the installed copy are tested.
"""

import ast
import io
import os
import stat
import subprocess
import sys

import pytest

from libvirt_gpu.devices.backends import mdev as mdev_backend
from libvirt_gpu.virt import config_xml
from libvirt_gpu.guests import hook
from libvirt_gpu.virt import metadata
from libvirt_gpu.store import state
from tests.doubles import hostile
from tests.doubles import kernel_sysfs
from tests.doubles import trees
from tests.doubles import paths
from tests.doubles.t4_hook import A, B, DOM, EXISTING
from tests.doubles.t4_hook import domain_xml, Env, new_uuid

ROOT = paths.ROOT
HOOK = os.path.join(ROOT, 'hooks', 'qemu')


# --- prepare / release ------------------------------------------------------

def test_prepare_creates_and_release_removes(env):
    u1, u2 = new_uuid(), new_uuid()
    xml = domain_xml([(u1, 'nvidia-223', None), (u2, 'nvidia-223', B)])
    before = env.mdevs()
    rc, err = env.run('prepare', xml)
    assert (rc, err) == (0, '')
    found = env.sysfs.kernel.mdevs()
    assert found[u2] == (config_xml.objects.PciAddress.parse(B),
                         'nvidia-223')
    assert str(found[u1][0]) == A               # the GPU with most room
    leases = {lease.vgpu_uuid: lease for lease in env.leases()}
    assert set(leases) == {u1, u2}
    assert {lease.state for lease in leases.values()} == {state.CREATED}
    assert {lease.domain_uuid for lease in leases.values()} == {DOM}
    assert 'created vGPU %s' % u1 in env.log()
    # a second prepare (libvirt retrying a start) changes nothing
    assert env.run('prepare', xml) == (0, '')
    assert len(env.sysfs.kernel.mdevs()) == len(before) + 2
    rc, err = env.run('release', xml)
    assert (rc, err) == (0, '')
    assert env.mdevs() == before
    assert env.leases() == []
    assert 'removed vGPU %s' % u2 in env.log()


def test_failed_prepare_rolls_back(env):
    good, bad = new_uuid(), new_uuid()
    # nvidia-223 on A works; asking B for nvidia-222 fails (B holds 223s)
    xml = domain_xml([(good, 'nvidia-223', A), (bad, 'nvidia-222', B)])
    rc, err = env.run('prepare', xml)
    assert rc == 1
    assert 'cannot start domain' in err and 'nvidia-222' in err
    assert good not in env.sysfs.kernel.mdevs()
    assert env.leases() == []


class StaleCountSysfs(kernel_sysfs.KernelSysfs):
    """available_instances always reads 9: only the kernel knows."""

    def read_int(self, path, optional=False, base=10):
        if path.endswith('/available_instances'):
            return 9
        return super().read_int(path, optional, base)


def test_rollback_after_a_kernel_refusal(env):
    uuids = [new_uuid() for _ in range(7)]
    # B has room for 6 nvidia-223: the 7th create is refused by the kernel
    xml = domain_xml([(u, 'nvidia-223', B) for u in uuids])
    env.sysfs = StaleCountSysfs(env.root, env.sysfs.profile)
    before = env.mdevs()
    rc, err = env.run('prepare', xml)
    assert rc == 1 and 'the kernel answered EINVAL' in err
    assert env.mdevs() == before
    assert env.leases() == []
    created = [w for w in env.sysfs.writes if w[0] == 'create']
    removed = [w for w in env.sysfs.writes if w[0] == 'remove']
    assert len(created) == 7 and created[-1][2] != 0
    assert len(removed) == 6


def test_no_capacity_message(env):
    xml = domain_xml([(new_uuid(), 'nvidia-223', None) for _ in range(15)])
    rc, err = env.run('prepare', xml)
    assert rc == 1
    assert 'No capacity left for vGPU type nvidia-223 on any GPU' in err
    # the 15th of them finds both GPUs full
    assert 'the domain asks for 15 vGPUs of this type and 14' in err
    assert '0000:3b:00.0 (0 free)' in err and '0000:af:00.0 (0 free)' in err
    assert env.leases() == [] and env.sysfs.writes == []


def test_type_not_enabled_message(env):
    rc, err = env.run('prepare', domain_xml([(new_uuid(), 'nvidia-999',
                                              None)]))
    assert rc == 1
    assert 'vGPU type nvidia-999 is not enabled on this host' in err
    assert 'nvidia-223' in err


def test_vgpu_without_hostdev_is_not_created(env):
    u = new_uuid()
    rc, err = env.run('prepare', domain_xml([(u, 'nvidia-223', None)],
                                            hostdevs=[]))
    assert rc == 0 and 'no <hostdev' in err
    assert u not in env.sysfs.kernel.mdevs()


def test_foreign_mdev_hostdev_is_left_to_libvirt(env):
    u = new_uuid()
    rc, err = env.run('prepare', domain_xml(hostdevs=[u]))
    assert (rc, err) == (0, '')
    assert u not in env.sysfs.kernel.mdevs()
    # an existing mdev used by the domain without our lease is never removed
    rc, _ = env.run('release', domain_xml(
        [(EXISTING, 'nvidia-223', None)]))
    assert EXISTING in env.sysfs.kernel.mdevs()


def test_mdevctl_defined_hostdev_is_created_and_removed(env):
    u = new_uuid()
    os.makedirs(os.path.join(env.mdevctl_dir, A))
    with open(os.path.join(env.mdevctl_dir, A, u), 'w') as f:
        f.write('{"mdev_type": "nvidia-222", "start": "manual", '
                '"attrs": []}')
    xml = domain_xml(hostdevs=[u])
    assert env.run('prepare', xml) == (0, '')
    assert env.sysfs.kernel.mdevs()[u][1] == 'nvidia-222'  # not enabled:
    # the operator's own definition names its type
    assert env.run('release', xml) == (0, '')
    assert u not in env.sysfs.kernel.mdevs()


def test_mdevctl_definition_with_attrs_refused(env):
    u = new_uuid()
    os.makedirs(os.path.join(env.mdevctl_dir, A))
    with open(os.path.join(env.mdevctl_dir, A, u), 'w') as f:
        f.write('{"mdev_type": "nvidia-222", "attrs": [{"x": "1"}]}')
    rc, err = env.run('prepare', domain_xml(hostdevs=[u]))
    assert rc == 1 and 'mdevctl start -u %s' % u in err


def test_pgpu_checks(tmp_path):
    with trees.simulated_tree('t4') as (root, profile):
        env = Env(root, profile, tmp_path,
                  types='nvidia-223\n[vgpu_nvidia-223]\n'
                        'device_addresses = %s' % A)
        _pgpu_checks(env)


def _pgpu_checks(env):
    rc, err = env.run('prepare', domain_xml(pgpus=[B]))
    assert rc == 1 and 'holds 2 vGPU' in err
    # A offers nvidia-223: not for passthrough
    rc, err = env.run('prepare', domain_xml(pgpus=[A]))
    assert rc == 1 and 'configured to offer vGPU type nvidia-223' in err


def test_pgpu_of_a_gpu_not_enabled_for_vgpu(tmp_path):
    with trees.simulated_tree('t4') as (root, profile):
        env = Env(root, profile, tmp_path, types='')
        assert env.run('prepare', domain_xml(pgpus=[A])) == (0, '')


def test_reconnect_never_fails(env):
    u = new_uuid()
    rc, err = env.run('reconnect', domain_xml([(u, 'nvidia-223', None)]))
    assert rc == 0 and 'does not exist' in err
    rc, err = env.run('reconnect', b'<domain><uuid>oops')
    assert rc == 0 and 'refused' in err


@pytest.mark.parametrize('op', ['start', 'started', 'stopped', 'attach',
                                'restore', 'somethingnew'])
def test_other_operations_do_nothing(env, op, capsys):
    xml = domain_xml([(new_uuid(), 'nvidia-223', None)])
    assert env.run(op, xml) == (0, '')
    assert capsys.readouterr().out == ''        # restore: no XML
    assert not os.path.exists(env.state_dir)


def test_release_survives_a_stuck_device(env, monkeypatch):
    u = new_uuid()
    xml = domain_xml([(u, 'nvidia-223', None)])
    assert env.run('prepare', xml)[0] == 0

    def stuck(uuid):
        raise hook.exception.MdevRemoveFailed(uuid=uuid, reason='busy')
    monkeypatch.setattr(mdev_backend.MdevBackend, "remove",
                        lambda self, uuid: stuck(uuid))
    rc, err = env.run('release', xml)
    assert rc == 0 and 'stays' in err
    (lease,) = env.leases()
    assert lease.state == state.REMOVING and lease.vgpu_uuid == u


# --- refusals ----------------------------------------------------------------

HOSTILE = hostile.inputs(DOM)


def test_the_hostile_set_is_complete():
    assert len(HOSTILE) >= 16
    for needle in (b'<!ENTITY x SYSTEM', b'&b;&b;', b'<!DOCTYPE domain',
                   b'uuid="../', b'type="../', b'&#10;', b'/../..'):
        assert any(needle in data for data in HOSTILE.values()), needle


@pytest.mark.parametrize('name', sorted(HOSTILE))
def test_hostile_input_refused_nothing_written(env, name):
    data = HOSTILE[name]
    before = hostile.tree_snapshot(env.root)
    rc, err = env.run('prepare', data)
    assert rc == 1
    assert err.startswith('libvirt-gpu: prepare of domain')
    assert 'refused, nothing done' in err
    assert len(err) < 2000                    # a message, not a dump
    # release and reconnect never fail (libvirt kills a guest whose
    # reconnect fails): logged, exit 0, whatever the input
    for op in ('release', 'reconnect'):
        rc, err = env.run(op, data)
        assert rc == 0 and 'refused' in err, (op, err)
    assert hostile.tree_snapshot(env.root) == before
    assert env.sysfs.writes == []
    assert not os.path.exists(env.state_dir)   # no leases, no log


# --- settings snapshot -------------------------------------------------------

def test_settings_snapshot_is_used_until_something_changes(env):
    settings, note = hook.load_settings(env.config, env.settings_file)
    assert 'read from' in note and 'refreshed' in note
    assert settings.sysfs_root == env.root
    assert settings.enabled_types() == ['nvidia-223']
    assert sorted(map(str, settings.enabled)) == [A, B]
    again, note = hook.load_settings(env.config, env.settings_file)
    assert note is None and again == settings
    # the config file changed: read again
    with open(env.config, 'a') as f:
        f.write('\n[vgpu_nvidia-223]\nmax_instances = 2\n')
    changed, note = hook.load_settings(env.config, env.settings_file)
    assert note is not None
    assert {e.max_instances for e in changed.enabled.values()} == {2}
    # a GPU went away: read again
    os.unlink(os.path.join(env.root, 'class', 'mdev_bus', A))
    _, note = hook.load_settings(env.config, env.settings_file)
    assert note is not None


def test_bad_snapshot_is_ignored(env):
    os.makedirs(env.state_dir)
    with open(env.settings_file, 'w') as f:
        f.write('{"version": 1, "enabled": "x"')
    settings, note = hook.load_settings(env.config, env.settings_file)
    assert note is not None and settings.sysfs_root == env.root


def test_bad_config_fails_prepare_clearly(env):
    with open(env.config, 'a') as f:
        f.write('\n[vgpu_nvidia-223]\ndevice_addresses = 0000:5e:00.0\n')
    rc, err = env.run('prepare', domain_xml([(new_uuid(), 'nvidia-223',
                                              None)]))
    assert rc == 1 and 'Configuration error' in err and '0000:5e:00.0' in err


# --- the hook process --------------------------------------------------------

def test_markers_match_the_script():
    with open(HOOK) as f:
        tree = ast.parse(f.read())
    values = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            values[node.targets[0].id] = ast.literal_eval(node.value)
    assert values['MARKERS'] == hook.MARKERS
    assert values['HANDLED'] == hook.HANDLED


def imported_modules(stderr):
    """Module names from ``python -X importtime`` output."""
    names = set()
    for line in stderr.splitlines():
        if line.startswith('import time:') and '|' in line:
            names.add(line.rsplit('|', 1)[1].strip())
    return names


def run_script(argv, xml, script=HOOK):
    return subprocess.run(
        [sys.executable, '-IS', '-X', 'importtime', script] + argv,
        input=xml, capture_output=True, timeout=60)


@pytest.mark.parametrize('op', ['prepare', 'start', 'release', 'stopped'])
def test_fast_path_imports_nothing(op):
    r = run_script(['vm1', op, 'begin', '-'], domain_xml())
    assert r.returncode == 0 and r.stdout == b''
    names = imported_modules(r.stderr.decode())
    assert names, r.stderr          # importtime did report
    heavy = {n for n in names if n.split('.')[0] in (
        'libvirt_gpu', 'libvirt', 'libvirtmod', 'lxml', 'oslo_config',
        'sqlite3', 'tenacity', 'site', 'json')}
    assert heavy == set()


def rendered_hook(env):
    """hooks/qemu as ``hook install`` writes it, for ``env``'s host."""
    script = os.path.join(env.state_dir + '-hooks', 'qemu')
    os.makedirs(os.path.dirname(script), exist_ok=True)
    with open(HOOK) as f:
        text = hook.render_hook(
            f.read(), sys.executable, env.config, env.settings_file,
            [ROOT] + [p for p in sys.path if os.path.isdir(p)])
    with open(script, 'w') as f:
        f.write(text)
    return script


# A character reference can spell every byte the fast path looks for:
# the same domain written with one goes through the same refusal.
@pytest.mark.parametrize('plain, spelt', [
    (b'urn:libvirt-gpu:1', b'urn:libvirt-gpu&#58;1'),
    (b"type='mdev'", b"type='&#109;dev'"),
    (b"type='mdev'", b"type='&#x6D;dev'"),
])
def test_fast_path_sees_through_character_references(env, plain, spelt):
    script = rendered_hook(env)
    if b'urn' in plain:          # a pGPU this host does not have
        xml = domain_xml(pgpus=['0000:99:00.0'])
        refusal = b'No GPU at 0000:99:00.0 on this host'
    else:                        # an mdev hostdev whose UUID is no UUID
        xml = domain_xml(hostdevs=['not-a-uuid'])
        refusal = b'not-a-uuid'
    assert xml.count(plain) == 1 and b'mdev' not in xml.replace(plain, b'')
    for text in (xml, xml.replace(plain, spelt)):
        r = run_script(['vm1', 'prepare', 'begin', '-'], text, script)
        assert r.returncode == 1 and refusal in r.stderr, r.stderr[-2000:]
    assert env.mdevs() == sorted(env.sysfs.kernel.mdevs())


def test_slow_path_never_imports_libvirt(env):
    # settings point at the simulated host; a refused start is enough to
    # go through every import of the prepare path
    script = rendered_hook(env)
    xml = domain_xml([(new_uuid(), 'nvidia-999', None)])
    cold = run_script(['vm1', 'prepare', 'begin', '-'], xml, script)
    warm = run_script(['vm1', 'prepare', 'begin', '-'], xml, script)
    for r in (cold, warm):
        assert r.returncode == 1, r.stderr[-2000:]
        assert b'nvidia-999 is not enabled' in r.stderr
        names = imported_modules(r.stderr.decode())
        assert ('libvirt_gpu.guests.hook' in names
                and 'pyexpat' in names)
        # nor lxml (30 ms of imports, a third of a prepare) nor
        # ElementTree (with re, copy, weakref: see xmlutil)
        assert not {n for n in names if n.split('.')[0] in (
            'libvirt', 'libvirtmod', 'lxml')}
        assert 'xml.etree.ElementTree' not in names
    # With its settings snapshot written (the cold call loads oslo.config,
    # which imports them itself): not dataclasses, typing or logging
    # either (see records, logs).
    assert 'oslo_config' in imported_modules(cold.stderr.decode())
    assert not {n for n in imported_modules(warm.stderr.decode())
                if n.split('.')[0] in ('oslo_config', 'dataclasses',
                                       'typing', 'logging', 'inspect')}


# --- install -----------------------------------------------------------------

def test_install(env, tmp_path):
    hooks_dir = str(tmp_path / 'hooks')
    done = hook.install(hooks_dir, env.config)
    assert done.path == os.path.join(hooks_dir, 'qemu.d', 'libvirt-gpu')
    assert done.restart_needed is True
    st = os.stat(done.path)
    assert stat.S_IMODE(st.st_mode) == 0o755 and st.st_uid == 0
    with open(done.path) as f:
        text = f.read()
    assert text.startswith('#!%s -IS\n' % sys.executable)
    assert "CONFIG_FILE = %r" % env.config in text
    assert "SETTINGS_FILE = %r" % env.settings_file in text
    assert os.path.exists(env.settings_file)
    assert not [n for n in os.listdir(hooks_dir) if n.endswith('.tmp')]
    # installing again: libvirtd already had a hook
    assert hook.install(hooks_dir, env.config).restart_needed is False


def test_installed_hook_runs_a_guest_lifecycle(env, tmp_path):
    """The installed file, run as libvirt runs it (its own interpreter via
    #!, an almost empty environment), against the simulated host whose
    kernel is emulated by an inotify watcher."""
    done = hook.install(str(tmp_path / 'hooks'), env.config)
    u = new_uuid()
    xml = domain_xml([(u, 'nvidia-223', None)])
    clean_env = {'LC_ALL': 'C', 'PATH': '/usr/bin:/bin', 'HOME': '/root'}
    with kernel_sysfs.KernelWatcher(env.root, env.sysfs.profile) as w:
        r = subprocess.run([done.path, 'vm1', 'prepare', 'begin', '-'],
                           input=xml, capture_output=True, env=clean_env,
                           timeout=60)
        assert r.returncode == 0, r.stderr
        assert u in env.sysfs.kernel.mdevs()
        r = subprocess.run([done.path, 'vm1', 'release', 'end', '-'],
                           input=xml, capture_output=True, env=clean_env,
                           timeout=60)
        assert r.returncode == 0, r.stderr
        assert u not in env.sysfs.kernel.mdevs()
        assert [e[0] for e in w.events] == ['create', 'remove']
    assert env.leases() == []


def test_installed_hook_rebuilds_a_cut_off_snapshot(env, tmp_path):
    """A snapshot cut off (a crash while it was written by hand, a full
    disk) read by the installed hook, which has not imported json: the
    prepare and the release still do their work and the snapshot is
    written again."""
    done = hook.install(str(tmp_path / 'hooks'), env.config)
    u = new_uuid()
    xml = domain_xml([(u, 'nvidia-223', None)])
    clean_env = {'LC_ALL': 'C', 'PATH': '/usr/bin:/bin', 'HOME': '/root'}

    def cut_off():
        with open(env.settings_file, 'rb') as f:
            whole = f.read()
        with open(env.settings_file, 'wb') as f:
            f.write(whole[:len(whole) // 2])

    def snapshot_is_whole():
        with open(env.settings_file, 'rb') as f:
            return isinstance(hook.settings.jsonutil.loads(f.read()), dict)

    with kernel_sysfs.KernelWatcher(env.root, env.sysfs.profile):
        for op, sub in (('prepare', 'begin'), ('release', 'end')):
            cut_off()
            r = subprocess.run([done.path, 'vm1', op, sub, '-'], input=xml,
                               capture_output=True, env=clean_env,
                               timeout=60)
            assert (r.returncode, r.stderr) == (0, b'')
            assert (u in env.sysfs.kernel.mdevs()) is (op == 'prepare')
            assert snapshot_is_whole()
    assert env.leases() == []
    assert 'snapshot %s refreshed' % env.settings_file in env.log()


# What a guest start with vGPUs must not load: each was loaded once and
# cost every start milliseconds (bench/hook.py --importtime): ctypes
# (safeopen's openat2), urllib (the read-only SQLite URI), string
# (config_xml's templates), datetime (sqlite3's adapters), pickle (fanout),
# re and json (with enum: the validators, the escaping of log lines, the
# settings snapshot and hook-figures.json; see objects, util.jsonutil), and
# the modules only migrate uses.
PREPARE_MUST_NOT_LOAD = ('ctypes', 'urllib', 'string', 'datetime', 'pickle',
                         're', 'json', 'enum',
                         'importlib.metadata', 'libvirt_gpu.util.xmledit',
                         'libvirt_gpu.guests.hook.incoming')
# The installed hook run as its own main module in an interpreter started
# as its #! line starts it; what it loaded goes to stderr at the end.
_LOADED = """import sys
sys.argv = [%r, 'vm1', 'prepare', 'begin', '-']
rc = 0
try:
    with open(sys.argv[0]) as f:
        exec(compile(f.read(), sys.argv[0], 'exec'), {'__name__': '__main__'})
except SystemExit as e:
    rc = e.code
sys.stderr.write('\\nRC %%s LOADED %%s\\n' %% (rc, ' '.join(sys.modules)))
"""


def test_a_prepare_loads_only_what_it_uses(env, tmp_path):
    done = hook.install(str(tmp_path / 'hooks'), env.config)
    clean_env = {'LC_ALL': 'C', 'PATH': '/usr/bin:/bin', 'HOME': '/root'}
    u = new_uuid()
    xml = domain_xml([(u, 'nvidia-223', None)])
    with kernel_sysfs.KernelWatcher(env.root, env.sysfs.profile):
        # the snapshot was written by install: this prepare is a warm one
        r = subprocess.run([done.python, '-IS', '-c', _LOADED % done.path],
                           input=xml, capture_output=True, env=clean_env,
                           timeout=60)
        subprocess.run([done.path, 'vm1', 'release', 'end', '-'], input=xml,
                       capture_output=True, env=clean_env, timeout=60)
    last = r.stderr.decode().rsplit('\nRC ', 1)[-1].split()
    assert last[:2] == ['0', 'LOADED'], r.stderr[-2000:]
    loaded = set(last[2:])
    assert 'libvirt_gpu.devices.backends.mdev' in loaded   # it did create
    assert sorted(n for n in loaded for m in PREPARE_MUST_NOT_LOAD
                  if n == m or n.startswith(m + '.')) == []


def test_install_refuses_unusable_paths(env, tmp_path):
    with pytest.raises(hook.exception.InvalidInput, match='absolute'):
        hook.install(str(tmp_path / 'hooks'), env.config,
                     python='relative/python')
    with pytest.raises(hook.exception.ConfigError, match='cannot run'):
        hook.install(str(tmp_path / 'hooks'), env.config,
                     python='/bin/false')
    with pytest.raises(hook.exception.ConfigError, match='cannot import'):
        hook.install(str(tmp_path / 'hooks'), env.config,
                     python='/usr/bin/python3')   # without our packages
    assert not os.path.exists(tmp_path / 'hooks' / 'qemu.d' / 'libvirt-gpu')


def test_log_shows_control_characters_as_text(tmp_path):
    """A name from sysfs or the domain XML with a terminal escape sequence
    reaches libvirt's error message and hook.log as text."""
    import io
    stderr = io.StringIO()
    log = hook.HookLog(['qemu', 'vm1', 'prepare', 'begin'], stderr)
    log.path = str(tmp_path / 'hook.log')
    log.error('type GRID\x1b]0;pwned\x07 on\nGPU')
    log.flush()
    text = open(log.path).read()
    assert '\x1b' not in text and '\x07' not in text
    assert 'GRID\\x1b]0;pwned\\x07 on\\nGPU' in text
    assert '\x1b' not in stderr.getvalue()
    assert 'GRID\\x1b]0;pwned\\x07' in stderr.getvalue()


# --- the table of operations -------------------------------------------------

def test_the_table_holds_each_operations_exit_rule():
    rules = {op.name: (op.may_refuse, op.rewrites, op.failure_rc)
             for op in hook.OPERATIONS}
    assert rules == {'prepare': (True, False, 1),
                     'release': (False, False, 0),
                     'reconnect': (False, False, 0),
                     'migrate': (True, True, 1)}
    assert hook.HANDLED == ('prepare', 'release', 'reconnect', 'migrate')


def _move_parent(hook_, req):
    """A rewriting operation as live migration will add one: our vGPU's
    parent changed in place, nothing else."""
    vgpu = req.document.root.find(
        'metadata', '{%s}gpus' % metadata.NAMESPACE,
        '{%s}vgpu' % metadata.NAMESPACE)
    assert hook_.env.vgpus is not None      # it got the host's parts
    req.document.set_attribute(vgpu, 'parent', B)
    return req.document


def _table_with(function, rewrites=True, may_refuse=True, name='migrate'):
    # the row replaces the table's own row of that name
    return tuple(op for op in hook.OPERATIONS if op.name != name) + (
        hook.Operation(
            name=name, function=function,
            reads=(hook.DEVICES, hook.METADATA, hook.DOCUMENT),
            rewrites=rewrites, may_refuse=may_refuse,
            failure='cannot migrate'),)


def _run_row(env, table, xml, op='migrate'):
    out, err = io.BytesIO(), io.StringIO()
    rc = hook.run(['qemu', 'vm1', op, 'begin', '-'], xml,
                  config_file=env.config, settings_file=env.settings_file,
                  sysfs=env.sysfs, stderr=err, mdevctl_dir=env.mdevctl_dir,
                  stdout=out, table=table)
    return rc, out.getvalue(), err.getvalue()


def nova_like_xml(parent=A):
    """Domain XML with other applications' metadata, a comment and odd
    spacing around ours."""
    return (
        "<domain type='kvm'>\n  <name>vm1</name><uuid>%s</uuid>\n"
        "  <metadata>\n    <nova:instance xmlns:nova='http://openstack.org/"
        "xmlns/libvirt/nova/1.1'><nova:name>a &amp; b</nova:name>"
        "</nova:instance>\n    <!-- ours below -->\n"
        "    <g:gpus xmlns:g='urn:libvirt-gpu:1'><g:vgpu  uuid='%s' "
        "type='nvidia-223' parent='%s' /></g:gpus>\n  </metadata>\n"
        "  <devices><hostdev mode='subsystem' type='mdev' managed='no' "
        "model='vfio-pci'><source><address uuid='%s'/></source></hostdev>"
        "</devices>\n</domain>\n" % (DOM, EXISTING, parent, EXISTING)
    ).encode()


def test_a_new_row_prints_the_xml_it_edited_in_place(env):
    xml = nova_like_xml()
    rc, out, err = _run_row(env, _table_with(_move_parent), xml)
    assert (rc, err) == (0, '')
    assert out == xml.replace(("parent='%s'" % A).encode(),
                              ("parent='%s'" % B).encode())


def test_a_row_that_leaves_the_xml_alone_prints_nothing(env):
    rc, out, err = _run_row(env, _table_with(lambda h, req: req.document),
                            nova_like_xml())
    assert (rc, out, err) == (0, b'', '')
    # and one for a guest that is not ours is not even parsed further
    rc, out, err = _run_row(env, _table_with(_move_parent),
                            domain_xml(hostdevs=[]))
    assert (rc, out, err) == (0, b'', '')


@pytest.mark.parametrize('may_refuse', [True, False])
@pytest.mark.parametrize('error', [
    hook.exception.GpuInUse(address=A, reason="x"), RuntimeError('boom')])
def test_every_error_maps_to_the_rows_exit_rule(env, may_refuse, error):
    def fails(hook_, req):
        req.document.set_attribute(req.document.root, 'x', 'y')
        raise error

    rc, out, err = _run_row(
        env, _table_with(fails, may_refuse=may_refuse), nova_like_xml())
    assert rc == (1 if may_refuse else 0)
    assert out == b''                 # nothing half-done reaches libvirt
    if isinstance(error, RuntimeError):
        assert 'internal error in migrate of' in err and 'boom' in err
    else:
        assert 'cannot migrate domain' in err and A in err


def test_refused_input_follows_the_rows_rule(env):
    for may_refuse, rc_wanted in ((True, 1), (False, 0)):
        rc, out, err = _run_row(
            env, _table_with(_move_parent, may_refuse=may_refuse),
            b'<domain><uuid>not-a-uuid</uuid></domain>')
        assert (rc, out) == (rc_wanted, b'')
        assert 'migrate of domain' in err and 'refused' in err


def test_a_row_without_rewrites_may_not_print(env):
    rc, out, err = _run_row(
        env, _table_with(_move_parent, rewrites=False), nova_like_xml())
    assert (rc, out) == (1, b'')
    assert 'internal error' in err and 'rewrite' in err
