"""What the files of a sysfs tree mean: PCI functions, GPUs, mdev types
and mdevs, SR-IOV VFs, read through the safe reader (``reader.Reader``,
the only code that opens files under the root) and turned into
``objects`` records here (numbers and ids by ``parsers``)."""

from __future__ import annotations

import os

from libvirt_gpu.util import bounds
from libvirt_gpu import exception
from libvirt_gpu.util import logs
from libvirt_gpu import objects
from libvirt_gpu.devices.sysfs import parsers
from libvirt_gpu.devices.sysfs import reader

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, overload

# text listed -> the objects.TypeId it parsed to
_KNOWN_TYPE_IDS: dict[str, objects.TypeId] = {}
_MAX_KNOWN_TYPE_IDS = 4096
# Linux numbers NUMA nodes below MAX_NUMNODES (1 << CONFIG_NODES_SHIFT,
# at most 1 << 10); a larger ``numa_node`` is no node: taken as unknown.
MAX_NUMA_NODE = (1 << 10) - 1
LOG = logs.getLogger(__name__)


def _numa_node(value, path, warn):
    """A ``numa_node`` as read (-1: none) as a node or None; one beyond
    MAX_NUMA_NODE is None too, and said (``warn``: a SysfsError)."""
    if value is None or value < 0:
        return None
    if value > MAX_NUMA_NODE:
        warn(exception.SysfsError(
            path=path, reason='%d is no NUMA node (Linux numbers them below '
                              '%d): the GPU\'s node is taken as unknown'
                              % (value, MAX_NUMA_NODE + 1)))
        return None
    return value


def _not_itself(address, found, path, warn):
    """``found`` (where a ``physfn`` or ``virtfn<N>`` link leads), or
    None when it is ``address`` itself (no kernel makes that; taken as
    is, the GPU would count as its own VF and be hidden), said
    (``warn``: a SysfsError naming the GPU)."""
    if found != address:
        return found
    warn(exception.SysfsError(
        path=path, reason='the GPU %s links to itself as its own SR-IOV '
                          'function; the link is ignored' % address))
    return None


def _log_warning(error):
    LOG.warning('%s', error)


class Sysfs(reader.Reader):
    """A host's sysfs: the reader plus what its files mean."""

    def pci_addresses(self) -> list[objects.PciAddress]:
        """Every device under ``bus/pci/devices`` whose name is an address."""
        found = []
        for name in self.listdir(os.path.join(self.root, *reader.PCI_DEVICES)):
            try:
                found.append(objects.PciAddress.parse(name))
            except exception.InvalidPciAddress:
                continue   # not a PCI device entry; real sysfs has none
        return sorted(found)

    def pci_class(self, address):
        """``class`` of a device, e.g. ``0x030200``."""
        base = self.pci_dir(address)
        dfd, real = self._open_dir(base)
        try:
            return self._read_in(dfd, real, base, 'class')
        finally:
            os.close(dfd)

    if TYPE_CHECKING:
        @overload
        def read_gpu(self, address: objects.PciAddress | str,
                     mdevs_by_parent: Any = None, static_cache: Any = None,
                     skipped: Any = None, class_filter: None = None
                     ) -> objects.Gpu: ...

        @overload
        def read_gpu(self, address: objects.PciAddress | str,
                     mdevs_by_parent: Any = None, static_cache: Any = None,
                     skipped: Any = None, *,
                     class_filter: Callable[[str], bool]
                     ) -> objects.Gpu | None: ...

    def read_gpu(self, address: objects.PciAddress | str,
                 mdevs_by_parent: Any = None, static_cache: Any = None,
                 skipped: Any = None,
                 class_filter: Callable[[str], bool] | None = None
                 ) -> objects.Gpu | None:
        """Build a Gpu from ``bus/pci/devices/<address>/``.

        Reads (all optional but vendor, device and class):
        ``vendor device class driver@ numa_node local_cpulist iommu_group@
        physfn@ virtfnN@ mdev_supported_types/<type>/{name,description,
        device_api,available_instances}`` (@ = symlink, only its target's
        name is used).  ``numa_node`` -1 (the kernel's "no node") becomes
        None, as does a missing file.  The group's members are left to
        discovery (``iommu_group_addresses``, ``pci_function``).
        Anything malformed is a SysfsError naming the file; ``skipped``: see
        ``mdev_types``.

        ``class_filter``: a test of the ``class`` text (``is_gpu_class``);
        a device that fails it is None, read no further.  Discovery then
        opens each device's directory once, not once for ``pci_class`` and
        again here.
        """
        address = objects.PciAddress.parse(address)
        base = self.pci_dir(address)
        # The device's directory is resolved (and checked to lie under the
        # root) once; its attributes are read relative to it, each opened
        # without following a link (``_read_in``).
        dfd, real = self._open_dir(base)
        try:
            class_code = None
            if class_filter is not None:
                class_code = self._read_in(dfd, real, base, 'class')
                if not class_filter(class_code):
                    return None
            return self._read_gpu_in(dfd, real, base, address,
                                     mdevs_by_parent, static_cache, skipped,
                                     class_code)
        finally:
            os.close(dfd)

    def _read_gpu_in(self, dfd, real, base, address, mdevs_by_parent,
                     static_cache, skipped, class_code):
        entries = set(reader._names(dfd, real))
        j = os.path.join

        def read(name, optional=False):
            return self._read_in(dfd, real, base, name, optional=optional)

        def link(name):
            return self._link_name_in(dfd, base, name)

        def address_of(name):
            return self._link_address_in(dfd, base, name)

        def hex_id(name):
            return parsers.parse_hex_id(read(name), j(base, name))

        warn = skipped.append if skipped is not None else _log_warning
        # -1: no NUMA affinity
        numa = read('numa_node', optional=True)
        if numa is not None:
            numa = _numa_node(parsers.parse_number(
                numa, j(base, 'numa_node'), minimum=-1),
                j(base, 'numa_node'), warn)
        group = None
        if 'iommu_group' in entries:
            name = link('iommu_group')
            group = int(name) if name and name.isdigit() else None
        physfn = None
        if 'physfn' in entries:
            physfn = _not_itself(address, address_of('physfn'),
                                 j(base, 'physfn'), warn)
        virtfns = []
        for entry in entries:
            if entry.startswith('virtfn') and entry[6:].isdigit():
                vf = _not_itself(address, address_of(entry), j(base, entry),
                                 warn)
                if vf is not None:
                    virtfns.append((int(entry[6:]), vf))
        vendor_id = hex_id('vendor')
        product_id = hex_id('device')
        driver = link('driver') if 'driver' in entries else None
        mdev_types = ()
        if reader.TYPES_DIR in entries:
            mdev_types = self._mdev_types_of(
                dfd, real, base, address, static_cache,
                (driver, vendor_id, product_id, physfn is not None),
                skipped)
        if mdevs_by_parent is None:
            mdevs_by_parent = self.mdevs_by_parent()
        return objects.Gpu(
            address=address,
            vendor_id=vendor_id,
            product_id=product_id,
            class_code=read('class') if class_code is None else class_code,
            driver=driver,
            numa_node=numa,
            iommu_group=group,
            physfn=physfn,
            virtfns=tuple(a for _, a in sorted(virtfns)),
            mdev_types=mdev_types,
            mdevs=tuple(sorted(mdevs_by_parent.get(address, ()))),
            local_cpulist=(read('local_cpulist')
                           if 'local_cpulist' in entries else None),
        )

    def locality(self, address: objects.PciAddress
                 ) -> tuple[int | None, bounds.CpuList]:
        """``(numa_node, local CPUs)`` of a PCI function: its node (None:
        unknown, -1, missing or not a number, said) and ``local_cpulist`` as a
        ``bounds.CpuList`` (empty when missing or unreadable as a list; its
        bounds are checked before it is parsed, and it is never expanded).
        """
        base = self.pci_dir(address)
        path = os.path.join(base, 'numa_node')
        try:
            numa = self.read_int(path, optional=True, minimum=-1)
        except exception.SysfsBadNumber as e:
            # as an unreadable local_cpulist: nearness is a preference
            _log_warning('%s: the node is taken as unknown' % e)
            numa = None
        numa = _numa_node(numa, path, _log_warning)
        text = self.read(os.path.join(base, 'local_cpulist'), optional=True)
        try:
            cpus = objects.parse_cpulist(text, 'local_cpulist')
        except exception.InvalidInput:
            cpus = objects.parse_cpulist('')
        return numa, cpus

    #
    #   kernel/iommu_groups/<n>/devices/<address> -> ../../../../devices/..
    #   bus/pci/devices/<address>/iommu_group
    #       -> ../../../kernel/iommu_groups/<n>

    def iommu_group_addresses(self, group: int
                              ) -> list[objects.PciAddress]:
        """The PCI addresses in IOMMU group ``group`` (sorted); an entry
        that is not a PCI address (none on real hosts) is skipped."""
        if isinstance(group, bool) or not isinstance(group, int) \
                or group < 0:
            raise exception.InvalidInput(
                reason='an IOMMU group is a number, not %r' % (group,))
        base = os.path.join(self.root, 'kernel', 'iommu_groups', str(group),
                            'devices')
        found = []
        for name in self.listdir(base):
            try:
                found.append(objects.PciAddress.parse(name))
            except exception.InvalidPciAddress:
                continue
        return sorted(found)

    def pci_function(self, address: objects.PciAddress
                     ) -> objects.IommuMember:
        """An IommuMember of any PCI function: ids, class and driver (each
        None when its file is missing); companion/host_uses left False
        for discovery to judge."""
        address = objects.PciAddress.parse(address)
        base = self.pci_dir(address)
        dfd, real = self._open_dir(base)     # resolved once, as read_gpu
        try:
            entries = set(reader._names(dfd, real))

            def read(name):
                return (self._read_in(dfd, real, base, name)
                        if name in entries else None)

            def hex_id(name):
                text = read(name)
                return (parsers.parse_hex_id(text, os.path.join(base, name))
                        if text else None)
            return objects.IommuMember(
                address=address, vendor_id=hex_id('vendor'),
                product_id=hex_id('device'), class_code=read('class'),
                driver=(self._link_name_in(dfd, base, 'driver')
                        if 'driver' in entries else None))
        finally:
            os.close(dfd)

    def types_dir(self, address: objects.PciAddress | str) -> str:
        return os.path.join(self.pci_dir(address), reader.TYPES_DIR)

    def mdev_type_ids(self, address: objects.PciAddress
                      ) -> list[objects.TypeId]:
        """Type ids the kernel lists for a parent (sorted): only names
        that are type ids (``objects.TypeId``: never ``..`` or another
        name a path could be made of), as ``mdev_types`` reads them."""
        found = []
        for name in self.listdir(self.types_dir(address), optional=True):
            try:
                found.append(objects.TypeId.parse(name))
            except exception.InvalidTypeId:
                continue
        return sorted(found)

    def mdev_types(self, address, static_cache=None, model=None,
                   skipped=None):
        """Every ``mdev_supported_types/<type>`` of a parent as VgpuType.

        Files are read relative to the open type directory (``dir_fd``):
        the parent's path, which crosses the ``bus/pci/devices`` link, is
        resolved once per parent instead of once per file.

        ``static_cache`` (a dict) with ``model`` (a hashable naming the
        driver and device model) lets a discovery pass read a type's
        ``name``, ``description`` and ``device_api`` once per model: the
        vendor driver fills them from its table of types for that model,
        so every parent of one model shows the same text.
        ``available_instances`` is per parent and always read.

        ``skipped`` (a list): a type that cannot be read (a bad file, a
        malformed number, a name that is no type id) is left out and its
        SysfsError appended, so that one bad type does not hide the
        others; without it, the error is raised.
        """
        base = self.types_dir(address)
        dfd, real = self._open_dir(base, optional=True)
        if dfd is None:
            return ()
        try:
            return self._mdev_types_in(dfd, real, base, static_cache, model,
                                       skipped)
        finally:
            os.close(dfd)

    def _mdev_types_of(self, dev_fd, dev_real, dev_path, address,
                       static_cache, model, skipped):
        """``mdev_types`` of the device whose directory is open as
        ``dev_fd`` (resolved and checked as ``dev_real``): a types
        directory that is a plain directory in it is opened there, without
        resolving its path again; anything else (a link) the way of
        ``mdev_types``, which checks where it leads."""
        try:
            dfd = self._open_plain_dir_in(dev_fd, reader.TYPES_DIR)
        except OSError:
            return self.mdev_types(address, static_cache, model=model,
                                   skipped=skipped)
        try:
            return self._mdev_types_in(
                dfd, os.path.join(dev_real, reader.TYPES_DIR),
                os.path.join(dev_path, reader.TYPES_DIR), static_cache, model,
                skipped)
        finally:
            os.close(dfd)

    def _mdev_types_in(self, dfd, real, base, static_cache, model, skipped):
        """``mdev_types`` of the types directory open as ``dfd``."""
        result = []
        known = _KNOWN_TYPE_IDS
        texts = (static_cache.get(model)
                 if static_cache is not None and model is not None else None)
        for type_id, plain in reader._type_entries(dfd):
            # The common case (a type id seen before, listed as a plain
            # directory, its text known for this model, a plain count)
            # costs no Python frame beyond _count_in and builds no path;
            # anything else is read again the thorough way, which names
            # what is wrong.
            static = texts.get(type_id) if texts is not None else None
            typed = known.get(type_id) if static is not None else None
            if typed is not None and plain:
                available = reader._count_in(dfd, type_id)
                if available is not None:
                    # Records are immutable: parents of one model whose
                    # type has the same count share one (the text cache
                    # also keeps them, keyed by (type id, count)).
                    made = texts.get((type_id, available))
                    if made is None:
                        made = texts[type_id, available] = objects.VgpuType(
                            typed, static[0], static[1], static[2],
                            available)
                    result.append(made)
                    continue
            try:
                result.append(self._mdev_type(
                    dfd, real, base, type_id, static_cache, model))
            except exception.SysfsError as e:
                if skipped is None:
                    raise
                skipped.append(e)
        return tuple(result)

    def _mdev_type(self, types_fd, types_real, types_path, type_id,
                   static_cache, model):
        path = os.path.join(types_path, type_id)
        try:
            typed = objects.TypeId.parse(type_id)
        except exception.InvalidTypeId as e:
            raise exception.SysfsReadError(path=path, reason=e)
        if len(_KNOWN_TYPE_IDS) < _MAX_KNOWN_TYPE_IDS:
            _KNOWN_TYPE_IDS[type_id] = typed
        try:
            tfd, real = self._open_in(types_fd, types_real, type_id,
                                      reader._DIR_FLAGS)
        except OSError as e:
            raise exception.SysfsReadError(path=path, reason=e.strerror)
        try:
            available = parsers.parse_number(
                self._read_in(tfd, real, path, 'available_instances'),
                os.path.join(path, 'available_instances'))
            if available > bounds.MAX_INSTANCES:
                raise exception.SysfsBadNumber(
                    path=os.path.join(path, 'available_instances'),
                    expected='a number of at most %d' % bounds.MAX_INSTANCES,
                    text=str(available)[:40])
            # static_cache: {model: {type id: (name, description, api)}}
            texts = (static_cache.setdefault(model, {})
                     if static_cache is not None and model is not None
                     else {})
            static = texts.get(type_id)
            if static is None:
                static = texts[type_id] = (
                    self._read_in(tfd, real, path, 'name', optional=True),
                    self._read_in(tfd, real, path, 'description',
                                  optional=True),
                    self._read_in(tfd, real, path, 'device_api'))
        finally:
            os.close(tfd)
        return objects.VgpuType(
            id=typed, name=static[0], description=static[1],
            device_api=static[2], available_instances=available)

    def mdevs_by_parent(self, skipped: Any = None
                        ) -> dict[objects.PciAddress, list[objects.Mdev]]:
        """``{parent PciAddress: [Mdev]}`` from ``bus/mdev/devices``.

        Each entry is a link into the parent's tree
        (``../../../devices/pci0000:ae/0000:ae:00.0/0000:af:00.0/<uuid>``)
        with ``mdev_type`` linking to the type directory.  One rule for
        every reader (discovery, the allocator, reconcile, the hook): an
        entry that cannot be read is left out, and its SysfsError appended
        to ``skipped`` (a list) or, without one, logged as a warning.  One
        bad entry costs only that entry.
        """
        if skipped is None:
            skipped = []
            result = self.mdevs_by_parent(skipped)
            for error in skipped:
                logs.getLogger(__name__).warning('mdev skipped: %s', error)
            return result
        base = os.path.join(self.root, *reader.MDEV_DEVICES)
        result = {}
        for name in self.listdir(base, optional=True):
            try:
                uuid = objects.Uuid.parse(name)
            except exception.InvalidUuid:
                continue
            try:
                found = self._mdev_entry(os.path.join(base, name), uuid)
            except exception.SysfsError as e:
                skipped.append(e)
                continue
            if found is not None:
                result.setdefault(found[0], []).append(found[1])
        return result

    def _mdev_entry(self, link, uuid):
        """``(parent, Mdev)`` of ``bus/mdev/devices/<uuid>``, or None for
        an mdev whose parent is not a PCI device."""
        try:
            target = self.readlink(link)
        except OSError as e:
            raise exception.SysfsReadError(path=link, reason=e.strerror)
        # where the link leads must lie under the root: checked on the
        # directory opened (as _open_dir), else the realpath way, which
        # also takes a link that leads to no directory
        dfd, _ = self._open_dir_fast(link)
        if dfd is None:
            self._readable(link)
        try:
            parent_name = os.path.basename(os.path.dirname(target))
            try:
                parent = objects.PciAddress.parse(parent_name)
            except exception.InvalidPciAddress:
                return None
            type_id = (self.link_name(os.path.join(link, 'mdev_type'))
                       if dfd is None else
                       self._link_name_in(dfd, link, 'mdev_type'))
        finally:
            if dfd is not None:
                os.close(dfd)
        if type_id is None:
            raise exception.SysfsReadError(
                path=os.path.join(link, 'mdev_type'),
                reason='mdev without a type link')
        try:
            type_id = objects.TypeId.parse(type_id)
        except exception.InvalidTypeId as e:
            raise exception.SysfsReadError(
                path=os.path.join(link, 'mdev_type'), reason=e)
        return parent, objects.Mdev(uuid=uuid, type_id=type_id)

    #
    #   bus/pci/devices/<PF>/sriov_totalvfs   16
    #   bus/pci/devices/<PF>/sriov_numvfs     0 (VFs off) or 16
    #   bus/pci/devices/<PF>/virtfn<N>     -> ../<VF>
    #   bus/pci/devices/<VF>/physfn        -> ../<PF>

    def sriov_totalvfs(self, address: objects.PciAddress) -> int | None:
        """``sriov_totalvfs`` of a PF, or None when it is no SR-IOV PF."""
        return self.read_int(os.path.join(self.pci_dir(address),
                                          'sriov_totalvfs'), optional=True)

    def sriov_numvfs(self, address):
        """``sriov_numvfs`` of a PF (VFs enabled now), or None."""
        return self.read_int(os.path.join(self.pci_dir(address),
                                          'sriov_numvfs'), optional=True)

    def set_sriov_numvfs(self, address, count):
        """Write ``count`` to ``sriov_numvfs`` (the kernel's generic way to
        enable VFs; NVIDIA's ``sriov-manage -e`` ends in the same write)."""
        if isinstance(count, bool) or not isinstance(count, int) \
                or count < 0:
            raise exception.InvalidInput(
                reason='sriov_numvfs must be a count, not %r' % (count,))
        self.write(os.path.join(self.pci_dir(address), 'sriov_numvfs'),
                   str(count))

    def virtfns(self, address: objects.PciAddress | str
                ) -> tuple[objects.PciAddress, ...]:
        """The VF addresses of a PF, in ``virtfn<N>`` order."""
        address = objects.PciAddress.parse(address)
        base = self.pci_dir(address)
        found = []
        for entry in self.listdir(base, optional=True):
            if entry.startswith('virtfn') and entry[6:].isdigit():
                path = os.path.join(base, entry)
                vf = _not_itself(address, self.link_address(path), path,
                                 _log_warning)
                if vf is not None:
                    found.append((int(entry[6:]), vf))
        return tuple(a for _, a in sorted(found))

    def physfn(self, address: objects.PciAddress | str
               ) -> objects.PciAddress | None:
        """The PF of a VF, or None (a ``physfn`` that leads to the
        device itself is said and ignored, as discovery ignores it)."""
        address = objects.PciAddress.parse(address)
        path = os.path.join(self.pci_dir(address), 'physfn')
        name = self.link_name(path)
        if name is None:
            return None
        try:
            found = objects.PciAddress.parse(name)
        except exception.InvalidPciAddress:
            raise exception.SysfsReadError(
                path=path, reason='expected a link to a PCI device, found '
                '%r' % name[:80])
        return _not_itself(address, found, path, _log_warning)
