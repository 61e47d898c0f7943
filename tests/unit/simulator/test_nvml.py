"""The NVML stand-in cannot lie: the simulated binding
(libvirt_gpu/simulator/nvml.py) is the installed nvidia-ml-py's own
``pynvml`` over a simulated ``libnvidia-ml``, whose C functions are ones
the binding really looks up, with the arguments it really passes; every
NVML call and constant the product uses exists in the installed binding;
and ``[gpu]/nvml = simulated`` gives the product that binding over the
same state as the simulated sysfs."""

import ast
import ctypes
import errno
import inspect
import os
import re
import types

import pynvml
import pytest

import libvirt_gpu
from libvirt_gpu import environment
from libvirt_gpu import exception
from libvirt_gpu import simulator
from libvirt_gpu.devices import nvml
from libvirt_gpu.devices.backends.nvidia_vgpu import names as vendor_names
from libvirt_gpu.simulator import kernel as kernel_mod
from libvirt_gpu.simulator import mig
from libvirt_gpu.simulator import nvml as sim_nvml
from libvirt_gpu.simulator import sysfs_tree
from tests.doubles import h100
from tests.doubles import kernel_sysfs
from tests.doubles import nvml_fake

PACKAGE_DIR = os.path.dirname(os.path.abspath(libvirt_gpu.__file__))
H100_PF = '0000:4e:00.0'
H100_VF = '0000:4e:00.4'


def _binding_calls():
    """``{C function: {argument counts}}``: every C function the
    installed binding looks up (``_nvmlGetFunctionPointer("name")``) and
    how many arguments its wrappers pass it."""
    with open(pynvml.__file__) as f:
        tree = ast.parse(f.read())
    found = {}
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef):
            continue
        names = {}
        for node in ast.walk(function):
            if isinstance(node, ast.Assign) and isinstance(
                    node.value, ast.Call) and isinstance(
                    node.value.func, ast.Name) and \
                    node.value.func.id == '_nvmlGetFunctionPointer' and \
                    isinstance(node.value.args[0], ast.Constant):
                c_name = node.value.args[0].value
                found.setdefault(c_name, set())
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        names[target.id] = c_name
        for node in ast.walk(function):
            if isinstance(node, ast.Call) and isinstance(
                    node.func, ast.Name) and node.func.id in names:
                found[names[node.func.id]].add(len(node.args))
    return found


def _shape(function):
    """A function's parameters: names, kinds, defaults (a default
    structure by its type's name: each module has its own instance)."""
    return [(p.name, p.kind, p.default if isinstance(
        p.default, (int, str, bytes, type(None))) or p.default is p.empty
        else type(p.default).__name__)
        for p in inspect.signature(function).parameters.values()]


@pytest.mark.parametrize('which', ['simulator', 'tests_fake'])
def test_the_simulated_binding_is_the_installed_pynvml(which):
    if which == 'simulator':
        sim = sim_nvml.module(kernel=kernel_mod.SimKernel('h100-80gb'))
    else:
        sim = nvml_fake.module(nvml_fake.h100_spec(h100.NVML_JSON))
    assert isinstance(sim.nvmlLib, sim_nvml.SimLibrary)
    checked = 0
    for name in dir(sim):
        if name.startswith('_') or name in ('nvmlLib', 'simulated',
                                            'state'):
            continue
        value = getattr(sim, name)
        if isinstance(value, types.ModuleType):
            continue
        assert hasattr(pynvml, name), name
        real = getattr(pynvml, name)
        if isinstance(value, type):
            assert value is real, name          # errors, structures
        elif inspect.isfunction(value):
            assert _shape(value) == _shape(real), name
            checked += 1
        elif isinstance(value, (int, str, bytes, float)):
            assert value == real, name
    assert checked > 400


def test_the_tests_fake_answers_only_the_simulated_driver_s_questions():
    asked = {name for name, value in vars(nvml_fake.SpecBackend).items()
             if inspect.isfunction(value) and not name.startswith('_')}
    assert asked - {'call'} <= set(sim_nvml.OPS)


def test_every_c_function_it_offers_is_one_the_binding_calls():
    calls = _binding_calls()
    assert len(calls) > 300
    for name in sim_nvml.EXPORTED:
        assert name in calls, '%s: the binding never looks it up' % name
        function = sim_nvml._FUNCTIONS[name]
        taken = len(inspect.signature(function).parameters) - 1  # lib
        assert calls[name] <= {taken}, (name, calls[name], taken)


def test_the_check_of_c_functions_can_fail():
    assert 'nvmlDeviceGetGpuInstancePossiblePlacements_v2' in \
        _binding_calls()
    assert 'nvmlDeviceGetGpuInstancePossiblePlacements' not in \
        _binding_calls()                  # the Python name, not the C one
    assert _binding_calls()['nvmlDeviceCreateGpuInstance'] == {3}


def test_the_simulator_s_nvml_numbers_are_the_binding_s():
    names = [n for n in dir(mig) if n.startswith('NVML_')]
    assert len(names) > 10
    for name in names:
        assert getattr(mig, name) == getattr(pynvml, name), name
    assert sim_nvml.NVML_GPU_VIRTUALIZATION_MODE_HOST_VGPU == \
        pynvml.NVML_GPU_VIRTUALIZATION_MODE_HOST_VGPU


def test_a_function_it_does_not_simulate_is_not_found():
    sim = sim_nvml.module(kernel=kernel_mod.SimKernel('h100-80gb'))
    sim.nvmlInit()
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        sim.nvmlDeviceGetPowerUsage(handle)
    with pytest.raises(AttributeError):
        sim.nvmlDeviceGetGpuInstancePossiblePlacements_v3
    sim.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        sim.nvmlDeviceGetCount()


# --- what the product calls ------------------------------------------------

def _product_files():
    for directory, _, files in os.walk(PACKAGE_DIR):
        if os.path.relpath(directory, PACKAGE_DIR).startswith('simulator'):
            continue
        for name in files:
            if name.endswith('.py'):
                yield os.path.join(directory, name)


_NVML_NAME = re.compile(r'nvml[A-Z]\w*')


def nvml_uses(source):
    """``(calls, constants)`` of NVML in ``source``: ``[(name, argument
    count or None)]`` for every ``x.nvml...`` attribute (called directly,
    or handed to a helper with its arguments after it, as
    ``self._ask(lib, lib.nvmlX, handle)``), and ``[(name, value or
    None)]`` for every ``NVML_*`` name assigned or written as a string."""
    tree = ast.parse(source)
    calls, constants, seen = [], [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Attribute) and \
                    _NVML_NAME.fullmatch(node.func.attr):
                calls.append((node.func.attr, len(node.args)))
                seen.add(id(node.func))
            for i, arg in enumerate(node.args):
                if isinstance(arg, ast.Attribute) and \
                        _NVML_NAME.fullmatch(arg.attr):
                    calls.append((arg.attr, len(node.args) - i - 1))
                    seen.add(id(arg))
        elif isinstance(node, ast.Assign) and isinstance(
                node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name) and \
                        target.id.startswith('NVML_'):
                    constants.append((target.id, node.value.value))
        elif isinstance(node, ast.Constant) and isinstance(
                node.value, str) and node.value.startswith('NVML_'):
            constants.append((node.value, None))
        elif isinstance(node, ast.Constant) and isinstance(
                node.value, str) and _NVML_NAME.fullmatch(node.value):
            calls.append((node.value, None))        # called by its name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _NVML_NAME.fullmatch(
                node.attr) and id(node) not in seen:
            calls.append((node.attr, None))
    return calls, constants


def wrong_nvml_uses(source):
    """What of ``nvml_uses(source)`` the installed binding does not have
    (or not with that many arguments, or with another value)."""
    calls, constants = nvml_uses(source)
    wrong = []
    for name, count in calls:
        function = getattr(pynvml, name, None)
        if not callable(function):
            wrong.append('%s: not in nvidia-ml-py' % name)
            continue
        if count is not None:
            try:
                inspect.signature(function).bind(*([None] * count))
            except TypeError:
                wrong.append('%s: %d arguments' % (name, count))
    for name, value in constants:
        if not hasattr(pynvml, name):
            wrong.append('%s: not in nvidia-ml-py' % name)
        elif value is not None and getattr(pynvml, name) != value:
            wrong.append('%s = %r, nvidia-ml-py: %r'
                         % (name, value, getattr(pynvml, name)))
    return wrong


def test_every_nvml_call_of_the_product_is_in_nvidia_ml_py():
    used = 0
    for path in _product_files():
        with open(path) as f:
            source = f.read()
        assert wrong_nvml_uses(source) == [], path
        used += len(nvml_uses(source)[0])
    assert used >= 20


def test_the_product_check_can_fail():
    assert wrong_nvml_uses(
        'lib.nvmlDeviceGetGpuInstancePossiblePlacements_v2(h, 1, p, c)\n'
        'lib.nvmlDeviceGetName(h, 2)\n'
        'ask(lib, lib.nvmlDeviceGetMigMode, h, 3)\n'
        'NVML_DEVICE_MIG_ENABLE = 2\n'
        'codes = ("NVML_ERROR_NOT_THERE",)\n'
        'call(address, "nvmlDeviceGetNothing", 1)\n') == [
        'nvmlDeviceGetGpuInstancePossiblePlacements_v2: not in '
        'nvidia-ml-py',
        'nvmlDeviceGetName: 2 arguments',
        'nvmlDeviceGetMigMode: 2 arguments',
        'nvmlDeviceGetNothing: not in nvidia-ml-py',
        'NVML_DEVICE_MIG_ENABLE = 2, nvidia-ml-py: 1',
        'NVML_ERROR_NOT_THERE: not in nvidia-ml-py']


# --- [gpu]/nvml = simulated -------------------------------------------------

@pytest.fixture
def h100_tree(tmp_path):
    root = str(tmp_path / 'sys')
    simulator.write_sysfs(simulator.load_profile('h100-80gb'), root)
    return root


def test_simulated_nvml_reads_the_simulated_host(h100_tree):
    found = nvml.source('simulated', sysfs_root=h100_tree).query()
    info = found[nvml.objects.PciAddress.parse(H100_PF)]
    assert (info.name, info.memory_total_mib, info.virtualization_mode,
            info.mig_enabled) == ('NVIDIA H100 80GB HBM3', 81559,
                                  'vgpu_host', False)
    assert [t.name for t in info.vgpu_types][:2] == [
        'NVIDIA H100-4C', 'NVIDIA H100-5C']
    # MIG off: the time-sliced types are creatable, the MIG-backed not
    assert {t.name for t in info.vgpu_types if t.creatable} == {
        'NVIDIA H100-%dC' % gb for gb in (4, 5, 8, 10, 16, 20, 40, 80)}


def test_simulated_nvml_needs_a_simulated_root():
    with pytest.raises(exception.ConfigError, match='simulated sysfs root'):
        nvml.source('simulated', sysfs_root='/sys')


def test_the_composition_root_binds_it_to_the_sysfs_root(h100_tree,
                                                         tmp_path):
    conf = types.SimpleNamespace(gpu=types.SimpleNamespace(nvml='simulated'))
    env = environment.Environment(str(tmp_path / 'state'),
                                  sysfs_root=h100_tree, conf=conf)
    assert list(env.nvml.query()) == [
        nvml.objects.PciAddress.parse(H100_PF)]


def test_one_state_for_nvml_and_the_sysfs_writes(h100_tree):
    """NVML in one 'process' turns MIG on and makes a GI; the tests'
    kernel double (another) enables the VFs (GIs go: the tree's file says
    so), NVML makes a GI again, the sysfs write of a MIG-backed type lands
    in it, and a third NVML reads where it sits."""
    tree = kernel_sysfs.KernelSysfs(h100_tree, 'h100-80gb')
    numvfs = os.path.join(h100_tree, 'bus/pci/devices', H100_PF,
                          'sriov_numvfs')
    tree.write(numvfs, '0')
    first = sim_nvml.module(sysfs_root=h100_tree)
    first.nvmlInit()
    handle = first.nvmlDeviceGetHandleByIndex(0)
    first.nvmlDeviceSetMigMode(handle, 1)
    first.nvmlDeviceCreateGpuInstance(handle, 19)
    tree.write(numvfs, '4')
    assert sysfs_tree.read_driver_state(h100_tree)['gpus'][H100_PF][
        'gis'] == []
    current = os.path.join(h100_tree, 'bus/pci/devices', H100_VF,
                           vendor_names.VENDOR_DIR, vendor_names.CURRENT_TYPE)
    with pytest.raises(exception.SysfsWriteError):
        tree.write(current, '1308')
    assert tree.writes[-1].errno == errno.EIO
    first.nvmlDeviceCreateGpuInstance(handle, 19)
    tree.write(current, '1308')
    third = sim_nvml.module(sysfs_root=h100_tree)
    third.nvmlInit()
    (instance,) = third.nvmlDeviceGetActiveVgpus(
        third.nvmlDeviceGetHandleByIndex(0))
    assert third.nvmlVgpuInstanceGetGpuInstanceId(instance) == 7
    assert third.nvmlVgpuInstanceGetGpuPciId(instance) == \
        '00000000:4E:00.4'
    assert read_vf(h100_tree, H100_VF, vendor_names.GPU_INSTANCE_ID) == '7'
    tree.write(current, '0')
    assert read_vf(h100_tree, H100_VF, vendor_names.GPU_INSTANCE_ID) is None


def read_vf(root, vf, name):
    path = os.path.join(root, 'bus', 'pci', 'devices', vf,
                        vendor_names.VENDOR_DIR, name)
    try:
        with open(path) as f:
            return f.read().strip()
    except FileNotFoundError:
        return None


def test_handles_are_the_binding_s_types():
    sim = sim_nvml.module(kernel=kernel_mod.SimKernel('h100-80gb'))
    sim.nvmlInit()
    sim.simulated.kernel.set_numvfs(H100_PF, '0')
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    assert isinstance(handle, pynvml.c_nvmlDevice_t)
    sim.nvmlDeviceSetMigMode(handle, 1)
    gi = sim.nvmlDeviceCreateGpuInstance(handle, 0)
    assert isinstance(gi, pynvml.c_nvmlGpuInstance_t)
    info = sim.nvmlGpuInstanceGetInfo(gi)
    assert ctypes.cast(info.device, ctypes.c_void_p).value == \
        ctypes.cast(handle, ctypes.c_void_p).value
    assert (info.id, info.profileId) == (0, 0)


def test_a_static_tree_reboots_keeping_mig_mode_only(h100_tree):
    tree = kernel_sysfs.KernelSysfs(h100_tree, 'h100-80gb')
    numvfs = os.path.join(h100_tree, 'bus/pci/devices', H100_PF,
                          'sriov_numvfs')
    tree.write(numvfs, '0')
    lib = sim_nvml.module(sysfs_root=h100_tree)
    lib.nvmlInit()
    handle = lib.nvmlDeviceGetHandleByIndex(0)
    lib.nvmlDeviceSetMigMode(handle, 1)
    tree.write(numvfs, '2')
    lib.nvmlDeviceCreateGpuInstance(handle, 0)
    tree.write(os.path.join(h100_tree, 'bus/pci/devices', H100_VF,
                            vendor_names.VENDOR_DIR,
                            vendor_names.CURRENT_TYPE), '1314')
    sysfs_tree.reboot(h100_tree, simulator.load_profile('h100-80gb'))
    with open(numvfs) as f:
        assert f.read() == '0\n'
    assert not os.path.exists(os.path.join(h100_tree, 'bus/pci/devices',
                                           H100_VF))
    assert lib.nvmlDeviceGetMigMode(handle) == [1, 1]
    assert lib.nvmlDeviceGetGpuInstanceRemainingCapacity(handle, 0) == 1
    assert lib.nvmlDeviceGetActiveVgpus(handle) == []
