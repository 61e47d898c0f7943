"""The exporter's layout part read on the simulated L40S host (sysfs: VFs,
the vendor interface) with NVML stood in for: ``Session``, a stand-in for
``nvml.Session``'s reads over ``{address text: Gpu}`` (what NVML says of
one GPU), so that a test sets one GPU's state exactly; it answers for
``L40S`` (0000:3d:00.0, ``l40s``) as an L40S and for ``MIGGPU``
(0000:bd:00.0, ``h100``) as an H100.  ``MIXED`` and ``MIG``: a layout
for each; ``scrape``: one scrape of the host with layouts, read back
(``read_ok``: the exporter's ``read_ok`` per part)."""

import os

from prometheus_client import parser as prom_parser

from libvirt_gpu import conf as conf_mod
from libvirt_gpu.devices import layout
from libvirt_gpu.devices import nvml
from libvirt_gpu import environment
from libvirt_gpu import exporter
from libvirt_gpu import objects
from tests.doubles import layout_facts as tl

L40S = '0000:3d:00.0'
MIGGPU = '0000:bd:00.0'
GIB = 1024
T1B, T24Q = 'nvidia-1145', 'nvidia-1155'
T1G, T3G = 'nvidia-1150', 'nvidia-1152'

MIXED = ('[layout_l40s]\ngpus = %s\nmode = mixed-size\n'
         'vgpu_types = nvidia-1145:1, nvidia-1155:1\nscheduler = equal-share\n'
         'time_slice_ms = 4\n' % L40S)
MIG = ('[layout_h100]\ngpus = %s\nmode = mig\n'
       'gpu_instances = 1g.10gb:2, 3g.40gb:1\n'
       'vgpu_types = nvidia-1150, nvidia-1152\n' % MIGGPU)


def _address(text):
    return objects.PciAddress.parse(text)


def l40s_facts():
    return layout.GpuFacts(
        address=_address(L40S), mig=None, types=(
            tl.vtype(1145, 'NVIDIA L40S-1B', 1, size=1, slots=48),
            tl.vtype(1155, 'NVIDIA L40S-24Q', 24, size=24, slots=48)))


class Gpu(object):
    """What NVML says of one GPU."""

    def __init__(self, facts, mixed=None, gis=(), active=(),
                 placements=None, scheduler=None):
        self.facts = facts
        self.mixed = mixed
        self.gis = gis
        self.active = active
        self.placements = placements or {}
        self.scheduler = scheduler


def l40s(**kwargs):
    kwargs.setdefault('mixed', True)
    kwargs.setdefault('scheduler', layout.Scheduler('equal-share', 4))
    kwargs.setdefault('active', (nvml.ActiveVgpu(
        objects.TypeId.parse(T1B), None, 0), nvml.ActiveVgpu(
        objects.TypeId.parse(T1B), None, 1)))
    kwargs.setdefault('placements', {T1B: tuple(range(2, 48)), T24Q: ()})
    return Gpu(l40s_facts(), **kwargs)


def h100(gis=((1, 19), (2, 19), (3, 9)), active=None, **kwargs):
    if active is None:
        active = (nvml.ActiveVgpu(objects.TypeId.parse(T1G), 1, None),)
    return Gpu(tl.h100_facts(), gis=tuple(
        layout.GpuInstance(i, p) for i, p in gis), active=active, **kwargs)


class Session(object):
    """``nvml.Session``'s reads over ``{address text: Gpu}``; ``fail``:
    the name of a read that fails as NVML would (``NvmlError``)."""

    def __init__(self, gpus, fail=None):
        self.gpus = gpus
        self.fail = fail
        self.closed = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.closed = True

    def _gpu(self, address, call):
        if call == self.fail:
            raise nvml.NvmlError(call=call, address=address,
                                 reason='Unknown Error')
        if str(address) not in self.gpus:
            raise nvml.NvmlUnavailable(reason='NVML lists no GPU %s'
                                       % address)
        return self.gpus[str(address)]

    def mig_mode(self, address):
        return self._gpu(address, 'mig_mode').facts.mig

    def gi_profiles(self, address):
        return self._gpu(address, 'gi_profiles').facts.profiles

    def vgpu_types(self, address, placements=False):
        return self._gpu(address, 'vgpu_types').facts.types

    def gpu_instances(self, address, profiles, schedulers=False,
                      computes=False):
        return self._gpu(address, 'gpu_instances').gis

    def mixed_size(self, address):
        return self._gpu(address, 'mixed_size').mixed

    def scheduler(self, address):
        return self._gpu(address, 'scheduler').scheduler

    def active_vgpus(self, address, mig):
        return self._gpu(address, 'active_vgpus').active

    def creatable_placements(self, address, type_number):
        # nvml.Session's answer: (placement size, free placement ids)
        ids = self._gpu(address, 'creatable_placements').placements.get(
            str(objects.vendor_type_id(type_number)))
        return None if ids is None else (8, ids)


class Nvml(object):
    """``nvml.Nvml`` with ``session`` (None: no driver); nothing for
    discovery (``query``) or usage: the GPUs are sysfs's."""

    def __init__(self, session):
        self._session = session

    def session(self):
        if self._session is None:
            raise nvml.NvmlUnavailable(reason='NVML Shared Library Not '
                                       'Found')
        return self._session

    def query(self):
        return {}

    def usage(self):
        return {}


def scrape(host, sections='', session=None, nvml_on=True):
    """``{(name, frozenset(labels)): value}`` of one scrape, with the
    layouts of ``sections`` ([gpu]/layouts: their names)."""
    path, root = host
    names = [line[len('[layout_'):-1] for line in sections.splitlines()
             if line.startswith('[layout_')]
    text = '[DEFAULT]\nstate_dir = %s\nsysfs_root = %s\n' % (
        os.path.join(path, 'state'), root)
    if names:
        text += '[gpu]\nlayouts = %s\n' % ', '.join(names)
    name = os.path.join(path, 'c%d.conf' % abs(hash(text + sections)))
    with open(name, 'w') as f:
        f.write(text + sections)
    env = environment.Environment.from_conf(conf_mod.load(name))
    env.nvml = Nvml(session) if nvml_on else None
    found = {}
    for family in prom_parser.text_string_to_metric_families(
            exporter.exposition(exporter.HostCollector(env))):
        for s in family.samples:
            found[(s.name, frozenset(s.labels.items()))] = s.value
    return found


def read_ok(found):
    return {dict(k[1])['part']: v for k, v in found.items()
            if k[0] == 'libvirt_gpu_exporter_read_ok'}
