"""The exporter's layout part (exporter.read_layout_views, layout_families):
each GPU's mode as its driver reports it, its MIG GPU instances and
placements with their vGPUs used and free, its scheduler, and whether it
differs from its layout (the steps ``layout plan`` would list).

The host is the simulated L40S host (sysfs: VFs, the vendor interface).
Most tests give NVML as ``Session``, a stand-in for ``nvml.Session``'s
reads (the records it returns), so that each can set one GPU's state
exactly (an NVML error at one read, a GI holding another type, a driver
that cannot say); it answers for 0000:3d:00.0 as an L40S and for
0000:bd:00.0 as an H100 (the GI profiles of a real H100,
tests/unit/devices/test_layout.py).  The last test reads the simulated H100
through nvidia-ml-py's own binding (``[gpu]/nvml = simulated``), and
tests/functional/test_exporter.py a live H100 and L40S brought to their
layouts."""

import os
import shutil
import tempfile

import pytest
from prometheus_client import parser as prom_parser

from libvirt_gpu import conf as conf_mod
from libvirt_gpu.devices import layout
from libvirt_gpu.devices import nvml
from libvirt_gpu import environment
from libvirt_gpu import exporter
from libvirt_gpu import objects
from libvirt_gpu import simulator
from tests.doubles import layouts
from tests.doubles import layout_facts as tl
from tests.doubles import paths
from tests.doubles.exporter_layout import Gpu
from tests.doubles.exporter_layout import L40S
from tests.doubles.exporter_layout import MIG
from tests.doubles.exporter_layout import MIGGPU
from tests.doubles.exporter_layout import MIXED
from tests.doubles.exporter_layout import Session
from tests.doubles.exporter_layout import T1B
from tests.doubles.exporter_layout import T1G
from tests.doubles.exporter_layout import T24Q
from tests.doubles.exporter_layout import T3G
from tests.doubles.exporter_layout import _address
from tests.doubles.exporter_layout import h100
from tests.doubles.exporter_layout import l40s
from tests.doubles.exporter_layout import read_ok
from tests.doubles.exporter_layout import scrape


@pytest.fixture(scope='module')
def host():
    path = tempfile.mkdtemp(prefix='lgpu-exporter-layout-')
    root = os.path.join(path, 'sys')
    simulator.write_sysfs(simulator.load_profile('l40s'), root)
    yield path, root
    shutil.rmtree(path, ignore_errors=True)


def value(found, metric, **labels):
    return found[('libvirt_gpu_' + metric, frozenset(labels.items()))]


def series(found, metric):
    return sorted((dict(k[1]) for k in found
                   if k[0] == 'libvirt_gpu_' + metric),
                  key=lambda labels: sorted(labels.items()))


LAYOUT_SERIES = ('gpu_layout_mode', 'gpu_layout_drift', 'gpu_layout_steps',
                 'gpu_instance_info', 'gpu_instance_vgpus_used',
                 'gpu_instance_vgpus_free', 'placements_used',
                 'placements_free', 'gpu_scheduler_info',
                 'gpu_scheduler_time_slice_seconds')


def no_layout_series(found):
    return not [k for k in found
                if k[0][len('libvirt_gpu_'):] in LAYOUT_SERIES]


# --- a mixed-size GPU --------------------------------------------------------

def test_a_mixed_size_gpu_at_its_layout(host):
    found = scrape(host, MIXED, Session({L40S: l40s()}))
    assert value(found, 'gpu_layout_mode', gpu=L40S, mode='mixed-size') == 1
    assert value(found, 'gpu_layout_drift', gpu=L40S, layout='l40s') == 0
    assert value(found, 'gpu_layout_steps', gpu=L40S, layout='l40s') == 0
    assert value(found, 'placements_used', gpu=L40S, type=T1B) == 2
    assert value(found, 'placements_free', gpu=L40S, type=T1B) == 46
    assert value(found, 'placements_used', gpu=L40S, type=T24Q) == 0
    assert value(found, 'placements_free', gpu=L40S, type=T24Q) == 0
    assert value(found, 'gpu_scheduler_info', gpu=L40S,
                 policy='equal-share') == 1
    assert value(found, 'gpu_scheduler_time_slice_seconds',
                 gpu=L40S) == 0.004
    assert read_ok(found)['layout'] == 1
    # the GPU is in no MIG mode: no GPU instance series
    assert series(found, 'gpu_instance_info') == []


def test_a_scheduler_that_differs_is_drift(host):
    found = scrape(host, MIXED, Session({L40S: l40s(
        scheduler=layout.Scheduler('best-effort'))}))
    assert value(found, 'gpu_layout_drift', gpu=L40S, layout='l40s') == 1
    assert value(found, 'gpu_layout_steps', gpu=L40S, layout='l40s') == 1
    assert value(found, 'gpu_scheduler_info', gpu=L40S,
                 policy='best-effort') == 1
    assert series(found, 'gpu_scheduler_time_slice_seconds') == []


def test_mixed_size_off_is_time_sliced_and_drift(host):
    found = scrape(host, MIXED, Session({L40S: l40s(mixed=False)}))
    assert value(found, 'gpu_layout_mode', gpu=L40S, mode='time-sliced') == 1
    assert series(found, 'gpu_layout_mode') == [
        {'gpu': L40S, 'mode': 'time-sliced'}]
    assert value(found, 'gpu_layout_drift', gpu=L40S, layout='l40s') == 1
    # placements are mixed-size mode's
    assert series(found, 'placements_free') == []


def test_placements_nvml_cannot_say_are_absent(host):
    found = scrape(host, MIXED, Session({L40S: l40s(placements={
        T1B: (5,)})}))
    assert value(found, 'placements_free', gpu=L40S, type=T1B) == 1
    assert series(found, 'placements_free') == [{'gpu': L40S, 'type': T1B}]
    assert value(found, 'placements_used', gpu=L40S, type=T24Q) == 0


# --- a MIG GPU ---------------------------------------------------------------

def test_a_mig_gpu_at_its_layout(host):
    found = scrape(host, MIG, Session({MIGGPU: h100()}))
    assert value(found, 'gpu_layout_mode', gpu=MIGGPU, mode='mig') == 1
    assert value(found, 'gpu_layout_drift', gpu=MIGGPU, layout='h100') == 0
    assert series(found, 'gpu_instance_info') == [
        {'gpu': MIGGPU, 'gi': '1', 'profile': '1g.10gb'},
        {'gpu': MIGGPU, 'gi': '2', 'profile': '1g.10gb'},
        {'gpu': MIGGPU, 'gi': '3', 'profile': '3g.40gb'}]
    assert value(found, 'gpu_instance_vgpus_used', gpu=MIGGPU, gi='1',
                 profile='1g.10gb', type=T1G) == 1
    assert value(found, 'gpu_instance_vgpus_free', gpu=MIGGPU, gi='1',
                 profile='1g.10gb', type=T1G) == 0
    assert value(found, 'gpu_instance_vgpus_free', gpu=MIGGPU, gi='2',
                 profile='1g.10gb', type=T1G) == 1
    assert value(found, 'gpu_instance_vgpus_free', gpu=MIGGPU, gi='3',
                 profile='3g.40gb', type=T3G) == 1
    # only the types of the GI's profile
    assert {s['type'] for s in series(found, 'gpu_instance_vgpus_free')
            if s['gi'] == '3'} == {T3G}
    assert series(found, 'placements_free') == []


def test_a_missing_gpu_instance_is_drift_with_its_steps(host):
    found = scrape(host, MIG, Session({MIGGPU: h100(gis=((1, 19),))}))
    assert value(found, 'gpu_layout_drift', gpu=MIGGPU, layout='h100') == 1
    # create one 1g.10gb and one 3g.40gb GPU instance
    assert value(found, 'gpu_layout_steps', gpu=MIGGPU, layout='h100') == 2


def test_mig_off_on_a_mig_layout_is_drift(host):
    """Drift with the steps that bring it back (a GPU that cannot hold its
    layout is drift too, without steps: the next test)."""
    gpu = h100(gis=(), active=())
    gpu.facts = tl.h100_facts(mig=False)
    found = scrape(host, MIG, Session({MIGGPU: gpu}))
    assert value(found, 'gpu_layout_mode', gpu=MIGGPU,
                 mode='time-sliced') == 1
    assert value(found, 'gpu_layout_drift', gpu=MIGGPU, layout='h100') == 1
    # disable the VFs, turn MIG mode on, enable the VFs, create two
    # 1g.10gb and one 3g.40gb GPU instance
    assert value(found, 'gpu_layout_steps', gpu=MIGGPU, layout='h100') == 6
    assert read_ok(found)['layout'] == 1


@pytest.mark.parametrize('body, said', [
    # a type the GPU never offers with MIG on
    (MIG.replace('nvidia-1150, nvidia-1152', 'nvidia-1160'),
     'nvidia-1160 is time-sliced'),
    # a GI profile the GPU lacks (layout plan's AttributeError)
    (MIG.replace('1g.10gb:2, 3g.40gb:1', '5g.50gb:1'),
     'the GPU has no GI profile 5g.50gb'),
])
def test_mig_still_to_change_on_a_layout_the_gpu_cannot_hold(
        host, caplog, body, said):
    """MIG mode still to change, and the layout checked as ``layout plan``
    checks it before the first step: drift without steps (logged), the
    part still read."""
    gpu = h100(gis=(), active=())
    gpu.facts = tl.h100_facts(mig=False)
    with caplog.at_level('WARNING'):
        found = scrape(host, body, Session({MIGGPU: gpu}))
    assert value(found, 'gpu_layout_drift', gpu=MIGGPU, layout='h100') == 1
    assert series(found, 'gpu_layout_steps') == []
    assert read_ok(found)['layout'] == 1
    assert said in caplog.text


def test_a_gpu_instance_holding_another_type_has_no_room(host):
    gpu = h100(gis=((1, 9),), active=())
    gpu.facts = layout.GpuFacts(
        address=gpu.facts.address, mig=True, profiles=gpu.facts.profiles,
        types=gpu.facts.types + (tl.vtype(1170, 'NVIDIA H100-3-40Q', 40,
                                          gi=9, per_gi=2),))
    gpu.active = (nvml.ActiveVgpu(objects.TypeId.parse(T3G), 1, None),)
    found = scrape(host, '', Session({MIGGPU: gpu}))
    assert value(found, 'gpu_instance_vgpus_free', gpu=MIGGPU, gi='1',
                 profile='3g.40gb', type='nvidia-1170') == 0
    assert value(found, 'gpu_instance_vgpus_used', gpu=MIGGPU, gi='1',
                 profile='3g.40gb', type='nvidia-1170') == 0
    gpu.active = ()
    found = scrape(host, '', Session({MIGGPU: gpu}))
    assert value(found, 'gpu_instance_vgpus_free', gpu=MIGGPU, gi='1',
                 profile='3g.40gb', type='nvidia-1170') == 2


def test_a_layout_the_gpu_cannot_hold_is_drift_without_steps(host):
    gpu = h100()
    gpu.facts = layout.GpuFacts(address=gpu.facts.address, mig=True,
                                profiles=gpu.facts.profiles,
                                types=gpu.facts.types[1:])   # no 1150
    found = scrape(host, MIG, Session({MIGGPU: gpu}))
    assert value(found, 'gpu_layout_drift', gpu=MIGGPU, layout='h100') == 1
    assert series(found, 'gpu_layout_steps') == []
    assert read_ok(found)['layout'] == 1


# --- GPUs in no layout -------------------------------------------------------

def test_a_gpu_in_no_layout_has_a_mode_and_no_drift(host):
    found = scrape(host, MIXED, Session({L40S: l40s(), MIGGPU: h100()}))
    assert value(found, 'gpu_layout_mode', gpu=MIGGPU, mode='mig') == 1
    assert series(found, 'gpu_layout_drift') == [
        {'gpu': L40S, 'layout': 'l40s'}]
    assert series(found, 'gpu_layout_steps') == [
        {'gpu': L40S, 'layout': 'l40s'}]
    assert len(series(found, 'gpu_instance_info')) == 3


def test_a_gpu_nvml_does_not_list_and_in_no_layout_is_left_out(host):
    found = scrape(host, '', Session({L40S: l40s()}))
    assert series(found, 'gpu_layout_mode') == [
        {'gpu': L40S, 'mode': 'mixed-size'}]
    assert read_ok(found)['layout'] == 1


def test_a_gpu_without_vgpu_types_is_left_out(host):
    found = scrape(host, '', Session({L40S: l40s(), MIGGPU: Gpu(
        layout.GpuFacts(address=_address(MIGGPU), mig=False))}))
    assert [s['gpu'] for s in series(found, 'gpu_layout_mode')] == [L40S]


# --- what cannot be read is said, never invented -----------------------------

def test_a_layout_gpu_nvml_does_not_list_makes_the_part_unreadable(host):
    found = scrape(host, MIXED + MIG, Session({L40S: l40s()}))
    assert read_ok(found)['layout'] == 0
    assert no_layout_series(found)
    assert read_ok(found)['host'] == 1


@pytest.mark.parametrize('call', ['mig_mode', 'gpu_instances',
                                  'mixed_size', 'active_vgpus',
                                  'creatable_placements', 'scheduler'])
def test_an_nvml_error_makes_the_part_unreadable(host, call):
    session = Session({L40S: l40s(), MIGGPU: h100()}, fail=call)
    found = scrape(host, MIXED + MIG, session)
    assert read_ok(found)['layout'] == 0
    assert no_layout_series(found)
    assert session.closed
    # the other parts are served
    assert {s['gpu'] for s in series(found, 'gpu_info')} == {L40S, MIGGPU}


def test_layouts_without_nvml_are_unreadable(host):
    for found in (scrape(host, MIXED, None),
                  scrape(host, MIXED, nvml_on=False)):
        assert read_ok(found)['layout'] == 0
        assert no_layout_series(found)


def test_without_layouts_and_nvml_the_part_is_absent(host):
    for found in (scrape(host, '', None), scrape(host, '', nvml_on=False)):
        assert 'layout' not in read_ok(found)
        assert no_layout_series(found)


def test_a_configuration_error_makes_the_part_unreadable(host):
    both = MIXED.replace('[layout_l40s]', '[layout_other]')
    found = scrape(host, MIXED + both, Session({L40S: l40s()}))
    assert read_ok(found)['layout'] == 0
    assert no_layout_series(found)


def test_a_layout_gpu_without_vgpu_types_is_drift(host):
    found = scrape(host, MIXED, Session({L40S: Gpu(layout.GpuFacts(
        address=_address(L40S), mig=None), mixed=False)}))
    assert value(found, 'gpu_layout_mode', gpu=L40S, mode='time-sliced') == 1
    assert value(found, 'gpu_layout_drift', gpu=L40S, layout='l40s') == 1


def test_every_layout_series_is_in_the_metrics_table():
    names = {family.name[len('libvirt_gpu_'):]
             for family in exporter.layout_families(())}
    assert names == set(LAYOUT_SERIES)
    path = os.path.join(paths.ROOT, 'docs', 'admin', 'metrics.md')
    with open(path) as f:
        rows = [line for line in f if line.startswith('| `libvirt_gpu_')]
    missing = [name for name in LAYOUT_SERIES
               if not any('`libvirt_gpu_%s`' % name in row for row in rows)]
    assert missing == []


# --- the simulated driver through nvidia-ml-py ([gpu]/nvml = simulated) ----

def test_the_simulated_h100_as_it_boots_drifts_by_layout_plan_s_steps(
        tmp_path):
    """A real binding over the simulated H100 (MIG off, its VFs enabled):
    its mode is the driver's, and its drift steps are those `layout
    plan` lists for it."""
    root = str(tmp_path / 'sys')
    simulator.write_sysfs(simulator.load_profile('h100-80gb'), root)
    config = tmp_path / 'c.conf'
    config.write_text(
        '[DEFAULT]\nstate_dir = %s\nsysfs_root = %s\n[gpu]\nnvml = '
        'simulated\nlayouts = h100\n[layout_h100]\ngpus = 0000:4e:00.0\n'
        'mode = mig\ngpu_instances = 1g.10gb:2, 3g.40gb:1\n'
        'vgpu_types = nvidia-1308, nvidia-1312\n' % (tmp_path / 'state',
                                                     root))
    env = environment.Environment.from_conf(conf_mod.load(str(config)))
    found = {}
    for family in prom_parser.text_string_to_metric_families(
            exporter.exposition(exporter.HostCollector(env))):
        for s in family.samples:
            found[(s.name, frozenset(s.labels.items()))] = s.value
    [plan] = layouts.converge(env, dry_run=True).plans
    assert len(plan.steps) > 1
    gpu = '0000:4e:00.0'
    assert value(found, 'gpu_layout_mode', gpu=gpu, mode='time-sliced') == 1
    assert value(found, 'gpu_layout_drift', gpu=gpu, layout='h100') == 1
    assert value(found, 'gpu_layout_steps', gpu=gpu,
                 layout='h100') == len(plan.steps)
    assert series(found, 'gpu_instance_info') == []
    assert read_ok(found)['layout'] == 1
