"""The hand-written checks that replace ``re`` on the qemu hook's path
accept exactly the language of the patterns they replace.

``objects`` validates PCI addresses, UUIDs, type ids and PCI ids,
``sysfs.parsers`` reads numbers and ``textutil.escape`` escapes control
characters without ``re`` (importing it costs the hook more than all of
its parsing).  Each is compared here
with the pattern it stands for over edge cases, every code point whose
lowercase form differs, and many strings made by mutating valid ones
(a fixed seed: the same strings every run).
"""

import random
import re

import pytest

from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.devices.sysfs import parsers
from libvirt_gpu.util import textutil

PCI_RE = re.compile(r'([0-9a-f]{4,8}):([0-9a-f]{2}):([01][0-9a-f])\.([0-7])')
UUID_RE = re.compile(r'[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}')
TYPE_RE = re.compile(r'[A-Za-z0-9][A-Za-z0-9_.-]{0,63}')
HEX_ID_RE = re.compile(r'(?:0x)?([0-9a-fA-F]{4})')
CONTROL_RE = re.compile('[\x00-\x09\x0b-\x1f\x7f-\x9f'
                        '\u202a-\u202e\u2066-\u2069]')

VALID = {
    'pci': ['0000:3b:00.0', '0000:AF:1F.7', 'deadbeef:00:10.3',
            '10000:00:00.0'],
    'uuid': ['9b2f7c1e-8a59-4f0e-b3c2-1d4e5f6a7b8c',
             'ABCDEF01-2345-6789-ABCD-EF0123456789'],
    'type': ['nvidia-223', 'A', 'i915-GVTg_V5_4', 'x' * 64, 'a.b-c_d'],
    'hex_id': ['10de', '0x10DE', ' 2331 ', '0xffff', 'ABCD'],
}
# characters a mutation puts in: the ones the languages use, their
# neighbours, and code points whose lowercase form is ASCII or longer
POOL = ('0123456789abcdefgABCDEFGxXzZ:.-+_ \t\n\x00\x7f/'
        '\u212a\u0130\u0131\u017f\u00e9\u0660\uff10\U0001f600')
LOWER_CHANGES = ''.join(chr(c) for c in range(0x80, 0x110000)
                        if chr(c).lower() != chr(c) and 0 < c < 0xd800
                        or 0xe000 <= c < 0x110000 and chr(c).lower()
                        != chr(c))


def mutations(seeds, count, seed):
    rnd = random.Random(seed)
    for _ in range(count):
        text = list(rnd.choice(seeds))
        for _ in range(rnd.randint(1, 3)):
            op = rnd.randrange(4)
            where = rnd.randrange(len(text) + 1)
            char = (rnd.choice(POOL) if rnd.random() < 0.9
                    else rnd.choice(LOWER_CHANGES))
            if op == 0 and text:
                text[min(where, len(text) - 1)] = char
            elif op == 1:
                text.insert(where, char)
            elif op == 2 and text:
                del text[min(where, len(text) - 1)]
            else:
                text = text[:where] if rnd.random() < 0.5 else text[where:]
        yield ''.join(text)


def candidates(kind, seed):
    yield from VALID[kind]
    yield from ['', ' ', '-', '0x', ':', '.', '0000:00:00.', '0000::00.0']
    for valid in VALID[kind]:
        for cut in range(len(valid) + 1):
            yield valid[:cut]
            yield valid[cut:]
        for where in range(len(valid)):
            for char in 'a0-:.xG_':
                yield valid[:where] + char + valid[where + 1:]
        yield valid.replace('-', 'a').replace(':', '0').replace('.', '0')
        for char in LOWER_CHANGES[::7]:
            yield char + valid[1:]
            yield valid[:-1] + char
    yield from mutations(VALID[kind], 20000, seed)


def accepts(parse, text):
    try:
        return parse(text)
    except (exception.InvalidInput, ValueError):
        return None


def test_pci_address_language():
    for text in candidates('pci', 1):
        m = (PCI_RE.fullmatch(text.lower())
             if len(text) <= 16 else None)
        want = (None if m is None else
                objects.PciAddress(*(int(g, 16) for g in m.groups())))
        assert accepts(objects.PciAddress.parse, text) == want, repr(text)


def test_uuid_language():
    for text in candidates('uuid', 2):
        want = (text.lower() if len(text) == 36
                and UUID_RE.fullmatch(text.lower()) else None)
        assert accepts(objects.Uuid.parse, text) == want, repr(text)


def test_type_id_language():
    for text in candidates('type', 3):
        want = text if TYPE_RE.fullmatch(text) else None
        assert accepts(objects.TypeId.parse, text) == want, repr(text)


def test_pci_id_language():
    for text in candidates('hex_id', 4):
        m = HEX_ID_RE.fullmatch(text.strip())
        want = m.group(1).lower() if m else None
        assert accepts(objects.normalize_hex_id, text) == want, repr(text)


def regex_escape(text):
    def one(match):
        code = ord(match.group())
        return '\\x%02x' % code if code < 0x100 else '\\u%04x' % code
    return CONTROL_RE.sub(one, text)


@pytest.mark.parametrize('newline', [False, True])
def test_escape_is_the_pattern(newline):
    every_bmp = ''.join(chr(c) for c in range(0x3000))
    assert textutil.escape(every_bmp) == regex_escape(every_bmp)
    rnd = random.Random(5)
    pool = every_bmp[:0x300] + '\u202a\u202e\u2066\u2069\U0001f600\n'
    for _ in range(2000):
        text = ''.join(rnd.choice(pool) for _ in range(rnd.randint(0, 20)))
        want = regex_escape(text)
        if newline:
            want = want.replace('\n', '\\n')
        assert textutil.escape(text, newline=newline) == want, repr(text)


NUMBER_RE = re.compile(r'-?[0-9]{1,19}\Z')
HEX_NUMBER_RE = re.compile(r'(0[xX])?[0-9a-fA-F]{1,16}\Z')


@pytest.mark.parametrize('base, pattern', [(10, NUMBER_RE),
                                           (16, HEX_NUMBER_RE)])
def test_sysfs_number_language(base, pattern):
    seeds = ['0', '-1', '9' * 19, '0x10de', '0XFFFF', 'f' * 16, '18446744']
    for text in list(mutations(seeds, 20000, base)) + [
            s[:cut] for s in seeds for cut in range(len(s))] + [
            '-', '0x', '0X', '', '-0x1', '1\n', ' 1', '1_0', '٣', '0x-1']:
        want = (int(text, base) if pattern.match(text) else None)
        try:
            got = parsers.parse_number(text, '/sys/x', minimum=None,
                                       base=base)
        except exception.SysfsBadNumber:
            got = None
        assert got == want, repr(text)
