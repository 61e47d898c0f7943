"""The PCI ID database reader: a hand-made file for the format's corners,
the system's file (Debian package pci.ids) for the real names."""

import re

import pytest

from libvirt_gpu.devices import pciids

SMALL = '''#
#\tList of PCI ID's
#
# Syntax:
# vendor  vendor_name
#\tdevice  device_name
#\t\tsubvendor subdevice  subsystem_name

10de  NVIDIA Corporation
\t1eb8  TU104GL [Tesla T4]
\t\t10de 12a2  T4 16GB
\t2330  GH100 [H100 SXM5 80GB]
# a comment inside a vendor block
\t\t10de 16c1  H100 SXM5 80GB
\t2331  GH100 [H100 PCIe]
10df  Emulex Corporation
\t2330  Not an NVIDIA device
1af4  Red Hat, Inc.
\t1041  Virtio 1.0 network device

# List of known device classes, subclasses and programming interfaces
C 03  Display controller
\t02  3D controller
'''


@pytest.fixture
def small(tmp_path):
    path = tmp_path / 'pci.ids'
    path.write_text(SMALL)
    return pciids.PciIds(str(path))


def test_lookups(small):
    assert small.vendor('10de') == 'NVIDIA Corporation'
    assert small.vendor('0x1AF4') == 'Red Hat, Inc.'
    assert small.device('10de', '2330') == 'GH100 [H100 SXM5 80GB]'
    assert small.device('0x10de', '0x1eb8') == 'TU104GL [Tesla T4]'
    assert small.device('1af4', '1041') == 'Virtio 1.0 network device'
    assert small.subsystem('10de', '2330', '10de', '16c1') == \
        'H100 SXM5 80GB'
    assert small.subsystem('10de', '1eb8', '10de', '12a2') == 'T4 16GB'


def test_blocks_do_not_leak(small):
    # 2330 of the next vendor is not NVIDIA's; a subsystem of one device
    # is not another's; a class line is not a vendor.
    assert small.device('10df', '2330') == 'Not an NVIDIA device'
    assert small.device('1af4', '2330') is None
    assert small.subsystem('10de', '2331', '10de', '16c1') is None
    assert small.subsystem('10de', '1eb8', '10de', '16c1') is None
    assert small.vendor('0302') is None
    assert small.device('10de', '1041') is None


def test_unknown_and_malformed_ids(small):
    assert small.vendor('abcd') is None
    assert small.device('10de', 'ffff') is None
    assert small.vendor('10d') is None
    assert small.device('10de', 'x2330') is None
    assert small.vendor(None) is None


def test_missing_file_gives_numbers_only(tmp_path):
    db = pciids.PciIds(str(tmp_path / 'absent'))
    assert not db.available
    assert db.vendor('10de') is None and db.device('10de', '2330') is None
    empty = tmp_path / 'empty'
    empty.write_text('')
    assert pciids.PciIds(str(empty)).device('10de', '2330') is None


def test_system_database():
    """The file the Makefile installs (Debian package pci.ids).  Its text
    for 10de:2330 is "GH100[H100 SXM5 80GB]" in Debian 12's 2023.04
    release, "GH100 [H100 SXM5 80GB]" in later ones."""
    db = pciids.PciIds()
    assert db.available, 'install the Debian package pci.ids (make deps)'
    assert db.vendor('10de') == 'NVIDIA Corporation'
    assert re.fullmatch(r'GH100 ?\[H100 SXM5 80GB\]',
                        db.device('10de', '2330'))
    assert db.device('10de', '1eb8') == 'TU104GL [Tesla T4]'
    with open(pciids.DEFAULT_PATH, 'rb') as f:
        lines = f.read().decode('utf-8', 'replace').splitlines()
    # The reader's answer is the database's line, whole.
    assert '\t2330  ' + db.device('10de', '2330') in lines
