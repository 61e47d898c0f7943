"""nova_cmds' copy of Nova's device_spec matching: the cases a sample
of ``make mutation`` found unguarded (a product id ignored, an address
refusal without its address)."""

import pytest

from libvirt_gpu.cmd import nova_cmds
from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.util import records
from tests.doubles import fakes

PF = objects.PciAddress.parse('0000:af:00.0')
VF = objects.PciAddress.parse('0000:af:00.4')


def _vf():
    return records.replace(fakes.gpu(str(VF), product_id='2331'),
                           physfn=PF)


@pytest.mark.parametrize('spec, matches', [
    ({}, True),
    ({'vendor_id': '10de'}, True),
    ({'vendor_id': '10DE', 'product_id': '2331'}, True),
    ({'vendor_id': '*', 'product_id': ' 2331 '}, True),
    ({'product_id': '2330'}, False),
    ({'vendor_id': '10de', 'product_id': '1eb8'}, False),
    ({'vendor_id': '1002'}, False),
    ({'vendor_id': '1002', 'product_id': '2331'}, False),
])
def test_both_ids_must_match(spec, matches):
    assert nova_cmds.spec_matches(spec, _vf(), {PF}) is matches


def test_a_pci_id_that_is_not_hex_is_refused_naming_it():
    with pytest.raises(exception.InvalidInput,
                       match=r"PCI id 'x10de'"):
        nova_cmds.spec_matches({'vendor_id': 'x10de'}, _vf(), {PF})


@pytest.mark.parametrize('address, matches', [
    ('0000:af:00.4', True),
    ('0000:af:00.0', True),        # the PF named exactly: its VFs too
    ('*:af:00.*', True),
    (':af:00.', True),
    ('af:00.5', False),
    ('0000:b0:00.4', False),
    ({'bus': 'af', 'function': '4'}, True),
    ({'bus': 'b.'}, False),
])
def test_the_address_forms_nova_takes(address, matches):
    assert nova_cmds.spec_matches({'address': address}, _vf(),
                                  {PF}) is matches


def test_the_pf_stands_for_its_vfs_only_when_it_has_vfs():
    assert not nova_cmds.address_matches('0000:af:00.0', VF, PF, set())


@pytest.mark.parametrize('address', ['0:0:af:00.4', '0000:af:20.4',
                                     '0000:af:00.8', '0000:xx:00.4',
                                     {'bus': '('}])
def test_an_address_nova_would_refuse_is_refused_naming_it(address):
    with pytest.raises(exception.InvalidInput) as raised:
        nova_cmds.address_matches(address, VF, PF, {PF})
    assert 'address %r' % (address,) in str(raised.value)
