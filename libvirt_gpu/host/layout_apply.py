"""Converging GPUs to their layouts: each GPU read (``GpuDriver``: NVML
and sysfs), checked against its layout, planned (``layout_plan``) and,
unless it is a dry run, changed step by step.

- A GPU whose plan has steps and that holds a vGPU is not touched: the
  refusal names the domains that use it (``holders``, given by the caller
  from the lease store).
- The first step that fails stops the run: the report says what was done
  and what is left.  Nothing is left half made (a GPU instance whose
  compute instance cannot be made is destroyed again, ``nvml.Session``);
  what was done is progress towards the layout, so the next run plans
  only what is still missing.
- Every check that can be made before the first step is made then, by
  ``plan`` too: a layout that needs MIG mode changed is checked against
  what the GPU reports now where that is enough (``layout.reports_for``),
  and again once MIG mode changed (a MIG mode change can change what the
  GPU reports: its profiles and types).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time

from libvirt_gpu.devices import capabilities
from libvirt_gpu.devices import layout as layout_mod
from libvirt_gpu.devices import layout_plan
from libvirt_gpu.devices import nvml
from libvirt_gpu import exception
from libvirt_gpu.util import logs
from libvirt_gpu import objects
from libvirt_gpu.store import statedir
from libvirt_gpu.util import records

LOG = logs.getLogger(__name__)

DONE = 'done'
WOULD = 'would'
FAILED = 'failed'
REFUSED = 'refused'
OK = 'ok'

# in the state directory: held by each `layout plan`, `layout apply` and
# `restore` while it reads and changes the host's GPUs
LOCK_NAME = 'layouts.lock'
LOCK_TIMEOUT = 60.0


class LayoutsLocked(exception.LibvirtGpuError):
    msg_fmt = ('another `libvirt-gpu layout apply` or `restore` is changing '
               'the GPUs of this host: %(reason)s; run this again once it '
               'has ended')


class GpuDriver(object):
    """One host's GPUs as the layouts see them: ``session`` an open
    ``nvml.Session``, ``sysfs`` a ``Sysfs``, ``kinds`` the vGPU kinds
    whose vGPUs live on the VFs a layout shapes
    (``capabilities.LayoutDriver``: which VFs show their interface, which
    hold a vGPU), handed in by the caller (``layout_kinds``).

    :param sriov_manage: NVIDIA's script (``-e``/``-d <pf>``) to enable and
        disable VFs, or None to write ``sriov_numvfs``.
    :param settle_timeout: seconds to wait for enabled VFs to show the
        vendor interface.
    """

    def __init__(self, session, sysfs, kinds, sriov_manage=None,
                 settle_timeout=30.0):
        self.session = session
        self.sysfs = sysfs
        self.kinds = tuple(kinds)
        for kind in self.kinds:
            if not isinstance(kind, capabilities.LayoutDriver):
                raise TypeError('%r is no capabilities.LayoutDriver' % (kind,))
        self.sriov_manage = sriov_manage
        self.settle_timeout = settle_timeout

    def facts(self, address):
        return layout_mod.GpuFacts(
            address=address, mig=self.session.mig_mode(address),
            profiles=self.session.gi_profiles(address),
            types=self.session.vgpu_types(address, placements=True),
            vfs_total=self.sysfs.sriov_totalvfs(address) or 0)

    def vgpus(self, address):
        """The VFs of the GPU that hold a vGPU now, sorted."""
        return tuple(sorted({vf for kind in self.kinds
                             for vf in kind.layout_vgpus(address)}))

    def state(self, address, layout, facts):
        mig = facts.mig
        return layout_mod.GpuState(
            address=address, mig=mig,
            vfs=self.sysfs.sriov_numvfs(address) or 0,
            vfs_total=facts.vfs_total,
            gpu_instances=(self.session.gpu_instances(
                address, facts.profiles,
                schedulers=layout.mode == layout_mod.MIG_TIME_SLICED,
                computes=True) if mig else ()),
            mixed_size=None if mig else self.session.mixed_size(address),
            scheduler=self.session.scheduler(address),
            vgpus=self.vgpus(address))

    # -- the steps -------------------------------------------------------

    def run(self, address, step, facts):
        action = step.action
        if action == layout_plan.DESTROY_GI:
            self.session.destroy_gpu_instance(address, step.gi_id)
        elif action == layout_plan.DISABLE_VFS:
            self._vfs(address, 0)
        elif action == layout_plan.MIG_MODE:
            self.session.set_mig_mode(address, step.on)
        elif action == layout_plan.ENABLE_VFS:
            self._vfs(address, step.count)
        elif action == layout_plan.CREATE_GI:
            self.session.create_gpu_instance(
                address, facts.profile_by_id(step.profile_id), step.start)
        elif action == layout_plan.MIXED_SIZE:
            self.session.set_mixed_size(address, step.on)
        elif action == layout_plan.SCHEDULER:
            self.session.set_scheduler(address, step.scheduler)
        elif action == layout_plan.GI_SCHEDULER:
            self.session.set_gpu_instances_scheduler(
                address, facts.profiles, step.scheduler)
        else:
            raise exception.InvalidInput(reason='no layout step %r'
                                         % action)

    def _vfs(self, address, count):
        if self.sriov_manage:
            # /usr/lib/nvidia/sriov-manage -e|-d 0000:41:00.0
            flag = '-e' if count else '-d'
            proc = subprocess.run([self.sriov_manage, flag, str(address)],
                                  capture_output=True, text=True,
                                  timeout=300)
            if proc.returncode != 0:
                raise exception.SysfsWriteError(
                    path=str(address), reason='%s %s exited %d: %s' % (
                        self.sriov_manage, flag, proc.returncode,
                        (proc.stderr or proc.stdout).strip()[-300:]))
        else:
            self.sysfs.set_sriov_numvfs(address, count)
            if not count and self.sysfs.virtfns(address):
                self._vfs_stayed(address)
        if count:
            self._settle(address, count)

    def _vfs_stayed(self, address):
        """The kernel removes the VFs before the ``sriov_numvfs`` write
        returns: VFs still there mean nothing answered it."""
        raise exception.SysfsWriteError(
                path=str(address), reason='VFs disabled, but its %d VFs are '
                'still there: nothing answered the write (a tree written by '
                '`libvirt-gpu simulate PROFILE DIR` is plain files and '
                'cannot change its VFs; serve it with `libvirt-gpu simulate '
                '--live PROFILE DIR` instead)'
                % len(self.sysfs.virtfns(address)))

    def _settle(self, address, count):
        deadline = time.monotonic() + self.settle_timeout
        while True:
            ready = sum(1 for vf in self.sysfs.virtfns(address)
                        if any(kind.layout_ready(vf)
                               for kind in self.kinds))
            if ready >= count or time.monotonic() >= deadline:
                return
            time.sleep(0.1)


@records.record
class Result:
    """One step (or refusal) of one GPU."""

    status: str               # DONE, WOULD, FAILED, REFUSED, OK
    layout: str
    address: objects.PciAddress
    action: str               # a layout_plan action, or 'check'/'layout'
    detail: str

    def to_json(self):
        return {'status': self.status, 'layout': self.layout,
                'gpu': str(self.address), 'action': self.action,
                'detail': self.detail}


@records.record
class Report:
    """What ``layout plan``/``apply`` did or would do (the CLI's report
    shape: ``summary``, ``COLUMNS``, ``rows``, ``details``, ``to_json``)."""

    results: tuple
    plans: tuple = ()          # layout_plan.GpuPlan
    module_option: str | None = None

    COLUMNS = ('STATUS', 'LAYOUT', 'GPU', 'STEP', 'DETAIL')

    @property
    def failed(self):
        return tuple(r for r in self.results
                     if r.status in (FAILED, REFUSED))

    @property
    def changed(self):
        return tuple(r for r in self.results if r.status == DONE)

    def summary(self):
        would = sum(1 for r in self.results if r.status == WOULD)
        return '%d GPU(s); %d step(s) done, %d to do, %d failed or refused' % (
            len(self.plans), len(self.changed), would, len(self.failed))

    def rows(self):
        return [(r.status, r.layout, str(r.address), r.action, r.detail)
                for r in self.results]

    def details(self):
        if self.module_option:
            return ('to set the schedulers at module load instead (after a '
                    'driver reload), in /etc/modprobe.d/nvidia-vgpu.conf:',
                    '  ' + self.module_option)
        return ()

    def to_json(self):
        return {'results': [r.to_json() for r in self.results],
                'gpus': [{'layout': p.layout, 'gpu': str(p.address),
                          'steps': [s.to_json() for s in p.steps],
                          'vgpus': [str(vf) for vf in p.vgpus]}
                         for p in self.plans],
                'failed': len(self.failed), 'done': len(self.changed),
                'module_option': self.module_option}


def _names(items):
    items = list(items)
    return '; '.join(items) if items else 'nothing'


class Applier(object):
    """One ``layout plan`` or ``apply`` run over ``targets``
    (``[(Layout, PciAddress)]``).

    :param driver: a ``GpuDriver``.
    :param holders: ``f(address, vfs) -> [str]``: who uses the vGPUs on
        those VFs (domain names or UUIDs).
    :param progress: ``f(Result)``, called once per step as it ends.
    """

    def __init__(self, driver, holders=None, dry_run=False, progress=None):
        self.driver = driver
        self.holders = holders or (lambda address, vfs: [
            'a vGPU on %s' % vf for vf in vfs])
        self.dry_run = dry_run
        self.progress = progress or (lambda result: None)
        self.results = []
        self.plans = []

    def _note(self, status, layout, address, action, detail):
        result = Result(status, layout.name, address, action, detail)
        self.results.append(result)
        LOG.info('layout %s, GPU %s: %s %s: %s', layout.name, address,
                 status, action, detail)
        self.progress(result)
        return result

    def run(self, targets, every_gpu=False):
        schedulers = {}
        for layout, address in targets:
            scheduler = layout_mod.wanted_scheduler(layout)
            if scheduler is not None:
                schedulers[address] = scheduler
            if not self._converge(layout, address) and not self.dry_run:
                break
        return Report(results=tuple(self.results), plans=tuple(self.plans),
                      module_option=layout_mod.module_option(
                          schedulers, every_gpu=every_gpu))

    def _checked(self, layout, address):
        """The GPU's facts, with the layout checked against them before
        any step wherever the GPU says enough in the MIG mode it has now
        (``layout.check_before_steps``; else once MIG mode changed)."""
        facts = self.driver.facts(address)
        layout_mod.check_before_steps(layout, facts)
        return facts

    def _converge(self, layout, address):
        """Plan (and unless a dry run, run) one GPU; False when it stopped
        on a refusal or a failure."""
        try:
            facts = self._checked(layout, address)
            state = self.driver.state(address, layout, facts)
            plan = layout_plan.plan(layout, facts, state)
        except exception.LibvirtGpuError as e:
            self.plans.append(layout_plan.GpuPlan(layout.name, address, ()))
            self._note(FAILED, layout, address, 'check', str(e))
            return False
        self.plans.append(plan)
        if plan.converged:
            self._note(OK, layout, address, 'layout', 'the GPU is at its '
                       'layout: nothing to do')
            return True
        if plan.vgpus:
            error = layout_mod.GpuBusy(
                layout=layout.name, address=address,
                domains=', '.join(self.holders(address, plan.vgpus)),
                what=', '.join(s.action for s in plan.steps))
            self._note(REFUSED, layout, address, 'layout', str(error))
            return False
        if self.dry_run:
            for step in plan.steps:
                self._note(WOULD, layout, address, step.action, step.detail)
            return True
        return self._run_steps(layout, address, facts, plan.steps)

    def _run_steps(self, layout, address, facts, steps):
        done = []
        for index, step in enumerate(steps):
            left = _names(s.detail for s in steps[index + 1:])
            try:
                self.driver.run(address, step, facts)
            except (exception.LibvirtGpuError, OSError,
                    subprocess.SubprocessError) as e:
                error = layout_mod.StepFailed(
                    layout=layout.name, address=address,
                    step=step.detail, reason=e, done=_names(done),
                    left=left)
                self._note(FAILED, layout, address, step.action, str(error))
                return False
            done.append(step.detail)
            self._note(DONE, layout, address, step.action, step.detail)
            if step.action == layout_plan.MIG_MODE:
                try:
                    facts = self._checked(layout, address)
                    if bool(facts.mig) != step.on:
                        raise layout_mod.LayoutError(
                            layout=layout.name, address=address,
                            reason='MIG mode is set but not current: the '
                                   'GPU needs a reset (nvidia-smi -r -i '
                                   '<index>, with no process on it) or a '
                                   'reboot')
                except exception.LibvirtGpuError as e:
                    self._note(FAILED, layout, address, 'check',
                               '%s; done: %s; left: %s' % (
                                   e, _names(done), left))
                    return False
        return True


def targets(layouts_by_gpu, only=None):
    """``[(Layout, PciAddress)]`` sorted by address, of ``only`` (a
    PciAddress) when given; InvalidInput when ``only`` is in no layout."""
    found = sorted(((layout, address)
                    for address, layout in layouts_by_gpu.items()),
                   key=lambda pair: pair[1])
    if only is not None:
        found = [(layout, address) for layout, address in found
                 if address == only]
        if not found:
            raise exception.InvalidInput(
                reason='the GPU %s is in no layout ([gpu]/layouts; '
                       '`libvirt-gpu layout plan` lists the GPUs in one)'
                       % only)
    return found


def lease_holders(store, names=None):
    """``holders`` for ``Applier`` from a lease store (``state.LeaseStore``):
    the domains whose leases are on the GPU or its VFs, by name where
    ``names`` (``{Uuid: name}``) knows them, else by UUID."""
    names = names or {}

    def holders(address, vfs):
        on = set(vfs) | {address}
        leases = store.leases()
        found = sorted({
            '%s (%s)' % (names[lease.domain_uuid], lease.domain_uuid)
            if lease.domain_uuid in names else 'domain %s'
            % lease.domain_uuid
            for lease in leases
            if lease.parent in on and lease.domain_uuid is not None})
        leased = {lease.parent for lease in leases}
        found += ['a vGPU on %s that libvirt-gpu did not lease' % vf
                  for vf in vfs if vf not in leased]
        return found
    return holders


def layout_kinds(vgpus):
    """The kinds of ``vgpus`` (a ``registry.Vgpus``) that drive layouts
    (``capabilities.LayoutDriver``): what ``GpuDriver`` and ``converge``
    take."""
    return vgpus.having(capabilities.LayoutDriver)


@contextlib.contextmanager
def host_lock(state_dir, timeout=LOCK_TIMEOUT):
    """The host's layouts lock (``LOCK_NAME`` in ``state_dir``, an
    exclusive ``flock``), waited for at most ``timeout`` seconds (not at
    all once its holder is seen stopped); LayoutsLocked naming the holder
    otherwise.  Two runs that interleave their steps fail each other's
    (the driver refuses a step the other made impossible), so each run
    plans and changes the GPUs alone."""
    statedir.ensure_dir(state_dir)
    path = os.path.join(state_dir, LOCK_NAME)
    fd = statedir.open_file(path, os.O_RDWR | os.O_CREAT)
    try:
        try:
            statedir.lock(fd, path, timeout=timeout)
        except exception.StateError as e:
            raise LayoutsLocked(reason=e.kwargs.get('reason', e))
        yield
    finally:
        os.close(fd)


def converge(layouts, gpus, nvml_source, sysfs, state_dir, kinds,
             holders=None, only=None, dry_run=False, progress=None,
             sriov_manage=None, settle_timeout=30.0,
             lock_timeout=LOCK_TIMEOUT):
    """Plan (``dry_run``) or apply ``layouts`` (``{PciAddress: Layout}``,
    ``Environment.layouts``) on a host whose GPUs are ``gpus``
    (``objects.Gpu``), read and changed through ``nvml_source`` (an
    ``nvml.Nvml``, None when NVML is off or the GPUs are not this
    machine's), ``sysfs`` and the vGPU kinds that drive layouts (``kinds``:
    ``layout_kinds`` of the host's), for the GPU ``only`` or every GPU in a
    layout, under the host's layouts lock (``host_lock`` in ``state_dir``,
    waited for ``lock_timeout`` seconds); returns a ``Report``.
    ``holders``: ``Applier``'s (``lease_holders`` of the lease store)."""
    chosen = targets(layouts, only)
    if not chosen:
        return Report(results=())
    if nvml_source is None:
        raise nvml.NvmlUnavailable(
            reason='[gpu]/nvml is off, or the GPUs are not read from this '
                   'host\'s /sys')
    with host_lock(state_dir, lock_timeout), \
            nvml_source.session() as session:
        driver = GpuDriver(session, sysfs, kinds, sriov_manage=sriov_manage,
                           settle_timeout=settle_timeout)
        applier = Applier(driver, holders=holders, dry_run=dry_run,
                          progress=progress)
        every = {g.address for g in gpus
                 if not g.is_vf and g.vendor_id == objects.NVIDIA_VENDOR_ID}
        return applier.run(chosen, every_gpu=every <= set(layouts))
