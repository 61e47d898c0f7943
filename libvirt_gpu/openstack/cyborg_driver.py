"""Our driver for OpenStack Cyborg's agent: ``libvirt_gpu_driver``.

Cyborg's agent loads it through stevedore (entry point
``libvirt_gpu_driver`` in ``cyborg.accelerator.driver``, turned on by
``[agent] enabled_drivers = libvirt_gpu_driver`` in cyborg.conf) and calls
``discover()`` about every minute; the conductor turns the
``DriverDevice`` objects into its database rows and Placement providers.

- What is offered comes from libvirt-gpu's own configuration (the file
  ``$LIBVIRT_GPU_CONFIG`` names, else ``/etc/libvirt-gpu/libvirt-gpu.conf``),
  read again at every discovery, so the qemu hook, ``libvirt-gpu agent``
  and Cyborg offer the same vGPU types.  Cyborg's own ``[gpu_devices]``
  and ``[vgpu_<type>]`` options are not read (a warning says so when set).
- Deployable names use Cyborg's ``[DEFAULT]/host``.
- The GPUs are read as ``libvirt-gpu`` reads them: libvirt at
  ``[libvirt]/connection_uri`` when the libvirt binding is installed
  beside Cyborg, else sysfs at ``[DEFAULT]/sysfs_root``; never ``lspci``.
- The objects are ``openstack.cyborg_objects`` records (the records
  ``libvirt-gpu discover --json`` prints) turned into Cyborg's own objects
  here.  Every GPU we manage is a device; one of which nothing can go to a
  guest through Cyborg (a vendor-interface vGPU type among them, a GPU
  carved for Nova) has no deployable, and the log says why (that
  module's doc).

Cyborg is not a requirement of ours: this module is the only one that
imports it, and only when Cyborg asks for ``LibvirtGPUDriver`` (the class
is built on first access, PEP 562), so importing this module needs no
Cyborg and nothing of ours imports it.
"""

import importlib.util

from libvirt_gpu import conffile
from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.util import logs

LOG = logs.getLogger(__name__)

ENTRY_POINT = 'libvirt_gpu_driver'
NAMESPACE = 'cyborg.accelerator.driver'


class ReportRefused(exception.LibvirtGpuError):
    """A report that would make Cyborg remove or change devices by mistake:
    ``discover()`` raises it instead, and Cyborg's agent keeps the devices
    it has (its ``ResourceTracker.update_usage`` sends no report when a
    driver raises)."""

    msg_fmt = ('libvirt_gpu_driver refuses to report, so that Cyborg keeps '
               'the devices it has: %(reason)s')


def uri_refusal(uri):
    """Why libvirt at ``uri`` cannot describe the host Cyborg runs on, or
    None: libvirt's built-in test host (``test:///default``: a fake host
    with no GPU) and another host (``qemu+ssh://other/system``,
    ``qemu://other/system``).  A ``test:///<file>`` of a simulated host is
    allowed (the tests' hosts)."""
    from urllib import parse
    try:
        parts = parse.urlsplit(uri)
    except ValueError as e:
        return '[libvirt]/connection_uri %r is not a URI (%s)' % (uri, e)
    driver, _, transport = parts.scheme.partition('+')
    if driver == 'test' and parts.path in ('', '/default'):
        return ('[libvirt]/connection_uri = %s is libvirt\'s built-in test '
                'host, not this one: set qemu:///system' % uri)
    if parts.netloc or transport not in ('', 'unix'):
        return ('[libvirt]/connection_uri = %s names another host: Cyborg '
                'reports the GPUs of the host it runs on; set '
                'qemu:///system' % uri)
    return None


def unreadable_vgpu_gpus(gpus, enabled, conf):
    """``{address: why}`` of the GPUs configured for vGPUs that discovery
    saw without any vGPU type, and that would be offered whole (PGPU)
    instead: their types could not be read now (a driver reload, VFs not
    enabled yet).  A GPU named in ``[vgpu_<type>]/device_addresses`` is
    refused by ``enablement.resolve`` already; this is the single enabled
    type without addresses (every GPU that offers it), which configures
    every GPU the vGPU driver (not vfio-pci) holds: one of a vendor in
    ``[gpu]/pgpu_vendor_ids`` would be offered whole, an NVIDIA one
    otherwise left out (and deleted by Cyborg)."""
    from libvirt_gpu.devices import enablement
    types = list(conf.gpu.enabled_vgpu_types)
    if len(types) != 1 or conf[enablement.group_name(types[0])] \
            .device_addresses:
        return {}
    whole = set(conf.gpu.pgpu_vendor_ids)
    found = {}
    for gpu in sorted(gpus, key=lambda g: g.address):
        if (gpu.is_vf or gpu.address in enabled or gpu.offered_types()
                or gpu.driver == 'vfio-pci'
                or gpu.vendor_id not in whole | {objects.NVIDIA_VENDOR_ID}):
            continue
        instead = ('offered whole (PGPU) instead' if gpu.vendor_id in whole
                   else 'left out of the report (Cyborg would delete it)')
        found[gpu.address] = (
            'GPU %s lists no vGPU type now (driver %s), while '
            '[gpu]/enabled_vgpu_types = %s enables it on every GPU that '
            'offers it: its types could not be read (is its driver '
            'reloading, or are its SR-IOV VFs not enabled yet?), and it '
            'would be %s; if it is meant to go whole to guests, bind it to '
            'vfio-pci or name the vGPU GPUs in [%s]/device_addresses'
            % (gpu.address, gpu.driver or 'none', types[0], instead,
               enablement.group_name(types[0])))
    return found


def report_refusal(conf, env):
    """Why the report of ``env`` (the host as ``discover_records`` reads
    it) must not reach Cyborg, or None.  Cyborg deletes every device its
    driver stops reporting, and replaces a device whose resource class
    changes, so a host read wrongly must raise, not report."""
    gpus = env.discovered.gpus
    if not gpus:
        where = ('libvirt at %s' % env.source.uri if env.source is not None
                 else 'sysfs at %s' % env.sysfs_root)
        return ('no GPU (PCI display controller) is visible on this host '
                '(read from %s, [DEFAULT]/sysfs_root = %s): is this the '
                'host\'s own sysfs, with its bus/pci/devices? Cyborg would '
                'delete every device of the host; if the host really has '
                'no GPU any more, remove libvirt_gpu_driver from '
                'cyborg.conf\'s [agent]/enabled_drivers'
                % (where, env.sysfs_root))
    unreadable = unreadable_vgpu_gpus(gpus, env.enabled, conf)
    if unreadable:
        return '; '.join(unreadable.values())
    return None


def discover_records(hostname, config_file=None, environ=None):
    """The ``cyborg_objects.DriverDevice`` records of this host, as
    libvirt-gpu's configuration (``conf.load``) offers them.  Raises
    ``ReportRefused`` (``report_refusal``, ``uri_refusal``) or the
    configuration's own error rather than return a report that would
    remove or change devices by mistake."""
    from libvirt_gpu import conf as conf_mod
    from libvirt_gpu import environment
    from libvirt_gpu.openstack import cyborg_objects

    conf = conf_mod.load(config_file, environ=environ)
    refusal = uri_refusal(conf.libvirt.connection_uri)
    if refusal is not None:
        raise ReportRefused(reason=refusal)
    source = None
    if importlib.util.find_spec('libvirt') is not None:
        # libvirt first, sysfs when it cannot be reached; Cyborg's
        # environment without the libvirt binding reads sysfs only.
        source = environment.Source(uri=conf.libvirt.connection_uri)
    env = environment.Environment.from_conf(conf, source=source)
    refusal = report_refusal(conf, env)
    if refusal is not None:
        raise ReportRefused(reason=refusal)
    from libvirt_gpu.devices import routes as routes_mod
    cyborg = env.routes.of(routes_mod.CYBORG)
    if not cyborg:
        LOG.warning('no GPU is given to Cyborg: list the GPUs it hands out '
                    'in [routes]/cyborg of libvirt-gpu\'s configuration; '
                    'every GPU is reported with nothing to offer')
    devices, withheld = cyborg_objects.host_devices(
        hostname, env.discovered.gpus, env.enabled, conf.gpu,
        carved=env.carved.gpus, cyborg=cyborg, routes=env.routes.foreign())
    for address, why in withheld.items():
        # A warning where the operator enabled a vGPU type for Cyborg (a
        # vendor interface's, or one with no room left); the host's state
        # (or another route's GPU) else.
        log = (LOG.warning if address in env.enabled and address in cyborg
               else LOG.info)
        log('%s: reported to Cyborg with nothing to offer: %s', address, why)
    return devices


def to_cyborg(device):
    """One ``cyborg_objects.DriverDevice`` as Cyborg's ``DriverDevice``."""
    from cyborg.objects.driver_objects import driver_attach_handle
    from cyborg.objects.driver_objects import driver_attribute
    from cyborg.objects.driver_objects import driver_controlpath_id
    from cyborg.objects.driver_objects import driver_deployable
    from cyborg.objects.driver_objects import driver_device

    deployables = [driver_deployable.DriverDeployable(
        name=d.name, num_accelerators=d.num_accelerators,
        driver_name=d.driver_name,
        attribute_list=[driver_attribute.DriverAttribute(
            key=a.key, value=a.value) for a in d.attribute_list],
        attach_handle_list=[driver_attach_handle.DriverAttachHandle(
            attach_type=h.attach_type, attach_info=h.attach_info,
            in_use=h.in_use) for h in d.attach_handle_list])
        for d in device.deployable_list]
    return driver_device.DriverDevice(
        vendor=device.vendor, model=device.model, type=device.type,
        std_board_info=device.std_board_info,
        vendor_board_info=device.vendor_board_info,
        stub=device.stub,
        controlpath_id=driver_controlpath_id.DriverControlPathID(
            cpid_type=device.controlpath_id.cpid_type,
            cpid_info=device.controlpath_id.cpid_info),
        deployable_list=deployables)


def ignored_cyborg_options(cyborg_conf):
    """Cyborg's own GPU options that are set, which this driver does not
    read (its configuration is libvirt-gpu's)."""
    group = getattr(cyborg_conf, 'gpu_devices', None)
    if group is None:
        return []
    found = []
    if group.enabled_vgpu_types:
        found.append('[gpu_devices]/enabled_vgpu_types')
    if group.filter_sriov_vfs:
        found.append('[gpu_devices]/filter_sriov_vfs')
    return found


def _build_class():
    from cyborg.accelerator.drivers import driver as cyborg_driver
    from cyborg.conf import CONF

    class LibvirtGPUDriver(cyborg_driver.GenericDriver):
        """Cyborg's ``GenericDriver`` over libvirt-gpu's discovery."""

        def __init__(self, config_file=None):
            self.config_file = config_file
            ignored = ignored_cyborg_options(CONF)
            if ignored:
                LOG.warning(
                    'libvirt_gpu_driver does not read %s: the GPUs and vGPU '
                    'types offered come from libvirt-gpu\'s configuration '
                    '([gpu]/enabled_vgpu_types, [vgpu_<type>]); remove '
                    'them from cyborg.conf', ', '.join(ignored))

        def discover(self):
            try:
                found = discover_records(CONF.host, self.config_file)
            except exception.LibvirtGpuError as e:
                # Raised, never an empty list: Cyborg would delete every
                # device and provider of the host.
                path, _ = conffile.config_path(self.config_file)
                LOG.error('libvirt_gpu_driver: nothing reported, Cyborg '
                          'keeps what it has: %s (libvirt-gpu '
                          'configuration: %s)', e, path)
                raise
            return [to_cyborg(d) for d in found]

        def update(self, control_path, image_path):
            raise NotImplementedError(
                'libvirt_gpu_driver: GPUs have no image to program')

        def get_stats(self):
            return {}

    LibvirtGPUDriver.__module__ = __name__
    LibvirtGPUDriver.__qualname__ = 'LibvirtGPUDriver'
    return LibvirtGPUDriver


def __getattr__(name):
    # PEP 562: stevedore's ``getattr(module, 'LibvirtGPUDriver')`` builds
    # the class, importing Cyborg only then.
    if name == 'LibvirtGPUDriver':
        cls = _build_class()
        globals()[name] = cls
        return cls
    raise AttributeError('module %r has no attribute %r' % (__name__, name))
