"""The libvirt connection: node devices in, node devices out.

Like nova's ``host.Host``, this owns the connection and nothing else: no
policy, no XML building.  libvirt errors are checked by error code, narrowly,
and re-raised as our typed errors.
"""

import libvirt

from libvirt_gpu import exception
from libvirt_gpu import nodedev


def _ignore_error(_ctx, _err):
    """libvirt prints every error to stderr unless a handler is set; ours
    are raised as exceptions and reported once, by the caller."""


libvirt.registerErrorHandler(_ignore_error, None)


class Host(object):

    def __init__(self, uri, read_only=False):
        self.uri = uri
        self.read_only = read_only
        self._conn = None

    def connect(self):
        if self._conn is None:
            try:
                if self.read_only:
                    self._conn = libvirt.openReadOnly(self.uri)
                else:
                    self._conn = libvirt.open(self.uri)
            except libvirt.libvirtError as e:
                raise exception.LibvirtUnavailable(
                    uri=self.uri, reason=e.get_error_message())
        return self._conn

    def close(self):
        if self._conn is not None:
            try:
                self._conn.close()
            except libvirt.libvirtError:
                pass   # closing a dead connection: nothing left to release
            self._conn = None

    def __enter__(self):
        self.connect()
        return self

    def __exit__(self, *exc):
        self.close()

    def _list(self, flags):
        try:
            return self.connect().listAllDevices(flags)
        except libvirt.libvirtError as e:
            raise exception.LibvirtError(reason=e.get_error_message())

    def pci_devices(self):
        """XML of every PCI node device."""
        return [d.XMLDesc(0) for d in
                self._list(libvirt.VIR_CONNECT_LIST_NODE_DEVICES_CAP_PCI_DEV)]

    def mdev_nodes(self, active_only=True):
        """MdevNode of every (active) mdev node device."""
        result = []
        for dev in self._list(libvirt.VIR_CONNECT_LIST_NODE_DEVICES_CAP_MDEV):
            if active_only and not _is_active(dev):
                continue
            result.append(nodedev.parse_mdev(dev.XMLDesc(0)))
        return result


def _is_active(dev):
    try:
        return bool(dev.isActive())
    except (AttributeError, libvirt.libvirtError) as e:
        if (isinstance(e, libvirt.libvirtError) and
                e.get_error_code() != libvirt.VIR_ERR_NO_SUPPORT):
            raise exception.LibvirtError(reason=e.get_error_message())
        return True   # drivers without isActive only list live devices
