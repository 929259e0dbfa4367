"""Revoking a connection here and at its provider (RFC 7009).

Revoked here, a connection can no longer be revealed; its tokens would still
work at the provider until they expire, unless it is told. So every
revocation of a connection (by its user, its MCP server or the operator)
revokes it here first, in one transaction (audited, ``credential.revoked``
sent), and then asks the provider to revoke the refresh token and the access
token sealed in it, outside any transaction (the provider may be slow; on
SQLite a transaction would hold the write lock meanwhile). A second audit
row, ``credential.provider_revoked``, says what the provider answered.

Here first, because a refresh may be in flight: its store is conditional on
the connection being live, so it fails, and the refresh revokes the tokens
it just obtained as orphans (:mod:`gateway.oauth.refresh`). Asked the other
way round, the provider would revoke the old tokens while the refresh
stored and handed out new ones that nobody would ever revoke. A provider
that fails to answer stops nothing: the revocation here is what the gateway
promises.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Final

from sqlalchemy.orm import Session

from gateway.audit import service as audit
from gateway.clock import Clock
from gateway.credentials import service
from gateway.credentials.catalog import CatalogError
from gateway.credentials.models import Credential
from gateway.oauth.provider import NO_ANSWER, Provider
from gateway.oauth.tokens import KIND, TokenSet, reveal_token_set
from gateway.vault.envelope import VaultError
from gateway.vault.keyring import KeyringError, KeySource

NOT_REVOKED: Final = "not revoked at the provider"
REVOKED: Final = "revoked at the provider"
# The audit action that says what the provider answered a revocation.
PROVIDER_REVOKED: Final = "credential.provider_revoked"

Transaction = Callable[[], AbstractContextManager[Session]]


def revoke_tokens(provider: Provider, tokens: TokenSet) -> str:
    """Revoke the refresh token, then the access token; what the provider answered.

    The refresh token first: once it is gone no new access token can be
    minted, whatever happens to the second request. A provider that did not
    answer the first is not waited for a second time.
    """
    outcomes = []
    if tokens.refresh_token is not None:
        outcomes.append(("refresh token", provider.revoke(tokens.refresh_token,
                                                          "refresh_token")))
        if outcomes[0][1].startswith(NO_ANSWER):
            return outcomes[0][1]
    outcomes.append(("access token", provider.revoke(tokens.access_token, "access_token")))
    if len({outcome for _, outcome in outcomes}) == 1:
        return outcomes[0][1]
    return "; ".join(f"{name}: {outcome}" for name, outcome in outcomes)


class AtProvider:
    """Revokes connections' tokens at their providers, saying what happened for the audit row.

    The keyring and the provider are asked for only when a connection is
    revoked: a command revoking an API key needs neither.
    """

    def __init__(self, keyring: Callable[[], KeySource],
                 provider_of: Callable[[str], Provider | None]) -> None:
        self._keyring = keyring
        self._provider_of = provider_of

    def __call__(self, credential: Credential) -> str:
        """Revoke the connection's tokens at its provider; the outcome, in a few words."""
        try:
            provider = self._provider_of(credential.type)
        except CatalogError:
            return f"{NOT_REVOKED}: the credential types file could not be read"
        if provider is None:
            return f"{NOT_REVOKED}: {credential.type!r} is no longer an OAuth type in the catalog"
        try:
            tokens = reveal_token_set(self._keyring(), credential)
        except (KeyringError, VaultError):
            return f"{NOT_REVOKED}: the tokens do not open with this keyring"
        return revoke_tokens(provider, tokens)


def revoke(transaction: Transaction, find: Callable[[Session], Credential],
           at_provider: Callable[[Credential], str], *, clock: Clock, actor: str,
           source_ip: str | None, reason: service.Reason) -> tuple[Credential, str | None]:
    """Revoke a credential; a connection at its provider first. Its outcome there, if any.

    ``find`` reads the credential in a transaction, refusing one the caller
    may not revoke. An API key is revoked in one transaction, as ever.
    """
    with transaction() as session:
        # Locked: a refresh storing its token set meanwhile either commits
        # first (its tokens are the ones revoked below) or finds it revoked.
        credential = _locked(session, find)
        service.revoke(session, clock, credential, actor=actor, source_ip=source_ip,
                       reason=reason)
    if credential.kind != KIND:
        return credential, None
    outcome = at_provider(credential)
    with transaction() as session:
        audit.record(session, clock, actor=actor, action=PROVIDER_REVOKED,
                     target=credential.id, source_ip=source_ip,
                     outcome="success" if outcome == REVOKED else "failure",
                     details={"client_id": credential.client_id, "type": credential.type,
                              "provider_revocation": outcome})
    return credential, outcome


def _locked(session: Session, find: Callable[[Session], Credential]) -> Credential:
    """The credential as it is now, locked until the transaction ends (on PostgreSQL).

    Read again, as the session may hold it from an earlier transaction; locked,
    so that of two revocations at once the second waits, then finds it revoked.
    """
    credential = find(session)
    session.refresh(credential, with_for_update=True)
    return credential
