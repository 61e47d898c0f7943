"""The CLI's modules: one per command group, each naming its commands in
``PARSERS``, and only ``cmd/output.py`` writes to stdout or stderr."""

import ast
import os

import pytest

from libvirt_gpu.cmd import main as cli_main
from tests.doubles import paths

CMD = os.path.join(paths.ROOT, 'libvirt_gpu', 'cmd')

# The one module that writes what the CLI prints.
WRITER = 'output.py'
STREAMS = ('stdout', 'stderr', '__stdout__', '__stderr__')
WRITES = ('write', 'writelines', 'flush')


def _writes(source):
    """(line, what) of each place in ``source`` that prints or writes to
    the process's stdout/stderr itself."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module == 'sys':
            found += [(node.lineno, 'from sys import %s' % a.name)
                      for a in node.names if a.name in STREAMS]
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id == 'print':
            found.append((node.lineno, 'print()'))
        elif (isinstance(func, ast.Attribute) and func.attr in WRITES
              and isinstance(func.value, ast.Attribute)
              and func.value.attr in STREAMS
              and isinstance(func.value.value, ast.Name)
              and func.value.value.id == 'sys'):
            found.append((node.lineno, 'sys.%s.%s()' % (func.value.attr,
                                                        func.attr)))
    return found


def test_only_output_writes_to_the_terminal():
    offenders = []
    for name in sorted(os.listdir(CMD)):
        if not name.endswith('.py') or name == WRITER:
            continue
        with open(os.path.join(CMD, name)) as f:
            offenders += ['cmd/%s:%d: %s' % (name, line, what)
                          for line, what in _writes(f.read())]
    assert offenders == [], (
        'these write to stdout/stderr themselves; hand the text to a '
        'function of cmd/output.py instead:\n' + '\n'.join(offenders))


def test_the_check_sees_every_way_of_writing():
    probe = '''
import sys
from sys import stderr
print('x')
sys.stdout.write('x')
sys.stderr.write('\\r' + 'x')
sys.stderr.flush()
sys.__stdout__.writelines(['x'])
sys.stderr.close()            # not a write
stream.write('x')             # a stream handed in: output's business
'''
    assert _writes(probe) == [
        (3, 'from sys import stderr'), (4, 'print()'),
        (5, 'sys.stdout.write()'), (6, 'sys.stderr.write()'),
        (7, 'sys.stderr.flush()'), (8, 'sys.__stdout__.writelines()')]


def _groups():
    return sorted(set(module for _, module in cli_main.COMMANDS))


@pytest.mark.parametrize('module', _groups())
def test_each_group_names_its_commands_in_the_table(module):
    """A command a group adds but ``COMMANDS`` lacks would never be
    built; one the table gives the wrong group would fail to build."""
    table = sorted(name for name, group in cli_main.COMMANDS
                   if group == module)
    assert sorted(cli_main.group(module).PARSERS) == table


def test_every_command_module_is_a_group_of_the_table():
    """A module named ``*_cmds.py`` that the table does not name holds
    commands no parser offers."""
    on_disk = sorted(name[:-3] for name in os.listdir(CMD)
                     if name.endswith('_cmds.py'))
    assert on_disk == _groups()


def test_a_command_runs_with_only_its_group_imported():
    import subprocess
    import sys
    code = ('import sys\n'
            'from libvirt_gpu.cmd import main\n'
            'main.build_parser(only="list")\n'
            'print(sorted(m for m in sys.modules\n'
            '             if m.endswith("_cmds")))\n')
    done = subprocess.run([sys.executable, '-c', code], capture_output=True,
                          text=True, check=True)
    assert done.stdout.strip() == "['libvirt_gpu.cmd.host_cmds']"


# --- the writers that main.py and demo.py once wrote inline ------------------

def test_progress_is_one_line_written_over(capsys):
    from libvirt_gpu.cmd import output
    output.emit_progress('migrating: 12%')
    output.emit_progress('migrating: 50%')
    output.end_progress()
    assert capsys.readouterr() == ('', '\rmigrating: 12%\rmigrating: 50%\n')


def test_removal_plan_goes_where_the_notes_go(capsys):
    from libvirt_gpu import objects
    from libvirt_gpu.cmd import output
    from libvirt_gpu.guests import reconcile
    plan = [reconcile.Finding(reconcile.WOULD_REMOVE, 'mdev', 'u-1', 'gone',
                              parent=objects.PciAddress.parse(
                                  '0000:af:00.0')),
            reconcile.Finding(reconcile.WOULD_REMOVE, 'lease', 'u-2', 'idle')]
    lines = ('will remove mdev u-1 on 0000:af:00.0: gone\n'
             'will remove lease u-2: idle\n')
    output.emit_removal_plan(plan)
    assert capsys.readouterr() == (lines, '')
    output.emit_removal_plan(plan, as_json=True)
    assert capsys.readouterr() == ('', lines)


def test_the_edge_and_exporter_lines(capsys):
    import errno
    from libvirt_gpu.cmd import output
    output.emit_exposition('# HELP x\nx 1\n')
    output.emit_internal_error('libvirt-gpu', KeyError('k'))
    output.emit_error('libvirt-gpu', output.os_error_text(
        PermissionError(errno.EACCES, 'Permission denied', '/etc/x')))
    assert capsys.readouterr() == (
        '# HELP x\nx 1\n',
        "libvirt-gpu: internal error: KeyError: 'k' (run with --debug for "
        'the traceback)\n'
        'libvirt-gpu: error: /etc/x: Permission denied (run as a user '
        'allowed to write there, e.g. root)\n')


def test_progress_moves_the_cursor_back_through_escaping_streams(capsys):
    # The CLI's stderr escapes control characters: the carriage return
    # must still reach the terminal as one, the text stays escaped.
    from libvirt_gpu.cmd import output
    from libvirt_gpu.cmd import term
    with term.escaped_output():
        output.emit_progress('migrating: 12%\x1b[2J')
        output.emit_progress('migrating: 50%')
        output.end_progress()
    assert capsys.readouterr().err == (
        '\rmigrating: 12%\\x1b[2J\rmigrating: 50%\n')
