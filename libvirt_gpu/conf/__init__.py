"""Configuration: one ConfigOpts per process, built by ``load``.

The file is ``/etc/libvirt-gpu/libvirt-gpu.conf`` unless the environment
variable ``LIBVIRT_GPU_CONFIG`` or an explicit ``config_file`` names another,
so the CLI and the qemu hook (which runs with an almost empty environment)
read the same file.  No module-level ConfigOpts: callers pass ``conf`` on.
"""

import os

from oslo_config import cfg

from libvirt_gpu import exception
from libvirt_gpu.conf import agent
from libvirt_gpu.conf import default
from libvirt_gpu.conf import gpu
from libvirt_gpu.conf import libvirt
from libvirt_gpu.conf import placement
from libvirt_gpu.conf import vgpu

DEFAULT_CONFIG_FILE = '/etc/libvirt-gpu/libvirt-gpu.conf'
CONFIG_ENV = 'LIBVIRT_GPU_CONFIG'

MODULES = [default, libvirt, gpu, vgpu, placement, agent]


def config_path(config_file=None, environ=None):
    """Which file to read, and whether it must exist."""
    environ = os.environ if environ is None else environ
    if config_file:
        return config_file, True
    if environ.get(CONFIG_ENV):
        return environ[CONFIG_ENV], True
    return DEFAULT_CONFIG_FILE, False


def new_conf():
    conf = cfg.ConfigOpts()
    for module in MODULES:
        if hasattr(module, 'register_opts'):
            module.register_opts(conf)
    return conf


def load(config_file=None, environ=None):
    """Return a parsed ConfigOpts with every group registered."""
    path, required = config_path(config_file, environ)
    files = []
    if os.path.exists(path):
        files = [path]
    elif required:
        raise exception.ConfigError(
            reason='config file %s does not exist' % path)
    conf = new_conf()
    try:
        conf(args=[], project='libvirt-gpu', default_config_files=files,
             default_config_dirs=[], use_env=False)
    except (cfg.Error, ValueError) as e:
        raise exception.ConfigError(reason='%s: %s' % (path, e))
    vgpu.register_dynamic_opts(conf)
    try:
        # Reading every value now turns a bad value into one clear error
        # instead of a traceback somewhere later.
        for type_id in conf.gpu.enabled_vgpu_types:
            dict(conf[vgpu.group_name(type_id)].items())
        conf.gpu.report_gpu_traits
        conf.gpu.nvml
    except (cfg.Error, ValueError) as e:
        raise exception.ConfigError(reason='%s: %s' % (path, e))
    return conf
