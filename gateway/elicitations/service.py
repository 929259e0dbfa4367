"""Creating, reading, listing and cancelling elicitations for a client.

Each function runs on the session (or connection) its caller hands it, in the
caller's unit of work (a view's ``db.transaction()``, a command's or the
worker's ``db.unit_of_work``); none begins or ends a transaction. Every state
change happens through :mod:`gateway.elicitations.lifecycle`.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from sqlalchemy import Connection, RowMapping, and_, bindparam, insert, or_, select
from sqlalchemy.orm import Session

from gateway.audit import service as audit
from gateway.clients.models import ClientIdentity
from gateway.clients.service import token_check_joined
from gateway.clock import Clock
from gateway.credentials.catalog import Catalog
from gateway.elicitations import lifecycle
from gateway.elicitations.lifecycle import OPEN, Status
from gateway.elicitations.models import Elicitation, IdempotencyRecord
from gateway.elicitations.schemas import (
    ELICITATION_ID,
    CreateApiKeyElicitation,
    CreateOAuthElicitation,
    CreatePaymentElicitation,
)
from gateway.errors import Conflict, GatewayError, InvalidInput, NotFound
from gateway.identity.sessions import Subject
from gateway.pagination import decode_cursor, encode_cursor, timestamp
from gateway.tokens import new_id

MAX_PAGE: Final = 100
# How long an Idempotency-Key is remembered; a retry after that creates anew.
IDEMPOTENCY_WINDOW: Final = timedelta(hours=24)
SYSTEM_ACTOR: Final = "system:expiry"
_ELICITATION_ID: Final = re.compile(ELICITATION_ID)
# What a type of the other kind is, said to a create that named it with the wrong kind.
_OTHER_KIND: Final = {"oauth": " (an OAuth connection: ask with kind oauth)",
                      "api_key": " (an API key: ask with kind api_key)"}


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


Create = CreateApiKeyElicitation | CreateOAuthElicitation | CreatePaymentElicitation


# --- create ----------------------------------------------------------------------


def create(
    session: Session, clock: Clock, caller: Caller, request: Create, *,
    catalog: Catalog, payments_enabled: bool, public_url: str,
    idempotency_key: str | None, request_digest: str,
) -> Outcome:
    """Create an elicitation, or return the one a retry or a reuse refers to.

    In the caller's transaction. A retry racing its twin with the same
    Idempotency-Key fails on the key's unique constraint when it commits;
    run again, it replays the twin's answer.
    """
    if idempotency_key is not None:
        replay = _replay(session, clock, caller.client, idempotency_key, request_digest)
        if replay is not None:
            return replay
    _check_allowed(caller.client, request, catalog, payments_enabled)
    scopes = _scopes_asked(request, catalog)
    now = clock.now()
    existing = _reusable(session, caller.client, request, scopes, now) \
        if request.reuse_pending else None
    connection = session.connection()
    if existing is not None:
        outcome = Outcome(200, represent(existing, public_url, now))
    else:
        created = _new(caller, request, scopes, now)
        # Inserted by statements built once; the row is not tracked by the
        # session, as nothing in this transaction changes it again.
        connection.execute(_INSERT_ELICITATION, _columns_of(created))
        audit.record_on(connection, clock, actor=caller.actor, action="elicitation.created",
                        target=created.id, source_ip=caller.source_ip,
                        details={"client_id": caller.client.id, "kind": request.kind,
                                 "credential_type": created.credential_type,
                                 "ttl_seconds": request.ttl_seconds})
        outcome = Outcome(201, represent(created, public_url, now))
    if idempotency_key is not None:
        connection.execute(_INSERT_IDEMPOTENCY, {
            "client_id": caller.client.id, "key": idempotency_key,
            "request_digest": request_digest, "status_code": outcome.status_code,
            "response": outcome.body, "created_at": now})
    return outcome


_INSERT_ELICITATION: Final = insert(Elicitation)
_INSERT_IDEMPOTENCY: Final = insert(IdempotencyRecord)


def _columns_of(elicitation: Elicitation) -> dict[str, Any]:
    """A new elicitation's values by column name (the metadata column's attribute differs)."""
    return {"id": elicitation.id, "client_id": elicitation.client_id,
            "subject_iss": elicitation.subject_iss, "subject_sub": elicitation.subject_sub,
            "kind": elicitation.kind, "credential_type": elicitation.credential_type,
            "scopes": elicitation.scopes, "payment": elicitation.payment,
            "message": elicitation.message, "metadata": elicitation.metadata_,
            "status": elicitation.status, "created_at": elicitation.created_at,
            "expires_at": elicitation.expires_at, "opened_at": elicitation.opened_at,
            "ended_at": elicitation.ended_at}


def request_digest(body: bytes) -> str:
    """Fingerprint of a request body, for Idempotency-Key comparisons."""
    return hashlib.sha256(body).hexdigest()


def _replay(session: Session, clock: Clock, client: ClientIdentity, key: str,
            digest: str) -> Outcome | None:
    record = session.scalar(select(IdempotencyRecord).where(
        IdempotencyRecord.client_id == client.id, IdempotencyRecord.key == key))
    if record is None:
        return None
    if clock.now() - record.created_at > IDEMPOTENCY_WINDOW:
        # Forgotten: the key may name a new request now. Deleted before the
        # new record is added, which takes the same key.
        session.delete(record)
        session.flush()
        return None
    if record.request_digest != digest:
        raise IdempotencyConflict("this Idempotency-Key was used with a different request "
                                  "body; use a new key for a new request")
    return Outcome(record.status_code, record.response)


def _check_allowed(client: ClientIdentity, request: Create, catalog: Catalog,
                   payments_enabled: bool) -> None:
    if isinstance(request, CreatePaymentElicitation):
        if not payments_enabled:
            raise PaymentsNotConfigured("this gateway takes no payments: its operator has not "
                                        "set GATEWAY_STRIPE_SECRET_KEY")
        return
    type_id = request.credential_type
    credential_type = catalog.get(type_id)
    if credential_type is None or credential_type.kind != request.kind:
        known = catalog.ids_of(request.kind)
        other = "" if credential_type is None else _OTHER_KIND[credential_type.kind]
        raise InvalidInput(f"unknown {request.kind} credential_type {type_id!r}{other}; this "
                           f"gateway knows {', '.join(known) or 'none'}",
                           field="credential_type")
    if not client.may_use(type_id):
        raise InvalidInput(f"this client may not ask for credential_type {type_id!r}; it may "
                           f"ask for {', '.join(client.credential_types)}",
                           field="credential_type")


def _scopes_asked(request: Create, catalog: Catalog) -> list[str] | None:
    """The scopes an OAuth elicitation asks for: the request's, or its type's own list."""
    if not isinstance(request, CreateOAuthElicitation):
        return None
    credential_type = catalog.get(request.credential_type)
    assert credential_type is not None
    assert credential_type.oauth is not None
    offered = credential_type.oauth.scopes
    if request.scopes is None:
        return list(offered)
    asked = list(dict.fromkeys(request.scopes))  # once each, in the order given
    outside = [scope for scope in asked if scope not in offered]
    if outside and not credential_type.oauth.allow_extra_scopes:
        raise InvalidInput(f"scopes {', '.join(outside)} are not offered by credential_type "
                           f"{credential_type.id!r}; it offers {', '.join(offered) or 'none'}",
                           field="scopes")
    return asked


def _reusable(session: Session, client: ClientIdentity, request: Create,
              scopes: list[str] | None, now: datetime) -> Elicitation | None:
    candidates = session.scalars(select(Elicitation).where(
        Elicitation.client_id == client.id,
        Elicitation.subject_iss == request.subject.iss,
        Elicitation.subject_sub == request.subject.sub,
        Elicitation.kind == request.kind,
        Elicitation.status.in_([s.value for s in OPEN]),
        Elicitation.expires_at > now,
    ))
    # Newest first, sorted here rather than in SQL: an ORDER BY created_at
    # leads SQLite's planner to the (client_id, created_at) index, which scans
    # every elicitation the client ever made instead of the few of one subject.
    payment = _payment_fields(request)
    for candidate in sorted(candidates, key=lambda e: e.created_at, reverse=True):
        if candidate.credential_type == _credential_type(request) and \
                candidate.payment == payment and candidate.scopes == scopes:
            return candidate
    return None


def _new(caller: Caller, request: Create, scopes: list[str] | None,
         now: datetime) -> Elicitation:
    return Elicitation(
        # 144 random bits: the id is the URL, so it must not be guessable.
        id=new_id("el_", 18),
        client_id=caller.client.id,
        subject_iss=request.subject.iss,
        subject_sub=request.subject.sub,
        kind=request.kind,
        credential_type=_credential_type(request),
        scopes=scopes,
        payment=_payment_fields(request),
        message=request.message,
        metadata_=request.metadata,
        status=Status.PENDING.value,
        created_at=now,
        expires_at=now + timedelta(seconds=request.ttl_seconds),
        opened_at=None,
        ended_at=None,
    )


def _credential_type(request: Create) -> str | None:
    return None if isinstance(request, CreatePaymentElicitation) else request.credential_type


def _payment_fields(request: Create) -> dict[str, Any] | None:
    if isinstance(request, CreatePaymentElicitation):
        return request.payment.model_dump(mode="json")
    return None


# --- read, list, cancel -------------------------------------------------------------


def get(session: Session, client: ClientIdentity, elicitation_id: str) -> Elicitation:
    """The client's elicitation as stored.

    Another client's elicitation is reported exactly like an unknown one.
    """
    elicitation = _load(session, elicitation_id)
    if elicitation is None or elicitation.client_id != client.id:
        raise NotFound(f"no elicitation {elicitation_id!r}")
    return elicitation


def read(connection: Connection, client: ClientIdentity, elicitation_id: str) -> Elicitation:
    """:func:`get` by a statement built once, for the API's read: the row, not tracked.

    The elicitation it returns belongs to no session; to change it, :func:`get`
    it in the transaction that does.
    """
    if not _ELICITATION_ID.fullmatch(elicitation_id):
        raise NotFound(f"no elicitation {elicitation_id!r}")
    row = connection.execute(_READ, {"id": elicitation_id,
                                     "client_id": client.id}).mappings().first()
    if row is None:
        raise NotFound(f"no elicitation {elicitation_id!r}")
    return Elicitation(**row)


def read_joined(row: RowMapping, elicitation_id: str) -> Elicitation:
    """:func:`read` from the row the API's token check read with it.

    ``row`` is the answer to :data:`READ_WITH_TOKEN_CHECK`.
    """
    if row["id"] is None:
        raise NotFound(f"no elicitation {elicitation_id!r}")
    # Joined on its client: the row's client_id is the token's client.
    return Elicitation(client_id=row["client_id"],
                       **{attribute: row[attribute] for attribute in _ROW_ATTRIBUTES})


# What a read makes the object of, besides client_id (what the row was read by).
_ROW_ATTRIBUTES: Final = (
    "id", "subject_iss", "subject_sub", "kind", "credential_type", "scopes", "payment",
    "message", "metadata_", "status", "created_at", "expires_at", "opened_at", "ended_at")
# Labelled by attribute name, so that the row makes the object as it is.
_ROW_COLUMNS: Final = tuple(getattr(Elicitation, attribute).label(attribute)
                            for attribute in _ROW_ATTRIBUTES)
_READ: Final = select(Elicitation.client_id.label("client_id"), *_ROW_COLUMNS).where(
    Elicitation.id == bindparam("id"), Elicitation.client_id == bindparam("client_id"))
# The API's read: the token check and the row in one statement, bound by
# the route's parameter (an id the URL converter let through).
READ_WITH_TOKEN_CHECK: Final = token_check_joined(
    Elicitation, Elicitation.client_id, Elicitation.id == bindparam("elicitation_id"),
    *_ROW_COLUMNS)


def _load(session: Session, elicitation_id: str, *, fresh: bool = False) -> Elicitation | None:
    # An id the gateway cannot have minted names nothing, and is not sent to
    # the database: PostgreSQL answers a NUL in it with an error, not a miss.
    if not _ELICITATION_ID.fullmatch(elicitation_id):
        return None
    return session.get(Elicitation, elicitation_id, populate_existing=fresh)


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


# --- the portal: the subject check --------------------------------------------------


class WrongAccount(GatewayError):
    """The signed-in user is not the one the elicitation was made for."""

    status = 403
    code = "wrong-account"
    title = "This link is for another account"

    def __init__(self, elicitation: Elicitation) -> None:
        super().__init__("This link was created for another account.")
        self.elicitation_id = elicitation.id
        self.client_id = elicitation.client_id


NO_SUCH_LINK: Final = ("This link is not valid. Go back to the app that sent it and open its "
                       "link again.")


def open_for(session: Session, clock: Clock, subject: Subject, elicitation_id: str, *,
             actor: str, source_ip: str | None) -> Elicitation:
    """The elicitation made for ``subject``: expired if its time is up, opened if pending.

    The one subject check of the portal, run by every page and every POST
    (the spec's phishing defence: a forwarded link is useless to anyone
    else). Raises NotFound for an unknown link and WrongAccount for another
    user's, before anything is changed.
    """
    elicitation = subject_checked(session, subject, elicitation_id)
    expire_if_overdue(session, clock, elicitation)
    if elicitation.status == Status.PENDING:
        lifecycle.transition(session, clock, elicitation, Status.OPENED, actor=actor,
                             source_ip=source_ip)
    return elicitation


def subject_checked(session: Session, subject: Subject, elicitation_id: str) -> Elicitation:
    """The elicitation made for ``subject``, as stored: :func:`open_for`'s check, writing nothing.

    For a request that reads before it writes (a key checked before it is
    stored); the write runs :func:`open_for` again.
    """
    # Read afresh, not from the session's copy: a request that checks the
    # link again (after a live check, or Stripe's answer) must see what
    # another tab did meanwhile.
    elicitation = _load(session, elicitation_id, fresh=True)
    if elicitation is None:
        raise NotFound(NO_SUCH_LINK)
    if (subject.iss, subject.sub) != (elicitation.subject_iss, elicitation.subject_sub):
        raise WrongAccount(elicitation)
    return elicitation


# --- representation -----------------------------------------------------------------


def url_of(elicitation_id: str, public_url: str) -> str:
    """The link the user opens: the id and nothing else (no PII, no credential)."""
    return f"{public_url}/e/{elicitation_id}"


def represent(elicitation: Elicitation, public_url: str,
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
        "scopes": elicitation.scopes,
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
