"""The CLI builds only the parser of the command it runs (argparse builds
every parser eagerly, a cost on each call); what it accepts and prints must
be exactly what the whole parser would."""

import os
import subprocess
import sys

import pytest

from libvirt_gpu.cmd import main as cli_main
from tests.doubles import paths

ROOT = paths.ROOT


def _commands(parser):
    return parser._subparsers._group_actions[0].choices


FULL = cli_main.build_parser()
NAMES = sorted(_commands(FULL))


def test_every_command_is_known_to_the_full_parser():
    assert FULL.command_names == list(_commands(FULL))
    assert {'list', 'types', 'placement', 'hook', 'restore'} <= set(NAMES)


@pytest.mark.parametrize('name', NAMES)
def test_one_command_parser_equals_the_full_ones(name):
    lazy = cli_main.build_parser(only=name)
    assert list(_commands(lazy)) == [name]
    assert lazy.command_names == FULL.command_names
    assert (_commands(lazy)[name].format_help()
            == _commands(FULL)[name].format_help())


@pytest.mark.parametrize('argv, word', [
    (['list'], 'list'),
    (['--sysfs-root', '/x', '--debug', 'list', '--json'], 'list'),
    (['--config-file=/x', '-c', 'test:///default', 'types'], 'types'),
    (['--hostname', 'list', 'types'], 'types'),   # a value, not COMMAND
    # anything unusual before COMMAND: let the whole parser judge it
    (['--host', 'list', 'types'], None),          # an abbreviation
    (['-ctest:///default', 'list'], None),
    (['-h'], None),
    ([], None),
])
def test_command_word(argv, word):
    assert cli_main._command_word(argv) == word


def test_unknown_command_gets_the_whole_parsers_answer():
    assert cli_main.build_parser(only='lits').command_names == \
        FULL.command_names
    assert len(_commands(cli_main.build_parser(only='lits'))) == len(NAMES)
    done = subprocess.run([sys.executable, '-m', 'libvirt_gpu.cmd.main',
                           'lits'], capture_output=True, text=True)
    assert done.returncode == 2
    assert "invalid choice: 'lits'" in done.stderr
    assert 'placement' in done.stderr      # every command offered


@pytest.mark.parametrize('columns', ['50', '120', '', 'junk'])
def test_help_wraps_as_argparse_would(monkeypatch, columns):
    """The formatters skip importing shutil; their width is argparse's."""
    import argparse
    monkeypatch.setenv('COLUMNS', columns)

    def parser(formatter):
        p = argparse.ArgumentParser(prog='x', formatter_class=formatter,
                                    description='word ' * 40)
        p.add_argument('--flag', help='a long help text ' * 8)
        return p.format_help()
    assert parser(cli_main._HelpFormatter) == parser(argparse.HelpFormatter)
    assert (parser(cli_main._RawDescriptionHelpFormatter)
            == parser(argparse.RawDescriptionHelpFormatter))


def test_console_script_runs_main_then_freezes_the_survivors(tmp_path):
    """setup.py's console script is cmd.main.run: main's exit status, and
    the collector told to leave the survivors alone before exit."""
    with open(os.path.join(ROOT, 'setup.py')) as f:
        assert "'libvirt-gpu = libvirt_gpu.cmd.main:run'" in f.read()
    code = ('import gc, sys\n'
            'from libvirt_gpu.cmd import main\n'
            'assert gc.get_freeze_count() == 0\n'
            "sys.argv = ['libvirt-gpu', 'simulate', '--list']\n"
            'status = main.run()\n'
            "print('status', status, 'frozen', gc.get_freeze_count() > 0)\n")
    done = subprocess.run([sys.executable, '-c', code], capture_output=True,
                          text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == 'status 0 frozen True'
    assert 't4' in done.stdout
