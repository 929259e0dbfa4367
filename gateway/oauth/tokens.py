"""A connection's token set: sealed in the vault as one credential, opened only to be used.

The access and refresh tokens are the secret, sealed together as JSON and
bound to the credential's row like any key. What may be shown (the account,
the granted scopes, when the access token expires) lives in the row's own
columns.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, Final

from gateway.credentials.catalog import CredentialType
from gateway.credentials.models import Credential
from gateway.credentials.service import binding
from gateway.elicitations.models import Elicitation
from gateway.oauth.provider import token_expiry
from gateway.tokens import new_id
from gateway.vault.envelope import Envelope, reveal_plaintext, seal
from gateway.vault.keyring import KeySource

KIND: Final = "oauth"
MAX_ACCOUNT_LENGTH: Final = 255


@dataclass(frozen=True, slots=True)
class TokenSet:
    """What is sealed: the tokens themselves, never shown but to the owning MCP server."""

    access_token: str = field(repr=False)
    refresh_token: str | None = field(repr=False)
    token_type: str


def granted_scopes(answer: Mapping[str, Any], asked: tuple[str, ...]) -> list[str]:
    """The scopes the provider granted: its ``scope``, or what was asked when it says nothing.

    RFC 6749 section 5.1: a token response omits ``scope`` when it is the one
    requested.
    """
    scope = answer.get("scope")
    if isinstance(scope, str):
        return scope.split()
    if isinstance(scope, list) and all(isinstance(item, str) for item in scope):
        return list(scope)  # a few providers send a list
    return list(asked)


def account_name(claims: Mapping[str, Any], fields: tuple[str, ...]) -> str | None:
    """The account the user connected, as the first present claim of ``fields`` names it."""
    for name in fields:
        value = claims.get(name)
        if isinstance(value, str | int) and not isinstance(value, bool) and str(value).strip():
            return str(value).strip()[:MAX_ACCOUNT_LENGTH]
    return None


def token_set_of(answer: Mapping[str, Any], previous: TokenSet | None = None) -> TokenSet:
    """The token set of a token response; with no new refresh token, the old one stays."""
    refresh = answer.get("refresh_token")
    if not isinstance(refresh, str) or not refresh:
        refresh = previous.refresh_token if previous is not None else None
    token_type = answer.get("token_type")
    return TokenSet(str(answer["access_token"]), refresh,
                    token_type if isinstance(token_type, str) and token_type else "Bearer")


def seal_connection(keyring: KeySource, elicitation: Elicitation,
                    credential_type: CredentialType, answer: Mapping[str, Any], *,
                    scopes: list[str], account: str | None, now: datetime) -> Credential:
    """A new connection for the elicitation's client and user, sealed; not stored yet."""
    credential = Credential(
        id=new_id("cr_", 15), client_id=elicitation.client_id,
        subject_iss=elicitation.subject_iss, subject_sub=elicitation.subject_sub,
        type=credential_type.id, kind=KIND, hint=_hint(account),
        elicitation_id=elicitation.id, created_at=now, revoked_at=None,
        account=account, scopes=scopes, token_expires_at=token_expiry(answer, now),
        refreshed_at=None)
    reseal(keyring, credential, token_set_of(answer))
    return credential


def reseal(keyring: KeySource, credential: Credential, tokens: TokenSet) -> None:
    """Seal ``tokens`` into the credential, replacing what it held."""
    credential.seal(keyring, _plaintext(tokens), binding(credential))


def sealed(keyring: KeySource, credential: Credential, tokens: TokenSet) -> Envelope:
    """``tokens`` sealed for the credential's row, to store with a conditional UPDATE."""
    return seal(keyring, _plaintext(tokens), binding(credential))


def _plaintext(tokens: TokenSet) -> bytes:
    return json.dumps(asdict(tokens), separators=(",", ":")).encode()


def reveal_token_set(keyring: KeySource, credential: Credential) -> TokenSet:
    """The connection's tokens; call only to use them or hand them to the owning MCP server."""
    document = json.loads(reveal_plaintext(keyring, credential.envelope, binding(credential)))
    return TokenSet(document["access_token"], document.get("refresh_token"),
                    document.get("token_type") or "Bearer")


def _hint(account: str | None) -> str:
    # The hint tells connections apart; a token's tail would change at every refresh.
    if not account:
        return "…"
    return account if len(account) <= 20 else account[:19] + "…"
