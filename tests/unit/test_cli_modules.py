"""The CLI's modules: only ``cmd/output.py`` writes to stdout or stderr."""

import ast
import os

CMD = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), 'libvirt_gpu', 'cmd')

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
