"""The Cyborg view of the GPUs: agent-driver report and driver objects.

``agent_report`` is the Rocky-era agent-driver ``discover()`` dict keyed by
PCI address.  ``driver_devices`` follows Cyborg's driver objects
(cyborg/objects/driver_objects): device -> deployable -> attach handles, with
a PCI control-path id and rc/trait attributes.

SR-IOV: a physical GPU is one device with one deployable (its VFs are not
devices of their own); a vGPU on the vendor interface is handed to a guest
as a VF, so its attach handles are ``PCI`` handles naming free VFs, while a
classic mdev (on the GPU or on a VF) is an ``MDEV`` handle.
"""


from __future__ import annotations

from libvirt_gpu.placement import model
from libvirt_gpu.placement import traits as traits_mod
from libvirt_gpu import records


@records.record
class ControlPathID:
    cpid_type: str
    cpid_info: dict[str, str]


@records.record
class AttachHandle:
    attach_type: str            # 'PCI' for a pGPU, 'MDEV' for a vGPU
    attach_info: dict[str, str]
    in_use: bool = False


@records.record
class Attribute:
    key: str
    value: str


@records.record
class Deployable:
    name: str
    num_accelerators: int
    attributes: tuple[Attribute, ...]
    attach_handles: tuple[AttachHandle, ...]


@records.record
class Device:
    vendor: str
    model: str
    type: str
    std_board_info: dict[str, str]
    controlpath_id: ControlPathID
    deployables: tuple[Deployable, ...]


def _pci_info(address):
    return {'domain': '%04x' % address.domain, 'bus': '%02x' % address.bus,
            'device': '%02x' % address.slot,
            'function': '%x' % address.function}


def agent_report(gpus, enabled):
    """``{"0000:af:00.0": {"type": "GPU", "vendor": "10de", ...}}``"""
    report = {}
    for gpu in gpus:
        entry = {
            'type': 'GPU',
            'vendor': gpu.vendor_id,
            'product': gpu.product_id,
            'devices': str(gpu.address),
            'driver': gpu.driver,
            'numa_node': gpu.numa_node,
            'iommu_group': gpu.iommu_group,
            'assignable': (not gpu.is_vf
                           and model.pgpu_refusal(gpu) is None),
        }
        if gpu.is_vf:
            entry['physfn'] = str(gpu.physfn)
        if gpu.virtfns:
            entry['virtfns'] = len(gpu.virtfns)
        setting = enabled.get(gpu.address)
        if setting is not None:
            entry['vgpu_type'] = setting.type_id
            entry['vgpu_total'] = model.vgpu_total(gpu, setting)
        report[str(gpu.address)] = entry
    return report


def _deployable(hostname, gpu, setting, gpu_traits):
    name = model.gpu_provider_name(hostname, gpu.address)
    if setting is None:
        trait_set = traits_mod.pgpu_traits(gpu)
        rc = model.PGPU
        handles = (AttachHandle('PCI', {'address': str(gpu.address)},
                                in_use=model.holds_vgpus(gpu)),)
        count = 1
    else:
        mtype = gpu.offered_type(setting.type_id)
        trait_set = traits_mod.vgpu_traits(gpu, mtype, gpu_traits)
        rc = setting.resource_class
        count = model.vgpu_total(gpu, setting)
        info = dict(_pci_info(gpu.address), asked_type=setting.type_id)
        if any(vf.vendor_vf is not None for vf in gpu.vf_gpus):
            # A vendor interface: the guest gets a VF, so one PCI handle
            # per VF that holds or can take a vGPU of the type (those
            # holding one are in use).
            held = [vf for vf in gpu.vf_gpus
                    if setting.type_id in vf.used_type_ids]
            free = [vf for vf in gpu.vf_gpus if not vf.used_type_ids and any(
                t.id == setting.type_id for t in vf.vgpu_types)]
            handles = tuple(
                AttachHandle('PCI', dict(
                    _pci_info(vf.address), asked_type=setting.type_id,
                    vgpu_mark='%s_%d' % (setting.type_id, i)),
                    in_use=vf in held)
                for i, vf in enumerate((held + free)[:count]))
        else:
            handles = tuple(
                AttachHandle('MDEV', dict(info, vgpu_mark='%s_%d'
                                          % (setting.type_id, i)))
                for i in range(count))
    attributes = [Attribute('rc', rc)]
    attributes += [Attribute('trait%d' % i, t)
                   for i, t in enumerate(sorted(trait_set))]
    return Deployable(name=name, num_accelerators=count,
                      attributes=tuple(attributes), attach_handles=handles)


def driver_devices(hostname, gpus, enabled, gpu_traits=True,
                   pgpu_vendors=model.DEFAULT_PGPU_VENDORS):
    devices = []
    for gpu in sorted(gpus, key=lambda g: g.address):
        if gpu.is_vf:
            continue      # part of its physical GPU's device
        setting = enabled.get(gpu.address)
        if not model.offered(gpu, setting, pgpu_vendors) or (
                setting is not None and model.vgpu_total(gpu, setting) < 1):
            deployables = ()
        else:
            deployables = (_deployable(hostname, gpu, setting, gpu_traits),)
        devices.append(Device(
            vendor=gpu.vendor_id,
            model=gpu.product_name or gpu.product_id,
            type='GPU',
            std_board_info={'product_id': gpu.product_id,
                            'controller': gpu.product_name or ''},
            controlpath_id=ControlPathID('PCI', _pci_info(gpu.address)),
            deployables=deployables))
    return devices


def to_dict(device):
    return records.asdict(device)
