"""The test VM's channel framing (tests/kernel/vm_init.py, used by both
ends): one JSON object per line, arriving in arbitrary chunks."""

from tests.kernel import vm_init


def test_objects_split_across_chunks_and_noise_skipped():
    data = vm_init.frame({'hello': '6.1'}) + b'console noise\n' + \
        vm_init.frame({'id': 1, 'rc': 0}) + vm_init.frame({'id': 2})
    found, buf = [], b''
    for i in range(0, len(data), 7):                # 7-byte chunks
        got, buf = vm_init.unframe(buf, data[i:i + 7])
        found += got
    assert found == [{'hello': '6.1'}, {'id': 1, 'rc': 0}, {'id': 2}]
    assert buf == b''


def test_an_incomplete_line_waits_for_the_rest():
    got, buf = vm_init.unframe(b'', b'{"id": 3, "std')
    assert (got, buf) == ([], b'{"id": 3, "std')
    got, buf = vm_init.unframe(buf, b'out": "x"}\n')
    assert (got, buf) == ([{'id': 3, 'stdout': 'x'}], b'')
