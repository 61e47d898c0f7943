"""The qemu hook's ``prepare`` check of ``<gpu:pgpu>`` applies the attach's
IOMMU group rule, on the H100 capture with groups added (tests/doubles/
h100.py): no group, a group holding the host's NIC, and a companion left
out of ``<devices>`` are refused naming the device; the GPU with its audio
function passes."""

import io

from libvirt_gpu.guests import hook
from libvirt_gpu.devices import sysfs as sysfs_mod
from tests.doubles import h100

DOM = '6b1f0c4e-2a55-4f34-9b8e-0d5f5a9f1c11'


def _hostdev(address):
    dom, bus, rest = address.split(':')
    slot, fn = rest.split('.')
    return ("<hostdev mode='subsystem' type='pci' managed='yes'><source>"
            "<address domain='0x%s' bus='0x%s' slot='0x%s' function='0x%s'/>"
            "</source></hostdev>" % (dom, bus, slot, fn))


def _xml(gpu, functions):
    return ("<domain type='kvm'><name>vm1</name><uuid>%s</uuid><metadata>"
            "<gpu:gpus xmlns:gpu='urn:libvirt-gpu:1'><gpu:pgpu address='%s'/>"
            "</gpu:gpus></metadata><memory unit='KiB'>65536</memory>"
            "<devices>%s</devices></domain>"
            % (DOM, gpu, ''.join(_hostdev(a) for a in functions))).encode()


def _prepare(root, tmp_path, xml):
    (tmp_path / 'state').mkdir(exist_ok=True)
    config = tmp_path / 'libvirt-gpu.conf'
    config.write_text('[DEFAULT]\nsysfs_root = %s\nstate_dir = %s\n'
                      % (root, tmp_path / 'state'))
    err = io.StringIO()
    rc = hook.run(['qemu', 'vm1', 'prepare', 'begin', '-'], xml,
                  config_file=str(config), settings_file=None,
                  sysfs=sysfs_mod.Sysfs(root), stderr=err,
                  mdevctl_dir=str(tmp_path / 'mdevctl.d'))
    return rc, err.getvalue()


def test_gpu_with_its_audio_function_passes(h100_audio_sysfs, tmp_path):
    assert _prepare(h100_audio_sysfs, tmp_path,
                    _xml(h100.GPU, [h100.GPU, h100.AUDIO])) == (0, '')


def test_audio_function_left_out_is_refused(h100_audio_sysfs, tmp_path):
    rc, err = _prepare(h100_audio_sysfs, tmp_path,
                       _xml(h100.GPU, [h100.GPU]))
    assert rc == 1
    assert h100.AUDIO in err and 'must go to the guest with it' in err


def test_group_with_the_hosts_nic_is_refused(h100_nic_sysfs, tmp_path):
    rc, err = _prepare(h100_nic_sysfs, tmp_path, _xml(h100.GPU, [h100.GPU]))
    assert rc == 1
    assert h100.NIC in err and 'network controller' in err


def test_gpu_without_group_is_refused(h100_sysfs, tmp_path):
    rc, err = _prepare(h100_sysfs, tmp_path, _xml(h100.GPU, [h100.GPU]))
    assert rc == 1 and 'no IOMMU group' in err and h100.GPU in err
