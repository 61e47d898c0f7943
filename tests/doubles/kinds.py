"""The vGPU kinds a test hands discovery, which imports no kind itself."""

from libvirt_gpu.devices.backends import registry


def registered():
    """The registered vGPU kinds (``registry.KINDS``, read at the call, so
    a test that patches it is seen), as an ``Environment``'s
    ``kind_classes`` gives them."""
    return tuple(registry.kind_classes())
