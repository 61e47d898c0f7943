"""Discovery and mdev create/remove/define on the VM's real kernel.

The GPUs are qemu display devices bound by the test driver (tests/kernel/
driver), which registers NVIDIA-shaped mdev types on them; libvirtd, udev
and mdevctl are this machine's own.
"""

import uuid as uuidlib

from tests.kernel import lab as lab_mod
from tests.kernel import product

A, B = lab_mod.GPUS


def new_uuid():
    return str(uuidlib.uuid4())


def by_address(listing):
    return {g['address']: g for g in listing}


def test_discovery_through_libvirt_and_sysfs_agree_with_the_kernel(lab):
    via_libvirt = by_address(product.cli_json(lab.vm, '-c', lab_mod.URI,
                                              'list'))
    via_sysfs = by_address(product.cli_json(lab.vm, '--sysfs-root', '/sys',
                                            'list'))
    assert set(via_libvirt) == set(via_sysfs) == {A, B}
    for address in (A, B):
        kernel = lab.kernel_types(address)
        assert set(kernel) == {'nvidia-222', 'nvidia-223', 'nvidia-231'}
        for view in (via_libvirt[address], via_sysfs[address]):
            assert view['driver'] == 'nvidia'
            assert view['enabled_type'] == 'nvidia-223'
            assert view['mode'] == 'vgpu'
            types = {t['id']: t for t in view['mdev_types']}
            assert set(types) == set(kernel)
            for type_id, k in kernel.items():
                assert types[type_id]['name'] == k['name']
                assert types[type_id]['available_instances'] == \
                    int(k['available_instances'])
                assert types[type_id]['device_api'] == k['device_api']
        # libvirt does not report descriptions; sysfs does, as the driver
        # wrote them.
        sysfs_types = {t['id']: t for t in via_sysfs[address]['mdev_types']}
        assert sysfs_types['nvidia-223']['description'] == \
            kernel['nvidia-223']['description']
        assert 'max_instance=8' in kernel['nvidia-223']['description']
        assert via_libvirt[address]['iommu_group'] == \
            via_sysfs[address]['iommu_group']


def test_create_through_libvirt_is_seen_through_udev_and_removed(lab):
    u = new_uuid()
    before = lab.available(A, 'nvidia-223')
    assert product.mdev(lab.vm, 'create', u, A) == {'result': True}
    assert lab.mdevs()[u] == (A, 'nvidia-223')
    assert lab.available(A, 'nvidia-223') == before - 1
    # one type per GPU: the driver now offers nothing else on A
    assert lab.available(A, 'nvidia-222') == 0
    assert lab.available(B, 'nvidia-222') == 16
    # libvirt learnt of it from udev, not from a poll
    name = 'mdev_%s_%s' % (u.replace('-', '_'), A.replace(':', '_')
                           .replace('.', '_'))
    assert lab.virsh('nodedev-dumpxml', name).rc == 0
    listed = {g['address']: g for g in product.cli_json(
        lab.vm, '-c', lab_mod.URI, 'list')}
    assert {m['uuid'] for m in listed[A]['mdevs']} == {u}
    assert product.mdev(lab.vm, 'remove', u) == {'result': True}
    assert u not in lab.mdevs()
    assert lab.available(A, 'nvidia-223') == before
    assert lab.available(A, 'nvidia-222') == 16
    assert lab.wait(lambda: lab.virsh('nodedev-dumpxml', name).rc != 0, 30)


def test_create_and_remove_through_sysfs_only(lab):
    u = new_uuid()
    assert product.mdev(lab.vm, 'create', u, B, 'nvidia-231',
                        libvirt=False) == {'result': True}
    assert lab.mdevs()[u] == (B, 'nvidia-231')
    # the same UUID again: the kernel's EEXIST, seen as "already there"
    assert product.mdev(lab.vm, 'create', u, B, 'nvidia-231',
                        libvirt=False) == {'result': False}
    # another type on a GPU that holds nvidia-231: refused as no capacity
    other = product.mdev(lab.vm, 'create', new_uuid(), B, 'nvidia-223',
                         libvirt=False)
    assert other['error'] == 'NoCapacity', other
    assert product.mdev(lab.vm, 'remove', u, libvirt=False) == \
        {'result': True}
    assert lab.mdevs() == {}


def test_full_gpu_is_refused_by_the_kernel(lab):
    made = [new_uuid() for _ in range(8)]
    try:
        # eight creates by one backend (one process: each start costs
        # seconds in the VM)
        answers = product.mdevs(lab.vm, [
            product.mdev_call('create', u, B, 'nvidia-223') for u in made],
            libvirt=False)
        assert answers == [{'result': True}] * 8, answers
        assert lab.available(B, 'nvidia-223') == 0
        # straight to the kernel (our check of available_instances would
        # refuse first): the driver's own refusal
        u = new_uuid()
        r = lab.vm.sh('echo %s > /sys/class/mdev_bus/%s/mdev_supported_types'
                      '/nvidia-223/create' % (u, B))
        assert r.rc != 0
        from tests.kernel import conftest
        conftest.OBSERVED['create on a full GPU'] = r.stderr.strip()
        assert u not in lab.mdevs()
    finally:
        product.mdevs(lab.vm, [product.mdev_call('remove', u)
                               for u in made], libvirt=False)
    assert lab.mdevs() == {}
    assert lab.available(B, 'nvidia-223') == 8


def test_define_and_undefine_through_libvirt_and_mdevctl(lab):
    u = new_uuid()
    assert product.mdev(lab.vm, 'define', u, A, start='auto') == \
        {'result': True}
    r = lab.vm.run(['mdevctl', 'list', '--defined', '--dumpjson'])
    assert u in r.stdout, r
    assert lab.exists('/etc/mdevctl.d/%s/%s' % (A, u))
    # defined, not started
    assert u not in lab.mdevs()
    assert product.mdev(lab.vm, 'undefine', u) == {'result': True}
    assert not lab.exists('/etc/mdevctl.d/%s/%s' % (A, u))
    assert product.mdev(lab.vm, 'undefine', u) == {'result': False}
