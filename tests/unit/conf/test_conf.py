import textwrap

import pytest

from libvirt_gpu import conf as conf_mod
from libvirt_gpu import exception
from libvirt_gpu import objects
from tests.doubles import fakes
from tests.doubles import layouts

GPUS = [fakes.gpu('0000:3b:00.0'), fakes.gpu('0000:af:00.0'),
        fakes.gpu('0000:d8:00.0', types=())]


def load(tmp_path, text):
    path = tmp_path / 'libvirt-gpu.conf'
    path.write_text(textwrap.dedent(text))
    return conf_mod.load(str(path))


def test_single_type_without_addresses_applies_to_every_offering_gpu(
        tmp_path):
    conf = load(tmp_path, """
        [gpu]
        enabled_vgpu_types = nvidia-223
        """)
    enabled = layouts.enabled(conf, GPUS)
    assert sorted(str(a) for a in enabled) == ['0000:3b:00.0',
                                               '0000:af:00.0']
    assert {e.type_id for e in enabled.values()} == {'nvidia-223'}


def test_two_types_with_addresses(tmp_path):
    conf = load(tmp_path, """
        [gpu]
        enabled_vgpu_types = nvidia-223, nvidia-319
        [vgpu_nvidia-223]
        device_addresses = 0000:AF:00.0
        resource_class = CUSTOM_VGPU_T4_2B
        [vgpu_nvidia-319]
        device_addresses = 0000:3b:00.0
        max_instances = 2
        """)
    enabled = layouts.enabled(conf, GPUS)
    af = enabled[objects.PciAddress.parse('0000:af:00.0')]
    assert af == objects.EnabledType('nvidia-223', 'CUSTOM_VGPU_T4_2B')
    assert enabled[objects.PciAddress.parse('0000:3b:00.0')] == \
        objects.EnabledType('nvidia-319', 'VGPU', 2)


def test_address_claimed_by_two_types(tmp_path):
    conf = load(tmp_path, """
        [gpu]
        enabled_vgpu_types = nvidia-223, nvidia-319
        [vgpu_nvidia-223]
        device_addresses = 0000:af:00.0
        [vgpu_nvidia-319]
        device_addresses = 0000:af:00.0
        """)
    with pytest.raises(exception.ConfigError, match='claimed by two types'):
        layouts.enabled(conf, GPUS)


def test_invalid_address(tmp_path):
    conf = load(tmp_path, """
        [gpu]
        enabled_vgpu_types = nvidia-223
        [vgpu_nvidia-223]
        device_addresses = af:00.0
        """)
    with pytest.raises(exception.ConfigError,
                       match=r"\[vgpu_nvidia-223\]/device_addresses: "
                             r"'af:00.0' is not a PCI address"):
        layouts.enabled(conf, GPUS)


def test_type_not_offered_by_gpu(tmp_path):
    conf = load(tmp_path, """
        [gpu]
        enabled_vgpu_types = nvidia-223
        [vgpu_nvidia-223]
        device_addresses = 0000:d8:00.0
        """)
    with pytest.raises(exception.ConfigError,
                       match='0000:d8:00.0 does not offer type nvidia-223'):
        layouts.enabled(conf, GPUS)


def test_address_without_gpu(tmp_path):
    conf = load(tmp_path, """
        [gpu]
        enabled_vgpu_types = nvidia-223
        [vgpu_nvidia-223]
        device_addresses = 0000:01:00.0
        """)
    with pytest.raises(exception.ConfigError, match='has no GPU there'):
        layouts.enabled(conf, GPUS)


def test_several_types_one_without_addresses(tmp_path):
    conf = load(tmp_path, """
        [gpu]
        enabled_vgpu_types = nvidia-223, nvidia-319
        [vgpu_nvidia-223]
        device_addresses = 0000:af:00.0
        """)
    with pytest.raises(exception.ConfigError,
                       match=r'\[vgpu_nvidia-319\] lists no device_addresses'):
        layouts.enabled(conf, GPUS)


def test_bad_type_id(tmp_path):
    with pytest.raises(exception.ConfigError, match='not a valid vGPU type'):
        load(tmp_path, """
            [gpu]
            enabled_vgpu_types = ../nvidia
            """)


def test_bad_value_is_config_error(tmp_path):
    with pytest.raises(exception.ConfigError, match='max_instances'):
        load(tmp_path, """
            [gpu]
            enabled_vgpu_types = nvidia-223
            [vgpu_nvidia-223]
            max_instances = zero
            """)


def test_bad_resource_class(tmp_path):
    conf = load(tmp_path, """
        [gpu]
        enabled_vgpu_types = nvidia-223
        [vgpu_nvidia-223]
        resource_class = GPU-ish
        """)
    with pytest.raises(exception.ConfigError, match='resource_class'):
        layouts.enabled(conf, GPUS)


def test_env_variable_names_file(tmp_path):
    path = tmp_path / 'other.conf'
    path.write_text('[libvirt]\nconnection_uri = test:///default\n')
    conf = conf_mod.load(environ={'LIBVIRT_GPU_CONFIG': str(path)})
    assert conf.libvirt.connection_uri == 'test:///default'


def test_explicit_missing_file_is_an_error(tmp_path):
    with pytest.raises(exception.ConfigError, match='does not exist'):
        conf_mod.load(str(tmp_path / 'missing.conf'))
    with pytest.raises(exception.ConfigError, match='does not exist'):
        conf_mod.load(environ={'LIBVIRT_GPU_CONFIG': str(tmp_path / 'x')})


def test_missing_default_file_gives_defaults(tmp_path, monkeypatch):
    monkeypatch.setattr(conf_mod, 'DEFAULT_CONFIG_FILE',
                        str(tmp_path / 'absent.conf'))
    conf = conf_mod.load(environ={})
    assert conf.sysfs_root == '/sys'
    assert conf.gpu.enabled_vgpu_types == []
