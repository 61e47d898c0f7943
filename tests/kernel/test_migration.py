"""Live migration of a guest with two vGPUs between two hosts, on the VM's
real kernel (VFIO migration protocol v2), QEMU and libvirt.

Host A is the VM's libvirtd (configured for GPU A only while these tests
run); host B is a second libvirtd in its own mount namespace
(``lab.SecondHost``: its own host UUID, socket, configuration for GPU B
only, state directory, and the product's hook installed there by
``libvirt-gpu hook install``).  Both share the kernel, so B's hook cannot
keep the source's vGPU UUIDs (A still holds them while the migration
runs): it takes new ones, which is the rewrite of the XML that libvirt
must use.  The test driver carries a value (``test_state``) in each
vGPU's migration stream: set on A's vGPUs, read on B's, it shows that the
device state moved, not that new devices were made.

In file order: B without room refuses (our command, then ``virsh migrate``
straight), A -> B with ``libvirt-gpu migrate`` and B -> A with ``virsh
migrate --live``, then a migration aborted with Ctrl-C after B's
``prepare`` leaves nothing on B (last: it leaves B with a slow hook).  The
guest is the same throughout; each test ends with it running on A with its
two vGPUs and their state.
"""

import json
import re
import time
import uuid as uuidlib

import pytest

from tests.kernel import conftest
from tests.kernel import lab as lab_mod
from tests.kernel import product

A, B = lab_mod.GPUS
GUEST = 'mover'
TYPE = 'nvidia-223'
STATES = ('0x1111aaaa5555', '0x2222bbbb6666')
# A migration port per migration: QEMU on the destination listens there.
LOOPBACK = 'tcp://127.0.0.1:%d'


def new_uuid():
    return str(uuidlib.uuid4())


def hostdev_uuids(xml):
    """The mdev UUIDs of the domain's hostdevs, in document order."""
    return re.findall(r"<address uuid='([0-9a-f-]{36})'/>", xml)


def on_gpu(lab, gpu):
    return {u for u, (parent, _) in lab.mdevs().items() if parent == gpu}


def device_state(lab, uuid):
    return lab.vm.read('/sys/bus/mdev/devices/%s/test_state'
                       % uuid).strip()


def dmesg_bytes(lab, uuid, verb):
    """Bytes of device state the test driver logged for mdev ``uuid``
    (``verb``: saved, resumed), None when it logged none."""
    r = lab.vm.sh('dmesg | grep "%s" | grep "%s .* bytes of device state" '
                  '| tail -1' % (uuid, verb))
    m = re.search(r'%s (\d+) bytes' % verb, r.stdout)
    return int(m.group(1)) if m else None


def guest_uuid(lab):
    return lab.domain_xml(GUEST).split('<uuid>')[1].split('<')[0]


@pytest.fixture(scope='module')
def host_b(lab):
    """Host B started, host A limited to GPU A; undone afterwards."""
    original = lab.vm.read(product.CONFIG)
    lab.vm.write_file(product.CONFIG, product.config(gpus=(A,)))
    b = lab_mod.SecondHost(lab)
    try:
        conftest.record('host B ready (hook install + libvirtd)',
                        b.start(product.config(gpus=(B,),
                                               state_dir=b.state_dir,
                                               uri=b.uri)))
        assert b.hook_installed, 'hook install on B printed nothing'
        yield b
    finally:
        b.virsh('destroy', GUEST)
        b.stop()
        lab.vm.write_file(product.CONFIG, original)


@pytest.fixture(scope='module')
def mover(lab, host_b):
    """The guest, running on A with two vGPUs whose test_state is set."""
    u1, u2 = new_uuid(), new_uuid()
    lab.define(lab_mod.guest_xml(GUEST, [(u1, TYPE, A), (u2, TYPE, A)],
                                 migratable=True))
    t0 = time.monotonic()
    lab.start(GUEST).check('starting %s' % GUEST)
    conftest.record('migration guest start (2 vGPUs)',
                    time.monotonic() - t0)
    for u, value in zip((u1, u2), STATES):
        lab.vm.write_file('/sys/bus/mdev/devices/%s/test_state' % u, value)
    try:
        yield GUEST
    finally:
        lab.destroy(GUEST)
        lab.undefine(GUEST)
        lab.wait(lambda: not lab.mdevs(), 60)


def assert_on_a_untouched(lab, host_b, uuids):
    """The guest runs on A with the vGPUs ``uuids`` and their state; B
    has no guest, no vGPU and no lease."""
    assert lab.is_running(GUEST)
    assert hostdev_uuids(lab.domain_xml(GUEST)) == uuids
    assert on_gpu(lab, A) == set(uuids)
    assert [device_state(lab, u) for u in uuids] == list(STATES)
    assert host_b.domain_state(GUEST) is None
    assert product.leases(lab.vm, host_b.state_dir) == []


def test_b_without_room_refuses_before_anything_starts(lab, host_b, mover):
    uuids = hostdev_uuids(lab.domain_xml(mover))
    assert len(uuids) == 2
    # Another type on B's GPU: the driver then offers no nvidia-223 there.
    blocker = new_uuid()
    assert product.mdev(lab.vm, 'create', blocker, B, 'nvidia-231',
                        libvirt=False) == {'result': True}
    try:
        assert lab.available(B, TYPE) == 0
        # Our command: its checks see room (B's libvirt lists GPU A too,
        # which B's configuration leaves out), so libvirt starts and B's
        # migrate hook refuses, before B starts anything.
        t0 = time.monotonic()
        r = product.cli(lab.vm, 'migrate', mover, host_b.uri,
                        '--migrate-uri', LOOPBACK % 49152)
        conftest.record('migration refused by B (ours)',
                        time.monotonic() - t0)
        assert r.rc != 0, r.stdout
        # B's hook's own line, without libvirt's wrapping of it
        assert 'a qemu hook refused it: libvirt-gpu: cannot migrate' in \
            r.stderr and TYPE in r.stderr, r.stderr
        assert 'Child process' not in r.stderr, r.stderr
        conftest.OBSERVED['B without room says'] = r.stderr.strip()[-300:]
        assert_on_a_untouched(lab, host_b, uuids)
        # virsh straight (none of our checks): the same refusal
        r = lab.virsh('migrate', '--live', mover, host_b.uri,
                      LOOPBACK % 49153, timeout=300)
        assert r.rc != 0 and TYPE in r.stderr, r.stderr
        assert_on_a_untouched(lab, host_b, uuids)
        assert on_gpu(lab, B) == {blocker}
    finally:
        product.mdev(lab.vm, 'remove', blocker, libvirt=False)
    assert on_gpu(lab, B) == set()


def test_a_to_b_with_our_command_and_back_with_virsh(lab, host_b, mover):
    dom_uuid = guest_uuid(lab)
    a_uuids = hostdev_uuids(lab.domain_xml(mover))

    # A -> B: libvirt-gpu migrate (checks, then libvirt's peer-to-peer)
    t0 = time.monotonic()
    r = product.cli(lab.vm, 'migrate', mover, host_b.uri,
                    '--migrate-uri', LOOPBACK % 49155, '--json',
                    timeout=600)
    wall = time.monotonic() - t0
    r.check('libvirt-gpu migrate A -> B')
    done = json.loads(r.stdout)
    assert done['ok'] and done['migrated'] is True, done
    assert host_b.domain_state(mover) == 'running'
    assert not lab.is_running(mover)
    b_uuids = hostdev_uuids(host_b.virsh('dumpxml', mover).check().stdout)
    assert len(b_uuids) == 2 and not set(b_uuids) & set(a_uuids)
    assert on_gpu(lab, B) == set(b_uuids)
    # A's release removed A's vGPUs; A keeps no lease for the guest
    assert lab.wait(lambda: on_gpu(lab, A) == set(), 120), lab.mdevs()
    assert [le for le in product.leases(lab.vm)
            if le['domain'] == dom_uuid] == []
    leases_b = product.leases(lab.vm, host_b.state_dir)
    assert sorted(le['uuid'] for le in leases_b) == sorted(b_uuids)
    assert {(le['domain'], le['parent'], le['state'], le['expires_at'])
            for le in leases_b} == {(dom_uuid, B, 'created', None)}
    # the state moved with the devices
    assert [device_state(lab, u) for u in b_uuids] == list(STATES)
    state_bytes = [dmesg_bytes(lab, u, 'resumed') for u in b_uuids]
    assert all(state_bytes), state_bytes
    conftest.record('migration A -> B (libvirt-gpu migrate)', wall)
    conftest.OBSERVED['A -> B'] = (
        'libvirt: %.1f s job, downtime %s ms, %s bytes of memory; '
        'device state %s bytes per vGPU'
        % ((done['elapsed_ms'] or 0) / 1000.0, done['downtime_ms'],
           done['data_total'], state_bytes))

    # B -> A: virsh migrate --live (virsh talks to both daemons)
    t0 = time.monotonic()
    r = host_b.virsh('migrate', '--live', mover, lab_mod.URI,
                     LOOPBACK % 49156, timeout=600)
    wall = time.monotonic() - t0
    assert r.rc == 0, r.stderr + host_b.log()[-2000:]
    conftest.record('migration B -> A (virsh migrate --live)', wall)
    assert lab.is_running(mover)
    assert host_b.domain_state(mover) is None      # transient there
    back = hostdev_uuids(lab.domain_xml(mover))
    assert len(back) == 2 and not set(back) & set(b_uuids)
    assert on_gpu(lab, A) == set(back)
    assert [device_state(lab, u) for u in back] == list(STATES)
    assert lab.wait(lambda: on_gpu(lab, B) == set(), 120), lab.mdevs()
    assert product.leases(lab.vm, host_b.state_dir) == []
    leases_a = [le for le in product.leases(lab.vm)
                if le['domain'] == dom_uuid]
    assert sorted(le['uuid'] for le in leases_a) == sorted(back)
    stats = lab.virsh('domjobinfo', mover, '--completed').stdout
    conftest.OBSERVED['B -> A'] = ' '.join(
        line.strip() for line in stats.splitlines()
        if line.startswith(('Time elapsed:', 'Total downtime:')))


# B's hook interpreter for the abort test: the product's hook as usual,
# then, after a prepare, a 12 s pause, as on a destination whose QEMU
# takes its time to start (a large guest): the window in which the
# source's job waits for B, after B made its vGPUs, is then wide enough
# for a Ctrl-C every time (the test sees B's vGPUs within a second).
# ($1 is -IS, $2 the hook, $3 the domain, $4 the operation.)
SLOW_PREPARE = '/usr/local/bin/python-slow-prepare'
SLOW_PREPARE_SH = '''#!/bin/sh
%s "$@"; rc=$?
[ "$4" = prepare ] && sleep 12
exit $rc
''' % product.PYTHON

_IN_BACKGROUND = ('setsid -f sh -c \'"$0" "$@" > /tmp/mig-abort.out 2>&1; '
                  'echo $? > /tmp/mig-abort.rc\' "$@" '
                  '< /dev/null > /dev/null 2>&1')


def test_an_aborted_migration_leaves_the_guest_on_a_and_nothing_on_b(
        lab, host_b, mover):
    uuids = hostdev_uuids(lab.domain_xml(mover))
    lab.vm.write_file(SLOW_PREPARE, SLOW_PREPARE_SH)
    lab.vm.run(['chmod', '755', SLOW_PREPARE]).check()
    # B keeps this hook until host_b stops it after this test, the last
    # of the file: installing the usual one again would cost seconds.
    host_b.install_hook(python=SLOW_PREPARE)
    _abort_after_b_prepared(lab, host_b, mover, uuids)


def _abort_after_b_prepared(lab, host_b, mover, uuids):
    lab.vm.run(['rm', '-f', '/tmp/mig-abort.out', '/tmp/mig-abort.rc'])
    lab.vm.run(['sh', '-c', _IN_BACKGROUND, 'sh', product.CLI,
                '--config-file', product.CONFIG, 'migrate', mover,
                host_b.uri, '--migrate-uri', LOOPBACK % 49154]).check(
                    'migrate &')
    # B's prepare has made its vGPUs: QEMU starts there now; Ctrl-C.
    t0 = time.monotonic()
    lab.wait(lambda: len(on_gpu(lab, B)) == 2
             or lab.exists('/tmp/mig-abort.rc'), 300, 0.3)
    assert len(on_gpu(lab, B)) == 2, (
        lab.vm.run(['cat', '/tmp/mig-abort.out']).stdout
        + host_b.log()[-2000:])
    # the CLI's Python only, not the shell around it (a shell killed by
    # SIGINT would not write the exit status)
    lab.vm.run(['pkill', '-INT', '-f', '^[^ ]*python[^ ]* %s --config-file '
                '%s migrate' % (product.CLI, product.CONFIG)]).check(
                    'pkill -INT')
    assert len(product.leases(lab.vm, host_b.state_dir)) == 2
    assert lab.wait(lambda: lab.exists('/tmp/mig-abort.rc'), 300)
    conftest.record('migration aborted after B prepared',
                    time.monotonic() - t0)
    out = lab.vm.read('/tmp/mig-abort.out')
    assert lab.vm.read('/tmp/mig-abort.rc').strip() == '130', out
    assert 'aborted' in out, out
    # B's release ran for its QEMU: nothing of the guest is left there
    assert lab.wait(lambda: on_gpu(lab, B) == set(), 120), lab.mdevs()
    assert_on_a_untouched(lab, host_b, uuids)
