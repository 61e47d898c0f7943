"""Choose a GPU for each vGPU and take its capacity, under the lease lock.

``Allocator.reserve`` runs in one ``LeaseStore`` transaction (an exclusive
flock, then SQLite ``BEGIN IMMEDIATE``), so racing processes queue and each
sees the leases of the ones before it.  What a GPU can still give to type T
is ``capacity.free`` of its capacity (``capacity.vgpu_total``, the number
Placement is told; for a GPU without VFs ``capacity.parent_total`` of the
type as the GPU lists it now):

    total = available_instances(T) + existing vGPUs of T on it
            (capped by the type's maximum and [vgpu_T]/max_instances)
    used  = | existing vGPU UUIDs on it  U  leased UUIDs on it |
    free  = total - used,   or 0 while the GPU holds (or has leased) any
            vGPU of another type (NVIDIA's time-sliced vGPUs share one
            type per GPU)

The mdev list is read before ``available_instances``: an mdev created by
another process in between then makes the count low, never high.  Reading
and then creating is still a race with anyone outside our leases, so the
kernel's answer to the create stays the final word (``backends.mdev``).

A vGPU without a parent goes to the enabled GPU with the most free
instances (lowest address on a tie).  A guest pinned to host NUMA nodes
(``objects.NumaPinning``: its ``<numatune>`` nodeset, its ``<vcpu>``
cpuset) gets a GPU on those nodes first (one whose ``numa_node`` is in the
nodeset or whose ``local_cpulist`` holds a pinned CPU), then the most room;
a GPU elsewhere only when none near has room.  Nothing here creates a
device.

A GPU whose vGPUs live on SR-IOV VFs (Ampere mdev on VFs, the vGPU 17+
vendor interface) is enabled, and counted, as one physical GPU (its PF
address): its capacity is ``capacity.vgpu_total`` of the GPU read with
all its VFs (the number Placement is told), less the vGPUs of the type
that exist on its VFs and the leases on its VFs not created yet; a lease of
another type not created yet makes it 0.  The vGPU then goes to the first
VF of that GPU that holds no vGPU, carries no lease, is not recorded for
another vGPU (``reserved_parents``) and can take the type now: the
lease's ``parent`` is that VF (one vGPU per VF).

One domain asks for at most ``MAX_VGPUS_PER_DOMAIN`` vGPUs (refused before
the lock), and within a transaction each GPU without VFs is read once and
counted down as claims land on it (``_Room``): the lock is held in time
linear in the domain's claims.  A refusal for room is worded the same for
a start and an incoming migration (``_no_room``) and names what holds the
room that is not the domain's own: incoming migrations' reservations and
leases of processes that died.

A GPU carved for Nova, or owned by another route (``carved``: ``{GPU:
label}``, ``carving.Carved.gpus`` and ``routes.Routes.foreign``) gives
nothing: its VFs and the capacity they use are the other route's, whatever
the configuration enables (a claim naming it or one of its VFs is
refused, ``GpuInUse``).
"""


from __future__ import annotations

import time

from libvirt_gpu.devices.backends import base
from libvirt_gpu.devices import capacity
from libvirt_gpu.devices import routes
from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.util import records
from libvirt_gpu.store import state

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import (Callable, Collection, Iterable, Mapping,
                                 Sequence)

    from libvirt_gpu.devices.backends import registry

    # what the sysfs tree holds: {parent: [Mdev]} (Sysfs.mdevs_by_parent)
    MdevsByParent = Mapping[objects.PciAddress, Sequence[objects.Mdev]]
    Nearness = Mapping[objects.PciAddress, bool]


@records.record
class VgpuClaim:
    """One vGPU a domain asks for, with values parsed where they entered
    the program (the API's arguments, the hook's metadata, an mdevctl
    definition): ``uuid`` by ``objects.Uuid.parse``, ``type_id`` by
    ``objects.TypeId.parse``, ``parent`` an ``objects.PciAddress`` or
    None.  Construction refuses only a value of the wrong type.

    ``managed``: the type must be enabled by configuration on the GPU
    (False for an operator's own mdevctl definition, which names its GPU
    and type itself).
    """

    uuid: objects.Uuid
    type_id: objects.TypeId
    parent: objects.PciAddress | None = None
    managed: bool = True

    def __post_init__(self) -> None:
        if not (type(self.uuid) is objects.Uuid
                and type(self.type_id) is objects.TypeId
                and (self.parent is None
                     or isinstance(self.parent, objects.PciAddress))):
            base.refuse_untyped(self, optional=('parent',))


@records.record
class Grant:
    """A claim with its GPU chosen.

    ``existed``: the mdev was already there (nothing to create, nothing to
    roll back).  ``lease`` is None for an mdev that exists without a lease of
    ours (made by someone else): we use it but will never remove it.
    """

    device: base.VgpuDevice
    existed: bool
    lease: state.Lease | None


def enabled_text(enabled: Mapping[objects.PciAddress, objects.EnabledType],
                 configured: Iterable[objects.TypeId] = ()) -> str:
    """``[gpu]/enabled_vgpu_types`` as TypeNotEnabled says it: the types
    enabled on a GPU, then those the configuration names (``configured``)
    that no GPU of this host offers, said so, never "none" for them."""
    on_gpus = sorted({t for e in enabled.values() for t in e.type_ids})
    unoffered = [t for t in configured if t not in on_gpus]
    said: list[str] = list(on_gpus)
    if unoffered:
        said.append('%s, which no GPU of this host offers (`libvirt-gpu '
                    'types` lists what they offer)' % ', '.join(unoffered))
    return ', '.join(said) or 'none'


_CARVED = routes.LABELS[routes.NOVA_PCI]


def _foreign(address: objects.PciAddress,
             label: str) -> exception.GpuInUse:
    """GpuInUse for a claim on a GPU of another route."""
    if label == _CARVED:
        return exception.GpuInUse(
            address=address, reason='its VFs are carved for Nova ([nova]/'
                                    'carved): they go to Nova\'s instances '
                                    'only')
    return exception.GpuInUse(
        address=address,
        reason='it is %s, not offered to libvirt-gpu\'s own guests' % label)


class Allocator(object):
    """:param backend: the host's ``registry.Vgpus`` (every vGPU kind).
    :param store: the host's ``LeaseStore``.
    :param enabled: ``{PciAddress: EnabledType}`` (``enablement.resolve``).
    :param carved: the physical GPUs carved for Nova or owned by another
        route: ``{GPU: label}`` (a set: carved for Nova), see the module
        doc.
    """

    def __init__(self, backend: registry.Vgpus, store: state.LeaseStore,
                 enabled: Mapping[objects.PciAddress, objects.EnabledType],
                 carved: (dict[objects.PciAddress, str]
                          | Collection[objects.PciAddress]) = frozenset()
                 ) -> None:
        self.backend = backend
        self.store = store
        self.enabled = dict(enabled)
        # the types named in the configuration (enablement.Enabled)
        self.configured: tuple[objects.TypeId, ...] = tuple(
            getattr(enabled, 'configured', ()))
        self.carved: dict[objects.PciAddress, str] = (
            dict(carved) if isinstance(carved, dict)
            else dict.fromkeys(carved, _CARVED))

    def _enabled_types(self) -> str:
        return enabled_text(self.enabled, self.configured)

    def _sriov_gpu(self, address: objects.PciAddress
                   ) -> tuple[objects.PciAddress,
                              objects.PciAddress | None] | None:
        """``(physical GPU, VF or None)`` when vGPUs of the GPU at
        ``address`` (a PF with VFs, or a VF) live on VFs, else None."""
        sysfs = self.backend.sysfs
        pf = sysfs.physfn(address)
        if pf is not None:
            return pf, address
        if sysfs.virtfns(address):
            return address, None
        return None

    def _gpu_free(self, txn: state.Transaction, gpu: objects.PciAddress,
                  type_id: objects.TypeId, mdevs: MdevsByParent,
                  vf: objects.PciAddress | None = None,
                  uuid: objects.Uuid | None = None
                  ) -> tuple[int, objects.PciAddress | None]:
        """``(free, VF)`` of an SR-IOV GPU (see the module doc): how many
        more vGPUs of ``type_id`` it can take, and the VF the next one goes
        to (``vf`` when given and usable; ``uuid``'s own recorded VF
        counts as usable).  ``(0, None)`` when none (a GPU carved for
        Nova: always)."""
        if gpu in self.carved:
            return 0, None
        # imported here: only an SR-IOV GPU is read as discovery reads it
        from libvirt_gpu.devices import discovery
        view = discovery.gpu_view(self.backend.sysfs, gpu,
                                  self.backend.kind_classes, mdevs)
        room = self.backend.room(gpu, type_id)
        total = capacity.vgpu_total(
            view, self._setting(gpu, type_id), room=room, warn=False)
        vfs = {f.address for f in view.vf_gpus}
        existing = {u for u, (a, _) in
                    self.backend.existing(mdevs).items() if a in vfs}
        recorded = {a: u for a, u in self.backend.reserved_parents().items()
                    if a in vfs}
        leases = [lease for a in sorted(vfs) for lease in txn.for_parent(a)]
        pending = [lease for lease in leases
                   if lease.vgpu_uuid not in existing]
        used = sum(f.used_type_ids.count(type_id) for f in view.functions)
        if room is not None:
            # the driver's room is per type (a GI profile, or the type's
            # count on a mixed-size GPU): the others' leases take none of it
            pending = [lease for lease in pending
                       if lease.type_id == type_id]
        free = capacity.free(total, used, len(pending), other_types=any(
            lease.type_id != type_id for lease in pending))
        if free < 1:
            return 0, None
        leased = {lease.parent for lease in leases}

        def usable(function: objects.Gpu) -> bool:
            return (not function.used_type_ids
                    and function.address not in leased
                    and recorded.get(function.address, uuid) == uuid
                    and any(t.id == type_id and t.available_instances > 0
                            for t in function.vgpu_types))
        chosen = None
        for function in view.vf_gpus:
            if (vf is None or function.address == vf) and usable(function):
                chosen = function.address
                break
        if free < 1 or chosen is None:
            return 0, None
        return free, chosen

    def free(self, txn: state.Transaction, parent: objects.PciAddress,
             type_id: objects.TypeId, mdevs_by_parent: MdevsByParent) -> int:
        """Instances of ``type_id`` ``parent`` can still give (see module
        doc); ``mdevs_by_parent`` must be read before this is called."""
        objects.typed(parent, objects.PciAddress, 'parent')
        sriov = self._sriov_gpu(parent)
        if sriov is not None:
            return self._gpu_free(txn, sriov[0], type_id, mdevs_by_parent,
                                  vf=sriov[1])[0]
        on_parent = {u: t for u, (p, t) in
                     self.backend.existing(mdevs_by_parent).items()
                     if p == parent}
        same = sum(1 for t in on_parent.values() if t == type_id)
        total = capacity.parent_total(
            self.backend.vgpu_type(parent, type_id), same,
            self._setting(parent, type_id))
        leases = txn.for_parent(parent)
        used = set(on_parent)
        pending = {lease.vgpu_uuid for lease in leases} - used
        other_types = (set(on_parent.values())
                       | {lease.type_id for lease in leases}) - {type_id}
        return capacity.free(total, len(used), len(pending),
                             other_types=bool(other_types))

    def _setting(self, gpu: objects.PciAddress,
                 type_id: objects.TypeId) -> objects.EnabledType:
        """``type_id`` as enabled on ``gpu`` (its max_instances), or with
        no setting of ours when another type is enabled there."""
        setting = self.enabled.get(gpu)
        found = setting.of(type_id) if setting is not None else None
        return found if found is not None else objects.EnabledType(type_id)

    def capacity(self, type_id: objects.TypeId
                 ) -> dict[objects.PciAddress, int]:
        """``{PciAddress: free}`` of every GPU that has ``type_id``
        enabled, read under the lock."""
        with self.store.transaction() as txn:
            mdevs = self.backend.sysfs.mdevs_by_parent()
            return {address: self.free(txn, address, type_id, mdevs)
                    for address, setting in sorted(self.enabled.items())
                    if setting.of(type_id) is not None
                    and (self.backend.is_parent(address)
                         or self._sriov_gpu(address) is not None)}

    # -- reserve --------------------------------------------------------

    def reserve(self, domain_uuid: objects.Uuid, claims: Iterable[VgpuClaim],
                pinning: objects.NumaPinning = objects.UNPINNED
                ) -> list[Grant]:
        """Grant every claim or none (one transaction); ``pinning``: where
        the domain is pinned (see the module doc).  Raises the first
        claim's error: NoCapacity, TypeNotEnabled, UnknownType, ParentGone,
        MdevConflict, LeaseConflict; InvalidInput for more claims than
        ``MAX_VGPUS_PER_DOMAIN``."""
        objects.typed(domain_uuid, objects.Uuid, 'domain_uuid')
        claims = _counted(claims)
        grants: list[Grant] = []
        # Where each GPU is, read and parsed before the lock: nothing that
        # grows with input (a long local_cpulist) runs inside it.
        nearness = self._nearness(pinning)
        with self.store.transaction() as txn:
            mdevs = self.backend.sysfs.mdevs_by_parent()
            room = _Room(self, txn, mdevs)
            for claim in claims:
                try:
                    grants.append(self._grant(txn, domain_uuid, claim,
                                              mdevs, nearness, room))
                except exception.NoCapacity as e:
                    raise _no_room(txn, domain_uuid, claims, grants, claim,
                                   e)
        return grants

    def reserve_incoming(
            self, domain_uuid: objects.Uuid, claims: Iterable[VgpuClaim],
            expires_at: float,
            pinning: objects.NumaPinning = objects.UNPINNED,
            new_uuid: Callable[[], objects.Uuid] | None = None,
            check: Callable[[list[Grant]], object] | None = None
            ) -> list[Grant]:
        """Reserve here, for a domain migrating in, a GPU for every claim
        or for none (one transaction), by the rules of ``reserve`` (the
        enabled type, room, ``pinning``); a claim's ``parent`` (the
        source's) is ignored.  Each lease stands until ``expires_at``
        although this process exits (``state.Lease.held``).

        A claim's UUID is kept when it is free here (no vGPU, no lease);
        else ``new_uuid()`` names the vGPU.  A retried migration never
        reserves more: this domain's pending incoming reservations (an
        earlier try's) are renewed, the one of a claim's UUID for that
        claim, the others (the new UUIDs an earlier try chose) for the
        claims whose UUID is taken here, by type; those left over are
        dropped.  ``check(grants)`` runs before the transaction commits:
        what it raises undoes everything (all or nothing).

        Returns the Grants in the claims' order; raises NoCapacity,
        TypeNotEnabled, InvalidInput (more claims than
        ``MAX_VGPUS_PER_DOMAIN``) or what ``check`` raises.
        """
        new_uuid = new_uuid or objects.Uuid.new
        objects.typed(domain_uuid, objects.Uuid, 'domain_uuid')
        claims = _counted(claims)
        # Where each GPU is, read before the lock (as ``reserve`` does).
        nearness = self._nearness(pinning)
        with self.store.transaction() as txn:
            mdevs = self.backend.sysfs.mdevs_by_parent()
            grants = self._incoming(txn, domain_uuid, claims, expires_at,
                                    new_uuid, mdevs, nearness)
            if check is not None:
                check(grants)
        return grants

    def _pending_incoming(self, txn: state.Transaction,
                          domain_uuid: objects.Uuid
                          ) -> dict[objects.Uuid, state.Lease]:
        """``{uuid: Lease}`` of this domain's incoming reservations that
        no prepare took over yet, in no promised order (a retry matches
        them to its claims by type, and the order of two of one type
        changes nothing)."""
        return {lease.vgpu_uuid: lease
                for lease in txn.for_domain(domain_uuid)
                if lease.state == state.RESERVED
                and lease.expires_at is not None
                and self.backend.lookup(lease.vgpu_uuid) is None}

    def _incoming(self, txn: state.Transaction, domain_uuid: objects.Uuid,
                  claims: list[VgpuClaim], expires_at: float,
                  new_uuid: Callable[[], objects.Uuid], mdevs: MdevsByParent,
                  nearness: Nearness) -> list[Grant]:
        """``reserve_incoming``'s work inside its transaction."""
        pending = self._pending_incoming(txn, domain_uuid)
        grants: list[Grant | None] = [None] * len(claims)
        taken: list[int] = []   # indexes of claims whose UUID is taken here
        fresh: list[int] = []   # indexes of claims reserved anew below
        used: set[objects.Uuid] = set()   # UUIDs granted or kept by this call

        def renew(i: int, lease: state.Lease) -> None:
            lease = txn.update(lease.vgpu_uuid, expires_at=expires_at)
            used.add(lease.vgpu_uuid)
            grants[i] = Grant(device=base.VgpuDevice(
                uuid=lease.vgpu_uuid, parent=lease.parent,
                type_id=lease.checked_type_id()), existed=False, lease=lease)

        for i, claim in enumerate(claims):
            uuid = claim.uuid
            lease = txn.get(uuid)
            exists = self.backend.lookup(uuid) is not None
            if (lease is not None and not exists
                    and lease.domain_uuid == domain_uuid
                    and lease.state == state.RESERVED
                    and lease.type_id == claim.type_id
                    and uuid not in used):
                pending.pop(uuid, None)
                renew(i, lease)
            elif lease is not None or exists or uuid in used:
                taken.append(i)
            else:
                used.add(uuid)
                fresh.append(i)
        # An earlier try gave the claims whose UUID is taken here new
        # UUIDs: the same ones again, not one more slot each.
        leftover = [lease for u, lease in pending.items() if u not in used]
        for i in taken:
            claim = claims[i]
            again = next((lease for lease in leftover
                          if lease.type_id == claim.type_id), None)
            if again is None:
                fresh.append(i)
                continue
            leftover.remove(again)
            renew(i, again)
        for lease in leftover:          # the earlier try asked for more
            txn.delete(lease.vgpu_uuid)
        room = _Room(self, txn, mdevs)
        renamed = set(taken)
        for i in sorted(fresh):
            claim = claims[i]
            uuid = claim.uuid
            if i in renamed:
                uuid = objects.typed(new_uuid(), objects.Uuid,
                                     'new_uuid()')
            try:
                parent = self._choose_parent(
                    txn, records.replace(claim, uuid=uuid, parent=None),
                    mdevs, nearness, room)
            except exception.NoCapacity as e:
                raise _no_room(txn, domain_uuid, claims,
                               [g for g in grants if g is not None], claim,
                               e)
            lease = txn.add(uuid, domain_uuid, parent, claim.type_id,
                            state.RESERVED, expires_at=expires_at)
            room.took(parent, claim.type_id)
            used.add(uuid)
            grants[i] = Grant(device=base.VgpuDevice(
                uuid=uuid, parent=parent, type_id=claim.type_id),
                existed=False, lease=lease)
        # every claim was renewed or reserved anew above
        return [g for g in grants if g is not None]

    def _grant(self, txn: state.Transaction, domain_uuid: objects.Uuid,
               claim: VgpuClaim, mdevs: MdevsByParent,
               nearness: Nearness | None = None,
               room: _Room | None = None) -> Grant:
        uuid = claim.uuid
        lease = txn.get(uuid)
        if lease is not None:
            return self._grant_leased(txn, domain_uuid, claim, lease)
        existing = self.backend.lookup(uuid)
        if existing is not None:
            self._check_fits(claim, existing)
            _borrow(txn, existing, domain_uuid)
            return Grant(device=existing, existed=True, lease=None)
        parent = (self._check_parent(txn, claim, claim.parent, mdevs)
                  if claim.parent is not None
                  else self._choose_parent(txn, claim, mdevs, nearness,
                                           room))
        device = base.VgpuDevice(uuid=uuid, parent=parent,
                                 type_id=claim.type_id)
        lease = txn.add(uuid, domain_uuid, parent, claim.type_id,
                        state.RESERVED)
        if room is not None:
            room.took(parent, claim.type_id)
        return Grant(device=device, existed=False, lease=lease)

    def _check_fits(self, claim: VgpuClaim,
                    existing: base.VgpuDevice) -> None:
        if existing.type_id != claim.type_id or (
                claim.parent is not None and existing.parent != claim.parent):
            raise exception.MdevConflict(
                uuid=existing.uuid, existing_type=existing.type_id,
                existing_parent=existing.parent, type_id=claim.type_id,
                parent=claim.parent or 'any GPU')

    def _grant_leased(self, txn: state.Transaction, domain_uuid: objects.Uuid,
                      claim: VgpuClaim, lease: state.Lease) -> Grant:
        """A lease exists for the claim's UUID: ours to take over only if it
        is this domain's (or a dead reconcile's) and nobody works on it."""
        mine = lease.domain_uuid == domain_uuid
        orphaned = lease.domain_uuid is None and lease.state == state.REMOVING
        if lease.holder_alive() and lease.pid != txn.pid:
            raise exception.LeaseConflict(
                uuid=lease.vgpu_uuid,
                holder='process %d (%s for domain %s), still running'
                % (lease.pid, lease.state, lease.domain_uuid or '-'))
        if not (mine or orphaned):
            raise exception.LeaseConflict(
                uuid=lease.vgpu_uuid, holder='domain %s' % lease.domain_uuid)
        existing = self.backend.lookup(lease.vgpu_uuid)
        if existing is not None:
            self._check_fits(claim, existing)
            lease = txn.update(lease.vgpu_uuid, domain_uuid=domain_uuid,
                               parent=existing.parent, state=state.CREATED)
            return Grant(device=existing, existed=True, lease=lease)
        # A row whose type is no type id was read (so that reconcile can
        # list and clean it) but is refused where its type would be used.
        device = base.VgpuDevice(uuid=lease.vgpu_uuid, parent=lease.parent,
                                 type_id=lease.checked_type_id())
        self._check_fits(claim, device)
        # The lease already counts against its GPU: no new capacity needed.
        self.backend.check_type(device.parent, device.type_id)
        lease = txn.update(lease.vgpu_uuid, domain_uuid=domain_uuid,
                           state=state.RESERVED)
        return Grant(device=device, existed=False, lease=lease)

    def _check_enabled(self, claim: VgpuClaim,
                       gpu: objects.PciAddress) -> None:
        """A managed claim must ask for the type enabled on ``gpu`` (the
        physical GPU: an SR-IOV GPU's setting covers its VFs)."""
        if not claim.managed:
            return
        setting = self.enabled.get(gpu)
        if setting is None or setting.of(claim.type_id) is None:
            raise exception.TypeNotEnabled(
                type_id=claim.type_id, where='the GPU %s' % gpu,
                enabled=(', '.join(setting.type_ids) if setting is not None
                         else 'none on that GPU'))

    def _check_parent(self, txn: state.Transaction, claim: VgpuClaim,
                      parent: objects.PciAddress,
                      mdevs: MdevsByParent) -> objects.PciAddress:
        """The parent a claim naming ``parent`` (its ``parent``) goes to:
        that GPU, or a VF of an SR-IOV GPU."""
        sriov = self._sriov_gpu(parent)
        if sriov is not None:
            return self._check_sriov_parent(txn, claim, mdevs, *sriov)
        if parent in self.carved:
            raise _foreign(parent, self.carved[parent])
        self.backend.check_type(parent, claim.type_id)
        self._check_enabled(claim, parent)
        if self.free(txn, parent, claim.type_id, mdevs) < 1:
            raise exception.NoCapacity(
                uuid=claim.uuid, type_id=claim.type_id,
                where='the GPU %s' % parent,
                reason='its vGPUs and leases take every instance')
        return parent

    def _check_sriov_parent(self, txn: state.Transaction, claim: VgpuClaim,
                            mdevs: MdevsByParent, gpu: objects.PciAddress,
                            vf: objects.PciAddress | None
                            ) -> objects.PciAddress:
        """A claim naming an SR-IOV GPU (its PF: any of its VFs) or one of
        its VFs; returns the VF."""
        if gpu in self.carved:
            raise _foreign(vf or gpu, self.carved[gpu])
        if vf is not None:
            self.backend.check_type(vf, claim.type_id)
        self._check_enabled(claim, gpu)
        free, chosen = self._gpu_free(txn, gpu, claim.type_id, mdevs,
                                      vf=vf, uuid=claim.uuid)
        if free < 1 or chosen is None:
            raise exception.NoCapacity(
                uuid=claim.uuid, type_id=claim.type_id,
                where='the GPU %s' % gpu,
                reason='its vGPUs and leases take every instance%s' % (
                    ' or VF %s is taken' % vf if vf is not None else ''))
        return chosen

    def _near(self, address: objects.PciAddress,
              pinning: objects.NumaPinning) -> bool:
        """Whether the GPU at ``address`` is on the nodes of ``pinning``
        (always False for an unpinned guest: every GPU ranks the same)."""
        if not pinning.pinned:
            return False
        try:
            return pinning.is_near(*self.backend.sysfs.locality(address))
        except exception.SysfsError:
            return False              # unknown: not preferred

    def _nearness(self, pinning: objects.NumaPinning
                  ) -> dict[objects.PciAddress, bool]:
        """``{address: near}`` of every enabled GPU (``_near``); empty
        for an unpinned guest."""
        if not pinning.pinned:
            return {}
        return {address: self._near(address, pinning)
                for address in self.enabled}

    def _choose_parent(self, txn: state.Transaction, claim: VgpuClaim,
                       mdevs: MdevsByParent, nearness: Nearness | None = None,
                       room: _Room | None = None) -> objects.PciAddress:
        """The GPU (or VF) with the most room for ``claim`` (near first);
        ``room`` (a ``_Room``) counts each GPU without VFs once per
        transaction instead of once per claim."""
        room = room if room is not None else _Room(self, txn, mdevs)
        candidates = sorted(a for a, s in self.enabled.items()
                            if s.of(claim.type_id) is not None)
        if not candidates:
            raise exception.TypeNotEnabled(
                type_id=claim.type_id, where='this host',
                enabled=self._enabled_types())
        # ((near, free), parent)
        best: tuple[tuple[bool, int], objects.PciAddress] | None = None
        looked: list[str] = []
        for address in candidates:
            near = (nearness or {}).get(address, False)
            if address in self.carved:
                label = self.carved[address]
                looked.append('%s (%s)' % (address, 'carved for Nova'
                                           if label == _CARVED else label))
                continue
            if self._sriov_gpu(address) is not None:
                free, chosen = self._gpu_free(txn, address, claim.type_id,
                                              mdevs, uuid=claim.uuid)
                looked.append('%s (%d free)' % (address, free))
                if chosen is not None and free > 0 and (
                        best is None or (near, free) > best[0]):
                    best = ((near, free), chosen)
                continue
            if not self.backend.is_parent(address):
                looked.append('%s (gone)' % address)
                continue
            if self.backend.vgpu_type(address, claim.type_id) is None:
                looked.append('%s (type not offered)' % address)
                continue
            free = room.free(address, claim.type_id)
            looked.append('%s (%d free)' % (address, free))
            if free > 0 and (best is None or (near, free) > best[0]):
                best = ((near, free), address)
        if best is None:
            raise exception.NoCapacity(
                uuid=claim.uuid, type_id=claim.type_id,
                where='any GPU of this host',
                reason='looked at %s' % ', '.join(looked))
        return best[1]

    # -- after the devices were made ------------------------------------

    def mark_created(self, uuids: Iterable[objects.Uuid]) -> None:
        """``reserved`` -> ``created`` for leases this process holds."""
        with self.store.transaction() as txn:
            for uuid in uuids:
                txn.update(uuid, state=state.CREATED)

    def forget(self, uuids: Iterable[objects.Uuid]) -> None:
        """Drop leases (the devices are gone or were never made)."""
        with self.store.transaction() as txn:
            for uuid in uuids:
                txn.delete(uuid)

    def give_back(self, domain_uuid: objects.Uuid,
                  uuids: Iterable[objects.Uuid]) -> None:
        """A domain no longer uses these existing, unleased mdevs (its
        start failed)."""
        with self.store.transaction() as txn:
            txn.give_back(domain_uuid, uuids)

    def begin_release(self, domain_uuid: objects.Uuid,
                      uuids: Iterable[objects.Uuid] | None = None
                      ) -> list[state.Lease]:
        """Mark a domain's leases ``removing`` (held by this process) and
        return them; ``uuids`` limits them to those vGPUs."""
        objects.typed(domain_uuid, objects.Uuid, 'domain_uuid')
        wanted = (None if uuids is None
                  else {objects.typed(u, objects.Uuid, 'uuids[]')
                        for u in uuids})
        taken: list[state.Lease] = []
        with self.store.transaction() as txn:
            for lease in txn.for_domain(domain_uuid):
                if wanted is not None and lease.vgpu_uuid not in wanted:
                    continue
                if lease.holder_alive() and lease.pid != txn.pid \
                        and lease.state != state.CREATED:
                    # Another process is creating it right now (a start
                    # racing a stop cannot happen in libvirt; be safe).
                    raise exception.LeaseConflict(
                        uuid=lease.vgpu_uuid,
                        holder='process %d (%s), still running'
                        % (lease.pid, lease.state))
                taken.append(txn.update(lease.vgpu_uuid,
                                        state=state.REMOVING))
            txn.give_back(domain_uuid, wanted)
        return taken


# The most vGPUs one domain may hold: a guest is given a handful (QEMU
# and the guest's driver set the practical limit far lower), and one
# domain's claims are judged under the lease lock, which every guest start
# of the host waits for.  A domain asking for more is refused before the
# lock is taken.
MAX_VGPUS_PER_DOMAIN = 64


def _counted(claims: Iterable[VgpuClaim]) -> list[VgpuClaim]:
    """``claims`` as a list, refused (InvalidInput) beyond
    ``MAX_VGPUS_PER_DOMAIN``."""
    counted = list(claims)
    if len(counted) > MAX_VGPUS_PER_DOMAIN:
        raise exception.InvalidInput(
            reason='the domain asks for %d vGPUs and one domain may hold at '
                   'most %d; give it fewer (split the work across guests)'
                   % (len(counted), MAX_VGPUS_PER_DOMAIN))
    return counted


class _Room(object):
    """What each GPU without VFs can still give, within one transaction:
    read once (``Allocator.free``), then counted down as the transaction
    reserves there (``took``), so that a domain's N claims cost N, not
    N times the leases.  A GPU whose vGPUs live on VFs is read again each
    time (its next VF changes with each reservation; a domain holds few:
    ``MAX_VGPUS_PER_DOMAIN``)."""

    def __init__(self, allocator: Allocator, txn: state.Transaction,
                 mdevs: MdevsByParent) -> None:
        self.allocator = allocator
        self.txn = txn
        self.mdevs = mdevs
        self._free: dict[tuple[objects.PciAddress, objects.TypeId], int] = {}

    def free(self, address: objects.PciAddress,
             type_id: objects.TypeId) -> int:
        key = (address, type_id)
        if key not in self._free:
            self._free[key] = self.allocator.free(self.txn, address, type_id,
                                                  self.mdevs)
        return self._free[key]

    def took(self, address: objects.PciAddress,
             type_id: objects.TypeId) -> None:
        """A lease of ``type_id`` was added on ``address``: one less of
        that type there, and none of another (one type per GPU)."""
        for key in list(self._free):
            if key[0] == address:
                self._free[key] = capacity.free_after(self._free[key],
                                                      key[1], type_id)


def _borrow(txn: state.Transaction, existing: base.VgpuDevice,
            domain_uuid: objects.Uuid) -> None:
    """An mdev without a lease (someone else made it) is used, never
    removed; but only by one domain at a time."""
    holder = txn.borrower(existing.uuid)
    if holder is not None and holder != domain_uuid:
        raise exception.LeaseConflict(
            uuid=existing.uuid,
            holder='domain %s, which already uses this existing vGPU (it is '
                   'given back when that domain stops)' % holder)
    txn.borrow(existing.uuid, domain_uuid)


STALE_LISTED = 5


def _no_room(txn: state.Transaction, domain_uuid: objects.Uuid,
             claims: Sequence[VgpuClaim], grants: Sequence[Grant],
             claim: VgpuClaim,
             error: exception.NoCapacity) -> exception.NoCapacity:
    """The NoCapacity of ``claim`` (``error``, from ``_choose_parent`` or
    ``_check_parent``), said the same way by ``reserve`` and
    ``reserve_incoming``: how many vGPUs of the type the domain asks for
    and how many of them fit (where), then what holds the room that is
    not this domain's: incoming migrations' reservations, leases left by
    processes that died."""
    kwargs = dict(error.kwargs)
    same = sum(1 for c in claims if c.type_id == claim.type_id)
    if same > 1:
        fitted: dict[str, int] = {}
        for grant in grants:
            if grant.device.type_id == claim.type_id:
                parent = str(grant.device.parent)
                fitted[parent] = fitted.get(parent, 0) + 1
        fit = sum(fitted.values())
        fits = ('%d fit (%s)' % (fit, ', '.join(
            '%d on %s' % (n, parent) for parent, n in sorted(
                fitted.items()))) if fit else 'none fits')
        kwargs['reason'] = ('the domain asks for %d vGPUs of this type and '
                            '%s; %s' % (same, fits, kwargs['reason']))
    kwargs['reason'] += _incoming_note(txn, domain_uuid) + _stale_note(txn)
    return exception.NoCapacity(**kwargs)


def _incoming_note(txn: state.Transaction, domain_uuid: objects.Uuid) -> str:
    """``'; N slot(s) are reserved for incoming ...'`` naming the domains
    whose incoming migration holds room here, or ''."""
    held: dict[objects.Uuid | None, tuple[int, float]] = {}
    for lease in txn.all():
        if (lease.expires_at is not None and lease.held(txn.now)
                and lease.domain_uuid != domain_uuid):
            count, until = held.get(lease.domain_uuid, (0, 0.0))
            held[lease.domain_uuid] = (count + 1,
                                       max(until, lease.expires_at))
    if not held:
        return ''
    named = ', '.join(
        '%d for domain %s until %s' % (count, domain, time.strftime(
            '%H:%M:%S', time.localtime(until)))
        for domain, (count, until) in sorted(
            held.items(), key=lambda item: str(item[0]))[:STALE_LISTED])
    if len(held) > STALE_LISTED:
        named += ' and %d more domain(s)' % (len(held) - STALE_LISTED)
    return ('; %d slot(s) are reserved for incoming live migration(s): %s '
            '(their prepare takes them, else they are freed when they '
            'expire; `libvirt-gpu reconcile --dry-run` lists them)'
            % (sum(count for count, _ in held.values()), named))


def _stale_note(txn: state.Transaction) -> str:
    """``'; N lease(s) left by processes that died ...'`` naming the
    leases whose holder process died before it finished (a killed prepare
    or release): they still count against capacity until ``reconcile``
    settles them; or ''."""
    stale = [lease for lease in txn.all()
             if lease.state != state.CREATED and not lease.holder_alive()
             and not lease.held(txn.now)]
    if not stale:
        return ''
    named = ', '.join('%s (%s for domain %s by process %d, gone)'
                      % (lease.vgpu_uuid, lease.state,
                         lease.domain_uuid or '-', lease.pid)
                      for lease in stale[:STALE_LISTED])
    if len(stale) > STALE_LISTED:
        named += ' and %d more' % (len(stale) - STALE_LISTED)
    return ('; %d lease(s) left by processes that died may be stale: %s; '
            '`libvirt-gpu reconcile --dry-run` shows what `libvirt-gpu '
            'reconcile` would free' % (len(stale), named))
