from oslo_config import cfg

libvirt_group = cfg.OptGroup(
    'libvirt', title='libvirt connection',
    help='How to reach the libvirt daemon of this host.')

libvirt_opts = [
    cfg.StrOpt('connection_uri', default='qemu:///system',
               help='libvirt URI used for discovery and for attaching '
                    'devices, e.g. qemu:///system or test:///path/node.xml.'),
]


def register_opts(conf):
    # A fresh OptGroup per ConfigOpts: register_group copies it shallowly.
    conf.register_group(cfg.OptGroup(libvirt_group.name,
                                     title=libvirt_group.title,
                                     help=libvirt_group.help))
    conf.register_opts(libvirt_opts, group=libvirt_group.name)


def list_opts():
    return {libvirt_group: libvirt_opts}
