"""The audit trail is append-only, and the database says so, not only the code.

Whatever path a change takes (SQL, the ORM, a forgotten WHERE), the app's own
engine cannot rewrite or remove a record: the statement fails with an error
that names the rule, and the record stays as it was written.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from alembic import command
from flask import Flask
from sqlalchemy import Delete, Engine, Table, Update, delete, func, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from gateway import db, migrations
from gateway.audit import service as audit
from gateway.audit.models import AuditEvent
from gateway.clock import SystemClock

EVENTS: Table = AuditEvent.__table__  # type: ignore[assignment]


def record_one(engine: Engine) -> int:
    """Write one audit record the way the gateway does; its id."""
    with sessionmaker(engine).begin() as session:
        audit.record(session, SystemClock(), actor="operator:root", action="client.created",
                     target="cl_weather", details={"name": "Weather MCP"})
        event_id: int = session.execute(select(func.max(EVENTS.c.id))).scalar_one()
    return event_id


def stored(engine: Engine, event_id: int) -> Any:
    with engine.connect() as connection:
        return connection.execute(select(EVENTS).where(EVENTS.c.id == event_id)).one()


@pytest.fixture
def engine(app: Flask) -> Engine:
    """The app's own engine, with the privileges the gateway runs with."""
    return db.engine_of(app)


@pytest.fixture
def event_id(engine: Engine) -> int:
    return record_one(engine)


STATEMENTS: dict[str, Callable[[int], Update | Delete]] = {
    "update-one": lambda event_id: update(EVENTS).where(EVENTS.c.id == event_id)
    .values(actor="operator:someone-else", outcome="failure"),
    "update-all": lambda event_id: update(EVENTS).values(details={}),
    "delete-one": lambda event_id: delete(EVENTS).where(EVENTS.c.id == event_id),
    "delete-all": lambda event_id: delete(EVENTS),
}


@pytest.mark.parametrize("change", STATEMENTS.values(), ids=STATEMENTS.keys())
def test_sql_cannot_change_or_delete_a_record(
    engine: Engine, event_id: int, change: Callable[[int], Update | Delete],
) -> None:
    before = stored(engine, event_id)
    with pytest.raises(IntegrityError, match="audit_events is append-only"), \
            engine.begin() as connection:
        connection.execute(change(event_id))
    assert stored(engine, event_id) == before


def test_the_orm_cannot_rewrite_a_record(engine: Engine, event_id: int) -> None:
    before = stored(engine, event_id)
    with Session(engine) as session:
        event = session.get(AuditEvent, event_id)
        assert event is not None
        event.outcome = "failure"
        with pytest.raises(IntegrityError, match="append-only: UPDATE refused"):
            session.commit()
    assert stored(engine, event_id) == before


def test_the_orm_cannot_delete_a_record(engine: Engine, event_id: int) -> None:
    before = stored(engine, event_id)
    with Session(engine) as session:
        session.delete(session.get(AuditEvent, event_id))
        with pytest.raises(IntegrityError, match="append-only: DELETE refused"):
            session.commit()
    assert stored(engine, event_id) == before


# Inserts over a record: SQLite resolves REPLACE by deleting the old row
# without firing its delete trigger, and an UPSERT turns into an update.
OVERWRITES: dict[str, tuple[str, str]] = {
    "insert-or-replace": ("sqlite", "INSERT OR REPLACE INTO audit_events"),
    "replace-into": ("sqlite", "REPLACE INTO audit_events"),
    "upsert": ("any", "INSERT INTO audit_events"),
}
COLUMNS = "(id, occurred_at, actor, action, target, source_ip, outcome, details)"
FORGED_VALUES = ("VALUES (:id, :occurred_at, 'operator:someone-else', 'client.created', "
                 "'cl_weather', NULL, 'failure', '{}')")
UPSERT_CLAUSE = " ON CONFLICT (id) DO UPDATE SET actor = excluded.actor"


@pytest.mark.parametrize("overwrite", OVERWRITES.values(), ids=OVERWRITES.keys())
def test_an_insert_over_a_record_cannot_replace_it(
    engine: Engine, event_id: int, overwrite: tuple[str, str],
) -> None:
    dialect, verb = overwrite
    if dialect != "any" and engine.dialect.name != dialect:
        pytest.skip(f"{verb.split(' INTO')[0]} is {dialect}'s own statement")
    before = stored(engine, event_id)
    statement = f"{verb} {COLUMNS} {FORGED_VALUES}"
    if verb == "INSERT INTO audit_events":
        statement += UPSERT_CLAUSE
    with pytest.raises(IntegrityError, match="audit_events is append-only"), \
            engine.begin() as connection:
        connection.execute(text(statement), {"id": event_id,
                                             "occurred_at": before.occurred_at})
    assert stored(engine, event_id) == before


def test_truncate_is_refused_on_postgresql(engine: Engine, event_id: int) -> None:
    if engine.dialect.name != "postgresql":
        pytest.skip("SQLite has no TRUNCATE; its DELETE without WHERE is refused above")
    before = stored(engine, event_id)
    with pytest.raises(IntegrityError, match="append-only: TRUNCATE refused"), \
            engine.begin() as connection:
        connection.execute(text("TRUNCATE audit_events"))
    assert stored(engine, event_id) == before


def test_new_records_are_still_written(engine: Engine, event_id: int) -> None:
    assert record_one(engine) > event_id


def test_downgrade_lifts_the_guard_and_upgrade_restores_it(empty_database_url: str) -> None:
    engine = db.make_engine(empty_database_url)
    try:
        migrations.upgrade(engine)
        event_id = record_one(engine)
        command.downgrade(migrations.alembic_config(engine), "0005")
        with engine.begin() as connection:
            connection.execute(update(EVENTS).where(EVENTS.c.id == event_id)
                               .values(outcome="failure"))
        migrations.upgrade(engine)
        with pytest.raises(IntegrityError, match="append-only"), engine.begin() as connection:
            connection.execute(delete(EVENTS).where(EVENTS.c.id == event_id))
        assert stored(engine, event_id).outcome == "failure"
    finally:
        engine.dispose()
