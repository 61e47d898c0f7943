"""Carving for OpenStack Nova: ``[nova]/carved`` and one ``[nova_<name>]``
section per carving.

A carving says "on these GPUs, keep ``count`` VFs of vGPU type
``vgpu_type`` for Nova's PCI passthrough": ``libvirt-gpu restore`` writes
the type to them at boot and ``libvirt-gpu nova-config`` prints the
``[pci]`` lines Nova needs for exactly those VFs.  The section names
depend on ``[nova]/carved``, so they are registered once the files are
parsed (``register_dynamic_opts``), as ``[vgpu_<type>]`` sections are; the
sample-config generator sees the options under the example section
``[nova_l40s_12q]``.  What the values mean against the host's GPUs is
read in ``libvirt_gpu.devices.carving`` (no oslo.config there).
"""

import re

from oslo_config import cfg

from libvirt_gpu import exception

EXAMPLE_NAME = 'l40s_12q'
SECTION_PREFIX = 'nova_'
# A carving's name is part of a section name: letters, digits, '_', '-'.
_NAME_RE = re.compile(r'[A-Za-z0-9][A-Za-z0-9_-]{0,63}')

nova_group = cfg.OptGroup('nova', title='Carving vGPUs for OpenStack Nova',
                          help=(
                              'GPUs whose vendor-interface vGPUs (NVIDIA vGPU'
                              ' 17+, kernel >= 6.8) go to Nova as PCI devices'
                              ': libvirt-gpu writes the vGPU type to a fixed '
                              'set of VFs at boot (libvirt-gpu restore) and '
                              'prints the [pci] device_spec and alias lines '
                              'for them (libvirt-gpu nova-config). A carved '
                              'GPU belongs to Nova alone: it is neither '
                              'enabled here ([gpu]/enabled_vgpu_types), nor '
                              'offered whole, nor reported to Placement or '
                              'Cyborg by libvirt-gpu.'))

nova_opts = [
    cfg.ListOpt('carved', default=[],
                help='Names of the carvings, each described by its own '
                     '[nova_<name>] section (l40s_12q -> [nova_l40s_12q]). '
                     'Empty: nothing is carved for Nova.'),
]

carving_opts = [
    cfg.ListOpt('gpus', default=[],
                help='The GPUs of this carving: PCI addresses of physical '
                     'GPUs (0000:3d:00.0) or vendor:product ids of a model '
                     '(10de:26b9: every GPU of that model on the host). '
                     'Required.'),
    cfg.StrOpt('vgpu_type',
               help='The vendor-interface vGPU type written to the VFs, as '
                    '`libvirt-gpu types` names it (nvidia-1153 for an '
                    'NVIDIA L40S-12Q). Required.'),
    cfg.IntOpt('count', min=1,
               help='How many VFs of each matching GPU get the type: the '
                    'lowest-numbered ones, always the same (Nova keeps '
                    'their addresses). At most what the GPU holds of the '
                    'type. Required.'),
    cfg.StrOpt('resource_class',
               help='The Placement resource class Nova reports these VFs '
                    'under. Default: CUSTOM_ followed by the type\'s name '
                    'upper-cased, every other character an underscore '
                    '(NVIDIA L40S-12Q -> CUSTOM_NVIDIA_L40S_12Q).'),
    cfg.StrOpt('alias',
               help='The name of the Nova [pci] alias (what a flavor\'s '
                    'pci_passthrough:alias names). Default: the type\'s '
                    'name without its leading NVIDIA word, lower-cased, '
                    'every other character a dash (NVIDIA L40S-12Q -> '
                    'l40s-12q).'),
]


def group_name(name):
    return SECTION_PREFIX + name


def _group(name):
    return cfg.OptGroup(group_name(name), title='Carving %s for Nova' % name,
                        help='One carving for Nova, named in [nova]/carved. '
                             'Copy this section once per carving, named '
                             'after it.')


def check_name(name):
    """A carving's name as ``[nova]/carved`` lists it; ConfigError naming
    the option otherwise."""
    if not isinstance(name, str) or _NAME_RE.fullmatch(name) is None:
        raise exception.ConfigError(
            reason='[nova]/carved: %r is not a carving name (letters, '
                   'digits, "_" and "-", e.g. l40s_12q); each name has its '
                   'own [nova_<name>] section' % (name,))
    return name


def register_opts(conf):
    # A fresh OptGroup per ConfigOpts: register_group copies it shallowly.
    conf.register_group(cfg.OptGroup(nova_group.name, title=nova_group.title,
                                     help=nova_group.help))
    conf.register_opts(nova_opts, group=nova_group.name)


def register_dynamic_opts(conf):
    """Register ``[nova_<name>]`` for every name of ``[nova]/carved``."""
    names = list(conf.nova.carved)
    if len(set(names)) != len(names):
        raise exception.ConfigError(
            reason='[nova]/carved lists a name twice: %s' % ', '.join(names))
    for name in names:
        group = _group(check_name(name))
        conf.register_group(group)
        conf.register_opts(carving_opts, group=group)


def list_opts():
    return {nova_group: nova_opts, _group(EXAMPLE_NAME): carving_opts}
