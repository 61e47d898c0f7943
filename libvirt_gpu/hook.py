"""The libvirt qemu hook: vGPUs exist exactly while their guest runs.

libvirt runs ``/etc/libvirt/hooks/qemu.d/libvirt-gpu`` (``hooks/qemu``,
installed by ``libvirt-gpu hook install``) as
``<hook> <domain name> <operation> <sub-operation> <extra>`` with the domain
XML on stdin, several times per guest start and stop.  That script exits at
once for every operation but ``prepare``/``release``/``reconnect`` and for
every guest whose XML holds neither our namespace nor an mdev, before it
imports anything; only then does it call ``run`` here.

What each operation does (DESIGN.md 3.1):

``prepare begin``  create every vGPU the domain asks for: each
    ``<gpu:vgpu>`` of its metadata that has its ``<hostdev type='mdev'>``,
    and each mdev hostdev that an mdevctl definition describes; check each
    ``<gpu:pgpu>``.  One failure removes what this call created and exits 1
    with a message for the operator (libvirt refuses the start and shows
    it).
``release end``    remove the vGPUs this host leased to the domain (the
    vendor driver may be removing them too), drop the leases.  Exit 0.
``reconnect begin`` check that the running guest's vGPUs exist; log what
    is wrong.  Exit 0: a non-zero exit here would kill the guest.
anything else     exit 0.  ``migrate``/``restore`` print nothing: the XML
    is not rewritten.

The hook never imports or calls libvirt (the daemon waits for it: any call
back would deadlock); it works from its stdin, its configuration and sysfs.
Input is refused before anything is written when it is malformed or hostile
(DOCTYPE, entities, oversize, a UUID/type/address that does not validate).

Configuration: oslo.config costs ~0.11 s to import, more than a whole
``prepare`` may take, so the hook reads a snapshot of what it needs
(``HookSettings``: sysfs root, state dir, enabled types resolved per GPU),
kept as JSON and refreshed through oslo.config whenever the config file,
the set of mdev parents (``class/mdev_bus``) or the set of VFs with NVIDIA's
vGPU 17+ vendor interface (``bus/pci/devices/*/nvidia``: a host without
mdevs, whose VFs appear when ``sriov-manage -e`` enables them) changed.
Both sets are taken before the configuration is read, so a change while
it is read makes the next call read it again.  Every line it logs also goes to
``<state_dir>/hook.log`` (libvirt discards a successful hook's stderr).
"""

import dataclasses
import json
import os
import sys
import time
import typing

from libvirt_gpu import allocator as allocator_mod
from libvirt_gpu.backends import base
from libvirt_gpu.backends import mdev as mdev_backend
from libvirt_gpu.backends import pci as pci_backend
from libvirt_gpu.backends import registry
from libvirt_gpu import config_xml
from libvirt_gpu import exception
from libvirt_gpu import metadata
from libvirt_gpu import objects
from libvirt_gpu import state
from libvirt_gpu import sysfs as sysfs_mod
from libvirt_gpu import xmlutil

PREPARE = 'prepare'
RELEASE = 'release'
RECONNECT = 'reconnect'
HANDLED = (PREPARE, RELEASE, RECONNECT)

DEFAULT_CONFIG_FILE = '/etc/libvirt-gpu/libvirt-gpu.conf'
SETTINGS_NAME = 'hook-settings.json'
LOG_NAME = 'hook.log'
LOG_MAX_BYTES = 1024 * 1024
# One call logs at most this many lines, each cut to LOG_LINE_MAX
# characters; what is left over is counted in one last line.  A guest
# with 10,000 vGPU entries must not push hook.log past its cap.
LOG_MAX_LINES = 100
LOG_LINE_MAX = 2000
# reconnect names at most this many missing vGPUs, then counts the rest.
RECONNECT_LISTED = 10
SETTINGS_VERSION = 2
_MAX_SETTINGS_BYTES = 1024 * 1024

# What hooks/qemu scans stdin for before importing anything (kept in step
# with it by a test): our namespace, an mdev hostdev, and the start of a
# DOCTYPE or entity declaration (refused here, never ignored).
MARKERS = (metadata.NAMESPACE.encode(), b'mdev', b'<!DOCTYPE', b'<!ENTITY')


# --- settings ----------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class HookSettings:
    """What the hook needs from the configuration."""

    sysfs_root: str
    state_dir: str
    enabled: typing.Dict[objects.PciAddress, objects.EnabledType]

    def enabled_types(self):
        return sorted({e.type_id for e in self.enabled.values()})


def _config_key(config_file):
    """``[mtime_ns, size, inode]`` of the config file (None: missing)."""
    try:
        st = os.stat(config_file)
    except FileNotFoundError:
        return None
    return [st.st_mtime_ns, st.st_size, st.st_ino]


def _mdev_parents(sysfs_root):
    """Names under ``<root>/class/mdev_bus`` (the mdev parents now)."""
    try:
        return sorted(os.listdir(os.path.join(sysfs_root, 'class',
                                              'mdev_bus')))
    except FileNotFoundError:
        return []


def _vendor_vfs(sysfs_root):
    """Names under ``<root>/bus/pci/devices`` that have an ``nvidia/``
    entry (the VFs with NVIDIA's vGPU 17+ vendor interface now).

    One readdir and one access() per PCI function, relative to the
    directory (no exception per miss): ~6 us per function on sysfs, so
    ~2 ms on a host with 8 GPUs of 32 VFs each.
    """
    try:
        fd = os.open(os.path.join(sysfs_root, 'bus', 'pci', 'devices'),
                     os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return []
    try:
        access, exists = os.access, os.F_OK
        return sorted(n for n in os.listdir(fd)
                      if access(n + '/nvidia', exists, dir_fd=fd))
    finally:
        os.close(fd)


def _sysfs_key(sysfs_root):
    """What, when it changes, makes the snapshot stale: ``{'mdev_parents':
    [...], 'vendor_vfs': [...]}``."""
    return {'mdev_parents': _mdev_parents(sysfs_root),
            'vendor_vfs': _vendor_vfs(sysfs_root)}


def settings_from_conf(config_file):
    """Build HookSettings through oslo.config and discovery (slow path)."""
    return _read_settings(config_file)[0]


def _read_settings(config_file):
    """``(HookSettings, keys)``: ``keys`` are the snapshot's ``(config
    key, sysfs key)`` taken before what they guard was read."""
    config_key = _config_key(config_file)
    from libvirt_gpu import conf as conf_mod
    from libvirt_gpu.conf import vgpu as vgpu_conf
    if config_file == DEFAULT_CONFIG_FILE and not os.path.exists(
            config_file):
        conf = conf_mod.load(None, environ={})
    else:
        conf = conf_mod.load(config_file)
    sysfs_key = _sysfs_key(conf.sysfs_root)
    # Every GPU, read from sysfs (no libvirt: the hook never imports it):
    # a GPU whose vGPUs live on SR-IOV VFs is configured by its PF, which
    # is no mdev parent.
    from libvirt_gpu import discovery
    sysfs = sysfs_mod.Sysfs(conf.sysfs_root)
    gpus = discovery.from_sysfs(sysfs).gpus
    return HookSettings(sysfs_root=conf.sysfs_root,
                        state_dir=conf.state_dir,
                        enabled=vgpu_conf.resolve(conf, gpus)), (
                            config_key, sysfs_key)


def _settings_to_json(settings, config_file, config_key, sysfs_key):
    return {
        'version': SETTINGS_VERSION,
        'config_file': config_file,
        'config_key': config_key,
        'sysfs_key': sysfs_key,
        'sysfs_root': settings.sysfs_root,
        'state_dir': settings.state_dir,
        'enabled': {str(a): {'type_id': e.type_id,
                             'resource_class': e.resource_class,
                             'max_instances': e.max_instances}
                    for a, e in sorted(settings.enabled.items())},
    }


def _settings_from_json(data, config_file):
    """HookSettings of a snapshot, or None when it is stale or unusable."""
    if not isinstance(data, dict) or data.get('version') != \
            SETTINGS_VERSION or data.get('config_file') != config_file:
        return None
    if data.get('config_key') != _config_key(config_file):
        return None
    root = data.get('sysfs_root')
    if not isinstance(root, str) or not os.path.isabs(root):
        return None
    if data.get('sysfs_key') != _sysfs_key(root):
        return None
    state_dir = data.get('state_dir')
    if not isinstance(state_dir, str) or not os.path.isabs(state_dir):
        return None
    enabled = {}
    try:
        for address, entry in (data.get('enabled') or {}).items():
            max_instances = entry.get('max_instances')
            if max_instances is not None and (
                    not isinstance(max_instances, int) or max_instances < 1):
                return None
            enabled[objects.PciAddress.parse(address)] = objects.EnabledType(
                type_id=objects.validate_type_id(entry['type_id']),
                resource_class=str(entry.get('resource_class', 'VGPU')),
                max_instances=max_instances)
    except (exception.InvalidInput, KeyError, TypeError, AttributeError):
        return None
    return HookSettings(sysfs_root=root, state_dir=state_dir,
                        enabled=enabled)


def write_settings(settings, config_file, settings_file, keys=None):
    """Write the snapshot atomically (mode 0600).

    ``keys``: ``(config key, sysfs key)`` taken before ``settings`` were
    read (``load_settings``); None: taken now.
    """
    if keys is None:
        keys = (_config_key(config_file), _sysfs_key(settings.sysfs_root))
    directory = os.path.dirname(settings_file)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    tmp = '%s.tmp.%d' % (settings_file, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC,
                 0o600)
    with os.fdopen(fd, 'w') as f:
        json.dump(_settings_to_json(settings, config_file, *keys), f,
                  indent=1, sort_keys=True)
    os.replace(tmp, settings_file)


def load_settings(config_file, settings_file=None):
    """HookSettings from the snapshot when it is current, else from the
    configuration (and the snapshot rewritten).  Returns ``(settings,
    note)``; ``note`` says why the snapshot was not used, or None."""
    if settings_file:
        try:
            with open(settings_file, 'rb') as f:
                raw = f.read(_MAX_SETTINGS_BYTES + 1)
            data = json.loads(raw) if len(raw) <= _MAX_SETTINGS_BYTES \
                else None
        except FileNotFoundError:
            data = None
        except (OSError, ValueError, UnicodeDecodeError):
            data = None
        settings = _settings_from_json(data, config_file)
        if settings is not None:
            return settings, None
    settings, keys = _read_settings(config_file)
    note = 'settings read from %s' % config_file
    if settings_file:
        try:
            write_settings(settings, config_file, settings_file, keys)
            note += ' (snapshot %s refreshed)' % settings_file
        except OSError as e:
            note += ' (cannot write snapshot %s: %s)' % (settings_file,
                                                         e.strerror)
    return settings, note


# --- logging -----------------------------------------------------------------

class HookLog(object):
    """Lines for the operator: errors to stderr (libvirt shows them when a
    start is refused), everything to ``<state_dir>/hook.log`` once the input
    has been accepted (nothing is written for refused input)."""

    def __init__(self, argv, stderr):
        self.stderr = stderr
        self.head = ' '.join(a.replace('\n', ' ')[:80] for a in argv[1:4])
        self.lines = []
        self.dropped = 0
        self.path = None

    def _keep(self, line, printed=None):
        """Keep ``line`` (and print ``printed`` to stderr) unless this call
        has logged LOG_MAX_LINES already; then only count it."""
        if len(self.lines) >= LOG_MAX_LINES:
            self.dropped += 1
            return
        self.lines.append(line[:LOG_LINE_MAX])
        if printed is not None:
            print(printed[:LOG_LINE_MAX], file=self.stderr)

    def info(self, message):
        self._keep(message)

    def error(self, message):
        self._keep('ERROR: ' + message, 'libvirt-gpu: %s' % message)

    def warning(self, message):
        self._keep('WARNING: ' + message,
                   'libvirt-gpu: warning: %s' % message)

    def flush(self):
        if self.dropped:
            self.lines.append('... and %d more line(s) not logged'
                              % self.dropped)
            print('libvirt-gpu: ... and %d more line(s) not shown'
                  % self.dropped, file=self.stderr)
            self.dropped = 0
        if self.path is None or not self.lines:
            return
        now = time.time()
        stamp = '%s.%03d' % (time.strftime('%Y-%m-%dT%H:%M:%S',
                                           time.localtime(now)),
                             int(now * 1000) % 1000)
        text = ''.join('%s [%d] %s: %s\n'
                       % (stamp, os.getpid(), self.head, line)
                       for line in self.lines)
        self.lines = []
        data = text.encode('utf-8', 'replace')
        try:
            try:
                if os.path.getsize(self.path) + len(data) > LOG_MAX_BYTES:
                    os.replace(self.path, self.path + '.1')
            except FileNotFoundError:
                pass
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT
                         | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        except OSError as e:
            print('libvirt-gpu: warning: cannot write %s: %s'
                  % (self.path, e.strerror), file=self.stderr)


# --- the operations ----------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Request:
    """The accepted input of one hook call."""

    operation: str
    domain: config_xml.DomainDevices
    meta: metadata.GpuMetadata

    @property
    def label(self):
        return '%r (%s)' % (self.domain.name[:80], self.domain.uuid)

    @property
    def ours(self):
        return not self.meta.empty or bool(self.domain.mdev_uuids)


def parse_request(operation, data):
    """Validate stdin; InvalidInput (with the reason) when refused."""
    root = xmlutil.parse(data, 'domain XML on stdin')
    domain = config_xml.read_domain(root)
    return Request(operation=operation, domain=domain,
                   meta=metadata.parse(root))


class Hook(object):
    """One hook call's services (sysfs, backends, leases)."""

    def __init__(self, settings, sysfs, log,
                 mdevctl_dir=mdev_backend.MDEVCTL_DIR):
        self.settings = settings
        self.sysfs = sysfs
        self.log = log
        # Every vGPU kind (classic mdev, NVIDIA's vendor interface on VFs)
        # behind one backend: see backends.registry.
        self.mdev = registry.VgpuBackend(sysfs, settings.state_dir,
                                         host=None, mdevctl_dir=mdevctl_dir)
        self.pci = pci_backend.PciBackend(sysfs)
        self.store = state.LeaseStore(settings.state_dir)
        self.allocator = allocator_mod.Allocator(self.mdev, self.store,
                                                 settings.enabled)

    # prepare ------------------------------------------------------------

    def claims(self, req):
        """VgpuClaims of the domain: metadata first, then mdevctl."""
        claims = []
        hostdevs = set(req.domain.mdev_uuids)
        listed = set()
        for entry in req.meta.vgpus:
            listed.add(entry.uuid)
            if self._on_vendor_vf(req, entry):
                # <hostdev type='pci' managed='no'> of its VF (vGPU 17+)
                claims.append(allocator_mod.VgpuClaim(
                    uuid=entry.uuid, type_id=entry.type_id,
                    parent=entry.parent))
                continue
            if entry.uuid not in hostdevs:
                self.log.warning(
                    'metadata lists vGPU %s but <devices> has no <hostdev '
                    "type='mdev'> with that UUID; it is not created"
                    % entry.uuid)
                continue
            claims.append(allocator_mod.VgpuClaim(
                uuid=entry.uuid, type_id=entry.type_id, parent=entry.parent))
        for uuid in req.domain.mdev_uuids:
            if uuid in listed:
                continue
            definition = self.mdev.definition(uuid)
            if definition is None:
                self.log.info('mdev %s is neither in our metadata nor '
                              'defined by mdevctl: left to libvirt' % uuid)
                continue
            if definition.attrs:
                raise exception.MdevCreateFailed(
                    uuid=uuid, type_id=definition.type_id,
                    parent=definition.parent,
                    reason='its mdevctl definition sets attributes; start it '
                           'with `mdevctl start -u %s` instead' % uuid)
            claims.append(allocator_mod.VgpuClaim(
                uuid=uuid, type_id=definition.type_id,
                parent=definition.parent, managed=False))
        return claims

    def _on_vendor_vf(self, req, entry):
        """Whether the metadata entry is a vendor-interface vGPU: its
        parent is a VF with ``nvidia/`` that a PCI hostdev of the domain
        names."""
        return (entry.parent is not None
                and entry.parent in req.domain.pci_addresses
                and self.mdev.is_vendor(entry.parent))

    def check_pgpus(self, req):
        for entry in req.meta.pgpus:
            setting = self.settings.enabled.get(entry.address)
            if setting is not None:
                raise exception.GpuInUse(
                    address=entry.address,
                    reason='it is configured to offer vGPU type %s ([gpu]/'
                           'enabled_vgpu_types)' % setting.type_id)
            if entry.address not in req.domain.pci_addresses:
                self.log.warning(
                    "metadata lists GPU %s but <devices> has no <hostdev "
                    "type='pci'> with that address" % entry.address)
            self.pci.prepare(base.PgpuDevice(entry.address))

    def prepare(self, req):
        self.check_pgpus(req)
        claims = self.claims(req)
        if not claims:
            return 0
        grants = self.allocator.reserve(req.domain.uuid, claims)
        state.crash_point('prepare:reserved')
        created = []
        try:
            for grant in grants:
                if grant.existed:
                    continue
                self.mdev.prepare(grant.device)
                created.append(grant)
                state.crash_point('prepare:created')
            self.allocator.mark_created(
                [g.device.uuid for g in grants
                 if g.lease is not None and not g.existed])
            state.crash_point('prepare:marked')
        except BaseException:
            self.rollback(grants, created)
            self._give_back(req, grants)
            raise
        for grant in grants:
            d = grant.device
            self.log.info('%s vGPU %s (%s on %s)' % (
                'kept existing' if grant.existed else 'created', d.uuid,
                d.type_id, d.parent))
        return 0

    def rollback(self, grants, created):
        """Remove what this call created and drop the leases it took (a
        vGPU that cannot be removed keeps its lease, for reconcile)."""
        stuck = set()
        for grant in created:
            try:
                self.mdev.remove(grant.device.uuid)
                self.log.info('rolled back vGPU %s' % grant.device.uuid)
            except exception.LibvirtGpuError as e:
                stuck.add(grant.device.uuid)
                self.log.error('rollback: %s' % e)
        fresh = [g.device.uuid for g in grants
                 if g.lease is not None and not g.existed
                 and g.device.uuid not in stuck]
        try:
            self.allocator.forget(fresh)
        except exception.LibvirtGpuError as e:
            self.log.error('rollback: %s' % e)

    def _give_back(self, req, grants):
        """A refused start no longer uses the existing mdevs it borrowed."""
        borrowed = [g.device.uuid for g in grants if g.lease is None]
        if not borrowed:
            return
        try:
            self.allocator.give_back(req.domain.uuid, borrowed)
        except exception.LibvirtGpuError as e:
            self.log.error('rollback: %s' % e)

    # release / reconnect -------------------------------------------------

    def release(self, req):
        leases = self.allocator.begin_release(req.domain.uuid)
        done = []
        for lease in leases:
            try:
                removed = self.mdev.remove(lease.mdev_uuid)
            except exception.LibvirtGpuError as e:
                self.log.error('vGPU %s of %s stays (its lease too, for '
                               '`libvirt-gpu reconcile`): %s'
                               % (lease.mdev_uuid, req.label, e))
                continue
            done.append(lease.mdev_uuid)
            self.log.info('%s vGPU %s (%s on %s)' % (
                'removed' if removed else 'already gone:', lease.mdev_uuid,
                lease.type_id, lease.parent))
        if done:
            self.allocator.forget(done)
        return 0

    def reconnect(self, req):
        in_use = list(req.domain.mdev_uuids) + [
            e.uuid for e in req.meta.vgpus if self._on_vendor_vf(req, e)]
        missing = [uuid for uuid in in_use
                   if self.mdev.lookup(uuid) is None]
        for uuid in missing[:RECONNECT_LISTED]:
            self.log.warning('running domain %s uses vGPU %s, which does '
                             'not exist' % (req.label, uuid))
        if len(missing) > RECONNECT_LISTED:
            self.log.warning('running domain %s uses %d more vGPUs that do '
                             'not exist' % (req.label,
                                            len(missing) - RECONNECT_LISTED))
        self.log.info('reconnect: %d vGPU(s) in use, %d missing'
                      % (len(in_use), len(missing)))
        return 0


def run(argv, data, config_file=DEFAULT_CONFIG_FILE, settings_file=None,
        sysfs=None, stderr=None, mdevctl_dir=mdev_backend.MDEVCTL_DIR):
    """One hook call; returns the exit status.  ``sysfs`` replaces the
    configured ``Sysfs`` (tests)."""
    stderr = stderr if stderr is not None else sys.stderr
    log = HookLog(argv, stderr)
    operation = argv[2] if len(argv) > 2 else ''
    if operation not in HANDLED:
        return 0
    failure_rc = 1 if operation == PREPARE else 0
    try:
        req = parse_request(operation, data)
    except exception.InvalidInput as e:
        log.error('%s of domain %r refused, nothing done: %s'
                  % (operation, argv[1][:80] if len(argv) > 1 else '?', e))
        return failure_rc
    if not req.ours:
        return 0
    try:
        settings, note = load_settings(config_file, settings_file)
        log.path = os.path.join(settings.state_dir, LOG_NAME)
        if note:
            log.info(note)
        hook = Hook(settings, sysfs or sysfs_mod.Sysfs(settings.sysfs_root),
                    log, mdevctl_dir=mdevctl_dir)
        return getattr(hook, operation)(req)
    except exception.LibvirtGpuError as e:
        verb = {PREPARE: 'cannot start', RELEASE: 'cannot clean up after',
                RECONNECT: 'cannot check'}[operation]
        log.error('%s domain %s: %s' % (verb, req.label, e))
        return failure_rc
    except Exception as e:  # noqa: BLE001 - the hook's edge: report, exit
        log.error('internal error in %s of %s: %s: %s'
                  % (operation, req.label, type(e).__name__, e))
        return failure_rc
    finally:
        log.flush()


# --- installing --------------------------------------------------------------

DEFAULT_HOOKS_DIR = '/etc/libvirt/hooks'
INSTALL_NAME = 'libvirt-gpu'


@dataclasses.dataclass(frozen=True)
class Installed:
    """What ``install`` did."""

    path: str
    python: str
    config_file: str
    settings_file: str
    restart_needed: bool     # libvirtd had no qemu hook when it started


def hook_source():
    """``hooks/qemu`` of the source tree or of the installed data files."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for candidate in (os.path.join(here, 'hooks', 'qemu'),
                      os.path.join(sys.prefix, 'share', 'libvirt-gpu',
                                   'hooks', 'qemu')):
        if os.path.isfile(candidate):
            return candidate
    raise exception.ConfigError(reason='hooks/qemu not found next to the '
                                       'package nor under %s/share'
                                % sys.prefix)


def _executable(path):
    return os.path.isfile(path) and os.access(path, os.X_OK)


def hooks_enabled(hooks_dir):
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


def render_hook(source, python, config_file, settings_file, import_path):
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


def install(hooks_dir=DEFAULT_HOOKS_DIR, config_file=DEFAULT_CONFIG_FILE,
            python=None, check=True):
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
    settings, keys = _read_settings(config_file)
    settings_file = os.path.join(settings.state_dir, SETTINGS_NAME)
    package_path = os.path.dirname(os.path.dirname(os.path.abspath(
        __file__)))
    # The interpreter's own site-packages, then this package's directory
    # (an editable or source install), as the hook will use them.
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
    if problem:
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
             'import libvirt_gpu.hook' % import_path],
            capture_output=True, text=True, timeout=60)
        if probe.returncode != 0:
            raise exception.ConfigError(
                reason='%s cannot import libvirt_gpu as the hook would: %s'
                % (python, probe.stderr.strip()[-500:]
                   or 'exit status %d' % probe.returncode))
    restart_needed = not hooks_enabled(hooks_dir)
    write_settings(settings, config_file, settings_file, keys)
    drop_ins = os.path.join(hooks_dir, 'qemu.d')
    os.makedirs(drop_ins, mode=0o755, exist_ok=True)
    target = os.path.join(drop_ins, INSTALL_NAME)
    # Written beside qemu.d, then renamed in: libvirt never sees a partly
    # written executable in qemu.d.
    tmp = os.path.join(hooks_dir, '.%s.%d.tmp' % (INSTALL_NAME, os.getpid()))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC,
                 0o600)
    try:
        with os.fdopen(fd, 'w') as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if os.geteuid() == 0:
            os.chown(tmp, 0, 0)
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return Installed(path=target, python=python, config_file=config_file,
                     settings_file=settings_file,
                     restart_needed=restart_needed)


def main():
    """``python -m libvirt_gpu.hook <name> <op> <subop> <extra>``."""
    return run(sys.argv, sys.stdin.buffer.read(),
               os.environ.get('LIBVIRT_GPU_CONFIG', DEFAULT_CONFIG_FILE))


if __name__ == '__main__':
    sys.exit(main())
