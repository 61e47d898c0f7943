"""A hang detector for tests that read hostile files in their own process.

A read of a FIFO blocks for ever; ``alarm(seconds)`` makes SIGALRM raise
``Hung`` in the test instead, so the test fails and the suite goes on.  It
bounds a hang, not a speed: the limits are minutes.
"""

import contextlib
import signal


class Hung(Exception):
    pass


@contextlib.contextmanager
def alarm(seconds):
    def hung(signum, frame):
        raise Hung('still running after %d s: hung' % seconds)
    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
