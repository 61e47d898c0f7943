import pytest

from libvirt_gpu import exception
from libvirt_gpu.util import xmlutil

HOSTILE = [
    # external entity
    '<!DOCTYPE d [<!ENTITY x SYSTEM "file:///etc/passwd">]><d>&x;</d>',
    # billion laughs
    '<!DOCTYPE d [<!ENTITY a "aaaa"><!ENTITY b "&a;&a;&a;&a;">]><d>&b;</d>',
    # a DOCTYPE alone
    '<!DOCTYPE domain SYSTEM "http://example.invalid/x.dtd"><domain/>',
    # malformed
    '<domain><name>x</domain>',
    '',
    # a DOCTYPE the byte search cannot see: the parser refuses it
    '<!DOCTYPE d [<!ENTITY x "y">]><d>&x;</d>'.encode('utf-16'),
    # an entity never declared
    '<d>&x;</d>',
]


@pytest.mark.parametrize('text', HOSTILE)
def test_hostile_refused(text):
    with pytest.raises(exception.InvalidXml):
        xmlutil.parse(text)


def test_oversize_refused():
    with pytest.raises(exception.InvalidXml, match='bytes'):
        xmlutil.parse('<d>' + 'x' * 100 + '</d>', max_bytes=64)


def test_parses_plain_xml():
    root = xmlutil.parse("<domain type='kvm'><name>g</name></domain>")
    assert root.findtext('name') == 'g'


def test_comments_and_processing_instructions_dropped():
    root = xmlutil.parse('<d><!-- c --><?pi x?><e a="1"/></d>')
    assert [child.tag for child in root] == ['e']


def test_utf16_document_parsed():
    root = xmlutil.parse("<domain><name>g</name></domain>".encode('utf-16'))
    assert root.findtext('name') == 'g'
