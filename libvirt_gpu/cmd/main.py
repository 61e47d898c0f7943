"""``libvirt-gpu``: the admin CLI that sits next to virsh.

Every command that reads the host takes the global source options:
``-c/--connect URI`` (libvirt only), ``--sysfs-root DIR`` (sysfs only), or
neither (libvirt at [libvirt]/connection_uri, falling back to sysfs at
[DEFAULT]/sysfs_root).  ``--json`` prints a document for scripts; otherwise a
table for people.  Errors go to stderr, exit status 1 (2 for usage).
"""

import argparse
import logging
import sys

from libvirt_gpu import conf as conf_mod
from libvirt_gpu import discovery
from libvirt_gpu import exception
from libvirt_gpu.cmd import output
from libvirt_gpu.conf import vgpu as vgpu_conf
from libvirt_gpu.placement import cyborg
from libvirt_gpu.placement import model

PROG = 'libvirt-gpu'

EPILOG = """
examples:
  libvirt-gpu list                          GPUs, their mode and vGPU capacity
  libvirt-gpu types 0000:af:00.0            vGPU types one GPU offers
  libvirt-gpu placement show --json         the Placement provider tree
  libvirt-gpu simulate t4 /tmp/sim          write a simulated T4 host
  libvirt-gpu --sysfs-root /tmp/sim list    read it back

configuration: /etc/libvirt-gpu/libvirt-gpu.conf, or the file named by
$LIBVIRT_GPU_CONFIG, or --config-file.
"""


class Context(object):
    """What a command needs: parsed config and, on demand, discovery."""

    def __init__(self, args):
        self.args = args
        self.conf = conf_mod.load(args.config_file)
        self._result = None

    @property
    def result(self):
        if self._result is None:
            self._result = discovery.discover(
                uri=self.args.connect, sysfs_root=self.args.sysfs_root,
                default_uri=self.conf.libvirt.connection_uri,
                default_sysfs_root=self.conf.sysfs_root)
        return self._result

    @property
    def enabled(self):
        return vgpu_conf.resolve(self.conf, self.result.gpus)

    @property
    def hostname(self):
        return self.args.hostname or self.conf.host

    def say_source(self):
        where = (self.args.connect or self.conf.libvirt.connection_uri
                 if self.result.source == 'libvirt' else
                 self.args.sysfs_root or self.conf.sysfs_root)
        print('source: %s (%s)' % (self.result.source, where),
              file=sys.stderr if self.args.json else sys.stdout)


def cmd_list(ctx):
    enabled = ctx.enabled
    gpus = ctx.result.gpus
    if ctx.args.json:
        ctx.say_source()
        print(output.dumps([output.gpu_to_json(g, enabled.get(g.address))
                            for g in gpus]))
        return 0
    ctx.say_source()
    rows = []
    for gpu in gpus:
        setting = enabled.get(gpu.address)
        capacity = ('%d' % model.vgpu_total(gpu, setting)
                    if setting is not None else '1')
        rows.append([str(gpu.address), '%s:%s' % (gpu.vendor_id,
                                                  gpu.product_id),
                     gpu.product_name, gpu.driver, gpu.numa_node,
                     gpu.iommu_group,
                     'vgpu' if setting is not None else 'pgpu',
                     setting.type_id if setting is not None else None,
                     capacity, len(gpu.mdev_types), len(gpu.mdevs)])
    print(output.table(['ADDRESS', 'ID', 'PRODUCT', 'DRIVER', 'NUMA',
                        'IOMMU', 'MODE', 'ENABLED TYPE', 'CAPACITY', 'TYPES',
                        'MDEVS'], rows))
    if not gpus:
        print('no GPU (PCI class 0x03xxxx) found')
    return 0


def cmd_types(ctx):
    if ctx.args.address:
        gpus = [ctx.result.gpu(ctx.args.address)]
    else:
        gpus = [g for g in ctx.result.gpus if g.mdev_types]
    if ctx.args.json:
        print(output.dumps({str(g.address): [output.type_to_json(t)
                                             for t in g.mdev_types]
                            for g in gpus}))
        return 0
    rows = []
    for gpu in gpus:
        for t in gpu.mdev_types:
            rows.append([str(gpu.address), t.id, t.name, t.device_api,
                         t.available_instances, t.description])
    print(output.table(['GPU', 'TYPE', 'NAME', 'API', 'AVAILABLE',
                        'DESCRIPTION'], rows))
    if not rows:
        print('no vGPU types offered (is the GPU bound to a vGPU-capable '
              'driver such as nvidia?)')
    return 0


def _tree(ctx):
    return model.build_tree(ctx.hostname, ctx.result.gpus, ctx.enabled,
                            ctx.conf.gpu.report_gpu_traits,
                            ctx.conf.gpu.pgpu_vendor_ids)


def cmd_placement_show(ctx):
    provider_tree = _tree(ctx)
    if ctx.args.json:
        print(output.dumps(provider_tree.to_dict()))
    else:
        print(output.provider_tree_text(provider_tree))
    return 0


def cmd_discover(ctx):
    gpus, enabled = ctx.result.gpus, ctx.enabled
    devices = cyborg.driver_devices(ctx.hostname, gpus, enabled,
                                    ctx.conf.gpu.report_gpu_traits,
                                    ctx.conf.gpu.pgpu_vendor_ids)
    document = {
        'agent_report': cyborg.agent_report(gpus, enabled),
        'driver_devices': [cyborg.to_dict(d) for d in devices],
    }
    if ctx.args.json:
        print(output.dumps(document))
        return 0
    rows = []
    for device in devices:
        for dep in device.deployables:
            attrs = {a.key: a.value for a in dep.attributes}
            rows.append([dep.name, device.vendor, device.model, attrs['rc'],
                         dep.num_accelerators,
                         ','.join(sorted({h.attach_type
                                          for h in dep.attach_handles}))])
    print(output.table(['DEPLOYABLE', 'VENDOR', 'MODEL', 'RC', 'COUNT',
                        'ATTACH'], rows))
    return 0


def cmd_simulate(ctx):
    from libvirt_gpu import simulator
    if ctx.args.list_profiles:
        for name in simulator.list_profiles():
            print(name)
        return 0
    if not ctx.args.profile or not ctx.args.dir:
        raise exception.InvalidInput(
            reason='simulate needs PROFILE and DIR (or --list)')
    profile = simulator.load_profile(ctx.args.profile)
    node_xml = simulator.write_host(profile, ctx.args.dir)
    if ctx.args.json:
        print(output.dumps({'profile': profile.name,
                            'sysfs_root': ctx.args.dir,
                            'node_xml': node_xml,
                            'test_uri': 'test://%s' % node_xml}))
    else:
        print('wrote simulated host %r to %s' % (profile.name, ctx.args.dir))
        print('  sysfs:  libvirt-gpu --sysfs-root %s list' % ctx.args.dir)
        print('  libvirt: libvirt-gpu -c test://%s list' % node_xml)
    return 0


def build_parser():
    parser = argparse.ArgumentParser(
        prog=PROG, description='Hand NVIDIA GPUs and vGPUs to libvirt/KVM '
        'guests and report them the way OpenStack Placement expects.',
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('-c', '--connect', metavar='URI',
                        help='discover through libvirt at URI only '
                             '(default: [libvirt]/connection_uri, with '
                             'sysfs as fallback)')
    parser.add_argument('--sysfs-root', metavar='DIR',
                        help='discover by reading sysfs at DIR only '
                             '(default: [DEFAULT]/sysfs_root = /sys)')
    parser.add_argument('--config-file', metavar='FILE',
                        help='configuration file (default: '
                             '$LIBVIRT_GPU_CONFIG or %s)'
                             % conf_mod.DEFAULT_CONFIG_FILE)
    parser.add_argument('--hostname', help='host name used in Placement '
                        '(default: [DEFAULT]/host)')
    parser.add_argument('--debug', action='store_true',
                        help='log debug messages and show tracebacks')
    sub = parser.add_subparsers(dest='command', metavar='COMMAND')
    sub.required = True

    def add(name, func, help_text, **kwargs):
        p = sub.add_parser(name, help=help_text, description=help_text,
                           **kwargs)
        p.add_argument('--json', action='store_true',
                       help='print JSON for scripts')
        p.set_defaults(func=func)
        return p

    add('list', cmd_list, 'list GPUs: address, ids, driver, NUMA node, '
        'IOMMU group, pGPU/vGPU mode, capacity')
    p = add('types', cmd_types, 'list the vGPU (mdev) types GPUs offer')
    p.add_argument('address', nargs='?', metavar='ADDRESS',
                   help='only this GPU (PCI address, e.g. 0000:af:00.0)')
    add('discover', cmd_discover, 'the Cyborg view: agent-driver report and '
        'driver objects')
    placement = sub.add_parser('placement', help='the Placement provider '
                               'tree', description='The Placement provider '
                               'tree of this host.')
    psub = placement.add_subparsers(dest='placement_command',
                                    metavar='SUBCOMMAND')
    psub.required = True
    show = psub.add_parser('show', help='print the provider tree '
                           '(inventories and traits)')
    show.add_argument('--json', action='store_true', help='print JSON')
    show.set_defaults(func=cmd_placement_show)
    p = add('simulate', cmd_simulate, 'write a simulated host: a sysfs-shaped '
            'tree in DIR and the libvirt test-driver XML DIR/node.xml')
    p.add_argument('profile', nargs='?', metavar='PROFILE',
                   help='bundled profile name (see --list) or a JSON file')
    p.add_argument('dir', nargs='?', metavar='DIR',
                   help='directory that stands in for /sys')
    p.add_argument('--list', dest='list_profiles', action='store_true',
                   help='list the bundled profiles')
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else
                        logging.WARNING, format='%(levelname)s: %(message)s')
    try:
        ctx = Context(args)
        return args.func(ctx)
    except exception.LibvirtGpuError as e:
        print('%s: error: %s' % (PROG, e), file=sys.stderr)
        if args.debug:
            raise
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `libvirt-gpu list | head`: the reader left; not an error.
        sys.stderr.close()
        return 0


if __name__ == '__main__':
    sys.exit(main())
