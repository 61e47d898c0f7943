"""What an ``Environment`` (environment.py) keeps when it is discovered
again or replaced, that the rest of the unit layer left open
(docs/dev/mutation.md): routes it was given (the hook's, from its
snapshot; restore discovers the host again after enabling VFs) and the
``[gpu]/nvml`` setting it was given without a configuration."""

import pytest

from libvirt_gpu import environment
from libvirt_gpu import objects
from libvirt_gpu.devices import nvml
from libvirt_gpu.devices import routes
from tests.doubles import kernel_sysfs
from tests.doubles import trees
from tests.doubles import t4_hook as th

A, B = (objects.PciAddress.parse(x) for x in (th.A, th.B))


@pytest.fixture
def sysfs():
    with trees.simulated_tree('t4') as (root, profile):
        yield kernel_sysfs.KernelSysfs(root, profile)


def test_given_routes_outlive_a_rediscovery_and_a_replace(sysfs, tmp_path):
    given = routes.Routes(owners={A: routes.CYBORG})
    env = environment.Environment(str(tmp_path / 'state'), sysfs=sysfs,
                                  routes=given)
    for again in (env.rediscover(), env.replace(parallel=True),
                  env.rediscover().rediscover()):
        assert again.routes.route_of(A) == routes.CYBORG
        assert again.routes.route_of(B) == routes.OURS
        # the pass-through backend leaves the GPU alone too
        assert A in again.routes.foreign()


def test_a_given_nvml_setting_outlives_a_rediscovery_and_a_replace(
        sysfs, tmp_path):
    env = environment.Environment(str(tmp_path / 'state'), sysfs=sysfs,
                                  nvml_setting=nvml.SIMULATED)
    for again in (env.rediscover(), env.replace(parallel=True)):
        assert again.nvml_setting == nvml.SIMULATED
        assert isinstance(again.nvml, nvml.Nvml)
    off = environment.Environment(str(tmp_path / 'state'), sysfs=sysfs,
                                  nvml_setting=nvml.OFF)
    assert off.rediscover().nvml is None
