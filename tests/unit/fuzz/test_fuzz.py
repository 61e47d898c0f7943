"""Property-based fuzzing (hypothesis): domain XML and sysfs trees made
for each example, and for each, in a child process judged by a timeout
(not a speed limit: a hang, as an unbounded parse, never ends):

- no traceback and the child exits 0 (every error is a message);
- ``release`` and ``reconnect`` exit 0 whatever the input (libvirt kills
  a guest whose ``reconnect`` fails), ``prepare`` 0 or 1;
- ``list`` and ``placement show`` exit 0 or 1;
- nothing outside the sysfs root (and the state directory) is written:
  a directory beside the root, which planted links point into, is
  unchanged.

The example count is modest (``MAX_EXAMPLES``, about 0.5 s each on a
2-core machine) and the search derandomized, so ``make test`` sees the
same examples every run; ``FUZZ_EXAMPLES=500`` searches further.
"""

import json
import os
import subprocess
import sys
import tempfile
import uuid as uuidlib

from hypothesis import configuration
from hypothesis import given
from hypothesis import HealthCheck
from hypothesis import settings
from hypothesis import strategies as st

from tests.doubles import hostile
from tests.doubles import trees
from tests.doubles import paths

# hypothesis keeps a cache of the constants it finds in our source; never
# in the repository (tests/unit/project/test_architecture.py reads every file).
configuration.set_hypothesis_home_dir(os.path.join(
    tempfile.gettempdir(), 'libvirt-gpu-hypothesis-%d' % os.getuid()))

ROOT = paths.ROOT
MAX_EXAMPLES = int(os.environ.get('FUZZ_EXAMPLES', '25'))
TIMEOUT = 120          # seconds a child may take before it counts as hung
A = '0000:3b:00.0'
B = '0000:af:00.0'
GPU_ATTRS = ('numa_node', 'local_cpulist', 'class', 'vendor', 'device',
             'iommu_group', 'driver', 'sriov_totalvfs')
TYPE_ATTRS = ('available_instances', 'name', 'description', 'device_api',
              'create')

# --- the sysfs tree ----------------------------------------------------------

numbers = st.one_of(
    st.integers(-2, 2 ** 70).map(str),
    st.sampled_from(['', ' ', '-1', '0x10', '1e9', '9' * 40, '٣', '0-7',
                     ','.join(['0-65535'] * 2000)]))
payloads = st.one_of(numbers, st.text(max_size=80),
                     st.binary(max_size=80).map(
                         lambda b: b.decode('latin-1')))
kinds = st.sampled_from(['text', 'text', 'text', 'fifo', 'link_outside',
                         'link_loop', 'dir', 'missing'])


@st.composite
def mutations(draw):
    gpu = draw(st.sampled_from([A, B]))
    where = draw(st.sampled_from(['gpu', 'type', 'mdev', 'pci_entry']))
    if where == 'gpu':
        path = ('bus', 'pci', 'devices', gpu, draw(st.sampled_from(
            GPU_ATTRS)))
    elif where == 'type':
        path = ('bus', 'pci', 'devices', gpu, 'mdev_supported_types',
                draw(st.sampled_from(['nvidia-222', 'nvidia-223',
                                      'nvidia-224'])),
                draw(st.sampled_from(TYPE_ATTRS)))
    elif where == 'mdev':
        path = ('bus', 'mdev', 'devices', draw(st.sampled_from(
            [str(uuidlib.UUID(int=draw(st.integers(0, 2 ** 128 - 1)))),
             'not-a-uuid'])))
    else:
        path = ('bus', 'pci', 'devices', draw(st.sampled_from(
            [gpu.upper(), '0000:ff:1f.7', '..', 'x'])))
    return path, draw(kinds), draw(payloads)


def _plant(root, outside, path, kind, payload):
    """Apply one mutation; a path the tree lacks is made where it can."""
    target = os.path.join(root, *path)
    parent = os.path.dirname(target)
    if not os.path.isdir(parent) or os.path.basename(target) in ('..',):
        return
    if os.path.lexists(target):
        if os.path.isdir(target) and not os.path.islink(target):
            if kind == 'text':
                return           # a device directory: keep it
            os.rename(target, target + '.aside')
        else:
            os.unlink(target)
    if kind == 'text':
        with open(target, 'w', encoding='utf-8',
                  errors='surrogateescape') as f:
            f.write(payload)
    elif kind == 'fifo':
        os.mkfifo(target)
    elif kind == 'link_outside':
        os.symlink(os.path.join(outside, os.path.basename(target)), target)
    elif kind == 'link_loop':
        os.symlink(os.path.basename(target), target)
    elif kind == 'dir':
        os.mkdir(target)
    # 'missing': removed above


# --- the domain XML ----------------------------------------------------------

uuids = st.one_of(st.uuids().map(str), st.sampled_from(
    ['../../x', 'A' * 40, '', '4b20d080-1b54-4048-85b3-a6a62d165c01\n']))
type_ids = st.one_of(st.sampled_from(['nvidia-223', 'nvidia-224',
                                      'nvidia-999', '../../x', 'a b']),
                     st.text(max_size=12))
parents = st.one_of(st.none(), st.sampled_from(
    [A, B, B.upper(), '0000:00:00.0', '../..']))
cpusets = st.one_of(
    st.none(), st.text(alphabet='0123456789-,^ ', max_size=40),
    st.integers(1, 60000).map(lambda n: ','.join(['0-65535'] * n)),
    st.sampled_from(['0-99999999999999999999', '^0', '7-3']))
encodings = st.one_of(st.none(), st.sampled_from(
    ['utf-8', 'UTF-16', 'x-no-such', 'utf-7', 'latin-1', 'ascii',
     'utf-32']))


@st.composite
def domains(draw):
    vgpus = draw(st.lists(st.tuples(uuids, type_ids, parents), max_size=3))
    xml = _domain_xml(vgpus)
    cpuset = draw(cpusets)
    nodeset = draw(cpusets)
    extra = ''
    if cpuset is not None:
        extra += "<vcpu cpuset='%s'>2</vcpu>" % cpuset
    if nodeset is not None:
        extra += "<numatune><memory nodeset='%s'/></numatune>" % nodeset
    xml = xml.replace(b'<devices>', extra.encode() + b'<devices>')
    encoding = draw(encodings)
    if encoding is not None:
        xml = (b'<?xml version="1.0" encoding="%s"?>\n' % encoding.encode()
               + xml)
    if draw(st.booleans()):
        junk = draw(st.binary(max_size=16))
        cut = draw(st.integers(0, len(xml)))
        xml = xml[:cut] + junk + xml[cut:]
    if draw(st.integers(0, 9)) == 0:
        xml = draw(st.sampled_from(sorted(
            hostile.inputs(str(uuidlib.uuid4())).values())))
    return xml


def _domain_xml(vgpus):
    """As tests/unit/guests/hook/test_hook.domain_xml, values written as
    given."""
    entries = ''.join(
        '<gpu:vgpu uuid="%s" type="%s"%s/>' % (
            _attr(u), _attr(t), ' parent="%s"' % _attr(p) if p else '')
        for u, t, p in vgpus)
    devices = ''.join(
        "<hostdev mode='subsystem' type='mdev' managed='no' "
        "model='vfio-pci'><source><address uuid='%s'/></source></hostdev>"
        % _attr(u) for u, _, _ in vgpus)
    return ("<domain type='kvm'><name>fuzz</name><uuid>%s</uuid>"
            "<metadata><gpu:gpus xmlns:gpu='urn:libvirt-gpu:1'>%s"
            "</gpu:gpus></metadata><devices>%s</devices></domain>"
            % (uuidlib.uuid4(), entries, devices)).encode(
                'utf-8', 'surrogateescape')


def _attr(value):
    return (value.replace('&', '&amp;').replace('"', '&quot;')
            .replace("'", '&apos;').replace('<', '&lt;'))


# --- the property ------------------------------------------------------------

@settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True,
          database=None,
          suppress_health_check=[HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(xml=domains(), planted=st.lists(mutations(), max_size=4))
def test_hook_and_discovery_on_fuzzed_input(xml, planted):
    with trees.simulated_tree('t4') as (root, profile), \
            tempfile.TemporaryDirectory(prefix='libvirt-gpu-fuzz-') as top:
        outside = os.path.join(top, 'outside')
        os.mkdir(outside)
        for name in ('create', 'remove', 'available_instances',
                     'local_cpulist', 'numa_node', 'class'):
            with open(os.path.join(outside, name), 'w') as f:
                f.write('untouched\n')
        for path, kind, payload in planted:
            _plant(root, outside, path, kind, payload)
        before = hostile.tree_snapshot(outside)
        state_dir = os.path.join(top, 'state')
        config = os.path.join(top, 'libvirt-gpu.conf')
        with open(config, 'w') as f:
            f.write('[DEFAULT]\nsysfs_root = %s\nstate_dir = %s\n'
                    '[gpu]\nenabled_vgpu_types = nvidia-223\n'
                    % (root, state_dir))
        xml_file = os.path.join(top, 'domain.xml')
        with open(xml_file, 'wb') as f:
            f.write(xml)
        env = dict(os.environ, LIBVIRT_GPU_CACHE_DIR='')
        done = subprocess.run(
            [sys.executable, '-m', 'tests.doubles.fuzz_driver', config,
             os.path.join(state_dir, 'hook-settings.json'),
             os.path.join(top, 'mdevctl.d'), profile, xml_file],
            capture_output=True, timeout=TIMEOUT, cwd=ROOT, env=env)
        stderr = done.stderr.decode('utf-8', 'replace')
        assert 'Traceback' not in stderr, stderr[-3000:]
        assert done.returncode == 0, stderr[-3000:]
        result = json.loads(done.stdout.decode().splitlines()[-1])
        assert result['release'] == 0 and result['reconnect'] == 0, result
        assert result['prepare'] in (0, 1), result
        assert result['list'] in (0, 1) and result['placement'] in (0, 1)
        assert hostile.tree_snapshot(outside) == before
