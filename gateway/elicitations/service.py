"""Creating, reading, listing and cancelling elicitations for a client.

The caller runs each function inside one transaction (``db.transaction()``);
every state change happens through :mod:`gateway.elicitations.lifecycle`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from sqlalchemy import Connection, and_, bindparam, or_, select
from sqlalchemy.orm import Session

from gateway.audit import service as audit
from gateway.clients.models import ClientIdentity
from gateway.clients.service import OwnedLookup
from gateway.clock import Clock
from gateway.credentials.catalog import Catalog
from gateway.db import UTCDateTime
from gateway.elicitations import lifecycle
from gateway.elicitations.lifecycle import OPEN, Status
from gateway.elicitations.models import Elicitation, ElicitationSnapshot, IdempotencyRecord
from gateway.elicitations.schemas import (
    ELICITATION_ID,
    CreateApiKeyElicitation,
    CreatePaymentElicitation,
)
from gateway.errors import Conflict, GatewayError, InvalidInput, NotFound
from gateway.pagination import decode_cursor, encode_cursor, timestamp
from gateway.prepared import PreparedInserts, PreparedSelect, PreparedWrite, insert_into
from gateway.tokens import new_id

MAX_PAGE: Final = 100
# How long an Idempotency-Key is remembered; a retry after that creates anew.
IDEMPOTENCY_WINDOW: Final = timedelta(hours=24)
SYSTEM_ACTOR: Final = "system:expiry"
_ELICITATION_ID: Final = re.compile(ELICITATION_ID)


class PaymentsNotConfigured(GatewayError):
    status = 422
    code = "payments-not-configured"
    title = "Payments are not configured"


class IdempotencyConflict(Conflict):
    code = "idempotency-key-reused"
    title = "Idempotency-Key reused"


@dataclass(frozen=True, slots=True)
class Caller:
    """Who asks, for the audit trail."""

    client: ClientIdentity
    source_ip: str | None

    @property
    def actor(self) -> str:
        return f"client:{self.client.id}"


@dataclass(frozen=True, slots=True)
class Outcome:
    """The answer to a create: its HTTP status and body (replayed for retries)."""

    status_code: int
    body: dict[str, Any]


Create = CreateApiKeyElicitation | CreatePaymentElicitation


# --- create ----------------------------------------------------------------------


def create(
    connection: Connection, clock: Clock, caller: Caller, request: Create, *,
    catalog: Catalog, payments_enabled: bool, public_url: str,
    idempotency_key: str | None, request_digest: str,
) -> Outcome:
    """Create an elicitation, or return the one a retry or a reuse refers to.

    The new elicitation, its audit event and its idempotency record are
    one statement (see :class:`gateway.prepared.PreparedInserts`): on an
    autocommit ``connection``, as the API runs it, a change committed as it
    runs; on one in a transaction, part of it. The reads before it would
    take no lock inside a transaction either: a retry racing its twin
    with the same Idempotency-Key fails on the key's unique constraint (the
    caller then replays the twin's answer), and two identical creates at
    the same instant may both create, as they could in a transaction.
    """
    if idempotency_key is not None:
        replay = _replay(connection, clock, caller.client, idempotency_key, request_digest)
        if replay is not None:
            return replay
    _check_allowed(caller.client, request, catalog, payments_enabled)
    now = clock.now()
    existing = (_reusable(connection, caller.client, request, now)
                if request.reuse_pending else None)
    if existing is not None:
        outcome = Outcome(200, represent(existing, public_url, now))
        if idempotency_key is not None:
            _REMEMBER.run(connection, _remembered(caller, idempotency_key, request_digest,
                                                   outcome, now))
        return outcome
    created = _new(caller, request, now)
    outcome = Outcome(201, represent(created, public_url, now))
    rows = {
        _TABLE.name: _row_of(created),
        audit.TABLE.name: audit.event_row(
            clock, actor=caller.actor, action="elicitation.created", target=created.id,
            source_ip=caller.source_ip,
            details={"client_id": caller.client.id, "kind": request.kind,
                     "credential_type": created.credential_type,
                     "ttl_seconds": request.ttl_seconds}),
    }
    if idempotency_key is None:
        _CREATED.run(connection, rows)
    else:
        rows[_IDEMPOTENCY.name] = _remembered(caller, idempotency_key, request_digest,
                                              outcome, now)
        _CREATED_REMEMBERED.run(connection, rows)
    return outcome


def request_digest(body: bytes) -> str:
    """Fingerprint of a request body, for Idempotency-Key comparisons."""
    return hashlib.sha256(body).hexdigest()


def _replay(connection: Connection, clock: Clock, client: ClientIdentity, key: str,
            digest: str) -> Outcome | None:
    record = _RECORD.first(connection, {"client_id": client.id, "key": key})
    if record is None:
        return None
    if clock.now() - record.created_at > IDEMPOTENCY_WINDOW:
        # Forgotten: the key may name a new request now.
        _FORGET.run(connection, {"id": record.id})
        return None
    if record.request_digest != digest:
        raise IdempotencyConflict("this Idempotency-Key was used with a different request "
                                  "body; use a new key for a new request")
    return Outcome(record.status_code, record.response)


def _remembered(caller: Caller, key: str, digest: str, outcome: Outcome,
                now: datetime) -> dict[str, Any]:
    return {"client_id": caller.client.id, "key": key, "request_digest": digest,
            "status_code": outcome.status_code, "response": outcome.body, "created_at": now}


def _check_allowed(client: ClientIdentity, request: Create, catalog: Catalog,
                   payments_enabled: bool) -> None:
    if isinstance(request, CreatePaymentElicitation):
        if not payments_enabled:
            raise PaymentsNotConfigured("this gateway takes no payments: its operator has not "
                                        "set GATEWAY_STRIPE_SECRET_KEY")
        return
    type_id = request.credential_type
    if type_id not in catalog:
        raise InvalidInput(f"unknown credential_type {type_id!r}; this gateway knows "
                           f"{', '.join(catalog.ids)}", field="credential_type")
    if not client.may_use(type_id):
        raise InvalidInput(f"this client may not ask for credential_type {type_id!r}; it may "
                           f"ask for {', '.join(client.credential_types)}",
                           field="credential_type")


def _reusable(connection: Connection, client: ClientIdentity, request: Create,
              now: datetime) -> ElicitationSnapshot | None:
    rows = connection.execute(_REUSABLE, {
        "client_id": client.id, "subject_iss": request.subject.iss,
        "subject_sub": request.subject.sub, "kind": request.kind, "now": now})
    # Newest first, sorted here rather than in SQL: an ORDER BY created_at
    # leads SQLite's planner to the (client_id, created_at) index, which scans
    # every elicitation the client ever made instead of the few of one subject.
    payment = _payment_fields(request)
    candidates = sorted((ElicitationSnapshot(**row._asdict()) for row in rows),
                        key=lambda e: e.created_at, reverse=True)
    for candidate in candidates:
        if candidate.credential_type == _credential_type(request) and \
                candidate.payment == payment:
            return candidate
    return None


def _new(caller: Caller, request: Create, now: datetime) -> ElicitationSnapshot:
    return ElicitationSnapshot(
        # 144 random bits: the id is the URL, so it must not be guessable.
        id=new_id("el_", 18),
        client_id=caller.client.id,
        subject_iss=request.subject.iss,
        subject_sub=request.subject.sub,
        kind=request.kind,
        credential_type=_credential_type(request),
        payment=_payment_fields(request),
        message=request.message,
        metadata_=request.metadata,
        status=Status.PENDING.value,
        created_at=now,
        expires_at=now + timedelta(seconds=request.ttl_seconds),
        opened_at=None,
        ended_at=None,
    )


def _row_of(elicitation: ElicitationSnapshot) -> dict[str, Any]:
    values = {field: getattr(elicitation, field) for field in _SNAPSHOT_FIELDS}
    values["metadata"] = values.pop("metadata_")
    return values


def _credential_type(request: Create) -> str | None:
    return request.credential_type if isinstance(request, CreateApiKeyElicitation) else None


def _payment_fields(request: Create) -> dict[str, Any] | None:
    if isinstance(request, CreatePaymentElicitation):
        return request.payment.model_dump(mode="json")
    return None


# --- read, list, cancel -------------------------------------------------------------


def get(session: Session, clock: Clock, client: ClientIdentity, elicitation_id: str) -> Elicitation:
    """The client's elicitation, expired first if its time is up.

    Another client's elicitation is reported exactly like an unknown one.
    """
    elicitation = _load(session, elicitation_id)
    if elicitation is None or elicitation.client_id != client.id:
        raise NotFound(f"no elicitation {elicitation_id!r}")
    expire_if_overdue(session, clock, elicitation)
    return elicitation


def peek(connection: Connection, client: ClientIdentity,
         elicitation_id: str) -> ElicitationSnapshot:
    """The client's elicitation as stored, read without loading an ORM object.

    Unlike :func:`get` it leaves an overdue elicitation as it is; the caller
    checks :func:`lifecycle.is_overdue` and calls :func:`get` to mark it.
    """
    elicitation = peek_any(connection, elicitation_id)
    if elicitation is None or elicitation.client_id != client.id:
        raise NotFound(f"no elicitation {elicitation_id!r}")
    return elicitation


def peek_any(connection: Connection, elicitation_id: str) -> ElicitationSnapshot | None:
    """Any client's elicitation as stored, for the portal, which checks whose it is."""
    if not _ELICITATION_ID.fullmatch(elicitation_id):
        return None
    row = _PEEK.first(connection, {"id": elicitation_id})
    return None if row is None else ElicitationSnapshot(**row._asdict())


def snapshot_of(row: Any | None, elicitation_id: str) -> ElicitationSnapshot:
    """The elicitation a read found (by :data:`OWN_ELICITATION`), or NotFound."""
    if row is None:
        raise NotFound(f"no elicitation {elicitation_id!r}")
    return ElicitationSnapshot(**row._asdict())


_TABLE: Final = Elicitation.metadata.tables[Elicitation.__tablename__]
_COLUMNS: Final = _TABLE.c
_SNAPSHOT_FIELDS: Final = tuple(field.name for field in dataclasses.fields(ElicitationSnapshot))
# Built once; the labels are ElicitationSnapshot's field names.
_PEEK_ANY: Final = select(*(
    _COLUMNS.metadata.label(name) if name == "metadata_" else _COLUMNS[name]
    for name in _SNAPSHOT_FIELDS
))
_BY_ID: Final = _PEEK_ANY.where(_COLUMNS.id == bindparam("id"))
_PEEK: Final = PreparedSelect(_BY_ID)
# The same read, joined to the API's token check: a read of the API costs one
# statement (see gateway.web.api.looks_up).
OWN_ELICITATION: Final = OwnedLookup(_BY_ID)
_IDEMPOTENCY: Final = IdempotencyRecord.metadata.tables[IdempotencyRecord.__tablename__]
_CREATED: Final = PreparedInserts("elicitation_created", _TABLE, audit.TABLE)
_CREATED_REMEMBERED: Final = PreparedInserts(
    "elicitation_created_remembered", _TABLE, audit.TABLE, _IDEMPOTENCY)
_REMEMBER: Final = PreparedWrite(insert_into(_IDEMPOTENCY))
_RECORD: Final = PreparedSelect(select(_IDEMPOTENCY).where(
    _IDEMPOTENCY.c.client_id == bindparam("client_id"), _IDEMPOTENCY.c.key == bindparam("key")))
_FORGET: Final = PreparedWrite(_IDEMPOTENCY.delete().where(_IDEMPOTENCY.c.id == bindparam("id")))
# Still-open elicitations of one client, subject and kind, for the reuse rule.
_REUSABLE: Final = _PEEK_ANY.where(
    _COLUMNS.client_id == bindparam("client_id"),
    _COLUMNS.subject_iss == bindparam("subject_iss"),
    _COLUMNS.subject_sub == bindparam("subject_sub"),
    _COLUMNS.kind == bindparam("kind"),
    _COLUMNS.status.in_([s.value for s in OPEN]),
    _COLUMNS.expires_at > bindparam("now", type_=UTCDateTime),
)


def _load(session: Session, elicitation_id: str) -> Elicitation | None:
    # An id the gateway cannot have minted names nothing, and is not sent to
    # the database: PostgreSQL answers a NUL in it with an error, not a miss.
    if not _ELICITATION_ID.fullmatch(elicitation_id):
        return None
    return session.get(Elicitation, elicitation_id)


def expire_if_overdue(session: Session, clock: Clock, elicitation: Elicitation) -> bool:
    """Mark an open elicitation whose time is up as expired; whether it did."""
    if not lifecycle.is_overdue(elicitation, clock.now()):
        return False
    try:
        lifecycle.transition(session, clock, elicitation, Status.EXPIRED, actor=SYSTEM_ACTOR)
    except lifecycle.IllegalTransition:
        return False  # another request ended it first; its state stands
    return True


def expire_overdue(session: Session, clock: Clock, *, client_id: str | None = None,
                   limit: int = 500) -> int:
    """Expire open elicitations whose time is up (all, or one client's); how many."""
    query = select(Elicitation).where(
        Elicitation.status.in_([s.value for s in OPEN]),
        Elicitation.expires_at <= clock.now(),
    ).limit(limit)
    if client_id is not None:
        query = query.where(Elicitation.client_id == client_id)
    return sum(expire_if_overdue(session, clock, e) for e in session.scalars(query).all())


@dataclass(frozen=True, slots=True)
class Filters:
    """What a listing is narrowed to."""

    status: str | None = None
    kind: str | None = None
    subject_iss: str | None = None
    subject_sub: str | None = None


def list_page(session: Session, clock: Clock, client_id: str | None, filters: Filters,
              cursor: str | None, limit: int) -> tuple[list[Elicitation], str | None]:
    """One page of elicitations (one client's, or all), newest first, and the next cursor."""
    expire_overdue(session, clock, client_id=client_id)
    query = select(Elicitation)
    if client_id is not None:
        query = query.where(Elicitation.client_id == client_id)
    for column, value in ((Elicitation.status, filters.status),
                          (Elicitation.kind, filters.kind),
                          (Elicitation.subject_iss, filters.subject_iss),
                          (Elicitation.subject_sub, filters.subject_sub)):
        if value is not None:
            query = query.where(column == value)
    if cursor is not None:
        created_at, last_id = decode_cursor(cursor)
        query = query.where(or_(
            Elicitation.created_at < created_at,
            and_(Elicitation.created_at == created_at, Elicitation.id < last_id)))
    query = query.order_by(Elicitation.created_at.desc(), Elicitation.id.desc())
    rows = list(session.scalars(query.limit(limit + 1)))
    page = rows[:limit]
    more = len(rows) > limit
    return page, encode_cursor(page[-1].created_at, page[-1].id) if more and page else None


def cancel(session: Session, clock: Clock, elicitation: Elicitation, *, actor: str,
           source_ip: str | None = None) -> Elicitation:
    """Cancel an open elicitation; its link stops working at once."""
    expire_if_overdue(session, clock, elicitation)
    return lifecycle.transition(session, clock, elicitation, Status.CANCELLED,
                                actor=actor, source_ip=source_ip)


def find(session: Session, clock: Clock, elicitation_id: str) -> Elicitation:
    """Any client's elicitation, for the operator; expired first if its time is up."""
    elicitation = _load(session, elicitation_id)
    if elicitation is None:
        raise NotFound(f"no elicitation {elicitation_id!r}")
    expire_if_overdue(session, clock, elicitation)
    return elicitation


# --- representation -----------------------------------------------------------------


def url_of(elicitation_id: str, public_url: str) -> str:
    """The link the user opens: the id and nothing else (no PII, no credential)."""
    return f"{public_url}/e/{elicitation_id}"


def represent(elicitation: Elicitation | ElicitationSnapshot, public_url: str,
              now: datetime) -> dict[str, Any]:
    """The API's JSON view of an elicitation."""
    url = url_of(elicitation.id, public_url)
    status = Status.EXPIRED.value if lifecycle.is_overdue(elicitation, now) \
        else elicitation.status
    return {
        "id": elicitation.id,
        "url": url,
        "status": status,
        "kind": elicitation.kind,
        "credential_type": elicitation.credential_type,
        "payment": elicitation.payment,
        "subject": {"iss": elicitation.subject_iss, "sub": elicitation.subject_sub},
        "message": elicitation.message,
        "metadata": elicitation.metadata_,
        "created_at": timestamp(elicitation.created_at),
        "expires_at": timestamp(elicitation.expires_at),
        "opened_at": timestamp(elicitation.opened_at),
        "ended_at": timestamp(elicitation.ended_at),
        # ElicitRequestURLParams, ready to send as is (MCP 2025-11-25).
        "mcp": {"mode": "url", "message": elicitation.message, "url": url,
                "elicitationId": elicitation.id},
    }
