"""Some NVIDIA drivers remove a guest's mdev themselves when qemu exits:
``release`` (the hook) and the backend's ``remove`` treat "already gone" as
done - no error, lease freed - on a simulated T4 host whose kernel is
emulated (tests/doubles/kernel_sysfs.py).  The API's live detach is tested
in tests/functional/test_attach_api.py."""

import pytest

from libvirt_gpu.devices.backends import mdev
from libvirt_gpu import exception
from tests.doubles import t4_hook as th


def test_release_after_the_driver_removed_the_mdev(env):
    uuid = th.new_uuid()
    xml = th.domain_xml([(uuid, 'nvidia-223', None)])
    assert env.run('prepare', xml) == (0, '')
    assert uuid in env.mdevs() and len(env.leases()) == 1
    env.sysfs.kernel.remove(uuid)           # qemu exited: the driver's own
    assert uuid not in env.mdevs()
    assert env.run('release', xml) == (0, '')
    assert env.leases() == []               # the lease is freed
    assert 'already gone: vGPU %s' % uuid in env.log()
    # and its instance is free again for the next guest
    assert env.run('prepare', th.domain_xml(
        [(th.new_uuid(), 'nvidia-223', None)], uuid=th.new_uuid())) == (0, '')


class _LibvirtAfterDriver(object):
    """libvirt's half of a remove racing the driver's own cleanup: the
    driver removes the mdev first, then libvirt's stop fails (mdevctl
    finds nothing to stop).  ``driver_first`` False: libvirt fails while
    the mdev is still there."""

    def __init__(self, kernel, driver_first=True):
        self.kernel = kernel
        self.driver_first = driver_first

    def destroy_mdev(self, uuid):
        if self.driver_first:
            self.kernel.remove(uuid)
        raise exception.LibvirtError(
            reason='removing an mdev through libvirt: Unable to stop '
                   'mediated device')


def test_backend_remove_when_the_driver_was_first(env):
    backend = mdev.MdevBackend(env.sysfs,
                               host=_LibvirtAfterDriver(env.sysfs.kernel))
    assert th.EXISTING in env.mdevs()
    assert backend.remove(th.EXISTING) is False       # gone, not by us
    assert th.EXISTING not in env.mdevs()


def test_backend_remove_failing_while_the_mdev_is_there_is_an_error(env):
    backend = mdev.MdevBackend(env.sysfs, host=_LibvirtAfterDriver(
        env.sysfs.kernel, driver_first=False))
    with pytest.raises(exception.MdevRemoveFailed, match='Unable to stop'):
        backend.remove(th.EXISTING)
    assert th.EXISTING in env.mdevs()
