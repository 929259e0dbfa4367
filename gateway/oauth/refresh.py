"""A reveal hands out a working access token: refreshed first when it is about to expire.

A refresh token works once. Providers rotate it at every refresh, and many
(oidc-provider, GitHub) end the whole grant when a used one comes back, so
two refreshes of one connection at once would cost the user the connection.
Reveals of one connection may arrive together on any process of any
instance, so the single flight is kept where they all meet: in the
credential's row, by its lease columns, the same way on SQLite and
PostgreSQL.

1. A reveal that finds the access token due takes the lease with one
   conditional UPDATE: only while the credential is live, the lease is free
   or ran out, and the token set is still the one it read. It commits at once.
   Lease times are the database's (:class:`~gateway.db_clock.database_now`):
   instances whose clocks disagree still agree on when a lease runs out.
2. The lease holder calls the provider outside any transaction: on SQLite a
   transaction would hold the file's one write lock for the whole call, on
   PostgreSQL a connection and a snapshot. The call has a deadline shorter
   than the lease (:func:`gateway.outbound.attempt_deadline`): a provider
   trickling its answer is cut off before another reveal may take the lease
   over and send the same refresh token again, which providers that detect
   reuse answer by ending the grant.
3. The answer is checked (:func:`gateway.oauth.provider.token_answer`) and
   sealed; then in one transaction the holder stores the new token set (only
   if the credential is still live and holds the token set it refreshed),
   frees the lease if it still holds it, and audits the refresh and its own
   reveal. Whatever fails on the way frees the lease.
4. Every other reveal waits, reading the row again in short read
   transactions, until the token set changes (it reveals the new one), the
   credential is revoked (it says so), the lease is freed with the token set
   unchanged (the provider failed the holder: 503), or the lease runs out
   (its holder died: it takes the lease itself).

Only ``invalid_grant`` revokes the connection (reason ``refresh-failed``,
which sends ``credential.revoked``) and answers ``reconnect-required``. Any
other answer (another error, 429, 5xx, no answer in time, an unusable token
answer) leaves the connection as it was and answers 503 with Retry-After;
``invalid_client`` is also logged as an error and audited
(``oauth.client_refused``), which ``gateway status`` shows.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final

from sqlalchemy import or_, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from gateway import db
from gateway.audit import service as audit
from gateway.clock import Clock
from gateway.credentials import service
from gateway.credentials.catalog import OAuthProvider
from gateway.credentials.models import Credential
from gateway.db_clock import database_now
from gateway.oauth import revocation
from gateway.oauth.provider import (
    ClientRefused,
    GrantRefused,
    Provider,
    ProviderUnavailable,
    token_expiry,
)
from gateway.oauth.tokens import TokenSet, granted_scopes, reveal_token_set, sealed, token_set_of
from gateway.outbound import attempt_deadline
from gateway.pagination import timestamp
from gateway.tokens import new_id
from gateway.vault.envelope import VaultError
from gateway.vault.keyring import KeySource
from gateway.vault.sealing import store_sealed

log = logging.getLogger(__name__)

# How often a waiting reveal reads the row again: a refresh takes some
# hundreds of milliseconds, and each look is one short read by primary key.
POLL_SECONDS: Final = 0.08
# The lease outlasts the provider call's deadline by this much: storing the
# result takes a transaction, which may wait its turn for the write lock.
LEASE_SLACK_SECONDS: Final = 5.0
# The audit action of a refresh whose provider refused the gateway's client.
CLIENT_REFUSED: Final = "oauth.client_refused"


@dataclass(frozen=True, slots=True)
class Reveal:
    """One client's reveal of one connection: who asks, from where, and with what."""

    client_id: str
    credential_id: str
    actor: str
    source_ip: str | None
    clock: Clock
    keyring: KeySource
    margin: timedelta


@dataclass(frozen=True, slots=True)
class Revealed:
    """A connection's access token, and what the MCP server needs to use it."""

    id: str
    type: str
    tokens: TokenSet = field(repr=False)
    expires_at: datetime | None
    scopes: list[str]
    account: str | None

    def as_json(self) -> dict[str, Any]:
        """The reveal response: an API key's fields, then the connection's."""
        return {"id": self.id, "type": self.type, "secret": self.tokens.access_token,
                "token_type": self.tokens.token_type, "expires_at": timestamp(self.expires_at),
                "scopes": self.scopes, "account": self.account}


def due(credential: Credential, now: datetime, margin: timedelta) -> bool:
    """Whether the access token must be refreshed before it is handed out.

    Within ``margin`` of its expiry, or within half its lifetime when that is
    shorter: a provider whose tokens live less than the margin would else be
    asked for a new one at every reveal. A token whose provider did not say
    when it expires is taken to work until it does not.
    """
    expires_at = credential.token_expires_at
    if expires_at is None:
        return False
    lifetime = expires_at - (credential.refreshed_at or credential.created_at)
    return now >= expires_at - max(timedelta(0), min(margin, lifetime / 2))


def deadline_for(config: OAuthProvider) -> float:
    """Seconds a refresh's provider call may take, answers read whole, before it is cut off."""
    # Discovery (once an hour) and the token request: two requests, each
    # allowed the connect and the read timeout.
    return 4 * config.timeout_seconds


def lease_for(config: OAuthProvider) -> timedelta:
    """How long a refresh may hold the lease before another reveal may take it over.

    Longer than the provider call's deadline, so that a holder is always
    done with the provider before its lease can run out.
    """
    return timedelta(seconds=deadline_for(config) + LEASE_SLACK_SECONDS)


def reveal_if_fresh(session: Session, ask: Reveal, credential: Credential, *,
                    refreshable: bool) -> Revealed | None:
    """In the caller's transaction: the token, audited; None when it must be refreshed first.

    A token set that cannot be refreshed (no refresh token, or a type gone
    from the catalog) is handed out as it is: ``expires_at`` tells.
    """
    service.require_live(credential)
    tokens = _open(ask.keyring, credential)
    if refreshable and tokens.refresh_token is not None and \
            due(credential, ask.clock.now(), ask.margin):
        return None
    return _hand_out(session, ask, credential, tokens)


def refresh_then_reveal(ask: Reveal, provider: Provider | None, seen: Credential) -> Revealed:
    """Refresh the token set, or wait for the reveal that does; then hand out the new one.

    ``seen`` is the row as read when its token was found due. Called outside
    any transaction; opens only short ones.
    """
    if provider is None:
        return _reveal_now(ask)
    # A value, not the row: each read below updates the session's one copy of it.
    due_nonce = seen.nonce
    lease = lease_for(provider.config)
    give_up_at = time.monotonic() + lease.total_seconds() + 2 * POLL_SECONDS
    waited_on: str | None = None
    while True:
        credential, now = _read(ask)
        service.require_live(credential)
        if credential.nonce != due_nonce:  # refreshed meanwhile
            return _reveal_now(ask)
        if credential.refresh_lease_until is not None and credential.refresh_lease_until > now:
            waited_on = credential.refresh_lease_holder
            if time.monotonic() > give_up_at:
                raise ProviderUnavailable("another request has been refreshing this "
                                          "connection's token for too long; try again")
            time.sleep(POLL_SECONDS)
            continue
        if waited_on is not None and credential.refresh_lease_holder is None:
            # The holder let go with the token set unchanged: the provider
            # failed it just now. Asking again at once would fail as well.
            raise ProviderUnavailable(f"The provider ({provider.config.host}) did not refresh "
                                      "the token; try again in a moment")
        holder = new_id("rl_", 15)
        if _take_lease(credential, lease, holder):
            revealed = _refresh(ask, provider, credential, holder)
            if revealed is not None:
                return revealed


def _read(ask: Reveal) -> tuple[Credential, datetime]:
    """The row as it is now, and the database's time, in a read transaction of its own."""
    # Ended at once: a SQLite read keeps showing the snapshot it began
    # with, and no transaction stays open while this request waits.
    with db.reading() as session:
        credential = service.get_for_client(session, ask.client_id, ask.credential_id,
                                            fresh=True)
        now = session.scalar(select(database_now()))
        assert now is not None
        return credential, now


def _take_lease(seen: Credential, lease: timedelta, holder: str) -> bool:
    """Take the refresh lease of the token set ``seen``; whether this request got it."""
    with db.transaction() as session:
        taken = session.execute(
            update(Credential)
            .where(Credential.id == seen.id, Credential.revoked_at.is_(None),
                   or_(Credential.refresh_lease_until.is_(None),
                       Credential.refresh_lease_until <= database_now()),
                   # The token set read: every sealing draws a new nonce, where
                   # an expiry can repeat (a provider's fixed one, a test's clock).
                   Credential.nonce == seen.nonce)
            .values(refresh_lease_until=database_now(lease.total_seconds()),
                    refresh_lease_holder=holder)
            .returning(Credential.id)
            .execution_options(synchronize_session=False)).first()
    return taken is not None


def _refresh(ask: Reveal, provider: Provider, seen: Credential, holder: str) -> Revealed | None:
    """Under the lease: ask the provider, then store; None when the row must be read again."""
    nonce = seen.nonce  # the token set refreshed: later reads update ``seen`` itself
    try:
        tokens = _open(ask.keyring, seen)
        if tokens.refresh_token is None:  # nothing to refresh with: hand out what there is
            _release_after_failure(seen.id, holder)
            return _reveal_now(ask)
        answer = _ask_provider(provider, tokens.refresh_token)
        new = token_set_of(answer, tokens)
    except GrantRefused as refused:
        _refused(ask, seen.id, nonce, holder, refused)
        return None
    except ClientRefused:
        _client_refused(ask, provider, seen.id, holder)
        raise
    except BaseException:
        _release_after_failure(seen.id, holder)
        raise
    try:
        return _store(ask, provider, seen, nonce, tokens, answer, new, holder)
    except BaseException:
        # The store's transaction rolled back, freeing nothing: free the lease apart.
        _release_after_failure(seen.id, holder)
        raise


def _ask_provider(provider: Provider, refresh_token: str) -> dict[str, Any]:
    """The provider's checked token answer, or an error; over by the deadline whatever happens."""
    seconds = deadline_for(provider.config)
    with attempt_deadline(seconds) as deadline:
        try:
            return provider.refresh(refresh_token)
        except ProviderUnavailable:
            if not deadline.passed():
                raise
    log.warning("%s: the refresh was cut off after %.0f s", provider.type_id, seconds)
    raise ProviderUnavailable(f"The provider ({provider.config.host}) did not answer within "
                              f"{seconds:.0f} s; try again in a moment")


def _store(ask: Reveal, provider: Provider, seen: Credential, nonce: bytes, tokens: TokenSet,
           answer: dict[str, Any], new: TokenSet, holder: str) -> Revealed | None:
    """Store the new token set, free the lease and audit, in one transaction."""
    now = ask.clock.now()
    expires_at = token_expiry(answer, now)
    scopes = granted_scopes(answer, tuple(seen.scopes or ()))
    # Sealed in the transaction, and again if its key version was retired meanwhile.
    stored = store_sealed(ask.keyring, lambda: _write(ask, seen, nonce, tokens, new, now,
                                                     expires_at, scopes, holder))
    if stored is None:
        _orphaned(ask, provider, new)
        return None
    return Revealed(seen.id, seen.type, new, expires_at, scopes, seen.account)


def _write(ask: Reveal, seen: Credential, nonce: bytes, tokens: TokenSet, new: TokenSet,
           now: datetime, expires_at: datetime | None, scopes: list[str], holder: str) -> Any:
    """The conditional store of the new token set, sealed now; None if the row moved on."""
    envelope = sealed(ask.keyring, seen, new)
    with db.transaction() as session:
        stored = session.execute(
            update(Credential)
            .where(Credential.id == seen.id, Credential.revoked_at.is_(None),
                   Credential.nonce == nonce)
            .values(key_version=envelope.key_version, wrapped_key=envelope.wrapped_key,
                    nonce=envelope.nonce, ciphertext=envelope.ciphertext,
                    token_expires_at=expires_at, refreshed_at=now, scopes=scopes)
            .returning(Credential.id)
            .execution_options(synchronize_session=False)).first()
        _release(session, seen.id, holder)
        if stored is not None:
            details: dict[str, Any] = {"client_id": seen.client_id, "type": seen.type,
                       "expires_at": timestamp(expires_at),
                       "refresh_token_rotated": new.refresh_token != tokens.refresh_token}
            if scopes != (seen.scopes or []):
                details["scopes"] = scopes
            audit.record(session, ask.clock, actor=ask.actor, action="credential.refreshed",
                         target=seen.id, source_ip=ask.source_ip, details=details)
            service.record_reveal(session, ask.clock, seen, actor=ask.actor,
                                  source_ip=ask.source_ip)
    return stored


def _orphaned(ask: Reveal, provider: Provider, new: TokenSet) -> None:
    """New tokens that were not stored: revoke them if the connection was revoked meanwhile.

    Else another refresh stored its token set first (this one's lease had run
    out); revoking ours could end the grant theirs belongs to.
    """
    if _read(ask)[0].live:
        return
    outcome = revocation.revoke_tokens(provider, new)
    log.info("credential %s was revoked during its refresh; its new tokens: %s",
             ask.credential_id, outcome)


def _refused(ask: Reveal, credential_id: str, nonce: bytes, holder: str,
             refused: GrantRefused) -> None:
    """Revoke the connection whose refresh the provider refused, and free the lease.

    Unless its token set (``nonce``) changed meanwhile: then another refresh
    spent the refresh token first, and the connection lives on with the new one.
    """
    try:
        with db.transaction() as session:
            current = session.get(Credential, credential_id, populate_existing=True,
                                  with_for_update=True)
            if current is not None and current.live and current.nonce == nonce:
                service.revoke(session, ask.clock, current, actor=ask.actor,
                               source_ip=ask.source_ip, reason=service.Reason.REFRESH_FAILED,
                               details={"provider_error": refused.error})
            _release(session, credential_id, holder)
    except BaseException:
        _release_after_failure(credential_id, holder)
        raise


def _client_refused(ask: Reveal, provider: Provider, credential_id: str, holder: str) -> None:
    """Free the lease and record that the provider refused the gateway's client.

    The record is what ``gateway status`` reads to say which type's client
    the operator must correct; the connection itself is left as it was.
    """
    try:
        with db.transaction() as session:
            _release(session, credential_id, holder)
            audit.record(session, ask.clock, actor=ask.actor, action=CLIENT_REFUSED,
                         target=provider.type_id, source_ip=ask.source_ip, outcome="failure",
                         details={"credential_id": credential_id,
                                  "provider_error": "invalid_client"})
    except SQLAlchemyError:
        _release_after_failure(credential_id, holder)


def _release(session: Session, credential_id: str, holder: str) -> None:
    """Free the lease if this holder still has it: one that ran out may be another's now."""
    session.execute(
        update(Credential)
        .where(Credential.id == credential_id, Credential.refresh_lease_holder == holder)
        .values(refresh_lease_until=None, refresh_lease_holder=None)
        .execution_options(synchronize_session=False))


def _release_after_failure(credential_id: str, holder: str) -> None:
    """Free the lease after a failure; if even that fails, the lease runs out by itself."""
    try:
        with db.transaction() as session:
            _release(session, credential_id, holder)
    except SQLAlchemyError as error:
        log.warning("credential %s: the refresh lease could not be freed (%s); it runs out "
                    "by itself", credential_id, type(error).__name__)


def _reveal_now(ask: Reveal) -> Revealed:
    """The token set as it is now, audited, in a transaction of its own."""
    with db.transaction() as session:
        credential = service.get_for_client(session, ask.client_id, ask.credential_id,
                                            fresh=True)
        service.require_live(credential)
        return _hand_out(session, ask, credential, _open(ask.keyring, credential))


def _hand_out(session: Session, ask: Reveal, credential: Credential,
              tokens: TokenSet) -> Revealed:
    service.record_reveal(session, ask.clock, credential, actor=ask.actor,
                          source_ip=ask.source_ip)
    return Revealed(credential.id, credential.type, tokens, credential.token_expires_at,
                    list(credential.scopes or []), credential.account)


def _open(keyring: KeySource, credential: Credential) -> TokenSet:
    try:
        return reveal_token_set(keyring, credential)
    except VaultError:
        raise service.unreadable(credential) from None
