"""[placement]: where and how to reach OpenStack Placement.

The keystoneauth options (session, auth plugin, adapter) are registered the
way Nova registers them, so a production host uses the same settings as its
nova-compute, e.g.::

    [placement]
    auth_type = password
    auth_url = https://keystone.example.org/v3
    username = placement-agent
    password = ...
    user_domain_name = Default
    project_name = service
    project_domain_name = Default
    region_name = RegionOne
    valid_interfaces = internal

A Placement running with ``[api] auth_strategy = noauth2`` (tests, labs) needs
no auth plugin: pass ``--url`` (or set ``endpoint_override``) and the agent
sends ``X-Auth-Token: <noauth_token>``.

Importing keystoneauth1 is slow (``bench/`` measures the CLI), so
``conf.load`` (which every command runs) registers only this module's own
options (``register_opts(conf, auth=False)``); the keystoneauth ones are
registered by ``register_auth_opts``, which ``PlacementClient.from_conf``
calls before it reads them.  oslo.config accepts options registered after
the files are parsed.
"""

from oslo_config import cfg

GROUP = 'placement'
DEFAULT_SERVICE_TYPE = 'placement'
DEFAULT_VALID_INTERFACES = ['internal', 'public']

placement_group = cfg.OptGroup(
    GROUP, title='Placement options',
    help='How to reach OpenStack Placement (keystoneauth1 session, auth '
         'and adapter options, as in nova.conf [placement]), and how the '
         'sync behaves.')

placement_opts = [
    cfg.StrOpt('noauth_token', default='admin', secret=True,
               help='Token sent as X-Auth-Token when no auth_type is set '
                    'and Placement runs with auth_strategy = noauth2 '
                    '("admin" gives admin rights). Ignored when auth_type '
                    'is set.'),
    cfg.IntOpt('conflict_retries', default=4, min=1, max=20,
               help='How many times a write refused with 409 '
                    'placement.concurrent_update (another writer changed '
                    'the provider) is re-read and retried, with jittered '
                    'exponential backoff, before the sync gives up until '
                    'the next interval.'),
    cfg.BoolOpt('nest_under_existing', default=True,
                help='When a provider named like this host already exists '
                     '(created by nova-compute), create the GPU providers '
                     'as its children instead of creating our own root. '
                     'Our root is then never created and the existing '
                     'provider\'s own inventories and traits are left '
                     'alone.'),
]


def _adapter_opts():
    from keystoneauth1 import loading as ks_loading
    opts = ks_loading.get_adapter_conf_options(include_deprecated=False)
    cfg.set_defaults(opts, service_type=DEFAULT_SERVICE_TYPE,
                     valid_interfaces=DEFAULT_VALID_INTERFACES)
    return opts


def register_opts(conf, auth=True):
    """Register [placement]: its own options, and with ``auth`` the
    keystoneauth ones (``register_auth_opts``)."""
    # A fresh OptGroup per ConfigOpts: register_group copies it shallowly,
    # so a shared one would leak options (e.g. the ones a keystoneauth plugin
    # registers when loaded) from one ConfigOpts into every other.
    conf.register_group(cfg.OptGroup(placement_group.name,
                                     title=placement_group.title,
                                     help=placement_group.help))
    conf.register_opts(placement_opts, group=GROUP)
    if auth:
        register_auth_opts(conf)


def register_auth_opts(conf):
    """Register the keystoneauth session, auth and adapter options of
    [placement]; calling it again changes nothing."""
    from keystoneauth1 import loading as ks_loading
    ks_loading.register_session_conf_options(conf, GROUP)
    ks_loading.register_auth_conf_options(conf, GROUP)
    ks_loading.register_adapter_conf_options(conf, GROUP,
                                             include_deprecated=False)
    conf.set_default('service_type', DEFAULT_SERVICE_TYPE, group=GROUP)
    conf.set_default('valid_interfaces', DEFAULT_VALID_INTERFACES,
                     group=GROUP)


def list_opts():
    # As nova.conf.placement.list_opts: the options of the common auth
    # plugin ('password') are listed so the sample shows them.
    from keystoneauth1 import loading as ks_loading
    return {
        placement_group: (
            placement_opts
            + ks_loading.get_session_conf_options()
            + ks_loading.get_auth_common_conf_options()
            + ks_loading.get_auth_plugin_conf_options('password')
            + _adapter_opts()),
    }
