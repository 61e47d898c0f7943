"""libvirt's ``ext`` transport to a daemon's unix socket: what libvirt
writes to our stdin goes to ``SOCKET``, what it answers to our stdout
(tests/functional/test_migrate_nvidia.py).  Run: ``python -I
ext_relay.py SOCKET``."""

import os
import select
import socket
import sys


def main(path):
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(path)
    ends = [0, sock.fileno()]
    while True:
        ready, _, _ = select.select(ends, [], [])
        for fd in ready:
            data = os.read(fd, 65536)
            if not data:
                return 0
            if fd == 0:
                sock.sendall(data)
            else:
                os.write(1, data)


if __name__ == '__main__':
    sys.exit(main(sys.argv[1]))
