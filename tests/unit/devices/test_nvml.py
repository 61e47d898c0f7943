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
