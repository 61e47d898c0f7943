"""[agent]: the periodic discovery + Placement sync service."""

from oslo_config import cfg

GROUP = 'agent'

agent_group = cfg.OptGroup(
    GROUP, title='Agent options',
    help='`libvirt-gpu agent` discovers the GPUs of this host and keeps '
         'their resource providers in Placement up to date.')

agent_opts = [
    cfg.IntOpt('sync_interval', default=60, min=1,
               help='Seconds between two syncs. A sync that finds nothing '
                    'changed costs one GET per host and writes nothing.'),
    cfg.IntOpt('backoff_max', default=300, min=1,
               help='Longest wait, in seconds, between retries while '
                    'Placement (or discovery) fails; the wait doubles from '
                    '1 s up to this cap and returns to sync_interval after '
                    'the next success.'),
]


def register_opts(conf):
    # A fresh OptGroup per ConfigOpts: register_group copies it shallowly,
    # so a shared one would leak options (e.g. the ones a keystoneauth plugin
    # registers when loaded) from one ConfigOpts into every other.
    conf.register_group(cfg.OptGroup(agent_group.name, title=agent_group.title,
                                     help=agent_group.help))
    conf.register_opts(agent_opts, group=GROUP)


def list_opts():
    return {agent_group: agent_opts}
