"""The commands of OpenStack Placement: ``placement show``, ``placement
sync`` and ``agent``, the service that syncs periodically."""

from libvirt_gpu import exception
from libvirt_gpu.cmd import output


def provider_tree(env, hostname):
    """The provider tree of the host ``env`` (an
    ``environment.Environment``) as ``hostname``: ``model.host_tree`` of
    the parts it takes (the GPUs as discovered, the enabled types, the
    ``[gpu]`` options, the GPUs carved for Nova, the kinds' rooms, the
    GPUs of other routes)."""
    from libvirt_gpu.openstack.placement import model
    return model.host_tree(hostname, env.discovered.gpus, env.enabled,
                           env.conf.gpu, carved=env.carved.gpus,
                           rooms=env.vgpus.rooms(env.enabled),
                           foreign=env.routes.owners)


def _tree(ctx):
    return provider_tree(ctx.env, ctx.hostname)


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
    env = ctx.env.replace(parallel=False)
    hostname = ctx.hostname

    def discover():
        # every cycle sees the host anew
        return provider_tree(env.rediscover(), hostname)
    report = agent.serve(env.conf, discover, once=ctx.args.once,
                         url=ctx.args.url)
    return 1 if report is not None and report.failed else 0


# --- parsers -----------------------------------------------------------------

def _placement_parser(sub, add):
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


def _agent_parser(sub, add):
    agent_help = ('discover and sync to Placement every '
                  '[agent]/sync_interval seconds; survives Placement outages')
    p = sub.add_parser('agent', help=agent_help, description=agent_help)
    p.set_defaults(func=cmd_agent, json=False)
    p.add_argument('--once', action='store_true',
                   help='one cycle, then exit (non-zero on failure)')
    p.add_argument('--url', help='Placement endpoint (overrides the '
                   'catalog / [placement]/endpoint_override)')


PARSERS = {'placement': _placement_parser, 'agent': _agent_parser}
