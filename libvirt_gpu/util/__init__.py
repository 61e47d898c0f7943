"""Helpers below every layer, importing nothing of ours outside the folder
but ``exception``: records, logging, files written and opened safely,
JSON, hardened XML, and the bounds on what is read from outside
(``bounds``: the only GPU and libvirt facts here)."""
