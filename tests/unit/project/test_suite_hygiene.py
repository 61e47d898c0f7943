"""What makes a test look run when it is not: a fixture named like a test
(``def test_x`` under ``@pytest.fixture``) reads as a test in a listing,
and pytest never collects it."""

import os
import re
from tests.doubles import paths

ROOT = paths.ROOT
# a fixture decorator, maybe more decorators, then a def named test...
_FIXTURE_TEST = re.compile(
    r'^@(?:pytest\.)?fixture\b[^\n]*\n(?:(?:@|\s)[^\n]*\n)*?'
    r'def (test\w*)\(', re.M)


def fixtures_named_like_tests(top):
    found = []
    for folder, dirs, files in os.walk(top):
        dirs[:] = sorted(d for d in dirs if d not in ('data', '__pycache__'))
        for name in sorted(files):
            if name.endswith('.py'):
                path = os.path.join(folder, name)
                with open(path) as f:
                    found += ['%s::%s' % (os.path.relpath(path, top), m)
                              for m in _FIXTURE_TEST.findall(f.read())]
    return found


def test_no_fixture_is_named_like_a_test():
    assert fixtures_named_like_tests(os.path.join(ROOT, 'tests')) == []


def test_the_fixture_check_sees_one(tmp_path):
    (tmp_path / 'test_x.py').write_text(
        'import pytest\n\n\n@pytest.fixture\ndef test_conf(tmp_path):\n'
        '    return tmp_path\n\n\n@pytest.fixture(scope="module")\n'
        'def test_other():\n    pass\n\n\ndef test_real(test_conf):\n'
        '    pass\n')
    assert fixtures_named_like_tests(str(tmp_path)) == [
        'test_x.py::test_conf', 'test_x.py::test_other']


def test_a_socket_binds_below_the_af_unix_limit(tmp_path):
    # tests/doubles/sockets.py: a socket file at a path longer than an
    # AF_UNIX address may be, as a clone under /tmp makes tmp_path
    import stat
    from tests.doubles import sockets
    deep = tmp_path / ('d' * 60) / ('e' * 60)
    deep.mkdir(parents=True)
    path = deep / 'nova.sock'
    assert len(str(path)) > 108
    with sockets.unix_socket(path) as sock:
        assert stat.S_ISSOCK(os.lstat(path).st_mode)
        sock.listen(1)
    assert stat.S_ISSOCK(os.lstat(sockets.make_socket_file(
        deep / 'other')).st_mode)
