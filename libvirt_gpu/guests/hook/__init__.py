"""The libvirt qemu hook: vGPUs exist exactly while their guest runs.

The package: ``settings`` (the snapshot of the configuration), ``log``
(what the operator reads), ``operations`` (``prepare``/``release``/
``reconnect``/``migrate`` and ``run``, the edge), ``incoming`` (``migrate``
on a live migration's destination), ``installer`` (``libvirt-gpu hook
install``).  The names below are the hook's public interface.

libvirt runs ``/etc/libvirt/hooks/qemu.d/libvirt-gpu`` (``hooks/qemu``,
installed by ``libvirt-gpu hook install``) as
``<hook> <domain name> <operation> <sub-operation> <extra>`` with the domain
XML on stdin, several times per guest start and stop.  That script exits at
once for every operation but ``prepare``/``release``/``reconnect``/
``migrate`` and for
every guest whose XML holds neither our namespace nor an mdev (nor a
character reference, which could spell either), before it imports
anything; only then does it call ``run`` here.

What each operation does (libvirt's contract for a qemu hook, as
libvirt 9 keeps it; proved against a real daemon by
tests/functional/test_libvirtd_fixture.py):

``prepare begin``  create every vGPU the domain asks for: each
    ``<gpu:vgpu>`` of its metadata that has its ``<hostdev>``, and each
    mdev hostdev that a vGPU kind defines persistently; check each
    ``<gpu:pgpu>``.  One failure removes what this call created and exits 1
    with a message for the operator (libvirt refuses the start and shows
    it).
``release end``    remove the vGPUs this host leased to the domain (the
    vendor driver may be removing them too), drop the leases.  Exit 0.
``reconnect begin`` check that the running guest's vGPUs exist; log what
    is wrong.  Exit 0: a non-zero exit here would kill the guest.
``migrate begin``  on a live migration's destination: reserve a vGPU of
    each type the incoming domain holds, rewrite its XML in place for this
    host and print it (the row of ``operations.OPERATIONS`` with
    ``rewrites``); a refusal exits 1 and libvirt aborts the migration.
anything else     exit 0, printing nothing (``restore``: the XML is not
    rewritten).

A domain whose PCI hostdev is a VF carved for OpenStack Nova (the record
of ``devices.carving``) is Nova's: every operation leaves it alone (no
lease, no rewritten XML, exit 0; hook.log says so once per call).

The hook never imports or calls libvirt (the daemon waits for it: any call
back would deadlock); it works from its stdin, its configuration and sysfs.
Input is refused before anything is written when it is malformed or hostile
(DOCTYPE, entities, oversize, a UUID/type/address that does not validate).

Configuration: importing oslo.config takes longer than a whole ``prepare``
may (``bench/hook.py`` measures both), so the hook reads the
configuration's snapshot (``confcache``, the CLI's form and staleness
rule, kept in the state directory) with the enabled types resolved per GPU
beside it (``HookSettings``: sysfs root, state dir, enabled types).  The
configuration file changed: it is read again through oslo.config.  The
parents of a registered vGPU kind changed (``WatchedParents.parents_now``: the
mdev parents in ``class/mdev_bus``, the VFs with NVIDIA's vGPU 17+ vendor
interface, which appear when ``sriov-manage -e`` enables them): the
enabled types are resolved again from the snapshot's values.  The keys
are taken before what they guard is read, so a change meanwhile makes the
next call read it again.  Every line it logs also goes to
``<state_dir>/hook.log`` (libvirt discards a successful hook's stderr).
"""

from __future__ import annotations

from libvirt_gpu import exception  # noqa: F401
from libvirt_gpu.guests.hook.log import HookLog  # noqa: F401
from libvirt_gpu.guests.hook.log import LOG_LINE_MAX  # noqa: F401
from libvirt_gpu.guests.hook.log import LOG_MAX_BYTES  # noqa: F401
from libvirt_gpu.guests.hook.log import LOG_MAX_LINES  # noqa: F401
from libvirt_gpu.guests.hook.log import LOG_NAME  # noqa: F401
from libvirt_gpu.guests.hook.operations import DEVICES  # noqa: F401
from libvirt_gpu.guests.hook.operations import DOCUMENT  # noqa: F401
from libvirt_gpu.guests.hook.operations import HANDLED  # noqa: F401
from libvirt_gpu.guests.hook.operations import Hook  # noqa: F401
from libvirt_gpu.guests.hook.operations import MARKERS  # noqa: F401
from libvirt_gpu.guests.hook.operations import METADATA  # noqa: F401
from libvirt_gpu.guests.hook.operations import MIGRATE  # noqa: F401
from libvirt_gpu.guests.hook.operations import operation  # noqa: F401
from libvirt_gpu.guests.hook.operations import Operation  # noqa: F401
from libvirt_gpu.guests.hook.operations import OPERATIONS  # noqa: F401
from libvirt_gpu.guests.hook.operations import parse_request  # noqa: F401
from libvirt_gpu.guests.hook.operations import PREPARE  # noqa: F401
from libvirt_gpu.guests.hook.operations import RECONNECT  # noqa: F401
from libvirt_gpu.guests.hook.operations import RECONNECT_LISTED  # noqa: F401
from libvirt_gpu.guests.hook.operations import RELEASE  # noqa: F401
from libvirt_gpu.guests.hook.operations import Request  # noqa: F401
from libvirt_gpu.guests.hook.operations import run  # noqa: F401
from libvirt_gpu.guests.hook.settings import DEFAULT_CONFIG_FILE  # noqa: F401
from libvirt_gpu.guests.hook.settings import HookSettings  # noqa: F401
from libvirt_gpu.guests.hook.settings import load_settings  # noqa: F401
from libvirt_gpu.guests.hook.settings import SETTINGS_NAME  # noqa: F401
from libvirt_gpu.guests.hook.settings import write_settings  # noqa: F401

TYPE_CHECKING = False
if TYPE_CHECKING:
    from libvirt_gpu.guests.hook.installer import (  # noqa: F401
        DEFAULT_HOOKS_DIR as DEFAULT_HOOKS_DIR,
        hook_source as hook_source,
        hooks_enabled as hooks_enabled,
        install as install,
        Installed as Installed,
        INSTALL_NAME as INSTALL_NAME,
        render_hook as render_hook)


def __getattr__(name: str) -> object:
    """``install`` and its helpers, imported only when asked for: a guest
    start never needs them."""
    if name in ('install', 'Installed', 'hook_source', 'hooks_enabled',
                'render_hook', 'DEFAULT_HOOKS_DIR', 'INSTALL_NAME'):
        from libvirt_gpu.guests.hook import installer
        return getattr(installer, name)
    raise AttributeError('module %r has no attribute %r' % (__name__, name))
