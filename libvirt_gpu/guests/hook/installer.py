"""``libvirt-gpu hook install``: put ``hooks/qemu`` where libvirtd runs it,
with this interpreter, configuration and import path baked in."""

from __future__ import annotations

import json
import os
import sys

from libvirt_gpu import exception
from libvirt_gpu.util import fileutil
from libvirt_gpu.guests.hook import settings as settings_mod
from libvirt_gpu.util import records

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable


DEFAULT_HOOKS_DIR = '/etc/libvirt/hooks'
INSTALL_NAME = 'libvirt-gpu'


@records.record
class Installed:
    """What ``install`` did."""

    path: str
    python: str
    config_file: str
    settings_file: str
    restart_needed: bool     # libvirtd had no qemu hook when it started


def hook_source() -> str:
    """``hooks/qemu`` of the source tree or of the installed data files."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.dirname(os.path.abspath(__file__)))))
    for candidate in (os.path.join(here, 'hooks', 'qemu'),
                      os.path.join(sys.prefix, 'share', 'libvirt-gpu',
                                   'hooks', 'qemu')):
        if os.path.isfile(candidate):
            return candidate
    raise exception.ConfigError(reason='hooks/qemu not found next to the '
                                       'package nor under %s/share'
                                % sys.prefix)


def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def hooks_enabled(hooks_dir: str) -> bool:
    """Whether libvirtd finds a qemu hook in ``hooks_dir`` (at start or
    SIGHUP it looks for an executable ``qemu`` or ``qemu.d/*``)."""
    if _executable(os.path.join(hooks_dir, 'qemu')):
        return True
    drop_ins = os.path.join(hooks_dir, 'qemu.d')
    try:
        names = os.listdir(drop_ins)
    except FileNotFoundError:
        return False
    return any(_executable(os.path.join(drop_ins, n)) for n in names)


def render_hook(source: str, python: str, config_file: str,
                settings_file: str, import_path: Iterable[str]) -> str:
    """``hooks/qemu`` with its interpreter and paths filled in::

        #!/opt/libvirt-gpu/bin/python -IS
        CONFIG_FILE = '/etc/libvirt-gpu/libvirt-gpu.conf'
        SETTINGS_FILE = '/var/lib/libvirt-gpu/hook-settings.json'
        IMPORT_PATH = ['/opt/libvirt-gpu/lib/python3.11/site-packages']
    """
    import_path = list(import_path)
    for what, value in ([('python', python), ('config file', config_file),
                         ('settings file', settings_file)]
                        + [('import path', p) for p in import_path]):
        if not os.path.isabs(value) or any(c.isspace() or c == '\0'
                                           for c in value):
            raise exception.InvalidInput(
                reason='%s %r must be an absolute path without spaces'
                % (what, value))
    lines = source.splitlines(True)
    if not lines or not lines[0].startswith('#!'):
        raise exception.ConfigError(reason='hooks/qemu has no #! line')
    lines[0] = '#!%s -IS\n' % python
    values = {'CONFIG_FILE': config_file, 'SETTINGS_FILE': settings_file,
              'IMPORT_PATH': import_path}
    found = set()
    for i, line in enumerate(lines):
        name = line.split(' = ', 1)[0]
        if name in values and ' = ' in line:
            lines[i] = '%s = %r\n' % (name, values[name])
            found.add(name)
    if found != set(values):
        raise exception.ConfigError(
            reason='hooks/qemu lacks %s' % ', '.join(sorted(set(values)
                                                            - found)))
    return ''.join(lines)


def install(hooks_dir: str = DEFAULT_HOOKS_DIR,
            config_file: str = settings_mod.DEFAULT_CONFIG_FILE,
            python: str | None = None, check: bool = True) -> Installed:
    """Install the hook as ``<hooks_dir>/qemu.d/libvirt-gpu`` (root-owned,
    0755), with the settings snapshot written next to the leases.

    The configuration is read now, so a bad one fails here and not at the
    next guest start.  ``check`` runs the interpreter once to prove it can
    import the package the way the hook will.
    """
    import subprocess
    if os.path.exists(hooks_dir) and not os.path.isdir(hooks_dir):
        raise exception.InvalidInput(
            reason='hooks directory %s is not a directory; name libvirt\'s '
                   'hooks directory with --dir' % hooks_dir)
    python = python or sys.executable
    if not os.path.isabs(python):
        raise exception.InvalidInput(
            reason='python %r must be an absolute path' % python)
    config_file = os.path.abspath(config_file)
    settings, document = settings_mod.read_settings(config_file)
    settings_file = os.path.join(settings.state_dir,
                                 settings_mod.SETTINGS_NAME)
    package_path = os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.dirname(os.path.abspath(__file__)))))
    # The interpreter's own site-packages, then this package's directory
    # (an editable or source install), as the hook will use them.
    import_path: list[str] | None
    try:
        probe = subprocess.run(
            [python, '-I', '-c', 'import json, site; '
             'print(json.dumps(site.getsitepackages()))'],
            capture_output=True, text=True, timeout=60)
        import_path = json.loads(probe.stdout) if probe.returncode == 0 \
            else None
        problem = None if import_path is not None else (
            probe.stderr.strip()[-500:] or 'exit status %d'
            % probe.returncode)
    except (OSError, ValueError) as e:
        import_path, problem = None, str(e)
    if import_path is None:
        raise exception.ConfigError(
            reason='cannot run %s to learn its site-packages: %s'
            % (python, problem))
    import_path = [p for p in import_path if os.path.isdir(p)]
    if package_path not in import_path:
        import_path.append(package_path)
    with open(hook_source()) as f:
        text = render_hook(f.read(), python, config_file, settings_file,
                           import_path)
    if check:
        probe = subprocess.run(
            [python, '-IS', '-c', 'import sys; sys.path.extend(%r); '
             # the hook, and what it loads to rebuild its settings
             'import libvirt_gpu.guests.hook, libvirt_gpu.conf, '
             'libvirt_gpu.devices.discovery' % import_path],
            capture_output=True, text=True, timeout=60)
        if probe.returncode != 0:
            raise exception.ConfigError(
                reason='%s cannot import libvirt_gpu as the hook would: %s'
                % (python, probe.stderr.strip()[-500:]
                   or 'exit status %d' % probe.returncode))
    restart_needed = not hooks_enabled(hooks_dir)
    if document is not None:
        settings_mod.write_settings(document, settings_file)
    drop_ins = os.path.join(hooks_dir, 'qemu.d')
    os.makedirs(drop_ins, mode=0o755, exist_ok=True)
    target = os.path.join(drop_ins, INSTALL_NAME)
    # Written beside qemu.d, then renamed in: libvirt never sees a partly
    # written executable in qemu.d.
    fileutil.write_atomic(target, text, mode=0o755, tmp_dir=hooks_dir,
                          root_owned=True)
    return Installed(path=target, python=python, config_file=config_file,
                     settings_file=settings_file,
                     restart_needed=restart_needed)
