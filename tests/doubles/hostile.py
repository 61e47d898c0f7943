"""Hostile input for the qemu hook, and a way to see that it changed
nothing.

``inputs(domain_uuid)``: ``{name: bytes}`` of tests/data/hostile/*.xml
(external entities, entity expansion, DOCTYPE, '..' and newlines in
UUIDs/types/addresses, malformed XML), and an oversize document made here
(5 MiB: more than the hook's 4 MiB cap) naming ``domain_uuid``.
"""

import os

DATA_DIR = os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), 'data', 'hostile')


def inputs(domain_uuid):
    found = {}
    for name in sorted(os.listdir(DATA_DIR)):
        with open(os.path.join(DATA_DIR, name), 'rb') as f:
            found[name[:-len('.xml')]] = f.read()
    found['oversize'] = (
        '<domain><uuid>%s</uuid><metadata><g:gpus xmlns:g="urn:libvirt-'
        'gpu:1"/></metadata><description>%s</description></domain>'
        % (domain_uuid, 'x' * (5 * 1024 * 1024))).encode()
    return found


def tree_snapshot(root):
    """Every path under ``root`` with its mode, size and mtime."""
    found = []
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(directory, name)
            st = os.lstat(path)
            found.append((path, st.st_mode, st.st_size, st.st_mtime_ns))
    return sorted(found)
