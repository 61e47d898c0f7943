"""The GPUs as OpenStack Cyborg's driver objects, field for field.

What our Cyborg driver (``libvirt_gpu.cyborg_driver``) hands to Cyborg's
agent, without importing Cyborg: records named and shaped like Cyborg's
``cyborg.objects.driver_objects`` (``DriverDevice`` -> ``DriverDeployable``
-> ``DriverAttribute``/``DriverAttachHandle``, ``DriverControlPathID``),
whose JSON fields are already the strings Cyborg stores.  Cyborg's
conductor matches control paths and attach handles by string equality, so
they are written exactly as Cyborg's own NVIDIA driver writes them
(``cyborg.accelerator.common.utils.pci_str_to_json``/``mdev_str_to_json``:
sorted keys; ``std_board_info``: ``product_id`` then ``controller``).

Equal to Cyborg 17's ``nvidia_gpu_driver`` on the same host, except where
that driver is wrong (README, "With OpenStack Cyborg"; pinned by
tests/unit/test_cyborg_golden.py):

- a VF is never a device of its own (its physical GPU is);
- a GPU that cannot be offered (no IOMMU group, a host device in its group,
  a vendor we do not pass through, no capacity for its enabled type, a
  whole GPU that holds vGPUs now) is left out, never reported with a total
  of 0 or as free;
- a vGPU on a vendor interface of SR-IOV VFs (NVIDIA's vGPU 17+, or any
  vGPU kind of that shape) is not offered to Cyborg: Cyborg creates a vGPU
  only for an MDEV handle, and nothing would set a VF's vGPU type
  (``vendor_interface_refusal``);
- names come from libvirt or pci.ids, never from ``lspci``.

Deployable names are Cyborg's (``<host>_<address>``); the Placement
provider of a deployable is ``uuid3(NAMESPACE_DNS, name)`` in Cyborg's
conductor and in our own tree (``placement.model``), so a host moves
between Cyborg and ``libvirt-gpu agent`` without new providers.
"""

from __future__ import annotations

import json

from libvirt_gpu import objects
from libvirt_gpu.placement import model
from libvirt_gpu.placement import traits as traits_mod
from libvirt_gpu import records

DEVICE_TYPE = 'GPU'
CPID_TYPE = 'PCI'
AH_PCI = 'PCI'
AH_MDEV = 'MDEV'
# What Cyborg's NVIDIA driver puts in every device's vendor_board_info;
# Cyborg needs the field set (an unset one breaks every later report).
VENDOR_BOARD_INFO = {'vendor_info': 'gpu_vb_info'}
# Deployable.driver_name: Cyborg's vendor map, upper-cased.
DRIVER_NAMES = {objects.NVIDIA_VENDOR_ID: 'NVIDIA'}
# std_board_info's controller: the PCI class as lspci (pci.ids) names it.
CLASS_NAMES = {
    '0300': 'VGA compatible controller',
    '0301': 'XGA compatible controller',
    '0302': '3D controller',
    '0380': 'Display controller',
}


@records.record
class DriverAttachHandle:
    attach_type: str            # 'PCI' (whole GPU) or 'MDEV' (a vGPU)
    attach_info: str            # JSON, sorted keys
    in_use: bool = False        # Cyborg's drivers always say False


@records.record
class DriverAttribute:
    key: str                    # 'rc' or 'trait<N>'
    value: str


@records.record
class DriverDeployable:
    name: str
    num_accelerators: int
    attribute_list: tuple[DriverAttribute, ...]
    attach_handle_list: tuple[DriverAttachHandle, ...]
    driver_name: str | None


@records.record
class DriverControlPathID:
    cpid_type: str
    cpid_info: str              # JSON, sorted keys


@records.record
class DriverDevice:
    vendor: str
    model: str
    type: str
    std_board_info: str
    vendor_board_info: str
    controlpath_id: DriverControlPathID
    deployable_list: tuple[DriverDeployable, ...]
    stub: bool = False


def _dumps(value, sort_keys):
    # oslo.serialization's jsonutils.dumps is json.dumps with its defaults.
    return json.dumps(value, sort_keys=sort_keys)


def _bdf(address):
    return {'domain': '%04x' % address.domain, 'bus': '%02x' % address.bus,
            'device': '%02x' % address.slot,
            'function': '%x' % address.function}


def pci_info(address):
    """``{"bus": "3b", "device": "00", "domain": "0000", "function": "0"}``
    as Cyborg writes a PCI control path or attach handle."""
    return _dumps(_bdf(address), sort_keys=True)


def mdev_info(address, type_id, index):
    return _dumps(dict(_bdf(address), asked_type=type_id,
                       vgpu_mark='%s_%d' % (type_id, index)), sort_keys=True)


def ordered_traits(trait_set):
    """Cyborg's order: OWNER_CYBORG, the CUSTOM_ traits, then the others.

    The conductor compares attributes by key (``trait0``, ``trait1``...):
    a trait that moves to another key is removed and added again, and
    sorted names lost OWNER_CYBORG in Placement on a vGPU -> whole GPU ->
    vGPU flip."""
    rest = sorted(trait_set - {traits_mod.OWNER})
    owner = [traits_mod.OWNER] if traits_mod.OWNER in trait_set else []
    return (owner + [t for t in rest if t.startswith('CUSTOM_')]
            + [t for t in rest if not t.startswith('CUSTOM_')])


def model_name(gpu):
    """What ``lspci -nn`` prints before the ids: vendor and device names
    (``NVIDIA Corporation TU104GL [Tesla T4]``; ``Device`` when pci.ids
    does not name it)."""
    vendor = gpu.vendor_name or 'Vendor %s' % gpu.vendor_id
    return '%s %s' % (vendor, gpu.product_name or 'Device')


def controller(gpu):
    return CLASS_NAMES.get(gpu.class_code[2:6], 'Display controller')


def vendor_interface_refusal(gpu, setting):
    """Why a GPU's enabled type cannot go to Cyborg, or None: its vGPUs
    are not mdevs but VFs whose type a vendor interface sets (NVIDIA's
    vGPU 17+, or any other kind of that shape), and Cyborg creates vGPUs
    only as mdevs."""
    interface = gpu.vgpu_interface
    if setting is None or interface in (None, objects.MDEV_INTERFACE):
        return None
    return ('%s: vGPU type %s is made through the %s vendor interface of '
            'its SR-IOV VFs (NVIDIA\'s is vGPU 17+); Cyborg creates vGPUs '
            'only as mdevs and could not set a VF\'s type, so this GPU is '
            'not reported to Cyborg' % (gpu.address, setting.type_id,
                                        interface))


def mdev_parents(gpu, type_id, count):
    """The address of each of the ``count`` MDEV handles of ``gpu``: the
    GPU's own (Cyborg's driver), or, where the type's mdevs are made on
    SR-IOV VFs (Ampere and later, classic vGPU), one VF per handle, since
    Cyborg creates a handle's vGPU under the address the handle names: the
    VFs that hold one of the type, then the free ones that list it, in
    address order."""
    if not gpu.vf_gpus:
        return [gpu.address] * count
    usable = [vf for vf in sorted(gpu.vf_gpus, key=lambda f: f.address)
              if vf.mdev_type(type_id) is not None and (
                  not vf.used_type_ids or type_id in vf.used_type_ids)]
    return [vf.address for vf in usable][:count]


def _deployable(hostname, gpu, setting, gpu_traits):
    if setting is None:
        rc = model.PGPU
        trait_set = traits_mod.pgpu_traits(gpu)
        count = 1
        handles = (DriverAttachHandle(AH_PCI, pci_info(gpu.address)),)
    else:
        rc = setting.resource_class
        trait_set = traits_mod.vgpu_traits(
            gpu, gpu.offered_type(setting.type_id), gpu_traits)
        # One handle per vGPU, never more vGPUs than handles: Cyborg binds
        # a request to a free handle.
        parents = mdev_parents(gpu, setting.type_id,
                               model.vgpu_total(gpu, setting))
        count = len(parents)
        handles = tuple(
            DriverAttachHandle(AH_MDEV, mdev_info(parent, setting.type_id, i))
            for i, parent in enumerate(parents))
    attributes = [DriverAttribute('rc', rc)] + [
        DriverAttribute('trait%d' % i, t)
        for i, t in enumerate(ordered_traits(trait_set))]
    return DriverDeployable(
        name=model.gpu_provider_name(hostname, gpu.address),
        num_accelerators=count, attribute_list=tuple(attributes),
        attach_handle_list=handles,
        driver_name=DRIVER_NAMES.get(gpu.vendor_id,
                                     traits_mod.vendor_word(gpu.vendor_id)))


def reportable(gpu, setting, pgpu_vendors=model.DEFAULT_PGPU_VENDORS):
    """Whether a GPU becomes a Cyborg device: what our own Placement tree
    offers (``model.offered``, capacity above 0), less the vendor
    interface and less a whole GPU that holds vGPUs now (our tree reserves
    it; Cyborg cannot reserve, and would hand it out)."""
    if not model.offered(gpu, setting, pgpu_vendors):
        return False
    if setting is None:
        return not model.holds_vgpus(gpu)
    if vendor_interface_refusal(gpu, setting) is not None:
        return False
    return bool(mdev_parents(gpu, setting.type_id,
                             model.vgpu_total(gpu, setting)))


def driver_devices(hostname, gpus, enabled, gpu_traits=True,
                   pgpu_vendors=model.DEFAULT_PGPU_VENDORS):
    """The ``DriverDevice`` records of a host, by address.

    ``enabled``: ``{PciAddress: EnabledType}`` (``enablement.resolve``);
    ``hostname``: Cyborg's ``[DEFAULT]/host``."""
    devices = []
    for gpu in sorted(gpus, key=lambda g: g.address):
        setting = enabled.get(gpu.address)
        if not reportable(gpu, setting, pgpu_vendors):
            continue
        devices.append(DriverDevice(
            vendor=gpu.vendor_id,
            model=model_name(gpu),
            type=DEVICE_TYPE,
            std_board_info=_dumps({'product_id': gpu.product_id,
                                   'controller': controller(gpu)},
                                  sort_keys=False),
            vendor_board_info=_dumps(VENDOR_BOARD_INFO, sort_keys=False),
            controlpath_id=DriverControlPathID(CPID_TYPE,
                                               pci_info(gpu.address)),
            deployable_list=(_deployable(hostname, gpu, setting,
                                         gpu_traits),),
            stub=False))
    return tuple(devices)


def to_primitive(record):
    """A record as plain data: ``{field: value}``, nested records and
    tuples as dicts and lists (the shape of Cyborg's object fields)."""
    if isinstance(record, tuple):
        return [to_primitive(r) for r in record]
    if records.is_record(record):
        return {f.name: to_primitive(getattr(record, f.name))
                for f in records.fields(record)}
    return record
