"""The gateway subject of the user behind an MCP request: their token's ``(iss, sub)``."""

from __future__ import annotations

from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken
from mcp.server.mcpserver.exceptions import ToolError

from gateway.client.models import Subject


class NoSubject(ToolError):
    """The request carries no token naming a user (issuer and subject)."""


def subject_of(token: AccessToken | None = None) -> Subject:
    """``(iss, sub)`` of ``token``, by default the current request's validated access token.

    The token verifier must fill ``AccessToken.subject`` with ``sub`` and put
    ``iss`` in ``AccessToken.claims``; the gateway completes an elicitation
    only for a browser session of that same pair.
    """
    token = token if token is not None else get_access_token()
    if token is None:
        raise NoSubject("this tool needs a signed-in user: the request carries no access token")
    issuer = (token.claims or {}).get("iss")
    if not isinstance(issuer, str) or not issuer or not token.subject:
        raise NoSubject("the access token names no issuer and subject")
    return Subject(iss=issuer, sub=token.subject)
