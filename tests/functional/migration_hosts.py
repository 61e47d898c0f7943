"""Live hosts a guest migrates between (shared by test_migrate_nvidia and
test_migrate_vendor): ``Host``, a live host whose libvirtd has a host
UUID of its own (libvirt refuses a migration to the host it runs on),
reached through libvirt's ``ext`` transport (``ext_uri``:
``tests/functional/ext_relay.py``, ``RELAY``, relays it to the daemon's
socket); ``migrate``, what ``libvirt-gpu migrate`` runs once its checks
passed; ``on``, whether a host runs the domain."""

import os
import stat
import sys
import uuid as uuidlib

from tests.functional import libvirtd as libvirtd_mod
from tests.functional import live_sysfs as ls

MIGRATE_URI = 'tcp://127.0.0.1'
RELAY = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                     'ext_relay.py')


class Host(ls.LiveHost):
    """A live host whose libvirtd has a host UUID of its own (libvirt
    refuses a migration to the host it runs on), reached by ``ext_uri``."""

    def start(self):
        for sub in ('callouts', 'notifiers'):
            os.makedirs(os.path.join(self.mdevctl_dir, 'scripts.d', sub),
                        exist_ok=True)
        self.live.start()
        self.daemon = libvirtd_mod.LibvirtDaemon(
            hooks=self.hooks(self.live),
            binds=self.live.libvirt_binds() + [(self.mdevctl_dir,
                                                '/etc/mdevctl.d')],
            env={'SYSTEMD_DEVICE_VERIFY_SYSFS': '0'},
            libvirtd_conf='host_uuid = "%s"' % uuidlib.uuid4())
        self.daemon.start()
        relay = os.path.join(self.workdir, 'relay.sh')
        with open(relay, 'w') as f:
            f.write('#!/bin/sh\nexec %s -I %s %s\n' % (
                sys.executable, RELAY, self.daemon.socket_path))
        os.chmod(relay, stat.S_IRWXU)
        self.ext_uri = 'qemu+ext://127.0.0.1/system?command=%s' % relay
        return self


def on(host, name):
    return [d.name() for d in host.daemon.connect().listAllDomains()
            if d.name() == name]


def migrate(source, dest, name):
    """What ``libvirt-gpu migrate`` runs once its checks passed (they
    refuse here before: this QEMU is older than VFIO migration needs):
    ``migration.migrate``, which writes NVIDIA's metadata first."""
    from libvirt_gpu.devices import nvml
    from libvirt_gpu.guests import migration
    from libvirt_gpu.virt import host as host_mod
    here = nvml.source('simulated', sysfs_root=source.live.root)
    with host_mod.Host(source.uri) as src, \
            host_mod.Host(dest.ext_uri) as dst:
        return migration.migrate(src, dst, dest.ext_uri, name,
                                 migrate_uri=MIGRATE_URI, nvml=here)
