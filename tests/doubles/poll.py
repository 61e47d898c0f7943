"""Waiting for something another process or thread does: the one poll
loop of the tests (no test bounds wall-clock time otherwise)."""

import time


def wait_for(predicate, timeout=10.0, interval=0.02):
    """Call ``predicate()`` every ``interval`` seconds until it returns a
    true value or ``timeout`` seconds have passed; its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)
