"""Run inside .venv-cyborg: cyborg-api for the functional tests.

    .venv-cyborg/bin/python tests/functional/cyborg_api.py \\
        --config-file cyborg.conf --log-file api.log

Serves ``cyborg.api.wsgi_app.init_application()`` (the WSGI entry point
operators run under a web server) with the standard library's wsgiref on
``[api]/host_ip`` and ``[api]/port``: Cyborg 17's ``cyborg-api`` console
script dies on oslo.service 4.x ("The oslo.service.wsgi.Server class is
deprecated and cannot be used with the threading backend").  The paste
pipeline is the one ``[api]/api_paste_config`` names (the tests' has no
keystonemiddleware: the request's X-Roles/X-Service-Roles headers are the
caller's identity).  Prints ``serving <url>`` once it listens.
"""

import sys
from socketserver import ThreadingMixIn
from wsgiref import simple_server

from cyborg.api import wsgi_app
from oslo_config import cfg


class _Server(ThreadingMixIn, simple_server.WSGIServer):
    daemon_threads = True


class _Quiet(simple_server.WSGIRequestHandler):
    def log_message(self, *args):
        pass


def main():
    app = wsgi_app.init_application()       # parses sys.argv
    host, port = cfg.CONF.api.host_ip, cfg.CONF.api.port
    server = simple_server.make_server(host, port, app, _Server, _Quiet)
    print('serving http://%s:%d' % (host, port), flush=True)
    server.serve_forever()


if __name__ == '__main__':
    sys.exit(main())
