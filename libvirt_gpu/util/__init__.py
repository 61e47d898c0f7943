"""Helpers that know nothing of GPUs or libvirt: records, logging, bounds,
files opened safely, hardened XML."""
