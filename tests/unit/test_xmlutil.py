import pytest

from libvirt_gpu import exception
from libvirt_gpu import xmlutil

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
