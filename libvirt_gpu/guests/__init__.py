"""The guest side: the public API (attach, detach), live migration, the
qemu hook, and putting a host back after crashes (``reconcile``) and
reboots (``restore``)."""
