"""``libvirt-gpu simulate --live PROFILE MOUNTPOINT``: serve a live host.

Mounts a simulated sysfs with the kernel's behaviour at MOUNTPOINT (see
``libvirt_gpu.simulator.live``) in the foreground until SIGINT or SIGTERM,
then unmounts it.  Needs root, /dev/fuse, libfuse3 and mfusepy.

Also runnable on its own (the test fixture does)::

    python -m libvirt_gpu.cmd.simulate_live t4 /mnt/sim [--busy-remove
        block|ebusy] [--no-uevents] [--probe-delay S] [--control-stdio]
        [--workdir DIR]
"""

import argparse
import logging
import sys

from libvirt_gpu import exception
from libvirt_gpu.cmd import main as cli
from libvirt_gpu.simulator import live


def run_live(profile_name, mountpoint, busy_remove=None, uevents=True,
             control_stdio=False, workdir=None,
             probe_delay=live.PROBE_DELAY):
    """Serve ``profile_name`` (a bundled profile or a JSON file) at
    ``mountpoint`` until SIGINT/SIGTERM.  Returns the exit status (0; 1
    with a message on stderr when it cannot mount)."""
    try:
        return live.serve(profile_name, mountpoint, busy_remove=busy_remove,
                          uevents=uevents, control_stdio=control_stdio,
                          workdir=workdir, probe_delay=probe_delay)
    except exception.LibvirtGpuError as e:
        sys.stderr.write('libvirt-gpu simulate --live: %s\n' % e)
        return 1


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog='libvirt-gpu simulate --live',
        description='Serve a simulated GPU host as a live sysfs (FUSE).')
    parser.add_argument('profile', help='bundled profile name or JSON file')
    parser.add_argument('mountpoint', help='an empty directory')
    cli.add_live_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format='%(asctime)s %(levelname)s %(message)s')
    return run_live(args.profile, args.mountpoint,
                    busy_remove=args.busy_remove,
                    uevents=not args.no_uevents,
                    control_stdio=args.control_stdio, workdir=args.workdir,
                    probe_delay=args.probe_delay)


if __name__ == '__main__':
    sys.exit(main())
