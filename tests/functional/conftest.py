"""Fixtures for tests that need a real libvirtd (see libvirtd.py).

``libvirtd_factory(**kwargs)`` starts a ``LibvirtDaemon`` (same keyword
arguments: hooks, binds, env, ...) and closes it after the test, whatever
happens. ``libvirtd`` is a started daemon without hooks. Both skip the test,
saying exactly what is missing, on a host that cannot run one (not root,
libvirtd or qemu not installed).
"""

import pytest

from tests.functional import libvirtd as _libvirtd
from tests.functional import live_sysfs as _live


@pytest.fixture(scope='session')
def libvirtd_requirements():
    missing = _libvirtd.missing_requirements()
    if missing:
        pytest.skip('real libvirtd not available: ' + '; '.join(missing))


@pytest.fixture
def libvirtd_factory(libvirtd_requirements):
    daemons = []

    def make(**kwargs):
        daemon = _libvirtd.LibvirtDaemon(**kwargs)
        daemons.append(daemon)
        return daemon.start()

    try:
        yield make
    finally:
        for daemon in daemons:
            daemon.close()


@pytest.fixture
def libvirtd(libvirtd_factory):
    return libvirtd_factory()


@pytest.fixture(scope='module', autouse=True)
def nothing_left_behind():
    """After every module: no live tree of ours mounted, no live-tree
    server running (trivially true for modules that start none)."""
    yield
    assert _live.wait_for(lambda: _live.leftovers() == ([], []), 10), \
        _live.leftovers()
