"""Configuration: one ConfigOpts per process, built by ``load``.

The file is ``/etc/libvirt-gpu/libvirt-gpu.conf`` unless the environment
variable ``LIBVIRT_GPU_CONFIG`` or an explicit ``config_file`` names another,
so the CLI and the qemu hook (which runs with an almost empty environment)
read the same file.  No module-level ConfigOpts: callers pass ``conf`` on.
"""

import os
import re
import stat

from oslo_config import cfg

from libvirt_gpu import exception
from libvirt_gpu import filetype
from libvirt_gpu.conf import agent
from libvirt_gpu.conf import default
from libvirt_gpu.conf import gpu
from libvirt_gpu.conf import libvirt
from libvirt_gpu.conf import placement
from libvirt_gpu.conf import vgpu

DEFAULT_CONFIG_FILE = '/etc/libvirt-gpu/libvirt-gpu.conf'
CONFIG_ENV = 'LIBVIRT_GPU_CONFIG'

MODULES = [default, libvirt, gpu, vgpu, placement, agent]

# A configuration file is a few KiB; anything bigger is a mistake (a log,
# /dev/zero) that must not be read into memory.
MAX_CONFIG_BYTES = 1024 * 1024


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
        if module is placement:
            # Without the keystoneauth options: importing keystoneauth1
            # would cost every command ~100 ms; a Placement client
            # registers them when it is built.
            placement.register_opts(conf, auth=False)
        elif hasattr(module, 'register_opts'):
            # ([vgpu_<type>] is registered once the files are read.)
            module.register_opts(conf)
    return conf


def load(config_file=None, environ=None):
    """Return a parsed ConfigOpts with every group registered; every option
    has been read once, so a bad value is one ConfigError here whatever
    the command."""
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
    _read_every_option(conf, path)
    _check_state_dir(conf, path)
    return conf


def check_config_file(path, required):
    """Whether ``path`` is a config file to read: a regular file of at most
    MAX_CONFIG_BYTES (a FIFO would hang the reader, ``/dev/zero`` fill the
    memory).  Missing: False, or a ConfigError when ``required``.  It is
    opened without blocking and judged by ``fstat``, so nothing here waits.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        if required:
            raise exception.ConfigError(
                reason='config file %s does not exist' % path)
        return False
    except OSError as e:
        kind = filetype.kind_behind(e, path)     # a socket
        if kind is None:
            raise exception.ConfigFileUnreadable(path=path,
                                                 reason=e.strerror)
        raise _not_regular(path, kind)
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if stat.S_ISCHR(st.st_mode) and _is_devnull(st):
        return False         # ``--config-file /dev/null``: no settings
    if not stat.S_ISREG(st.st_mode):
        raise _not_regular(path, filetype.kind(st.st_mode))
    if st.st_size > MAX_CONFIG_BYTES:
        raise exception.ConfigFileUnreadable(
            path=path, reason='it is %d bytes, more than the %d a '
                              'configuration file can be; is it the right '
                              'file?' % (st.st_size, MAX_CONFIG_BYTES))
    return True


def _is_devnull(st):
    try:
        null = os.stat(os.devnull)
    except OSError:
        return False
    return stat.S_ISCHR(null.st_mode) and st.st_rdev == null.st_rdev


def _not_regular(path, kind):
    return exception.ConfigFileUnreadable(
        path=path, reason='it is %s, not a regular file' % kind)


def _check_state_dir(conf, path):
    """[DEFAULT]/state_dir may be missing (it is made on first use) but
    not something other than a directory."""
    state_dir = conf.state_dir
    if os.path.exists(state_dir) and not os.path.isdir(state_dir):
        raise exception.ConfigError(
            reason='%s: [DEFAULT]/state_dir = %s is not a directory; name '
                   'a directory (it is created when missing)'
                   % (path, state_dir))


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
