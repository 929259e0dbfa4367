"""Rate limits (Flask-Limiter): API calls per token and per address, logins per account and address.

Counters live in the memory of one process (each gunicorn worker counts on
its own), or in Redis (GATEWAY_RATELIMIT_STORAGE_URL) when several processes
or instances share the load. A
client over its limit gets 429 with Retry-After, as problem+json, and the
refusal is counted for ``/metrics`` under the limit's scope.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from flask import Blueprint, Flask, Response, current_app, g, request
from flask_limiter import Limiter, RateLimitExceeded, RequestLimit

from gateway.errors import GatewayError
from gateway.metrics import counters
from gateway.settings import Settings
from gateway.tokens import keyed_digest
from gateway.web.errors import render_error

log = logging.getLogger(__name__)

EXTENSION = "gateway.limiter"
KEY_PREFIX = "gateway"
HITS_EXTENSION = "gateway.ratelimit_hits"


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
        # resumes when it is back.
        swallow_errors=True,
        key_prefix=KEY_PREFIX,
    )
    limiter.init_app(app)
    app.register_error_handler(RateLimitExceeded, _refused)
    app.extensions[EXTENSION] = limiter
    app.extensions[HITS_EXTENSION] = counters.rate_limit_hits()
    return limiter


def counts_per_process(settings: Settings) -> bool:
    """Whether each process keeps its own counters (the in-memory store)."""
    return urlsplit(settings.ratelimit_storage_url).scheme == "memory"


def counted(scope: str) -> Callable[[RequestLimit], None]:
    """A breach callback that counts the refusal under ``scope``.

    Flask-Limiter stops at the first limit a request breaches, so each
    refused request is counted once.
    """

    def count(breached: RequestLimit) -> None:
        current_app.extensions[HITS_EXTENSION].labels(scope).inc()

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


def limit_logins(app: Flask, blueprint: Blueprint, settings: Settings) -> None:
    """Count logins per account and per address; past the limit, refuse them all.

    Every attempt is counted before its password is checked: Flask-Limiter
    counts in its hook, which runs before the view, with one atomic increment
    per limit. Counting only failures, after their answer, would let guesses
    sent at once all pass a limit none of them had yet been counted against,
    the right one among them. A login that succeeds gives its count back
    (:func:`give_back_login`), so the limits hold failures only: users behind
    one shared address (an office, a campus) do not lock each other out by
    logging in. Once the limit is reached every attempt gets 429 until the
    window ends, the right password included: otherwise the limit would tell
    a guesser when it hit.
    """
    limiter: Limiter = app.extensions[EXTENSION]
    message = "Too many failed logins. Wait a few minutes, then try again."
    for key_func, scope in ((login_account_key, "login-account"),
                            (source_address, "login-ip")):
        limiter.limit(settings.ratelimit_login, key_func=key_func, scope=scope,
                      methods=["POST"], error_message=message,
                      exempt_when=_not_a_login, on_breach=counted(scope))(blueprint)


def give_back_login() -> None:
    """Take back the count of this request's login, which succeeded."""
    limiter: Limiter = current_app.extensions[EXTENSION]
    for spent in limiter.current_limits:
        try:
            # Only into the window that counted it: a window that has ended
            # reads as untouched, and giving back there would credit the next
            # one (a negative count) with an extra guess.
            window = limiter.limiter.get_window_stats(spent.limit, *spent.request_args)
            if window.remaining < spent.limit.amount:
                limiter.limiter.hit(spent.limit, *spent.request_args, cost=-1)
        except limiter.storage.base_exceptions:
            # As for the counting itself (swallow_errors): a storage outage
            # must not fail a login that went through.
            log.warning("could not give back a successful login's rate-limit count",
                        exc_info=True)


def _not_a_login() -> bool:
    # The limits sit on the identity blueprint; only its login form counts.
    return request.endpoint != "identity.login_submit"


def login_account_key() -> str:
    # Case-folded, as logins are: "Alice" and "alice" share one budget.
    return "account:" + request.form.get("username", "").strip().lower()[:64]


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
