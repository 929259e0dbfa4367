"""What the gateway client raises: problem details, kept whole.

Every error answer of the gateway's API is an RFC 9457 problem document
(``application/problem+json``) whose ``type`` is ``urn:gateway:problem:<code>``.
:class:`ProblemError` carries all of it, so a caller can branch on ``code``
or ``status`` and quote ``request_id`` to the gateway's operator.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

PROBLEM_PREFIX: Final = "urn:gateway:problem:"


class GatewayClientError(Exception):
    """Anything the gateway client raises."""

    def describe(self) -> str:
        """What went wrong, in words to pass on to a person (an MCP tool's error text)."""
        return str(self)


class GatewayUnavailable(GatewayClientError):
    """No answer from the gateway: connection refused or reset, TLS failure, timeout.

    Raised once the retries are spent. A create retried with the same
    ``Idempotency-Key`` may still have happened on the gateway; creating again
    with that key is safe and returns the same elicitation. ``url`` is the
    gateway's base URL, ``reason`` why no answer came ("connection refused").
    """

    def __init__(self, url: str, reason: str, *, attempts: int = 1, call: str = "") -> None:
        self.url = url
        self.reason = reason
        self.attempts = attempts
        what = f"{call}: " if call else ""
        super().__init__(f"{what}no answer from {url} after {attempts} attempt(s): {reason}")

    def describe(self) -> str:
        return f"The gateway at {self.url} did not answer: {self.reason}."


class ProblemError(GatewayClientError):
    """The gateway answered with an error; the problem document's fields as attributes."""

    def __init__(self, status: int, problem: Mapping[str, Any], *,
                 retry_after: float | None = None) -> None:
        self.status = status
        self.problem: dict[str, Any] = dict(problem)
        self.type: str = str(problem.get("type", "about:blank"))
        self.title: str = str(problem.get("title", f"HTTP {status}"))
        self.detail: str | None = _text_or_none(problem.get("detail"))
        self.request_id: str | None = _text_or_none(problem.get("request_id"))
        self.retry_after = retry_after
        super().__init__(self._summary())

    @property
    def code(self) -> str:
        """The gateway's short error code (``not-found``, ``validation-failed``...)."""
        return self.type.removeprefix(PROBLEM_PREFIX)

    def describe(self) -> str:
        """The gateway's own words: the problem's ``title: detail``."""
        if self.detail and self.detail != self.title:
            return f"{self.title}: {self.detail}"
        return self.title

    def _summary(self) -> str:
        text = f"{self.status} {self.title}"
        if self.detail and self.detail != self.title:
            text += f": {self.detail}"
        if self.request_id:
            text += f" (request {self.request_id})"
        return text


class AuthenticationFailed(ProblemError):
    """401: the API token is missing, wrong, revoked or expired."""


class Forbidden(ProblemError):
    """403: the token may not do this."""


class NotFound(ProblemError):
    """404: no such elicitation or credential for this client."""


class Conflict(ProblemError):
    """409: the state forbids it (cancelling an ended elicitation, a reused Idempotency-Key)."""


class ReconnectRequired(Conflict):
    """409 ``reconnect-required``: the provider refused to refresh an OAuth connection.

    The gateway has revoked the connection (and sent ``credential.revoked``
    with reason ``refresh-failed``); only the user can mend it, by connecting
    the account again through a new elicitation.
    """


class InvalidRequest(ProblemError):
    """400 or 422: the request breaks a rule; ``detail`` and ``problem`` say which."""


class RateLimited(ProblemError):
    """429: over the client's limit; ``retry_after`` says for how many seconds."""


class TemporarilyUnavailable(ProblemError):
    """503: the gateway cannot do it for now; ``retry_after`` says when to retry.

    The request was not completed. A create retried with the same
    ``Idempotency-Key`` is safe either way.
    """


class ProviderUnavailable(TemporarilyUnavailable):
    """503 ``provider-unavailable``: an OAuth connection's provider did not answer a refresh.

    The connection is intact; reveal it again after ``retry_after`` seconds.
    """


_BY_STATUS: Final[dict[int, type[ProblemError]]] = {
    400: InvalidRequest, 401: AuthenticationFailed, 403: Forbidden, 404: NotFound,
    409: Conflict, 422: InvalidRequest, 429: RateLimited, 503: TemporarilyUnavailable,
}
# Codes that call for a different action than others of their status.
_BY_CODE: Final[dict[tuple[int, str], type[ProblemError]]] = {
    (409, "reconnect-required"): ReconnectRequired,
    (503, "provider-unavailable"): ProviderUnavailable,
}


def problem_error(status: int, problem: Mapping[str, Any], *,
                  retry_after: float | None = None) -> ProblemError:
    """The most specific error class for this status and problem type."""
    code = str(problem.get("type", "")).removeprefix(PROBLEM_PREFIX)
    chosen = _BY_CODE.get((status, code)) or _BY_STATUS.get(status, ProblemError)
    return chosen(status, problem, retry_after=retry_after)


def _text_or_none(value: Any) -> str | None:
    return None if value is None else str(value)
