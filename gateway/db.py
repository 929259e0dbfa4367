"""Engine, session-per-request and the one transaction helper.

Every state change runs inside :func:`transaction`: the change, its audit row
and its outbox row commit together or not at all. The one exception is a
change that is a single statement (a reveal's audit row; a create's
elicitation with its audit row, see :class:`gateway.prepared.PreparedInserts`),
which may run on the request's :func:`autocommit` connection, where it is its
own transaction.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, Final

from flask import Flask, current_app, g
from sqlalchemy import Connection, DateTime, Engine, MetaData, create_engine, event
from sqlalchemy.engine import Dialect, ExceptionContext, make_url
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker
from sqlalchemy.pool import ConnectionPoolEntry
from sqlalchemy.types import TypeDecorator

from gateway import wal

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

# How long SQLite waits for another writer before "database is locked".
SQLITE_BUSY_TIMEOUT_S = 15.0
_WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE")
_HOLDS_WRITE_LOCK = "gateway.write_lock"
_HOLDS_FILE_LOCK = "gateway.write_file_lock"


def make_engine(database_url: str, **options: Any) -> Engine:
    """An engine for the URL; SQLite gets WAL, foreign keys and a busy timeout."""
    # A pool large enough for the requests a busy worker process serves at
    # once: a connection returned to a full pool is closed, and one opened
    # for the next request, so a pool smaller than the usual concurrency
    # opens and closes connections all the time (for PostgreSQL, a new
    # server process each).
    if database_url.startswith("sqlite"):
        options.setdefault("connect_args", {"timeout": SQLITE_BUSY_TIMEOUT_S})
        if _is_sqlite_file(database_url):
            options.setdefault("pool_size", 32)
            options.setdefault("max_overflow", 64)
            _create_private(make_url(database_url).database)
        engine = create_engine(database_url, **options)
        event.listen(engine, "connect", _tune_sqlite)
        _serialize_sqlite_writers(engine)
        if _is_sqlite_file(database_url):
            _keep_wal_small(engine)
        return engine
    options.setdefault("pool_size", POSTGRES_POOL_SIZE)
    options.setdefault("max_overflow", POSTGRES_MAX_OVERFLOW)
    engine = create_engine(database_url, **options)
    _ping_when_idle(engine)
    return engine


# A pooled connection unused this long is checked before it is handed out.
IDLE_PING_SECONDS = 10.0
_CHECKED_IN_AT = "gateway.checked_in_at"


def _ping_when_idle(engine: Engine) -> None:
    """Replace a dead pooled connection before a request gets it, at no cost under load.

    SQLAlchemy's ``pool_pre_ping`` pings on every checkout: one more round
    trip per request, a quarter of a read's time on PostgreSQL. Connections
    die while they sit idle (a server restart, a proxy's idle timeout), so
    only one idle for a while is pinged; a dead one is replaced at once. A
    connection that dies while busy fails its statement, and SQLAlchemy then
    discards every connection of the pool made before the failure.
    """

    def stamp(dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
        record.info[_CHECKED_IN_AT] = time.monotonic()

    def ping(dbapi_connection: Any, record: ConnectionPoolEntry, proxy: Any) -> None:
        since = record.info.get(_CHECKED_IN_AT)
        if since is None or time.monotonic() - since < IDLE_PING_SECONDS:
            return
        try:
            engine.dialect.do_ping(dbapi_connection)
        except engine.dialect.loaded_dbapi.Error as error:
            # The pool closes this one and checks out another.
            raise DisconnectionError("a pooled connection died while idle") from error

    event.listen(engine.pool, "checkin", stamp)
    event.listen(engine.pool, "checkout", ping)


def _keep_wal_small(engine: Engine) -> None:
    # Started with the process's first connection to the file: not in a
    # process that never opens it, and again in each forked worker.
    def start(dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
        wal.keep_small(engine)

    event.listen(engine, "connect", start)


def _create_private(path: str | None) -> None:
    # SQLite creates a missing database with the process's umask (often
    # readable by everyone), and its -wal and -shm files take the database's
    # mode. Created here first, owner-only. An existing file keeps the mode
    # its operator gave it; a folder that does not exist is SQLite's error to
    # report, at the first connection.
    if not path:
        return
    with contextlib.suppress(FileExistsError, FileNotFoundError, NotADirectoryError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


def _is_sqlite_file(database_url: str) -> bool:
    # An in-memory database gets SQLAlchemy's one-connection-per-thread pool,
    # which takes no pool sizes.
    database = make_url(database_url).database
    return bool(database) and database != ":memory:" and "mode=memory" not in database_url


def _tune_sqlite(dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
    # WAL lets readers run while one writer commits; SQLite leaves foreign keys
    # off unless every connection asks for them.
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def _serialize_sqlite_writers(engine: Engine) -> None:
    """Let one thread of all the processes on the file write at a time; the others queue.

    SQLite has one writer. A thread that finds the write lock taken sleeps in
    SQLite's busy handler, in steps growing to 100 ms, and does not queue:
    a writer that arrives while it sleeps goes first, so under steady writes
    some waiters sleep step after step. Queued instead, writers go in turn,
    and the next one starts the moment the last one is done: threads of one
    process on a Python lock, and the one thread per process holding it on a
    lock file beside the database, shared by every process that writes to
    the file (gunicorn's workers, the worker, the CLI). Past the busy timeout
    a writer goes ahead unqueued, so SQLite's own locking (and its "database
    is locked") stays the last word.

    A transaction's turn lasts from its first write until it ends, when its
    connection returns to the pool (after the commit or rollback).

    A write on an autocommit connection is its own transaction, which takes
    and gives back SQLite's lock inside the driver's one call. It queues,
    for as long as its statement (failed or not), only in a process that
    runs on one CPU (a pinned worker of ``gateway serve``,
    :mod:`gateway.serving.affinity`). Queued, the turn passes on only once
    the writer has the interpreter lock back after its statement. Measured
    on 5 December 2026 with ``bench/`` on SQLite, key submits and creates,
    one statement each on an autocommit connection, against these writes
    meeting in SQLite's busy handler:

    - two workers each on a CPU of its own: queued, submits 723/s with a p99
      of 109 ms (691/s, 563 ms), creates 1,207/s, 73 ms (1,118/s, 129 ms);
    - the same workers on both CPUs: queued, submits 525/s, 148 ms (632/s,
      276 ms), creates 834/s, 85 ms (960/s, 93 ms).

    Every engine on the file shares the locks.
    """
    thread_lock, file_lock = _writer_locks(engine.url.database)

    def before_write(connection: Connection, cursor: Any, statement: str, *args: Any) -> None:
        info = connection.info
        if info.get(_HOLDS_WRITE_LOCK) or not statement.lstrip()[:7].upper().startswith(_WRITES):
            return
        autocommit = cursor.connection.isolation_level is None
        if autocommit and not _on_one_cpu():
            return
        deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_S
        if not thread_lock.acquire(timeout=SQLITE_BUSY_TIMEOUT_S):
            return
        info[_HOLDS_WRITE_LOCK] = _STATEMENT if autocommit else _TRANSACTION
        if file_lock is not None:
            info[_HOLDS_FILE_LOCK] = file_lock.acquire(deadline)

    def release(info: dict[Any, Any]) -> None:
        if info.pop(_HOLDS_FILE_LOCK, False) and file_lock is not None:
            file_lock.release()
        if info.pop(_HOLDS_WRITE_LOCK, None):
            thread_lock.release()

    def after_statement(connection: Connection, *args: Any) -> None:
        if connection.info.get(_HOLDS_WRITE_LOCK) == _STATEMENT:
            release(connection.info)

    def after_failed_statement(context: ExceptionContext) -> None:
        if context.connection is not None:
            after_statement(context.connection)

    def after_transaction(dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
        release(record.info)

    event.listen(engine, "before_cursor_execute", before_write)
    event.listen(engine, "after_cursor_execute", after_statement)
    event.listen(engine, "handle_error", after_failed_statement)
    event.listen(engine.pool, "checkin", after_transaction)
    event.listen(engine.pool, "detach", after_transaction)


def _on_one_cpu() -> bool:
    """Whether this process may run on one CPU only, as the kernel says now."""
    # Asked at each write (a system call of about a microsecond): a worker is
    # pinned after its process started, and a test may pin its own.
    return hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) == 1


# Whose turn a connection holds in the writers' queue: its statement's (an
# autocommit write) or its transaction's.
_STATEMENT: Final = "statement"
_TRANSACTION: Final = "transaction"

_WRITER_LOCKS: dict[str | None, tuple[threading.Lock, _WriterFileLock | None]] = {}
_WRITER_LOCKS_GUARD = threading.Lock()


def _writer_locks(database: str | None) -> tuple[threading.Lock, _WriterFileLock | None]:
    """The process's writer lock and lock file for this database, the same for every engine."""
    with _WRITER_LOCKS_GUARD:
        if database not in _WRITER_LOCKS or not database or database == ":memory:":
            _WRITER_LOCKS[database] = (threading.Lock(), _WriterFileLock.beside(database))
        return _WRITER_LOCKS[database]


# A writer's turn lasts about a millisecond, so the file lock is polled
# often: a longer sleep leaves the database idle after the holder is done.
_FILE_LOCK_POLL_S = 0.00005


class _WriterFileLock:
    """An exclusive ``flock`` on ``<database>-writer.lock``, polled until a deadline.

    Polled rather than blocking so that a writer stuck in another process
    costs at most the busy timeout here too. The lock dies with its process,
    so a crashed writer never leaves it taken. Only the thread holding the
    process's writer lock touches it.

    The file is opened on first use in each process: a ``flock`` belongs to
    the open file, so a descriptor inherited across a fork (gunicorn's
    workers) would let parent and child hold "the" lock at once.
    """

    def __init__(self, path: str) -> None:
        self._path = path
        self._fd = -1
        self._pid = 0

    def _descriptor(self) -> int:
        if self._pid != os.getpid():
            self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            self._pid = os.getpid()
        return self._fd

    @classmethod
    def beside(cls, database: str | None) -> _WriterFileLock | None:
        if not database or database == ":memory:" or database.startswith("file:"):
            return None  # no file, or a URI form whose path is not ours to guess
        return cls(f"{database}-writer.lock")

    def acquire(self, deadline: float) -> bool:
        while True:
            try:
                fcntl.flock(self._descriptor(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(_FILE_LOCK_POLL_S)

    def release(self) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)


# In the ``info`` of a request's session: one-row writes that nothing reads
# back in the transaction (audit events) may be held until its commit and
# written together then. Sessions of the CLI and the worker write at once.
WRITES_AT_COMMIT: Final = "gateway.writes_at_commit"


def init_app(app: Flask, database_url: str) -> None:
    """Attach a lazily connecting engine and a session factory to the app."""
    engine = make_engine(database_url)
    app.extensions["gateway.engine"] = engine
    app.extensions["gateway.sessionmaker"] = sessionmaker(
        engine, expire_on_commit=False, info={WRITES_AT_COMMIT: True})
    app.extensions["gateway.autocommit"] = _autocommit_engine(engine)
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


def _autocommit_engine(engine: Engine) -> Engine:
    # PostgreSQL switches a pooled connection to autocommit for the checkout
    # at no cost (a flag of the driver). SQLite's driver would run a PRAGMA
    # at each checkin to switch back, so a SQLite file gets a pool of its own
    # whose connections stay in autocommit; its writes, one statement each,
    # queue with the main engine's (see _serialize_sqlite_writers).
    if engine.dialect.name == "sqlite" and _is_sqlite_file(str(engine.url)):
        return make_engine(engine.url.render_as_string(hide_password=False),
                           isolation_level="AUTOCOMMIT")
    return engine.execution_options(isolation_level="AUTOCOMMIT")


def autocommit() -> Connection:
    """The request's connection outside any transaction, opened on first use.

    Each statement on it commits as it runs. It serves reads, which then
    cost no BEGIN and no ROLLBACK (on PostgreSQL, two round trips fewer),
    and a change that is one statement (a reveal's audit row, a create),
    which then costs no BEGIN and no COMMIT. A change of more than one
    statement belongs in a :func:`transaction`, and so do reads that decide
    a change when the transaction locks what they read.
    """
    if "db_autocommit" not in g:
        g.db_autocommit = current_app.extensions["gateway.autocommit"].connect()
    connection: Connection = g.db_autocommit
    return connection


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
    release_autocommit()


def release_autocommit() -> None:
    """Give the request's autocommit connection back to the pool (a long-poll, before it waits)."""
    connection: Connection | None = g.pop("db_autocommit", None)
    if connection is not None:
        connection.close()
