"""udev netlink messages, as ``systemd-udevd`` broadcasts them.

A real kernel tells udevd of every device added or removed (netlink group
1, ``add@/devices/...``); udevd then re-broadcasts the event, with its own
properties, to netlink group 2 in libudev's format.  That second message is
what ``udev_monitor_new_from_netlink(udev, "udev")`` listeners receive -
libvirtd's node-device driver among them.  A simulated host has no udevd,
so the simulator sends that message itself::

    struct monitor_netlink_header {        (systemd, device-monitor.c)
        char prefix[8];                    "libudev\\0"
        unsigned magic;                    htobe32(0xfeedcafe)
        unsigned header_size;              40
        unsigned properties_off;           40
        unsigned properties_len;           len(properties)
        unsigned filter_subsystem_hash;    htobe32(murmur2(subsystem))
        unsigned filter_devtype_hash;      htobe32(murmur2(devtype)) or 0
        unsigned filter_tag_bloom_hi;      htobe32(bloom >> 32) or 0
        unsigned filter_tag_bloom_lo;      htobe32(bloom & 0xffffffff) or 0
    };
    properties: "ACTION=add\\0DEVPATH=/devices/...\\0SUBSYSTEM=mdev\\0..."

libudev accepts it when it comes with sender credentials of uid 0 (the
kernel attaches them; sending to a multicast group needs CAP_NET_ADMIN)
and carries ACTION, DEVPATH, SUBSYSTEM and SEQNUM.  The hashes feed the
socket filters of subscribers that filter by subsystem, devtype or tag.

The message reaches every group-2 listener of the sender's network
namespace.
"""

import itertools
import socket
import struct
import threading
import time

NETLINK_KOBJECT_UEVENT = 15
GROUP_KERNEL = 1
GROUP_UDEV = 2
UDEV_MONITOR_MAGIC = 0xfeedcafe
PREFIX = b'libudev\0'
_HEADER = struct.Struct('=8sIIIIIIII')      # native-order fields
HEADER_SIZE = _HEADER.size                 # 40
REQUIRED = ('ACTION', 'DEVPATH', 'SUBSYSTEM', 'SEQNUM')
_MASK32 = 0xffffffff


def murmur_hash2(data, seed=0):
    """systemd's ``murmur_hash2`` (MurmurHash2, 32 bit, little endian
    reads on x86): ``string_hash32(s) = murmur_hash2(s, strlen(s), 0)``."""
    if isinstance(data, str):
        data = data.encode()
    m = 0x5bd1e995
    length = len(data)
    h = (seed ^ length) & _MASK32
    i = 0
    while length - i >= 4:
        k = int.from_bytes(data[i:i + 4], 'little')
        k = (k * m) & _MASK32
        k ^= k >> 24
        k = (k * m) & _MASK32
        h = (h * m) & _MASK32
        h ^= k
        i += 4
    rest = length - i
    if rest == 3:
        h ^= data[i + 2] << 16
    if rest >= 2:
        h ^= data[i + 1] << 8
    if rest >= 1:
        h ^= data[i]
        h = (h * m) & _MASK32
    h ^= h >> 13
    h = (h * m) & _MASK32
    h ^= h >> 15
    return h


def tag_bloom(tags):
    """systemd's 64-bit bloom filter of a device's tags."""
    bits = 0
    for tag in tags:
        h = murmur_hash2(tag)
        for shift in (0, 6, 12, 18):
            bits |= 1 << ((h >> shift) & 63)
    return bits


def _be32(value):
    """``htobe32`` stored into a native-order field."""
    return struct.unpack('=I', struct.pack('>I', value & _MASK32))[0]


def encode(properties, tags=()):
    """The libudev message for ``properties`` (ordered ``(key, value)``
    pairs holding at least ACTION, DEVPATH, SUBSYSTEM and SEQNUM)."""
    props = dict(properties)
    missing = [k for k in REQUIRED if not props.get(k)]
    if missing:
        raise ValueError('a udev message needs %s' % ', '.join(missing))
    body = b''.join(('%s=%s' % (k, v)).encode() + b'\0'
                    for k, v in properties)
    devtype = props.get('DEVTYPE')
    bloom = tag_bloom(tags)
    header = _HEADER.pack(
        PREFIX, _be32(UDEV_MONITOR_MAGIC), HEADER_SIZE, HEADER_SIZE,
        len(body), _be32(murmur_hash2(props['SUBSYSTEM'])),
        _be32(murmur_hash2(devtype)) if devtype else 0,
        _be32(bloom >> 32) if bloom else 0,
        _be32(bloom) if bloom else 0)
    return header + body


def decode(message):
    """``{key: value}`` of a libudev message (ValueError if it is not one,
    with the checks libudev makes)."""
    if len(message) < HEADER_SIZE or not message.startswith(PREFIX):
        raise ValueError('not a libudev message')
    (_prefix, magic, header_size, off, length, subsystem_hash,
     _devtype_hash, _hi, _lo) = _HEADER.unpack_from(message)
    if magic != _be32(UDEV_MONITOR_MAGIC):
        raise ValueError('bad magic 0x%08x' % magic)
    if header_size != HEADER_SIZE or off + length > len(message):
        raise ValueError('bad header sizes')
    props = {}
    for item in message[off:off + length].split(b'\0'):
        if item:
            key, _, value = item.decode().partition('=')
            props[key] = value
    for key in REQUIRED:
        if key not in props:
            raise ValueError('no %s' % key)
    if subsystem_hash != _be32(murmur_hash2(props['SUBSYSTEM'])):
        raise ValueError('subsystem hash does not match')
    return props


class UeventSender(object):
    """Broadcasts libudev messages to netlink group 2 (needs root).

    ``enabled`` may be turned off to see what a listener does without
    them; ``sent`` keeps the last messages' properties (for tests and the
    ``state`` control command).
    """

    KEEP = 256

    def __init__(self, group=GROUP_UDEV, first_seqnum=None):
        self.group = group
        self.enabled = True
        self.sent = []
        self._lock = threading.Lock()
        if first_seqnum is None:
            # Well away from the kernel's own counter, never reused
            # within a run.
            first_seqnum = 1000000 + int(time.time() * 1000) % 1000000
        self._seqnum = itertools.count(first_seqnum)
        self._sock = socket.socket(socket.AF_NETLINK,
                                   socket.SOCK_RAW | socket.SOCK_CLOEXEC,
                                   NETLINK_KOBJECT_UEVENT)
        self._sock.bind((0, 0))

    def send(self, action, devpath, subsystem, extra=(), tags=()):
        """Broadcast one event; returns its properties (None: disabled).

        ``devpath`` is the path under /sys (``/devices/pci0000:ae/...``);
        ``extra`` more ``(key, value)`` pairs (``MDEV_TYPE``, ``DRIVER``).
        """
        with self._lock:
            if not self.enabled:
                return None
            props = [('ACTION', action), ('DEVPATH', devpath),
                     ('SUBSYSTEM', subsystem)]
            props.extend(extra)
            props.append(('SEQNUM', str(next(self._seqnum))))
            props.append(('USEC_INITIALIZED',
                          str(int(time.monotonic() * 1000000))))
            self._sock.sendto(encode(props, tags), (0, self.group))
            self.sent.append(dict(props))
            del self.sent[:-self.KEEP]
            return dict(props)

    def close(self):
        self._sock.close()


class UeventListener(object):
    """A group-2 subscriber, as libudev's monitor (for tests)."""

    def __init__(self, group=GROUP_UDEV):
        self._sock = socket.socket(socket.AF_NETLINK,
                                   socket.SOCK_RAW | socket.SOCK_CLOEXEC,
                                   NETLINK_KOBJECT_UEVENT)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        self._sock.bind((0, group))

    def receive(self, timeout=5.0):
        """``(properties, sender uid)`` of the next libudev message, or
        None after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self._sock.settimeout(left)
            try:
                data, ancdata, _flags, _addr = self._sock.recvmsg(
                    65536, socket.CMSG_SPACE(12))
            except socket.timeout:
                return None
            uid = None
            for level, kind, payload in ancdata:
                if level == socket.SOL_SOCKET and \
                        kind == socket.SCM_CREDENTIALS:
                    _pid, uid, _gid = struct.unpack('=iII', payload[:12])
            try:
                return decode(data), uid
            except ValueError:
                continue          # a kernel (group 1) or foreign message

    def close(self):
        self._sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
