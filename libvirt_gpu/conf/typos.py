"""Mistakes in the configuration file are errors, not silence.

oslo.config ignores an option or section nobody registered, and lets the
last of two settings of one option win: a misspelt ``enabled_vgpu_type``
would leave every GPU whole and the hook's refusal would then blame the
GPU; an option set twice would be edited in one place and read from the
other.  After every group is registered, the file is read once more
(``check``), and the first of these is refused with one line naming it:

- a section nobody registered, with the nearest known name;
- an option its section does not have, with the nearest known name.  The
  known options of a section are the registered ones (whatever module
  registered them), except in ``[placement]``: keystoneauth registers its
  options per authentication plugin, and only when a client is built, so
  there they are ours, keystoneauth's session and adapter options, and
  those of the plugin ``auth_type`` names (an unknown ``auth_type`` is
  refused too, with the nearest plugin name);
- a ``[vgpu_<type>]`` section of a type ``[gpu]/enabled_vgpu_types`` does
  not enable: nothing reads it (its ``device_addresses`` would be ignored
  and every GPU that offers the enabled type sliced), so it is named,
  with the enabled type it is nearest to;
- a ``[nova_<name>]`` section of a carving ``[nova]/carved`` does not
  list, likewise, with the listed carving it is nearest to;
- an option set twice in one section, or a section opened twice, naming
  both lines (oslo.config would merge the sections and let the last
  value win; an option registered as a multi-valued one may repeat).
"""

import difflib

from oslo_config import cfg

from libvirt_gpu import exception

VGPU_PREFIX = 'vgpu_'
CARVING_PREFIX = 'nova_'
PLACEMENT = 'placement'


def _nearest(name, known):
    found = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    return '; did you mean %s?' % found[0] if found else ''


def _groups(conf):
    return {name for name in conf
            if isinstance(conf[name], cfg.ConfigOpts.GroupAttr)}


def _options_of(conf, group_name):
    if group_name == 'DEFAULT':
        return {name for name in conf
                if not isinstance(conf[name], cfg.ConfigOpts.GroupAttr)}
    return set(conf[group_name])


def _multi_options(conf, group_name):
    """The options of ``group_name`` that may be given more than once."""
    group = None if group_name == 'DEFAULT' else group_name
    found = set()
    for name in _options_of(conf, group_name):
        try:
            opt = conf._get_opt_info(name, group)['opt']
        except (cfg.NoSuchOptError, cfg.NoSuchGroupError, KeyError):
            continue
        if getattr(opt, 'multi', False):
            found.add(name)
    return found


class _Parser(cfg.ConfigParser):
    """oslo.config's own parser, keeping where each section and option
    was given: ``lines[section]`` the lines that open it,
    ``lines[section, key]`` those that set it."""

    def __init__(self, filename, sections):
        super().__init__(filename, sections)
        self.lines = {}
        self._key_line = None

    def _split_key_value(self, line):
        self._key_line = self.lineno
        return super()._split_key_value(line)

    def new_section(self, section):
        super().new_section(section)
        self.lines.setdefault(section, []).append(self.lineno)

    def assignment(self, key, value):
        super().assignment(key, value)
        self.lines.setdefault((self.section, key), []).append(
            self._key_line)


def _refuse(path, text):
    return exception.ConfigError(reason='%s: %s' % (path, text))


def check(conf, path, vgpu_options, carving_options=()):
    """Refuse the first mistake of the file ``path`` (see the module doc):
    ConfigError naming it and what to do.  ``vgpu_options``: the option
    names of a ``[vgpu_<type>]`` section; ``carving_options``: those of a
    ``[nova_<name>]`` section."""
    sections = {}
    parser = _Parser(path, sections)
    try:
        parser.parse()
    except (OSError, UnicodeDecodeError, cfg.ParseError):
        return          # oslo.config has read it already: it says what
    _check_twice(conf, path, sections, parser.lines)
    groups = _groups(conf)
    enabled = [t for t in conf.gpu.enabled_vgpu_types]
    for section in sorted(sections):
        if section == 'DEFAULT':
            known = _options_of(conf, 'DEFAULT')
        elif section == PLACEMENT and section in groups:
            known = _placement_options(conf, path, sections[section])
        elif section in groups:
            known = _options_of(conf, section)
        elif section.startswith(VGPU_PREFIX):
            known = set(vgpu_options)
        elif section.startswith(CARVING_PREFIX) and carving_options:
            known = set(carving_options)
        else:
            raise _refuse(path, 'unknown section [%s]%s (sections: %s)'
                          % (section, _nearest(section, groups | {'DEFAULT'}),
                             ', '.join(sorted(
                                 g for g in groups if not g.startswith(
                                     (VGPU_PREFIX, CARVING_PREFIX))))))
        for name in sorted(sections[section]):
            if name not in known:
                raise _refuse(path, 'unknown option [%s]/%s%s'
                              % (section, name, _nearest(name, known)))
        if section.startswith(VGPU_PREFIX) and section not in groups:
            raise _refuse(path, _not_enabled(section, enabled))
        if section.startswith(CARVING_PREFIX) and section not in groups:
            raise _refuse(path, _not_carved(section, conf.nova.carved))


def _not_carved(section, carved):
    name = section[len(CARVING_PREFIX):]
    near = difflib.get_close_matches(name, sorted(carved), n=1, cutoff=0.6)
    what = ('did you mean [%s%s]?' % (CARVING_PREFIX, near[0]) if near
            else 'list it in [nova]/carved or remove the section')
    return ('section [%s] is a carving [nova]/carved (%s) does not list, '
            'so nothing would read it; %s'
            % (section, ', '.join(carved) or 'empty', what))


def _not_enabled(section, enabled):
    type_id = section[len(VGPU_PREFIX):]
    near = difflib.get_close_matches(type_id, sorted(enabled), n=1,
                                     cutoff=0.6)
    what = ('did you mean [%s%s]?' % (VGPU_PREFIX, near[0]) if near
            else 'enable the type there or remove the section')
    return ('section [%s] is of type %s, which [gpu]/enabled_vgpu_types '
            '(%s) does not enable, so nothing would read it; %s'
            % (section, type_id, ', '.join(enabled) or 'empty', what))


def _check_twice(conf, path, sections, lines):
    """A section opened twice, or an option given twice, naming both
    lines."""
    for section in sorted(sections):
        opened = lines.get(section, [])
        if len(opened) > 1:
            raise _refuse(path, 'section [%s] is opened twice (lines %d and '
                                '%d); merge them into one'
                          % (section, opened[0], opened[1]))
    for section in sorted(sections):
        multi = None
        for name in sorted(sections[section]):
            given = lines.get((section, name), [])
            if len(given) < 2:
                continue
            if multi is None:
                multi = (_multi_options(conf, section)
                         if section in _groups(conf) or section == 'DEFAULT'
                         else set())
            if name in multi:
                continue
            raise _refuse(path, '[%s]/%s is set twice (lines %d and %d), '
                                'and only the last would count; keep one'
                          % (section, name, given[0], given[1]))


def _placement_options(conf, path, given):
    """The options ``[placement]`` may hold: ours (registered), and,
    when the file gives one that is not, keystoneauth's session, adapter
    and common auth options and those of the plugin ``auth_type`` names
    (keystoneauth is imported only then)."""
    known = _options_of(conf, PLACEMENT)
    if set(given) <= known:
        return known
    from keystoneauth1 import exceptions as ks_exceptions
    from keystoneauth1 import loading as ks_loading
    for opt in (ks_loading.get_session_conf_options()
                + ks_loading.get_auth_common_conf_options()
                + ks_loading.get_adapter_conf_options(
                    include_deprecated=False)):
        known.add(opt.dest)
    auth_type = (given.get('auth_type') or [None])[-1]
    if auth_type:
        try:
            ks_loading.get_plugin_loader(auth_type)
        except ks_exceptions.NoMatchingPlugin:
            names = set(ks_loading.get_available_plugin_names())
            raise _refuse(path, 'unknown [placement]/auth_type %s%s (the '
                                'keystoneauth plugins: password, token, '
                                'v3applicationcredential, ...)'
                          % (auth_type, _nearest(auth_type, names)))
        for opt in ks_loading.get_auth_plugin_conf_options(auth_type):
            known.add(opt.dest)
            known.update(d.name for d in opt.deprecated_opts
                         if d.group in (None, PLACEMENT))
    return known
