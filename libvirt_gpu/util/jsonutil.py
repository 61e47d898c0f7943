"""``json.loads`` and ``json.dumps`` without importing ``json``.

The ``json`` package imports ``re`` (and with it ``enum``, ``functools``,
``collections`` ...): about 9 ms of CPU in a fresh process, a quarter of
a qemu hook call, which reads its settings snapshot and writes its
figures as JSON on every guest start.  The parsing and the writing
themselves are done by ``_json``, the C accelerator that ``json`` uses
too; this module calls it directly, configured as ``json``'s defaults
configure it, so the results are the same: same values, same text, same
exceptions (tests/unit/util/test_jsonutil.py compares them).  Whatever the
accelerator does not do by itself goes to ``json`` itself: ``indent``,
reporting an error (its message and position: in a process that has
not imported ``json.decoder`` the accelerator cannot raise its own, and
fails with a ``SystemError``, which sends the text to ``json``), a bytes
document that is not UTF-8, an interpreter without ``_json``.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

try:
    import _json
except ImportError:      # an interpreter without the accelerator
    _json = None  # type: ignore[assignment]

_WHITESPACE = ' \t\n\r'       # what JSON allows around a document


def _json_module():
    import json
    return json


def _cannot_serialize(value):
    # json.JSONEncoder.default's exception, word for word
    raise TypeError(f'Object of type {value.__class__.__name__} '
                    f'is not JSON serializable')


class _Context(object):
    """The attributes ``_json.make_scanner`` reads from a decoder: those of
    ``json.JSONDecoder()``."""

    def __init__(self):
        constants = {'-Infinity': float('-inf'), 'Infinity': float('inf'),
                     'NaN': float('nan')}
        self.strict = True
        self.object_hook = None
        self.object_pairs_hook = None
        self.parse_float = float
        self.parse_int = int
        self.parse_constant = constants.__getitem__


def _encoder(item_separator, key_separator, sort_keys):
    """``_json.make_encoder`` as ``json.JSONEncoder`` makes it (one per
    call: it keeps the objects being written to find a cycle)."""
    return _json.make_encoder(
        {}, _cannot_serialize, _json.encode_basestring_ascii, None,
        key_separator, item_separator, sort_keys, False, True)


def _accelerated():
    """The scanner, or None when ``_json`` is missing or does not take
    what this module passes it (another interpreter's version)."""
    if _json is None:
        return None
    try:
        scan = _json.make_scanner(_Context())
        probe = {'b': [1, 2.5, None, True, 'é'], 'a': -1}
        text = ''.join(_encoder(', ', ': ', True)(probe, 0))
        if (text != '{"a": -1, "b": [1, 2.5, null, true, "\\u00e9"]}'
                or scan(text, 0) != (probe, len(text))):
            return None
    except (TypeError, AttributeError, ValueError, StopIteration):
        return None
    return scan


_scan = _accelerated()


def loads(data: str | bytes | bytearray) -> Any:
    """``json.loads(data)``: ``data`` is a str, bytes or bytearray."""
    if _scan is None:
        return _json_module().loads(data)
    if isinstance(data, (bytes, bytearray)):
        # json.detect_encoding: UTF-8 unless a BOM or a zero byte in the
        # first four says UTF-16/32 (or UTF-8 with a BOM)
        if data[:2] in (b'\xff\xfe', b'\xfe\xff') or data[:3] == (
                b'\xef\xbb\xbf') or b'\x00' in data[:4]:
            return _json_module().loads(data)
        text = data.decode('utf-8', 'surrogatepass')
    elif isinstance(data, str):
        text = data
    else:
        return _json_module().loads(data)    # its TypeError
    start = len(text) - len(text.lstrip(_WHITESPACE))
    if text[start:start + 1] in ('', '\ufeff'):
        return _json_module().loads(text)    # its error
    try:
        value, end = _scan(text, start)
    except (StopIteration, SystemError):
        # its error, with the position.  SystemError: the scanner looks
        # its JSONDecodeError up in ``json.decoder`` only if that is
        # already imported; in a process that has not imported it (the
        # hook) a malformed document raises "returned NULL without
        # setting an exception" instead
        return _json_module().loads(text)
    if text[end:].strip(_WHITESPACE):
        return _json_module().loads(text)    # "Extra data"
    return value


def dumps(value: object, *, indent: int | None = None,
          separators: tuple[str, str] | None = None,
          sort_keys: bool = False) -> str:
    """``json.dumps(value, indent=..., separators=..., sort_keys=...)``
    with json's other defaults (ASCII only; NaN and infinities as
    ``NaN``/``Infinity``; a cycle or a value JSON cannot hold raises)."""
    if _scan is None or indent is not None:
        return _json_module().dumps(value, indent=indent,
                                    separators=separators,
                                    sort_keys=sort_keys)
    if isinstance(value, str):
        return _json.encode_basestring_ascii(value)
    item_separator, key_separator = separators or (', ', ': ')
    return ''.join(_encoder(item_separator, key_separator, sort_keys)(
        value, 0))
