"""Presentation of records for the CLI: JSON documents and text tables."""

import dataclasses
import json


def gpu_to_json(gpu, enabled=None):
    """One entry of ``libvirt-gpu list --json``."""
    return {
        'address': str(gpu.address),
        'vendor_id': gpu.vendor_id,
        'product_id': gpu.product_id,
        'vendor_name': gpu.vendor_name,
        'product_name': gpu.product_name,
        'class': gpu.class_code,
        'driver': gpu.driver,
        'numa_node': gpu.numa_node,          # None: unknown (sysfs -1)
        'local_cpulist': gpu.local_cpulist,
        'iommu_group': gpu.iommu_group,
        'iommu_members': [member_to_json(m) for m in gpu.iommu_members],
        'nvml': nvml_to_json(gpu.nvml),
        'mode': 'vgpu' if enabled is not None else 'pgpu',
        'enabled_type': enabled.type_id if enabled is not None else None,
        'physfn': str(gpu.physfn) if gpu.physfn else None,
        'virtfns': [str(a) for a in gpu.virtfns],
        'mdev_types': [type_to_json(t) for t in gpu.mdev_types],
        'mdevs': [{'uuid': m.uuid, 'type': m.type_id} for m in gpu.mdevs],
    }


def member_to_json(member):
    """One function of a GPU's IOMMU group."""
    return {
        'address': str(member.address),
        'vendor_id': member.vendor_id,
        'product_id': member.product_id,
        'class': member.class_code,
        'driver': member.driver,
        'companion': member.companion,
        'host_uses': member.host_uses,
    }


def nvml_to_json(info):
    """What NVML said about a GPU, or None when it was not asked or had
    nothing to say."""
    if info is None:
        return None
    return {
        'name': info.name,
        'memory_total_mib': info.memory_total_mib,
        'virtualization_mode': info.virtualization_mode,
        'mig_enabled': info.mig_enabled,
        'vgpu_types': [dataclasses.asdict(t) for t in info.vgpu_types],
    }


def type_to_json(mdev_type):
    return {
        'id': mdev_type.id,
        'name': mdev_type.name,
        'description': mdev_type.description,
        'device_api': mdev_type.device_api,
        'available_instances': mdev_type.available_instances,
    }


def dumps(document):
    return json.dumps(document, indent=2, sort_keys=True)


def table(headers, rows):
    """Left-aligned columns, a rule under the header; '-' for None."""
    rows = [['-' if c is None else str(c) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row)]
    fmt = '  '.join('%%-%ds' % w for w in widths)
    lines = [fmt % tuple(headers), fmt % tuple('-' * w for w in widths)]
    lines += [fmt % tuple(row) for row in rows]
    return '\n'.join(line.rstrip() for line in lines)


def provider_tree_text(provider_tree):
    """The tree drawn with its inventories and traits."""
    root = provider_tree.root
    lines = ['%s  (%s)' % (root.name, root.uuid)]
    children = provider_tree.children
    for i, child in enumerate(children):
        last = i == len(children) - 1
        branch, pad = ('└── ', '    ') if last else ('├── ', '│   ')
        lines.append('%s%s  (%s)' % (branch, child.name, child.uuid))
        for inv in child.inventories:
            lines.append('%s    inventory %s total=%d reserved=%d '
                         'max_unit=%d' % (pad, inv.resource_class, inv.total,
                                          inv.reserved,
                                          inv.to_api()['max_unit']))
        lines.append('%s    traits    %s' % (pad, ', '.join(
            sorted(child.traits))))
    if not children:
        lines.append('(no GPU providers)')
    return '\n'.join(lines)


def sync_report_to_json(report):
    """``libvirt-gpu placement sync --json``."""
    return {
        'host': report.host,
        'dry_run': report.dry_run,
        'changed': report.changed,
        'nested': report.nested,
        'root_uuid': report.root_uuid,
        'results': [dataclasses.asdict(r) for r in report.results],
        'requests': [dataclasses.asdict(r) for r in report.requests],
        'requests_sent': report.stats.total,
        'writes_sent': report.stats.writes,
        'duration_s': round(report.duration_s, 3),
    }
