"""A configuration's layouts resolved against GPUs as the composition root
resolves them (``Environment.layouts``), and the rules that take them, for
unit tests that resolve a configuration on hand-built GPUs."""

from libvirt_gpu.devices import carving
from libvirt_gpu.devices import enablement
from libvirt_gpu.devices import layout


def of(conf, gpus):
    """``{PciAddress: Layout}`` of ``conf``'s ``[gpu]/layouts`` on
    ``gpus``."""
    return layout.claims(layout.read_layouts(conf), gpus)


def enabled(conf, gpus):
    """``enablement.resolve`` of ``conf`` on ``gpus``, with their
    layouts."""
    return enablement.resolve(conf, gpus, of(conf, gpus))


def carved(conf, gpus, enabled_types, known_names=None):
    """``carving.resolve`` of ``conf`` on ``gpus``, with their layouts."""
    return carving.resolve(conf, gpus, enabled_types, of(conf, gpus),
                           known_names)


def converge(env, names=None, **kwargs):
    """``layout_apply.converge`` of the host ``env``
    (``environment.Environment``), handed its parts as the CLI hands them
    (``cmd.layout_cmds``): its layouts, GPUs, NVML, sysfs, state directory
    and the holders its lease store names (``names``: ``{Uuid: domain
    name}``)."""
    from libvirt_gpu.host import layout_apply
    return layout_apply.converge(
        env.layouts, env.discovered.gpus, env.nvml, env.sysfs, env.state_dir,
        layout_apply.layout_kinds(env.vgpus),
        holders=layout_apply.lease_holders(env.store, names), **kwargs)
