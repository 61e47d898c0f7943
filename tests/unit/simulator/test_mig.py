"""The simulator follows NVIDIA's driver rules for MIG-backed and
mixed-size vGPUs and the vGPU scheduler (libvirt_gpu/simulator/mig.py),
asked as the product asks: the sysfs writes through ``SimKernel`` and NVML
through nvidia-ml-py's own ``pynvml`` over the simulated driver
(``simulator.nvml``).  Each rule has a test here that fails when the
simulator stops enforcing it."""

import ctypes
import errno
import os
import re

import pytest

from libvirt_gpu.simulator import kernel as kernel_mod
from libvirt_gpu.simulator import loading
from libvirt_gpu.simulator import mig
from libvirt_gpu.simulator import nvml as sim_nvml
from tests.doubles import h100 as h100_capture

H100_PF = '0000:4e:00.0'
H100_VFS = ['0000:4e:00.%d' % i for i in range(4, 8)] + [
    '0000:4e:01.%d' % i for i in range(8)]
BW_PF = '0000:ca:00.0'
BW_VFS = ['0000:ca:00.%d' % i for i in range(4, 8)] + [
    '0000:ca:01.%d' % i for i in range(8)]
L40S_PF = '0000:bd:00.0'
L40S_VFS = ['0000:bd:00.%d' % i for i in range(4, 8)] + [
    '0000:bd:01.%d' % i for i in range(8)]

# H100 type numbers (profiles/h100-80gb.json)
H100_40C, H100_1_10C, H100_1_10CME, H100_2_20C = 1306, 1308, 1309, 1311
H100_1_20C, H100_3_40C = 1310, 1312
# RTX PRO 6000 Blackwell
DC_1_24Q, DC_1_12Q, DC_1_8Q, DC_24Q = 1510, 1511, 1512, 1503
# L40S
L40S_4Q, L40S_12Q, L40S_16Q, L40S_24Q = 1150, 1153, 1154, 1155
GI_1G_10GB, GI_1G_10GB_ME, GI_3G_40GB, GI_4G_40GB, GI_7G_80GB = (
    19, 20, 9, 5, 0)
GI_1G_24GB_GFX = 47


class Host(object):
    """A simulated host's kernel and NVML (the real binding) over it."""

    def __init__(self, profile, pf):
        self.kernel = kernel_mod.SimKernel(profile)
        self.nvml = sim_nvml.module(kernel=self.kernel)
        self.nvml.nvmlInit()
        self.pf = pf
        self.handle = self.nvml.nvmlDeviceGetHandleByPciBusId(
            pf.upper().replace('0000:', '00000000:', 1))

    def mig(self, mode):
        self.nvml.nvmlDeviceSetMigMode(self.handle, mode)

    def vfs(self, count):
        self.kernel.set_numvfs(self.pf, str(count))

    def gi(self, profile_id, start=None):
        if start is None:
            return self.nvml.nvmlDeviceCreateGpuInstance(self.handle,
                                                         profile_id)
        placement = self.nvml.c_nvmlGpuInstancePlacement_t(start, 0)
        return self.nvml.nvmlDeviceCreateGpuInstanceWithPlacement(
            self.handle, profile_id, ctypes.byref(placement))

    def gi_info(self, gi):
        info = self.nvml.nvmlGpuInstanceGetInfo(gi)
        return (info.id, info.profileId, info.placement.start,
                info.placement.size)

    def gis(self, profile_id):
        array = (self.nvml.c_nvmlGpuInstance_t * 8)()
        count = ctypes.c_uint(0)
        self.nvml.nvmlDeviceGetGpuInstances(self.handle, profile_id, array,
                                            ctypes.byref(count))
        return sorted(self.gi_info(array[i])[0] for i in range(count.value))

    def creatable(self, vf):
        return [t.number for t in self.kernel.vf_creatable(vf)]

    def write(self, vf, number):
        return self.kernel.set_vgpu_type(vf, str(number))

    def max_instances(self, number):
        return self.nvml.nvmlVgpuTypeGetMaxInstances(self.handle, number)

    def heterogeneous(self, on):
        self.nvml.nvmlDeviceSetVgpuHeterogeneousMode(
            self.handle, self.nvml.NVML_VGPU_PGPU_HETEROGENEOUS_MODE if on
            else self.nvml.NVML_VGPU_PGPU_HOMOGENEOUS_MODE)

    def scheduler(self, policy, frequency=0):
        state = self.nvml.c_nvmlVgpuSchedulerState_v2_t()
        state.schedulerPolicy = policy
        state.frequency = frequency
        self.nvml.nvmlDeviceSetVgpuSchedulerState_v2(self.handle, state)

    def scheduler_state(self):
        return self.nvml.nvmlDeviceGetVgpuSchedulerState_v2(
            self.handle, self.nvml.c_nvmlVgpuSchedulerStateInfo_v2_t())

    def fill(self, vfs, number):
        """Write ``number`` to each VF in turn until the driver refuses;
        returns how many it made."""
        made = 0
        for vf in vfs:
            try:
                self.write(vf, number)
            except OSError:
                break
            made += 1
        return made


@pytest.fixture
def h100():
    """The H100 with its VFs disabled (the boot enabled them), as a
    layout is applied: MIG mode, then the VFs, then GIs."""
    host = Host('h100-80gb', H100_PF)
    host.vfs(0)
    return host


@pytest.fixture
def blackwell():
    host = Host('rtx-pro-6000', BW_PF)
    host.vfs(0)
    return host


@pytest.fixture
def l40s():
    return Host('l40s', L40S_PF)


def nvml_error(host, name):
    return pytest.raises(getattr(host.nvml, 'NVMLError_' + name))


# --- MIG mode -------------------------------------------------------------

def test_mig_mode_is_refused_while_vfs_are_enabled(h100):
    h100.vfs(4)
    with nvml_error(h100, 'InUse'):
        h100.mig(1)
    h100.vfs(0)
    h100.mig(1)
    assert h100.nvml.nvmlDeviceGetMigMode(h100.handle) == [1, 1]
    h100.vfs(4)
    with nvml_error(h100, 'InUse'):
        h100.mig(0)


def test_mig_mode_survives_a_reboot_and_nothing_else_does(h100):
    h100.mig(1)
    h100.vfs(4)
    h100.gi(GI_1G_10GB)
    h100.write(H100_VFS[0], H100_1_10C)
    h100.kernel.reboot()
    assert h100.nvml.nvmlDeviceGetMigMode(h100.handle) == [1, 1]
    assert h100.kernel.numvfs(H100_PF) == 0
    assert h100.gis(GI_1G_10GB) == []
    assert h100.kernel.gpu_vgpus(H100_PF) == {}


# --- enabling VFs -----------------------------------------------------------

def test_enabling_vfs_destroys_every_gpu_instance(h100):
    h100.mig(1)
    h100.gi(GI_3G_40GB)
    h100.gi(GI_1G_10GB)
    h100.vfs(4)
    assert h100.gis(GI_3G_40GB) == [] and h100.gis(GI_1G_10GB) == []


def test_enabling_vfs_clears_mixed_size_mode(l40s):
    l40s.vfs(0)
    l40s.heterogeneous(True)
    l40s.vfs(8)
    assert l40s.nvml.nvmlDeviceGetVgpuHeterogeneousMode(l40s.handle) == \
        l40s.nvml.NVML_VGPU_PGPU_HOMOGENEOUS_MODE


def test_gpu_instances_made_before_the_vfs_leave_nothing_creatable(h100):
    """MIG on, GIs, then sriov-manage -e: the list is empty and a type
    write fails with EIO, until GIs are made again."""
    h100.mig(1)
    h100.gi(GI_1G_10GB)
    h100.vfs(4)
    assert h100.creatable(H100_VFS[0]) == []
    with pytest.raises(OSError) as raised:
        h100.write(H100_VFS[0], H100_1_10C)
    assert raised.value.errno == errno.EIO
    h100.gi(GI_1G_10GB)
    assert H100_1_10C in h100.creatable(H100_VFS[0])
    assert h100.write(H100_VFS[0], H100_1_10C) == 'nvidia-%d' % H100_1_10C


# --- which types -------------------------------------------------------------

def test_mig_on_offers_only_mig_backed_types(h100):
    h100.vfs(4)
    off = h100.creatable(H100_VFS[0])
    assert H100_40C in off and H100_1_10C not in off
    h100.vfs(0)
    h100.mig(1)
    h100.vfs(4)
    h100.gi(GI_4G_40GB)
    h100.gi(GI_3G_40GB)
    assert h100.creatable(H100_VFS[0]) == [H100_3_40C, 1313]
    with pytest.raises(OSError) as raised:
        h100.write(H100_VFS[0], H100_40C)
    assert raised.value.errno == errno.EIO


def test_the_driver_picks_the_gpu_instance(h100):
    h100.mig(1)
    h100.vfs(4)
    first, second = h100.gi(GI_1G_10GB), h100.gi(GI_1G_10GB)
    ids = [h100.gi_info(first)[0], h100.gi_info(second)[0]]
    assert ids == [7, 8]
    h100.write(H100_VFS[0], H100_1_10C)
    h100.write(H100_VFS[1], H100_1_10C)
    assert [h100.kernel.vf_gi(vf)
            for vf in H100_VFS[:2]] == ids
    # NVML says the same of each vGPU instance
    instances = h100.nvml.nvmlDeviceGetActiveVgpus(h100.handle)
    assert sorted(h100.nvml.nvmlVgpuInstanceGetGpuInstanceId(i)
                  for i in instances) == ids
    # the first one's GI is free again: the next one goes there
    h100.write(H100_VFS[0], 0)
    h100.write(H100_VFS[2], H100_1_10C)
    assert h100.kernel.vf_gi(H100_VFS[2]) == 7


def test_gi_and_placement_files_are_unreadable_without_a_vgpu(h100, l40s):
    h100.mig(1)
    h100.vfs(4)
    h100.gi(GI_1G_10GB)
    for read in (h100.kernel.vf_gi,
                 h100.kernel.vf_placement):
        with pytest.raises(OSError) as raised:
            read(H100_VFS[0])
        assert raised.value.errno == errno.ENXIO
    h100.write(H100_VFS[0], H100_1_10C)
    assert h100.kernel.vf_gi(H100_VFS[0]) == 7
    h100.write(H100_VFS[0], 0)
    with pytest.raises(OSError) as raised:
        h100.kernel.vf_gi(H100_VFS[0])
    assert raised.value.errno == errno.ENXIO
    with pytest.raises(OSError) as raised:
        l40s.kernel.vf_placement(L40S_VFS[0])
    assert raised.value.errno == errno.ENXIO
    l40s.heterogeneous(True)
    l40s.write(L40S_VFS[0], L40S_24Q)
    assert l40s.kernel.vf_placement(L40S_VFS[0]) == 0


def test_equal_size_vgpus_report_no_placement(l40s):
    """An assumption (the files are for MIG-backed and mixed-size
    vGPUs): in equal-size mode the placement file stays unreadable."""
    l40s.write(L40S_VFS[0], L40S_24Q)
    with pytest.raises(OSError) as raised:
        l40s.kernel.vf_placement(L40S_VFS[0])
    assert raised.value.errno == errno.ENXIO
    creatable = l40s.nvml.nvmlDeviceGetVgpuTypeCreatablePlacements(
        l40s.handle, L40S_24Q)
    assert [creatable.placementIds[i] for i in range(creatable.count)] == [
        16]


def test_one_framebuffer_size_per_gpu_instance(blackwell):
    blackwell.mig(1)
    blackwell.vfs(8)
    blackwell.gi(GI_1G_24GB_GFX)
    blackwell.write(BW_VFS[0], DC_1_12Q)
    assert blackwell.creatable(BW_VFS[1]) == [DC_1_12Q]
    with pytest.raises(OSError):
        blackwell.write(BW_VFS[1], DC_1_8Q)
    blackwell.write(BW_VFS[1], DC_1_12Q)         # two per GI
    assert blackwell.creatable(BW_VFS[2]) == []
    # another GI of the same profile takes any size
    blackwell.gi(GI_1G_24GB_GFX)
    assert blackwell.creatable(BW_VFS[2]) == [DC_1_24Q, DC_1_12Q, DC_1_8Q]
    blackwell.write(BW_VFS[2], DC_1_8Q)
    assert blackwell.creatable(BW_VFS[3]) == [DC_1_8Q]


def test_a_type_s_maximum_is_max_per_gi_times_its_gpu_instances(
        h100, blackwell):
    h100.mig(1)
    assert h100.max_instances(H100_1_10C) == 0
    for count in (1, 2, 3):
        h100.gi(GI_1G_10GB)
        assert h100.max_instances(H100_1_10C) == count
    blackwell.mig(1)
    blackwell.vfs(12)
    blackwell.gi(GI_1G_24GB_GFX)
    blackwell.gi(GI_1G_24GB_GFX)
    assert blackwell.nvml.nvmlVgpuTypeGetMaxInstancesPerGpuInstance(
        DC_1_8Q) == 3
    assert blackwell.max_instances(DC_1_8Q) == 6
    assert blackwell.max_instances(DC_1_12Q) == 4
    assert blackwell.fill(BW_VFS, DC_1_12Q) == 4


def test_what_a_gpu_instance_holds_and_can_take(blackwell):
    nvml = blackwell.nvml
    blackwell.mig(1)
    blackwell.vfs(4)
    gi = blackwell.gi(GI_1G_24GB_GFX)

    def creatable():
        info = nvml.c_nvmlVgpuTypeIdInfo_v1_t()
        info.version = nvml.nvmlVgpuTypeIdInfo_v1
        found = nvml.nvmlGpuInstanceGetCreatableVgpus(gi, info)
        return [found.vgpuTypeIds[i] for i in range(found.vgpuCount)]

    def active():
        info = nvml.c_nvmlActiveVgpuInstanceInfo_v1_t()
        info.version = nvml.nvmlActiveVgpuInstanceInfo_v1
        found = nvml.nvmlGpuInstanceGetActiveVgpus(gi, info)
        return [found.vgpuInstances[i] for i in range(found.vgpuCount)]

    assert creatable() == [DC_1_24Q, DC_1_12Q, DC_1_8Q]
    assert active() == []
    blackwell.write(BW_VFS[0], DC_1_12Q)
    assert creatable() == [DC_1_12Q]
    assert active() == nvml.nvmlDeviceGetActiveVgpus(blackwell.handle)


def test_one_framebuffer_size_can_live_under_several_gi_profiles(h100):
    """H100-1-20C and H100-2-20C: 20 GB each, in 1g.20gb and 2g.20gb GIs;
    each goes only to a GI of its own profile."""
    h100.mig(1)
    h100.vfs(4)
    h100.gi(14)                        # 2g.20gb
    assert h100.creatable(H100_VFS[0]) == [H100_2_20C]
    with pytest.raises(OSError):
        h100.write(H100_VFS[0], H100_1_20C)
    h100.gi(15)                        # 1g.20gb, at slice 2
    h100.write(H100_VFS[0], H100_1_20C)
    assert h100.kernel.vf_gi(H100_VFS[0]) == 4


# --- GPU instances: what the profile table holds -----------------------------

def test_gpu_instance_layouts_the_table_cannot_hold_are_refused(h100):
    h100.mig(1)
    with nvml_error(h100, 'NotSupported'):
        h100.nvml.nvmlDeviceGetGpuInstanceProfileInfo(
            h100.handle, h100.nvml.NVML_GPU_INSTANCE_PROFILE_6_SLICE)
    h100.gi(GI_4G_40GB)
    with nvml_error(h100, 'InsufficientResources'):
        h100.gi(GI_7G_80GB)
    h100.gi(GI_3G_40GB)
    with nvml_error(h100, 'InsufficientResources'):
        h100.gi(GI_1G_10GB)                 # 7 compute slices in use
    assert h100.nvml.nvmlDeviceGetGpuInstanceRemainingCapacity(
        h100.handle, GI_1G_10GB) == 0


def test_gpu_instances_need_free_compute_slices_too():
    """A table whose memory slices outnumber its compute slices: the
    third 1-slice GI finds memory but no compute left."""
    profile = mig.GiProfile(id=1, nvml_profile=0, name='1g.1gb', slices=1,
                            memory_mb=1024, instances=8,
                            placements=tuple(range(8)), placement_size=1)
    gpu = mig.SimGpu(name='narrow', memory_mib=8192, gi_table=mig.GiTable(
        compute_slices=2, memory_slices=8, profiles=(profile,)))
    state = mig.GpuState(mig_mode=1)
    mig.create_gi(gpu, state, 1)
    mig.create_gi(gpu, state, 1)
    with pytest.raises(mig.DriverError) as raised:
        mig.create_gi(gpu, state, 1)
    assert raised.value.code == mig.NVML_ERROR_INSUFFICIENT_RESOURCES


def test_gpu_instances_sit_where_the_real_driver_puts_them(h100):
    h100.mig(1)
    assert [h100.gi_info(h100.gi(GI_1G_10GB)) for _ in range(7)] == [
        (7 + s, GI_1G_10GB, s, 1) for s in range(7)]
    with nvml_error(h100, 'InsufficientResources'):
        h100.gi(GI_1G_10GB)                 # 7 of 7


def test_gpu_instance_counts_and_placements(h100):
    h100.mig(1)
    h100.gi(GI_1G_10GB_ME)
    with nvml_error(h100, 'InsufficientResources'):
        h100.gi(GI_1G_10GB_ME)              # one media extension
    with nvml_error(h100, 'InvalidArgument'):
        h100.gi(GI_3G_40GB, start=2)        # 3g starts at 0 or 4 only
    assert h100.gi_info(h100.gi(GI_3G_40GB, start=4)) == (2, 9, 4, 4)
    with nvml_error(h100, 'InsufficientResources'):
        h100.gi(GI_3G_40GB, start=0)        # overlaps the 1g at 0
    array = (h100.nvml.c_nvmlGpuInstancePlacement_t * 8)()
    count = ctypes.c_uint(0)
    h100.nvml.nvmlDeviceGetGpuInstancePossiblePlacements(
        h100.handle, GI_3G_40GB, array, ctypes.byref(count))
    assert [(array[i].start, array[i].size)
            for i in range(count.value)] == [(0, 4), (4, 4)]


def test_a_gpu_instance_with_a_compute_instance_or_vgpus_stays(h100):
    h100.mig(1)
    h100.vfs(4)
    gi = h100.gi(GI_1G_10GB)
    ci = h100.nvml.nvmlGpuInstanceCreateComputeInstance(
        gi, h100.nvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE)
    with nvml_error(h100, 'InUse'):
        h100.nvml.nvmlGpuInstanceDestroy(gi)
    h100.nvml.nvmlComputeInstanceDestroy(ci)
    h100.write(H100_VFS[0], H100_1_10C)
    with nvml_error(h100, 'InUse'):
        h100.nvml.nvmlGpuInstanceDestroy(gi)
    h100.write(H100_VFS[0], 0)
    h100.nvml.nvmlGpuInstanceDestroy(gi)
    assert h100.gis(GI_1G_10GB) == []


def _lgip(path):
    """``nvidia-smi mig -lgip`` rows: (name, id, total, GiB, SM, DEC, ENC,
    CE, JPEG, OFA)."""
    with open(path) as f:
        lines = f.read().splitlines()
    rows = []
    for first, second in zip(lines, lines[1:]):
        head = re.match(r'\|\s+\d+\s+MIG (\S+)\s+(\d+)\s+\d+/(\d+)\s+'
                        r'([\d.]+)\s+\S+\s+(\d+)\s+(\d+)\s+(\d+)', first)
        if head:
            tail = [int(x) for x in re.findall(r'\d+', second)]
            rows.append((head.group(1), int(head.group(2)),
                         int(head.group(3)), float(head.group(4)),
                         int(head.group(5)), int(head.group(6)),
                         int(head.group(7)), *tail))
    return rows


def test_h100_gi_profiles_are_the_real_h100_s():
    rows = _lgip(os.path.join(h100_capture.CAPTURE,
                              'nvidia-smi-mig-lgip.txt'))
    assert len(rows) == 7
    table = loading.load_profile('h100-80gb').device(H100_PF).gpu.gi_table
    mine = [(p.name, p.id, p.instances, round(p.memory_mb / 1024, 2),
             p.sm, p.dec, p.enc, p.ce, p.jpeg, p.ofa)
            for p in table.profiles]
    assert mine == [(name, pid, total, gib, sm, dec, enc, ce, jpeg, ofa)
                    for name, pid, total, gib, sm, dec, enc, ce, jpeg, ofa
                    in rows]


# --- mixed-size mode --------------------------------------------------------

def test_mixed_size_mode_only_before_any_vgpu(l40s):
    l40s.write(L40S_VFS[0], L40S_4Q)
    with nvml_error(l40s, 'InUse'):
        l40s.heterogeneous(True)
    l40s.write(L40S_VFS[0], 0)
    l40s.heterogeneous(True)
    assert l40s.nvml.nvmlDeviceGetVgpuHeterogeneousMode(l40s.handle) == \
        l40s.nvml.NVML_VGPU_PGPU_HETEROGENEOUS_MODE


def test_mixed_size_mode_is_not_available_with_mig_on(blackwell):
    blackwell.heterogeneous(True)
    blackwell.heterogeneous(False)
    blackwell.mig(1)
    with nvml_error(blackwell, 'NotSupported'):
        blackwell.heterogeneous(True)
    with nvml_error(blackwell, 'NotSupported'):
        blackwell.nvml.nvmlDeviceGetVgpuHeterogeneousMode(blackwell.handle)


def test_mixed_sizes_sit_at_placements_the_driver_picks(l40s):
    l40s.heterogeneous(True)
    l40s.write(L40S_VFS[0], L40S_24Q)           # 16 slots at 0
    assert l40s.kernel.vf_placement(L40S_VFS[0]) == 0
    supported = l40s.nvml.nvmlDeviceGetVgpuTypeSupportedPlacements(
        l40s.handle, L40S_16Q, l40s.nvml.NVML_VGPU_PGPU_HETEROGENEOUS_MODE,
        2)
    assert (supported.placementSize, [supported.placementIds[i] for i in
                                      range(supported.count)]) == (11,
                                                                   [0, 11])
    # both 16Q placements overlap the 24Q: not creatable
    assert L40S_16Q not in l40s.creatable(L40S_VFS[1])
    creatable = l40s.nvml.nvmlDeviceGetVgpuTypeCreatablePlacements(
        l40s.handle, L40S_12Q)
    assert (creatable.placementSize, [creatable.placementIds[i] for i in
                                      range(creatable.count)]) == (8,
                                                                   [16, 24])
    l40s.write(L40S_VFS[1], L40S_12Q)
    l40s.write(L40S_VFS[2], L40S_4Q)            # 3 slots: none left at 24+
    assert [l40s.kernel.vf_placement(vf) for vf in L40S_VFS[:3]] == [
        0, 16, 24]
    instances = l40s.nvml.nvmlDeviceGetActiveVgpus(l40s.handle)
    assert sorted(l40s.nvml.nvmlVgpuInstanceGetPlacementId(i)
                  for i in instances) == [0, 16, 24]


def test_equal_size_mode_keeps_one_size(l40s):
    l40s.write(L40S_VFS[0], L40S_4Q)
    assert l40s.creatable(L40S_VFS[1]) == [L40S_4Q, 1160]   # 4Q, 4A
    with pytest.raises(OSError) as raised:
        l40s.write(L40S_VFS[1], L40S_12Q)
    assert raised.value.errno == errno.EINVAL


# --- the scheduler ---------------------------------------------------------

def test_fixed_share_is_refused_with_mixed_sizes(l40s):
    fixed = l40s.nvml.NVML_VGPU_SCHEDULER_POLICY_FIXED_SHARE
    l40s.heterogeneous(True)
    with nvml_error(l40s, 'NotSupported'):
        l40s.scheduler(fixed)
    l40s.heterogeneous(False)
    l40s.scheduler(fixed)
    with nvml_error(l40s, 'NotSupported'):
        l40s.heterogeneous(True)


def test_the_scheduler_changes_only_while_no_vm_runs(l40s):
    equal = l40s.nvml.NVML_VGPU_SCHEDULER_POLICY_EQUAL_SHARE
    l40s.write(L40S_VFS[0], L40S_4Q)
    l40s.kernel.mark_busy(L40S_VFS[0])
    with nvml_error(l40s, 'InUse'):
        l40s.scheduler(equal, frequency=100)
    l40s.kernel.mark_idle(L40S_VFS[0])
    l40s.scheduler(equal, frequency=100)
    state = l40s.scheduler_state()
    assert (state.schedulerPolicy, state.timeslice) == (equal, 10000000)


def test_scheduler_arguments_out_of_range_are_refused(l40s):
    with nvml_error(l40s, 'InvalidArgument'):
        l40s.scheduler(7)
    with nvml_error(l40s, 'InvalidArgument'):
        l40s.scheduler(l40s.nvml.NVML_VGPU_SCHEDULER_POLICY_EQUAL_SHARE,
                       frequency=mig.MAX_FREQUENCY + 1)
    caps = l40s.nvml.nvmlDeviceGetVgpuSchedulerCapabilities(l40s.handle)
    assert list(caps.supportedSchedulers) == list(mig.POLICIES)


def test_no_time_sliced_scheduler_with_mig_on(h100):
    h100.mig(1)
    with nvml_error(h100, 'NotSupported'):
        h100.scheduler(h100.nvml.NVML_VGPU_SCHEDULER_POLICY_EQUAL_SHARE)


def test_a_gpu_instance_has_its_own_scheduler_while_mig_is_on(blackwell):
    nvml = blackwell.nvml
    equal = nvml.NVML_VGPU_SCHEDULER_POLICY_EQUAL_SHARE
    blackwell.mig(1)
    blackwell.vfs(4)
    gi = blackwell.gi(GI_1G_24GB_GFX)
    info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
        gi, nvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
        nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
    assert (info.id, info.sliceCount) == (0, 1)
    with nvml_error(blackwell, 'NotSupported'):
        nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
            gi, nvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
            nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
    state = nvml.c_nvmlVgpuSchedulerState_v2_t()
    state.schedulerPolicy, state.frequency = equal, 50
    blackwell.write(BW_VFS[0], DC_1_12Q)
    blackwell.kernel.mark_busy(BW_VFS[0])
    with nvml_error(blackwell, 'InUse'):
        nvml.nvmlGpuInstanceSetVgpuSchedulerState_v2(gi, state)
    blackwell.kernel.mark_idle(BW_VFS[0])
    nvml.nvmlGpuInstanceSetVgpuSchedulerState_v2(gi, state)
    got = nvml.nvmlGpuInstanceGetVgpuSchedulerState_v2(
        gi, nvml.c_nvmlVgpuSchedulerStateInfo_v2_t())
    assert (got.schedulerPolicy, got.timeslice) == (equal, 20000000)
