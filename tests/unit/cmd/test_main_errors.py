"""Every CLI error is one line on stderr (exit status 1, 2 for usage), never
a traceback unless ``--debug`` is given; the texts say what the code does.

Each test builds its own tree and configuration and runs the CLI as a
process, as an operator would.
"""

import concurrent.futures
import json
import os
import subprocess
import sys

import pytest

from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu import simulator
from tests.doubles import paths

ROOT = paths.ROOT


def cli(*argv, **kwargs):
    """``libvirt-gpu ARGV`` as a process: (exit status, stdout, stderr)."""
    proc = subprocess.run([sys.executable, '-m', 'libvirt_gpu.cmd.main']
                          + list(argv), cwd=ROOT, capture_output=True,
                          text=True, **kwargs)
    return proc.returncode, proc.stdout, proc.stderr


def one_line_error(rc, err, status=1):
    assert rc == status, err
    assert 'Traceback' not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith('libvirt-gpu: ')
    return lines[0]


@pytest.fixture(scope='module')
def sim(tmp_path_factory):
    root = tmp_path_factory.mktemp('t4')
    simulator.write_host(simulator.load_profile('t4'), str(root))
    return str(root)


def write_conf(path, text):
    with open(path, 'w') as f:
        f.write(text)
    return str(path)


def error_with(conf_path, conf_text, sim, *argv):
    """The one-line error of ``libvirt-gpu --config-file CONF --sysfs-root
    SIM ARGV``, CONF written at ``conf_path`` with ``conf_text``."""
    conf = write_conf(conf_path, conf_text)
    return one_line_error(*cli('--config-file', conf, '--sysfs-root', sim,
                               *argv)[::2])


# --- every command, three broken setups --------------------------------------

def _commands(tmp):
    return [
        ['list'], ['types'], ['types', '0000:af:00.0'], ['discover'],
        ['placement', 'show'],
        ['placement', 'sync', '--url', 'http://127.0.0.1:9', '--dry-run'],
        ['agent', '--once', '--url', 'http://127.0.0.1:9'],
        ['attach', 'vm1', '--vgpu-type', 'nvidia-223'],
        ['detach', 'vm1', '--vgpu-type', 'nvidia-223'],
        ['domgpus', 'vm1'],
        ['hook', 'install', '--dir', os.path.join(tmp, 'hooks')],
        ['reconcile', '--dry-run'], ['reconcile'],
        ['restore', '--no-libvirt', '--dry-run'], ['restore', '--dry-run'],
    ]


def _run_all(setups):
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        return list(pool.map(lambda argv: (argv, cli(*argv)), setups))


def test_every_command_with_a_broken_config(tmp_path):
    conf = write_conf(tmp_path / 'bad.conf',
                      '[agent]\nsync_interval = -1\n')
    commands = _commands(str(tmp_path)) + [
        ['simulate', 't4', str(tmp_path / 'sim')]]
    for argv, (rc, out, err) in _run_all(
            [['--config-file', conf] + c for c in commands]):
        line = one_line_error(rc, err)
        assert '[agent]/sync_interval' in line, argv
        assert 'LocationInfo' not in line
    assert not os.path.exists(tmp_path / 'hooks')
    assert not os.path.exists(tmp_path / 'sim')


@pytest.mark.parametrize('kind', ['missing', 'file'])
def test_every_command_with_a_bad_sysfs_root(tmp_path, kind):
    root = str(tmp_path / 'sysroot')
    if kind == 'file':
        write_conf(root, 'not a directory\n')
    state_dir = str(tmp_path / 'state')
    conf = write_conf(tmp_path / 'ok.conf',
                      '[DEFAULT]\nsysfs_root = %s\nstate_dir = %s\n[gpu]\n'
                      'enabled_vgpu_types = nvidia-223\n'
                      '[libvirt]\nconnection_uri = qemu+unix:///system?'
                      'socket=%s\n'
                      % (root, state_dir, tmp_path / 'no-libvirt-sock'))
    for argv, (rc, out, err) in _run_all(
            [['--config-file', conf, '--sysfs-root', root] + c
             for c in _commands(str(tmp_path))]):
        line = one_line_error(rc, err)
        assert root in line or 'libvirt' in line, argv
    assert not os.path.exists(tmp_path / 'hooks' / 'qemu.d')


def test_usage_errors_exit_2_without_a_traceback(tmp_path):
    for argv in (['attach', 'vm1'], ['list', '--bogus'], ['placement'],
                 ['nosuchcommand']):
        rc, _, err = cli(*argv)
        assert rc == 2, argv
        assert 'Traceback' not in err
        assert err.splitlines()[-1].startswith('libvirt-gpu')


def test_debug_shows_the_traceback(tmp_path):
    rc, _, err = cli('--debug', '--config-file', str(tmp_path), 'list')
    assert rc == 1 and 'Traceback' in err


# --- the cases of the issue, one by one ------------------------------------

def test_config_file_that_is_a_directory(tmp_path):
    line = one_line_error(*cli('--config-file', str(tmp_path), 'list')[::2])
    assert 'a directory' in line and str(tmp_path) in line
    assert 'cannot read the configuration file' in line


def test_unreadable_config_is_not_called_a_configuration_error(tmp_path,
                                                               sim):
    conf = write_conf(tmp_path / 'secret.conf', '[DEFAULT]\n')
    os.chmod(conf, 0)
    rc, out, err = cli('--config-file', conf, '--sysfs-root', sim, 'list',
                       **_as_nobody())
    line = one_line_error(rc, err)
    assert 'cannot read the configuration file' in line
    assert 'ermission denied' in line
    assert 'Configuration error' not in line


def _as_nobody():
    """Run the CLI without root's power to ignore file permissions (the
    tests run as root): CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH are
    dropped from the child's bounding set before it starts."""
    if os.geteuid() != 0:
        return {}

    def drop():
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        pr_capbset_drop, dac_override, dac_read_search = 24, 1, 2
        for cap in (dac_override, dac_read_search):
            if libc.prctl(pr_capbset_drop, cap, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), 'prctl(PR_CAPBSET_DROP)')
    return {'preexec_fn': drop}


def test_option_checked_at_load_for_every_command(tmp_path, sim):
    conf = write_conf(tmp_path / 'c.conf', '[agent]\nsync_interval = -1\n')
    for argv in (['list'], ['agent', '--once']):
        line = one_line_error(*cli('--config-file', conf, '--sysfs-root',
                                   sim, *argv)[::2])
        assert line == ('libvirt-gpu: error: Configuration error: %s: '
                        '[agent]/sync_interval: Value for option '
                        'sync_interval is not valid: Should be greater than '
                        'or equal to 1' % conf)


def test_bad_value_of_a_per_type_option_names_it_without_oslo_repr(
        tmp_path, sim):
    line = error_with(tmp_path / 'c.conf',
                      '[gpu]\nenabled_vgpu_types = nvidia-223\n'
                      '[vgpu_nvidia-223]\nmax_instances = 0\n', sim, 'list')
    assert '[vgpu_nvidia-223]/max_instances' in line
    assert 'LocationInfo' not in line


def test_state_dir_that_is_a_file(tmp_path, sim):
    state_file = write_conf(tmp_path / 'state', 'x')
    conf = write_conf(tmp_path / 'c.conf',
                      '[DEFAULT]\nstate_dir = %s\n' % state_file)
    for argv in (['list'], ['hook', 'install', '--dir',
                            str(tmp_path / 'hooks')],
                 ['restore', '--no-libvirt']):
        line = one_line_error(*cli('--config-file', conf, '--sysfs-root',
                                   sim, *argv)[::2])
        assert 'state_dir' in line and 'not a directory' in line
    assert not os.path.exists(tmp_path / 'hooks')


def test_hook_install_dir_that_is_a_file(tmp_path, sim):
    hooks = write_conf(tmp_path / 'hooks', 'x')
    state_dir = tmp_path / 'state'
    conf = write_conf(tmp_path / 'c.conf',
                      '[DEFAULT]\nsysfs_root = %s\nstate_dir = %s\n'
                      % (sim, state_dir))
    line = one_line_error(*cli('--config-file', conf, 'hook', 'install',
                               '--dir', hooks)[::2])
    assert hooks in line and 'not a directory' in line
    assert not os.path.exists(state_dir)        # nothing half-done


def test_restore_mdevctl_dir_that_is_a_file(tmp_path, sim):
    mdevctl = write_conf(tmp_path / 'mdevctl.d', 'x')
    line = error_with(tmp_path / 'c.conf', '[DEFAULT]\nstate_dir = %s\n'
                      % (tmp_path / 'state'), sim, 'restore', '--no-libvirt',
                      '--mdevctl-dir', mdevctl)
    assert '--mdevctl-dir %s is not a directory' % mdevctl in line


def test_simulate_where_it_may_not_write(tmp_path):
    locked = tmp_path / 'locked'
    locked.mkdir()
    os.chmod(locked, 0o555)
    os.chmod(tmp_path, 0o755)
    rc, out, err = cli('simulate', 't4', str(locked / 'sim'),
                       **_as_nobody())
    line = one_line_error(rc, err)
    assert 'Permission denied' in line and str(locked / 'sim') in line
    inside_file = write_conf(tmp_path / 'plain', 'x')
    line = one_line_error(*cli('simulate', 't4', inside_file + '/sim')[::2])
    assert 'Not a directory' in line


def test_placement_url_must_be_http(sim, tmp_path):
    empty = write_conf(tmp_path / 'empty.conf', '')
    for argv in (['placement', 'sync', '--url', 'ftp://placement/'],
                 ['agent', '--once', '--url', 'placement:8778']):
        line = one_line_error(*cli('--config-file', empty,
                                   '--sysfs-root', sim, *argv)[::2])
        assert 'URL must be http(s)' in line
        assert 'Cannot reach' not in line


def test_reconcile_without_libvirt_is_not_told_to_use_sysfs(tmp_path, sim):
    conf = write_conf(tmp_path / 'c.conf',
                      '[DEFAULT]\nstate_dir = %s\n[libvirt]\n'
                      'connection_uri = qemu+unix:///system?socket=%s\n'
                      % (tmp_path / 'state', tmp_path / 'nosock'))
    line = one_line_error(*cli('--config-file', conf, '--sysfs-root', sim,
                               'reconcile')[::2])
    assert 'cannot connect to libvirt' in line
    assert '--sysfs-root' not in line
    assert 'needs libvirt' in line
    # discovery, which can read sysfs, still offers it
    line = one_line_error(*cli('--config-file', conf, '-c',
                               'qemu+unix:///system?socket=%s'
                               % (tmp_path / 'nosock'), 'list')[::2])
    assert 'Use --sysfs-root' in line


def test_reconcile_refuses_the_test_driver_and_says_dry_run_first(sim,
                                                                  tmp_path):
    conf = write_conf(tmp_path / 'c.conf', '[DEFAULT]\nstate_dir = %s\n'
                      % (tmp_path / 'state'))
    before = sorted(os.listdir(os.path.join(sim, 'bus', 'mdev', 'devices')))
    line = one_line_error(*cli('--config-file', conf, '--sysfs-root', sim,
                               '-c', 'test://%s/node.xml' % sim,
                               'reconcile')[::2])
    assert 'test driver' in line and 'qemu:///system' in line
    assert sorted(os.listdir(os.path.join(sim, 'bus', 'mdev',
                                          'devices'))) == before
    rc, out, _ = cli('reconcile', '--help')
    assert rc == 0
    assert 'run with --dry-run first' in ' '.join(out.split())


# --- error texts that must say what the code does ---------------------------

def test_type_id_text_matches_what_is_accepted():
    for good in ('nvidia-223', 'i915-GVTg_V5_4', 'vendor.type-1'):
        assert objects.TypeId.parse(good) == good
    with pytest.raises(exception.InvalidTypeId) as e:
        objects.TypeId.parse('nvidia+1')
    text = str(e.value)
    assert "'.'" in text and "'_'" in text and "'-'" in text
    assert 'only,' not in text


def test_pci_address_text_matches_what_is_accepted():
    assert str(objects.PciAddress.parse('0000:AF:00.0')) == '0000:af:00.0'
    with pytest.raises(exception.InvalidPciAddress) as e:
        objects.PciAddress.parse('0000:zz:00.0')
    assert 'lowercase' not in str(e.value)


# --- enabled_vgpu_types naming a type no GPU offers -------------------------

def test_enabled_type_no_gpu_offers(tmp_path, sim):
    conf = write_conf(tmp_path / 'c.conf',
                      '[gpu]\nenabled_vgpu_types = nvidia-999\n')
    rc, out, err = cli('--config-file', conf, '--sysfs-root', sim, 'list',
                       '--json')
    assert rc == 0, err
    assert [g['mode'] for g in json.loads(out)] == ['pgpu', 'pgpu']
    (warning,) = [line for line in err.splitlines()
                  if line.startswith('WARNING')]
    assert 'nvidia-999' in warning and 'no GPU' in warning
    assert 'nvidia-223' in warning and 'nvidia-321' in warning
    # with addresses: an error naming what that GPU offers
    line = error_with(tmp_path / 'd.conf',
                      '[gpu]\nenabled_vgpu_types = nvidia-999\n'
                      '[vgpu_nvidia-999]\ndevice_addresses = 0000:af:00.0\n',
                      sim, 'list')
    assert 'does not offer type nvidia-999' in line
    assert 'nvidia-223' in line


# --- restore --dry-run ------------------------------------------------------

def _snapshot(top, cache=None):
    """Every path under ``top`` and what it holds, the CLI's own cache
    directory (``cache``: the configuration's snapshot, the vGPU kinds it
    found installed) aside: no state of the host."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(top):
        if cache is not None:
            dirnames[:] = [d for d in dirnames
                           if os.path.join(dirpath, d) != str(cache)]
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            if os.path.islink(path):
                found[path] = ('link', os.readlink(path))
            elif os.path.isfile(path):
                with open(path, 'rb') as f:
                    found[path] = ('file', f.read())
            else:
                found[path] = ('dir', None)
    return found


def test_restore_dry_run_shows_and_writes_nothing(tmp_path,
                                                  settings_snapshot_dir):
    root = str(tmp_path / 'sys')
    simulator.write_host(simulator.load_profile('a100'), root)
    # a mdevctl definition to re-create on the first GPU's second VF
    mdevctl = tmp_path / 'mdevctl.d'
    (mdevctl / '0000:41:00.5').mkdir(parents=True)
    uuid = '0f6a4a5e-8b7b-4d8e-9a3e-4d2b8c3f1a01'
    (mdevctl / '0000:41:00.5' / uuid).write_text(
        '{"mdev_type": "nvidia-472", "start": "auto"}')
    state_dir = tmp_path / 'state'
    conf = write_conf(tmp_path / 'c.conf',
                      '[DEFAULT]\nstate_dir = %s\n[gpu]\n'
                      'enabled_vgpu_types = nvidia-472\n' % state_dir)
    before = _snapshot(str(tmp_path), settings_snapshot_dir)
    rc, out, err = cli('--config-file', conf, '--sysfs-root', root,
                       'restore', '--no-libvirt', '--dry-run', '--json',
                       '--mdevctl-dir', str(mdevctl))
    assert rc == 0, err
    assert _snapshot(str(tmp_path), settings_snapshot_dir) == before
    report = json.loads(out)
    assert report['changed'] == 0 and report['failed'] == 0
    would = {(a['what'], a['target']): a['detail']
             for a in report['actions'] if a['action'] == 'would'}
    assert 'would enable 16 VFs' in would[('vfs', '0000:c1:00.0')]
    assert would[('mdev', uuid)] == 'would create nvidia-472 on 0000:41:00.5'
    # the real run does what the dry run announced
    rc, out, err = cli('--config-file', conf, '--sysfs-root', root,
                       'restore', '--no-libvirt', '--json',
                       '--mdevctl-dir', str(mdevctl),
                       '--settle-timeout', '0')
    done = {(a['what'], a['target']): a['action']
            for a in json.loads(out)['actions']}
    assert done[('vfs', '0000:c1:00.0')] == 'enabled-vfs'
    with open(os.path.join(root, 'bus', 'pci', 'devices', '0000:c1:00.0',
                           'sriov_numvfs')) as f:
        assert f.read().strip() == '16'


# --- the hook with stdin closed ----------------------------------------------

def test_hook_with_stdin_closed(tmp_path):
    hook_script = os.path.join(ROOT, 'hooks', 'qemu')
    for op, status in (('prepare', 1), ('release', 0), ('reconnect', 0)):
        proc = subprocess.run(
            ['bash', '-c', 'exec "$@" <&-', '-', sys.executable, hook_script,
             'vm1', op, 'begin', '-'], capture_output=True, text=True)
        assert proc.returncode == status
        assert 'Traceback' not in proc.stderr
        (line,) = proc.stderr.splitlines()
        assert 'no domain XML on stdin' in line
    # an operation the hook ignores stays silent
    proc = subprocess.run(['bash', '-c', 'exec "$@" <&-', '-',
                           sys.executable, hook_script, 'vm1', 'started',
                           'begin', '-'], capture_output=True, text=True)
    assert (proc.returncode, proc.stderr) == (0, '')


def test_every_command_that_prints_a_result_takes_json():
    # README ("The command at a glance") and docs/admin/configure-types.md:
    # every command that prints a result takes --json (agent, a
    # service that logs, does not)
    from libvirt_gpu.cmd import main as cli_main
    parser = cli_main.build_parser()
    for argv in (['list'], ['types'], ['discover'], ['placement', 'show'],
                 ['placement', 'sync'], ['simulate', '--list'],
                 ['attach', 'vm', '--address', '0000:3b:00.0'],
                 ['detach', 'vm', '--address', '0000:3b:00.0'],
                 ['domgpus', 'vm'], ['hook', 'install'], ['reconcile'],
                 ['restore']):
        assert parser.parse_args(argv + ['--json']).json is True, argv
    assert parser.parse_args(['agent']).json is False
