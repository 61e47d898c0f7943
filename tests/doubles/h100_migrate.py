"""The destination's ``migrate`` hook on the simulated H100 host with
NVML simulated (``[gpu]/nvml = simulated``, driver 580.95.02): the
``h100`` fixture (a ``vendor_world.World`` of ``nvidia-1300`` on
``GPU``), NVIDIA's metadata of a vGPU on a source H100
(``source_metadata``), the XML libvirt hands the hook (``incoming``,
``without_hostdev``), one ``migrate begin -`` (``migrate``) and the
hook's log (``hook_log``).  A test module takes the fixture by name::

    h100 = h100_migrate.h100
"""

import base64
import io

import pytest

from libvirt_gpu.devices import nvml
from libvirt_gpu.guests import hook
from libvirt_gpu import objects
from tests.doubles import h100_nvml as tn
from tests.doubles import vendor_world as tv

GPU = '0000:4e:00.0'
SOURCE_VF = '0000:17:00.5'


@pytest.fixture
def h100(tmp_path):
    world = tv.World('h100-80gb', str(tmp_path), 'nvidia-1300', GPU)
    with open(world.config, 'w') as f:
        f.write('[DEFAULT]\nsysfs_root = %s\nstate_dir = %s\n[gpu]\n'
                'enabled_vgpu_types = nvidia-1300\nnvml = simulated\n'
                % (world.root, world.state_dir))
    return world


def source_metadata(**changes):
    """NVIDIA's metadata of a time-sliced vGPU on a source H100."""
    vf = objects.PciAddress.parse(tn.VF)
    return nvml.read_vgpu_metadata(
        nvml.Nvml(tn.host(tn.h100(**changes))[1]), [vf])[vf].raw


def incoming(uuid, raw=None):
    xml = tv.vf_domain_xml(uuid, SOURCE_VF, type_id='nvidia-1300')
    if raw is not None:
        xml = xml.replace(b"parent='%s'/>" % SOURCE_VF.encode(),
                          b"parent='%s' nvidia-metadata='%s'/>" % (
                              SOURCE_VF.encode(), base64.b64encode(raw)))
    return xml


def migrate(world, xml):
    out, err = io.BytesIO(), io.StringIO()
    rc = hook.run(['qemu', 'vm1', 'migrate', 'begin', '-'], xml,
                  config_file=world.config, sysfs=world.sysfs, stderr=err,
                  mdevctl_dir=world.mdevctl, stdout=out)
    return rc, out.getvalue(), err.getvalue()


def hook_log(world):
    with open('%s/%s' % (world.state_dir, hook.LOG_NAME)) as f:
        return f.read()


def without_hostdev(xml):
    start, end = xml.index(b'<hostdev'), xml.index(b'</hostdev>')
    return xml[:start] + xml[end + len(b'</hostdev>'):]
