"""Prepared statements read and write as SQLAlchemy does, on SQLite and PostgreSQL, errors too."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import (
    JSON,
    Column,
    ColumnElement,
    Connection,
    Integer,
    LargeBinary,
    MetaData,
    Select,
    String,
    Table,
    Update,
    bindparam,
    create_engine,
    event,
    exists,
    func,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.exc import DBAPIError, IntegrityError, NoResultFound

from gateway import db
from gateway.db import UTCDateTime
from gateway.prepared import (
    Parameters,
    PreparedChange,
    PreparedInserts,
    PreparedSelect,
    PreparedWrite,
    insert_into,
    refuse_unless,
)

metadata = MetaData()
things = Table(
    "prepared_things", metadata,
    Column("id", String(20), primary_key=True),
    Column("status", String(10)),
    Column("seen_at", UTCDateTime),
    Column("doc", JSON),
    Column("count", Integer),
    Column("blob", LargeBinary),
)
notes = Table(
    "prepared_notes", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("thing_id", String(20), unique=True),
    Column("written_at", UTCDateTime),
    Column("details", JSON),
)
SEEN = datetime(2026, 3, 1, 12, 30, 15, 123456, tzinfo=UTC)
BY_ID = select(things).where(things.c.id == bindparam("id"))


@pytest.fixture
def connection(clean_database: str) -> Iterator[Connection]:
    engine = db.make_engine(clean_database, isolation_level="AUTOCOMMIT")
    metadata.create_all(engine)
    try:
        with engine.connect() as connection:
            connection.execute(things.insert(), [
                {"id": "a", "status": "open", "seen_at": SEEN,
                 "doc": {"nested": [1, "two", None]}, "count": 7, "blob": b"\x00\xff"},
                {"id": "b", "status": "closed", "seen_at": None, "doc": None, "count": None,
                 "blob": None},
            ])
            yield connection
    finally:
        metadata.drop_all(engine)
        engine.dispose()


@pytest.mark.parametrize("thing_id", ["a", "b"])
def test_a_row_reads_back_as_through_sqlalchemy(connection: Connection, thing_id: str) -> None:
    expected = connection.execute(BY_ID, {"id": thing_id}).one()._asdict()
    row = PreparedSelect(BY_ID).first(connection, {"id": thing_id})
    assert row._asdict() == expected
    assert row.id == thing_id


def test_values_keep_their_types(connection: Connection) -> None:
    row = PreparedSelect(BY_ID).first(connection, {"id": "a"})
    assert row.seen_at == SEEN
    assert row.seen_at.tzinfo is not None
    assert row.doc == {"nested": [1, "two", None]}
    assert row.count == 7
    assert bytes(row.blob) == b"\x00\xff"


def test_no_row_is_none(connection: Connection) -> None:
    assert PreparedSelect(BY_ID).first(connection, {"id": "missing"}) is None


def test_a_literal_in_the_statement_is_bound(connection: Connection) -> None:
    open_only = PreparedSelect(select(things.c.id).where(
        things.c.id == bindparam("id"), things.c.status == "open"))
    assert open_only.first(connection, {"id": "a"}).id == "a"
    assert open_only.first(connection, {"id": "b"}) is None


def test_parameters_are_converted_by_their_column_type(connection: Connection) -> None:
    seen_after = PreparedSelect(select(things.c.id).where(
        things.c.seen_at > bindparam("after", type_=UTCDateTime)))
    assert seen_after.first(connection, {"after": SEEN - timedelta(seconds=1)}).id == "a"
    assert seen_after.first(connection, {"after": SEEN}) is None
    # UTCDateTime refuses naive datetimes: the type's own check ran.
    with pytest.raises(ValueError, match="naive"):
        seen_after.first(connection, {"after": SEEN.replace(tzinfo=None)})


def test_a_driver_error_comes_out_as_sqlalchemys(connection: Connection) -> None:
    missing = Table("prepared_missing", MetaData(), Column("id", String(20)))
    prepared = PreparedSelect(select(missing).where(missing.c.id == bindparam("id")))
    with pytest.raises(DBAPIError, match="prepared_missing") as raised:
        prepared.first(connection, {"id": "secret-ish"})
    assert "secret-ish" not in str(raised.value)
    # The connection still serves.
    assert PreparedSelect(BY_ID).first(connection, {"id": "a"}).id == "a"


def test_an_expanding_in_is_refused(connection: Connection) -> None:
    prepared = PreparedSelect(select(things).where(things.c.id.in_(["a", "b"])))
    with pytest.raises(ValueError, match="expanding IN"):
        prepared.first(connection, {})


def test_one_requires_a_row(connection: Connection) -> None:
    prepared = PreparedSelect(BY_ID)
    assert prepared.one(connection, {"id": "a"}).status == "open"
    with pytest.raises(NoResultFound):
        prepared.one(connection, {"id": "missing"})


def test_a_connection_that_died_is_replaced(connection: Connection, clean_database: str) -> None:
    if connection.dialect.name != "postgresql":
        pytest.skip("a SQLite file has no server to lose the connection")
    pid = connection.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
    admin = create_engine(clean_database, isolation_level="AUTOCOMMIT")
    with admin.connect() as other:
        other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
    admin.dispose()
    with pytest.raises(DBAPIError) as raised:
        PreparedSelect(BY_ID).first(connection, {"id": "a"})
    assert raised.value.connection_invalidated
    # As after any SQLAlchemy statement that lost its connection: once rolled
    # back, the Connection goes on with a new one from the pool.
    connection.rollback()
    assert PreparedSelect(BY_ID).first(connection, {"id": "a"}).id == "a"
    assert connection.exec_driver_sql("SELECT pg_backend_pid()").scalar_one() != pid


# --- writes ---------------------------------------------------------------------

INSERT = PreparedWrite(insert_into(things))
CLOSE = PreparedWrite(
    update(things)
    .where(things.c.status == bindparam("from_status"), things.c.id != bindparam("keep"))
    .values(status=bindparam("to_status", type_=things.c.status.type),
            seen_at=bindparam("at", type_=UTCDateTime))
    .returning(things.c.id))
NEW = {"id": "c", "status": "open", "seen_at": SEEN + timedelta(hours=1),
       "doc": {"k": ["v", 2]}, "count": 3, "blob": b"\x01\x02"}


def test_an_insert_reads_back_as_written_through_sqlalchemy(connection: Connection) -> None:
    written = INSERT.run(connection, NEW)
    assert written.rowcount == 1
    assert written.rows == []
    row = connection.execute(BY_ID, {"id": "c"}).one()
    assert {**row._asdict(), "blob": bytes(row.blob)} == NEW


def test_an_update_reports_its_rows_and_what_it_returned(connection: Connection) -> None:
    written = CLOSE.run(connection, {"from_status": "open", "keep": "none",
                                     "to_status": "closed", "at": SEEN})
    assert written.rowcount == 1
    assert [row.id for row in written.rows] == ["a"]
    again = CLOSE.run(connection, {"from_status": "open", "keep": "none",
                                   "to_status": "closed", "at": SEEN})
    assert (again.rowcount, again.rows) == (0, [])
    assert connection.execute(BY_ID, {"id": "a"}).one().status == "closed"


def test_a_value_written_into_the_statement_needs_no_parameter(connection: Connection) -> None:
    forget = PreparedWrite(update(things).where(things.c.id == bindparam("id"))
                           .values(doc=None, status="forgotten"))
    assert forget.run(connection, {"id": "a"}).rowcount == 1
    row = connection.execute(BY_ID, {"id": "a"}).one()
    assert (row.status, row.doc) == ("forgotten", None)


def test_returning_converts_values_by_their_column_type(connection: Connection) -> None:
    prepared = PreparedWrite(insert_into(things).returning(things.c.seen_at, things.c.doc))
    row = prepared.run(connection, NEW).rows[0]
    assert row.seen_at == NEW["seen_at"]
    assert row.doc == NEW["doc"]


@pytest.fixture
def transactional(clean_database: str) -> Iterator[Connection]:
    """A connection that opens transactions (the other tests' connections commit each statement)."""
    engine = db.make_engine(clean_database)
    metadata.create_all(engine)
    try:
        with engine.connect() as connection:
            yield connection
    finally:
        metadata.drop_all(engine)
        engine.dispose()


def test_a_write_in_a_transaction_goes_with_it(transactional: Connection) -> None:
    with transactional.begin() as transaction:
        INSERT.run(transactional, NEW)
        transaction.rollback()
    assert transactional.execute(BY_ID, {"id": "c"}).first() is None
    transactional.rollback()  # ends the read's own transaction
    with transactional.begin():
        INSERT.run(transactional, NEW)
    assert transactional.execute(BY_ID, {"id": "c"}).one().count == 3


def test_the_engines_listeners_see_every_write(connection: Connection) -> None:
    # SQLite's writer queue hangs on these two events: a write they missed
    # would race the other writers (or keep the queue's lock past its end).
    seen: list[tuple[str, str]] = []
    engine = connection.engine
    before = lambda conn, cursor, sql, *rest: seen.append(("before", sql))  # noqa: E731
    after = lambda conn, cursor, sql, *rest: seen.append(("after", sql))  # noqa: E731
    event.listen(engine, "before_cursor_execute", before)
    event.listen(engine, "after_cursor_execute", after)
    try:
        INSERT.run(connection, NEW)
    finally:
        event.remove(engine, "before_cursor_execute", before)
        event.remove(engine, "after_cursor_execute", after)
    assert [when for when, _ in seen] == ["before", "after"]
    assert all(sql.startswith("INSERT INTO prepared_things") for _, sql in seen)


def test_a_refused_write_comes_out_as_sqlalchemys_and_hides_its_values(
    connection: Connection,
) -> None:
    with pytest.raises(IntegrityError) as raised:
        INSERT.run(connection, {**NEW, "id": "a", "status": "secret-ish"})
    assert "secret-ish" not in str(raised.value)
    assert connection.execute(BY_ID, {"id": "a"}).one().status == "open"


def test_a_missing_value_is_refused_before_anything_is_sent(connection: Connection) -> None:
    with pytest.raises(KeyError, match="count"):
        INSERT.run(connection, {key: value for key, value in NEW.items() if key != "count"})
    assert connection.execute(BY_ID, {"id": "c"}).first() is None


# --- several tables in one statement ---------------------------------------------------

THING_NOTED = PreparedInserts("prepared_thing_noted", things, notes)
NOTE = {"thing_id": "c", "written_at": SEEN, "details": {"why": ["made", 1]}}


def _note_of(connection: Connection, thing_id: str) -> dict[str, object] | None:
    row = connection.execute(select(notes).where(notes.c.thing_id == thing_id)).first()
    return None if row is None else row._asdict()


def test_one_row_goes_into_each_table_as_sqlalchemy_writes_it(connection: Connection) -> None:
    THING_NOTED.run(connection, {"prepared_things": NEW, "prepared_notes": NOTE})
    row = connection.execute(BY_ID, {"id": "c"}).one()
    assert {**row._asdict(), "blob": bytes(row.blob)} == NEW
    note = _note_of(connection, "c")
    assert note is not None
    assert {key: value for key, value in note.items() if key != "id"} == NOTE
    assert isinstance(note["id"], int)  # the generated key is the database's


def test_when_one_row_is_refused_no_row_is_written(connection: Connection) -> None:
    THING_NOTED.run(connection, {"prepared_things": NEW, "prepared_notes": NOTE})
    other = {**NEW, "id": "d"}
    with pytest.raises(IntegrityError):
        # The note's thing_id is taken: the thing must not stay behind alone.
        THING_NOTED.run(connection, {"prepared_things": other, "prepared_notes": NOTE})
    assert connection.execute(BY_ID, {"id": "d"}).first() is None
    with pytest.raises(IntegrityError):
        # The other way round: the thing's id is taken.
        THING_NOTED.run(connection, {"prepared_things": NEW,
                                     "prepared_notes": {**NOTE, "thing_id": "e"}})
    assert _note_of(connection, "e") is None


def test_the_statement_works_on_every_connection_of_the_pool(clean_database: str) -> None:
    # On SQLite it needs a temporary view made on each connection.
    engine = db.make_engine(clean_database, isolation_level="AUTOCOMMIT")
    metadata.create_all(engine)
    try:
        connections = [engine.connect() for _ in range(3)]
        for number, connection in enumerate(connections):
            THING_NOTED.run(connection, {
                "prepared_things": {**NEW, "id": f"t{number}"},
                "prepared_notes": {**NOTE, "thing_id": f"t{number}"}})
        for connection in connections:
            connection.close()
        with engine.connect() as connection:
            assert connection.scalar(select(func.count()).select_from(notes)) == 3
    finally:
        metadata.drop_all(engine)
        engine.dispose()


def test_in_a_transaction_the_rows_go_with_it(transactional: Connection) -> None:
    with transactional.begin() as transaction:
        THING_NOTED.run(transactional, {"prepared_things": NEW, "prepared_notes": NOTE})
        transaction.rollback()
    assert transactional.execute(BY_ID, {"id": "c"}).first() is None
    assert _note_of(transactional, "c") is None


def test_a_missing_value_of_any_table_is_refused_before_anything_is_sent(
    connection: Connection,
) -> None:
    note = {key: value for key, value in NOTE.items() if key != "written_at"}
    with pytest.raises(KeyError, match="written_at"):
        THING_NOTED.run(connection, {"prepared_things": NEW, "prepared_notes": note})
    assert connection.execute(BY_ID, {"id": "c"}).first() is None


def test_one_table_is_refused() -> None:
    with pytest.raises(ValueError, match="PreparedWrite"):
        PreparedInserts("prepared_alone", things)


# --- a guarded change ------------------------------------------------------------------


def _is_open(parameters: Parameters) -> list[ColumnElement[bool]]:
    return [things.c.id == parameters["id"], things.c.status == "open"]


def _closes(parameters: Parameters) -> Update:
    return update(things).values(status="closed", seen_at=parameters["at"])


def _closed_postgresql(parameters: Parameters) -> Select[Any]:
    moved = (_closes(parameters).where(*_is_open(parameters)).returning(things.c.id)
             .cte("moved"))
    noted = insert(notes).from_select(
        ["thing_id", "written_at", "details"],
        select(moved.c.id, parameters["at"], parameters["details"]).select_from(moved))
    return select(moved.c.id).add_cte(noted.cte("noted"))


def _closed_sqlite(parameters: Parameters) -> list[Any]:
    return [
        refuse_unless(exists(select(things.c.id).where(*_is_open(parameters)))),
        _closes(parameters).where(things.c.id == parameters["id"]),
        insert(notes).values(thing_id=parameters["id"], written_at=parameters["at"],
                             details=parameters["details"]),
    ]


# Closes an open thing and notes it, or does nothing.
THING_CLOSED = PreparedChange(
    "prepared_thing_closed",
    [Column("id", String), Column("at", UTCDateTime), Column("details", JSON)],
    postgresql=_closed_postgresql, sqlite=_closed_sqlite)
CLOSED_AT = SEEN + timedelta(days=1)


def test_a_guarded_change_is_made_when_its_guard_holds(connection: Connection) -> None:
    made = THING_CLOSED.run(connection, {"id": "a", "at": CLOSED_AT, "details": {"by": "x"}})
    assert made is True
    row = connection.execute(BY_ID, {"id": "a"}).one()
    assert (row.status, row.seen_at) == ("closed", CLOSED_AT)
    note = _note_of(connection, "a")
    assert note is not None
    assert (note["written_at"], note["details"]) == (CLOSED_AT, {"by": "x"})


def test_a_change_its_guard_refuses_writes_nothing(connection: Connection) -> None:
    assert THING_CLOSED.run(connection, {"id": "b", "at": CLOSED_AT, "details": {}}) is False
    assert connection.execute(BY_ID, {"id": "b"}).one().seen_at is None
    assert _note_of(connection, "b") is None
    # Refused again the second time: a closed thing stays closed once.
    assert THING_CLOSED.run(connection, {"id": "a", "at": CLOSED_AT, "details": {}}) is True
    assert THING_CLOSED.run(connection, {"id": "a", "at": SEEN, "details": {}}) is False
    assert connection.execute(BY_ID, {"id": "a"}).one().seen_at == CLOSED_AT


def test_another_constraint_is_not_taken_for_the_guard(connection: Connection) -> None:
    connection.execute(notes.insert(), {"thing_id": "a", "written_at": SEEN, "details": {}})
    with pytest.raises(IntegrityError):
        THING_CLOSED.run(connection, {"id": "a", "at": CLOSED_AT, "details": {}})
    assert connection.execute(BY_ID, {"id": "a"}).one().status == "open"
