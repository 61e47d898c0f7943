"""PID 1 of the test VM (started by initramfs-init, run by the machine's own
python3 with ``-I``; standard library only).

It reads its settings from the JSON file named by ``tk.conf=`` on the kernel
command line (written by vm.py under .cache/, visible through the read-only
host root), then:

* mounts what a booted system has (/run, /dev/pts, /dev/shm, /dev/fd ...),
  the test kernel's modules over /lib/modules, and the persistent disk
  (/dev/vda, ext4) whose directories are bind-mounted over the paths that
  must survive a reboot (mdevctl's definitions, libvirt's domain configs,
  the product's state_dir);
* makes KVM usable for the guest OS of the hot-plug tests (``kvm``: KVM on
  the SVM that QEMU's TCG emulates, made safe to use on several CPUs);
* loads vfio, mdev and the test driver *before* udev (so the in-tree
  ``bochs`` driver never gets the emulated display devices), then starts
  systemd-udevd and replays the coldplug events;
* mounts the QEMU unpacked under .cache/ (``qemu_tree``) over the
  machine's: its module directory replaces the machine's (a QEMU aborts on
  another build's modules), its firmware directories are stacked on top of
  the machine's with a read-only overlay, its programs are bind-mounted
  file by file.  Mounts, not copies: nothing is written, and it is instant;
* forks the agent (agent_loop) and reaps every orphan, as an init must;
* powers the VM off after ``watchdog_s`` whatever happens (SIGALRM), so a
  VM never outlives its test run even if the host side vanished.

The agent speaks one JSON object per line over the virtio-serial port named
``tk.agent``: it first writes ``{"hello": ...}``; each request
``{"id", "argv", "input", "timeout", "env"}`` is run in its own thread and
answered ``{"id", "rc", "stdout", "stderr"}`` (rc 124 on timeout, 127 when
the program does not exist); ``{"id", "fs"}`` is a file read or a listing
of links that the agent answers itself (``fs_request``).
"""

import fcntl
import glob
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback

PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
PORT_NAME = 'tk.agent'


def log(msg):
    sys.stderr.write('vm-init[%.1f]: %s\n' % (time.monotonic(), msg))
    sys.stderr.flush()


def sh(*argv, check=True):
    try:
        r = subprocess.run(argv, capture_output=True, text=True)
    except OSError as e:
        r = subprocess.CompletedProcess(argv, 127, '', str(e))
    if check and r.returncode:
        log('%s failed rc=%d: %s'
            % (' '.join(argv), r.returncode, r.stderr.strip()))
    return r


def poweroff(*_):
    log('powering off')
    try:
        os.sync()
        with open('/proc/sysrq-trigger', 'w') as f:
            f.write('o')
    finally:
        time.sleep(30)
        os._exit(1)


def read_conf():
    with open('/proc/cmdline') as f:
        args = f.read().split()
    path = [a.split('=', 1)[1] for a in args if a.startswith('tk.conf=')]
    with open(path[0]) as f:
        return json.load(f)


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'w') as f:
        f.write(text)


def base_mounts(conf):
    sh('mount', '-t', 'tmpfs', '-o', 'mode=755', 'tmpfs', '/run')
    for d in ('/run/lock', '/dev/pts', '/dev/shm'):
        os.makedirs(d, exist_ok=True)
    sh('mount', '-t', 'devpts', 'devpts', '/dev/pts')
    sh('mount', '-t', 'tmpfs', 'tmpfs', '/dev/shm')
    # No tmpfs on /tmp: the root is already a writable overlay, and the
    # checkout (with .cache/) may itself live under /tmp (a CI clone).
    # devtmpfs lacks these links (udev/systemd make them); mdevctl reads
    # /dev/stdin.
    for name, target in (('fd', '/proc/self/fd'),
                         ('stdin', '/proc/self/fd/0'),
                         ('stdout', '/proc/self/fd/1'),
                         ('stderr', '/proc/self/fd/2')):
        if not os.path.lexists('/dev/' + name):
            os.symlink(target, '/dev/' + name)
    sh('hostname', 'tkvm')
    sh('ip', 'link', 'set', 'lo', 'up')


def kernel_modules(conf):
    os.makedirs('/lib/modules', exist_ok=True)
    sh('mount', '--bind', os.path.dirname(conf['modules_dir']),
       '/lib/modules')
    # Keep the emulated display devices away from their in-tree driver.
    write('/etc/modprobe.d/tk-test-vm.conf',
          'install bochs /bin/true\ninstall bochs_drm /bin/true\n')
    for mod in ('virtio_console', 'virtio_blk', 'ext4', 'vfio',
                'vfio_iommu_type1', 'mdev', 'vfio-pci'):
        sh('modprobe', mod)
    sh('insmod', conf['driver'])


# KVM's ioctls (linux/kvm.h: _IO(KVMIO, n), KVMIO = 0xAE).
KVM_CREATE_VM = 0xAE01
KVM_CREATE_IRQCHIP = 0xAE60
KVM_CREATE_VCPU = 0xAE41
KVM_STATE = '/run/tk-kvm'
# The descriptors of the pinning VM (see kvm): held by PID 1 until power-off.
KVM_PIN = []


def kvm(conf):
    """Make /dev/kvm safe to use, and say in KVM_STATE whether it is.

    QEMU's TCG emulates AMD's SVM with nested paging, so the VM's kernel
    can run KVM guests at one level of emulation instead of two (the guest
    OS of the hot-plug tests boots in seconds instead of minutes).  One
    thing breaks it: creating the first KVM VM flips static keys in the
    kernel (the preempt notifiers, in the scheduler; a vCPU's local APIC,
    in kvm.ko), and the kernel patches its code with int3 breakpoints to
    do so; multi-threaded TCG may run a CPU's stale translation of the
    patched code, and the VM dies of an "Oops: int3" in __schedule.  So
    here, with every other CPU offline, a VM with one vCPU is made and held
    open for good: the keys stay on, and no later VM (libvirt's probe, the
    guest OS) flips them again.  (The keys the kernel flips at boot are
    vm.TestVm.boot's to guard.)"""
    others = [os.path.join(d, 'online') for d in
              sorted(glob.glob('/sys/devices/system/cpu/cpu[0-9]*'))
              if not d.endswith('/cpu0')
              and os.path.exists(os.path.join(d, 'online'))]
    with open('/proc/cpuinfo') as f:
        flags = [line.split(':', 1)[1].split() for line in f
                 if line.startswith('flags')]
        if not flags or 'svm' not in flags[0]:
            write(KVM_STATE, 'no: the VM\'s CPU has no SVM\n')
            return

    def set_online(value):
        for path in others:
            with open(path, 'w') as f:
                f.write(value)
    set_online('0')
    try:
        if sh('modprobe', 'kvm_amd').returncode:
            write(KVM_STATE, 'no: modprobe kvm_amd failed\n')
            return
        dev = os.open('/dev/kvm', os.O_RDWR | os.O_CLOEXEC)
        vm = fcntl.ioctl(dev, KVM_CREATE_VM, 0)
        fcntl.ioctl(vm, KVM_CREATE_IRQCHIP, 0)
        vcpu = fcntl.ioctl(vm, KVM_CREATE_VCPU, 0)
        KVM_PIN.extend((dev, vm, vcpu))
        write(KVM_STATE, 'yes\n')
    except OSError as e:
        write(KVM_STATE, 'no: %s\n' % e)
    finally:
        set_online('1')


def persistent_disk(conf):
    os.makedirs('/persist', exist_ok=True)
    if sh('mount', '-t', 'ext4', '/dev/vda', '/persist').returncode:
        return
    for path in conf['persistent_paths']:
        keep = os.path.join('/persist', path.strip('/').replace('/', '_'))
        os.makedirs(path, exist_ok=True)
        if not os.path.isdir(keep):
            # first boot: start from what the packages put there
            # (mdevctl needs its scripts.d/callouts)
            sh('cp', '-a', path, keep)
        sh('mount', '--bind', keep, path)


# Directories of a QEMU build that must come from that build alone, and
# those whose files it adds to (or overrides in) the machine's.
QEMU_OWN_DIRS = ('usr/lib/x86_64-linux-gnu/qemu',)
QEMU_STACKED_DIRS = ('usr/share/qemu', 'usr/share/seabios')
QEMU_PROGRAM_DIRS = ('usr/bin', 'usr/lib/qemu')


def qemu_tree(conf):
    tree = conf.get('qemu_tree')
    if not tree:
        return
    for rel in QEMU_OWN_DIRS:
        os.makedirs('/' + rel, exist_ok=True)
        sh('mount', '--bind', os.path.join(tree, rel), '/' + rel)
    for rel in QEMU_STACKED_DIRS:
        os.makedirs('/' + rel, exist_ok=True)
        sh('mount', '-t', 'overlay', 'overlay', '-o',
           'lowerdir=%s:/%s' % (os.path.join(tree, rel), rel), '/' + rel)
    for rel in QEMU_PROGRAM_DIRS:
        src_dir = os.path.join(tree, rel)
        if not os.path.isdir(src_dir):
            continue
        for name in sorted(os.listdir(src_dir)):
            src = os.path.join(src_dir, name)
            if os.path.islink(src) or not os.path.isfile(src):
                continue
            dst = os.path.join('/', rel, name)
            if os.path.islink(dst):
                os.unlink(dst)
            if not os.path.exists(dst):
                open(dst, 'w').close()
            sh('mount', '--bind', src, dst)


def files(conf):
    for path, text in conf.get('files', {}).items():
        write(path, text)


def users(conf):
    """libvirt's QEMU driver resolves its build-time default user before
    it reads qemu.conf (which says root): the user must exist.  Debian
    makes it in libvirt-daemon-system, which the machine need not have;
    the VM's /etc is its own (overlay), so it is made here."""
    for name in conf.get('system_users', ()):
        if sh('getent', 'passwd', name, check=False).returncode:
            sh('groupadd', '--system', '-f', name)
            sh('useradd', '--system', '--gid', name, '--no-create-home',
               '--shell', '/usr/sbin/nologin', name)


def udev(conf):
    sh('/lib/systemd/systemd-udevd', '--daemon')
    sh('udevadm', 'trigger', '--action=add')
    sh('udevadm', 'settle', '-t', '60')


def find_port():
    base = '/sys/class/virtio-ports'
    for _ in range(100):
        for port in sorted(os.listdir(base)) if os.path.isdir(base) else ():
            try:
                with open(os.path.join(base, port, 'name')) as f:
                    if f.read().strip() == PORT_NAME:
                        return '/dev/' + port
            except OSError:
                pass
        time.sleep(0.1)
    raise RuntimeError('no virtio port named %s' % PORT_NAME)


# -- the protocol: one JSON object per line, both ways (vm.py, the host's
# end, uses these two as well) ---------------------------------------------

def frame(obj):
    """``obj`` as one line of the protocol."""
    return (json.dumps(obj) + '\n').encode()


def unframe(buf, chunk):
    """``buf`` (what was left) and a new ``chunk``: the objects of the
    complete lines (a line that is no JSON is skipped: the channel may
    carry noise before the other end speaks) and what is left."""
    *lines, rest = (buf + chunk).split(b'\n')
    found = []
    for line in lines:
        try:
            found.append(json.loads(line))
        except ValueError:
            continue
    return found, rest


class Agent(object):

    def __init__(self, path):
        self.fd = os.open(path, os.O_RDWR)
        self.lock = threading.Lock()

    def send(self, obj):
        data = frame(obj)
        with self.lock:
            while data:
                try:
                    data = data[os.write(self.fd, data):]
                except OSError:
                    time.sleep(0.2)    # host not connected (yet)

    def handle(self, req):
        if 'fs' in req:
            out = fs_request(req['fs'])
            out['id'] = req.get('id')
            self.send(out)
            return
        env = dict(os.environ)
        env.update(req.get('env') or {})
        try:
            r = subprocess.run(req['argv'], input=req.get('input'),
                               capture_output=True, text=True, env=env,
                               timeout=req.get('timeout') or None,
                               cwd=req.get('cwd') or '/')
            out = dict(rc=r.returncode, stdout=r.stdout, stderr=r.stderr)
        except subprocess.TimeoutExpired as e:
            out = dict(rc=124, stdout=_text(e.stdout),
                       stderr=_text(e.stderr) + '\n(timed out)')
        except OSError as e:
            out = dict(rc=127, stdout='', stderr=str(e))
        out['id'] = req.get('id')
        self.send(out)

    def serve(self):
        self.send({'hello': os.uname().release})
        buf = b''
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:
                time.sleep(0.2)
                continue
            if not chunk:
                time.sleep(0.1)     # host side closed; it may come back
                continue
            requests, buf = unframe(buf, chunk)
            for req in requests:
                threading.Thread(target=self.handle, args=(req,),
                                 daemon=True).start()


def fs_request(q):
    """A file request answered here, without starting a process (each
    ``cat`` or ``readlink`` costs a fork and an exec under TCG):
    ``{"op": "read", "path"}``: the file's text; ``{"op": "links",
    "globs": [...]}``: ``{path: real path}`` (JSON) of what each pattern
    matches and still exists."""
    try:
        if q.get('op') == 'read':
            with open(q['path'], errors='replace') as f:
                return dict(rc=0, stdout=f.read(), stderr='')
        if q.get('op') == 'links':
            found = {}
            for pattern in q['globs']:
                for path in sorted(glob.glob(pattern)):
                    real = os.path.realpath(path)
                    if os.path.exists(real):
                        found[path] = real
            return dict(rc=0, stdout=json.dumps(found), stderr='')
    except (OSError, KeyError, TypeError) as e:
        return dict(rc=1, stdout='', stderr='%s: %s' % (q.get('op'), e))
    return dict(rc=2, stdout='', stderr='unknown file request %r' % (q,))


def _text(b):
    if b is None:
        return ''
    return b if isinstance(b, str) else b.decode(errors='replace')


def agent_loop():
    os.setsid()
    Agent(find_port()).serve()


def main():
    os.environ.update(PATH=PATH, HOME='/root', LC_ALL='C.UTF-8')
    conf = read_conf()
    signal.signal(signal.SIGALRM, poweroff)
    signal.alarm(int(conf['watchdog_s']))
    log('PID 1 (the kernel booted and the initramfs ran until here)')
    for step in (base_mounts, kernel_modules, kvm, qemu_tree,
                 persistent_disk, files, users, udev):
        t0 = time.monotonic()
        try:
            step(conf)
        except Exception:   # keep going: the tests see what is missing
            log('setup step %s failed' % step.__name__)
            traceback.print_exc()
        log('%s: %.1f s' % (step.__name__, time.monotonic() - t0))
    log('setup done')
    agent = None
    while True:
        if agent is None:
            agent = os.fork()
            if agent == 0:
                try:
                    agent_loop()
                except BaseException:
                    traceback.print_exc()
                finally:
                    os._exit(1)
        try:
            pid, _ = os.wait()
        except ChildProcessError:
            time.sleep(0.5)
            continue
        except InterruptedError:
            continue
        if pid == agent:
            log('agent exited; restarting it')
            agent = None


if __name__ == '__main__':
    main()
