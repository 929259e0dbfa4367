"""Forwarded headers: trusted from exactly ``GATEWAY_PROXY_HOPS`` proxies, and no further.

Werkzeug's ProxyFix reads the last ``hops`` entries of X-Forwarded-For,
-Proto, -Host and -Port: the ones the trusted proxies added. Entries a client
wrote before them are ignored, and a header with fewer entries than ``hops``
is ignored whole, so the request keeps its socket's address and scheme. That
is safe when a proxy forgets a header, but silent: the audit trail would
name the proxy as every user's address. So the first such request in each
process is logged, saying what was used instead; later ones are not, so a
misconfigured proxy costs one line, not one per request.
"""

from __future__ import annotations

import logging
import threading
from typing import Final

from flask import Flask, current_app, request
from werkzeug.http import parse_list_header
from werkzeug.middleware.proxy_fix import ProxyFix

from gateway.settings import Settings, env_name
from gateway.web.https import allows_plain_http

log = logging.getLogger(__name__)

# The headers whose absence changes what a request is taken to be, and what
# it falls back to. X-Forwarded-Host and -Port fall back to the Host header,
# which every proxy passes on.
_FALLBACKS: Final = {
    "X-Forwarded-For": ("the socket address", "REMOTE_ADDR"),
    "X-Forwarded-Proto": ("the connection's scheme", "wsgi.url_scheme"),
}


def init_app(app: Flask, settings: Settings) -> None:
    """Trust the configured proxy hops' forwarded headers, and say when a request lacks them."""
    hops = settings.proxy_hops
    if not hops:
        return
    app.wsgi_app = ProxyFix(  # type: ignore[method-assign]
        app.wsgi_app, x_for=hops, x_proto=hops, x_host=hops, x_port=hops
    )
    app.before_request(ShortHeaders(hops))


def describe(settings: Settings) -> str:
    """What the gateway trusts of forwarded headers, as said when it starts."""
    hops = settings.proxy_hops
    if not hops:
        return (f"{env_name('proxy_hops')}=0: X-Forwarded-* headers are ignored; each "
                "request's address and scheme are its connection's own")
    entries = "entry" if hops == 1 else f"{hops} entries"
    return (f"{env_name('proxy_hops')}={hops}: trusting the last {entries} of "
            "X-Forwarded-For, -Proto, -Host and -Port, which the proxies in front add; "
            "a client's own entries before them are ignored")


class ShortHeaders:
    """A before-request hook: log, once per header and process, a request it cannot trust."""

    def __init__(self, hops: int) -> None:
        self.hops = hops
        self._unsaid = set(_FALLBACKS)
        self._lock = threading.Lock()

    def __call__(self) -> None:
        if not self._unsaid:
            return  # every warning given: nothing left to look at
        view = current_app.view_functions.get(request.endpoint or "")
        if allows_plain_http(view):
            return  # health probes come straight from a load balancer, not through the proxy
        for header in _FALLBACKS:
            value = request.headers.get(header)
            entries = parse_list_header(value) if value else []
            if len(entries) < self.hops and self._first(header):
                self._warn(header, len(entries))

    def _first(self, header: str) -> bool:
        # Two threads may find the same header short at once; one of them says so.
        with self._lock:
            first = header in self._unsaid
            self._unsaid.discard(header)
        return first

    def _warn(self, header: str, count: int) -> None:
        fallback, key = _FALLBACKS[header]
        # What the request held before ProxyFix, which keeps it aside.
        original = request.environ["werkzeug.proxy_fix.orig"]
        carried = "no " + header if count == 0 else \
            f"{count} {header} {'entry' if count == 1 else 'entries'}"
        log.warning("%s=%d but the request carried %s: using %s %s instead (said once per "
                    "process; is the proxy in front setting it?)",
                    env_name("proxy_hops"), self.hops, carried, fallback, original.get(key))
