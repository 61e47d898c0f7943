"""tests/tools/mutation.py: the sample it draws and the interval it
prints, the parts of ``make mutation`` that are ours rather than
mutmut's."""

import importlib.util
import io
import os

import pytest
from tests.doubles import paths

_PATH = os.path.join(paths.TESTS,
                     'tools', 'mutation.py')
_spec = importlib.util.spec_from_file_location('mutation_tool', _PATH)
tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tool)


def test_wilson_matches_the_published_interval():
    # 90 of 100: 0.8256 to 0.9448 (Wilson score interval, z = 1.96).
    low, high = tool.wilson(90, 100)
    assert low == pytest.approx(0.8256, abs=5e-4)
    assert high == pytest.approx(0.9448, abs=5e-4)


def test_wilson_stays_inside_zero_and_one():
    assert tool.wilson(0, 10)[0] == 0.0
    assert tool.wilson(10, 10)[1] == 1.0
    assert tool.wilson(10, 10)[0] == pytest.approx(0.7225, abs=5e-4)
    assert tool.wilson(0, 0) == (0.0, 1.0)


def test_draw_is_the_same_for_a_seed_and_differs_between_seeds():
    names = ['m.x__mutmut_%d' % i for i in range(500)]
    one = tool.draw(names, 50, 7)
    assert one == tool.draw(list(reversed(names)), 50, 7)
    assert len(one) == len(set(one)) == 50
    assert set(one) <= set(names)
    assert one != tool.draw(names, 50, 8)


def test_draw_of_more_than_there_are_is_all_of_them():
    assert tool.draw(['b', 'a'], 2, 1) == ['a', 'b']
    assert tool.draw(['b', 'a'], 3, 1) == ['a', 'b']


def test_the_report_gives_the_interval_only_for_a_sample():
    found = {'libvirt_gpu/a.py': {'a.f__mutmut_1': 'killed',
                                  'a.f__mutmut_2': 'survived',
                                  'a.f__mutmut_3': 'not checked'}}
    out = io.StringIO()
    assert tool.report(found, out=out) == (1, 2)
    assert 'interval' not in out.getvalue()
    assert 'survived       a.f__mutmut_2' in out.getvalue()
    out = io.StringIO()
    tool.report(found, out=out, sampled=True)
    assert '95% interval 9.5% to 90.5%' in out.getvalue()


def test_the_selection_ignores_files_and_deselects_tests():
    assert tool.selection(['tests/unit'], [
        'tests/unit/test_a.py', 'tests/unit/test_b.py::test_c']) == [
        'tests/unit', '--ignore=tests/unit/test_a.py',
        '--deselect=tests/unit/test_b.py::test_c']
    assert tool.selection(['t.py']) == ['t.py']


def test_only_keeps_the_mutants_a_glob_names():
    found = {'libvirt_gpu/a.py': {
        'a.xǁCǁf__mutmut_1': 'killed', 'a.xǁCǁf__mutmut_2': 'survived',
        'a.xǁCǁff__mutmut_1': 'survived', 'a.x_g__mutmut_1': 'survived'}}
    assert tool.selected(found, []) == found
    assert tool.selected(found, ['a.xǁCǁf__mutmut_*']) == {
        'libvirt_gpu/a.py': {'a.xǁCǁf__mutmut_1': 'killed',
                             'a.xǁCǁf__mutmut_2': 'survived'}}
    assert tool.selected(found, ['a.xǁCǁf__mutmut_1', 'a.x_g*']) == {
        'libvirt_gpu/a.py': {'a.xǁCǁf__mutmut_1': 'killed',
                             'a.x_g__mutmut_1': 'survived'}}
    out = io.StringIO()
    assert tool.report(tool.selected(found, ['*ǁff_*']), out=out) == (0, 1)


def _child(site, where, env_mutant, code):
    env = dict(os.environ, PYTHONPATH=site, MUTANT_UNDER_TEST=env_mutant)
    env[tool.HITS_ENV] = where
    env.pop('PYTHONSAFEPATH', None)
    import subprocess
    import sys
    subprocess.run([sys.executable, '-c', code], env=env, check=True)


def test_a_started_python_writes_down_what_it_called(tmp_path, monkeypatch):
    monkeypatch.setenv('PYTHONPATH', '/elsewhere')
    where = tool.child_hits(str(tmp_path))
    assert os.environ['PYTHONPATH'].split(os.pathsep) == [
        str(tmp_path / '.child-site'), str(tmp_path), '/elsewhere']
    assert os.environ[tool.HITS_ENV] == where
    site = str(tmp_path / '.child-site')
    call = ('from mutmut.mutation import trampoline as t; '
            't.record_trampoline_hit("libvirt_gpu.a.x_f"); '
            't.record_trampoline_hit("libvirt_gpu.b.x_g", caller="c")')
    _child(site, where, 'stats', call)
    files = os.listdir(where)
    assert len(files) == 1 and files[0].endswith('.hits')
    stats = set()
    plugin = tool.ChildHits(where, stats)
    plugin.pytest_runtest_teardown(None, None)
    assert stats == {'libvirt_gpu.a.x_f', 'libvirt_gpu.b.x_g'}
    assert os.listdir(where) == []


@pytest.mark.parametrize('mutant', ['', 'libvirt_gpu.a.x_f__mutmut_1',
                                    'fail'])
def test_only_the_stats_run_is_written_down(tmp_path, monkeypatch, mutant):
    monkeypatch.delenv('PYTHONPATH', raising=False)
    where = tool.child_hits(str(tmp_path))
    _child(str(tmp_path / '.child-site'), where, mutant,
           'import sitecustomize')
    assert os.listdir(where) == []


def test_a_python_that_called_nothing_leaves_no_file(tmp_path, monkeypatch):
    monkeypatch.delenv('PYTHONPATH', raising=False)
    where = tool.child_hits(str(tmp_path))
    _child(str(tmp_path / '.child-site'), where, 'stats', 'pass')
    assert os.listdir(where) == []


def _unit_tree(root, files):
    for rel, text in files.items():
        path = root / 'tests' / 'unit' / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_a_modules_tests_are_those_of_its_mirrored_folder(tmp_path,
                                                          monkeypatch):
    # tests/unit/ mirrors libvirt_gpu/: the files named after the module
    # in its package's folder, and any file that imports it; a file of
    # that name in another folder is another module's
    _unit_tree(tmp_path, {
        'devices/test_layout.py': '',
        'devices/test_layout_apply.py': '',
        'devices/test_layouts.py': '',
        'test_layout.py': '',
        'store/test_layout.py': '',
        'cmd/test_layout_cmds.py': 'from libvirt_gpu.devices import layout\n',
        'cmd/test_other.py': 'from libvirt_gpu.devices import nvml\n',
        'guests/hook/test_hook.py': '',
        'guests/hook/test_hook_leases.py': '',
        'guests/test_hook.py': ''})
    monkeypatch.setattr(tool, 'ROOT', str(tmp_path))
    assert tool.tests_for('libvirt_gpu/devices/layout.py') == [
        'tests/unit/cmd/test_layout_cmds.py',
        'tests/unit/devices/test_layout.py',
        'tests/unit/devices/test_layout_apply.py']
    assert tool.tests_for('libvirt_gpu/guests/hook/__init__.py') == [
        'tests/unit/guests/hook/test_hook.py',
        'tests/unit/guests/hook/test_hook_leases.py']
