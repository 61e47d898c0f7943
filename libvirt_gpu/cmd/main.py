"""``libvirt-gpu``: the admin CLI that sits next to virsh.

Every command that reads the host takes the global source options:
``-c/--connect URI`` (libvirt only), ``--sysfs-root DIR`` (sysfs only), or
neither (libvirt at [libvirt]/connection_uri, falling back to sysfs at
[DEFAULT]/sysfs_root).  ``--json`` prints a document for scripts; otherwise a
table for people.  Errors go to stderr, exit status 1 (2 for usage).  What
is printed is built and written by ``cmd.output``.

This module holds the edge (``main``, ``run``) and the top-level parser;
the commands live in one module per group (``COMMANDS``), each with its
parsers, and run with a ``cmd.context.Context``.

A command imports what it needs when it runs: ``list`` on a large host is
over in a fraction of the time of importing everything (see
``bench/discovery.py``); the parser imports only the group of the command
it builds.
"""

import argparse
import os
import sys

import libvirt_gpu
from libvirt_gpu import conffile
from libvirt_gpu import exception
from libvirt_gpu.util import logs
from libvirt_gpu.cmd import context
from libvirt_gpu.cmd import output
from libvirt_gpu.cmd import term

PROG = 'libvirt-gpu'

EPILOG = """
examples:
  libvirt-gpu list                          GPUs, their mode and vGPU capacity
  libvirt-gpu types 0000:af:00.0            vGPU types one GPU offers
  libvirt-gpu placement show --json         the Placement provider tree
  libvirt-gpu nova-config                   Nova's [pci] lines for carved VFs
  libvirt-gpu simulate t4 /tmp/sim          write a simulated T4 host
  libvirt-gpu --sysfs-root /tmp/sim list    read it back
  libvirt-gpu layout plan                   steps to the configured layouts

configuration: /etc/libvirt-gpu/libvirt-gpu.conf, or the file named by
$LIBVIRT_GPU_CONFIG, or --config-file.
"""


# Every COMMAND, in the order --help lists them, with the module under
# libvirt_gpu.cmd that defines it (its ``PARSERS[COMMAND](sub, add)`` adds
# the command's parser).  A group is imported only when a parser of it is
# built.
COMMANDS = (
    ('list', 'host_cmds'),
    ('types', 'host_cmds'),
    ('discover', 'host_cmds'),
    ('placement', 'openstack_cmds'),
    ('agent', 'openstack_cmds'),
    ('nova-config', 'nova_cmds'),
    ('simulate', 'host_cmds'),
    ('attach', 'guest_cmds'),
    ('detach', 'guest_cmds'),
    ('domgpus', 'guest_cmds'),
    ('hook', 'service_cmds'),
    ('reconcile', 'recovery_cmds'),
    ('migrate', 'guest_cmds'),
    ('restore', 'recovery_cmds'),
    ('layout', 'layout_cmds'),
    ('exporter', 'service_cmds'),
)

# The options before COMMAND that take a value (``_command_word``).
_GLOBAL_VALUE_OPTIONS = ('-c', '--connect', '--sysfs-root', '--config-file',
                         '--hostname')


def _columns():
    """The terminal's width as ``shutil.get_terminal_size`` tells it
    (``$COLUMNS``, else the terminal of stdout, else 80), without importing
    ``shutil`` (and the compression modules it loads), which argparse's
    formatters do for every option added."""
    try:
        columns = int(os.environ.get('COLUMNS', ''))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


class _Width(object):
    """A help formatter whose default width is ``_columns() - 2``, as
    argparse's own."""

    def __init__(self, prog, indent_increment=2, max_help_position=24,
                 width=None):
        super().__init__(prog, indent_increment, max_help_position,
                         _columns() - 2 if width is None else width)


class _HelpFormatter(_Width, argparse.HelpFormatter):
    pass


class _RawDescriptionHelpFormatter(_Width,
                                   argparse.RawDescriptionHelpFormatter):
    pass


class _Commands(object):
    """The subparsers action, recording the name of every command in
    ``names`` (those whose parser this call does not build too)."""

    def __init__(self, action):
        self.action = action
        self.names = []

    def add_parser(self, name, **kwargs):
        self.names.append(name)
        kwargs.setdefault('formatter_class', _HelpFormatter)
        return self.action.add_parser(name, **kwargs)


def group(module):
    """The command group module ``module`` of ``COMMANDS``, imported."""
    name = 'libvirt_gpu.cmd.' + module
    __import__(name)
    return sys.modules[name]


def _command_word(argv):
    """The COMMAND of ``argv`` when it is plain to see (only the global
    options, spelled out, before it), else None."""
    words = iter(argv)
    for word in words:
        if word in _GLOBAL_VALUE_OPTIONS:
            next(words, None)
        elif word == '--debug' or (word.startswith('--') and word.split(
                '=', 1)[0] in _GLOBAL_VALUE_OPTIONS):
            continue
        else:
            return None if word.startswith('-') else word
    return None


def build_parser(only=None):
    """The whole parser, or (``only``: a command name) one holding only
    that command; with an unknown name, the whole parser."""
    if only is not None and only not in dict(COMMANDS):
        only = None
    return _build_parser(only)


def _build_parser(only):
    parser = argparse.ArgumentParser(
        prog=PROG, description='Hand NVIDIA GPUs and vGPUs to libvirt/KVM '
        'guests and report them the way OpenStack Placement expects.',
        epilog=EPILOG, formatter_class=_RawDescriptionHelpFormatter)
    parser.add_argument('--version', action='version',
                        version='%(prog)s ' + libvirt_gpu.__version__,
                        help="print libvirt-gpu's version and exit")
    parser.add_argument('-c', '--connect', metavar='URI',
                        help='discover through libvirt at URI only '
                             '(default: [libvirt]/connection_uri, with '
                             'sysfs as fallback)')
    parser.add_argument('--sysfs-root', metavar='DIR',
                        help='discover by reading sysfs at DIR only '
                             '(default: [DEFAULT]/sysfs_root = /sys)')
    parser.add_argument('--config-file', metavar='FILE',
                        help='configuration file (default: '
                             '$LIBVIRT_GPU_CONFIG or %s)'
                             % conffile.DEFAULT_CONFIG_FILE)
    parser.add_argument('--hostname', help='host name used in Placement '
                        '(default: [DEFAULT]/host)')
    parser.add_argument('--debug', action='store_true',
                        help='log debug messages and show tracebacks')
    action = parser.add_subparsers(dest='command', metavar='COMMAND')
    action.required = True
    sub = _Commands(action)
    parser.command_names = sub.names

    def add(name, func, help_text, **kwargs):
        p = sub.add_parser(name, help=help_text, description=help_text,
                           **kwargs)
        p.add_argument('--json', action='store_true',
                       help='print JSON for scripts')
        p.set_defaults(func=func)
        return p

    # argparse builds every parser eagerly (gettext look-ups, a help
    # formatter per option): with ``only``, the others are just named
    for name, module in COMMANDS:
        if only is None or name == only:
            group(module).PARSERS[name](sub, add)
        else:
            sub.names.append(name)
    return parser


@term.escaped_output()
def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(only=_command_word(argv))
    args = parser.parse_args(argv)
    # logging is loaded when something logs (a plain ``list`` need not
    # pay its import), with --debug at once
    logs.configure(level='DEBUG' if args.debug else 'WARNING',
                   format='%(levelname)s: %(message)s')
    if args.debug:
        logs.load()
    try:
        ctx = context.Context(args)
        return args.func(ctx)
    except exception.LibvirtGpuError as e:
        output.emit_error(PROG, e)
        if args.debug:
            raise
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `libvirt-gpu list | head`: the reader left; not an error.
        sys.stderr.close()
        return 0
    except OSError as e:
        # A path the operator named that cannot be used (a file where a
        # directory belongs, no permission): one line, not a traceback.
        output.emit_error(PROG, output.os_error_text(e))
        if args.debug:
            raise
        return 1
    except Exception as e:  # noqa: BLE001 - the CLI's edge: one line
        output.emit_internal_error(PROG, e)
        if args.debug:
            raise
        return 1


def run():
    """The ``libvirt-gpu`` console script: ``main`` as the whole life of a
    process.  The interpreter's last act would be a collector pass over
    every object the command made (a great many after ``list`` on a large
    host) to find cycles that exit frees anyway, so the survivors
    are frozen (``gc.freeze``: the collector leaves them alone) first.
    Not done by ``main``, which tests and the agent call in a process that
    goes on."""
    code = main()
    import gc
    gc.freeze()
    return code


if __name__ == '__main__':
    sys.exit(run())
