"""Text for people: control characters escaped.

GPU, type and driver names come from sysfs and libvirt, and errors quote
paths and values from there too: a name holding a terminal escape sequence
(``ESC ] 0 ;`` retitles the window, ``ESC [ 2 J`` clears it) must reach a
terminal or a log as text, not as a command.  C0 controls except the
newline, DEL, C1 controls and the Unicode bidirectional overrides are
written as ``\\xNN`` / ``\\uNNNN``.  Used by the CLI (``cmd.term``) and the
hook's log.
"""

import re

_CONTROL = ('[\x00-\x09\x0b-\x1f\x7f-\x9f'
            '\u202a-\u202e\u2066-\u2069]')   # compiled on first use by re


def _escape_char(match):
    code = ord(match.group())
    return '\\x%02x' % code if code < 0x100 else '\\u%04x' % code


def escape(text, newline=False):
    """``text`` with every control character written as an escape; with
    ``newline``, the newline too (one table cell, one line)."""
    text = re.sub(_CONTROL, _escape_char, text)
    return text.replace('\n', '\\n') if newline else text
