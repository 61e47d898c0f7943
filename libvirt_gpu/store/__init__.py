"""What a host keeps between processes: the trusted state directory, the
leases (``state``), the allocator that takes capacity under them, and
the figures the hook leaves for the exporter."""
