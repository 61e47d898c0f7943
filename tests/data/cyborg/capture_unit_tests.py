"""Fill in ``reported`` of ``cyborg-unit-tests.json``: what Cyborg's own
NVIDIA driver returns under the mocks of Cyborg's unit tests for it
(``cyborg/tests/unit/accelerator/drivers/gpu/test_utils.py``,
``test_discover_gpus_report_pGPU`` and ``_vGPU``), every field.

Run with Cyborg's virtualenv (``make cyborg-venv``)::

    .venv-cyborg/bin/python tests/data/cyborg/capture_unit_tests.py

Each case runs in a process of its own (Cyborg's configuration is global).
"""

import json
import os
import subprocess
import sys
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, 'cyborg-unit-tests.json')


def plain(obj):
    """A Cyborg object as its set fields, nested."""
    if isinstance(obj, list):
        return [plain(o) for o in obj]
    if hasattr(obj, 'obj_fields'):
        return {k: plain(getattr(obj, k)) for k in obj.obj_fields
                if obj.obj_attr_is_set(k)}
    return obj


def multi_mock_open(*contents):
    # as Cyborg's test: each open() reads the next of ``contents``
    files = [mock.mock_open(read_data=c).return_value for c in contents]
    opener = mock.mock_open()
    opener.side_effect = files
    return opener


def run_case(case):
    import cyborg.conf
    from cyborg.conf import CONF
    from cyborg.accelerator.drivers.gpu.nvidia.driver import NVIDIAGPUDriver

    CONF([], project='cyborg')
    CONF.set_override('host', case['host'])
    patches = [mock.patch('cyborg.accelerator.common.utils.lspci_privileged',
                          return_value=case['lspci'])]
    if case['enabled']:
        CONF.set_override('enabled_vgpu_types', list(case['enabled']),
                          group='gpu_devices')
        cyborg.conf.devices.register_dynamic_opts(CONF)
        for type_id, addresses in case['enabled'].items():
            CONF.set_override('device_addresses', addresses,
                              group='vgpu_%s' % type_id)
        sysfs = case['sysfs']
        patches += [
            mock.patch('os.path.exists', return_value=True),
            mock.patch('os.listdir',
                       return_value=sysfs['mdev_supported_types']),
            mock.patch('builtins.open', multi_mock_open(
                sysfs['name'], str(sysfs['available_instances'])))]
    for p in patches:
        p.start()
    try:
        return plain(NVIDIAGPUDriver().discover())
    finally:
        for p in reversed(patches):
            p.stop()


def main():
    if len(sys.argv) == 2:
        with open(DATA) as f:
            case = json.load(f)['cases'][sys.argv[1]]
        json.dump(run_case(case), sys.stdout)
        return
    with open(DATA) as f:
        doc = json.load(f)
    for name in doc['cases']:
        out = subprocess.run(
            [sys.executable, __file__, name], check=True, text=True,
            capture_output=True,
            env=dict(os.environ, PYTHONWARNINGS='ignore')).stdout
        doc['cases'][name]['reported'] = json.loads(out)
    with open(DATA, 'w') as f:
        json.dump(doc, f, indent=1)
        f.write('\n')


if __name__ == '__main__':
    main()
