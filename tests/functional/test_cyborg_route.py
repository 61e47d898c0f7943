"""The route the specs were written for: a Cyborg-bound vGPU reaching a
guest through Nova 34's own code, on a real libvirtd with our hook, the
live simulated T4, and our reconcile and restore in every window.

The T4's ``0000:af:00.0`` is Cyborg's (``[routes]/cyborg``), ``0000:3b:00.0``
ours.  Cyborg's agent binds an ARQ by writing the attach handle's UUID to
the type's ``create`` (what its privsep helper does; the real Cyborg's
bind runs in test_cyborg_bind.py); Nova 34's ``_allocate_cyborg_mdevs``
and ``_guest_add_mdevs`` run in ``.venv-nova`` through the probe (against
this libvirtd: with the vGPU present, and absent, when Nova creates,
defines and autostarts it).

The second half is the scheduling side, on the real Placement: Nova's own
vGPU providers (made by Nova's own ``_ensure_pgpu_providers``) and
Cyborg's (made by Cyborg's conductor from our driver) under one compute
node, and Nova's request code for a flavor asking ``resources:VGPU=1`` and
for a Cyborg device profile."""

import json
import os
import subprocess
import sys
import uuid as uuidlib

import pytest

from tests.functional import cyborg_env
from tests.functional import hook_guests as hg
from tests.functional import libvirtd
from tests.functional import live_sysfs as ls
from tests.functional import nova_env
from tests.functional import placement_server

OURS = '0000:3b:00.0'
CYBORGS = '0000:af:00.0'
TYPE = 'nvidia-223'
HANDLE_INFO = {'domain': '0000', 'bus': 'af', 'device': '00',
               'function': '0', 'asked_type': TYPE}

missing = ls.live_host_requirements()
pytestmark = pytest.mark.skipif(bool(missing), reason='; '.join(missing))


class CyborgRouteSetup(hg.HookSetup):
    """Our hook, with the T4's second GPU given to Cyborg."""

    def hooks(self, live):
        found = super().hooks(live)
        with open(self.config, 'a') as f:
            f.write('[routes]\ncyborg = %s\nnova_conf =\n' % CYBORGS)
        return found


@pytest.fixture(scope='module')
def nova():
    venv, _ = nova_env.ensure_venv()
    return venv


@pytest.fixture(scope='module')
def host(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp('cyborg-route'))
    setup = CyborgRouteSetup(workdir, TYPE)
    with ls.LiveHost(workdir, hooks=setup.hooks) as h:
        h.setup = setup
        h.workdir = workdir
        yield h


def cli(host, *args):
    """Our CLI on the host: (exit status, stdout as JSON)."""
    result = subprocess.run(
        [sys.executable, '-m', 'libvirt_gpu.cmd.main', '--config-file',
         host.setup.config, '-c', host.uri] + list(args) + ['--json'],
        capture_output=True, text=True, timeout=300, cwd=ls.REPO)
    assert result.returncode in (0, 1, 3), result.stderr
    return result.returncode, json.loads(result.stdout)


def reconcile(host, dry_run=False):
    args = ['reconcile', '--mdevctl-dir', host.mdevctl_dir]
    return cli(host, *(args + (['--dry-run'] if dry_run else [])))[1]


def restore(host, dry_run=False):
    args = ['restore', '--mdevctl-dir', host.mdevctl_dir]
    return cli(host, *(args + (['--dry-run'] if dry_run else [])))


def findings(report, uuid):
    return [(f['action'], f['what']) for f in report['findings']
            if f['uuid'] == uuid]


def live_mdevs(host):
    return {m['uuid'] for m in host.live.state()['mdevs']}


def definition_path(host, uuid):
    return os.path.join(host.mdevctl_dir, CYBORGS, uuid)


def bind(host, uuid):
    """What Cyborg's agent does for a bound ARQ: the handle's UUID to the
    type's ``create`` (not persistent)."""
    host.live.sysfs.write(host.live.type_path(CYBORGS, TYPE, 'create'), uuid)


def unbind(host, uuid):
    """What Cyborg's unbind does: ``remove`` of the live device only."""
    host.live.sysfs.write(host.live.path('bus', 'mdev', 'devices', uuid,
                                         'remove'), '1')


def nova_spawn(host, nova, uuid):
    """Nova 34's spawn of an instance with one bound ARQ of handle
    ``uuid``: ``_allocate_cyborg_mdevs`` then ``_guest_add_mdevs``."""
    probe = nova_env.Judge(nova, os.path.join(host.workdir, 'nova'))
    arq = {'uuid': str(uuidlib.uuid4()), 'attach_handle_type': 'MDEV',
           'attach_handle_uuid': uuid, 'attach_handle_info': HANDLE_INFO}
    return probe.run(['cyborg_mdevs'], uri=host.uri, arqs=[arq])


def define_guest(host, name, hostdevs):
    """The instance's domain as Nova defines it: no metadata of ours."""
    conn = host.daemon.connect()
    return conn.defineXML(libvirtd.tiny_domain_xml(
        name, extra_devices=''.join(hostdevs)))


def test_a_cyborg_vgpu_from_bind_to_a_new_bind_of_its_handle(host, nova):
    import libvirt
    present = str(uuidlib.uuid4())
    # bind; reconcile in the window before Nova's spawn keeps it
    bind(host, present)
    report = reconcile(host, dry_run=True)
    assert findings(report, present) == [('kept', 'mdev')]
    assert 'given to Cyborg' in report['findings'][0]['reason']
    reconcile(host)
    assert present in live_mdevs(host)
    # Nova's spawn with the vGPU present: found, used, not defined
    spawned = nova_spawn(host, nova, present)
    assert spawned['existed'] == {present: True}
    assert spawned['mdevs'] == [present]
    (hostdev,) = spawned['hostdevs']
    assert "type=\"mdev\"" in hostdev and present in hostdev
    assert not os.path.exists(definition_path(host, present))
    # the guest starts (no VFIO here: prepare, then the start fails) and
    # our hook leaves its vGPU alone
    dom = define_guest(host, 'instance-cyborg-1', spawned['hostdevs'])
    with pytest.raises(libvirt.libvirtError):
        dom.create()
    assert present in live_mdevs(host)
    assert hg.leases(host) == []
    assert findings(reconcile(host), present) == []   # its domain's
    # delete: Nova undefines, Cyborg unbinds
    dom.undefine()
    unbind(host, present)
    assert present not in live_mdevs(host)

    # Nova's spawn with the vGPU absent (a reconcile of old, a reboot):
    # Nova creates it, defines it and sets autostart
    absent = str(uuidlib.uuid4())
    spawned = nova_spawn(host, nova, absent)
    assert spawned['existed'] == {absent: False}
    assert absent in live_mdevs(host)
    assert os.path.exists(definition_path(host, absent))
    dom = define_guest(host, 'instance-cyborg-2', spawned['hostdevs'])
    report = reconcile(host)
    assert findings(report, absent) == []            # its domain names it
    # delete: the definition outlives the ARQ
    dom.undefine()
    unbind(host, absent)
    assert absent not in live_mdevs(host)
    assert os.path.exists(definition_path(host, absent))
    code, report = restore(host, dry_run=True)
    would = [a for a in report['actions'] if a['target'] == absent]
    assert [a['action'] for a in would] == ['skipped', 'would'], would
    assert 'would create' not in json.dumps(would)
    # a reboot: libvirt starts the definition again (autostart; started
    # here through libvirt when this libvirtd did not, as nova-compute's
    # init_host would)
    host.daemon.stop()
    host.daemon.start()
    if absent not in live_mdevs(host):
        host.daemon.connect().nodeDeviceLookupByName(
            'mdev_%s_0000_af_00_0' % absent.replace('-', '_')).create()
    assert absent in live_mdevs(host)
    code, report = restore(host)
    done = [(a['action'], a['detail'].split(': ')[0])
            for a in report['actions'] if a['target'] == absent]
    assert done == [('skipped', '%s on %s' % (TYPE, CYBORGS)),
                    ('undefined', 'mdev+definition')], report
    assert absent not in live_mdevs(host)
    assert not os.path.exists(definition_path(host, absent))
    # a new bind of the same handle finds its UUID free
    bind(host, absent)
    assert absent in live_mdevs(host)
    unbind(host, absent)


# -- scheduling: Nova's own vGPUs beside Cyborg's --------------------------

@pytest.fixture(scope='module')
def server():
    with placement_server.running() as s:
        yield s


@pytest.fixture(scope='module')
def cyborg():
    venv, _ = cyborg_env.ensure_venv()
    return venv


def test_nova_native_and_cyborg_requests_land_on_their_own_route(
        tmp_path, server, cyborg, nova):
    for sub in ('schema', 'cyborg'):
        os.makedirs(str(tmp_path / sub))
    schema = cyborg_env.create_schema(cyborg, str(tmp_path / 'schema'))
    host = cyborg_env.CyborgHost(cyborg, str(tmp_path / 'cyborg'),
                                 'compute-1', server.url, schema)
    host.write_host('t4')
    nova_conf = str(tmp_path / 'nova.conf')
    with open(nova_conf, 'w') as f:
        f.write('[devices]\nenabled_mdev_types = %s\n[mdev_%s]\n'
                'device_addresses = %s\n' % (TYPE, TYPE, OURS))
    host.configure({TYPE: [CYBORGS]}, cyborg=(CYBORGS,), nova_conf=nova_conf)
    # a GPU two routes claim is refused, in one line naming both
    clash = str(tmp_path / 'clash.conf')
    with open(host.lg_conf) as f:
        text = f.read().replace('cyborg = %s' % CYBORGS, 'cyborg = %s'
                                % OURS)
    with open(clash, 'w') as f:
        f.write(text)
    result = subprocess.run(
        [sys.executable, '-m', 'libvirt_gpu.cmd.main', '--config-file',
         clash, 'list'], capture_output=True, text=True, timeout=120,
        cwd=ls.REPO)
    assert result.returncode != 0
    assert ('a GPU can\'t be claimed by two routes: [routes]/cyborg gives '
            '%s to cyborg and %s [mdev_%s]/device_addresses gives it to '
            'nova-vgpu' % (OURS, nova_conf, TYPE)) in result.stderr
    # Nova's compute node and its own vGPU provider, as Nova makes them
    probe = nova_env.Judge(nova, str(tmp_path / 'nova'))
    with open(nova_conf) as f:
        probe.write(f.read())
    host.root_uuid = str(uuidlib.uuid4())
    made = probe.run(['nova_vgpus'], placement=server.url,
                     hostname=host.hostname, compute_uuid=host.root_uuid,
                     pgpus={'pci_0000_3b_00_0': 4})
    novas = {p['name']: p['uuid'] for p in made['providers']}
    nova_vgpu = novas['compute-1_pci_0000_3b_00_0']
    # Cyborg's provider of its GPU, from our driver through its conductor
    host.report()
    children = cyborg_env_children(server, host.root_uuid)
    cyborg_vgpu = children['compute-1_%s' % CYBORGS]
    assert set(children) == {'compute-1_pci_0000_3b_00_0',
                             'compute-1_%s' % CYBORGS}
    # our own agent's sync leaves both alone
    host.libvirt_gpu('placement', 'sync', '--url', server.url)
    assert cyborg_env_children(server, host.root_uuid) == children
    # Nova's request code: flavor -> request groups -> owner pre-filter
    asked = probe.run(['extra_candidates'], placement=server.url,
                      extra_specs=[{'resources:VGPU': '1'}],
                      device_profile_groups=[[{
                          'resources:CUSTOM_CYBORG_VGPU': '1',
                          'trait:CUSTOM_NVIDIA_1EB8_T4_2B': 'required'}]])
    flavor, profile = asked['candidates']
    assert {rp for c in flavor['candidates'] for rp in c} == {nova_vgpu}
    assert {rp for c in profile['candidates'] for rp in c} == {cyborg_vgpu}


def cyborg_env_children(server, root_uuid):
    """``{name: uuid}`` of the root's children in Placement."""
    adapter = server.adapter()
    found = adapter.get('/resource_providers?in_tree=%s' % root_uuid,
                        headers={'OpenStack-API-Version': 'placement 1.14'}
                        ).json()['resource_providers']
    return {p['name']: p['uuid'] for p in found if p['uuid'] != root_uuid}
