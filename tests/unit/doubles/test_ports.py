"""The test servers' ports: free now, outside the kernel's ephemeral range,
never handed out twice."""

import random
import socket

from tests.doubles import ports


def test_ports_are_below_the_ephemeral_range_and_distinct():
    low, high = ports.ephemeral_range()
    given = [ports.free_port(random.Random(7)) for _ in range(20)]
    assert len(set(given)) == 20
    assert all(ports.LOW <= p < ports.HIGH and not low <= p <= high
               for p in given)


def test_a_held_port_is_not_given():
    first = ports.free_port(random.Random(1))
    ports._given.discard(first)
    with socket.socket() as holder:
        holder.bind(('127.0.0.1', first))
        holder.listen()
        # the same random sequence would pick it first: it is skipped
        assert ports.free_port(random.Random(1)) != first
