"""The hook's log: what the operator reads (stderr, ``hook.log``)."""

from __future__ import annotations

import os
import time

from libvirt_gpu import exception
from libvirt_gpu.store import statedir
from libvirt_gpu.util import textutil

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import TextIO

    from libvirt_gpu.store import figures

LOG_NAME = 'hook.log'
LOG_MAX_BYTES = 1024 * 1024
# One call logs at most this many lines, each cut to LOG_LINE_MAX
# characters; what is left over is counted in one last line.  A guest
# with 10,000 vGPU entries must not push hook.log past its cap.
LOG_MAX_LINES = 100
LOG_LINE_MAX = 2000


class HookLog(object):
    """Lines for the operator: errors to stderr (libvirt shows them when a
    start is refused), everything to ``<state_dir>/hook.log`` once the input
    has been accepted (nothing is written for refused input)."""

    def __init__(self, argv: Sequence[str], stderr: TextIO) -> None:
        self.stderr = stderr
        # argv[1] is the domain's name, which its owner chose: escaped
        # like every line (an ESC, BEL, CR or U+202E never reaches the
        # log or a terminal raw)
        self.head = ' '.join(textutil.escape(str(a)[:80], newline=True)
                             for a in argv[1:4])
        self.lines: list[str] = []
        self.dropped = 0
        self.unshown = 0        # of those, errors and warnings (stderr)
        self.path: str | None = None
        self.errors = 0

    def _keep(self, line: str, printed: str | None = None) -> None:
        """Keep ``line`` (and print ``printed`` to stderr) unless this call
        has logged LOG_MAX_LINES already; then only count it."""
        if len(self.lines) >= LOG_MAX_LINES:
            self.dropped += 1
            if printed is not None:
                self.unshown += 1
            return
        # names from sysfs or the domain XML may hold escape sequences:
        # the log and libvirt's error message show them as text
        self.lines.append(textutil.escape(line[:LOG_LINE_MAX], newline=True))
        if printed is not None:
            print(textutil.escape(printed[:LOG_LINE_MAX]), file=self.stderr)

    def info(self, message: str) -> None:
        self._keep(message)

    def error(self, message: str) -> None:
        self.errors += 1
        self._keep('ERROR: ' + message, 'libvirt-gpu: %s' % message)

    def warning(self, message: str) -> None:
        self._keep('WARNING: ' + message,
                   'libvirt-gpu: warning: %s' % message)

    def record(self, timer: figures.HookTimer, outcome: str) -> None:
        """Count this call (``figures.HookTimer``) for ``libvirt-gpu
        exporter`` in the state directory, the one of ``hook.log``; nothing
        before the settings named it (``path`` unset).  A directory that
        cannot be written costs a warning, never the call."""
        if self.path is None:
            return
        state_dir = os.path.dirname(self.path)
        try:
            timer.done(state_dir, outcome)
        except OSError as e:
            self.warning('cannot record the hook\'s figures in %s: %s'
                         % (state_dir, e.strerror))
        except exception.StateError as e:
            self.warning('cannot record the hook\'s figures: %s' % e)

    def flush(self) -> None:
        if self.dropped:
            self.lines.append('... and %d more line(s) not logged'
                              % self.dropped)
            self.dropped = 0
        if self.unshown:
            # only errors and warnings go to stderr: a successful call
            # that logged much still prints nothing there
            print('libvirt-gpu: ... and %d more line(s) not shown'
                  % self.unshown, file=self.stderr)
            self.unshown = 0
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
        data = text.encode('utf-8', 'replace')
        try:
            # Never through a link, never waiting on a FIFO: only a
            # regular file of the directory's owner with one link (a hard
            # link planted here would make root append to a file
            # elsewhere), private (statedir.open_file).
            fd = statedir.open_file(self.path, os.O_WRONLY | os.O_APPEND
                                    | os.O_CREAT)
            if os.fstat(fd).st_size + len(data) > LOG_MAX_BYTES:
                os.close(fd)
                os.replace(self.path, self.path + '.1')
                fd = statedir.open_file(self.path, os.O_WRONLY | os.O_APPEND
                                        | os.O_CREAT)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        except OSError as e:
            print(textutil.escape('libvirt-gpu: warning: cannot write %s: %s'
                                  % (self.path, e.strerror)),
                  file=self.stderr)
        except exception.StateError as e:
            print(textutil.escape('libvirt-gpu: warning: %s' % e),
                  file=self.stderr)
