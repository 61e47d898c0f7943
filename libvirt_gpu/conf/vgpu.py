"""Per-type options: one ``[vgpu_<type>]`` section per enabled type.

The section names depend on ``[gpu]/enabled_vgpu_types``, so they are
registered once the config files are parsed (``register_dynamic_opts``).
The sample-config generator sees the same options through ``list_opts``,
under the example section ``[vgpu_nvidia-223]``.
"""

from oslo_config import cfg

from libvirt_gpu.devices import enablement
from libvirt_gpu import exception
from libvirt_gpu import objects

EXAMPLE_TYPE = 'nvidia-223'

vgpu_opts = [
    cfg.ListOpt('device_addresses', default=[],
                help=(
                    'PCI addresses (0000:af:00.0) of the GPUs that offer this'
                    ' type. Each address may belong to one type only. Empty: '
                    'every GPU that offers the type, allowed only when it is '
                    'the single enabled type.')),
    cfg.StrOpt('resource_class', default='VGPU',
               help='Placement resource class of these vGPUs: VGPU or a '
                    'CUSTOM_ class, e.g. CUSTOM_VGPU_T4_2B.'),
    cfg.IntOpt('max_instances', min=1,
               help='Upper bound on vGPUs of this type per GPU, overriding '
                    'what the driver reports (its max_instance).'),
]


group_name = enablement.group_name


def _group(type_id):
    return cfg.OptGroup(group_name(type_id), title='vGPU type %s' % type_id,
                        help='Options of vGPU type %s. Copy this section '
                             'once per enabled type, named after the type.'
                        % type_id)


def register_dynamic_opts(conf):
    """Register ``[vgpu_<type>]`` for every enabled type."""
    for type_id in conf.gpu.enabled_vgpu_types:
        try:
            objects.TypeId.parse(type_id)
        except exception.InvalidTypeId as e:
            raise exception.ConfigError(
                reason='[gpu]/enabled_vgpu_types: %s' % e)
        group = _group(type_id)
        conf.register_group(group)
        conf.register_opts(vgpu_opts, group=group)


def list_opts():
    return {_group(EXAMPLE_TYPE): vgpu_opts}
