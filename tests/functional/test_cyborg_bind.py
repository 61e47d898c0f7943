"""The real Cyborg 17 bind path on a live simulated T4 host, with our
routes: Cyborg's agent (``libvirt_gpu_driver``) makes an ARQ's vGPU on the
GPU ``[routes]/cyborg`` gives it, and our parts leave that vGPU alone.

Everything is real but the kernel and Nova (``cyborg_bind``'s module
doc): cyborg-api, -conductor and -agent over RabbitMQ, the test's
Placement, a libvirtd that sees the live tree as /sys with our hook
installed, and the ``libvirt-gpu`` CLI.  The host's vGPU GPU (af:00.0)
is Cyborg's and already holds two vGPUs nobody names; 3b:00.0 is ours.
"""

import json
import os
import uuid as uuidlib

import pytest

from tests.functional import cyborg_bind as cb
from tests.functional import hook_guests
from tests.functional import libvirtd
from tests.functional import live_sysfs as ls
from tests.functional import placement_server

VFIO_ERROR = 'Mediated host device assignment requires VFIO support'
UDEV_TIMEOUT = 30.0

missing = ls.live_host_requirements()
pytestmark = pytest.mark.skipif(bool(missing), reason='; '.join(missing))


@pytest.fixture(scope='module')
def host(tmp_path_factory):
    with placement_server.running() as placement:
        with cb.running(tmp_path_factory.mktemp('cyborg-bind'),
                        placement) as h:
            h.create_profile('t4-2b')
            yield h


@pytest.fixture
def arq(host):
    """A new ARQ for one T4-2B vGPU, deleted after the test."""
    uuid = host.create_arq('t4-2b')
    yield uuid
    if uuid in host.arqs():
        host.delete(uuid)


def reconcile(host, *args):
    return json.loads(host.cli('reconcile', '--json', *args).stdout)


def findings_of(report, uuid):
    return [(f['action'], f['what']) for f in report['findings']
            if f['uuid'] == uuid]


def test_a_bound_arq_makes_its_vgpu_on_the_host_and_in_libvirt(host, arq):
    instance = str(uuidlib.uuid4())
    bound = host.bind(arq, instance)
    handle = bound['attach_handle_uuid']
    assert bound['attach_handle_type'] == 'MDEV'
    assert bound['hostname'] == host.hostname
    assert bound['device_rp_uuid'] == cb.provider_uuid(host.hostname,
                                                       cb.CYBORG_GPU)
    info = bound['attach_handle_info']
    assert (info['domain'], info['bus'], info['device'], info['function'],
            info['asked_type']) == ('0000', 'af', '00', '0', cb.T4_2B)
    # the agent's privsep helper wrote the handle's UUID to the live
    # tree's create: the simulated kernel made it there
    assert host.mdev_parent_and_type(handle) == (cb.CYBORG_GPU, cb.T4_2B)
    dev = ls.wait_for(lambda: host.nodedev(handle), UDEV_TIMEOUT)
    assert dev is not None, 'libvirt never saw ' + cb.nodedev_name(
        handle, cb.CYBORG_GPU)
    xml = dev.XMLDesc(0)
    assert "<uuid>%s</uuid>" % handle in xml
    assert 'nvidia-223' in xml
    # Nova was told (the stand-in's record of Cyborg's notification)
    assert host.nova.of(instance) == [{
        'name': 'accelerator-request-bound', 'server_uuid': instance,
        'tag': arq, 'status': 'completed'}]


def test_reconcile_keeps_a_bound_vgpu_before_novas_spawn(host, arq):
    handle = host.bind(arq)['attach_handle_uuid']
    report = reconcile(host, '--dry-run')
    assert findings_of(report, handle) == [('kept', 'mdev')]
    (finding,) = [f for f in report['findings'] if f['uuid'] == handle]
    assert 'given to Cyborg' in finding['reason']
    assert finding['parent'] == cb.CYBORG_GPU
    report = reconcile(host)
    assert findings_of(report, handle) == [('kept', 'mdev')]
    assert host.mdev_parent_and_type(handle) == (cb.CYBORG_GPU, cb.T4_2B)
    assert host.nodedev(handle) is not None
    assert host.arq(arq)['state'] == 'Bound'


def test_deleting_the_arq_removes_its_vgpu_and_its_handle_binds_again(
        host, arq):
    handle = host.bind(arq)['attach_handle_uuid']
    assert host.mdev_parent_and_type(handle) is not None
    host.delete(arq)
    assert arq not in host.arqs()
    assert host.mdev_parent_and_type(handle) is None
    assert ls.wait_for(lambda: host.nodedev(handle) is None, UDEV_TIMEOUT)
    # the handle is free again, and its UUID too: the next ARQ gets the
    # same handle (Cyborg takes the first free one) and its vGPU is made
    again = host.create_arq('t4-2b')
    try:
        assert host.bind(again)['attach_handle_uuid'] == handle
        assert host.mdev_parent_and_type(handle) == (cb.CYBORG_GPU,
                                                     cb.T4_2B)
    finally:
        host.delete(again)
    assert host.mdev_parent_and_type(handle) is None


def test_an_arq_whose_vgpu_went_away_is_deleted_once_it_is_made_again(
        host, arq):
    # Something removed the bound vGPU behind Cyborg's back (the old
    # reconcile did; a reboot does, Cyborg's vGPU is not persistent):
    # Cyborg 17 then cannot delete the ARQ (its agent's remove fails, the
    # API answers 500 'UnbindFailed') and it stays Bound.  The recovery:
    # make the vGPU again with the handle's UUID, delete the ARQ again.
    handle = host.bind(arq)['attach_handle_uuid']
    host.live.sysfs.write(os.path.join(host.mdev_path(handle), 'remove'),
                          '1')
    with pytest.raises(cb.BindError) as e:
        host.delete(arq)
    assert 'answered 500' in str(e.value) and 'UnbindFailed' in str(e.value)
    assert host.arq(arq)['state'] == 'Bound'
    host.live.sysfs.write(host.live.type_path(cb.CYBORG_GPU, cb.T4_2B,
                                              'create'), handle)
    host.delete(arq)
    assert arq not in host.arqs()
    assert host.mdev_parent_and_type(handle) is None


def test_unbind_removes_the_vgpu_and_keeps_the_arq(host, arq):
    handle = host.bind(arq)['attach_handle_uuid']
    unbound = host.unbind(arq)
    assert unbound['state'] == 'Unbound'
    assert unbound['attach_handle_uuid'] is None
    assert host.mdev_parent_and_type(handle) is None


def start_refused(host, handle):
    """Define and start a guest as Nova 34 writes it for a Cyborg ARQ (the
    mdev hostdev with the handle's UUID, no metadata of ours); no VFIO
    here: the start fails after ``prepare``, then ``release`` runs.
    Returns what our hook logged meanwhile."""
    import libvirt
    log_path = os.path.join(host.state_dir, 'hook.log')
    before = len(_read(log_path))
    dom_uuid = str(uuidlib.uuid4())
    dom = host.daemon.connect().defineXML(libvirtd.tiny_domain_xml(
        'instance-cyborg', uuid=dom_uuid,
        extra_devices=libvirtd.mdev_hostdev_xml(handle)))
    try:
        with pytest.raises(libvirt.libvirtError) as e:
            dom.create()
        assert VFIO_ERROR in e.value.get_error_message()
    finally:
        dom.undefine()
    # libvirt ran the hooks for it: prepare, then release
    ops = [c[1:3] for c in host.hook_calls() if c[-1] == 'uuid=' + dom_uuid]
    assert ['prepare', 'begin'] in ops and ['release', 'end'] in ops, ops
    return _read(log_path)[before:]


def test_our_hook_leaves_a_cyborg_guests_vgpu_alone(host, arq):
    handle = host.bind(arq)['attach_handle_uuid']
    logged = start_refused(host, handle)
    assert ('vGPU %s is neither in our metadata nor defined persistently: '
            'left to libvirt' % handle) in logged
    assert host.mdev_parent_and_type(handle) == (cb.CYBORG_GPU, cb.T4_2B)
    assert host.nodedev(handle) is not None
    assert hook_guests.leases(host) == []
    assert host.arq(arq)['state'] == 'Bound'


def test_our_hook_leaves_novas_definition_of_a_cyborg_vgpu_alone(host, arq):
    # Nova 34 defines the vGPU (autostart) when it was absent at spawn:
    # the guest's start then finds Nova's definition of the live vGPU on
    # Cyborg's GPU; the hook leaves it to that route: no claim, no lease,
    # nothing removed.
    handle = host.bind(arq)['attach_handle_uuid']
    conn = host.daemon.connect()
    defined = conn.nodeDeviceDefineXML(
        "<device><parent>%s</parent><capability type='mdev'>"
        "<type id='%s'/><uuid>%s</uuid></capability></device>" % (
            cb.pci_nodedev_name(cb.CYBORG_GPU), cb.T4_2B, handle), 0)
    defined.setAutostart(1)
    try:
        logged = start_refused(host, handle)
        assert host.mdev_parent_and_type(handle) == (cb.CYBORG_GPU,
                                                     cb.T4_2B), logged
        assert hook_guests.leases(host) == [], logged
        assert ('vGPU %s is defined on %s, given to OpenStack Cyborg '
                '([routes]/cyborg): left to that route' % (
                    handle, cb.CYBORG_GPU)) in logged
        assert 'removed vGPU %s' % handle not in logged
        assert host.arq(arq)['state'] == 'Bound'
    finally:
        defined.undefine()


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return ''


# -- the whole route: the real bind, then Nova 34's own spawn ---------------

@pytest.fixture(scope='module')
def nova_venv():
    from tests.functional import nova_env
    return nova_env.ensure_venv()[0]


def test_the_route_from_a_real_bind_through_novas_spawn_to_the_next_bind(
        host, arq, nova_venv, tmp_path):
    from tests.functional import nova_env
    instance = str(uuidlib.uuid4())
    bound = host.bind(arq, instance)
    handle = bound['attach_handle_uuid']
    # reconcile in the window between the bind and Nova's spawn
    assert findings_of(reconcile(host), handle) == [('kept', 'mdev')]
    # the vGPU goes away (a reboot: Cyborg's is not persistent); Nova's
    # spawn, with the ARQ as Cyborg's API returns it, creates, defines
    # and autostarts it (_allocate_cyborg_mdevs)
    host.live.sysfs.write(os.path.join(host.mdev_path(handle), 'remove'),
                          '1')
    probe = nova_env.Judge(nova_venv, str(tmp_path / 'nova'))
    spawned = probe.run(['cyborg_mdevs'], uri=host.daemon.uri,
                        arqs=[host.arq(arq)])
    assert spawned['existed'] == {handle: False}
    assert spawned['mdevs'] == [handle]
    assert host.mdev_parent_and_type(handle) == (cb.CYBORG_GPU, cb.T4_2B)
    definition = os.path.join(host.live_host.mdevctl_dir, cb.CYBORG_GPU,
                              handle)
    assert os.path.exists(definition)
    # the guest, as Nova defines it
    dom = host.daemon.connect().defineXML(libvirtd.tiny_domain_xml(
        'instance-%s' % instance[:8],
        extra_devices=''.join(spawned['hostdevs'])))
    assert findings_of(reconcile(host), handle) == []
    # delete: Nova undefines the guest, Cyborg's unbind removes only the
    # live device; Nova's definition is a leftover reconcile undefines
    dom.undefine()
    host.delete(arq)
    assert host.mdev_parent_and_type(handle) is None
    assert os.path.exists(definition)
    assert findings_of(reconcile(host), handle) == [('removed', 'definition')]
    assert not os.path.exists(definition)
    # the next bind of the same handle finds its UUID free
    again = host.create_arq('t4-2b')
    try:
        assert host.bind(again)['attach_handle_uuid'] == handle
        assert host.mdev_parent_and_type(handle) == (cb.CYBORG_GPU,
                                                     cb.T4_2B)
    finally:
        host.delete(again)
