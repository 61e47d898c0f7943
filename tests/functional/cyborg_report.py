"""Run inside .venv-cyborg: one report of Cyborg's agent, in one process.

    .venv-cyborg/bin/python tests/functional/cyborg_report.py CYBORG_CONF

Cyborg's own ResourceTracker loads the drivers of ``[agent]
enabled_drivers`` through stevedore and calls their ``discover()``, then
hands the objects to the real ``ConductorManager.report_data`` (created in
this process: with ``transport_url = fake:/`` no RPC leaves it), which
writes Cyborg's database and Placement.  Prints one JSON line: the classes
of the drivers loaded.  An error is an exit status other than 0.
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
    tracker.update_usage(context.get_admin_context())
    print(json.dumps({'drivers': ['%s.%s' % (type(d).__module__,
                                             type(d).__name__)
                                  for d in tracker.acc_drivers]}))
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1]))
