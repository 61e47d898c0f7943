"""Typos in the configuration file are errors, not silence.

oslo.config ignores an option or section nobody registered: a misspelt
``enabled_vgpu_type`` would leave every GPU whole and the hook's refusal
would then blame the GPU.  After every group is registered, each section
and option of the file is compared with the registered ones and the first
unknown one refused, naming the nearest known name.

Not checked: the options of ``[placement]`` (keystoneauth registers its
authentication options by plugin, only when a client is built), and
``[vgpu_<type>]`` sections of types not enabled are checked against the
options of a ``[vgpu_<type>]`` section (they are read by nothing, but a
type can be enabled and disabled by one line); ``[nova_<name>]`` sections
of carvings ``[nova]/carved`` does not list likewise, against a
carving's options.
"""

import difflib

from oslo_config import cfg

from libvirt_gpu import exception

# Groups whose options are registered elsewhere, on demand.
UNCHECKED_OPTIONS = ('placement',)
VGPU_PREFIX = 'vgpu_'
CARVING_PREFIX = 'nova_'


def _nearest(name, known):
    found = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    return '; did you mean %s?' % found[0] if found else ''


def _options_of(conf, group_name):
    if group_name == 'DEFAULT':
        return {name for name in conf
                if not isinstance(conf[name], cfg.ConfigOpts.GroupAttr)}
    return set(conf[group_name])


def check(conf, path, vgpu_options, carving_options=()):
    """Refuse the first unknown section or option of the file ``path``
    (ConfigError naming the nearest known name).  ``vgpu_options``: the
    option names of a ``[vgpu_<type>]`` section; ``carving_options``:
    those of a ``[nova_<name>]`` section."""
    sections = {}
    try:
        cfg.ConfigParser(path, sections).parse()
    except (OSError, cfg.ParseError):
        return          # oslo.config has read it already: it says what
    groups = {name for name in conf
              if isinstance(conf[name], cfg.ConfigOpts.GroupAttr)}
    for section in sorted(sections):
        if section == 'DEFAULT':
            known = _options_of(conf, 'DEFAULT')
        elif section in groups:
            if section in UNCHECKED_OPTIONS:
                continue
            known = _options_of(conf, section)
        elif section.startswith(VGPU_PREFIX):
            known = set(vgpu_options)
        elif section.startswith(CARVING_PREFIX) and carving_options:
            known = set(carving_options)
        else:
            raise exception.ConfigError(
                reason='%s: unknown section [%s]%s (sections: %s)'
                % (path, section,
                   _nearest(section, groups | {'DEFAULT'}),
                   ', '.join(sorted(groups - set(
                       g for g in groups if g.startswith(
                           (VGPU_PREFIX, CARVING_PREFIX)))))))
        for name in sorted(sections[section]):
            if name not in known:
                raise exception.ConfigError(
                    reason='%s: unknown option [%s]/%s%s'
                    % (path, section, name, _nearest(name, known)))
