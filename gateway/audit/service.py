"""Writing audit events inside the caller's transaction."""

from __future__ import annotations

from typing import Any, Final, Literal

from sqlalchemy import Connection, insert
from sqlalchemy.orm import Session

from gateway.audit.models import AuditEvent
from gateway.clock import Clock

Outcome = Literal["success", "failure", "denied"]


def record(
    session: Session,
    clock: Clock,
    *,
    actor: str,
    action: str,
    outcome: Outcome = "success",
    target: str | None = None,
    source_ip: str | None = None,
    details: dict[str, Any] | None = None,
) -> None:
    """Add an audit event to the session's transaction: it commits with the change it records.

    Callers pass identifiers and outcomes, never a secret: the trail is read
    by people who must not learn keys from it.
    """
    record_on(session.connection(), clock, actor=actor, action=action, outcome=outcome,
              target=target, source_ip=source_ip, details=details)


def record_on(
    connection: Connection,
    clock: Clock,
    *,
    actor: str,
    action: str,
    outcome: Outcome = "success",
    target: str | None = None,
    source_ip: str | None = None,
    details: dict[str, Any] | None = None,
) -> None:
    """:func:`record` on the transaction's connection, for a path that runs no ORM session."""
    # Inserted at once by a statement built once: rows are only ever
    # inserted, so no object needs tracking.
    connection.execute(_INSERT, {
        "occurred_at": clock.now(), "actor": actor, "action": action, "target": target,
        "source_ip": source_ip, "outcome": outcome, "details": details or {}})


_INSERT: Final = insert(AuditEvent)
