"""Shared by the tests that run our installed qemu hook under a real
libvirtd on the live simulated host (test_live_hook, test_live_vendor):
the hook's configuration, guests that name vGPUs in our metadata, and
readers of what the hook left (leases, its log)."""

import os
import site
import sys

import pytest

from libvirt_gpu.virt import config_xml
from libvirt_gpu.guests import hook
from libvirt_gpu.virt import metadata
from libvirt_gpu import objects
from libvirt_gpu.store import state
from libvirt_gpu.devices.backends import nvidia_vgpu
from tests.functional import libvirtd
from tests.functional import live_sysfs as ls


class HookSetup(object):
    """Our hook, configured for ``type_id`` on the live tree; a subclass
    adds hooks of its own through ``extra_hooks``."""

    def __init__(self, workdir, type_id):
        self.type_id = type_id
        self.state_dir = os.path.join(workdir, 'state')
        self.config = os.path.join(workdir, 'libvirt-gpu.conf')
        self.settings = os.path.join(self.state_dir, hook.SETTINGS_NAME)

    def extra_hooks(self):
        return {}

    def hooks(self, live):
        with open(self.config, 'w') as f:
            f.write('[DEFAULT]\nsysfs_root = %s\nstate_dir = %s\n'
                    '[gpu]\nenabled_vgpu_types = %s\n'
                    % (live.root, self.state_dir, self.type_id))
        with open(hook.hook_source()) as f:
            text = hook.render_hook(
                f.read(), sys.executable, self.config, self.settings,
                [p for p in site.getsitepackages() if os.path.isdir(p)]
                + [ls.REPO])
        return dict({'qemu.d/libvirt-gpu': text}, **self.extra_hooks())


def leases(host):
    return state.LeaseStore(host.setup.state_dir).leases()


def hook_log(host):
    try:
        with open(os.path.join(host.setup.state_dir, hook.LOG_NAME)) as f:
            return f.read()
    except FileNotFoundError:
        return ''


def guest_xml(name, vgpus, vendor=False):
    """A tiny guest with ``<gpu:vgpu>`` entries ((uuid, type, parent)) and
    their devices: the mdev hostdev, or (``vendor``: NVIDIA's vGPU 17+
    interface) the VF as an unmanaged PCI hostdev."""
    meta = metadata.render_document(metadata.GpuMetadata(vgpus=tuple(
        metadata.VgpuEntry(objects.Uuid.parse(u), objects.TypeId.parse(t),
                           objects.PciAddress.parse(p) if p else None)
        for u, t, p in vgpus)))
    devices = ''.join(
        nvidia_vgpu.vf_hostdev(objects.PciAddress.parse(p)) if vendor
        else config_xml.mdev_hostdev(objects.Uuid.parse(u))
        for u, _, p in vgpus)
    return libvirtd.tiny_domain_xml(name, metadata=meta,
                                    extra_devices=devices)


def start(host, name, vgpus, vendor=False):
    """Define and start a guest that this host must refuse; returns
    (libvirt error code, message) of the refusal, after which it is
    undefined."""
    import libvirt
    conn = host.daemon.connect()
    dom = conn.defineXML(guest_xml(name, vgpus, vendor))
    try:
        with pytest.raises(libvirt.libvirtError) as e:
            dom.create()
        return e.value.get_error_code(), e.value.get_error_message()
    finally:
        dom.undefine()
