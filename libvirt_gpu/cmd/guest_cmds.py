"""The commands that act on a guest: ``attach``, ``detach`` and ``domgpus``
(a vGPU or a whole GPU, like virsh), and ``migrate``."""

from libvirt_gpu import exception
from libvirt_gpu.cmd import output


def _flags(args):
    """virsh's --live/--config/--current -> (live, config)."""
    if args.current and (args.live or args.config):
        raise exception.InvalidInput(
            reason='--current cannot be combined with --live or --config')
    return args.live, args.config


def _say_attachment(ctx, verb, done):
    if ctx.args.json:
        output.emit_json(output.attachment_to_json(done))
    else:
        output.emit_text(output.attachment_text(verb, done))


def cmd_attach(ctx):
    from libvirt_gpu.guests import api
    from libvirt_gpu.virt import host as host_mod
    live, config = _flags(ctx.args)
    with host_mod.Host(ctx.libvirt_uri()) as host:
        done = api.attach(ctx.environment(host), ctx.args.domain,
                          vgpu_type=ctx.args.vgpu_type,
                          address=ctx.args.address, parent=ctx.args.parent,
                          uuid=ctx.args.uuid, live=live, config=config)
    _say_attachment(ctx, 'attached', done)
    return 0


def cmd_detach(ctx):
    from libvirt_gpu.guests import api
    from libvirt_gpu.virt import host as host_mod
    live, config = _flags(ctx.args)
    # With libvirt's event loop: a live detach waits for the guest's
    # device-removed event before it removes the vGPU.
    with host_mod.Host(ctx.libvirt_uri(), events=True) as host:
        done = api.detach(ctx.environment(host), ctx.args.domain,
                          uuid=ctx.args.uuid, address=ctx.args.address,
                          vgpu_type=ctx.args.vgpu_type, live=live,
                          config=config)
    _say_attachment(ctx, 'detached', done)
    return 0


def cmd_domgpus(ctx):
    from libvirt_gpu.guests import api
    from libvirt_gpu.virt import host as host_mod
    with host_mod.Host(ctx.libvirt_uri()) as host:
        env = ctx.environment(host)
        got = api.list_devices(env, ctx.args.domain,
                               inactive=ctx.args.inactive)
    # each vGPU's route: its parent's physical GPU's (None: no parent known)
    routes = {v.uuid: env.routes.route_of_parent(env.sysfs, v.parent)
              for v in got.vgpus if v.parent is not None}
    if ctx.args.json:
        output.emit_json(output.domain_devices_to_json(got, routes))
    else:
        output.emit_text(output.domain_devices_text(got, routes))
    return 0


def _stamp(ctx, host, nvml):
    """``migrate --stamp``: NVIDIA's metadata written, nothing moved."""
    from libvirt_gpu.guests import migration
    from libvirt_gpu.virt import guest as guest_mod
    guest = guest_mod.Guest(host.lookup_domain(ctx.args.domain))
    meta = migration.stamp(guest, nvml)
    if meta is None:
        _, meta = guest.devices()
    written = [e for e in meta.vgpus if e.driver_metadata]
    if ctx.args.json:
        output.emit_json({'domain': guest.name, 'stamped': [
            str(e.uuid) for e in written]})
    else:
        output.emit_text('%s: NVIDIA\'s metadata of %d of %d vGPU(s) in its '
                         'live metadata' % (guest.name, len(written),
                                            len(meta.vgpus)))
    return 0 if written or not meta.vgpus else 1


def cmd_migrate(ctx):
    from libvirt_gpu.guests import api
    from libvirt_gpu.virt import host as host_mod
    as_json = ctx.args.json

    def show(plan):
        if not as_json:
            output.emit_text(output.migration_checks_text(plan))

    def progress(stats):
        if not as_json:
            output.emit_progress(output.migration_progress_text(stats))

    with host_mod.Host(ctx.libvirt_uri()) as host:
        # this host's NVML: NVIDIA's metadata of the guest's vGPUs
        env = ctx.environment(host)
        nvml = env.nvml
        if ctx.args.stamp:
            return _stamp(ctx, host, nvml)
        # A refused check raises MigrationRefused (exit status 1) after
        # ``show`` printed every check.
        done = api.migrate(host, ctx.args.domain, ctx.args.dest_uri,
                           dry_run=ctx.args.dry_run, progress=progress,
                           on_plan=show, migrate_uri=ctx.args.migrate_uri,
                           nvml=nvml, sysfs=env.sysfs)
    if as_json:
        output.emit_json(output.migration_to_json(done))
    if done.outcome is None:                        # --dry-run
        return 0 if done.plan.ok else 1
    if not as_json:
        output.end_progress()
        output.emit_text(output.migration_outcome_text(done.plan,
                                                       done.outcome))
    return 0 if done.outcome.done else 130


# --- parsers -----------------------------------------------------------------

def _flag_arguments(p):
    p.add_argument('--live', action='store_true',
                   help='affect the running domain')
    p.add_argument('--config', action='store_true',
                   help='affect the persistent configuration (next '
                        'boot)')
    p.add_argument('--current', action='store_true',
                   help='affect the current state: live when running, '
                        'config otherwise (the default)')


def _attach_parser(sub, add):
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
    _flag_arguments(p)


def _detach_parser(sub, add):
    p = add('detach', cmd_detach, 'take a vGPU or a whole GPU from a domain')
    p.add_argument('domain', metavar='DOMAIN', help='domain name or UUID')
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument('--uuid', metavar='UUID', help='the vGPU\'s UUID')
    what.add_argument('--vgpu-type', metavar='TYPE',
                      help='the domain\'s only vGPU of this type')
    what.add_argument('--address', metavar='ADDRESS',
                      help='PCI address of a whole GPU')
    _flag_arguments(p)


def _domgpus_parser(sub, add):
    p = add('domgpus', cmd_domgpus, 'list the vGPUs and GPUs a domain holds')
    p.add_argument('domain', metavar='DOMAIN', help='domain name or UUID')
    p.add_argument('--inactive', action='store_true',
                   help='read the persistent configuration')


def _migrate_parser(sub, add):
    p = add('migrate', cmd_migrate, 'migrate a running guest with its '
            'vGPUs live to another host (checks first: libvirt >= 8.6 and '
            'QEMU >= 8.1 on both, room for each vGPU type there); Ctrl-C '
            'aborts')
    p.add_argument('domain', metavar='DOMAIN', help='name or UUID')
    p.add_argument('dest_uri', metavar='DEST_URI',
                   help='the destination\'s libvirt URI, opened by this '
                        'command and by the source\'s libvirtd, e.g. '
                        'qemu+ssh://host2/system')
    what = p.add_mutually_exclusive_group()
    what.add_argument('--dry-run', action='store_true',
                      help='only run the checks and print them')
    what.add_argument('--stamp', action='store_true',
                      help='only write NVIDIA\'s metadata of the guest\'s '
                           'vGPUs (read by this host\'s NVML) into its live '
                           'metadata, for a `virsh migrate` to carry to the '
                           'destination\'s check; nothing is migrated')
    p.add_argument('--migrate-uri', metavar='URI',
                   help='where the guest\'s memory goes, e.g. '
                        'tcp://10.0.0.2:49152 (a migration network); by '
                        'default the destination\'s host name, as its '
                        'libvirtd reports it')


PARSERS = {'attach': _attach_parser, 'detach': _detach_parser,
           'domgpus': _domgpus_parser, 'migrate': _migrate_parser}
