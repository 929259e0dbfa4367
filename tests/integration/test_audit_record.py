"""An audit event commits with the change it records, in its order, or not at all."""

from __future__ import annotations

from typing import Any

import pytest
from flask import Flask
from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway import db
from gateway.audit import service as audit
from gateway.audit.models import AuditEvent
from gateway.clock import FixedClock


def record(session: Session, clock: FixedClock, action: str, **details: Any) -> None:
    audit.record(session, clock, actor="operator:test", action=action, target="cl_1",
                 source_ip="192.0.2.7", details=details)


def stored(app: Flask) -> list[tuple[str, str, str | None, dict[str, Any]]]:
    with app.app_context():
        rows = db.session().scalars(select(AuditEvent).order_by(AuditEvent.id))
        return [(row.action, row.actor, row.source_ip, row.details) for row in rows]


def test_the_events_of_a_transaction_are_kept_in_their_order(
    app: Flask, clock: FixedClock,
) -> None:
    with app.app_context(), db.transaction() as session:
        for number in range(3):
            record(session, clock, f"test.step{number}", number=number)
    assert stored(app) == [(f"test.step{number}", "operator:test", "192.0.2.7",
                            {"number": number}) for number in range(3)]


def test_a_transaction_that_fails_leaves_no_event(app: Flask, clock: FixedClock) -> None:
    def fail() -> None:
        with db.transaction() as session:
            record(session, clock, "test.lost")
            raise RuntimeError("the change failed")

    with app.app_context(), pytest.raises(RuntimeError):
        fail()
    with app.app_context(), db.transaction() as session:
        record(session, clock, "test.kept")
    assert [action for action, *_ in stored(app)] == ["test.kept"]


def test_a_session_of_its_own_sees_its_event_at_once(app: Flask, clock: FixedClock) -> None:
    # As the CLI's and the worker's sessions are.
    with app.app_context(), db.engine().begin() as connection, \
            Session(bind=connection) as session:
        record(session, clock, "test.at-once")
        assert session.scalar(select(AuditEvent.action)) == "test.at-once"
    assert [action for action, *_ in stored(app)] == ["test.at-once"]
