"""A temporary directory no other user can steer, for the tests and the
benchmarks alike (``tests/conftest.py``, ``bench/*.py``).

A state directory must sit below directories only root (or its user) can
write (``statedir.check_dir``), and /tmp, writable by anyone, is refused
as a state directory's parent: so every temporary file of a test or a
benchmark, and of the processes they start, goes under ``.cache/tmp`` of
the checkout, or, where that is not private (a clone under /tmp, or in a
group-writable directory), under a directory of this user's own home
named after the checkout.
"""

import os
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def private_tmp(root=ROOT):
    """``.cache/tmp`` of the checkout ``root`` when every directory above
    it is one only root (or this user) can write; else a directory of
    this user's own home, named after the checkout (StateError when even
    that is not private, saying why)."""
    from libvirt_gpu import exception
    from libvirt_gpu.store import statedir
    path = os.path.join(root, '.cache', 'tmp')
    os.makedirs(path, mode=0o700, exist_ok=True)
    try:
        statedir.check_dir(path)
        return path
    except exception.StateError:
        pass
    import hashlib
    name = hashlib.sha256(root.encode()).hexdigest()[:12]
    path = os.path.join(os.path.expanduser('~'), '.cache',
                        'libvirt-gpu-tests', name)
    os.makedirs(path, mode=0o700, exist_ok=True)
    statedir.check_dir(path)        # the home too: say so, plainly
    return path


def use_private_tmp(root=ROOT):
    """Point ``TMPDIR`` (this process's ``tempfile`` and the processes it
    starts) at ``private_tmp(root)``; returns the path."""
    path = private_tmp(root)
    os.environ['TMPDIR'] = path
    tempfile.tempdir = None         # gettempdir() looks again
    return path
