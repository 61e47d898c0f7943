"""What the hook's settings snapshot (guests/hook/settings.py) keeps that
the rest of the unit layer left open (docs/dev/mutation.md): the hook's
next calls, served from the snapshot, know the same routes (the GPUs
given to Cyborg, left alone) and the same ``[gpu]/nvml`` as the
configuration; a snapshot that cannot be written is said, with why."""

import errno
import json
import os

from libvirt_gpu import objects
from libvirt_gpu import simulator
from libvirt_gpu.devices import routes
from libvirt_gpu.guests import hook

T4_A = objects.PciAddress.parse('0000:3b:00.0')


def config(tmp_path, extra=''):
    root = str(tmp_path / 'sim')
    if not os.path.exists(root):
        simulator.write_host(simulator.load_profile('t4'), root)
    path = tmp_path / 'a.conf'
    path.write_text('[DEFAULT]\nsysfs_root = %s\nstate_dir = %s\n[gpu]\n'
                    'enabled_vgpu_types = nvidia-223\n%s'
                    % (root, tmp_path / 'state', extra))
    return str(path), str(tmp_path / 'state' / hook.SETTINGS_NAME)


def test_the_snapshot_keeps_the_routes_and_the_nvml_setting(tmp_path):
    conf, snapshot = config(tmp_path, 'nvml = off\n[routes]\ncyborg = %s\n'
                            % T4_A)
    first, note = hook.load_settings(conf, snapshot)
    assert note.startswith('settings read from')
    assert first.routes.owners == {T4_A: routes.CYBORG}
    again, note = hook.load_settings(conf, snapshot)
    assert note is None                          # served from the snapshot
    assert again.routes.owners == {T4_A: routes.CYBORG}
    assert again.routes.route_of(T4_A) == routes.CYBORG
    assert (first.nvml, again.nvml) == ('off', 'off')


def test_a_snapshot_that_cannot_be_written_is_said(tmp_path):
    conf, snapshot = config(tmp_path)
    os.makedirs(snapshot)                  # a directory where it belongs
    settings, note = hook.load_settings(conf, snapshot)
    assert settings.enabled_types() == ['nvidia-223']
    assert note == ('settings read from %s (cannot write snapshot %s: '
                    '%s)' % (conf, snapshot, os.strerror(errno.EISDIR)))


def test_a_snapshot_of_an_older_release_without_routes_is_read_again(
        tmp_path):
    conf, snapshot = config(tmp_path, '[routes]\ncyborg = %s\n' % T4_A)
    hook.load_settings(conf, snapshot)
    with open(snapshot) as f:
        document = json.load(f)
    del document['extra']['routes']            # as an older release wrote
    with open(snapshot, 'w') as f:
        json.dump(document, f)
    again, note = hook.load_settings(conf, snapshot)
    assert note.startswith('enabled types resolved again')
    assert again.routes.owners == {T4_A: routes.CYBORG}
    # and the snapshot written anew carries them
    third, note = hook.load_settings(conf, snapshot)
    assert note is None and third.routes.owners == {T4_A: routes.CYBORG}
