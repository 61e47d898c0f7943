"""What the test VM boots, from Debian packages only, cached under .cache/.

``Assets(cache_dir).prepare()`` makes, once (later runs reuse it)::

    <cache>/debs/        apt-get download: linux-image-<abi>, linux-headers-
                         <abi> (+ -common, linux-kbuild-6.1), busybox-static
    <cache>/root/        all of them unpacked with dpkg-deb -x (never
                         installed): boot/vmlinuz-<abi>, lib/modules/<abi>,
                         usr/src/linux-headers-<abi>, bin/busybox
    <cache>/initramfs.gz the VM's first userspace (busybox + virtio, 9p,
                         overlay modules + tests/kernel/initramfs-init)
    <cache>/guest-initramfs.gz  the inner guest's (busybox + guest-init)

and, every run, builds ``tests/kernel/driver`` against the headers into
``<cache>/driver/nvidia.ko`` (kbuild skips what is up to date).

The kernel is Debian's newest ``linux-image-6.1.0-N-amd64`` for which the
archive also has headers; ``KERNEL_ABI`` in the environment pins one.
Every step raises ``AssetError`` with one line saying what to do.
"""

import os
import re
import shutil
import subprocess
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DRIVER_SRC = os.path.join(HERE, 'driver')

# Modules the initramfs loads, in order (virtio_ring before virtio).
INITRAMFS_MODULES = (
    'drivers/virtio/virtio_ring', 'drivers/virtio/virtio',
    'drivers/virtio/virtio_pci_modern_dev',
    'drivers/virtio/virtio_pci_legacy_dev', 'drivers/virtio/virtio_pci',
    'fs/netfs/netfs', 'fs/fscache/fscache', 'net/9p/9pnet',
    'net/9p/9pnet_virtio', 'fs/9p/9p', 'fs/overlayfs/overlay',
)


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
    """The newest 6.1 ABI with both image and headers in the archive."""
    def abis(prefix):
        out = _run(['apt-cache', 'search', '--names-only',
                    r'^%s-6\.1\.0-[0-9]+-amd64$' % prefix],
                   'looking up %s in apt' % prefix).stdout
        return {m.group(1) for m in re.finditer(
            r'^%s-(6\.1\.0-\d+)-amd64 ' % prefix, out, re.M)}

    both = abis('linux-image') & abis('linux-headers')
    if not both:
        _run(['apt-get', 'update', '-qq'], 'apt-get update')
        both = abis('linux-image') & abis('linux-headers')
    if not both:
        raise AssetError('apt knows no linux-image-6.1.0-N-amd64 with '
                         'headers; check /etc/apt/sources.list (bookworm '
                         'and bookworm-security)')
    return max(both, key=lambda a: int(a.rsplit('-', 1)[1]))


class Assets(object):

    def __init__(self, cache_dir, abi=None):
        self.cache = os.path.abspath(cache_dir)
        self.abi = abi or os.environ.get('KERNEL_ABI') or None
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
        return os.path.join(self.cache, 'guest-initramfs.gz')

    # steps ---------------------------------------------------------------
    def prepare(self):
        t0 = time.monotonic()
        if self.abi is None:
            self.abi = _newest_abi()
        self._download()
        self._extract()
        self.times['download'] = time.monotonic() - t0
        t0 = time.monotonic()
        self._build_driver()
        self._initramfs()
        self._guest_initramfs()
        self.times['build'] = time.monotonic() - t0
        return self

    def _packages(self):
        return ['linux-image-' + self.kver, 'linux-headers-' + self.kver,
                'linux-headers-%s-common' % self.abi, 'linux-kbuild-6.1',
                'busybox-static']

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
        for path in (self.kernel, self.busybox, makefile):
            if not os.path.exists(path):
                raise AssetError('%s is missing after unpacking; remove %s '
                                 'and run again' % (path, self.root))
        open(stamp, 'w').close()

    def _build_driver(self):
        build = os.path.dirname(self.driver)
        os.makedirs(build, exist_ok=True)
        for name in os.listdir(DRIVER_SRC):
            src = os.path.join(DRIVER_SRC, name)
            dst = os.path.join(build, name)
            if not os.path.exists(dst) or \
                    os.path.getmtime(src) > os.path.getmtime(dst):
                shutil.copy2(src, dst)
        _run(['make', '-s', '-C', self.headers, 'M=' + build, 'modules'],
             'building the test mdev driver')
        if not os.path.exists(self.driver):
            raise AssetError('the driver build made no %s' % self.driver)

    def _cpio(self, tree, out):
        """A newc archive of ``tree``, gzipped, with busybox's cpio."""
        tmp = out + '.tmp'
        find = subprocess.run(['find', '.'], cwd=tree, check=True,
                              capture_output=True)
        with open(tmp, 'wb') as f:
            cpio = subprocess.run([self.busybox, 'cpio', '-o', '-H', 'newc'],
                                  cwd=tree, input=find.stdout,
                                  capture_output=True, check=True)
            gz = subprocess.run(['gzip', '-1'], input=cpio.stdout,
                                capture_output=True, check=True)
            f.write(gz.stdout)
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
            shutil.copy2(os.path.join(self.modules_dir, 'kernel',
                                      mod + '.ko'),
                         os.path.join(tree, 'mods'))
        shutil.copy2(init, os.path.join(tree, 'init'))
        self._cpio(tree, self.initramfs)
        shutil.rmtree(tree)

    def _guest_initramfs(self):
        init = os.path.join(HERE, 'guest-init')
        if self._up_to_date(self.guest_initramfs, init):
            return
        tree = self._fresh_tree('guest-tree', 'bin', 'proc', 'sys', 'dev')
        shutil.copy2(init, os.path.join(tree, 'init'))
        self._cpio(tree, self.guest_initramfs)
        shutil.rmtree(tree)


if __name__ == '__main__':
    import sys
    a = Assets(sys.argv[1] if len(sys.argv) > 1 else '.cache/kernel-vm')
    a.prepare()
    print(a.abi, a.times)
