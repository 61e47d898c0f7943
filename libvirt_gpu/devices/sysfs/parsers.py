"""What sysfs files say, as values: the parsers of the text the reader
(``sysfs.reader``) returns.  Pure functions, no I/O; every refusal is a
``SysfsBadNumber`` naming the file it came from."""

from libvirt_gpu import exception
from libvirt_gpu import objects

# A count or an id: decimal digits (a leading '-' where the caller allows
# negative values), at most 19 of them (fits a 64-bit kernel value); in
# hex, an optional 0x and at most 16 digits.  Checked by hand, not by
# ``re`` (the qemu hook reads numbers on every guest start and importing
# ``re`` costs it more than all of its parsing); the patterns,
# ``-?[0-9]{1,19}\Z`` and ``(0[xX])?[0-9a-fA-F]{1,16}\Z``, are compared
# with this in tests/unit/test_objects_hand_validators.py.
_DIGITS = frozenset('0123456789')
_HEX_DIGITS = frozenset('0123456789abcdefABCDEF')


def _is_number(text, base):
    if base == 16:
        digits = text[2:] if text[:2] in ('0x', '0X') else text
        return 0 < len(digits) <= 16 and _HEX_DIGITS.issuperset(digits)
    digits = text[1:] if text[:1] == '-' else text
    return 0 < len(digits) <= 19 and _DIGITS.issuperset(digits)


def parse_number(text, path, minimum=0, base=10):
    """``text`` (an attribute's content) as an int >= ``minimum`` (None:
    any), else a SysfsBadNumber naming ``path`` and what was read."""
    expected = ('a number' if minimum is None
                else 'a number of at least %d' % minimum)
    if not _is_number(text, base) or (
            minimum is not None and int(text, base) < minimum):
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
