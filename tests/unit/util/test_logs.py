"""logs: loggers that load ``logging`` only when something is logged, with
the CLI's configuration applied at that moment."""

import subprocess
import sys

PROGRAM = r'''
import sys
from libvirt_gpu.util import logs
LOG = logs.getLogger('libvirt_gpu.example')
logs.configure(level='WARNING', format='%(levelname)s: %(message)s')
print('loaded before use:', 'logging' in sys.modules)
LOG.info('not shown')
print('loaded after use:', 'logging' in sys.modules)
LOG.warning('shown %d', 7)
import logging
print('same logger:', LOG.name == 'libvirt_gpu.example',
      logging.getLogger('libvirt_gpu.example').level)
'''


def run(program):
    return subprocess.run([sys.executable, '-c', program],
                          capture_output=True, text=True, check=True)


def test_logging_loaded_on_first_use_and_configured_then():
    done = run(PROGRAM)
    assert done.stdout.splitlines()[:2] == [
        'loaded before use: False', 'loaded after use: True']
    assert done.stderr == 'WARNING: shown 7\n'


def test_configure_applies_at_once_when_logging_is_loaded():
    done = run('import logging, sys\n'
               'from libvirt_gpu.util import logs\n'
               "logs.configure(level='ERROR', format='[%(message)s]')\n"
               "logging.getLogger('x').error('now')\n"
               "logging.getLogger('x').warning('below the level')\n")
    assert done.stderr == '[now]\n'
