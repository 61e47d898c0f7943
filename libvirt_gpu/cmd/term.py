"""The CLI's streams: control characters escaped (``textutil.escape``).

GPU, type and driver names come from sysfs and libvirt, and errors quote
paths and values from there too: a name holding a terminal escape sequence
(``ESC ] 0 ;`` retitles the window, ``ESC [ 2 J`` clears it) must reach the
terminal as text, not as a command.  C0 controls except the newline, C1
controls and the Unicode bidirectional overrides are written as ``\\xNN`` /
``\\uNNNN``.  JSON output passes unchanged (``json.dumps`` already escapes
every one of them).
"""

import contextlib
import sys

from libvirt_gpu.util import textutil

escape = textutil.escape


class EscapingStream(object):
    """A text stream that escapes what is written to it."""

    def __init__(self, stream):
        self._stream = stream

    @property
    def raw_stream(self):
        return self._stream

    def write(self, text):
        return self._stream.write(escape(text))

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def unescaped(stream):
    """The stream under an EscapingStream, for text that is escaped
    already: JSON from ``json.dumps`` (ASCII only, every control character
    a ``\\uXXXX``), which a second scan would only slow down."""
    return getattr(stream, 'raw_stream', stream)


@contextlib.contextmanager
def escaped_output():
    """Within: ``sys.stdout`` and ``sys.stderr`` escape control characters.
    Usable as a decorator."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = EscapingStream(saved[0]), EscapingStream(
        saved[1])
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
