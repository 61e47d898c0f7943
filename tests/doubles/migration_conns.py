"""Two stand-in libvirt connections for ``migration.check`` (each side's
versions, its domain, its GPUs' node devices) and the check run on them:
shared by migration's tests."""

import libvirt

from libvirt_gpu.virt import host as host_mod
from libvirt_gpu.guests import migration
from tests.doubles import t4_hook as th

DEST_URI = 'qemu+ssh://b/system'


def v(major, minor, release):
    return major * 1000000 + minor * 1000 + release


GOOD = (v(9, 0, 0), v(8, 2, 0))


class Domain(object):
    def __init__(self, xml=b'<domain/>', stats=None, active=True):
        self._xml = xml
        self._stats = stats or {}
        self._active = active

    def UUIDString(self):
        return th.DOM

    def name(self):
        return 'vm1'

    def isActive(self):
        return self._active

    def XMLDesc(self, flags):
        return self._xml.decode()

    def migrateToURI3(self, uri, params, flags):
        pass

    def jobStats(self, flags=0):
        assert flags & libvirt.VIR_DOMAIN_JOB_STATS_COMPLETED
        return dict(self._stats)


class NodeDevice(object):
    def __init__(self, xml):
        self._xml = xml

    def XMLDesc(self, flags):
        return self._xml


def gpu_xml(bus, types):
    """A PCI node device of an NVIDIA GPU at 0000:<bus>:00.0 offering
    ``types`` (``{type id: available instances}``)."""
    offered = ''.join(
        "<type id='%s'><name>%s</name><deviceAPI>vfio-pci</deviceAPI>"
        "<availableInstances>%d</availableInstances></type>"
        % (t, t, n) for t, n in sorted(types.items()))
    return ("<device><name>pci_0000_%02x_00_0</name>"
            "<capability type='pci'><domain>0</domain><bus>%d</bus>"
            "<slot>0</slot><function>0</function><product id='0x1eb8'/>"
            "<vendor id='0x10de'/><capability type='mdev_types'>%s"
            "</capability></capability></device>" % (bus, bus, offered))


class Conn(object):
    """One side's libvirt: its versions, its domain (None: this side has
    none, a lookup fails the test), its GPUs' node devices."""

    def __init__(self, versions=GOOD, domain=None, gpus=()):
        self.lib, self.qemu = versions
        self.domain = domain
        self.gpus = gpus

    def getLibVersion(self):
        return self.lib

    def getVersion(self):
        return self.qemu

    def lookupByName(self, name):
        assert self.domain is not None, 'looked up on the wrong side'
        return self.domain

    lookupByUUIDString = lookupByName

    def listAllDevices(self, flags):
        return [NodeDevice(x) for x in self.gpus]


def vgpu_domain(count, type_id='nvidia-223'):
    return Domain(th.domain_xml([(th.new_uuid(), type_id, None)
                                 for _ in range(count)]))


def check(source, dest):
    return migration.check(host_mod.Host.from_connection(source),
                           host_mod.Host.from_connection(dest),
                           DEST_URI, 'vm1')


def by_what(plan):
    return {c.what: c for c in plan.checks}
