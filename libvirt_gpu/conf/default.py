import socket

from oslo_config import cfg

default_opts = [
    cfg.StrOpt('host', default=socket.gethostname(),
               sample_default='<hostname>',
               help='Name of this host: the root provider in Placement and '
                    'the prefix of its GPU providers.'),
    cfg.StrOpt('sysfs_root', default='/sys',
               help='Root of the sysfs tree to read and write. Only tests '
                    'and the simulator change it.'),
    cfg.StrOpt('pci_ids_file', default='/usr/share/misc/pci.ids',
               help='The PCI ID database (Debian package pci.ids) that '
                    'names GPUs read from sysfs, as libvirt names them. '
                    'Missing: GPUs are shown by their numeric ids.'),
    cfg.StrOpt('state_dir', default='/var/lib/libvirt-gpu',
               help='Directory of the state file that holds vGPU leases.'),
]


def register_opts(conf):
    conf.register_opts(default_opts)


def list_opts():
    return {'DEFAULT': default_opts}
