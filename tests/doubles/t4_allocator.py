"""The allocator's claims on the simulated T4 host (0000:3b:00.0 empty,
0000:af:00.0 holding two nvidia-223) and the settings that enable them:
shared by the allocator's tests."""

from libvirt_gpu.host import allocator
from libvirt_gpu import objects

T_NVIDIA_223 = objects.TypeId.parse('nvidia-223')

A = objects.PciAddress.parse('0000:3b:00.0')    # empty
B = objects.PciAddress.parse('0000:af:00.0')    # holds two nvidia-223
DOM = objects.Uuid.parse('c7a5fdbd-cdaf-9455-926a-d65c16db1809')
DOM2 = objects.Uuid.parse('0a2b8d1c-1111-4222-8333-944445555666')
EXISTING = objects.Uuid.parse('4b20d080-1b54-4048-85b3-a6a62d165c01')


def new_uuid():
    return objects.Uuid.new()


def enabled(type_id=T_NVIDIA_223, addresses=(A, B), max_instances=None):
    return {a: objects.EnabledType(type_id=objects.TypeId.parse(type_id),
                                   max_instances=max_instances)
            for a in addresses}


def claim(type_id=T_NVIDIA_223, parent=None, uuid=None, managed=True):
    if isinstance(type_id, str):
        type_id = objects.TypeId.parse(type_id)
    return allocator.VgpuClaim(uuid=uuid or new_uuid(), type_id=type_id,
                               parent=parent, managed=managed)
