"""Values are parsed where they enter the program, and the device records
(``backends.base.VgpuDevice``, ``PgpuDevice``) only hold typed values.

A bad UUID, type id or PCI address given at an edge gets the error (class
and text) that the records used to raise when they parsed it themselves,
and nothing is written: the public API's arguments, a lease row read back
from the state file.  (The hook's input:
tests/unit/guests/hook/test_hook.py's hostile set; mdevctl files and sysfs
names: tests/unit/devices/backends/test_backends.py.)
"""

import os
import sqlite3

import pytest

from libvirt_gpu.host import allocator
from libvirt_gpu.guests import api
from libvirt_gpu.devices.backends import mdev
from libvirt_gpu import conf as conf_mod
from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.store import state
from tests.doubles import domains
from tests.doubles import fake_libvirt
from tests.doubles import kernel_sysfs
from tests.doubles import trees

T_NVIDIA_223 = objects.TypeId.parse('nvidia-223')

A = '0000:3b:00.0'          # empty T4
B = '0000:af:00.0'          # T4 holding two nvidia-223
EXISTING = objects.Uuid.parse('4b20d080-1b54-4048-85b3-a6a62d165c01')
DOM = objects.Uuid.parse('c7a5fdbd-cdaf-9455-926a-d65c16db1809')

# The values tests/unit/devices/backends/test_backends.py once gave the
# records themselves.
BAD_UUIDS = ['../../../etc/passwd', 'x' * 36, EXISTING + '\n',
             EXISTING[:-1] + '/']
BAD_TYPES = ['../nvidia-223', 'nvidia-223\n', '', 'a/b']
BAD_ADDRESSES = ['../0000:af:00.0', '0000:af:00.0\n', '0000:af:00.0/..',
                 'af:00.0']


def new_uuid():
    return objects.Uuid.new()


class Host(object):
    """A simulated T4 host (kernel rules in-process), its configuration
    and a file-backed libvirt holding one running, persistent guest."""

    def __init__(self, root, profile, tmp):
        self.sysfs = kernel_sysfs.KernelSysfs(root, profile)
        self.state_dir = os.path.join(tmp, 'state')
        path = os.path.join(tmp, 'libvirt-gpu.conf')
        with open(path, 'w') as f:
            f.write('[DEFAULT]\nsysfs_root = %s\nstate_dir = %s\n'
                    '[gpu]\nenabled_vgpu_types = nvidia-223\n'
                    '[vgpu_nvidia-223]\ndevice_addresses = %s, %s\n'
                    % (root, self.state_dir, A, B))
        self.conf = conf_mod.load(path)
        self.conn = fake_libvirt.FakeConnection(os.path.join(tmp, 'doms'))
        self.dom = self.conn.define(domains.tiny_domain_xml('vm1', DOM),
                                    active=True)

    def call(self, func, **kwargs):
        return func(self.conn, 'vm1', conf=self.conf, sysfs=self.sysfs,
                    **kwargs)

    def snapshot(self):
        """What a refused call must leave as it was."""
        import libvirt
        return (self.dom.XMLDesc(0),
                self.dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE),
                list(self.sysfs.writes))

    def leases(self):
        return state.LeaseStore(self.state_dir).leases()


@pytest.fixture
def host(tmp_path):
    with trees.simulated_tree('t4') as (root, profile):
        yield Host(root, profile, str(tmp_path))


def refused(host, error, **kwargs):
    """``kwargs`` given to api.attach or api.detach (``call``) raise
    exactly ``error`` and change nothing."""
    func = kwargs.pop('call')
    before = host.snapshot()
    with pytest.raises(type(error)) as e:
        host.call(func, **kwargs)
    assert type(e.value) is type(error)
    assert str(e.value) == str(error)
    assert host.snapshot() == before
    assert host.sysfs.writes == []
    assert host.leases() == []


# --- the API -----------------------------------------------------------------

@pytest.mark.parametrize('bad', BAD_UUIDS)
def test_api_refuses_a_bad_uuid(host, bad):
    error = exception.InvalidUuid(value=bad)
    refused(host, error, call=api.attach, vgpu_type='nvidia-223', uuid=bad)
    refused(host, error, call=api.attach, vgpu_type='nvidia-223', uuid=bad,
            config=True)
    refused(host, error, call=api.detach, uuid=bad)


@pytest.mark.parametrize('bad', BAD_TYPES)
def test_api_refuses_a_bad_type_id(host, bad):
    error = exception.InvalidTypeId(value=bad)
    refused(host, error, call=api.attach, vgpu_type=bad)
    refused(host, error, call=api.attach, vgpu_type=bad, parent=A)
    refused(host, error, call=api.detach, vgpu_type=bad)


@pytest.mark.parametrize('bad', BAD_ADDRESSES)
def test_api_refuses_a_bad_address(host, bad):
    error = exception.InvalidPciAddress(value=bad)
    refused(host, error, call=api.attach, vgpu_type='nvidia-223',
            parent=bad)
    refused(host, error, call=api.attach, address=bad)
    refused(host, error, call=api.detach, address=bad)


def test_api_passes_typed_values_inward(host):
    # The same call with good values works, and what comes back is typed:
    # the parent a PciAddress, the UUID lowercase as validate_uuid makes it.
    u = new_uuid()
    done = host.call(api.attach, vgpu_type='nvidia-223', parent=A.upper(),
                     uuid=u.upper(), live=True)
    assert done.uuid == u
    assert done.parent == objects.PciAddress.parse(A)
    assert [(lease.vgpu_uuid, lease.parent, lease.type_id)
            for lease in host.leases()] == [
        (u, objects.PciAddress.parse(A), 'nvidia-223')]


# --- the lease file ----------------------------------------------------------

def _corrupt(store, column, value):
    db = sqlite3.connect(store.db_path)
    try:
        with db:
            db.execute('UPDATE leases SET %s = ?' % column, (value,))
    finally:
        db.close()


@pytest.fixture
def leased(tmp_path):
    """An allocator on a T4 host with one lease (a claim not created)."""
    with trees.simulated_tree('t4') as tree:
        backend = mdev.MdevBackend(kernel_sysfs.KernelSysfs(*tree))
        store = state.LeaseStore(tmp_path / 'state')
        enabled = {objects.PciAddress.parse(a):
                   objects.EnabledType(type_id=T_NVIDIA_223) for a in (A, B)}
        alloc = allocator.Allocator(backend, store, enabled)
        claim = allocator.VgpuClaim(uuid=new_uuid(), type_id=T_NVIDIA_223,
                                    parent=objects.PciAddress.parse(A))
        alloc.reserve(DOM, [claim])
        yield alloc, store, claim


@pytest.mark.parametrize('bad', BAD_TYPES + ['nvidia+223'])
def test_a_lease_row_with_a_bad_type_id_is_refused_where_used(leased, bad):
    """Taking over a lease whose type is no type id fails as before; the
    table can still be read, so that reconcile can list and clean it."""
    alloc, store, claim = leased
    _corrupt(store, 'type_id', bad)
    with pytest.raises(exception.InvalidTypeId) as e:
        alloc.reserve(DOM, [claim])
    assert str(e.value) == str(exception.InvalidTypeId(value=bad))
    assert [(lease.type_id, lease.bad_type_id)
            for lease in store.leases()] == [(None, bad)]


def test_a_lease_row_with_a_bad_parent_is_refused(leased):
    _, store, _ = leased
    _corrupt(store, 'parent', '../0000:3b:00.0')
    with pytest.raises(exception.InvalidPciAddress):
        store.leases()
