"""Property-based fuzzing (hypothesis) of the destination's ``migrate``:
hostile and random domain XML (our metadata with UUIDs taken here or in
capitals, parents that are VFs, GPUs or junk, hostdevs missing, doubled or
of the other kind, two ``<metadata>``, whole GPUs, other encodings, junk
bytes, the corpus of tests/doubles/hostile) thrown at the hook's
``migrate`` on the simulated T4 host, in this process (the whole-process
properties, hangs included, are test_fuzz.py's).  For every input:

- no traceback, no internal error: exit 0 or 1;
- a refusal is one line on stderr, prints nothing and leaves no
  reservation;
- what is printed is well-formed UTF-8 XML, and every reservation made is
  named in it (or in the input, when nothing was printed);
- the same call again (libvirt's retry) reserves nothing more;
- ``hook.log`` holds no raw control character.

Derandomized and modest (``MAX_EXAMPLES``), so ``make test`` sees the same
examples every run; ``FUZZ_EXAMPLES=500`` searches further.
"""

import os
import re
import tempfile
import uuid as uuidlib

import pytest
from hypothesis import configuration
from hypothesis import given
from hypothesis import HealthCheck
from hypothesis import settings
from hypothesis import strategies as st

from libvirt_gpu.guests import hook
from libvirt_gpu.store import state
from libvirt_gpu.util import xmlutil
from tests.doubles import hostile
from tests.doubles import trees
from tests.doubles import t4_hook as th
from tests.doubles import t4_migrate

configuration.set_hypothesis_home_dir(os.path.join(
    tempfile.gettempdir(), 'libvirt-gpu-hypothesis-%d' % os.getuid()))

MAX_EXAMPLES = int(os.environ.get('FUZZ_EXAMPLES', '100'))
A, B, EXISTING = th.A, th.B, str(th.EXISTING)
SOURCE_VF = '0000:65:00.5'
DOMAINS = (str(th.DOM), '6a8a3b1e-9d0b-4a55-9d84-3c7f0f3f4e21')
_RAW = re.compile('[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]')


@pytest.fixture(scope='module')
def env(tmp_path_factory):
    with trees.simulated_tree('t4') as (root, profile):
        yield th.Env(root, profile, tmp_path_factory.mktemp('fuzzmig'))


# --- the domain XML ----------------------------------------------------------

def _rarely(common, rare):
    """``common`` nine times in ten, else ``rare``: most examples must get
    past the input checks to reach the reservation."""
    return st.sampled_from([False] * 9 + [True]).flatmap(
        lambda is_rare: rare if is_rare else common)


def _uuid_of(how):
    """A vGPU UUID: new (as it is, or in capitals) or the one of the vGPU
    this host already holds (likewise)."""
    if how in ('existing', 'EXISTING'):
        return st.just(EXISTING.upper() if how == 'EXISTING' else EXISTING)
    return st.uuids().map(lambda u: str(u).upper() if how == 'NEW'
                          else str(u))


vgpu_uuids = _rarely(
    st.sampled_from(['new'] * 5 + ['NEW', 'existing', 'EXISTING']).flatmap(
        _uuid_of),
    st.sampled_from(['', 'not-a-uuid', '../../x', EXISTING + ' ']))
type_ids = _rarely(st.sampled_from(['nvidia-223'] * 4 + ['nvidia-224']),
                   st.sampled_from(['nvidia-999', '', 'a b', '../x']))
parents = _rarely(st.sampled_from([None, A, B, '0000:65:00.0', SOURCE_VF]),
                  st.sampled_from([B.upper(), '0000:3b:00.4', 'junk']))
hostdev_kinds = _rarely(st.sampled_from(['mdev', 'mdev', 'mdev', 'pci']),
                        st.sampled_from(['none', 'both', 'twice',
                                         'mode-capabilities']))
names = _rarely(st.just('vm1'), st.one_of(st.text(max_size=12).map(
    lambda t: ''.join('&#x%x;' % ord(c) if ord(c) < 0x20 or c in '<&\'"'
                      else c for c in t)),
    st.just('vm&#x202e;&#x85;\x1b[2J')))


def _attr(value):
    return (value.replace('&', '&amp;').replace('"', '&quot;')
            .replace("'", '&apos;').replace('<', '&lt;'))


def _pci(address):
    try:
        dom, bus, rest = address.split(':')
        slot, fn = rest.split('.')
        return ("<address domain='0x%s' bus='0x%s' slot='0x%s' "
                "function='0x%s'/>" % (dom, bus, slot, fn))
    except ValueError:
        return "<address domain='%s'/>" % _attr(address)


@st.composite
def domains(draw):
    entries = draw(st.lists(st.tuples(vgpu_uuids, type_ids, parents,
                                      hostdev_kinds), min_size=1, max_size=5))
    meta = ''.join('<g:vgpu uuid="%s" type="%s"%s/>' % (
        _attr(u), _attr(t), ' parent="%s"' % _attr(p) if p else '')
        for u, t, p, _ in entries)
    if draw(_rarely(st.just(False), st.just(True))):
        meta += "<g:pgpu address='%s'/>" % draw(st.sampled_from([A, B]))
    devices = []
    for u, _, p, kind in entries:
        mdev = ("<hostdev mode='subsystem' type='mdev' managed='no' "
                "model='vfio-pci'><source><address uuid='%s'/></source>"
                "</hostdev>" % _attr(u))
        pci = ("<hostdev mode='subsystem' type='pci' managed='no'><source>"
               "%s</source></hostdev>" % _pci(p or SOURCE_VF))
        devices.append({'mdev': mdev, 'pci': pci, 'none': '',
                        'both': mdev + pci, 'twice': pci + pci,
                        'mode-capabilities': mdev.replace(
                            'subsystem', 'capabilities')}[kind])
    metadata = ("<metadata><g:gpus xmlns:g='urn:libvirt-gpu:1'>%s</g:gpus>"
                "</metadata>" % meta)
    extra_meta = draw(_rarely(st.just(''), st.sampled_from([
        '<metadata/>', "<metadata><n:i xmlns:n='urn:n'/></metadata>"])))
    xml = ("<domain type='kvm'><name>%s</name><uuid>%s</uuid>%s%s"
           "<devices>%s</devices></domain>" % (
               draw(names), draw(st.sampled_from(DOMAINS)), metadata,
               extra_meta, ''.join(devices))).encode('utf-8', 'replace')
    how = draw(_rarely(st.just('plain'), st.sampled_from([
        'utf-16', 'utf-16-le', 'utf-32', 'bom', 'latin-1', 'junk',
        'truncated', 'hostile'])))
    if how in ('utf-16', 'utf-16-le', 'utf-32'):
        xml = xml.decode('utf-8').encode(how)
    elif how == 'bom':
        xml = b'\xef\xbb\xbf' + xml
    elif how == 'latin-1':
        xml = b'<?xml version="1.0" encoding="latin-1"?>' + xml
    elif how == 'junk':
        at = draw(st.integers(0, len(xml)))
        xml = xml[:at] + draw(st.binary(min_size=1, max_size=8)) + xml[at:]
    elif how == 'truncated':
        xml = xml[:draw(st.integers(0, len(xml)))]
    elif how == 'hostile':
        corpus = hostile.inputs(str(uuidlib.uuid4()))
        corpus.pop('oversize')          # its size is tested elsewhere
        xml = draw(st.sampled_from(sorted(corpus.values())))
    return xml


# --- the property ------------------------------------------------------------

def _clear(env):
    store = state.LeaseStore(env.state_dir)
    with store.transaction() as txn:
        for lease in txn.all():
            txn.delete(lease.vgpu_uuid)
    store.close()


def _log(env):
    try:
        with open(os.path.join(env.state_dir, hook.LOG_NAME), 'rb') as f:
            return f.read().decode('utf-8')
    except FileNotFoundError:
        return ''


@settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True,
          database=None,
          suppress_health_check=[HealthCheck.too_slow,
                                 HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large])
@given(xml=domains())
def test_migrate_on_fuzzed_input(env, xml):
    _clear(env)
    rc, out, err = t4_migrate.migrate(env, xml)
    assert rc in (0, 1), err
    assert 'Traceback' not in err and 'internal error' not in err, err
    leases = env.leases()
    if rc == 1:
        assert out == b'' and err.count('\n') == 1, err
        assert leases == []
    else:
        assert err == '', err
        shown = (out or xml).decode('utf-8').lower()
        if out:
            xmlutil.parse(out)
        for lease in leases:
            assert lease.state == state.RESERVED and lease.expires_at
            assert lease.vgpu_uuid in shown
        again = t4_migrate.migrate(env, xml)
        assert again[0] == 0 and again[1] == out
        assert len(env.leases()) == len(leases)
    for line in _log(env).splitlines():
        assert not _RAW.search(line), line
