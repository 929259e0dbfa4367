"""The Python client of the gateway, for MCP servers.

Needs only ``requests``. The helpers for the official ``mcp`` SDK live in
:mod:`gateway.client.mcp` (``pip install 'gateway[mcp]'``).
"""

from gateway.client.api import GatewayClient
from gateway.client.errors import (
    AuthenticationFailed,
    Conflict,
    Forbidden,
    GatewayClientError,
    GatewayUnavailable,
    InvalidRequest,
    NotFound,
    ProblemError,
    ProviderUnavailable,
    RateLimited,
    ReconnectRequired,
    TemporarilyUnavailable,
)
from gateway.client.models import Credential, Elicitation, Page, RevealedCredential, Subject
from gateway.client.webhooks import WebhookVerificationError, verify_webhook

__all__ = [
    "AuthenticationFailed",
    "Conflict",
    "Credential",
    "Elicitation",
    "Forbidden",
    "GatewayClient",
    "GatewayClientError",
    "GatewayUnavailable",
    "InvalidRequest",
    "NotFound",
    "Page",
    "ProblemError",
    "ProviderUnavailable",
    "RateLimited",
    "ReconnectRequired",
    "RevealedCredential",
    "Subject",
    "TemporarilyUnavailable",
    "WebhookVerificationError",
    "verify_webhook",
]
