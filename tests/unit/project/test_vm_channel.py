"""The test VM's channel framing (tests/kernel/vm_init.py, used by both
ends): one JSON object per line, arriving in arbitrary chunks; and the
file requests its agent answers without starting a process."""

import json

import pytest

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


def test_the_agent_reads_files_and_resolves_links_itself(tmp_path):
    # the shape of /sys/bus/mdev/devices: links to devices under their
    # parent, each with an mdev_type link (lab.mdevs reads these)
    parent = tmp_path / 'devices' / '0000:00:05.0'
    (parent / 'types' / 'nvidia-223').mkdir(parents=True)
    (parent / 'u1').mkdir()
    (parent / 'u1' / 'mdev_type').symlink_to(parent / 'types' / 'nvidia-223')
    bus = tmp_path / 'bus'
    bus.mkdir()
    (bus / 'u1').symlink_to(parent / 'u1')
    (bus / 'gone').symlink_to(parent / 'gone')     # dangling: left out
    (parent / 'u1' / 'state').write_text('0x11\n')

    state = str(parent / 'u1' / 'state')
    r = vm_init.fs_request({'op': 'read', 'path': state})
    assert (r['rc'], r['stdout']) == (0, '0x11\n')
    globs = [str(bus / '*'), str(bus / '*/mdev_type')]
    r = vm_init.fs_request({'op': 'links', 'globs': globs})
    assert r['rc'] == 0
    assert json.loads(r['stdout']) == {
        str(bus / 'u1'): str(parent / 'u1'),
        str(bus / 'u1' / 'mdev_type'): str(parent / 'types' / 'nvidia-223')}
    missing = vm_init.fs_request({'op': 'read', 'path': str(tmp_path / 'x')})
    assert missing['rc'] == 1 and 'No such file' in missing['stderr']
    assert vm_init.fs_request({'op': 'write'})['rc'] == 2


def test_a_kernel_that_dies_at_boot_is_said_with_its_first_oops(tmp_path):
    # qemu exits at a panic (-no-reboot): the boot says the kernel's own
    # first words on it (vm.TestVm._oops), not a timeout minutes later
    from tests.kernel import vm
    machine = vm.TestVm.__new__(vm.TestVm)
    machine.workdir = str(tmp_path)
    machine.boots = 2
    (tmp_path / 'console-2.log').write_text(
        '[    1.2] Freeing initrd memory\n'
        '[    1.245784] Oops: int3: 0000 [#1] PREEMPT SMP NOPTI\n'
        '[    1.248543] Oops: int3: 0000 [#2] PREEMPT SMP NOPTI\n'
        '[    1.249379] Kernel panic - not syncing: Fatal exception\n')
    assert machine._oops() == (
        ': [    1.245784] Oops: int3: 0000 [#1] PREEMPT SMP NOPTI')
    (tmp_path / 'console-2.log').write_text('[ 1.0] Run /init\n')
    assert machine._oops() == ''
    machine.boots = 3                               # no console yet
    assert machine._oops() == ''


def test_a_boot_that_dies_of_int3_is_booted_once_more(monkeypatch):
    # multi-threaded TCG's stale translation of int3-patched code: one
    # more boot, said in ``retried``; any other death, or a second int3,
    # is raised
    from tests.kernel import vm
    machine = vm.TestVm.__new__(vm.TestVm)
    machine.retried = []
    int3 = vm.VmError('qemu exited with 0 before the test VM came up: '
                      '[ 1.2] Oops: int3: 0000 [#1]; see console-1.log')
    answers = [int3, 12.5]

    def once(timeout):
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer
    monkeypatch.setattr(machine, '_boot_once', once)
    assert machine.boot() == 12.5
    assert machine.retried == [str(int3)]
    answers[:] = [int3, int3]
    with pytest.raises(vm.VmError, match='Oops: int3'):
        machine.boot()
    other = vm.VmError('the test VM did not come up within 300 s')
    answers[:] = [other, 1.0]
    with pytest.raises(vm.VmError, match='within 300 s'):
        machine.boot()
    assert answers == [1.0]
