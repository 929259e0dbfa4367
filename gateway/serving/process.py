"""The process ``gateway serve`` becomes: a gunicorn master that imports little.

gunicorn's gevent worker patches the standard library as it starts, after
the fork. What the master imported before is in the worker unpatched, and
``requests``' urllib3 keeps references to the unpatched ``ssl``: an outbound
HTTPS call (an OAuth provider, Stripe, a key's live check) would then block
its worker, every held long-poll and request on it included. ``gateway
serve`` imports all of the gateway for its checks, so once they pass it
replaces itself (same process id, same signals) with this module, which
imports only what the master needs; each worker loads the app after gevent
has patched it. The master itself is not patched: its threads (the
``gateway worker`` supervisor) must not live on in the workers it forks, as
greenlets would.
"""

import ssl
import sys

from gevent.hub import Hub

from gateway import logs
from gateway.serving import server
from gateway.settings import load_settings

# gevent does the TLS handshake before gunicorn sees the connection, and
# prints the traceback of one that fails: a client that connects and leaves
# (a port probe, a load balancer's TCP check) or speaks plain HTTP. Such a
# client is not the server's error, as it was not under threaded workers.
Hub.NOT_ERROR = (*Hub.NOT_ERROR, ssl.SSLError, ConnectionError)


def main() -> None:
    """Serve with the options ``gateway serve`` settled on (its one argument)."""
    settings = load_settings()
    logs.configure(settings)
    server.run(settings, server.Options.from_json(sys.argv[1]))


if __name__ == "__main__":
    main()
