"""``libvirt-gpu nova-config``: the ``[pci]`` lines OpenStack Nova needs for
the VFs carved for it (``[nova]/carved``, ``devices.carving``), and
``--check FILE``: what a Nova configuration file says that differs.

Printed (a file for ``/etc/nova/nova.conf.d/``)::

    [pci]
    device_spec = {"vendor_id": "10de", "product_id": "26b9",
                   "address": "0000:bd:00.4", "managed": "no",
                   "resource_class": "CUSTOM_NVIDIA_L40S_12Q"}
    alias = {"name": "l40s-12q", "device_type": "type-VF",
             "resource_class": "CUSTOM_NVIDIA_L40S_12Q",
             "vendor_id": "10de", "product_id": "26b9"}

one ``device_spec`` per carved VF (its exact address: nothing else of the
host matches it) and one ``alias`` per alias name, each on one line.  A
VF the configuration carves that the record does not hold as Nova's
(``carving.Carved.withheld``: ``restore`` refused it, a guest of ours
holds a vGPU there, or the record cannot be read) is left out and said
(``Withheld``: stderr, a comment, ``--json``'s ``withheld``).
``"live_migratable": "yes"`` is added to every ``device_spec`` only when
the host's libvirt is 10.0.0 or later and its QEMU 8.2.2 or later (Nova's
minimums for migrating a VF of a kernel variant driver), read through
libvirt; when libvirt cannot be asked it is left out and the header says
why.

``--check`` reads a Nova file as Nova's oslo.config does (sections,
repeated ``device_spec``/``alias`` lines, indented continuation lines,
values in quotes) and each JSON value as Nova's own parsers take it (a
dict or a list of dicts; addresses as globs, regex dicts or a PF's
address that stands for its VFs), then names every difference, one line
each.  The file is read only when it is a regular file (never waiting on
a FIFO).  An address regex is judged only when it can be in bounded time
(``_field_pattern``: at most 32 characters, no quantifier within another,
256 distinct ones a file; the fields matched are at most four
characters); any other is named, not tried.  A ``devname`` spec names a
network interface and matches no GPU function (``notes``).
"""

from __future__ import annotations

import json
import os
import re
import sys

from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.cmd import output
from libvirt_gpu.util import filetype
from libvirt_gpu.util import records

# Nova's minimums for "live_migratable": "yes" (libvirt's encoding:
# major * 1000000 + minor * 1000 + release).
LIBVIRT_MIN = 10000000      # 10.0.0
QEMU_MIN = 8002002          # 8.2.2
DEVICE_TYPE = 'type-VF'
MANAGED = 'no'
# Nova's names of the [pci] options (device_spec's deprecated name too).
SPEC_KEYS = ('device_spec', 'passthrough_whitelist')
ALIAS_KEY = 'alias'
_FALSE = ('no', 'false', 'off', '0', 'n', 'f')
_TRUE = ('yes', 'true', 'on', '1', 'y', 't')
_MAX_FILE_BYTES = 1024 * 1024
# Nova's bounds of an address's domain, bus, slot and function.
_MAX_FIELDS = (0xFFFF, 0xFF, 0x1F, 0x7)
# The longest regex of an address field judged (see _field_pattern), and
# how many distinct ones one file may hold.
_MAX_PATTERN = 32
_MAX_REGEXES = 256


def version_text(number):
    if number is None:
        return '?'
    return '%d.%d.%d' % (number // 1000000, number // 1000 % 1000,
                         number % 1000)


@records.record
class Versions:
    """The host's libvirt and QEMU versions (libvirt's encoding), or why
    they are unknown."""

    libvirt: int | None = None
    qemu: int | None = None
    error: str | None = None

    @property
    def live_migratable(self):
        return (self.libvirt is not None and self.qemu is not None
                and self.libvirt >= LIBVIRT_MIN and self.qemu >= QEMU_MIN)

    def describe(self):
        if self.error is not None:
            return ('libvirt and QEMU versions unknown (%s): '
                    '"live_migratable" left out' % self.error)
        return ('libvirt %s, QEMU %s: %s (Nova needs libvirt >= %s and '
                'QEMU >= %s)' % (
                    version_text(self.libvirt), version_text(self.qemu),
                    '"live_migratable": "yes"' if self.live_migratable
                    else '"live_migratable" left out',
                    version_text(LIBVIRT_MIN), version_text(QEMU_MIN)))


@records.record
class DeviceSpec:
    """One ``[pci] device_spec`` value: one carved VF."""

    vendor_id: str
    product_id: str
    address: objects.PciAddress
    resource_class: str
    live_migratable: bool = False

    def to_json(self):
        found = {'vendor_id': self.vendor_id, 'product_id': self.product_id,
                 'address': str(self.address), 'managed': MANAGED,
                 'resource_class': self.resource_class}
        if self.live_migratable:
            found['live_migratable'] = 'yes'
        return found


@records.record
class Alias:
    """One ``[pci] alias`` value: one kind of carved VF."""

    name: str
    resource_class: str
    vendor_id: str
    product_id: str

    def to_json(self):
        return {'name': self.name, 'device_type': DEVICE_TYPE,
                'resource_class': self.resource_class,
                'vendor_id': self.vendor_id, 'product_id': self.product_id}


@records.record
class NovaConfig:
    """What Nova needs for the carved VFs of a host."""

    hostname: str
    source: str                  # the libvirt-gpu configuration file
    carved: tuple                # carving.CarvedGpu, in address order
    versions: Versions
    device_specs: tuple[DeviceSpec, ...]
    aliases: tuple[Alias, ...]
    withheld: tuple = ()         # Withheld: carved VFs Nova is not given

    @property
    def nova_vfs(self):
        """``{vf: CarvedGpu}`` of the carved VFs Nova is given."""
        left_out = {w.vf for w in self.withheld}
        return {vf: c for c in self.carved for vf in c.vfs
                if vf not in left_out}

    def text(self):
        lines = [
            '# Generated by `libvirt-gpu nova-config` on %s from the '
            'carvings' % self.hostname,
            '# of %s ([nova]/carved); do not edit: generate it again '
            'after' % self.source,
            '# a change and check a file with `libvirt-gpu nova-config '
            '--check FILE`.',
            '# Drop it into /etc/nova/nova.conf.d/ and restart '
            'nova-compute; set',
            '# [pci] report_in_placement = true here and [filter_scheduler]',
            '# pci_in_placement = true on the schedulers.',
            '# %s' % self.versions.describe(),
        ]
        for carved in self.carved:
            lines.append('# [%s]: %s (%s) on %s: %s' % (
                carved.carving.section, carved.type_id,
                carved.type_name or 'unnamed', carved.gpu,
                ', '.join(str(vf) for vf in carved.vfs)))
        lines.extend('# left out: %s' % w.describe() for w in self.withheld)
        if not self.carved:
            lines.append('# nothing is carved for Nova on this host')
        lines.append('[pci]')
        lines.extend('device_spec = %s' % json.dumps(s.to_json())
                     for s in self.device_specs)
        lines.extend('alias = %s' % json.dumps(a.to_json())
                     for a in self.aliases)
        return '\n'.join(lines)

    def to_json(self):
        return {
            'hostname': self.hostname,
            'versions': {'libvirt': version_text(self.versions.libvirt),
                         'qemu': version_text(self.versions.qemu),
                         'error': self.versions.error},
            'live_migratable': self.versions.live_migratable,
            'carved': [{'carving': c.carving.name, 'gpu': str(c.gpu),
                        'type_id': str(c.type_id), 'type_name': c.type_name,
                        'resource_class': c.resource_class,
                        'alias': c.alias,
                        'vfs': [str(vf) for vf in c.vfs]}
                       for c in self.carved],
            'device_spec': [s.to_json() for s in self.device_specs],
            'alias': [a.to_json() for a in self.aliases],
            'withheld': [w.to_json() for w in self.withheld],
        }


@records.record
class Withheld:
    """A VF the configuration carves that Nova is not given: the record
    does not hold it as Nova's (``carving.Carved.withheld``)."""

    vf: objects.PciAddress
    carved: object               # carving.CarvedGpu
    reason: str

    def describe(self):
        return ('VF %s ([%s]) is not given to Nova: %s' % (
            self.vf, self.carved.carving.section, self.reason))

    def to_json(self):
        return {'vf': str(self.vf), 'carving': self.carved.carving.name,
                'reason': self.reason}


def withheld(carved, ours):
    """``Withheld`` of the planned VFs of ``carved`` (``carving.Carved``)
    the record does not hold as Nova's; ``ours``: ``{vf: uuid}`` of the
    VFs our own vGPUs are recorded on."""
    found = []
    for vf, c in carved.withheld():
        if carved.damaged is not None:
            reason = 'the carve record cannot be read (%s)' % carved.damaged
        elif vf in ours:
            reason = ('it holds libvirt-gpu\'s own vGPU %s; move it off this '
                      'GPU (docs/admin/nova.md), then run `libvirt-gpu '
                      'restore`' % ours[vf])
        else:
            reason = ('`libvirt-gpu restore` has not recorded it as Nova\'s; '
                      'run it and read what it says of this VF')
        found.append(Withheld(vf=vf, carved=c, reason=reason))
    return tuple(found)


def nova_config(carved, versions, hostname, source, left_out=()):
    """The ``NovaConfig`` of the ``carving.CarvedGpu``s ``carved``, but
    for the VFs ``left_out`` (``Withheld``)."""
    skipped = {w.vf for w in left_out}
    specs = tuple(
        DeviceSpec(vendor_id=c.vendor_id, product_id=c.product_id,
                   address=vf, resource_class=c.resource_class,
                   live_migratable=versions.live_migratable)
        for c in carved for vf in c.vfs if vf not in skipped)
    aliases = {}
    for c in carved:
        aliases.setdefault(c.alias, Alias(
            name=c.alias, resource_class=c.resource_class,
            vendor_id=c.vendor_id, product_id=c.product_id))
    return NovaConfig(hostname=hostname, source=source, carved=tuple(carved),
                      versions=versions, device_specs=specs,
                      aliases=tuple(aliases[n] for n in sorted(aliases)),
                      withheld=tuple(left_out))


def host_versions(uri):
    """``Versions`` of the libvirt at ``uri``."""
    from libvirt_gpu.virt import host as host_mod
    try:
        with host_mod.Host(uri, read_only=True) as host:
            lib, hyp = host.versions()
    except exception.LibvirtError as e:
        return Versions(error='libvirt at %s: %s' % (
            uri, str(e).splitlines()[0]))
    return Versions(libvirt=lib, qemu=hyp)


# --- reading a Nova configuration file ---------------------------------------

@records.record
class NovaEntry:
    """One JSON value of a ``[pci]`` option of a Nova file (a dict), with
    the line it starts on."""

    key: str
    line: int
    value: dict


@records.record
class NovaFile:
    """The ``[pci]`` device_spec and alias values of a Nova file, and what
    could not be read (one line each)."""

    specs: tuple[NovaEntry, ...]
    aliases: tuple[NovaEntry, ...]
    problems: tuple[str, ...]


def _unquote(value):
    value = value.strip()
    if len(value) > 1 and value[0] == value[-1] and value[0] in '"\'':
        return value[1:-1]
    return value


def _assignments(text):
    """``(section, key, value, line)`` of an INI text as oslo.config reads
    it: ``key = value`` or ``key: value``, indented lines continuing the
    value, ``#``/``;`` comments."""
    section = None
    current = None          # [section, key, value, line]
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if current is not None and raw[:1] in (' ', '\t') and stripped \
                and not stripped.startswith(('#', ';')):
            current[2] += '\n' + stripped
            continue
        if current is not None:
            yield tuple(current)
            current = None
        if not stripped or stripped.startswith(('#', ';')):
            continue
        if stripped.startswith('[') and stripped.endswith(']'):
            section = stripped[1:-1].strip()
            continue
        match = re.match(r'([^=:\s]+)\s*[=:]\s*(.*)$', stripped)
        if match is None:
            continue
        current = [section, match.group(1), match.group(2), number]
    if current is not None:
        yield tuple(current)


def _read_regular(path):
    """The bytes (at most ``_MAX_FILE_BYTES`` + 1) of the regular file
    ``path``, never waiting on a FIFO nor reading a device to its end;
    InvalidInput naming it otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        kind = filetype.kind_behind(e, path)
        raise exception.InvalidInput(reason='--check %s: %s' % (
            path, 'it is %s, not a regular file' % kind if kind
            else e.strerror))
    reason = filetype.not_regular(os.fstat(fd).st_mode)
    if reason is not None:
        os.close(fd)
        raise exception.InvalidInput(reason='--check %s: %s; name a Nova '
                                     'configuration file' % (path, reason))
    with os.fdopen(fd, 'rb') as f:
        try:
            return f.read(_MAX_FILE_BYTES + 1)
        except OSError as e:
            raise exception.InvalidInput(reason='--check %s: %s' % (
                path, e.strerror))


def read_nova_file(path):
    """The ``NovaFile`` at ``path`` (InvalidInput when it cannot be
    read)."""
    raw = _read_regular(path)
    if len(raw) > _MAX_FILE_BYTES:
        raise exception.InvalidInput(reason='--check %s: larger than %d '
                                     'bytes' % (path, _MAX_FILE_BYTES))
    text = raw.decode('utf-8', errors='replace')
    specs, aliases, problems = [], [], []
    for section, key, value, line in _assignments(text):
        if section != 'pci' or key not in SPEC_KEYS + (ALIAS_KEY,):
            continue
        try:
            parsed = json.loads(_unquote(value))
        except ValueError as e:
            problems.append('line %d: [pci] %s is not JSON (%s)'
                            % (line, key, e))
            continue
        except RecursionError:
            problems.append('line %d: [pci] %s is not JSON Nova can read '
                            '(nested too deeply)' % (line, key))
            continue
        values = parsed if isinstance(parsed, list) else [parsed]
        target = aliases if key == ALIAS_KEY else specs
        for item in values:
            if not isinstance(item, dict):
                problems.append('line %d: [pci] %s holds %s, not a JSON '
                                'object' % (line, key, type(item).__name__))
                continue
            target.append(NovaEntry(key=key, line=line, value=item))
    return NovaFile(specs=tuple(specs), aliases=tuple(aliases),
                    problems=tuple(problems))


# --- Nova's matching, as its devspec does it ---------------------------------

def _fields(address):
    return ('%04x' % address.domain, '%02x' % address.bus,
            '%02x' % address.slot, '%x' % address.function)


def _glob_fields(text):
    """A glob address (``*:bd:00.*``, ``:00.``) as four fields, each None
    (any) or an int; InvalidInput when Nova would refuse it."""
    dbs, _, func = text.partition('.')
    parts = dbs.split(':') if dbs else []
    if len(parts) > 3:
        raise exception.InvalidInput(reason='address %r' % text)
    parts = ['*'] * (3 - len(parts)) + parts
    out = []
    for part, most in zip(parts + [func], _MAX_FIELDS):
        part = part.strip()
        if part in ('', '*'):
            out.append(None)
            continue
        try:
            value = int(part, 16)
        except ValueError:
            value = -1
        if not 0 <= value <= most:
            raise exception.InvalidInput(reason='address %r' % text)
        out.append(value)
    return out


def _glob_match(fields, address):
    values = (address.domain, address.bus, address.slot, address.function)
    return all(f is None or f == v for f, v in zip(fields, values))


class Unjudged(exception.InvalidInput):
    """A device_spec libvirt-gpu does not judge (its reason says why and
    what to write instead)."""


def _nests_quantifiers(parsed, inside=False):
    """Whether the parsed pattern (a ``re._parser.SubPattern``) holds a
    quantifier within a quantifier's body."""
    from re import _constants as constants
    from re import _parser
    repeats = (constants.MAX_REPEAT, constants.MIN_REPEAT,
               constants.POSSESSIVE_REPEAT)

    def subpatterns(arg):
        if isinstance(arg, _parser.SubPattern):
            yield arg
        elif isinstance(arg, (list, tuple)):
            for item in arg:
                yield from subpatterns(item)

    for op, arg in parsed:
        within = inside
        if op in repeats:
            if inside:
                return True
            within = True
        if any(_nests_quantifiers(sub, within) for sub in subpatterns(arg)):
            return True
    return False


def _field_pattern(name, text):
    """The compiled regex of one field of a dict address, when it can be
    judged in bounded time.  The fields matched are at most 4 characters
    (``0000``, ``bd``, ``00``, ``4``): without a quantifier inside another
    a backtracking match of a pattern of at most ``_MAX_PATTERN``
    characters takes at most a polynomial of degree 4 in its length
    (milliseconds), so such patterns are matched here, in this process;
    any other is refused, not tried (``((.*)*)*x`` would run for ever,
    here and in Nova, which matches them the same way).  InvalidInput
    for what Nova's ``re`` refuses, ``Unjudged`` for what we do not
    try."""
    what = 'address %s regex %r' % (name, text[:80])
    if len(text) > _MAX_PATTERN:
        raise Unjudged(reason='%s is longer than %d characters: libvirt-gpu '
                       'does not judge it; name the VF by its address '
                       '("0000:bd:00.4")' % (what, _MAX_PATTERN))
    from re import _parser
    try:
        parsed = _parser.parse(text)
        pattern = re.compile(text)
    except (re.error, OverflowError, RecursionError, ValueError) as e:
        raise exception.InvalidInput(reason='%s (%s)' % (what, e))
    if _nests_quantifiers(parsed):
        raise Unjudged(reason='%s nests a quantifier in another, which can '
                       'take a regex engine (Nova\'s too) for ever: '
                       'libvirt-gpu does not judge it; name the VF by its '
                       'address ("0000:bd:00.4")' % what)
    return pattern


class Patterns(object):
    """The regexes of one file's dict addresses, each judged once
    (``_field_pattern``) and matched once per value: a file repeating a
    slow pattern costs no more than one; at most ``_MAX_REGEXES``
    distinct ones."""

    def __init__(self):
        self._compiled = {}
        self._matched = {}

    def match(self, name, text, value):
        key = (name, text)
        pattern = self._compiled.get(key)
        if pattern is None:
            if len(self._compiled) >= _MAX_REGEXES:
                raise Unjudged(reason='address %s regex %r: the file holds '
                               'more than %d distinct address regexes; '
                               'libvirt-gpu does not judge more' % (
                                   name, text[:80], _MAX_REGEXES))
            pattern = self._compiled[key] = _field_pattern(name, text)
        found = self._matched.get((key, value))
        if found is None:
            found = self._matched[key, value] = bool(pattern.match(value))
        return found


def address_matches(spec_address, address, physfn, pfs, patterns=None):
    """Whether Nova's ``address`` of a device_spec (absent, a glob string
    or a dict of regexes) matches the function ``address`` whose PF is
    ``physfn`` (None for a PF); ``pfs``: the host's PFs with VFs (a spec
    naming one of them exactly stands for its VFs too); ``patterns``:
    the ``Patterns`` of the file."""
    if spec_address is None:
        return True
    if isinstance(spec_address, dict):
        patterns = patterns if patterns is not None else Patterns()
        names = ('domain', 'bus', 'slot', 'function')
        # every field judged, as Nova compiles them all
        texts = [str(spec_address.get(n, '.*')) for n in names]
        for name, text in zip(names, texts):
            try:
                patterns.match(name, text, '')
            except Unjudged:
                raise
            except exception.InvalidInput:
                raise exception.InvalidInput(reason='address %r'
                                             % (spec_address,))
        return all(patterns.match(n, t, v) for n, t, v in
                   zip(names, texts, _fields(address)))
    fields = _glob_fields(str(spec_address))
    if None not in fields and physfn is not None:
        single = objects.PciAddress(*fields)
        if single in pfs and single == physfn:
            return True
    return _glob_match(fields, address)


def _hex_id(value):
    if value is None or str(value).strip() == '*':
        return None
    try:
        return '%04x' % int(str(value).strip(), 16)
    except ValueError:
        raise exception.InvalidInput(reason='PCI id %r' % value)


DEVNAME = 'devname'


def spec_matches(spec, function, pfs, patterns=None):
    """Whether a device_spec value (a dict) matches the host function
    ``function`` (an ``objects.Gpu``).  A spec naming a ``devname`` (a
    network interface, Nova's other way to name a device) matches no GPU
    function."""
    if DEVNAME in spec:
        return False
    vendor, product = _hex_id(spec.get('vendor_id')), _hex_id(
        spec.get('product_id'))
    if vendor is not None and vendor != function.vendor_id:
        return False
    if product is not None and product != function.product_id:
        return False
    return address_matches(spec.get('address'), function.address,
                           function.physfn, pfs, patterns)


def _flag(value, default):
    """Nova's ``strutils.bool_from_string`` of a tag (None: ``default``;
    anything it does not know: None)."""
    if value is None:
        return default
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    return None


def nova_resource_class(spec, function):
    """The resource class Nova reports a device under (its
    ``_get_rc_for_dev``)."""
    rc = spec.get('resource_class')
    if not rc:
        return ('CUSTOM_PCI_%s_%s' % (function.vendor_id,
                                      function.product_id)).upper()
    rc = str(rc).upper()
    if not rc.startswith('CUSTOM_'):
        import os_resource_classes
        if rc not in os_resource_classes.STANDARDS:
            rc = os_resource_classes.normalize_name(rc)
    return rc


# --- the comparison ----------------------------------------------------------

def differences(expected, nova_file, functions):
    """One line per difference between ``expected`` (the ``NovaConfig``
    of this host) and ``nova_file`` (``NovaFile``); ``functions``: every
    GPU function of the host (``objects.Gpu``, PFs and VFs)."""
    found = list(nova_file.problems)
    pfs = {f.address for f in functions if f.virtfns}
    carved_by_vf = expected.nova_vfs
    left_out = {w.vf: w for w in expected.withheld}
    patterns = Patterns()
    specs = []
    for entry in nova_file.specs:
        try:
            for function in functions:
                spec_matches(entry.value, function, pfs, patterns)
        except Unjudged as e:
            found.append('line %d: [pci] %s: %s'
                         % (entry.line, entry.key, e.kwargs['reason']))
            continue
        except exception.InvalidInput as e:
            found.append('line %d: [pci] %s: Nova refuses its %s'
                         % (entry.line, entry.key, e.kwargs['reason']))
            continue
        specs.append(entry)
    for function in sorted(functions, key=lambda f: f.address):
        matched = [e for e in specs
                   if spec_matches(e.value, function, pfs, patterns)]
        carved = carved_by_vf.get(function.address)
        if carved is None:
            withheld_vf = left_out.get(function.address)
            if matched and withheld_vf is not None:
                found.append('line %d: device_spec matches VF %s, which '
                             'Nova must not be given: %s' % (
                                 matched[0].line, function.address,
                                 withheld_vf.reason))
            elif matched:
                held = ', '.join(function.used_type_ids) or 'no vGPU'
                found.append('line %d: device_spec matches %s %s (holds '
                             '%s), which is not carved for Nova' % (
                                 matched[0].line,
                                 'VF' if function.is_vf else 'GPU',
                                 function.address, held))
            continue
        found.extend(_judge_vf(expected, carved, function, matched))
    for vf, carved in sorted(carved_by_vf.items()):
        if vf not in {f.address for f in functions}:
            found.append('carved VF %s ([%s]) is not on the host now: run '
                         '`libvirt-gpu restore`' % (vf,
                                                    carved.carving.section))
    found.extend(_judge_aliases(expected, nova_file))
    return found


def notes(nova_file):
    """What ``--check`` says of a Nova file beside its differences: each
    device_spec naming a ``devname`` (a network interface: it matches no
    GPU function, so it is no difference)."""
    return ['line %d: [pci] %s names devname %s, a network interface: it '
            'matches no GPU function (a VF carved for Nova is named by its '
            'address)' % (e.line, e.key, json.dumps(e.value[DEVNAME]))
            for e in nova_file.specs if DEVNAME in e.value]


def _judge_vf(expected, carved, function, matched):
    vf = function.address
    what = 'carved VF %s (%s, [%s])' % (vf, carved.type_name or
                                        carved.type_id,
                                        carved.carving.section)
    found = []
    held = function.used_type_ids
    if tuple(held) != (carved.type_id,):
        found.append('%s holds %s now, not %s: run `libvirt-gpu restore`'
                     % (what, ', '.join(held) or 'no vGPU', carved.type_id))
    if not matched:
        found.append('%s is missing: no [pci] device_spec matches it'
                     % what)
        return found
    spec, line = matched[0].value, matched[0].line   # Nova takes the first
    managed = _flag(spec.get('managed'), True)
    if 'managed' not in spec:
        found.append('line %d: device_spec of %s leaves out "managed", '
                     'which Nova takes as "yes": Nova would take the VF '
                     'from NVIDIA\'s driver; add "managed": "no"'
                     % (line, what))
    elif managed is not False:
        found.append('line %d: device_spec of %s has "managed": %s; it '
                     'must be "no" (the VF stays on NVIDIA\'s driver)'
                     % (line, what, json.dumps(spec.get('managed'))))
    rc = nova_resource_class(spec, function)
    if rc != carved.resource_class:
        found.append('line %d: device_spec of %s reports resource class '
                     '%s; this host carves it as %s' % (
                         line, what, rc, carved.resource_class))
    migratable = _flag(spec.get('live_migratable'), False)
    if migratable != expected.versions.live_migratable:
        found.append('line %d: device_spec of %s has "live_migratable": '
                     '%s; %s' % (line, what, json.dumps(
                         spec.get('live_migratable', 'no (absent)')),
                         expected.versions.describe()))
    return found


def _judge_aliases(expected, nova_file):
    found = []
    by_name = {}
    for entry in nova_file.aliases:
        by_name.setdefault(str(entry.value.get('name', '')).strip(),
                           []).append(entry)
    for alias in expected.aliases:
        entries = by_name.get(alias.name)
        if not entries:
            found.append('alias %s (resource class %s) is missing from '
                         '[pci] alias' % (alias.name, alias.resource_class))
            continue
        if len(entries) > 1:
            found.append('lines %s: alias %s is defined %d times; Nova\'s '
                         'PCI in Placement takes one spec per alias' % (
                             ', '.join(str(e.line) for e in entries),
                             alias.name, len(entries)))
        value, line = entries[0].value, entries[0].line
        if value.get('device_type') != DEVICE_TYPE:
            found.append('line %d: alias %s has "device_type": %s; it must '
                         'be "%s"' % (line, alias.name, json.dumps(
                             value.get('device_type')), DEVICE_TYPE))
        rc = str(value.get('resource_class', '')).upper()
        if rc != alias.resource_class:
            found.append('line %d: alias %s asks for resource class %s; '
                         'the VFs are reported as %s' % (
                             line, alias.name, rc or '(none)',
                             alias.resource_class))
        for key in ('vendor_id', 'product_id'):
            try:
                got = _hex_id(value.get(key))
            except exception.InvalidInput:
                got = value.get(key)
            if got is not None and got != getattr(alias, key):
                found.append('line %d: alias %s has "%s": %s; the VFs have '
                             '%s' % (line, alias.name, key,
                                     json.dumps(value.get(key)),
                                     getattr(alias, key)))
    return found


# --- the command -------------------------------------------------------------

def cmd_nova_config(ctx):
    from libvirt_gpu import conffile
    env = ctx.env
    carved = env.carved
    left_out = withheld(carved, env.vgpus.reserved_parents())
    versions = host_versions(ctx.libvirt_uri())
    expected = nova_config(carved.planned, versions, ctx.hostname,
                           conffile.config_path(ctx.args.config_file)[0],
                           left_out)
    # what Nova is not given, on stderr: stdout is the file (or JSON)
    for w in left_out:
        output.emit_text('libvirt-gpu: warning: ' + w.describe(),
                         sys.stderr)
    if ctx.args.check is None:
        if ctx.args.json:
            output.emit_json(expected.to_json(), keys_sorted=True)
        else:
            output.emit_text(expected.text())
        return 0
    nova_file = read_nova_file(ctx.args.check)
    found = differences(expected, nova_file, env.discovered.gpus)
    said = notes(nova_file)
    for line in said:
        output.emit_text('libvirt-gpu: note: ' + line, sys.stderr)
    if ctx.args.json:
        output.emit_json({'file': ctx.args.check, 'matches': not found,
                          'differences': found, 'notes': said,
                          'withheld': [w.to_json() for w in left_out]},
                         keys_sorted=True)
    elif found:
        output.emit_text('\n'.join(found))
    else:
        output.emit_text('%s matches the VFs carved for Nova on %s'
                         % (ctx.args.check, ctx.hostname))
    return 1 if found else 0


# --- parsers -----------------------------------------------------------------

def _nova_config_parser(sub, add):
    p = add('nova-config', cmd_nova_config,
            'print the [pci] device_spec and alias lines OpenStack Nova '
            'needs for the VFs carved for it ([nova]/carved; a file for '
            '/etc/nova/nova.conf.d/), or with --check compare a Nova '
            'configuration file with them: one line per difference, exit '
            'status 1 when there is any')
    p.add_argument('--check', metavar='FILE',
                   help='a Nova configuration file to compare (its [pci] '
                        'device_spec and alias lines)')


PARSERS = {'nova-config': _nova_config_parser}
