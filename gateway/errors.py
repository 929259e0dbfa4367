"""Domain errors: what went wrong, in words a caller can act on.

Services raise these; the web edge maps them to HTTP (problem+json under
/api/, an HTML page elsewhere) and the CLI to one line on stderr. ``detail``
is shown to the caller, so it never holds a secret.
"""

from __future__ import annotations

from typing import Any, ClassVar


class GatewayError(Exception):
    """A domain error with what a caller needs to understand it."""

    status: ClassVar[int] = 400
    code: ClassVar[str] = "bad-request"
    title: ClassVar[str] = "Bad request"

    def __init__(self, detail: str | None = None, **extra: Any) -> None:
        super().__init__(detail or self.title)
        self.detail = detail or self.title
        self.extra = extra

    def headers(self) -> dict[str, str]:
        """Extra response headers (WWW-Authenticate, Retry-After...)."""
        return {}


class NotFound(GatewayError):
    status = 404
    code = "not-found"
    title = "Not found"


class Conflict(GatewayError):
    status = 409
    code = "conflict"
    title = "Conflict"


class InvalidInput(GatewayError):
    """The request is well-formed but asks for something the rules refuse."""

    status = 422
    code = "invalid-input"
    title = "Invalid input"
