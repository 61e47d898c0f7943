import os
import subprocess
import sys
from tests.doubles import paths

ROOT = paths.ROOT
SAMPLE = os.path.join(ROOT, 'etc', 'libvirt-gpu', 'libvirt-gpu.conf.sample')


def test_sample_config_is_up_to_date(tmp_path):
    out = tmp_path / 'sample.conf'
    generator = os.path.join(os.path.dirname(sys.executable),
                             'oslo-config-generator')
    subprocess.run([generator, '--namespace', 'libvirt_gpu', '--wrap-width',
                    '79', '--output-file', str(out)], check=True, cwd=ROOT)
    with open(SAMPLE) as f:
        committed = f.read()
    assert out.read_text() == committed, (
        'etc/libvirt-gpu/libvirt-gpu.conf.sample is out of date: run '
        '`tox -e genconfig` (or `make genconfig`) and commit the result')


def test_sample_config_has_per_type_group():
    with open(SAMPLE) as f:
        text = f.read()
    assert '[vgpu_nvidia-223]' in text
    assert '#device_addresses =' in text
    assert '#enabled_vgpu_types =' in text


def test_every_group_of_ours_comes_with_its_help():
    """Each module lists its OptGroup (not only its name), so the sample
    explains every section above its options."""
    from libvirt_gpu.conf import MODULES
    with open(SAMPLE) as f:
        text = ' '.join(f.read().replace('#', ' ').split())
    missing = []
    for module in MODULES:
        for group in module.list_opts():
            if group == 'DEFAULT':
                continue
            if isinstance(group, str) or not group.help:
                missing.append('%s lists %r without its help'
                               % (module.__name__, group))
            elif ' '.join(group.help.split()) not in text:
                missing.append('[%s] help not in the sample' % group.name)
    assert missing == []
