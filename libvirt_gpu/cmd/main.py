"""``libvirt-gpu``: the admin CLI that sits next to virsh.

Every command that reads the host takes the global source options:
``-c/--connect URI`` (libvirt only), ``--sysfs-root DIR`` (sysfs only), or
neither (libvirt at [libvirt]/connection_uri, falling back to sysfs at
[DEFAULT]/sysfs_root).  ``--json`` prints a document for scripts; otherwise a
table for people.  Errors go to stderr, exit status 1 (2 for usage).  What
is printed is built and written by ``cmd.output``.

A command imports what it needs when it runs: ``list`` on a large host is
over in a fraction of the time of importing everything (see
``bench/discovery.py``).
"""

import argparse
import errno
import functools
import os
import sys

import libvirt_gpu
from libvirt_gpu.devices import capacity as capacity_mod
from libvirt_gpu import confcache
from libvirt_gpu import conffile
from libvirt_gpu import exception
from libvirt_gpu.util import logs
from libvirt_gpu.devices import pci_classes
from libvirt_gpu.util import records
from libvirt_gpu.cmd import output
from libvirt_gpu.cmd import simulate_live
from libvirt_gpu.cmd import term

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
    """What a command needs: the parsed configuration and the host
    (``env``, an ``environment.Environment``: discovery, NVML, the PCI
    names and the enabled types, each built once when first used).

    A command that only reads option values (``snapshot=True`` in its
    parser defaults) gets them from the settings snapshot when it is
    current (``confcache``: no oslo.config import); the others get the
    ConfigOpts of ``conf.load``."""

    def __init__(self, args):
        self.args = args
        if getattr(args, 'snapshot', False):
            self.conf = confcache.load(args.config_file)
        else:
            from libvirt_gpu import conf as conf_mod
            self.conf = conf_mod.load(args.config_file)

    @functools.cached_property
    def env(self):
        """The host as this command line names it: libvirt at ``-c`` only,
        sysfs at ``--sysfs-root`` only, or neither: libvirt at
        [libvirt]/connection_uri, falling back to sysfs.  A command run
        once may read a large host in several processes."""
        from libvirt_gpu import environment
        source = environment.Source(
            uri=self.args.connect or self.conf.libvirt.connection_uri,
            fallback=not self.args.connect, sysfs_root=self.args.sysfs_root)
        return environment.Environment.from_conf(
            self.conf, sysfs_root=self.args.sysfs_root, source=source,
            parallel=True, mdevctl_dir=getattr(self.args, 'mdevctl_dir',
                                               None))

    @property
    def result(self):
        return self.env.discovered

    @property
    def enabled(self):
        return self.env.enabled

    @property
    def hostname(self):
        return self.args.hostname or self.conf.host

    def environment(self, host=None):
        """The host that the lifecycle commands act on: ``env`` read from
        its sysfs (what the allocator and the kinds work with), with
        ``host``, its libvirt ``Host``, when the command has one."""
        return self.env.replace(host=host, source=None, parallel=False)

    def say_source(self):
        where = (self.args.connect or self.conf.libvirt.connection_uri
                 if self.result.source == 'libvirt' else
                 self.args.sysfs_root or self.conf.sysfs_root)
        output.emit_note('source: %s (%s)' % (self.result.source, where),
                         as_json=self.args.json)


def _whole_refusal(ctx, gpu):
    """Why ``gpu`` is not offered whole, by the rule Placement's tree is
    built with (``model.offered``), or None."""
    refusal = capacity_mod.pgpu_refusal(gpu)
    if refusal is None and gpu.vendor_id not in ctx.conf.gpu.pgpu_vendor_ids:
        refusal = ('its vendor %s is not in [gpu]/pgpu_vendor_ids'
                   % gpu.vendor_id)
    return refusal


def cmd_list(ctx):
    enabled = ctx.enabled
    gpus = ctx.result.gpus
    ctx.say_source()
    if ctx.args.json:
        # A VF shows the setting of its physical GPU (it is used as a part
        # of it); its ``physfn`` names that GPU.
        documents = []
        type_memo = {}
        for gpu in gpus:
            setting = enabled.get(gpu.physfn or gpu.address)
            documents.append(output.gpu_to_json(
                gpu, setting, not_assignable=(
                    _whole_refusal(ctx, gpu)
                    if setting is None and not gpu.is_vf else None),
                type_memo=type_memo))
        output.emit_gpus_json(documents)
        return 0
    from libvirt_gpu.openstack.placement import model
    rows = []
    notes = []
    for gpu in gpus:
        if gpu.is_vf:
            continue          # counted on its physical GPU's row (VFS)
        setting = enabled.get(gpu.address)
        refusal = _whole_refusal(ctx, gpu) if setting is None else None
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
    output.emit_text(output.table(
        ['ADDRESS', 'ID', 'PRODUCT', 'DRIVER', 'NUMA', 'CPUS', 'IOMMU',
         'GROUP MEMBERS', 'MODE', 'ENABLED TYPE', 'CAPACITY', 'TYPES',
         'VGPUS', 'VFS'], rows))
    for note in notes:
        output.emit_text(note)
    if not gpus:
        output.emit_text('no GPU (PCI class 0x03xxxx) found')
    return 0


def _gpu_types(gpu):
    """The types to show for ``gpu``: a VF's own; for a physical GPU every
    type of it and its VFs, ``available_instances`` being what the whole
    GPU can still take (not one VF's 0 or 1)."""
    if gpu.is_vf or not gpu.vf_gpus:
        return gpu.vgpu_types if gpu.is_vf else gpu.offered_types()

    from libvirt_gpu import objects
    from libvirt_gpu.openstack.placement import model
    shown = []
    for mtype in gpu.offered_types():
        used = sum(f.used_type_ids.count(mtype.id) for f in gpu.functions)
        total = model.vgpu_total(gpu, objects.EnabledType(mtype.id))
        shown.append(records.replace(
            mtype, available_instances=max(0, total - used)))
    return tuple(shown)


def cmd_types(ctx):
    if ctx.args.address:
        from libvirt_gpu import objects
        gpus = [ctx.result.gpu(objects.PciAddress.parse(ctx.args.address))]
    else:
        gpus = [g for g in ctx.result.gpus
                if not g.is_vf and g.offered_types()]
    ctx.say_source()
    if ctx.args.json:
        output.emit_json({str(g.address): [output.type_to_json(t)
                                           for t in _gpu_types(g)]
                          for g in gpus})
        return 0
    rows = []
    for gpu in gpus:
        for t in _gpu_types(gpu):
            rows.append([str(gpu.address), t.id, t.name, t.device_api,
                         t.available_instances, t.description])
    output.emit_text(output.table(['GPU', 'TYPE', 'NAME', 'API', 'AVAILABLE',
                                   'DESCRIPTION'], rows))
    if not rows:
        output.emit_text('no vGPU types offered (is the GPU bound to a '
                         'vGPU-capable driver such as nvidia? are its SR-IOV '
                         'VFs enabled?)')
    return 0


def _tree(ctx):
    from libvirt_gpu.openstack.placement import model
    return model.host_tree(ctx.env, ctx.hostname)


def cmd_placement_show(ctx):
    provider_tree = _tree(ctx)
    ctx.say_source()
    if ctx.args.json:
        output.emit_json(provider_tree.to_dict())
    else:
        output.emit_text(output.provider_tree_text(provider_tree))
    return 0


def _check_url(url):
    """``--url`` must be an http(s) URL with a host (anything else would
    fail later as "cannot reach Placement", which sends people looking
    for a network problem)."""
    if url is None:
        return
    from urllib import parse
    parts = parse.urlsplit(url)
    if parts.scheme not in ('http', 'https') or not parts.netloc:
        raise exception.InvalidInput(
            reason='--url %s: the URL must be http(s)://HOST[:PORT][/PATH], '
                   'e.g. http://placement:8778' % url)


def cmd_placement_sync(ctx):
    from libvirt_gpu.openstack import agent
    _check_url(ctx.args.url)
    report = agent.sync_once(ctx.conf, url=ctx.args.url,
                             dry_run=ctx.args.dry_run, tree=_tree(ctx))
    output.emit_report(report, as_json=ctx.args.json)
    return 1 if report.failed else 0


def cmd_agent(ctx):
    from libvirt_gpu.openstack import agent
    _check_url(ctx.args.url)
    # a process that lives on reads the host in one process
    report = agent.serve(ctx.env.replace(parallel=False), ctx.hostname,
                         once=ctx.args.once, url=ctx.args.url)
    return 1 if report is not None and report.failed else 0


def cmd_discover(ctx):
    from libvirt_gpu.openstack.placement import cyborg_objects
    devices, withheld = cyborg_objects.host_devices(
        ctx.hostname, ctx.result.gpus, ctx.enabled, ctx.conf.gpu)
    ctx.say_source()
    if ctx.args.json:
        output.emit_json(output.cyborg_devices_to_json(devices))
    else:
        output.emit_text(output.cyborg_devices_text(devices))
    for address, why in withheld.items():
        output.emit_note('%s: nothing offered to Cyborg: %s' % (address, why),
                         as_json=ctx.args.json)
    return 0


def cmd_simulate(ctx):
    from libvirt_gpu import simulator
    if ctx.args.list_profiles:
        output.emit_text('\n'.join(simulator.list_profiles()))
        return 0
    if not ctx.args.profile or not ctx.args.dir:
        raise exception.InvalidInput(
            reason='simulate needs PROFILE and DIR (or --list)')
    if ctx.args.live:
        return simulate_live.run_live(
            ctx.args.profile, ctx.args.dir,
            busy_remove=ctx.args.busy_remove,
            uevents=not ctx.args.no_uevents,
            control_stdio=ctx.args.control_stdio, workdir=ctx.args.workdir,
            probe_delay=ctx.args.probe_delay)
    profile = simulator.load_profile(ctx.args.profile)
    try:
        node_xml = simulator.write_host(profile, ctx.args.dir)
    except OSError as e:
        raise exception.SimulatorError(
            reason='cannot write the simulated host to %s: %s; name a '
                   'directory you may write to' % (ctx.args.dir,
                                                   e.strerror or e))
    if ctx.args.json:
        output.emit_json({'profile': profile.name,
                          'sysfs_root': ctx.args.dir, 'node_xml': node_xml,
                          'test_uri': 'test://%s' % node_xml})
    else:
        output.emit_text(
            'wrote simulated host %r to %s\n'
            '  sysfs:  libvirt-gpu --sysfs-root %s list\n'
            '  libvirt: libvirt-gpu -c test://%s list'
            % (profile.name, ctx.args.dir, ctx.args.dir, node_xml))
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


def _say_attachment(ctx, verb, done):
    if ctx.args.json:
        output.emit_json(output.attachment_to_json(done))
    else:
        output.emit_text(output.attachment_text(verb, done))


def cmd_attach(ctx):
    from libvirt_gpu.guests import api
    from libvirt_gpu.virt import host as host_mod
    live, config = _flags(ctx.args)
    with host_mod.Host(_uri(ctx)) as host:
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
    with host_mod.Host(_uri(ctx), events=True) as host:
        done = api.detach(ctx.environment(host), ctx.args.domain,
                          uuid=ctx.args.uuid, address=ctx.args.address,
                          vgpu_type=ctx.args.vgpu_type, live=live,
                          config=config)
    _say_attachment(ctx, 'detached', done)
    return 0


def cmd_domgpus(ctx):
    from libvirt_gpu.guests import api
    from libvirt_gpu.virt import host as host_mod
    with host_mod.Host(_uri(ctx)) as host:
        got = api.list_devices(ctx.environment(host), ctx.args.domain,
                               inactive=ctx.args.inactive)
    if ctx.args.json:
        output.emit_json(output.domain_devices_to_json(got))
    else:
        output.emit_text(output.domain_devices_text(got))
    return 0


def cmd_migrate(ctx):
    from libvirt_gpu.guests import api
    from libvirt_gpu.virt import host as host_mod
    as_json = ctx.args.json

    def show(plan):
        if not as_json:
            output.emit_text(output.migration_checks_text(plan))

    def progress(stats):
        if not as_json:
            sys.stderr.write('\r' + output.migration_progress_text(stats))
            sys.stderr.flush()

    with host_mod.Host(_uri(ctx)) as host:
        # A refused check raises MigrationRefused (exit status 1) after
        # ``show`` printed every check.
        done = api.migrate(host, ctx.args.domain, ctx.args.dest_uri,
                           dry_run=ctx.args.dry_run, progress=progress,
                           on_plan=show, migrate_uri=ctx.args.migrate_uri)
    if as_json:
        output.emit_json(output.migration_to_json(done))
    if done.outcome is None:                        # --dry-run
        return 0 if done.plan.ok else 1
    if not as_json:
        sys.stderr.write('\n')
        output.emit_text(output.migration_outcome_text(done.plan,
                                                       done.outcome))
    return 0 if done.outcome.done else 130


def cmd_hook_install(ctx):
    from libvirt_gpu.guests import hook
    path, _ = conffile.config_path(ctx.args.config_file)
    done = hook.install(ctx.args.dir, path, python=ctx.args.python)
    if ctx.args.json:
        output.emit_json(output.installed_to_json(done))
    else:
        output.emit_text(output.installed_text(done))
    return 0


def cmd_reconcile(ctx):
    from libvirt_gpu.virt import host as host_mod
    from libvirt_gpu.guests import reconcile
    with host_mod.Host(_uri(ctx)) as host:
        env = ctx.environment(host)
        report = reconcile.reconcile(
            env, dry_run=ctx.args.dry_run, covered=set(env.enabled),
            on_plan=lambda plan: _say_plan(ctx, plan))
    output.emit_report(report, as_json=ctx.args.json)
    return 3 if report.stuck else 0


def _say_plan(ctx, plan):
    """reconcile says what it is about to remove before it does."""
    for f in plan:
        output.emit_note('will remove %s %s%s: %s' % (
            f.what, f.uuid, ' on %s' % f.parent if f.parent else '',
            f.reason), as_json=ctx.args.json)
    (sys.stderr if ctx.args.json else sys.stdout).flush()


def cmd_restore(ctx):
    from libvirt_gpu.guests import restore
    _check_dir_option('--mdevctl-dir', ctx.args.mdevctl_dir)
    env = ctx.environment()
    owner = None
    if not ctx.args.no_libvirt:
        owner = restore.lease_owner_check(env.state_dir, _uri(ctx))
    report = restore.restore(
        env, vf_pfs=restore.vf_targets(env), owner_running=owner,
        sriov_manage=restore.sriov_manage_for(env.sysfs_root,
                                              ctx.args.sriov_manage),
        settle_timeout=ctx.args.settle_timeout, dry_run=ctx.args.dry_run)
    output.emit_report(report, as_json=ctx.args.json)
    return 1 if report.failed else 0


EXPORTER_PORT = 9851
EXPORTER_HELP = """\
Serve this host's GPUs, vGPUs and the qemu hook's health as Prometheus
metrics at http://ADDRESS:PORT/metrics until SIGTERM/SIGINT: per GPU its
mode, enabled type and capacity (total, used, free: the counts Placement
and the allocator use), why a GPU is not offered whole; per type the
instances the driver can still make; per vGPU its type, GPU, holding
domain and lease state; what `reconcile --dry-run` would remove; the
hook's calls, refusals, errors and latency; the last Placement sync and
restore; NVML's utilisation and memory where NVML answers.  Each scrape
reads the host afresh and takes no lock a guest start waits for.  The
README's "Metrics" section lists every series with a sample query.

examples:
  libvirt-gpu exporter                          127.0.0.1:%d, libvirt at
                                                [libvirt]/connection_uri
  libvirt-gpu exporter --address 0.0.0.0 --port 9851
  libvirt-gpu exporter --once                   print one scrape and exit
  libvirt-gpu exporter --no-libvirt             no domain names, no
                                                reconcile series
""" % EXPORTER_PORT


def _port(text):
    try:
        port = int(text, 10)
    except ValueError:
        port = -1
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(
            '%r is not a TCP port: give a number from 1 to 65535' % text)
    return port


def _listen_error(address, port, error):
    reason = error.strerror or str(error)
    if error.errno == errno.EADDRINUSE:
        reason += ' (another process listens there: stop it, or pick ' \
                  'another --port)'
    elif error.errno in (errno.EACCES, errno.EPERM):
        reason += (' (ports below 1024 need root: pick a --port above 1023)'
                   if port < 1024 else ' (not allowed here: pick another '
                   '--port or --address)')
    elif error.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
        reason += ' (no such address on this host: give one of its own ' \
                  'addresses to --address, or 0.0.0.0)'
    return exception.ListenError(address=address, port=port, reason=reason)


def _survey(env, uri):
    """What ``reconcile --dry-run`` reports, for each scrape; None on
    libvirt's test driver, which reconcile refuses (it knows none of this
    host's guests)."""
    from libvirt_gpu.guests import reconcile
    if uri.startswith('test:'):
        return None

    def survey():
        fresh = env.rediscover()
        return reconcile.reconcile(fresh, dry_run=True,
                                   covered=set(fresh.enabled))
    return survey


def cmd_exporter(ctx):
    import signal
    import threading
    from libvirt_gpu import exporter
    args = ctx.args
    env = ctx.environment()
    host = None
    survey = None
    if not args.no_libvirt:
        from libvirt_gpu.virt import host as host_mod
        host = host_mod.Host(_uri(ctx), read_only=True)
        env = ctx.environment(host)
        survey = _survey(env, _uri(ctx))
    collector = exporter.HostCollector(env, survey=survey)
    if args.once:
        sys.stdout.write(exporter.exposition(collector))
        return 0
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        exporter.serve(collector, args.address, args.port, stop)
    except OSError as e:
        raise _listen_error(args.address, args.port, e)
    finally:
        if host is not None:
            host.close()
    return 0


def _add_exporter_command(sub):
    p = sub.add_parser('exporter', help='serve Prometheus metrics of this '
                       'host (GPUs, vGPUs, hook health)',
                       description=EXPORTER_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(func=cmd_exporter, json=False)
    p.add_argument('--address', default='127.0.0.1',
                   help='address to listen on (default: 127.0.0.1; '
                        '0.0.0.0 for every interface, :: for IPv6)')
    p.add_argument('--port', type=_port, default=EXPORTER_PORT,
                   help='TCP port (default: %d)' % EXPORTER_PORT)
    p.add_argument('--once', action='store_true',
                   help='print one scrape on stdout and exit')
    p.add_argument('--no-libvirt', action='store_true',
                   help='do not connect to libvirt: no domain names, no '
                        'whole-GPU use, no reconcile series')


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
    p.add_argument('--dry-run', action='store_true',
                   help='show what would be written (VFs enabled, vGPUs '
                        'created or reset); write nothing')


def _check_dir_option(option, path):
    """An option naming a directory that exists as something else: say so
    in one line instead of failing deep inside the command."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise exception.InvalidInput(
            reason='%s %s is not a directory; name a directory'
            % (option, path))


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
            'status 3). It removes devices: run with --dry-run first. Only '
            'vGPUs we leased, or on GPUs the configuration enables, are '
            'touched; it needs a libvirt that knows the host\'s domains '
            '(not test:///)')
    p.add_argument('--dry-run', action='store_true',
                   help='only report what would be done (run this first)')
    p = add('migrate', cmd_migrate, 'migrate a running guest with its '
            'vGPUs live to another host (checks first: libvirt >= 8.6 and '
            'QEMU >= 8.1 on both, room for each vGPU type there); Ctrl-C '
            'aborts')
    p.add_argument('domain', metavar='DOMAIN', help='name or UUID')
    p.add_argument('dest_uri', metavar='DEST_URI',
                   help='the destination\'s libvirt URI, opened by this '
                        'command and by the source\'s libvirtd, e.g. '
                        'qemu+ssh://host2/system')
    p.add_argument('--dry-run', action='store_true',
                   help='only run the checks and print them')
    p.add_argument('--migrate-uri', metavar='URI',
                   help='where the guest\'s memory goes, e.g. '
                        'tcp://10.0.0.2:49152 (a migration network); by '
                        'default the destination\'s host name, as its '
                        'libvirtd reports it')


# The options before COMMAND that take a value (``_command_word``).
_GLOBAL_VALUE_OPTIONS = ('-c', '--connect', '--sysfs-root', '--config-file',
                         '--hostname')


def _columns():
    """The terminal's width as ``shutil.get_terminal_size`` tells it
    (``$COLUMNS``, else the terminal of stdout, else 80), without importing
    ``shutil`` (and the compression modules it loads), which argparse's
    formatters do for every option added."""
    try:
        columns = int(os.environ.get('COLUMNS', ''))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


class _Width(object):
    """A help formatter whose default width is ``_columns() - 2``, as
    argparse's own."""

    def __init__(self, prog, indent_increment=2, max_help_position=24,
                 width=None):
        super().__init__(prog, indent_increment, max_help_position,
                         _columns() - 2 if width is None else width)


class _HelpFormatter(_Width, argparse.HelpFormatter):
    pass


class _RawDescriptionHelpFormatter(_Width,
                                   argparse.RawDescriptionHelpFormatter):
    pass


class _Unbuilt(object):
    """Stands for the parser of a command this call does not run: argparse
    builds every parser eagerly (gettext look-ups, a help formatter per
    option) for all of ours, so ``build_parser(only=...)`` builds
    just one; whatever is asked of the others is skipped."""

    def __getattr__(self, name):
        return self._skip

    def _skip(self, *args, **kwargs):
        return self


class _Commands(object):
    """The subparsers action, adding only the command ``only`` (every
    command when None)."""

    def __init__(self, action, only):
        self.action = action
        self.only = only
        self.names = []

    def add_parser(self, name, **kwargs):
        self.names.append(name)
        if self.only is not None and name != self.only:
            return _Unbuilt()
        kwargs.setdefault('formatter_class', _HelpFormatter)
        return self.action.add_parser(name, **kwargs)


def _command_word(argv):
    """The COMMAND of ``argv`` when it is plain to see (only the global
    options, spelled out, before it), else None."""
    words = iter(argv)
    for word in words:
        if word in _GLOBAL_VALUE_OPTIONS:
            next(words, None)
        elif word == '--debug' or (word.startswith('--') and word.split(
                '=', 1)[0] in _GLOBAL_VALUE_OPTIONS):
            continue
        else:
            return None if word.startswith('-') else word
    return None


def build_parser(only=None):
    """The whole parser, or (``only``: a command name) one holding only
    that command; with an unknown name, the whole parser."""
    parser = _build_parser(only)
    if only is not None and only not in parser.command_names:
        parser = _build_parser(None)
    return parser


def _build_parser(only):
    parser = argparse.ArgumentParser(
        prog=PROG, description='Hand NVIDIA GPUs and vGPUs to libvirt/KVM '
        'guests and report them the way OpenStack Placement expects.',
        epilog=EPILOG, formatter_class=_RawDescriptionHelpFormatter)
    parser.add_argument('--version', action='version',
                        version='%(prog)s ' + libvirt_gpu.__version__,
                        help="print libvirt-gpu's version and exit")
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
                             % conffile.DEFAULT_CONFIG_FILE)
    parser.add_argument('--hostname', help='host name used in Placement '
                        '(default: [DEFAULT]/host)')
    parser.add_argument('--debug', action='store_true',
                        help='log debug messages and show tracebacks')
    action = parser.add_subparsers(dest='command', metavar='COMMAND')
    action.required = True
    sub = _Commands(action, only)
    parser.command_names = sub.names

    def add(name, func, help_text, **kwargs):
        p = sub.add_parser(name, help=help_text, description=help_text,
                           **kwargs)
        p.add_argument('--json', action='store_true',
                       help='print JSON for scripts')
        p.set_defaults(func=func)
        return p

    # The commands that only read option values take them from the
    # settings snapshot when it is current (``Context``).
    add('list', cmd_list, 'list GPUs: address, ids, driver, NUMA node, '
        'IOMMU group, pGPU/vGPU mode, capacity').set_defaults(snapshot=True)
    p = add('types', cmd_types, 'list the vGPU (mdev) types GPUs offer')
    p.set_defaults(snapshot=True)
    p.add_argument('address', nargs='?', metavar='ADDRESS',
                   help='only this GPU (PCI address, e.g. 0000:af:00.0)')
    add('discover', cmd_discover, 'the Cyborg view: the driver objects '
        'Cyborg\'s agent gets from libvirt_gpu_driver').set_defaults(
            snapshot=True)
    placement = sub.add_parser('placement', help='the Placement provider '
                               'tree', description='The Placement provider '
                               'tree of this host.')
    psub = placement.add_subparsers(dest='placement_command',
                                    metavar='SUBCOMMAND')
    psub.required = True
    show = psub.add_parser('show', help='print the provider tree '
                           '(inventories and traits)')
    show.add_argument('--json', action='store_true', help='print JSON')
    show.set_defaults(func=cmd_placement_show, snapshot=True)
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
    simulate_live.add_live_arguments(p.add_argument_group(
        'live tree', 'With --live, DIR is a mount point: a FUSE filesystem '
        'answers writes the way the kernel does (create/remove of mdevs '
        'with its error numbers, udev events) until SIGINT/SIGTERM. Needs '
        'root and /dev/fuse. Bind it over /sys parts in a private mount '
        'namespace to show it to libvirtd or mdevctl.'))
    p.add_argument('--live', action='store_true',
                   help='serve a live tree at DIR instead of writing files')
    _add_lifecycle_commands(sub, add)
    _add_restore_command(add)
    _add_exporter_command(sub)
    return parser


@term.escaped_output()
def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(only=_command_word(argv))
    args = parser.parse_args(argv)
    # logging is loaded when something logs (a plain ``list`` need not
    # pay its import), with --debug at once
    logs.configure(level='DEBUG' if args.debug else 'WARNING',
                   format='%(levelname)s: %(message)s')
    if args.debug:
        logs.load()
    try:
        ctx = Context(args)
        return args.func(ctx)
    except exception.LibvirtGpuError as e:
        output.emit_error(PROG, e)
        if args.debug:
            raise
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `libvirt-gpu list | head`: the reader left; not an error.
        sys.stderr.close()
        return 0
    except OSError as e:
        # A path the operator named that cannot be used (a file where a
        # directory belongs, no permission): one line, not a traceback.
        print('%s: error: %s' % (PROG, _os_error_text(e)), file=sys.stderr)
        if args.debug:
            raise
        return 1
    except Exception as e:  # noqa: BLE001 - the CLI's edge: one line
        print('%s: internal error: %s: %s (run with --debug for the '
              'traceback)' % (PROG, type(e).__name__, e), file=sys.stderr)
        if args.debug:
            raise
        return 1


def _os_error_text(e):
    where = ' -> '.join(str(f) for f in (e.filename, e.filename2)
                        if f is not None)
    text = e.strerror or str(e)
    if e.errno in (errno.EACCES, errno.EPERM):
        text += ' (run as a user allowed to write there, e.g. root)'
    return '%s: %s' % (where, text) if where else text


def run():
    """The ``libvirt-gpu`` console script: ``main`` as the whole life of a
    process.  The interpreter's last act would be a collector pass over
    every object the command made (a great many after ``list`` on a large
    host) to find cycles that exit frees anyway, so the survivors
    are frozen (``gc.freeze``: the collector leaves them alone) first.
    Not done by ``main``, which tests and the agent call in a process that
    goes on."""
    code = main()
    import gc
    gc.freeze()
    return code


if __name__ == '__main__':
    sys.exit(run())
