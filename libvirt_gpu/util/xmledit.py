"""Domain XML edited in place: what is not ours comes back byte for byte.

libvirt's ``migrate`` and ``restore`` hook operations hand the hook the
domain XML on stdin and take its stdout as the new XML.  Parsing that into
ElementTree and writing it back would rename other applications' namespace
prefixes (nova's ``nova:`` becomes ``ns0:``), drop comments and
reformat attributes.  A ``Document`` instead keeps the input's bytes and
the byte span of every element; an edit replaces one span (an element, an
attribute value, an element's content) and ``tobytes`` splices the edits
into the untouched bytes::

    doc = xmledit.Document.parse(data, 'domain XML on stdin')
    vgpu = doc.root.find('{urn:libvirt-gpu:1}gpus', 'metadata')
    doc.set_attribute(vgpu, 'parent', '0000:af:00.0')
    sys.stdout.buffer.write(doc.tobytes())

The input goes through the same hardening as ``xmlutil.parse`` (size cap,
no DOCTYPE, no entity declaration) before expat reads it; elements are
looked up by namespace URI and local name, whatever prefix the input uses.
Only UTF-8 input can be edited (libvirt writes nothing else).
"""

from __future__ import annotations

import re
import xml.parsers.expat as expat

from libvirt_gpu import exception
from libvirt_gpu.util import xmlutil

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator

# One attribute of a start tag: name, =, a quoted value (no '<' inside).
_ATTR = re.compile(rb'\s([^\s=/>]+)\s*=\s*("[^"]*"|\'[^\']*\')')
_ENCODING = re.compile(rb'^<\?xml[^>]*encoding\s*=\s*["\']([^"\']+)')


class Element(object):
    """One element of a ``Document``: its name and where its bytes are.

    ``start``..``head_end`` is the start tag (``<a x="1">`` or the whole
    ``<a/>``), ``tail_start``..``end`` the end tag (equal to ``head_end``
    and ``end`` for an empty element).
    """

    __slots__ = ('namespace', 'local', 'prefix', 'attrib', 'children',
                 'start', 'head_end', 'tail_start', 'end')

    def __init__(self, namespace: str, local: str, prefix: str,
                 attrib: dict[str, str], start: int) -> None:
        self.namespace = namespace
        self.local = local
        self.prefix = prefix
        self.attrib = attrib
        self.children: list[Element] = []
        self.start = start
        # set as the parser reaches them (Document.parse)
        self.head_end: int = -1
        self.tail_start: int = -1
        self.end: int = -1

    @property
    def tag(self) -> str:
        """``{namespace}local`` (ElementTree's spelling), or ``local``."""
        if self.namespace:
            return '{%s}%s' % (self.namespace, self.local)
        return self.local

    @property
    def empty(self) -> bool:
        return self.tail_start == self.head_end and self.end == self.head_end

    def find(self, *tags: str) -> Element | None:
        """The first element down the path of ``tags`` (``{ns}local`` or
        ``local`` each), or None."""
        found = self
        for tag in tags:
            child = next((c for c in found.children if c.tag == tag), None)
            if child is None:
                return None
            found = child
        return found

    def findall(self, tag: str) -> list[Element]:
        return [c for c in self.children if c.tag == tag]

    def iter(self) -> Iterator[Element]:
        yield self
        for child in self.children:
            yield from child.iter()


def _tag_end(data: bytes, start: int) -> int:
    """The offset just past the ``>`` that closes the tag at ``start``
    (quoted attribute values may hold ``>``)."""
    quote = None
    i = start + 1
    while i < len(data):
        c = data[i]
        if quote is not None:
            if c == quote:
                quote = None
        elif c in b'"\'':
            quote = c
        elif c == ord('>'):
            return i + 1
        i += 1
    raise exception.InvalidXml(reason='unterminated tag at byte %d' % start)


class Document(object):
    """The bytes of one XML document, its element spans and pending edits."""

    def __init__(self, data: bytes, root: Element) -> None:
        self.data = data
        self.root = root
        # (start, end, replacement bytes)
        self._edits: list[tuple[int, int, bytes]] = []

    @classmethod
    def parse(cls, text: str | bytes, what: str = 'XML',
              max_bytes: int = xmlutil.MAX_XML_BYTES) -> Document:
        """Read ``text`` (str or bytes) as an editable document; the
        errors of ``xmlutil.parse``, and InvalidXml for an encoding other
        than UTF-8."""
        data = xmlutil.checked_bytes(text, what, max_bytes)
        declared = _ENCODING.match(data.lstrip())
        if declared and declared.group(1).lower() not in (b'utf-8',
                                                          b'utf8'):
            raise exception.InvalidXml(
                reason='%s is in %s; only UTF-8 can be edited'
                % (what, declared.group(1).decode('ascii', 'replace')[:40]))
        stack: list[Element] = []
        top: list[Element] = []
        parser = expat.ParserCreate(namespace_separator=' ')
        parser.namespace_prefixes = True

        def start(name: str, attrib: dict[str, str]) -> None:
            parts = name.split(' ')
            if len(parts) == 1:
                namespace, local, prefix = '', parts[0], ''
            else:
                namespace, local = parts[0], parts[1]
                prefix = parts[2] if len(parts) > 2 else ''
            offset = parser.CurrentByteIndex
            elem = Element(namespace, local, prefix, attrib, offset)
            elem.head_end = _tag_end(data, offset)
            (stack[-1].children if stack else top).append(elem)
            stack.append(elem)

        def end(name: str) -> None:
            elem = stack.pop()
            if data[elem.head_end - 2:elem.head_end] == b'/>':
                elem.tail_start = elem.end = elem.head_end
            else:
                elem.tail_start = parser.CurrentByteIndex
                elem.end = _tag_end(data, elem.tail_start)

        def doctype(*args: object) -> None:
            raise exception.InvalidXml(reason='%s carries a DOCTYPE' % what)

        parser.StartElementHandler = start
        parser.EndElementHandler = end
        parser.StartDoctypeDeclHandler = doctype
        try:
            parser.Parse(data, True)
        except expat.ExpatError as e:
            raise exception.InvalidXml(reason='%s is malformed: %s'
                                       % (what, e))
        return cls(data, top[0])

    # reading -------------------------------------------------------------

    def bytes_of(self, elem: Element) -> bytes:
        """The input's bytes of ``elem``, tags included."""
        return self.data[elem.start:elem.end]

    # editing -------------------------------------------------------------

    def _edit(self, start: int, end: int, replacement: str | bytes) -> None:
        if isinstance(replacement, str):
            replacement = replacement.encode('utf-8')
        for s, e, _ in self._edits:
            if start < e and s < end or (start == end == s == e):
                raise exception.InvalidXml(
                    reason='two edits of bytes %d-%d of the document'
                    % (start, end))
        self._edits.append((start, end, replacement))

    def replace(self, elem: Element, text: str | bytes) -> None:
        """Replace the whole of ``elem`` (tags included) with ``text``."""
        self._edit(elem.start, elem.end, text)

    def remove(self, elem: Element) -> None:
        self._edit(elem.start, elem.end, b'')

    def set_text(self, elem: Element, text: str) -> None:
        """Replace what is between ``elem``'s tags with ``text`` (escaped);
        an empty element keeps its start tag and gains an end tag."""
        body = xmlutil.escape(text).encode('utf-8')
        if elem.empty:
            head = self.data[elem.start:elem.head_end - 2].rstrip()
            name = head[1:].split(None, 1)[0]
            self._edit(elem.start, elem.end,
                       head + b'>' + body + b'</' + name + b'>')
        else:
            self._edit(elem.head_end, elem.tail_start, body)

    def set_attribute(self, elem: Element, name: str, value: str) -> None:
        """Give the unprefixed attribute ``name`` of ``elem`` the value
        ``value``: only its value changes (its quotes, its place and the
        other attributes stay); a new attribute goes last."""
        head = self.data[elem.start:elem.head_end]
        raw = name.encode('utf-8')
        for match in _ATTR.finditer(head):
            if match.group(1) == raw:
                text = xmlutil.escape(value).encode('utf-8')
                self._edit(elem.start + match.start(2) + 1,
                           elem.start + match.end(2) - 1, text)
                return
        closing = 2 if head.endswith(b'/>') else 1
        at = elem.head_end - closing
        self._edit(at, at, (' %s="%s"' % (name, xmlutil.escape(value))).encode(
            'utf-8'))

    def append(self, parent: Element, text: str | bytes) -> None:
        """Add ``text`` (an element, already rendered) as ``parent``'s last
        child."""
        if parent.empty:
            head = self.data[parent.start:parent.head_end - 2].rstrip()
            name = head[1:].split(None, 1)[0]
            if isinstance(text, str):
                text = text.encode('utf-8')
            self._edit(parent.start, parent.end,
                       head + b'>' + text + b'</' + name + b'>')
        else:
            self._edit(parent.tail_start, parent.tail_start, text)

    @property
    def changed(self) -> bool:
        return bool(self._edits)

    def tobytes(self) -> bytes:
        """The document with every edit applied; the input itself when
        there is none."""
        out = []
        at = 0
        for start, end, replacement in sorted(self._edits,
                                              key=lambda e: (e[0], e[1])):
            out.append(self.data[at:start])
            out.append(replacement)
            at = end
        out.append(self.data[at:])
        return b''.join(out)
