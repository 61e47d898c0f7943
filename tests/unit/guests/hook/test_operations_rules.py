"""Which vGPUs a guest start claims (guests/hook/operations.py
``Hook.claims``), that the rest of the unit layer left open
(docs/dev/mutation.md): a vGPU the metadata lists without its hostdev
does not stop the next ones from being created, and a persistent
definition on a GPU of another route is left to that route, the log
naming the GPU and the route; one defined only persistently is claimed
after a listed one.  On the simulated T4 host."""

import json
import os
import shutil
import tempfile

import pytest

from libvirt_gpu import objects
from tests.doubles import trees
from tests.doubles import t4_hook as th

# the domain of test_routes_nova's Nova guests
NOVA_DOM = objects.Uuid.parse('0f6b2f4e-5d0b-4a55-9d4e-3f9c6f1b6a01')

A = th.A


@pytest.fixture
def fast_tmp():
    # the state directory's parent is this 0700 one: a state directory
    # below a directory anyone can write is refused (statedir.check_dir)
    path = tempfile.mkdtemp(prefix='lgpu-operations-rules-')
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def env(tmp_path):
    with trees.simulated_tree('t4') as (root, profile):
        yield th.Env(root, profile, tmp_path)


def test_a_listed_vgpu_without_its_hostdev_does_not_stop_the_next(env):
    missing, present = th.new_uuid(), th.new_uuid()
    before = set(env.mdevs())
    rc, err = env.run('prepare', th.domain_xml(
        [(missing, 'nvidia-223', A), (present, 'nvidia-223', A)],
        hostdevs=[present]))
    assert rc == 0, err
    assert set(env.mdevs()) - before == {present}
    assert [lease.vgpu_uuid for lease in env.leases()] == [present]
    assert ('metadata lists vGPU %s but <devices> has no <hostdev '
            "type='mdev'> with that UUID; it is not created" % missing) in \
        env.log()


def test_a_definition_on_another_routes_gpu_is_left_to_that_route(env):
    with open(env.config, 'a') as f:
        f.write('[routes]\ncyborg = %s\n' % A)
    uuid = th.new_uuid()
    # Nova's definition of Cyborg's vGPU, as libvirt leaves it for mdevctl
    define(env, uuid, A, start='auto')
    before = env.mdevs()
    rc, err = env.run('prepare', th.domain_xml([], hostdevs=[uuid]))
    assert rc == 0, err
    assert env.mdevs() == before and env.leases() == []
    assert ('vGPU %s is defined on %s, given to OpenStack Cyborg '
            '([routes]/cyborg): left to that route' % (uuid, A)) in env.log()


def define(env, uuid, parent, start='manual'):
    """A persistent definition of ``uuid`` (mdevctl's)."""
    path = os.path.join(env.mdevctl_dir, parent, uuid)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'w') as f:
        json.dump({'mdev_type': 'nvidia-223', 'start': start,
                   'attrs': []}, f)


def test_a_defined_vgpu_after_a_listed_one_is_claimed_too(env):
    listed, defined = th.new_uuid(), th.new_uuid()
    define(env, defined, th.B)
    before = set(env.mdevs())
    # the listed vGPU's hostdev first, then the one only mdevctl defines
    rc, err = env.run('prepare', th.domain_xml(
        [(listed, 'nvidia-223', A)], hostdevs=[listed, defined]))
    assert rc == 0, err
    assert set(env.mdevs()) - before == {listed, defined}
    assert sorted(lease.vgpu_uuid for lease in env.leases()) == sorted(
        [listed, defined])


def test_novas_guest_on_a_carved_vf_is_logged_as_left_to_nova(fast_tmp):
    from tests.doubles import carved_host as tnr
    from tests.doubles import vendor_world as tv
    carved = tnr.Host(fast_tmp, tnr.CARVING % (tnr.L2, 2))
    assert carved.restore().failed == ()
    # our metadata naming the carved VF: a release has nothing to undo
    xml = tv.vf_domain_xml(objects.Uuid.new(), '0000:bd:00.4', dom=NOVA_DOM)
    assert tnr.run_hook(carved, 'release', xml) == (0, '', b'')
    (line,) = [x for x in tnr.hook_log(carved).splitlines()
               if 'carved for Nova' in x]
    assert line.endswith(": domain 'vm1' (%s) uses VF(s) "
                         "carved for Nova (0000:bd:00.4): left to Nova"
                         % NOVA_DOM)


def test_a_vgpu_neither_listed_nor_defined_is_left_to_libvirt(env):
    uuid = th.new_uuid()
    rc, err = env.run('prepare', th.domain_xml([], hostdevs=[uuid]))
    assert rc == 0, err
    assert env.leases() == []
    (line,) = [x for x in env.log().splitlines() if uuid in x]
    assert line.endswith(': vGPU %s is neither in our metadata nor defined '
                         'persistently: left to libvirt' % uuid)
