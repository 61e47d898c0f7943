"""The commands that set up the host's services: ``hook install`` (the
qemu hook) and ``exporter`` (Prometheus metrics)."""

import argparse
import errno

from libvirt_gpu import conffile
from libvirt_gpu import exception
from libvirt_gpu.cmd import output


def cmd_hook_install(ctx):
    from libvirt_gpu.guests import hook
    path, _ = conffile.config_path(ctx.args.config_file)
    done = hook.install(ctx.args.dir, path, python=ctx.args.python)
    if ctx.args.json:
        output.emit_json(output.installed_to_json(done))
    else:
        output.emit_text(output.installed_text(done))
    return 0


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
reads the host afresh and takes no lock a guest start waits for.
docs/admin/metrics.md lists every series with sample queries.

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
        host = host_mod.Host(ctx.libvirt_uri(), read_only=True)
        env = ctx.environment(host)
        survey = _survey(env, ctx.libvirt_uri())
    collector = exporter.HostCollector(env, survey=survey)
    if args.once:
        output.emit_exposition(exporter.exposition(collector))
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


# --- parsers -----------------------------------------------------------------

def _hook_parser(sub, add):
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


def _exporter_parser(sub, add):
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


PARSERS = {'hook': _hook_parser, 'exporter': _exporter_parser}
