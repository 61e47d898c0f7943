"""Hardened XML parsing for everything that comes from outside.

Domain XML reaches the hook on stdin and node-device XML comes from libvirt;
both are parsed here and nowhere else: a size cap, and any DOCTYPE (so any
entity declaration, internal or external) refused, before parsing by a byte
search and during it by the parser itself (which also catches one in an
encoding the byte search cannot see, such as UTF-16).  Comments and
processing instructions are dropped.  ``require_utf8`` refuses whatever
is not UTF-8 (the qemu hook's input: libvirt writes nothing else).

The parser is the standard library's ElementTree over expat (its C
accelerator): the qemu hook parses a domain at every start of a guest with
vGPUs, in a new process, and importing ``lxml`` (it imports ``inspect`` and
``gzip``) would be a large part of the hook's whole time
(``bench/hook.py``). Expat resolves no external entity and loads no DTD;
with no DOCTYPE accepted it sees no entity but the five predefined ones. The
elements returned offer the ElementTree API (``find``, ``iterfind``,
``findtext``, ``get``, ``attrib``, ``tag``, ``text``).  ElementTree (with
``re``, ``weakref``, ``copy``) is imported at the first parse, not with
this module: ``libvirt-gpu list`` renders and parses no XML.
"""

from libvirt_gpu import exception

MAX_XML_BYTES = 4 * 1024 * 1024


class _DoctypeSeen(Exception):
    pass


_builder = []           # the _Builder class, made at the first parse


def _builder_class():
    """The default tree builder, refusing a DOCTYPE when the parser meets
    one (expat reports it here before any declaration inside it)."""
    if not _builder:
        import xml.etree.ElementTree as ET

        class _Builder(ET.TreeBuilder):
            def doctype(self, name, pubid, system):
                raise _DoctypeSeen()
        _builder.append(_Builder)
    return _builder[0]


# xml.sax.saxutils would do, but it imports urllib (and with it http, email
# and ssl), which the qemu hook would pay for at every guest start.
_ESCAPES = (('&', '&amp;'), ('<', '&lt;'), ('>', '&gt;'), ("'", '&apos;'),
            ('"', '&quot;'))


def escape(value):
    """``value`` made safe for XML text and quoted attributes."""
    value = str(value)
    for char, entity in _ESCAPES:
        value = value.replace(char, entity)
    return value


def checked_bytes(text, what='XML', max_bytes=MAX_XML_BYTES):
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


def require_utf8(data, what='XML'):
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
    head = head.lstrip()[:200]
    if head.startswith(b'<?xml'):
        declared = head[:head.find(b'?>') + 1 or None].split(
            b'encoding', 1)[1:]
        if declared:
            name = declared[0].lstrip(b' \t\r\n=').lstrip(b'"\'')
            name = name.split(b'"', 1)[0].split(b"'", 1)[0].strip()
            if name.lower() not in _UTF8_NAMES:
                raise exception.InvalidXml(
                    reason='%s declares the encoding %s; only UTF-8 is '
                           'read: convert it and declare UTF-8 (or nothing)'
                           % (what, name.decode('ascii', 'replace')[:40]))
    return data


def parse(text, what='XML', max_bytes=MAX_XML_BYTES):
    """Parse ``text`` (str or bytes) and return the root element.

    Raises InvalidXml for oversize input, a DOCTYPE (and so any entity
    declaration), or malformed XML.
    """
    data = checked_bytes(text, what, max_bytes)
    import xml.etree.ElementTree as ET
    parser = ET.XMLParser(target=_builder_class()())
    try:
        parser.feed(data)
        return parser.close()
    except _DoctypeSeen:
        raise exception.InvalidXml(reason='%s carries a DOCTYPE' % what)
    except ET.ParseError as e:
        raise exception.InvalidXml(reason='%s is malformed: %s' % (what, e))
    except (LookupError, ValueError) as e:
        # expat names an encoding it cannot decode (``encoding="x-bogus"``:
        # LookupError; a multi-byte one such as UTF-7: ValueError).
        raise exception.InvalidXml(
            reason='%s declares an encoding that cannot be read (%s); '
                   'write it in UTF-8' % (what, e))
