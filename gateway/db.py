"""Engine, session-per-request and the one transaction helper.

Every state change runs inside :func:`transaction`: the change, its audit row
and its outbox row commit together or not at all. Reads use the request's
:func:`session` outside it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, Final, TypeVar

from flask import Flask, current_app, g
from sqlalchemy import DateTime, Engine, MetaData, create_engine
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker
from sqlalchemy.types import TypeDecorator

from gateway import sqlite

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


# A process's PostgreSQL connections: kept open in its pool, and opened
# beyond that while more requests than that need one at once.
POSTGRES_POOL_SIZE: Final = 24
POSTGRES_MAX_OVERFLOW: Final = 8
POSTGRES_CONNECTIONS_PER_PROCESS: Final = POSTGRES_POOL_SIZE + POSTGRES_MAX_OVERFLOW



def make_engine(database_url: str, **options: Any) -> Engine:
    """An engine for the URL; SQLite gets WAL, foreign keys and a busy timeout."""
    # A pool as large as the requests a worker serves at once: a connection
    # returned to a full pool is closed and another opened for the next one.
    if database_url.startswith("sqlite"):
        return sqlite.make_engine(database_url, **options)
    # A connection can die while pooled (a server restart, a proxy's idle
    # timeout); it is replaced before a request gets it.
    options.setdefault("pool_pre_ping", True)
    options.setdefault("pool_size", POSTGRES_POOL_SIZE)
    options.setdefault("max_overflow", POSTGRES_MAX_OVERFLOW)
    return create_engine(database_url, **options)


def for_reads(engine: Engine) -> Engine:
    """The engine for connections that only read: on SQLite they never wait for writers."""
    return engine.execution_options(**{sqlite.READS: True})


def init_app(app: Flask, database_url: str) -> None:
    """Attach a lazily connecting engine and a session factory to the app."""
    engine = make_engine(database_url)
    app.extensions["gateway.engine"] = engine
    # The request's session reads; db.transaction() makes it write.
    app.extensions["gateway.sessionmaker"] = sessionmaker(for_reads(engine),
                                                          expire_on_commit=False)
    app.teardown_appcontext(_close_session)


def without_waiting(engine: Engine) -> Engine:
    """The engine for a write that fails at once, never waits, when the lock is taken (SQLite)."""
    return engine.execution_options(**{sqlite.NO_WAIT: True})


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


_WRITING: Final = "gateway.writing"


@contextmanager
def transaction() -> Iterator[Session]:
    """Run the block as one write transaction on the request's session: commit, or roll back.

    A read the request made before is ended first, so that the transaction
    begins as one that writes. A block inside another joins it.
    """
    current = session()
    if current.info.get(_WRITING):
        yield current
        return
    if current.in_transaction():
        current.commit()  # a read only: nothing is written
    with sqlite.writer_turn(current.get_bind().engine):
        current.connection(execution_options={sqlite.READS: False})
        current.info[_WRITING] = True
        try:
            yield current
            current.commit()
        except BaseException:
            current.rollback()
            raise
        finally:
            current.info.pop(_WRITING, None)


T = TypeVar("T")


def retry_on_conflict(work: Callable[[], T], *, attempts: int,
                      conflict: type[Exception] = IntegrityError) -> T:
    """Run ``work`` (a whole transaction) again when it fails with ``conflict``.

    A unique constraint is how the database settles two requests racing to
    write the same thing: the loser's transaction is rolled back whole, and
    its next attempt sees the winner's row. The last attempt's error is raised.
    """
    for attempt in range(1, attempts + 1):
        try:
            return work()
        except conflict:
            if attempt == attempts:
                raise
    raise AssertionError("unreachable: the last attempt returns or raises")


def _close_session(error: BaseException | None) -> None:
    current: Session | None = g.pop("db_session", None)
    if current is not None:
        current.close()
