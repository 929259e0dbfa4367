"""The state machine: which transitions exist, and that each is one guarded write."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

from gateway.audit.models import AuditEvent
from gateway.clients.models import Client
from gateway.clock import FixedClock
from gateway.elicitations.lifecycle import (
    OPEN,
    TERMINAL,
    TRANSITIONS,
    IllegalTransition,
    Status,
    transition,
)
from gateway.elicitations.models import Elicitation

START = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def session(engine: Engine) -> Iterator[Session]:
    with sessionmaker(engine, expire_on_commit=False)() as session:
        session.add(Client(id="cl_test", name="test", status="active", credential_types=[],
                           created_at=START))
        session.commit()
        yield session


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock(START)


def make(session: Session, status: Status = Status.PENDING) -> Elicitation:
    elicitation = Elicitation(
        id=f"el_{status}_{len(session.new)}_{datetime.now().timestamp()}", client_id="cl_test",
        subject_iss="https://auth.example.com", subject_sub="u", kind="api_key",
        credential_type="generic", message="m", metadata_={}, status=status.value,
        created_at=START, expires_at=START + timedelta(minutes=15))
    session.add(elicitation)
    session.commit()
    return elicitation


def test_terminal_states_lead_nowhere() -> None:
    assert set(TRANSITIONS) == set(OPEN)
    assert all(target in Status for targets in TRANSITIONS.values() for target in targets)
    assert {Status.COMPLETED, Status.DECLINED, Status.FAILED, Status.EXPIRED,
                        Status.CANCELLED} == TERMINAL
    # Only a user who opened the link can complete, decline or fail it.
    assert TRANSITIONS[Status.PENDING] == {Status.OPENED, Status.EXPIRED, Status.CANCELLED}


@pytest.mark.parametrize(("start", "to"), [
    (start, to) for start in Status for to in Status if to in TRANSITIONS.get(start, ())
])
def test_every_legal_transition_writes_its_audit_row(
    session: Session, clock: FixedClock, start: Status, to: Status,
) -> None:
    elicitation = make(session, start)
    transition(session, clock, elicitation, to, actor="test")
    session.commit()
    session.expire_all()
    stored = session.get(Elicitation, elicitation.id)
    assert stored is not None
    assert stored.status == to.value
    assert (stored.ended_at is not None) == (to in TERMINAL)
    actions = session.scalars(select(AuditEvent.action)
                              .where(AuditEvent.target == elicitation.id)).all()
    assert actions == [f"elicitation.{to.value}"]


@pytest.mark.parametrize(("start", "to"), [
    (start, to) for start in Status for to in Status if to not in TRANSITIONS.get(start, ())
])
def test_every_illegal_transition_is_refused_and_changes_nothing(
    session: Session, clock: FixedClock, start: Status, to: Status,
) -> None:
    elicitation = make(session, start)
    with pytest.raises(IllegalTransition):
        transition(session, clock, elicitation, to, actor="test")
    session.rollback()
    assert session.get(Elicitation, elicitation.id).status == start.value  # type: ignore[union-attr]
    assert session.scalars(select(AuditEvent).where(
        AuditEvent.target == elicitation.id)).all() == []


def test_an_overdue_elicitation_can_only_expire(session: Session, clock: FixedClock) -> None:
    elicitation = make(session, Status.OPENED)
    clock.advance(minutes=15)
    with pytest.raises(IllegalTransition, match="expired"):
        transition(session, clock, elicitation, Status.COMPLETED, actor="test")
    transition(session, clock, elicitation, Status.EXPIRED, actor="test")
    assert elicitation.status == "expired"


def test_a_stale_copy_loses_the_race(engine: Engine, session: Session,
                                     clock: FixedClock) -> None:
    elicitation = make(session, Status.OPENED)
    # Another request ends it first, through its own session.
    with sessionmaker(engine)() as other:
        transition(other, clock, other.get(Elicitation, elicitation.id),  # type: ignore[arg-type]
                   Status.DECLINED, actor="other")
        other.commit()
    with pytest.raises(IllegalTransition, match="declined"):
        transition(session, clock, elicitation, Status.COMPLETED, actor="test")
    session.rollback()
    assert session.get(Elicitation, elicitation.id).status == "declined"  # type: ignore[union-attr]
