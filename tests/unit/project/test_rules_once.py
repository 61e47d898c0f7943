"""Rules written once (issue 40, item 3): each rule's own test (the check
that fails when a second copy appears is ``test_architecture.
test_each_rule_is_written_once``).

- the GPU selector: ``devices/selectors.py`` (``parse``, ``resolve``,
  ``physical``) and its refusals, for every option that names GPUs;
- Placement's ``CUSTOM_`` names: ``objects.is_custom_name`` (the check)
  and ``objects.custom_name`` (the normalizer);
- NVIDIA's leading ``NVIDIA``/``GRID`` word of a type's name:
  ``objects.type_word``;
- the host's JSON record files: ``store/recordfile.RecordFile`` (the
  carve record and the NVIDIA vGPU state file are built on it; the files
  on disk keep the form they always had; the class's own tests are in
  ``tests/unit/store/test_recordfile.py``);
- the capacity rules a transaction and a carving use:
  ``capacity.free_after``, ``capacity.exceeds``.
"""

from __future__ import annotations

import json
import os
import random
import re

import os_resource_classes
import os_traits
import pytest

from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.devices import capacity
from libvirt_gpu.devices import selectors
from libvirt_gpu.devices.backends.nvidia_vgpu import statefile
from libvirt_gpu.store import carved as carve_record

PACKAGE_DIR = os.path.dirname(os.path.abspath(objects.__file__))
PF = objects.PciAddress.parse('0000:41:00.0')
VF = objects.PciAddress.parse('0000:41:00.4')
OTHER = objects.PciAddress.parse('0000:61:00.0')


# --- the CUSTOM_ rule --------------------------------------------------------

# Placement's own language of a custom name (its JSON schema's pattern,
# and the 255 characters of its column)
CUSTOM_PATTERN = re.compile(r'CUSTOM_[A-Z0-9_]{1,248}')


def _strings(seed=40, n=3000):
    rng = random.Random(seed)
    alphabet = 'ABCXYZ019_az -.:ÄßéCUSTOM\t'
    found = ['', 'CUSTOM_', 'CUSTOM_A', 'CUSTOM__', 'custom_a', 'CUSTOM_a',
             'CUSTOM_' + 'A' * 248, 'CUSTOM_' + 'A' * 249, 'XCUSTOM_A',
             'CUSTOM_A B', 'CUSTOM_É', 'NVIDIA L40S-12Q', 'GRID T4-2B',
             '  a__b--c  ', 'ß', 'İ', '1eb8']
    for _ in range(n):
        size = rng.choice((1, 3, 8, 20, 250, 260))
        text = ''.join(rng.choice(alphabet) for _ in range(size))
        found.append(rng.choice(('', 'CUSTOM_')) + text)
    return found


def test_the_custom_check_is_placements_language():
    for text in _strings():
        assert objects.is_custom_name(text) == bool(
            CUSTOM_PATTERN.fullmatch(text)), text
    for value in (None, 3, b'CUSTOM_A', ['CUSTOM_A']):
        assert objects.is_custom_name(value) is False


def test_the_normalizer_is_os_traits_and_os_resource_classes():
    for text in _strings():
        ours = objects.custom_name(text)
        assert ours == os_traits.normalize_name(text)[:255], text
        assert ours == os_resource_classes.normalize_name(text)[:255], text
        if any(c.isascii() and c.isalnum() for c in text):
            assert objects.is_custom_name(ours), text
    assert objects.custom_name('NVIDIA L40S-12Q') == 'CUSTOM_NVIDIA_L40S_12Q'
    assert objects.custom_name('a__b') == 'CUSTOM_A_B'
    assert len(objects.custom_name('x' * 400)) == 255


def test_the_vendor_word_rule():
    assert objects.type_word('GRID T4-2B') == 'T4-2B'
    assert objects.type_word('NVIDIA L40S-12Q') == 'L40S-12Q'
    assert objects.type_word('nvidia  RTX Pro 6000 DC-48C ') == \
        'RTX Pro 6000 DC-48C'
    assert objects.type_word(' GRID ') == 'GRID'      # the word alone
    assert objects.type_word('GRIDX T4') == 'GRIDX T4'
    assert objects.type_word('Tesla T4-2B') == 'Tesla T4-2B'
    assert objects.type_word(None) == objects.type_word('') == ''


def test_traits_and_carving_follow_the_one_rule_each():
    from libvirt_gpu.devices import carving
    from libvirt_gpu.openstack.placement import traits
    name = 'GRID  T4-2B/x'
    mtype = _type('nvidia-223', name=name)
    assert traits.vgpu_type_word(mtype) == objects.type_word(name)
    assert traits.custom('NVIDIA', '1eb8', 'T4-2B') == \
        objects.custom_name('NVIDIA_1eb8_T4-2B')
    assert carving.default_resource_class(name) == objects.custom_name(name)
    assert carving.default_alias(name) == 't4-2b-x'


def _type(type_id, name=None, published_max=None):
    return objects.VgpuType(id=objects.TypeId.parse(type_id), name=name,
                            description=None, device_api='vfio-pci',
                            available_instances=1,
                            published_max=published_max)


# --- the GPU selector --------------------------------------------------------

def _gpu(address, vf_of=None, product='26b9'):
    return objects.Gpu(address=objects.PciAddress.parse(str(address)),
                       vendor_id='10de', product_id=product,
                       class_code='0x030200', driver='nvidia', numa_node=0,
                       iommu_group=1, physfn=vf_of)


GPUS = (_gpu(PF), _gpu(VF, vf_of=PF), _gpu(OTHER, product='2331'))


def _said(call, *args, **kwargs):
    with pytest.raises(exception.ConfigError) as e:
        call(*args, **kwargs)
    return e.value.kwargs['reason']


def test_the_selector_parse():
    option = '[x]/gpus'
    assert selectors.parse(option, []) == ()
    assert _said(selectors.parse, option, [], required=True) == (
        '[x]/gpus is empty: name the GPUs by PCI address (0000:41:00.0) or '
        'by model, their vendor:product ids (10de:2331)')
    assert selectors.parse(option, [' 0000:41:00.0 ', '10DE:0x26B9']) == (
        objects.GpuSelector(address=PF),
        objects.GpuSelector(vendor_id='10de', product_id='26b9'))
    assert _said(selectors.parse, option, ['0000:41:00.0', 'nvidia']) == (
        "[x]/gpus: 'nvidia' names no GPU: give a PCI address "
        '(0000:41:00.0) or the vendor:product ids of a model (10de:2331)')
    assert selectors.parse(option, ['all'], allow_all=True) is selectors.ALL
    assert _said(selectors.parse, option, ['all', str(PF)],
                 allow_all=True) == (
        '[x]/gpus: "all" stands alone (every GPU no other route claims); or '
        'list the GPUs')
    # where "all" is not allowed it is an entry that names no GPU
    assert "'all' names no GPU" in _said(selectors.parse, option, ['all'])


def test_the_selector_resolve():
    option = '[x]/gpus'
    model = objects.GpuSelector(vendor_id='10de', product_id='26b9')
    absent = objects.GpuSelector(vendor_id='10de', product_id='ffff')
    by_pf = objects.GpuSelector(address=PF)
    found = selectors.resolve(option, (model, absent, by_pf), GPUS)
    assert found == ((model, (GPUS[0],)), (absent, ()), (by_pf, (GPUS[0],)))
    assert selectors.resolve(option, selectors.ALL, GPUS) == (
        (None, (GPUS[0], GPUS[2])),)
    assert _said(selectors.resolve, option,
                 (objects.GpuSelector(address=VF),), GPUS,
                 vf_hint=' (hint)') == (
        '[x]/gpus names 0000:41:00.4, a VF of the GPU 0000:41:00.0; name the '
        'physical GPU (hint)')
    assert _said(selectors.resolve, option, (objects.GpuSelector(
        address=objects.PciAddress.parse('0000:99:00.0')),), GPUS) == (
        '[x]/gpus names 0000:99:00.0, but this host has no GPU there '
        '(`libvirt-gpu list` shows the GPUs)')
    by_address = {g.address: g for g in GPUS}
    assert selectors.physical(option, OTHER, by_address) is GPUS[2]


# --- the capacity rules ------------------------------------------------------

def test_free_after_one_lease():
    t1 = objects.TypeId.parse('nvidia-1')
    t2 = objects.TypeId.parse('nvidia-2')
    assert capacity.free_after(3, t1, t1) == 2
    assert capacity.free_after(0, t1, t1) == 0
    assert capacity.free_after(3, t1, t2) == 0      # one type per GPU


def test_exceeds_the_gpus_maximum():
    mtype = _type('nvidia-1', published_max=4)
    assert not capacity.exceeds(mtype, 4)
    assert capacity.exceeds(mtype, 4, held=1)
    assert not capacity.exceeds(mtype, 3, held=1)
    assert capacity.limit(mtype) == 4
    unknown = _type('nvidia-1')
    assert not capacity.exceeds(unknown, 1000)
    assert capacity.limit(unknown) is None


# --- the record file ---------------------------------------------------------
#
# RecordFile itself is tested in tests/unit/store/test_recordfile.py; here,
# that the two files built on it keep the form hosts hold them in.

# the files as hosts hold them today: an upgraded host reads them as they
# are and writes them back in the same form
CARVED_TODAY = {'version': 1, 'vfs': {'0000:bd:00.4': {
    'gpu': '0000:bd:00.0', 'type_id': 'nvidia-1153',
    'type_name': 'NVIDIA L40S-12Q', 'carving': 'l40s_12q'}}}
VGPUS_TODAY = {'version': 1, 'vgpus': {
    '6f6f2b9e-2d0c-4f43-9d1a-0b6c2a1e0c11': {
        'vf': '0000:41:00.4', 'gpu': '0000:41:00.0',
        'type_id': 'nvidia-1153', 'start': 'auto', 'params': None,
        'gi_id': 1, 'placement': 0},
    '7f6f2b9e-2d0c-4f43-9d1a-0b6c2a1e0c12': {
        'vf': '0000:41:00.5', 'gpu': None, 'type_id': 'nvidia-1153',
        'start': None, 'params': 'frame_rate_limiter=0'}}}


def _write(path, data):
    text = json.dumps(data, indent=1, sort_keys=True) + '\n'
    with open(path, 'w') as f:
        f.write(text)
    return text


def test_the_carve_record_of_today_is_read_and_kept(tmp_path):
    record = carve_record.CarveRecord(str(tmp_path))
    assert os.path.basename(record.path) == 'nova-carved.json'
    assert os.path.basename(record.lock_path) == 'nova-carved.lock'
    text = _write(record.path, CARVED_TODAY)
    vf = objects.PciAddress.parse('0000:bd:00.4')
    assert record.read() == {vf: carve_record.CarvedVf(
        vf=vf, gpu=objects.PciAddress.parse('0000:bd:00.0'),
        type_id=objects.TypeId.parse('nvidia-1153'), carving='l40s_12q',
        type_name='NVIDIA L40S-12Q')}
    with record.locked() as entries:
        entry = entries.pop(vf)
    with record.locked() as entries:
        entries[vf] = entry
    with open(record.path) as f:
        assert f.read() == text


def test_the_nvidia_state_file_of_today_is_read_and_kept(tmp_path):
    state = statefile.VendorState(str(tmp_path))
    assert os.path.basename(state.path) == 'nvidia-vgpu.json'
    assert os.path.basename(state.lock_path) == 'nvidia-vgpu.lock'
    text = _write(state.path, VGPUS_TODAY)
    found = state.read()
    assert sorted(found) == sorted(VGPUS_TODAY['vgpus'])
    first = found['6f6f2b9e-2d0c-4f43-9d1a-0b6c2a1e0c11']
    assert (first.vf, first.gpu, first.start, first.gi_id,
            first.placement) == (VF, PF, 'auto', 1, 0)
    second = found['7f6f2b9e-2d0c-4f43-9d1a-0b6c2a1e0c12']
    assert (second.gpu, second.start, second.params, second.gi_id) == (
        None, None, 'frame_rate_limiter=0', None)
    with state.locked() as entries:
        kept = dict(entries)
        entries.clear()
    with state.locked() as entries:
        entries.update(kept)
    with open(state.path) as f:
        assert f.read() == text


def test_the_damaged_carve_record_says_what_to_do(tmp_path):
    record = carve_record.CarveRecord(str(tmp_path))
    _write(record.path, {'version': 2, 'vfs': {}})
    with pytest.raises(carve_record.DamagedRecord) as e:
        record.read()
    assert e.value.kwargs['damage'] == 'not a version 1 record'
    assert str(e.value).endswith(carve_record.REMEDY)
