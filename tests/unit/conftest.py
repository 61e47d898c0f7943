"""The unit tests' shared fixtures: the temporary trees and the simulated
hosts more than one test file runs on.  A file that needs a host of its
own defines a fixture of the same name, which wins in that file."""

import shutil
import tempfile

import pytest

from tests.doubles import t4_hook
from tests.doubles import trees


@pytest.fixture
def fast_tmp():
    """A fresh directory of its own under the tests' private temporary
    directory (tests/private_tmp.py), removed after the test: where a
    simulated host keeps its tree and its state directory (not /dev/shm
    nor /tmp: a state directory below a directory anyone can write is
    refused, ``statedir.check_dir``)."""
    path = tempfile.mkdtemp(prefix='lgpu-')
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def env(tmp_path):
    """The simulated T4 host of the hook tests (``t4_hook.Env``): 8
    ``nvidia-223`` free on 0000:3b:00.0, 6 on 0000:af:00.0 beside two
    taken."""
    with trees.simulated_tree('t4') as (root, profile):
        yield t4_hook.Env(root, profile, tmp_path)


@pytest.fixture
def host(env):
    """``env`` under the name the exporter's tests give the host they
    scrape."""
    return env
