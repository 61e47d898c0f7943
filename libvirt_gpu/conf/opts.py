"""``list_opts`` for oslo-config-generator (entry point oslo.config.opts)."""

from libvirt_gpu.conf import MODULES


def list_opts():
    merged = {}
    for module in MODULES:
        for group, opts in module.list_opts().items():
            merged.setdefault(group, []).extend(opts)
    return [(None if g == 'DEFAULT' else g, opts)
            for g, opts in merged.items()]
