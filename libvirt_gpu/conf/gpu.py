from oslo_config import cfg
from oslo_config import types

from libvirt_gpu import exception
from libvirt_gpu import objects

VENDOR_ID_FORMS = '4 hex digits, as sysfs (0x10de) or lspci (10de, 10DE) shows'


class PciVendorId(types.String):
    """A PCI vendor id as an operator writes it (``0x10de``, ``10DE``,
    ``10de``), held as discovery has it (``10de``); any other form
    (``nvidia``) is refused by ``conf.load``, naming the option, for every
    entry point alike (a vendor id of another form matched no GPU, and the
    Cyborg driver then reported none)."""

    def __init__(self):
        super().__init__(type_name='PCI vendor id')

    def __call__(self, value):
        value = super().__call__(value)
        try:
            return objects.normalize_hex_id(value.strip().lower())
        except exception.InvalidInput:
            raise ValueError('%r is not a PCI vendor id: write %s'
                             % (value, VENDOR_ID_FORMS))


gpu_group = cfg.OptGroup('gpu', title='GPU and vGPU selection', help=(
    'Which vGPU types this host offers. A GPU that offers none of the enabled'
    ' types is reported as a whole GPU (resource class PGPU).'))

gpu_opts = [
    cfg.ListOpt('enabled_vgpu_types', default=[],
                help=(
                    'vGPU types (mdev type ids such as nvidia-223) this host '
                    'offers. With one type and no '
                    '[vgpu_<type>]/device_addresses, every GPU that offers it'
                    ' is sliced into that type. With several types, each '
                    'needs its own [vgpu_<type>] section listing the GPUs it '
                    'applies to.')),
    cfg.BoolOpt('report_gpu_traits', default=True,
                help='Add the standard os-traits GPU traits '
                     '(HW_GPU_MAX_DISPLAY_HEADS_*, HW_GPU_RESOLUTION_*) '
                     'that a vGPU type description supports.'),
    cfg.ListOpt('pgpu_vendor_ids', default=[objects.NVIDIA_VENDOR_ID],
                item_type=PciVendorId(),
                help='PCI vendor ids whose GPUs are offered whole (PGPU) '
                     'when no vGPU type is enabled on them: 4 hex digits '
                     '(10de, 10DE and 0x10de are one id). Other display '
                     'devices, such as a server\'s BMC console (ASPEED '
                     '1a03), are listed but never offered.'),
    cfg.StrOpt('nvml', default='auto', choices=('auto', 'off', 'simulated'),
               help='Read NVIDIA\'s management library (NVML, through the '
                    'nvidia-ml-py package) for GPU names, memory, '
                    'virtualization and MIG mode, and the vGPU types a vGPU '
                    'host driver lists. auto: where the package, the '
                    'library and a GPU are there, else sysfs/libvirt alone '
                    'without a word; off: never; simulated: the simulated '
                    'driver of the simulated host at [DEFAULT]/sysfs_root '
                    '(tests and demos; needs nvidia-ml-py).'),
]


def register_opts(conf):
    # A fresh OptGroup per ConfigOpts: register_group copies it shallowly.
    conf.register_group(cfg.OptGroup(gpu_group.name, title=gpu_group.title,
                                     help=gpu_group.help))
    conf.register_opts(gpu_opts, group=gpu_group.name)


def list_opts():
    return {gpu_group: gpu_opts}
