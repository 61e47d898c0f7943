from oslo_config import cfg

libvirt_group = cfg.OptGroup('libvirt', title='libvirt connection')

libvirt_opts = [
    cfg.StrOpt('connection_uri', default='qemu:///system',
               help='libvirt URI used for discovery and for attaching '
                    'devices, e.g. qemu:///system or test:///path/node.xml.'),
]


def register_opts(conf):
    conf.register_group(libvirt_group)
    conf.register_opts(libvirt_opts, group=libvirt_group)


def list_opts():
    return {libvirt_group: libvirt_opts}
