"""host.Host reading node devices that come and go."""

import subprocess
import sys

import libvirt
import pytest

from libvirt_gpu import exception
from libvirt_gpu.virt import host
from libvirt_gpu.virt import nodedev

MDEV_XML = """<device>
  <name>mdev_%(u)s</name><parent>%(parent)s</parent>
  <capability type='mdev'><type id='nvidia-223'/><uuid>%(uuid)s</uuid>
  <iommuGroup number='120'/></capability>
</device>"""
UUID = '4b20d080-1b54-4048-85b3-a6a62d165c01'


def _error(code):
    err = libvirt.libvirtError('gone')
    err.err = (code, 0, 'gone', 0, None, None, None, 0, 0)
    return err


class _Dev(object):
    """A virNodeDevice whose device disappears after listing."""

    def __init__(self, xml=None, gone_at=None):
        self.xml, self.gone_at = xml, gone_at

    def isActive(self):
        if self.gone_at == 'isActive':
            raise _error(libvirt.VIR_ERR_NO_NODE_DEVICE)
        return 1

    def XMLDesc(self, flags):
        if self.gone_at == 'XMLDesc':
            raise _error(libvirt.VIR_ERR_NO_NODE_DEVICE)
        return self.xml


class _Conn(object):
    def __init__(self, devs):
        self.devs = devs

    def listAllDevices(self, flags):
        return self.devs


def _host(devs):
    h = host.Host('test:///none')
    h._conn = _Conn(devs)
    return h


def _xml(parent='pci_0000_af_00_0'):
    return MDEV_XML % {'u': UUID.replace('-', '_'), 'uuid': UUID,
                       'parent': parent}


def test_vanished_devices_are_skipped():
    h = _host([_Dev(_xml(), gone_at='isActive'),
               _Dev(_xml(), gone_at='XMLDesc'), _Dev(_xml())])
    nodes = h.mdev_nodes()
    assert [n.mdev.uuid for n in nodes] == [UUID]
    assert [x for x in _host([_Dev('<device/>', gone_at='XMLDesc'),
                              _Dev('<device/>')]).pci_devices()] == \
        ['<device/>']


def test_other_errors_still_raise():
    class Broken(_Dev):
        def XMLDesc(self, flags):
            raise _error(libvirt.VIR_ERR_INTERNAL_ERROR)

    with pytest.raises(exception.LibvirtError):
        _host([Broken(_xml())]).mdev_nodes()


def test_mdev_without_pci_parent():
    node = nodedev.parse_mdev(_xml(parent='computer'))
    assert node.parent is None and node.mdev.uuid == UUID


def test_mdev_name_of_libvirt_before_7_7_gives_the_uuid():
    # libvirt < 7.7 has no <uuid> in an mdev's capability: the UUID is only
    # in the name, mdev_<uuid with _ for ->[_<parent address>].
    for name in ('mdev_%s' % UUID.replace('-', '_'),
                 'mdev_%s_0000_af_00_0' % UUID.replace('-', '_')):
        xml = ("<device><name>%s</name><parent>pci_0000_af_00_0</parent>"
               "<capability type='mdev'><type id='nvidia-223'/>"
               "<iommuGroup number='120'/></capability></device>" % name)
        node = nodedev.parse_mdev(xml)
        assert node.mdev.uuid == UUID
        assert node.mdev.type_id == 'nvidia-223'
        assert str(node.parent) == '0000:af:00.0'
    h = _host([_Dev(xml)])
    assert [n.mdev.uuid for n in h.mdev_nodes()] == [UUID]


LIBVIRT_ERROR_PROBE = '''
import sys, libvirt
import libvirt_gpu.virt.host as host_mod
if sys.argv[1] == 'host':
    try:
        host_mod.Host('test:///no/such/file.xml').connect()
    except Exception:
        pass
try:
    libvirt.open('test:///no/such/file.xml')
except libvirt.libvirtError:
    pass
'''


@pytest.mark.parametrize('first, printed', [('import', True),
                                            ('host', False)])
def test_importing_host_leaves_libvirts_error_handler_alone(first, printed):
    """A program that only imports us keeps libvirt's own handler (which
    prints errors); a Host that opens its own connection sets ours."""
    done = subprocess.run([sys.executable, '-c', LIBVIRT_ERROR_PROBE, first],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert ('libvirt: Test Driver error' in done.stderr) is printed


EVENTS_PROBE = '''
import sys
from libvirt_gpu.virt import guest as guest_mod
from libvirt_gpu.virt import host as host_mod
with host_mod.Host('test:///default', events=sys.argv[1] == 'on') as h:
    dom = h.connect().lookupByName('test')
    with guest_mod.Guest(dom).device_removals() as removals:
        print(removals.events)
'''


@pytest.mark.parametrize('loop, events', [('on', 'True'), ('off', 'False')])
def test_device_removed_events_need_the_event_loop_first(loop, events):
    """libvirt's test driver delivers domain events only on a connection
    opened after the event loop was registered (``Host(events=True)``);
    without it the wait for a removal falls back to looking again."""
    done = subprocess.run([sys.executable, '-c', EVENTS_PROBE, loop],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [events]


class _Defined(object):
    """A virNodeDevice just defined; its setAutostart answers from
    ``answers`` in turn (an error code raises, None succeeds)."""

    def __init__(self, conn):
        self.conn = conn

    def name(self):
        return 'mdev_%s_0000_af_00_0' % UUID.replace('-', '_')

    def setAutostart(self, on):
        self.conn.calls.append(('setAutostart', on))
        code = self.conn.answers.pop(0)
        if code is not None:
            raise _error(code)

    def undefine(self, flags):
        self.conn.calls.append(('undefine',))
        if self.conn.undefine_fails:
            raise _error(libvirt.VIR_ERR_NO_NODE_DEVICE)


class _DefineConn(object):
    def __init__(self, answers, undefine_fails=False):
        self.answers = list(answers)
        self.undefine_fails = undefine_fails
        self.calls = []

    def nodeDeviceDefineXML(self, xml, flags):
        self.calls.append(('define',))
        return _Defined(self)

    def nodeDeviceLookupByName(self, name):
        assert name == _Defined(self).name()
        return _Defined(self)


def _defining(conn):
    h = host.Host('test:///none')
    h._conn = conn
    h.AUTOSTART_WAIT = 2.0
    return h


def test_autostart_waits_for_libvirt_to_list_the_device_it_defined():
    # libvirt 9.0 loses a device it just defined from its list for a
    # moment (kernel tests, two defines in a row): looked up again
    conn = _DefineConn([libvirt.VIR_ERR_NO_NODE_DEVICE,
                        libvirt.VIR_ERR_NO_NODE_DEVICE, None])
    name = _defining(conn).define_mdev('<device/>', autostart=True)
    assert name == _Defined(conn).name()
    assert conn.calls == [('define',)] + [('setAutostart', 1)] * 3


def test_autostart_refused_drops_the_definition():
    conn = _DefineConn([libvirt.VIR_ERR_INTERNAL_ERROR])
    with pytest.raises(exception.LibvirtError) as e:
        _defining(conn).define_mdev('<device/>', autostart=True)
    assert 'to start at boot' in str(e.value)
    assert 'nodedev-undefine' not in str(e.value)
    assert conn.calls == [('define',), ('setAutostart', 1), ('undefine',)]


def test_autostart_never_listed_drops_the_definition_or_says_how():
    conn = _DefineConn([libvirt.VIR_ERR_NO_NODE_DEVICE] * 100,
                       undefine_fails=True)
    h = _defining(conn)
    h.AUTOSTART_WAIT = 0.3
    with pytest.raises(exception.LibvirtError) as e:
        h.define_mdev('<device/>', autostart=True)
    assert conn.calls[-1] == ('undefine',)
    assert 'virsh nodedev-undefine %s' % _Defined(conn).name() in \
        str(e.value)


def test_libvirt_python_without_set_autostart_leaves_no_definition():
    class Old(_Defined):
        setAutostart = property()       # AttributeError, as before 7.8

    class OldConn(_DefineConn):
        def nodeDeviceLookupByName(self, name):
            return Old(self)

    conn = OldConn([])
    with pytest.raises(exception.NotSupported):
        _defining(conn).define_mdev('<device/>', autostart=True)
    assert conn.calls == [('define',), ('undefine',)]
