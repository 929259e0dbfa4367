"""Rate limits (Flask-Limiter): API calls per token and per address, the portal's pages
for visitors not signed in per address.

Counters live in the memory of one process (each gunicorn worker counts on
its own, so a limit allows up to as many times its amount as there are
workers), or in Redis (GATEWAY_RATELIMIT_STORAGE_URL), exact across every
worker and instance that shares it. A client over its limit gets 429 with
Retry-After, as problem+json, and the refusal is counted for ``/metrics``
under the limit's scope.

When the storage cannot be reached the limits fail open, so that an outage
of Redis does not take the API and the portal down with it; the process says
so once per outage at error level and counts each request that went
uncounted. The login lockout is not here: it counts in the database
(gateway.identity.lockout), shared by every worker with nothing else to run.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit

from flask import Blueprint, Flask, Response, current_app, g, has_request_context, request
from flask_limiter import Limiter, RateLimitExceeded, RequestLimit

from gateway.errors import GatewayError
from gateway.metrics import counters
from gateway.settings import Settings
from gateway.tokens import keyed_digest
from gateway.web.errors import render_error

if TYPE_CHECKING:
    from prometheus_client import Counter

log = logging.getLogger(__name__)

PORTAL_SCOPE: Final = "portal-ip"

EXTENSION = "gateway.limiter"
KEY_PREFIX = "gateway"
STORAGE_WATCH_EXTENSION = "gateway.ratelimit_storage"
# Flask-Limiter's logger, on which it reports a count it could not make.
LIBRARY_LOGGER: Final = "flask-limiter"


def init_app(app: Flask, settings: Settings) -> Limiter:
    """Attach a limiter to the app; limits are added per blueprint with :func:`limit_api`."""
    limiter = Limiter(
        key_func=source_address,
        storage_uri=settings.ratelimit_storage_url,
        strategy="fixed-window",
        # Flask-Limiter's own headers would put a Retry-After on every
        # response, and raise a 503's to the window's end: the API adds the
        # X-RateLimit-* headers itself (_budget_headers), and Retry-After
        # goes on refusals only.
        headers_enabled=False,
        # A storage outage must not take the API down with it; counting
        # resumes when it is back. StorageWatch makes the outage heard.
        swallow_errors=True,
        key_prefix=KEY_PREFIX,
    )
    limiter.init_app(app)
    app.register_error_handler(RateLimitExceeded, _refused)
    app.extensions[EXTENSION] = limiter
    app.extensions[STORAGE_WATCH_EXTENSION] = StorageWatch(
        counters.of(app).rate_limit_storage_errors)
    app.after_request(_note_storage_back)
    library_logger = logging.getLogger(LIBRARY_LOGGER)
    if not any(isinstance(f, _UncountedRequests) for f in library_logger.filters):
        library_logger.addFilter(_UncountedRequests())
    return limiter


class StorageWatch:
    """Whether this process's limits are being counted; says so when that changes.

    One error line when the storage is first found unreachable and one line
    when counting works again, not a traceback per request: during an outage
    every request fails to count, and a log that repeats itself thousands of
    times hides the one line that matters.
    """

    def __init__(self, uncounted: Counter) -> None:
        self._uncounted = uncounted
        self._lock = threading.Lock()
        self._down = False

    def unreachable(self, error: BaseException) -> None:
        """A request went uncounted: count it, and say so if the outage is new."""
        self._uncounted.inc()
        with self._lock:
            new, self._down = not self._down, True
        if new:
            log.error("rate-limit storage unreachable (%s: %s): rate limits are not enforced "
                      "until it is back",
                      type(error).__name__, str(error)[:200])

    def reachable(self) -> None:
        """A request was counted: the storage is back, if it was away."""
        if not self._down:  # read without the lock: the common case stays cheap
            return
        with self._lock:
            back, self._down = self._down, False
        if back:
            log.warning("rate-limit storage reachable again: rate limits are enforced")


class _UncountedRequests(logging.Filter):
    """Turns Flask-Limiter's traceback per uncounted request into :class:`StorageWatch`'s news.

    Flask-Limiter swallows a storage error (``swallow_errors``) and logs it
    with its traceback, once per request; that is the only word it gives.
    Errors of any other kind pass through as they are.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if error is None or not has_request_context():
            return True
        limiter: Limiter | None = current_app.extensions.get(EXTENSION)
        if limiter is None or not isinstance(error, limiter.storage.base_exceptions):
            return True
        g.ratelimit_uncounted = True
        current_app.extensions[STORAGE_WATCH_EXTENSION].unreachable(error)
        return False


def _note_storage_back(response: Response) -> Response:
    limiter: Limiter = current_app.extensions[EXTENSION]
    if limiter.current_limits and not g.get("ratelimit_uncounted", False):
        current_app.extensions[STORAGE_WATCH_EXTENSION].reachable()
    return response


def counts_per_process(settings: Settings) -> bool:
    """Whether each process keeps its own counters (the in-memory store)."""
    return urlsplit(settings.ratelimit_storage_url).scheme == "memory"


def count_refusal(scope: str) -> None:
    """Count a request refused by the limit of ``scope``, for ``/metrics``."""
    counters.of(current_app).rate_limit_hits.labels(scope).inc()


def counted(scope: str) -> Callable[[RequestLimit], None]:
    """A breach callback that counts the refusal under ``scope``.

    Flask-Limiter stops at the first limit a request breaches, so each
    refused request is counted once.
    """

    def count(breached: RequestLimit) -> None:
        count_refusal(scope)

    return count


class RateLimited(GatewayError):
    status = 429
    code = "too-many-requests"
    title = "Too many requests"

    def __init__(self, detail: str, retry_after: int) -> None:
        super().__init__(detail)
        self.retry_after = retry_after

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}


def _refused(error: RateLimitExceeded) -> Response:
    # The same answer as any other refusal of the gateway's, problem+json
    # under /api/, rather than werkzeug's generic 429.
    limiter: Limiter = current_app.extensions[EXTENSION]
    breached = limiter.current_limit
    # As Flask-Limiter words it, at least a second.
    retry_after = max(1, int(breached.reset_at - time.time())) if breached else 1
    return render_error(RateLimited(error.description or "Too many requests", retry_after))


def limit_api(app: Flask, blueprint: Blueprint, settings: Settings) -> None:
    """Limit every route of ``blueprint`` per API token and per source address.

    The limits are shared: one budget for all of the API's routes, not one
    per route. Flask-Limiter checks them in its app-wide hook, which Flask
    runs before the blueprint's own, authentication included: a request
    with a wrong token counts against its address too.
    """
    limiter: Limiter = app.extensions[EXTENSION]
    for rate, key_func, scope, whose in (
            (settings.ratelimit_api, token_key, "api-token", "this API token"),
            (settings.ratelimit_api_ip, source_address, "api-ip", "this address")):
        limiter.shared_limit(
            rate, scope, key_func=key_func, on_breach=counted(scope),
            error_message=f"over the limit of {rate} for {whose}; "
                          "retry after the Retry-After seconds",
        )(blueprint)
    blueprint.after_request(_budget_headers)


def _budget_headers(response: Response) -> Response:
    """The limit that applied to this request, what is left of it and when it resets."""
    limiter: Limiter = current_app.extensions[EXTENSION]
    current = limiter.current_limit
    if current is not None:
        response.headers["X-RateLimit-Limit"] = str(current.limit.amount)
        response.headers["X-RateLimit-Remaining"] = str(current.remaining)
        response.headers["X-RateLimit-Reset"] = str(current.reset_at)
    return response


def limit_portal(app: Flask, blueprints: Iterable[Blueprint], settings: Settings) -> None:
    """One budget per source address for the portal routes anyone may call unsigned in.

    The login pages and the providers' returns (``/login``, ``/login/callback``,
    ``/logout``, every path of the OAuth blueprint, the OAuth callback among
    them whatever its URL) answer visitors with no session; without a limit
    one address could make the gateway do their work (a database read, a
    provider call) as fast as it can send. The limit is set per blueprint,
    not per path, so a route added to one is covered too. Health probes,
    ``/metrics`` and Stripe's signed webhook are not in these blueprints.
    """
    limiter: Limiter = app.extensions[EXTENSION]
    rate = settings.ratelimit_portal
    for blueprint in blueprints:
        limiter.shared_limit(
            rate, PORTAL_SCOPE, key_func=source_address, on_breach=counted(PORTAL_SCOPE),
            error_message="Too many requests from your address. Wait a minute, then "
                          "try again.",
        )(blueprint)


def source_address() -> str:
    """The caller's address, as the trusted proxy hops report it."""
    return request.remote_addr or "unknown"


def bearer_token() -> str | None:
    """The bearer token of the request, if it carries one."""
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def token_digest() -> str | None:
    """The keyed digest of the request's bearer token, computed once per request."""
    if "token_digest" not in g:
        token = bearer_token()
        settings: Settings = current_app.extensions["gateway.settings"]
        g.token_digest = keyed_digest(settings.token_pepper, token) if token else None
    digest: str | None = g.token_digest
    return digest


def token_key() -> str:
    # Keyed by digest, never by the token: the counters' storage (Redis)
    # must not hold usable tokens.
    digest = token_digest()
    return f"token:{digest}" if digest else f"anonymous:{source_address()}"
