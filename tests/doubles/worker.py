"""One API or hook call in a process of its own, for the reliability tests
(which start many at once and SIGKILL some)::

    python -m tests.doubles.worker attach|prepare|release --root ROOT \
        --profile PROFILE.json --config CONF [--domains DIR] \
        [--domain UUID|XML] [--vgpu-type TYPE] [--go FILE]

The sysfs tree's kernel is ``kernel_sysfs.KernelSysfs`` (every worker on a
tree takes the tree's lock for each write, as the kernel serialises);
``attach`` talks to the file-backed ``fake_libvirt`` in ``--domains``.
Prints ``ready`` once set up (then waits for ``--go`` to exist), and one
JSON line: ``{"ok": bool, "error": class name, "message": ...}``.
"""

import argparse
import json
import os
import sys
import time

from libvirt_gpu import exception


def main(argv=None):
    from libvirt_gpu.guests import api
    from libvirt_gpu import conf as conf_mod
    from libvirt_gpu.guests import hook
    from tests.doubles import fake_libvirt
    from tests.doubles import kernel_sysfs

    p = argparse.ArgumentParser()
    p.add_argument('action', choices=('attach', 'prepare', 'release'))
    p.add_argument('--root', required=True)
    p.add_argument('--profile', required=True, help='profile JSON file')
    p.add_argument('--config', required=True)
    p.add_argument('--domains', help='fake libvirt directory (attach)')
    p.add_argument('--domain', help='domain UUID (attach) or XML file')
    p.add_argument('--vgpu-type')
    p.add_argument('--go', help='wait until this file exists, then start')
    args = p.parse_args(argv)
    sysfs = kernel_sysfs.KernelSysfs(args.root, args.profile)
    conf = conf_mod.load(args.config)     # before the start line: the race
    print('ready', flush=True)            # is about the allocation
    if args.go:
        while not os.path.exists(args.go):
            time.sleep(0.001)
    result = {'ok': True}
    try:
        if args.action == 'attach':
            conn = fake_libvirt.FakeConnection(args.domains)
            done = api.attach(conn, args.domain, vgpu_type=args.vgpu_type,
                              live=True, conf=conf, sysfs=sysfs)
            result['uuid'] = done.uuid
            result['parent'] = str(done.parent)
            result['domain'] = done.domain_uuid
        else:
            with open(args.domain, 'rb') as f:
                xml = f.read()
            rc = hook.run(['qemu', 'vm', args.action, 'begin', '-'], xml,
                          config_file=args.config, sysfs=sysfs)
            result['ok'] = rc == 0
            result['rc'] = rc
    except exception.LibvirtGpuError as e:
        result = {'ok': False, 'error': type(e).__name__, 'message': str(e)}
    print(json.dumps(result))
    sys.stdout.flush()
    return 0


if __name__ == '__main__':
    sys.exit(main())
