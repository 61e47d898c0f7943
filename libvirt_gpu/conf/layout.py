"""``[gpu]/layouts`` and one ``[layout_<name>]`` section per layout: how a
GPU is laid out (its mode, MIG GPU instances, vGPU types, scheduler).

The section names depend on ``[gpu]/layouts``, so they are registered once
the files are parsed (``register_dynamic_opts``); the rules that need no
GPU are checked then too (``devices.layout.read_layouts``).  The sample
config shows the options under the example section ``[layout_h100_mig]``.
What a layout means and how ``libvirt-gpu layout apply`` converges a GPU
to it: ``docs/admin/layouts.md``.
"""

import re

from oslo_config import cfg
from oslo_config import types

from libvirt_gpu.conf import gpu
from libvirt_gpu.devices import layout as layout_mod
from libvirt_gpu import exception
from libvirt_gpu import objects

EXAMPLE = 'h100_mig'
_NAME = re.compile(r'[a-z0-9][a-z0-9_-]{0,47}')


class GpuSelectorType(types.String):
    """A PCI address (``0000:41:00.0``) or the vendor:product ids of a
    model (``10de:2331``), kept in its normal form."""

    def __init__(self):
        super().__init__(type_name='GPU address or vendor:product')

    def __call__(self, value):
        value = super().__call__(value)
        try:
            return str(objects.GpuSelector.parse(value))
        except exception.InvalidInput as e:
            raise ValueError(e.kwargs.get('reason', str(e)))


layouts_opt = cfg.ListOpt(
    'layouts', default=[],
    help='Names of the GPU layouts of this host, one [layout_<name>] '
         'section each. A GPU in a layout offers the layout\'s vGPU types '
         '(and no [vgpu_<type>]/device_addresses may name it); '
         '`libvirt-gpu layout plan` shows the steps that bring the GPUs to '
         'their layouts, `libvirt-gpu layout apply` runs them.')

layout_opts = [
    cfg.ListOpt('gpus', default=[], item_type=GpuSelectorType(),
                help='The GPUs of this layout: PCI addresses of physical '
                     'GPUs (0000:41:00.0) or vendor:product ids, every GPU '
                     'of that model (10de:2331). A GPU may be in one layout '
                     'only.'),
    cfg.StrOpt('mode', default=layout_mod.TIME_SLICED,
               choices=layout_mod.MODES,
               help='time-sliced: vGPUs of one size share the GPU in time; '
                    'mixed-size: time-sliced vGPUs of several sizes at '
                    'placements; mig: each vGPU in a MIG GPU instance of '
                    'its own; mig-time-sliced: several vGPUs share a GPU '
                    'instance in time.'),
    cfg.ListOpt('gpu_instances', default=[],
                help='MIG modes: the GPU instances to make, as '
                     '<profile>:<count> (1g.10gb:4, 3g.40gb:1); the GPU\'s '
                     'slices and memory must hold them all. The profiles '
                     'are the GPU\'s (nvidia-smi mig -lgip).'),
    cfg.ListOpt('vgpu_types', default=[],
                help='The vGPU types the GPU offers (nvidia-<id>), each '
                     'its own Placement provider: one type in time-sliced '
                     'mode; several sizes in mixed-size mode, each with a '
                     'count that is its Placement total (nvidia-1153:3, '
                     'nvidia-1145:1; `layout plan` checks that the counts '
                     'fit together whatever placements the driver picks); '
                     'in the MIG modes, MIG-backed types whose GPU instance '
                     'profile the layout makes, one type per profile. '
                     '<type>:<count> also caps a type in any mode.'),
    cfg.StrOpt('scheduler', choices=tuple(layout_mod.SCHEDULERS),
               help='The vGPU scheduler of the time-sliced modes (unset: '
                    'left as the driver has it). fixed-share does not work '
                    'with mixed-size. Set through NVML by `layout apply` '
                    'and `restore`; `layout plan` prints the nvidia module '
                    'option that sets it at module load instead.'),
    cfg.IntOpt('time_slice_ms', min=layout_mod.TIME_SLICE_MS[0],
               max=layout_mod.TIME_SLICE_MS[1],
               help='The scheduler\'s time slice in milliseconds, with '
                    'equal-share or fixed-share (unset: the driver\'s).'),
]


def _group(name):
    return cfg.OptGroup(layout_mod.section(name), title='GPU layout %s'
                        % name,
                        help='One GPU layout, named in [gpu]/layouts. Copy '
                             'this section once per layout, named '
                             'layout_<name>.')


def register_opts(conf):
    conf.register_opt(layouts_opt, group=gpu.gpu_group.name)


def register_dynamic_opts(conf):
    """Register ``[layout_<name>]`` for every name in ``[gpu]/layouts``."""
    for name in conf.gpu.layouts:
        if not _NAME.fullmatch(name):
            raise exception.ConfigError(
                reason='[gpu]/layouts: %r is not a layout name (lower-case '
                       'letters, digits, _ and -, at most 48)' % name)
        conf.register_group(_group(name))
        conf.register_opts(layout_opts, group=layout_mod.section(name))


def check(conf, path):
    """The rules of each layout that need no GPU: ConfigError naming the
    file ``path`` and the option."""
    try:
        return layout_mod.read_layouts(conf)
    except exception.ConfigError as e:
        raise exception.ConfigError(reason='%s: %s' % (
            path, e.kwargs.get('reason', e)))


def list_opts():
    return {gpu.gpu_group: [layouts_opt], _group(EXAMPLE): layout_opts}
