"""Capturing a key: check it, seal it, store it and complete the elicitation, at once.

The plaintext exists only in this request's memory: it is never logged,
never echoed back (not even in an error), and written only as ciphertext
bound to its row.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Final

from sqlalchemy import (
    Column,
    ColumnElement,
    Connection,
    Exists,
    FromClause,
    Insert,
    Select,
    String,
    Update,
    and_,
    bindparam,
    delete,
    exists,
    func,
    insert,
    or_,
    select,
    union_all,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gateway import changes, db
from gateway.audit import service as audit
from gateway.clients.models import Client
from gateway.clients.service import OwnedLookup
from gateway.clock import Clock
from gateway.credentials.catalog import CredentialType
from gateway.credentials.models import LIVE_OWNER_INDEX, Credential
from gateway.db import UTCDateTime
from gateway.elicitations import lifecycle
from gateway.elicitations.lifecycle import OPEN, Status
from gateway.elicitations.models import Elicitation, ElicitationSnapshot
from gateway.errors import Conflict, GatewayError, NotFound
from gateway.pagination import decode_cursor, encode_cursor, timestamp
from gateway.prepared import (
    Parameters,
    PreparedChange,
    prefixed,
    refuse_unless,
    row_parameters,
)
from gateway.tokens import new_id
from gateway.vault.envelope import Envelope, VaultError, bind, reveal_plaintext, seal
from gateway.vault.keyring import Keyring
from gateway.webhooks import outbox

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
    if not secret:
        raise InvalidSecret(f"Enter your {label}.")
    if len(secret) < credential_type.min_length:
        raise InvalidSecret(f"A {label} has at least {credential_type.min_length} characters.")
    if len(secret) > credential_type.max_length:
        raise InvalidSecret(f"A {label} has at most {credential_type.max_length} characters.")
    if _CONTROL.search(secret):
        raise InvalidSecret(f"A {label} has no line breaks, tabs or other control "
                            "characters. Copy just the key and try again.")
    if credential_type.pattern is not None and not credential_type.pattern.fullmatch(secret):
        raise InvalidSecret(f"This does not look like a {label}. Check that you copied the "
                            "whole key, with nothing before or after it.")


def hint_of(secret: str) -> str:
    """The last few characters, for the user and the MCP server to recognise the key."""
    if len(secret) <= HINT_TAIL * 3:
        return "…"
    return "…" + secret[-HINT_TAIL:]


class CredentialUnreadable(GatewayError):
    status = 500
    code = "credential-unreadable"
    title = "The credential cannot be opened"


@dataclass(frozen=True, slots=True)
class SealedCredential:
    """A credential as a reveal reads it: whose it is, and its envelope; no ORM object."""

    id: str
    client_id: str
    subject_iss: str
    subject_sub: str
    type: str
    revoked_at: datetime | None
    envelope: Envelope

    @property
    def live(self) -> bool:
        return self.revoked_at is None


def binding(credential: Credential | SealedCredential) -> bytes:
    """The associated data that ties a credential's ciphertext to its row."""
    return bind(purpose="credential", id=credential.id, client_id=credential.client_id,
                subject_iss=credential.subject_iss, subject_sub=credential.subject_sub,
                type=credential.type)


def seal_for(keyring: Keyring, elicitation: Elicitation | ElicitationSnapshot,
             credential_type: CredentialType, secret: str, now: datetime) -> Credential:
    """The key checked and sealed for the elicitation's client and user; not stored yet."""
    check_shape(credential_type, secret)
    credential = Credential(
        id=new_id("cr_", 15), client_id=elicitation.client_id,
        subject_iss=elicitation.subject_iss, subject_sub=elicitation.subject_sub,
        type=credential_type.id, hint=hint_of(secret), elicitation_id=elicitation.id,
        created_at=now, revoked_at=None)
    credential.envelope = seal(keyring, secret.encode(), binding(credential))
    return credential


def capture(clock: Clock, elicitation: Elicitation | ElicitationSnapshot,
            credential: Credential, *, actor: str, source_ip: str | None) -> bool:
    """Store the sealed key and complete the elicitation, as one change.

    ``elicitation`` is as the caller read it, still open. The change is made
    only if it is still in the status read and its time is not up: False,
    with nothing written, when it has moved on meanwhile (ended, opened in
    another tab, or expired while a live check ran), and the caller reads
    it again.

    In the same change: a still-pending elicitation is recorded as opened
    first, the owner's previous key is revoked (the MCP server must not go
    on using a key the user has replaced), every step is audited, and the
    completion's webhook event goes into the outbox if the client takes
    webhooks. The change is one statement on the request's autocommit
    connection, so it is its own transaction. Of two captures for one owner
    at once, the database refuses the second's key while the first's is
    live; the second then runs again and revokes it.
    """
    if credential.elicitation_id != elicitation.id:
        raise ValueError("the credential was sealed for another elicitation")
    if elicitation.status not in OPEN:
        raise lifecycle.IllegalTransition(
            f"an elicitation that is {elicitation.status} cannot become completed",
            elicitation_status=elicitation.status)
    completed = replace(ElicitationSnapshot.of(elicitation), status=Status.COMPLETED.value)
    summary = {"id": credential.id, "type": credential.type, "hint": credential.hint}

    def event(action: str, target: str | None, **details: Any) -> dict[str, Any]:
        return audit.event_row(clock, actor=actor, action=action, target=target,
                               source_ip=source_ip,
                               details={"client_id": credential.client_id, **details})

    rows = {
        "credential": {column.key: getattr(credential, column.key)
                       for column in _CREDENTIALS.columns},
        "opened": event("elicitation.opened", elicitation.id, **{"from": Status.PENDING.value}),
        "completed": event("elicitation.completed", elicitation.id,
                           credential_id=credential.id, **{"from": Status.OPENED.value}),
        # One row per key this one replaces: the statement fills in its id.
        "superseded": event("credential.revoked", None, type=credential.type,
                            reason="superseded", superseded_by=credential.id),
        "captured": event("credential.captured", credential.id, type=credential.type,
                          elicitation_id=elicitation.id),
        "event": outbox.event_row(clock, credential.client_id, "elicitation.completed",
                                  lifecycle.event_data(completed, {"credential": summary}),
                                  elicitation_id=elicitation.id),
    }
    parameters = {"elicitation_id": elicitation.id, "from_status": elicitation.status,
                  "at": clock.now(), **prefixed(rows)}
    for _ in range(_OWNER_RACES):
        try:
            return _CAPTURED.run(db.autocommit(), parameters)
        except IntegrityError as error:
            # The database keeps one live key per owner: another capture for
            # the same owner committed its key while this one ran, so this
            # one wrote nothing. Run again, now revoking that key.
            if not _another_live_key(error):
                raise
    raise Conflict("this key could not be stored while other keys of the same kind were "
                   "being stored for you; submit it again")


# How many times a capture runs again when another capture for the same
# owner committed first: each rerun means another key was stored meanwhile.
_OWNER_RACES: Final = 5


def _another_live_key(error: IntegrityError) -> bool:
    """Whether the error is the database refusing a second live key for an owner."""
    diagnostics = getattr(error.orig, "diag", None)  # PostgreSQL
    if diagnostics is not None:
        return bool(diagnostics.constraint_name == LIVE_OWNER_INDEX)
    # SQLite names the index's columns.
    return "UNIQUE constraint failed: credentials.client_id" in str(error.orig)


_CREDENTIALS: Final = Credential.metadata.tables[Credential.__tablename__]
_ELICITATIONS: Final = Elicitation.metadata.tables[Elicitation.__tablename__]
_CLIENTS: Final = Client.metadata.tables[Client.__tablename__]
# The parts of a capture, each a row of its table, in its parameters' names.
_PARTS: Final = {"credential": _CREDENTIALS, "opened": audit.TABLE, "completed": audit.TABLE,
                 "superseded": audit.TABLE, "captured": audit.TABLE, "event": outbox.TABLE}


def _completes(parameters: Parameters) -> Update:
    """The elicitation completed, and stamped opened if it was still pending."""
    elicitations = _ELICITATIONS.c
    return update(_ELICITATIONS).values(
        status=Status.COMPLETED.value,
        opened_at=func.coalesce(elicitations.opened_at, parameters["at"]),
        ended_at=parameters["at"])


def _still_as_read(parameters: Parameters) -> list[ColumnElement[bool]]:
    """The guard: the elicitation in the status read, and its time not up."""
    return [_ELICITATIONS.c.id == parameters["elicitation_id"],
            _ELICITATIONS.c.status == parameters["from_status"],
            _ELICITATIONS.c.expires_at > parameters["at"]]


def _owners_live_keys(parameters: Parameters) -> list[ColumnElement[bool]]:
    credentials = _CREDENTIALS.c
    return [credentials.client_id == parameters["credential__client_id"],
            credentials.subject_iss == parameters["credential__subject_iss"],
            credentials.subject_sub == parameters["credential__subject_sub"],
            credentials.type == parameters["credential__type"],
            credentials.revoked_at.is_(None)]


def _takes_webhooks(parameters: Parameters) -> Exists:
    return exists(select(_CLIENTS.c.id).where(
        _CLIENTS.c.id == parameters["credential__client_id"], _CLIENTS.c.webhook_url != ""))


def _added(parameters: Parameters, part: str, *where: ColumnElement[bool],
           source: FromClause | None = None, **given: ColumnElement[Any]) -> Insert:
    """``INSERT INTO <part's table> SELECT <its row> [FROM source] [WHERE …]``."""
    table = _PARTS[part]
    row = parameters.row(table, part, **given)
    query = select(*row.values()).where(*where)
    if source is not None:
        query = query.select_from(source)
    return insert(table).from_select(list(row), query)


def _captured_postgresql(parameters: Parameters) -> Select[Any]:
    """The capture as a WITH chain, every step made only if the elicitation moved."""
    moved = (_completes(parameters).where(*_still_as_read(parameters))
             .returning(_ELICITATIONS.c.id).cte("moved"))
    # Sibling statements see the database as it was before this one: the
    # keys revoked here are the owner's live keys, never the one added.
    superseded = (update(_CREDENTIALS).where(*_owners_live_keys(parameters),
                                             exists(select(moved.c.id)))
                  .values(revoked_at=parameters["at"]).returning(_CREDENTIALS.c.id)
                  .cte("superseded"))
    steps = [
        _added(parameters, "opened", parameters["from_status"] == Status.PENDING.value,
               source=moved),
        _added(parameters, "completed", source=moved),
        _added(parameters, "superseded", source=superseded, target=superseded.c.id),
        # After the revocation: the index of live keys is checked as each
        # row is written, and would refuse the new key while the old one is
        # still live. Reading the revoked keys' ids makes that UPDATE run first.
        _added(parameters, "credential", _count(superseded) >= 0, source=moved),
        _added(parameters, "captured", source=moved),
        _added(parameters, "event", _takes_webhooks(parameters), source=moved),
    ]
    # Long-polls and the webhook dispatcher are told when the change commits.
    notified = union_all(*(select(func.pg_notify(changes.CHANNEL, topic)).select_from(moved)
                           for topic in (lifecycle.CHANGE_TOPIC, outbox.CHANGE_TOPIC))
                         ).cte("notified")
    statement = select(moved.c.id, _count(notified).label("notified"))
    for number, step in enumerate(steps):
        statement = statement.add_cte(step.cte(f"step_{number}"))
    return statement


def _count(rows: FromClause) -> ColumnElement[int]:
    return select(func.count()).select_from(rows).scalar_subquery()


def _captured_sqlite(parameters: Parameters) -> list[Any]:
    """The capture as a trigger's statements, in order, after its guard."""
    return [
        refuse_unless(exists(select(_ELICITATIONS.c.id).where(*_still_as_read(parameters)))),
        _completes(parameters).where(_ELICITATIONS.c.id == parameters["elicitation_id"]),
        _added(parameters, "opened", parameters["from_status"] == Status.PENDING.value),
        _added(parameters, "completed"),
        # Recorded before they are revoked: afterwards they are not told
        # from the owner's keys revoked before.
        _added(parameters, "superseded", *_owners_live_keys(parameters), source=_CREDENTIALS,
               target=_CREDENTIALS.c.id),
        update(_CREDENTIALS).where(*_owners_live_keys(parameters))
        .values(revoked_at=parameters["at"]),
        _added(parameters, "credential"),
        _added(parameters, "captured"),
        _added(parameters, "event", _takes_webhooks(parameters)),
    ]


_CAPTURED: Final = PreparedChange(
    "credential_captured",
    [Column("elicitation_id", String), Column("from_status", String),
     Column("at", UTCDateTime),
     *row_parameters(*_PARTS.values(), prefixes=list(_PARTS))],
    postgresql=_captured_postgresql, sqlite=_captured_sqlite)


def reveal_secret(keyring: Keyring, credential: Credential | SealedCredential) -> str:
    """The plaintext key; call only to hand it to its owner's MCP server."""
    return reveal_plaintext(keyring, credential.envelope, binding(credential)).decode()


# --- the owning client's view ------------------------------------------------------


def represent(credential: Credential) -> dict[str, Any]:
    """A credential's metadata as the API shows it; never the secret."""
    return {
        "id": credential.id,
        "type": credential.type,
        "hint": credential.hint,
        "status": "active" if credential.live else "revoked",
        "subject": {"iss": credential.subject_iss, "sub": credential.subject_sub},
        "elicitation_id": credential.elicitation_id,
        "created_at": timestamp(credential.created_at),
        "revoked_at": timestamp(credential.revoked_at),
    }


def get_for_client(session: Session, client_id: str, credential_id: str) -> Credential:
    """The client's credential; another client's is reported exactly like an unknown one."""
    credential = session.get(Credential, credential_id)
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


def reveal_for_client(connection: Connection, clock: Clock, keyring: Keyring, row: Any | None,
                      credential_id: str, *, actor: str,
                      source_ip: str | None) -> tuple[SealedCredential, str]:
    """The client's credential and its plaintext, for the owning MCP server; audited.

    ``row`` is what :data:`OWN_SEALED` found for the client's token: None
    for an unknown credential or another client's. ``connection`` is an
    autocommit one (:func:`gateway.db.autocommit`): the reveal changes one
    row, its audit event, which is committed before the plaintext is
    returned. A reveal that cannot be recorded hands out nothing.
    """
    if row is None:
        raise NotFound(f"no credential {credential_id!r}")
    credential = SealedCredential(
        row.id, row.client_id, row.subject_iss, row.subject_sub, row.type, row.revoked_at,
        Envelope(row.key_version, row.wrapped_key, row.nonce, row.ciphertext))
    if not credential.live:
        raise Conflict("this credential was revoked; ask the user for a new one")
    try:
        secret = reveal_secret(keyring, credential)
    except VaultError:
        # The keyring does not open what was sealed: restored beside the
        # wrong keyring, or a retired key version. Nothing the caller can fix.
        log.error("credential %s does not open with this keyring (sealed under key v%d)",
                  credential.id, credential.envelope.key_version)
        raise CredentialUnreadable(
            "the gateway cannot open this credential with its keyring; its operator must "
            "restore the keyring it was sealed with (`gateway status` shows the key versions "
            "in use)") from None
    audit.record(connection, clock, actor=actor, action="credential.revealed",
                 target=credential.id, source_ip=source_ip,
                 details={"client_id": credential.client_id, "type": credential.type})
    return credential, secret


# The columns the vault needs, read with the API's token check in one
# statement (see gateway.web.api.looks_up): this runs on every reveal, and
# loads no ORM object.
OWN_SEALED: Final = OwnedLookup(select(
    _CREDENTIALS.c.id, _CREDENTIALS.c.client_id, _CREDENTIALS.c.subject_iss,
    _CREDENTIALS.c.subject_sub, _CREDENTIALS.c.type, _CREDENTIALS.c.revoked_at,
    _CREDENTIALS.c.key_version, _CREDENTIALS.c.wrapped_key, _CREDENTIALS.c.nonce,
    _CREDENTIALS.c.ciphertext,
).where(_CREDENTIALS.c.id == bindparam("credential_id")))


def revoke(session: Session, clock: Clock, credential: Credential, *, actor: str,
           source_ip: str | None) -> Credential:
    """Revoke a credential: it can no longer be revealed."""
    if not credential.live:
        raise Conflict("this credential was revoked already")
    credential.revoked_at = clock.now()
    audit.record(session, clock, actor=actor, action="credential.revoked",
                 target=credential.id, source_ip=source_ip,
                 details={"client_id": credential.client_id, "type": credential.type})
    return credential


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
