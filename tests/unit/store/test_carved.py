"""store/carved.py: the record of the VFs ``restore`` carved for Nova,
refused with what to do when it cannot be read, and set aside."""

import json
import os

import pytest

from libvirt_gpu import objects
from libvirt_gpu.store import carved

VF = '0000:bd:00.4'
ENTRY = {'gpu': '0000:bd:00.0', 'type_id': 'nvidia-1153',
         'type_name': 'NVIDIA L40S-12Q', 'carving': 'l40s_12q'}


@pytest.fixture
def record(tmp_path):
    os.makedirs(str(tmp_path / 'state'))
    return carved.CarveRecord(str(tmp_path / 'state'))


def _write(record, data):
    with open(record.path, 'w') as f:
        f.write(data if isinstance(data, str) else json.dumps(data))


def _damage(record):
    with pytest.raises(carved.DamagedRecord) as e:
        record.read()
    assert e.value.kwargs['path'] == record.path
    assert str(e.value).endswith('; ' + carved.REMEDY)
    return e.value.kwargs['damage']


def test_an_entry_reads_as_a_carved_vf(record):
    _write(record, {'version': 1, 'vfs': {VF: ENTRY}})
    vf = objects.PciAddress.parse(VF)
    assert record.read() == {vf: carved.CarvedVf(
        vf=vf, gpu=objects.PciAddress.parse('0000:bd:00.0'),
        type_id=objects.TypeId.parse('nvidia-1153'), carving='l40s_12q',
        type_name='NVIDIA L40S-12Q')}
    no_name = dict(ENTRY, type_name=None)
    _write(record, {'version': 1, 'vfs': {VF: no_name}})
    assert record.read()[vf].type_name is None


@pytest.mark.parametrize('value,damage', [
    ('l40s_12q', 'not an object'),
    ([ENTRY], 'not an object'),
    (dict(ENTRY, carving=7), 'carving or type_name'),
    (dict(ENTRY, type_name=12), 'carving or type_name'),
    (dict(ENTRY, carving=None), 'carving or type_name')])
def test_an_entry_of_the_wrong_shape_is_named(record, value, damage):
    _write(record, {'version': 1, 'vfs': {VF: value}})
    assert _damage(record) == "entry %r is invalid: %s" % (VF, damage)


@pytest.mark.parametrize('field', ['gpu', 'type_id', 'carving'])
def test_an_entry_without_a_field_is_refused(record, field):
    entry = dict(ENTRY)
    del entry[field]
    _write(record, {'version': 1, 'vfs': {VF: entry}})
    assert _damage(record).startswith("entry %r is invalid: " % VF)


def test_an_entry_whose_address_is_not_one_is_refused(record):
    _write(record, {'version': 1, 'vfs': {'bd:00.4x': ENTRY}})
    assert _damage(record).startswith("entry 'bd:00.4x' is invalid: ")
    _write(record, {'version': 1, 'vfs': {VF: dict(ENTRY, gpu='gpu0')}})
    assert _damage(record).startswith("entry %r is invalid: " % VF)


def test_what_the_state_directory_refuses_is_said_with_the_remedy(record):
    _write(record, '\ufeff{"version": 1, "vfs": {}}')
    assert _damage(record).startswith('not JSON')
    _write(record, json.dumps({'version': 1, 'vfs': {}}).ljust(
        carved.CarveRecord.max_bytes + 1))
    assert _damage(record) == 'larger than %d bytes' % (1024 * 1024)
    _write(record, {'version': 2, 'vfs': {}})
    assert _damage(record) == 'not a version 1 record'


def test_a_damaged_record_is_set_aside_under_its_time(record):
    _write(record, 'not json')
    aside = record.set_aside(now=0)
    assert aside == record.path + '.damaged-19700101T000000Z'
    assert not os.path.exists(record.path)
    with open(aside) as f:
        assert f.read() == 'not json'
    _write(record, 'not json either')
    second = record.set_aside(now=0)
    assert second == record.path + '.damaged-19700101T000000Z.2'
    assert record.read() == {}


def test_a_record_that_reads_is_not_set_aside(record):
    _write(record, {'version': 1, 'vfs': {VF: ENTRY}})
    assert record.set_aside(now=0) is None
    assert sorted(os.listdir(record.state_dir)) == [
        'nova-carved.json', 'nova-carved.lock']
