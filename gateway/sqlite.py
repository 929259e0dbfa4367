"""The embedded database: a SQLite file in WAL mode, its transactions and its log.

SQLite has one writer at a time. A transaction takes the write lock when it
begins (``BEGIN IMMEDIATE``) and waits for it up to the busy timeout. Begun
DEFERRED, it would take the lock at its first write, and SQLite answers
"database is locked" at once, without waiting, when another writer committed
since the transaction's first read. Only a connection marked :data:`READS`
(a request's reads, outside :func:`gateway.db.transaction`) begins DEFERRED,
so that readers never wait for writers.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from typing import Any, Final

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.pool import ConnectionPoolEntry

from gateway import wal

# How long a writer waits for another before "database is locked".
BUSY_TIMEOUT_S: Final = 15.0
# A writer waiting for another process's sleeps this long between tries,
# doubling up to the longest.
FIRST_PAUSE_S: Final = 0.0005
LONGEST_PAUSE_S: Final = 0.005
# The execution option that marks a connection whose transactions only read.
READS: Final = "gateway_reads"
# The execution option of a write that gives up at once rather than wait for the lock.
NO_WAIT: Final = "gateway_no_wait"


def make_engine(database_url: str, **options: Any) -> Engine:
    """An engine on a SQLite file (or in memory), in WAL mode with foreign keys on."""
    options.setdefault("connect_args", {"timeout": BUSY_TIMEOUT_S})
    on_file = is_file(database_url)
    if on_file:
        options.setdefault("pool_size", 32)
        options.setdefault("max_overflow", 64)
        _create_private(make_url(database_url).database)
    engine = create_engine(database_url, **options)
    event.listen(engine, "connect", _tune)
    event.listen(engine, "begin", _begin)
    if on_file:
        # Started with the process's first connection to the file: not in a
        # process that never opens it, and again in each forked worker.
        event.listen(engine, "connect", lambda *_: wal.keep_small(engine))
    return engine


def is_file(database_url: str) -> bool:
    """Whether the URL names a file (an in-memory database takes no pool sizes)."""
    database = make_url(database_url).database
    return bool(database) and database != ":memory:" and "mode=memory" not in database_url


def _tune(dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
    # WAL lets readers run while one writer commits; SQLite leaves foreign keys
    # off unless every connection asks for them. The driver's own transaction
    # handling is off, so that _begin says how each transaction begins
    # (SQLAlchemy's documented recipe for pysqlite).
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()
    dbapi_connection.isolation_level = None


def _begin(connection: Connection) -> None:
    options = connection.get_execution_options()
    if options.get(READS, False):
        connection.exec_driver_sql("BEGIN")
    else:
        # A write that can wait for nothing (NO_WAIT): one the process may
        # make while another of its own connections holds the lock, which it
        # would wait on for the whole busy timeout.
        _begin_writing(connection, 0.0 if options.get(NO_WAIT, False) else BUSY_TIMEOUT_S)


def _begin_writing(connection: Connection, patience: float) -> None:
    """``BEGIN IMMEDIATE``, waiting up to ``patience`` for another process's writer.

    Waited for here, by sleeping between tries, rather than in SQLite's busy
    handler: that one sleeps inside the driver's call, which in a gevent
    worker stops the worker's one thread and every request on it, while
    ``time.sleep`` there lets the others run. (This process's own writers
    take their turn before this, on :func:`writer_turn`.)
    """
    deadline = time.monotonic() + patience
    pause = FIRST_PAUSE_S
    connection.exec_driver_sql("PRAGMA busy_timeout = 0")
    try:
        while True:
            try:
                connection.exec_driver_sql("BEGIN IMMEDIATE")
                return
            except OperationalError as error:
                if not _is_busy(error) or time.monotonic() + pause > deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, LONGEST_PAUSE_S)
    finally:
        connection.exec_driver_sql(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")


def _is_busy(error: OperationalError) -> bool:
    return getattr(error.orig, "sqlite_errorcode", None) == sqlite3.SQLITE_BUSY


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


_TURNS: dict[str | None, threading.Lock] = {}
_TURNS_GUARD: Final = threading.Lock()
# A forked gunicorn worker makes its own turns, after gevent has patched
# threading: a lock made before would block the worker's one thread, and
# every greenlet on it, instead of its greenlet.
os.register_at_fork(after_in_child=_TURNS.clear)


@contextlib.contextmanager
def writer_turn(engine: Engine) -> Iterator[None]:
    """Wait for this process's other write transactions on the file, in turn.

    SQLite's busy handler lets a waiting writer sleep in growing steps while
    later ones take the lock first, and under steady writes some waiters
    sleep step after step (the tail of bench/HISTORY.md's 6 December entry).
    Threads of one process that would write wait on a lock instead and go
    as soon as the one before has committed; writers of other processes
    still meet in the busy handler, one per process at a time.
    """
    if engine.dialect.name != "sqlite":
        yield
        return
    with _TURNS_GUARD:
        turn = _TURNS.setdefault(engine.url.database, threading.Lock())
    with turn:
        yield
