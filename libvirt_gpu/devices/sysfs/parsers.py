"""What sysfs files say, as values: the parsers of the text the reader
(``sysfs.reader``) returns.  Pure functions, no I/O; every refusal is a
``SysfsBadNumber`` naming the file it came from."""

import re

from libvirt_gpu import exception
from libvirt_gpu import objects

# A count or an id: decimal digits (a leading '-' where the caller allows
# negative values), at most 19 of them (fits a 64-bit kernel value).
_NUMBER = re.compile(r'-?[0-9]{1,19}\Z')
_HEX_NUMBER = re.compile(r'(0[xX])?[0-9a-fA-F]{1,16}\Z')


def parse_number(text, path, minimum=0, base=10):
    """``text`` (an attribute's content) as an int >= ``minimum`` (None:
    any), else a SysfsBadNumber naming ``path`` and what was read."""
    pattern = _HEX_NUMBER if base == 16 else _NUMBER
    expected = ('a number' if minimum is None
                else 'a number of at least %d' % minimum)
    if not pattern.match(text) or (minimum is not None
                                   and int(text, base) < minimum):
        raise exception.SysfsBadNumber(path=path, expected=expected,
                                       text=text[:40])
    return int(text, base)


def parse_hex_id(text, path):
    """A PCI id attribute (``vendor``, ``device``: ``0x10de``) normalized
    (``10de``), else a SysfsBadNumber naming ``path``.  The one parser of
    hex ids read from sysfs."""
    try:
        return objects.normalize_hex_id(text)
    except exception.InvalidInput:
        raise exception.SysfsBadNumber(
            path=path, expected='a 4-digit hex PCI id', text=text[:40])
