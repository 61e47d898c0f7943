"""A live simulated tree's NVML channel without the mount
(``simulator.live.LiveTree``): ``TreeChannel`` is a ``LiveBackend`` whose
exchange goes through the tree's methods that the FUSE operations call
(open, write, read, release)."""

from libvirt_gpu.simulator import nvml as sim_nvml


class TreeChannel(sim_nvml.LiveBackend):
    """``LiveBackend`` over ``tree``'s NVML file, one request a handle."""

    def __init__(self, tree):
        self.tree = tree

    def exchange(self, request):
        fh = self.tree.nvml_open()
        try:
            self.tree.nvml_request(fh, request)
            return self.tree.replies[fh]
        finally:
            self.tree.nvml_release(fh)
