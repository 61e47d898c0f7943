"""``libvirt-gpu restore`` on simulated hosts after a reboot (VFs off, no
vGPU): VFs enabled, persistent vGPUs re-created (mdevctl definitions,
vendor-interface state), stale ones reset; a second run changes nothing."""

import json
import os
import stat


from libvirt_gpu.devices.backends import base
from libvirt_gpu.devices.backends import nvidia_vgpu
from libvirt_gpu import conf as conf_mod
from libvirt_gpu import environment
from libvirt_gpu import objects
from libvirt_gpu.host import restore
from libvirt_gpu import simulator
from libvirt_gpu.cmd import main as cli
from libvirt_gpu.simulator import loading
from tests.doubles import kernel_sysfs
from libvirt_gpu.devices.backends.nvidia_vgpu.files import (
    VendorFiles as vendor)
from libvirt_gpu.devices.backends.nvidia_vgpu import names as vendor_names

T_NVIDIA_1145 = objects.TypeId.parse('nvidia-1145')

U1 = objects.Uuid.parse('aa618089-8b16-4d01-a136-25a0f3c73123')
U2 = objects.Uuid.parse('c73f1fa6-489e-4834-9476-d70dabd98c40')
U3 = objects.Uuid.parse('3b356d38-854e-48be-b376-00c72c7d119c')
U4 = objects.Uuid.parse('676428a0-2445-499f-9bfd-65cd4a9bd18f')
U5 = objects.Uuid.parse('6c5954b8-5bc1-4769-b820-8099fe50aaba')


def rebooted(name):
    """The bundled profile as a boot leaves it: VFs off, no vGPU."""
    with open(os.path.join(loading.profile_dir(), name + '.json')) as f:
        data = json.load(f)
    for dev in data['devices']:
        dev.pop('mdevs', None)
        dev.pop('held_type', None)
        if dev.get('virtfns'):
            dev['sriov_numvfs'] = 0
    return loading.profile_from_dict(data, source=name + '-rebooted')


def host(profile, fast_tmp):
    root = os.path.join(fast_tmp, 'sys')
    simulator.write_sysfs(profile, root)
    return kernel_sysfs.KernelSysfs(root, profile)


def conf(fast_tmp, text):
    path = os.path.join(fast_tmp, 'libvirt-gpu.conf')
    with open(path, 'w') as f:
        f.write('[DEFAULT]\nstate_dir = %s\n%s'
                % (os.path.join(fast_tmp, 'state'), text))
    return path, conf_mod.load(path)


def define(mdevctl, parent, uuid, type_id, start):
    os.makedirs(os.path.join(mdevctl, parent), exist_ok=True)
    with open(os.path.join(mdevctl, parent, uuid), 'w') as f:
        json.dump({'mdev_type': type_id, 'start': start, 'attrs': []}, f)


def summary(report):
    return sorted((a.action, a.what, a.target) for a in report.actions)


def test_a100_after_reboot_and_idempotence(fast_tmp):
    sysfs = host(rebooted('a100'), fast_tmp)
    _, cfg = conf(fast_tmp, '[gpu]\nenabled_vgpu_types = nvidia-472\n')
    mdevctl = os.path.join(fast_tmp, 'mdevctl.d')
    define(mdevctl, '0000:41:00.4', U1, 'nvidia-472', 'auto')
    define(mdevctl, '0000:41:00.5', U2, 'nvidia-472', 'manual')
    define(mdevctl, '0000:c1:00.4', U3, 'nvidia-473', 'auto')
    define(mdevctl, '0000:41:00.6', U4, 'nvidia-468', 'auto')   # won't fit
    os.makedirs(os.path.join(mdevctl, '0.0.0123'))            # a ccw parent
    state_dir = cfg.state_dir
    targets = restore.vf_targets(
        environment.Environment(state_dir, sysfs=sysfs, conf=cfg))
    assert [str(t) for t in targets] == ['0000:41:00.0', '0000:c1:00.0']

    def run():
        return restore.restore(
            environment.Environment(state_dir, sysfs=sysfs,
                                    mdevctl_dir=mdevctl),
            vf_pfs=targets, settle_timeout=0)
    first = run()
    assert summary(first) == [
        ('created', 'mdev', U3), ('created', 'mdev', U1),
        ('enabled-vfs', 'vfs', '0000:41:00.0'),
        ('enabled-vfs', 'vfs', '0000:c1:00.0'),
        ('failed', 'mdev', U4), ('skipped', 'mdev', U2)]
    assert 'No capacity' in [a for a in first.failed][0].detail
    assert len(sysfs.virtfns('0000:41:00.0')) == 16
    parents = sysfs.mdevs_by_parent()
    assert [m.uuid for m in parents[objects.PciAddress.parse(
        '0000:41:00.4')]] == [U1]
    writes = len(sysfs.writes)
    second = run()
    assert second.changed == ()                   # nothing to do twice
    assert len(sysfs.writes) == writes            # not one sysfs write
    assert summary(second) == [
        ('failed', 'mdev', U4), ('ok', 'mdev', U3), ('ok', 'mdev', U1),
        ('ok', 'vfs', '0000:41:00.0'), ('ok', 'vfs', '0000:c1:00.0'),
        ('skipped', 'mdev', U2)]


def test_l40s_after_reboot_from_our_state(fast_tmp):
    sysfs = host(rebooted('l40s'), fast_tmp)
    _, cfg = conf(fast_tmp, '[gpu]\nenabled_vgpu_types = nvidia-1145\n'
                  '[vgpu_nvidia-1145]\ndevice_addresses = 0000:3d:00.0\n')
    state = nvidia_vgpu.VendorState(cfg.state_dir)
    with state.locked() as entries:
        for uuid, vf, gpu, type_id, start, params in (
                (U1, '0000:3d:00.4', '0000:3d:00.0', 'nvidia-1145', 'auto',
                 'frame_rate_limiter=0'),
                (U2, '0000:3d:00.5', '0000:3d:00.0', 'nvidia-1145', None,
                 None),                     # transient: gone with the boot
                (U3, '0000:bd:00.4', '0000:bd:00.0', 'nvidia-1156', 'auto',
                 None)):
            entries[uuid] = nvidia_vgpu.VendorVgpu(
                uuid=uuid, vf=objects.PciAddress.parse(vf),
                gpu=objects.PciAddress.parse(gpu),
                type_id=type_id, start=start, params=params)
    # the GPU of U3 is not configured but our state names it
    targets = restore.vf_targets(
        environment.Environment(cfg.state_dir, sysfs=sysfs, conf=cfg))
    env = environment.Environment(
        cfg.state_dir, sysfs=sysfs,
        mdevctl_dir=os.path.join(fast_tmp, 'none'))
    assert [str(t) for t in targets] == ['0000:3d:00.0', '0000:bd:00.0']
    first = restore.restore(env, vf_pfs=targets, settle_timeout=0)
    assert summary(first) == [
        ('created', 'vgpu', U3), ('created', 'vgpu', U1),
        ('enabled-vfs', 'vfs', '0000:3d:00.0'),
        ('enabled-vfs', 'vfs', '0000:bd:00.0'), ('forgot', 'vgpu', U2)]
    assert first.failed == ()
    assert vendor(sysfs).current_type('0000:3d:00.4') == 1145
    assert vendor(sysfs).current_type('0000:bd:00.4') == 1156
    with open(os.path.join(vendor(sysfs).vendor_dir('0000:3d:00.4'),
                           vendor_names.VGPU_PARAMS)) as f:
        assert f.read() == 'frame_rate_limiter=0'
    assert sorted(state.read()) == sorted([U1, U3])
    writes = len(sysfs.writes)
    second = restore.restore(env.replace(), vf_pfs=targets,
                             settle_timeout=0)
    assert second.changed == () and len(sysfs.writes) == writes
    assert summary(second) == [
        ('ok', 'vfs', '0000:3d:00.0'), ('ok', 'vfs', '0000:bd:00.0'),
        ('ok', 'vgpu', U3), ('ok', 'vgpu', U1)]


def test_stale_vendor_vgpus_reset_only_when_their_guest_is_gone(fast_tmp):
    sysfs = host(simulator.load_profile('l40s'), fast_tmp)
    state_dir = os.path.join(fast_tmp, 'state')
    backend = nvidia_vgpu.NvidiaVgpuBackend(sysfs, state_dir)
    for uuid, vf in ((U1, '0000:3d:00.6'), (U2, '0000:3d:00.7'),
                     (U3, '0000:3d:01.0')):
        backend.prepare(base.VgpuDevice(
            uuid=uuid, parent=objects.PciAddress.parse(vf),
            type_id=objects.TypeId.parse('nvidia-1145')))
    vf = objects.PciAddress.parse('0000:3d:01.1')
    backend.define(base.VgpuDevice(uuid=U4, parent=vf,
                                   type_id=T_NVIDIA_1145), start='manual')
    backend.prepare(base.VgpuDevice(uuid=U4, parent=vf,
                                    type_id=T_NVIDIA_1145))
    running = {U1: False, U2: True, U3: None}

    def run():
        return restore.restore(
            environment.Environment(
                state_dir, sysfs=sysfs,
                mdevctl_dir=os.path.join(fast_tmp, 'none')),
            vf_pfs=(), owner_running=running.get, settle_timeout=0)
    first = run()
    assert summary(first) == [
        ('ok', 'vgpu', U2),                        # its guest runs
        ('reset', 'vgpu', U1),                     # its guest is gone
        ('skipped', 'vgpu', '0000:3d:00.4'),       # not ours: never touched
        ('skipped', 'vgpu', '0000:3d:00.5'),
        ('skipped', 'vgpu', U3)]                   # cannot tell: kept
    assert vendor(sysfs).current_type('0000:3d:00.6') == 0
    assert vendor(sysfs).current_type('0000:3d:00.7') == 1145
    assert vendor(sysfs).current_type('0000:3d:00.4') == 1145
    assert vendor(sysfs).current_type('0000:3d:01.1') == 1145  # persistent
    assert U1 not in backend.vgpus()
    writes = len(sysfs.writes)
    assert run().changed == () and len(sysfs.writes) == writes


def test_sriov_manage_is_run_and_its_failure_reported(fast_tmp):
    sysfs = host(rebooted('a100'), fast_tmp)
    log = os.path.join(fast_tmp, 'calls')
    script = os.path.join(fast_tmp, 'sriov-manage')
    with open(script, 'w') as f:
        f.write('#!/bin/sh\necho "$@" >> %s\n'
                '[ "$2" = 0000:c1:00.0 ] && { echo no GPU >&2; exit 3; }\n'
                'exit 0\n' % log)
    os.chmod(script, stat.S_IRWXU)
    report = restore.restore(
        environment.Environment(os.path.join(fast_tmp, 'state'),
                                sysfs=sysfs,
                                mdevctl_dir=os.path.join(fast_tmp, 'none')),
        vf_pfs=[objects.PciAddress.parse(a)
                for a in ('0000:41:00.0', '0000:c1:00.0')],
        sriov_manage=script,
        settle_timeout=0)
    with open(log) as f:
        calls = f.read().split('\n')[:2]
    assert calls == ['-e 0000:41:00.0', '-e 0000:c1:00.0']
    (failed,) = report.failed
    assert failed.target == '0000:c1:00.0' and 'exited 3' in failed.detail
    assert 'no GPU' in failed.detail
    assert restore.sriov_manage_for(fast_tmp, 'auto') is None   # not /sys
    assert restore.sriov_manage_for('/sys', 'none') is None
    assert restore.sriov_manage_for('/sys', script) == script


def test_cli_restore_json(fast_tmp, capsys):
    simulator.write_sysfs(simulator.load_profile('l40s'),
                          os.path.join(fast_tmp, 'sys'))
    path, _ = conf(fast_tmp, '[gpu]\nenabled_vgpu_types = nvidia-1145\n')
    argv = ['--config-file', path, '--sysfs-root',
            os.path.join(fast_tmp, 'sys'), 'restore', '--json',
            '--no-libvirt', '--mdevctl-dir', os.path.join(fast_tmp, 'none'),
            '--settle-timeout', '0']
    assert cli.main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc['changed'] == 0 and doc['failed'] == 0
    assert {(a['action'], a['target']) for a in doc['actions']} == {
        ('ok', '0000:3d:00.0'), ('ok', '0000:bd:00.0'),
        ('skipped', '0000:3d:00.4'), ('skipped', '0000:3d:00.5')}
    assert cli.main(argv[:-6] + ['--no-libvirt', '--settle-timeout', '0',
                                 '--mdevctl-dir',
                                 os.path.join(fast_tmp, 'none')]) == 0
    assert '0 change(s), 0 failure(s)' in capsys.readouterr().out
