"""Placement never over-promises a GPU with a layout (issue 28's
acceptance): on each of the four simulated hosts of ``test_layouts_live``
(its ``CASES``: A100 40GB and H100 80GB MIG-backed, L40S mixed sizes, RTX
PRO 6000 Blackwell MIG time-sliced), with the layout applied (``layout
apply``, ``[gpu]/nvml = simulated``) and the provider tree synced to a
real Placement (``placement sync``), a scheduler's loop runs until
Placement says no:

1. ``GET /allocation_candidates`` for one vGPU of a type (the resource
   class and the type's trait of the provider the product reports for
   it, within the host's tree);
2. ``PUT /allocations/<consumer>`` with the first candidate;
3. a guest gets a vGPU of that type on the candidate's GPU the way an
   operator's guest does: the VF is chosen as ``attach --config`` chooses
   it (the vGPU kind's ``choose_parent``), then our hook's ``prepare``
   runs (in this process, from its settings snapshot: the allocator, then
   the type written to the VF; the simulated driver picks the GPU instance
   or the placement);
4. the simulated driver must hold that vGPU on that VF.

Once Placement offers no more of a type, the driver must have no room
left for it either (no free VF lists it as creatable: Placement does not
under-promise), but for a type the layout gives a count (mixed sizes:
``vgpu_types = nvidia-1153:3, nvidia-1145:1``), of which Placement must
offer exactly that count, the rest of the GPU being the other types'.
Whatever Placement still offers of the GPU's other types must be
creatable.  This runs for each type the GPU's providers offer first, then
the others (the guests are released and the allocations deleted in
between), and for all of them interleaved; there the agent's sync comes
after the first round and again when the GPU is full, and Placement must
accept it and offer no more than before.  The host runs no libvirtd:
nothing here needs one.
"""

import collections
import contextlib
import io
import json
import os

import pytest

from libvirt_gpu import environment
from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.cmd import main
from libvirt_gpu.devices import sysfs as sysfs_mod
from libvirt_gpu.devices.backends.nvidia_vgpu import files as vendor_files
from libvirt_gpu.guests import hook as hook_mod
from libvirt_gpu.guests.hook import operations
from libvirt_gpu.guests.hook import settings as settings_mod
from libvirt_gpu.openstack.placement import traits as traits_mod
from libvirt_gpu.openstack.placement import tree
from tests.functional import hook_guests as hg
from tests.functional import live_sysfs as ls
from tests.functional import placement_server
from tests.functional.live_layouts import CASES, config_text

missing = ls.missing_requirements()
pytestmark = pytest.mark.skipif(bool(missing), reason='; '.join(missing))

Offer = collections.namedtuple('Offer', ['type_id', 'provider',
                                         'resource_class', 'trait'])
"""One vGPU type of the GPU as Placement has it: the provider's UUID, its
resource class and the type's trait (``CUSTOM_<vendor>_<product>_<type>``)."""

# whose the allocations are: Placement (1.38+) wants a project, a user and
# the consumer's type
PROJECT = '0fd1f1e5-a7c8-4a3c-9b7f-3c6e1d2a4b50'
USER = '6c2d8e4f-1b3a-4c5d-8e9f-0a1b2c3d4e5f'


@pytest.fixture(scope='module')
def server():
    with placement_server.running() as srv:
        yield srv


class Host(object):
    """The live simulated host of a case, its layout applied, its tree in
    Placement, and the guests holding vGPUs with their consumers."""

    def __init__(self, live, case, workdir, server):
        self.live = live
        self.case = case
        self.server = server
        self.placement = server.adapter()
        self.hostname = 'fill-' + case.profile
        self.gpu = objects.PciAddress.parse(case.gpu)
        self.state_dir = os.path.join(workdir, 'state')
        self.config = os.path.join(workdir, 'libvirt-gpu.conf')
        self.settings = os.path.join(self.state_dir, hook_mod.SETTINGS_NAME)
        with open(self.config, 'w') as f:
            f.write(config_text(live.root, self.state_dir, case))
        self.guests = {}        # name -> domain XML, holding a vGPU
        self.consumers = []     # of the allocations made in Placement
        self.made = 0

    def cli(self, *argv):
        """``libvirt-gpu ARGV --json`` on this host (its entry point, in
        this process): its JSON."""
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main.main(['--config-file', self.config, '--sysfs-root',
                              self.live.root, '--hostname', self.hostname]
                             + list(argv) + ['--json'])
        assert code == 0, out.getvalue() + err.getvalue()
        return json.loads(out.getvalue())

    def sync(self):
        return self.cli('placement', 'sync', '--url', self.server.url)

    def env(self):
        """The host as the hook builds it (its settings snapshot)."""
        settings, _ = settings_mod.load_settings(self.config, self.settings)
        return environment.Environment.for_hook(
            settings, sysfs_mod.Sysfs(settings.sysfs_root))

    # -- what Placement says ------------------------------------------------

    def read_offers(self):
        """An ``Offer`` per provider of the GPU in Placement, its type
        found by the type's trait (each type the layout names)."""
        gpu = next(g for g in self.env().discovered.gpus
                   if g.address == self.gpu)
        words = {}
        for t in layout_types(self.case):
            mtype = gpu.offered_type(objects.TypeId.parse(t))
            assert mtype is not None, (t, gpu.offered_types())
            words[traits_mod.custom(
                traits_mod.vendor_word(gpu.vendor_id), gpu.product_id,
                traits_mod.vgpu_type_word(mtype))] = t
        root = tree.provider_uuid(self.hostname)
        found = []
        for rp in self.get('/resource_providers?in_tree=%s'
                           % root)['resource_providers']:
            if not rp['name'].startswith(
                    '%s_%s' % (self.hostname, self.case.gpu)):
                continue
            uuid = rp['uuid']
            traits = self.get('/resource_providers/%s/traits'
                              % uuid)['traits']
            named = [t for t in traits if t in words]
            assert len(named) == 1, (
                'the provider %s should carry the trait of one type of '
                'the layout (%s), not %s' % (rp['name'], sorted(words),
                                             traits))
            inventories = self.get('/resource_providers/%s/inventories'
                                   % uuid)['inventories']
            assert len(inventories) == 1, (rp['name'], inventories)
            (trait,), (rc,) = named, inventories
            found.append(Offer(words[trait], uuid, rc, trait))
        assert found, 'no provider of %s in Placement' % self.case.gpu
        return sorted(found)

    def get(self, url):
        resp = self.placement.get(url, raise_exc=False)
        assert resp.status_code == 200, (url, resp.status_code, resp.text)
        return resp.json()

    def candidate(self, offer):
        """The first allocation request Placement offers for one vGPU of
        ``offer``'s type in this host's tree, or None."""
        got = self.get(
            '/allocation_candidates?resources=%s:1&required=%s&in_tree=%s'
            % (offer.resource_class, offer.trait,
               tree.provider_uuid(self.hostname)))
        if not got['allocation_requests']:
            return None
        first = got['allocation_requests'][0]['allocations']
        assert list(first) == [offer.provider], (offer, first)
        return first

    def claim(self, allocations):
        consumer = str(objects.Uuid.new())
        resp = self.placement.put(
            '/allocations/%s' % consumer, raise_exc=False,
            json={'allocations': allocations, 'consumer_generation': None,
                  'project_id': PROJECT, 'user_id': USER,
                  'consumer_type': 'INSTANCE'})
        assert resp.status_code == 204, (resp.status_code, resp.text)
        self.consumers.append(consumer)
        return consumer

    def used(self, offer):
        return self.get('/resource_providers/%s/usages'
                        % offer.provider)['usages'][offer.resource_class]

    # -- what the driver does -----------------------------------------------

    def placed(self):
        """``{VF: [type, GI id, placement]}`` of the GPU's VFs."""
        vfs = {str(a) for a in self.live.sysfs.virtfns(self.case.gpu)}
        return {vf: where for vf, where in
                self.live.state()['driver']['placed'].items() if vf in vfs}

    def room(self, type_id):
        """The free VFs of the GPU that list ``type_id`` as creatable."""
        files = vendor_files.VendorFiles(self.live.sysfs)
        number = objects.vendor_type_number(objects.TypeId.parse(type_id))
        placed = self.placed()
        return [str(vf) for vf in self.live.sysfs.virtfns(self.case.gpu)
                if str(vf) not in placed
                and any(n == number for n, _ in files.creatable_types(vf))]

    def hook(self, name, operation, xml):
        err = io.StringIO()
        code = operations.run(['qemu', name, operation, 'begin', '-'],
                              xml.encode(),
                              config_file=self.config,
                              settings_file=self.settings, stderr=err)
        return code, err.getvalue()

    def give(self, type_id, consumer, offer):
        """A guest gets a vGPU of ``type_id`` on the GPU (see the module
        doc); the simulated driver must then hold it on its VF."""
        self.made += 1
        name = 'fill-%d' % self.made
        uuid = objects.Uuid.new()
        tid = objects.TypeId.parse(type_id)
        note = ('Placement accepted %s of %s on %s (%d of its provider '
                'used) but' % (type_id, consumer, self.case.gpu,
                               self.used(offer)))
        vgpus = self.env().vgpus
        try:
            vf = vgpus.kind_of(vgpus.parents_of(self.gpu)[0]).choose_parent(
                self.gpu, tid)
        except exception.NoCapacity as e:
            pytest.fail('%s no VF takes it: %s' % (note, e))
        xml = hg.guest_xml(name, [(str(uuid), type_id, str(vf))],
                           vendor=True)
        code, said = self.hook(name, 'prepare', xml)
        assert code == 0, '%s the hook refused it: %s' % (note, said)
        self.guests[name] = xml
        where = self.placed().get(str(vf))
        assert where is not None and where[0] == type_id, (note, where)
        # the driver put it in a GPU instance (MIG) or at a placement
        assert where[1] is not None or where[2] is not None, where

    def release_all(self):
        """Every guest stops (our hook's ``release``), every allocation is
        deleted: the GPU is as the layout left it."""
        guests, self.guests = self.guests, {}
        consumers, self.consumers = self.consumers, []
        for name, xml in sorted(guests.items()):
            code, said = self.hook(name, 'release', xml)
            assert code == 0, said
        for consumer in consumers:
            resp = self.placement.delete('/allocations/%s' % consumer,
                                         raise_exc=False)
            assert resp.status_code == 204, resp.text
        assert self.placed() == {}

    def fill(self, offers, sync_once=False):
        """Round robin over ``offers``: claim and create one of each type
        Placement still offers, until it offers none; returns how many of
        each type were created.  ``sync_once``: sync after the first round
        (the agent's cycle comes while guests start: the totals it then
        reports must hold the allocations made)."""
        made = collections.Counter()
        going = list(offers)
        rounds = 0
        while going:
            if rounds == 1 and sync_once:
                self.sync()
            rounds += 1
            for offer in list(going):
                allocations = self.candidate(offer)
                if allocations is None:
                    going.remove(offer)
                    continue
                self.give(offer.type_id, self.claim(allocations), offer)
                made[offer.type_id] += 1
        return made

    def no_room(self, offers, made):
        """Placement offers none of ``offers``' types: the driver must have
        no room for any of them either (else Placement under-promises),
        but for a type with a count in the layout, of which Placement
        offers exactly that count (the rest of the GPU is the other
        types')."""
        counts = layout_types(self.case)
        for offer in offers:
            count = counts[offer.type_id]
            if count is not None:
                assert made[offer.type_id] == count, (
                    'Placement offered %d %s on %s, the layout gives it %d '
                    '(made: %s)' % (made[offer.type_id], offer.type_id,
                                    self.case.gpu, count, dict(made)))
                continue
            assert self.room(offer.type_id) == [], (
                'Placement offers no more %s on %s after %s, but the '
                'driver has room' % (offer.type_id, self.case.gpu,
                                     dict(made)))

    def check_full(self, offers, made):
        """``no_room``, and a sync now (the agent's next cycle, with the
        GPU full) succeeds and leaves Placement offering none of them."""
        self.no_room(offers, made)
        self.sync()
        for offer in offers:
            assert self.candidate(offer) is None, (offer, dict(made))


@pytest.fixture(scope='module', params=CASES, ids=[c.profile for c in CASES])
def host(request, server, tmp_path_factory):
    case = request.param
    workdir = str(tmp_path_factory.mktemp('fill-' + case.profile))
    with ls.LiveSysfs(case.profile, uevents=False) as live:
        h = Host(live, case, workdir, server)
        report = h.cli('layout', 'apply')
        assert report['failed'] == 0, report
        h.sync()
        h.offers = h.read_offers()
        yield h


@pytest.fixture
def gpu(host):
    """The host's GPU, given back as the layout left it (no guest, no
    allocation) after each test, whatever the test did."""
    yield host
    host.release_all()


def layout_types(case):
    """``{type: count}`` of the case's layout: ``vgpu_types = a, b`` (count
    None: as many as the driver's rules give) or, for mixed sizes, with a
    count each (``a:2, b:8``: the layout's split of the GPU)."""
    (line,) = [ln for ln in case.layout if ln.startswith('vgpu_types ')]
    found = {}
    for part in line.split('=', 1)[1].split(','):
        type_id, _, count = part.strip().partition(':')
        found[type_id] = int(count) if count else None
    return found


def test_each_type_fills_to_what_placement_offers(gpu):
    host = gpu
    offers = host.offers
    for offer in offers:
        made = host.fill([offer])
        assert made[offer.type_id] >= 1, offer
        if offer.type_id == host.case.type_id:
            # what the driver's rules give (test_layouts_live's count)
            assert made[offer.type_id] == host.case.capacity, dict(made)
        host.no_room([offer], made)
        # what Placement still offers of the GPU's other types is creatable
        made += host.fill([o for o in offers if o != offer])
        host.no_room(offers, made)
        host.release_all()


def test_types_interleaved_fill_to_what_placement_offers(gpu):
    host = gpu
    offers = host.offers
    if len(offers) < 2:
        pytest.skip('Placement offers one vGPU type of %s (%s)'
                    % (host.case.gpu, offers[0].type_id))
    made = host.fill(offers, sync_once=True)
    host.check_full(offers, made)
