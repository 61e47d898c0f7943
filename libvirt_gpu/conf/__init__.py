"""Configuration: one ConfigOpts per process, built by ``load``.

The file is ``/etc/libvirt-gpu/libvirt-gpu.conf`` unless the environment
variable ``LIBVIRT_GPU_CONFIG`` or an explicit ``config_file`` names another,
so the CLI and the qemu hook (which runs with an almost empty environment)
read the same file.  No module-level ConfigOpts: callers pass ``conf`` on.
"""

from __future__ import annotations

import re

from oslo_config import cfg

from libvirt_gpu import conffile
from libvirt_gpu import exception
from libvirt_gpu.util import logs
from libvirt_gpu.conf import agent
from libvirt_gpu.conf import default
from libvirt_gpu.conf import gpu
from libvirt_gpu.conf import layout
from libvirt_gpu.conf import libvirt
from libvirt_gpu.conf import nova
from libvirt_gpu.conf import placement
from libvirt_gpu.conf import routes
from libvirt_gpu.conf import typos
from libvirt_gpu.conf import vgpu

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

# The file rules live in ``conffile`` (no oslo.config there); named here too.
DEFAULT_CONFIG_FILE = conffile.DEFAULT_CONFIG_FILE
CONFIG_ENV = conffile.CONFIG_ENV
MAX_CONFIG_BYTES = conffile.MAX_CONFIG_BYTES
config_path = conffile.config_path
check_config_file = conffile.check_config_file

MODULES = [default, libvirt, gpu, layout, vgpu, nova, routes, placement,
           agent]


def new_conf():
    conf = cfg.ConfigOpts()
    for module in MODULES:
        if module is placement:
            # Without the keystoneauth options: every command would pay
            # for importing keystoneauth1; a Placement client
            # registers them when it is built.
            placement.register_opts(conf, auth=False)
        elif hasattr(module, 'register_opts'):
            # ([vgpu_<type>] and [nova_<name>] are registered once the
            # files are read.)
            module.register_opts(conf)
    return conf


def load(config_file: str | None = None,
         environ: Mapping[str, str] | None = None) -> cfg.ConfigOpts:
    """Return a parsed ConfigOpts with every group registered; every option
    has been read once, so a bad value is one ConfigError here whatever
    the command."""
    logs.load()     # oslo.config logs through logging: configured first
    path, required = config_path(config_file, environ)
    files = []
    if check_config_file(path, required):
        files = [path]
    conf = new_conf()
    try:
        conf(args=[], project='libvirt-gpu', default_config_files=files,
             default_config_dirs=[], use_env=False)
    except cfg.ConfigFilesPermissionDeniedError:
        raise exception.ConfigFileUnreadable(path=path,
                                             reason='permission denied')
    except OSError as e:
        raise exception.ConfigFileUnreadable(path=path, reason=e.strerror)
    except (cfg.Error, ValueError) as e:
        raise exception.ConfigError(reason='%s: %s' % (path, _clean(e)))
    vgpu.register_dynamic_opts(conf)
    nova.register_dynamic_opts(conf)
    layout.register_dynamic_opts(conf)
    if files:
        typos.check(conf, path, [opt.dest for opt in vgpu.vgpu_opts],
                    [opt.dest for opt in nova.carving_opts])
    _read_every_option(conf, path)
    layout.check(conf, path)
    conffile.check_state_dir(conf.state_dir, path)
    return conf


# oslo.config names where a bad value came from as the repr of a
# LocationInfo; the file is named once, in front, instead.
_LOCATION = re.compile(r' from LocationInfo\(.*?\)(?= is not valid)')


def _clean(error):
    return _LOCATION.sub('', str(error))


def _read_every_option(conf, path):
    """Read every registered option now: a bad value (``[agent]
    sync_interval = -1``) becomes one clear error for every command instead
    of a traceback in the one command that happens to use it."""
    for name in sorted(conf):
        _read_option(conf, 'DEFAULT', name, path)
    for group_name in sorted(conf):
        group = conf[group_name]
        if isinstance(group, cfg.ConfigOpts.GroupAttr):
            for name in sorted(group):
                _read_option(group, group_name, name, path)


def _read_option(holder, group_name, name, path):
    try:
        holder[name]
    except (cfg.Error, ValueError) as e:
        raise exception.ConfigError(reason='%s: [%s]/%s: %s'
                                    % (path, group_name, name, _clean(e)))
