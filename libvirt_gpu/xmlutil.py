"""Hardened XML parsing for everything that comes from outside.

Domain XML reaches the hook on stdin and node-device XML comes from libvirt;
both are parsed here and nowhere else, with entity resolution, network
access and DTD loading off, a size cap, and any DOCTYPE refused.
"""

from lxml import etree

from libvirt_gpu import exception

MAX_XML_BYTES = 4 * 1024 * 1024


def _parser():
    return etree.XMLParser(resolve_entities=False, no_network=True,
                           load_dtd=False, dtd_validation=False,
                           huge_tree=False, remove_comments=True,
                           remove_pis=True)


def parse(text, what='XML', max_bytes=MAX_XML_BYTES):
    """Parse ``text`` (str or bytes) and return the root element.

    Raises InvalidXml for oversize input, a DOCTYPE (and so any entity
    declaration), or malformed XML.
    """
    if isinstance(text, str):
        data = text.encode('utf-8')
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
    try:
        root = etree.fromstring(data, _parser())
    except etree.XMLSyntaxError as e:
        raise exception.InvalidXml(reason='%s is malformed: %s' % (what, e))
    docinfo = root.getroottree().docinfo
    if docinfo.doctype or docinfo.internalDTD is not None:
        raise exception.InvalidXml(reason='%s carries a DOCTYPE' % what)
    return root
