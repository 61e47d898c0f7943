"""What `make lint`'s mypy run promises (docs/dev/types.md): the modules
whose types are the design are checked strictly, and their annotations cost
the hook nothing at run time."""

import configparser
import fnmatch
import os
import subprocess
import sys

from tests.doubles import architecture
from tests.doubles.paths import ROOT

# The layers issue 40 named: records, the libvirt layer, the host's state,
# the device kinds and the qemu hook.
MUST_BE_STRICT = ('libvirt_gpu.objects', 'libvirt_gpu.virt.*',
                  'libvirt_gpu.store.*', 'libvirt_gpu.devices.backends.*',
                  'libvirt_gpu.guests.hook.*')


def _strict_patterns():
    parser = configparser.ConfigParser()
    parser.read(os.path.join(ROOT, 'setup.cfg'))
    found = []
    for section in parser.sections():
        if (section.startswith('mypy-')
                and parser[section].getboolean('disallow_untyped_defs',
                                               False)):
            found.extend(section[len('mypy-'):].split(','))
    return found


def _modules():
    return sorted(architecture.our_modules())


def _strict(module, patterns):
    return any(fnmatch.fnmatchcase(module, p) or module == p.rstrip('.*')
               for p in patterns)


def test_the_design_layers_are_strict():
    patterns = _strict_patterns()
    assert set(MUST_BE_STRICT) <= set(patterns), (
        'setup.cfg checks these strictly: %s' % patterns)


def test_every_strict_pattern_names_modules():
    modules = list(_modules())
    for pattern in _strict_patterns():
        assert any(_strict(m, [pattern]) for m in modules), pattern


def test_strict_modules_do_not_evaluate_annotations():
    patterns = _strict_patterns()
    for module in _modules():
        if not _strict(module, patterns):
            continue
        path = os.path.join(ROOT, *module.split('.'))
        path = (path + '.py' if os.path.exists(path + '.py')
                else os.path.join(path, '__init__.py'))
        with open(path) as f:
            text = f.read()
        if ') -> ' in text:
            assert 'from __future__ import annotations' in text, module


def test_type_checking_blocks_import_nothing_at_run_time():
    # the hook's modules: typing stays out of the process
    code = ('import sys; import libvirt_gpu.guests.hook.operations, '
            'libvirt_gpu.virt.metadata, libvirt_gpu.virt.config_xml, '
            'libvirt_gpu.objects; print("typing" in sys.modules)')
    out = subprocess.run([sys.executable, '-I', '-c', code], check=True,
                         capture_output=True, text=True, cwd=ROOT).stdout
    assert out.strip() == 'False'
