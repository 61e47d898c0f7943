"""`libvirt-gpu placement sync` and `agent --once` against a real Placement,
on a simulated T4 host, through the CLI entry point."""

import json
import os

import pytest

from libvirt_gpu.store import figures
from libvirt_gpu import simulator
from libvirt_gpu.cmd import main as cli
from tests.functional import placement_server

GOLDEN_CONF = os.path.join(os.path.dirname(os.path.dirname(__file__)),
                           'data', 'golden', 't4.conf')


@pytest.fixture(scope='module')
def server():
    with placement_server.running() as srv:
        yield srv


@pytest.fixture(scope='module')
def t4(tmp_path_factory):
    """The simulated host's sysfs root; beside it ``t4.conf``, the golden
    configuration with a state directory of its own (a sync leaves its
    outcome there for the exporter: never in /var/lib)."""
    top = tmp_path_factory.mktemp('t4')
    root = top / 'sys'
    simulator.write_host(simulator.load_profile('t4'), root)
    with open(GOLDEN_CONF) as f:
        golden = f.read()
    (top / 't4.conf').write_text('[DEFAULT]\nstate_dir = %s\n\n%s'
                                 % (top / 'state', golden))
    return str(root)


def conf_of(t4):
    return os.path.join(os.path.dirname(t4), 't4.conf')


def cli_json(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip().startswith('{') else out), \
        err


def base(t4, host):
    return ['--config-file', conf_of(t4), '--hostname', host,
            '--sysfs-root', t4]


def test_sync_dry_run_then_sync_then_nothing(capsys, server, t4):
    argv = base(t4, 'cli-host') + ['placement', 'sync', '--url', server.url]
    code, plan, _ = cli_json(capsys, *argv, '--dry-run', '--json')
    assert code == 0 and plan['dry_run'] and plan['changed']
    assert plan['writes_sent'] == 0
    assert any(r['method'] == 'POST' and r['url'] == '/resource_providers'
               for r in plan['requests'])
    # The dry run wrote nothing: the host is not in Placement.
    resp = server.adapter().get('/resource_providers?name=cli-host')
    assert resp.json()['resource_providers'] == []

    code, first, _ = cli_json(capsys, *argv, '--json')
    assert code == 0 and first['changed'] and first['writes_sent'] > 0
    assert sorted(r['outcome'] for r in first['results']).count(
        'created') == 3

    code, second, _ = cli_json(capsys, *argv, '--json')
    assert code == 0 and not second['changed']
    assert second['writes_sent'] == 0
    # what the exporter serves: two syncs (the dry run is not one), the
    # first one's writes
    done = figures.outcome(os.path.join(os.path.dirname(t4), 'state'),
                           figures.PLACEMENT_SYNC)
    assert (done['runs'], done['failures'], done['last_changes'],
            done['changes_total']) == (2, 0, 0, first['writes_sent'])

    # What Placement holds equals `placement show`.
    code, shown, _ = cli_json(capsys, *base(t4, 'cli-host'), 'placement',
                              'show', '--json')
    for provider in shown['resource_providers']:
        inv = server.adapter().get('/resource_providers/%s/inventories'
                                   % provider['uuid']).json()
        assert {rc: {k: v for k, v in body.items()}
                for rc, body in inv['inventories'].items()} == \
            provider['inventories']
        traits = server.adapter().get('/resource_providers/%s/traits'
                                      % provider['uuid']).json()['traits']
        assert sorted(traits) == provider['traits']


def test_agent_once(capsys, server, t4):
    code = cli.main(base(t4, 'agent-host') + ['agent', '--once', '--url',
                                              server.url])
    _, err = capsys.readouterr()
    assert code == 0, err
    got = server.adapter().get(
        '/allocation_candidates?resources=VGPU:1'
        '&required=CUSTOM_NVIDIA_1EB8_T4_2B').json()
    names = set()
    for uuid in got['provider_summaries']:
        names.add(server.adapter().get('/resource_providers/%s' % uuid)
                  .json()['name'])
    assert 'agent-host_0000:af:00.0' in names


def test_sync_unreachable_placement_is_clear_error(capsys, t4):
    code = cli.main(base(t4, 'h') + ['placement', 'sync', '--url',
                                     'http://127.0.0.1:9/placement'])
    _, err = capsys.readouterr()
    assert code == 1
    assert err.startswith('libvirt-gpu: error:')
    assert '127.0.0.1:9' in err
