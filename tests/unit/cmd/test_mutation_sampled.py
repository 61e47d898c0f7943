"""Behaviours a random sample of ``make mutation`` over the round's
modules found unguarded, in modules whose own tests run the program
as another process (which never runs a mutant): each pinned here in
the test's own process."""

import io
import os

import pytest

from libvirt_gpu.cmd import main as main_mod
from libvirt_gpu.cmd import nova_cmds
from libvirt_gpu.cmd import output
from libvirt_gpu import exception
from libvirt_gpu.guests.hook import installer
from libvirt_gpu.guests.hook import log as log_mod


# --- cmd.output --------------------------------------------------------------

def test_mib_divides_by_two_to_the_twentieth():
    assert output._mib(0) == '0.0 MiB'
    assert output._mib(1048576) == '1.0 MiB'
    assert output._mib(1 << 40) == '1048576.0 MiB'


@pytest.mark.parametrize('stats, text', [
    ({}, 'migrating: preparing the destination'),
    ({'data_total': 0, 'data_processed': 0, 'data_remaining': 0},
     'migrating: preparing the destination'),
    # libvirt gave no total yet but has copied: progress, not "preparing"
    ({'data_processed': 1048576, 'data_remaining': 3145728},
     'migrating:  25%  1.0 MiB processed, 3.0 MiB remaining'),
    ({'data_total': 4194304, 'data_processed': 0,
      'data_remaining': 4194304},
     'migrating:   0%  0.0 MiB processed, 4.0 MiB remaining'),
    ({'data_total': 4194304, 'data_processed': 4194304,
      'data_remaining': 0},
     'migrating: 100%  4.0 MiB processed, 0.0 MiB remaining'),
])
def test_migration_progress(stats, text):
    assert output.migration_progress_text(stats) == text


# --- cmd.main ----------------------------------------------------------------

@pytest.mark.parametrize('value', ['0', '-3', 'wide', ''])
def test_columns_not_a_positive_count_fall_back(monkeypatch, value):
    monkeypatch.setenv('COLUMNS', value)
    monkeypatch.setattr(os, 'get_terminal_size',
                        lambda fd: os.terminal_size((132, 40)))
    assert main_mod._columns() == 132


def test_columns_from_the_environment_win(monkeypatch):
    monkeypatch.setenv('COLUMNS', '1')
    monkeypatch.setattr(os, 'get_terminal_size',
                        lambda fd: os.terminal_size((132, 40)))
    assert main_mod._columns() == 1


# --- cmd.nova_cmds: the INI reading of nova.conf -----------------------------

def test_a_line_that_is_no_assignment_does_not_end_the_reading():
    text = ('[pci]\n'
            'just words\n'
            'alias = {"name": "a"}\n'
            '  continued\n'
            '# a comment\n'
            '[filter_scheduler]\n'
            'enabled_filters: PciPassthroughFilter\n')
    assert list(nova_cmds._assignments(text)) == [
        ('pci', 'alias', '{"name": "a"}\ncontinued', 3),
        ('filter_scheduler', 'enabled_filters', 'PciPassthroughFilter', 7)]


# --- guests.hook.log ---------------------------------------------------------

def test_the_log_head_is_the_domain_the_operation_and_its_phase():
    hook = log_mod.HookLog(['/etc/libvirt/hooks/qemu', 'guest-1', 'prepare',
                            'begin', '-', 'extra'], io.StringIO())
    assert hook.head == 'guest-1 prepare begin'
    hook = log_mod.HookLog(['qemu', 'g' * 100, 'release'], io.StringIO())
    assert hook.head == 'g' * 80 + ' release'


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
