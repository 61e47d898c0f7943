"""The composition root (``environment.Environment``): what it keeps, and
the places the vGPU kinds declare (``VgpuKind.places``), which it hands on
without naming them."""

import pytest

from libvirt_gpu.backends import mdev as mdev_backend
from libvirt_gpu.backends import registry
from libvirt_gpu import environment


def test_a_kind_s_place_defaults_to_what_the_kind_declares(tmp_path):
    env = environment.Environment(str(tmp_path / 'state'),
                                  sysfs_root=str(tmp_path))
    assert env.place('mdevctl_dir') == mdev_backend.MDEVCTL_DIR
    assert env.vgpus.kind(mdev_backend.MdevBackend.name).mdevctl_dir == \
        mdev_backend.MDEVCTL_DIR


def test_a_kind_s_place_given_reaches_the_kind_and_survives_replace(
        tmp_path):
    where = str(tmp_path / 'mdevctl.d')
    env = environment.Environment(str(tmp_path / 'state'),
                                  sysfs_root=str(tmp_path), mdevctl_dir=where)
    assert env.place('mdevctl_dir') == where
    assert env.vgpus.kind(mdev_backend.MdevBackend.name).mdevctl_dir == where
    again = env.replace(remove_timeout=1.0)
    assert again.place('mdevctl_dir') == where
    # None (a command-line option not given) is the kind's default
    assert env.replace(mdevctl_dir=None).place('mdevctl_dir') == \
        mdev_backend.MDEVCTL_DIR


def test_a_place_no_kind_declares_is_refused(tmp_path):
    with pytest.raises(TypeError, match='mdevctl_dirr.*known: mdevctl_dir'):
        environment.Environment(str(tmp_path), sysfs_root=str(tmp_path),
                                mdevctl_dirr=str(tmp_path))


def test_places_are_the_registered_kinds_own(tmp_path):
    declared = {place.name for cls in registry.kind_classes()
                for place in cls.places}
    env = environment.Environment(str(tmp_path), sysfs_root=str(tmp_path))
    assert set(env.places) == declared and declared


def test_discovery_sees_a_kind_s_functions_only_through_the_kinds_given():
    """Discovery names no kind: the VFs of NVIDIA's vendor interface are
    read by the kinds its caller hands it, and by none without them."""
    from libvirt_gpu import discovery
    from libvirt_gpu import sysfs as sysfs_mod
    from tests.doubles import trees
    with trees.simulated_tree('l40s', without_mdevs=True) as (root, _):
        sysfs = sysfs_mod.Sysfs(root)
        kinds = environment.Environment(root, sysfs=sysfs).kind_classes
        seen = discovery.from_sysfs(sysfs, kinds=kinds).gpus
        unseen = discovery.from_sysfs(sysfs, kinds=()).gpus
    assert any(g.vendor_vf is not None for g in seen)
    assert all(g.vendor_vf is None for g in unseen)
