"""The database floor: the bare app doing a scenario's database work, and nothing else.

The bare app touches no database, so part of what separates the gateway
from it is the database work no implementation can skip: checking a token
is a read, storing an elicitation is a write that commits. With ``--floor``
the runner starts the bare app a second time, with every scenario's view
first running the statements its :attr:`Scenario.floor` names, straight on
the driver (no ORM, no SQLAlchemy), on the same database as the gateway's
(its own table in it). A scenario's floor is the statements the gateway
makes for it, each at its cheapest: that target's rate is the most an
implementation making those round trips could reach on this machine, and
gateway/floor says how far the gateway's own code is from it.

The statements are the cheapest of their kind:

- ``read``: a look-up by primary key of a one-row table;
- ``write``: an INSERT of one short row, committed on its own (PostgreSQL's
  commit waits for its log to reach the disk, as the gateway's do; SQLite
  runs with the gateway's settings, WAL and ``synchronous=NORMAL``).

Each process keeps a pool of connections, as the gateway does, and closes
those left idle (:data:`IDLE_CLOSE_S`): the floor is measured in turn with
the gateway, on the same PostgreSQL server, and while the gateway is
measured the floor's connections must not hold places the gateway needs.
Like :mod:`scenarios`, this module must not import the gateway.
"""

from __future__ import annotations

import functools
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Final, Protocol

from flask.typing import ResponseReturnValue

STEPS: Final = frozenset({"read", "write"})
# Where the floor server finds its database (see bare.py).
ENVIRONMENT: Final = "BENCH_FLOOR_DATABASE"
# Connections per process, as many as the gateway's pool keeps on
# PostgreSQL: wrk's connections do not always split evenly between the
# processes, and the floor must not queue where the gateway would not.
POOL_SIZE: Final = 24
# How long a request waits for a pooled connection before it fails.
POOL_TIMEOUT_S: Final = 30.0
# A pooled connection unused this long is closed. PostgreSQL serves 100
# connections by default (3 of them kept for superusers); the gateway's two
# workers may open 32 each, and the floor's 24 each, left open and idle
# while the gateway is measured, would make the gateway's long-polls fail
# with "too many clients".
IDLE_CLOSE_S: Final = 2.0
# How often each process looks for connections left idle.
IDLE_CHECK_S: Final = 0.5
# The statements, written out for each driver's parameter style.
_SQLITE_SQL: Final = {
    "create": "CREATE TABLE IF NOT EXISTS bench_floor "
              "(id INTEGER PRIMARY KEY, value TEXT NOT NULL)",
    "read": "SELECT id, value FROM bench_floor WHERE id = ?",
    "write": "INSERT INTO bench_floor (value) VALUES (?)",
}
_POSTGRES_SQL: Final = {
    "create": "CREATE TABLE IF NOT EXISTS bench_floor "
              "(id BIGSERIAL PRIMARY KEY, value TEXT NOT NULL)",
    "read": "SELECT id, value FROM bench_floor WHERE id = %s",
    "write": "INSERT INTO bench_floor (value) VALUES (%s)",
}
SQLITE_PREFIX: Final = "sqlite:"
POSTGRES_PREFIX: Final = "postgresql://"


class DriverConnection(Protocol):
    def execute(self, sql: str, parameters: Sequence[Any] = ()) -> Any: ...

    def close(self) -> None: ...


class FloorDatabase:
    """Where the floor's statements run: a SQLite file or a PostgreSQL database.

    ``target`` is ``sqlite:PATH`` or a libpq URI (``postgresql://…``).
    """

    def __init__(self, target: str) -> None:
        if target.startswith(SQLITE_PREFIX):
            self._connect: Callable[[], DriverConnection] = functools.partial(
                _sqlite, target.removeprefix(SQLITE_PREFIX))
            self._sql = _SQLITE_SQL
        elif target.startswith(POSTGRES_PREFIX):
            self._connect = functools.partial(_postgres, target)
            self._sql = _POSTGRES_SQL
        else:
            raise ValueError(f"the floor's database is sqlite:PATH or postgresql://…, "
                             f"not {target.split(':')[0]!r}")
        # Idle connections, each with the time it was given back: the last
        # one given back is the next one taken, so the list is oldest first.
        self._idle: list[tuple[DriverConnection, float]] = []
        self._opened = 0
        self._changed = threading.Condition()
        self._closer_pid = 0

    def create_table(self) -> None:
        """The floor's table with the one row the reads find; once, before serving.

        On a connection of its own, closed after: the server forks its
        workers after this, and a connection must not be shared by two.
        """
        connection = self._connect()
        try:
            connection.execute(self._sql["create"])
            connection.execute(self._sql["write"], ("the row every read finds",))
        finally:
            connection.close()

    def run(self, steps: Sequence[str]) -> None:
        """Run ``steps`` in order on one pooled connection, each statement on its own."""
        with self._connection() as connection:
            for step in steps:
                if step == "read":
                    connection.execute(self._sql["read"], (1,)).fetchone()
                else:
                    connection.execute(self._sql["write"], ("floor",))

    def close(self) -> None:
        """Close the pooled connections; once no request runs, that is all of them."""
        self.close_idle(0.0)

    def close_idle(self, idle_seconds: float) -> int:
        """Close the pooled connections unused for ``idle_seconds``; how many."""
        now = time.monotonic()
        with self._changed:
            fresh = next((number for number, (_, given_back) in enumerate(self._idle)
                          if now - given_back < idle_seconds), len(self._idle))
            stale, self._idle = self._idle[:fresh], self._idle[fresh:]
            self._opened -= len(stale)
            self._changed.notify(len(stale))  # a waiting request may open one now
        for connection, _ in stale:
            connection.close()
        return len(stale)

    @contextmanager
    def _connection(self) -> Iterator[DriverConnection]:
        connection = self._take()
        try:
            yield connection
        finally:
            with self._changed:
                self._idle.append((connection, time.monotonic()))
                self._changed.notify()

    def _take(self) -> DriverConnection:
        """An idle connection, else a new one while fewer than POOL_SIZE are open, else wait."""
        deadline = time.monotonic() + POOL_TIMEOUT_S
        with self._changed:
            self._start_closer()
            while not self._idle and self._opened >= POOL_SIZE:
                if not self._changed.wait(deadline - time.monotonic()):
                    raise TimeoutError(f"no floor connection free in {POOL_TIMEOUT_S:.0f} s")
            if self._idle:
                return self._idle.pop()[0]
            self._opened += 1
        try:
            return self._connect()
        except BaseException:
            with self._changed:  # a connection that failed to open takes no place
                self._opened -= 1
                self._changed.notify()
            raise

    def _start_closer(self) -> None:
        # Once in each process that takes connections: the server forks its
        # workers after making the table, and a thread does not survive a fork.
        if self._closer_pid != os.getpid():
            self._closer_pid = os.getpid()
            threading.Thread(target=_close_idle_while_used, args=(weakref.ref(self),),
                             name="floor-idle-closer", daemon=True).start()


def _close_idle_while_used(database: weakref.ref[FloorDatabase]) -> None:
    while True:
        time.sleep(IDLE_CHECK_S)
        alive = database()
        if alive is None:
            return
        alive.close_idle(IDLE_CLOSE_S)
        del alive


def _sqlite(path: str) -> DriverConnection:
    # Autocommit, and the gateway's settings; the gateway waits up to 30 s
    # for SQLite's write lock too.
    connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False,
                                 timeout=30.0)
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("PRAGMA synchronous=NORMAL")
    return connection


def _postgres(uri: str) -> DriverConnection:
    import psycopg  # only when measuring PostgreSQL: the SQLite runs need no driver

    connection: DriverConnection = psycopg.connect(uri, autocommit=True)
    return connection


def check_steps(scenario: str, steps: Sequence[str]) -> None:
    """Refuse a scenario whose floor names a statement this module does not run."""
    unknown = [step for step in steps if step not in STEPS]
    if unknown:
        raise ValueError(f"scenario {scenario!r}: unknown floor step(s) {unknown}; "
                         f"the steps are {sorted(STEPS)}")


def with_floor(view: Callable[..., ResponseReturnValue], steps: Sequence[str],
               database: FloorDatabase) -> Callable[..., ResponseReturnValue]:
    """``view``, after running ``steps`` on ``database``."""

    @functools.wraps(view)
    def floored(**variables: Any) -> ResponseReturnValue:
        database.run(steps)
        return view(**variables)

    return floored
