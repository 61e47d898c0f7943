"""Run a command with the tests' temporary directory on a tmpfs of its own.

    python tests/tools/on_tmpfs.py [--size SIZE] -- COMMAND [ARG ...]

The tests write their simulated hosts as real trees of files, directories
and links (thousands per test file) under their private temporary
directory (``tests/private_tmp.py``: ``.cache/tmp`` of the checkout).  On a
virtual machine's disk a file made costs from 0.1 to 3 ms, and the cost
varies from minute to minute; on a tmpfs it is some 25 us.  The directory
stays where it is, so that it stays private (a state directory below
/dev/shm or /tmp, which anyone can write, is refused): a tmpfs is mounted
on it, in a mount namespace of the command's own (``unshare --mount``), so
that no other process sees it and nothing is left mounted when the command
ends, whatever way it ends.  The tmpfs starts empty: nothing a run leaves
there outlives it.

That takes root (``CAP_SYS_ADMIN``).  Without it, or where ``unshare`` or
the mount is refused, the command runs as it would without this tool, on
the disk, after one line on stderr saying why.  The exit status is the
command's.
"""

import argparse
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from tests import private_tmp  # noqa: E402

# Set in the command's environment to the tmpfs's path: a nested call
# (``make unit`` inside ``make test``) runs its command as it is.
MARK = 'LGPU_TESTS_TMPFS'
# The most the tests' files may take of the machine's memory (tmpfs
# counts what is written, not this): a test that leaks files fills it and
# fails with ENOSPC instead of taking the memory the services need.
DEFAULT_SIZE = '25%'


def say(message):
    print('on_tmpfs: %s' % message, file=sys.stderr, flush=True)


def why_not(unshare):
    """None when a mount namespace of our own can be made here; else why
    not, in words."""
    if os.geteuid() != 0:
        return 'not root'
    if unshare is None:
        return 'no unshare command (util-linux)'
    probe = subprocess.run([unshare, '--mount', '--propagation', 'private',
                            'true'],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           text=True)
    if probe.returncode != 0:
        return ('unshare --mount is refused: %s'
                % (probe.stderr.strip() or 'exit %d' % probe.returncode))
    return None


def inside(path, size, command):
    """In the new namespace: mount the tmpfs on ``path``, then become
    ``command`` (on the disk after saying why, where the mount fails)."""
    mount = subprocess.run(
        ['mount', '-t', 'tmpfs', '-o', 'mode=0700,size=%s' % size,
         'lgpu-tests', path], stderr=subprocess.PIPE, text=True)
    if mount.returncode == 0:
        os.environ[MARK] = path
    else:
        say('the tests\' temporary files stay on the disk in %s: the '
            'mount was refused: %s' % (path, mount.stderr.strip()))
        os.environ[MARK] = ''
    os.execvp(command[0], command)


def main(argv=None):
    parser = argparse.ArgumentParser(
        usage='%(prog)s [--size SIZE] -- COMMAND [ARG ...]',
        description=__doc__.split('\n\n')[2],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--size', default=DEFAULT_SIZE,
                        help='the most the tmpfs holds: tmpfs(5) size= '
                        '(default %(default)s of the memory)')
    parser.add_argument('--inside', metavar='PATH', help=argparse.SUPPRESS)
    parser.add_argument('command', nargs='+', help='the command to run')
    args = parser.parse_args(argv)
    if args.inside is not None:
        inside(args.inside, args.size, args.command)
    if MARK in os.environ:
        os.execvp(args.command[0], args.command)
    path = private_tmp.private_tmp()
    unshare = shutil.which('unshare')
    reason = why_not(unshare)
    if reason is not None:
        say('the tests\' temporary files stay on the disk in %s (%s)'
            % (path, reason))
        os.environ[MARK] = ''
        os.execvp(args.command[0], args.command)
    os.execv(unshare, [unshare, '--mount', '--propagation', 'private', '--',
                       sys.executable, os.path.abspath(__file__),
                       '--size', args.size, '--inside', path, '--']
             + args.command)


if __name__ == '__main__':
    main()
