"""One HTTPS request to the gateway, with timeouts and retries on connection errors.

Retries are for failures where the gateway may never have seen the request
(refused, reset, timed out). A request that changes something is retried
only when doing it twice is harmless: a create carries an ``Idempotency-Key``
(the same on every attempt, so the gateway answers a repeat with the first
answer), and revealing or revoking a credential ends the same however often
it is asked. Cancelling is retried only when the connection was never made.
Error answers (4xx, 5xx) are never retried here: they are answers.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

import requests
from urllib3.exceptions import NameResolutionError, NewConnectionError, ProtocolError

from gateway import __version__
from gateway.client.errors import GatewayUnavailable, problem_error

DEFAULT_CONNECT_TIMEOUT: Final = 5.0
DEFAULT_READ_TIMEOUT: Final = 30.0
USER_AGENT: Final = f"gateway-client/{__version__}"


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: Any


class Transport:
    """Sends requests to one gateway with one API token."""

    def __init__(self, base_url: str, api_token: str, *, verify: bool | str = True,
                 connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
                 read_timeout: float = DEFAULT_READ_TIMEOUT, retries: int = 2,
                 backoff: float = 0.25, session: requests.Session | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        parts = urlsplit(base_url)
        # The gateway refuses API calls over plain HTTP, but only after the
        # token has crossed the network in the clear; refuse before sending.
        if parts.scheme != "https" or not parts.netloc:
            raise ValueError(f"the gateway's URL must be https://host[:port], not {base_url!r}")
        if not api_token:
            raise ValueError("an API token is required (gateway clients create prints one)")
        self.base_url = base_url.rstrip("/")
        self._token = api_token
        self.verify = verify
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.retries = retries
        self.backoff = backoff
        self._session = session or requests.Session()
        # Proxies from the environment would see the bearer token; trust none by default.
        self._session.trust_env = session.trust_env if session is not None else False
        self._sleep = sleep

    def __repr__(self) -> str:
        return f"Transport({self.base_url!r}, api_token='***')"

    def close(self) -> None:
        self._session.close()

    def request(self, method: str, path: str, *, params: Mapping[str, Any] | None = None,
                body: Any = None, headers: Mapping[str, str] | None = None,
                extra_read_time: float = 0, retry_unless_sent: bool = False) -> Answer:
        """The answer to one call; :class:`ProblemError` for an error answer.

        ``retry_unless_sent``: retry only failures that happened before the
        request could reach the gateway (for calls that must not run twice).
        """
        all_headers = {
            "Authorization": f"Bearer {self._token}",
            "Accept": "application/json, application/problem+json",
            "User-Agent": USER_AGENT, **(headers or {}),
        }
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            all_headers["Content-Type"] = "application/json"
        query = {k: v for k, v in (params or {}).items() if v is not None}
        timeout = (self.connect_timeout, self.read_timeout + extra_read_time)
        attempt = 0
        while True:
            try:
                response = self._session.request(
                    method, self.base_url + path, params=query, data=data, headers=all_headers,
                    timeout=timeout, verify=self.verify, allow_redirects=False)
                break
            except requests.RequestException as error:
                retryable = _never_sent(error) or (
                    not retry_unless_sent and isinstance(error, _MAYBE_SENT))
                if not retryable or attempt >= self.retries:
                    raise GatewayUnavailable(self.base_url, _reason(error), attempts=attempt + 1,
                                             call=f"{method} {path}") from error
            # Exponential back-off with jitter, so many servers retrying at once spread out.
            self._sleep(self.backoff * (2 ** attempt) * (0.5 + random.random()))  # noqa: S311
            attempt += 1
        return _answer(response)


# Failures after which the gateway may or may not have processed the request.
_MAYBE_SENT: Final = (requests.ConnectionError, requests.Timeout)


def _never_sent(error: requests.RequestException) -> bool:
    if isinstance(error, requests.ConnectTimeout):
        return True
    cause: Any = error.args[0] if error.args else None
    return isinstance(getattr(cause, "reason", None), NewConnectionError)


def _reason(error: requests.RequestException) -> str:
    """Why no answer came, in words; the exception's own text can carry the full URL."""
    if isinstance(error, requests.ConnectTimeout):
        return "the connection timed out"
    if isinstance(error, requests.ReadTimeout):
        return "it sent no answer in time"
    if isinstance(error, requests.exceptions.SSLError):
        return "the TLS handshake failed (is its certificate trusted here?)"
    cause: Any = error.args[0] if error.args else None
    if isinstance(cause, ProtocolError):
        return "the connection closed before an answer came"
    reason = getattr(cause, "reason", None)
    if isinstance(reason, NameResolutionError):
        return "its host name could not be resolved"
    refused = getattr(reason, "__cause__", None)
    if isinstance(reason, NewConnectionError) and isinstance(refused, OSError) and \
            refused.strerror:
        return refused.strerror.lower()  # "connection refused", "network is unreachable"
    return f"the connection failed ({type(error).__name__})"


def _answer(response: requests.Response) -> Answer:
    try:
        body = response.json() if response.content else None
    except ValueError:
        body = None
    if response.status_code >= 400:
        if not isinstance(body, dict):
            body = {"title": response.reason or f"HTTP {response.status_code}",
                    "status": response.status_code}
        raise problem_error(response.status_code, body,
                            retry_after=_seconds(response.headers.get("Retry-After")))
    if 300 <= response.status_code < 400:
        # The API never redirects; following one could send the token elsewhere.
        raise problem_error(response.status_code, {
            "title": "Unexpected redirect",
            "detail": "the gateway's API does not redirect; check the base URL"})
    return Answer(response.status_code, body)


def _seconds(value: str | None) -> float | None:
    if value is None or not value.strip().isdigit():
        return None
    return float(value)
