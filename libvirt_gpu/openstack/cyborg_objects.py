"""The GPUs as OpenStack Cyborg's driver objects: the one Cyborg model.

What our Cyborg driver (``libvirt_gpu.openstack.cyborg_driver``) hands to
Cyborg's agent and what ``libvirt-gpu discover --json`` prints
(``to_primitive`` of the same records), without importing Cyborg: records
named and shaped like Cyborg's ``cyborg.objects.driver_objects``
(``DriverDevice`` -> ``DriverDeployable`` ->
``DriverAttribute``/``DriverAttachHandle``, ``DriverControlPathID``), whose
JSON fields are already the strings Cyborg stores.

Field values are Cyborg 17's own, as its NVIDIA driver
(``cyborg/accelerator/drivers/gpu/nvidia/sysinfo.py``) writes them from a
line of ``lspci -nn -D`` (``cyborg/accelerator/common/utils.py``
``parse_lspci_line``), and as Cyborg's unit tests pin them for a P100 and
a T4 (tests/unit/openstack/test_cyborg_driver_golden.py):

- ``vendor``: the vendor id, ``10de``; ``type``: ``GPU``;
- ``model``: lspci's device name, vendor and device as pci.ids names them:
  ``NVIDIA Corporation GP100GL [Tesla P100 PCIe 12GB]`` (``NVIDIA
  Corporation Device`` for a device pci.ids does not know);
- ``std_board_info``: ``{"product_id": "15f7", "controller": "3D
  controller"}``, in that order: the device id and lspci's name of the PCI
  class (``VGA compatible controller`` or ``3D controller``);
- ``vendor_board_info``: ``{"vendor_info": "gpu_vb_info"}`` (Cyborg needs
  it set: an unset one breaks every report after the first); ``stub``:
  false;
- ``controlpath_id``: ``PCI``, ``{"bus": "00", "device": "06", "domain":
  "0000", "function": "0"}`` (``pci_str_to_json``: sorted keys; Cyborg's
  conductor matches control paths and attach handles by string equality);
- a deployable named ``<host>_<address>`` (its Placement provider is
  ``uuid3(NAMESPACE_DNS, name)``, in Cyborg's conductor and in our own tree,
  ``placement.model``), ``driver_name`` ``NVIDIA``, attributes ``rc``
  (``PGPU`` or ``VGPU``) then ``trait0``, ``trait1``...: ``OWNER_CYBORG``,
  ``CUSTOM_NVIDIA_15F7`` (``CUSTOM_NVIDIA_1EB8_T4_1B`` for a vGPU type),
  then, with ``[gpu]/report_gpu_traits``, the os-traits display traits;
- attach handles, ``in_use`` always false: one ``PCI`` handle with the
  GPU's address (what Nova reads to build a ``<hostdev>``) for a whole GPU;
  one ``MDEV`` handle per vGPU (``mdev_str_to_json``: the address, plus
  ``asked_type`` and ``vgpu_mark`` ``nvidia-223_<n>``) for an mdev type.

Where this differs from Cyborg's driver on the same host, on purpose
(each difference is named and checked by
tests/unit/openstack/test_cyborg_driver_golden.py):

- a VF is never a device of its own (its physical GPU is); Cyborg's
  driver reports each VF as a whole GPU unless
  ``[gpu_devices]/filter_sriov_vfs`` is set;
- names come from libvirt or pci.ids, never from ``lspci``;
- a GPU carved for Nova (``[nova]/carved``) is a device without a
  deployable: its VFs and their capacity are Nova's PCI devices;
- every GPU we manage is a device (``reported``), but a GPU of which
  nothing can go to a guest through Cyborg has **no deployable**
  (``withheld`` says why): no IOMMU group or a device the host uses in its
  group, a whole GPU that holds vGPUs now (our own tree reserves it;
  Cyborg cannot reserve, and would hand it out), an enabled type with no
  room left (Placement refuses a total of 0), and a vendor-interface vGPU
  type (below).  Cyborg then lists the GPU, but has no provider, handle or
  accelerator of it to schedule or bind.

Vendor-interface vGPUs (NVIDIA vGPU 17+ on kernel >= 6.8: the vGPU is an
SR-IOV VF whose type is written to a file of the VF's ``nvidia/`` folder,
or any other kind of that shape) cannot be carried by the Cyborg route
today, so such a GPU is reported with no deployable and a warning.
Not ``MDEV`` handles: Cyborg binds one by writing a UUID to the named address's
``mdev_supported_types/<type>/create``, which a VF of this kind does not
have, and Nova drops every ``MDEV`` handle anyway.  Not ``PCI`` handles
naming the VFs: nothing in Cyborg or Nova sets a VF's vGPU type, and Nova
composes a Cyborg ``PCI`` handle as ``<hostdev managed='yes'>``, so
libvirt would take the VF from NVIDIA's driver (which must keep it:
``managed='no'``) and the guest would get a VF without its vGPU.  Such
GPUs go to Nova as PCI devices (``[pci] device_spec`` with ``"managed":
"no"``) or to ``libvirt-gpu agent``'s own Placement tree, which offers
them.
"""

from __future__ import annotations

import json

from libvirt_gpu import objects
from libvirt_gpu.openstack.placement import model
from libvirt_gpu.openstack.placement import traits as traits_mod
from libvirt_gpu.util import records

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
# lspci's name of the display class, for a subclass pci.ids does not name.
DISPLAY_CLASS = 'Display controller'


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
    std_board_info: str         # JSON: product_id, then controller
    vendor_board_info: str      # JSON
    controlpath_id: DriverControlPathID
    deployable_list: tuple[DriverDeployable, ...]   # () when withheld
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
    """An MDEV handle's: the address, ``asked_type``, ``vgpu_mark``."""
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
    (``NVIDIA Corporation TU104GL [Tesla T4]``; ``Device`` for a device,
    or a vendor, that pci.ids does not name)."""
    return ' '.join(n for n in (gpu.vendor_name, gpu.product_name or 'Device')
                    if n)


def controller(gpu):
    """lspci's name of the GPU's PCI class (``3D controller``); the
    display class's for a GPU whose class libvirt did not report (before
    5.2 it writes no ``<class>``)."""
    if gpu.class_code is None:
        return DISPLAY_CLASS
    return CLASS_NAMES.get(gpu.class_code[2:6].lower(), DISPLAY_CLASS)


def vendor_interface_refusal(gpu, setting):
    """Why a GPU's enabled type cannot go to Cyborg, or None: its vGPUs
    are not mdevs but VFs whose type a vendor interface sets (NVIDIA's
    vGPU 17+, or any other kind of that shape): see the module doc."""
    interface = gpu.vgpu_interface
    if setting is None or interface in (None, objects.MDEV_INTERFACE):
        return None
    return ('vGPU type %s is made through the %s vendor interface of the '
            'GPU\'s SR-IOV VFs (NVIDIA\'s is vGPU 17+): Cyborg binds vGPUs '
            'only as mdevs, and Nova would pass a VF from Cyborg with '
            'managed=yes, taking it from the vendor\'s driver; the GPU is '
            'reported to Cyborg with nothing to offer (give its VFs to Nova '
            'as PCI devices with "managed": "no", or use libvirt-gpu '
            'agent)' % (setting.type_id, interface))


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


def reported(gpu, setting, pgpu_vendors=model.DEFAULT_PGPU_VENDORS):
    """Whether ``gpu`` is a Cyborg device at all: a physical GPU (a VF is
    part of its physical GPU) of a vendor we pass through whole, or with a
    vGPU type enabled.  (Cyborg's NVIDIA driver reports its vendor's.)"""
    if gpu.is_vf:
        return False
    return setting is not None or gpu.vendor_id in pgpu_vendors


def withheld(gpu, setting):
    """Why nothing of a reported GPU goes to Cyborg (its device then has no
    deployable), or None when it has one: the rules of our own Placement
    tree (``placement.model``: whole-GPU refusals, capacity above 0), less
    a whole GPU holding vGPUs now and a vendor-interface vGPU type."""
    if setting is None:
        refusal = model.pgpu_refusal(gpu)
        if refusal is not None:
            return 'not offered whole: %s' % refusal
        if model.holds_vgpus(gpu):
            return ('not offered whole: it holds vGPUs now (Cyborg could '
                    'not reserve it)')
        return None
    refusal = vendor_interface_refusal(gpu, setting)
    if refusal is not None:
        return refusal
    if not mdev_parents(gpu, setting.type_id,
                        model.vgpu_total(gpu, setting)):
        return 'vGPU type %s: no room left' % setting.type_id
    return None


def _deployable(hostname, gpu, setting, gpu_traits):
    if setting is None:
        rc = model.PGPU
        trait_set = traits_mod.pgpu_traits(gpu)
        handles = (DriverAttachHandle(AH_PCI, pci_info(gpu.address)),)
    else:
        rc = setting.resource_class
        trait_set = traits_mod.vgpu_traits(
            gpu, gpu.offered_type(setting.type_id), gpu_traits)
        # One handle per vGPU, never more vGPUs than handles: Cyborg binds
        # a request to a free handle.
        parents = mdev_parents(gpu, setting.type_id,
                               model.vgpu_total(gpu, setting))
        handles = tuple(
            DriverAttachHandle(AH_MDEV, mdev_info(parent, setting.type_id, i))
            for i, parent in enumerate(parents))
    attributes = [DriverAttribute('rc', rc)] + [
        DriverAttribute('trait%d' % i, t)
        for i, t in enumerate(ordered_traits(trait_set))]
    return DriverDeployable(
        name=model.gpu_provider_name(hostname, gpu.address),
        num_accelerators=len(handles), attribute_list=tuple(attributes),
        attach_handle_list=handles,
        driver_name=DRIVER_NAMES.get(gpu.vendor_id,
                                     traits_mod.vendor_word(gpu.vendor_id)))


def driver_device(hostname, gpu, setting, gpu_traits=True):
    """The ``DriverDevice`` of one reported GPU."""
    deployables = ()
    if withheld(gpu, setting) is None:
        deployables = (_deployable(hostname, gpu, setting, gpu_traits),)
    return DriverDevice(
        vendor=gpu.vendor_id,
        model=model_name(gpu),
        type=DEVICE_TYPE,
        std_board_info=_dumps({'product_id': gpu.product_id,
                               'controller': controller(gpu)},
                              sort_keys=False),
        vendor_board_info=_dumps(VENDOR_BOARD_INFO, sort_keys=False),
        controlpath_id=DriverControlPathID(CPID_TYPE, pci_info(gpu.address)),
        deployable_list=deployables,
        stub=False)


def driver_devices(hostname, gpus, enabled, gpu_traits=True,
                   pgpu_vendors=model.DEFAULT_PGPU_VENDORS):
    """The ``DriverDevice`` records of a host, by address.

    ``enabled``: ``{PciAddress: EnabledType}`` (``enablement.resolve``);
    ``hostname``: Cyborg's ``[DEFAULT]/host``."""
    return tuple(
        driver_device(hostname, gpu, enabled.get(gpu.address), gpu_traits)
        for gpu in sorted(gpus, key=lambda g: g.address)
        if reported(gpu, enabled.get(gpu.address), pgpu_vendors))


def withheld_gpus(gpus, enabled, pgpu_vendors=model.DEFAULT_PGPU_VENDORS):
    """``{address: why}`` of the reported GPUs that have no deployable."""
    found = {}
    for gpu in sorted(gpus, key=lambda g: g.address):
        setting = enabled.get(gpu.address)
        if reported(gpu, setting, pgpu_vendors):
            why = withheld(gpu, setting)
            if why is not None:
                found[gpu.address] = why
    return found


CARVED = ('carved for Nova ([nova]/carved): its VFs and the capacity they '
          'use are Nova\'s PCI devices')


# The resource class of a Cyborg vGPU deployable whose type's is VGPU: a
# Nova-native request (a flavor's resources:VGPU=1) must never be given a
# candidate on Cyborg's provider, and Nova 34's OWNER_NOVA pre-filter
# covers only the root and PCI groups; Cyborg's device profile asks for
# this class instead (docs/admin/cyborg.md).
CYBORG_VGPU_RC = 'CUSTOM_CYBORG_VGPU'
NOT_CYBORGS = ('not given to Cyborg ([routes]/cyborg does not name it): %s')


def cyborg_setting(setting):
    """``setting`` as Cyborg reports it: ``VGPU`` becomes
    ``CYBORG_VGPU_RC`` (a custom class the operator chose stays)."""
    if setting is None or setting.resource_class != 'VGPU':
        return setting
    return records.replace(setting, resource_class=CYBORG_VGPU_RC)


def host_devices(hostname, gpus, enabled, gpu_options, carved=frozenset(),
                 cyborg=None, routes=None):
    """``driver_devices`` as libvirt-gpu's ``[gpu]`` options ask: what the
    Cyborg driver reports and ``discover`` prints, built in one place;
    ``carved``: the physical GPUs carved for Nova, reported with no
    deployable; ``cyborg``: the physical GPUs given to Cyborg
    (``[routes]/cyborg``; None: every GPU, as Cyborg's own driver reports
    a host), the others reported with no deployable (``routes``: their
    ``{address: label}``).  Returns ``(devices, {address: why
    withheld})``."""
    carved = frozenset(carved)
    others = frozenset()
    if cyborg is not None:
        others = {g.address for g in gpus if not g.is_vf
                  and g.address not in frozenset(cyborg)} - carved
        enabled = {a: cyborg_setting(s) for a, s in enabled.items()}
    carved_paths = {pci_info(address) for address in carved | others}
    devices = tuple(
        records.replace(d, deployable_list=())
        if d.controlpath_id.cpid_info in carved_paths else d
        for d in driver_devices(hostname, gpus, enabled,
                                gpu_options.report_gpu_traits,
                                gpu_options.pgpu_vendor_ids))
    withheld_now = withheld_gpus(gpus, enabled, gpu_options.pgpu_vendor_ids)
    reported_now = {d.controlpath_id.cpid_info for d in devices}
    for gpu in gpus:
        if gpu.address in carved and not gpu.is_vf:
            withheld_now[gpu.address] = CARVED
        elif gpu.address in others and pci_info(gpu.address) in \
                reported_now:
            withheld_now[gpu.address] = NOT_CYBORGS % (routes or {}).get(
                gpu.address, 'libvirt-gpu\'s own guests')
    return devices, dict(sorted(withheld_now.items()))


def to_primitive(record):
    """A record as plain data: ``{field: value}``, nested records and
    tuples as dicts and lists (the shape of Cyborg's object fields)."""
    if isinstance(record, tuple):
        return [to_primitive(r) for r in record]
    if records.is_record(record):
        return {f.name: to_primitive(getattr(record, f.name))
                for f in records.fields(record)}
    return record
