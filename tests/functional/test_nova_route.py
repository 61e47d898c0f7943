"""The Nova route (vendor-interface VFs carved by libvirt-gpu, handed to
Nova's PCI passthrough) judged by OpenStack Nova 34's own code.

One L40S host for the module (``l40s`` profile on the live FUSE tree, a
real libvirtd with our qemu hook installed): 0000:bd:00.0 is carved for
Nova, four L40S-12Q (``nvidia-1153``) VFs; 0000:3d:00.0 is the product's
own route (``nvidia-1145``, two VFs already holding one each).  Nova runs
in ``.venv-nova`` through ``tests/functional/nova_probe.py``: it parses
what ``libvirt-gpu nova-config`` prints, lists the host's PCI devices
from the libvirtd as its libvirt driver does, filters them through its
device specs, reports them to a real Placement with its PCI-in-Placement
translation and asks Placement for allocation candidates as its
scheduler does.  The product's own Placement sync reports the same host.
"""

import json
import os
import re
import subprocess
import sys
import uuid as uuidlib

import pytest

from libvirt_gpu.devices.backends.nvidia_vgpu.files import (
    VendorFiles as vendor)
from libvirt_gpu import objects
from tests.functional import hook_guests as hg
from tests.functional import libvirtd
from tests.functional import live_sysfs as ls
from tests.functional import nova_env
from tests.functional import placement_server

HOSTNAME = 'gpu-l40s-01'
CARVED_GPU = '0000:bd:00.0'
OTHER_GPU = '0000:3d:00.0'
OTHER_PRE = {'0000:3d:00.4': 'nvidia-1145', '0000:3d:00.5': 'nvidia-1145'}
CARVED_TYPE = 'nvidia-1153'              # NVIDIA L40S-12Q: 4 fill the GPU
COUNT = 4
PCI_VFIO_ERROR = "host doesn't support passthrough of host PCI devices"

CONFIG = """\
[DEFAULT]
sysfs_root = {root}
state_dir = {state}

[gpu]
nvml = off
enabled_vgpu_types = nvidia-1145

[vgpu_nvidia-1145]
device_addresses = {other}
"""
# The README's carving ("With OpenStack Nova": its test checks they agree).
CARVING = """
[nova]
carved = l40s_12q

[nova_l40s_12q]
gpus = {carved}
vgpu_type = {type}
count = {count}
"""

missing = ls.live_host_requirements()
pytestmark = pytest.mark.skipif(bool(missing), reason='; '.join(missing))


class Setup(hg.HookSetup):
    """Our hook and configuration: the host's two routes."""

    def hooks(self, live):
        hooks = super().hooks(live)
        # HookSetup wrote a configuration of one type: ours replaces it
        with open(self.config, 'w') as f:
            f.write((CONFIG + CARVING).format(
                root=live.root, state=self.state_dir, other=OTHER_GPU,
                carved=CARVED_GPU, type=CARVED_TYPE, count=COUNT))
        return hooks


class ReadmeNova(object):
    """README's "With OpenStack Nova": its configuration (``ini``), its
    commands (``sh``) and the flavor's extra spec it names."""

    def __init__(self, section):
        (self.ini,) = re.findall(r'^```ini\n(.*?)^```', section,
                                 flags=re.S | re.M)
        (self.sh,) = re.findall(r'^```sh\n(.*?)^```', section,
                                flags=re.S | re.M)
        (self.alias,) = re.findall(r'pci_passthrough:alias=([\w.-]+:\d+)',
                                   section)

    def commands(self):
        return [line.split(' #', 1)[0].strip()
                for line in self.sh.splitlines() if line.strip()]


def readme_nova():
    """The README's section (``ReadmeNova``)."""
    with open(os.path.join(ls.REPO, 'README.md')) as f:
        text = f.read()
    assert '\n## With OpenStack Nova\n' in text
    return ReadmeNova(text.split('\n## With OpenStack Nova\n', 1)[1]
                      .split('\n## ')[0])


def cli(host, *argv, hostname=HOSTNAME, libvirt=False):
    """``libvirt-gpu ARGV`` as a process with the host's configuration
    (CompletedProcess); ``libvirt``: through the host's libvirtd (what
    nova-config asks it: its libvirt and QEMU versions), else the live
    tree read as sysfs (quicker: libvirtd lists the FUSE tree slowly)."""
    where = ['-c', host.uri] if libvirt else []
    return subprocess.run(
        [sys.executable, '-m', 'libvirt_gpu.cmd.main'] + where + [
            '--config-file', host.setup.config, '--hostname', hostname]
        + list(argv), cwd=ls.REPO, capture_output=True, text=True,
        timeout=120)


def cli_json(host, *argv, **kwargs):
    r = cli(host, *argv, **kwargs)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


def vgpus_now(host):
    return {vf: t for vf, t in host.live.state()['vgpus'].items() if t}


def carved_now(host):
    """The VFs of the carved GPU holding the carved type, by the kernel."""
    gpu_vfs = {str(a) for a in host.live.sysfs.virtfns(CARVED_GPU)}
    return sorted(vf for vf, t in vgpus_now(host).items()
                  if vf in gpu_vfs and t == CARVED_TYPE)


def carve_and_print(host):
    """Carve the VFs (``restore``) and print Nova's lines."""
    r = cli(host, 'restore')
    assert r.returncode == 0, r.stdout + r.stderr
    r = cli(host, 'nova-config', libvirt=True)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


# --- fixtures ----------------------------------------------------------------

@pytest.fixture(scope='module')
def nova_venv():
    return nova_env.ensure_venv()[0]


@pytest.fixture(scope='module')
def placement():
    with placement_server.running() as server:
        yield server


@pytest.fixture(scope='module')
def host(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp('nova-l40s'))
    setup = Setup(workdir, 'nvidia-1145')
    with ls.LiveHost(workdir, profile='l40s', hooks=setup.hooks) as h:
        h.setup = setup
        h.fragment = carve_and_print(h)
        yield h


def providers(placement, root_name):
    """Every provider of the tree whose root is named ``root_name``:
    ``{uuid: (name, parent uuid, traits, inventories)}`` (inventories
    without the provider generation)."""
    adapter = placement.adapter()
    (root,) = adapter.get('/resource_providers?name=%s'
                          % root_name).json()['resource_providers']
    found = {}
    for rp in adapter.get('/resource_providers?in_tree=%s'
                          % root['uuid']).json()['resource_providers']:
        traits = adapter.get('/resource_providers/%s/traits'
                             % rp['uuid']).json()['traits']
        inv = adapter.get('/resource_providers/%s/inventories'
                          % rp['uuid']).json()['inventories']
        found[rp['uuid']] = (rp['name'], rp['parent_provider_uuid'],
                             sorted(traits), inv)
    return found


@pytest.fixture(scope='module')
def routes(host, placement, nova_venv, tmp_path_factory):
    """Both routes report the host, as they take turns on a compute node
    Nova already knows: Nova (its periodic update), ours, Nova again,
    ours again.  What each said, and Placement afterwards."""
    judge = nova_env.Judge(nova_venv, tmp_path_factory.mktemp('nova'))
    judge.write(host.fragment)
    compute_uuid = str(uuidlib.uuid4())
    first = judge.run(['parse', 'enumerate', 'placement'], uri=host.uri,
                      hostname=HOSTNAME, compute_uuid=compute_uuid,
                      placement=placement.url)
    assert 'refused' not in first, first
    seen = [providers(placement, HOSTNAME)]
    ours = cli_json(host, 'placement', 'sync', '--url', placement.url,
                    '--json')
    seen.append(providers(placement, HOSTNAME))
    (alias,) = first['aliases']
    again = judge.run(['enumerate', 'placement', 'candidates'],
                      devices=first['devices'], hostname=HOSTNAME,
                      compute_uuid=compute_uuid, placement=placement.url,
                      flavors=[['%s:1' % alias, None],
                               ['%s:%d' % (alias, COUNT), 'none'],
                               ['%s:%d' % (alias, COUNT + 1), 'none']])
    assert 'refused' not in again, again
    seen.append(providers(placement, HOSTNAME))
    ours_again = cli_json(host, 'placement', 'sync', '--url',
                          placement.url, '--json')
    seen.append(providers(placement, HOSTNAME))
    return dict(nova=first, ours=ours, ours_again=ours_again, judge=judge,
                compute_uuid=compute_uuid, seen=seen, placement=seen[-1],
                candidates=again['candidates'])


# --- Nova's parsers --------------------------------------------------------

def lines_of(fragment, key):
    return [line for line in fragment.splitlines()
            if line.startswith(key + ' = ')]


def test_nova_accepts_every_line_nova_config_prints(host, routes):
    nova = routes['nova']
    specs = lines_of(host.fragment, 'device_spec')
    aliases = lines_of(host.fragment, 'alias')
    assert [line for line in host.fragment.splitlines()
            if line.startswith('[')] == ['[pci]']
    # every line became one spec / one alias of Nova's
    assert len(nova['device_specs']) == len(specs) == COUNT
    assert len(nova['aliases']) == len(aliases) == 1
    (alias_name, alias), = nova['aliases'].items()
    (alias_spec,) = alias['specs']
    assert alias_spec['dev_type'] == 'type-VF'
    rc = alias_spec['resource_class']
    assert rc.startswith('CUSTOM_')
    for spec in nova['device_specs']:
        assert spec['vendor_id'] == '10de'
        assert spec['tags']['managed'] == 'false'
        assert spec['tags']['resource_class'] == rc
        # this host's libvirt (9.0) is older than Nova's minimum for
        # live-migratable VFs (10.0.0): not offered, and Nova's own
        # start-up check agrees
        assert 'live_migratable' not in spec['tags']
    assert nova['live_migratable_check'] == 'ok'


# --- Nova's view of the host's PCI devices ----------------------------------

def test_nova_lists_every_function_of_both_gpus(host, routes):
    """Nova's driver sees the whole host: what keeps the PFs, the other
    GPU and the free VFs out is the device specs, not the listing."""
    devices = {d['address']: d for d in routes['nova']['devices']}
    sysfs = host.live.sysfs
    for gpu in (CARVED_GPU, OTHER_GPU):
        assert devices[gpu]['dev_type'] == 'type-PF'
        for vf in sysfs.virtfns(gpu):
            assert devices[str(vf)]['dev_type'] == 'type-VF'
            assert devices[str(vf)]['parent_addr'] == gpu


def test_exactly_the_carved_vfs_match_nova_s_device_specs(host, routes):
    tracked = {d['address']: d for d in routes['nova']['tracked']}
    carved = carved_now(host)
    assert len(carved) == COUNT
    assert sorted(tracked) == carved
    (alias,) = routes['nova']['aliases'].values()
    rc = alias['specs'][0]['resource_class']
    for vf, dev in tracked.items():
        assert dev['dev_type'] == 'type-VF'
        assert dev['parent_addr'] == CARVED_GPU
        assert dev['extra_info']['managed'] == 'false'
        assert dev['resource_class'] == rc
        assert dev['status'] == 'available'
    # none of: the PFs, the carved GPU's free VFs, the other GPU's VFs
    # (holding vGPUs of ours or not)
    for address in [CARVED_GPU, OTHER_GPU] + list(OTHER_PRE) + [
            str(a) for gpu in (CARVED_GPU, OTHER_GPU)
            for a in host.live.sysfs.virtfns(gpu)
            if str(a) not in carved]:
        assert address not in tracked


def test_nova_hands_each_carved_vf_over_unmanaged(host, routes):
    from lxml import etree
    for dev in routes['nova']['tracked']:
        xml = etree.fromstring(dev['hostdev'])
        assert (xml.get('type'), xml.get('managed')) == ('pci', 'no')
        addr = xml.find('source/address')
        assert str(objects.PciAddress(*(int(addr.get(k), 16) for k in (
            'domain', 'bus', 'slot', 'function')))) == dev['address']


# --- Placement: Nova's providers and ours -----------------------------------

def nova_provider_names(routes):
    return {p['name'] for p in routes['nova']['providers']
            if p['parent_uuid'] is not None}


def test_nova_reports_the_carved_vfs_on_one_provider(routes):
    (alias,) = routes['nova']['aliases'].values()
    rc = alias['specs'][0]['resource_class']
    pci = [p for p in routes['nova']['providers']
           if p['parent_uuid'] is not None]
    assert [p['name'] for p in pci] == ['%s_%s' % (HOSTNAME,
                                                   CARVED_GPU.upper())]
    assert pci[0]['inventory'][rc]['total'] == COUNT
    assert {'OWNER_NOVA', 'COMPUTE_MANAGED_PCI_DEVICE'} <= set(
        pci[0]['traits'])


def test_nova_s_providers_and_ours_never_overlap(routes):
    held = routes['placement']
    nova = {p['uuid'] for p in routes['nova']['providers']}
    ours = {r['uuid'] for r in routes['ours']['results']}
    root = routes['compute_uuid']
    assert root in nova and held[root][0] == HOSTNAME
    # ours hang under Nova's compute node: never a root of their own
    assert ours - {root} and all(held[u][1] == root for u in ours - {root})
    ours -= {root}
    nova -= {root}
    assert not ours & nova
    assert set(held) == ours | nova | {root}
    # names: Placement's are unique per database, case-insensitively on
    # MySQL's collation: ours must not take Nova's in any case
    assert not ({held[u][0].lower() for u in ours}
                & {held[u][0].lower() for u in nova})
    for u in ours:
        name, _, traits, _ = held[u]
        assert not name.startswith(HOSTNAME + '_pci_')
        assert CARVED_GPU not in name.lower()
        assert 'OWNER_NOVA' not in traits
        assert 'COMPUTE_MANAGED_PCI_DEVICE' not in traits
    for u in nova:
        assert 'OWNER_NOVA' in held[u][2]


def test_each_route_leaves_the_other_s_providers_alone(routes):
    """Nova's periodic update after our sync, and ours after Nova's,
    change nothing of the other's (as Placement holds them)."""
    after_nova, after_ours, after_nova_again, after_ours_again = \
        routes['seen']
    root = routes['compute_uuid']
    nova = set(after_nova) - {root}
    ours = set(after_ours) - set(after_nova)
    assert nova and ours
    for u in nova:
        assert after_nova[u] == after_ours[u] == after_nova_again[u] == \
            after_ours_again[u]
    for u in ours:
        assert after_ours[u] == after_nova_again[u] == after_ours_again[u]
    assert set(after_ours_again) == nova | ours | {root}
    assert not routes['ours_again']['changed']
    assert routes['ours_again']['writes_sent'] == 0


def test_an_allocation_candidate_for_each_carved_vf(routes):
    """The scheduler's query for a flavor asking for the alias, as Nova 34
    sends it once every compute is new enough (``OWNER_NOVA`` required on
    the root and on each PCI group), with both routes in Placement: one
    VF, every carved VF at once, and one more than were carved."""
    from urllib.parse import parse_qs
    (alias,) = routes['nova']['aliases'].values()
    rc = alias['specs'][0]['resource_class']
    (pci,) = [p['uuid'] for p in routes['nova']['providers']
              if p['parent_uuid'] is not None]
    one, every, more = routes['candidates']
    for asked, count in ((one, 1), (every, COUNT), (more, COUNT + 1)):
        query = parse_qs(asked['query'])
        assert query['root_required'] == ['OWNER_NOVA']
        groups = [k[len('resources'):] for k in query
                  if k.startswith('resources')]
        assert len(groups) == count
        for group in groups:
            assert query['resources' + group] == ['%s:1' % rc]
            assert query['required' + group] == ['OWNER_NOVA']
    assert one['candidates'] == [{pci: {rc: 1}}]
    assert every['candidates'] == [{pci: {rc: COUNT}}]
    assert more['candidates'] == []


# --- the hook leaves Nova's guests alone ------------------------------------

def nova_domain_xml(name, hostdevs):
    """A guest as Nova defines it: Nova's metadata, and the VFs as the
    ``<hostdev>`` Nova's driver wrote for them."""
    meta = ('<nova:instance xmlns:nova="http://openstack.org/xmlns/libvirt/'
            'nova/1.1"><nova:name>%s</nova:name></nova:instance>' % name)
    return libvirtd.tiny_domain_xml(name, metadata=meta,
                                    extra_devices=''.join(hostdevs))


def test_the_hook_leaves_a_nova_guest_s_vf_alone(host, routes):
    import libvirt
    dev = routes['nova']['tracked'][0]
    before = vgpus_now(host)
    conn = host.daemon.connect()
    dom = conn.defineXML(nova_domain_xml('nova-1', [dev['hostdev']]))
    try:
        with pytest.raises(libvirt.libvirtError) as e:
            dom.create()
    finally:
        dom.undefine()
    # past prepare (our hook said yes), refused for lack of VFIO, then
    # release: the carved VF kept its type throughout
    assert e.value.get_error_code() == libvirt.VIR_ERR_CONFIG_UNSUPPORTED
    assert PCI_VFIO_ERROR in e.value.get_error_message()
    assert vgpus_now(host) == before
    assert hg.leases(host) == []


def test_the_hook_leaves_a_nova_guest_s_migration_alone(host, routes):
    """``migrate begin`` as libvirt runs it on the destination: the
    domain's XML on stdin; an empty answer keeps it as it is."""
    dev = routes['nova']['tracked'][1]
    xml = nova_domain_xml('nova-2', [dev['hostdev']])
    path = os.path.join(host.daemon.tmpdir, 'etc', 'hooks', 'qemu.d',
                        'libvirt-gpu')
    before = vgpus_now(host)
    for op, sub in (('migrate', 'begin'), ('prepare', 'begin'),
                    ('release', 'end')):
        r = host.daemon.run_in_namespace(
            [path, 'nova-2', op, sub, '-'], input=xml, capture_output=True,
            text=True, timeout=60,
            env={'LC_ALL': 'C', 'PATH': '/usr/bin:/bin'})
        assert (op, r.returncode, r.stdout) == (op, 0, ''), r.stderr
    assert vgpus_now(host) == before
    assert hg.leases(host) == []


def test_the_hook_gives_no_guest_of_ours_a_carved_vf(host, routes):
    """A guest of ours (our metadata) naming a carved VF, holding it as
    its hostdev, is refused at prepare: the VF is Nova's."""
    import libvirt
    vf = routes['nova']['tracked'][2]['address']
    before = vgpus_now(host)
    code, message = hg.start(host, 'ours-on-nova', [
        (str(objects.Uuid.new()), CARVED_TYPE, vf)], vendor=True)
    assert code == libvirt.VIR_ERR_HOOK_SCRIPT_FAILED, message
    assert vf in message
    assert vgpus_now(host) == before
    assert hg.leases(host) == []


def test_carved_vfs_keep_their_type(host):
    """What Nova's PCI records stand on: the kernel's answer, read as the
    product reads it."""
    sysfs = host.live.sysfs
    number = int(CARVED_TYPE.split('-')[1])
    for vf in carved_now(host):
        assert vendor(sysfs).current_type(vf) == number


# --- nova-config --check ---------------------------------------------------

def check(host, path):
    """``nova-config --check PATH --json``: (exit status, differences)."""
    r = cli(host, 'nova-config', '--check', path, '--json',
            libvirt=True)
    assert r.returncode in (0, 1), r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc['matches'] == (r.returncode == 0)
    return r.returncode, doc['differences']


def test_check_is_clean_on_what_nova_config_printed(host, routes):
    path = routes['judge'].write(host.fragment)
    assert check(host, path) == (0, [])


def edited(fragment, carved, free_vf):
    """A hand-edited copy: the first carved VF's line dropped, the second's
    resource class changed, the third made managed, a free VF added, the
    alias asking for another resource class."""
    out = []
    for line in fragment.splitlines():
        if line.startswith('device_spec = '):
            spec = json.loads(line.split(' = ', 1)[1])
            if spec['address'] == carved[0]:
                continue
            if spec['address'] == carved[1]:
                spec['resource_class'] = 'CUSTOM_NVIDIA_L40S_24Q'
            if spec['address'] == carved[2]:
                spec['managed'] = 'yes'
            line = 'device_spec = ' + json.dumps(spec)
        elif line.startswith('alias = '):
            alias = json.loads(line.split(' = ', 1)[1])
            alias['resource_class'] = 'CUSTOM_NVIDIA_L40S_6Q'
            out.append('device_spec = ' + json.dumps(dict(
                spec, address=free_vf, managed='no')))
            line = 'alias = ' + json.dumps(alias)
        out.append(line)
    return '\n'.join(out) + '\n'


def test_check_names_each_difference_of_a_hand_edited_copy(
        host, routes, nova_venv, tmp_path):
    carved = carved_now(host)
    free_vf = [str(a) for a in host.live.sysfs.virtfns(CARVED_GPU)
               if str(a) not in carved][0]
    judge = nova_env.Judge(nova_venv, tmp_path)
    path = judge.write(edited(host.fragment, carved, free_vf))
    code, found = check(host, path)
    assert code == 1
    expected = [(carved[0], 'missing'),
                (carved[1], 'CUSTOM_NVIDIA_L40S_24Q'),
                (carved[2], 'managed'),
                (free_vf, 'not carved'),
                ('alias', 'CUSTOM_NVIDIA_L40S_6Q')]
    for what, why in expected:
        assert [d for d in found if what in d and why in d], (what, found)
    assert len(found) == len(expected), found
    # Nova itself takes the edited copy without a word, and would then
    # track the free VF, miss the dropped one, hand one over managed and
    # report one under another class: what --check names is what would
    # go wrong
    nova = judge.run(['parse', 'enumerate'],
                     devices=routes['nova']['devices'], hostname=HOSTNAME,
                     compute_uuid=routes['compute_uuid'])
    assert 'refused' not in nova, nova
    tracked = {d['address']: d for d in nova['tracked']}
    assert sorted(tracked) == sorted(carved[1:] + [free_vf])
    assert tracked[carved[1]]['resource_class'] == 'CUSTOM_NVIDIA_L40S_24Q'
    assert tracked[carved[2]]['extra_info']['managed'] == 'true'
    assert "managed=\"yes\"" in tracked[carved[2]]['hostdev']


# --- a reboot ----------------------------------------------------------------

def rebooted_profile(path):
    """The ``l40s`` profile as a boot leaves it: VFs off, no vGPU."""
    from libvirt_gpu.simulator import loading
    with open(os.path.join(loading.profile_dir(), 'l40s.json')) as f:
        data = json.load(f)
    for dev in data['devices']:
        dev.pop('held_type', None)
        if dev.get('virtfns'):
            dev['sriov_numvfs'] = 0
    data['name'] = 'l40s-rebooted'
    with open(path, 'w') as f:
        json.dump(data, f)
    return path


@pytest.fixture(scope='module')
def rebooted(host, routes, tmp_path_factory):
    """The same host after a reboot (its VFs off, no vGPU, its state
    directory kept) and ``libvirt-gpu restore``, as the systemd unit runs
    it before nova-compute: a new live tree and libvirtd."""
    workdir = tmp_path_factory.mktemp('nova-l40s-rebooted')
    profile = rebooted_profile(str(workdir / 'l40s-rebooted.json'))
    with ls.LiveHost(str(workdir), profile=profile) as h:
        h.setup = Setup(str(workdir), 'nvidia-1145')
        h.setup.state_dir = host.setup.state_dir
        h.setup.hooks(h.live)               # writes its configuration
        assert vgpus_now(h) == {}
        h.restored = cli(h, 'restore')
        yield h


def test_restore_after_a_reboot_carves_the_same_vfs(host, rebooted):
    assert rebooted.restored.returncode == 0, (
        rebooted.restored.stdout + rebooted.restored.stderr)
    assert carved_now(rebooted) == carved_now(host)
    # nothing else came back: the other GPU's vGPUs were not ours
    assert vgpus_now(rebooted) == {vf: CARVED_TYPE
                                   for vf in carved_now(host)}


def test_nova_config_after_a_reboot_is_the_same(host, rebooted, routes):
    path = routes['judge'].write(host.fragment)
    assert check(rebooted, path) == (0, [])
    r = cli(rebooted, 'nova-config', libvirt=True)
    assert r.returncode == 0, r.stderr
    assert lines_of(r.stdout, 'device_spec') == lines_of(host.fragment,
                                                         'device_spec')
    assert lines_of(r.stdout, 'alias') == lines_of(host.fragment, 'alias')


def test_nova_s_pci_records_stay_valid_after_a_reboot(rebooted, routes):
    """Nova, listing the rebooted host from its libvirtd, tracks the same
    devices as before: its PCI records (address, parent, ids, type) and
    its Placement inventory still hold."""
    again = routes['judge'].run(['enumerate'], uri=rebooted.uri,
                                hostname=HOSTNAME,
                                compute_uuid=routes['compute_uuid'])
    keys = ('address', 'parent_addr', 'vendor_id', 'product_id',
            'dev_type', 'extra_info', 'resource_class')
    assert [{k: d[k] for k in keys} for d in again['tracked']] == \
        [{k: d[k] for k in keys} for d in routes['nova']['tracked']]


# --- a new compute node ------------------------------------------------------

def test_nova_creates_its_compute_node_after_our_first_sync(
        host, placement, routes):
    """On a host new to Placement our sync may run before nova-compute
    ever did: it must not take the compute node's name (Nova's create
    would get 409), but say to start nova-compute; Nova then creates its
    compute node provider (named after the host) and its PCI providers,
    and our next sync nests under it."""
    name = 'gpu-l40s-02'
    try:
        second_host_in_placement(host, placement, routes, name)
    finally:
        # the other tests ask Placement about the first host only
        drop_tree(placement, name)


def drop_tree(placement, root_name):
    """Delete the tree whose root is named ``root_name``, leaves first."""
    adapter = placement.adapter()
    roots = adapter.get('/resource_providers?name=%s'
                        % root_name).json()['resource_providers']
    for root in roots:
        tree = adapter.get('/resource_providers?in_tree=%s' % root['uuid']
                           ).json()['resource_providers']
        depth = {}

        def level(rp):
            if rp['uuid'] not in depth:
                parent = next((p for p in tree if p['uuid'] ==
                               rp['parent_provider_uuid']), None)
                depth[rp['uuid']] = 0 if parent is None else level(parent) + 1
            return depth[rp['uuid']]
        for rp in sorted(tree, key=level, reverse=True):
            adapter.delete('/resource_providers/%s' % rp['uuid'])


def second_host_in_placement(host, placement, routes, name):
    r = cli(host, 'placement', 'sync', '--url', placement.url, '--json',
            hostname=name)
    assert r.returncode != 0, r.stdout
    assert ('No provider named %s in Placement yet' % name in r.stderr
            and 'Start nova-compute' in r.stderr), r.stderr
    adapter = placement.adapter()
    assert adapter.get('/resource_providers?name=%s' % name).json()[
        'resource_providers'] == []
    compute_uuid = str(uuidlib.uuid4())
    nova = routes['judge'].run(['enumerate', 'placement'],
                               devices=routes['nova']['devices'],
                               hostname=name, compute_uuid=compute_uuid,
                               placement=placement.url)
    assert 'refused' not in nova, nova
    held = providers(placement, name)
    assert held[compute_uuid][0] == name
    assert '%s_%s' % (name, CARVED_GPU.upper()) in {
        n for n, *_ in held.values()}
    cli_json(host, 'placement', 'sync', '--url', placement.url, '--json',
             hostname=name)
    after = providers(placement, name)
    assert after[compute_uuid][0] == name
    ours = {u: p for u, p in after.items() if u not in held}
    assert ours and all(p[1] == compute_uuid for p in ours.values())


# --- names derived from the type ----------------------------------------

def test_nova_config_names_a_full_gpu_s_carving_from_its_type(
        host, tmp_path):
    """The carving without ``resource_class`` nor ``alias``: both come
    from the type's name (NVIDIA L40S-12Q), also once the carved VFs
    leave the GPU no room for another of the type."""
    with open(host.setup.config) as f:
        text = f.read()
    config = tmp_path / 'libvirt-gpu.conf'
    config.write_text('\n'.join(
        line for line in text.splitlines()
        if not line.startswith(('resource_class =', 'alias ='))) + '\n')
    r = subprocess.run(
        [sys.executable, '-m', 'libvirt_gpu.cmd.main', '--config-file',
         str(config), '--hostname', HOSTNAME, 'nova-config', '--json'],
        cwd=ls.REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert {s['resource_class'] for s in doc['device_spec']} == {
        'CUSTOM_NVIDIA_L40S_12Q'}


# --- README: With OpenStack Nova -----------------------------------------

def test_the_readme_s_nova_section_followed_as_nova_reads_it(
        host, routes, placement, nova_venv, tmp_path):
    """The module's host is configured with the README's carving; here
    its commands run as written (the host's libvirtd standing for the
    default one, the Nova file in a temporary nova.conf.d), Nova reads the
    file they wrote, and the flavor's extra spec the README names gets an
    allocation candidate on the carved GPU."""
    readme = readme_nova()
    # what the whole module checked is the README's carving
    assert readme.ini.strip() == CARVING.format(
        carved=CARVED_GPU, type=CARVED_TYPE, count=COUNT).strip()
    judge = nova_env.Judge(nova_venv, tmp_path)
    nova_file = os.path.join(judge.conf_dir, nova_env.CONF_NAME)
    commands = readme.commands()
    assert [c.split()[:2] for c in commands] == [
        ['libvirt-gpu', 'restore'], ['libvirt-gpu', 'nova-config'],
        ['libvirt-gpu', 'nova-config']]
    for line in commands:
        argv = line.replace('/etc/nova/nova.conf.d/50-libvirt-gpu.conf',
                            nova_file).split()[1:]
        target = None
        if '>' in argv:
            argv, target = argv[:argv.index('>')], argv[-1]
        r = cli(host, *argv, libvirt=True)
        assert (line, r.returncode, r.stderr) == (line, 0, '')
        if target is not None:
            with open(target, 'w') as f:
                f.write(r.stdout)
    assert 'matches the VFs carved for Nova' in r.stdout
    nova = judge.run(['parse', 'candidates'], placement=placement.url,
                     flavors=[[readme.alias, None]])
    assert 'refused' not in nova, nova
    assert readme.alias.split(':')[0] in nova['aliases']
    assert len(nova['device_specs']) == COUNT
    (asked,) = nova['candidates']
    names = {p['uuid']: p['name'] for p in routes['nova']['providers']}
    assert asked['candidates'] and all(
        [names.get(rp) for rp in c] == ['%s_%s' % (HOSTNAME,
                                                   CARVED_GPU.upper())]
        for c in asked['candidates'])
