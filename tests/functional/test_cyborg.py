"""Our driver under the real OpenStack Cyborg 17.0.0, with a real Placement.

Cyborg's own ResourceTracker loads ``libvirt_gpu_driver`` by name through
stevedore, and its own conductor (``ConductorManager.report_data``, in the
same process over the fake transport) writes a real SQLite database
(``cyborg-dbsync create_schema``) and the test's Placement
(``placement_server``).  Each report is one process of Cyborg's venv
(``cyborg_env``); the simulated host is a T4 pair: af:00.0 holds two GRID
T4-2B vGPUs, 3b:00.0 none.
"""

import itertools
import json
import os
import tempfile

import pytest

from libvirt_gpu.openstack import cyborg_objects
from tests.functional import cyborg_env
from tests.functional import placement_server

AF, B3 = '0000:af:00.0', '0000:3b:00.0'
T4_2B = 'nvidia-223'
_names = itertools.count()


@pytest.fixture(scope='module')
def venv():
    return cyborg_env.ensure_venv()[0]


@pytest.fixture(scope='module')
def server():
    with placement_server.running() as srv:
        yield srv


@pytest.fixture(scope='module')
def schema(venv, tmp_path_factory):
    return cyborg_env.create_schema(venv, str(tmp_path_factory.mktemp('db')))


@pytest.fixture
def host(venv, server, schema, tmp_path):
    """A T4 host with T4-2B on af:00.0, its compute node in Placement."""
    h = cyborg_env.CyborgHost(venv, str(tmp_path), 'cy%d' % next(_names),
                              server.url, schema)
    h.write_host('t4')
    h.configure({T4_2B: [AF]})
    h.make_compute_node(server.adapter())
    return h


class Placement:
    def __init__(self, adapter):
        self.a = adapter

    def json(self, url):
        resp = self.a.get(url, raise_exc=False)
        assert resp.status_code == 200, (url, resp.text)
        return resp.json()

    def children(self, root_uuid):
        """{name: {uuid, parent, generation, inventories, traits}}."""
        found = {}
        for p in self.json('/resource_providers?in_tree=%s'
                           % root_uuid)['resource_providers']:
            if p['uuid'] == root_uuid:
                continue
            inv = self.json('/resource_providers/%s/inventories'
                            % p['uuid'])['inventories']
            found[p['name']] = {
                'uuid': p['uuid'], 'parent': p['parent_provider_uuid'],
                'generation': p['generation'],
                'inventories': {rc: (i['total'], i['reserved'], i['max_unit'])
                                for rc, i in inv.items()},
                'traits': set(self.json('/resource_providers/%s/traits'
                                        % p['uuid'])['traits'])}
        return found


@pytest.fixture
def placement(server):
    return Placement(server.adapter())


def ours(host):
    """Our own provider tree for the host (``placement show --json``) were
    its GPUs on our own route, children only, in the shape of
    ``Placement.children``, a vGPU's class as Cyborg's (CUSTOM_CYBORG_VGPU
    for VGPU: the one difference between the two routes' providers)."""
    tree = json.loads(host.libvirt_gpu('placement', 'show', '--json',
                                       conf=host.lg_conf_ours))
    rc = {'VGPU': cyborg_objects.CYBORG_VGPU_RC}
    found = {}
    for p in tree['resource_providers']:
        if p['parent_provider_uuid'] is None:
            continue
        found[p['name']] = {
            'uuid': p['uuid'],
            'inventories': {rc.get(c, c): (i['total'], i['reserved'],
                                           i['max_unit'])
                            for c, i in p['inventories'].items()},
            'traits': set(p['traits'])}
    return found


def without_generations(children):
    skip = ('generation', 'parent')
    return {n: {k: v for k, v in p.items() if k not in skip}
            for n, p in children.items()}


def test_cyborg_reports_our_gpus_as_our_own_sync_would(host, placement):
    drivers = host.report()
    assert drivers == ['libvirt_gpu.openstack.cyborg_driver.LibvirtGPUDriver']
    # Cyborg's rows
    assert host.rows('select vendor, model, type, hostname, std_board_info '
                     'from devices order by id') == [
        ('10de', 'NVIDIA Corporation TU104GL [Tesla T4]', 'GPU', host.hostname,
         '{"product_id": "1eb8", "controller": "3D controller"}')] * 2
    assert host.rows('select name, num_accelerators, driver_name from '
                     'deployables order by name') == [
        ('%s_%s' % (host.hostname, B3), 1, 'NVIDIA'),
        ('%s_%s' % (host.hostname, AF), 8, 'NVIDIA')]
    assert host.rows('select attach_type, count(*), sum(in_use) from '
                     'attach_handles group by attach_type') == [
        ('MDEV', 8, 0), ('PCI', 1, 0)]
    assert host.rows('select cpid_type, cpid_info from controlpath_ids '
                     'order by cpid_info') == [
        ('PCI', '{"bus": "%s", "device": "00", "domain": "0000", '
         '"function": "0"}' % bus) for bus in ('3b', 'af')]
    # Placement: the providers our own sync would make, under Nova's node
    got = placement.children(host.root_uuid)
    assert {p['parent'] for p in got.values()} == {host.root_uuid}
    assert without_generations(got) == ours(host)
    assert got['%s_%s' % (host.hostname, AF)]['traits'] == {
        'OWNER_CYBORG', 'CUSTOM_NVIDIA_1EB8_T4_2B',
        'HW_GPU_MAX_DISPLAY_HEADS_4'}


def test_discover_json_is_what_cyborg_gets(host):
    # The objects Cyborg's agent got from our driver (real Cyborg objects,
    # their fields) are what ``libvirt-gpu discover --json`` prints, field
    # by field, on the same host and configuration.
    got = host.report(objects=True)
    printed = json.loads(host.libvirt_gpu('discover', '--json'))
    assert got == printed
    assert [d['model'] for d in got] == [
        'NVIDIA Corporation TU104GL [Tesla T4]'] * 2
    assert [json.loads(d['std_board_info'])['controller']
            for d in got] == ['3D controller'] * 2


def test_a_second_report_changes_nothing(host, placement):
    host.report()
    rows = host.rows('select id, name from deployables order by id')
    handles = host.rows('select id, uuid from attach_handles order by id')
    before = placement.children(host.root_uuid)
    host.report()    # Cyborg's "same device" path reads vendor_board_info
    assert placement.children(host.root_uuid) == before
    assert host.rows('select id, name from deployables order by id') == rows
    assert host.rows('select id, uuid from attach_handles '
                     'order by id') == handles


def test_our_sync_after_cyborgs_report_moves_no_generation(
        host, placement, server):
    host.report()
    before = placement.children(host.root_uuid)
    out = host.libvirt_gpu('placement', 'sync', '--url', server.url,
                           '--json')
    report = json.loads(out)
    assert placement.children(host.root_uuid) == before, report
    assert len(before) == 2


def test_vgpu_whole_vgpu_flip_keeps_every_trait(host, placement):
    both = {T4_2B: [AF, B3]}
    host.configure(both)
    host.report()
    name = '%s_%s' % (host.hostname, B3)
    vgpu_traits = {'OWNER_CYBORG', 'CUSTOM_NVIDIA_1EB8_T4_2B',
                   'HW_GPU_MAX_DISPLAY_HEADS_4'}
    assert placement.children(host.root_uuid)[name]['traits'] == vgpu_traits
    host.configure({T4_2B: [AF]})
    host.report()
    whole = placement.children(host.root_uuid)[name]
    assert whole['traits'] == {'OWNER_CYBORG', 'CUSTOM_NVIDIA_1EB8'}
    assert whole['inventories'] == {'PGPU': (1, 0, 1)}
    host.configure(both)
    host.report()
    again = placement.children(host.root_uuid)
    assert again[name]['traits'] == vgpu_traits
    assert again[name]['inventories'] == {
        cyborg_objects.CYBORG_VGPU_RC: (8, 0, 8)}
    assert without_generations(again) == ours(host)
    # Cyborg's rows say the same
    assert sorted(v for (v,) in host.rows(
        "select a.value from attributes a join deployables d on "
        "d.id = a.deployable_id where d.name = ? and a.key like 'trait%'",
        name)) == sorted(vgpu_traits)


def test_a_gpu_removed_removes_its_provider(host, placement):
    host.report()
    gone = placement.children(host.root_uuid)['%s_%s' % (host.hostname, B3)]
    # The GPU leaves the host: discovery no longer sees it.
    os.unlink(os.path.join(host.sysfs_root, 'bus', 'pci', 'devices', B3))
    host.report()
    got = placement.children(host.root_uuid)
    assert list(got) == ['%s_%s' % (host.hostname, AF)]
    assert placement.a.get('/resource_providers/%s' % gone['uuid'],
                           raise_exc=False).status_code == 404
    assert host.rows('select name from deployables') == [
        ('%s_%s' % (host.hostname, AF),)]
    assert without_generations(got) == ours(host)


def test_a_refused_report_leaves_cyborgs_devices_in_place(host, placement):
    """The host read wrongly (its bus/pci/devices empty): our driver's
    discover() raises instead of reporting nothing, Cyborg's
    ResourceTracker.update_usage sends no report (its agent's periodic
    task logs the error and runs again next cycle), and every device,
    deployable and provider stays.  Whole GPUs only: no vGPU GPU named in
    the configuration, whose absence the configuration refuses anyway."""
    host.configure({})
    host.report()
    before = placement.children(host.root_uuid)
    rows = host.rows('select id, name from deployables order by id')
    handles = host.rows('select id, uuid from attach_handles order by id')
    assert len(host.rows('select id from devices')) == 2
    devices = os.path.join(host.sysfs_root, 'bus', 'pci', 'devices')
    for name in os.listdir(devices):
        os.unlink(os.path.join(devices, name))
    with pytest.raises(cyborg_env.CyborgError) as e:
        host.report()
    assert 'libvirt_gpu_driver refuses to report' in str(e.value)
    assert 'no GPU' in str(e.value)
    assert placement.children(host.root_uuid) == before
    assert host.rows('select id, name from deployables order by id') == rows
    assert host.rows('select id, uuid from attach_handles '
                     'order by id') == handles
    assert len(host.rows('select id from devices')) == 2


def test_cyborgs_own_gpu_options_are_warned_about(venv, server, schema):
    with tempfile.TemporaryDirectory() as workdir:
        h = cyborg_env.CyborgHost(venv, workdir, 'cy-warn', server.url,
                                  schema)
        h.write_host('t4')
        h.configure({})
        with open(h.conf, 'a') as f:
            f.write('\n[gpu_devices]\nenabled_vgpu_types = nvidia-223\n'
                    '[vgpu_nvidia-223]\ndevice_addresses = %s\n' % AF)
        h.make_compute_node(server.adapter())
        h.report()
        assert ('libvirt_gpu_driver does not read '
                '[gpu_devices]/enabled_vgpu_types' in h.log_text())
        # libvirt-gpu's configuration is what counts: both GPUs whole
        # but af:00.0, which holds vGPUs (a device with nothing to offer).
        assert h.rows('select name from deployables') == [
            ('cy-warn_%s' % B3,)]
        assert len(h.rows('select id from devices')) == 2


def test_real_conductor_and_agent_over_rabbitmq(venv, server, schema,
                                                placement, tmp_path):
    # RabbitMQ from Debian's packages; cyborg-conductor and cyborg-agent
    # as an operator runs them, [agent] enabled_drivers =
    # libvirt_gpu_driver.
    with cyborg_env.rabbitmq() as transport:
        h = cyborg_env.CyborgHost(venv, str(tmp_path), 'cy-rabbit',
                                  server.url, schema, transport=transport)
        h.write_host('t4')
        h.configure({T4_2B: [AF]})
        h.make_compute_node(server.adapter())
        with cyborg_env.Service(h, 'cyborg-conductor') as conductor:
            cyborg_env.wait_for(
                lambda: 'Created RPC server' in conductor.log_text(), 120,
                'cyborg-conductor serving', conductor.process,
                conductor.log)
            with cyborg_env.Service(h, 'cyborg-agent') as agent:
                cyborg_env.wait_for(
                    lambda: len(h.rows('select id from deployables')) == 2
                    and len(placement.children(h.root_uuid)) == 2, 120,
                    'the agent\'s first report', agent.process, agent.log)
    got = placement.children(h.root_uuid)
    assert without_generations(got) == ours(h)
    assert {p['parent'] for p in got.values()} == {h.root_uuid}


def test_a_broken_configuration_removes_nothing(host, placement):
    # A typo in libvirt-gpu's configuration must not read as "no GPUs":
    # discover() fails, with the configuration's one-line reason, and
    # Cyborg keeps every row and provider.
    host.report()
    before = placement.children(host.root_uuid)
    rows = host.rows('select id, name from deployables order by id')
    host.configure({'nvidia-999': [AF]})
    with pytest.raises(cyborg_env.CyborgError) as failed:
        host.report()
    assert 'nvidia-999' in str(failed.value)
    assert ('libvirt_gpu_driver: nothing reported, Cyborg keeps what it '
            'has: ') in host.log_text()
    assert placement.children(host.root_uuid) == before
    assert host.rows('select id, name from deployables order by id') == rows


def test_vendor_interface_vgpus_stay_out_of_cyborg(venv, server, schema,
                                                   placement, tmp_path):
    # L40S, vGPU 17+: a vGPU is a VF whose type NVIDIA's interface sets,
    # which nothing in Cyborg does (and Nova would pass a VF from Cyborg
    # managed): the GPU with a type enabled is a device with nothing to
    # offer (the reason in Cyborg's log), the other one stays whole.
    # 3d:00.0 holds vGPUs, so it is not offered whole either.
    h = cyborg_env.CyborgHost(venv, str(tmp_path), 'cy-l40s', server.url,
                              schema)
    h.write_host('l40s')
    h.configure({'nvidia-1145': ['0000:bd:00.0']})
    h.make_compute_node(server.adapter())
    got = h.report(objects=True)
    assert got == json.loads(h.libvirt_gpu('discover', '--json'))
    assert [d['deployable_list'] for d in got] == [[], []]
    assert placement.children(h.root_uuid) == {}
    assert h.rows('select count(*) from devices') == [(2,)]
    assert h.rows('select count(*) from deployables') == [(0,)]
    assert h.rows('select count(*) from attach_handles') == [(0,)]
    assert ('0000:bd:00.0: reported to Cyborg with nothing to offer: vGPU '
            'type nvidia-1145 is made through the nvidia vendor interface'
            in h.log_text())
    h.configure({})
    h.report()
    got = placement.children(h.root_uuid)
    assert list(got) == ['cy-l40s_0000:bd:00.0']
    assert got['cy-l40s_0000:bd:00.0']['inventories'] == {'PGPU': (1, 0, 1)}
