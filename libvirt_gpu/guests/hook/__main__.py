"""``python -m libvirt_gpu.guests.hook <name> <op> <subop> <extra>``: the hook
without the installed script (the domain XML on stdin)."""

from __future__ import annotations

import os
import sys

from libvirt_gpu.guests.hook import operations
from libvirt_gpu.guests.hook import settings


def main() -> int:
    return operations.run(sys.argv, sys.stdin.buffer.read(),
                          os.environ.get('LIBVIRT_GPU_CONFIG',
                                         settings.DEFAULT_CONFIG_FILE))


if __name__ == '__main__':
    sys.exit(main())
