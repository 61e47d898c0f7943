"""Text for people: control characters escaped.

GPU, type and driver names come from sysfs and libvirt, and errors quote
paths and values from there too: a name holding a terminal escape sequence
(``ESC ] 0 ;`` retitles the window, ``ESC [ 2 J`` clears it) must reach a
terminal or a log as text, not as a command.  C0 controls except the
newline, DEL, C1 controls and the Unicode bidirectional overrides are
written as ``\\xNN`` / ``\\uNNNN``.  Used by the CLI (``cmd.term``) and the
hook's log.
"""

# Each character to escape -> its escape, for ``str.translate`` (no
# ``re``: the qemu hook escapes every line it logs, and importing ``re``
# costs it more than all of its escaping).  tests/unit/test_textutil.py
# compares it with the pattern
# ``[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]``.
_ESCAPES = {code: ('\\x%02x' % code if code < 0x100 else '\\u%04x' % code)
            for codes in (range(0x00, 0x0a), range(0x0b, 0x20),
                          range(0x7f, 0xa0), range(0x202a, 0x202f),
                          range(0x2066, 0x206a))
            for code in codes}


def escape(text: str, newline: bool = False) -> str:
    """``text`` with every control character written as an escape; with
    ``newline``, the newline too (one table cell, one line)."""
    text = text.translate(_ESCAPES)
    return text.replace('\n', '\\n') if newline else text
