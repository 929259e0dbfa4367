"""Random tokens and the keyed digests under which they are stored.

A token the gateway only ever checks (API tokens, session ids) is stored as
HMAC-SHA256 under the server-side pepper, never as itself. A stolen table of
digests is useless without the pepper, and one HMAC per request costs
microseconds: no slow hash belongs on the per-request path, because these
tokens carry 256 random bits and cannot be guessed.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Final

from gateway.settings import Secret

TOKEN_BYTES: Final = 32
# What new_id mints: a short prefix, then URL-safe base64.
ID_PATTERN: Final = r"[a-z]{2,4}_[A-Za-z0-9_-]{1,40}"


def new_token(prefix: str) -> str:
    """A fresh URL-safe token of 256 random bits, e.g. ``gw_…``."""
    return prefix + secrets.token_urlsafe(TOKEN_BYTES)


def new_id(prefix: str, random_bytes: int = 12) -> str:
    """A public identifier: random, so it reveals no count or order."""
    return prefix + secrets.token_urlsafe(random_bytes)


def keyed_digest(pepper: Secret, token: str) -> str:
    """The hex HMAC-SHA256 of ``token`` under ``pepper``: what is stored and looked up."""
    return hmac.new(pepper.reveal().encode(), token.encode(), hashlib.sha256).hexdigest()


def token_hint(token: str, visible: int = 4) -> str:
    """A masked form that tells tokens apart without revealing them: ``gw_AbCd…``."""
    prefix, _, body = token.partition("_")
    return f"{prefix}_{body[:visible]}…"
