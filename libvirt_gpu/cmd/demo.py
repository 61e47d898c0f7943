"""``make demo``: the main job on a simulated host, no GPU needed.

Writes the bundled T4 profile (two Tesla T4, one already holding two GRID
T4-2B vGPUs) as a sysfs tree plus libvirt test-driver XML into a temporary
directory, enables GRID T4-2B on one GPU, and runs the CLI against it
through libvirt's node-device API: the GPU table, the vGPU types, and the
Placement provider tree with inventories and traits.
"""

import os
import sys
import tempfile

from libvirt_gpu import simulator
from libvirt_gpu.cmd import main as cli
from libvirt_gpu.cmd import output

DEMO_CONF = """\
[gpu]
enabled_vgpu_types = nvidia-223

[vgpu_nvidia-223]
device_addresses = 0000:af:00.0
"""


def main():
    with tempfile.TemporaryDirectory(prefix='libvirt-gpu-demo-') as tmp:
        root = os.path.join(tmp, 'sys')
        node_xml = simulator.write_host(simulator.load_profile('t4'), root)
        conf = os.path.join(tmp, 'libvirt-gpu.conf')
        with open(conf, 'w') as f:
            f.write(DEMO_CONF)
        base = ['--config-file', conf, '--hostname', 'compute-1',
                '-c', 'test://' + node_xml, '--sysfs-root', root]
        output.emit_text('Simulated host: profile t4 in %s' % root)
        output.emit_text('Configuration (%s):\n%s' % (conf, DEMO_CONF))
        steps = [
            ('GPUs (libvirt-gpu list)', ['list']),
            ('vGPU types of 0000:af:00.0 (libvirt-gpu types 0000:af:00.0)',
             ['types', '0000:af:00.0']),
            ('Placement provider tree (libvirt-gpu placement show)',
             ['placement', 'show']),
        ]
        for title, argv in steps:
            output.emit_section(title)
            code = cli.main(base + argv)
            if code:
                return code
        output.emit_text('\nScripts: add --json to any command that prints '
                         'a result. Try: libvirt-gpu simulate --list')
    return 0


if __name__ == '__main__':
    sys.exit(main())
