"""Operator mistakes in the configuration file (issue 30, section 5):
each is one refusal of ``conf.load``, as every command reads its file,
naming the mistake and what to do.

- typos in ``[placement]``, checked against our options, keystoneauth's
  session and adapter options and the options of the auth plugin
  ``auth_type`` names; an unknown ``auth_type``;
- a ``state_dir`` that is not a directory of our own (``/``, ``/etc``,
  ``/usr/lib``, a directory holding another program's directories);
- an option or a section given twice (both lines named);
- a ``[vgpu_<type>]`` section of a type that is not enabled.
"""

import os

import pytest

from libvirt_gpu import conf as conf_mod
from libvirt_gpu import conffile
from libvirt_gpu import exception

PASSWORD = """[placement]
auth_type = password
auth_url = http://keystone.example:5000/v3
username = placement
password = secret
project_name = service
user_domain_name = Default
project_domain_name = Default
"""


def _write(tmp_path, text):
    path = tmp_path / 'libvirt-gpu.conf'
    path.write_text(text)
    return str(path)


def _load(tmp_path, text):
    return conf_mod.load(_write(tmp_path, text))


def _refused(tmp_path, text):
    with pytest.raises(exception.ConfigError) as e:
        _load(tmp_path, text)
    said = str(e.value)
    assert '\n' not in said
    return said


# --- [placement] -----------------------------------------------------------

@pytest.mark.parametrize('typo,meant,text', [
    ('auth_tpye', 'auth_type', '[placement]\nauth_tpye = password\n'),
    ('endpoint_overide', 'endpoint_override',
     '[placement]\nendpoint_overide = http://placement:8778\n'),
    ('pasword', 'password', PASSWORD + 'pasword = secret\n'),
    ('nest_under_exisiting', 'nest_under_existing',
     '[placement]\nnest_under_exisiting = false\n'),
    ('usernme', 'username', PASSWORD + 'usernme = x\n'),
])
def test_a_typo_in_placement_is_named(tmp_path, typo, meant, text):
    said = _refused(tmp_path, text)
    assert 'unknown option [placement]/%s; did you mean %s?' % (
        typo, meant) in said


def test_the_chosen_plugins_options_are_accepted(tmp_path):
    """The password plugin's options with ``auth_type = password``, and
    the session and adapter options (no plugin chosen)."""
    conf = _load(tmp_path, PASSWORD + 'timeout = 30\nregion_name = R1\n'
                 'valid_interfaces = internal\ntenant_name = service\n')
    assert conf.placement.nest_under_existing is True
    _load(tmp_path, '[placement]\nendpoint_override = http://p:8778\n'
          'insecure = true\n')


def test_another_plugins_option_is_unknown(tmp_path):
    """``application_credential_secret`` belongs to the
    v3applicationcredential plugin, not to ``password``: read by
    nothing."""
    said = _refused(tmp_path, PASSWORD
                    + 'application_credential_secret = s\n')
    assert 'unknown option [placement]/application_credential_secret' \
        in said
    _load(tmp_path, '[placement]\nauth_type = v3applicationcredential\n'
          'application_credential_secret = s\n'
          'application_credential_id = i\n')


def test_an_unknown_auth_type_is_named(tmp_path):
    said = _refused(tmp_path, '[placement]\nauth_type = pasword\n')
    assert 'unknown [placement]/auth_type pasword; did you mean ' \
        'password?' in said


# --- state_dir -------------------------------------------------------------

@pytest.mark.parametrize('state_dir', [
    '/', '/etc', '/usr/lib', '/usr', '/var', '/home', '/var/lib', '/tmp',
    '/var/lib/..', '/etc/', '/proc/self'])
def test_a_shared_system_directory_is_refused(tmp_path, state_dir):
    said = _refused(tmp_path, '[DEFAULT]\nstate_dir = %s\n' % state_dir)
    assert '[DEFAULT]/state_dir = %s ' % state_dir in said
    assert 'other programs use' in said
    assert 'name a directory of libvirt-gpu\'s own, such as ' \
        '/var/lib/libvirt-gpu' in said


def test_a_relative_state_dir_is_refused(tmp_path):
    said = _refused(tmp_path, '[DEFAULT]\nstate_dir = state\n')
    assert '[DEFAULT]/state_dir = state is a relative path' in said


def test_a_directory_holding_another_programs_directories(tmp_path):
    """A directory that holds a directory with something in it is not
    ours (the state directory holds files only)."""
    shared = tmp_path / 'shared'
    (shared / 'python3' / 'dist-packages').mkdir(parents=True)
    said = _refused(tmp_path, '[DEFAULT]\nstate_dir = %s\n' % shared)
    assert 'holds the directory python3' in said
    # an empty directory in it (a mistake of ours, a planted one) is left
    # to the state directory's own checks
    (shared / 'python3' / 'dist-packages').rmdir()
    (shared / 'python3').rmdir()
    (shared / 'empty').mkdir()
    (shared / 'hook.log').write_text('')
    _load(tmp_path, '[DEFAULT]\nstate_dir = %s\n' % shared)


def test_our_own_state_dir_is_accepted(tmp_path):
    conf = _load(tmp_path, '[DEFAULT]\nstate_dir = %s\n'
                 % (tmp_path / 'state'))
    assert conf.state_dir == str(tmp_path / 'state')
    assert conffile.SHARED_DIRS >= {'/', '/etc', '/usr/lib'}


def test_the_snapshot_path_refuses_it_too(tmp_path, monkeypatch):
    """The CLI's settings snapshot (confcache) checks the value too."""
    from libvirt_gpu import confcache
    from libvirt_gpu.util import cachefiles
    monkeypatch.setenv(cachefiles.CACHE_ENV, str(tmp_path / 'cache'))
    path = _write(tmp_path, '[DEFAULT]\nstate_dir = %s\n'
                  % (tmp_path / 'state'))
    confcache.load(path)
    assert confcache.read(path) is not None
    os.makedirs(str(tmp_path / 'state' / 'lib' / 'x'))
    with pytest.raises(exception.ConfigError, match='holds the directory'):
        confcache.load(path)


# --- given twice -----------------------------------------------------------

def test_an_option_given_twice_names_both_lines(tmp_path):
    said = _refused(tmp_path, '[gpu]\nenabled_vgpu_types = nvidia-223\n'
                    'nvml = off\n\nenabled_vgpu_types = nvidia-224\n')
    assert '[gpu]/enabled_vgpu_types is set twice (lines 2 and 5)' in said
    assert 'keep one' in said


def test_an_option_given_twice_in_two_openings_of_a_section(tmp_path):
    """The section is named first: it is where the mistake is."""
    said = _refused(tmp_path, '[DEFAULT]\nstate_dir = %s\n[gpu]\nnvml = '
                    'off\n[DEFAULT]\nhost = h\n' % (tmp_path / 's'))
    assert 'section [DEFAULT] is opened twice (lines 1 and 5); merge ' \
        'them into one' in said


def test_a_multiline_value_names_its_first_line(tmp_path):
    said = _refused(tmp_path, '[gpu]\nenabled_vgpu_types = nvidia-223,\n'
                    '  nvidia-224\nnvml = off\nenabled_vgpu_types = x\n')
    assert 'lines 2 and 5' in said


def test_a_multi_valued_option_may_repeat(tmp_path):
    """An option registered as multi-valued (MultiStrOpt) is meant to be
    given more than once."""
    from oslo_config import cfg
    from libvirt_gpu.conf import typos
    conf = conf_mod.new_conf()
    conf.register_opts([cfg.MultiStrOpt('many')], group='gpu')
    path = _write(tmp_path, '[gpu]\nmany = a\nmany = b\n')
    conf(args=[], default_config_files=[path], default_config_dirs=[],
         use_env=False)
    typos.check(conf, path, [])
    assert conf.gpu.many == ['a', 'b']
    conf.register_opts([cfg.StrOpt('one')], group='gpu')
    path = _write(tmp_path, '[gpu]\none = a\none = b\n')
    with pytest.raises(exception.ConfigError, match='set twice'):
        typos.check(conf, path, [])


# --- [vgpu_<type>] of a type not enabled ------------------------------------

def test_a_section_of_a_type_near_the_enabled_one(tmp_path):
    """The case of the issue: its device_addresses would be ignored and
    every GPU sliced."""
    said = _refused(tmp_path, '[gpu]\nenabled_vgpu_types = nvidia-223\n'
                    '[vgpu_nvidia-233]\ndevice_addresses = 0000:af:00.0\n')
    assert 'section [vgpu_nvidia-233] is of type nvidia-233, which ' \
        '[gpu]/enabled_vgpu_types (nvidia-223) does not enable, so ' \
        'nothing would read it; did you mean [vgpu_nvidia-223]?' in said


def test_a_section_of_a_type_not_enabled_at_all(tmp_path):
    said = _refused(tmp_path, '[vgpu_grid_p40-2q]\nmax_instances = 2\n')
    assert '[gpu]/enabled_vgpu_types (empty) does not enable' in said
    assert 'enable the type there or remove the section' in said


# --- the whole messages (each part was once changed alone: make mutation) --

def test_the_refusals_name_the_file_first(tmp_path):
    path = str(tmp_path / 'libvirt-gpu.conf')
    cases = {
        '[gpu]\nnvml = off\nnvml = auto\n':
            '[gpu]/nvml is set twice (lines 2 and 3), and only the last '
            'would count; keep one',
        '[DEFAULT]\nhost = a\nhost = b\n':
            '[DEFAULT]/host is set twice (lines 2 and 3), and only the last '
            'would count; keep one',
        '[gpus]\n':
            'unknown section [gpus]; did you mean gpu? (sections: agent, '
            'gpu, libvirt, nova, placement, routes)',
        '[placement]\nauth_type = pasword\n':
            'unknown [placement]/auth_type pasword; did you mean password? '
            '(the keystoneauth plugins: password, token, '
            'v3applicationcredential, ...)',
        '[placement]\nauth_type = password\nusernme = x\n':
            'unknown option [placement]/usernme; did you mean username?',
        '[gpu]\nenabled_vgpu_types = nvidia-223, nvidia-224\n'
        '[vgpu_nvidia-223]\ndevice_addresses = 0000:af:00.0\n'
        '[vgpu_nvidia-224]\ndevice_addresses = 0000:3b:00.0\n'
        '[vgpu_nvidia-225]\n':
            'section [vgpu_nvidia-225] is of type nvidia-225, which '
            '[gpu]/enabled_vgpu_types (nvidia-223, nvidia-224) does not '
            'enable, so nothing would read it; did you mean '
            '[vgpu_nvidia-224]?',
    }
    for text, said in cases.items():
        assert _refused(tmp_path, text).endswith('%s: %s' % (path, said)), \
            text


@pytest.mark.parametrize('state_dir,said', [
    ('state', 'is a relative path, which names another directory in each '
              'program that reads it'),
    ('/etc', 'is a directory other programs use too'),
    ('/etc/', 'is /etc, a directory other programs use too'),
    ('/var/lib/..', 'is /var, a directory other programs use too'),
    ('/sys/kernel', 'is a directory other programs use too'),
    ('/dev/shm/x', 'is a directory other programs use too'),
])
def test_the_state_dir_refusals_whole(tmp_path, state_dir, said):
    path = str(tmp_path / 'libvirt-gpu.conf')
    assert _refused(tmp_path, '[DEFAULT]\nstate_dir = %s\n' % state_dir) \
        .endswith(
            '%s: [DEFAULT]/state_dir = %s %s; name a directory of '
            'libvirt-gpu\'s own, such as /var/lib/libvirt-gpu (it is created '
            'when missing)' % (path, state_dir, said))


def test_a_foreign_directory_among_files_is_found(tmp_path):
    """Files before and after it in the listing: every entry is looked
    at, and the message names it whole."""
    shared = tmp_path / 'shared'
    shared.mkdir()
    for n in range(10):
        (shared / ('a%d' % n)).write_text('')
    (shared / 'lib').mkdir()
    (shared / 'lib' / 'x').write_text('')
    for n in range(10):
        (shared / ('z%d' % n)).write_text('')
    said = _refused(tmp_path, '[DEFAULT]\nstate_dir = %s\n' % shared)
    assert said.endswith(
        '[DEFAULT]/state_dir = %s holds the directory lib, which '
        'libvirt-gpu never makes there: the directory is another '
        'program\'s; name a directory of libvirt-gpu\'s own, such as '
        '/var/lib/libvirt-gpu (it is created when missing)' % shared)


def test_a_link_to_a_directory_is_left_to_the_state_dirs_checks(tmp_path):
    """A link is no directory made there either; the state directory's
    own checks refuse a link where a state file should be."""
    (tmp_path / 'elsewhere' / 'x').mkdir(parents=True)
    state = tmp_path / 'state'
    state.mkdir()
    os.symlink(str(tmp_path / 'elsewhere'), str(state / 'linked'))
    _load(tmp_path, '[DEFAULT]\nstate_dir = %s\n' % state)


def test_a_multi_valued_option_of_default_may_repeat(tmp_path):
    from oslo_config import cfg
    from libvirt_gpu.conf import typos
    conf = conf_mod.new_conf()
    conf.register_opts([cfg.MultiStrOpt('many')])
    path = _write(tmp_path, '[DEFAULT]\nmany = a\nmany = b\n')
    conf(args=[], default_config_files=[path], default_config_dirs=[],
         use_env=False)
    typos.check(conf, path, [])
