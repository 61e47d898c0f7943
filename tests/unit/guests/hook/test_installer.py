"""The hook as installed (``guests.hook.installer.render_hook``): the
paths it is given must be absolute and without spaces, and good ones are
written into its source.  Pinned in this process, where the hook tests
that install it run it as another process (which never runs a mutant of
``make mutation``)."""

import pytest

from libvirt_gpu import exception
from libvirt_gpu.guests.hook import installer


# --- guests.hook.installer ---------------------------------------------------

HOOK_SOURCE = ("#!/usr/bin/python3\nCONFIG_FILE = None\n"
               "SETTINGS_FILE = None\nIMPORT_PATH = []\n")


@pytest.mark.parametrize('python, config', [
    ('python3', '/etc/libvirt-gpu/libvirt-gpu.conf'),      # relative
    ('/usr/bin/python3', 'etc/libvirt-gpu.conf'),          # relative
    ('/opt/my venv/bin/python', '/etc/libvirt-gpu.conf'),  # a space
    ('/usr/bin/python3', '/etc/libvirt-gpu\x00.conf'),     # a NUL
])
def test_a_hook_path_must_be_absolute_and_without_spaces(python, config):
    with pytest.raises(exception.InvalidInput,
                       match='must be an absolute path without spaces'):
        installer.render_hook(HOOK_SOURCE, python, config,
                              '/var/lib/libvirt-gpu/hook-settings.json', [])


def test_a_hook_with_good_paths_is_rendered():
    text = installer.render_hook(
        HOOK_SOURCE, '/usr/bin/python3', '/etc/libvirt-gpu.conf',
        '/var/lib/libvirt-gpu/hook-settings.json', ['/opt/lib'])
    assert text.splitlines()[0] == '#!/usr/bin/python3 -IS'
    assert "CONFIG_FILE = '/etc/libvirt-gpu.conf'" in text
    assert "IMPORT_PATH = ['/opt/lib']" in text
