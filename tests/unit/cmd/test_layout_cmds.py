"""``libvirt-gpu layout plan|apply`` and ``restore`` on a simulated host
that has no NVML (the simulated binding is another room's): the commands
say in one line what layouts need; a host without layouts asks NVML
nothing; ``restore`` brings the layouts back first and goes on with the
rest when it cannot."""

import json
import os
import shutil
import tempfile

import pytest

from libvirt_gpu.cmd import main as cli
from libvirt_gpu import environment
from libvirt_gpu.host import restore
from libvirt_gpu import simulator
from tests.doubles import kernel_sysfs

LAYOUT = ('[gpu]\nlayouts = l40s\n[layout_l40s]\ngpus = 0000:3d:00.0\n'
          'mode = mixed-size\nvgpu_types = nvidia-1145:1, nvidia-1155:1\n'
          'scheduler = equal-share\n')


@pytest.fixture(scope='module')
def l40s():
    path = tempfile.mkdtemp(prefix='lgpu-layout-cli-')
    root = os.path.join(path, 'sys')
    simulator.write_sysfs(simulator.load_profile('l40s'), root)
    yield path, root
    shutil.rmtree(path, ignore_errors=True)


def config(path, text):
    name = os.path.join(path, 'c%d.conf' % abs(hash(text)))
    with open(name, 'w') as f:
        f.write('[DEFAULT]\nstate_dir = %s\n%s'
                % (os.path.join(path, 'state'), text))
    return name


def run(capsys, path, root, text, *argv):
    code = cli.main(['--config-file', config(path, text), '--sysfs-root',
                     root] + list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_without_nvml_a_layout_is_one_clear_error(capsys, l40s):
    code, out, err = run(capsys, *l40s, LAYOUT, 'layout', 'plan')
    assert code == 1 and out == ''
    assert err.count('\n') == 1
    assert 'NVML cannot be used' in err and 'nvidia-ml-py' in err


def test_without_layouts_nothing_is_asked(capsys, l40s):
    code, out, err = run(capsys, *l40s, '', 'layout', 'apply', '--json')
    assert code == 0, err
    assert json.loads(out)['gpus'] == []


def test_a_gpu_in_no_layout_is_named(capsys, l40s):
    code, out, err = run(capsys, *l40s, LAYOUT, 'layout', 'apply', '--gpu',
                         '0000:bd:00.0')
    assert code == 1
    assert 'the GPU 0000:bd:00.0 is in no layout' in err


def test_a_bad_layout_stops_every_command(capsys, l40s):
    code, out, err = run(capsys, *l40s, LAYOUT + 'gpu_instances = 1g:1\n',
                         'list')
    assert code == 1
    assert '[layout_l40s]/gpu_instances: GPU instances exist only in the ' \
        'MIG modes' in err


def test_restore_brings_layouts_first_and_goes_on_without_them(l40s):
    path, root = l40s
    # the vGPUs of the tree are no one's: reported, never touched
    sysfs = kernel_sysfs.KernelSysfs(root, 'l40s')
    from libvirt_gpu import conf as conf_mod
    cfg = conf_mod.load(config(path, LAYOUT))
    report = restore.restore(environment.Environment(
        cfg.state_dir, sysfs=sysfs, conf=cfg), settle_timeout=0)
    first = report.actions[0]
    assert (first.action, first.what) == (restore.FAILED, 'layout')
    assert 'NVML cannot be used' in first.detail
    assert len(report.actions) > 1         # the other steps still ran
