"""What the hook's log promises that the hook tests left open: each test
here fails on a change ``make mutation`` made to guests/hook/log.py that
the rest stayed green on (docs/dev/mutation.md): the line and size
bounds, the whole lines an operator reads, and where a call is counted."""

import io
import os
import re

import pytest

from libvirt_gpu import exception
from libvirt_gpu.guests.hook import log as hook_log
from libvirt_gpu.guests.hook import log as log_mod

ARGV = ['qemu', 'vm\x1b1', 'prepare', 'begin', '-']
LINE = re.compile(r'^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3} \[%d\] (.*)$'
                  % os.getpid())


def _log(tmp_path=None, argv=ARGV):
    log = hook_log.HookLog(argv, io.StringIO())
    if tmp_path is not None:
        log.path = str(tmp_path / hook_log.LOG_NAME)
    return log


def _written(log):
    with open(log.path) as f:
        lines = f.read().splitlines()
    found = []
    for line in lines:
        match = LINE.match(line)
        assert match, line
        found.append(match.group(1))
    return found


def test_each_kind_of_line_in_the_log_and_on_stderr(tmp_path):
    log = _log(tmp_path)
    log.info('started')
    log.warning('slow\x07')
    log.error('refused')
    assert log.errors == 1
    assert log.stderr.getvalue() == ('libvirt-gpu: warning: slow\\x07\n'
                                     'libvirt-gpu: refused\n')
    log.flush()
    assert _written(log) == ['vm\\x1b1 prepare begin: started',
                             'vm\\x1b1 prepare begin: WARNING: slow\\x07',
                             'vm\\x1b1 prepare begin: ERROR: refused']
    assert log.lines == []


def test_the_head_is_three_arguments_each_cut_to_80(tmp_path):
    log = _log(tmp_path, ['qemu', 'n' * 100, 'migrate\n', 'begin', 'x'])
    log.info('a')
    log.flush()
    assert _written(log) == ['%s migrate\\n begin: a' % ('n' * 80)]


def test_a_line_is_cut_to_its_maximum(tmp_path):
    log = _log(tmp_path)
    log.error('e' * 3000 + '\n')
    assert log.stderr.getvalue() == 'libvirt-gpu: %s\n' % (
        'e' * (hook_log.LOG_LINE_MAX - len('libvirt-gpu: ')))
    log.info('i' * (hook_log.LOG_LINE_MAX - 1) + '\nj')
    log.flush()
    assert _written(log) == [
        'vm\\x1b1 prepare begin: ERROR: ' + 'e' * (hook_log.LOG_LINE_MAX - 7),
        'vm\\x1b1 prepare begin: ' + 'i' * (hook_log.LOG_LINE_MAX - 1) + '\\n']


def test_exactly_the_maximum_of_lines_then_a_count(tmp_path):
    log = _log(tmp_path)
    for n in range(hook_log.LOG_MAX_LINES - 1):
        log.info('line %d' % n)
    log.warning('last kept')
    log.info('dropped')
    log.error('dropped error')
    log.warning('dropped warning')
    assert log.errors == 1
    assert log.stderr.getvalue() == 'libvirt-gpu: warning: last kept\n'
    log.flush()
    lines = _written(log)
    assert len(lines) == hook_log.LOG_MAX_LINES + 1
    assert lines[-2:] == ['vm\\x1b1 prepare begin: WARNING: last kept',
                          'vm\\x1b1 prepare begin: ... and 3 more line(s) not '
                          'logged']
    assert log.stderr.getvalue().splitlines()[-1] == (
        'libvirt-gpu: ... and 2 more line(s) not shown')
    # counted once: the next flush has nothing more to say
    log.flush()
    assert len(_written(log)) == hook_log.LOG_MAX_LINES + 1
    assert len(log.stderr.getvalue().splitlines()) == 2


def test_dropped_info_lines_are_not_said_on_stderr(tmp_path):
    log = _log(tmp_path)
    for n in range(hook_log.LOG_MAX_LINES + 5):
        log.info('line %d' % n)
    log.flush()
    assert log.stderr.getvalue() == ''
    assert _written(log)[-1] == ('vm\\x1b1 prepare begin: ... and 5 more '
                                 'line(s) not logged')


def test_without_a_path_nothing_is_written_and_the_lines_wait():
    log = _log()
    log.info('kept')
    log.flush()
    assert log.lines == ['kept']


def test_nothing_to_log_writes_no_file(tmp_path):
    log = _log(tmp_path)
    log.flush()
    assert not os.path.exists(log.path)


def _one_line_bytes(tmp_path):
    probe = _log(tmp_path / 'probe')
    os.mkdir(tmp_path / 'probe', 0o700)
    probe.info('x')
    probe.flush()
    return os.path.getsize(probe.path)


@pytest.mark.parametrize('over,rotated', [(0, False), (1, True)])
def test_the_log_is_rotated_past_its_size(tmp_path, over, rotated):
    size = _one_line_bytes(tmp_path)
    log = _log(tmp_path)
    fd = os.open(log.path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b'o' * (hook_log.LOG_MAX_BYTES - size + over))
    os.close(fd)
    log.info('x')
    log.flush()
    assert os.path.exists(log.path + '.1') is rotated
    if rotated:
        assert os.path.getsize(log.path) == size
        assert os.path.getsize(log.path + '.1') == \
            hook_log.LOG_MAX_BYTES - size + 1
    else:
        assert os.path.getsize(log.path) == hook_log.LOG_MAX_BYTES


def test_a_log_that_cannot_be_written_costs_a_warning(tmp_path):
    log = _log()
    log.path = str(tmp_path / 'missing' / hook_log.LOG_NAME)
    log.info('x')
    log.flush()
    assert log.stderr.getvalue() == (
        'libvirt-gpu: warning: cannot write %s: No such file or directory\n'
        % log.path)


def test_a_log_that_is_not_a_private_file_costs_a_warning(tmp_path):
    log = _log(tmp_path)
    os.mkfifo(log.path, 0o600)
    log.info('x')
    log.flush()
    warning = log.stderr.getvalue()
    assert warning.startswith('libvirt-gpu: warning: ')
    assert warning.count('\n') == 1 and log.path in warning


class Timer(object):
    def __init__(self, error=None):
        self.error = error
        self.calls = []

    def done(self, state_dir, outcome):
        self.calls.append((state_dir, outcome))
        if self.error is not None:
            raise self.error


def test_record_counts_the_call_in_the_log_s_directory(tmp_path):
    timer = Timer()
    log = _log(tmp_path)
    log.record(timer, 'refused')
    assert timer.calls == [(str(tmp_path), 'refused')]
    assert log.lines == [] and log.stderr.getvalue() == ''


def test_record_before_the_settings_named_the_log_counts_nothing():
    timer = Timer()
    _log().record(timer, 'ok')
    assert timer.calls == []


@pytest.mark.parametrize('error,text', [
    (OSError(13, 'Permission denied'),
     "cannot record the hook's figures in %s: Permission denied"),
    (exception.StateError(reason='planted'),
     "cannot record the hook's figures: "),
])
def test_record_failing_costs_a_warning(tmp_path, error, text):
    log = _log(tmp_path)
    log.record(Timer(error), 'ok')
    expected = text % str(tmp_path) if '%s' in text else text + str(error)
    assert log.lines == ['WARNING: ' + expected]
    assert log.stderr.getvalue() == 'libvirt-gpu: warning: %s\n' % expected
    assert log.errors == 0


# --- What ``make mutation`` found open (docs/dev/mutation.md) ---
# Behaviours a random sample of ``make mutation`` over the round's modules
# found unguarded, in modules whose own tests run the program as another
# process (which never runs a mutant): each pinned here in the test's own
# process.

# --- guests.hook.log ---------------------------------------------------------

def test_the_log_head_is_the_domain_the_operation_and_its_phase():
    hook = log_mod.HookLog(['/etc/libvirt/hooks/qemu', 'guest-1', 'prepare',
                            'begin', '-', 'extra'], io.StringIO())
    assert hook.head == 'guest-1 prepare begin'
    hook = log_mod.HookLog(['qemu', 'g' * 100, 'release'], io.StringIO())
    assert hook.head == 'g' * 80 + ' release'
