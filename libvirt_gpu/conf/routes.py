"""Which route owns each GPU: ``[routes]``.

A GPU of the host reaches guests by one route, never two: libvirt-gpu's
own (the qemu hook, ``libvirt-gpu attach``, ``libvirt-gpu agent``),
OpenStack Cyborg's (``libvirt_gpu_driver``, ARQs that Nova binds), Nova's
PCI passthrough of VFs carved for it (``[nova]/carved``) or Nova's own
vGPU route (``[devices]/enabled_mdev_types`` in nova.conf).  This group
names the GPUs of the second and where the fourth is configured; what
the values mean against the host is read in ``libvirt_gpu.devices.routes``
(no oslo.config there).
"""

from oslo_config import cfg

routes_group = cfg.OptGroup('routes', title='Which route owns each GPU', help=(
    'A GPU serves one route: libvirt-gpu\'s own guests (the default for '
    'every GPU this group does not give away), OpenStack Cyborg (cyborg), '
    'Nova\'s PCI passthrough of carved VFs ([nova]/carved) or Nova\'s own '
    'vGPU route (read from the nova.conf named by nova_conf). A GPU two '
    'routes claim is refused when the configuration is read, naming both.'))

routes_opts = [
    cfg.ListOpt('cyborg', default=[],
                help='The GPUs that OpenStack Cyborg hands out through '
                     'libvirt_gpu_driver: PCI addresses of physical GPUs '
                     '(0000:3b:00.0) or vendor:product ids of a model '
                     '(10de:1eb8: every GPU of that model), or "all": every '
                     'GPU no other route claims. Their types come '
                     'from [gpu]/enabled_vgpu_types and [vgpu_<type>] as for '
                     'any GPU; only the driver reports them, and the hook, '
                     'attach, reconcile, restore and libvirt-gpu agent leave '
                     'them and their vGPUs alone. Empty: no GPU is '
                     'Cyborg\'s.'),
    cfg.StrOpt('nova_conf', default='/etc/nova/nova.conf',
               help='nova-compute\'s configuration file, read for Nova\'s own '
                    'vGPU route ([devices]/enabled_mdev_types, '
                    '[mdev_<type>]/device_addresses): the GPUs it names are '
                    'Nova\'s, and a GPU libvirt-gpu or Cyborg also offers '
                    'is refused. A file that does not exist names none; '
                    'empty: not read.'),
]


def register_opts(conf):
    # A fresh OptGroup per ConfigOpts: register_group copies it shallowly.
    conf.register_group(cfg.OptGroup(routes_group.name,
                                     title=routes_group.title,
                                     help=routes_group.help))
    conf.register_opts(routes_opts, group=routes_group.name)


def list_opts():
    return {routes_group: routes_opts}
