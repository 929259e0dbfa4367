"""Checking a webhook from the gateway, on the MCP server's side.

Standard Webhooks: the signature covers ``webhook-id.webhook-timestamp.body``
under the ``whsec_`` secret, any one of the space-separated ``v1,``
signatures may match (two are sent while a secret rotates), and the
timestamp must be within five minutes of now, either way, so a captured
delivery cannot be replayed later. Deduplicate on ``webhook-id``: retries
carry the same one.

This module uses the standard library only, so MCP servers can import it
without the gateway's server dependencies.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from collections.abc import Mapping
from typing import Any, Final

TOLERANCE_SECONDS: Final = 300


class WebhookVerificationError(Exception):
    """The delivery is not authentic, or too old or too new to accept."""


def verify_webhook(secret: str, headers: Mapping[str, str], body: bytes | str, *,
                   now: float | None = None) -> dict[str, Any]:
    """The event, once its signature and timestamp check out; raise otherwise."""
    lowered = {name.lower(): value for name, value in headers.items()}
    try:
        message_id = lowered["webhook-id"]
        stamp = lowered["webhook-timestamp"]
        signatures = lowered["webhook-signature"]
    except KeyError as missing:
        raise WebhookVerificationError(f"missing header {missing}") from None
    if not stamp.isdigit():
        raise WebhookVerificationError("webhook-timestamp is not a number")
    current = time.time() if now is None else now
    if abs(current - int(stamp)) > TOLERANCE_SECONDS:
        raise WebhookVerificationError("webhook-timestamp is more than 5 minutes off")
    text = body.decode() if isinstance(body, bytes) else body
    expected = _signature(secret, f"{message_id}.{stamp}.{text}".encode())
    for candidate in signatures.split():
        version, _, value = candidate.partition(",")
        if version == "v1" and hmac.compare_digest(value.encode(), expected.encode()):
            event: dict[str, Any] = json.loads(text)
            return event
    raise WebhookVerificationError("no signature matches this secret")


def _signature(secret: str, content: bytes) -> str:
    try:
        key = base64.b64decode(secret.removeprefix("whsec_"), validate=True)
    except binascii.Error:
        raise WebhookVerificationError("the secret is not a whsec_ secret") from None
    return base64.b64encode(hmac.new(key, content, hashlib.sha256).digest()).decode()
