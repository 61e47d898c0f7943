"""The real mdevctl on the live simulated host, as a cross-check.

mdevctl 1.2 has no root override: it runs inside a ``LiveHost``'s mount
namespace, where the live tree is /sys and a private directory is
/etc/mdevctl.d.  Its JSON output is read here, in the test, only to compare
it with our own discovery; the product never parses tool output.
"""

import json
import os

import pytest

from libvirt_gpu.devices.backends import base
from libvirt_gpu.devices.backends import mdev as mdev_backend
from libvirt_gpu.devices import discovery
from libvirt_gpu import objects
from tests.doubles import kinds
from tests.functional import live_sysfs as ls

A = '0000:3b:00.0'
B = '0000:af:00.0'
PRE = ['4b20d080-1b54-4048-85b3-a6a62d165c01',
       'b1ae8bf6-38b0-4c81-9d44-78ce3f520496']

missing = ls.live_host_requirements()
pytestmark = pytest.mark.skipif(bool(missing), reason='; '.join(missing))


@pytest.fixture(scope='module')
def host(tmp_path_factory):
    with ls.LiveHost(tmp_path_factory.mktemp('mdevctl-host')) as h:
        yield h


@pytest.fixture(autouse=True)
def restored(host):
    yield
    live = host.live
    for m in live.state()['mdevs']:
        if m['uuid'] not in PRE:
            live.sysfs.write(live.path('bus', 'mdev', 'devices', m['uuid'],
                                       'remove'), '1')
    for parent in os.listdir(host.mdevctl_dir):
        if parent != 'scripts.d':
            for name in os.listdir(os.path.join(host.mdevctl_dir, parent)):
                os.unlink(os.path.join(host.mdevctl_dir, parent, name))


def new_uuid():
    return objects.Uuid.new()


def vgpu_device(uuid, parent, type_id):
    """A VgpuDevice as the product builds one: the parent parsed."""
    return base.VgpuDevice(objects.Uuid.parse(uuid),
                           objects.PciAddress.parse(parent),
                           objects.TypeId.parse(type_id))


def mdevctl_json(host, *args):
    r = host.run_mdevctl(*args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout) if r.stdout.strip() else []


def by_parent(entries):
    """mdevctl's ``[{parent: [{key: value}, ...]}]`` as
    ``{parent: {key: value}}``."""
    result = {}
    for entry in entries:
        for parent, items in entry.items():
            for item in items:
                result.setdefault(parent, {}).update(item)
    return result


def our_types(host):
    return {str(g.address): {t.id: {
        'available_instances': t.available_instances,
        'device_api': t.device_api, 'name': t.name,
        'description': t.description} for t in g.mdev_types}
        for g in discovery.from_sysfs(
            host.live.sysfs, kinds=kinds.registered()).gpus if g.mdev_types}


def our_mdevs(host):
    return {str(g.address): {m.uuid: m.type_id for m in g.mdevs}
            for g in discovery.from_sysfs(
                host.live.sysfs, kinds=kinds.registered()).gpus if g.mdevs}


def mdevctl_active(host):
    listed = by_parent(mdevctl_json(host, 'list', '--dumpjson'))
    return {p: {u: d['mdev_type'] for u, d in devs.items()}
            for p, devs in listed.items()}


def test_types_agree_with_our_discovery(host):
    theirs = by_parent(mdevctl_json(host, 'types', '--dumpjson'))
    assert sorted(theirs) == [A, B]
    assert theirs == our_types(host)
    assert theirs[B]['nvidia-223']['available_instances'] == 6
    assert theirs[B]['nvidia-231']['available_instances'] == 0


def test_list_agrees_with_our_discovery(host):
    assert mdevctl_active(host) == our_mdevs(host) == {
        B: {PRE[0]: 'nvidia-223', PRE[1]: 'nvidia-223'}}


def test_mdevctl_start_is_seen_by_us_and_ours_by_it(host):
    u = new_uuid()
    r = host.run_mdevctl('start', '-p', A, '-t', 'nvidia-231', '-u', u)
    assert r.returncode == 0, r.stderr
    backend = mdev_backend.MdevBackend(host.live.sysfs,
                                       mdevctl_dir=host.mdevctl_dir)
    assert backend.lookup(u) == vgpu_device(u, A, 'nvidia-231')
    assert our_mdevs(host)[A] == {u: 'nvidia-231'}
    assert our_types(host)[A]['nvidia-231']['available_instances'] == 7
    assert by_parent(mdevctl_json(host, 'types', '--dumpjson')) == \
        our_types(host)
    # ours (a sysfs create by the backend) is in mdevctl's list
    mine = vgpu_device(new_uuid(), A, 'nvidia-231')
    assert backend.prepare(mine) is True
    assert mdevctl_active(host)[A] == {u: 'nvidia-231',
                                       mine.uuid: 'nvidia-231'}
    # and each side removes the other's
    assert host.run_mdevctl('stop', '-u', mine.uuid).returncode == 0
    assert backend.lookup(mine.uuid) is None
    assert backend.remove(u) is True
    assert A not in mdevctl_active(host)
    assert mdevctl_active(host) == our_mdevs(host)


def test_mdevctl_refusals_leave_nothing_behind(host):
    before = our_mdevs(host)
    # the kernel's EEXIST and NVIDIA's EINVAL, as mdevctl meets them
    for args in (('-p', A, '-t', 'nvidia-223', '-u', PRE[0]),
                 ('-p', B, '-t', 'nvidia-231', '-u', new_uuid())):
        r = host.run_mdevctl('start', *args)
        assert r.returncode != 0
        assert r.stderr.strip()
    assert our_mdevs(host) == before == mdevctl_active(host)


def test_definitions_are_shared(host):
    # mdevctl's definition is read by our backend ...
    u = new_uuid()
    r = host.run_mdevctl('define', '-p', B, '-t', 'nvidia-223', '-u', u)
    assert r.returncode == 0, r.stderr
    backend = mdev_backend.MdevBackend(host.live.sysfs,
                                       mdevctl_dir=host.mdevctl_dir)
    found = backend.definition(u)
    assert (found.parent, found.type_id, found.start) == (
        objects.PciAddress.parse(B), 'nvidia-223', 'manual')
    # ... and ours (written without libvirt) by mdevctl
    mine = vgpu_device(new_uuid(), A, 'nvidia-232')
    backend.define(mine, start='auto')
    defined = by_parent(mdevctl_json(host, 'list', '--defined',
                                     '--dumpjson'))
    assert defined[A][mine.uuid]['mdev_type'] == 'nvidia-232'
    assert defined[A][mine.uuid]['start'] == 'auto'
    assert defined[B][u]['mdev_type'] == 'nvidia-223'
    # mdevctl starts our definition; the kernel makes it
    assert host.run_mdevctl('start', '-u', mine.uuid).returncode == 0
    assert backend.lookup(mine.uuid) == mine
    assert backend.remove(mine.uuid) is True
    assert backend.undefine(mine.uuid) is True
    assert host.run_mdevctl('undefine', '-u', u).returncode == 0
    assert backend.definition(u) is None
