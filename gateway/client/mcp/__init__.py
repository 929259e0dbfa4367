"""Helpers for MCP servers built on the official ``mcp`` SDK (``pip install 'gateway[mcp]'``).

:class:`GatewayElicitations` asks for API keys, OAuth connections and
payments from inside a tool, choosing per request between the 2025-11-25
form (error -32042 and ``notifications/elicitation/complete``) and the
2026-07-28 form (``InputRequiredResult`` and ``requestState``).
:class:`CompletionNotifier` turns the gateway's webhooks into completion
notifications. :func:`subject_of` names the signed-in user as the gateway needs them. A gateway that
refuses a call or does not answer ends the tool call with
:class:`GatewayCallFailed`, whose text is the gateway's own words; wrap a
tool in :func:`in_own_words` and the client reads those words alone.
"""

from gateway.client.mcp.elicit import (
    ElicitationNotCompleted,
    GatewayCallFailed,
    GatewayElicitations,
    UrlElicitationUnsupported,
    is_multi_round_trip,
)
from gateway.client.mcp.errors import in_own_words
from gateway.client.mcp.notify import CompletionNotifier
from gateway.client.mcp.subject import NoSubject, subject_of

__all__ = [
    "CompletionNotifier",
    "ElicitationNotCompleted",
    "GatewayCallFailed",
    "GatewayElicitations",
    "NoSubject",
    "UrlElicitationUnsupported",
    "in_own_words",
    "is_multi_round_trip",
    "subject_of",
]
