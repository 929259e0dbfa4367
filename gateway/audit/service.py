"""Writing audit events, inside the caller's transaction or as a change of their own."""

from __future__ import annotations

from typing import Any, Final, Literal

from sqlalchemy import Connection, insert
from sqlalchemy.orm import Session

from gateway.audit.models import AuditEvent
from gateway.clock import Clock

Outcome = Literal["success", "failure", "denied"]


def record(
    session: Session | Connection,
    clock: Clock,
    *,
    actor: str,
    action: str,
    outcome: Outcome = "success",
    target: str | None = None,
    source_ip: str | None = None,
    details: dict[str, Any] | None = None,
) -> int:
    """Write an audit event; its id.

    In a session, the event commits with the session's change. On an
    autocommit connection (:func:`gateway.db.autocommit`) it is a change of
    its own, committed when this returns. Callers pass identifiers and
    outcomes, never a secret: the trail is read by people who must not learn
    keys from it.
    """
    connection = session.connection() if isinstance(session, Session) else session
    # A plain INSERT, not an ORM object: rows are never read back or changed
    # in the transaction that writes them, and this runs on hot paths.
    result = connection.execute(_INSERT, {
        "occurred_at": clock.now(),
        "actor": actor,
        "action": action,
        "target": target,
        "source_ip": source_ip,
        "outcome": outcome,
        "details": details or {},
    })
    key = result.inserted_primary_key
    assert key is not None  # a single-row INSERT always reports its key
    event_id: int = key[0]
    return event_id


_INSERT: Final = insert(AuditEvent.metadata.tables[AuditEvent.__tablename__])
