"""Standard Webhooks signatures (https://www.standardwebhooks.com).

The signed content is ``{webhook-id}.{webhook-timestamp}.{body}``; the key is
the base64 part of a ``whsec_`` secret. While a rotated secret's grace period
runs, a delivery carries one signature per secret, space-separated, and a
receiver that knows either accepts it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Sequence
from typing import Final

SECRET_PREFIX: Final = "whsec_"  # noqa: S105  (a prefix, not a secret)


def secret_key(secret: str) -> bytes:
    """The HMAC key of a ``whsec_…`` secret."""
    return base64.b64decode(secret.removeprefix(SECRET_PREFIX))


def sign(secret: str, message_id: str, timestamp: int, body: str) -> str:
    """One ``v1,<base64>`` signature."""
    content = f"{message_id}.{timestamp}.{body}".encode()
    digest = hmac.new(secret_key(secret), content, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def headers(secrets: Sequence[str], message_id: str, timestamp: int,
            body: str) -> dict[str, str]:
    """The three Standard Webhooks headers, signed with every current secret."""
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(sign(s, message_id, timestamp, body) for s in secrets),
    }
