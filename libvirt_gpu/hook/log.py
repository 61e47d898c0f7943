"""The hook's log: what the operator reads (stderr, ``hook.log``)."""

import os
import time

LOG_NAME = 'hook.log'
LOG_MAX_BYTES = 1024 * 1024


class HookLog(object):
    """Lines for the operator: errors to stderr (libvirt shows them when a
    start is refused), everything to ``<state_dir>/hook.log`` once the input
    has been accepted (nothing is written for refused input)."""

    def __init__(self, argv, stderr):
        self.stderr = stderr
        self.head = ' '.join(a.replace('\n', ' ')[:80] for a in argv[1:4])
        self.lines = []
        self.path = None

    def info(self, message):
        self.lines.append(message)

    def error(self, message):
        self.lines.append('ERROR: ' + message)
        print('libvirt-gpu: %s' % message, file=self.stderr)

    def warning(self, message):
        self.lines.append('WARNING: ' + message)
        print('libvirt-gpu: warning: %s' % message, file=self.stderr)

    def flush(self):
        if self.path is None or not self.lines:
            return
        now = time.time()
        stamp = '%s.%03d' % (time.strftime('%Y-%m-%dT%H:%M:%S',
                                           time.localtime(now)),
                             int(now * 1000) % 1000)
        text = ''.join('%s [%d] %s: %s\n'
                       % (stamp, os.getpid(), self.head, line)
                       for line in self.lines)
        self.lines = []
        try:
            try:
                if os.path.getsize(self.path) > LOG_MAX_BYTES:
                    os.replace(self.path, self.path + '.1')
            except FileNotFoundError:
                pass
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT
                         | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, text.encode('utf-8', 'replace'))
            finally:
                os.close(fd)
        except OSError as e:
            print('libvirt-gpu: warning: cannot write %s: %s'
                  % (self.path, e.strerror), file=self.stderr)
