"""Files written whole or not at all.

``write_atomic`` writes a temporary file in the target's directory (or in
``tmp_dir``), flushes it to disk, sets its mode (and root ownership when
asked), then renames it over the target: a reader or a crash sees the old
file or the new one, never half of one.  On any failure the temporary file
is removed and the target is left as it was.
"""

import os


def write_atomic(path, text, mode=0o600, tmp_dir=None, root_owned=False):
    """Replace ``path`` with ``text`` (str) atomically.

    :param mode: the new file's permission bits.
    :param tmp_dir: where the temporary file is made (same file system as
        ``path``); default: ``path``'s directory.  A directory that a
        program scans (libvirt's ``qemu.d``) must not see it.
    :param root_owned: chown the file to root:root when running as root.
    """
    directory = tmp_dir or os.path.dirname(path) or '.'
    tmp = os.path.join(directory, '.%s.%d.tmp' % (os.path.basename(path),
                                                  os.getpid()))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC,
                 0o600)
    try:
        with os.fdopen(fd, 'w') as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if root_owned and os.geteuid() == 0:
            os.chown(tmp, 0, 0)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
