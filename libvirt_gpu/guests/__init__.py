"""The guest side: the public API (attach, detach), live migration, the
qemu hook, and the leftovers that crashes leave behind (``reconcile``)."""
