"""The test VM: Debian's kernel under qemu (TCG), the machine's / inside.

::

    vm = TestVm(assets, workdir)       # assets: tests.kernel.assets.Assets
    vm.boot()                          # until the agent says hello
    r = vm.run(['cat', '/proc/version'])        # Result(rc, stdout, stderr)
    vm.poweroff(); vm.boot()           # the persistent disk survives
    vm.close()                         # always; kills qemu if still there

What runs where
---------------
qemu gets the machine's whole ``/`` read-only over virtio-9p (initramfs-init
puts a tmpfs overlay on top), so the VM runs this machine's libvirt,
mdevctl, udev and this checkout's ``.venv`` at the same paths; its QEMU is
the newer one of ``assets.qemu_tree``, mounted over the machine's inside the
VM only (vm_init.py), because VFIO migration needs QEMU >= 8.1.  Two
``bochs-display`` devices at 0000:00:05.0 and 0000:00:06.0 are the GPUs the
test driver binds.  ``<workdir>/persist.img`` (ext4, made by ``new_disk``)
is the VM's disk for what must survive a reboot.  vm_init.py is PID 1;
its agent runs commands for the host over a virtio-serial port whose host
end is ``<workdir>/agent.sock``.

Nothing outlives the run: qemu is started with a parent-death signal
(SIGKILL when the process that started it dies, SIGKILL of pytest included),
and the VM powers itself off after ``watchdog_s``.
"""

import ctypes
import itertools
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import threading
import time
import typing

from tests.kernel import vm_init

QEMU = 'qemu-system-x86_64'
GPU_ADDRESSES = ('0000:00:05.0', '0000:00:06.0')
# /var/cache/libvirt: libvirtd's probe of QEMU's capabilities (about 15 s
# here) is done once, not again after the reboot test's power-off.
PERSISTENT_PATHS = ('/etc/mdevctl.d', '/etc/libvirt/qemu',
                    '/var/lib/libvirt-gpu', '/var/cache/libvirt')
_PR_SET_PDEATHSIG = 1


class VmError(Exception):
    pass


class Result(typing.NamedTuple):
    rc: int
    stdout: str
    stderr: str

    def check(self, what='command'):
        if self.rc != 0:
            raise VmError('%s failed in the test VM (rc=%d): %s'
                          % (what, self.rc,
                             (self.stderr or self.stdout).strip()[-2000:]))
        return self


def missing_requirements():
    """Why this machine cannot run the VM ([] when it can)."""
    missing = []
    for tool in (QEMU, 'apt-get', 'dpkg-deb', 'make', 'gcc', 'mkfs.ext4',
                 'zstd', 'xz', 'nsenter', 'unshare'):
        if shutil.which(tool) is None:
            missing.append('%s is not installed (run make deps)' % tool)
    if os.geteuid() != 0:
        missing.append('the VM tests run as root (9p passthrough, libvirtd)')
    return missing


def _die_with_parent():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() == 1:       # the parent is already gone
        os._exit(1)


class TestVm(object):

    def __init__(self, assets, workdir, memory_mb=3072, cpus=2,
                 watchdog_s=3600, files=None):
        self.assets = assets
        self.workdir = os.path.abspath(workdir)
        self.memory_mb = memory_mb
        self.cpus = cpus
        self.watchdog_s = watchdog_s
        self.files = dict(files or {})
        self.disk = os.path.join(self.workdir, 'persist.img')
        self.sock_path = os.path.join(self.workdir, 'agent.sock')
        self.proc = None
        self.boots = 0
        self.retried = []       # why each boot booted again (boot)
        self._sock = None
        self._reader = None
        self._waiting = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._hello = queue.Queue()

    # -- lifecycle -------------------------------------------------------
    def new_disk(self, size_mb=256):
        os.makedirs(self.workdir, exist_ok=True)
        with open(self.disk, 'wb') as f:
            f.truncate(size_mb << 20)
        subprocess.run(['mkfs.ext4', '-q', '-F', self.disk], check=True,
                       capture_output=True)

    def console_log(self, boot=None):
        return os.path.join(self.workdir,
                            'console-%d.log' % (boot or self.boots))

    def _write_conf(self):
        conf = dict(modules_dir=self.assets.modules_dir,
                    driver=self.assets.driver,
                    qemu_tree=self.assets.qemu_tree,
                    system_users=['libvirt-qemu'],
                    watchdog_s=self.watchdog_s,
                    persistent_paths=list(PERSISTENT_PATHS),
                    files=self.files)
        path = os.path.join(self.workdir, 'vm.json')
        with open(path, 'w') as f:
            json.dump(conf, f)
        return path

    def command(self):
        init = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                            'vm_init.py')
        # Modules udev would load for devices the tests do not use; and
        # KVM's, which vm_init.kvm loads itself at the one safe moment.
        skip = 'kvm,kvm_amd,kvm_intel,ccp,pcspkr,snd_pcsp,joydev,evdev'
        append = ('console=ttyS0 panic=-1 quiet loglevel=4 '
                  'modprobe.blacklist=%s tk.init=%s tk.conf=%s'
                  % (skip, init, self._write_conf()))
        # Multi-threaded TCG: one thread per vCPU.  Single-threaded TCG
        # has none of the int3 race (see boot) but its guests under KVM
        # ran the hot-plug tests past their timeouts beside the other
        # tests (kernel tests 1,546 s against some 750 s).
        argv = [QEMU, '-accel', 'tcg,thread=multi', '-cpu', 'max',
                '-m', str(self.memory_mb), '-smp', str(self.cpus),
                '-nodefaults', '-display', 'none', '-serial', 'stdio',
                '-no-reboot', '-nic', 'none',
                '-kernel', self.assets.kernel,
                '-initrd', self.assets.initramfs, '-append', append,
                '-virtfs', 'local,path=/,mount_tag=hostroot,'
                'security_model=passthrough,readonly=on,multidevs=remap,'
                'id=hostroot',
                '-drive', 'file=%s,if=virtio,format=raw' % self.disk,
                '-device', 'virtio-serial-pci',
                '-chardev', 'socket,id=agent,path=%s,server=on,wait=off'
                % self.sock_path,
                '-device', 'virtserialport,chardev=agent,name=tk.agent',
                '-vga', 'none']
        for addr in GPU_ADDRESSES:
            argv += ['-device', 'bochs-display,addr=%s' % addr[-4:]]
        return argv

    def boot(self, timeout=300):
        """Start qemu and wait for the agent's hello; returns seconds.

        A kernel that dies of ``Oops: int3`` before the hello is booted
        once more, and the first oops kept in ``retried``: multi-threaded
        TCG can run one vCPU's stale translation of code the kernel is
        patching with int3 on another as it flips static keys at boot (seen
        once in nine runs, on a loaded machine, as the kernel unpacked its
        initramfs).  Any other death at boot, or a second one, is the
        error it is."""
        try:
            return self._boot_once(timeout)
        except VmError as e:
            if 'Oops: int3' not in str(e):
                raise
            self.retried.append(str(e))
            return self._boot_once(timeout)

    def _boot_once(self, timeout):
        if self.proc is not None and self.proc.poll() is None:
            raise VmError('the test VM is already running')
        if not os.path.exists(self.disk):
            self.new_disk()
        if os.path.exists(self.sock_path):
            os.unlink(self.sock_path)
        self.boots += 1
        t0 = time.monotonic()
        with open(self.console_log(), 'wb') as log:
            self.proc = subprocess.Popen(
                self.command(), stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        self._connect(t0 + 30)
        deadline = t0 + timeout
        while True:
            # a second at a time: a kernel that panics makes qemu exit
            # (-no-reboot), said at once with the console's first oops
            try:
                self._hello.get(timeout=max(0.1, min(
                    1.0, deadline - time.monotonic())))
                return time.monotonic() - t0
            except queue.Empty:
                pass
            if self.proc.poll() is not None:
                code = self.proc.returncode
                self.close()
                raise VmError('qemu exited with %s before the test VM came '
                              'up%s; see %s' % (code, self._oops(),
                                                self.console_log()))
            if time.monotonic() >= deadline:
                self.close()
                raise VmError('the test VM did not come up within %d s; '
                              'see %s' % (timeout, self.console_log()))

    def _oops(self):
        """': ' and the console's first line that says the kernel died,
        or ''."""
        try:
            with open(self.console_log(), errors='replace') as f:
                for line in f:
                    if 'Oops' in line or 'Kernel panic' in line:
                        return ': ' + line.strip()
        except OSError:
            pass
        return ''

    def _connect(self, deadline):
        while True:
            if self.proc.poll() is not None:
                raise VmError('qemu exited with %s at start%s; see %s'
                              % (self.proc.returncode, self._oops(),
                                 self.console_log()))
            try:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.connect(self.sock_path)
                break
            except OSError:
                sock.close()
                if time.monotonic() > deadline:
                    self.close()
                    raise VmError('no agent socket from qemu; see %s'
                                  % self.console_log())
                time.sleep(0.1)
        self._sock = sock
        self._reader = threading.Thread(target=self._read, args=(sock,),
                                        daemon=True)
        self._reader.start()

    def _read(self, sock):
        buf = b''
        while True:
            try:
                chunk = sock.recv(65536)
            except OSError:
                chunk = b''
            if not chunk:
                break
            messages, buf = vm_init.unframe(buf, chunk)
            for msg in messages:
                if 'hello' in msg:
                    self._hello.put(msg)
                    continue
                with self._lock:
                    waiter = self._waiting.pop(msg.get('id'), None)
                if waiter is not None:
                    waiter.put(msg)
        with self._lock:        # the VM went away: wake everyone up
            waiting, self._waiting = self._waiting, {}
        for waiter in waiting.values():
            waiter.put(None)

    def poweroff(self, timeout=120):
        """Flush and power off; waits for qemu to exit."""
        self.run(['sh', '-c', 'sync; umount /persist/* 2>/dev/null; sync'],
                 timeout=60)
        self.run(['sh', '-c', 'echo o > /proc/sysrq-trigger'], timeout=5,
                 wait=False)
        try:
            self.proc.wait(timeout)
        finally:
            self.close()

    def close(self):
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    @property
    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    # -- commands --------------------------------------------------------
    def run(self, argv, input=None, timeout=120, env=None, wait=True):
        """Run ``argv`` in the VM; Result.  ``timeout`` is enforced in the
        VM (rc 124) and, with a margin, here."""
        return self._request(dict(argv=list(argv), input=input,
                                  timeout=timeout, env=env or {}),
                             timeout, argv, wait)

    def _request(self, req, timeout, what, wait=True):
        if self._sock is None:
            raise VmError('the test VM is not running')
        rid = next(self._ids)
        waiter = queue.Queue()
        with self._lock:
            self._waiting[rid] = waiter
        req['id'] = rid
        self._sock.sendall(vm_init.frame(req))
        if not wait:
            return None
        try:
            msg = waiter.get(timeout=timeout + 30)
        except queue.Empty:
            raise VmError('no answer from the test VM to %s within %d s'
                          % (what, timeout + 30))
        if msg is None:
            raise VmError('the test VM went away during %s; see %s'
                          % (what, self.console_log()))
        return Result(msg['rc'], msg['stdout'], msg['stderr'])

    def sh(self, script, **kwargs):
        return self.run(['sh', '-c', script], **kwargs)

    def read(self, path):
        """The text of ``path`` in the VM, read by the agent itself (no
        process is started)."""
        return self._request(dict(fs=dict(op='read', path=path)), 60,
                             path).check('reading ' + path).stdout

    def links(self, *globs):
        """{path: real path} of what each glob pattern matches in the VM
        (and still exists), resolved by the agent itself."""
        r = self._request(dict(fs=dict(op='links', globs=list(globs))), 60,
                          globs).check('listing ' + ' '.join(globs))
        return json.loads(r.stdout)

    def write_file(self, path, text):
        self.run(['sh', '-c', 'mkdir -p "$(dirname "$1")" && cat > "$1"',
                  'sh', path], input=text).check('writing ' + path)
