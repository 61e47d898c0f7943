"""NVML as an optional source, through a fake ``pynvml`` (tests/nvml_fake)
that answers as NVML answered on the real H100 (nvml.json beside the
capture) and as NVML's API reference describes a vGPU host."""

import pytest

from libvirt_gpu.devices import discovery
from libvirt_gpu import exception
from libvirt_gpu.devices import nvml
from libvirt_gpu import objects
from libvirt_gpu.devices import pciids
from libvirt_gpu.devices import sysfs as sysfs_mod
from tests.doubles import h100
from tests.doubles import kinds
from tests.doubles import nvml_fake
import logging
import sys
import types
from libvirt_gpu.devices import layout
from libvirt_gpu.simulator import kernel as kernel_mod
from libvirt_gpu.simulator import mig
from libvirt_gpu.simulator import nvml as sim_nvml

GPU = objects.PciAddress.parse(h100.GPU)


def _h100():
    return nvml_fake.module(nvml_fake.h100_spec(h100.NVML_JSON))


def l40s_vgpu_host_spec():
    """An L40S on NVIDIA's vGPU host driver, as NVML documents it:

    - nvmlDeviceGetVirtualizationMode: NVML_GPU_VIRTUALIZATION_MODE_HOST_VGPU
      (3) on a vGPU host;
    - nvmlDeviceGetMigMode: NVML_ERROR_NOT_SUPPORTED on a GPU without MIG;
    - nvmlDeviceGetSupportedVgpus: every vGPU type id the GPU supports;
    - nvmlDeviceGetCreatableVgpus: the ids creatable now (fewer once vGPUs
      of one framebuffer size exist);
    - nvmlVgpuTypeGetName, nvmlVgpuTypeGetFramebufferSize (bytes),
      nvmlVgpuTypeGetMaxInstances(device, type): per type.
    """
    return {'gpus': [{
        'name': 'NVIDIA L40S', 'bus_id': '00000000:3D:00.0',
        'memory_total_mib': 46068, 'virtualization_mode': 3,
        'mig_mode': nvml_fake.NOT_SUPPORTED,
        'supported_vgpus': [1145, 1150, 1155],
        'creatable_vgpus': [1150],
        'vgpu_types': {
            1145: {'name': 'NVIDIA L40S-1B', 'framebuffer_mib': 1024,
                   'max_instances': 32},
            1150: {'name': 'NVIDIA L40S-4Q', 'framebuffer_mib': 4096,
                   'max_instances': 12},
            1155: {'name': 'NVIDIA L40S-24Q', 'framebuffer_mib': 24576,
                   'max_instances': 2},
        }}]}


def test_h100_as_nvml_answered():
    """nvml.json: nvmlDeviceGetName 'NVIDIA H100 80GB HBM3',
    nvmlDeviceGetMemoryInfo 81559 MiB, nvmlDeviceGetVirtualizationMode 1
    (passthrough), nvmlDeviceGetMigMode [0, 0], and the vGPU queries
    (nvmlDeviceGetSupportedVgpus, nvmlDeviceGetCreatableVgpus) Not
    Supported: no vGPU host driver."""
    fake = _h100()
    found = nvml.Nvml(fake).query()
    assert found == {GPU: objects.NvmlGpu(
        name='NVIDIA H100 80GB HBM3', memory_total_mib=81559,
        virtualization_mode='passthrough', mig_enabled=False,
        vgpu_types=())}
    assert fake.state['initialised'] == 0          # shut down again
    assert fake.state['calls'][0] == 'nvmlInit'
    assert fake.state['calls'][-1] == 'nvmlShutdown'


def test_vgpu_host_types():
    found = nvml.Nvml(nvml_fake.module(l40s_vgpu_host_spec())).query()
    info = found[objects.PciAddress.parse('0000:3d:00.0')]
    assert (info.virtualization_mode, info.mig_enabled,
            info.memory_total_mib) == ('vgpu_host', None, 46068)
    assert info.vgpu_types == (
        objects.NvmlVgpuType(1145, 'NVIDIA L40S-1B', 1024, 32, False),
        objects.NvmlVgpuType(1150, 'NVIDIA L40S-4Q', 4096, 12, True),
        objects.NvmlVgpuType(1155, 'NVIDIA L40S-24Q', 24576, 2, False))


@pytest.mark.parametrize('error', ['NVML_ERROR_LIBRARY_NOT_FOUND',
                                   'NVML_ERROR_DRIVER_NOT_LOADED'])
def test_no_library_or_driver_is_silent(error, caplog):
    """nvmlInit fails with these where the driver is missing."""
    spec = dict(nvml_fake.h100_spec(h100.NVML_JSON))
    spec['init_error'] = getattr(nvml_fake.pynvml, error)
    fake = nvml_fake.module(spec)
    caplog.set_level('WARNING')
    assert nvml.Nvml(fake).query() == {}
    assert fake.state['calls'] == ['nvmlInit']
    assert caplog.records == []


def test_real_binding_without_a_gpu_is_silent(caplog):
    """The real nvidia-ml-py on this machine, which has no NVIDIA driver:
    nvmlInit cannot load libnvidia-ml.so."""
    import ctypes.util
    if ctypes.util.find_library('nvidia-ml'):
        pytest.skip('this machine has libnvidia-ml: see test_h100_as_nvml')
    caplog.set_level('WARNING')
    assert nvml.Nvml().query() == {}
    assert caplog.records == []


def test_unexpected_error_skips_that_gpu_only(caplog):
    spec = l40s_vgpu_host_spec()
    spec['gpus'].insert(0, dict(spec['gpus'][0], bus_id='not-an-address'))
    found = nvml.Nvml(nvml_fake.module(spec)).query()
    assert list(found) == [objects.PciAddress.parse('0000:3d:00.0')]
    assert 'NVML: GPU 0 skipped' in caplog.text


def test_discovery_supplement_on_the_capture(h100_sysfs):
    tree = sysfs_mod.Sysfs(h100_sysfs)
    named = discovery.with_nvml(discovery.from_sysfs(
        tree, pci_ids=pciids.PciIds(), kinds=kinds.registered()),
        nvml.Nvml(_h100()), kinds=kinds.registered())
    (gpu,) = named.gpus
    assert gpu.nvml.memory_total_mib == 81559
    assert gpu.nvml.virtualization_mode == 'passthrough'
    # The database's name is kept (libvirt's); NVML's is in gpu.nvml.
    assert gpu.product_name == pciids.PciIds().device('10de', '2330')
    # Without the database NVML names the GPU.
    unnamed = discovery.with_nvml(discovery.from_sysfs(
        tree, kinds=kinds.registered()), nvml.Nvml(_h100()),
        kinds=kinds.registered())
    assert unnamed.gpus[0].product_name == 'NVIDIA H100 80GB HBM3'


def test_discovery_without_nvml_is_unchanged(h100_sysfs):
    plain = discovery.from_sysfs(sysfs_mod.Sysfs(h100_sysfs),
                                 kinds=kinds.registered())
    spec = dict(nvml_fake.h100_spec(h100.NVML_JSON),
                init_error=nvml_fake.pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    assert discovery.with_nvml(plain, nvml.Nvml(
        nvml_fake.module(spec)), kinds=kinds.registered()) is plain
    assert discovery.with_nvml(plain, None, kinds=kinds.registered()) is plain
    assert plain.gpus[0].nvml is None


def test_setting():
    assert nvml.source('off') is None
    assert isinstance(nvml.source('auto'), nvml.Nvml)
    with pytest.raises(exception.ConfigError, match=r'\[gpu\]/nvml'):
        nvml.source('on')


def test_bad_setting_is_a_config_error(tmp_path, capsys, h100_sysfs):
    from libvirt_gpu.cmd import main as cli
    conf = tmp_path / 'bad.conf'
    conf.write_text('[gpu]\nnvml = yes\n')
    code = cli.main(['--config-file', str(conf), '--sysfs-root', h100_sysfs,
                     'list'])
    out, err = capsys.readouterr()
    assert code == 1 and out == ''
    assert err.startswith('libvirt-gpu: error: Configuration error:')
    assert 'nvml' in err


# --- what make mutation found ----------------------------------------------
#
# What NVML's reading and changing (devices/nvml.py) promises that
# test_nvml and test_sim_nvml left open: each test here fails on a change
# ``make mutation`` made to nvml.py that the rest stayed green on
# (docs/dev/mutation.md): the whole error a user reads, each unit
# conversion, the order of what is listed, what is skipped and what stops
# the read, and which GPU instance is made, kept or destroyed.
#
# NVML is the simulated binding (nvidia-ml-py's own ``pynvml`` over a
# simulated ``libnvidia-ml``): over a simulated H100 or L40S host
# (``SimKernel``), whose failures a test injects (``sim_nvml.inject``), or
# over a description of GPUs (tests/doubles/nvml_fake.py) where a test
# needs an answer no simulated host gives.

H100 = objects.PciAddress.parse('0000:4e:00.0')
H100_VF = '0000:4e:00.4'
L40S = objects.PciAddress.parse('0000:3d:00.0')
L40S_2 = objects.PciAddress.parse('0000:bd:00.0')
MIB = 1024 * 1024


def _host(profile):
    kernel = kernel_mod.SimKernel(profile)
    return kernel, sim_nvml.module(kernel=kernel)


def _session(lib):
    lib.nvmlInit()
    return nvml.Session(lib)


def _mig_h100():
    """An H100 with its VFs off and MIG on (through the binding, not the
    code under test): ``(kernel, lib, session, {profile name:
    GiProfile})``."""
    kernel, lib = _host('h100-80gb')
    kernel.set_numvfs(str(H100), '0')
    session = _session(lib)
    lib.nvmlDeviceSetMigMode(session.handle(H100), 1)
    return kernel, lib, session, {p.name: p for p in H100_PROFILES}


def _make_gi(lib, profile_id, compute=True):
    """A GPU instance made through the binding, with the compute instance
    that spans it (``compute``); its id."""
    handle = lib.nvmlDeviceGetHandleByIndex(0)
    gi = lib.nvmlDeviceCreateGpuInstance(handle, profile_id)
    if compute:
        slices = {19: 1, 14: 2}[profile_id]
        info = lib.nvmlGpuInstanceGetComputeInstanceProfileInfo(
            gi, {1: 0, 2: 1}[slices],
            lib.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
        lib.nvmlGpuInstanceCreateComputeInstance(gi, info.id)
    return lib.nvmlGpuInstanceGetInfo(gi).id


def _gpu(**changes):
    """One GPU of nvml_fake's spec: an L40S on a vGPU host."""
    gpu = {'name': 'NVIDIA L40S', 'bus_id': '00000000:3D:00.0',
           'memory_total_mib': 46068, 'virtualization_mode': 3,
           'mig_mode': nvml_fake.NOT_SUPPORTED,
           'supported_vgpus': [], 'creatable_vgpus': [], 'vgpu_types': {}}
    gpu.update(changes)
    return gpu


def _fake(*gpus):
    return nvml_fake.module({'gpus': list(gpus)})


# --- Nvml.query --------------------------------------------------------------

@pytest.mark.parametrize('mode, name', [(0, 'none'), (1, 'passthrough'),
                                        (2, 'vgpu'), (3, 'vgpu_host'),
                                        (4, 'vsga_host'), (9, '9')])
def test_each_virtualization_mode_is_named(mode, name):
    (gpu,) = nvml.Nvml(_fake(_gpu(virtualization_mode=mode))).query().values()
    assert gpu.virtualization_mode == name


def test_mig_on_and_unanswered_fields_are_none():
    (gpu,) = nvml.Nvml(_fake(_gpu(
        mig_mode=[1, 0], name=nvml_fake.NOT_SUPPORTED,
        memory_total_mib=nvml_fake.NOT_SUPPORTED,
        virtualization_mode=nvml_fake.NOT_SUPPORTED))).query().values()
    assert gpu == objects.NvmlGpu(name=None, memory_total_mib=None,
                                  virtualization_mode=None, mig_enabled=True,
                                  vgpu_types=())
    (gpu,) = nvml.Nvml(_fake(_gpu(mig_mode=[0, 1]))).query().values()
    assert gpu.mig_enabled is False          # the current mode, not pending


def test_memory_is_whole_mib():
    (gpu,) = nvml.Nvml(_fake(_gpu())).query().values()
    assert gpu.memory_total_mib == 46068
    assert type(gpu.memory_total_mib) is int


def test_the_name_is_stripped_and_blank_is_none():
    (gpu,) = nvml.Nvml(_fake(_gpu(name='  NVIDIA L40S \n'))).query().values()
    assert gpu.name == 'NVIDIA L40S'
    (gpu,) = nvml.Nvml(_fake(_gpu(name='   '))).query().values()
    assert gpu.name is None


def test_text_decodes_bytes_replacing_what_is_not_utf8():
    assert nvml._text(b' NVIDIA \xff ') == 'NVIDIA \ufffd'
    assert nvml._text(b'  ') is None
    assert nvml._text(7) is None
    assert nvml._text(None) is None


VGPU_TYPES = {
    1145: {'name': 'NVIDIA L40S-1B', 'framebuffer_mib': 1024,
           'max_instances': 32},
    1150: {'name': ' NVIDIA L40S-4Q ', 'framebuffer_mib': 4096,
           'max_instances': 12},
    1155: {'name': 'NVIDIA L40S-24Q', 'framebuffer_mib': 24576,
           'max_instances': 2},
    1160: {'name': 'NVIDIA L40S-48Q', 'framebuffer_mib': 49152,
           'max_instances': 1},
}


def test_supported_types_in_nvml_s_order_then_the_other_creatable_sorted():
    (gpu,) = nvml.Nvml(_fake(_gpu(
        supported_vgpus=[1155, 1145], creatable_vgpus=[1160, 1150, 1145],
        vgpu_types=VGPU_TYPES))).query().values()
    assert gpu.vgpu_types == (
        objects.NvmlVgpuType(1155, 'NVIDIA L40S-24Q', 24576, 2, False),
        objects.NvmlVgpuType(1145, 'NVIDIA L40S-1B', 1024, 32, True),
        objects.NvmlVgpuType(1150, 'NVIDIA L40S-4Q', 4096, 12, True),
        objects.NvmlVgpuType(1160, 'NVIDIA L40S-48Q', 49152, 1, True))
    assert all(type(t.framebuffer_mib) is int for t in gpu.vgpu_types)


def test_types_when_one_list_is_not_answered():
    (gpu,) = nvml.Nvml(_fake(_gpu(
        supported_vgpus=nvml_fake.NOT_SUPPORTED, creatable_vgpus=[1150],
        vgpu_types=VGPU_TYPES))).query().values()
    assert gpu.vgpu_types == (
        objects.NvmlVgpuType(1150, 'NVIDIA L40S-4Q', 4096, 12, True),)
    (gpu,) = nvml.Nvml(_fake(_gpu(
        supported_vgpus=[1150], creatable_vgpus=nvml_fake.NOT_SUPPORTED,
        vgpu_types=VGPU_TYPES))).query().values()
    assert gpu.vgpu_types == (
        objects.NvmlVgpuType(1150, 'NVIDIA L40S-4Q', 4096, 12, False),)


def test_max_instances_is_asked_of_this_gpu():
    """nvmlVgpuTypeGetMaxInstances(device, type): the simulated H100's
    MIG-backed types have none while MIG is off, its time-sliced ones
    20 of 4 GB."""
    kernel, lib = _host('h100-80gb')
    (gpu,) = nvml.Nvml(lib).query().values()
    counts = {t.name: t.max_instances for t in gpu.vgpu_types}
    assert counts['NVIDIA H100-4C'] == 20
    assert counts['NVIDIA H100-1-10C'] == 0


def test_every_gpu_is_read_between_one_init_and_one_shutdown():
    fake = _fake(_gpu(), _gpu(bus_id='00000000:BD:00.0'))
    found = nvml.Nvml(fake).query()
    assert list(found) == [L40S, L40S_2]
    assert fake.state['calls'].count('nvmlInit') == 1
    assert fake.state['calls'][-1] == 'nvmlShutdown'
    assert fake.state['initialised'] == 0


def test_a_gpu_that_fails_is_skipped_with_its_index(caplog):
    kernel, lib = _host('l40s')
    sim_nvml.inject('nvmlDeviceGetHandleByIndex_v2', nth=1, kernel=kernel)
    caplog.set_level(logging.WARNING)
    assert list(nvml.Nvml(lib).query()) == [L40S_2]
    assert [r.getMessage() for r in caplog.records] == [
        'NVML: GPU 0 skipped: Unknown Error']
    assert lib.nvmlLib._initialised == 0


def test_a_gpu_list_that_fails_is_empty_and_shut_down(caplog):
    kernel, lib = _host('l40s')
    sim_nvml.inject('nvmlDeviceGetCount_v2', nth=1, kernel=kernel)
    caplog.set_level(logging.WARNING)
    assert nvml.Nvml(lib).query() == {}
    assert [r.getMessage() for r in caplog.records] == [
        'NVML: cannot list GPUs: Unknown Error']
    assert lib.nvmlLib._initialised == 0


def test_a_shutdown_that_fails_keeps_what_was_read(caplog):
    kernel, lib = _host('l40s')
    shutdown = lib.nvmlShutdown

    def failing():
        shutdown()
        raise lib.NVMLError(lib.NVML_ERROR_UNKNOWN)
    lib.nvmlShutdown = failing
    caplog.set_level(logging.DEBUG)
    assert list(nvml.Nvml(lib).query()) == [L40S, L40S_2]
    assert [r.getMessage() for r in caplog.records] == [
        'NVML shutdown: Unknown Error']
    assert caplog.records[0].levelno == logging.DEBUG


def test_an_init_that_fails_is_a_debug_line_only(caplog):
    fake = nvml_fake.module({'gpus': [_gpu()], 'init_error':
                             nvml_fake.pynvml.NVML_ERROR_DRIVER_NOT_LOADED})
    caplog.set_level(logging.DEBUG)
    assert nvml.Nvml(fake).usage() == {}
    assert [r.getMessage() for r in caplog.records] == [
        'NVML not used: Driver Not Loaded']
    assert fake.state['calls'] == ['nvmlInit']


def test_without_the_binding_nothing_is_read(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, 'pynvml', None)
    caplog.set_level(logging.DEBUG)
    assert nvml.Nvml().query() == {}
    assert nvml.Nvml().usage() == {}
    assert [r.getMessage() for r in caplog.records] == [
        'NVML not used: nvidia-ml-py is not installed'] * 2
    with pytest.raises(nvml.NvmlUnavailable) as raised:
        nvml.Nvml().session()
    assert str(raised.value) == (
        'NVML cannot be used: nvidia-ml-py is not installed; layouts need '
        "NVIDIA's driver and the nvidia-ml-py package ([gpu]/nvml = auto)")


def test_a_driver_error_other_than_cannot_tell_is_raised_not_none():
    """NOT_SUPPORTED, FUNCTION_NOT_FOUND, NO_PERMISSION: None; others are
    errors (the GPU is skipped)."""
    for code in (mig.NVML_ERROR_NOT_SUPPORTED,
                 nvml_fake.pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
                 nvml_fake.pynvml.NVML_ERROR_NO_PERMISSION):
        kernel, lib = _host('l40s')
        sim_nvml.inject('nvmlDeviceGetName', error=code, kernel=kernel)
        found = nvml.Nvml(lib).query()
        assert [g.name for g in found.values()] == [None, 'NVIDIA L40S']
    kernel, lib = _host('l40s')
    sim_nvml.inject('nvmlDeviceGetName', error=mig.NVML_ERROR_IN_USE,
                    kernel=kernel)
    assert list(nvml.Nvml(lib).query()) == [L40S_2]


# --- Nvml.usage --------------------------------------------------------------

UUID = '11111111-2222-4333-8444-555555555555'


def test_usage_in_shares_and_bytes():
    fake = _fake(_gpu(utilization_gpu=37, memory_used_mib=3, vgpu_instances=[
        {'id': 5, 'mdev_uuid': UUID, 'pci_id': '00000000:3D:00.4',
         'fb_usage_mib': 7, 'sm_util': 25},
        {'id': 6, 'mdev_uuid': 'not-a-uuid', 'pci_id': 'nowhere',
         'fb_usage_mib': 0},
        {'id': 8, 'mdev_uuid': '  ', 'pci_id': ' '},
        {'id': 9}]))
    (usage,) = nvml.Nvml(fake).usage().values()
    assert usage == nvml.GpuUsage(
        utilization=0.37, memory_used=3 * MIB, memory_total=46068 * MIB,
        vgpus=(nvml.VgpuUsage(mdev_uuid=objects.Uuid.parse(UUID),
                              vf=objects.PciAddress.parse('0000:3d:00.4'),
                              utilization=0.25, fb_used=7 * MIB),
               nvml.VgpuUsage(mdev_uuid=None, vf=None, utilization=None,
                              fb_used=0),
               nvml.VgpuUsage(mdev_uuid=None, vf=None, utilization=None,
                              fb_used=None),
               nvml.VgpuUsage(mdev_uuid=None, vf=None, utilization=None,
                              fb_used=None)))


def test_usage_a_gpu_cannot_tell_is_none():
    (usage,) = nvml.Nvml(_fake(_gpu(
        memory_total_mib=nvml_fake.NOT_SUPPORTED))).usage().values()
    assert usage == nvml.GpuUsage(utilization=None, memory_used=None,
                                  memory_total=None, vgpus=())


def test_usage_of_the_simulated_vfs():
    """The simulated L40S has two L40S-1B on its first GPU's VFs 4 and 5:
    NVML names their VFs, not an mdev."""
    kernel, lib = _host('l40s')
    usage = nvml.Nvml(lib).usage()
    assert [v.vf for v in usage[L40S].vgpus] == [
        objects.PciAddress.parse('0000:3d:00.4'),
        objects.PciAddress.parse('0000:3d:00.5')]
    assert {v.mdev_uuid for v in usage[L40S].vgpus} == {None}
    assert usage[L40S_2].vgpus == ()


# --- source ------------------------------------------------------------------

def test_source_settings(tmp_path):
    fake = _fake(_gpu())
    assert nvml.source('off', module=fake) is None
    assert list(nvml.source('simulated', module=fake).query()) == [L40S]
    assert list(nvml.source('auto', module=fake,
                            sysfs_root=str(tmp_path)).query()) == [L40S]
    assert nvml.source('auto', sysfs_root=str(tmp_path)) is None
    assert isinstance(nvml.source('auto', sysfs_root=None), nvml.Nvml)
    assert isinstance(nvml.source('auto', sysfs_root='/sys'), nvml.Nvml)


@pytest.mark.parametrize('root', [None, '/sys'])
def test_simulated_needs_a_simulated_root(root):
    with pytest.raises(exception.ConfigError) as raised:
        nvml.source('simulated', sysfs_root=root)
    assert str(raised.value) == (
        'Configuration error: [gpu]/nvml = simulated needs a simulated '
        "sysfs root ([DEFAULT]/sysfs_root or --sysfs-root), not this "
        "host's /sys")


def test_a_setting_of_none_of_the_choices():
    with pytest.raises(exception.ConfigError) as raised:
        nvml.source('on', module=_fake(_gpu()))
    assert str(raised.value) == (
        "Configuration error: [gpu]/nvml must be one of auto, off, "
        "simulated, not 'on'")


# --- Session: opening, calls, handles ----------------------------------------

def test_a_session_is_one_init_and_its_with_block_shuts_it_down():
    kernel, lib = _host('l40s')
    with nvml.Nvml(lib).session() as session:
        assert lib.nvmlLib._initialised == 1
        assert session.mig_mode(L40S) is None
    assert lib.nvmlLib._initialised == 0


def test_a_session_without_a_driver_names_the_error():
    fake = nvml_fake.module({'gpus': [], 'init_error':
                             nvml_fake.pynvml.NVML_ERROR_DRIVER_NOT_LOADED})
    with pytest.raises(nvml.NvmlUnavailable) as raised:
        nvml.Nvml(fake).session()
    assert str(raised.value) == (
        'NVML cannot be used: Driver Not Loaded; layouts need NVIDIA\'s '
        'driver and the nvidia-ml-py package ([gpu]/nvml = auto)')


def test_a_shutdown_that_fails_at_the_end_of_a_session_is_not_raised(
        caplog):
    kernel, lib = _host('l40s')
    lib.nvmlShutdown = lambda: (_ for _ in ()).throw(
        lib.NVMLError(lib.NVML_ERROR_UNKNOWN))
    caplog.set_level(logging.DEBUG)
    with nvml.Session(lib):
        pass
    assert [r.getMessage() for r in caplog.records] == [
        'NVML shutdown: Unknown Error']


def test_the_installed_binding_is_used_when_none_is_given():
    """This machine has nvidia-ml-py but no driver: the binding is
    imported (kept for the next call) and its nvmlInit fails."""
    import ctypes.util
    if ctypes.util.find_library('nvidia-ml'):
        pytest.skip('this machine has libnvidia-ml')
    source = nvml.Nvml()
    for _ in range(2):
        with pytest.raises(nvml.NvmlUnavailable) as raised:
            source.session()
        assert 'nvidia-ml-py is not installed' not in str(raised.value)


def test_a_failing_call_names_the_call_and_the_gpu():
    kernel, lib = _host('l40s')
    session = _session(lib)
    sim_nvml.inject('nvmlDeviceGetMigMode', error=mig.NVML_ERROR_IN_USE,
                    kernel=kernel)
    with pytest.raises(nvml.NvmlError) as raised:
        session.mig_mode(L40S)
    assert str(raised.value) == ('NVML nvmlDeviceGetMigMode on GPU '
                                 '0000:3d:00.0: In use by another client')
    # "cannot tell" is None only where the caller allows it
    sim_nvml.inject('nvmlDeviceGetVgpuSchedulerState_v2',
                    error=mig.NVML_ERROR_NOT_SUPPORTED, kernel=kernel)
    assert session.scheduler(L40S) is None
    sim_nvml.inject('nvmlDeviceSetVgpuSchedulerState_v2',
                    error=mig.NVML_ERROR_NOT_SUPPORTED, kernel=kernel)
    with pytest.raises(nvml.NvmlError, match='Not Supported'):
        session.set_scheduler(L40S, layout.Scheduler('equal-share', 4))


def test_handles_are_listed_once_by_address():
    kernel, lib = _host('l40s')
    session = _session(lib)
    assert session.mixed_size(L40S_2) is False
    sim_nvml.inject('nvmlDeviceGetCount_v2', kernel=kernel)
    assert session.mixed_size(L40S) is False       # not listed again
    with pytest.raises(nvml.NvmlUnavailable) as raised:
        session.mig_mode(objects.PciAddress.parse('0000:41:00.0'))
    assert str(raised.value) == (
        'NVML cannot be used: NVML lists no GPU 0000:41:00.0; layouts need '
        "NVIDIA's driver and the nvidia-ml-py package ([gpu]/nvml = auto)")


@pytest.mark.parametrize('point, call, where', [
    ('nvmlDeviceGetCount_v2', 'nvmlDeviceGetCount', 'all'),
    ('nvmlDeviceGetHandleByIndex_v2', 'nvmlDeviceGetHandleByIndex', '#0'),
    ('nvmlDeviceGetPciInfo_v3', 'nvmlDeviceGetPciInfo', '#0')])
def test_listing_the_gpus_names_the_call_that_failed(point, call, where):
    kernel, lib = _host('l40s')
    session = _session(lib)
    sim_nvml.inject(point, kernel=kernel)
    with pytest.raises(nvml.NvmlError) as raised:
        session.handle(L40S)
    assert str(raised.value) == 'NVML %s on GPU %s: Unknown Error' % (
        call, where)


def test_a_gpu_whose_bus_id_is_not_an_address_is_not_listed():
    lib = _fake(_gpu(bus_id='nonsense'), _gpu(bus_id='00000000:BD:00.0'))
    session = _session(lib)
    assert session.mig_mode(L40S_2) is None
    with pytest.raises(nvml.NvmlUnavailable, match='lists no GPU'):
        session.handle(L40S)


# --- Session: reading --------------------------------------------------------

def test_mig_mode_is_the_current_one_not_the_pending():
    for current, pending in ((0, 1), (1, 0)):
        session = _session(_fake(_gpu(mig_mode=[current, pending])))
        assert session.mig_mode(L40S) is bool(current)


def test_mig_mode_changes():
    kernel, lib = _host('h100-80gb')
    session = _session(lib)
    assert session.mig_mode(H100) is False
    kernel.set_numvfs(str(H100), '0')
    session.set_mig_mode(H100, True)
    assert session.mig_mode(H100) is True
    session.set_mig_mode(H100, False)
    assert session.mig_mode(H100) is False


H100_PROFILES = (
    layout.GiProfile(id=19, name='1g.10gb', slices=1, instances=7,
                     memory_mib=9984, placements=tuple(
                         (i, 1) for i in range(7))),
    layout.GiProfile(id=14, name='2g.20gb', slices=2, instances=3,
                     memory_mib=20096, placements=((0, 2), (2, 2), (4, 2))),
    layout.GiProfile(id=9, name='3g.40gb', slices=3, instances=2,
                     memory_mib=40448, placements=((0, 4), (4, 4))),
    layout.GiProfile(id=5, name='4g.40gb', slices=4, instances=1,
                     memory_mib=40448, placements=((0, 4),)),
    layout.GiProfile(id=0, name='7g.80gb', slices=7, instances=1,
                     memory_mib=81152, placements=((0, 8),)),
    layout.GiProfile(id=20, name='1g.10gb+me', slices=1, instances=1,
                     memory_mib=9984, placements=tuple(
                         (i, 1) for i in range(7))),
    layout.GiProfile(id=15, name='1g.20gb', slices=1, instances=4,
                     memory_mib=20096, placements=((0, 2), (2, 2), (4, 2),
                                                   (6, 2))))


def test_the_h100_s_gi_profiles_in_nvml_s_order():
    kernel, lib = _host('h100-80gb')
    assert _session(lib).gi_profiles(H100) == H100_PROFILES


def test_a_profile_listing_that_fails_names_the_call():
    kernel, lib = _host('h100-80gb')
    session = _session(lib)
    session.handle(H100)
    sim_nvml.inject('nvmlDeviceGetGpuInstanceProfileInfoV', nth=2,
                    kernel=kernel)
    with pytest.raises(nvml.NvmlError) as raised:
        session.gi_profiles(H100)
    assert str(raised.value) == ('NVML nvmlDeviceGetGpuInstanceProfileInfo '
                                 'on GPU 0000:4e:00.0: Unknown Error')


def test_a_gpu_without_mig_has_no_gi_profiles():
    kernel, lib = _host('l40s')
    assert _session(lib).gi_profiles(L40S) == ()


@pytest.mark.parametrize('name, slices, memory, expected', [
    ('MIG 1g.10gb+me', 1, 9984, '1g.10gb+me'),
    ('mig  2G.20GB ', 2, 20096, '2g.20gb'),
    ('MIGHTY', 1, 9984, 'mighty'),
    ('3g.40gb', 3, 40448, '3g.40gb'),
    (None, 1, 9984, '1g.10gb'),
    ('MIG ', 7, 81152, 'mig'),
    ('', 7, 81152, '7g.79gb'),
    ('Mig 4g.40gb', 4, 40448, '4g.40gb'),
    (b'', 2, 20096, '2g.20gb')])
def test_profile_names(name, slices, memory, expected):
    info = types.SimpleNamespace(name=name, sliceCount=slices,
                                 memorySizeMB=memory)
    assert nvml._profile_name(info) == expected


def test_a_profile_without_a_name_is_named_by_its_size():
    info = types.SimpleNamespace(sliceCount=4, memorySizeMB=40448)
    assert nvml._profile_name(info) == '4g.40gb'


def _types(session, address, placements=False):
    return {t.type_id: t for t in session.vgpu_types(address, placements)}


def test_mig_backed_and_time_sliced_types_of_the_h100():
    kernel, lib = _host('h100-80gb')
    session = _session(lib)
    found = session.vgpu_types(H100)
    assert [t.type_id for t in found][:3] == [
        'nvidia-1300', 'nvidia-1301', 'nvidia-1302']
    by_id = {t.type_id: t for t in found}
    assert by_id['nvidia-1300'] == layout.TypeFacts(
        type_id=objects.TypeId.parse('nvidia-1300'), name='NVIDIA H100-4C',
        framebuffer_mib=4096, gi_profile_id=None, max_per_gi=None,
        placement_size=None, placements=())
    assert by_id['nvidia-1311'] == layout.TypeFacts(
        type_id=objects.TypeId.parse('nvidia-1311'),
        name='NVIDIA H100-2-20C', framebuffer_mib=20480, gi_profile_id=14,
        max_per_gi=1, placement_size=None, placements=())
    assert type(by_id['nvidia-1311'].framebuffer_mib) is int
    # the H100 has no mixed-size mode: a placement size of 0, no ids
    with_places = _types(session, H100, placements=True)
    assert (with_places['nvidia-1300'].placement_size,
            with_places['nvidia-1300'].placements) == (0, ())
    assert (with_places['nvidia-1311'].placement_size,
            with_places['nvidia-1311'].placements) == (None, ())


def test_mixed_size_placements_of_the_l40s_types():
    kernel, lib = _host('l40s')
    session = _session(lib)
    plain = _types(session, L40S_2)
    assert plain['nvidia-1150'].placement_size is None
    assert plain['nvidia-1150'].gi_profile_id is None
    assert plain['nvidia-1150'].max_per_gi is None
    found = _types(session, L40S_2, placements=True)
    assert (found['nvidia-1150'].placement_size,
            found['nvidia-1150'].placements) == (
        3, (0, 3, 6, 9, 12, 15, 18, 21, 24, 27))
    assert (found['nvidia-1166'].placement_size,
            found['nvidia-1166'].placements) == (32, (0,))


def test_a_type_s_unanswered_facts_are_none():
    kernel, lib = _host('l40s')
    session = _session(lib)
    session.handle(L40S)
    for point in ('nvmlVgpuTypeGetFramebufferSize', 'nvmlVgpuTypeGetName',
                  'nvmlVgpuTypeGetGpuInstanceProfileId'):
        sim_nvml.inject(point, error=mig.NVML_ERROR_NOT_SUPPORTED,
                        kernel=kernel)
    first = session.vgpu_types(L40S)[0]
    assert (first.framebuffer_mib, first.name, first.gi_profile_id,
            first.max_per_gi) == (None, None, None, None)


def test_placements_the_binding_cannot_hold_are_none_of_that_type(caplog):
    kernel, lib = _host('l40s')
    session = _session(lib)
    session.handle(L40S)
    sim_nvml.inject('nvmlDeviceGetVgpuTypeSupportedPlacements',
                    error=mig.NVML_ERROR_INSUFFICIENT_SIZE, kernel=kernel)
    caplog.set_level(logging.DEBUG)
    found = session.vgpu_types(L40S, placements=True)
    assert (found[0].placement_size, found[0].placements) == (None, ())
    assert (found[1].placement_size, found[1].placements[:2]) == (2, (0, 2))
    assert [r.getMessage() for r in caplog.records] == [
        '0000:3d:00.0: no mixed-size placements of type 1145: NVML '
        'nvmlDeviceGetVgpuTypeSupportedPlacements on GPU 0000:3d:00.0: '
        'Insufficient Size']


def test_placements_that_fail_otherwise_are_an_error():
    kernel, lib = _host('l40s')
    session = _session(lib)
    session.handle(L40S)
    sim_nvml.inject('nvmlDeviceGetVgpuTypeSupportedPlacements',
                    error=mig.NVML_ERROR_IN_USE, kernel=kernel)
    with pytest.raises(nvml.NvmlError, match='nvmlDeviceGetVgpuTypeSupported'
                       'Placements on GPU 0000:3d:00.0: In use'):
        session.vgpu_types(L40S, placements=True)
    sim_nvml.inject('nvmlDeviceGetVgpuTypeSupportedPlacements',
                    error=mig.NVML_ERROR_NOT_SUPPORTED, kernel=kernel)
    found = session.vgpu_types(L40S, placements=True)
    assert (found[0].placement_size, found[0].placements) == (None, ())
    assert found[1].placement_size == 2


def test_gpu_instances_with_their_compute_and_scheduler():
    kernel, lib, session, profiles = _mig_h100()
    assert _make_gi(lib, 19) == 7
    assert _make_gi(lib, 14) == 4
    assert _make_gi(lib, 19, compute=False) == 8
    best = layout.Scheduler('best-effort', None)
    assert session.gpu_instances(H100, H100_PROFILES, schedulers=True,
                                 computes=True) == (
        layout.GpuInstance(id=4, profile_id=14, scheduler=best, start=2,
                           size=2, compute=True),
        layout.GpuInstance(id=7, profile_id=19, scheduler=best, start=0,
                           size=1, compute=True),
        layout.GpuInstance(id=8, profile_id=19, scheduler=best, start=1,
                           size=1, compute=False))
    assert session.gpu_instances(H100, (profiles['1g.10gb'],)) == (
        layout.GpuInstance(id=7, profile_id=19, scheduler=None, start=0,
                           size=1, compute=None),
        layout.GpuInstance(id=8, profile_id=19, scheduler=None, start=1,
                           size=1, compute=None))
    odd = layout.GiProfile(id=19, name='1g.10gb', slices=5, instances=7,
                           memory_mib=9984, placements=())
    assert {g.compute for g in session.gpu_instances(
        H100, (odd,), computes=True)} == {None}


def test_the_gi_scheduler_is_set_on_every_gi_of_the_profiles():
    kernel, lib, session, profiles = _mig_h100()
    _make_gi(lib, 19)
    _make_gi(lib, 14)
    session.set_gpu_instances_scheduler(
        H100, (profiles['2g.20gb'],), layout.Scheduler('equal-share', 4))
    assert [g.scheduler for g in session.gpu_instances(
        H100, H100_PROFILES, schedulers=True)] == [
        layout.Scheduler('equal-share', 4),
        layout.Scheduler('best-effort', None)]


def test_the_gpu_scheduler_round_trips():
    kernel, lib = _host('l40s')
    session = _session(lib)
    assert session.scheduler(L40S_2) == layout.Scheduler('best-effort', None)
    session.set_scheduler(L40S_2, layout.Scheduler('equal-share', 4))
    assert session.scheduler(L40S_2) == layout.Scheduler('equal-share', 4)
    session.set_scheduler(L40S_2, layout.Scheduler('fixed-share', 10))
    assert session.scheduler(L40S_2) == layout.Scheduler('fixed-share', 10)
    session.set_scheduler(L40S_2, layout.Scheduler('equal-share', 3))
    found = session.scheduler(L40S_2)      # 333 Hz: a slice of 3.003 ms
    assert found == layout.Scheduler('equal-share', 3)
    assert type(found.time_slice_ms) is int
    session.set_scheduler(L40S_2, layout.Scheduler('fixed-share', None))
    assert session.scheduler(L40S_2) == layout.Scheduler('fixed-share', 2)
    assert session.scheduler(L40S) == layout.Scheduler('best-effort', None)


def test_a_scheduler_policy_nvml_does_not_name_is_none():
    kernel, lib = _host('l40s')
    session = _session(lib)
    real = lib.nvmlDeviceGetVgpuSchedulerState_v2

    def unknown(handle, info):
        state = real(handle, info)
        state.schedulerPolicy = 9
        return state
    lib.nvmlDeviceGetVgpuSchedulerState_v2 = unknown
    assert session.scheduler(L40S) is None


def test_the_scheduler_state_nvml_is_given():
    kernel, lib = _host('l40s')
    session = _session(lib)
    state = session._scheduler_state(layout.Scheduler('fixed-share', 4))
    assert (state.engineId, state.schedulerPolicy, state.avgFactor,
            state.frequency) == (
        lib.NVML_VGPU_SCHEDULER_ENGINE_TYPE_GRAPHICS, 3, 0, 250)
    state = session._scheduler_state(layout.Scheduler('equal-share', None))
    assert (state.schedulerPolicy, state.frequency) == (2, 0)
    state = session._scheduler_state(layout.Scheduler('best-effort', 3))
    assert (state.schedulerPolicy, state.frequency) == (1, 333)
    state = session._scheduler_state(layout.Scheduler('equal-share', 1))
    assert state.frequency == 1000


def test_mixed_size_mode_and_its_placements():
    kernel, lib = _host('l40s')
    session = _session(lib)
    assert session.mixed_size(L40S_2) is False
    session.set_mixed_size(L40S_2, True)
    assert session.mixed_size(L40S_2) is True
    assert session.creatable_placements(L40S_2, 1155) == (16, (0, 16))
    kernel.set_vgpu_type('0000:bd:00.4', b'1155')
    assert session.creatable_placements(L40S_2, 1155) == (16, (16,))
    assert session.active_vgpus(L40S_2, mig=False) == (nvml.ActiveVgpu(
        type_id=objects.TypeId.parse('nvidia-1155'), gi_id=None,
        placement=0),)
    assert session.active_vgpus(L40S_2, mig=True) == (nvml.ActiveVgpu(
        type_id=objects.TypeId.parse('nvidia-1155'), gi_id=None,
        placement=None),)
    kernel.set_vgpu_type('0000:bd:00.4', b'0')
    session.set_mixed_size(L40S_2, False)
    assert session.mixed_size(L40S_2) is False


def test_mixed_size_is_none_where_n_a():
    kernel, lib, session, profiles = _mig_h100()
    assert session.mixed_size(H100) is None
    assert session.creatable_placements(H100, 1308) is None


def test_a_mig_vgpu_is_in_its_gpu_instance():
    kernel, lib, session, profiles = _mig_h100()
    kernel.set_numvfs(str(H100), '4')
    assert _make_gi(lib, 19) == 7
    kernel.set_vgpu_type(H100_VF, b'1308')
    assert session.active_vgpus(H100, mig=True) == (nvml.ActiveVgpu(
        type_id=objects.TypeId.parse('nvidia-1308'), gi_id=7,
        placement=None),)
    sim_nvml.inject('nvmlVgpuInstanceGetType',
                    error=mig.NVML_ERROR_NOT_SUPPORTED, kernel=kernel)
    sim_nvml.inject('nvmlVgpuInstanceGetGpuInstanceId',
                    error=mig.NVML_ERROR_NOT_SUPPORTED, kernel=kernel)
    assert session.active_vgpus(H100, mig=True) == (nvml.ActiveVgpu(
        type_id=None, gi_id=None, placement=None),)


def test_no_active_vgpus_where_the_gpu_cannot_tell():
    kernel, lib = _host('l40s')
    session = _session(lib)
    sim_nvml.inject('nvmlDeviceGetActiveVgpus',
                    error=mig.NVML_ERROR_NOT_SUPPORTED, kernel=kernel)
    session.handle(L40S)
    assert session.active_vgpus(L40S, mig=False) == ()
    assert len(session.active_vgpus(L40S, mig=False)) == 2


# --- Session: changing -------------------------------------------------------

def _gis(session):
    return [(g.id, g.profile_id, g.start, g.compute)
            for g in session.gpu_instances(H100, H100_PROFILES,
                                           computes=True)]


def test_a_gi_made_where_asked_with_its_compute_instance():
    kernel, lib, session, profiles = _mig_h100()
    assert session.create_gpu_instance(H100, profiles['3g.40gb'],
                                       start=4) == 2
    assert session.create_gpu_instance(H100, profiles['1g.10gb'],
                                       start=1) == 8
    assert _gis(session) == [(2, 9, 4, True), (8, 19, 1, True)]


def test_a_compute_instance_that_fails_destroys_its_gi():
    kernel, lib, session, profiles = _mig_h100()
    sim_nvml.inject('nvmlGpuInstanceCreateComputeInstance', kernel=kernel)
    with pytest.raises(nvml.NvmlError) as raised:
        session.create_gpu_instance(H100, profiles['1g.10gb'])
    assert str(raised.value) == (
        'NVML nvmlGpuInstanceCreateComputeInstance on GPU 0000:4e:00.0: '
        'Unknown Error')
    assert _gis(session) == []


@pytest.mark.parametrize('point', ['nvmlGpuInstanceGetInfo',
                                   'nvmlGpuInstanceGetComputeInstance'
                                   'ProfileInfoV'])
def test_a_gi_whose_facts_cannot_be_read_is_destroyed(point):
    kernel, lib, session, profiles = _mig_h100()
    sim_nvml.inject(point, kernel=kernel)
    with pytest.raises(nvml.NvmlError) as raised:
        session.create_gpu_instance(H100, profiles['2g.20gb'], start=2)
    assert str(raised.value) == 'NVML %s on GPU 0000:4e:00.0: Unknown ' \
        'Error' % point.replace('InfoV', 'Info')
    assert _gis(session) == []


def test_a_gi_no_compute_profile_spans_is_destroyed():
    kernel, lib, session, profiles = _mig_h100()
    odd = layout.GiProfile(id=19, name='1g.10gb', slices=5, instances=7,
                           memory_mib=9984, placements=((0, 1),))
    with pytest.raises(nvml.NvmlError) as raised:
        session.create_gpu_instance(H100, odd)
    assert str(raised.value) == (
        'NVML nvmlGpuInstanceCreateComputeInstance on GPU 0000:4e:00.0: no '
        'compute instance profile spans 5 slices')
    assert _gis(session) == []


def test_a_gi_that_cannot_be_destroyed_again_says_both():
    kernel, lib, session, profiles = _mig_h100()
    sim_nvml.inject('nvmlGpuInstanceCreateComputeInstance',
                    error=mig.NVML_ERROR_IN_USE, kernel=kernel)
    sim_nvml.inject('nvmlGpuInstanceDestroy', kernel=kernel)
    with pytest.raises(nvml.NvmlError) as raised:
        session.create_gpu_instance(H100, profiles['1g.10gb'])
    assert str(raised.value) == (
        'NVML nvmlGpuInstanceCreateComputeInstance on GPU 0000:4e:00.0: '
        'In use by another client; destroying the GPU instance again '
        'failed too (Unknown Error): the next apply destroys and makes it '
        'again')
    ((_, profile_id, _, compute),) = _gis(session)
    assert (profile_id, compute) == (19, False)   # left for the next apply


def test_destroying_a_gi_destroys_its_compute_instance_first():
    kernel, lib, session, profiles = _mig_h100()
    _make_gi(lib, 19)
    _make_gi(lib, 14)                   # its compute profile is not the first
    _make_gi(lib, 19, compute=False)
    before = _gis(session)
    assert sorted(g[3] for g in before) == [False, True, True]
    for gi_id, _, _, _ in before:
        session.destroy_gpu_instance(H100, gi_id)
    assert _gis(session) == []


def test_destroying_a_gi_whose_compute_profile_fails_names_the_call():
    kernel, lib, session, profiles = _mig_h100()
    gi_id = _make_gi(lib, 19)
    sim_nvml.inject('nvmlGpuInstanceGetComputeInstanceProfileInfoV',
                    kernel=kernel)
    with pytest.raises(nvml.NvmlError) as raised:
        session.destroy_gpu_instance(H100, gi_id)
    assert str(raised.value) == (
        'NVML nvmlGpuInstanceGetComputeInstanceProfileInfo on GPU '
        '0000:4e:00.0: Unknown Error')
    assert len(_gis(session)) == 1


def test_a_gi_that_is_not_there_cannot_be_destroyed():
    kernel, lib, session, profiles = _mig_h100()
    with pytest.raises(nvml.NvmlError, match='nvmlDeviceGetGpuInstanceById'):
        session.destroy_gpu_instance(H100, 3)


# --- every call: its failure names the call and the GPU; "cannot tell" is
# None where the caller allows it ---------------------------------------------

def _mig_with_vgpu():
    """The H100 in MIG mode: GI 7 (1g.10gb) holding an H100-1-10C on its
    first VF, GI 4 (2g.20gb) empty: ``(kernel, session, profiles)``."""
    kernel, lib, session, profiles = _mig_h100()
    kernel.set_numvfs(str(H100), '4')
    assert _make_gi(lib, 19) == 7
    kernel.set_vgpu_type(H100_VF, b'1308')
    assert _make_gi(lib, 14) == 4
    return kernel, session, profiles


def _mixed_l40s():
    """The L40S's second GPU in mixed-size mode, an L40S-24Q at
    placement 0."""
    kernel, lib = _host('l40s')
    session = _session(lib)
    lib.nvmlDeviceSetVgpuHeterogeneousMode(
        session.handle(L40S_2), lib.NVML_VGPU_PGPU_HETEROGENEOUS_MODE)
    kernel.set_vgpu_type('0000:bd:00.4', b'1155')
    return kernel, session, None


EQUAL_4 = layout.Scheduler('equal-share', 4)
FAILS = [
    # (host, C function failing, the call named, what is done)
    (_mig_with_vgpu, 'nvmlDeviceGetMigMode', 'nvmlDeviceGetMigMode',
     lambda s, p: s.mig_mode(H100)),
    (_mig_with_vgpu, 'nvmlDeviceGetGpuInstancePossiblePlacements_v2',
     'nvmlDeviceGetGpuInstancePossiblePlacements',
     lambda s, p: s.gi_profiles(H100)),
    (_mig_with_vgpu, 'nvmlDeviceGetSupportedVgpus',
     'nvmlDeviceGetSupportedVgpus', lambda s, p: s.vgpu_types(H100)),
    (_mig_with_vgpu, 'nvmlVgpuTypeGetGpuInstanceProfileId',
     'nvmlVgpuTypeGetGpuInstanceProfileId', lambda s, p: s.vgpu_types(H100)),
    (_mig_with_vgpu, 'nvmlVgpuTypeGetMaxInstancesPerGpuInstance',
     'nvmlVgpuTypeGetMaxInstancesPerGpuInstance',
     lambda s, p: s.vgpu_types(H100)),
    (_mig_with_vgpu, 'nvmlVgpuTypeGetFramebufferSize',
     'nvmlVgpuTypeGetFramebufferSize', lambda s, p: s.vgpu_types(H100)),
    (_mig_with_vgpu, 'nvmlVgpuTypeGetName', 'nvmlVgpuTypeGetName',
     lambda s, p: s.vgpu_types(H100)),
    (_mig_with_vgpu, 'nvmlDeviceGetGpuInstances', 'nvmlDeviceGetGpuInstances',
     lambda s, p: s.gpu_instances(H100, H100_PROFILES)),
    (_mig_with_vgpu, 'nvmlGpuInstanceGetInfo', 'nvmlGpuInstanceGetInfo',
     lambda s, p: s.gpu_instances(H100, H100_PROFILES)),
    (_mig_with_vgpu, 'nvmlGpuInstanceGetComputeInstanceProfileInfoV',
     'nvmlGpuInstanceGetComputeInstanceProfileInfo',
     lambda s, p: s.gpu_instances(H100, H100_PROFILES, computes=True)),
    (_mig_with_vgpu, 'nvmlGpuInstanceGetComputeInstances',
     'nvmlGpuInstanceGetComputeInstances',
     lambda s, p: s.gpu_instances(H100, H100_PROFILES, computes=True)),
    (_mig_with_vgpu, 'nvmlGpuInstanceGetVgpuSchedulerState_v2',
     'nvmlGpuInstanceGetVgpuSchedulerState_v2',
     lambda s, p: s.gpu_instances(H100, H100_PROFILES, schedulers=True)),
    (_mig_with_vgpu, 'nvmlDeviceGetActiveVgpus', 'nvmlDeviceGetActiveVgpus',
     lambda s, p: s.active_vgpus(H100, mig=True)),
    (_mig_with_vgpu, 'nvmlVgpuInstanceGetType', 'nvmlVgpuInstanceGetType',
     lambda s, p: s.active_vgpus(H100, mig=True)),
    (_mig_with_vgpu, 'nvmlVgpuInstanceGetGpuInstanceId',
     'nvmlVgpuInstanceGetGpuInstanceId',
     lambda s, p: s.active_vgpus(H100, mig=True)),
    (_mig_with_vgpu, 'nvmlDeviceSetMigMode', 'nvmlDeviceSetMigMode',
     lambda s, p: s.set_mig_mode(H100, False)),
    (_mig_with_vgpu, 'nvmlDeviceCreateGpuInstance',
     'nvmlDeviceCreateGpuInstance',
     lambda s, p: s.create_gpu_instance(H100, p['1g.10gb'])),
    (_mig_with_vgpu, 'nvmlDeviceCreateGpuInstanceWithPlacement',
     'nvmlDeviceCreateGpuInstanceWithPlacement',
     lambda s, p: s.create_gpu_instance(H100, p['1g.10gb'], start=6)),
    (_mig_with_vgpu, 'nvmlDeviceGetGpuInstanceById',
     'nvmlDeviceGetGpuInstanceById',
     lambda s, p: s.destroy_gpu_instance(H100, 4)),
    (_mig_with_vgpu, 'nvmlGpuInstanceGetComputeInstances',
     'nvmlGpuInstanceGetComputeInstances',
     lambda s, p: s.destroy_gpu_instance(H100, 4)),
    (_mig_with_vgpu, 'nvmlComputeInstanceDestroy',
     'nvmlComputeInstanceDestroy',
     lambda s, p: s.destroy_gpu_instance(H100, 4)),
    (_mig_with_vgpu, 'nvmlGpuInstanceDestroy', 'nvmlGpuInstanceDestroy',
     lambda s, p: s.destroy_gpu_instance(H100, 4)),
    (_mig_with_vgpu, 'nvmlGpuInstanceSetVgpuSchedulerState_v2',
     'nvmlGpuInstanceSetVgpuSchedulerState_v2',
     lambda s, p: s.set_gpu_instances_scheduler(H100, H100_PROFILES,
                                                EQUAL_4)),
    (_mixed_l40s, 'nvmlDeviceGetVgpuHeterogeneousMode',
     'nvmlDeviceGetVgpuHeterogeneousMode', lambda s, p: s.mixed_size(L40S_2)),
    (_mixed_l40s, 'nvmlDeviceSetVgpuHeterogeneousMode',
     'nvmlDeviceSetVgpuHeterogeneousMode',
     lambda s, p: s.set_mixed_size(L40S_2, True)),
    (_mixed_l40s, 'nvmlDeviceGetVgpuTypeCreatablePlacements',
     'nvmlDeviceGetVgpuTypeCreatablePlacements',
     lambda s, p: s.creatable_placements(L40S_2, 1155)),
    (_mixed_l40s, 'nvmlDeviceGetVgpuSchedulerState_v2',
     'nvmlDeviceGetVgpuSchedulerState_v2', lambda s, p: s.scheduler(L40S_2)),
    (_mixed_l40s, 'nvmlDeviceSetVgpuSchedulerState_v2',
     'nvmlDeviceSetVgpuSchedulerState_v2',
     lambda s, p: s.set_scheduler(L40S_2, EQUAL_4)),
    (_mixed_l40s, 'nvmlVgpuInstanceGetPlacementId',
     'nvmlVgpuInstanceGetPlacementId',
     lambda s, p: s.active_vgpus(L40S_2, mig=False)),
]


@pytest.mark.parametrize('host, point, call, do', FAILS,
                         ids=['%s-%d' % (f[1], i) for i, f in
                              enumerate(FAILS)])
def test_each_failing_call_names_itself_and_the_gpu(host, point, call, do):
    kernel, session, profiles = host()
    address = H100 if host is _mig_with_vgpu else L40S_2
    sim_nvml.inject(point, kernel=kernel)
    with pytest.raises(nvml.NvmlError) as raised:
        do(session, profiles)
    assert str(raised.value) == 'NVML %s on GPU %s: Unknown Error' % (
        call, address)


def _first_mig_backed(session):
    return [t for t in session.vgpu_types(H100)
            if t.type_id == 'nvidia-1308'][0]


CANNOT_TELL = [
    # (host, C function not supported (its nth call), what is read,
    #  what it reads then)
    (_mig_with_vgpu, 'nvmlDeviceGetMigMode', 1,
     lambda s, p: s.mig_mode(H100), None),
    (_mig_with_vgpu, 'nvmlDeviceGetGpuInstancePossiblePlacements_v2', 1,
     lambda s, p: [g.placements for g in s.gi_profiles(H100)[:2]],
     [(), H100_PROFILES[1].placements]),
    (_mig_with_vgpu, 'nvmlDeviceGetSupportedVgpus', 1,
     lambda s, p: s.vgpu_types(H100), ()),
    (_mig_with_vgpu, 'nvmlVgpuTypeGetMaxInstancesPerGpuInstance', 1,
     lambda s, p: _first_mig_backed(s).max_per_gi, None),
    (_mig_with_vgpu, 'nvmlGpuInstanceGetComputeInstanceProfileInfoV', 1,
     lambda s, p: [g.compute for g in s.gpu_instances(
         H100, H100_PROFILES, computes=True)], [True, None]),
    (_mig_with_vgpu, 'nvmlGpuInstanceGetVgpuSchedulerState_v2', 2,
     lambda s, p: [g.scheduler for g in s.gpu_instances(
         H100, H100_PROFILES, schedulers=True)],
     [None, layout.Scheduler('best-effort', None)]),
    (_mig_with_vgpu, 'nvmlVgpuInstanceGetType', 1,
     lambda s, p: s.active_vgpus(H100, mig=True),
     (nvml.ActiveVgpu(type_id=None, gi_id=7, placement=None),)),
    (_mig_with_vgpu, 'nvmlVgpuInstanceGetGpuInstanceId', 1,
     lambda s, p: s.active_vgpus(H100, mig=True),
     (nvml.ActiveVgpu(type_id=objects.TypeId.parse('nvidia-1308'),
                      gi_id=None, placement=None),)),
    (_mixed_l40s, 'nvmlDeviceGetVgpuHeterogeneousMode', 1,
     lambda s, p: s.mixed_size(L40S_2), None),
    (_mixed_l40s, 'nvmlDeviceGetVgpuTypeCreatablePlacements', 1,
     lambda s, p: s.creatable_placements(L40S_2, 1155), None),
    (_mixed_l40s, 'nvmlVgpuInstanceGetPlacementId', 1,
     lambda s, p: s.active_vgpus(L40S_2, mig=False),
     (nvml.ActiveVgpu(type_id=objects.TypeId.parse('nvidia-1155'),
                      gi_id=None, placement=None),)),
]


@pytest.mark.parametrize('host, point, nth, read, expected', CANNOT_TELL,
                         ids=['%s-%d' % (f[1], i) for i, f in
                              enumerate(CANNOT_TELL)])
def test_each_call_the_gpu_cannot_answer_reads_none(host, point, nth, read,
                                                    expected):
    kernel, session, profiles = host()
    sim_nvml.inject(point, nth=nth, error=mig.NVML_ERROR_NOT_SUPPORTED,
                    kernel=kernel)
    assert read(session, profiles) == expected


def test_an_older_binding_without_one_of_the_cannot_tell_codes():
    """A binding without NVML_ERROR_NO_PERMISSION still tells Not
    Supported from an error; an error without a code is one."""
    lib = types.SimpleNamespace(NVML_ERROR_NOT_SUPPORTED=3,
                                NVML_ERROR_INVALID_ARGUMENT=2)
    assert nvml._unanswered(lib, types.SimpleNamespace(value=3)) is True
    assert nvml._unanswered(lib, types.SimpleNamespace(value=4)) is False
    assert nvml._no_such_profile(lib, types.SimpleNamespace(value=2)) is True
    assert nvml._no_such_profile(lib, Exception('no code')) is False
    assert nvml._unanswered(nvml_fake.pynvml, Exception('no code')) is False


def test_a_time_sliced_type_is_not_asked_for_mig_facts_or_placements():
    """Neither the per-GPU-instance maximum of a time-sliced type nor, when
    not asked for, its placements: a failure of either is never met."""
    kernel, lib = _host('l40s')
    session = _session(lib)
    session.handle(L40S)
    sim_nvml.inject('nvmlVgpuTypeGetMaxInstancesPerGpuInstance',
                    kernel=kernel)
    sim_nvml.inject('nvmlDeviceGetVgpuTypeSupportedPlacements',
                    kernel=kernel)
    found = session.vgpu_types(L40S)
    assert {(t.max_per_gi, t.placement_size) for t in found} == {
        (None, None)}
    assert set(sim_nvml.faults(kernel=kernel)) == {
        'nvmlVgpuTypeGetMaxInstancesPerGpuInstance',
        'nvmlDeviceGetVgpuTypeSupportedPlacements'}


def test_compute_instances_are_listed_of_the_profile_spanning_the_gi():
    """NVML lists a GPU instance's compute instances of one profile; the
    simulated driver has one per GI and does not look at it, so the
    profile asked for is recorded: NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE
    (1) for a 2g GPU instance."""
    kernel, lib, session, profiles = _mig_h100()
    gi_id = _make_gi(lib, 14)
    asked = []
    listing = lib.nvmlGpuInstanceGetComputeInstances

    def recorded(gi, profile_id, handles, count):
        asked.append(profile_id)
        assert handles is not None          # room for what NVML lists
        return listing(gi, profile_id, handles, count)
    lib.nvmlGpuInstanceGetComputeInstances = recorded
    assert [g.compute for g in session.gpu_instances(
        H100, (profiles['2g.20gb'],), computes=True)] == [True]
    session.destroy_gpu_instance(H100, gi_id)
    assert asked == [lib.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE] * 2
    assert lib.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE == 1


def test_a_profile_of_no_instance_is_left_out_and_the_rest_kept():
    """A GPU can list a profile it has no room for (instanceCount 0): the
    2g.20gb here; those after it are still read."""
    kernel, lib = _host('h100-80gb')
    reading = lib.nvmlDeviceGetGpuInstanceProfileInfo

    def none_of_2g(handle, index, *rest):
        info = reading(handle, index, *rest)
        if info.id == 14:
            info.instanceCount = 0
        return info
    lib.nvmlDeviceGetGpuInstanceProfileInfo = none_of_2g
    assert _session(lib).gi_profiles(H100) == tuple(
        p for p in H100_PROFILES if p.id != 14)
