"""The commands that read the host: ``list``, ``types``, ``discover`` (the
Cyborg view), and ``simulate``, which writes a simulated one."""

from libvirt_gpu.devices import capacity as capacity_mod
from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.devices import pci_classes
from libvirt_gpu.util import records
from libvirt_gpu.cmd import output
from libvirt_gpu.cmd import simulate_live


def _whole_refusal(ctx, gpu):
    """Why ``gpu`` is not offered whole, by the rule Placement's tree is
    built with (``model.offered``), or None."""
    refusal = capacity_mod.pgpu_refusal(gpu)
    if refusal is None and gpu.vendor_id not in ctx.conf.gpu.pgpu_vendor_ids:
        refusal = ('its vendor %s is not in [gpu]/pgpu_vendor_ids'
                   % gpu.vendor_id)
    return refusal


def _capacities(gpu, setting, rooms):
    """``{TypeId: capacity}`` of every type enabled on ``gpu`` (what each
    type's Placement provider is told)."""
    from libvirt_gpu.openstack.placement import model
    return {one.type_id: model.vgpu_total(
        gpu, one, room=rooms.get((gpu.address, one.type_id)))
        for one in setting.types}


def _holders(ctx, gpus):
    """``{vGPU UUID: (domain name, domain UUID)}`` of the vGPUs of
    ``gpus`` (``''`` where unknown), by the exporter's rule
    (``guests.holders``): a lease's domain, else the domain that borrowed
    it, else the running domain using it, read through libvirt when the
    GPUs were (a listing of sysfs opens no libvirt).  What cannot be read
    is said in a note and left out."""
    uuids = [m.uuid for gpu in gpus for m in gpu.mdevs]
    if not uuids:
        return {}
    from libvirt_gpu.guests import holders as holders_mod
    leases, borrowed, domains = {}, {}, None
    try:
        with ctx.env.store.snapshot() as txn:
            leases = {lease.vgpu_uuid: lease for lease in txn.all()}
            borrowed = txn.borrowed()
    except exception.StateError as e:
        output.emit_note('the leases were not read, so the domains of our '
                         'vGPUs may be missing: %s' % e,
                         as_json=ctx.args.json)
    if ctx.result.source == 'libvirt':
        from libvirt_gpu.virt import host as host_mod
        try:
            with host_mod.Host(ctx.libvirt_uri(), read_only=True) as host:
                domains = holders_mod.read_domains(host)
        except exception.LibvirtError as e:
            output.emit_note('the running domains were not read, so the '
                             'domains of vGPUs without a lease are missing: '
                             '%s' % e, as_json=ctx.args.json)
    return {uuid: holders_mod.holder(uuid, leases, borrowed, domains)
            for uuid in uuids}


def _route(ctx, gpu):
    """The route of ``gpu`` (a VF: its physical GPU's)."""
    return ctx.env.routes.route_of(gpu.physfn or gpu.address)


def cmd_list(ctx):
    enabled = ctx.enabled
    gpus = ctx.result.gpus
    ctx.env.routes      # a GPU two routes claim: refused before any line
    ctx.say_source()
    rooms = ctx.env.vgpus.rooms(enabled)
    holders = _holders(ctx, gpus)
    if ctx.args.json:
        # A VF shows the setting of its physical GPU (it is used as a part
        # of it); its ``physfn`` names that GPU.
        documents = []
        type_memo = {}
        for gpu in gpus:
            setting = enabled.get(gpu.physfn or gpu.address)
            several = (setting is not None and setting.others
                       and not gpu.is_vf)
            documents.append(output.gpu_to_json(
                gpu, setting, not_assignable=(
                    _whole_refusal(ctx, gpu)
                    if setting is None and not gpu.is_vf else None),
                type_memo=type_memo, route=_route(ctx, gpu),
                holders=holders,
                room=(rooms.get((gpu.address, setting.type_id))
                      if setting is not None else None),
                capacities=(_capacities(gpu, setting, rooms)
                            if several else None)))
        output.emit_gpus_json(documents)
        return 0
    rows = []
    vgpu_rows = []
    notes = []
    for gpu in gpus:
        route = _route(ctx, gpu)
        for mdev in gpu.mdevs:
            name, dom = holders[mdev.uuid]
            vgpu_rows.append([mdev.uuid, mdev.type_id,
                              str(gpu.physfn or gpu.address),
                              str(gpu.address), route,
                              name or dom or None])
        if gpu.is_vf:
            continue          # counted on its physical GPU's row (VFS)
        setting = enabled.get(gpu.address)
        refusal = _whole_refusal(ctx, gpu) if setting is None else None
        if refusal:
            notes.append('%s: not offered whole: %s' % (gpu.address,
                                                        refusal))
        for member in gpu.iommu_members:
            if member.host_uses:
                notes.append(
                    '%s: IOMMU group %d also holds %s (%s, driver %s), '
                    'which the host uses' % (
                        gpu.address, gpu.iommu_group, member.address,
                        pci_classes.host_class_name(member.class_code),
                        member.driver))
        if setting is not None:
            for type_id in setting.type_ids:
                room = rooms.get((gpu.address, type_id))
                if room is not None:
                    notes.append(output.room_text(gpu.address, room))
            capacity = ','.join('%d' % n for n in _capacities(
                gpu, setting, rooms).values())
        else:
            capacity = '0' if refusal else '1'

        vfs = None
        if gpu.virtfns:
            busy = sum(1 for vf in gpu.vf_gpus if vf.used_type_ids)
            vfs = '%d (%d used)' % (len(gpu.virtfns), busy)
        functions = gpu.functions
        rows.append([str(gpu.address), '%s:%s' % (gpu.vendor_id,
                                                  gpu.product_id),
                     gpu.product_name, gpu.driver, gpu.numa_node,
                     gpu.local_cpulist, gpu.iommu_group,
                     ','.join(str(m.address) for m in gpu.iommu_members
                              if m.address != gpu.address) or None,
                     'vgpu' if setting is not None else 'pgpu', route,
                     ','.join(setting.type_ids) if setting is not None
                     else None,
                     capacity, len(gpu.offered_types()),
                     sum(len(f.used_type_ids) for f in functions), vfs])
    output.emit_text(output.table(
        ['ADDRESS', 'ID', 'PRODUCT', 'DRIVER', 'NUMA', 'CPUS', 'IOMMU',
         'GROUP MEMBERS', 'MODE', 'ROUTE', 'ENABLED TYPE', 'CAPACITY',
         'TYPES', 'VGPUS', 'VFS'], rows))
    for note in notes:
        output.emit_text(note)
    if vgpu_rows:
        # every vGPU: its route (its GPU's) and the domain holding it
        output.emit_text('')
        output.emit_text(output.table(
            ['VGPU', 'TYPE', 'GPU', 'PARENT', 'ROUTE', 'DOMAIN'],
            sorted(vgpu_rows, key=lambda r: (r[2], r[3], r[0]))))
    if not gpus:
        output.emit_text('no GPU (PCI class 0x03xxxx) found')
    return 0


def _gpu_types(ctx, gpu):
    """The types to show for ``gpu``: a VF's own; for a physical GPU every
    type of it and its VFs, ``available_instances`` being what the whole
    GPU can still take (not one VF's 0 or 1; on a MIG or mixed-size GPU
    the driver's room, ``Vgpus.room``)."""
    if gpu.is_vf or not gpu.vf_gpus:
        return gpu.vgpu_types if gpu.is_vf else gpu.offered_types()

    from libvirt_gpu import objects
    from libvirt_gpu.openstack.placement import model
    shown = []
    for mtype in gpu.offered_types():
        used = sum(f.used_type_ids.count(mtype.id) for f in gpu.functions)
        total = model.vgpu_total(gpu, objects.EnabledType(mtype.id),
                                 room=ctx.env.vgpus.room(gpu.address,
                                                         mtype.id))
        shown.append(records.replace(
            mtype, available_instances=max(0, total - used)))
    return tuple(shown)


def cmd_types(ctx):
    if ctx.args.address:
        gpus = [ctx.result.gpu(objects.PciAddress.parse(ctx.args.address))]
    else:
        gpus = [g for g in ctx.result.gpus
                if not g.is_vf and g.offered_types()]
    ctx.say_source()
    if ctx.args.json:
        output.emit_json({str(g.address): [output.type_to_json(t)
                                           for t in _gpu_types(ctx, g)]
                          for g in gpus})
        return 0
    rows = []
    for gpu in gpus:
        for t in _gpu_types(ctx, gpu):
            rows.append([str(gpu.address), t.id, t.name, t.device_api,
                         t.available_instances, t.description])
    output.emit_text(output.table(['GPU', 'TYPE', 'NAME', 'API', 'AVAILABLE',
                                   'DESCRIPTION'], rows))
    if not rows:
        output.emit_text('no vGPU types offered (is the GPU bound to a '
                         'vGPU-capable driver such as nvidia? are its SR-IOV '
                         'VFs enabled?)')
    return 0


def cmd_discover(ctx):
    from libvirt_gpu.devices import routes
    from libvirt_gpu.openstack import cyborg_objects
    devices, withheld = cyborg_objects.host_devices(
        ctx.hostname, ctx.result.gpus, ctx.enabled, ctx.conf.gpu,
        carved=ctx.env.carved.gpus, cyborg=ctx.env.routes.of(routes.CYBORG),
        routes=ctx.env.routes.foreign())
    ctx.say_source()
    if ctx.args.json:
        output.emit_json(output.cyborg_devices_to_json(devices))
    else:
        output.emit_text(output.cyborg_devices_text(devices))
    for address, why in withheld.items():
        output.emit_note('%s: nothing offered to Cyborg: %s' % (address, why),
                         as_json=ctx.args.json)
    return 0


def cmd_simulate(ctx):
    from libvirt_gpu import simulator
    if ctx.args.list_profiles:
        output.emit_text('\n'.join(simulator.list_profiles()))
        return 0
    if not ctx.args.profile or not ctx.args.dir:
        raise exception.InvalidInput(
            reason='simulate needs PROFILE and DIR (or --list)')
    if ctx.args.live:
        return simulate_live.run_live(
            ctx.args.profile, ctx.args.dir,
            busy_remove=ctx.args.busy_remove,
            uevents=not ctx.args.no_uevents,
            control_stdio=ctx.args.control_stdio, workdir=ctx.args.workdir,
            probe_delay=ctx.args.probe_delay)
    profile = simulator.load_profile(ctx.args.profile)
    try:
        node_xml = simulator.write_host(profile, ctx.args.dir)
    except OSError as e:
        raise exception.SimulatorError(
            reason='cannot write the simulated host to %s: %s; name a '
                   'directory you may write to' % (ctx.args.dir,
                                                   e.strerror or e))
    if ctx.args.json:
        output.emit_json({'profile': profile.name,
                          'sysfs_root': ctx.args.dir, 'node_xml': node_xml,
                          'test_uri': 'test://%s' % node_xml})
    else:
        output.emit_text(
            'wrote simulated host %r to %s\n'
            '  sysfs:  libvirt-gpu --sysfs-root %s list\n'
            '  libvirt: libvirt-gpu -c test://%s list'
            % (profile.name, ctx.args.dir, ctx.args.dir, node_xml))
    return 0


# --- parsers -----------------------------------------------------------------
# The commands that only read option values take them from the settings
# snapshot when it is current (``Context``).

def _list_parser(sub, add):
    add('list', cmd_list, 'list GPUs: address, ids, driver, NUMA node, '
        'IOMMU group, pGPU/vGPU mode, capacity').set_defaults(snapshot=True)


def _types_parser(sub, add):
    p = add('types', cmd_types, 'list the vGPU (mdev) types GPUs offer')
    p.set_defaults(snapshot=True)
    p.add_argument('address', nargs='?', metavar='ADDRESS',
                   help='only this GPU (PCI address, e.g. 0000:af:00.0)')


def _discover_parser(sub, add):
    add('discover', cmd_discover, 'the Cyborg view: the driver objects '
        'Cyborg\'s agent gets from libvirt_gpu_driver').set_defaults(
            snapshot=True)


def _simulate_parser(sub, add):
    p = add('simulate', cmd_simulate, 'write a simulated host: a sysfs-shaped '
            'tree in DIR and the libvirt test-driver XML DIR/node.xml')
    p.add_argument('profile', nargs='?', metavar='PROFILE',
                   help='bundled profile name (see --list) or a JSON file')
    p.add_argument('dir', nargs='?', metavar='DIR',
                   help='directory that stands in for /sys')
    p.add_argument('--list', dest='list_profiles', action='store_true',
                   help='list the bundled profiles')
    simulate_live.add_live_arguments(p.add_argument_group(
        'live tree', 'With --live, DIR is a mount point: a FUSE filesystem '
        'answers writes the way the kernel does (create/remove of mdevs '
        'with its error numbers, udev events) until SIGINT/SIGTERM. Needs '
        'root and /dev/fuse. Bind it over /sys parts in a private mount '
        'namespace to show it to libvirtd or mdevctl.'))
    p.add_argument('--live', action='store_true',
                   help='serve a live tree at DIR instead of writing files')


PARSERS = {'list': _list_parser, 'types': _types_parser,
           'discover': _discover_parser, 'simulate': _simulate_parser}
