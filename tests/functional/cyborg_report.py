"""Run inside .venv-cyborg: one report of Cyborg's agent, in one process.

    .venv-cyborg/bin/python tests/functional/cyborg_report.py CYBORG_CONF

Cyborg's own ResourceTracker loads the drivers of ``[agent]
enabled_drivers`` through stevedore and calls their ``discover()``, then
hands the objects to the real ``ConductorManager.report_data`` (created in
this process: with ``transport_url = fake:/`` no RPC leaves it), which
writes Cyborg's database and Placement.  Prints one JSON line: the classes
of the drivers loaded (``drivers``) and the objects they discovered, as the
plain fields of Cyborg's objects (``objects``).  An error is an exit status
other than 0.
"""

import json
import sys


def main(conf_file):
    from cyborg.common import service
    service.prepare_service([sys.argv[0], '--config-file', conf_file])
    from cyborg.agent.resource_tracker import ResourceTracker
    from cyborg.conductor.manager import ConductorManager
    from cyborg.conf import CONF
    from cyborg import context

    conductor = ConductorManager('cyborg-conductor', CONF.host)
    tracker = ResourceTracker(CONF.agent.resource_provider_name, conductor)
    reported = []
    report_data = conductor.report_data

    def keep(ctx, host, driver_devices):
        reported.extend(plain(d) for d in driver_devices)
        return report_data(ctx, host, driver_devices)
    conductor.report_data = keep
    tracker.update_usage(context.get_admin_context())
    print(json.dumps({'drivers': ['%s.%s' % (type(d).__module__,
                                             type(d).__name__)
                                  for d in tracker.acc_drivers],
                      'objects': reported}))
    return 0


def plain(obj):
    """A Cyborg object as its fields, nested (lists of objects as lists)."""
    if isinstance(obj, list):
        return [plain(o) for o in obj]
    if hasattr(obj, 'obj_fields'):
        return {k: plain(getattr(obj, k)) for k in obj.obj_fields
                if obj.obj_attr_is_set(k)}
    return obj


if __name__ == '__main__':
    sys.exit(main(sys.argv[1]))
