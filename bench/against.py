"""``--against REF``: the package of another commit, for a before/after in
one run (imported by the scripts in this directory, which Python puts
first on ``sys.path``).

``tree(ref)`` writes the tree of commit ``ref`` of this checkout (``git
archive``: no worktree registered, nothing of this checkout touched) into
a temporary directory under the tests' private one, and removes it after:
a script then times the package there as it times one given by
``--before DIR``.  A fresh clone has every commit it needs; a shallow one
may lack ``ref``, and says so."""

import contextlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests import private_tmp  # noqa: E402


class NoSuchCommit(SystemExit):
    """``ref`` names no commit of this checkout (one line, exit status
    1)."""


def add_option(parser):
    """``--against REF`` beside ``--before DIR`` (one or the other)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument('--before', metavar='DIR',
                       help='also time the libvirt_gpu package in DIR (an '
                       'older checkout)')
    group.add_argument('--against', metavar='REF',
                       help='also time the package of commit REF of this '
                       'checkout (e.g. HEAD~1), written apart by git '
                       'archive')


def resolve(ref):
    """The full hash of commit ``ref`` of this checkout."""
    done = subprocess.run(['git', '-C', ROOT, 'rev-parse', '--verify',
                           '--quiet', '%s^{commit}' % ref],
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                          text=True)
    if done.returncode != 0:
        raise NoSuchCommit('--against %s: no such commit in %s (a shallow '
                           'clone may lack it: git fetch --unshallow)'
                           % (ref, ROOT))
    return done.stdout.strip()


@contextlib.contextmanager
def tree(ref):
    """``(directory, label)``: commit ``ref``'s tree, written for the
    time of the block, and how to name it in a report."""
    commit = resolve(ref)
    archive = subprocess.run(['git', '-C', ROOT, 'archive', '--format=tar',
                              commit], stdout=subprocess.PIPE, check=True)
    # state directories under /tmp are refused: see tests/private_tmp.py
    private_tmp.use_private_tmp()
    where = tempfile.mkdtemp(prefix='bench-against-')
    try:
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            if hasattr(tarfile, 'data_filter'):     # Python 3.8.17+
                tar.extractall(where, filter='data')
            else:
                tar.extractall(where)
        yield where, ('commit %s' % ref if commit.startswith(ref)
                      else 'commit %s (%s)' % (ref, commit[:7]))
    finally:
        shutil.rmtree(where, ignore_errors=True)


@contextlib.contextmanager
def before_tree(args):
    """``(directory, label)`` of what ``--before`` or ``--against`` names,
    or ``(None, None)`` without either."""
    if getattr(args, 'against', None):
        with tree(args.against) as found:
            yield found
    elif args.before:
        yield os.path.abspath(args.before), 'package in %s' % args.before
    else:
        yield None, None
