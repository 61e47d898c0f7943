"""The README and docs/ against the code, so that they cannot drift.

- docs/dev/architecture.md's module table is ``LEVELS`` of
  tests/doubles/architecture.py, row for row: rename, add or move a
  module and this fails until the table says so;
- its folder table names every folder of libvirt_gpu/ and, in the row of
  its folder, every module once; the folders under the root come from the
  floor up (none imports one of a row below it);
- the README stays a front page (at most 300 lines) with its "Install on
  a host" section;
- no figure of an earlier run is quoted as history ("17 min 35 s", "this
  round", "went from 965 s"): a figure in the docs says how to measure it;
- every relative link and every repository path the docs name in
  backquotes (``libvirt_gpu/...``, ``tests/...``, ``etc/...`` ...) exists;
- every ``libvirt-gpu`` command line in a shell block parses with the
  CLI's own parser, and the README's commands for a simulated host run.
"""

import ast
import glob
import os
import re
import subprocess
import sys

import pytest

from tests.doubles import architecture
from tests.doubles import paths

ROOT = paths.ROOT
README = os.path.join(ROOT, 'README.md')
ARCHITECTURE = os.path.join(ROOT, 'docs', 'dev', 'architecture.md')
PACKAGE_DIR = os.path.join(ROOT, 'libvirt_gpu')
README_MAX_LINES = 300


def _docs():
    """README.md and every Markdown file under docs/, relative to ROOT."""
    found = ['README.md'] + sorted(
        os.path.relpath(p, ROOT) for p in glob.glob(
            os.path.join(ROOT, 'docs', '**', '*.md'), recursive=True))
    assert len(found) > 5, found        # the walk saw the docs
    return found


def _read(rel):
    with open(os.path.join(ROOT, rel), encoding='utf-8') as f:
        return f.read()


def _prose(text):
    """``text`` without its fenced code blocks (``` ... ```)."""
    return re.sub(r'^```.*?^```', '', text, flags=re.S | re.M)


# --- (a) the module table is LEVELS ----------------------------------------

def _module(cell):
    """``sysfs/`` -> ``sysfs``, ``backends/nvidia_vgpu/names.py`` ->
    ``backends.nvidia_vgpu.names``."""
    name = cell.strip()
    name = name[:-len('.py')] if name.endswith('.py') else name.rstrip('/')
    return name.replace('/', '.')


def table_rows(text):
    """The module table of architecture.md's "The rooms" section: one set
    of module names (package-relative, dotted) per row, in order."""
    section = text.split('## The rooms', 1)[1].split('\n## ', 1)[0]
    lines = section.splitlines()
    start = next((i for i, line in enumerate(lines)
                  if line.replace(' ', '').startswith('|room|')), None)
    rows = []
    for line in lines[start + 2:] if start is not None else ():
        if not line.startswith('|'):
            break                       # the table ends at its first non-row
        first = line.split('|')[1]
        rows.append({_module(m) for m in re.findall(r'`([^`]+)`', first)})
    return rows


def _on_disk(module):
    path = os.path.join(PACKAGE_DIR, *module.split('.'))
    return os.path.isfile(path + '.py') or os.path.isfile(
        os.path.join(path, '__init__.py'))


def _row_text(rank):
    return ', '.join('`%s`' % (m.replace('.', '/') + (
        '/' if os.path.isdir(os.path.join(PACKAGE_DIR, *m.split('.')))
        else '.py')) for m in rank)


def test_the_module_table_is_levels_row_for_row():
    rows = table_rows(_read(ARCHITECTURE))
    levels = [set(rank) for rank in architecture.LEVELS]
    assert rows, 'no module table found under "## The rooms"'
    if rows != levels:
        want = '\n'.join('| %s | ... |' % _row_text(rank)
                         for rank in architecture.LEVELS)
        in_table = set().union(*rows)
        in_levels = set().union(*levels)
        pytest.fail(
            'docs/dev/architecture.md\'s module table differs from LEVELS '
            'in tests/doubles/architecture.py.\n'
            'only in the table: %s\nonly in LEVELS: %s\n'
            'The first column must read, row by row, from the floor up:\n%s'
            % (sorted(in_table - in_levels) or '-',
               sorted(in_levels - in_table) or '-', want))


def test_every_module_of_the_table_exists():
    named = set().union(*table_rows(_read(ARCHITECTURE)))
    missing = sorted(m for m in named if not _on_disk(m))
    assert missing == [], (
        'docs/dev/architecture.md names modules that are not under '
        'libvirt_gpu/: %s' % missing)


def test_the_table_reader_sees_a_renamed_module():
    text = ('## The rooms\n\n| room | owns |\n|---|---|\n'
            '| `exception.py`, `sysfs/` | x |\n| `backends/nvidia_vgpu/'
            'names.py` | y |\n\n| part | what |\n|---|---|\n'
            '| `vgpus` | not a room |\n\n## The doors\n'
            '| `not_a_row.py` | z |\n')
    assert table_rows(text) == [{'exception', 'sysfs'},
                                {'backends.nvidia_vgpu.names'}]


# --- (a) the folder table is the package's folders and modules -----------

def folder_rows(text):
    """The folder table of architecture.md's "The folders" section, in
    order: ``(folder, modules, folders)`` per row, the folder relative to
    the package (``''``: the root; ``devices/backends``), then the module
    (``x.py``) and folder (``x/``) names its second column gives in
    backquotes, bare, as often as it gives them."""
    section = text.split('## The folders', 1)[1].split('\n## ', 1)[0]
    rows = []
    for line in section.splitlines():
        cells = line.split('|')
        if not line.startswith('|') or len(cells) < 4:
            continue
        folder = re.fullmatch(r'\s*`libvirt_gpu/((?:\w+/)*)`\s*', cells[1])
        if folder is None:
            continue                    # the heading and its rule
        names = re.findall(r'`([^`]+)`', '|'.join(cells[2:]))
        rows.append((folder.group(1).rstrip('/'),
                     [n for n in names if re.fullmatch(r'\w+\.py', n)],
                     [n[:-1] for n in names if re.fullmatch(r'\w+/', n)]))
    return rows


def _holds_code(path):
    """Whether a package's ``__init__.py`` holds more than a docstring and
    plain assignments (the root's version): re-exports, functions."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    return any(not isinstance(node, (ast.Expr, ast.Assign))
               or isinstance(node, ast.Expr) and not isinstance(
                   node.value, ast.Constant) for node in tree.body)


def package_folders(package_dir=PACKAGE_DIR):
    """``{folder: (modules, directories)}`` of every folder of the package
    (a directory with an ``__init__.py``, at any depth; ``''``: the root):
    its modules (``x.py``; ``__init__.py`` where it holds code) and the
    directories in it (its folders, and data such as ``profiles``)."""
    found = {}
    for directory, dirs, files in os.walk(package_dir):
        dirs[:] = sorted(d for d in dirs if d != '__pycache__')
        if '__init__.py' not in files:
            continue
        rel = os.path.relpath(directory, package_dir)
        modules = {f for f in files if f.endswith('.py') and (
            f != '__init__.py' or _holds_code(os.path.join(directory, f)))}
        found['' if rel == '.' else rel.replace(os.sep, '/')] = (
            modules, set(dirs))
    return found


def folder_table_errors(rows, folders):
    """What the folder table ``rows`` (``folder_rows``) says wrong of the
    package's ``folders`` (``package_folders``), one line each."""
    errors = []
    named = [folder for folder, _, _ in rows]
    for folder in sorted(set(folders) - set(named)):
        errors.append('no row for libvirt_gpu/%s: add one naming %s' % (
            folder + '/' if folder else '', ', '.join(sorted(
                folders[folder][0])) or 'its folders'))
    for folder in sorted(set(named) - set(folders)):
        errors.append('a row for libvirt_gpu/%s, which is no folder of '
                      'the package' % (folder + '/' if folder else ''))
    for folder in sorted({f for f in named if named.count(f) > 1}):
        errors.append('libvirt_gpu/%s/ has %d rows' % (
            folder, named.count(folder)))
    for folder, modules, dirs in rows:
        if folder not in folders:
            continue
        where = 'libvirt_gpu/%s' % (folder + '/' if folder else '')
        have, subdirs = folders[folder]
        for name in sorted({m for m in modules if modules.count(m) > 1}):
            errors.append('%s: %s named %d times' % (
                where, name, modules.count(name)))
        for name in sorted(have - set(modules)):
            errors.append('%s: %s is not named' % (where, name))
        for name in sorted(set(modules) - have):
            errors.append('%s: %s is no module of this folder' % (
                where, name))
        for name in sorted(set(dirs) - subdirs):
            errors.append('%s: %s/ is no directory of this folder' % (
                where, name))
    return errors


def test_the_folder_table_names_every_folder_and_module_once():
    rows = folder_rows(_read(ARCHITECTURE))
    assert rows, 'no folder table found under "## The folders"'
    errors = folder_table_errors(rows, package_folders())
    assert errors == [], (
        "docs/dev/architecture.md's folder table differs from "
        'libvirt_gpu/:\n%s' % '\n'.join(errors))


def test_the_layer_folders_come_from_the_floor_up():
    """Each folder under the root imports only folders of the rows above
    it (the root's modules, which sit at several rows of the rooms' table,
    aside, and the arrows test_architecture excuses)."""
    order = [folder for folder, _, _ in folder_rows(_read(ARCHITECTURE))
             if folder and '/' not in folder]
    excused = {(a.split('.')[0], b.split('.')[0])
               for a, b in architecture.FOLDER_ARROWS_EXCUSED}
    arrows = architecture.folder_graph(
        architecture.door_graph(), top=True, excused=excused)
    assert set(order) == {f for f in package_folders()
                          if f and '/' not in f}, order
    below = folders_below(order, arrows)
    assert below == [], below


def folders_below(order, arrows):
    """Each folder of ``order`` (the rows, from the floor up) that imports
    one of a row below it (``arrows``: architecture.folder_graph),
    one line each, naming a module that does."""
    return sorted('%s imports %s, on a row below it (%s)' % (
        folder, target, arrows[folder][target][0][0])
        for i, folder in enumerate(order)
        for target in arrows.get(folder, ())
        if target in order[i + 1:])


def test_the_folder_table_check_sees_what_is_wrong(tmp_path):
    text = ('## The folders\n\n| folder | what is in it |\n|---|---|\n'
            '| `libvirt_gpu/` | `exception.py` and `sub/` |\n'
            '| `libvirt_gpu/sub/` | `a.py`, `a.py`, `c.py` and `data/` |\n'
            '| `libvirt_gpu/gone/` | `x.py` |\n\n## The rooms\n'
            '| `libvirt_gpu/other/` | `y.py` |\n')
    rows = folder_rows(text)
    assert rows == [('', ['exception.py'], ['sub']),
                    ('sub', ['a.py', 'a.py', 'c.py'], ['data']),
                    ('gone', ['x.py'], [])]
    package = tmp_path / 'libvirt_gpu'
    for rel in ('sub', 'sub/inner', 'sub/data'):
        (package / rel).mkdir(parents=True)
    (package / '__init__.py').write_text('"""The package."""\nv = 1\n')
    (package / 'exception.py').write_text('')
    (package / 'sub' / '__init__.py').write_text('"""Only a docstring."""\n')
    (package / 'sub' / 'a.py').write_text('')
    (package / 'sub' / 'b.py').write_text('')
    (package / 'sub' / 'inner' / '__init__.py').write_text(
        'from libvirt_gpu.sub import a  # noqa\n')
    folders = package_folders(str(package))
    assert folders == {'': ({'exception.py'}, {'sub'}),
                       'sub': ({'a.py', 'b.py'}, {'data', 'inner'}),
                       'sub/inner': ({'__init__.py'}, set())}
    assert folder_table_errors(rows, folders) == [
        'no row for libvirt_gpu/sub/inner/: add one naming __init__.py',
        'a row for libvirt_gpu/gone/, which is no folder of the package',
        'libvirt_gpu/sub/: a.py named 2 times',
        'libvirt_gpu/sub/: b.py is not named',
        'libvirt_gpu/sub/: c.py is no module of this folder']
    # a row above a folder it imports
    arrows = {'store': {'devices': [('store.allocator', 'devices.capacity')],
                        'util': [('store.state', 'util.fileutil')]}}
    assert folders_below(['util', 'store', 'devices'], arrows) == [
        'store imports devices, on a row below it (store.allocator)']
    assert folders_below(['util', 'devices', 'store'], arrows) == []


# --- (b) the README is a front page ----------------------------------------

def test_the_readme_is_a_front_page_with_install_on_a_host():
    text = _read('README.md')
    lines = text.count('\n')
    assert lines <= README_MAX_LINES, (
        'README.md has %d lines, more than %d: move the detail to '
        'docs/admin/ or docs/dev/ and link to it'
        % (lines, README_MAX_LINES))
    headings = re.findall(r'^#+ (.+)$', _prose(text), flags=re.M)
    assert 'Install on a host' in headings, headings


# --- (c) no history of earlier runs -----------------------------------------

HISTORY = [
    r'\b\d+ ?min(?:utes?)? \d+ ?s\b',                   # 17 min 35 s
    r'\b(?:this|last|previous|earlier|next|the other) rounds?\b',
    r'\bbefore this (?:round|change|release)\b',
    r'\bwent (?:up |down )?from [\d.]+',                 # went from 965 s
    r'\b(?:was|were) [\d.]+ ?(?:ms|s|min|minutes|seconds)\b.{0,40}\bnow\b',
    r'\b[\d.]+ ?(?:ms|s|min) (?:instead of|against|before:?) [\d.]+ ?'
    r'(?:ms|s|min)\b',
    r'\bmeasured (?:in|on) (?:a|this|the) .{0,40}(?:machine|round)\b',
    r'\bBefore: [\d.]+',
]


def _history(text):
    return [m.group(0) for pattern in HISTORY
            for m in re.finditer(pattern, text, flags=re.I)]


@pytest.mark.parametrize('rel', _docs())
def test_no_timing_history(rel):
    found = _history(_read(rel))
    assert found == [], (
        '%s quotes figures of earlier runs: %s; say how to measure it '
        '(the command) and how things are, not how they were' % (rel, found))


def test_the_history_check_sees_history():
    assert _history('17 min 0 s and 17 min 35 s in two runs') != []
    assert _history('the previous round took longer') != []
    assert _history('The kernel layer went from 965 s to 732 s') != []
    assert _history('answers in 4 s instead of 17 s') != []
    assert _history('run `make bench` to measure it') == []


# --- (d) links and paths -------------------------------------------------

def _slug(heading):
    """GitHub's anchor of a heading."""
    text = re.sub(r'[`*_\[\]]|\(.*?\)', lambda m: '' if m.group(0)[0] in
                  '`*_[]' else m.group(0), heading).strip().lower()
    text = re.sub(r'[^\w\- ]', '', text)
    return text.replace(' ', '-')


def _anchors(rel):
    return {_slug(h) for h in re.findall(r'^#+ (.+)$', _prose(_read(rel)),
                                         flags=re.M)}


def _links(rel):
    return re.findall(r'\[[^\]]*\]\(([^)\s]+)\)', _prose(_read(rel)))


@pytest.mark.parametrize('rel', _docs())
def test_every_relative_link_points_to_a_file_that_exists(rel):
    broken = []
    for link in _links(rel):
        if re.match(r'[a-z][a-z0-9+.-]*:', link):     # http:, mailto: ...
            continue
        path, _, anchor = link.partition('#')
        target = os.path.normpath(os.path.join(
            os.path.dirname(os.path.join(ROOT, rel)), path)) if path \
            else os.path.join(ROOT, rel)
        if not os.path.exists(target):
            broken.append(link)
        elif anchor and target.endswith('.md') and anchor not in _anchors(
                os.path.relpath(target, ROOT)):
            broken.append(link + ' (no such heading)')
    assert broken == [], '%s links to what does not exist: %s' % (rel,
                                                                  broken)


PATH_PREFIXES = ('libvirt_gpu/', 'tests/', 'bench/', 'etc/', 'templates/',
                 'hooks/', 'docs/')


def _repo_paths(rel):
    """Repository paths named in backquotes:
    ``tests/unit/guests/hook/test_hook.py``,
    ``etc/libvirt-gpu/systemd/``; not patterns or placeholders."""
    for name in re.findall(r'`([^`\s]+)`', _read(rel)):
        name = name.rstrip('.,:;')
        if name.startswith(PATH_PREFIXES) and not re.search(
                r'[*<>{}$]|\.\.\.|…', name):
            yield name


@pytest.mark.parametrize('rel', _docs())
def test_every_repository_path_named_exists(rel):
    missing = sorted({p for p in _repo_paths(rel)
                      if not os.path.exists(os.path.join(ROOT, p))})
    assert missing == [], '%s names paths that do not exist: %s' % (
        rel, missing)


# --- (e) the commands ----------------------------------------------------

def _shell_blocks(rel):
    return re.findall(r'^```(?:sh|bash|shell)\n(.*?)^```', _read(rel),
                      flags=re.S | re.M)


def _commands(rel):
    """Every ``libvirt-gpu ...`` line of a shell block (comments cut) that
    is a command, not a synopsis (no [optional], (a | b), <placeholder>,
    ``...``)."""
    for block in _shell_blocks(rel):
        for line in block.splitlines():
            line = line.split(' #', 1)[0].strip()
            if not line.startswith('libvirt-gpu '):
                continue
            if re.search(r'[\[\]()<>|]|\.\.\.', line) or re.search(
                    r'\b[A-Z][A-Z_]{2,}\b', line):   # DOMAIN, DEST_URI, ...
                continue
            yield line


def _all_commands():
    return sorted({(rel, line) for rel in _docs() for line in _commands(rel)})


def _parser():
    from libvirt_gpu.cmd import main as cli_main
    return cli_main.build_parser()


@pytest.mark.parametrize('rel, line', _all_commands())
def test_every_command_in_the_docs_parses(rel, line):
    import shlex
    argv = shlex.split(line)[1:]
    parser = _parser()
    if argv == ['--version'] and '--version' not in parser.format_help():
        pytest.skip('libvirt-gpu --version is not in this checkout yet')
    try:
        parser.parse_args(argv)
    except SystemExit as e:
        assert e.code == 0, '%s: `%s` does not parse (exit %s)' % (
            rel, line, e.code)


def _synopses():
    """Every ``libvirt-gpu`` line of a shell block, synopses included."""
    return sorted({(rel, line.split(' #', 1)[0].strip())
                   for rel in _docs() for block in _shell_blocks(rel)
                   for line in block.splitlines()
                   if line.startswith('libvirt-gpu ')})


def _subparsers(parser):
    import argparse
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices
    return {}


def _options(parser):
    return {o for a in parser._actions for o in a.option_strings}


@pytest.mark.parametrize('rel, line', _synopses())
def test_every_option_in_the_docs_exists(rel, line):
    """``--flag`` of a documented command line, synopses included, is an
    option of that command (or a global one)."""
    parser = _parser()
    known = _options(parser)
    words = iter(line.replace('|', ' ').replace('[', ' ').replace(
        ']', ' ').replace('(', ' ').replace(')', ' ').split()[1:])
    current = parser
    for word in words:
        if word in ('-c', '--connect', '--sysfs-root', '--config-file',
                    '--hostname'):
            next(words, None)
        elif not word.startswith('-') and word in _subparsers(current):
            current = _subparsers(current)[word]
            known |= _options(current)
    flags = {w.split('=', 1)[0]
             for w in re.findall(r'(?<![\w-])--?[a-z][\w-]*', line)}
    unknown = sorted(f for f in flags if f not in known and f != '--version')
    assert unknown == [], '%s: `%s` uses options the CLI lacks: %s' % (
        rel, line, unknown)


def test_the_command_scan_finds_the_readme_s_commands():
    found = {line for _, line in _all_commands()}
    assert 'libvirt-gpu hook install' in found
    assert 'libvirt-gpu --sysfs-root /tmp/sim list' in found


def _console_script():
    """The ``module:function`` setup.py installs as ``libvirt-gpu``."""
    (spec,) = re.findall(r"'libvirt-gpu = ([\w.]+:\w+)'",
                         _read('setup.py'))
    return spec.split(':')


def test_the_readme_s_simulated_host_commands_run(tmp_path):
    """The README's block for a host without a GPU, run as written (with
    /tmp/sim in a temporary directory)."""
    text = _read('README.md')
    blocks = [b for b in _shell_blocks('README.md')
              if b.startswith('libvirt-gpu simulate ')]
    assert len(blocks) == 1, 'the README has one block for a simulated host'
    module, function = _console_script()
    sim = str(tmp_path / 'sim')
    env = dict(os.environ, LIBVIRT_GPU_CONFIG='/dev/null',
               LIBVIRT_GPU_CACHE_DIR='', PYTHONPATH=ROOT)
    ran = 0
    for line in blocks[0].splitlines():
        line = line.split(' #', 1)[0].strip()
        if not line:
            continue
        assert line.startswith('libvirt-gpu '), line
        argv = line.replace('/tmp/sim', sim).split()[1:]
        done = subprocess.run(
            [sys.executable, '-c', 'import sys, %s as m; sys.exit(m.%s())'
             % (module, function)] + argv, cwd=ROOT, env=env,
            capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (line, done.stderr)
        assert 'error' not in done.stderr, (line, done.stderr)
        ran += 1
    assert ran >= 3
    assert '0000:af:00.0' in text


def test_the_units_documentation_lines_name_installed_guides():
    # setup.py installs docs/admin/ as <prefix>/share/doc/libvirt-gpu/admin
    units = glob.glob(os.path.join(ROOT, 'etc', 'libvirt-gpu', 'systemd',
                                   '*.service'))
    assert len(units) == 4
    for unit in units:
        with open(unit) as f:
            lines = [line for line in f if line.startswith('Documentation=')]
        assert len(lines) == 1, unit
        prefix = 'Documentation=file:///opt/libvirt-gpu/share/doc/' \
                 'libvirt-gpu/admin/'
        assert lines[0].startswith(prefix), (unit, lines[0])
        guide = lines[0].strip()[len(prefix):]
        assert os.path.isfile(os.path.join(ROOT, 'docs', 'admin', guide)), \
            (unit, guide)
