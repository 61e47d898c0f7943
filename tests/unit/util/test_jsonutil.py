"""``jsonutil`` reads and writes JSON as ``json`` does, without importing
it: same values, same text, same exceptions (type and message), over
edge cases and many generated documents and mutated texts (a fixed seed:
the same ones every run); and importing it imports neither ``json`` nor
``re``."""

import json
import random
import subprocess
import sys

import pytest

from libvirt_gpu.util import jsonutil

STRINGS = ['', 'a', 'é', '\x00', '\x1f', '"', '\\', '/', '\ud800',
           '\U0001f600', '\u2028', 'nvidia-223', 'Infinity', '\ufeff']
NUMBERS = [0, -1, 1, 2 ** 63, -2 ** 70, 10 ** 40, 0.0, -0.0, 1.5, 1e308,
           5e-324, 0.1, float('inf'), float('-inf'), float('nan'), True,
           False, None]


def value(rnd, depth=0):
    pick = rnd.randrange(8 if depth < 4 else 3)
    if pick == 0:
        return rnd.choice(NUMBERS)
    if pick == 1:
        return rnd.choice(STRINGS) + rnd.choice(STRINGS)
    if pick == 2:
        return rnd.random() * 10 ** rnd.randint(-30, 30)
    if pick in (3, 4):
        return [value(rnd, depth + 1) for _ in range(rnd.randrange(4))]
    keys = STRINGS + [1, -2.5, True, None, 'k%d' % rnd.randrange(9)]
    return {rnd.choice(keys): value(rnd, depth + 1)
            for _ in range(rnd.randrange(5))}


def outcome(func, *args, **kwargs):
    """What a call gives: ('ok', repr of the value) or ('raised', type,
    message)."""
    try:
        return ('ok', repr(func(*args, **kwargs)))
    except (ValueError, TypeError, RecursionError) as e:
        return ('raised', type(e), str(e))


def test_the_accelerator_is_used():
    # on this interpreter the fast path is taken (a change to _json that
    # made jsonutil fall back to json would lose what it is for)
    assert jsonutil._scan is not None


def test_importing_it_imports_neither_json_nor_re():
    root = jsonutil.__file__.rsplit('/libvirt_gpu/', 1)[0]
    code = ('import sys\n'
            'sys.path.insert(0, %r)\n'
            'from libvirt_gpu.util import jsonutil\n'
            'jsonutil.dumps(jsonutil.loads(b\'{"a": [1, 2.5, null]}\'), '
            'separators=(",", ":"), sort_keys=True)\n'
            'print(sorted({"json", "re"} & set(sys.modules)))' % root)
    out = subprocess.run([sys.executable, '-I', '-S', '-c', code],
                         check=True, capture_output=True, text=True)
    assert out.stdout.strip() == '[]'


OPTIONS = [{}, {'separators': (',', ':')}, {'sort_keys': True},
           {'separators': (',', ':'), 'sort_keys': True},
           {'indent': 1, 'sort_keys': True}, {'indent': 2}]


@pytest.mark.parametrize('options', OPTIONS)
def test_dumps_is_json_dumps(options):
    rnd = random.Random(11)
    values = NUMBERS + STRINGS + [value(rnd) for _ in range(1500)]
    values += [{'a': {1}}, {(1, 2): 3}, {'b': 1, 2: 3}, object(), b'x',
               [1, [2, [3, {'x': float('nan')}]]]]
    for v in values:
        assert (outcome(jsonutil.dumps, v, **options)
                == outcome(json.dumps, v, **options)), repr(v)


def test_dumps_refuses_a_cycle_as_json_does():
    cycle = []
    cycle.append(cycle)
    assert outcome(jsonutil.dumps, cycle) == outcome(json.dumps, cycle)


def texts(rnd):
    yield from ['', ' ', '{}', ' {"a": 1} ', '[1,]', '{"a" 1}', '\ufeff{}',
                '  \ufeff{}', 'NaN', '-Infinity', '1 2', '"\\ud800"', '01',
                '1e999', '-', '"\x00"', '[' * 5000 + ']' * 5000, '9' * 5000,
                '{"a": 1, "a": 2}', '\t\n\r[true,false,null]\r\n\t',
                '[1]\x0b', '1\u3000', '\x0c1', '\xa0"a"']
    pool = '{}[]",:. -+0123456789eEtruefalsn\\\x00é\t\n'
    for _ in range(3000):
        try:
            text = json.dumps(value(rnd), **rnd.choice(OPTIONS))
        except TypeError:      # keys of mixed types, sorted
            continue
        for _ in range(rnd.randrange(3)):
            where = rnd.randrange(len(text) + 1)
            text = text[:where] + rnd.choice(pool) + text[where + 1:]
        yield text


def test_loads_is_json_loads():
    for text in texts(random.Random(12)):
        assert outcome(jsonutil.loads, text) == outcome(json.loads, text), \
            repr(text)


def test_loads_of_bytes_is_json_loads():
    rnd = random.Random(13)
    datas = [b'', b'\xef\xbb\xbf{}', b'\xff\xfe{\x00}\x00', b'{"a": "\xff"}',
             '{"é": 1}'.encode('utf-16'), '[1]'.encode('utf-16-le'),
             '[1]'.encode('utf-32-be'), b'"\xed\xa0\x80"', b'\x001',
             bytearray(b' [1] ')]
    datas += [t.encode('utf-8', 'surrogatepass') for t in texts(rnd)]
    for data in datas:
        assert outcome(jsonutil.loads, data) == outcome(json.loads, data), \
            repr(data)


def test_loads_refuses_what_is_not_text_as_json_does():
    for data in (None, 1, ['{}']):
        assert outcome(jsonutil.loads, data) == outcome(json.loads, data)


# A document cut off or damaged as a crash or a full disk leaves one, each
# read first in a fresh process that has not imported json.decoder (the
# hook's, started with -I -S): _json's scanner takes its JSONDecodeError
# from json.decoder only when that is imported, and raised SystemError
# otherwise.
_DAMAGED = ['{"key": {"a": 1', '{"key"', '{"a" 1}', '[1 2]', '"abc',
            '{"a": "\\x"}', '{"a": [1, {"b": 2}', '{"a": 1,}']
_FIRST_ERROR = """import sys
sys.path.insert(0, %r)
from libvirt_gpu.util import jsonutil
assert 'json.decoder' not in sys.modules
try:
    jsonutil.loads(sys.argv[1])
except ValueError as e:
    print(repr((type(e).__name__, str(e))))
"""


@pytest.mark.parametrize('text', _DAMAGED)
def test_a_damaged_document_raises_json_s_error_in_a_fresh_process(text):
    root = jsonutil.__file__.rsplit('/libvirt_gpu/', 1)[0]
    done = subprocess.run(
        [sys.executable, '-I', '-S', '-c', _FIRST_ERROR % root, text],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    with pytest.raises(ValueError) as expected:
        json.loads(text)
    assert done.stdout.strip() == repr(
        ('JSONDecodeError', str(expected.value)))
