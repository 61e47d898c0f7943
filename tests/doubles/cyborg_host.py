"""A simulated host as the Cyborg driver reads it: sysfs plus libvirt's
test driver on the host's ``node.xml`` (``write_host``), the bundled T4
host with some GPUs' vGPU types gone (``t4``), and our configuration
naming that connection (``write_conf``; ``host_conf``: both under
``tmp_path``, every GPU given to Cyborg)."""

import os

from libvirt_gpu import simulator
from libvirt_gpu.util import records


def t4(vanished=()):
    """The bundled T4 host; the GPUs at ``vanished`` list no vGPU type and
    hold no vGPU (what sysfs and libvirt show while the vGPU manager
    driver reloads)."""
    profile = simulator.load_profile('t4')
    devices = tuple(
        records.replace(d, mdev_types=(), mdevs=()) if d.address in vanished
        else d for d in profile.devices)
    return records.replace(profile, devices=devices)


def write_host(root, profile):
    os.makedirs(root, exist_ok=True)
    return simulator.write_host(profile, root)


def write_conf(path, root, uri, gpu_lines=(), sections=()):
    lines = (['[DEFAULT]', 'sysfs_root = %s' % root,
              'state_dir = %s' % os.path.join(os.path.dirname(path), 'state'),
              '[libvirt]', 'connection_uri = %s' % uri,
              '[gpu]', 'nvml = off'] + list(gpu_lines) + list(sections)
             + ['[routes]', 'cyborg = all'])
    with open(path, 'w') as f:
        f.write('\n'.join(lines) + '\n')
    return path


def host_conf(tmp_path, profile=None, gpu_lines=(), sections=(), uri=None):
    root = str(tmp_path / 'sys')
    node_xml = write_host(root, profile or t4())
    return write_conf(str(tmp_path / 'libvirt-gpu.conf'), root,
                      uri or 'test://%s' % node_xml, gpu_lines, sections)
