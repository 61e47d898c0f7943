"""One owner per GPU (``devices.routes``), and what our parts leave to the
other routes: reconcile and restore keep Cyborg's vGPUs and clean Nova's
leftover definitions of them (``guests.reconcile``'s module doc).

Routes are read against the simulated T4 host (``A`` and ``B``, both
offering ``nvidia-223``); reconcile runs on libvirt's domains in
``fake_libvirt`` with the real lease store and mdevctl definitions."""

import json
import os

import pytest

from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.devices import routes
from libvirt_gpu.guests import reconcile
from libvirt_gpu.util import records
from tests.doubles import fakes
from tests.doubles import trees
from tests.unit import test_hook as th
from tests.unit import test_mutation_reconcile as tr

A, B, TYPE = tr.A, tr.B, tr.TYPE


class Conf:
    """What ``routes.resolve`` reads of a configuration."""

    def __init__(self, cyborg=(), nova_conf=''):
        self.routes = type('R', (), {'cyborg': list(cyborg),
                                     'nova_conf': nova_conf})


def gpu(address, vf_of=None, offers=(fakes.T4_2B,)):
    return records.replace(fakes.gpu(address, types=offers), physfn=(
        objects.PciAddress.parse(vf_of) if vf_of else None))


GPUS = [gpu(str(A)), gpu(str(B))]


def nova_conf(tmp_path, text):
    path = tmp_path / 'nova.conf'
    path.write_text(text)
    return str(path)


def setting(type_id='nvidia-223'):
    return objects.EnabledType(type_id=objects.TypeId.parse(type_id))


# -- resolve: one owner per GPU ---------------------------------------------

def test_cyborg_gpus_by_address_and_by_model():
    found = routes.resolve(Conf([str(A)]), GPUS, {}, {})
    assert found.owners == {A: routes.CYBORG}
    assert found.route_of(B) == routes.OURS
    assert set(routes.resolve(Conf(['10de:1eb8']), GPUS, {}, {}).of(
        routes.CYBORG)) == {A, B}
    assert routes.resolve(Conf(['all']), GPUS, {}, {}).of(
        routes.CYBORG) == tuple(sorted([A, B]))


def test_a_gpu_carved_and_given_to_cyborg_is_refused_naming_both():
    with pytest.raises(exception.ConfigError) as e:
        routes.resolve(Conf([str(A)]), GPUS, {}, {A: '[nova_t4]'})
    assert str(e.value) == (
        'Configuration error: a GPU can\'t be claimed by two routes: '
        '[nova_t4] gives %s to nova-pci and [routes]/cyborg gives it to '
        'cyborg; give it to one route (docs/admin/nova.md, "Routes")' % A)


def test_novas_own_vgpus_and_cyborgs_on_one_gpu_are_refused(tmp_path):
    path = nova_conf(tmp_path, '[devices]\nenabled_mdev_types = nvidia-223\n'
                     '[mdev_nvidia-223]\ndevice_addresses = %s\n' % A)
    with pytest.raises(exception.ConfigError) as e:
        routes.resolve(Conf([str(A)], path), GPUS, {}, {})
    assert ('[routes]/cyborg gives %s to cyborg and %s [mdev_nvidia-223]/'
            'device_addresses gives it to nova-vgpu' % (A, path)) in str(
                e.value)


def test_novas_own_vgpus_on_a_gpu_we_enable_are_refused(tmp_path):
    path = nova_conf(tmp_path, '[devices]\nenabled_mdev_types = nvidia-223\n')
    with pytest.raises(exception.ConfigError) as e:
        routes.resolve(Conf((), path), GPUS, {B: setting()}, {})
    assert ('(nvidia-223, on every GPU offering it) gives %s to nova-vgpu '
            'and [gpu]/enabled_vgpu_types (nvidia-223) gives it to '
            'libvirt-gpu' % B) in str(e.value)


def test_novas_own_route_as_nova_reads_it(tmp_path):
    # the listed GPU; the first type without addresses on every other GPU
    # offering it (nova's _get_supported_vgpu_types); a second default type
    # is ignored as Nova ignores it
    vf_host = GPUS + [gpu('0000:d8:00.0', offers=(fakes.T4_4C,)),
                      gpu('0000:d8:00.4', vf_of='0000:d8:00.0')]
    path = nova_conf(tmp_path, '[devices]\nenabled_mdev_types = nvidia-224, '
                     'nvidia-223, nvidia-225\n[mdev_nvidia-224]\n'
                     'device_addresses = 0000:d8:00.4\n')
    found = routes.resolve(Conf((), path), vf_host, {}, {})
    assert found.owners == {
        objects.PciAddress.parse('0000:d8:00.0'): routes.NOVA_VGPU,
        A: routes.NOVA_VGPU, B: routes.NOVA_VGPU}
    nova = routes.read_nova_conf(path)
    assert nova.default_type == 'nvidia-223'


def test_no_nova_conf_claims_nothing_and_a_fifo_is_refused(tmp_path):
    assert routes.resolve(Conf((), str(tmp_path / 'none')), GPUS, {},
                          {}).owners == {}
    fifo = str(tmp_path / 'fifo')
    os.mkfifo(fifo)
    with pytest.raises(exception.ConfigError) as e:
        routes.read_nova_conf(fifo)
    assert 'not a regular file' in str(e.value)


@pytest.mark.parametrize('values, words', [
    (['0000:3b:00.4'], 'no GPU there'),
    (['nvidia'], 'names no GPU'),
    (['all', str(A)], '"all" stands alone'),
])
def test_bad_cyborg_entries_name_the_option(values, words):
    with pytest.raises(exception.ConfigError) as e:
        routes.resolve(Conf(values), GPUS, {}, {})
    assert '[routes]/cyborg' in str(e.value) and words in str(e.value)


def test_routes_round_trip_through_the_hook_snapshot():
    found = routes.Routes(owners={A: routes.CYBORG, B: routes.NOVA_VGPU})
    assert routes.Routes.from_json(json.loads(json.dumps(
        found.to_json()))) == found
    with pytest.raises(ValueError):
        routes.Routes.from_json({str(A): routes.OURS})


# -- reconcile and Cyborg's vGPUs --------------------------------------------

@pytest.fixture
def world(tmp_path):
    with trees.simulated_tree('t4', without_mdevs=True) as (root, profile):
        yield tr.World(root, profile, tmp_path)


CYBORG_A = routes.Routes(owners={A: routes.CYBORG})


def run(world, owners=CYBORG_A, **kwargs):
    env = world.env().replace(routes=owners)
    return reconcile.reconcile(env, covered=(A, B), **kwargs)


def define(world, uuid, parent=A):
    """Nova's definition, as libvirt's nodedev-define leaves it for
    mdevctl (start auto: Nova sets autostart)."""
    path = os.path.join(world.mdevctl_dir, str(parent), str(uuid))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'w') as f:
        json.dump({'mdev_type': str(TYPE), 'start': 'auto', 'attrs': []}, f)
    return path


def test_a_bound_cyborg_vgpu_before_novas_spawn_is_kept(world):
    uuid = world.mdev(A)            # Cyborg's agent: the handle's UUID
    report = run(world)
    assert [(f.action, f.what, f.uuid) for f in report.findings] == [
        (reconcile.KEPT, 'mdev', str(uuid))]
    assert 'given to Cyborg' in report.findings[0].reason
    assert uuid in world.mdevs()
    # the same vGPU on a GPU of ours is an orphan, and removed
    report = run(world, owners=routes.Routes())
    assert [(f.action, f.uuid) for f in report.findings] == [
        (reconcile.REMOVED, str(uuid))]
    assert uuid not in world.mdevs()


def test_novas_leftover_definition_is_undefined(world):
    uuid = th.new_uuid()
    path = define(world, uuid)        # the ARQ is gone: not live
    report = run(world, dry_run=True)
    assert [(f.action, f.what, f.uuid) for f in report.findings] == [
        (reconcile.WOULD_REMOVE, 'definition', str(uuid))]
    assert os.path.exists(path)
    report = run(world)
    assert [(f.action, f.what) for f in report.findings] == [
        (reconcile.REMOVED, 'definition')]
    assert reconcile.LEFTOVER in report.findings[0].reason
    assert not os.path.exists(path)


def test_a_definition_a_domain_names_is_left_to_nova(world):
    uuid = th.new_uuid()
    path = define(world, uuid)
    world.conn.define(_guest_xml(uuid), active=False)   # Nova's guest
    assert run(world).findings == ()
    assert os.path.exists(path)


def test_a_live_leftover_is_kept_but_removed_at_boot(world):
    uuid = world.mdev(A)
    path = define(world, uuid)
    report = run(world)
    assert [(f.action, f.what) for f in report.findings] == [
        (reconcile.KEPT, 'mdev+definition')]
    assert uuid in world.mdevs() and os.path.exists(path)
    env = world.env().replace(routes=CYBORG_A)
    report = reconcile.leftovers(env, boot=True)
    assert [(f.action, f.what) for f in report.findings] == [
        (reconcile.REMOVED, 'mdev+definition')]
    assert uuid not in world.mdevs() and not os.path.exists(path)
    # the same handle binds again: its UUID is free
    world.mdev(A, uuid)


def test_other_routes_vgpus_are_never_removed(world):
    uuid = world.mdev(B)
    for route in (routes.NOVA_VGPU, routes.NOVA_PCI):
        report = run(world, owners=routes.Routes(owners={B: route}))
        assert [f.action for f in report.findings] == [reconcile.KEPT]
        assert uuid in world.mdevs()


def _guest_xml(uuid):
    """A stopped guest as Nova 34 defines it for a Cyborg-bound vGPU: a
    mdev hostdev with the handle's UUID, no metadata of ours."""
    return ("<domain type='kvm'><name>instance-0001</name>"
            "<uuid>%s</uuid><memory>65536</memory><os><type>hvm</type>"
            "</os><devices><hostdev mode='subsystem' type='mdev' "
            "model='vfio-pci'><source><address uuid='%s'/></source>"
            "</hostdev></devices></domain>" % (tr.DOM2, uuid))
