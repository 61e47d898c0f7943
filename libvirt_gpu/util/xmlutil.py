"""Hardened XML parsing for everything that comes from outside.

Domain XML reaches the hook on stdin and node-device XML comes from libvirt;
both are parsed here and nowhere else: a size cap, and any DOCTYPE (so any
entity declaration, internal or external) refused, before parsing by a byte
search and during it by the parser itself (which also catches one in an
encoding the byte search cannot see, such as UTF-16).  Comments and
processing instructions are dropped.  ``require_utf8`` refuses whatever
is not UTF-8 (the qemu hook's input: libvirt writes nothing else).

The parser is expat (the standard library's C parser) building this
module's ``Element``s, which answer as ElementTree's do for the calls the
readers make (``find``, ``iterfind``, ``findtext``, ``get``, ``attrib``,
``tag``, ``text``): the qemu hook parses a domain at every start of a guest
with vGPUs, in a new process, and importing ``lxml`` (it imports
``inspect`` and ``gzip``) or ElementTree (``re``, ``weakref``, ``copy``,
``warnings``) would be a large part of the hook's whole time
(``bench/hook.py``).  Expat resolves no external entity and loads no DTD;
with no DOCTYPE accepted it sees no entity but the five predefined ones.
expat is imported at the first parse, not with this module:
``libvirt-gpu list`` renders and parses no XML.
"""

from __future__ import annotations

from libvirt_gpu import exception

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import ItemsView, Iterator, KeysView

    _Predicates = tuple[tuple[str, str | None], ...]
    _Steps = tuple[tuple[str, _Predicates], ...]

MAX_XML_BYTES = 4 * 1024 * 1024


class _DoctypeSeen(Exception):
    pass


class Element(object):
    """One parsed element: the part of ElementTree's ``Element`` that
    readers of domain and node-device XML use (``tag``, ``attrib``,
    ``text``, ``tail``, ``get``, iteration over the children, ``find``,
    ``findall``, ``iterfind``, ``findtext``, ``iter``), with the same
    answers.  Paths are ElementTree's for the forms used here: steps
    ``tag``, ``{namespace}tag``, ``*`` and ``.``, joined by ``/``, each
    with optional ``[@name]`` or ``[@name='value']`` predicates; any other
    form is a ValueError (a programming error, never input).

    Kept here, over expat, rather than ElementTree: ElementTree brings
    ``re``, ``weakref``, ``copy`` and ``warnings``, a tenth of the qemu
    hook's whole start-up (``bench/hook.py --importtime``)."""

    __slots__ = ('tag', 'attrib', 'text', 'tail', '_children')

    def __init__(self, tag: str, attrib: dict[str, str]) -> None:
        self.tag = tag
        self.attrib = attrib
        self.text: str | None = None
        self.tail: str | None = None
        self._children: list[Element] = []

    def __repr__(self) -> str:
        return '<Element %r>' % (self.tag,)

    def __iter__(self) -> Iterator[Element]:
        return iter(self._children)

    def __len__(self) -> int:
        return len(self._children)

    def __getitem__(self, index: int) -> Element:
        return self._children[index]

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.attrib.get(key, default)

    def keys(self) -> KeysView[str]:
        return self.attrib.keys()

    def items(self) -> ItemsView[str, str]:
        return self.attrib.items()

    def iter(self, tag: str | None = None) -> Iterator[Element]:
        """This element and every one below it, in document order; only
        those named ``tag`` when given (``*``: all)."""
        if tag == '*':
            tag = None
        pending = [self]
        while pending:
            element = pending.pop()
            if tag is None or element.tag == tag:
                yield element
            pending.extend(reversed(element._children))

    def iterfind(self, path: str) -> Iterator[Element]:
        found = [self]
        for tag, predicates in _steps(path):
            if tag == '.':
                found = [e for e in found if _holds(e, predicates)]
                continue
            found = [child for e in found for child in e._children
                     if (tag == '*' or child.tag == tag)
                     and _holds(child, predicates)]
        return iter(found)

    def findall(self, path: str) -> list[Element]:
        return list(self.iterfind(path))

    def find(self, path: str) -> Element | None:
        return next(self.iterfind(path), None)

    def findtext(self, path: str,
                 default: str | None = None) -> str | None:
        element = self.find(path)
        if element is None:
            return default
        return element.text or ''


# path -> its parsed steps (paths are constants)
_STEPS: dict[str, _Steps] = {}


def _steps(path: str) -> _Steps:
    steps = _STEPS.get(path)
    if steps is None:
        steps = _STEPS[path] = tuple(_parse_path(path))
    return steps


def _split_path(path: str) -> list[str]:
    """``path`` cut at each ``/`` outside ``{...}`` and ``[...]``."""
    parts, start, depth = [], 0, 0
    for at, char in enumerate(path):
        if char in '{[':
            depth += 1
        elif char in '}]':
            depth -= 1
        elif char == '/' and depth == 0:
            parts.append(path[start:at])
            start = at + 1
    parts.append(path[start:])
    return parts


def _parse_path(path: str) -> Iterator[tuple[str, _Predicates]]:
    if not isinstance(path, str) or not path or path.startswith('/'):
        raise ValueError('unsupported path %r' % (path,))
    for step in _split_path(path):
        tag, _, rest = step.partition('[')
        if tag.startswith('{'):
            namespace_end = step.find('}')
            if namespace_end < 0:
                raise ValueError('unsupported path %r' % (path,))
            tag, _, rest = step.partition('}')[2].partition('[')
            tag = step[:namespace_end + 1] + tag
        if not tag or tag == '..' or '@' in tag or '(' in tag:
            raise ValueError('unsupported path %r' % (path,))
        predicates = []
        while rest:
            body, close, rest = rest.partition(']')
            if not close or not body.startswith('@') or (
                    rest and not rest.startswith('[')):
                raise ValueError('unsupported path %r' % (path,))
            rest = rest[1:]
            name, equals, quoted = body[1:].partition('=')
            value: str | None = None
            if equals:
                if len(quoted) < 2 or quoted[0] not in '\'"' or \
                        quoted[-1] != quoted[0]:
                    raise ValueError('unsupported path %r' % (path,))
                value = quoted[1:-1]
            predicates.append((name, value))
        yield tag, tuple(predicates)


def _holds(element: Element, predicates: _Predicates) -> bool:
    for name, value in predicates:
        got = element.attrib.get(name)
        if got is None or (value is not None and got != value):
            return False
    return True


class _Builder(object):
    """expat's callbacks building ``Element``s, as ElementTree's
    TreeBuilder does: names ``{namespace}local``, text and tails kept as
    given, comments and processing instructions dropped, and a DOCTYPE
    refused when the parser meets one (before any declaration in it)."""

    def __init__(self) -> None:
        self.stack: list[Element] = []
        self.root: Element | None = None
        # the element whose text or tail comes next
        self.last: Element | None = None
        self.closed = False     # whether ``last`` was closed (tail)

    def start(self, name: str, attrib: dict[str, str]) -> None:
        if '}' in name:
            name = '{' + name
        if attrib:
            attrib = {('{' + k if '}' in k else k): v
                      for k, v in attrib.items()}
        element = Element(name, attrib)
        if self.stack:
            self.stack[-1]._children.append(element)
        else:
            self.root = element
        self.stack.append(element)
        self.last, self.closed = element, False

    def end(self, name: str) -> None:
        self.last, self.closed = self.stack.pop(), True

    def data(self, text: str) -> None:
        last = self.last
        if last is None:
            return
        if self.closed:
            last.tail = text if last.tail is None else last.tail + text
        else:
            last.text = text if last.text is None else last.text + text

    @staticmethod
    def doctype(*args: object) -> None:
        raise _DoctypeSeen()


# xml.sax.saxutils would do, but it imports urllib (and with it http, email
# and ssl), which the qemu hook would pay for at every guest start.
_ESCAPES = (('&', '&amp;'), ('<', '&lt;'), ('>', '&gt;'), ("'", '&apos;'),
            ('"', '&quot;'))


def escape(value: object) -> str:
    """``value`` made safe for XML text and quoted attributes."""
    value = str(value)
    for char, entity in _ESCAPES:
        value = value.replace(char, entity)
    return value


def checked_bytes(text: str | bytes | bytearray, what: str = 'XML',
                  max_bytes: int = MAX_XML_BYTES) -> bytes:
    """``text`` (str or bytes) as bytes, once it passed the checks every
    parse of outside XML makes: InvalidXml for input that is not text,
    oversize, or carries a DOCTYPE or entity declaration."""
    if isinstance(text, str):
        try:
            data = text.encode('utf-8')
        except UnicodeError:
            raise exception.InvalidXml(
                reason='%s is not valid Unicode (a lone surrogate)' % what)
    elif isinstance(text, (bytes, bytearray)):
        data = bytes(text)
    else:
        raise exception.InvalidXml(reason='%s is not text' % what)
    if len(data) > max_bytes:
        raise exception.InvalidXml(
            reason='%s is %d bytes, more than the %d allowed'
            % (what, len(data), max_bytes))
    if b'<!DOCTYPE' in data or b'<!ENTITY' in data:
        raise exception.InvalidXml(
            reason='%s carries a DOCTYPE or entity declaration' % what)
    return data


# Byte order marks of the encodings expat detects by themselves; the
# UTF-32 ones first (UTF-32LE's starts with UTF-16LE's).
_BOMS = ((b'\x00\x00\xfe\xff', 'UTF-32'), (b'\xff\xfe\x00\x00', 'UTF-32'),
         (b'\xfe\xff', 'UTF-16'), (b'\xff\xfe', 'UTF-16'))
_UTF8_NAMES = (b'utf-8', b'utf8')


def require_utf8(data: bytes, what: str = 'XML') -> bytes:
    """Refuse (InvalidXml) bytes that are not UTF-8 XML: a UTF-16 or
    UTF-32 byte order mark, a NUL byte (UTF-16 without one), bytes that do
    not decode, an encoding declaration other than UTF-8.  libvirt writes
    UTF-8 only; what reaches us otherwise was converted by someone, and an
    edit spliced in at byte offsets (``xmledit``) would not be well-formed
    in it."""
    for bom, name in _BOMS:
        if data.startswith(bom):
            raise exception.InvalidXml(
                reason='%s is %s (it starts with a byte order mark); only '
                       'UTF-8 is read: convert it (`iconv -t UTF-8`)'
                       % (what, name))
    if b'\x00' in data:
        raise exception.InvalidXml(
            reason='%s holds a NUL byte at offset %d (UTF-16 or UTF-32 '
                   'text?); only UTF-8 is read: convert it (`iconv -t '
                   'UTF-8`)' % (what, data.index(b'\x00')))
    try:
        data.decode('utf-8')
    except UnicodeDecodeError as e:
        raise exception.InvalidXml(
            reason='%s is not UTF-8 (byte 0x%02x at offset %d); only UTF-8 '
                   'is read: convert it (`iconv -t UTF-8`)'
                   % (what, data[e.start], e.start))
    head = data[3:] if data.startswith(b'\xef\xbb\xbf') else data
    head = head.lstrip()
    if head.startswith(b'<?xml'):
        # the whole declaration, however much blank space it holds
        declared = head[:head.find(b'?>') + 1 or None].split(
            b'encoding', 1)[1:]
        if declared:
            encoding = declared[0].lstrip(b' \t\r\n=').lstrip(b'"\'')
            encoding = encoding.split(b'"', 1)[0].split(b"'", 1)[0].strip()
            if encoding.lower() not in _UTF8_NAMES:
                raise exception.InvalidXml(
                    reason='%s declares the encoding %s; only UTF-8 is '
                           'read: convert it and declare UTF-8 (or nothing)'
                           % (what, encoding.decode('ascii', 'replace')[:40]))
    return data


def parse(text: str | bytes | bytearray, what: str = 'XML',
          max_bytes: int = MAX_XML_BYTES) -> Element:
    """Parse ``text`` (str or bytes) and return the root ``Element``.

    Raises InvalidXml for oversize input, a DOCTYPE (and so any entity
    declaration), or malformed XML.
    """
    data = checked_bytes(text, what, max_bytes)
    from xml.parsers import expat
    builder = _Builder()
    parser = expat.ParserCreate(namespace_separator='}')
    parser.buffer_text = True
    parser.StartElementHandler = builder.start
    parser.EndElementHandler = builder.end
    parser.CharacterDataHandler = builder.data
    parser.StartDoctypeDeclHandler = builder.doctype
    try:
        parser.Parse(data, True)
    except _DoctypeSeen:
        raise exception.InvalidXml(reason='%s carries a DOCTYPE' % what)
    except expat.ExpatError as e:
        raise exception.InvalidXml(reason='%s is malformed: %s' % (what, e))
    except (LookupError, ValueError) as e:
        # expat names an encoding it cannot decode (``encoding="x-bogus"``:
        # LookupError; a multi-byte one such as UTF-7: ValueError).
        raise exception.InvalidXml(
            reason='%s declares an encoding that cannot be read (%s); '
                   'write it in UTF-8' % (what, e))
    assert builder.root is not None     # expat refuses a document without
    return builder.root
