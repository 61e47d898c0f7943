"""PCI class codes that decide what an IOMMU group means for passthrough.

Names as data, no I/O.  A class code is the kernel's ``class`` attribute
(``0x020000``: base class 02, subclass 00, programming interface 00).

VFIO hands a guest a whole IOMMU group or nothing.  Every other member of
a GPU's group is one of:

- a *companion*: another function of the GPU's own PCI device (a consumer
  GPU's HDMI audio ``.1``, the USB-C controller of some Turing boards),
  which goes to the guest with it;
- a *bridge*: allowed to stay with the host (the kernel never binds a
  guest to a PCI-to-PCI bridge);
- a device the host uses: one of ``HOST_DEVICE_CLASSES`` with a driver
  bound that is not a VFIO stub.  Passing the GPU through would take it
  away from the host, so the attach must refuse and name it.
"""

# Base class (2 hex digits) or base class + subclass (4) -> what it is.
HOST_DEVICE_CLASSES = {
    '01': 'storage controller',
    '02': 'network controller',
    '0c03': 'USB controller',
    '0c04': 'Fibre Channel controller',
    '0c06': 'InfiniBand controller',
}

# Classes of the functions that may sit beside a GPU on its own device.
COMPANION_CLASSES = {
    '03': 'display controller',
    '0403': 'audio device',
    '0c03': 'USB controller',
    '0c80': 'serial bus controller',
}

BRIDGE_CLASSES = {
    '0600': 'host bridge',
    '0604': 'PCI bridge',
}

# Drivers that hold a device for VFIO, not for the host.
VFIO_DRIVERS = ('vfio-pci', 'pci-stub')


def _digits(class_code):
    text = (class_code or '').lower()
    return text[2:] if text.startswith('0x') else text


def _lookup(table, class_code):
    digits = _digits(class_code)
    return table.get(digits[:4]) or table.get(digits[:2])


def host_class_name(class_code):
    """What kind of host device ``class_code`` is, or None."""
    return _lookup(HOST_DEVICE_CLASSES, class_code)


def is_companion_class(class_code):
    return _lookup(COMPANION_CLASSES, class_code) is not None


def is_bridge(class_code):
    return _lookup(BRIDGE_CLASSES, class_code) is not None


def host_uses(class_code, driver, companion=False):
    """Whether a group member is a device the host uses: a host-device
    class with a host driver bound.  A companion of the GPU goes with it
    to the guest, so it never counts."""
    if companion or driver is None or driver in VFIO_DRIVERS:
        return False
    return host_class_name(class_code) is not None
