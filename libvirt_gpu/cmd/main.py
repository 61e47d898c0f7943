"""``libvirt-gpu``: the admin CLI that sits next to virsh.

Every command that reads the host takes the global source options:
``-c/--connect URI`` (libvirt only), ``--sysfs-root DIR`` (sysfs only), or
neither (libvirt at [libvirt]/connection_uri, falling back to sysfs at
[DEFAULT]/sysfs_root).  ``--json`` prints a document for scripts; otherwise a
table for people.  Errors go to stderr, exit status 1 (2 for usage).
"""

import argparse
import dataclasses
import logging
import sys

from libvirt_gpu import conf as conf_mod
from libvirt_gpu import discovery
from libvirt_gpu import exception
from libvirt_gpu import nvml
from libvirt_gpu import pci_classes
from libvirt_gpu import pciids
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

    def reset(self):
        """Forget the last discovery (the agent discovers every cycle)."""
        self._result = None

    @property
    def result(self):
        if self._result is None:
            self._result = discovery.discover(
                uri=self.args.connect, sysfs_root=self.args.sysfs_root,
                default_uri=self.conf.libvirt.connection_uri,
                default_sysfs_root=self.conf.sysfs_root,
                pci_ids=pciids.PciIds(self.conf.pci_ids_file),
                nvml=nvml.source(self.conf.gpu.nvml))
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
    ctx.say_source()
    if ctx.args.json:
        # A VF shows the setting of its physical GPU (it is used as a part
        # of it); its ``physfn`` names that GPU.
        documents = []
        for gpu in gpus:
            setting = enabled.get(gpu.physfn or gpu.address)
            document = output.gpu_to_json(gpu, setting)
            document['not_assignable'] = (
                model.pgpu_refusal(gpu)
                if setting is None and not gpu.is_vf else None)
            documents.append(document)
        print(output.dumps(documents))
        return 0
    rows = []
    notes = []
    for gpu in gpus:
        if gpu.is_vf:
            continue          # counted on its physical GPU's row (VFS)
        setting = enabled.get(gpu.address)
        refusal = model.pgpu_refusal(gpu) if setting is None else None
        if refusal:
            notes.append('%s: not offered whole: %s' % (gpu.address,
                                                        refusal))
        for member in gpu.iommu_members:
            if member.host_uses:
                notes.append(
                    '%s: IOMMU group %d also holds %s (%s, driver %s), '
                    'which the host uses' % (
                        gpu.address, gpu.iommu_group, member.address,
                        pci_classes.host_class_name(member.class_code),
                        member.driver))
        capacity = ('%d' % model.vgpu_total(gpu, setting)
                    if setting is not None else '0' if refusal else '1')
        vfs = None
        if gpu.virtfns:
            busy = sum(1 for vf in gpu.vf_gpus if vf.used_type_ids)
            vfs = '%d (%d used)' % (len(gpu.virtfns), busy)
        functions = gpu.functions
        rows.append([str(gpu.address), '%s:%s' % (gpu.vendor_id,
                                                  gpu.product_id),
                     gpu.product_name, gpu.driver, gpu.numa_node,
                     gpu.local_cpulist, gpu.iommu_group,
                     ','.join(str(m.address) for m in gpu.iommu_members
                              if m.address != gpu.address) or None,
                     'vgpu' if setting is not None else 'pgpu',
                     setting.type_id if setting is not None else None,
                     capacity, len(gpu.offered_types()),
                     sum(len(f.used_type_ids) for f in functions), vfs])
    print(output.table(['ADDRESS', 'ID', 'PRODUCT', 'DRIVER', 'NUMA',
                        'CPUS', 'IOMMU', 'GROUP MEMBERS', 'MODE',
                        'ENABLED TYPE', 'CAPACITY', 'TYPES', 'VGPUS', 'VFS'],
                       rows))
    for note in notes:
        print(note)
    if not gpus:
        print('no GPU (PCI class 0x03xxxx) found')
    return 0


def _gpu_types(gpu):
    """The types to show for ``gpu``: a VF's own; for a physical GPU every
    type of it and its VFs, ``available_instances`` being what the whole
    GPU can still take (not one VF's 0 or 1)."""
    if gpu.is_vf or not gpu.vf_gpus:
        return gpu.vgpu_types if gpu.is_vf else gpu.offered_types()
    from libvirt_gpu import objects
    shown = []
    for mtype in gpu.offered_types():
        used = sum(f.used_type_ids.count(mtype.id) for f in gpu.functions)
        total = model.vgpu_total(gpu, objects.EnabledType(mtype.id))
        shown.append(dataclasses.replace(
            mtype, available_instances=max(0, total - used)))
    return tuple(shown)


def cmd_types(ctx):
    if ctx.args.address:
        gpus = [ctx.result.gpu(ctx.args.address)]
    else:
        gpus = [g for g in ctx.result.gpus
                if not g.is_vf and g.offered_types()]
    ctx.say_source()
    if ctx.args.json:
        print(output.dumps({str(g.address): [output.type_to_json(t)
                                             for t in _gpu_types(g)]
                            for g in gpus}))
        return 0
    rows = []
    for gpu in gpus:
        for t in _gpu_types(gpu):
            rows.append([str(gpu.address), t.id, t.name, t.device_api,
                         t.available_instances, t.description])
    print(output.table(['GPU', 'TYPE', 'NAME', 'API', 'AVAILABLE',
                        'DESCRIPTION'], rows))
    if not rows:
        print('no vGPU types offered (is the GPU bound to a vGPU-capable '
              'driver such as nvidia? are its SR-IOV VFs enabled?)')
    return 0


def _tree(ctx):
    return model.build_tree(ctx.hostname, ctx.result.gpus, ctx.enabled,
                            ctx.conf.gpu.report_gpu_traits,
                            ctx.conf.gpu.pgpu_vendor_ids)


def cmd_placement_show(ctx):
    provider_tree = _tree(ctx)
    ctx.say_source()
    if ctx.args.json:
        print(output.dumps(provider_tree.to_dict()))
    else:
        print(output.provider_tree_text(provider_tree))
    return 0


def cmd_placement_sync(ctx):
    from libvirt_gpu import agent
    report = agent.sync_once(ctx.conf, url=ctx.args.url,
                             dry_run=ctx.args.dry_run, tree=_tree(ctx))
    if ctx.args.json:
        print(output.dumps(output.sync_report_to_json(report)))
    else:
        print(report.text())
    return 1 if report.failed else 0


def cmd_agent(ctx):
    from libvirt_gpu import agent

    def discover_tree():
        ctx.reset()
        return _tree(ctx)

    client = agent.make_client(ctx.conf, url=ctx.args.url)
    report = agent.run(ctx.conf, discover_tree, once=ctx.args.once,
                       client=client)
    return 1 if report is not None and report.failed else 0


def cmd_discover(ctx):
    gpus, enabled = ctx.result.gpus, ctx.enabled
    devices = cyborg.driver_devices(ctx.hostname, gpus, enabled,
                                    ctx.conf.gpu.report_gpu_traits,
                                    ctx.conf.gpu.pgpu_vendor_ids)
    ctx.say_source()
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
    if ctx.args.live:
        # Imported here: the FUSE binding is needed by this command only.
        from libvirt_gpu.cmd import simulate_live
        return simulate_live.run_live(
            ctx.args.profile, ctx.args.dir,
            busy_remove=ctx.args.busy_remove,
            uevents=not ctx.args.no_uevents,
            control_stdio=ctx.args.control_stdio, workdir=ctx.args.workdir,
            probe_delay=ctx.args.probe_delay)
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


# --- vGPU/pGPU lifecycle: attach, detach, domgpus, hook, reconcile -----------

def _flags(args):
    """virsh's --live/--config/--current -> (live, config)."""
    if args.current and (args.live or args.config):
        raise exception.InvalidInput(
            reason='--current cannot be combined with --live or --config')
    return args.live, args.config


def _uri(ctx):
    return ctx.args.connect or ctx.conf.libvirt.connection_uri


def _attachment_json(done):
    return {'domain_uuid': done.domain_uuid, 'domain': done.domain_name,
            'kind': done.kind, 'live': done.live, 'config': done.config,
            'uuid': done.uuid, 'type': done.type_id,
            'parent': str(done.parent) if done.parent else None,
            'address': str(done.address) if done.address else None,
            'note': done.note}


def _say_attachment(ctx, verb, done):
    if ctx.args.json:
        print(output.dumps(_attachment_json(done)))
        return
    where = ', '.join(w for w, on in (('live', done.live),
                                      ('config', done.config)) if on)
    if done.kind == 'vgpu':
        gpu = (str(done.parent) if done.parent else
               'GPU chosen at the next start')
        what = 'vGPU %s (%s on %s)' % (done.uuid, done.type_id or '?', gpu)
    else:
        what = 'GPU %s' % done.address
    print('%s %s %s %s (%s)' % (verb, what, 'to' if verb == 'attached'
                                else 'from', done.domain_name, where))
    if done.note:
        print('note: %s' % done.note)


def cmd_attach(ctx):
    from libvirt_gpu import api
    from libvirt_gpu import host as host_mod
    live, config = _flags(ctx.args)
    with host_mod.Host(_uri(ctx)) as host:
        done = api.attach(host, ctx.args.domain,
                          vgpu_type=ctx.args.vgpu_type,
                          address=ctx.args.address, parent=ctx.args.parent,
                          uuid=ctx.args.uuid, live=live, config=config,
                          conf=ctx.conf)
    _say_attachment(ctx, 'attached', done)
    return 0


def cmd_detach(ctx):
    from libvirt_gpu import api
    from libvirt_gpu import host as host_mod
    live, config = _flags(ctx.args)
    with host_mod.Host(_uri(ctx)) as host:
        done = api.detach(host, ctx.args.domain, uuid=ctx.args.uuid,
                          address=ctx.args.address,
                          vgpu_type=ctx.args.vgpu_type, live=live,
                          config=config, conf=ctx.conf)
    _say_attachment(ctx, 'detached', done)
    return 0


def cmd_domgpus(ctx):
    from libvirt_gpu import api
    from libvirt_gpu import host as host_mod
    with host_mod.Host(_uri(ctx)) as host:
        got = api.list_devices(host, ctx.args.domain,
                               inactive=ctx.args.inactive, conf=ctx.conf)
    if ctx.args.json:
        print(output.dumps({
            'domain_uuid': got.domain_uuid, 'domain': got.domain_name,
            'active': got.active, 'inactive_xml': got.inactive_xml,
            'vgpus': [{'uuid': v.uuid, 'type': v.type_id,
                       'parent': str(v.parent) if v.parent else None,
                       'in_metadata': v.in_metadata,
                       'in_devices': v.in_devices, 'exists': v.exists,
                       'lease': v.leased} for v in got.vgpus],
            'pgpus': [str(a) for a in got.pgpus]}))
        return 0
    print('domain %s (%s), %s; %s XML' % (
        got.domain_name, got.domain_uuid,
        'running' if got.active else 'shut off',
        'persistent' if got.inactive_xml else 'live'))
    rows = [['vgpu', v.uuid, v.type_id, v.parent,
             'yes' if v.exists else 'no', v.leased,
             'metadata' if v.in_metadata else 'hostdev only']
            for v in got.vgpus]
    rows += [['pgpu', None, None, a, None, None, None] for a in got.pgpus]
    print(output.table(['KIND', 'UUID', 'TYPE', 'GPU', 'EXISTS', 'LEASE',
                        'SOURCE'], rows))
    return 0


def cmd_hook_install(ctx):
    from libvirt_gpu import hook
    path, _ = conf_mod.config_path(ctx.args.config_file)
    done = hook.install(ctx.args.dir, path, python=ctx.args.python)
    if ctx.args.json:
        print(output.dumps({'path': done.path, 'python': done.python,
                            'config_file': done.config_file,
                            'settings_file': done.settings_file,
                            'restart_needed': done.restart_needed}))
        return 0
    print('installed %s (root-owned, mode 0755)' % done.path)
    print('  python:   %s -IS' % done.python)
    print('  config:   %s' % done.config_file)
    print('  settings: %s (rebuilt when the config or the GPUs change)'
          % done.settings_file)
    if done.restart_needed:
        print('libvirtd had no qemu hook when it started and only looks for '
              'hooks then: restart libvirtd (or send it SIGHUP) before '
              'starting guests with vGPUs')
    else:
        print('libvirtd already runs qemu hooks: nothing to restart')
    return 0


def cmd_reconcile(ctx):
    from libvirt_gpu import host as host_mod
    from libvirt_gpu import reconcile
    from libvirt_gpu import state
    from libvirt_gpu import sysfs as sysfs_mod
    with host_mod.Host(_uri(ctx)) as host:
        report = reconcile.reconcile(
            host, sysfs_mod.Sysfs(ctx.args.sysfs_root or ctx.conf.sysfs_root),
            state.LeaseStore(ctx.conf.state_dir), dry_run=ctx.args.dry_run)
    if ctx.args.json:
        print(output.dumps({'dry_run': report.dry_run, 'findings': [
            {'action': f.action, 'what': f.what, 'uuid': f.uuid,
             'parent': str(f.parent) if f.parent else None,
             'type': f.type_id, 'domain_uuid': f.domain_uuid,
             'reason': f.reason} for f in report.findings]}))
    else:
        print(output.table(['ACTION', 'WHAT', 'UUID', 'GPU', 'TYPE',
                            'REASON'],
                           [[f.action, f.what, f.uuid, f.parent, f.type_id,
                             f.reason] for f in report.findings]))
        if not report.findings:
            print('nothing to do: every vGPU and lease is accounted for')
    return 3 if report.stuck else 0


def cmd_restore(ctx):
    from libvirt_gpu import restore
    from libvirt_gpu import sysfs as sysfs_mod
    root = ctx.args.sysfs_root or ctx.conf.sysfs_root
    sysfs = sysfs_mod.Sysfs(root)
    state_dir = ctx.conf.state_dir
    owner = None
    if not ctx.args.no_libvirt:
        owner = restore.lease_owner_check(state_dir, _uri(ctx))
    report = restore.restore(
        sysfs, state_dir,
        vf_pfs=restore.vf_targets(ctx.conf, sysfs, state_dir),
        mdevctl_dir=ctx.args.mdevctl_dir, owner_running=owner,
        sriov_manage=restore.sriov_manage_for(root, ctx.args.sriov_manage),
        settle_timeout=ctx.args.settle_timeout)
    if ctx.args.json:
        print(output.dumps(report.to_json()))
    else:
        print(output.table(['ACTION', 'WHAT', 'TARGET', 'DETAIL'],
                           [[a.action, a.what, a.target, a.detail]
                            for a in report.actions]))
        print('%d change(s), %d failure(s)' % (len(report.changed),
                                               len(report.failed)))
    return 1 if report.failed else 0


def _add_restore_command(add):
    p = add('restore', cmd_restore, 'after a reboot: enable the SR-IOV VFs '
            'of vGPU GPUs, re-create persistent vGPUs (mdevctl definitions, '
            'our vendor-interface state), reset stale ones; a second run '
            'changes nothing (exit status 1 when something failed)')
    p.add_argument('--mdevctl-dir', default='/etc/mdevctl.d',
                   help='where mdevctl keeps its definitions (default: '
                        '%(default)s)')
    p.add_argument('--sriov-manage', default='auto', metavar='PATH',
                   help='how to enable VFs: NVIDIA\'s sriov-manage script '
                        'at PATH, "none" to write sriov_numvfs, or "auto" '
                        '(default): /usr/lib/nvidia/sriov-manage on the real '
                        '/sys when it is installed, else sriov_numvfs')
    p.add_argument('--settle-timeout', type=float, default=30.0,
                   metavar='SECONDS',
                   help='how long to wait for enabled VFs to show their vGPU '
                        'interface (default: %(default)s)')
    p.add_argument('--no-libvirt', action='store_true',
                   help='do not ask libvirt which guests run (then no stale '
                        'vGPU is reset)')


def _add_lifecycle_commands(sub, add):
    def flags(p):
        p.add_argument('--live', action='store_true',
                       help='affect the running domain')
        p.add_argument('--config', action='store_true',
                       help='affect the persistent configuration (next '
                            'boot)')
        p.add_argument('--current', action='store_true',
                       help='affect the current state: live when running, '
                            'config otherwise (the default)')

    p = add('attach', cmd_attach, 'give a domain a vGPU (--vgpu-type) or a '
            'whole GPU (--address), like virsh attach-device')
    p.add_argument('domain', metavar='DOMAIN', help='domain name or UUID')
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument('--vgpu-type', metavar='TYPE',
                      help='an enabled vGPU type, e.g. nvidia-223')
    what.add_argument('--address', metavar='ADDRESS',
                      help='PCI address of a whole GPU, e.g. 0000:3b:00.0')
    p.add_argument('--parent', metavar='ADDRESS',
                   help='the GPU to slice the vGPU from (default: the '
                        'enabled GPU with the most room)')
    p.add_argument('--uuid', metavar='UUID',
                   help='UUID of the new vGPU (default: a random one)')
    flags(p)
    p = add('detach', cmd_detach, 'take a vGPU or a whole GPU from a domain')
    p.add_argument('domain', metavar='DOMAIN', help='domain name or UUID')
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument('--uuid', metavar='UUID', help='the vGPU\'s UUID')
    what.add_argument('--vgpu-type', metavar='TYPE',
                      help='the domain\'s only vGPU of this type')
    what.add_argument('--address', metavar='ADDRESS',
                      help='PCI address of a whole GPU')
    flags(p)
    p = add('domgpus', cmd_domgpus, 'list the vGPUs and GPUs a domain holds')
    p.add_argument('domain', metavar='DOMAIN', help='domain name or UUID')
    p.add_argument('--inactive', action='store_true',
                   help='read the persistent configuration')
    hook_p = sub.add_parser('hook', help='the libvirt qemu hook',
                            description='The libvirt qemu hook.')
    hsub = hook_p.add_subparsers(dest='hook_command', metavar='SUBCOMMAND')
    hsub.required = True
    p = hsub.add_parser('install', help='install the hook into '
                        'DIR/qemu.d/libvirt-gpu (root-owned, 0755)',
                        description='Install the hook into '
                        'DIR/qemu.d/libvirt-gpu with this Python and the '
                        'configuration file baked in; say whether libvirtd '
                        'must be restarted to find it.')
    p.add_argument('--dir', default='/etc/libvirt/hooks',
                   help='libvirt hooks directory (default: %(default)s)')
    p.add_argument('--python', metavar='PATH',
                   help='interpreter for the hook (default: this one)')
    p.add_argument('--json', action='store_true', help='print JSON')
    p.set_defaults(func=cmd_hook_install)
    p = add('reconcile', cmd_reconcile, 'find and remove vGPUs and leases '
            'that no domain uses after crashes; report stuck ones (exit '
            'status 3)')
    p.add_argument('--dry-run', action='store_true',
                   help='only report what would be done')


# Defaults of the live tree, kept equal to simulator.kernel.BUSY_MODES and
# simulator.live.PROBE_DELAY by a test (importing the simulator here would
# cost every command ~60 ms).
LIVE_BUSY_MODES = ('block', 'ebusy')
LIVE_PROBE_DELAY = 0.1


def add_live_arguments(group):
    """Options of ``simulate --live`` (also ``cmd.simulate_live``)."""
    group.add_argument('--busy-remove', choices=LIVE_BUSY_MODES,
                       default=None,
                       help='removing an mdev a guest uses: block until it '
                            'is released (kernel >= 5.16) or answer EBUSY '
                            '(older kernels); default: the profile\'s '
                            'busy_remove, else block')
    group.add_argument('--no-uevents', action='store_true',
                       help='do not broadcast udev events (libvirtd then '
                            'never learns of new or removed mdevs)')
    group.add_argument('--control-stdio', action='store_true',
                       help='read control commands on stdin (busy UUID, '
                            'idle UUID, state, sent, uevents on|off, quit) '
                            'and stop when it closes')
    group.add_argument('--probe-delay', type=float, default=LIVE_PROBE_DELAY,
                       metavar='SECONDS',
                       help='how long a successful create takes after its '
                            'add uevent (the vendor driver probing the new '
                            'vGPU; default %(default)s)')
    group.add_argument('--workdir', default=None,
                       help='where the private backing tree is made '
                            '(default: /dev/shm)')


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
    sync = psub.add_parser(
        'sync', help='make Placement match this host once',
        description='Create or update this host\'s providers in Placement '
        '(inventories, traits), remove those of GPUs that are gone (kept '
        'with reserved = total while they have allocations). Auth comes '
        'from [placement] (keystoneauth options); --url with no auth_type '
        'talks to a noauth2 Placement.')
    sync.add_argument('--url', help='Placement endpoint (overrides the '
                      'catalog / [placement]/endpoint_override)')
    sync.add_argument('--dry-run', action='store_true',
                      help='read Placement, print the requests a sync would '
                           'send, send no write')
    sync.add_argument('--json', action='store_true', help='print JSON')
    sync.set_defaults(func=cmd_placement_sync)
    agent_help = ('discover and sync to Placement every '
                  '[agent]/sync_interval seconds; survives Placement outages')
    p = sub.add_parser('agent', help=agent_help, description=agent_help)
    p.set_defaults(func=cmd_agent, json=False)
    p.add_argument('--once', action='store_true',
                   help='one cycle, then exit (non-zero on failure)')
    p.add_argument('--url', help='Placement endpoint (overrides the '
                   'catalog / [placement]/endpoint_override)')
    p = add('simulate', cmd_simulate, 'write a simulated host: a sysfs-shaped '
            'tree in DIR and the libvirt test-driver XML DIR/node.xml')
    p.add_argument('profile', nargs='?', metavar='PROFILE',
                   help='bundled profile name (see --list) or a JSON file')
    p.add_argument('dir', nargs='?', metavar='DIR',
                   help='directory that stands in for /sys')
    p.add_argument('--list', dest='list_profiles', action='store_true',
                   help='list the bundled profiles')
    add_live_arguments(p.add_argument_group(
        'live tree', 'With --live, DIR is a mount point: a FUSE filesystem '
        'answers writes the way the kernel does (create/remove of mdevs '
        'with its error numbers, udev events) until SIGINT/SIGTERM. Needs '
        'root and /dev/fuse. Bind it over /sys parts in a private mount '
        'namespace to show it to libvirtd or mdevctl.'))
    p.add_argument('--live', action='store_true',
                   help='serve a live tree at DIR instead of writing files')
    _add_lifecycle_commands(sub, add)
    _add_restore_command(add)
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
