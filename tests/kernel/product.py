"""Every call the kernel tests make to the product, in one place.

Each runs *inside* the test VM, against its real kernel and libvirtd: the
CLI (``.venv/bin/libvirt-gpu``) or a short Python program calling the
public API (``libvirt_gpu.guests.api``) or the mdev backend.  Results come
back as JSON.  When the product's names change, this is the file to fix.
"""

import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
VENV_BIN = os.path.join(REPO, '.venv', 'bin')
CLI = os.path.join(VENV_BIN, 'libvirt-gpu')
PYTHON = os.path.join(VENV_BIN, 'python')
CONFIG = '/etc/libvirt-gpu/libvirt-gpu.conf'
STATE_DIR = '/var/lib/libvirt-gpu'
URI = 'qemu:///system'
# the product's test-only crash points (libvirt_gpu.store.state.crash_point)
CRASH_ENV = 'LIBVIRT_GPU_TEST_CRASH_AT'


def config(enabled_types=('nvidia-223',), gpus=(), state_dir=STATE_DIR,
           uri=URI, cyborg=()):
    """The product's configuration file in the VM; ``gpus``: the GPUs
    that offer the (single) enabled type, all when empty; ``cyborg``: the
    GPUs given to Cyborg (``[routes]/cyborg``)."""
    text = ('[DEFAULT]\nstate_dir = %s\nsysfs_root = /sys\n'
            '[libvirt]\nconnection_uri = %s\n'
            '[gpu]\nenabled_vgpu_types = %s\n'
            % (state_dir, uri, ', '.join(enabled_types)))
    if gpus:
        text += ('[vgpu_%s]\ndevice_addresses = %s\n'
                 % (enabled_types[0], ', '.join(gpus)))
    if cyborg:
        text += '[routes]\ncyborg = %s\n' % ', '.join(cyborg)
    return text


def cli(vm, *args, timeout=180, config_file=CONFIG):
    """``libvirt-gpu ARGS`` in the VM; vm.Result."""
    return vm.run([CLI, '--config-file', config_file] + list(args),
                  timeout=timeout)


def cli_json(vm, *args):
    r = cli(vm, *(args + ('--json',))).check('libvirt-gpu ' + ' '.join(args))
    return json.loads(r.stdout)


def python(vm, program, timeout=180, env=None, **params):
    """Run ``program`` with the venv's Python in the VM; it finds its
    arguments in ``P`` and prints its answer with ``out(obj)`` (JSON)."""
    prelude = ('import json, sys\nP = json.loads(sys.stdin.read())\n'
               'def out(o):\n    print(json.dumps(o, default=str))\n')
    return vm.run([PYTHON, '-c', prelude + program],
                  input=json.dumps(params), timeout=timeout,
                  env=dict(env or {}, LIBVIRT_GPU_CONFIG=CONFIG))


def _answer(r, what):
    r.check(what)
    return json.loads(r.stdout.strip().splitlines()[-1])


_API = '''
import libvirt
from libvirt_gpu.guests import api
from libvirt_gpu import exception
from libvirt_gpu.util import records
conn = libvirt.open(%r)
try:
    done = getattr(api, P.pop('call'))(conn, P.pop('domain'), **P)
except exception.LibvirtGpuError as e:
    out({'error': type(e).__name__, 'message': str(e)})
else:
    out(records.asdict(done) if records.is_record(done)
        else repr(done))
''' % URI


def api(vm, call, domain, **kwargs):
    """``libvirt_gpu.guests.api.<call>(conn, domain, **kwargs)``: its result
    as a dict, or ``{'error': class name, 'message': ...}``."""
    return _answer(python(vm, _API, call=call, domain=domain, **kwargs),
                   'api.%s' % call)


_BACKEND = '''
import libvirt
from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.virt import host as host_mod
from libvirt_gpu.devices import sysfs as sysfs_mod
from libvirt_gpu.devices.backends import base
from libvirt_gpu.devices.backends import mdev
host = None
if P['libvirt']:
    host = host_mod.Host.from_connection(libvirt.open(%r))
backend = mdev.MdevBackend(sysfs_mod.Sysfs('/sys'), host=host)
answers = []
for C in P['calls']:
    # The edge of this script: its parameters are parsed here, once.
    device = base.VgpuDevice(objects.Uuid.parse(C['uuid']),
                             objects.PciAddress.parse(C['parent']),
                             objects.TypeId.parse(C['type']))
    try:
        if C['op'] == 'create':
            res = backend.prepare(device)
        elif C['op'] == 'remove':
            res = backend.remove(device.uuid)
        elif C['op'] == 'define':
            backend.define(device, start=C['start'])
            res = True
        elif C['op'] == 'undefine':
            res = backend.undefine(device.uuid)
    except exception.LibvirtGpuError as e:
        answers.append({'error': type(e).__name__, 'message': str(e)})
    else:
        answers.append({'result': res})
out(answers)
''' % URI


def mdev_call(op, uuid, parent=None, type_id=None, start='manual'):
    """One call of the mdev backend, for ``mdevs``."""
    return dict(op=op, uuid=uuid, parent=parent or '0000:00:05.0',
                type=type_id or 'nvidia-223', start=start)


def mdevs(vm, calls, libvirt=True):
    """The mdev backend's calls (``mdev_call``: create, remove, define,
    undefine) made in order by one backend in one process, through
    libvirt's node-device API (``libvirt=True``) or sysfs only; their
    answers, in order (each process start costs seconds under TCG)."""
    return _answer(python(vm, _BACKEND, calls=list(calls), libvirt=libvirt),
                   'mdev backend %s' % ', '.join(c['op'] for c in calls))


def mdev(vm, op, uuid, parent=None, type_id=None, libvirt=True,
         start='manual'):
    """The mdev backend's ``op`` (create/remove/define/undefine), alone
    in its process."""
    return mdevs(vm, [mdev_call(op, uuid, parent, type_id, start)],
                 libvirt)[0]


_LEASES = '''
import os, sqlite3
path = os.path.join(P['state_dir'], 'leases.sqlite3')
if not os.path.exists(path):     # never written: no lease
    out([])
    raise SystemExit(0)
db = sqlite3.connect('file:%s?mode=ro' % path, uri=True)
out([dict(zip(('uuid', 'domain', 'parent', 'type', 'state', 'expires_at'),
              row)) for row in db.execute(
    'SELECT mdev_uuid, domain_uuid, parent, type_id, state, expires_at '
    'FROM leases ORDER BY mdev_uuid')])
'''


def leases(vm, state_dir=STATE_DIR):
    """The leases the product keeps in ``state_dir`` (read-only, straight
    from its SQLite file): [{uuid, domain, parent, type, state,
    expires_at}]."""
    return _answer(python(vm, _LEASES, state_dir=state_dir),
                   'reading the leases in %s' % state_dir)


def hook_install(vm, python=None):
    """``libvirt-gpu hook install`` (``--python PATH`` when given)."""
    args = ('hook', 'install') + (('--python', python) if python else ())
    return cli_json(vm, *args)


CRASH_WRAPPER = '/usr/local/bin/python-crash-at'
CRASH_FILE = '/run/libvirt-gpu-crash-at'


def hook_install_crashing(vm):
    """Install the hook with an interpreter that SIGKILLs it at the step
    named in CRASH_FILE (``crash_at``), none while the file is absent.
    libvirt runs hooks with an almost empty environment, so the crash
    point is set by a wrapper around the venv's Python; read from a file,
    it changes without installing the hook again (seconds each here)."""
    vm.write_file(CRASH_WRAPPER,
                  '#!/bin/sh\n'
                  '{ read -r step < %s; } 2>/dev/null && export %s="$step"\n'
                  'exec %s "$@"\n' % (CRASH_FILE, CRASH_ENV, PYTHON))
    vm.run(['chmod', '755', CRASH_WRAPPER]).check('chmod')
    return hook_install(vm, python=CRASH_WRAPPER)


def crash_at(vm, step):
    """The step at which the hook of ``hook_install_crashing`` kills
    itself; None: at none."""
    if step is None:
        vm.run(['rm', '-f', CRASH_FILE]).check('rm ' + CRASH_FILE)
    else:
        vm.write_file(CRASH_FILE, step + '\n')


if __name__ == '__main__':
    sys.exit('a helper module of the kernel tests')
