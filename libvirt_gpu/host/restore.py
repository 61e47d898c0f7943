"""Put back, after a reboot, what the operator configured: ``libvirt-gpu
restore`` (run at boot by ``etc/libvirt-gpu/systemd/libvirt-gpu-restore.
service``, and safe to run any time: a second run changes nothing).

Neither SR-IOV VFs nor vGPUs survive a reboot.  In order:

0. **Layouts.**  The GPUs of ``[gpu]/layouts`` are brought to their
   layouts first (``host.layout_apply``: VFs, MIG GPU instances,
   mixed-size mode, the vGPU scheduler; MIG mode itself survives a
   reboot), so that the vGPUs below find their GPU instances.
1. **VFs.**  Every GPU whose vGPUs live on VFs needs them enabled again:
   the PFs named by ``[vgpu_<type>]/device_addresses`` (when an enabled
   type names no addresses, the PFs the kinds say their vGPUs live on:
   ``SriovGpus.sriov_pfs``) and the GPUs the kinds' own records mention
   (``Recorded.recorded_gpus``).  A PF with ``sriov_numvfs`` 0 gets all
   of ``sriov_totalvfs``::

       bus/pci/devices/0000:41:00.0/sriov_numvfs  <-  16

   NVIDIA asks for its ``/usr/lib/nvidia/sriov-manage -e <pf>`` instead:
   on the real ``/sys`` we run that script when it is installed (it ends in
   the same write after preparing the driver), and write ``sriov_numvfs``
   ourselves otherwise (any sysfs root but ``/sys``, or no script).  A PF
   with some but not all VFs enabled is left as it is, and reported.
   The GPUs carved for Nova (``[nova]/carved``) are among the PFs.
2. **VFs carved for Nova.**  With the VFs enabled, the carvings are
   resolved against the host (``env.carved``: ``carving.resolve``) and
   each carved VF gets its type, the lowest-numbered VFs of each GPU, so
   the same addresses carry the same types after every boot (Nova keeps
   their PCI records): the vGPU kind of the VF writes it (NVIDIA's vendor
   interface: type number 1153 for nvidia-1153 to the VF's type file).
   Each is recorded as Nova's (``store.carved.CarveRecord``) before it is
   written.  A VF that holds the type already (carved before, by us or
   by hand) is adopted as it is; one that holds another type, or one of
   our own vGPUs, is reported and left alone (the addresses must not
   move).  A recorded VF no longer carved by the configuration is reset
   and forgotten once no running guest uses it (``vf_in_use``, asked
   through libvirt); while a guest uses it, or when that cannot be told
   (``--no-libvirt``), it stays Nova's and is reported.  A record that
   cannot be read is renamed ``nova-carved.json.damaged-<UTC time>``
   and rebuilt from the configuration (``CarveRecord.set_aside``).  The
   writes are the vGPU kind's (``capabilities.Carvable``: ``write_type``).
   A carving the host cannot satisfy is reported and nothing of it
   written.
3. **Persistent vGPUs.**  What each kind records to start with the host
   (``Persistent.restorable``: the kind's persistent definitions marked to
   start at boot) is created where it does not exist; what a kind leaves
   alone is reported with its reason.  The kinds are asked from the last
   (the fallback, whose definitions an operator wrote) to the first.
4. **Stale vGPUs.**  Each kind's own clean-up (``Recorded.boot_cleanup``):
   a vGPU of ours whose owner (the domain of its lease) is not running is
   reset, a record of one that is gone is forgotten.  vGPUs that are not
   ours are reported, never touched (the VFs carved for Nova are not
   reported: they are step 2's); without libvirt to ask, nothing is
   reset.

5. **Other routes' leftovers.**  Nova's definitions of Cyborg's vGPUs
   that no domain names (``reconcile.leftovers``: the ARQ is gone; libvirt
   started them at boot) are removed and undefined, so that the next bind
   of the same Cyborg handle finds its UUID free.  Needs libvirt (the
   second boot unit, ``libvirt-gpu-restore-routes.service``, after libvirtd
   and before nova-compute); without it, reported as skipped.  Step 3
   never creates a definition on a GPU of another route
   (``routes.Routes``): Nova starts its own (``init_host``).

Every step is reported (``RestoreReport``): what changed, what was already
right, what failed and why.
"""

from __future__ import annotations

import os
import subprocess
import time

from libvirt_gpu.devices.backends import base
from libvirt_gpu.devices import capabilities
from libvirt_gpu.devices.backends import registry
from libvirt_gpu.devices import carving
from libvirt_gpu import exception
from libvirt_gpu.store import carved as carve_record
from libvirt_gpu.store import figures
from libvirt_gpu.util import logs
from libvirt_gpu import objects
from libvirt_gpu.util import records
from libvirt_gpu.devices import sysfs as sysfs_mod

LOG = logs.getLogger(__name__)

SRIOV_MANAGE = '/usr/lib/nvidia/sriov-manage'

# Actions (``Action.action``).
ENABLED_VFS = 'enabled-vfs'
CREATED = 'created'
RESET = 'reset'
WOULD = 'would'          # --dry-run: what a real run would change
FORGOT = 'forgot'
UNDEFINED = 'undefined'  # step 5: another route's leftover definition
CARVED = 'carved'
OK = 'ok'
SKIPPED = 'skipped'
FAILED = 'failed'
APPLIED = 'applied'      # a layout step
CHANGES = (ENABLED_VFS, CARVED, CREATED, RESET, FORGOT, APPLIED, UNDEFINED)


@records.record
class Action:
    """One thing restore looked at."""

    action: str            # one of the constants above
    what: str              # 'vfs', or a kind's noun ('vgpu')
    target: str            # PF address, vGPU UUID, VF address
    detail: str

    @property
    def changed(self):
        return self.action in CHANGES

    def to_json(self):
        return {'action': self.action, 'what': self.what,
                'target': self.target, 'detail': self.detail,
                'changed': self.changed}


@records.record
class RestoreReport:
    """What ``restore`` did; the report shape of the CLI (``summary``,
    ``COLUMNS`` and ``rows``, ``details``, ``to_json``)."""

    actions: tuple[Action, ...]

    COLUMNS = ('ACTION', 'WHAT', 'TARGET', 'DETAIL')

    @property
    def changed(self):
        return tuple(a for a in self.actions if a.changed)

    @property
    def failed(self):
        return tuple(a for a in self.actions if a.action == FAILED)

    def summary(self):
        return '%d change(s), %d failure(s)' % (
            len(self.changed), len(self.failed))

    def rows(self):
        return [(a.action, a.what, a.target, a.detail) for a in self.actions]

    def details(self):
        return ()

    def to_json(self):
        return {'changed': len(self.changed), 'failed': len(self.failed),
                'actions': [a.to_json() for a in self.actions]}


# --- which GPUs need VFs -----------------------------------------------------

def vf_targets(env):
    """PF addresses whose VFs restore enables on the host ``env`` (step 1
    of the module doc), sorted."""
    conf, sysfs = env.conf, env.sysfs
    targets = set()
    everywhere = False
    for type_id in conf.gpu.enabled_vgpu_types:
        from libvirt_gpu.devices import enablement
        addresses = enablement.device_addresses(conf, type_id)
        if not addresses:
            everywhere = True
        targets.update(addresses)
    if everywhere:
        for kind in registry.having(env.kind_classes,
                                    capabilities.SriovGpus):
            targets.update(kind.sriov_pfs(sysfs))
    for kind in env.vgpus.having(capabilities.Recorded):
        targets.update(kind.recorded_gpus())
    targets.update(carved_gpus(env))
    return sorted(t for t in targets if sysfs.isdir(sysfs.pci_dir(t))
                  and base.is_sriov_pf(sysfs, t))


def carved_gpus(env):
    """The physical GPUs the carvings for Nova name (by address or model,
    read before their VFs are enabled) and those the record names."""
    found = set()
    if env.conf is not None:
        found.update(carving.matching(carving.carvings(env.conf),
                                      env.discovered.gpus))
    try:
        recorded = carve_record.CarveRecord(env.state_dir).read()
    except carve_record.DamagedRecord as e:
        # step 2 sets it aside and rebuilds it from the configuration
        LOG.warning('%s', e)
        recorded = {}
    found.update(r.gpu for r in recorded.values())
    return found


# --- the steps ---------------------------------------------------------------

class Restore(object):
    """One restore run.

    :param env: the host (``environment.Environment``: its sysfs, state
        directory, its vGPU kinds; no libvirt: restore runs before
        libvirtd).
    :param owner_running: ``f(uuid) -> True | False | None``: whether the
        guest that holds our vGPU ``uuid`` runs (None: cannot tell).
    :param sriov_manage: path of NVIDIA's script, or None to write
        ``sriov_numvfs`` directly.
    :param settle_timeout: seconds to wait for enabled VFs to show their
        vGPU interface (the driver registers them after the VFs appear).
    :param vf_in_use: ``f(vf) -> True | False | None``: whether a running
        guest uses the PCI function ``vf`` (None: cannot tell).
    :param leftovers: ``f(dry_run) -> [Action]`` of step 5 (the CLI's:
        ``reconcile.leftovers`` through libvirt), or None when libvirt is
        not asked (step 5 is then skipped).
    """

    def __init__(self, env, owner_running=None, sriov_manage=None,
                 settle_timeout=30.0, dry_run=False, vf_in_use=None,
                 leftovers=None):
        self.dry_run = dry_run
        self.env = env
        self.sysfs = env.sysfs
        self.state_dir = env.state_dir
        self.owner_running = owner_running or (lambda uuid: None)
        self.vf_in_use = vf_in_use or (lambda vf: None)
        self.leftovers = leftovers
        self.sriov_manage = sriov_manage
        self.settle_timeout = settle_timeout
        self.actions = []
        self.carved_vfs = frozenset()     # step 2 tells

    def _note(self, action, what, target, detail):
        self.actions.append(Action(action, what, str(target), detail))
        LOG.info('%s %s %s: %s', action, what, target, detail)

    def run(self, vf_pfs):
        self.apply_layouts()
        for pf in vf_pfs:
            self.enable_vfs(pf)
        self.carve()
        self.restore_persistent()
        self.reset_stale()
        self.other_routes()
        return RestoreReport(actions=tuple(self.actions))

    # 0. layouts --------------------------------------------------------------

    def apply_layouts(self):
        conf = self.env.conf
        if conf is None or not getattr(conf.gpu, 'layouts', None):
            return
        from libvirt_gpu.host import layout_apply
        env = self.env
        try:
            report = layout_apply.converge(
                env.layouts, env.discovered.gpus, env.nvml, env.sysfs,
                env.state_dir, layout_apply.layout_kinds(env.vgpus),
                holders=layout_apply.lease_holders(env.store),
                dry_run=self.dry_run,
                sriov_manage=self.sriov_manage,
                settle_timeout=self.settle_timeout)
        except exception.LibvirtGpuError as e:
            self._note(FAILED, 'layout', 'layouts', str(e))
            return
        actions = {layout_apply.DONE: APPLIED, layout_apply.WOULD: WOULD,
                   layout_apply.OK: OK}
        for result in report.results:
            self._note(actions.get(result.status, FAILED), 'layout',
                       result.address, '%s: %s' % (result.action,
                                                   result.detail))

    # 1. VFs ------------------------------------------------------------------

    def enable_vfs(self, pf):
        objects.typed(pf, objects.PciAddress, 'pf')
        total = self.sysfs.sriov_totalvfs(pf)
        current = self.sysfs.sriov_numvfs(pf) or 0
        if not total:
            self._note(SKIPPED, 'vfs', pf, 'not an SR-IOV PF')
            return
        if current == total:
            self._note(OK, 'vfs', pf, 'all %d VFs enabled' % total)
            return
        if current:
            self._note(SKIPPED, 'vfs', pf, '%d of %d VFs enabled by someone '
                       'else: left as they are' % (current, total))
            return
        if self.dry_run:
            self._note(WOULD, 'vfs', pf, 'would enable %d VFs (%s)' % (
                total, self.sriov_manage + ' -e' if self.sriov_manage
                else 'write %d to sriov_numvfs' % total))
            return
        try:
            how = self._enable(pf, total)
        except (exception.LibvirtGpuError, OSError,
                subprocess.SubprocessError) as e:
            self._note(FAILED, 'vfs', pf, 'cannot enable VFs: %s' % e)
            return
        missing = self._settle(pf, total)
        detail = 'enabled %d VFs (%s)' % (total, how)
        if missing:
            detail += '; %d VF(s) show no vGPU interface yet' % missing
        self._note(ENABLED_VFS, 'vfs', pf, detail)

    def _enable(self, pf, total):
        if self.sriov_manage:
            # /usr/lib/nvidia/sriov-manage -e 0000:41:00.0
            proc = subprocess.run([self.sriov_manage, '-e', str(pf)],
                                  capture_output=True, text=True,
                                  timeout=300)
            if proc.returncode != 0:
                raise exception.SysfsWriteError(
                    path=str(pf), reason='%s -e exited %d: %s' % (
                        self.sriov_manage, proc.returncode,
                        (proc.stderr or proc.stdout).strip()[-300:]))
            return self.sriov_manage + ' -e'
        self.sysfs.set_sriov_numvfs(pf, total)
        return 'sriov_numvfs'

    def _ready(self, vf):
        return (self.sysfs.isdir(self.sysfs.types_dir(vf))
                or self.env.vgpus.is_parent(vf))

    def _settle(self, pf, total):
        """Wait until the PF has ``total`` VFs that each show mdev types or
        the vendor interface; returns how many do not."""
        deadline = time.monotonic() + self.settle_timeout
        while True:
            vfs = self.sysfs.virtfns(pf)
            missing = total - sum(1 for vf in vfs if self._ready(vf))
            if not missing or time.monotonic() >= deadline:
                return missing
            time.sleep(0.1)

    def _dry_create(self, backend, device, what, where):
        """``--dry-run``: what creating ``device`` would do."""
        if backend.lookup(device.uuid) is not None:
            self._note(OK, what, device.uuid, 'exists: ' + where)
        else:
            self._note(WOULD, what, device.uuid, 'would create ' + where)

    # 2. VFs carved for Nova --------------------------------------------------

    def carve(self):
        """Step 2 of the module doc."""
        record = carve_record.CarveRecord(self.state_dir)
        try:
            self.carved_vfs = frozenset(record.read())
        except carve_record.DamagedRecord as e:
            if not self._set_aside(record, e):
                return
        # the host as it is now that its VFs are enabled
        self.env = self.env.rediscover()
        try:
            planned = self.env.carved.planned
        except exception.ConfigError as e:
            self._note(FAILED, 'carving', '[nova]/carved', str(e))
            return
        self.carved_vfs |= self.env.carved.vfs
        wanted = set()
        for carved in planned:
            for vf in carved.vfs:
                wanted.add(vf)
                self._carve_vf(record, carved, vf)
        self._uncarve(record, wanted)

    def _set_aside(self, record, error):
        """A record that cannot be read is moved aside (its name and the
        time), to be rebuilt from the configuration; whether to go on."""
        what, reason = 'carve-record', error.kwargs['damage']
        if self.dry_run:
            self._note(WOULD, what, record.path, 'would move it aside and '
                       'rebuild it from the configuration (%s)' % reason)
            return False
        try:
            aside = record.set_aside()
        except (OSError, exception.StateError) as e:
            self._note(FAILED, what, record.path, 'cannot be read (%s) nor '
                       'moved aside (%s): move it away by hand and run '
                       '`libvirt-gpu restore` again' % (reason, e))
            return False
        if aside is not None:
            self._note(FORGOT, what, record.path, 'cannot be read (%s): '
                       'moved aside to %s; rebuilt from the configuration '
                       '(a VF it named that the configuration no longer '
                       'carves is no longer held as Nova\'s)'
                       % (reason, aside))
        return True

    def _carving_kind(self, vf):
        """The vGPU kind that carves ``vf``, or None."""
        kind = self.env.vgpus.kind_of(vf)
        if not isinstance(kind, capabilities.Carvable) \
                or not kind.is_parent(vf):
            return None
        return kind

    def _carve_vf(self, record, carved, vf):
        what = 'carved-vf'
        detail = '%s (%s) for Nova, [%s]' % (
            carved.type_id, carved.type_name or 'unnamed',
            carved.carving.section)
        kind = self._carving_kind(vf)
        if kind is None:
            self._note(FAILED, what, vf, 'no vendor interface (%s): is '
                       'NVIDIA\'s vGPU manager loaded?' % detail)
            return
        ours = self.env.vgpus.reserved_parents().get(vf)
        if ours is not None:
            self._note(FAILED, what, vf, 'holds libvirt-gpu\'s own vGPU %s; '
                       'move it off this GPU first (docs/admin/nova.md) '
                       '(%s)' % (ours, detail))
            return
        held = kind.held_type(vf)
        if held is not None and held != carved.type_id:
            self._note(FAILED, what, vf, 'holds %s, not %s: left alone; '
                       'the carved VFs are always the lowest-numbered, so '
                       'reset this one once nothing uses it' % (held, detail))
            return
        entry = carve_record.CarvedVf(vf=vf, gpu=carved.gpu,
                                      type_id=carved.type_id,
                                      carving=carved.carving.name,
                                      type_name=carved.type_name)
        if self.dry_run:
            self._note(OK if held else WOULD, what, vf,
                       ('holds ' if held else 'would write ') + detail)
            return
        with record.locked() as entries:
            entries[vf] = entry
        if held:
            self._note(OK, what, vf, 'holds ' + detail)
            return
        try:
            kind.write_type(vf, carved.type_id)
        except exception.LibvirtGpuError as e:
            self._note(FAILED, what, vf, '%s: %s' % (detail, e))
            return
        self._note(CARVED, what, vf, 'wrote ' + detail)

    def _uncarve(self, record, wanted):
        """Recorded VFs the configuration no longer carves."""
        what = 'carved-vf'
        for vf, entry in sorted(record.read().items()):
            if vf in wanted:
                continue
            kind = self._carving_kind(vf)
            held = kind.held_type(vf) if kind is not None else None
            gone = '[%s] no longer carves it' % carving.section(
                entry.carving)
            if held is not None:
                users = self.vf_in_use(vf)
                if users is not False:
                    self._note(SKIPPED, what, vf, '%s, but %s: it keeps %s '
                               'and stays Nova\'s' % (
                                   gone, 'a running guest uses it' if users
                                   else 'whether a guest uses it cannot be '
                                   'told (run restore with libvirt)', held))
                    continue
            if self.dry_run:
                self._note(WOULD, what, vf, '%s: would %sforget it' % (
                    gone, 'reset it (%s) and ' % held if held else ''))
                continue
            if held is not None:
                try:
                    kind.clear_type(vf)
                except exception.LibvirtGpuError as e:
                    self._note(FAILED, what, vf, '%s: %s' % (gone, e))
                    continue
            with record.locked() as entries:
                entries.pop(vf, None)
            self._note(RESET if held else FORGOT, what, vf, '%s: %s' % (
                gone, 'reset (it held %s), no guest uses it' % held
                if held else 'it holds nothing'))

    # 3. persistent vGPUs ----------------------------------------------------

    def restore_persistent(self):
        # the fallback kind first: an operator's definitions before ours
        for kind in reversed(self.env.vgpus.having(capabilities.Persistent)):
            for item in kind.restorable():
                self._restore_one(kind, item)

    def _restore_one(self, kind, item):
        if item.device is None:
            self._note(FAILED if item.failed else SKIPPED, kind.noun,
                       item.uuid, item.detail)
            return
        from libvirt_gpu.devices import routes as routes_mod
        route = self.env.routes.route_of_parent(self.sysfs,
                                                item.device.parent)
        if route != routes_mod.OURS:
            self._note(SKIPPED, kind.noun, item.uuid, '%s: the GPU is %s; '
                       'its definitions are not ours to start (step 5 '
                       'judges a Cyborg one)' % (item.detail,
                                                 routes_mod.LABELS[route]))
            return
        if self.dry_run:
            self._dry_create(kind, item.device, kind.noun, item.detail)
            return
        try:
            created = kind.prepare(item.device)
        except exception.LibvirtGpuError as e:
            self._note(FAILED, kind.noun, item.uuid,
                       '%s: %s' % (item.detail, e))
            return
        self._note(CREATED if created else OK, kind.noun, item.uuid,
                   ('created ' if created else 'exists: ') + item.detail)

    # 4. stale vGPUs ----------------------------------------------------------

    def reset_stale(self):
        """Each kind's own clean-up after a reboot
        (``Recorded.boot_cleanup``); what it says of a VF carved for Nova
        (not one of the kind's) is step 2's, left out."""
        carved = {str(vf) for vf in self.carved_vfs}
        for kind in self.env.vgpus.having(capabilities.Recorded):
            for note in kind.boot_cleanup(self.owner_running, self.dry_run):
                if note.action == SKIPPED and note.target in carved:
                    continue
                self._note(note.action, kind.noun, note.target, note.detail)

    # 5. other routes' leftovers ------------------------------------------

    def other_routes(self):
        from libvirt_gpu.devices import routes as routes_mod
        if not self.env.routes.of(routes_mod.CYBORG):
            return
        if self.leftovers is None:
            self._note(SKIPPED, 'vgpu', 'cyborg', 'libvirt not asked '
                       '(--no-libvirt): Nova\'s leftover definitions on '
                       'Cyborg\'s GPUs are judged by a restore with libvirt '
                       '(libvirt-gpu-restore-routes.service)')
            return
        try:
            found = self.leftovers(self.dry_run)
        except exception.LibvirtGpuError as e:
            self._note(FAILED, 'vgpu', 'cyborg', 'cannot judge Nova\'s '
                       'leftover definitions on Cyborg\'s GPUs: %s' % e)
            return
        for action in found:
            self._note(action.action, action.what, action.target,
                       action.detail)


def restore(env, vf_pfs=(), **kwargs):
    """Run every step (see the module doc) on the host ``env``; returns a
    RestoreReport.  A run that is not a dry run leaves its outcome for
    ``libvirt-gpu exporter`` (``figures``)."""
    dry_run = kwargs.get('dry_run', False)
    try:
        report = Restore(env, **kwargs).run(vf_pfs)
    except exception.LibvirtGpuError as e:
        if not dry_run:
            figures.record_outcome(env.state_dir, figures.RESTORE, error=e)
        raise
    if not dry_run:
        figures.record_outcome(
            env.state_dir, figures.RESTORE, changes=len(report.changed),
            error=('; '.join('%s %s: %s' % (a.what, a.target, a.detail)
                             for a in report.failed) or None))
    return report


def vf_user_check(uri):
    """``vf_in_use`` for a real host: whether a running domain of libvirt
    at ``uri`` has the PCI function as a hostdev; None when libvirt
    cannot be asked or a domain's XML cannot be read."""
    from libvirt_gpu.virt import host as host_mod
    cache = {}

    def in_use_now():
        if 'used' not in cache:
            used = set()
            try:
                with host_mod.Host(uri, read_only=True) as h:
                    for guest in h.list_guests():
                        if guest.is_active():
                            devices, _ = guest.devices()
                            used.update(devices.pci_addresses)
            except (exception.LibvirtGpuError, exception.InvalidInput) as e:
                LOG.warning('cannot ask libvirt which VFs running guests '
                            'use (%s): no VF carved before is reset', e)
                used = None
            cache['used'] = used
        return cache['used']

    def check(vf):
        used = in_use_now()
        return None if used is None else vf in used

    return check


def lease_owner_check(state_dir, uri):
    """``owner_running`` for a real host: the lease of a vGPU names its
    domain (``state.LeaseStore``); libvirt at ``uri`` says whether that
    domain runs.  None when libvirt cannot be asked."""
    from libvirt_gpu.virt import host as host_mod
    from libvirt_gpu.store import state

    cache = {}

    def running_domains():
        if 'running' not in cache:
            try:
                with host_mod.Host(uri, read_only=True) as h:
                    cache['running'] = {d.UUIDString() for d in
                                        h.list_domains() if d.isActive()}
            except exception.LibvirtGpuError as e:
                LOG.warning('cannot ask libvirt which guests run (%s): no '
                            'vGPU is reset', e)
                cache['running'] = None
        return cache['running']

    def check(uuid):
        try:
            leases = {lease.vgpu_uuid: lease for lease in
                      state.LeaseStore(state_dir).leases()}
        except exception.LibvirtGpuError as e:
            LOG.warning('cannot read leases: %s', e)
            return None
        lease = leases.get(uuid)
        if lease is None or lease.domain_uuid is None:
            return False
        running = running_domains()
        if running is None:
            return None
        return lease.domain_uuid in running

    return check


def sriov_manage_for(sysfs_root, requested='auto'):
    """Which way to enable VFs: ``requested`` a path (use it), ``none``
    (write sysfs), or ``auto``: NVIDIA's script on the real /sys when it is
    installed, sysfs otherwise."""
    if requested in (None, 'none'):
        return None
    if requested != 'auto':
        return requested
    if sysfs_mod.Sysfs.is_host_sysfs(sysfs_root) and \
            os.access(SRIOV_MANAGE, os.X_OK):
        return SRIOV_MANAGE
    return None
