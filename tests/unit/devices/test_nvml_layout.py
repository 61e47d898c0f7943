"""Every NVML name the layouts use (devices/nvml.py: functions, structures,
constants) is one the installed ``nvidia-ml-py`` (``pynvml``) has, and
every call passes the arguments its function takes: the product is
written against the real binding, not against a stand-in."""

import ast
import inspect
import os

import pynvml
import pytest

from libvirt_gpu.devices import nvml

SOURCE = nvml.__file__


def _tree():
    with open(SOURCE) as f:
        return ast.parse(f.read(), SOURCE)


def _lib_attributes(tree):
    """``lib.X`` / ``self.lib.X`` names read in the module."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and (
                isinstance(node.value, ast.Name) and node.value.id == 'lib'
                or isinstance(node.value, ast.Attribute)
                and node.value.attr == 'lib'):
            found.add(node.attr)
    return found


def _called_by_name(tree):
    """``(function name, positional argument count)`` of every
    ``self._call(address, 'nvmlX', *args)``."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(
                node.func, ast.Attribute) and node.func.attr == '_call' \
                and len(node.args) >= 2 and isinstance(
                    node.args[1], ast.Constant):
            found.add((node.args[1].value, len(node.args) - 2))
    return found


def _direct_calls(tree):
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(
                node.func, ast.Attribute) and \
                node.func.attr.startswith('nvml'):
            found.add((node.func.attr, len(node.args)))
    return found


def test_the_scan_sees_the_layout_calls():
    names = {name for name, _ in _called_by_name(_tree())}
    assert {'nvmlDeviceCreateGpuInstance', 'nvmlDeviceSetMigMode',
            'nvmlDeviceSetVgpuSchedulerState_v2'} <= names
    assert 'NVML_DEVICE_MIG_ENABLE' in _lib_attributes(_tree())


def test_every_name_is_the_real_bindings():
    tree = _tree()
    names = _lib_attributes(tree) | {n for n, _ in _called_by_name(tree)}
    missing = sorted(n for n in names
                     if n not in ('NVMLError',) and not hasattr(pynvml, n))
    assert missing == []


@pytest.mark.parametrize('name, count', sorted(
    _called_by_name(_tree()) | _direct_calls(_tree())))
def test_every_call_takes_the_arguments_given(name, count):
    signature = inspect.signature(getattr(pynvml, name))
    signature.bind(*range(count))      # TypeError when they do not fit


def test_the_binding_is_the_one_required():
    assert os.path.basename(pynvml.__file__) == 'pynvml.py'
    assert pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT > 0
