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
from tests.doubles import t4_hook as th
from tests.doubles import reconcile_world as tr
from tests.doubles.reconcile_world import CYBORG_A
from tests.doubles.reconcile_world import _restore

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

world = tr.world


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
    assert [(f.action, f.what, f.parent, f.type_id)
            for f in report.findings] == [
        (reconcile.KEPT, 'mdev+definition', A, TYPE)]
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


# -- the hook and Nova's definition of a Cyborg vGPU -------------------------

def test_the_hook_leaves_novas_definition_on_cyborgs_gpu_to_nova(tmp_path):
    # a definition of ours (or an operator's) on our GPU is created at
    # prepare (test_hook); on Cyborg's GPU it is Nova's to create
    with trees.simulated_tree('t4') as (root, profile):
        env = th.Env(root, profile, tmp_path, types='nvidia-223\n[routes]\n'
                     'cyborg = %s\nnova_conf =' % th.A)
        u = th.new_uuid()
        os.makedirs(os.path.join(env.mdevctl_dir, th.A))
        with open(os.path.join(env.mdevctl_dir, th.A, u), 'w') as f:
            f.write('{"mdev_type": "nvidia-223", "start": "auto", '
                    '"attrs": []}')
        xml = th.domain_xml(hostdevs=[u])
        assert env.run('prepare', xml) == (0, '')
        assert u not in env.sysfs.kernel.mdevs() and env.leases() == []
        assert 'left to that route' in env.log()
        env.sysfs.kernel.create(objects.PciAddress.parse(th.A), TYPE, u)
        assert env.run('release', xml) == (0, '')
        assert u in env.sysfs.kernel.mdevs()


# -- what make mutation found unpinned ---------------------------------------

def test_novas_deprecated_option_and_group_names_are_read(tmp_path):
    # Nova still reads [devices]/enabled_vgpu_types and [vgpu_<type>]
    path = nova_conf(tmp_path, '[devices]\nenabled_vgpu_types = nvidia-223'
                     '\n[vgpu_nvidia-223]\ndevice_addresses = %s\n' % A)
    nova = routes.read_nova_conf(path)
    assert nova.types == ('nvidia-223',)
    assert nova.addresses == {A: 'nvidia-223'} and nova.default_type is None


@pytest.mark.parametrize('raw, said', [
    (b'[devices\nenabled_mdev_types = x\n', 'Nova could not read it '
                                            'either: '),
    (b'[devices]\nenabled_mdev_types = \xff\n', 'not UTF-8 text'),
    (b'[devices]\nenabled_mdev_types = nvidia-223\n[mdev_nvidia-223]\n'
     b'device_addresses = 0000:zz:00.0\n',
     "[mdev_nvidia-223]/device_addresses: '0000:zz:00.0' is no PCI address"),
])
def test_a_nova_conf_it_cannot_read_is_named_with_the_reason(
        tmp_path, raw, said):
    path = tmp_path / 'nova.conf'
    path.write_bytes(raw)
    with pytest.raises(exception.ConfigError) as e:
        routes.read_nova_conf(str(path))
    assert str(e.value).startswith(
        'Configuration error: [routes]/nova_conf %s: %s' % (path, said))


def test_the_cyborg_refusals_word_for_word():
    vf_host = GPUS + [gpu('0000:d8:00.4', vf_of=str(A))]
    with pytest.raises(exception.ConfigError) as e:
        routes.resolve(Conf(['0000:d8:00.4']), vf_host, {}, {})
    assert str(e.value) == (
        'Configuration error: [routes]/cyborg names 0000:d8:00.4, a VF of '
        'the GPU %s; name the physical GPU' % A)
    with pytest.raises(exception.ConfigError) as e:
        routes.resolve(Conf(['all', str(B)]), GPUS, {}, {})
    assert str(e.value) == (
        'Configuration error: [routes]/cyborg: "all" stands alone (every GPU '
        'no other route claims); or list the GPUs')


@pytest.mark.parametrize('data, said', [
    ([], 'routes: not an object'),
    ({'nope': routes.CYBORG}, "routes: 'nope' is not a PCI address"),
    ({str(A): 'ours'}, "routes: 'ours' is no route"),
])
def test_a_bad_snapshot_of_routes_says_what(data, said):
    with pytest.raises(ValueError) as e:
        routes.Routes.from_json(data)
    assert str(e.value).startswith(said)


def test_a_leftover_is_kept_while_some_domain_cannot_be_read(world):
    uuid = th.new_uuid()
    path = define(world, uuid)
    world.conn.define(th.domain_xml([('nonsense', TYPE, None)],
                                    uuid=tr.DOM2, name='broken').decode())
    report = run(world)
    kept = [(f.action, f.what, f.parent, f.type_id, f.reason)
            for f in report.findings if f.uuid == str(uuid)]
    assert kept == [(reconcile.KEPT, 'definition', A, TYPE,
                     'Nova\'s definition of a Cyborg vGPU; no readable '
                     'domain names it, but some domain XML could not '
                     'be read')]
    assert os.path.exists(path)


def test_a_dry_run_of_the_leftovers_takes_no_lock(world):
    # restore --dry-run must not wait for a guest start holding the lock
    uuid = world.mdev(A)
    define(world, uuid)
    world.store.lock_timeout = 0.1
    env = world.env().replace(routes=CYBORG_A)
    env.store.lock_timeout = 0.1
    with world.store.transaction():
        report = reconcile.leftovers(env, dry_run=True, boot=True)
    assert [(f.action, f.what) for f in report.findings] == [
        (reconcile.WOULD_REMOVE, 'mdev+definition')]


# -- restore: other routes' definitions and its step 5 -----------------------

def test_restore_starts_no_definition_of_another_routes_gpu(world):
    from libvirt_gpu.host import restore
    cyborgs, ours = th.new_uuid(), th.new_uuid()
    define(world, cyborgs, parent=A)
    define(world, ours, parent=B)
    run_ = _restore(world)
    run_.restore_persistent()
    done = {(a.action, a.target): a.detail for a in run_.actions}
    assert done[(restore.SKIPPED, str(cyborgs))] == (
        '%s on %s: the GPU is given to OpenStack Cyborg ([routes]/cyborg); '
        'its definitions are not ours to start (step 5 judges a Cyborg one)'
        % (TYPE, A))
    assert (restore.CREATED, str(ours)) in done
    assert ours in world.mdevs() and cyborgs not in world.mdevs()


def test_restore_step_5_without_libvirt_with_it_and_failing(world):
    from libvirt_gpu.host import restore
    # no Cyborg GPU: nothing to judge, nothing said
    run_ = _restore(world, owners=routes.Routes())
    run_.other_routes()
    assert run_.actions == []
    run_ = _restore(world)
    run_.other_routes()
    assert [(a.action, a.what, a.target) for a in run_.actions] == [
        (restore.SKIPPED, 'vgpu', 'cyborg')]
    assert '--no-libvirt' in run_.actions[0].detail
    asked = []
    found = restore.Action(restore.UNDEFINED, 'vgpu', 'u-1', 'gone')
    run_ = _restore(world, dry_run=True, leftovers=lambda dry_run: (
        asked.append(dry_run) or [found]))
    run_.other_routes()
    assert asked == [True] and run_.actions == [found]

    def broken(dry_run):
        raise exception.LibvirtGpuError('libvirt is down')
    run_ = _restore(world, leftovers=broken)
    run_.other_routes()
    assert [(a.action, a.target, a.detail) for a in run_.actions] == [
        (restore.FAILED, 'cyborg', 'cannot judge Nova\'s leftover '
         'definitions on Cyborg\'s GPUs: libvirt is down')]
