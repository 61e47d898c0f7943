"""NUMA: a guest pinned to host NUMA nodes gets a vGPU on a GPU of those
nodes before one with more room elsewhere; an unpinned guest still gets
the GPU with the most room.  Through the qemu hook's ``prepare`` on the
simulated T4 host (0000:3b:00.0 on node 0, empty; 0000:af:00.0 on node 1,
holding two vGPUs), and the parsing of the pinning at the XML edge."""

import os

import pytest

from libvirt_gpu.virt import config_xml
from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.util import xmlutil
from tests.doubles import t4_hook as th

NODE0_GPU = th.A            # more room
NODE1_GPU = th.B


def pinned_xml(uuid, pinning):
    """Domain XML with one vGPU and ``pinning`` (elements of <domain>)."""
    xml = th.domain_xml([(uuid, 'nvidia-223', None)]).decode()
    return xml.replace('<devices>', pinning + '<devices>', 1).encode()


def parent_of(env, uuid):
    """The GPU the vGPU was created on (as the kernel has it)."""
    return str(env.sysfs.kernel.mdevs()[uuid][0])


def prepared_on(env, pinning, guest=None):
    """``prepare`` of a guest (``guest``: its UUID, default the shared
    one) with one new vGPU and ``pinning``; the GPU it was created on."""
    uuid = th.new_uuid()
    xml = pinned_xml(uuid, pinning)
    if guest is not None:
        xml = xml.replace(th.DOM.encode(), guest.encode())
    assert env.run('prepare', xml) == (0, '')
    return parent_of(env, uuid)


def test_pinned_to_node_1_gets_the_node_1_gpu(env):
    assert prepared_on(env, "<numatune><memory mode='strict' "
                            "nodeset='1'/></numatune>") == NODE1_GPU


def test_unpinned_gets_the_most_room(env):
    assert prepared_on(env, '') == NODE0_GPU


def test_vcpu_cpuset_maps_to_nodes_through_local_cpulist(env):
    for address, cpus in ((NODE0_GPU, '0-15'), (NODE1_GPU, '16-31')):
        with open(os.path.join(env.root, 'bus', 'pci', 'devices', address,
                               'local_cpulist'), 'w') as f:
            f.write(cpus + '\n')
    assert prepared_on(env, "<vcpu placement='static' "
                            "cpuset='16-19'>2</vcpu>") == NODE1_GPU


def test_pinned_where_no_gpu_is_gets_the_most_room(env):
    assert prepared_on(
        env, "<numatune><memory nodeset='3'/></numatune>") == NODE0_GPU


def test_node_full_falls_back_to_another_node(env):
    # T4-2B: 8 per GPU; node 1's GPU holds 2: six more fit there, the
    # seventh goes to node 0 (each vGPU in a guest of its own)
    pin = "<numatune><memory nodeset='1'/></numatune>"
    parents = [prepared_on(env, pin, guest=th.new_uuid()) for _ in range(7)]
    assert parents == [NODE1_GPU] * 6 + [NODE0_GPU]


def _pinning(body):
    return config_xml.read_domain(xmlutil.parse(
        '<domain><uuid>%s</uuid>%s</domain>' % (th.DOM, body))).pinning


def test_pinning_parsed_at_the_edge():
    assert _pinning('') == objects.UNPINNED
    assert not _pinning('<vcpu>2</vcpu>').pinned
    p = _pinning("<vcpu cpuset='0-7,^3,16'>2</vcpu><numatune><memory "
                 "nodeset='0-1'/></numatune>")
    assert p.cpus == frozenset({0, 1, 2, 4, 5, 6, 7, 16})
    assert p.nodes == frozenset({0, 1})
    assert p.is_near(1, frozenset()) and p.is_near(None, frozenset({16}))
    assert not p.is_near(None, frozenset()) and not p.is_near(
        2, frozenset({8}))


@pytest.mark.parametrize('body', [
    "<numatune><memory nodeset='one'/></numatune>",
    "<vcpu cpuset='7-3'>2</vcpu>",
    "<vcpu cpuset='-1'>2</vcpu>",
])
def test_bad_pinning_is_refused_naming_it(body):
    with pytest.raises(exception.InvalidXml, match='nodeset|cpuset'):
        _pinning(body)
