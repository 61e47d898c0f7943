"""Exporter behaviours no other test pinned (issue 30, section 6): a whole
GPU a running domain uses is not free; a vGPU's ``exists`` label comes
from sysfs, not from its lease; ``leases{state}`` is served for every
state, at 0 too; a hook call that took exactly a bucket's bound counts in
that bucket.  Through a whole scrape of the collector on the simulated
T4 host, read back with prometheus_client's parser."""

import os

import pytest

from libvirt_gpu import objects
from libvirt_gpu import conf as conf_mod
from libvirt_gpu import environment
from libvirt_gpu import exporter
from libvirt_gpu.store import figures
from libvirt_gpu.virt import host as host_mod
from libvirt_gpu.store import state
from tests.doubles import fake_libvirt
from tests.doubles import trees
from tests.doubles import exporter_scrape
from tests.doubles import t4_hook as th

A, B, DOM = th.A, th.B, th.DOM
P = 'libvirt_gpu_'


@pytest.fixture
def vgpu_host(tmp_path):
    with trees.simulated_tree('t4') as (root, profile):
        yield th.Env(root, profile, tmp_path)


@pytest.fixture
def pgpu_host(tmp_path):
    """The T4 host with no vGPU type enabled: both GPUs offered whole."""
    with trees.simulated_tree('t4', without_mdevs=True) as (root, profile):
        host = th.Env(root, profile, tmp_path)
        with open(host.config, 'w') as f:
            f.write('[DEFAULT]\nsysfs_root = %s\nstate_dir = %s\n'
                    % (root, host.state_dir))
        yield host


def scrape(host, conn=None):
    """``{(name, frozenset(labels.items())): value}`` of one scrape."""
    libvirt_host = (host_mod.Host.from_connection(conn)
                    if conn is not None else None)
    env = environment.Environment.from_conf(
        conf_mod.load(host.config), sysfs=host.sysfs, conn=libvirt_host)
    return exporter_scrape.scrape(exporter.HostCollector(env))


def value(samples, metric, **labels):
    return samples[(P + metric, frozenset(labels.items()))]


def series(samples, name):
    return [dict(k[1]) for k in samples if k[0] == P + name]


# --- a whole GPU ------------------------------------------------------------

@pytest.mark.parametrize('running', [True, False])
def test_a_whole_gpu_a_running_domain_uses_is_not_free(pgpu_host, tmp_path,
                                                       running):
    """Broken by counting a whole GPU free whatever libvirt says its
    domains use."""
    conn = fake_libvirt.FakeConnection(str(tmp_path / 'doms'))
    conn.define(th.domain_xml(pgpus=[A]).decode(), active=running)
    found = scrape(pgpu_host, conn)
    assert value(found, 'gpu_capacity', gpu=A, mode='pgpu', type='') == 1
    assert value(found, 'gpu_used', gpu=A, mode='pgpu', type='') == \
        (1 if running else 0)
    assert value(found, 'gpu_free', gpu=A, mode='pgpu', type='') == \
        (0 if running else 1)
    # the other GPU stays free
    assert value(found, 'gpu_used', gpu=B, mode='pgpu', type='') == 0
    assert value(found, 'gpu_free', gpu=B, mode='pgpu', type='') == 1


# --- vGPUs and leases -------------------------------------------------------

def test_exists_comes_from_sysfs_not_from_the_lease(vgpu_host):
    """A lease whose vGPU is not made (yet) says ``exists="no"``; a vGPU
    without a lease ``yes`` (broken by judging by the lease)."""
    pending = th.new_uuid()
    with state.LeaseStore(vgpu_host.state_dir).transaction() as txn:
        txn.add(pending, DOM, objects.PciAddress.parse(A),
                objects.TypeId.parse('nvidia-223'), state.RESERVED)
    made = th.new_uuid()
    assert vgpu_host.run('prepare', th.domain_xml(
        [(made, 'nvidia-223', B)], uuid=th.new_uuid()))[0] == 0
    found = {s['uuid']: s for s in series(scrape(vgpu_host), 'vgpu_info')}
    assert (found[pending]['lease_state'], found[pending]['exists']) == (
        'reserved', 'no')
    assert (found[made]['lease_state'], found[made]['exists']) == (
        'created', 'yes')
    unleased = [s for s in found.values() if s['lease_state'] == 'none']
    assert unleased and all(s['exists'] == 'yes' for s in unleased)


def test_leases_by_state_are_served_at_zero(vgpu_host):
    """Every state's series is there with no lease at all, so an alert on
    ``leases{state="reserved"}`` never sees "no data" (broken by counting
    only the states that occur)."""
    found = scrape(vgpu_host)
    assert {s['state'] for s in series(found, 'leases')} == set(
        state.STATES)
    for name in state.STATES:
        assert value(found, 'leases', state=name) == 0
    with state.LeaseStore(vgpu_host.state_dir).transaction() as txn:
        txn.add(th.new_uuid(), DOM, objects.PciAddress.parse(A),
                objects.TypeId.parse('nvidia-223'), state.RESERVED)
    found = scrape(vgpu_host)
    assert [value(found, 'leases', state=name) for name in state.STATES] \
        == [1, 0, 0]


# --- the hook's latency histogram -------------------------------------------

@pytest.mark.parametrize('bound', figures.BUCKETS)
def test_a_call_of_exactly_a_bound_counts_in_that_bucket(vgpu_host, bound):
    """Prometheus' buckets are ``le`` (less than or equal): broken by
    ``<``, which moves such a call up one bucket."""
    os.makedirs(vgpu_host.state_dir, mode=0o700, exist_ok=True)
    figures.record_hook_call(vgpu_host.state_dir, 'prepare', figures.OK,
                             bound)
    counts = figures.hook_figures(vgpu_host.state_dir)['prepare']['counts']
    assert counts[figures.BUCKETS.index(bound)] == 1 and sum(counts) == 1
    found = scrape(vgpu_host)
    index = figures.BUCKETS.index(bound)
    below = figures.BUCKETS[index - 1] if index else None
    assert value(found, 'hook_duration_seconds_bucket', operation='prepare',
                 le=repr(float(bound))) == 1
    if below is not None:
        assert value(found, 'hook_duration_seconds_bucket',
                     operation='prepare', le=repr(float(below))) == 0
