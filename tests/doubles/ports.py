"""TCP ports for the servers the tests start (Prometheus, the exporter,
RabbitMQ).

A port found by binding to port 0 is an ephemeral one: between closing
that socket and the server binding it, any connect() on the machine may
be given the same port as its local end (the kernel hands them out from
``ip_local_port_range``), and the server then fails to start now and then.
The ports here come from below that range, where the kernel never picks
one by itself; each is bound once to check that nobody holds it, and no
port is handed out twice by one test process."""

import random
import socket

LOW, HIGH = 20000, 32000        # below Linux's default 32768-60999
_given = set()


def ephemeral_range():
    try:
        with open('/proc/sys/net/ipv4/ip_local_port_range') as f:
            low, high = (int(w) for w in f.read().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def free_port(rng=random):
    """A port on 127.0.0.1 that nobody holds now, outside the kernel's
    ephemeral range, not given before by this process."""
    low, high = ephemeral_range()
    candidates = [p for p in range(LOW, HIGH) if not low <= p <= high
                  and p not in _given]
    for _ in range(200):
        port = rng.choice(candidates)
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(('127.0.0.1', port))
            except OSError:
                continue
        _given.add(port)
        return port
    raise OSError('no free TCP port in %d-%d' % (LOW, HIGH))
