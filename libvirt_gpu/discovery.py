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
(``Gpu.vendor_vf``, sysfs only: libvirt does not report it), its types
named and given NVIDIA's published maximum by the vendor backend's table
(``backends.nvidia_vgpu.complete_types``).
"""

import dataclasses
import logging
import os

from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu import sysfs as sysfs_mod

LOG = logging.getLogger(__name__)

GPU_CLASS_PREFIX = objects.GPU_CLASS_PREFIX
is_gpu_class = objects.is_gpu_class


def from_sysfs(sysfs, share_type_text=True):
    """Discover GPUs by reading a sysfs tree (``Sysfs``).

    ``share_type_text``: read a type's name, description and device_api
    once per driver and device model (see ``Sysfs.mdev_types``).

    One bad entry does not hide the rest of the host: a PCI device, a vGPU
    type or an mdev whose files cannot be read (a FIFO, a link out of the
    root, a malformed number) is skipped with a warning naming the file.
    Only a tree without a readable ``bus/pci/devices`` is an error.
    """
    skipped = []
    mdevs = sysfs.mdevs_by_parent(skipped=skipped)
    static_cache = {} if share_type_text else None
    gpus = []
    for address in sysfs.pci_addresses():
        try:
            if not is_gpu_class(sysfs.pci_class(address)):
                continue
            gpu = sysfs.read_gpu(address, mdevs_by_parent=mdevs,
                                 static_cache=static_cache, skipped=skipped)
            gpus.append(with_vendor_vf(gpu, sysfs))
        except exception.SysfsError as e:
            _warn_skipped('PCI device %s' % address, e)
    for error in skipped:
        _warn_skipped('sysfs entry', error)
    return objects.DiscoveryResult(source='sysfs', gpus=group_sriov(gpus))


def _warn_skipped(what, error):
    LOG.warning('%s skipped: %s', what, error)


def with_vendor_vf(gpu, sysfs):
    """A VF with its vendor-interface state (``<VF>/nvidia/``) read.  An
    mdev parent never has one (NVIDIA: the vendor-specific framework does
    not support mdev), so only VFs without mdev types are looked at."""
    if gpu.physfn is None or gpu.mdev_types or gpu.vendor_vf is not None:
        return gpu
    state = sysfs.read_vendor_vf(gpu.address)
    return gpu if state is None else dataclasses.replace(gpu, vendor_vf=state)


def group_sriov(gpus):
    """``gpus`` (a tuple, order kept) with each PF's ``vf_gpus`` set and the
    vendor-interface types of its VFs completed."""
    by_address = {g.address: g for g in gpus}
    for pf in gpus:
        if not pf.virtfns or pf.is_vf:
            continue
        vfs = [by_address[a] for a in pf.virtfns if a in by_address]
        supported = ()
        if any(vf.vendor_vf is not None for vf in vfs):
            # Imported here: only hosts with the vendor interface need it.
            from libvirt_gpu.backends import nvidia_vgpu
            vfs = nvidia_vgpu.complete_types(pf, vfs)
            for vf in vfs:
                by_address[vf.address] = vf
            supported = nvidia_vgpu.supported_types(pf.product_id)
        by_address[pf.address] = dataclasses.replace(
            pf, vf_gpus=tuple(vfs), supported_types=supported)
    return tuple(by_address[g.address] for g in gpus)


def _supplement(gpu, sysfs):
    """Fill what libvirt does not report from sysfs, where sysfs has it.

    libvirt has no type descriptions, and its test driver (unlike the udev
    backend of a real daemon) keeps no ``<driver>``.
    """
    if sysfs is None or not os.path.isdir(sysfs.pci_dir(gpu.address)):
        return gpu
    changes = {}
    if gpu.physfn is not None and not gpu.mdev_types:
        state = sysfs.read_vendor_vf(gpu.address)
        if state is not None:
            changes['vendor_vf'] = state
    if gpu.driver is None:
        changes['driver'] = sysfs.link_name(
            os.path.join(sysfs.pci_dir(gpu.address), 'driver'))
    if gpu.mdev_types and os.path.isdir(sysfs.types_dir(gpu.address)):
        skipped = []
        descriptions = {t.id: t.description
                        for t in sysfs.mdev_types(gpu.address,
                                                  skipped=skipped)}
        for error in skipped:
            _warn_skipped('type description', error)
        changes['mdev_types'] = tuple(
            dataclasses.replace(t, description=descriptions.get(t.id))
            if t.description is None else t for t in gpu.mdev_types)
    return dataclasses.replace(gpu, **changes)


def from_libvirt(host, sysfs=None):
    """Discover GPUs through libvirt's node-device API (``host.Host``).

    ``sysfs``, when given, supplies what libvirt lacks (``_supplement``).
    """
    # Imported here: the XML parser (lxml) is needed with libvirt only.
    from libvirt_gpu import nodedev
    mdevs = {}
    for node in host.mdev_nodes():
        mdevs.setdefault(node.parent, []).append(node.mdev)
    gpus = []
    for xml in host.pci_devices():
        if not is_gpu_class(nodedev.pci_class(xml)):
            continue
        gpu = nodedev.parse_pci(xml)
        try:
            gpu = _supplement(gpu, sysfs)
        except exception.SysfsError as e:
            _warn_skipped('PCI device %s' % gpu.address, e)
            continue
        gpus.append(_with_mdevs(gpu, mdevs.get(gpu.address, ())))
    gpus.sort(key=lambda g: g.address)
    return objects.DiscoveryResult(source='libvirt',
                                   gpus=group_sriov(tuple(gpus)))


def _with_mdevs(gpu, mdevs):
    return dataclasses.replace(gpu, mdevs=tuple(sorted(mdevs)))


def discover(uri=None, sysfs_root=None, default_uri='qemu:///system',
             default_sysfs_root='/sys'):
    """Discover with the source the operator chose.

    ``uri`` given: libvirt only (errors are errors).  ``sysfs_root`` given:
    sysfs only.  Neither: libvirt at ``default_uri``, falling back to sysfs
    at ``default_sysfs_root`` when libvirt cannot be reached; the result's
    ``source`` and the log say which was used.
    """
    if sysfs_root is not None and uri is None:
        return from_sysfs(sysfs_mod.Sysfs(sysfs_root))
    # Imported here: reading sysfs needs no libvirt (the qemu hook reads
    # GPUs with from_sysfs and must never import libvirt).
    from libvirt_gpu import host as host_mod
    if uri is not None:
        sysfs = sysfs_mod.Sysfs(sysfs_root or default_sysfs_root)
        with host_mod.Host(uri, read_only=True) as h:
            return from_libvirt(h, sysfs)
    try:
        with host_mod.Host(default_uri, read_only=True) as h:
            return from_libvirt(h, sysfs_mod.Sysfs(default_sysfs_root))
    except exception.LibvirtUnavailable as e:
        LOG.warning('libvirt unavailable (%s); reading sysfs at %s instead',
                    e, default_sysfs_root)
        return from_sysfs(sysfs_mod.Sysfs(default_sysfs_root))
