"""A small libvirt connection kept in files, shared by processes.

The real daemon cannot hot-plug a vGPU here (no VFIO), and libvirt's test
driver cannot attach devices at all, so the API's live paths and the
reliability tests (32 processes, SIGKILLs) use this stand-in.  It speaks
the subset of ``virConnect``/``virDomain`` that ``host``/``guest`` call,
with libvirt's error codes and messages (measured on libvirt 9.0)::

    attach of a device already there   VIR_ERR_OPERATION_INVALID
        "Requested operation is not valid: device is already in the domain
         configuration"
    --live on a stopped domain        VIR_ERR_OPERATION_INVALID
        "Requested operation is not valid: domain is not running"
    detach of a missing device        VIR_ERR_DEVICE_MISSING
        "device not found: device not present in domain configuration"
    unknown domain                    VIR_ERR_NO_DOMAIN
    nodeDeviceCreateXML               VIR_ERR_NO_SUPPORT (as the test driver)

Each domain is ``<dir>/<uuid>.json`` (name, active, persistent, live and
config XML), rewritten atomically under an flock, so a SIGKILL leaves every
domain as it was after its last completed call.

A live detach sends ``VIR_DOMAIN_EVENT_ID_DEVICE_REMOVED`` to the callbacks
registered in this process (``domainEventRegisterAny``), as the daemon does
once the guest has let go; ``unplug_delay`` (seconds) makes the guest take
that long (the device stays in the live XML until then), and
``events=False`` makes registration fail as on a connection opened without
an event loop.
"""

import contextlib
import fcntl
import itertools
import json
import os
import threading

import libvirt
from lxml import etree


def libvirt_error(code, message):
    e = libvirt.libvirtError(message)
    e.err = (code, 0, message, 2, None, None, None, 0, 0)
    return e


def _same_hostdev(a, b):
    """Two ``<hostdev>`` elements naming the same host device."""
    if a.tag != 'hostdev' or b.tag != 'hostdev' or a.get('type') != \
            b.get('type'):
        return False
    sa, sb = a.find('source/address'), b.find('source/address')
    if sa is None or sb is None:
        return False
    if a.get('type') == 'mdev':
        return sa.get('uuid') == sb.get('uuid')
    return all(int(sa.get(k), 16) == int(sb.get(k), 16)
               for k in ('domain', 'bus', 'slot', 'function'))


class FakeConnection(object):

    def __init__(self, directory, unplug_delay=None, events=True):
        self.directory = os.fspath(directory)
        os.makedirs(self.directory, exist_ok=True)
        self.unplug_delay = unplug_delay
        self.events = events
        self._callbacks = {}
        self._ids = itertools.count(1)
        self._unplugs = []

    def settle(self):
        """Wait for the guests' pending unplugs (``unplug_delay``)."""
        while self._unplugs:
            self._unplugs.pop().join()

    # -- events -----------------------------------------------------------

    def domainEventRegisterAny(self, dom, event_id, cb, opaque):
        if not self.events:
            raise libvirt_error(libvirt.VIR_ERR_INTERNAL_ERROR,
                                'could not initialize domain event timer')
        callback_id = next(self._ids)
        self._callbacks[callback_id] = (dom.UUIDString(), event_id, cb,
                                        opaque)
        return callback_id

    def domainEventDeregisterAny(self, callback_id):
        self._callbacks.pop(callback_id, None)
        return 0

    def _device_removed(self, uuid, alias):
        for dom_uuid, event_id, cb, opaque in list(self._callbacks.values()):
            if dom_uuid == uuid and \
                    event_id == libvirt.VIR_DOMAIN_EVENT_ID_DEVICE_REMOVED:
                cb(self, FakeDomain(self, uuid), alias, opaque)

    # -- storage --------------------------------------------------------

    @contextlib.contextmanager
    def locked(self):
        fd = os.open(os.path.join(self.directory, '.lock'),
                     os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _path(self, uuid):
        return os.path.join(self.directory, uuid + '.json')

    def load(self, uuid):
        try:
            with open(self._path(uuid)) as f:
                return json.load(f)
        except FileNotFoundError:
            raise libvirt_error(libvirt.VIR_ERR_NO_DOMAIN,
                                "Domain not found: no domain with matching "
                                "uuid '%s'" % uuid)

    def save(self, record):
        tmp = self._path(record['uuid']) + '.tmp.%d' % os.getpid()
        with open(tmp, 'w') as f:
            json.dump(record, f)
        os.replace(tmp, self._path(record['uuid']))

    def define(self, xml, active=False, persistent=True):
        """Add a domain (XML as for defineXML); returns it."""
        root = etree.fromstring(xml)
        record = {'uuid': root.findtext('uuid'), 'name': root.findtext(
            'name'), 'active': active, 'persistent': persistent,
            'config': xml if persistent else None,
            'live': xml if active else None}
        with self.locked():
            self.save(record)
        return FakeDomain(self, record['uuid'])

    # -- virConnect -------------------------------------------------------

    def getURI(self):
        return 'fake://%s' % self.directory

    def listAllDomains(self, flags=0):
        return [FakeDomain(self, name[:-len('.json')])
                for name in sorted(os.listdir(self.directory))
                if name.endswith('.json')]

    def lookupByUUIDString(self, uuid):
        self.load(uuid)
        return FakeDomain(self, uuid)

    def lookupByName(self, name):
        for dom in self.listAllDomains():
            if dom.name() == name:
                return dom
        raise libvirt_error(libvirt.VIR_ERR_NO_DOMAIN,
                            "Domain not found: no domain with matching name "
                            "'%s'" % name)

    def nodeDeviceCreateXML(self, xml, flags=0):
        raise libvirt_error(libvirt.VIR_ERR_NO_SUPPORT,
                            'this function is not supported by the '
                            'connection driver: virNodeDeviceCreateXML')

    def listAllDevices(self, flags=0):
        return []


class FakeDomain(object):

    def __init__(self, conn, uuid):
        self.conn = conn
        self.uuid = uuid

    def _record(self):
        return self.conn.load(self.uuid)

    def UUIDString(self):
        return self.uuid

    def connect(self):
        return self.conn

    def name(self):
        return self._record()['name']

    def isActive(self):
        return int(self._record()['active'])

    def isPersistent(self):
        return int(self._record()['persistent'])

    def XMLDesc(self, flags=0):
        record = self._record()
        if flags & libvirt.VIR_DOMAIN_XML_INACTIVE or not record['active']:
            return record['config'] or record['live']
        return record['live']

    # -- changes --------------------------------------------------------

    def _targets(self, record, flags):
        live = bool(flags & libvirt.VIR_DOMAIN_AFFECT_LIVE)
        config = bool(flags & libvirt.VIR_DOMAIN_AFFECT_CONFIG)
        if not live and not config:
            live, config = record['active'], not record['active']
        if live and not record['active']:
            raise libvirt_error(libvirt.VIR_ERR_OPERATION_INVALID,
                                'Requested operation is not valid: domain '
                                'is not running')
        if config and not record['persistent']:
            raise libvirt_error(libvirt.VIR_ERR_OPERATION_INVALID,
                                'Requested operation is not valid: cannot '
                                'change persistent config of a transient '
                                'domain')
        return [k for k, on in (('live', live), ('config', config)) if on]

    def _change(self, flags, edit):
        with self.conn.locked():
            record = self._record()
            keys = self._targets(record, flags)
            new = {}
            for key in keys:
                root = etree.fromstring(record[key])
                edit(root)
                new[key] = etree.tostring(root, encoding='unicode')
            record.update(new)
            self.conn.save(record)

    def attachDeviceFlags(self, xml, flags=0):
        device = etree.fromstring(xml)

        def edit(root):
            devices = root.find('devices')
            if any(_same_hostdev(d, device) for d in devices):
                raise libvirt_error(
                    libvirt.VIR_ERR_OPERATION_INVALID,
                    'Requested operation is not valid: device is already '
                    'in the domain configuration')
            devices.append(etree.fromstring(xml))
        self._change(flags, edit)
        return 0

    def detachDeviceFlags(self, xml, flags=0):
        device = etree.fromstring(xml)

        def edit(root):
            devices = root.find('devices')
            for d in devices:
                if _same_hostdev(d, device):
                    devices.remove(d)
                    return
            raise libvirt_error(libvirt.VIR_ERR_DEVICE_MISSING,
                                'device not found: device not present in '
                                'domain configuration')
        live = 'live' in self._targets(self._record(), flags)
        delay = self.conn.unplug_delay if live else None
        if delay is None:
            self._change(flags, edit)
        else:
            # The persistent part now, the guest's unplug later.
            config = flags & ~libvirt.VIR_DOMAIN_AFFECT_LIVE
            if config & libvirt.VIR_DOMAIN_AFFECT_CONFIG:
                self._change(config, edit)
            # Missing in the live XML: refused now, as libvirt does.
            root = etree.fromstring(self._record()['live'])
            if not any(_same_hostdev(d, device)
                       for d in root.find('devices')):
                edit(root)

            def unplug():
                self._change(libvirt.VIR_DOMAIN_AFFECT_LIVE, edit)
                self.conn._device_removed(self.uuid, 'hostdev0')
            timer = threading.Timer(delay, unplug)
            self.conn._unplugs.append(timer)
            timer.start()
            return 0
        if live:
            self.conn._device_removed(self.uuid, 'hostdev0')
        return 0

    def setMetadata(self, kind, xml, key, uri, flags=0):
        assert kind == libvirt.VIR_DOMAIN_METADATA_ELEMENT

        def namespaced(elem):
            new = etree.Element('{%s}%s' % (uri, etree.QName(elem).localname),
                                nsmap={key: uri})
            for name, value in elem.attrib.items():
                new.set(name, value)
            for child in elem:
                new.append(namespaced(child))
            return new

        def edit(root):
            meta = root.find('metadata')
            if meta is None:
                meta = etree.Element('metadata')
                root.insert(2, meta)
            for child in list(meta):
                if isinstance(child.tag, str) and \
                        etree.QName(child).namespace == uri:
                    meta.remove(child)
            if xml is not None:
                meta.append(namespaced(etree.fromstring(xml)))
        self._change(flags, edit)
        return 0

    # -- test helpers ----------------------------------------------------

    def set_active(self, active):
        """Start (live XML = config) or stop (live XML dropped)."""
        with self.conn.locked():
            record = self._record()
            record['active'] = active
            record['live'] = record['config'] if active else None
            self.conn.save(record)
