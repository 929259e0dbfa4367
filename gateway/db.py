"""Engine, session-per-request and the one transaction helper.

Every state change runs inside :func:`transaction`: the change, its audit row
and (later) its outbox row commit together or not at all.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from flask import Flask, current_app, g
from sqlalchemy import Connection, DateTime, Engine, MetaData, create_engine, event
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker
from sqlalchemy.pool import ConnectionPoolEntry
from sqlalchemy.types import TypeDecorator

# Stable constraint names, so migrations can alter constraints on both backends.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    """Declarative base of every model."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class UTCDateTime(TypeDecorator[datetime]):
    """An aware UTC datetime on every backend (SQLite keeps no time zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetimes are refused; pass an aware UTC datetime")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


# How long SQLite waits for another writer before "database is locked".
SQLITE_BUSY_TIMEOUT_S = 15.0
_WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE")
_HOLDS_WRITE_LOCK = "gateway.write_lock"


def make_engine(database_url: str, **options: Any) -> Engine:
    """An engine for the URL; SQLite gets WAL, foreign keys and a busy timeout."""
    if database_url.startswith("sqlite"):
        options.setdefault("connect_args", {"timeout": SQLITE_BUSY_TIMEOUT_S})
        engine = create_engine(database_url, **options)
        event.listen(engine, "connect", _tune_sqlite)
        _serialize_sqlite_writers(engine)
        return engine
    options.setdefault("pool_pre_ping", True)
    options.setdefault("pool_size", 10)
    options.setdefault("max_overflow", 20)
    return create_engine(database_url, **options)


def _tune_sqlite(dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
    # WAL lets readers run while one writer commits; SQLite leaves foreign keys
    # off unless every connection asks for them.
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def _serialize_sqlite_writers(engine: Engine) -> None:
    """Let one thread of the process write at a time; the others queue on a lock.

    SQLite has one writer. A thread that finds the write lock taken sleeps in
    SQLite's busy handler, in steps growing to 100 ms, so under concurrent
    writes the lock sits free while the waiters sleep, and the writer holding
    it waits for the GIL between its statements. Queued on a Python lock
    instead, the next writer starts the moment the last one is done. The lock
    is taken before a transaction's first write and given back when its
    connection returns to the pool (after the commit or rollback). Past the
    busy timeout a writer goes ahead unqueued, so SQLite's own locking (and
    its "database is locked") stays the last word.
    """
    lock = threading.Lock()

    def before_write(connection: Connection, cursor: Any, statement: str, *args: Any) -> None:
        info = connection.info
        if info.get(_HOLDS_WRITE_LOCK) or not statement.lstrip()[:7].upper().startswith(_WRITES):
            return
        info[_HOLDS_WRITE_LOCK] = lock.acquire(timeout=SQLITE_BUSY_TIMEOUT_S)

    def after_transaction(dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
        if record.info.pop(_HOLDS_WRITE_LOCK, False):
            lock.release()

    event.listen(engine, "before_cursor_execute", before_write)
    event.listen(engine.pool, "checkin", after_transaction)
    event.listen(engine.pool, "detach", after_transaction)


def init_app(app: Flask, database_url: str) -> None:
    """Attach a lazily connecting engine and a session factory to the app."""
    engine = make_engine(database_url)
    app.extensions["gateway.engine"] = engine
    app.extensions["gateway.sessionmaker"] = sessionmaker(engine, expire_on_commit=False)
    app.teardown_appcontext(_close_session)


def engine() -> Engine:
    """The engine of the current app."""
    return engine_of(current_app)


def engine_of(app: Flask) -> Engine:
    """The engine of ``app``."""
    result: Engine = app.extensions["gateway.engine"]
    return result


def session() -> Session:
    """The session of the current request, opened on first use."""
    if "db_session" not in g:
        g.db_session = current_app.extensions["gateway.sessionmaker"]()
    result: Session = g.db_session
    return result


@contextmanager
def transaction() -> Iterator[Session]:
    """Run the block as one transaction on the request's session: commit, or roll back."""
    current = session()
    try:
        yield current
        current.commit()
    except BaseException:
        current.rollback()
        raise


def _close_session(error: BaseException | None) -> None:
    current: Session | None = g.pop("db_session", None)
    if current is not None:
        current.close()
