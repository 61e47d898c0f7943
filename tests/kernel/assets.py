"""What the test VM boots, from Debian packages only, cached under .cache/.

``Assets(cache_dir).prepare()`` makes, once (later runs reuse it)::

    <cache>/debs/<abi>/  apt-get download: linux-image-<abi>-amd64 and
                         -cloud-amd64, linux-headers-<abi>-amd64 (+ -common,
                         linux-kbuild-<abi>), busybox-static
    <cache>/root/<abi>/  all of them unpacked with dpkg-deb -x (never
                         installed): boot/vmlinuz-*, lib/modules/<abi>-amd64,
                         usr/src/linux-headers-<abi>-amd64, bin/busybox
    <cache>/qemu/<ver>/  QEMU from bookworm-backports (qemu-system-x86,
                         -common, -data, seabios) unpacked the same way; the
                         VM mounts it over its own /usr (vm_init.py): only
                         the VM runs it, the machine keeps its QEMU
    <cache>/initramfs-<abi>.gz  the VM's first userspace (busybox + 9p and
                         overlay modules + tests/kernel/initramfs-init)
    <cache>/guest-initramfs.gz  the inner guest's (busybox + guest-init)

and, every run, builds ``tests/kernel/driver`` against the headers into
``<cache>/driver/<abi>/nvidia.ko`` (kbuild skips what is up to date).

Why these: VFIO live migration (protocol v2) needs Linux >= 6.2 on the
kernel side and QEMU >= 8.1 (Debian 12 has 7.2, which only speaks the
removed v1 protocol).  The kernel is Debian 12's newest
``linux-image-6.12.N+deb12-amd64`` (bookworm-security) for which the archive
also has headers; ``KERNEL_ABI`` (e.g. ``6.12.117+deb12``) pins one.  The
inner guest OS boots the ``-cloud-amd64`` flavour of the same kernel: it
has ACPI PCI hotplug and a serial console and far fewer drivers to start,
which matters under two levels of emulation.  QEMU is bookworm-backports'
newest; ``QEMU_VERSION`` pins one.  Every step raises ``AssetError`` with
one line saying what to do.
"""

import os
import re
import shutil
import subprocess
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DRIVER_SRC = os.path.join(HERE, 'driver')

# Modules the initramfs loads, in order (virtio is built into 6.12; its
# modules are .ko.xz, unpacked into the initramfs for busybox's insmod).
INITRAMFS_MODULES = (
    'fs/netfs/netfs', 'net/9p/9pnet', 'net/9p/9pnet_virtio', 'fs/9p/9p',
    'fs/overlayfs/overlay',
)
KERNEL_SERIES = '6.12'
BACKPORTS = 'deb http://deb.debian.org/debian bookworm-backports main\n'
ZSTD_MAGIC = b'\x28\xb5\x2f\xfd'
QEMU_PACKAGES = ('qemu-system-x86', 'qemu-system-common',
                 'qemu-system-data', 'seabios')


class AssetError(Exception):
    pass


def _run(argv, what, **kwargs):
    try:
        return subprocess.run(argv, check=True, capture_output=True,
                              text=True, **kwargs)
    except FileNotFoundError:
        raise AssetError('%s: %s is not installed; run make deps'
                         % (what, argv[0]))
    except subprocess.CalledProcessError as e:
        tail = (e.stderr or e.stdout or '').strip().splitlines()[-3:]
        raise AssetError('%s failed (%s): %s'
                         % (what, ' '.join(argv[:3]), ' | '.join(tail)))


def _newest_abi():
    """The newest 6.12 ABI with image, cloud image and headers in the
    archive (``6.12.117+deb12``)."""
    series = re.escape(KERNEL_SERIES)

    def abis(prefix, flavour='amd64'):
        out = _run(['apt-cache', 'search', '--names-only',
                    r'^%s-%s\.[0-9]+\+deb12-%s$' % (prefix, series,
                                                    flavour)],
                   'looking up %s in apt' % prefix).stdout
        return {m.group(1) for m in re.finditer(
            r'^%s-(%s\.\d+\+deb12)-%s ' % (prefix, series, flavour),
            out, re.M)}

    def usable():
        return (abis('linux-image') & abis('linux-headers')
                & abis('linux-image', 'cloud-amd64'))

    both = usable()
    if not both:
        _run(['apt-get', 'update', '-qq'], 'apt-get update')
        both = usable()
    if not both:
        raise AssetError('apt knows no linux-image-%s.N+deb12-amd64 with '
                         'headers and a -cloud-amd64 image; check '
                         '/etc/apt/sources.list (bookworm and '
                         'bookworm-security)' % KERNEL_SERIES)
    return max(both, key=lambda a: int(a.split('+')[0].rsplit('.', 1)[1]))


class Assets(object):

    def __init__(self, cache_dir, abi=None, qemu_version=None):
        self.cache = os.path.abspath(cache_dir)
        self.abi = abi or os.environ.get('KERNEL_ABI') or None
        self.qemu_version = (qemu_version or os.environ.get('QEMU_VERSION')
                             or None)
        self.times = {}

    # paths ---------------------------------------------------------------
    @property
    def kver(self):
        return '%s-amd64' % self.abi

    @property
    def root(self):
        return os.path.join(self.cache, 'root', self.abi)

    @property
    def kernel(self):
        return os.path.join(self.root, 'boot', 'vmlinuz-' + self.kver)

    @property
    def guest_vmlinuz(self):
        return os.path.join(self.root, 'boot',
                            'vmlinuz-%s-cloud-amd64' % self.abi)

    @property
    def guest_kernel(self):
        """The inner guest OS's kernel: the cloud flavour's ELF image,
        unpacked from its vmlinuz (``_guest_kernel``)."""
        return os.path.join(self.cache, 'vmlinux-%s-cloud' % self.abi)

    @property
    def qemu_tree(self):
        """Where QEMU from backports lies unpacked (``usr/``, ``etc/``)."""
        return os.path.join(self.cache, 'qemu',
                            self.qemu_version.replace(':', '_'))

    @property
    def modules_dir(self):
        return os.path.join(self.root, 'lib', 'modules', self.kver)

    @property
    def headers(self):
        return os.path.join(self.root, 'usr', 'src',
                            'linux-headers-' + self.kver)

    @property
    def busybox(self):
        return os.path.join(self.root, 'bin', 'busybox')

    @property
    def driver(self):
        return os.path.join(self.cache, 'driver', self.abi, 'nvidia.ko')

    @property
    def initramfs(self):
        return os.path.join(self.cache, 'initramfs-%s.gz' % self.abi)

    @property
    def guest_initramfs(self):
        return os.path.join(self.cache, 'guest-initramfs.cpio')

    # steps ---------------------------------------------------------------
    def prepare(self):
        t0 = time.monotonic()
        if self.abi is None:
            self.abi = _newest_abi()
        self._download()
        self._extract()
        self._qemu()
        self.times['download'] = time.monotonic() - t0
        t0 = time.monotonic()
        self._build_driver()
        self._initramfs()
        self._guest_kernel()
        self._guest_initramfs()
        self.times['build'] = time.monotonic() - t0
        return self

    def _packages(self):
        return ['linux-image-' + self.kver,
                'linux-image-%s-cloud-amd64' % self.abi,
                'linux-headers-' + self.kver,
                'linux-headers-%s-common' % self.abi,
                'linux-kbuild-' + self.abi, 'busybox-static']

    def _debs(self):
        return os.path.join(self.cache, 'debs', self.abi)

    def _download(self):
        debs = self._debs()
        os.makedirs(debs, exist_ok=True)
        have = os.listdir(debs)
        missing = [p for p in self._packages()
                   if not any(f.startswith(p + '_') for f in have)]
        if missing:
            _run(['apt-get', 'download'] + missing,
                 'downloading the test kernel', cwd=debs)

    def _extract(self):
        stamp = os.path.join(self.root, '.extracted')
        if os.path.exists(stamp):
            return
        shutil.rmtree(self.root, ignore_errors=True)
        os.makedirs(self.root)
        debs = self._debs()
        for name in sorted(os.listdir(debs)):
            if name.endswith('.deb'):
                _run(['dpkg-deb', '-x', os.path.join(debs, name), self.root],
                     'unpacking %s' % name)
        # The arch headers include the -common tree by absolute path.
        makefile = os.path.join(self.headers, 'Makefile')
        with open(makefile) as f:
            text = f.read()
        text = re.sub(r'^include /usr/src/',
                      'include %s/usr/src/' % self.root, text, flags=re.M)
        with open(makefile, 'w') as f:
            f.write(text)
        _run(['depmod', '-b', self.root, self.kver],
             'depmod of the test kernel')
        for path in (self.kernel, self.guest_vmlinuz, self.busybox,
                     makefile):
            if not os.path.exists(path):
                raise AssetError('%s is missing after unpacking; remove %s '
                                 'and run again' % (path, self.root))
        open(stamp, 'w').close()

    # -- QEMU from bookworm-backports -----------------------------------
    def _apt_backports(self):
        """apt options for a private list of bookworm-backports (the
        machine's own apt configuration is left alone)."""
        base = os.path.join(self.cache, 'apt')
        lists = os.path.join(base, 'lists')
        os.makedirs(os.path.join(lists, 'partial'), exist_ok=True)
        sources = os.path.join(base, 'backports.list')
        if not os.path.exists(sources):
            with open(sources, 'w') as f:
                f.write(BACKPORTS)
        return ['-o', 'Dir::Etc::sourcelist=' + sources,
                '-o', 'Dir::Etc::sourceparts=/dev/null',
                '-o', 'Dir::State::Lists=' + lists]

    def _backports_version(self, opts, refresh=False):
        if refresh:
            _run(['apt-get'] + opts + ['update', '-qq'],
                 'apt-get update of bookworm-backports')
        out = _run(['apt-cache'] + opts + ['madison', 'qemu-system-x86'],
                   'looking up qemu-system-x86 in bookworm-backports').stdout
        found = [line.split('|')[1].strip() for line in out.splitlines()
                 if 'bookworm-backports' in line]
        return found[0] if found else None

    def _qemu(self):
        if self.qemu_version is None:
            known = sorted(os.listdir(os.path.join(self.cache, 'qemu'))) \
                if os.path.isdir(os.path.join(self.cache, 'qemu')) else []
            ready = [k for k in known if os.path.exists(
                os.path.join(self.cache, 'qemu', k, '.extracted'))]
            if ready:     # offline re-runs use what is there
                self.qemu_version = ready[-1].replace('_', ':', 1)
        if self.qemu_version is not None and os.path.exists(
                os.path.join(self.qemu_tree, '.extracted')):
            return
        opts = self._apt_backports()
        if self.qemu_version is None:
            self.qemu_version = (self._backports_version(opts)
                                 or self._backports_version(opts, True))
        if self.qemu_version is None:
            raise AssetError('bookworm-backports offers no qemu-system-x86 '
                             '(VFIO migration needs QEMU >= 8.1); is '
                             'deb.debian.org reachable?')
        debs = os.path.join(self.cache, 'debs', 'qemu-' +
                            self.qemu_version.replace(':', '_'))
        os.makedirs(debs, exist_ok=True)
        if not any(f.endswith('.deb') for f in os.listdir(debs)):
            _run(['apt-get'] + opts + ['download', '-t', 'bookworm-backports']
                 + ['%s' % p for p in QEMU_PACKAGES],
                 'downloading QEMU from bookworm-backports', cwd=debs)
        tree = self.qemu_tree
        shutil.rmtree(tree, ignore_errors=True)
        os.makedirs(tree)
        for name in sorted(os.listdir(debs)):
            if name.endswith('.deb'):
                _run(['dpkg-deb', '-x', os.path.join(debs, name), tree],
                     'unpacking %s' % name)
        binary = os.path.join(tree, 'usr', 'bin', 'qemu-system-x86_64')
        if not os.path.exists(binary):
            raise AssetError('%s is missing after unpacking; remove %s and '
                             'run again' % (binary, debs))
        open(os.path.join(tree, '.extracted'), 'w').close()

    def _build_driver(self):
        build = os.path.dirname(self.driver)
        os.makedirs(build, exist_ok=True)
        for name in os.listdir(DRIVER_SRC):
            src = os.path.join(DRIVER_SRC, name)
            dst = os.path.join(build, name)
            if not os.path.exists(dst) or \
                    os.path.getmtime(src) > os.path.getmtime(dst):
                shutil.copy2(src, dst)
        # No BTF for our module: that step wants pahole, which the
        # machine lacks and the module does not need.
        _run(['make', '-s', '-C', self.headers, 'M=' + build,
              'CONFIG_DEBUG_INFO_BTF_MODULES=', 'modules'],
             'building the test mdev driver')
        if not os.path.exists(self.driver):
            raise AssetError('the driver build made no %s' % self.driver)

    def _cpio(self, tree, out, gzip=True):
        """A newc archive of ``tree`` with busybox's cpio, gzipped unless
        ``gzip`` is false."""
        tmp = out + '.tmp'
        find = subprocess.run(['find', '.'], cwd=tree, check=True,
                              capture_output=True)
        with open(tmp, 'wb') as f:
            cpio = subprocess.run([self.busybox, 'cpio', '-o', '-H', 'newc'],
                                  cwd=tree, input=find.stdout,
                                  capture_output=True, check=True)
            data = cpio.stdout
            if gzip:
                data = subprocess.run(['gzip', '-1'], input=data,
                                      capture_output=True, check=True).stdout
            f.write(data)
        os.replace(tmp, out)

    def _fresh_tree(self, name, *dirs):
        tree = os.path.join(self.cache, name)
        shutil.rmtree(tree, ignore_errors=True)
        for d in dirs:
            os.makedirs(os.path.join(tree, d))
        shutil.copy2(self.busybox, os.path.join(tree, 'bin', 'busybox'))
        return tree

    def _up_to_date(self, out, *inputs):
        return os.path.exists(out) and all(
            os.path.getmtime(out) >= os.path.getmtime(i) for i in inputs)

    def _initramfs(self):
        init = os.path.join(HERE, 'initramfs-init')
        if self._up_to_date(self.initramfs, init):
            return
        tree = self._fresh_tree('initramfs-tree', 'bin', 'mods', 'proc',
                                'sys', 'dev', 'lower', 'upper', 'newroot')
        for mod in INITRAMFS_MODULES:
            src = os.path.join(self.modules_dir, 'kernel', mod + '.ko.xz')
            dst = os.path.join(tree, 'mods', os.path.basename(mod) + '.ko')
            with open(dst, 'wb') as f:
                try:
                    subprocess.run(['xz', '-dc', src], stdout=f,
                                   check=True)
                except (OSError, subprocess.CalledProcessError) as e:
                    raise AssetError('unpacking %s for the initramfs: %s'
                                     % (src, e))
        shutil.copy2(init, os.path.join(tree, 'init'))
        self._cpio(tree, self.initramfs)
        shutil.rmtree(tree)

    # The guest OS boots under two levels of emulation, where every step
    # the kernel takes before init costs about a hundred times its usual
    # time: its kernel is given as the uncompressed ELF image (QEMU starts
    # it at its PVH entry: no decompression, no real-mode setup), and its
    # initramfs uncompressed.
    def _guest_kernel(self):
        out = self.guest_kernel
        if self._up_to_date(out, self.guest_vmlinuz):
            return
        with open(self.guest_vmlinuz, 'rb') as f:
            image = f.read()
        start = image.find(ZSTD_MAGIC)
        if start < 0:
            raise AssetError('%s holds no zstd-compressed kernel; this '
                             'kernel flavour is not one the tests know'
                             % self.guest_vmlinuz)
        # zstd stops at the 4-byte size the build appends after the frame
        # and says so (rc 1); what it wrote before is the whole image.
        r = subprocess.run(['zstd', '-dcq'], input=image[start:],
                           capture_output=True)
        if not r.stdout.startswith(b'\x7fELF'):
            raise AssetError('unpacking %s gave no ELF image: %s'
                             % (self.guest_vmlinuz, r.stderr.decode(
                                 errors='replace').strip()[-200:]))
        with open(out + '.tmp', 'wb') as f:
            f.write(r.stdout)
        os.replace(out + '.tmp', out)

    def _guest_initramfs(self):
        init = os.path.join(HERE, 'guest-init')
        if self._up_to_date(self.guest_initramfs, init):
            return
        tree = self._fresh_tree('guest-tree', 'bin', 'proc', 'sys', 'dev')
        shutil.copy2(init, os.path.join(tree, 'init'))
        self._cpio(tree, self.guest_initramfs, gzip=False)
        shutil.rmtree(tree)


if __name__ == '__main__':
    import sys
    a = Assets(sys.argv[1] if len(sys.argv) > 1 else '.cache/kernel-vm')
    a.prepare()
    print(a.abi, a.qemu_version, a.times)
