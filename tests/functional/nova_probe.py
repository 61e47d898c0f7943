"""Run inside .venv-nova: OpenStack Nova's own code judges a host's
``[pci]`` configuration, in one process.

    .venv-nova/bin/python tests/functional/nova_probe.py REQUEST.json

REQUEST (JSON) names:

* ``conf_dir``: a ``nova.conf.d`` directory (read with ``--config-dir`` as
  nova-compute reads one) holding what ``libvirt-gpu nova-config`` printed;
  ``conf_file``: the rest of nova.conf (``[filter_scheduler]
  pci_in_placement``, ``[pci] report_in_placement``).
* ``steps``: which of the following to run, in this order:

  ``parse``: ``[pci] device_spec`` through ``nova.pci.whitelist.Whitelist``
  (``nova.pci.devspec.PciDeviceSpec``), ``[pci] alias`` through
  ``nova.pci.request.get_alias_from_config``.

  ``enumerate`` (``uri``): the host's PCI devices as Nova's libvirt driver
  lists them from the libvirtd at ``uri`` (or ``devices``: a list an
  earlier run printed, to spare libvirtd the second enumeration)
  (``LibvirtDriver._get_pci_passthrough_devices`` over
  ``nova.virt.libvirt.host.Host``), its ``live_migratable`` check
  (``_check_pci_whitelist``), then the PCI tracker
  (``nova.pci.manager.PciDevTracker``) fed with them, as the resource
  tracker does: the devices it keeps, their tags, the resource class the
  PCI-in-Placement translation gives each, the ``<hostdev>`` the driver
  writes for each (``_get_guest_pci_device``).

  ``placement`` (``placement``, ``hostname``, ``compute_uuid``): what the
  resource tracker's ``_update_to_placement`` does with them: the compute
  node's root provider (``get_provider_subtree_and_ensure_root``, with the
  ``COMPUTE_NODE`` and ``OWNER_NOVA`` traits it always adds),
  ``pci_placement_translator.update_provider_tree_for_pci``, then
  ``SchedulerReportClient.update_from_provider_tree`` against the real
  Placement.

  ``candidates`` (``placement``, ``flavors``: ``[[alias extra spec,
  group_policy or null], ...]``): the scheduler's allocation-candidate
  query for a flavor asking for the alias (``RequestSpec`` with the
  flavor's PCI requests, ``generate_request_groups_from_pci_requests``,
  the ``owner_nova_filter`` pre-filter as when every compute is new
  enough, ``resources_from_request_spec``) sent by
  ``SchedulerReportClient.get_allocation_candidates``.

  ``cyborg_mdevs`` (``uri``, ``arqs``: bound ARQs as Cyborg's API returns
  them, ``nova_conf_vgpus``: optional ``[devices]`` of Nova's own vGPU
  route): what spawn and hard reboot do with Cyborg's MDEV handles
  (``LibvirtDriver._get_supported_vgpu_types`` for Nova's own types, then
  ``_allocate_cyborg_mdevs``: look each mdev up through libvirt, create,
  define and autostart it when absent) and the ``<hostdev>`` that
  ``_guest_add_mdevs`` puts in the guest (``LibvirtConfigGuest`` XML of
  those devices).  Prints which were there before.

  ``nova_vgpus`` (``placement``, ``hostname``, ``compute_uuid``,
  ``pgpus``: ``{libvirt name: total}``): the compute node's root provider
  and Nova's own vGPU providers of those GPUs, as the libvirt driver makes
  them (``_ensure_pgpu_providers``: ``<host>_pci_...``, ``OWNER_NOVA``).

  ``extra_candidates`` (``placement``, ``extra_specs``: a list of flavor
  extra-spec dicts, ``device_profile_groups``: a list of Cyborg device
  profile group lists): the scheduler's allocation-candidate query for a
  flavor with those extra specs (and, for a device profile, its request
  groups as ``nova.accelerator.cyborg`` makes them), with the
  ``owner_nova_filter`` pre-filter.

Only what needs a running nova-compute is stood in for: the driver object
is made without its ``__init__`` (it holds the ``Host``), the PCI tracker
reads no database (a new compute node has no PCI records yet), the report
client gets a noauth2 adapter, the service-version check of the
``OWNER_NOVA`` pre-filter answers "every compute is new enough".

Prints one JSON line.  A configuration Nova refuses (a NovaException or a
schema error while parsing) is ``{"refused": {"step", "error",
"message"}}`` with exit status 2; any other failure is a traceback and
status 1.
"""

import json
import sys
from unittest import mock


class Refused(Exception):
    def __init__(self, step, exc):
        super().__init__(str(exc))
        self.doc = {'step': step, 'error': type(exc).__name__,
                    'message': str(exc)}


def configure(req):
    import nova.conf
    argv = []
    if req.get('conf_file'):
        argv += ['--config-file', req['conf_file']]
    if req.get('conf_dir'):
        argv += ['--config-dir', req['conf_dir']]
    nova.conf.CONF(argv, project='nova', default_config_files=[],
                   default_config_dirs=[])
    from nova import objects
    objects.register_all()
    return nova.conf.CONF


def parse(conf, out):
    import jsonschema
    from nova import exception
    from nova.pci import request as pci_request
    from nova.pci import whitelist
    try:
        specs = whitelist.Whitelist(conf.pci.device_spec).specs
    except exception.NovaException as e:
        raise Refused('device_spec', e)
    try:
        aliases = pci_request.get_alias_from_config()
    except (exception.NovaException, jsonschema.ValidationError) as e:
        raise Refused('alias', e)
    out['device_specs'] = [{'vendor_id': s.vendor_id,
                            'product_id': s.product_id,
                            'address': _plain(s.address),
                            'tags': dict(s.get_tags())} for s in specs]
    out['aliases'] = {name: {'numa_policy': policy, 'specs': specs}
                      for name, (policy, specs) in aliases.items()}


def _plain(address):
    """A WhitelistPciAddress as the fields Nova matches on."""
    if address is None:
        return None
    spec = address.pci_address_spec
    return {k: getattr(spec, k, None)
            for k in ('domain', 'bus', 'slot', 'func')} | {
        'physical_function': address.is_physical_function}


def driver_for(uri):
    from nova.virt.libvirt import driver as nova_driver
    from nova.virt.libvirt import host as nova_host
    drv = nova_driver.LibvirtDriver.__new__(nova_driver.LibvirtDriver)
    drv._host = nova_host.Host(uri)
    return drv


def tracker_for(conf, req):
    from nova import context as nova_context
    from nova import objects
    from nova.pci import manager as pci_manager
    ctx = nova_context.get_admin_context()
    node = objects.ComputeNode(
        id=1, uuid=req.get('compute_uuid'),
        hypervisor_hostname=req.get('hostname'), numa_topology=None)
    with mock.patch.object(objects.PciDeviceList, 'get_by_compute_node',
                           return_value=objects.PciDeviceList(objects=[])):
        return ctx, pci_manager.PciDevTracker(ctx, node)


def enumerate_devices(conf, req, out, state):
    from nova import exception
    from nova.compute import pci_placement_translator as translator
    from nova.virt.libvirt import driver as nova_driver
    drv = driver_for(req.get('uri'))
    if req.get('devices') is not None:
        devices_json = json.dumps(req['devices'])
    else:
        devices_json = (
            nova_driver.LibvirtDriver._get_pci_passthrough_devices(drv))
        out['devices'] = json.loads(devices_json)
        try:
            drv._check_pci_whitelist()
            out['live_migratable_check'] = 'ok'
        except exception.InvalidConfiguration as e:
            out['live_migratable_check'] = str(e)
    ctx, tracker = tracker_for(conf, req)
    tracker.update_devices_from_hypervisor_resources(devices_json)
    kept = []
    for dev in tracker.pci_devs:
        spec = tracker.dev_filter.get_devspec(dev)
        tags = dict(spec.get_tags()) if spec else {}
        kept.append({
            'address': dev.address, 'parent_addr': dev.parent_addr,
            'vendor_id': dev.vendor_id, 'product_id': dev.product_id,
            'dev_type': dev.dev_type, 'status': dev.status,
            'extra_info': dict(dev.extra_info),
            'resource_class': translator._get_rc_for_dev(dev, tags),
            'hostdev': drv._get_guest_pci_device(dev).to_xml()})
    out['tracked'] = kept
    state['ctx'], state['tracker'] = ctx, tracker


def report_client(req):
    from keystoneauth1 import adapter
    from keystoneauth1 import session
    from keystoneauth1 import token_endpoint
    from nova.scheduler.client import report
    sess = session.Session(auth=token_endpoint.Token(req['placement'],
                                                     'admin'))
    return report.SchedulerReportClient(adapter=adapter.Adapter(
        sess, service_type='placement', endpoint_override=req['placement'],
        raise_exc=False))


def placement(conf, req, out, state):
    import os_traits
    from nova.compute import pci_placement_translator as translator
    client = report_client(req)
    ctx, tracker = state['ctx'], state['tracker']
    name = req['hostname']
    tree = client.get_provider_subtree_and_ensure_root(
        ctx, req['compute_uuid'], name=name)
    allocs = client.get_allocations_for_provider_tree(ctx, name)
    tree.update_traits(name, set(tree.data(name).traits) | {
        os_traits.COMPUTE_NODE, os_traits.OWNER_NOVA})
    reshaped = translator.update_provider_tree_for_pci(
        tree, name, tracker, allocs, [])
    client.update_from_provider_tree(
        ctx, tree, allocations=allocs if reshaped else None)
    out['providers'] = []
    for uuid in tree.get_provider_uuids():
        data = tree.data(uuid)
        out['providers'].append({
            'uuid': data.uuid, 'name': data.name,
            'parent_uuid': data.parent_uuid,
            'traits': sorted(data.traits),
            'inventory': {rc: dict(inv) for rc, inv
                          in data.inventory.items()}})


def candidates(conf, req, out, state):
    from nova import context as nova_context
    from nova import objects
    from nova.pci import request as pci_request
    from nova.scheduler import request_filter
    from nova.scheduler import utils as scheduler_utils
    ctx = nova_context.get_admin_context()
    client = report_client(req)
    found = []
    for alias_spec, group_policy in req['flavors']:
        extra = {'pci_passthrough:alias': alias_spec}
        if group_policy:
            extra['group_policy'] = group_policy
        flavor = objects.Flavor(vcpus=0, memory_mb=0, root_gb=0,
                                ephemeral_gb=0, swap=0, extra_specs=extra)
        spec = objects.RequestSpec(
            flavor=flavor, image=None, is_bfv=False,
            pci_requests=pci_request.get_pci_requests_from_flavor(flavor),
            requested_resources=[], scheduler_hints={})
        spec.generate_request_groups_from_pci_requests()
        with mock.patch.object(request_filter, '_should_filter_by_owner',
                               return_value=True):
            request_filter.owner_nova_filter(ctx, spec)
        res_req = scheduler_utils.resources_from_request_spec(
            ctx, spec, None, enable_pinning_translate=False)
        alloc_reqs, summaries, _ = client.get_allocation_candidates(
            ctx, res_req)
        found.append({
            'query': res_req.to_querystring(),
            'candidates': [
                {rp: body['resources']
                 for rp, body in a['allocations'].items()}
                for a in (alloc_reqs or [])]})
    out['candidates'] = found


def _vgpu_driver(uri):
    """A driver with Nova's own vGPU configuration read, as its
    ``__init__`` reads it (``_get_supported_vgpu_types``, after the
    attributes it sets before, with their values)."""
    import collections
    import os_resource_classes as orc
    drv = driver_for(uri)
    drv.pgpu_type_mapping = collections.defaultdict(str)
    drv.pgpu_type_default = None
    drv.mdev_classes = set()
    drv.mdev_class_mapping = collections.defaultdict(lambda: orc.VGPU)
    drv.mdev_type_max_mapping = collections.defaultdict(str)
    drv.virtual_mdevs = set()
    drv.supported_vgpu_types = drv._get_supported_vgpu_types()
    return drv


def nova_vgpus(conf, req, out, state):
    import os_traits
    from nova import context as nova_context
    client = report_client(req)
    ctx = nova_context.get_admin_context()
    drv = _vgpu_driver('qemu:///system')
    name = req['hostname']
    tree = client.get_provider_subtree_and_ensure_root(
        ctx, req['compute_uuid'], name=name)
    tree.update_traits(name, set(tree.data(name).traits) | {
        os_traits.COMPUTE_NODE, os_traits.OWNER_NOVA})
    inventories = {dev: {'total': total, 'reserved': 0, 'min_unit': 1,
                         'max_unit': total, 'step_size': 1,
                         'allocation_ratio': 1.0}
                   for dev, total in req['pgpus'].items()}
    drv._ensure_pgpu_providers(inventories, tree, name)
    client.update_from_provider_tree(ctx, tree)
    out['providers'] = [{'uuid': tree.data(u).uuid, 'name': tree.data(u).name,
                         'traits': sorted(tree.data(u).traits)}
                        for u in tree.get_provider_uuids()]


def cyborg_mdevs(conf, req, out, state):
    import libvirt
    from nova.virt.libvirt import config as vconfig
    from nova.virt.libvirt import utils as libvirt_utils
    drv = _vgpu_driver(req['uri'])
    before = {}
    for arq in req['arqs']:
        ahi = arq['attach_handle_info']
        name = '{}_{}_{}_{}_{}'.format(
            libvirt_utils.mdev_uuid2name(arq['attach_handle_uuid']),
            ahi['domain'], ahi['bus'], ahi['device'], ahi['function'])
        try:
            drv._host.device_lookup_by_name(name)
            before[arq['attach_handle_uuid']] = True
        except libvirt.libvirtError:
            before[arq['attach_handle_uuid']] = False
    uuids = drv._allocate_cyborg_mdevs(req['arqs'])
    guest = vconfig.LibvirtConfigGuest()
    drv._guest_add_mdevs(guest, uuids)
    out['mdevs'] = uuids
    out['existed'] = before
    out['hostdevs'] = [d.to_xml() for d in guest.devices]


def extra_candidates(conf, req, out, state):
    from nova import context as nova_context
    from nova import objects
    from nova.accelerator import cyborg
    from nova.scheduler import request_filter
    from nova.scheduler import utils as scheduler_utils
    ctx = nova_context.get_admin_context()
    client = report_client(req)
    asked = [(extra, None) for extra in req.get('extra_specs', ())]
    asked += [({}, groups) for groups in req.get('device_profile_groups', ())]
    found = []
    for extra, groups in asked:
        flavor = objects.Flavor(vcpus=0, memory_mb=0, root_gb=0,
                                ephemeral_gb=0, swap=0, extra_specs=extra)
        spec = objects.RequestSpec(
            flavor=flavor, image=None, is_bfv=False, pci_requests=None,
            requested_resources=[], scheduler_hints={})
        if groups is not None:
            # the groups as Nova's Cyborg client makes them of the profile
            # Cyborg's API returns (no Keystone for the client: only its
            # translation runs)
            client_ = cyborg._CyborgClient.__new__(cyborg._CyborgClient)
            spec.requested_resources = client_.get_device_request_groups(
                groups, None)
        with mock.patch.object(request_filter, '_should_filter_by_owner',
                               return_value=True):
            request_filter.owner_nova_filter(ctx, spec)
        res_req = scheduler_utils.resources_from_request_spec(
            ctx, spec, None, enable_pinning_translate=False)
        alloc_reqs, _, _ = client.get_allocation_candidates(ctx, res_req)
        found.append({
            'query': res_req.to_querystring(),
            'candidates': [
                {rp: body['resources']
                 for rp, body in a['allocations'].items()}
                for a in (alloc_reqs or [])]})
    out['candidates'] = found


STEPS = {'enumerate': enumerate_devices, 'placement': placement,
         'candidates': candidates, 'cyborg_mdevs': cyborg_mdevs,
         'extra_candidates': extra_candidates, 'nova_vgpus': nova_vgpus}


def main(request_path):
    with open(request_path) as f:
        req = json.load(f)
    out = {}
    state = {}
    try:
        conf = configure(req)
        if 'parse' in req['steps']:
            parse(conf, out)
        for step in ('enumerate', 'placement', 'nova_vgpus', 'candidates',
                     'cyborg_mdevs', 'extra_candidates'):
            if step in req['steps']:
                STEPS[step](conf, req, out, state)
    except Refused as e:
        print(json.dumps({'refused': e.doc}))
        return 2
    print(json.dumps(out, sort_keys=True))
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1]))
