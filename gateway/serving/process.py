"""The process ``gateway serve`` becomes: gevent's patches first, then gunicorn.

gunicorn's gevent worker patches the standard library as it starts, but by
then the master has imported what ``gateway serve`` checked with, and
``requests``' urllib3 keeps references to the unpatched ``ssl``: an outbound
HTTPS call (an OAuth provider, Stripe, a key's live check) would then block
its worker, every held long-poll and request on it included. So ``gateway
serve`` checks what it checks, then replaces itself (same process id, same
signals) with this module, which patches before anything else is imported,
as gevent asks. Workers forked from it inherit the patched modules.
"""

from gevent import monkey

monkey.patch_all()

import ssl  # noqa: E402
import sys  # noqa: E402

from gevent.hub import Hub  # noqa: E402

from gateway import logs  # noqa: E402
from gateway.serving import server  # noqa: E402
from gateway.settings import load_settings  # noqa: E402

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
