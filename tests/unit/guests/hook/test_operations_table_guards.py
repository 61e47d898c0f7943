"""The hook's table: exit rules no other test pinned (issue 30, section
6).  An internal error while reading the XML (not a refusal of it) exits
non-zero for the operations that may refuse (``prepare``, ``migrate``)
and 0 for the others; a ``release`` that raised our own error counts as
an error in the hook's figures, never as a refusal."""

import io

import pytest

from libvirt_gpu import exception
from libvirt_gpu.store import figures
from libvirt_gpu.guests import hook
from libvirt_gpu.guests.hook import operations
from libvirt_gpu.util import records
from tests.doubles import t4_hook as th


def _run(env, op, xml, table=hook.OPERATIONS):
    out, err = io.BytesIO(), io.StringIO()
    rc = hook.run(['qemu', 'vm1', op, 'begin', '-'], xml,
                  config_file=env.config, settings_file=env.settings_file,
                  sysfs=env.sysfs, stderr=err, mdevctl_dir=env.mdevctl_dir,
                  stdout=out, table=table)
    return rc, out.getvalue(), err.getvalue()


@pytest.mark.parametrize('op, rc', [('prepare', 1), ('migrate', 1),
                                    ('release', 0), ('reconnect', 0)])
def test_an_internal_error_reading_the_xml_follows_the_rows_rule(
        env, monkeypatch, op, rc):
    """Broken by exiting 0 (or 1) whatever the row says when reading the
    XML fails with anything but a refusal."""
    def broken(root):
        raise RuntimeError('reader broke')
    monkeypatch.setattr(operations.config_xml, 'read_domain', broken)
    xml = th.domain_xml([(th.new_uuid(), 'nvidia-223', th.A)])
    before = env.mdevs()
    got, out, err = _run(env, op, xml)
    assert (got, out) == (rc, b'')
    assert 'internal error reading the XML of %s' % op in err
    assert 'RuntimeError: reader broke' in err
    assert env.mdevs() == before and env.leases() == []    # nothing done


def _row(name, function):
    """The table with row ``name``'s function replaced, its rules kept."""
    rows = []
    for op in hook.OPERATIONS:
        if op.name == name:
            op = hook.Operation(name=op.name, function=function,
                                reads=op.reads, rewrites=op.rewrites,
                                may_refuse=op.may_refuse,
                                failure=op.failure)
        rows.append(op)
    return tuple(rows)


@pytest.mark.parametrize('error', [
    exception.GpuInUse(address=th.A, reason='held'),
    exception.StateError(path='/x', reason='broken'),
    RuntimeError('boom')])
def test_a_failed_release_counts_as_an_error_not_a_refusal(env, error):
    """``release`` never refuses: our own error there is an error in the
    figures (broken by counting every LibvirtGpuError as a refusal)."""
    def fails(hook_, req):
        raise error
    xml = th.domain_xml([(th.new_uuid(), 'nvidia-223', th.A)])
    rc, out, err = _run(env, 'release', xml, table=_row('release', fails))
    assert (rc, out) == (0, b'')
    found = figures.hook_figures(env.state_dir)['release']
    assert (found['calls'], found['refusals'], found['errors']) == (1, 0, 1)


def test_a_refused_prepare_counts_as_a_refusal(env):
    def refuses(hook_, req):
        raise exception.GpuInUse(address=th.A, reason='held')
    xml = th.domain_xml([(th.new_uuid(), 'nvidia-223', th.A)])
    rc, _, err = _run(env, 'prepare', xml, table=_row('prepare', refuses))
    assert rc == 1 and 'cannot start domain' in err
    found = figures.hook_figures(env.state_dir)['prepare']
    assert (found['calls'], found['refusals'], found['errors']) == (1, 1, 0)


def test_a_migrate_row_that_does_not_read_the_document_says_so(env):
    """``migrate`` edits the XML its row reads (``DOCUMENT``): a table
    whose row leaves it out is an internal error that names the row, and
    nothing is reserved (broken by using ``req.document`` unchecked: an
    AttributeError on None)."""
    rows = tuple(records.replace(op, reads=(operations.DEVICES,
                                            operations.METADATA))
                 if op.name == 'migrate' else op for op in hook.OPERATIONS)
    xml = th.domain_xml([(th.new_uuid(), 'nvidia-223', th.A)])
    rc, out, err = _run(env, 'migrate', xml, table=rows)
    assert (rc, out) == (1, b'')
    assert ('TypeError: migrate edits the domain XML: its row of '
            'operations.OPERATIONS must read DOCUMENT') in err
    assert env.leases() == []
