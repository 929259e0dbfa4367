"""``gateway worker``: the sweeper marks overdue elicitations expired, with their audit rows."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from flask import Flask
from sqlalchemy import select

from gateway import db
from gateway.audit.models import AuditEvent
from gateway.clock import FixedClock
from gateway.elicitations.models import Elicitation
from tests.conftest import Api
from tests.integration.api.test_create import body
from tests.integration.conftest import Result

pytestmark = pytest.mark.slow


@pytest.fixture
def clock() -> FixedClock:
    """The API runs ten minutes in the past, so what it creates is overdue now."""
    return FixedClock(datetime.now(UTC) - timedelta(minutes=10))


def test_worker_once_expires_what_is_overdue_and_nothing_else(
    api: Api, app: Flask, invoke_gateway: Callable[..., Result],
) -> None:
    overdue = api.post("/api/v1/elicitations", body(ttl_seconds=60)).get_json()
    current = api.post("/api/v1/elicitations", body(
        ttl_seconds=3600, subject={"iss": "https://auth.example.com", "sub": "u2"})).get_json()

    result = invoke_gateway("worker", "--once")
    assert result.code == 0, result.stderr

    with app.app_context():
        session = db.session()
        states = dict(session.execute(select(Elicitation.id, Elicitation.status)).all())
        expired_by = session.scalars(select(AuditEvent.actor).where(
            AuditEvent.action == "elicitation.expired")).all()
    assert states == {overdue["id"]: "expired", current["id"]: "pending"}
    assert expired_by == ["system:expiry"]
