"""libvirt-gpu: NVIDIA GPUs and vGPUs for libvirt/KVM guests, reported the
way OpenStack Placement expects."""

import glob
import os
import re

import setuptools

HERE = os.path.dirname(os.path.abspath(__file__))


def _requirements(name):
    with open(os.path.join(HERE, name)) as f:
        return [line.strip() for line in f
                if line.strip() and not line.startswith('#')]


def _version():
    with open(os.path.join(HERE, 'libvirt_gpu', '__init__.py')) as f:
        found = re.search(r"^__version__ = '([^']+)'$", f.read(), re.M)
    return found.group(1)


def _data(directory):
    return [p for p in glob.glob(os.path.join(directory, '**', '*'),
                                 recursive=True) if os.path.isfile(p)]


setuptools.setup(
    name='libvirt-gpu',
    version=_version(),
    description=__doc__.replace('\n', ' '),
    python_requires='>=3.9',
    packages=setuptools.find_packages(include=['libvirt_gpu', 'libvirt_gpu.*']),
    package_data={'libvirt_gpu.simulator': ['profiles/*.json']},
    install_requires=_requirements('requirements.txt'),
    # NVML through NVIDIA's binding, where the driver provides the library.
    extras_require={'nvml': ['nvidia-ml-py>=12.535']},
    data_files=[
        ('share/libvirt-gpu/hooks', _data('hooks')),
        ('share/libvirt-gpu/templates', _data('templates')),
        ('share/libvirt-gpu/etc', _data('etc')),
        # the guides the systemd units' Documentation= lines name
        ('share/doc/libvirt-gpu', ['README.md']),
        ('share/doc/libvirt-gpu/admin', _data('docs/admin')),
    ],
    entry_points={
        'console_scripts': [
            'libvirt-gpu = libvirt_gpu.cmd.main:run',
        ],
        'oslo.config.opts': [
            'libvirt_gpu = libvirt_gpu.conf.opts:list_opts',
        ],
        # Loaded by Cyborg's agent only ([agent] enabled_drivers =
        # libvirt_gpu_driver); Cyborg is not a requirement of ours.
        # The vGPU kinds (devices/backends/registry.py): a third party's
        # package adds one with an entry point of this group.
        'libvirt_gpu.vgpu_kinds': [
            'mdev = libvirt_gpu.devices.backends.mdev:MdevBackend',
            'nvidia = '
            'libvirt_gpu.devices.backends.nvidia_vgpu:NvidiaVgpuBackend',
        ],
        'cyborg.accelerator.driver': [
            'libvirt_gpu_driver = '
            'libvirt_gpu.openstack.cyborg_driver:LibvirtGPUDriver',
        ],
    },
)
