"""The commands that repair the host: ``reconcile`` (what crashes leave
behind) and ``restore`` (after a reboot)."""

import os

from libvirt_gpu import exception
from libvirt_gpu.cmd import output


def cmd_reconcile(ctx):
    from libvirt_gpu.virt import host as host_mod
    from libvirt_gpu.guests import reconcile
    _check_dir_option('--mdevctl-dir', ctx.args.mdevctl_dir)
    with host_mod.Host(ctx.libvirt_uri()) as host:
        env = ctx.environment(host)
        report = reconcile.reconcile(
            env, dry_run=ctx.args.dry_run, covered=set(env.enabled),
            on_plan=lambda plan: output.emit_removal_plan(
                plan, as_json=ctx.args.json))
    output.emit_report(report, as_json=ctx.args.json)
    return 3 if report.stuck else 0


def cmd_restore(ctx):
    from libvirt_gpu.host import restore
    _check_dir_option('--mdevctl-dir', ctx.args.mdevctl_dir)
    env = ctx.environment()
    owner = vf_user = leftovers = None
    if not ctx.args.no_libvirt:
        owner = restore.lease_owner_check(env.state_dir, ctx.libvirt_uri())
        vf_user = restore.vf_user_check(ctx.libvirt_uri())
        leftovers = _leftovers(env, ctx.libvirt_uri())
    report = restore.restore(
        env, vf_pfs=restore.vf_targets(env), owner_running=owner,
        vf_in_use=vf_user, leftovers=leftovers,
        sriov_manage=restore.sriov_manage_for(env.sysfs_root,
                                              ctx.args.sriov_manage),
        settle_timeout=ctx.args.settle_timeout, dry_run=ctx.args.dry_run)
    output.emit_report(report, as_json=ctx.args.json)
    return 1 if report.failed else 0


def _leftovers(env, uri):
    """restore's step 5 on this host: ``reconcile.leftovers`` with
    libvirt at ``uri``, at boot, its findings as restore's actions."""
    from libvirt_gpu.guests import reconcile
    from libvirt_gpu.host import restore
    actions = {reconcile.REMOVED: restore.UNDEFINED,
               reconcile.WOULD_REMOVE: restore.WOULD,
               reconcile.KEPT: restore.SKIPPED,
               reconcile.STUCK: restore.FAILED,
               reconcile.CONFLICT: restore.FAILED}

    def check(dry_run):
        from libvirt_gpu.virt import host as host_mod
        with host_mod.Host(uri) as host:
            report = reconcile.leftovers(env.replace(host=host),
                                         dry_run=dry_run, boot=True)
        return [restore.Action(actions.get(f.action, restore.SKIPPED),
                               'vgpu', f.uuid, _detail(f))
                for f in report.findings]
    return check


def _detail(finding):
    where = (' (%s on %s)' % (finding.type_id, finding.parent)
             if finding.parent else '')
    return '%s: %s%s' % (finding.what, finding.reason, where)


def _check_dir_option(option, path):
    """An option naming a directory that exists as something else: say so
    in one line instead of failing deep inside the command."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise exception.InvalidInput(
            reason='%s %s is not a directory; name a directory'
            % (option, path))


# --- parsers -----------------------------------------------------------------

def _reconcile_parser(sub, add):
    p = add('reconcile', cmd_reconcile, 'find and remove vGPUs and leases '
            'that no domain uses after crashes; report stuck ones (exit '
            'status 3) and list the reservations of incoming live '
            'migrations (kept until they expire). It removes devices: run '
            'with --dry-run first. Only '
            'vGPUs we leased, or on GPUs the configuration enables, are '
            'touched; it needs a libvirt that knows the host\'s domains '
            '(not test:///)')
    p.add_argument('--dry-run', action='store_true',
                   help='only report what would be done (run this first)')
    p.add_argument('--mdevctl-dir', default='/etc/mdevctl.d',
                   help='where mdevctl (and libvirt through it) keeps '
                        'persistent vGPU definitions (default: %(default)s)')


def _restore_parser(sub, add):
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
                        'vGPU is reset, and no VF carved for Nova that the '
                        'configuration no longer carves)')
    p.add_argument('--dry-run', action='store_true',
                   help='show what would be written (VFs enabled, vGPUs '
                        'created or reset); write nothing')


PARSERS = {'reconcile': _reconcile_parser, 'restore': _restore_parser}
