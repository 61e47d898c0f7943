
# The one place the version is written: setup.py reads it from this line,
# `libvirt-gpu --version` prints it.
__version__ = '0.1.0'
