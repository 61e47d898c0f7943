"""``layout plan`` and ``layout apply``: bring the GPUs to the layouts of
the configuration (``[gpu]/layouts``; docs/admin/layouts.md)."""

from libvirt_gpu.cmd import output


def _progress(result):
    """One line per step on stderr as it ends (stdout keeps the report)."""
    output.emit_note('%s %s %s: %s' % (result.status, result.address,
                                       result.action, result.detail),
                     as_json=True)


def _run(ctx, dry_run):
    from libvirt_gpu.host import layout_apply
    from libvirt_gpu.host import restore
    from libvirt_gpu import objects
    only = None
    if getattr(ctx.args, 'gpu', None):
        only = objects.PciAddress.parse(ctx.args.gpu)
    env = ctx.environment()
    report = layout_apply.converge(
        env.layouts, env.discovered.gpus, env.nvml, env.sysfs, env.state_dir,
        layout_apply.layout_kinds(env.vgpus),
        holders=layout_apply.lease_holders(env.store, _domain_names(ctx)),
        only=only, dry_run=dry_run,
        progress=None if dry_run else _progress,
        sriov_manage=restore.sriov_manage_for(env.sysfs_root,
                                              ctx.args.sriov_manage),
        lock_timeout=ctx.args.wait)
    output.emit_report(report, as_json=ctx.args.json)
    return 1 if report.failed else 0


def _domain_names(ctx):
    """``{Uuid: name}`` of libvirt's domains, for refusals that name who
    uses a GPU; empty when libvirt cannot be asked."""
    from libvirt_gpu import exception
    from libvirt_gpu import objects
    from libvirt_gpu.virt import host as host_mod
    try:
        with host_mod.Host(ctx.libvirt_uri(), read_only=True) as h:
            return {objects.Uuid.parse(d.UUIDString()): d.name()
                    for d in h.list_domains()}
    except exception.LibvirtGpuError:
        return {}


def cmd_layout_plan(ctx):
    return _run(ctx, dry_run=True)


def cmd_layout_apply(ctx):
    return _run(ctx, dry_run=False)


# --- parsers -----------------------------------------------------------------

def _seconds(text):
    """``--wait``: seconds from 0 to 3600, in ASCII digits."""
    import argparse
    whole, dot, part = text.partition('.')
    if not (whole + part).isascii() or not (whole + part).isdigit() \
            or len(text) > 12 or not 0 <= float(text) <= 3600:
        raise argparse.ArgumentTypeError(
            '%r is not a number of seconds from 0 to 3600' % text)
    return float(text)


_SRIOV_HELP = ('how to enable VFs: NVIDIA\'s sriov-manage script at PATH, '
               '"none" to write sriov_numvfs, or "auto" (default): '
               '/usr/lib/nvidia/sriov-manage on the real /sys when it is '
               'installed, else sriov_numvfs')


def _layout_parser(sub, add):
    layout = sub.add_parser(
        'layout', help='bring GPUs to their configured layouts (MIG, GPU '
        'instances, mixed sizes, the vGPU scheduler)',
        description='Each GPU of a [layout_<name>] section: its MIG mode, '
        'VFs, MIG GPU instances, mixed-size mode and vGPU scheduler, '
        'changed in the order NVIDIA\'s driver needs. Only what differs is '
        'changed; a GPU that holds vGPUs is left alone (the refusal names '
        'the domains). Run `layout plan` first.')
    lsub = layout.add_subparsers(dest='layout_command', metavar='SUBCOMMAND')
    lsub.required = True
    plan = lsub.add_parser(
        'plan', help='print the steps that would bring each GPU to its '
        'layout, and the nvidia module option for the schedulers',
        description='Read each GPU of a layout (NVML, sysfs) and print the '
        'steps `layout apply` would run, in order; nothing is changed. '
        'Also prints the nvidia module option (RmPVMRL) that sets the '
        'schedulers at module load, for operators who want that instead.')
    apply = lsub.add_parser(
        'apply', help='run those steps (a second run does nothing)',
        description='Run the steps of `layout plan`, one progress line per '
        'step on stderr. The first failure stops the run: it says what was '
        'done and what is left, and the next run goes on from there '
        '(exit status 1).')
    apply.add_argument('--gpu', metavar='ADDRESS',
                       help='only the GPU at ADDRESS (0000:41:00.0)')
    for p, func in ((plan, cmd_layout_plan), (apply, cmd_layout_apply)):
        p.add_argument('--json', action='store_true', help='print JSON for '
                       'scripts')
        p.add_argument('--sriov-manage', default='auto', metavar='PATH',
                       help=_SRIOV_HELP)
        p.add_argument('--wait', type=_seconds, default=60.0,
                       metavar='SECONDS',
                       help='how long to wait while another `layout apply` '
                       'or `restore` changes the GPUs (default 60)')
        p.set_defaults(func=func)
    plan.set_defaults(gpu=None)


PARSERS = {'layout': _layout_parser}
