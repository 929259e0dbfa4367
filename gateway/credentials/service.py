"""Capturing a key: check it, seal it, store it and complete the elicitation, at once.

The plaintext exists only in this request's memory: it is never logged,
never echoed back (not even in an error), and written only as ciphertext
bound to its row.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Final, Protocol

from sqlalchemy import Connection, and_, bindparam, delete, insert, inspect, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from gateway.audit import service as audit
from gateway.clients import service as clients
from gateway.clients.models import Client
from gateway.clock import Clock
from gateway.credentials.catalog import CredentialType
from gateway.credentials.models import LIVE_OWNER_INDEX, ONE_KEY_PER_ELICITATION, Credential
from gateway.elicitations import lifecycle
from gateway.elicitations.lifecycle import Status
from gateway.elicitations.models import Elicitation
from gateway.errors import Conflict, GatewayError, NotFound
from gateway.pagination import decode_cursor, encode_cursor, timestamp
from gateway.tokens import new_id
from gateway.vault.envelope import Envelope, VaultError, bind, reveal_plaintext
from gateway.vault.keyring import KeySource
from gateway.webhooks import outbox
from gateway.wording import with_article

log = logging.getLogger(__name__)

HINT_TAIL: Final = 4
# C0 and C1 control characters and DEL: never part of a key, often of a
# careless copy (a line break, a tab). One regular expression, not a loop in
# Python over every character: it runs twice on every submit.
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f-\x9f]")


class InvalidSecret(GatewayError):
    """The key does not fit its type; the message says how, never what was typed."""

    status = 422
    code = "invalid-secret"
    title = "This key does not look right"


def check_shape(credential_type: CredentialType, secret: str) -> None:
    """Refuse a key of the wrong length or pattern, without repeating it."""
    label = credential_type.label
    # "A GitHub token has...", "An OpenAI API key has...": as the label is said.
    a_label = with_article(label)
    opening = a_label[0].upper() + a_label[1:]
    if not secret:
        raise InvalidSecret(f"Enter your {label}.")
    if len(secret) < credential_type.min_length:
        raise InvalidSecret(f"{opening} has at least {credential_type.min_length} characters.")
    if len(secret) > credential_type.max_length:
        raise InvalidSecret(f"{opening} has at most {credential_type.max_length} characters.")
    if _CONTROL.search(secret):
        raise InvalidSecret(f"{opening} has no line breaks, tabs or other control "
                            "characters. Copy just the key and try again.")
    if credential_type.pattern is not None and not credential_type.pattern.fullmatch(secret):
        raise InvalidSecret(f"This does not look like {a_label}. Check that you copied the "
                            "whole key, with nothing before or after it.")


def hint_of(credential_type: CredentialType, secret: str) -> str | None:
    """The last few characters, for the user and the MCP server to recognise the key.

    None where the type keeps no hint: its keys' tails are told to nobody.
    """
    if not credential_type.hint:
        return None
    if len(secret) <= HINT_TAIL * 3:
        return "…"
    return "…" + secret[-HINT_TAIL:]


class CredentialUnreadable(GatewayError):
    status = 500
    code = "credential-unreadable"
    title = "The credential cannot be opened"


class ReconnectRequired(Conflict):
    """The provider refused to refresh the connection: only its user can mend it."""

    code = "reconnect-required"
    title = "The user must connect the account again"


class AlreadyRevoked(Conflict):
    def __init__(self) -> None:
        super().__init__("this credential was revoked already")


class CaptureRaced(Conflict):
    """Another capture stored its key while this one ran: for the same owner, or for the
    same elicitation (another tab). Run the whole transaction again."""

    def __init__(self) -> None:
        super().__init__("this key could not be stored while other keys of the same kind were "
                         "being stored for you; submit it again")


class Reason(StrEnum):
    """Why a credential was revoked, as its audit row and its webhook event say."""

    USER = "user"  # on /account
    CLIENT = "client"  # through the API
    OPERATOR = "operator"  # with the CLI
    SUPERSEDED = "superseded"  # the user stored a new one
    REFRESH_FAILED = "refresh-failed"  # the provider refused to refresh a connection


# How many times a capture runs again when another capture for the same
# owner committed first: each rerun means another key was stored meanwhile.
OWNER_RACES: Final = 5


def binding(credential: Credential) -> bytes:
    """The associated data that ties a credential's ciphertext to its row."""
    return _binding(credential.id, credential.client_id, credential.subject_iss,
                    credential.subject_sub, credential.type)


def _binding(credential_id: str, client_id: str, subject_iss: str, subject_sub: str,
             type_id: str) -> bytes:
    return bind(purpose="credential", id=credential_id, client_id=client_id,
                subject_iss=subject_iss, subject_sub=subject_sub, type=type_id)


def seal_for(keyring: KeySource, elicitation: Elicitation, credential_type: CredentialType,
             secret: str, now: datetime) -> Credential:
    """The key checked and sealed for the elicitation's client and user; not stored yet."""
    check_shape(credential_type, secret)
    credential = Credential(
        id=new_id("cr_", 15), client_id=elicitation.client_id,
        subject_iss=elicitation.subject_iss, subject_sub=elicitation.subject_sub,
        type=credential_type.id, hint=hint_of(credential_type, secret),
        elicitation_id=elicitation.id, created_at=now, revoked_at=None)
    credential.seal(keyring, secret.encode(), binding(credential))
    return credential


def capture(session: Session, clock: Clock, elicitation: Elicitation, credential: Credential,
            *, actor: str, source_ip: str | None) -> Elicitation:
    """Store the sealed key and complete the elicitation, in the caller's transaction.

    ``elicitation`` is open and was read in this transaction. The owner's
    previous key is revoked (the MCP server must not go on using a key the
    user has replaced), every step is audited, and the completion's webhook
    event goes into the outbox. If the elicitation moved on meanwhile, the
    transition raises and the caller's transaction writes nothing.

    The database keeps one live key per owner and one key per elicitation:
    of two captures for one owner, or for one elicitation, at once, the
    second's key is refused once the first's is written, and this raises
    :class:`CaptureRaced`. Run the whole transaction again: it revokes the
    owner's key in turn, or finds the elicitation completed.
    """
    if credential.elicitation_id != elicitation.id:
        raise ValueError("the credential was sealed for another elicitation")
    if elicitation.status == Status.PENDING:
        lifecycle.transition(session, clock, elicitation, Status.OPENED, actor=actor,
                             source_ip=source_ip)
    connection = session.connection()
    # The revocations are written first: the unique index of live keys is
    # checked as each row is written, and would refuse the new key beside them.
    for previous in connection.execute(_LIVE_OF_OWNER, {
            "client_id": credential.client_id, "subject_iss": credential.subject_iss,
            "subject_sub": credential.subject_sub, "type": credential.type}).all():
        _revoke(session, clock, previous, actor=actor, source_ip=source_ip,
                reason=Reason.SUPERSEDED, details={"superseded_by": credential.id})
    try:
        connection.execute(_INSERT, _columns_of(credential))
    except IntegrityError as error:
        if not _lost_capture_race(error):
            raise
        raise CaptureRaced() from None
    audit.record(session, clock, actor=actor, action="credential.captured",
                 target=credential.id, source_ip=source_ip,
                 details={"client_id": credential.client_id, "type": credential.type,
                          "elicitation_id": elicitation.id})
    return lifecycle.transition(session, clock, elicitation, Status.COMPLETED, actor=actor,
                                source_ip=source_ip, details={"credential_id": credential.id},
                                event_data={"credential": summary(credential,
                                                                     asked=elicitation.scopes)})


# Built once: the statements of a capture, run on the transaction's connection.
_LIVE_OF_OWNER: Final = select(
    Credential.id, Credential.client_id, Credential.type, Credential.subject_iss,
    Credential.subject_sub,
).where(Credential.client_id == bindparam("client_id"),
        Credential.subject_iss == bindparam("subject_iss"),
        Credential.subject_sub == bindparam("subject_sub"),
        Credential.type == bindparam("type"), Credential.revoked_at.is_(None))
_INSERT: Final = insert(Credential)
_COLUMNS: Final = tuple((attribute.key, attribute.columns[0].key)
                        for attribute in inspect(Credential).column_attrs)


def _columns_of(credential: Credential) -> dict[str, Any]:
    """A new credential's values by column; a value not set is left to the column's default."""
    values = ((column, getattr(credential, attribute)) for attribute, column in _COLUMNS)
    return {column: value for column, value in values if value is not None}


def summary(credential: Credential, *, asked: list[str] | None = None) -> dict[str, Any]:
    """What a webhook event tells of a credential: never a secret or a token.

    For a connection: the account, the scopes granted, and those asked for
    that the provider did not grant.
    """
    described: dict[str, Any] = {"id": credential.id, "type": credential.type,
                                 "hint": credential.hint}
    if credential.kind == "oauth":
        granted = credential.scopes or []
        described.update(account=credential.account, scopes=granted,
                         missing_scopes=missing_scopes(asked, granted))
    return described


def missing_scopes(asked: list[str] | None, granted: list[str]) -> list[str]:
    """The scopes asked for that the provider did not grant."""
    return [scope for scope in asked or [] if scope not in granted]


def _lost_capture_race(error: IntegrityError) -> bool:
    """Whether the database refused a second live key for an owner, or a second key for an
    elicitation."""
    diagnostics = getattr(error.orig, "diag", None)  # PostgreSQL
    if diagnostics is not None:
        return diagnostics.constraint_name in (LIVE_OWNER_INDEX, ONE_KEY_PER_ELICITATION)
    # SQLite names the indexes' columns.
    return any(f"UNIQUE constraint failed: credentials.{column}" in str(error.orig)
               for column in ("client_id", "elicitation_id"))


def reveal_secret(keyring: KeySource, credential: Credential) -> str:
    """The plaintext key; call only to hand it to its owner's MCP server."""
    return reveal_plaintext(keyring, credential.envelope, binding(credential)).decode()


# --- the owning client's view ------------------------------------------------------


def represent(credential: Credential) -> dict[str, Any]:
    """A credential's metadata as the API shows it; never the secret."""
    oauth = credential.kind == "oauth"
    return {
        "id": credential.id,
        "type": credential.type,
        "kind": credential.kind,
        "hint": credential.hint,
        "status": "active" if credential.live else "revoked",
        "subject": {"iss": credential.subject_iss, "sub": credential.subject_sub},
        "elicitation_id": credential.elicitation_id,
        "created_at": timestamp(credential.created_at),
        "revoked_at": timestamp(credential.revoked_at),
        "revoked_reason": credential.revoked_reason,
        # An OAuth connection's account and granted scopes, so an MCP server
        # can tell connections apart without revealing (and refreshing) one.
        "account": credential.account if oauth else None,
        "scopes": (credential.scopes or []) if oauth else None,
    }


def get_for_client(session: Session, client_id: str, credential_id: str, *,
                   fresh: bool = False) -> Credential:
    """The client's credential; another client's is reported exactly like an unknown one.

    ``fresh`` reads the row again even when the session holds it already: a
    request that waits for another's change reads it in several transactions.
    """
    credential = session.get(Credential, credential_id, populate_existing=fresh)
    if credential is None or credential.client_id != client_id:
        raise NotFound(f"no credential {credential_id!r}")
    return credential


def list_for_client(session: Session, client_id: str, *, subject_iss: str | None,
                    subject_sub: str | None, type_id: str | None, include_revoked: bool,
                    cursor: str | None, limit: int) -> tuple[list[Credential], str | None]:
    """One page of the client's credentials, newest first, and the next cursor."""
    query = select(Credential).where(Credential.client_id == client_id)
    for column, value in ((Credential.subject_iss, subject_iss),
                          (Credential.subject_sub, subject_sub), (Credential.type, type_id)):
        if value is not None:
            query = query.where(column == value)
    if not include_revoked:
        query = query.where(Credential.revoked_at.is_(None))
    if cursor is not None:
        created_at, last_id = decode_cursor(cursor)
        query = query.where(or_(Credential.created_at < created_at,
                                and_(Credential.created_at == created_at,
                                     Credential.id < last_id)))
    rows = list(session.scalars(query.order_by(Credential.created_at.desc(),
                                               Credential.id.desc()).limit(limit + 1)))
    page = rows[:limit]
    more = len(rows) > limit and page
    return page, encode_cursor(page[-1].created_at, page[-1].id) if more else None


def reveal_for_client(
    session: Session, clock: Clock, keyring: KeySource, client_id: str, credential_id: str, *,
    actor: str, source_ip: str | None,
) -> tuple[Credential, str]:
    """The client's credential and its plaintext, for the owning MCP server; audited.

    The audit row is in the caller's transaction: the caller hands the
    plaintext out only once that transaction has committed, so a reveal that
    cannot be recorded hands out nothing.
    """
    credential = get_for_client(session, client_id, credential_id)
    require_live(credential)
    try:
        secret = reveal_secret(keyring, credential)
    except VaultError:
        raise unreadable(credential) from None
    record_reveal(session, clock, credential, actor=actor, source_ip=source_ip)
    return credential, secret


@dataclass(frozen=True, slots=True)
class RevealedKey:
    """An API key's plaintext for its owning MCP server, its reveal audited."""

    id: str
    type: str
    secret: str


def reveal_key(connection: Connection, clock: Clock, keyring: KeySource, client_id: str,
               credential_id: str, *, actor: str, source_ip: str | None) -> RevealedKey | None:
    """:func:`reveal_for_client` for an API key, on the transaction's connection.

    The reveal in the path of every tool call that uses a stored key: one
    statement built once reads the row, one writes the audit row. None for
    an OAuth connection, whose reveal may refresh it first.
    """
    row = connection.execute(_OF_CLIENT, {"id": credential_id,
                                          "client_id": client_id}).mappings().first()
    if row is None:
        raise NotFound(f"no credential {credential_id!r}")
    if row["kind"] == "oauth":
        return None
    _require_live(row["revoked_at"], row["revoked_reason"])
    envelope = Envelope(row["key_version"], row["wrapped_key"], row["nonce"], row["ciphertext"])
    try:
        secret = reveal_plaintext(keyring, envelope, _binding(
            row["id"], row["client_id"], row["subject_iss"], row["subject_sub"], row["type"]))
    except VaultError:
        raise _unreadable(row["id"], row["key_version"]) from None
    audit.record_on(connection, clock, actor=actor, action="credential.revealed",
                    target=row["id"], source_ip=source_ip,
                    details={"client_id": row["client_id"], "type": row["type"]})
    return RevealedKey(row["id"], row["type"], secret.decode())


_OF_CLIENT: Final = select(Credential.__table__).where(
    Credential.id == bindparam("id"), Credential.client_id == bindparam("client_id"))


def require_live(credential: Credential) -> None:
    """Refuse a revoked credential, saying what the MCP server should do about it."""
    _require_live(credential.revoked_at, credential.revoked_reason)


def _require_live(revoked_at: datetime | None, revoked_reason: str | None) -> None:
    if revoked_at is None:
        return
    if revoked_reason == Reason.REFRESH_FAILED:
        raise ReconnectRequired("the provider refused to refresh this connection; ask the "
                                "user to connect the account again")
    raise Conflict("this credential was revoked; ask the user for a new one")


def unreadable(credential: Credential) -> CredentialUnreadable:
    """The error, logged, of a credential whose envelope does not open with this keyring."""
    return _unreadable(credential.id, credential.key_version)


def _unreadable(credential_id: str, key_version: int) -> CredentialUnreadable:
    # Restored beside the wrong keyring, or a retired key version: nothing
    # the caller can fix.
    log.error("credential %s does not open with this keyring (sealed under key v%d)",
              credential_id, key_version)
    return CredentialUnreadable(
        "the gateway cannot open this credential with its keyring; its operator must "
        "restore the keyring it was sealed with (`gateway status` shows the key versions "
        "in use)")


def record_reveal(session: Session, clock: Clock, credential: Credential, *, actor: str,
                  source_ip: str | None) -> None:
    """Audit a reveal, in the transaction that must commit before the secret is handed out."""
    audit.record(session, clock, actor=actor, action="credential.revealed",
                 target=credential.id, source_ip=source_ip,
                 details={"client_id": credential.client_id, "type": credential.type})


def revoke(session: Session, clock: Clock, credential: Credential, *, actor: str,
           source_ip: str | None, reason: Reason,
           details: dict[str, Any] | None = None) -> Credential:
    """Revoke a credential, in the caller's transaction: it can no longer be revealed.

    Every revocation, whoever makes it, is audited and sends the owning
    client ``credential.revoked``, so an MCP server never goes on trusting
    a credential that is gone.
    """
    if not credential.live:
        raise AlreadyRevoked()
    now = _revoke(session, clock, credential, actor=actor, source_ip=source_ip, reason=reason,
                  details=details)
    # The object follows the row, without becoming a change of its own.
    set_committed_value(credential, "revoked_at", now)
    set_committed_value(credential, "revoked_reason", reason.value)
    return credential


class _Revocable(Protocol):
    """What a revocation needs of a credential: a stored object, or a row read for it."""

    @property
    def id(self) -> str: ...
    @property
    def client_id(self) -> str: ...
    @property
    def type(self) -> str: ...
    @property
    def subject_iss(self) -> str: ...
    @property
    def subject_sub(self) -> str: ...


def _revoke(session: Session, clock: Clock, credential: _Revocable, *, actor: str,
            source_ip: str | None, reason: Reason, details: dict[str, Any] | None) -> datetime:
    """The revocation's row change, audit row and webhook event; when it was revoked."""
    now = clock.now()
    session.connection().execute(_REVOKE, {"credential_id": credential.id, "at": now,
                                           "reason": reason.value})
    audit.record(session, clock, actor=actor, action="credential.revoked",
                 target=credential.id, source_ip=source_ip,
                 details={"client_id": credential.client_id, "type": credential.type,
                          "reason": reason.value, **(details or {})})
    outbox.enqueue(session, clock, credential.client_id,
                   clients.webhook_url_of(session, credential.client_id), "credential.revoked",
                   {"credential_id": credential.id, "type": credential.type,
                    "subject": {"iss": credential.subject_iss, "sub": credential.subject_sub},
                    "reason": reason.value})
    return now


_REVOKE: Final = update(Credential).where(Credential.id == bindparam("credential_id")).values(
    {Credential.revoked_at: bindparam("at"), Credential.revoked_reason: bindparam("reason")})


def list_for_subject(session: Session, subject_iss: str,
                     subject_sub: str) -> list[tuple[Credential, str]]:
    """A user's live credentials across clients, with each client's name, newest first."""
    rows = session.execute(
        select(Credential, Client.name).join(Client, Client.id == Credential.client_id)
        .where(Credential.subject_iss == subject_iss, Credential.subject_sub == subject_sub,
               Credential.revoked_at.is_(None))
        .order_by(Credential.created_at.desc()))
    return [(credential, name) for credential, name in rows]


def purge_revoked(session: Session, clock: Clock, older_than: timedelta, *, actor: str) -> int:
    """Delete revoked credentials (ciphertext and all) revoked before ``older_than`` ago."""
    cutoff = clock.now() - older_than
    ids = list(session.scalars(select(Credential.id).where(Credential.revoked_at < cutoff)))
    if ids:
        session.execute(delete(Credential).where(Credential.id.in_(ids)))
    audit.record(session, clock, actor=actor, action="credential.purged",
                 details={"count": len(ids), "revoked_before": timestamp(cutoff)})
    return len(ids)
