"""The engine and the unit of work: the one owner that begins and ends a transaction.

A request is one unit of work on one session. Whether it writes is known
before it begins, from its method: a routed request whose method changes
state (POST, PUT, PATCH, DELETE) begins its transaction as one that writes
(on SQLite ``BEGIN IMMEDIATE``, the write lock taken once) at its first
statement, which for the API is the token check. Any other request reads and
never takes SQLite's write lock, unless it must write after all (an overdue
elicitation marked expired, a browser session touched): then
:func:`transaction` begins the write, on SQLite after ending the read.

The method decides because it is known before the first statement, costs
nothing to look up, and says what the client asked for; a GET that writes is
the exception, and it pays for itself. The view's :func:`transaction` block
ends the request's transaction (commit, or roll back on an error), so what
the view does after it (the change signal, a provider call, the rendering)
happens after the commit.

Outside a request (a CLI command, a worker step) :func:`unit_of_work` is the
same owner on an engine of the caller's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from typing import Any, Final, TypeVar

from flask import Flask, current_app, g, has_request_context, request
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


# Methods that ask for no change (RFC 9110 section 9.2.1): their requests read.
_SAFE_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})
# Keys in the request session's info: it holds the write lock (the writer's
# turn, to be let go when the transaction ends), and a transaction() block is open.
_WRITING: Final = "gateway.writing"
_IN_BLOCK: Final = "gateway.in_block"


def session() -> Session:
    """The session of the current request (or app context), opened on first use.

    In a request known to write, its transaction begins here as one that writes.
    """
    if "db_session" not in g:
        current: Session = current_app.extensions["gateway.sessionmaker"]()
        g.db_session = current
        if _request_writes():
            _begin_writing(current)
    result: Session = g.db_session
    return result


@contextmanager
def transaction() -> Iterator[Session]:
    """Run the block as the request's write transaction: commit at its end, or roll back.

    In a request known to write, the block ends the transaction begun with
    the request's first statement. In one that read, the read is ended and a
    write begun. A block inside another joins it.
    """
    current = session()
    if current.info.get(_IN_BLOCK):
        yield current
        return
    if not current.info.get(_WRITING):
        if current.in_transaction() and _reads_end_before_writing(current):
            current.commit()  # a read only: nothing is written
        _begin_writing(current)
    current.info[_IN_BLOCK] = True
    try:
        yield current
        current.commit()
    except BaseException:
        current.rollback()
        raise
    finally:
        current.info.pop(_IN_BLOCK, None)
        _end_writing(current)


@contextmanager
def reading() -> Iterator[Session]:
    """A read on the request's session, ended with the block (a SQLite read keeps its snapshot).

    For a request that waits between reads, holding no transaction open
    meanwhile. Inside a write it joins the write.
    """
    current = session()
    if current.info.get(_WRITING):
        yield current
        return
    try:
        yield current
    finally:
        current.commit()  # a read only: nothing is written


@contextmanager
def unit_of_work(engine: Engine, *, wait: bool = True) -> Iterator[Session]:
    """One write transaction on ``engine`` outside a request: commit, or roll back.

    ``wait=False``: on SQLite, fail at once when the write lock is taken
    rather than wait for it (a write this process may make while one of its
    own transactions holds the lock).
    """
    bind = engine if wait else without_waiting(engine)
    with ExitStack() as stack:
        if wait:
            stack.enter_context(sqlite.writer_turn(engine))
        current = stack.enter_context(Session(bind, expire_on_commit=False))
        stack.enter_context(current.begin())
        yield current


def _request_writes() -> bool:
    # Not yet routed, a request reads: the browser session is looked up
    # before the CSRF check and the limits, and a request they refuse must
    # not have taken the write lock.
    return has_request_context() and request.url_rule is not None \
        and request.method not in _SAFE_METHODS


def _reads_end_before_writing(current: Session) -> bool:
    # On SQLite a transaction begun as a read cannot safely become the
    # writer (see gateway.sqlite): the read ends and a write begins. On
    # PostgreSQL there is no write lock to take: the transaction goes on.
    return current.get_bind().engine.dialect.name == "sqlite"


def _begin_writing(current: Session) -> None:
    # This process's writers take their turn first (sqlite.writer_turn),
    # held until the transaction ends, then the database's write lock.
    engine = current.get_bind().engine
    turn = ExitStack()
    turn.enter_context(sqlite.writer_turn(engine))
    current.info[_WRITING] = turn
    if engine.dialect.name != "sqlite":
        return  # its first statement begins it
    try:
        current.connection(execution_options={sqlite.READS: False})
    except BaseException:
        _end_writing(current)
        raise


def _end_writing(current: Session) -> None:
    turn: ExitStack | None = current.info.pop(_WRITING, None)
    if turn is not None:
        turn.close()


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
    # A transaction still open (a request that failed before its block) is
    # rolled back by the close.
    current: Session | None = g.pop("db_session", None)
    if current is not None:
        try:
            current.close()
        finally:
            _end_writing(current)
