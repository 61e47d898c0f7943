"""The test VM as the tests see it: a host with two GPUs, libvirtd, guests.

``Lab`` wraps a booted ``vm.TestVm`` with what the tests observe and set
up: libvirtd (started and restarted here), the kernel's view of mdevs
(sysfs read by the VM's agent), guests defined from XML and handled with
``virsh``, qemu's command line.  Nothing here does the product's work:
that is product.py.
"""

import json
import time

from tests.doubles import poll
from tests.kernel import vm as vm_mod

GPUS = vm_mod.GPU_ADDRESSES
URI = 'qemu:///system'
NS = 'urn:libvirt-gpu:1'

QEMU_CONF = '''\
# written by tests/kernel: qemu as root, no cgroups or namespaces in the VM
user = "root"
group = "root"
dynamic_ownership = 1
remember_owner = 0
security_driver = "none"
cgroup_controllers = [ ]
namespaces = [ ]
stdio_handler = "file"
'''

# Each libvirtd of the VM is a host of its own to libvirt: a migration
# between two with one host UUID is refused as "to the same host".
HOST_UUID_A = '5a0e1d01-6c1b-4f0e-9c7e-00000000000a'
HOST_UUID_B = '5a0e1d02-6c1b-4f0e-9c7e-00000000000b'

LIBVIRTD_CONF = '''\
host_uuid = "%s"
log_outputs = "2:file:/var/log/libvirt/libvirtd.log"
''' % HOST_UUID_A


def vm_files():
    """Files vm_init writes into the VM before anything starts."""
    from tests.kernel import product
    return {'/etc/libvirt/qemu.conf': QEMU_CONF,
            '/etc/libvirt/libvirtd.conf': LIBVIRTD_CONF,
            product.CONFIG: product.config(),
            # restore, not mdevctl's udev rule, brings mdevs back at boot
            '/etc/udev/rules.d/60-mdevctl.rules': '# masked by tests\n'}


# The guest OS's kernel command line.  Under KVM (vm_init.kvm) it boots in
# seconds; under two levels of emulation, where the VM cannot offer KVM, in
# minutes.  These cut what it does not need (measured with
# initcall_debug in that guest, seconds each there): the crypto self-tests
# (cryptomgr.notests), IPv6 (2.7), and initcalls it has no use for: the
# jitter entropy source (5.7), the KDF self-test (2.2), two BPF kfunc
# registrations (9), the built-in X.509 certificates (4.8, no module is
# loaded), encrypted keys (1.7), the RTC (1.9), the PS/2 controller (3.4).
GUEST_OS_CMDLINE = (
    'console=ttyS0 quiet mitigations=off cryptomgr.notests ipv6.disable=1 '
    'initcall_blacklist=jent_mod_init,crypto_kdf108_init,'
    'bpf_tcp_ca_kfunc_init,bpf_dummy_struct_ops_init,'
    'load_system_certificate_list,init_encrypted,cmos_init,i8042_init')

# QEMU >= 9.1 lets a VFIO device migrate on its own ("auto") only when the
# kernel can track the pages the device dirties (IOMMUFD); Debian's 6.12
# has no IOMMUFD, so the guests that migrate force it on, as an operator
# of such a kernel would.  libvirt marks such a domain "custom-argv".
MIGRATABLE_VFIO = (
    "<qemu:commandline xmlns:qemu='http://libvirt.org/schemas/domain/qemu/"
    "1.0'><qemu:arg value='-global'/>"
    "<qemu:arg value='vfio-pci.enable-migration=on'/></qemu:commandline>")


def guest_xml(name, vgpus=(), kernel=None, initrd=None, serial=None,
              memory_mb=96, migratable=False, virt='qemu'):
    """A guest of libvirt domain type ``virt`` (``qemu``: TCG; ``kvm``
    where vm_init.kvm made KVM safe): with ``kernel`` it boots that (the
    guest OS of the hot-plug tests), without it qemu sits in the firmware.
    ``vgpus``: (uuid, type, parent) named in our metadata, each with its
    hostdev; ``migratable``: its VFIO devices may migrate
    (``MIGRATABLE_VFIO``)."""
    meta = ''.join(
        '<gpu:vgpu uuid="%s" type="%s"%s/>'
        % (u, t, ' parent="%s"' % p if p else '') for u, t, p in vgpus)
    hostdevs = ''.join(
        "<hostdev mode='subsystem' type='mdev' managed='no' "
        "model='vfio-pci'><source><address uuid='%s'/></source></hostdev>"
        % u for u, _, _ in vgpus)
    boot = ''
    if kernel:
        boot = ('<kernel>%s</kernel><initrd>%s</initrd>'
                '<cmdline>%s</cmdline>' % (kernel, initrd, GUEST_OS_CMDLINE))
    console = ("<serial type='file'><source path='%s'/><target port='0'/>"
               "</serial>" % serial) if serial else ''
    extra = MIGRATABLE_VFIO if migratable else ''
    return '''<domain type='%s'>
  <name>%s</name>
  <memory unit='MiB'>%d</memory>
  <vcpu>1</vcpu>
  <metadata><gpu:gpus xmlns:gpu="%s">%s</gpu:gpus></metadata>
  <os><type arch='x86_64' machine='pc'>hvm</type>%s</os>
  <features><acpi/></features>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    %s%s
    <video><model type='none'/></video>
    <memballoon model='none'/>
  </devices>%s
</domain>''' % (
        virt, name, memory_mb, NS, meta, boot, hostdevs, console, extra)


class Lab(object):

    def __init__(self, vm):
        self.vm = vm
        self.times = {}

    # -- libvirtd ----------------------------------------------------------
    def start_libvirtd(self, timeout=180):
        """Start libvirtd and wait until it answers; returns seconds."""
        t0 = time.monotonic()
        self.vm.run(['mkdir', '-p', '/run/libvirt', '/var/log/libvirt',
                     '/var/lib/libvirt', '/var/cache/libvirt']).check()
        self.vm.run(['libvirtd', '-d']).check('libvirtd -d')
        while time.monotonic() - t0 < timeout:
            r = self.vm.run(['virsh', '-c', URI, 'version'], timeout=60)
            if r.rc == 0:
                return time.monotonic() - t0
            time.sleep(1)
        raise vm_mod.VmError('libvirtd did not answer within %d s: %s'
                             % (timeout, r.stderr.strip()))

    def stop_libvirtd(self):
        self.vm.sh('pid=$(cat /run/libvirtd.pid 2>/dev/null) && '
                   'kill $pid && while kill -0 $pid 2>/dev/null; '
                   'do sleep 0.2; done', timeout=60)

    def restart_libvirtd(self):
        self.stop_libvirtd()
        return self.start_libvirtd()

    def virsh(self, *args, timeout=120):
        """virsh, to observe only."""
        return self.vm.run(['virsh', '-c', URI] + list(args),
                           timeout=timeout)

    # -- guests --------------------------------------------------------------
    # virsh, not a Python program: under TCG a Python start that imports
    # libvirt costs seconds, virsh a fraction of one.
    def define(self, xml):
        self.vm.run(['virsh', '-c', URI, 'define', '/dev/stdin'],
                    input=xml).check('defining a guest')

    def start(self, name):
        return self.virsh('start', name, timeout=240)

    def destroy(self, name):
        return self.virsh('destroy', name)

    def undefine(self, name):
        return self.virsh('undefine', name)

    def domain_xml(self, name, inactive=False):
        args = ('dumpxml', name) + (('--inactive',) if inactive else ())
        return self.virsh(*args).check('dumpxml %s' % name).stdout

    def is_running(self, name):
        r = self.virsh('domstate', name)
        return r.rc == 0 and r.stdout.strip() == 'running'

    def qemu_pid(self, name):
        r = self.vm.run(['pgrep', '-f', '-o', '^/usr/bin/qemu-system-x86_64'
                         ' -name guest=%s,' % name])
        return int(r.stdout) if r.rc == 0 and r.stdout.strip() else None

    def qemu_cmdline(self, name):
        pid = self.qemu_pid(name)
        if pid is None:
            return []
        r = self.vm.run(['cat', '/proc/%d/cmdline' % pid])
        return [a for a in r.stdout.split('\0') if a]

    # -- the kernel's view ---------------------------------------------------
    def mdevs(self):
        """{uuid: (parent, type)} from /sys/bus/mdev/devices (the links
        resolved by the VM's agent: one round trip, no process)."""
        devices = '/sys/bus/mdev/devices/'
        links = self.vm.links(devices + '*', devices + '*/mdev_type')
        out = {}
        for path, real in links.items():
            uuid = path[len(devices):]
            if '/' in uuid:
                continue
            kind = links.get(path + '/mdev_type')
            # none: the mdev went away while it was being read
            if kind is not None:
                out[uuid] = (real.split('/')[-2], kind.split('/')[-1])
        return out

    def available(self, parent, type_id):
        return int(self.vm.read(
            '/sys/class/mdev_bus/%s/mdev_supported_types/%s/'
            'available_instances' % (parent, type_id)))

    def kernel_types(self, parent):
        """{type id: {name, description, available_instances, device_api}}
        as the kernel shows them."""
        base = '/sys/class/mdev_bus/%s/mdev_supported_types' % parent
        r = self.vm.sh('for t in %s/*; do for f in name description '
                       'available_instances device_api; do '
                       'echo "${t##*/}|$f|$(cat $t/$f)"; done; done' % base)
        out = {}
        for line in r.check().stdout.splitlines():
            t, f, v = line.split('|', 2)
            out.setdefault(t, {})[f] = v
        return out

    def wait(self, predicate, timeout=60, interval=0.5):
        return poll.wait_for(predicate, timeout, interval)

    def exists(self, path):
        return self.vm.run(['test', '-e', path]).rc == 0


# -- a second host in the same VM ---------------------------------------------

_SECOND_LIBVIRTD = r'''
set -e
B=$1; CLI=$2; CONF=$3
mkdir -p $B/run $B/lib $B/log $B/sock
rm -rf $B/etc
cp -a /etc/libvirt $B/etc
# the first host's hooks and guests are not this host's
rm -rf $B/etc/hooks $B/etc/qemu
mkdir -p $B/etc/qemu
cat > $B/etc/libvirtd.conf <<EOF
host_uuid = "$4"
unix_sock_dir = "$B/sock"
log_outputs = "2:file:/var/log/libvirt/libvirtd.log"
EOF
unshare -m --propagation private sh -ec "
mount --bind $B/run /run/libvirt
mount --bind $B/lib /var/lib/libvirt
mount --bind $B/etc /etc/libvirt
mount --bind $B/log /var/log/libvirt
$CLI --config-file $CONF hook install --json > $B/hook-install.json
exec libvirtd -d -p $B/libvirtd.pid"
'''


class SecondHost(object):
    """Host B of the migration tests: a second libvirtd in the VM, in a
    mount namespace of its own (its own /run/libvirt, /var/lib/libvirt,
    /etc/libvirt and /var/log/libvirt, bind-mounted from ``base``), with
    its own host UUID, socket, product configuration and state
    directory, and the product's hook installed *inside* that namespace
    with ``libvirt-gpu hook install``.  It shares the kernel, udev and
    sysfs with host A: which GPU each host may use is set by each host's
    configuration."""

    def __init__(self, lab, base='/tmp/hostb',
                 config_file='/etc/libvirt-gpu/host-b.conf',
                 state_dir='/var/lib/libvirt-gpu-b'):
        self.lab = lab
        self.vm = lab.vm
        self.base = base
        self.config_file = config_file
        self.state_dir = state_dir
        self.uri = 'qemu+unix:///system?socket=%s/sock/libvirt-sock' % base
        self.hook_installed = None

    def start(self, config_text, timeout=180):
        """Write its configuration, install the hook, start libvirtd and
        wait until it answers; returns seconds."""
        from tests.kernel import product
        t0 = time.monotonic()
        self.vm.write_file(self.config_file, config_text)
        self.vm.run(['sh', '-c', _SECOND_LIBVIRTD, 'sh', self.base,
                     product.CLI, self.config_file, HOST_UUID_B],
                    timeout=120).check('starting the second libvirtd')
        self.hook_installed = json.loads(
            self.vm.read(self.base + '/hook-install.json'))
        while time.monotonic() - t0 < timeout:
            r = self.virsh('version', timeout=60)
            if r.rc == 0:
                return time.monotonic() - t0
            time.sleep(1)
        raise vm_mod.VmError('the second libvirtd did not answer within '
                             '%d s: %s' % (timeout, r.stderr.strip()))

    def install_hook(self, python=None):
        """``libvirt-gpu hook install`` again, in this host's mount
        namespace (entered through its libvirtd), with ``--python`` when
        given; libvirtd runs the new file from its next hook call."""
        from tests.kernel import product
        args = [product.CLI, '--config-file', self.config_file, 'hook',
                'install', '--json'] + (['--python', python] if python
                                        else [])
        r = self.vm.run(['sh', '-c', 'exec nsenter -t "$(cat "$0")" -m -- '
                         '"$@"', self.base + '/libvirtd.pid'] + args)
        self.hook_installed = json.loads(r.check('hook install on B').stdout)
        return self.hook_installed

    def stop(self):
        self.vm.sh('pid=$(cat %s/libvirtd.pid 2>/dev/null) && kill $pid && '
                   'while kill -0 $pid 2>/dev/null; do sleep 0.2; done'
                   % self.base, timeout=60)

    def virsh(self, *args, timeout=120):
        return self.vm.run(['virsh', '-c', self.uri] + list(args),
                           timeout=timeout)

    def domain_state(self, name):
        """virsh's word for the domain's state here, None when unknown."""
        r = self.virsh('domstate', name)
        return r.stdout.strip() if r.rc == 0 else None

    def log(self, name=None):
        """libvirtd's log here, or the QEMU log of guest ``name``."""
        path = ('%s/log/qemu/%s.log' % (self.base, name) if name
                else self.base + '/log/libvirtd.log')
        return self.vm.run(['cat', path]).stdout
