"""The configuration file is input too: only a regular file of sane size is
read.  A FIFO hung every command and the hook, ``/dev/zero`` grew memory
without bound, a directory gave a traceback.  The CLI and the hook run as
processes; their timeout detects a hang, it is no speed claim.
"""

import os
import resource
import site
import subprocess
import sys

import pytest

from libvirt_gpu import conf as conf_mod
from libvirt_gpu import exception
from libvirt_gpu.guests import hook
from tests.doubles import hang
from tests.doubles import sockets
from tests.doubles import paths

ROOT = paths.ROOT
CLI = os.path.join(os.path.dirname(sys.executable), 'libvirt-gpu')
HANG = 60     # seconds: a hang detector, not a speed assertion


def _fifo(path):
    os.mkfifo(path)
    return path, 'it is a FIFO, not a regular file'


def _socket(path):
    sockets.make_socket_file(path)
    return path, 'it is a socket, not a regular file'


def _dev_zero(path):
    return '/dev/zero', 'it is a character device, not a regular file'


def _link_to_dev_zero(path):
    os.symlink('/dev/zero', path)
    return path, 'it is a character device, not a regular file'


def _directory(path):
    os.mkdir(path)
    return path, 'it is a directory, not a regular file'


def _oversize(path):
    with open(path, 'w') as f:
        f.write('[DEFAULT]\n' + '# padding\n' * (
            conf_mod.MAX_CONFIG_BYTES // 10 + 1))
    return path, 'more than the %d a configuration file can be' % (
        conf_mod.MAX_CONFIG_BYTES)


CASES = {'fifo': _fifo, 'socket': _socket, 'dev-zero': _dev_zero,
         'link-to-dev-zero': _link_to_dev_zero, 'directory': _directory,
         'oversize': _oversize}


# Read in this process only when a regression cannot eat its memory: a
# reader of /dev/zero grows without bound (the processes below run under
# a memory limit).
IN_PROCESS = sorted(c for c in CASES if 'dev-zero' not in c)


def _memory_limit():
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


@pytest.fixture(autouse=True)
def hang_detector():
    """A read of a FIFO in this process would block for ever: SIGALRM
    fails the test instead of stopping the suite."""
    with hang.alarm(HANG * 5):
        yield


@pytest.fixture(params=sorted(CASES))
def bad_config(request, tmp_path):
    # short name: AF_UNIX paths are limited to ~108 bytes
    return CASES[request.param](str(tmp_path / 'c'))


@pytest.fixture(params=IN_PROCESS)
def bad_config_in_process(request, tmp_path):
    return CASES[request.param](str(tmp_path / 'c'))


def test_load_refuses(bad_config_in_process):
    path, reason = bad_config_in_process
    with pytest.raises(exception.ConfigError) as info:
        conf_mod.load(path)
    message = str(info.value)
    assert message.startswith('cannot read the configuration file %s: '
                              % path), message
    assert reason in message and '\n' not in message


def test_load_refuses_through_the_environment(bad_config_in_process):
    path, reason = bad_config_in_process
    with pytest.raises(exception.ConfigError, match=reason):
        conf_mod.load(None, environ={conf_mod.CONFIG_ENV: path})


@pytest.mark.parametrize('how', ['option', 'environment'])
def test_cli_one_line_error(bad_config, tmp_path, how):
    path, reason = bad_config
    env = dict(os.environ)
    argv = [CLI]
    if how == 'option':
        argv += ['--config-file', path]
    else:
        env[conf_mod.CONFIG_ENV] = path
    r = subprocess.run(argv + ['--sysfs-root', str(tmp_path), 'list'],
                       capture_output=True, env=env, timeout=HANG,
                       preexec_fn=_memory_limit)
    err = r.stderr.decode()
    assert r.returncode == 1 and r.stdout == b''
    assert err.count('\n') == 1, err
    assert err.startswith('libvirt-gpu: error: cannot read the '
                          'configuration file %s: ' % path), err
    assert reason in err


def test_regular_config_still_read(tmp_path):
    path = tmp_path / 'c'
    path.write_text('[DEFAULT]\nstate_dir = %s\n' % (tmp_path / 'state'))
    assert conf_mod.load(str(path)).state_dir == str(tmp_path / 'state')
    link = tmp_path / 'link'
    os.symlink(str(path), str(link))     # a link to a regular file is fine
    assert conf_mod.load(str(link)).state_dir == str(tmp_path / 'state')


def test_missing_default_config_is_fine_and_named_one_is_not(tmp_path):
    assert conf_mod.check_config_file(str(tmp_path / 'none'), False) is False
    with pytest.raises(exception.ConfigError, match='does not exist'):
        conf_mod.check_config_file(str(tmp_path / 'none'), True)


def test_hook_with_a_hostile_config(bad_config, tmp_path):
    """The installed hook whose config file is hostile: prepare refuses
    the start (exit 1), reconnect and release exit 0; none hangs."""
    path, reason = bad_config
    with open(hook.hook_source()) as f:
        text = hook.render_hook(
            f.read(), sys.executable, path, str(tmp_path / 'settings.json'),
            [p for p in site.getsitepackages() if os.path.isdir(p)] + [ROOT])
    script = str(tmp_path / 'qemu-hook')
    with open(script, 'w') as f:
        f.write(text)
    os.chmod(script, 0o755)
    xml = (b"<domain type='kvm'><name>vm1</name>"
           b"<uuid>c7a5fdbd-cdaf-9455-926a-d65c16db1809</uuid><metadata>"
           b"<gpu:gpus xmlns:gpu='urn:libvirt-gpu:1'><gpu:vgpu "
           b"uuid='4b20d080-1b54-4048-85b3-a6a62d165c01' type='nvidia-223'/>"
           b"</gpu:gpus></metadata><devices/></domain>")
    env = {'LC_ALL': 'C', 'PATH': '/usr/bin:/bin', 'HOME': '/root'}
    for op, expected in (('prepare', 1), ('reconnect', 0), ('release', 0)):
        r = subprocess.run([script, 'vm1', op, 'begin', '-'], input=xml,
                           capture_output=True, env=env, timeout=HANG,
                           preexec_fn=_memory_limit)
        err = r.stderr.decode()
        assert r.returncode == expected, (op, err)
        assert reason in err and 'Traceback' not in err, (op, err)


def test_dev_null_is_an_empty_configuration():
    """``--config-file /dev/null`` is the usual way to say "no settings":
    it reads as empty, while every other device is refused."""
    conf = conf_mod.load(os.devnull)
    assert conf.gpu.enabled_vgpu_types == []


def test_the_hang_detector_fires(tmp_path):
    """The detector these tests rely on turns a blocked read into Hung."""
    fifo = str(tmp_path / 'fifo')
    os.mkfifo(fifo)
    with pytest.raises(hang.Hung):
        with hang.alarm(1):
            open(fifo).read()     # no writer: blocks until the alarm
