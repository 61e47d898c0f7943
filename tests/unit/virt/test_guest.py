"""What ``virt.guest.Guest`` promises, one call at a time (``Host``'s
calls: test_host_calls.py): the libvirt call made (its flags), the typed
error for each libvirt error code, and the words of each message.

libvirt's own test driver (``test:///default``, in this process, no
daemon) answers where it can: domains, persistence, live and persistent
XML, metadata.  The error codes it never gives (a timeout, a hook that
refused, a device gone between listing and reading) come from small
objects that raise ``libvirtError`` with the code asked for; the
functional tests run the same calls against a real ``libvirtd``.
"""


import libvirt
import pytest

from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.virt import guest as guest_mod
from libvirt_gpu.virt import metadata


TEST_URI = 'test:///default'


TEST_UUID = '6695eb01-f6a4-8304-79aa-97f2502e193f'   # the test driver's


UUID = objects.Uuid.parse('4b20d080-1b54-4048-85b3-a6a62d165c01')


def _error(code, message='it went wrong'):
    err = libvirt.libvirtError(message)
    err.err = (code, 0, message, 0, None, None, None, 0, 0)
    return err


def _silent_error(code):
    """A libvirtError without a message of its own (str() still has one)."""
    err = libvirt.libvirtError('the text of the exception')
    err.err = (code, 0, None, 0, None, None, None, 0, 0)
    return err


@pytest.fixture
def conn():
    c = libvirt.open(TEST_URI)
    yield c
    c.close()


class Calls(list):
    def __call__(self, *args):
        self.append(args)


# -- Guest: the test driver's domain ---------------------------------------

def test_guest_reads_name_uuid_and_state(conn):
    g = guest_mod.Guest(conn.lookupByName('test'))
    assert g.name == 'test'
    assert g.uuid == objects.Uuid.parse(TEST_UUID)
    assert g.is_active() is True
    assert g.is_persistent() is True


def test_a_transient_domain_is_not_persistent(conn):
    xml = conn.lookupByName('test').XMLDesc(0).replace(
        '<name>test</name>', '<name>brief</name>').replace(
        TEST_UUID, str(UUID))
    g = guest_mod.Guest(conn.createXML(xml, 0))
    assert g.is_persistent() is False
    assert g.is_active() is True


def test_metadata_written_live_or_persistent_is_read_from_that_xml(conn):
    g = guest_mod.Guest(conn.lookupByName('test'))
    meta = metadata.GpuMetadata(vgpus=(metadata.VgpuEntry(
        UUID, objects.TypeId.parse('nvidia-223'),
        objects.PciAddress.parse('0000:af:00.0')),))
    g.set_gpu_metadata(meta, config=True)
    assert g.devices(inactive=True)[1] == meta
    assert g.devices()[1].empty
    g.set_gpu_metadata(meta, live=True)
    assert g.devices()[1] == meta
    g.set_gpu_metadata(metadata.GpuMetadata(), live=True, config=True)
    assert g.devices()[1].empty
    assert g.devices(inactive=True)[1].empty
    assert g.xml().tag == 'domain'


class _Domain(object):
    """A virDomain whose calls are recorded and raise ``fails[call]``."""

    def __init__(self, fails=None, answer=None):
        self.fails = fails or {}
        self.answer = answer
        self.calls = []

    def _do(self, call, *args):
        self.calls.append((call,) + args)
        if call in self.fails:
            raise self.fails[call]
        return self.answer

    def name(self):
        return 'vm1'

    def UUIDString(self):
        return str(UUID)

    def isActive(self):
        return self._do('isActive')

    def isPersistent(self):
        return self._do('isPersistent')

    def XMLDesc(self, flags):
        return self._do('XMLDesc', flags)

    def attachDeviceFlags(self, xml, flags):
        return self._do('attachDeviceFlags', xml, flags)

    def detachDeviceFlags(self, xml, flags):
        return self._do('detachDeviceFlags', xml, flags)

    def setMetadata(self, kind, text, prefix, ns, flags):
        return self._do('setMetadata', kind, text, prefix, ns, flags)

    def migrateToURI3(self, uri, params, flags):
        return self._do('migrateToURI3', uri, params, flags)

    def jobStats(self, flags):
        return self._do('jobStats', flags)

    def abortJob(self):
        return self._do('abortJob')


LIVE = libvirt.VIR_DOMAIN_AFFECT_LIVE
CONFIG = libvirt.VIR_DOMAIN_AFFECT_CONFIG


@pytest.mark.parametrize('live, config, flags', [
    (False, False, 0), (True, False, LIVE), (False, True, CONFIG),
    (True, True, LIVE | CONFIG)])
@pytest.mark.parametrize('method', ['attach_device', 'detach_device'])
def test_device_calls_carry_the_live_and_config_flags(method, live, config,
                                                      flags):
    dom = _Domain()
    getattr(guest_mod.Guest(dom), method)('<hostdev/>', live=live,
                                          config=config)
    call = 'attachDeviceFlags' if method == 'attach_device' \
        else 'detachDeviceFlags'
    assert dom.calls == [(call, '<hostdev/>', flags)]


def test_metadata_calls_carry_the_element_namespace_and_flags():
    dom = _Domain()
    meta = metadata.GpuMetadata(vgpus=(metadata.VgpuEntry(
        UUID, objects.TypeId.parse('nvidia-223')),))
    guest_mod.Guest(dom).set_gpu_metadata(meta, live=True)
    guest_mod.Guest(dom).set_gpu_metadata(metadata.GpuMetadata(),
                                          config=True)
    assert dom.calls == [
        ('setMetadata', libvirt.VIR_DOMAIN_METADATA_ELEMENT,
         metadata.render(meta), 'gpu', 'urn:libvirt-gpu:1', LIVE),
        ('setMetadata', libvirt.VIR_DOMAIN_METADATA_ELEMENT, None, 'gpu',
         'urn:libvirt-gpu:1', CONFIG)]


def test_xml_asks_for_the_persistent_config_only_when_inactive():
    dom = _Domain(answer='<domain/>')
    g = guest_mod.Guest(dom)
    g.xml()
    g.xml(inactive=True)
    assert dom.calls == [('XMLDesc', 0),
                         ('XMLDesc', libvirt.VIR_DOMAIN_XML_INACTIVE)]


LABEL = 'vm1 (%s)' % UUID


@pytest.mark.parametrize('call, run, what', [
    ('isActive', lambda g: g.is_active(), 'state'),
    ('isPersistent', lambda g: g.is_persistent(), 'state'),
    ('XMLDesc', lambda g: g.xml(), 'reading the XML'),
    ('attachDeviceFlags', lambda g: g.attach_device('<x/>'),
     'attaching a device'),
    ('detachDeviceFlags', lambda g: g.detach_device('<x/>'),
     'detaching a device'),
    ('setMetadata', lambda g: g.set_gpu_metadata(metadata.GpuMetadata()),
     'writing the metadata'),
    ('jobStats', lambda g: g.job_stats(), 'reading the job statistics'),
    ('abortJob', lambda g: g.abort_job(), 'aborting its job')])
def test_each_guest_call_names_itself_and_the_domain(call, run, what):
    dom = _Domain(fails={call: _error(libvirt.VIR_ERR_INTERNAL_ERROR, 'no')})
    with pytest.raises(exception.LibvirtError) as e:
        run(guest_mod.Guest(dom))
    assert str(e.value) == 'libvirt: %s of %s: no' % (what, LABEL)


@pytest.mark.parametrize('code, kind, text', [
    (libvirt.VIR_ERR_NO_DOMAIN, exception.DomainNotFound,
     'No domain %s (name or UUID) in libvirt' % LABEL),
    (libvirt.VIR_ERR_OPERATION_INVALID, exception.DomainStateError,
     'Domain %s: why' % LABEL),
    (libvirt.VIR_ERR_DEVICE_MISSING, exception.DeviceNotAttached,
     'Domain %s holds no why' % LABEL),
    (libvirt.VIR_ERR_OPERATION_TIMEOUT, exception.LibvirtTimeout,
     'libvirt: doing of %s: why (timed out; worth retrying)' % LABEL),
    (libvirt.VIR_ERR_INTERNAL_ERROR, exception.LibvirtError,
     'libvirt: doing of %s: why' % LABEL)])
def test_guest_errors_are_typed_by_code(code, kind, text):
    made = guest_mod.Guest(_Domain())._typed(_error(code, 'why'), 'doing')
    assert type(made) is kind
    assert str(made) == text


def test_a_guest_error_without_a_message_says_the_exceptions_text():
    made = guest_mod.Guest(_Domain())._typed(
        _silent_error(libvirt.VIR_ERR_INTERNAL_ERROR), 'doing')
    assert str(made) == 'libvirt: doing of %s: the text of the exception' \
        % LABEL


# -- Guest: migration and its job -----------------------------------------

LIVE_P2P = libvirt.VIR_MIGRATE_LIVE | libvirt.VIR_MIGRATE_PEER2PEER


def test_migrate_live_is_peer_to_peer_with_the_memory_uri_when_given():
    dom = _Domain()
    g = guest_mod.Guest(dom)
    g.migrate_live('qemu+tcp://b/system')
    g.migrate_live('qemu+tcp://b/system', migrate_uri='tcp://10.0.0.2:49152')
    assert dom.calls == [
        ('migrateToURI3', 'qemu+tcp://b/system', {}, LIVE_P2P),
        ('migrateToURI3', 'qemu+tcp://b/system',
         {libvirt.VIR_MIGRATE_PARAM_URI: 'tcp://10.0.0.2:49152'}, LIVE_P2P)]


def test_a_migration_refused_by_a_hook_says_the_hooks_words():
    said = ('Hook script execution failed: internal error: Child process '
            '(LC_ALL=C /etc/libvirt/hooks/qemu vm1 migrate begin -) '
            'unexpected exit status 1: no room for nvidia-223 here\n')
    dom = _Domain(fails={'migrateToURI3': _error(
        libvirt.VIR_ERR_HOOK_SCRIPT_FAILED, said)})
    with pytest.raises(exception.LibvirtError) as e:
        guest_mod.Guest(dom).migrate_live('qemu+tcp://b/system')
    assert str(e.value) == ('libvirt: migration to qemu+tcp://b/system: a '
                            'qemu hook refused it: no room for nvidia-223 '
                            'here')


def test_a_migration_refused_otherwise_says_libvirts_words():
    dom = _Domain(fails={'migrateToURI3': _error(
        libvirt.VIR_ERR_OPERATION_FAILED, 'unexpected exit status 1: x')})
    with pytest.raises(exception.LibvirtError) as e:
        guest_mod.Guest(dom).migrate_live('qemu+tcp://b/system')
    assert str(e.value) == ('libvirt: migration to qemu+tcp://b/system: '
                            'unexpected exit status 1: x')
    silent = _Domain(fails={'migrateToURI3': _silent_error(
        libvirt.VIR_ERR_OPERATION_FAILED)})
    with pytest.raises(exception.LibvirtError) as e:
        guest_mod.Guest(silent).migrate_live('qemu+tcp://b/system')
    assert str(e.value).endswith(': the text of the exception')


@pytest.mark.parametrize('message, said', [
    ('Child (x) unexpected exit status 1: refused here', 'refused here'),
    ('a (unexpected exit status 2: inner) unexpected exit status 12: '
     'outer words ', 'outer words'),
    ('unexpected exit status 1:no space after the colon',
     'unexpected exit status 1:no space after the colon'),
    ('unexpected exit status x1: words', 'unexpected exit status x1: words'),
    ('unexpected exit status 1:   ', 'unexpected exit status 1:   '),
    ('the hook failed', 'the hook failed')])
def test_the_hooks_own_words_are_after_libvirts_exit_status(message, said):
    assert guest_mod._hook_said(message) == said


def test_job_stats_of_the_running_or_the_completed_job():
    dom = _Domain(answer={'downtime': 30})
    g = guest_mod.Guest(dom)
    assert g.job_stats() == {'downtime': 30}
    assert g.job_stats(completed=True) == {'downtime': 30}
    assert dom.calls == [('jobStats', 0),
                         ('jobStats', libvirt.VIR_DOMAIN_JOB_STATS_COMPLETED)]


@pytest.mark.parametrize('code', [libvirt.VIR_ERR_NO_DOMAIN,
                                  libvirt.VIR_ERR_OPERATION_INVALID])
def test_no_job_or_no_domain_has_no_stats_and_nothing_to_abort(code):
    dom = _Domain(fails={'jobStats': _error(code, 'no job'),
                         'abortJob': _error(code, 'no job')})
    assert guest_mod.Guest(dom).job_stats() == {}
    assert guest_mod.Guest(dom).abort_job() == 'no job'
    silent = _Domain(fails={'abortJob': _silent_error(code)})
    assert guest_mod.Guest(silent).abort_job() == 'the text of the exception'


def test_an_abort_libvirt_took_says_nothing():
    dom = _Domain()
    assert guest_mod.Guest(dom).abort_job() is None
    assert dom.calls == [('abortJob',)]


# -- Guest: device removal events ------------------------------------------

class _EventConn(object):
    def __init__(self, register=None, deregister=None):
        self.register, self.deregister = register, deregister
        self.calls = []

    def domainEventRegisterAny(self, dom, event, callback, opaque):
        self.calls.append(('register', dom, event, opaque))
        self.callback = callback
        if self.register:
            raise self.register
        return 7

    def domainEventDeregisterAny(self, callback_id):
        self.calls.append(('deregister', callback_id))
        if self.deregister:
            raise self.deregister


class _EventDomain(object):
    def __init__(self, conn):
        self.conn = conn

    def connect(self):
        return self.conn


def test_removals_are_registered_for_the_domain_and_deregistered_once():
    conn = _EventConn()
    dom = _EventDomain(conn)
    with guest_mod.Guest(dom).device_removals() as removals:
        assert removals.events is True
        conn.callback(conn, dom, 'hostdev0', None)
        assert removals.wait(0) is True
        assert removals.wait(0) is False
    assert conn.calls == [
        ('register', dom, libvirt.VIR_DOMAIN_EVENT_ID_DEVICE_REMOVED, None),
        ('deregister', 7)]
    removals.close()
    assert len(conn.calls) == 2
    assert removals.events is False


def test_a_removal_waited_for_after_it_happened_is_seen():
    conn = _EventConn()
    removals = guest_mod.DeviceRemovals(_EventDomain(conn))
    conn.callback(conn, None, 'hostdev0', None)
    assert removals.wait(-5) is True


@pytest.mark.parametrize('refusal', [
    _error(libvirt.VIR_ERR_NO_SUPPORT), AttributeError('no events')])
def test_a_connection_without_events_polls(refusal, monkeypatch):
    slept = Calls()
    monkeypatch.setattr(guest_mod.time, 'sleep', slept)
    conn = _EventConn(register=refusal)
    removals = guest_mod.DeviceRemovals(_EventDomain(conn))
    assert removals.events is False
    assert removals.wait(30) is False
    assert removals.wait(0.05) is False
    assert removals.wait(-1) is False
    assert slept == [(guest_mod.POLL_INTERVAL,), (0.05,), (0.0,)]
    removals.close()
    assert [c[0] for c in conn.calls] == ['register']


def test_a_dead_connection_at_close_is_quiet():
    conn = _EventConn(deregister=_error(libvirt.VIR_ERR_INTERNAL_ERROR))
    removals = guest_mod.DeviceRemovals(_EventDomain(conn))
    removals.close()
    assert removals.events is False


# -- what the first measurement left ---------------------------------------

def test_live_and_config_both_asked_give_both_flags():
    assert guest_mod._flags(True, True) == LIVE | CONFIG
    assert guest_mod._flags(True, False) == LIVE
    assert guest_mod._flags(False, True) == CONFIG


@pytest.mark.parametrize('method, call', [
    ('attach_device', 'attachDeviceFlags'),
    ('detach_device', 'detachDeviceFlags')])
def test_a_device_call_without_flags_asks_for_neither(method, call):
    dom = _Domain()
    getattr(guest_mod.Guest(dom), method)('<hostdev/>')
    assert dom.calls == [(call, '<hostdev/>', 0)]


def test_the_hooks_words_may_hold_a_colon():
    assert guest_mod._hook_said(
        'x unexpected exit status 1: vGPU a: no room') == 'vGPU a: no room'


def test_xml_libvirt_answers_that_is_not_xml_is_named_domain_xml():
    with pytest.raises(exception.InvalidXml) as e:
        guest_mod.Guest(_Domain(answer='<domain>')).xml()
    assert 'domain XML is malformed' in str(e.value)
