"""What ``migration.check`` (guests/migration.py) tells an operator that
the rest of the unit layer left open (docs/dev/mutation.md): the plan
carries NVIDIA's question for each vGPU of the guest, what the source
read and who answers, as ``migrate --check`` prints it."""

from libvirt_gpu import objects
from tests.doubles import t4_hook as th
from tests.doubles.migration_conns import Conn
from tests.doubles.migration_conns import Domain
from tests.doubles.migration_conns import check
from tests.doubles.migration_conns import gpu_xml

U1 = '4b20d080-1b54-4048-85b3-a6a62d165c01'
U2 = 'b1ae8bf6-38b0-4c81-9d44-78ce3f520496'


def test_the_plan_asks_nvidias_question_for_each_vgpu():
    source = Conn(domain=Domain(th.domain_xml(
        [(U1, 'nvidia-223', None), (U2, 'nvidia-224', None)])))
    dest = Conn(gpus=[gpu_xml(0x3b, {'nvidia-223': 1, 'nvidia-224': 1})])
    plan = check(source, dest)
    # without NVML on the source (check's default), each vGPU is said
    # unread: the destination's hook makes today's checks only
    assert [(a.uuid, a.type_id, a.read, a.host_driver)
            for a in plan.driver] == [
        (objects.Uuid.parse(U1), objects.TypeId.parse('nvidia-223'), False,
         None),
        (objects.Uuid.parse(U2), objects.TypeId.parse('nvidia-224'), False,
         None)]
    assert all('NVML is not used on this host' in a.detail
               for a in plan.driver)
    # the question asks nothing of its own: the plan still passes
    assert plan.ok
