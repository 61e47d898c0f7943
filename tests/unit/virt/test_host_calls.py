"""What ``virt.host.Host`` promises, one call at a time (``Guest``'s calls:
test_guest.py): the libvirt call made (its flags), the typed error for
each libvirt error code, and the words of each message.

libvirt's own test driver (``test:///default``, in this process, no
daemon) answers where it can: domains, persistence, live and persistent
XML, metadata.  The error codes it never gives (a timeout, a hook that
refused, a device gone between listing and reading) come from small
objects that raise ``libvirtError`` with the code asked for; the
functional tests run the same calls against a real ``libvirtd``.
"""

import threading

import libvirt
import pytest

from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.virt import host as host_mod


TEST_URI = 'test:///default'


TEST_UUID = '6695eb01-f6a4-8304-79aa-97f2502e193f'   # the test driver's


UUID = objects.Uuid.parse('4b20d080-1b54-4048-85b3-a6a62d165c01')


OTHER = objects.Uuid.parse('4b20d080-1b54-4048-85b3-a6a62d165c02')


MDEV_XML = """<device>
  <name>mdev_%(u)s_0000_af_00_0</name><parent>pci_0000_af_00_0</parent>
  <capability type='mdev'><type id='nvidia-223'/><uuid>%(uuid)s</uuid>
  <iommuGroup number='120'/></capability>
</device>"""


PCI_XML = "<device><name>pci_0000_af_00_0</name></device>"


def _error(code, message='it went wrong'):
    err = libvirt.libvirtError(message)
    err.err = (code, 0, message, 0, None, None, None, 0, 0)
    return err


def _silent_error(code):
    """A libvirtError without a message of its own (str() still has one)."""
    err = libvirt.libvirtError('the text of the exception')
    err.err = (code, 0, None, 0, None, None, None, 0, 0)
    return err


def _mdev_xml(uuid):
    return MDEV_XML % {'u': str(uuid).replace('-', '_'), 'uuid': uuid}


@pytest.fixture
def conn():
    c = libvirt.open(TEST_URI)
    yield c
    c.close()


class Calls(list):
    def __call__(self, *args):
        self.append(args)


# -- Host: connecting ------------------------------------------------------

class _Opened(object):
    def __init__(self, uri):
        self.uri = uri
        self.closed = 0

    def close(self):
        self.closed += 1


@pytest.fixture
def opener(monkeypatch):
    """libvirt.open / openReadOnly recorded; what they answer is set per
    test (a connection, or an error raised)."""
    calls = []
    answer = {'raise': None}

    def make(kind):
        def open_(uri):
            calls.append((kind, uri))
            if answer['raise'] is not None:
                raise answer['raise']
            return _Opened(uri)
        return open_
    monkeypatch.setattr(libvirt, 'open', make('open'))
    monkeypatch.setattr(libvirt, 'openReadOnly', make('openReadOnly'))
    handlers = Calls()
    monkeypatch.setattr(libvirt, 'registerErrorHandler', handlers)
    loops = Calls()
    monkeypatch.setattr(host_mod, 'start_event_loop', loops)
    return calls, answer, handlers, loops


@pytest.mark.parametrize('read_only, kind', [(False, 'open'),
                                             (True, 'openReadOnly')])
def test_connect_opens_the_uri_once_read_only_when_asked(opener, read_only,
                                                         kind):
    calls, _, handlers, loops = opener
    h = host_mod.Host('qemu:///system', read_only=read_only)
    first = h.connect()
    assert first.uri == 'qemu:///system'
    assert h.connect() is first
    assert calls == [(kind, 'qemu:///system')]
    assert handlers == [(host_mod._ignore_error, None)]
    assert loops == []


def test_connect_with_events_starts_the_loop_before_opening(opener):
    calls, _, _, loops = opener
    host_mod.Host('qemu:///system', events=True).connect()
    assert loops == [()]
    assert calls == [('open', 'qemu:///system')]


@pytest.mark.parametrize('read_only, hint', [
    (True, ' Use --sysfs-root to read sysfs instead'),
    (False, ' This command needs libvirt: -c URI picks the connection')])
def test_an_unreachable_libvirt_says_what_to_do_instead(opener, read_only,
                                                        hint):
    _, answer, _, _ = opener
    answer['raise'] = _error(libvirt.VIR_ERR_SYSTEM_ERROR, 'no socket')
    h = host_mod.Host('qemu:///system', read_only=read_only)
    with pytest.raises(exception.LibvirtUnavailable) as e:
        h.connect()
    assert str(e.value) == ('cannot connect to libvirt at qemu:///system: '
                            'no socket; is libvirtd running?' + hint)
    assert h._conn is None


@pytest.mark.parametrize('code', [libvirt.VIR_ERR_XML_ERROR,
                                  libvirt.VIR_ERR_XML_DETAIL])
def test_xml_libvirt_cannot_parse_is_named_with_its_first_line(opener, code):
    _, answer, _, _ = opener
    answer['raise'] = _error(code, 'bad tag at line 3\n<dom>\n ^')
    with pytest.raises(exception.LibvirtXmlError) as e:
        host_mod.Host('test:///f.xml').connect()
    assert str(e.value) == ('libvirt at test:///f.xml cannot parse XML: '
                            'bad tag at line 3; fix that XML (for '
                            'test:///FILE, the file at the line named)')


def test_xml_error_without_a_message_says_question_mark(opener):
    _, answer, _, _ = opener
    answer['raise'] = _silent_error(libvirt.VIR_ERR_XML_ERROR)
    with pytest.raises(exception.LibvirtXmlError) as e:
        host_mod.Host('test:///f.xml').connect()
    assert 'cannot parse XML: ?;' in str(e.value)


def test_the_test_driver_is_really_opened_read_only():
    with host_mod.Host(TEST_URI, read_only=True) as h:
        with pytest.raises(libvirt.libvirtError) as e:
            h.connect().lookupByName('test').destroy()
    assert e.value.get_error_code() == libvirt.VIR_ERR_OPERATION_DENIED


# -- Host: close and a lent connection -------------------------------------

def test_close_closes_once_and_forgets_the_connection():
    h = host_mod.Host('x:///')
    opened = _Opened('x:///')
    h._conn = opened
    h.close()
    h.close()
    assert opened.closed == 1
    assert h._conn is None


def test_closing_a_dead_connection_is_quiet():
    class Dead(object):
        def close(self):
            raise _error(libvirt.VIR_ERR_INTERNAL_ERROR)
    h = host_mod.Host('x:///')
    h._conn = Dead()
    h.close()
    assert h._conn is None


def test_a_lent_connection_is_left_open():
    lent = _Opened('x:///')
    h = host_mod.Host.from_connection(lent)
    assert h.uri is None
    assert h.connect() is lent
    h.close()
    assert lent.closed == 0
    assert h._conn is None


def test_with_block_closes_what_it_opened():
    with host_mod.Host(TEST_URI) as h:
        opened = h._conn
        assert opened.getURI() == TEST_URI
    assert h._conn is None
    with pytest.raises(libvirt.libvirtError):
        opened.getURI()


# -- Host: versions and lists ----------------------------------------------

class _Conn(object):
    """A virConnect whose answers the test sets."""

    def __init__(self, devs=(), error=None):
        self.devs = list(devs)
        self.error = error
        self.calls = []

    def getLibVersion(self):
        if self.error:
            raise self.error
        return 9000000

    def getVersion(self):
        return 8002000

    def listAllDevices(self, flags):
        self.calls.append(('listAllDevices', flags))
        if self.error:
            raise self.error
        return self.devs

    def listAllDomains(self, flags):
        self.calls.append(('listAllDomains', flags))
        if self.error:
            raise self.error
        return ['a', 'b']

    def nodeDeviceCreateXML(self, xml, flags):
        self.calls.append(('nodeDeviceCreateXML', xml, flags))
        if self.error:
            raise self.error
        return _Dev(name='mdev_made')

    def nodeDeviceDefineXML(self, xml, flags):
        self.calls.append(('nodeDeviceDefineXML', xml, flags))
        if self.error:
            raise self.error
        return _Dev(name='mdev_defined')

    def getURI(self):
        return 'fake:///here'


class _Dev(object):
    """A virNodeDevice: its XML, its state, and what its calls raise."""

    def __init__(self, xml=None, active=1, name='dev', fails=None):
        self.xml = xml
        self.active = active
        self._name = name
        self.fails = fails or {}
        self.calls = []

    def _maybe(self, call):
        self.calls.append(call)
        if call in self.fails:
            raise self.fails[call]

    def name(self):
        return self._name

    def XMLDesc(self, flags):
        self._maybe('XMLDesc')
        return self.xml

    def isActive(self):
        self._maybe('isActive')
        return self.active

    def destroy(self):
        self._maybe('destroy')

    def undefine(self, flags):
        self._maybe('undefine')


def _host(conn):
    h = host_mod.Host('fake:///')
    h._conn = conn
    return h


def test_versions_are_libvirts_then_the_hypervisors():
    assert _host(_Conn()).versions() == (9000000, 8002000)


def test_versions_refused_is_a_libvirt_error():
    conn = _Conn(error=_error(libvirt.VIR_ERR_NO_SUPPORT, 'nope'))
    with pytest.raises(exception.LibvirtError) as e:
        _host(conn).versions()
    assert str(e.value) == 'libvirt: nope'


def test_pci_devices_lists_pci_devices_and_skips_the_gone():
    gone = _Dev(fails={'XMLDesc': _error(libvirt.VIR_ERR_NO_NODE_DEVICE)})
    conn = _Conn([_Dev(PCI_XML), gone, _Dev('<device/>')])
    assert _host(conn).pci_devices() == [PCI_XML, '<device/>']
    assert conn.calls == [
        ('listAllDevices', libvirt.VIR_CONNECT_LIST_NODE_DEVICES_CAP_PCI_DEV)]


def test_a_device_that_cannot_be_read_for_another_reason_is_an_error():
    bad = _Dev(fails={'XMLDesc': _error(libvirt.VIR_ERR_INTERNAL_ERROR,
                                        'broken')})
    with pytest.raises(exception.LibvirtError) as e:
        _host(_Conn([bad])).pci_devices()
    assert str(e.value) == 'libvirt: broken'


def test_listing_refused_is_a_libvirt_error():
    conn = _Conn(error=_error(libvirt.VIR_ERR_INTERNAL_ERROR, 'no list'))
    with pytest.raises(exception.LibvirtError) as e:
        _host(conn).pci_devices()
    assert str(e.value) == 'libvirt: no list'


def test_mdev_nodes_are_the_active_ones_unless_all_are_asked_for():
    live = _Dev(_mdev_xml(UUID))
    stopped = _Dev(_mdev_xml(OTHER), active=0)
    conn = _Conn([live, stopped])
    h = _host(conn)
    assert [n.mdev.uuid for n in h.mdev_nodes()] == [UUID]
    assert [n.mdev.uuid for n in h.mdev_nodes(active_only=False)] == \
        [UUID, OTHER]
    assert stopped.calls == ['isActive', 'XMLDesc']
    assert conn.calls[0] == (
        'listAllDevices', libvirt.VIR_CONNECT_LIST_NODE_DEVICES_CAP_MDEV)


def test_an_mdev_gone_before_its_state_or_xml_is_skipped():
    gone_state = _Dev(_mdev_xml(OTHER), fails={
        'isActive': _error(libvirt.VIR_ERR_NO_NODE_DEVICE)})
    gone_xml = _Dev(_mdev_xml(OTHER), fails={
        'XMLDesc': _error(libvirt.VIR_ERR_NO_NODE_DEVICE)})
    nodes = _host(_Conn([gone_state, gone_xml, _Dev(_mdev_xml(UUID))])) \
        .mdev_nodes()
    assert [n.mdev.uuid for n in nodes] == [UUID]


def test_a_driver_without_is_active_lists_only_live_mdevs():
    old = _Dev(_mdev_xml(UUID), fails={
        'isActive': _error(libvirt.VIR_ERR_NO_SUPPORT)})
    assert [n.mdev.uuid for n in _host(_Conn([old])).mdev_nodes()] == [UUID]


def test_an_mdev_whose_state_cannot_be_read_is_an_error():
    bad = _Dev(_mdev_xml(UUID), fails={
        'isActive': _error(libvirt.VIR_ERR_INTERNAL_ERROR, 'no state')})
    with pytest.raises(exception.LibvirtError) as e:
        _host(_Conn([bad])).mdev_nodes()
    assert str(e.value) == 'libvirt: no state'


# -- Host: mdevs made, defined, found, removed -----------------------------

def test_create_mdev_hands_libvirt_the_xml_and_names_the_device():
    conn = _Conn()
    assert _host(conn).create_mdev('<device/>') == 'mdev_made'
    assert conn.calls == [('nodeDeviceCreateXML', '<device/>', 0)]


def test_create_mdev_refused_says_what_was_done():
    conn = _Conn(error=_error(libvirt.VIR_ERR_INTERNAL_ERROR, 'no room'))
    with pytest.raises(exception.LibvirtError) as e:
        _host(conn).create_mdev('<device/>')
    assert str(e.value) == \
        'libvirt: creating an mdev through libvirt: no room'


def test_define_mdev_without_autostart_only_defines():
    conn = _Conn()
    assert _host(conn).define_mdev('<device/>') == 'mdev_defined'
    assert conn.calls == [('nodeDeviceDefineXML', '<device/>', 0)]


def test_define_mdev_refused_says_what_was_done():
    conn = _Conn(error=_error(libvirt.VIR_ERR_NO_SUPPORT, 'too old'))
    with pytest.raises(exception.NotSupported) as e:
        _host(conn).define_mdev('<device/>')
    assert str(e.value) == ('defining an mdev through libvirt is not '
                            'supported here: too old')


def test_define_mdev_without_the_call_in_libvirt_python():
    class Old(object):
        pass
    with pytest.raises(exception.NotSupported) as e:
        _host(Old()).define_mdev('<device/>')
    assert str(e.value) == ('defining an mdev through libvirt is not '
                            'supported here: libvirt-python has no '
                            'nodeDeviceDefineXML')


class _Defining(_Conn):
    """Defines; setAutostart raises ``autostart``; undefine raises
    ``undefine`` (None: works)."""

    def __init__(self, autostart, undefine=None):
        super().__init__()
        self.dev = _Dev(name='mdev_defined',
                        fails={'undefine': undefine} if undefine else {})
        self.dev.setAutostart = self._set_autostart
        self.autostart = autostart

    def _set_autostart(self, on):
        self.calls.append(('setAutostart', on))
        if self.autostart is not None:
            raise self.autostart

    def nodeDeviceDefineXML(self, xml, flags):
        self.calls.append(('nodeDeviceDefineXML', xml, flags))
        return self.dev

    def nodeDeviceLookupByName(self, name):
        self.calls.append(('lookup', name))
        return self.dev


def test_define_mdev_with_autostart_marks_the_defined_device():
    conn = _Defining(autostart=None)
    assert _host(conn).define_mdev('<d/>', autostart=True) == 'mdev_defined'
    assert conn.calls == [('nodeDeviceDefineXML', '<d/>', 0),
                          ('lookup', 'mdev_defined'), ('setAutostart', 1)]
    assert conn.dev.calls == []


def test_autostart_refused_and_undefine_refused_says_both_and_the_fix():
    conn = _Defining(
        autostart=_error(libvirt.VIR_ERR_INTERNAL_ERROR, 'no autostart'),
        undefine=_error(libvirt.VIR_ERR_INTERNAL_ERROR, 'no undefine'))
    with pytest.raises(exception.LibvirtError) as e:
        _host(conn).define_mdev('<d/>', autostart=True)
    assert str(e.value) == (
        'libvirt: marking mdev mdev_defined to start at boot: no autostart; '
        'its definition could not be dropped (no undefine): remove it with '
        '"virsh nodedev-undefine mdev_defined"')


def test_autostart_refused_is_typed_by_its_code():
    conn = _Defining(autostart=_error(libvirt.VIR_ERR_OPERATION_TIMEOUT,
                                      'slow'))
    with pytest.raises(exception.LibvirtTimeout) as e:
        _host(conn).define_mdev('<d/>', autostart=True)
    assert str(e.value) == ('libvirt: marking mdev mdev_defined to start at '
                            'boot: slow (timed out; worth retrying)')
    assert conn.dev.calls == ['undefine']


def test_old_libvirt_python_autostart_and_undefine_refused_says_both():
    conn = _Defining(autostart=AttributeError('setAutostart'),
                     undefine=_error(libvirt.VIR_ERR_INTERNAL_ERROR, 'stuck'))
    with pytest.raises(exception.LibvirtError) as e:
        _host(conn).define_mdev('<d/>', autostart=True)
    assert str(e.value) == (
        'libvirt: libvirt-python has no virNodeDevice.setAutostart; its '
        'definition could not be dropped (stuck): remove it with "virsh '
        'nodedev-undefine mdev_defined"')


def test_old_libvirt_python_autostart_says_what_is_not_supported():
    conn = _Defining(autostart=AttributeError('setAutostart'))
    with pytest.raises(exception.NotSupported) as e:
        _host(conn).define_mdev('<d/>', autostart=True)
    assert str(e.value) == (
        'marking an mdev to start at boot through libvirt is not supported '
        'here: libvirt-python has no virNodeDevice.setAutostart')


def test_find_mdev_looks_up_by_uuid_among_active_devices():
    mine = _Dev(_mdev_xml(UUID))
    conn = _Conn([_Dev(_mdev_xml(OTHER)), mine])
    assert _host(conn).find_mdev(UUID) is mine
    assert _host(conn).find_mdev(
        objects.Uuid.parse('4b20d080-1b54-4048-85b3-a6a62d165c09')) is None
    assert conn.calls[0] == (
        'listAllDevices', libvirt.VIR_CONNECT_LIST_NODE_DEVICES_CAP_MDEV)


def test_find_mdev_inactive_adds_the_inactive_flag():
    conn = _Conn([])
    _host(conn).find_mdev(UUID, inactive=True)
    assert conn.calls == [(
        'listAllDevices',
        libvirt.VIR_CONNECT_LIST_NODE_DEVICES_CAP_MDEV |
        libvirt.VIR_CONNECT_LIST_NODE_DEVICES_INACTIVE)]


def test_find_mdev_takes_a_uuid_not_text():
    with pytest.raises(TypeError):
        _host(_Conn([])).find_mdev(str(UUID))


def test_find_mdev_skips_the_gone_and_names_other_errors():
    gone = _Dev(fails={'XMLDesc': _error(libvirt.VIR_ERR_NO_NODE_DEVICE)})
    mine = _Dev(_mdev_xml(UUID))
    assert _host(_Conn([gone, mine])).find_mdev(UUID) is mine
    bad = _Dev(fails={'XMLDesc': _error(libvirt.VIR_ERR_INTERNAL_ERROR, 'x')})
    with pytest.raises(exception.LibvirtError) as e:
        _host(_Conn([bad, mine])).find_mdev(UUID)
    assert str(e.value) == 'libvirt: reading an mdev node device: x'


@pytest.mark.parametrize('method, call, flags', [
    ('destroy_mdev', 'destroy',
     libvirt.VIR_CONNECT_LIST_NODE_DEVICES_CAP_MDEV),
    ('undefine_mdev', 'undefine',
     libvirt.VIR_CONNECT_LIST_NODE_DEVICES_CAP_MDEV |
     libvirt.VIR_CONNECT_LIST_NODE_DEVICES_INACTIVE)])
def test_removal_through_libvirt(method, call, flags):
    mine = _Dev(_mdev_xml(UUID))
    other = _Dev(_mdev_xml(OTHER))
    conn = _Conn([other, mine])
    assert getattr(_host(conn), method)(UUID) is True
    assert mine.calls == ['XMLDesc', call]
    assert other.calls == ['XMLDesc']
    assert conn.calls == [('listAllDevices', flags)]


@pytest.mark.parametrize('method', ['destroy_mdev', 'undefine_mdev'])
def test_removal_of_what_libvirt_does_not_know_is_false(method):
    assert getattr(_host(_Conn([])), method)(UUID) is False


@pytest.mark.parametrize('method, call', [('destroy_mdev', 'destroy'),
                                          ('undefine_mdev', 'undefine')])
def test_removal_of_what_vanished_meanwhile_is_false(method, call):
    mine = _Dev(_mdev_xml(UUID), fails={
        call: _error(libvirt.VIR_ERR_NO_NODE_DEVICE)})
    assert getattr(_host(_Conn([mine])), method)(UUID) is False


@pytest.mark.parametrize('method, call, words', [
    ('destroy_mdev', 'destroy', 'removing an mdev through libvirt'),
    ('undefine_mdev', 'undefine', 'undefining an mdev through libvirt')])
def test_removal_refused_says_what_was_done(method, call, words):
    mine = _Dev(_mdev_xml(UUID), fails={
        call: _error(libvirt.VIR_ERR_INTERNAL_ERROR, 'busy')})
    with pytest.raises(exception.LibvirtError) as e:
        getattr(_host(_Conn([mine])), method)(UUID)
    assert str(e.value) == 'libvirt: %s: busy' % words


def test_undefine_without_the_call_in_libvirt_python():
    mine = _Dev(_mdev_xml(UUID), fails={'undefine': AttributeError('x')})
    with pytest.raises(exception.NotSupported) as e:
        _host(_Conn([mine])).undefine_mdev(UUID)
    assert str(e.value) == ('undefining an mdev through libvirt is not '
                            'supported here: libvirt-python has no '
                            'virNodeDevice.undefine')


# -- Host: domains (libvirt's test driver) ---------------------------------

def test_lookup_domain_by_name_by_uuid_or_as_given(conn):
    h = host_mod.Host.from_connection(conn)
    by_name = h.lookup_domain('test')
    assert by_name.UUIDString() == TEST_UUID
    assert h.lookup_domain(TEST_UUID).name() == 'test'
    assert h.lookup_domain(TEST_UUID.upper()).name() == 'test'
    assert h.lookup_domain(by_name) is by_name


@pytest.mark.parametrize('ident', ['nosuch',
                                   '4b20d080-1b54-4048-85b3-a6a62d165c01'])
def test_lookup_of_a_domain_libvirt_lacks_names_the_connection(conn, ident):
    h = host_mod.Host.from_connection(conn)
    with pytest.raises(exception.DomainNotFound) as e:
        h.lookup_domain(ident)
    assert str(e.value) == \
        'No domain %s (name or UUID) in %s' % (ident, TEST_URI)


def test_lookup_names_the_hosts_own_uri_first():
    class Conn(_Conn):
        def lookupByName(self, name):
            raise _error(libvirt.VIR_ERR_NO_DOMAIN)
    h = host_mod.Host('qemu+ssh://far/system')
    h._conn = Conn()
    with pytest.raises(exception.DomainNotFound) as e:
        h.lookup_domain('vm')
    assert str(e.value) == \
        'No domain vm (name or UUID) in qemu+ssh://far/system'


def test_lookup_refused_otherwise_says_what_was_done():
    class Conn(_Conn):
        def lookupByName(self, name):
            raise _error(libvirt.VIR_ERR_INTERNAL_ERROR, 'lost')
    with pytest.raises(exception.LibvirtError) as e:
        _host(Conn()).lookup_domain('vm')
    assert str(e.value) == 'libvirt: looking up domain vm: lost'


def test_list_domains_and_guests(conn):
    h = host_mod.Host.from_connection(conn)
    assert [d.name() for d in h.list_domains()] == ['test']
    guests = h.list_guests()
    assert [(g.name, str(g.uuid)) for g in guests] == [('test', TEST_UUID)]


def test_list_domains_asks_for_all_and_names_a_refusal():
    ok = _Conn()
    assert _host(ok).list_domains() == ['a', 'b']
    assert ok.calls == [('listAllDomains', 0)]
    bad = _Conn(error=_error(libvirt.VIR_ERR_INTERNAL_ERROR, 'lost'))
    with pytest.raises(exception.LibvirtError) as e:
        _host(bad).list_domains()
    assert str(e.value) == 'libvirt: listing domains: lost'


# -- Host: errors by code --------------------------------------------------

@pytest.mark.parametrize('code, kind, text', [
    (libvirt.VIR_ERR_NO_SUPPORT, exception.NotSupported,
     'doing it is not supported here: why'),
    (libvirt.VIR_ERR_OPERATION_TIMEOUT, exception.LibvirtTimeout,
     'libvirt: doing it: why (timed out; worth retrying)'),
    (libvirt.VIR_ERR_INTERNAL_ERROR, exception.LibvirtError,
     'libvirt: doing it: why')])
def test_host_errors_are_typed_by_code(code, kind, text):
    made = host_mod._typed(_error(code, 'why'), 'doing it')
    assert type(made) is kind
    assert str(made) == text


def test_an_error_without_a_message_says_the_exceptions_text():
    made = host_mod._typed(_silent_error(libvirt.VIR_ERR_INTERNAL_ERROR),
                           'doing it')
    assert str(made) == 'libvirt: doing it: the text of the exception'


# -- the event loop --------------------------------------------------------

def test_the_event_loop_is_registered_and_run_once(monkeypatch):
    registered = Calls()
    running = threading.Event()
    never = threading.Event()

    def run_once():
        running.set()
        never.wait()
    monkeypatch.setattr(host_mod, '_event_loop', None)
    monkeypatch.setattr(libvirt, 'virEventRegisterDefaultImpl', registered)
    monkeypatch.setattr(libvirt, 'virEventRunDefaultImpl', run_once)
    host_mod.start_event_loop()
    loop = host_mod._event_loop
    assert running.wait(30)
    assert loop.daemon is True
    assert loop.name == 'libvirt-events'
    assert loop.is_alive()
    host_mod.start_event_loop()
    assert host_mod._event_loop is loop
    assert registered == [()]


class _FlagsDev(_Dev):
    """A virNodeDevice that records the flags of XMLDesc and undefine."""

    def XMLDesc(self, flags):
        self.calls.append(('XMLDesc', flags))
        return self.xml

    def undefine(self, flags):
        self.calls.append(('undefine', flags))


def test_node_device_calls_pass_no_flags():
    mine = _FlagsDev(_mdev_xml(UUID))
    assert _host(_Conn([mine])).undefine_mdev(UUID) is True
    assert _host(_Conn([mine])).pci_devices() == [_mdev_xml(UUID)]
    assert mine.calls == [('XMLDesc', 0), ('undefine', 0), ('XMLDesc', 0)]


def test_a_definition_undone_is_undefined_without_flags():
    conn = _Defining(autostart=_error(libvirt.VIR_ERR_INTERNAL_ERROR, 'no'))
    flags = []
    conn.dev.undefine = flags.append
    with pytest.raises(exception.LibvirtError):
        _host(conn).define_mdev('<d/>', autostart=True)
    assert flags == [0]


def test_find_mdev_names_its_argument_when_given_text():
    with pytest.raises(TypeError) as e:
        _host(_Conn([])).find_mdev(str(UUID))
    assert str(e.value).startswith('uuid must be an objects.Uuid, not str')


def test_a_stopped_mdev_listed_first_does_not_hide_the_rest():
    stopped = _Dev(_mdev_xml(OTHER), active=0)
    live = _Dev(_mdev_xml(UUID))
    assert [n.mdev.uuid for n in _host(_Conn([stopped, live])).mdev_nodes()] \
        == [UUID]
