"""The simulated T4 host without vGPUs that reconcile runs on (``A`` and
``B``, ``nvidia-223``), libvirt's domains in ``fake_libvirt`` and the
real lease store (``World``; the ``world`` fixture), and a restore of it
with Cyborg given ``A`` (``_restore``).  A test module takes the fixture
by name::

    world = reconcile_world.world
"""

import time

import pytest

from libvirt_gpu import environment
from libvirt_gpu import objects
from libvirt_gpu.devices import routes
from libvirt_gpu.guests import reconcile
from libvirt_gpu.store import state
from libvirt_gpu.virt import host as host_mod
from tests.doubles import fake_libvirt
from tests.doubles import kernel_sysfs
from tests.doubles import trees
from tests.doubles import t4_hook as th

A, B = (objects.PciAddress.parse(a) for a in (th.A, th.B))
DOM = th.DOM
DOM2 = objects.Uuid.parse('d2000000-0000-4000-8000-000000000002')
TYPE = objects.TypeId.parse('nvidia-223')
GONE_PID = 2 ** 22 + 7               # above pid_max's default
CYBORG_A = routes.Routes(owners={A: routes.CYBORG})


class World(object):
    """The host, its domains and its leases."""

    def __init__(self, root, profile, tmp_path):
        self.sysfs = kernel_sysfs.KernelSysfs(root, profile)
        self.state_dir = str(tmp_path / 'state')
        self.mdevctl_dir = str(tmp_path / 'mdevctl.d')
        self.conn = fake_libvirt.FakeConnection(tmp_path / 'doms')
        self.store = state.LeaseStore(self.state_dir)

    def env(self, remove_timeout=5.0):
        return environment.Environment(
            self.state_dir, sysfs=self.sysfs,
            host=host_mod.Host.from_connection(self.conn),
            mdevctl_dir=self.mdevctl_dir, remove_timeout=remove_timeout)

    def reconcile(self, dry_run=False, covered=(A, B), **kwargs):
        env = self.env(kwargs.pop('remove_timeout', 5.0))
        return reconcile.reconcile(env, dry_run=dry_run, covered=covered,
                                   **kwargs)

    def mdev(self, parent=A, uuid=None):
        uuid = uuid or th.new_uuid()
        self.sysfs.kernel.create(parent, TYPE, uuid)
        return uuid

    def mdevs(self):
        return set(self.sysfs.kernel.mdevs())

    def lease(self, uuid, domain=DOM, parent=A, lease_state=state.CREATED,
              pid=GONE_PID, updated_at=None, expires_at=None):
        """A lease as a crashed (``GONE_PID``) or other process left it."""
        with self.store.transaction() as txn:
            txn.add(uuid, domain, parent, TYPE, lease_state)
            txn._db.execute(
                'UPDATE leases SET pid = ?, pid_start = NULL, updated_at = '
                '?, expires_at = ? WHERE mdev_uuid = ?',
                (pid, time.time() - 10 if updated_at is None
                 else updated_at, expires_at, uuid))

    def leases(self):
        # a store of its own: a removal's thread reads them too
        return {lease.vgpu_uuid: lease
                for lease in state.LeaseStore(self.state_dir).leases()}

    def domain(self, uuids, dom=DOM, active=True, persistent=True,
               name=None):
        return self.conn.define(th.domain_xml(
            [(u, TYPE, None) for u in uuids], uuid=dom,
            name=name or 'vm-%s' % dom[:8]).decode(), active=active,
            persistent=persistent)


@pytest.fixture
def world(tmp_path):
    with trees.simulated_tree('t4', without_mdevs=True) as (root, profile):
        yield World(root, profile, tmp_path)


def _restore(world, owners=CYBORG_A, **kwargs):
    from libvirt_gpu.host import restore
    return restore.Restore(world.env().replace(routes=owners), **kwargs)
