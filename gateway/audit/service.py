"""Writing audit events, inside the caller's transaction or as a change of their own."""

from __future__ import annotations

import functools
from typing import Any, Final, Literal

from sqlalchemy import Connection, bindparam, event, insert
from sqlalchemy.orm import Session, SessionTransaction

from gateway.audit.grouped import MAX_BATCH, group_for, is_autocommit
from gateway.audit.models import AuditEvent
from gateway.clock import Clock
from gateway.db import WRITES_AT_COMMIT
from gateway.prepared import PreparedWrite

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
) -> None:
    """Write an audit event.

    In a session, the event commits with the session's change. A request's
    session (see :data:`gateway.db.WRITES_AT_COMMIT`) holds its events until
    the commit and writes them in one statement: a submit records three, and
    on SQLite every statement of a transaction that wrote is one more wait
    for the others' writers. On an autocommit connection
    (:func:`gateway.db.autocommit`) the event is a change of its own,
    committed when this returns, maybe in one statement with the events
    other requests commit at the same moment (:mod:`gateway.audit.grouped`).
    Callers pass identifiers and outcomes, never a secret: the trail is
    read by people who must not learn keys from it.
    """
    row = event_row(clock, actor=actor, action=action, outcome=outcome, target=target,
                    source_ip=source_ip, details=details)
    if isinstance(session, Connection):
        _commit_now(session, row)
    elif session.info.get(WRITES_AT_COMMIT):
        session.info.setdefault(_PENDING, []).append(row)
    else:
        _write(session.connection(), [row])


def event_row(
    clock: Clock,
    *,
    actor: str,
    action: str,
    outcome: Outcome = "success",
    target: str | None = None,
    source_ip: str | None = None,
    details: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """An audit event as the row of :data:`TABLE`, for a statement that writes it with others."""
    return {
        "occurred_at": clock.now(),
        "actor": actor,
        "action": action,
        "target": target,
        "source_ip": source_ip,
        "outcome": outcome,
        "details": details or {},
    }


_PENDING: Final = "gateway.audit_pending"
TABLE: Final = AuditEvent.metadata.tables[AuditEvent.__tablename__]
# Every column but the generated id: an event missing one is refused by name.
_COLUMNS: Final = tuple(column.key for column in TABLE.columns
                        if column is not TABLE.autoincrement_column)


@event.listens_for(Session, "before_commit")
def _write_pending(session: Session) -> None:
    rows = session.info.pop(_PENDING, None)
    if rows:
        _write(session.connection(), rows)


@event.listens_for(Session, "after_transaction_end")
def _forget(session: Session, transaction: SessionTransaction) -> None:
    # Rolled back or closed: the events go with the change they recorded.
    if transaction.parent is None:
        session.info.pop(_PENDING, None)


def _commit_now(connection: Connection, row: dict[str, Any]) -> None:
    if is_autocommit(connection):
        group_for(connection.engine, _write).commit(connection, row)
    else:  # a connection in a transaction: the event commits with it
        _write(connection, [row])


def _write(connection: Connection, rows: list[dict[str, Any]]) -> None:
    _inserting(len(rows)).run(connection, {
        f"{name}_{number}": value
        for number, row in enumerate(rows) for name, value in row.items()})


@functools.lru_cache(maxsize=MAX_BATCH)
def _inserting(count: int) -> PreparedWrite:
    """One INSERT of ``count`` events (a transaction records one to a few, a group more)."""
    return PreparedWrite(insert(TABLE).values([
        {name: bindparam(f"{name}_{number}", type_=TABLE.c[name].type) for name in _COLUMNS}
        for number in range(count)]))
