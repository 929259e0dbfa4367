"""Rate limits (Flask-Limiter): per API token and per source address on the API.

Counters live in memory for one instance, or in Redis
(GATEWAY_RATELIMIT_STORAGE_URL) when several instances share the load. A
client over its limit gets 429 with Retry-After, as problem+json, and the
refusal is counted for ``/metrics`` under the limit's scope.

The login form's limits use Flask-Limiter's decorators. The API's two limits
are checked by one hook of the API blueprint with the limiter's own
strategy and storage: Flask-Limiter works out per request which of its
limits apply, and on the API, where every route has the same two, that
resolution cost more than the rest of a read.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from flask import Blueprint, Flask, Response, current_app, g, request
from flask_limiter import Limiter, RequestLimit
from limits import RateLimitItem, parse_many
from limits.errors import StorageError
from limits.storage import MemoryStorage, Storage
from limits.strategies import FixedWindowRateLimiter

from gateway.errors import GatewayError
from gateway.metrics import counters
from gateway.settings import Settings
from gateway.tokens import keyed_digest

log = logging.getLogger(__name__)

EXTENSION = "gateway.limiter"
KEY_PREFIX = "gateway"
HITS_EXTENSION = "gateway.ratelimit_hits"
# The blueprint whose login form the limiter's decorators limit.
LOGIN_BLUEPRINT = "identity"
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
        self._counting = threading.Lock()
        sweeper = threading.Thread(target=_sweep, args=(weakref.ref(self),),
                                   name="ratelimit-sweeper", daemon=True)
        sweeper.start()

    def _MemoryStorage__schedule_expiry(self) -> None:
        """Nothing to schedule: the sweeper thread runs on its own."""

    def incr(self, key: str, expiry: float, amount: int = 1) -> int:
        """Count ``amount`` in the key's window, starting a new window once it expired.

        What the base class does, in one step under one lock: it runs twice
        on every API request, and the base class's version (an expiry check,
        a lock per key) cost more than the rest of the limit check.
        """
        now = time.time()
        with self._counting:
            if self.expirations.get(key, 0) <= now:
                self.storage.pop(key, None)
            count = self.storage[key] = self.storage[key] + amount
            if count == amount:
                self.expirations[key] = now + expiry
        return count


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


class LoginLimiter(Limiter):
    """Flask-Limiter, with its hooks on the identity blueprint rather than on every request.

    Its hooks work out which of its limits apply even when none does; its
    decorators sit on the login form only (the API checks its own limits,
    below), so every other request (API calls, pages, health checks, static
    files) skips that work.
    """

    def init_app(self, app: Flask) -> None:
        super().init_app(app)
        self._file_under_login(app.before_request_funcs)
        self._file_under_login(app.after_request_funcs)
        self._file_under_login(app.teardown_request_funcs)

    def _file_under_login(self, hooks: dict[str | None, list[Any]]) -> None:
        # Flask runs the hooks filed under a blueprint's name for its requests only.
        own = [hook for hook in hooks.get(None, []) if self._owns(hook)]
        hooks[None] = [hook for hook in hooks[None] if hook not in own]
        hooks.setdefault(LOGIN_BLUEPRINT, []).extend(own)

    def _owns(self, hook: object) -> bool:
        # Its bound methods, and partial(Limiter.__inject_headers, self).
        if isinstance(hook, partial):
            return bool(hook.args) and hook.args[0] is self
        return getattr(hook, "__self__", None) is self


def init_app(app: Flask, settings: Settings) -> Limiter:
    """Attach a limiter to the app; limits are added per blueprint with :func:`limit_api`."""
    limiter = LoginLimiter(
        key_func=source_address,
        storage_uri=storage_uri(settings),
        strategy="fixed-window",
        headers_enabled=True,
        # A storage outage must not take the API down with it; counting
        # resumes when it is back.
        swallow_errors=True,
        key_prefix=KEY_PREFIX,
        # Storage failures arrive as limits' StorageError, which the API's
        # check below lets through the same way.
        storage_options={"wrap_exceptions": True},
    )
    limiter.init_app(app)
    app.extensions[EXTENSION] = limiter
    app.extensions[HITS_EXTENSION] = counters.rate_limit_hits()
    return limiter


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


@dataclass(frozen=True, slots=True)
class ApiLimit:
    """One of the API's limits: its scope (the metrics label), its rates and whose budget."""

    scope: str
    rates: tuple[RateLimitItem, ...]
    key: Callable[[], str]
    whose: str


def limit_api(app: Flask, blueprint: Blueprint, settings: Settings) -> None:
    """Limit every route of ``blueprint`` per API token and per source address.

    Call it before the blueprint's authentication hook: a request with a
    wrong token counts against its address too.
    """
    limiter: Limiter = app.extensions[EXTENSION]
    limits = (
        ApiLimit("api-token", tuple(parse_many(settings.ratelimit_api)), token_key,
                 "this API token"),
        ApiLimit("api-ip", tuple(parse_many(settings.ratelimit_api_ip)), source_address,
                 "this address"),
    )

    strategy = limiter.limiter
    if not isinstance(strategy, FixedWindowRateLimiter):
        raise TypeError("the API's limits count fixed windows; configure the limiter so")

    def check() -> None:
        check_api_limits(strategy.storage, limits)

    blueprint.before_request(check)
    blueprint.after_request(_rate_limit_headers)


@dataclass(frozen=True, slots=True)
class _Budget:
    """One limit's window as this request left it: the rate, its counter's key, the count."""

    rate: RateLimitItem
    key: str
    count: int


def check_api_limits(storage: Storage, limits: tuple[ApiLimit, ...]) -> None:
    """Count the request against each limit; 429 at the first one it breaches.

    The windows are fixed, so a hit is one increment of the window's counter
    (what ``limits``' fixed-window strategy does), and the count it returns
    is also what the headers report: no second read of the storage.

    A storage outage lets the request through (as Flask-Limiter's
    ``swallow_errors`` does for the login form): the API stays up, and
    counting resumes when the storage is back.
    """
    shown: _Budget | None = None
    try:
        for limit in limits:
            identity = limit.key()
            for rate in limit.rates:
                key = rate.key_for(KEY_PREFIX, identity, limit.scope)
                budget = _Budget(rate, key, storage.incr(key, rate.get_expiry()))
                if budget.count > rate.amount:
                    g.rate_limit = budget
                    current_app.extensions[HITS_EXTENSION].labels(limit.scope).inc()
                    raise RateLimited(f"over the limit of {rate} for {limit.whose}; "
                                      "retry after the Retry-After seconds",
                                      _retry_after(storage, key))
                shown = shown or budget
    except StorageError:
        log.exception("the rate limit storage failed; the request goes on uncounted")
        return
    g.rate_limit = shown


def _retry_after(storage: Storage, key: str) -> int:
    return max(1, int(storage.get_expiry(key) - time.time()) + 1)


def _rate_limit_headers(response: Response) -> Response:
    # The first limit's budget (the token's), or the breached one's.
    budget: _Budget | None = g.get("rate_limit")
    if budget is None:
        return response
    storage: Storage = current_app.extensions[EXTENSION].limiter.storage
    try:
        reset_at = storage.get_expiry(budget.key)
    except StorageError:
        return response
    response.headers["X-RateLimit-Limit"] = str(budget.rate.amount)
    response.headers["X-RateLimit-Remaining"] = str(max(0, budget.rate.amount - budget.count))
    response.headers["X-RateLimit-Reset"] = str(int(reset_at))
    return response


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
