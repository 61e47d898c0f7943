"""Configuration typo checks no other test pinned (issue 30, section 6):
keystoneauth's ``[placement]`` options are not typos, typos in a
``[vgpu_<type>]`` section are found (of an enabled type and of one not
enabled), and a group's name given as an option of ``[DEFAULT]`` is
refused.  Through ``conf.load``, as every command reads its file."""

import pytest

from libvirt_gpu import conf as conf_mod
from libvirt_gpu import exception

# What a production host writes, as nova's [placement] section.
KEYSTONE = """[placement]
auth_type = password
auth_url = http://keystone.example:5000/v3
username = placement
password = secret
project_name = service
user_domain_name = Default
project_domain_name = Default
region_name = RegionOne
valid_interfaces = internal
cafile = /etc/ssl/certs/ca-certificates.crt
insecure = false
timeout = 30
"""


def _load(tmp_path, text):
    path = tmp_path / 'libvirt-gpu.conf'
    path.write_text(text)
    return conf_mod.load(str(path))


def _refused(tmp_path, text):
    with pytest.raises(exception.ConfigError) as e:
        _load(tmp_path, text)
    return str(e.value)


def test_keystoneauth_placement_options_are_not_typos(tmp_path):
    """keystoneauth registers them per plugin, only when a client is
    built: they are not unknown (broken by checking ``[placement]``
    against the options registered at load)."""
    conf = _load(tmp_path, KEYSTONE + 'nest_under_existing = false\n')
    assert conf.placement.nest_under_existing is False


@pytest.mark.parametrize('section', ['vgpu_nvidia-223', 'vgpu_nvidia-224'])
def test_a_typo_in_a_vgpu_section_is_found(tmp_path, section):
    """Of the enabled type (a registered group) and of a type not enabled
    (checked against a ``[vgpu_<type>]`` section's options)."""
    said = _refused(tmp_path, '[gpu]\nenabled_vgpu_types = nvidia-223\n'
                    '[%s]\ndevice_adresses = 0000:af:00.0\n' % section)
    assert 'unknown option [%s]/device_adresses; did you mean ' \
        'device_addresses?' % section in said


def test_a_vgpu_sections_own_options_are_accepted(tmp_path):
    """(A section of a type not enabled is refused as such:
    test_mistakes_conf.py.)"""
    _load(tmp_path, '[gpu]\nenabled_vgpu_types = nvidia-223\n'
          '[vgpu_nvidia-223]\ndevice_addresses = 0000:af:00.0\n'
          'max_instances = 2\n')


@pytest.mark.parametrize('name', ['gpu', 'placement', 'agent', 'libvirt'])
def test_a_group_name_in_default_is_refused(tmp_path, name):
    """``[DEFAULT]/gpu = ...`` is no option: oslo.config lists groups
    beside options (broken by taking every name of the ConfigOpts as a
    ``[DEFAULT]`` option)."""
    said = _refused(tmp_path, '[DEFAULT]\n%s = x\n' % name)
    assert 'unknown option [DEFAULT]/%s' % name in said
