"""tests/tools/on_tmpfs.py: the tests' temporary directory on a tmpfs in a
mount namespace of the command's own, or on the disk, saying why."""

import json
import os
import subprocess
import sys

import pytest

from tests import private_tmp
from tests.tools import on_tmpfs

TOOL = on_tmpfs.__file__
# What the command run sees: the file system of the private temporary
# directory, the mark, its mount namespace; it leaves a file there and
# exits 3.
PROBE = r'''
import json, os, sys
path = sys.argv[1]
fstype = None
with open('/proc/self/mountinfo') as f:
    for line in f:
        fields = line.split()
        if fields[4] == path:
            fstype = fields[fields.index('-') + 1]    # the last one wins
open(os.path.join(path, 'left-by-the-command'), 'w').close()
print(json.dumps({'fstype': fstype, 'mark': os.environ.get('%s'),
                  'ns': os.readlink('/proc/self/ns/mnt')}))
sys.exit(3)
''' % on_tmpfs.MARK


def run(env_changes, *extra):
    env = dict(os.environ)
    env.pop(on_tmpfs.MARK, None)
    env.update(env_changes)
    path = private_tmp.private_tmp()
    done = subprocess.run(
        [sys.executable, TOOL] + list(extra)
        + ['--', sys.executable, '-c', PROBE, path],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        timeout=60)
    left = os.path.join(path, 'left-by-the-command')
    seen_after = os.path.exists(left)
    if seen_after:
        os.unlink(left)
    return done, json.loads(done.stdout), seen_after


def mounts():
    with open('/proc/self/mountinfo') as f:
        return f.read()


def test_the_command_gets_a_tmpfs_of_its_own_and_nothing_outlives_it():
    before = mounts()
    done, seen, left = run({})
    path = private_tmp.private_tmp()
    assert done.returncode == 3                 # the command's own status
    if os.geteuid() != 0:
        assert seen['mark'] == ''
        assert done.stderr == ('on_tmpfs: the tests\' temporary files stay '
                               'on the disk in %s (not root)\n' % path)
        return
    assert done.stderr == ''
    assert seen == {'fstype': 'tmpfs', 'mark': path,
                    'ns': seen['ns']}
    assert seen['ns'] != os.readlink('/proc/self/ns/mnt')
    assert mounts() == before                   # nothing left mounted here
    assert not left                             # nor written here


def test_the_size_is_the_tmpfs_s_own():
    if os.geteuid() != 0:
        pytest.skip('a tmpfs takes root: the test above checks the '
                    'fallback')
    probe = ('import os, sys; s = os.statvfs(sys.argv[1]); '
             'print(s.f_blocks * s.f_frsize)')
    path = private_tmp.private_tmp()
    env = dict(os.environ)
    env.pop(on_tmpfs.MARK, None)
    done = subprocess.run(
        [sys.executable, TOOL, '--size', '3m', '--', sys.executable, '-c',
         probe, path], env=env, stdout=subprocess.PIPE, text=True,
        timeout=60, check=True)
    assert int(done.stdout) == 3 * 1024 * 1024


def test_a_nested_call_runs_the_command_as_it_is():
    done, seen, left = run({on_tmpfs.MARK: '/somewhere'})
    assert done.returncode == 3
    assert done.stderr == ''
    assert seen['mark'] == '/somewhere'
    assert seen['ns'] == os.readlink('/proc/self/ns/mnt')
    assert left                                 # the same directory


def test_a_refused_unshare_runs_the_command_on_the_disk(tmp_path):
    fake = tmp_path / 'bin' / 'unshare'
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\necho "unshare: unshare failed: Operation '
                    'not permitted" >&2\nexit 1\n')
    fake.chmod(0o755)
    done, seen, left = run({'PATH': str(fake.parent)})
    path = private_tmp.private_tmp()
    assert done.returncode == 3
    assert seen['mark'] == ''
    assert seen['ns'] == os.readlink('/proc/self/ns/mnt')
    assert left
    reason = ('unshare --mount is refused: unshare: unshare failed: '
              'Operation not permitted' if os.geteuid() == 0 else 'not root')
    assert done.stderr == ('on_tmpfs: the tests\' temporary files stay on '
                           'the disk in %s (%s)\n' % (path, reason))


def test_a_refused_mount_runs_the_command_on_the_disk(tmp_path):
    fake = tmp_path / 'bin' / 'mount'
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\necho "mount: permission denied" >&2\n'
                    'exit 32\n')
    fake.chmod(0o755)
    path = private_tmp.private_tmp()
    done, seen, left = run({'PATH': str(fake.parent)}, '--inside', path)
    assert done.returncode == 3
    assert seen['mark'] == ''
    assert left
    assert done.stderr == ('on_tmpfs: the tests\' temporary files stay on '
                           'the disk in %s: the mount was refused: mount: '
                           'permission denied\n' % path)


def test_why_not_names_each_missing_part(monkeypatch, tmp_path):
    monkeypatch.setattr(os, 'geteuid', lambda: 1000)
    assert on_tmpfs.why_not('/usr/bin/unshare') == 'not root'
    monkeypatch.setattr(os, 'geteuid', lambda: 0)
    assert on_tmpfs.why_not(None) == 'no unshare command (util-linux)'
    silent = tmp_path / 'unshare'
    silent.write_text('#!/bin/sh\nexit 7\n')
    silent.chmod(0o755)
    assert on_tmpfs.why_not(str(silent)) == (
        'unshare --mount is refused: exit 7')
