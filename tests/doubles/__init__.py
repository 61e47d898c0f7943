"""Test doubles shared by the unit and functional tests.

* ``kernel_sysfs``: a simulated host's sysfs tree whose kernel is
  ``libvirt_gpu.simulator.kernel.SimKernel`` (the one rule book of the
  kernel's mdev, vendor-interface and SR-IOV answers), in-process
  (``KernelSysfs``) or for writes by other processes (``KernelWatcher``).
* ``trees``: fresh simulated trees and profile files for them.
* ``worker``: ``python -m tests.doubles.worker``, one API or hook call in
  a process of its own (the reliability tests kill them).
* ``fake_libvirt``: a file-backed libvirt connection shared by processes.
* ``domains``: tiny domain XML for that connection.
* ``fakes``: hand-built records for tests that need no simulated host.
* ``hostile``: hostile input for the qemu hook.
* ``kinds``: the registered vGPU kinds, which discovery takes from its
  caller.

Nothing here imports from ``tests.unit`` or ``tests.functional``, and
nothing in ``tests.unit`` imports from ``tests.functional``
(``tests/unit/project/test_architecture.py``).
"""
