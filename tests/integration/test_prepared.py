"""Prepared reads give the rows SQLAlchemy gives, on SQLite and PostgreSQL, and its errors."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import (
    JSON,
    Column,
    Connection,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    bindparam,
    create_engine,
    select,
    text,
)
from sqlalchemy.exc import DBAPIError, NoResultFound

from gateway import db
from gateway.db import UTCDateTime
from gateway.prepared import PreparedSelect

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
