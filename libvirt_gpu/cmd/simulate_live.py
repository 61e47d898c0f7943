"""``libvirt-gpu simulate --live PROFILE MOUNTPOINT``: serve a live host.

Mounts a simulated sysfs with the kernel's behaviour at MOUNTPOINT (see
``libvirt_gpu.simulator.live``) in the foreground until SIGINT or SIGTERM,
then unmounts it.  Needs root, /dev/fuse, libfuse3 and mfusepy.

Also runnable on its own (the test fixture does)::

    python -m libvirt_gpu.cmd.simulate_live t4 /mnt/sim [--busy-remove
        block|ebusy] [--no-uevents] [--probe-delay S] [--control-stdio]
        [--workdir DIR]

``cmd.host_cmds`` takes the options from ``add_live_arguments`` here; the
simulator (and the FUSE binding) is imported only when a tree is served.
"""

import argparse
import sys

from libvirt_gpu import exception
from libvirt_gpu.util import logs
from libvirt_gpu.cmd import output

# Defaults of the live tree, kept equal to simulator.kernel.BUSY_MODES and
# simulator.live.PROBE_DELAY by a test (every command would pay for
# importing the simulator for them).
LIVE_BUSY_MODES = ('block', 'ebusy')
LIVE_PROBE_DELAY = 0.1


def add_live_arguments(group):
    """Options of ``simulate --live`` (and of this module's ``main``)."""
    group.add_argument('--busy-remove', choices=LIVE_BUSY_MODES,
                       default=None,
                       help='removing an mdev a guest uses: block until it '
                            'is released (kernel >= 5.16) or answer EBUSY '
                            '(older kernels); default: the profile\'s '
                            'busy_remove, else block')
    group.add_argument('--no-uevents', action='store_true',
                       help='do not broadcast udev events (libvirtd then '
                            'never learns of new or removed mdevs)')
    group.add_argument('--control-stdio', action='store_true',
                       help='read control commands on stdin (busy UUID, '
                            'idle UUID, state, sent, uevents on|off, quit) '
                            'and stop when it closes')
    group.add_argument('--probe-delay', type=float, default=LIVE_PROBE_DELAY,
                       metavar='SECONDS',
                       help='how long a successful create takes after its '
                            'add uevent (the vendor driver probing the new '
                            'vGPU; default %(default)s)')
    group.add_argument('--workdir', default=None,
                       help='where the private backing tree is made '
                            '(default: /dev/shm)')


def run_live(profile_name, mountpoint, busy_remove=None, uevents=True,
             control_stdio=False, workdir=None,
             probe_delay=LIVE_PROBE_DELAY):
    """Serve ``profile_name`` (a bundled profile or a JSON file) at
    ``mountpoint`` until SIGINT/SIGTERM.  Returns the exit status (0; 1
    with a message on stderr when it cannot mount)."""
    from libvirt_gpu.simulator import live
    try:
        return live.serve(profile_name, mountpoint, busy_remove=busy_remove,
                          uevents=uevents, control_stdio=control_stdio,
                          workdir=workdir, probe_delay=probe_delay)
    except exception.LibvirtGpuError as e:
        output.emit_error('libvirt-gpu simulate --live', e)
        return 1


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog='libvirt-gpu simulate --live',
        description='Serve a simulated GPU host as a live sysfs (FUSE).')
    parser.add_argument('profile', help='bundled profile name or JSON file')
    parser.add_argument('mountpoint', help='an empty directory')
    add_live_arguments(parser)
    args = parser.parse_args(argv)
    logs.configure(level='INFO', stream=sys.stderr,
                   format='%(asctime)s %(levelname)s %(message)s')
    return run_live(args.profile, args.mountpoint,
                    busy_remove=args.busy_remove,
                    uevents=not args.no_uevents,
                    control_stdio=args.control_stdio, workdir=args.workdir,
                    probe_delay=args.probe_delay)


if __name__ == '__main__':
    sys.exit(main())
