"""Find the GPUs of a host: libvirt's node-device API first, sysfs second.

Both sources produce the same ``objects.Gpu`` records (a parity test proves
it on every simulated profile); libvirt adds vendor and product names, sysfs
adds type descriptions, which libvirt does not report.  A GPU is any PCI
device of class 0x03xxxx (VGA, XGA, 3D controller, display controller).

SR-IOV: VFs are PCI functions of class 0x03 too and are listed like any
GPU (with ``physfn``); each PF record also carries the records of its
enabled VFs (``Gpu.vf_gpus``), so that callers judge one physical GPU as a
whole and never take a VF for a GPU of its own.  A VF with NVIDIA's vGPU
17+ vendor interface carries what its ``nvidia/`` directory says
(``Gpu.vendor_vf``, sysfs only: libvirt does not report it), its listed
types - only those - named and given their maximum from NVML or, by type
name, the kind's table.  Discovery never names a kind: the caller hands it
the vGPU kinds (``kinds``: ``VgpuKind`` classes, an ``Environment``'s
``kind_classes``), and each reads its own functions
(``VendorFunctions.read_function``) and completes its types
(``VendorFunctions.complete_types``).

IOMMU groups: each GPU carries every function of its group
(``Gpu.iommu_members``), each judged a companion of the GPU (another
function of its own PCI device, e.g. its HDMI audio) or a device the host
uses (``pci_classes``).  A GPU without a group cannot be passed through.

Names: libvirt names devices from the PCI ID database; reading sysfs we
look the same database up (``pciids``) when the caller gives one.  NVML
(``nvml``), when asked for and present, adds what only the driver knows.
"""

from __future__ import annotations

import os

from libvirt_gpu.devices import capabilities
from libvirt_gpu import exception
from libvirt_gpu.util import logs
from libvirt_gpu import objects
from libvirt_gpu.devices import pci_classes
from libvirt_gpu.util import records
from libvirt_gpu.devices import sysfs as sysfs_mod

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from libvirt_gpu.devices.sysfs.devices import Sysfs

LOG = logs.getLogger(__name__)

GPU_CLASS_PREFIX = objects.GPU_CLASS_PREFIX
is_gpu_class = objects.is_gpu_class


def from_sysfs(sysfs, share_type_text=True, pci_ids=None, parallel=False,
               *, kinds):
    """Discover GPUs by reading a sysfs tree (``Sysfs``).

    ``share_type_text``: read a type's name, description and device_api
    once per driver and device model (see ``Sysfs.mdev_types``).

    One bad entry does not hide the rest of the host: a PCI device, a vGPU
    type or an mdev whose files cannot be read (a FIFO, a link out of the
    root, a malformed number) is skipped with a warning naming the file.
    Only a tree without a readable ``bus/pci/devices`` is an error.

    ``pci_ids``: a ``pciids.PciIds`` to name the GPUs from (None: numbers
    only, as sysfs has them).

    ``parallel``: a large host's PCI devices may be read by several
    processes at once (``fanout``: one per 64 devices, one per CPU that
    other work leaves, at most 4); the result, and the warnings in their
    order, are those of one process.  For a command run once (the CLI),
    not for a long-lived process with threads or the hook.

    ``kinds``: the vGPU kinds (see the module doc), required.
    """
    kinds = _kinds(kinds)
    skipped = []
    mdevs = sysfs.mdevs_by_parent(skipped=skipped)
    addresses = sysfs.pci_addresses()

    def read(part):
        return _read_gpus(sysfs, part, mdevs, share_type_text, pci_ids,
                          kinds)
    workers = 1
    if parallel:
        from libvirt_gpu.util import fanout
        workers = fanout.workers_for(len(addresses))
    if workers > 1:
        parts = fanout.map_parts(read, addresses, workers)
    else:
        parts = [read(addresses)]
    gpus = []
    for found, _, _ in parts:
        gpus.extend(found)
    for _, refused, _ in parts:
        for what, error in refused:
            _warn_skipped(what, error)
    for error in skipped:
        _warn_skipped('sysfs entry', error)
    for _, _, part_skipped in parts:
        for error in part_skipped:
            _warn_skipped('sysfs entry', error)
    return objects.DiscoveryResult(source='sysfs',
                                   gpus=group_sriov(_unique(gpus), kinds))


def _unique(gpus):
    """``gpus`` less every GPU whose address another one has too
    (``0000:AF:00.0`` and ``0000:af:00.0`` in a tree, two node devices of
    one address): which is the real one cannot be told, and two providers
    of one GPU would offer it twice.  Each is skipped with a warning."""
    count = {}
    for gpu in gpus:
        count[gpu.address] = count.get(gpu.address, 0) + 1
    kept = []
    said = set()
    for gpu in gpus:
        if count[gpu.address] == 1:
            kept.append(gpu)
        elif gpu.address not in said:
            said.add(gpu.address)
            _warn_skipped('PCI device %s' % gpu.address,
                          'it is listed %d times; which one is the device '
                          'cannot be told' % count[gpu.address])
    return kept


def _read_gpus(sysfs, addresses, mdevs, share_type_text, pci_ids, kinds):
    """The GPUs among ``addresses``, read with their IOMMU groups, names
    and vendor-interface state: ``(gpus, refused, skipped)``, where
    ``refused`` holds ``(what, message)`` of a device that could not be
    read and ``skipped`` the messages of entries left out of a GPU (text:
    the answer may come back from another process, ``fanout``)."""
    static_cache = {} if share_type_text else None
    groups = {}
    gpus = []
    refused = []
    skipped = []
    for address in addresses:
        try:
            gpu = sysfs.read_gpu(address, mdevs_by_parent=mdevs,
                                 static_cache=static_cache, skipped=skipped,
                                 class_filter=is_gpu_class)
            if gpu is None:
                continue
            if gpu.iommu_group is not None:
                if gpu.iommu_group not in groups:
                    # the GPU's own function as just read; the others read
                    groups[gpu.iommu_group] = [
                        objects.IommuMember(a, gpu.vendor_id, gpu.product_id,
                                            gpu.class_code, gpu.driver)
                        if a == gpu.address else sysfs.pci_function(a)
                        for a in
                        sysfs.iommu_group_addresses(gpu.iommu_group)]
                gpu = with_iommu_members(gpu, groups[gpu.iommu_group])
            gpu = with_pci_names(gpu, pci_ids)
            gpus.append(with_vendor_vf(gpu, sysfs, kinds))
        except exception.SysfsError as e:
            refused.append(('PCI device %s' % address, str(e)))
    return gpus, refused, [str(e) for e in skipped]


def _warn_skipped(what, error):
    LOG.warning('%s skipped: %s', what, error)


def with_pci_names(gpu, pci_ids):
    """``gpu`` named from the PCI ID database where it has no names."""
    if pci_ids is None or (gpu.vendor_name and gpu.product_name):
        return gpu
    return records.replace(
        gpu, vendor_name=gpu.vendor_name or pci_ids.vendor(gpu.vendor_id),
        product_name=gpu.product_name or pci_ids.device(gpu.vendor_id,
                                                        gpu.product_id))


def with_iommu_members(gpu: objects.Gpu,
                       functions: Iterable[objects.IommuMember]
                       ) -> objects.Gpu:
    """``gpu`` with the functions of its IOMMU group (IommuMember records
    as read) judged: a companion is another function of the GPU's own
    PCI device of a companion class; a device the host uses is one of a
    host-device class with a host driver bound (``pci_classes``)."""
    members = []
    for function in functions:
        own = function.address
        companion = (own != gpu.address
                     and (own.domain, own.bus, own.slot)
                     == (gpu.address.domain, gpu.address.bus,
                         gpu.address.slot)
                     and pci_classes.is_companion_class(function.class_code))
        uses = pci_classes.host_uses(function.class_code, function.driver,
                                     companion)
        host_class = (pci_classes.host_class_name(function.class_code)
                      if uses else None)
        if (companion, uses, host_class) != (
                function.companion, function.host_uses, function.host_class):
            # (most members, the GPU's own function first, are judged
            # neither: the record as read is the judged one)
            function = records.replace(function, companion=companion,
                                       host_uses=uses, host_class=host_class)
        members.append(function)
    return records.replace(gpu, iommu_members=tuple(sorted(members)))


def with_vendor_vf(gpu, sysfs, kinds):
    """A VF with its vendor-interface state (``<VF>/nvidia/``) read.  An
    mdev parent never has one (NVIDIA: the vendor-specific framework does
    not support mdev), so only VFs without mdev types are looked at."""
    if gpu.physfn is None or gpu.mdev_types or gpu.vendor_vf is not None:
        return gpu
    state = read_function(sysfs, gpu.address, kinds)
    return gpu if state is None else records.replace(gpu, vendor_vf=state)


def read_function(sysfs, address, kinds):
    """The ``objects.VendorVf`` the first of ``kinds`` reads on the VF
    ``address`` (``VendorFunctions.read_function``), or None."""
    for kind in kinds:
        if not issubclass(kind, capabilities.VendorFunctions):
            continue
        state = kind.read_function(sysfs, address)
        if state is not None:
            return state
    return None


def group_sriov(gpus, kinds):
    """``gpus`` (a tuple, order kept) with each PF's ``vf_gpus`` set and the
    vendor-interface types of its VFs completed by ``kinds``."""
    by_address = {g.address: g for g in gpus}
    for pf in gpus:
        if not pf.virtfns or pf.is_vf:
            continue
        vfs = [by_address[a] for a in pf.virtfns if a in by_address]
        if any(vf.vendor_vf is not None for vf in vfs):
            for kind in kinds:
                if issubclass(kind, capabilities.VendorFunctions):
                    vfs = kind.complete_types(pf, vfs)
            for vf in vfs:
                by_address[vf.address] = vf
        by_address[pf.address] = records.replace(pf, vf_gpus=tuple(vfs))
    return tuple(by_address[g.address] for g in gpus)


def gpu_view(sysfs: Sysfs, gpu: objects.PciAddress,
             kinds: Iterable[type],        # the vGPU kinds' classes
             mdevs_by_parent: (Mapping[objects.PciAddress,
                                       Sequence[objects.Mdev]] | None) = None
             ) -> objects.Gpu:
    """The ``objects.Gpu`` of the physical GPU ``gpu`` with its VFs
    (``vf_gpus``, vendor state and completed types), read from ``sysfs``
    alone and grouped as discovery groups them (``group_sriov``): how the
    allocator counts a GPU's capacity with the function Placement's
    inventory uses."""
    if mdevs_by_parent is None:
        mdevs_by_parent = sysfs.mdevs_by_parent()
    found = [sysfs.read_gpu(gpu, mdevs_by_parent=mdevs_by_parent)]
    for vf in sysfs.virtfns(gpu):
        found.append(with_vendor_vf(
            sysfs.read_gpu(vf, mdevs_by_parent=mdevs_by_parent), sysfs,
            kinds))
    return group_sriov(tuple(found), kinds)[0]


def _kinds(kinds):
    """``kinds`` as a tuple; None refused.  Discovery imports no kind and
    no registry (it sits below them): its caller hands it the kinds."""
    if kinds is None:
        raise TypeError("discovery needs the vGPU kinds: pass kinds= an "
                        "Environment's kind_classes (() for none)")
    return tuple(kinds)


def _supplement(gpu, sysfs, kinds):
    """Fill what libvirt does not report from sysfs, where sysfs has it.

    libvirt has no type descriptions, and its test driver (unlike the udev
    backend of a real daemon) keeps no ``<driver>``.
    """
    if sysfs is None or not sysfs.isdir(sysfs.pci_dir(gpu.address)):
        return gpu
    changes = {}
    if gpu.physfn is not None and not gpu.mdev_types:
        state = read_function(sysfs, gpu.address, kinds)
        if state is not None:
            changes['vendor_vf'] = state
    if gpu.driver is None:
        changes['driver'] = sysfs.link_name(
            os.path.join(sysfs.pci_dir(gpu.address), 'driver'))
    if gpu.local_cpulist is None:
        changes['local_cpulist'] = sysfs.read(
            os.path.join(sysfs.pci_dir(gpu.address), 'local_cpulist'),
            optional=True)
    if gpu.mdev_types and sysfs.isdir(sysfs.types_dir(gpu.address)):
        skipped = []
        descriptions = {t.id: t.description
                        for t in sysfs.mdev_types(gpu.address,
                                                  skipped=skipped)}
        for error in skipped:
            _warn_skipped('type description', error)
        changes['mdev_types'] = tuple(
            records.replace(t, description=descriptions.get(t.id))
            if t.description is None else t for t in gpu.mdev_types)
    return records.replace(gpu, **changes)


def from_libvirt(host, sysfs=None, *, kinds):
    """Discover GPUs through libvirt's node-device API (``host.Host``).

    ``sysfs``, when given, supplies what libvirt lacks (``_supplement``);
    ``kinds``: the vGPU kinds (see the module doc), required.
    """
    kinds = _kinds(kinds)
    # Imported here: node-device XML is read with libvirt only.
    from libvirt_gpu.virt import nodedev
    mdevs = {}
    for node in host.mdev_nodes():
        mdevs.setdefault(node.parent, []).append(node.mdev)
    gpus = []
    functions = {}
    for xml in host.pci_devices():
        function = nodedev.parse_function(xml)
        functions[function.address] = function
        if function.class_code is None:
            # libvirt < 5.2 writes no <class> (RHEL 7, Ubuntu 18.04)
            gpu = _classless_gpu(xml, function, sysfs)
            if gpu is None:
                continue
        elif not is_gpu_class(function.class_code):
            continue
        else:
            gpu = nodedev.parse_pci(xml)
        try:
            gpu = _supplement(gpu, sysfs, kinds)
        except exception.SysfsError as e:
            _warn_skipped('PCI device %s' % gpu.address, e)
            continue
        gpus.append(_with_mdevs(gpu, mdevs.get(gpu.address, ())))
    gpus = [_with_libvirt_group(gpu, functions, sysfs)
            for gpu in _unique(gpus)]
    gpus.sort(key=lambda g: g.address)
    return objects.DiscoveryResult(source='libvirt',
                                   gpus=group_sriov(tuple(gpus), kinds))


def _classless_gpu(xml, function, sysfs):
    """A node device without ``<class>`` as a GPU, or None: its class
    read from sysfs where this machine's sysfs has the device; else an
    NVIDIA function that offers vGPU types, is a VF, or is function 0 (an
    NVIDIA board's other functions are its audio, USB and serial ones)."""
    from libvirt_gpu.virt import nodedev
    if sysfs is not None and sysfs.isdir(sysfs.pci_dir(function.address)):
        try:
            class_code = sysfs.pci_class(function.address)
        except exception.SysfsError as e:
            _warn_skipped('PCI device %s' % function.address, e)
            return None
        if not is_gpu_class(class_code):
            return None
        return records.replace(nodedev.parse_pci(xml), class_code=class_code)
    if function.vendor_id != objects.NVIDIA_VENDOR_ID:
        return None
    gpu = nodedev.parse_pci(xml)
    if gpu.mdev_types or gpu.physfn is not None \
            or function.address.function == 0:
        return gpu
    return None


def _with_libvirt_group(gpu, functions, sysfs):
    """The group members libvirt lists (``<iommuGroup><address/>``), each
    described by its own node device; a driver libvirt does not report
    (its test driver keeps none) is read from sysfs when given."""
    members = []
    for address in (m.address for m in gpu.iommu_members):
        function = functions.get(address) or objects.IommuMember(
            address=address, vendor_id=None, product_id=None,
            class_code=None, driver=None)
        if function.driver is None and sysfs is not None \
                and sysfs.isdir(sysfs.pci_dir(address)):
            function = records.replace(function, driver=sysfs.link_name(
                os.path.join(sysfs.pci_dir(address), 'driver')))
        members.append(function)
    return with_iommu_members(gpu, members) if members else gpu


def _with_mdevs(gpu, mdevs):
    return records.replace(gpu, mdevs=tuple(sorted(mdevs)))


def with_nvml(result, nvml, kinds):
    """``result`` with what NVML (``nvml.Nvml``) says about each GPU it
    sees (``Gpu.nvml``), and NVML's name for a GPU the PCI ID database
    did not name, its VFs regrouped by ``kinds`` (the vGPU kinds).  NVML
    absent: ``result`` unchanged."""
    kinds = _kinds(kinds)
    found = nvml.query() if nvml is not None else {}
    if not found:
        return result
    gpus = []
    for gpu in result.gpus:
        info = found.get(gpu.address)
        if info is not None:
            gpu = records.replace(
                gpu, nvml=info, product_name=gpu.product_name or info.name)
        gpus.append(gpu)
    return records.replace(result, gpus=group_sriov(tuple(gpus), kinds))


def discover(uri=None, sysfs_root=None, default_uri='qemu:///system',
             default_sysfs_root='/sys', pci_ids=None, nvml=None,
             parallel=False, *, kinds):
    """Discover with the source the operator chose.

    ``uri`` given: libvirt only (errors are errors).  ``sysfs_root`` given:
    sysfs only.  Neither: libvirt at ``default_uri``, falling back to sysfs
    at ``default_sysfs_root`` when libvirt cannot be reached; the result's
    ``source`` and the log say which was used.  ``pci_ids`` names what
    the source left unnamed; ``nvml`` (``nvml.Nvml``) adds NVML's view;
    ``parallel``: see ``from_sysfs``; ``kinds``: the vGPU kinds (see the
    module doc), required.
    """
    kinds = _kinds(kinds)
    return with_nvml(_discover(uri, sysfs_root, default_uri,
                               default_sysfs_root, pci_ids, parallel, kinds),
                     nvml, kinds)


def with_names(result, pci_ids, kinds):
    """``result`` with its GPUs named from the PCI ID database
    (``pci_ids``, None: as they are) where the source left them unnamed,
    its VFs regrouped by ``kinds`` (the vGPU kinds)."""
    kinds = _kinds(kinds)
    if pci_ids is None:
        return result
    named = tuple(with_pci_names(g, pci_ids) for g in result.gpus)
    if all(a is b for a, b in zip(named, result.gpus)):
        return result          # libvirt named them all (the usual case)
    return records.replace(result, gpus=group_sriov(named, kinds))


def is_local_uri(uri):
    """Whether libvirt at ``uri`` describes this machine: a driver of
    this host (``qemu:///system``, ``qemu+unix:///system``), not another
    host (``qemu+ssh://other/system``, ``qemu://host/system``) nor
    libvirt's test driver (a file, no host at all)."""
    from urllib import parse
    try:
        parts = parse.urlsplit(uri)
    except ValueError:
        return False
    driver, _, transport = parts.scheme.partition('+')
    return (driver not in ('', 'test') and not parts.netloc
            and transport in ('', 'unix'))


def _sysfs_beside(uri, sysfs_root, default_sysfs_root):
    """The sysfs that completes what libvirt at ``uri`` reports: the one
    the operator named, else this machine's only when ``uri`` describes
    this machine (another host's GPUs must not get this host's drivers,
    CPUs or type descriptions); None otherwise."""
    if sysfs_root is not None:
        return sysfs_mod.Sysfs(sysfs_root)
    if is_local_uri(uri):
        return sysfs_mod.Sysfs(default_sysfs_root)
    return None


def _discover(uri, sysfs_root, default_uri, default_sysfs_root, pci_ids,
              parallel, kinds):
    if sysfs_root is not None and uri is None:
        return from_sysfs(sysfs_mod.Sysfs(sysfs_root), pci_ids=pci_ids,
                          parallel=parallel, kinds=kinds)
    # Imported here: reading sysfs needs no libvirt (the qemu hook reads
    # GPUs with from_sysfs and must never import libvirt).
    from libvirt_gpu.virt import host as host_mod
    if uri is not None:
        sysfs = _sysfs_beside(uri, sysfs_root, default_sysfs_root)
        with host_mod.Host(uri, read_only=True) as h:
            return with_names(from_libvirt(h, sysfs, kinds=kinds), pci_ids,
                              kinds)
    try:
        with host_mod.Host(default_uri, read_only=True) as h:
            # The configuration names this host's libvirt and its sysfs
            # together ([libvirt]/connection_uri, [DEFAULT]/sysfs_root):
            # they describe one host, whatever the URI's form (a test:///
            # file of a simulated host, say).  Only a URI given on the
            # command line may name another host.
            return with_names(from_libvirt(h, sysfs_mod.Sysfs(
                default_sysfs_root), kinds=kinds), pci_ids, kinds)
    except exception.LibvirtUnavailable as e:
        LOG.warning('libvirt unavailable (%s); reading sysfs at %s instead',
                    e, default_sysfs_root)
        return from_sysfs(sysfs_mod.Sysfs(default_sysfs_root),
                          pci_ids=pci_ids, parallel=parallel, kinds=kinds)
