"""NVIDIA's vGPU migration calls: the simulated driver answers
``nvmlVgpuInstanceGetMetadata``, ``nvmlDeviceGetVgpuMetadata``,
``nvmlDeviceGetPgpuMetadataString`` and ``nvmlGetVgpuCompatibility``
through the installed nvidia-ml-py by NVIDIA's rules (simulator/nvml.py),
and the product reads them into typed answers (devices/nvml.py): a
different host driver branch or board is no live migration, with why;
NVML absent or "not supported" is UNKNOWN, never a yes."""

import ctypes

import pynvml
import pytest

from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.devices import nvml
from libvirt_gpu.simulator import loading
from libvirt_gpu.simulator import nvml as sim_nvml
from tests.doubles.h100_nvml import PF
from tests.doubles.h100_nvml import VF
from tests.doubles.h100_nvml import h100
from tests.doubles.h100_nvml import host
from tests.doubles.h100_nvml import product


def vgpu_metadata(lib):
    lib.nvmlInit()
    (instance,) = lib.nvmlDeviceGetActiveVgpus(
        lib.nvmlDeviceGetHandleByIndex(0))
    return lib.nvmlVgpuInstanceGetMetadata(instance)


def pgpu_metadata(lib):
    lib.nvmlInit()
    return lib.nvmlDeviceGetVgpuMetadata(lib.nvmlDeviceGetHandleByIndex(0))


def compatible(source, dest):
    """NVML's two numbers for the source's vGPU on ``dest``'s GPU, the
    vGPU's metadata carried over as bytes (as the domain XML carries it)."""
    _, src = host(source)
    raw = nvml._raw_of(vgpu_metadata(src))
    _, dst = host(dest, vgpu=False)
    moved = pynvml.c_nvmlVgpuMetadata_t.from_buffer_copy(
        raw.ljust(ctypes.sizeof(pynvml.c_nvmlVgpuMetadata_t), b'\0'))
    answer = dst.nvmlGetVgpuCompatibility(moved, pgpu_metadata(dst))
    return answer.vgpuVmCompatibility, answer.compatibilityLimitCode


# --- the simulated driver ----------------------------------------------------

def test_metadata_carry_the_host_driver_board_and_type():
    _, lib = host(h100(driver_version='550.127.05'))
    meta = vgpu_metadata(lib)
    assert meta.hostDriverVersion == '550.127.05'
    assert meta.guestInfoState == \
        pynvml.NVML_VGPU_INSTANCE_GUEST_INFO_STATE_UNINITIALIZED
    assert meta.opaqueDataSize == len(meta.opaqueData) > 0
    for part in ('550.127.05', '0x233010de', 'NVIDIA H100 80GB HBM3',
                 '"type":1300'):
        assert part in meta.opaqueData
    pgpu = pgpu_metadata(lib)
    assert pgpu.hostDriverVersion == '550.127.05'
    assert '"gpu":"0000:4e:00.0"' in pgpu.opaqueData
    text, size = lib.nvmlDeviceGetPgpuMetadataString(
        lib.nvmlDeviceGetHandleByIndex(0))
    assert text.decode() == pgpu.opaqueData and size == len(text) + 1


LIVE = (pynvml.NVML_VGPU_VM_COMPATIBILITY_COLD
        | pynvml.NVML_VGPU_VM_COMPATIBILITY_HIBERNATE
        | pynvml.NVML_VGPU_VM_COMPATIBILITY_SLEEP
        | pynvml.NVML_VGPU_VM_COMPATIBILITY_LIVE)


@pytest.mark.parametrize('dest, expected', [
    ({}, (LIVE, pynvml.NVML_VGPU_COMPATIBILITY_LIMIT_NONE)),
    # one branch, another release of it
    ({'driver_version': '580.105.08'},
     (LIVE, pynvml.NVML_VGPU_COMPATIBILITY_LIMIT_NONE)),
    ({'driver_version': '550.127.05'},
     (pynvml.NVML_VGPU_VM_COMPATIBILITY_NONE,
      pynvml.NVML_VGPU_COMPATIBILITY_LIMIT_HOST_DRIVER)),
    # another board of the GPU (H100 PCIe's device id)
    ({'product_id': '2331'},
     (pynvml.NVML_VGPU_VM_COMPATIBILITY_NONE,
      pynvml.NVML_VGPU_COMPATIBILITY_LIMIT_GPU)),
])
def test_compatibility_by_nvidia_s_rules(dest, expected):
    assert compatible(h100(), h100(**dest)) == expected


def test_a_type_the_destination_lacks_is_no_migration():
    _, src = host(h100())
    meta = vgpu_metadata(src)
    meta.opaqueData = meta.opaqueData.replace('"type":1300',
                                              '"type":1399').encode()
    meta.opaqueDataSize = len(meta.opaqueData)
    _, dst = host(h100(), vgpu=False)
    answer = dst.nvmlGetVgpuCompatibility(meta, pgpu_metadata(dst))
    assert (answer.vgpuVmCompatibility, answer.compatibilityLimitCode) == (
        0, pynvml.NVML_VGPU_COMPATIBILITY_LIMIT_GPU)


def test_foreign_or_stale_metadata_is_an_invalid_argument():
    _, src = host(h100())
    meta = vgpu_metadata(src)
    _, dst = host(h100(), vgpu=False)
    pgpu = pgpu_metadata(dst)
    garbage = pynvml.c_nvmlVgpuMetadata_t()
    garbage.opaqueData = b'\x01not ours'
    garbage.opaqueDataSize = 9
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        dst.nvmlGetVgpuCompatibility(garbage, pgpu)
    pgpu.opaqueData = pgpu.opaqueData.replace('580.95.02',
                                              '580.95.03').encode()
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        dst.nvmlGetVgpuCompatibility(meta, pgpu)


def test_an_injected_failure_strikes_the_compatibility_call():
    kernel, lib = host(h100())
    meta = vgpu_metadata(lib)
    pgpu = pgpu_metadata(lib)
    sim_nvml.inject('nvmlGetVgpuCompatibility', 1,
                    pynvml.NVML_ERROR_NOT_SUPPORTED, kernel=kernel)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        lib.nvmlGetVgpuCompatibility(meta, pgpu)
    assert lib.nvmlGetVgpuCompatibility(meta, pgpu).vgpuVmCompatibility \
        == LIVE


def test_a_profile_s_driver_version_is_checked():
    assert loading.load_profile('h100-80gb').driver_version == '580.95.02'
    data = {'name': 'x', 'driver_version': '58O.1', 'devices': [
        {'address': '0000:01:00.0', 'vendor_id': '10de',
         'product_id': '1eb8', 'class_code': '0x030200'}]}
    with pytest.raises(exception.SimulatorError,
                       match="driver_version '58O.1' is not a driver "
                             "version such as 580.95.02"):
        loading.profile_from_dict(data)
    data['driver_version'] = '550.54.14'
    assert loading.profile_from_dict(data).driver_version == '550.54.14'


# --- what the product reads --------------------------------------------------

def test_the_product_reads_a_vf_s_metadata_and_asks_the_destination():
    meta = nvml.read_vgpu_metadata(product(h100()), [
        objects.PciAddress.parse(VF), objects.PciAddress.parse(
            '0000:4e:00.5')])
    found = meta[objects.PciAddress.parse(VF)]
    assert found.host_driver == '580.95.02'
    assert meta[objects.PciAddress.parse('0000:4e:00.5')] is None
    gpu = objects.PciAddress.parse(PF)
    same = nvml.compatibility(product(h100(), vgpu=False), found, gpu)
    assert (same.verdict, same.live, same.known) == (nvml.LIVE, True, True)
    assert same.kinds == ('cold', 'hibernate', 'sleep', 'live')
    other = nvml.compatibility(
        product(h100(driver_version='550.127.05'), vgpu=False), found, gpu)
    assert (other.verdict, other.live, other.limits) == (
        nvml.NOT_LIVE, False, ('the host driver',))
    assert other.reason == (
        "NVIDIA's driver allows no live migration to GPU 0000:4e:00.0 (no "
        "kind at all): limited by the host driver (the source runs "
        "580.95.02, this host 550.127.05)")
    board = nvml.compatibility(product(h100(product_id='2331'), vgpu=False),
                               found, gpu)
    assert board.reason == (
        "NVIDIA's driver allows no live migration to GPU 0000:4e:00.0 (no "
        "kind at all): limited by the GPU")


def test_metadata_that_cannot_be_nvidia_s_is_refused_not_guessed():
    gpu = objects.PciAddress.parse(PF)
    big = nvml.VgpuMetadata(raw=b'x' * 469)
    found = nvml.compatibility(product(h100(), vgpu=False), big, gpu)
    assert found.verdict == nvml.NOT_LIVE
    assert 'not an nvmlVgpuMetadata_t' in found.reason
    junk = nvml.VgpuMetadata(raw=b'\x01\x00\x00\x00junk')
    found = nvml.compatibility(product(h100(), vgpu=False), junk, gpu)
    assert found.verdict == nvml.NOT_LIVE
    assert found.reason.startswith("NVIDIA's driver here cannot judge")


def test_no_nvml_or_not_supported_is_unknown_never_a_yes():
    gpu = objects.PciAddress.parse(PF)
    meta = nvml.read_vgpu_metadata(product(h100()), [
        objects.PciAddress.parse(VF)])[objects.PciAddress.parse(VF)]
    off = nvml.compatibility(None, meta, gpu)
    assert (off.verdict, off.live, off.known) == (nvml.UNKNOWN, False, False)
    assert off.reason == 'NVML is not used on this host ([gpu]/nvml)'
    kernel, lib = host(h100(), vgpu=False)
    sim_nvml.inject('nvmlGetVgpuCompatibility', 1,
                    pynvml.NVML_ERROR_NOT_SUPPORTED, kernel=kernel)
    found = nvml.compatibility(nvml.Nvml(lib), meta, gpu)
    assert found.verdict == nvml.UNKNOWN and 'Not Supported' in found.reason
    sim_nvml.inject('nvmlDeviceGetVgpuMetadata', 1,
                    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, kernel=kernel)
    found = nvml.compatibility(nvml.Nvml(lib), meta, gpu)
    assert found.verdict == nvml.UNKNOWN
    assert 'nvmlDeviceGetVgpuMetadata' in found.reason
    absent = nvml.compatibility(nvml.Nvml(lib), meta,
                                objects.PciAddress.parse('0000:99:00.0'))
    assert absent.verdict == nvml.UNKNOWN
    assert absent.reason == ('NVML cannot be used: NVML lists no GPU '
                             '0000:99:00.0')
    assert nvml.read_vgpu_metadata(None, [gpu]) == {}


@pytest.mark.parametrize('vm, limit, verdict, reason', [
    (0x1 | 0x2, 0x2, nvml.NOT_LIVE,
     "NVIDIA's driver allows no live migration to GPU 0000:4e:00.0 (only "
     "cold, hibernate): limited by the guest driver"),
    (0x0, 0x80000000 | 0x4, nvml.NOT_LIVE,
     "NVIDIA's driver allows no live migration to GPU 0000:4e:00.0 (no "
     "kind at all): limited by the GPU and another factor"),
    (0x0, 0x0, nvml.NOT_LIVE,
     "NVIDIA's driver allows no live migration to GPU 0000:4e:00.0 (no "
     "kind at all): limited by an unnamed factor"),
    (0x8, 0x0, nvml.LIVE,
     "NVIDIA's driver allows a live migration to GPU 0000:4e:00.0"),
])
def test_nvidia_s_numbers_read_as_one_line(vm, limit, verdict, reason):
    found = nvml.answer_of(vm, limit, objects.PciAddress.parse(PF),
                           '580.95.02', '550.54.14')
    assert (found.verdict, found.reason) == (verdict, reason)


def test_a_gpu_without_the_vgpu_is_passed_over_for_one_that_takes_it():
    meta = nvml.read_vgpu_metadata(product(h100()), [
        objects.PciAddress.parse(VF)])[objects.PciAddress.parse(VF)]
    here = product(h100(), vgpu=False)
    assert nvml.best_compatibility(here, meta).live
    other = nvml.best_compatibility(
        product(h100(driver_version='550.54.14'), vgpu=False), meta)
    assert other.verdict == nvml.NOT_LIVE
    assert 'limited by the host driver' in other.reason
    assert nvml.best_compatibility(None, meta).verdict == nvml.UNKNOWN
