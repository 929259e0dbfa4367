"""Rate limits (Flask-Limiter): per API token and per source address on the API.

Counters live in memory for one instance, or in Redis
(GATEWAY_RATELIMIT_STORAGE_URL) when several instances share the load. A
client over its limit gets 429 with Retry-After, as problem+json, and the
refusal is counted for ``/metrics`` under the limit's scope.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from typing import Final

from flask import Blueprint, Flask, Response, current_app, g, request
from flask_limiter import Limiter, RequestLimit
from limits.storage import MemoryStorage

from gateway.metrics import counters
from gateway.settings import Settings
from gateway.tokens import keyed_digest

EXTENSION = "gateway.limiter"
HITS_EXTENSION = "gateway.ratelimit_hits"
SWEEP_SECONDS = 5.0


class SteadyMemoryStorage(MemoryStorage):
    """The ``limits`` memory storage, swept by one long-lived thread.

    The stock storage starts a new timer thread whenever its last one ended,
    which under load means a thread start every 10 ms, each blocking a
    request thread. Counters expire when read anyway, so the sweep only
    frees memory, and one sweep every few seconds is plenty.
    """

    STORAGE_SCHEME = ["gateway-memory"]  # noqa: RUF012  (the base class declares it so)

    def __init__(self, uri: str | None = None, wrap_exceptions: bool = False,
                 **options: str) -> None:
        super().__init__(uri, wrap_exceptions=wrap_exceptions, **options)
        sweeper = threading.Thread(target=_sweep, args=(weakref.ref(self),),
                                   name="ratelimit-sweeper", daemon=True)
        sweeper.start()

    def _MemoryStorage__schedule_expiry(self) -> None:
        """Nothing to schedule: the sweeper thread runs on its own."""


def _sweep(storage: weakref.ref[SteadyMemoryStorage]) -> None:
    while True:
        time.sleep(SWEEP_SECONDS)
        alive = storage()
        if alive is None:
            return  # the app and its limiter are gone
        alive._MemoryStorage__expire_events()  # type: ignore[attr-defined]
        del alive


def storage_uri(settings: Settings) -> str:
    """The limiter's storage; in-process counters use the steadier memory storage."""
    uri = settings.ratelimit_storage_url
    return "gateway-memory://" if uri.startswith("memory://") else uri


def init_app(app: Flask, settings: Settings) -> Limiter:
    """Attach a limiter to the app; limits are added per blueprint with :func:`limit_api`."""
    limiter = Limiter(
        key_func=source_address,
        storage_uri=storage_uri(settings),
        strategy="fixed-window",
        headers_enabled=True,
        # A storage outage must not take the API down with it; counting
        # resumes when it is back.
        swallow_errors=True,
        key_prefix="gateway",
    )
    limiter.init_app(app)
    limiter.request_filter(_carries_no_limit)
    app.extensions[EXTENSION] = limiter
    app.extensions[HITS_EXTENSION] = counters.rate_limit_hits()
    return limiter


_LIMITED_BLUEPRINTS: Final = ("api", "identity")


def _carries_no_limit() -> bool:
    # Limits sit on the API and on the login form only. Every other request
    # (pages, health checks, static files) skips the limiter's per-request
    # work of resolving which limits apply, which costs as much as a page.
    root = (request.blueprint or "").partition(".")[0]
    return root not in _LIMITED_BLUEPRINTS


def counted(scope: str) -> Callable[[RequestLimit], None]:
    """A breach callback that counts the refusal under ``scope``.

    Flask-Limiter stops at the first limit a request breaches, so each
    refused request is counted once.
    """

    def count(breached: RequestLimit) -> None:
        current_app.extensions[HITS_EXTENSION].labels(scope).inc()

    return count


def limit_api(app: Flask, blueprint: Blueprint, settings: Settings) -> None:
    """Limit every route of ``blueprint`` per API token and per source address."""
    limiter: Limiter = app.extensions[EXTENSION]
    limiter.limit(settings.ratelimit_api, key_func=token_key, scope="api-token",
                  on_breach=counted("api-token"))(blueprint)
    limiter.limit(settings.ratelimit_api_ip, key_func=source_address, scope="api-ip",
                  on_breach=counted("api-ip"))(blueprint)


def limit_logins(app: Flask, blueprint: Blueprint, settings: Settings) -> None:
    """Count failed logins per account and per address; past the limit, refuse them all.

    Only failures count (a login that fails answers 401), but once the limit
    is reached every attempt gets 429 until the window ends, the right
    password included: otherwise the limit would tell a guesser when it hit.
    """
    limiter: Limiter = app.extensions[EXTENSION]
    message = "Too many failed logins. Wait a few minutes, then try again."
    for key_func, scope in ((login_account_key, "login-account"),
                            (source_address, "login-ip")):
        limiter.limit(settings.ratelimit_login, key_func=key_func, scope=scope,
                      methods=["POST"], deduct_when=_failed_login, error_message=message,
                      exempt_when=_not_a_login, on_breach=counted(scope))(blueprint)


def _not_a_login() -> bool:
    # The limits sit on the identity blueprint; only its login form counts.
    return request.endpoint != "identity.login_submit"


def _failed_login(response: Response) -> bool:
    return response.status_code == 401


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
