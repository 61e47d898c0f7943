"""host behaviour no other test pinned (issue 30, section 6):
``setAutostart`` on an mdev just defined is retried for
``Host.AUTOSTART_WAIT`` seconds, with a growing back-off, never a busy
loop, never giving up early.  On a stand-in clock: tenacity reads
``time.monotonic`` and sleeps through ``time.sleep``, both replaced here,
so the test takes no real time and sees every wait."""

import time

import libvirt
import pytest

from libvirt_gpu import exception
from libvirt_gpu.virt import host as host_mod

NAME = 'mdev_4b20d080_1b54_4048_85b3_a6a62d165c01_0000_af_00_0'


def _no_node_device():
    error = libvirt.libvirtError('Node device not found')
    error.err = (libvirt.VIR_ERR_NO_NODE_DEVICE, 0, 'Node device not found',
                 0, '', None, None, 0, 0)
    return error


class Clock(object):
    def __init__(self):
        self.now = 1000.0
        self.sleeps = []

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


class Device(object):
    def __init__(self, conn):
        self.conn = conn

    def name(self):
        return NAME

    def setAutostart(self, on):
        self.conn.calls.append(self.conn.clock.now)
        self.conn.clock.now += 0.001        # a call takes a moment
        if len(self.conn.calls) <= self.conn.missing_for:
            raise _no_node_device()

    def undefine(self, flags):
        self.conn.undefined = True


class Conn(object):
    """libvirt that lists the device it defined only after
    ``missing_for`` lookups (for ever: never)."""

    def __init__(self, clock, missing_for):
        self.clock = clock
        self.missing_for = missing_for
        self.calls = []
        self.undefined = False

    def nodeDeviceDefineXML(self, xml, flags):
        return Device(self)

    def nodeDeviceLookupByName(self, name):
        assert name == NAME
        return Device(self)


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(time, 'monotonic', clock.monotonic)
    monkeypatch.setattr(time, 'sleep', clock.sleep)
    return clock


def _define(conn):
    h = host_mod.Host.from_connection(conn)
    return h.define_mdev('<device/>', autostart=True)


def test_set_autostart_is_retried_for_autostart_wait_with_back_off(clock):
    """Broken by a fixed number of tries, by no wait (a busy loop), by a
    constant wait or by a wait that grows without bound."""
    wait = host_mod.Host.AUTOSTART_WAIT
    conn = Conn(clock, missing_for=10 ** 6)
    with pytest.raises(exception.LibvirtError) as e:
        _define(conn)
    assert 'to start at boot' in str(e.value)
    assert conn.undefined                       # nothing left half-made
    calls = conn.calls
    # tried for the whole wait, and not much past it
    assert wait <= calls[-1] - calls[0] <= wait + 1.0
    # a back-off: the first retry comes soon, the waits grow, then level
    sleeps = clock.sleeps
    assert len(sleeps) == len(calls) - 1
    assert 0 < sleeps[0] <= 0.25
    assert sleeps == sorted(sleeps)
    assert sleeps[-1] >= 4 * sleeps[0]
    assert max(sleeps) <= 1.0
    assert len(calls) <= 20


def test_set_autostart_succeeds_once_libvirt_lists_the_device(clock):
    conn = Conn(clock, missing_for=4)
    assert _define(conn) == NAME
    assert len(conn.calls) == 5 and not conn.undefined
    assert clock.now - 1000.0 < host_mod.Host.AUTOSTART_WAIT


def test_set_autostart_answered_at_once_waits_for_nothing(clock):
    conn = Conn(clock, missing_for=0)
    assert _define(conn) == NAME
    assert (len(conn.calls), clock.sleeps) == (1, [])
