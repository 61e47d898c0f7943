"""Everything the CLI prints, in one place.

Commands hand records to this module and never ``print`` themselves:

- ``emit_json(document)`` writes a JSON document: indented with sorted keys
  on a terminal, one compact line otherwise.  The compact form runs
  Python's C encoder, which ``indent`` switches off; ``list --json`` on a
  host with thousands of vGPU types is ~4x faster to encode that way.  Both
  forms are the same document.
- ``emit_text(text)`` writes text for people, and ``emit_note`` and
  ``emit_error`` a line on stderr: the only writers of human-readable text
  (what names from sysfs or libvirt may contain passes through them).
  The rest write one command's stream: ``emit_progress`` (``migrate``'s
  line on stderr), ``emit_exposition`` (``exporter --once``),
  ``emit_removal_plan`` (``reconcile``), ``emit_section`` (the demo) and
  ``emit_internal_error`` (the CLI's edge).  No other module of ``cmd``
  writes to stdout or stderr (``tests/unit/cmd/test_cmd_modules.py``).
- ``*_to_json`` build the documents of ``--json``, ``*_text`` the text.

Reports (``restore``, ``reconcile``, ``placement sync``) share one shape:
``summary()`` (a line), ``COLUMNS`` and ``rows()`` (a table), ``details()``
(more lines) and ``to_json()``; ``emit_report`` prints any of them.
"""

import errno
import json
import sys

from libvirt_gpu.cmd import term
from libvirt_gpu.util import records


# --- writers -----------------------------------------------------------------

def dumps(document, pretty=False, keys_sorted=False):
    """``document`` as JSON with its keys sorted; ``keys_sorted``: every
    dict in it has them in order already (the encoder's sort would then be
    paid for nothing by a large ``list --json``)."""
    if pretty:
        return json.dumps(document, indent=2, sort_keys=not keys_sorted)
    return json.dumps(document, sort_keys=not keys_sorted,
                      separators=(',', ':'))


def emit_json(document, stream=None, keys_sorted=False):
    # dumps escapes every control and non-ASCII character (ensure_ascii):
    # nothing for cmd.term to do
    stream = term.unescaped(stream or sys.stdout)
    stream.write(dumps(document, pretty=stream.isatty(),
                       keys_sorted=keys_sorted))
    stream.write('\n')


def emit_gpus_json(documents, stream=None):
    """``list --json``: ``emit_json(documents, keys_sorted=True)``, the
    one-line form written by ``gpus_json_text``."""
    stream = term.unescaped(stream or sys.stdout)
    if stream.isatty():
        emit_json(documents, stream, keys_sorted=True)
        return
    stream.write(gpus_json_text(documents))
    stream.write('\n')


def gpus_json_text(documents):
    """``dumps(documents, keys_sorted=True)`` of ``gpu_to_json`` documents,
    with each type's dict encoded once.  Parents of one model share their
    type dicts (``gpu_to_json``'s ``type_memo``), so a host of 256
    parents x 20 types has 5,000 types in its document but a few dozen
    distinct dicts; the encoder would write each of them again.  A GPU's
    text is its keys before ``mdev_types``, the types' texts, then its
    keys after (keys are sorted, and the compact form has no blanks), so
    the text is the encoder's own, byte for byte."""
    encode = json.JSONEncoder(separators=(',', ':')).encode
    texts = {}        # id(type dict) -> its text; the dicts live meanwhile
    parts = []
    for document in documents:
        before = {}
        after = {}
        for key, value in document.items():
            if key < 'mdev_types':
                before[key] = value
            elif key > 'mdev_types':
                after[key] = value
        types = []
        for mdev_type in document['mdev_types']:
            text = texts.get(id(mdev_type))
            if text is None:
                text = texts[id(mdev_type)] = encode(mdev_type)
            types.append(text)
        parts.append('%s"mdev_types":[%s]%s' % (
            encode(before)[:-1] + ',' if before else '{', ','.join(types),
            ',' + encode(after)[1:] if after else '}'))
    return '[%s]' % ','.join(parts)


def emit_text(text, stream=None):
    """Write ``text`` (one or more lines) for people."""
    (stream or sys.stdout).write('%s\n' % text)


def emit_note(text, as_json=False):
    """A side remark: on stdout with text, on stderr next to a JSON
    document (which must stay alone on stdout)."""
    emit_text(text, sys.stderr if as_json else sys.stdout)


def emit_error(prog, error):
    emit_text('%s: error: %s' % (prog, error), sys.stderr)


def emit_internal_error(prog, error):
    """The one line of an error the CLI did not expect (its edge)."""
    emit_text('%s: internal error: %s: %s (run with --debug for the '
              'traceback)' % (prog, type(error).__name__, error), sys.stderr)


def emit_report(report, as_json=False):
    if as_json:
        emit_json(report.to_json())
    else:
        emit_text(report_text(report))


def emit_removal_plan(plan, as_json=False):
    """What ``reconcile`` is about to remove, said (and flushed) before it
    does."""
    for f in plan:
        emit_note('will remove %s %s%s: %s' % (
            f.what, f.uuid, ' on %s' % f.parent if f.parent else '',
            f.reason), as_json=as_json)
    (sys.stderr if as_json else sys.stdout).flush()


def emit_progress(text):
    """A progress line on stderr, written over by the next one;
    ``end_progress`` ends it.  The carriage return goes to the terminal
    itself (the CLI's stderr escapes control characters, which would show
    it as ``\\x0d`` and pile the updates up on one line); the text is
    escaped as every other line is."""
    term.unescaped(sys.stderr).write('\r')
    sys.stderr.write(text)
    sys.stderr.flush()


def end_progress():
    sys.stderr.write('\n')


def emit_exposition(text):
    """``exporter --once``: one scrape, Prometheus' text format as the
    exporter wrote it."""
    sys.stdout.write(text)


def emit_section(title):
    """``make demo``'s heading of each step, on stdout before the step's
    own output."""
    emit_text('\n== %s\n' % title)
    sys.stdout.flush()


# --- text --------------------------------------------------------------------

def table(headers, rows):
    """Left-aligned columns, a rule under the header; '-' for None."""
    rows = [['-' if c is None else term.escape(str(c), newline=True)
             for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row)]
    fmt = '  '.join('%%-%ds' % w for w in widths)
    lines = [fmt % tuple(headers), fmt % tuple('-' * w for w in widths)]
    lines += [fmt % tuple(row) for row in rows]
    return '\n'.join(line.rstrip() for line in lines)


def report_text(report):
    """A report's summary line, its table, then its details."""
    lines = [report.summary()]
    rows = report.rows()
    if rows:
        lines.append(table(report.COLUMNS, rows))
    lines.extend(report.details())
    return '\n'.join(lines)


def provider_tree_text(provider_tree):
    """The tree drawn with its inventories and traits."""
    root = provider_tree.root
    lines = ['%s  (%s)' % (root.name, root.uuid)]
    children = provider_tree.children
    for i, child in enumerate(children):
        last = i == len(children) - 1
        branch, pad = ('└── ', '    ') if last else ('├── ', '│   ')
        lines.append('%s%s  (%s)' % (branch, child.name, child.uuid))
        for inv in child.inventories:
            lines.append('%s    inventory %s total=%d reserved=%d '
                         'max_unit=%d' % (pad, inv.resource_class, inv.total,
                                          inv.reserved,
                                          inv.to_api()['max_unit']))
        lines.append('%s    traits    %s' % (pad, ', '.join(
            sorted(child.traits))))
    if not children:
        lines.append('(no GPU providers)')
    return '\n'.join(lines)


def cyborg_devices_text(devices):
    """``discover``: one row per Cyborg device (``cyborg_objects``
    records), its deployable's name, resource class, count and handles
    ('-' where it has none)."""
    rows = []
    for device in devices:
        info = json.loads(device.controlpath_id.cpid_info)
        address = '%(domain)s:%(bus)s:%(device)s.%(function)s' % info
        deps = device.deployable_list or (None,)
        for dep in deps:
            attrs = {a.key: a.value for a in dep.attribute_list} if dep else {}
            rows.append([
                address, device.model, dep and dep.name, attrs.get('rc'),
                dep and dep.num_accelerators,
                dep and ','.join(sorted({h.attach_type
                                         for h in dep.attach_handle_list}))])
    return table(['DEVICE', 'MODEL', 'DEPLOYABLE', 'RC', 'COUNT', 'ATTACH'],
                 rows)


def attachment_text(verb, done):
    """``attached vGPU U (nvidia-223 on 0000:af:00.0) to vm1 (live)``."""
    where = ', '.join(w for w, on in (('live', done.live),
                                      ('config', done.config)) if on)
    if done.kind == 'vgpu':
        gpu = (str(done.parent) if done.parent else
               'GPU chosen at the next start')
        what = 'vGPU %s (%s on %s)' % (done.uuid, done.type_id or '?', gpu)
    else:
        what = 'GPU %s' % done.address
    lines = ['%s %s %s %s (%s)' % (verb, what, 'to' if verb == 'attached'
                                   else 'from', done.domain_name, where)]
    if done.note:
        lines.append('note: %s' % done.note)
    return '\n'.join(lines)


def domain_devices_text(got, routes=None):
    """``domgpus``: the domain, then a row per vGPU and whole GPU;
    ``routes``: ``{vGPU UUID: route}`` (``devices.routes``; '-' for a vGPU
    whose GPU is unknown)."""
    routes = routes or {}
    head = 'domain %s (%s), %s; %s XML' % (
        got.domain_name, got.domain_uuid,
        'running' if got.active else 'shut off',
        'persistent' if got.inactive_xml else 'live')
    rows = [['vgpu', v.uuid, v.type_id, v.parent, routes.get(v.uuid),
             'yes' if v.exists else 'no', v.leased,
             'metadata' if v.in_metadata else 'hostdev only']
            for v in got.vgpus]
    rows += [['pgpu', None, None, a, None, None, None, None]
             for a in got.pgpus]
    return '%s\n%s' % (head, table(['KIND', 'UUID', 'TYPE', 'GPU', 'ROUTE',
                                    'EXISTS', 'LEASE', 'SOURCE'], rows))


def os_error_text(e):
    """An ``OSError`` on a path the operator named, as one line."""
    where = ' -> '.join(str(f) for f in (e.filename, e.filename2)
                        if f is not None)
    text = e.strerror or str(e)
    if e.errno in (errno.EACCES, errno.EPERM):
        text += ' (run as a user allowed to write there, e.g. root)'
    return '%s: %s' % (where, text) if where else text


def installed_text(done):
    lines = ['installed %s (root-owned, mode 0755)' % done.path,
             '  python:   %s -IS' % done.python,
             '  config:   %s' % done.config_file,
             '  settings: %s (rebuilt when the config or the GPUs change)'
             % done.settings_file]
    if done.restart_needed:
        lines.append('libvirtd had no qemu hook when it started and only '
                     'looks for hooks then: restart libvirtd (or send it '
                     'SIGHUP) before starting guests with vGPUs')
    else:
        lines.append('libvirtd already runs qemu hooks: nothing to restart')
    return '\n'.join(lines)


# --- JSON documents ----------------------------------------------------------

def cyborg_devices_to_json(devices):
    """``discover --json``: the Cyborg driver's ``DriverDevice`` records as
    plain data, field for field (``cyborg_objects.to_primitive``)."""
    from libvirt_gpu.openstack import cyborg_objects
    return cyborg_objects.to_primitive(tuple(devices))


def gpu_to_json(gpu, enabled=None, not_assignable=None, type_memo=None,
                room=None, capacities=None, route=None, holders=None):
    """One entry of ``libvirt-gpu list --json``, its keys sorted (as every
    dict of that document: see ``emit_json(keys_sorted=True)``);
    ``not_assignable``: why the GPU cannot be passed through whole;
    ``route``: the route that owns the GPU (``devices.routes``: a VF's is
    its physical GPU's), which is every vGPU's of it too;
    ``holders``: ``{vGPU UUID: (domain name, domain UUID)}`` (``''``
    where unknown; each vGPU's ``domain`` and ``domain_uuid``, None then);
    ``room``: the driver's room for its enabled type on a MIG or
    mixed-size GPU (``capacity.DriverRoom``; adds ``vgpu_mode``,
    ``capacity`` and ``gpu_instances`` or ``placements``);
    ``capacities``: ``{TypeId: capacity}`` of every type a GPU that offers
    several has (adds ``enabled_types``: each type with its capacity, the
    total of its Placement provider);
    ``type_memo``: a dict kept across the GPUs of one document, so that a
    type record shared by many parents (discovery shares equal ones) is
    converted once."""
    document = {
        'address': str(gpu.address),
        'vendor_id': gpu.vendor_id,
        'product_id': gpu.product_id,
        'vendor_name': gpu.vendor_name,
        'product_name': gpu.product_name,
        'class': gpu.class_code,
        'driver': gpu.driver,
        'numa_node': gpu.numa_node,          # None: unknown (sysfs -1)
        'local_cpulist': gpu.local_cpulist,
        'iommu_group': gpu.iommu_group,
        'iommu_members': [member_to_json(m) for m in gpu.iommu_members],
        'nvml': nvml_to_json(gpu.nvml),
        'mode': 'vgpu' if enabled is not None else 'pgpu',
        'enabled_type': enabled.type_id if enabled is not None else None,
        'physfn': str(gpu.physfn) if gpu.physfn else None,
        'virtfns': [str(a) for a in gpu.virtfns],
        'mdev_types': [_type_json(t, type_memo) for t in gpu.mdev_types],
        'mdevs': [_mdev_json(m, route, (holders or {}).get(m.uuid))
                  for m in gpu.mdevs],
        'not_assignable': not_assignable,
        'route': route,
    }
    if room is not None:
        document.update(room_to_json(room, enabled))
    if capacities:
        document['enabled_types'] = [
            {'type': type_id, 'capacity': capacities[type_id]}
            for type_id in enabled.type_ids if type_id in capacities]
    return _sorted(document)


def _mdev_json(mdev, route, holder):
    """One vGPU of a ``list --json`` entry, its keys sorted."""
    name, dom = holder or ('', '')
    return {'domain': name or None, 'domain_uuid': dom or None,
            'route': route, 'type': mdev.type_id, 'uuid': mdev.uuid}


def room_to_json(room, enabled):
    """The keys a GPU in MIG or mixed-size mode adds to its ``list
    --json`` entry: its ``vgpu_mode``, ``capacity`` (what the driver can
    hold of the enabled type in all) and its GPU instances (profile, id,
    used, free) or its placements (size, the free placement ids)."""
    from libvirt_gpu.devices import capacity
    found = {'vgpu_mode': room.mode,
             'capacity': capacity.room_total(room, enabled)}
    if room.mode == capacity.MODE_MIG:
        found['gpu_instances'] = [
            {'id': g.id, 'profile': g.profile, 'profile_id': g.profile_id,
             'used': g.used, 'free': g.free} for g in room.gis]
    else:
        found['placements'] = {'size': room.placement_size,
                               'used': room.used,
                               'free': list(room.placements)}
    return found


def room_text(address, room):
    """One line of ``libvirt-gpu list`` about a GPU in MIG or mixed-size
    mode."""
    from libvirt_gpu.devices import capacity
    if room.mode == capacity.MODE_MIG:
        where = ', '.join('GI %d %s %d used %d free' % (
            g.id, g.profile, g.used, g.free) for g in room.gis) or 'no GI'
    else:
        where = '%d-slot placements, %d used, free at %s' % (
            room.placement_size or 0, room.used,
            ','.join(str(p) for p in room.placements) or 'none')
    return '%s: %s %s: %s' % (address, room.mode, room.type_id, where)


def _type_json(mdev_type, memo):
    if memo is None:
        return type_to_json(mdev_type)
    found = memo.get(id(mdev_type))
    if found is None:
        # the record is kept with its dict, so its id stays its own
        found = memo[id(mdev_type)] = (mdev_type, type_to_json(mdev_type))
    return found[1]


def _sorted(document):
    return dict(sorted(document.items()))


def member_to_json(member):
    """One function of a GPU's IOMMU group."""
    return _sorted({
        'address': str(member.address),
        'vendor_id': member.vendor_id,
        'product_id': member.product_id,
        'class': member.class_code,
        'driver': member.driver,
        'companion': member.companion,
        'host_uses': member.host_uses,
    })


def nvml_to_json(info):
    """What NVML said about a GPU, or None when it was not asked or had
    nothing to say."""
    if info is None:
        return None
    return _sorted({
        'name': info.name,
        'memory_total_mib': info.memory_total_mib,
        'virtualization_mode': info.virtualization_mode,
        'mig_enabled': info.mig_enabled,
        'vgpu_types': [_sorted(records.asdict(t)) for t in info.vgpu_types],
    })


def type_to_json(mdev_type):
    # keys in sorted order as written (5,000 of these on a large host)
    return {
        'available_instances': mdev_type.available_instances,
        'description': mdev_type.description,
        'device_api': mdev_type.device_api,
        'id': mdev_type.id,
        'name': mdev_type.name,
    }


def attachment_to_json(done):
    return {'domain_uuid': done.domain_uuid, 'domain': done.domain_name,
            'kind': done.kind, 'live': done.live, 'config': done.config,
            'uuid': done.uuid, 'type': done.type_id,
            'parent': str(done.parent) if done.parent else None,
            'address': str(done.address) if done.address else None,
            'note': done.note}


def domain_devices_to_json(got, routes=None):
    """``domgpus --json``; ``routes`` as ``domain_devices_text``'s (a
    vGPU's ``route``: None where its GPU is unknown)."""
    routes = routes or {}
    return {
        'domain_uuid': got.domain_uuid, 'domain': got.domain_name,
        'active': got.active, 'inactive_xml': got.inactive_xml,
        'vgpus': [{'uuid': v.uuid, 'type': v.type_id,
                   'parent': str(v.parent) if v.parent else None,
                   'in_metadata': v.in_metadata,
                   'in_devices': v.in_devices, 'exists': v.exists,
                   'lease': v.leased, 'route': routes.get(v.uuid)}
                  for v in got.vgpus],
        'pgpus': [str(a) for a in got.pgpus]}


def installed_to_json(done):
    return {'path': done.path, 'python': done.python,
            'config_file': done.config_file,
            'settings_file': done.settings_file,
            'restart_needed': done.restart_needed}


# --- live migration ----------------------------------------------------------

def migration_to_json(done):
    plan, outcome = done.plan, done.outcome
    doc = {'domain': plan.domain, 'destination': plan.dest_uri,
           'ok': plan.ok,
           'checks': [{'what': c.what, 'ok': c.ok, 'detail': c.detail}
                      for c in plan.checks],
           'vgpus': {t: n for t, n in plan.vgpus},
           # NVIDIA's compatibility question, per vGPU (migration.py)
           'nvidia': [{'vgpu': str(a.uuid), 'type': str(a.type_id),
                       'metadata_read': a.read,
                       'host_driver': a.host_driver, 'detail': a.detail}
                      for a in plan.driver],
           # the destination's layout question, per vGPU (migration.py)
           'layout': [{'vgpu': str(a.uuid), 'type': str(a.type_id),
                       'mode': a.mode, 'needs': a.needs, 'detail': a.detail}
                      for a in plan.layout]}
    if outcome is not None:
        doc['migrated'] = outcome.done
        doc['downtime_ms'] = outcome.downtime_ms
        doc['data_total'] = outcome.data_total
        doc['elapsed_ms'] = outcome.elapsed_ms
        if outcome.abort_refused:
            doc['abort_refused'] = outcome.abort_refused
    return doc


def migration_checks_text(plan):
    lines = ['checks for migrating %s to %s:' % (plan.domain,
                                                 plan.dest_uri)]
    for c in plan.checks:
        lines.append('  %-4s %s: %s' % ('ok' if c.ok else 'NO', c.what,
                                        c.detail))
    for a in plan.driver:
        lines.append('  %-4s NVIDIA compatibility of vGPU %s (%s): %s' % (
            'ask', a.uuid, a.type_id, a.detail))
    for a in plan.layout:
        lines.append('  %-4s destination layout for vGPU %s (%s): %s' % (
            'ask', a.uuid, a.type_id, a.detail))
    return '\n'.join(lines)


def _mib(n):
    return '%.1f MiB' % (n / 1048576.0)


def migration_progress_text(stats):
    """One progress line from libvirt's job statistics."""
    done = stats.get('data_processed', 0)
    left = stats.get('data_remaining', 0)
    if not stats.get('data_total') and not done and not left:
        # libvirt has not started copying: the destination is preparing
        # (its hook, its QEMU starting)
        return 'migrating: preparing the destination'
    total = stats.get('data_total') or (done + left) or 1
    return 'migrating: %3d%%  %s processed, %s remaining' % (
        min(100, 100 * (total - left) // total), _mib(done), _mib(left))


def migration_outcome_text(plan, outcome):
    if not outcome.done:
        return ('migration of %s aborted: it runs on here with its vGPUs'
                % plan.domain)
    late = ('Ctrl-C came too late (%s): ' % outcome.abort_refused
            if outcome.abort_refused else '')
    downtime = ('%d ms' % outcome.downtime_ms
                if outcome.downtime_ms is not None
                else 'not reported by libvirt')
    took = ('; took %.1f s' % (outcome.elapsed_ms / 1000.0)
            if outcome.elapsed_ms is not None else '')
    return '%smigrated %s to %s; downtime %s%s' % (
        late, plan.domain, plan.dest_uri, downtime, took)
