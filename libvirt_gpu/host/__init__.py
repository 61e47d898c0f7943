"""The host as a whole: the operations that bring every GPU of a host
back to what the operator configured (``restore``, after a reboot)."""
