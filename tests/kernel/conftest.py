"""The kernel tests' fixtures: one test VM for the whole session.

``lab`` (session): assets prepared (download once, driver built), the VM
booted, libvirtd ready, the product's hook installed with ``libvirt-gpu
hook install`` and libvirtd restarted to find it.  ``os_guest`` (session):
a small guest OS booted inside the VM for the hot-plug tests; it is started
when first needed, under KVM where vm_init.kvm made KVM safe in the VM (it
boots in seconds).  Otherwise it runs under TCG inside the VM's TCG and
takes minutes to boot: it is then started as soon as libvirtd is ready (when
a collected test needs it), while the tests that need no guest OS run
(order: ``pytest_collection_modifyitems``).

A machine that cannot run the VM fails these tests, saying why; they are
never skipped.  The time of each phase is printed at the end of the run.
"""

import compileall
import os
import shutil
import time

import pytest

from tests.kernel import assets as assets_mod
from tests.kernel import lab as lab_mod
from tests.kernel import product
from tests.kernel import vm as vm_mod
from tests.kernel import vm_init

REPO = product.REPO
CACHE = os.environ.get('KERNEL_TEST_CACHE',
                       os.path.join(REPO, '.cache', 'kernel-vm'))
OS_GUEST = 'osguest'
OS_GUEST_SERIAL = '/tmp/osguest-serial.log'

# phase -> seconds, printed by pytest_terminal_summary
PHASES = {}
# what the real kernel answered where the product has to guess, printed too
OBSERVED = {}


def record(phase, seconds):
    PHASES[phase] = PHASES.get(phase, 0.0) + seconds


def _uses_os_guest(item):
    return 'os_guest' in getattr(item, 'fixturenames', ())


def pytest_collection_modifyitems(session, config, items):
    # Within the kernel tests (they stay where they are among the other
    # layers' tests): first those that need neither the guest OS nor much
    # CPU (where the guest OS runs under TCG, it boots meanwhile); then
    # the hot-plug tests, which need it (test_hotplug powers it off after
    # them); then the migration tests (several QEMUs starting at once);
    # the tests that power the VM off (the Cyborg route's and the reboot
    # test): last.
    def rank(item):
        name = item.module.__name__
        if name.endswith(('test_cyborg_route', 'test_reboot')):
            return 3
        if name.endswith('test_migration'):
            return 2
        return 1 if _uses_os_guest(item) else 0
    kernel = [i for i in items if i.module.__name__.startswith(
        'tests.kernel.')]
    if kernel:
        first = items.index(kernel[0])
        chosen = set(kernel)
        rest = [i for i in items if i not in chosen]
        items[:] = (rest[:first] + sorted(kernel, key=rank)
                    + rest[first:])


def pytest_terminal_summary(terminalreporter):
    if not PHASES:
        return
    tr = terminalreporter
    tr.section('kernel VM phases (seconds)')
    for phase, seconds in PHASES.items():
        tr.write_line('%-28s %7.1f' % (phase, seconds))
    for what, answer in OBSERVED.items():
        tr.write_line('%s: %s' % (what, answer))


@pytest.fixture(scope='session')
def vm_assets():
    missing = vm_mod.missing_requirements()
    if missing:
        pytest.fail('the kernel tests cannot run here: ' + '; '.join(missing))
    try:
        assets = assets_mod.Assets(CACHE).prepare()
    except assets_mod.AssetError as e:
        pytest.fail(str(e))
    for phase, seconds in assets.times.items():
        record(phase, seconds)
    return assets


@pytest.fixture(scope='session')
def lab(vm_assets, request):
    # The product's Pythons in the VM would compile the package on their
    # first import, under TCG (seconds), and again after the reboot test's
    # power-off (the VM's writes live in a tmpfs): compiled here, once.
    compileall.compile_dir(os.path.join(REPO, 'libvirt_gpu'), quiet=1)
    workdir = os.path.join(CACHE, 'session')
    shutil.rmtree(workdir, ignore_errors=True)
    vm = vm_mod.TestVm(vm_assets, workdir, files=lab_mod.vm_files())
    vm.new_disk()
    try:
        record('boot', vm.boot())
        lab = lab_mod.Lab(vm)
        record('libvirtd ready', lab.start_libvirtd())
        lab.os_guest_kvm = vm.run(['cat', vm_init.KVM_STATE]).stdout.strip()
        lab.os_guest_virt = 'kvm' if lab.os_guest_kvm == 'yes' else 'qemu'
        lab.os_guest_started = None
        # Under TCG the guest OS takes minutes to boot: then it starts now,
        # while the tests that need no guest OS run (when a collected test
        # needs it at all).  Under KVM it starts when first needed.
        if lab.os_guest_virt == 'qemu' and any(
                _uses_os_guest(i) for i in request.session.items):
            _start_os_guest(lab, vm_assets)
        hook = product.hook_install(vm)
        assert hook, 'hook install printed nothing'
        record('libvirtd restart (hook)', lab.restart_libvirtd())
        yield lab
    finally:
        if vm.retried:
            OBSERVED['boots retried (multi-threaded TCG)'] = ' | '.join(
                vm.retried)
        vm.close()


def _start_os_guest(lab, assets):
    t0 = time.monotonic()
    OBSERVED['guest OS runs under'] = (
        'KVM (on the SVM that TCG emulates)' if lab.os_guest_virt == 'kvm'
        else 'TCG inside TCG (KVM in the VM: %s)'
        % (lab.os_guest_kvm or 'no answer'))
    lab.define(lab_mod.guest_xml(OS_GUEST, kernel=assets.guest_kernel,
                                 initrd=assets.guest_initramfs,
                                 serial=OS_GUEST_SERIAL, memory_mb=160,
                                 virt=lab.os_guest_virt))
    lab.start(OS_GUEST).check('starting the guest OS')
    lab.os_guest_started = t0


@pytest.fixture(scope='session')
def os_guest(lab, vm_assets):
    """Name of the running guest OS, once its init has listed its PCI
    devices."""
    early = lab.os_guest_started is not None
    if not early:
        _start_os_guest(lab, vm_assets)

    def booted():
        return bool(guest_pci(lab))
    if not lab.wait(booted, timeout=900, interval=2):
        pytest.fail('the guest OS did not boot within 15 min; see %s in '
                    'the VM' % OS_GUEST_SERIAL)
    record('guest OS boot (started early, under TCG)' if early
           else 'guest OS boot', time.monotonic() - lab.os_guest_started)
    return OS_GUEST


def guest_serial_tail(lab, lines=15):
    """The end of the guest OS's console, for a failure's message."""
    return lab.vm.run(['tail', '-n', str(lines), OS_GUEST_SERIAL]).stdout


def guest_pci(lab):
    """The guest OS's PCI devices ({slot: 'vendor:device'}) from the last
    whole line its init printed: the console file is read while the guest
    writes it, and a line counts only once its end mark is there."""
    r = lab.vm.run(['grep', 'GUEST PCI', OS_GUEST_SERIAL])
    # what follows the mark: a kernel message may share its line
    whole = [line.partition('GUEST PCI')[2].split()[:-1]
             for line in r.stdout.splitlines()
             if line.rstrip('\r').endswith(' END')]
    if not whole:
        return {}
    return dict(item.split('=', 1) for item in whole[-1])
