"""What ``list``, ``domgpus`` and the exporter say of each GPU's and
vGPU's route, on the simulated T4 host split between three routes:
0000:af:00.0 (holding the profile's two vGPUs) given to Cyborg by
``[routes]/cyborg``, 0000:3b:00.0 Nova's own vGPU route by the nova.conf
``[routes]/nova_conf`` names.  Each vGPU's domain comes from its lease, or
from libvirt (the test driver on the simulated host's node devices, with a
running domain naming a vGPU)."""

import json

import pytest
from prometheus_client import parser as prom_parser

from libvirt_gpu.cmd import main as cli
from libvirt_gpu import conf as conf_mod
from libvirt_gpu import environment
from libvirt_gpu import exporter
from libvirt_gpu import objects
from libvirt_gpu import simulator
from libvirt_gpu.store import state
from tests.doubles import tables

A = '0000:3b:00.0'            # Nova's own vGPU route
B = '0000:af:00.0'            # Cyborg's
# the vGPUs the t4 profile holds on B
PRE = ['4b20d080-1b54-4048-85b3-a6a62d165c01',
       'b1ae8bf6-38b0-4c81-9d44-78ce3f520496']
DOM = '6a8a3b1e-9d0b-4a55-9d84-3c7f0f3f4e21'
NOVA_DOM = 'c0ffee00-0000-4000-8000-000000000001'


@pytest.fixture(scope='module')
def t4(tmp_path_factory):
    """The simulated T4 host: its sysfs root and the test driver's URI of
    its node devices, with a running domain ``instance-1`` (Nova's) whose
    hostdev names ``PRE[1]``."""
    root = tmp_path_factory.mktemp('t4')
    node_xml = simulator.write_host(simulator.load_profile('t4'), root)
    with open(node_xml) as f:
        text = f.read()
    domain = ('<domain type="test"><name>instance-1</name><uuid>%s</uuid>'
              '<memory>65536</memory><vcpu>1</vcpu><os><type>hvm</type></os>'
              '<devices><hostdev mode="subsystem" type="mdev" '
              'model="vfio-pci"><source><address uuid="%s"/></source>'
              '</hostdev></devices></domain>' % (NOVA_DOM, PRE[1]))
    assert text.rstrip().endswith('</node>')
    with open(node_xml, 'w') as f:
        f.write(text.rstrip()[:-len('</node>')] + domain + '</node>\n')
    return str(root), 'test://' + node_xml


def _conf(tmp_path, root, routes=True):
    nova = tmp_path / 'nova.conf'
    nova.write_text('[devices]\nenabled_mdev_types = nvidia-222\n'
                    '[mdev_nvidia-222]\ndevice_addresses = %s\n' % A)
    path = tmp_path / 'libvirt-gpu.conf'
    path.write_text(
        '[DEFAULT]\nstate_dir = %s\nsysfs_root = %s\n'
        '[gpu]\nenabled_vgpu_types = nvidia-223\n'
        '[vgpu_nvidia-223]\ndevice_addresses = %s\n%s'
        % (tmp_path / 'state', root, B,
           '[routes]\ncyborg = %s\nnova_conf = %s\n' % (B, nova)
           if routes else '[routes]\nnova_conf =\n'))
    return str(path)


def _lease(conf, uuid, domain):
    env = environment.Environment.from_conf(conf_mod.load(conf))
    with env.store.transaction() as txn:
        txn.add(objects.Uuid.parse(uuid), objects.Uuid.parse(domain),
                objects.PciAddress.parse(B), objects.TypeId.parse(
                    'nvidia-223'), state.CREATED)
    return env


def _cli(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# --- list --------------------------------------------------------------------

def test_list_json_says_each_gpus_and_vgpus_route_and_domain(
        capsys, t4, tmp_path):
    root, _ = t4
    conf = _conf(tmp_path, root)
    _lease(conf, PRE[0], DOM)
    code, out, err = _cli(capsys, '--config-file', conf, '--sysfs-root',
                          root, 'list', '--json')
    assert code == 0, err
    gpus = {g['address']: g for g in json.loads(out)}
    assert {a: g['route'] for a, g in gpus.items()} == {
        A: 'nova-vgpu', B: 'cyborg'}
    # sysfs only: the domain is the lease's, by UUID
    assert gpus[B]['mdevs'] == [
        {'uuid': PRE[0], 'type': 'nvidia-223', 'route': 'cyborg',
         'domain': None, 'domain_uuid': DOM},
        {'uuid': PRE[1], 'type': 'nvidia-223', 'route': 'cyborg',
         'domain': None, 'domain_uuid': None}]


def test_list_json_without_routes_says_every_gpu_is_ours(capsys, t4,
                                                         tmp_path):
    root, _ = t4
    conf = _conf(tmp_path, root, routes=False)
    code, out, _ = _cli(capsys, '--config-file', conf, '--sysfs-root', root,
                        'list', '--json')
    assert code == 0
    gpus = json.loads(out)
    assert {g['route'] for g in gpus} == {'libvirt-gpu'}
    assert {m['route'] for g in gpus for m in g['mdevs']} == {'libvirt-gpu'}


def test_list_through_libvirt_names_the_domain_of_a_vgpu_without_lease(
        capsys, t4, tmp_path):
    root, uri = t4
    conf = _conf(tmp_path, root)
    _lease(conf, PRE[0], DOM)
    code, out, err = _cli(capsys, '--config-file', conf, '-c', uri,
                          '--sysfs-root', root, 'list', '--json')
    assert code == 0, err
    (gpu,) = [g for g in json.loads(out) if g['address'] == B]
    # the lease's domain is not a domain of this libvirt: unnamed; Nova's
    # running instance names Cyborg's vGPU
    assert [(m['uuid'], m['domain'], m['domain_uuid'])
            for m in gpu['mdevs']] == [(PRE[0], None, DOM),
                                       (PRE[1], 'instance-1', NOVA_DOM)]


def test_list_text_has_a_route_column_and_a_table_of_the_vgpus(
        capsys, t4, tmp_path):
    root, uri = t4
    code, out, err = _cli(capsys, '--config-file', _conf(tmp_path, root),
                          '-c', uri, '--sysfs-root', root, 'list')
    assert code == 0, err
    assert {r['ADDRESS']: r['ROUTE'] for r in tables.rows(out)} == {
        A: 'nova-vgpu', B: 'cyborg'}
    vgpus = out[out.index('\nVGPU '):]
    assert [(r['VGPU'], r['GPU'], r['ROUTE'], r['DOMAIN'])
            for r in tables.rows(vgpus)] == [
        (PRE[0], B, 'cyborg', '-'), (PRE[1], B, 'cyborg', 'instance-1')]


def test_list_refuses_a_gpu_two_routes_claim(capsys, t4, tmp_path):
    root, _ = t4
    conf = tmp_path / 'two.conf'
    with open(_conf(tmp_path, root)) as f:
        conf.write_text(f.read().replace('cyborg = %s' % B,
                                         'cyborg = %s' % A))
    code, out, err = _cli(capsys, '--config-file', str(conf),
                          '--sysfs-root', root, 'list', '--json')
    assert (code, out) == (1, '')
    assert err.splitlines()[-1].startswith('libvirt-gpu: error: ')
    assert "a GPU can't be claimed by two routes: " in err
    assert len(err.splitlines()) == 1


# --- domgpus -----------------------------------------------------------------

def test_domgpus_says_the_route_of_each_vgpu(capsys, t4, tmp_path):
    root, uri = t4
    conf = _conf(tmp_path, root)
    code, out, err = _cli(capsys, '--config-file', conf, '-c', uri,
                          '--sysfs-root', root, 'domgpus', 'instance-1',
                          '--json')
    assert code == 0, err
    assert [(v['uuid'], v['parent'], v['route'])
            for v in json.loads(out)['vgpus']] == [(PRE[1], B, 'cyborg')]
    code, out, err = _cli(capsys, '--config-file', conf, '-c', uri,
                          '--sysfs-root', root, 'domgpus', 'instance-1')
    assert code == 0, err
    head, rule, row = out.splitlines()[1:]
    assert head.split() == ['KIND', 'UUID', 'TYPE', 'GPU', 'ROUTE', 'EXISTS',
                            'LEASE', 'SOURCE']
    assert row.split()[:6] == ['vgpu', PRE[1], 'nvidia-223', B, 'cyborg',
                               'yes']


# --- the exporter ------------------------------------------------------------

def _scrape(conf):
    env = environment.Environment.from_conf(conf_mod.load(conf))
    found = {}
    for family in prom_parser.text_string_to_metric_families(
            exporter.exposition(exporter.HostCollector(env))):
        for s in family.samples:
            found.setdefault(s.name, []).append(s.labels)
    return found


def test_the_exporter_labels_each_gpu_and_vgpu_with_its_route(t4, tmp_path):
    root, _ = t4
    conf = _conf(tmp_path, root)
    _lease(conf, PRE[0], DOM)
    found = _scrape(conf)
    assert {s['gpu']: s['route'] for s in found[
        'libvirt_gpu_gpu_info']} == {A: 'nova-vgpu', B: 'cyborg'}
    assert sorted((s['uuid'], s['route'], s['domain_uuid'])
                  for s in found['libvirt_gpu_vgpu_info']) == [
        (PRE[0], 'cyborg', DOM), (PRE[1], 'cyborg', '')]


def _surveyed(tmp_path, conf):
    """One scrape with libvirt (a file-backed fake with no domain) and
    reconcile's dry run handed in as the CLI hands it:
    ``{(name, labels): value}``."""
    from libvirt_gpu.cmd import service_cmds
    from libvirt_gpu.virt import host as host_mod
    from tests.doubles import fake_libvirt
    conn = fake_libvirt.FakeConnection(str(tmp_path / 'doms'))
    env = environment.Environment.from_conf(
        conf_mod.load(conf), conn=host_mod.Host.from_connection(conn))
    collector = exporter.HostCollector(
        env, survey=service_cmds._survey(env, 'qemu:///system'))
    found = {}
    for family in prom_parser.text_string_to_metric_families(
            exporter.exposition(collector)):
        for s in family.samples:
            found[(s.name, frozenset(s.labels.items()))] = s.value
    return found


def _findings(found):
    return sorted((dict(k[1])['uuid'], dict(k[1])['action'],
                   dict(k[1])['route']) for k in found
                  if k[0] == 'libvirt_gpu_reconcile_finding')


def test_the_exporter_counts_no_cyborg_vgpu_as_an_orphan(t4, tmp_path):
    """Cyborg's vGPUs no domain names yet (bound, Nova's spawn to come)
    are kept findings of Cyborg's route, not unexplained vGPUs; the same
    vGPUs on a GPU of ours are."""
    root, _ = t4
    found = _surveyed(tmp_path, _conf(tmp_path, root))
    assert found[('libvirt_gpu_unexplained_vgpus', frozenset())] == 0
    assert _findings(found) == [(PRE[0], 'kept', 'cyborg'),
                                (PRE[1], 'kept', 'cyborg')]
    ours = tmp_path / 'ours'
    ours.mkdir()
    found = _surveyed(ours, _conf(ours, root, routes=False))
    assert found[('libvirt_gpu_unexplained_vgpus', frozenset())] == 2
    assert _findings(found) == [(PRE[0], 'would remove', 'libvirt-gpu'),
                                (PRE[1], 'would remove', 'libvirt-gpu')]
