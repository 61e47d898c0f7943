"""vGPU kinds are plugins: a third kind of the core only, defined here and
registered through an entry point (``registry.GROUP``), is created,
listed, removed and reconciled by the API, the allocator, the hook and
reconcile, none of which changes."""

import io
import json
import os

import pytest

from libvirt_gpu.guests import api
from libvirt_gpu.devices.backends import base
from libvirt_gpu.devices import capabilities
from libvirt_gpu.virt import config_xml
from libvirt_gpu.devices import discovery
from libvirt_gpu import environment
from libvirt_gpu import exception
from libvirt_gpu.guests import hook
from libvirt_gpu.virt import host as host_mod
from libvirt_gpu import objects
from libvirt_gpu.guests import reconcile
from libvirt_gpu import simulator
from libvirt_gpu.simulator import loading
from libvirt_gpu.devices import sysfs as sysfs_mod
from tests.doubles import domains
from tests.doubles import fake_libvirt
from tests.doubles import kinds

TYPE = objects.TypeId.parse('dummy-1')
CAPACITY = 2
SPEC = 'tests.unit.devices.backends.test_registry_vgpu_kinds:DummyKind'


class DummyKind(base.VgpuKind):
    """vGPUs that are lines of a JSON file, made on one GPU (``PARENT``,
    set by the fixture), ``CAPACITY`` of type ``dummy-1`` at most."""

    name = 'dummy'
    PARENT = None

    @classmethod
    def from_parts(cls, parts):
        return cls(os.path.join(parts.state_dir, 'dummy.json'))

    def __init__(self, path):
        self.path = path

    def _read(self):
        if not os.path.exists(self.path):
            return {}
        with open(self.path) as f:
            return json.load(f)

    def _write(self, data):
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with open(self.path, 'w') as f:
            json.dump(data, f)

    def is_parent(self, address):
        return address == self.PARENT

    def owns(self, uuid):
        return uuid in self._read()

    def lookup(self, uuid):
        entry = self._read().get(uuid)
        if entry is None:
            return None
        # the kind's own file: parsed here, where it enters
        return base.VgpuDevice(uuid=uuid, parent=self.PARENT,
                               type_id=objects.TypeId.parse(entry))

    def check_type(self, parent, type_id):
        if not self.is_parent(parent):
            raise exception.ParentGone(address=parent, uuid=None,
                                       reason='not a dummy parent')
        if type_id != TYPE:
            raise exception.UnknownType(type_id=type_id, address=parent)

    def vgpu_type(self, parent, type_id):
        if type_id != TYPE:
            return None
        return objects.VgpuType(id=TYPE, name='Dummy', description=None,
                                device_api='vfio-pci',
                                available_instances=CAPACITY - len(
                                    self._read()))

    def prepare(self, device):
        data = self._read()
        if device.uuid in data:
            return False
        data[device.uuid] = device.type_id
        self._write(data)
        return True

    def remove(self, uuid):
        data = self._read()
        if data.pop(uuid, None) is None:
            return False
        self._write(data)
        return True

    def existing(self, mdevs_by_parent=None):
        return {u: (self.PARENT, t) for u, t in self._read().items()}

    def in_devices(self, devices, uuid, parent):
        # handed to guests as <hostdev type='mdev'>
        return uuid in devices.mdev_uuids

    def hostdev_xml(self, device):
        return config_xml.mdev_hostdev(device.uuid)


@pytest.fixture
def world(tmp_path, monkeypatch):
    """A simulated T4 host (no vGPUs) whose first GPU is the dummy kind's,
    one running guest in a fake libvirt, and the dummy kind registered."""
    root = str(tmp_path / 'sys')
    with open(os.path.join(loading.profile_dir(), 't4.json')) as f:
        data = json.load(f)
    for dev in data['devices']:
        dev.pop('mdevs', None)      # nothing else for reconcile to judge
    simulator.write_sysfs(loading.profile_from_dict(data, 't4-empty'),
                          root)
    sysfs = sysfs_mod.Sysfs(root)
    parent = discovery.from_sysfs(sysfs,
                                  kinds=kinds.registered()).gpus[0].address
    monkeypatch.setattr(DummyKind, 'PARENT', parent)
    # The one registration of a new kind: an entry point
    kinds.register(monkeypatch, tmp_path / 'site', 'dummy', SPEC)
    conn = fake_libvirt.FakeConnection(str(tmp_path / 'doms'))
    conn.define(domains.tiny_domain_xml('vm1'), active=True)
    env = environment.Environment(
        str(tmp_path / 'state'), sysfs=sysfs,
        host=host_mod.Host.from_connection(conn),
        mdevctl_dir=str(tmp_path / 'mdevctl.d'),
        enabled={parent: objects.EnabledType(TYPE)})
    return env, conn, parent


def dummy(env):
    return env.vgpus.kind('dummy')


def test_the_dummy_kind_is_registered(world):
    env, _, parent = world
    assert [k.name for k in env.vgpus.kinds] == ['dummy', 'nvidia', 'mdev']
    assert env.vgpus.kind_of(parent) is dummy(env)
    # the core only
    assert capabilities.declared(DummyKind) == ()
    assert base.VgpuKind.__abstractmethods__ <= set(DummyKind.__dict__)


def test_api_attaches_lists_and_detaches_a_dummy_vgpu(world):
    env, conn, parent = world
    done = api.attach(conn, 'vm1', vgpu_type=TYPE, live=True, env=env)
    assert done.parent == parent
    assert dummy(env).lookup(done.uuid) == base.VgpuDevice(
        uuid=done.uuid, parent=parent, type_id=TYPE)
    assert [(lease.vgpu_uuid, lease.parent) for lease in
            env.store.leases()] == [(done.uuid, parent)]
    got = api.list_devices(conn, 'vm1', env=env)
    assert [(v.uuid, v.exists, v.in_devices, v.parent)
            for v in got.vgpus] == [(done.uuid, True, True, parent)]
    # the allocator counts the kind's capacity
    assert env.allocator.capacity(TYPE) == {parent: CAPACITY - 1}
    api.detach(conn, 'vm1', uuid=done.uuid, live=True, env=env)
    assert dummy(env).existing() == {}
    assert env.store.leases() == []


def test_the_allocator_refuses_beyond_the_kinds_capacity(world):
    env, conn, parent = world
    for _ in range(CAPACITY):
        api.attach(conn, 'vm1', vgpu_type=TYPE, live=True, env=env)
    with pytest.raises(exception.NoCapacity):
        api.attach(conn, 'vm1', vgpu_type=TYPE, live=True, env=env)
    assert len(dummy(env).existing()) == CAPACITY


def test_the_hook_creates_and_removes_dummy_vgpus(world):
    env, _, parent = world
    uuid = objects.Uuid.new()
    xml = ((
        "<domain type='kvm'><name>vm2</name>"
        "<uuid>c7a5fdbd-cdaf-9455-926a-d65c16db1809</uuid><metadata>"
        "<gpu:gpus xmlns:gpu='urn:libvirt-gpu:1'><gpu:vgpu uuid='%s' "
        "type='%s'/></gpu:gpus></metadata><devices>%s</devices></domain>")
        % (uuid, TYPE, config_xml.mdev_hostdev(uuid))).encode()
    log = hook.HookLog(['qemu', 'vm2', 'prepare', 'begin'], io.StringIO())
    operations = hook.Hook(env, log)
    assert operations.prepare(hook.parse_request("prepare", xml)) is None
    assert dummy(env).existing() == {uuid: (parent, TYPE)}
    assert operations.release(hook.parse_request("release", xml)) is None
    assert dummy(env).existing() == {}
    assert env.store.leases() == []


def test_reconcile_removes_a_dummy_vgpu_of_a_stopped_guest(world):
    env, conn, parent = world
    done = api.attach(conn, 'vm1', vgpu_type=TYPE, live=True, env=env)
    conn.lookupByName('vm1').set_active(False)
    report = reconcile.reconcile(env)
    assert done.uuid in [f.uuid for f in report.findings]
    assert dummy(env).existing() == {}
    assert env.store.leases() == []


# --- a live detach waits for libvirt's device-removed event ----------------

def _record_waits(monkeypatch):
    """What each wait for a device removal returned (True: woken by the
    event)."""
    from libvirt_gpu.virt import guest as guest_mod
    woken = []
    real = guest_mod.DeviceRemovals.wait

    def recorded(self, timeout):
        woken.append((self.events, real(self, timeout)))
        return woken[-1][1]
    monkeypatch.setattr(guest_mod.DeviceRemovals, 'wait', recorded)
    return woken


def test_live_detach_removes_the_vgpu_when_the_guest_lets_go(world,
                                                             monkeypatch):
    """The guest takes a while to let go (the device stays in its live XML
    until then): the removal waits for libvirt's DEVICE_REMOVED event and
    is woken by it, not by the timeout."""
    env, conn, parent = world
    done = api.attach(conn, 'vm1', vgpu_type=TYPE, live=True, env=env)
    conn.unplug_delay = 1.0
    woken = _record_waits(monkeypatch)
    gone = api.detach(conn, 'vm1', uuid=done.uuid, live=True, env=env)
    assert gone.note is None
    assert dummy(env).existing() == {} and env.store.leases() == []
    assert woken == [(True, True)]


def test_without_events_the_removal_looks_again_until_the_timeout(
        world, monkeypatch):
    env, conn, parent = world
    done = api.attach(conn, 'vm1', vgpu_type=TYPE, live=True, env=env)
    conn.events = False
    conn.unplug_delay = 0.3
    woken = _record_waits(monkeypatch)
    gone = api.detach(conn, 'vm1', uuid=done.uuid, live=True, env=env)
    assert gone.note is None and dummy(env).existing() == {}
    # no event: every wait ends by itself and the domain is looked at again
    assert woken and set(woken) == {(False, False)}
    # a guest that never lets go in time: left to the release hook
    again = api.attach(conn, 'vm1', vgpu_type=TYPE, live=True, env=env)
    conn.events = True
    conn.unplug_delay = 1.0
    monkeypatch.setattr(api, 'DETACH_WAIT', 0.2)
    late = api.detach(conn, 'vm1', uuid=again.uuid, live=True, env=env)
    assert 'has not released vGPU %s yet' % again.uuid in late.note
    assert again.uuid in dummy(env).existing()
    conn.settle()
