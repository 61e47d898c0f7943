"""The host side: the GPUs a host has (sysfs, libvirt node devices, NVML,
pci.ids), how many vGPUs each holds, and the vGPU kinds (``backends``)."""
