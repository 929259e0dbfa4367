"""Audit events committed on their own, those of concurrent requests together (group commit).

A reveal's audit event is its only change, and it is committed before the
key is handed out: on its own, each one costs the database a durable commit
(on PostgreSQL, a flush of its log to disk; on SQLite, a turn of the one
write lock). Under load many arrive at once. The first caller writes its
event and every event queued by then in one INSERT, on its own autocommit
connection, while the others wait; the first of those that queued meanwhile
then does the same for the next batch. Every caller returns only once its
own event is committed. When a batch fails, each of its callers writes its
event alone on its own connection, so that one bad event, or one dead
connection, fails only its own request.

A caller waits for another thread's write: it must not itself hold a write
in progress (an open transaction that wrote), or on SQLite that write's lock
would keep the batch it waits for from being written.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from sqlalchemy import Connection, Engine

# Events per INSERT: enough to cover one process's concurrent requests.
MAX_BATCH: Final = 32

Row = dict[str, Any]
Writer = Callable[[Connection, list[Row]], None]


@dataclass(slots=True)
class _Waiting:
    row: Row
    done: threading.Event = field(default_factory=threading.Event)
    # What woke it: its batch was committed, it leads the next batch, or
    # its batch failed and it writes its event alone.
    outcome: str = ""


class GroupCommit:
    """One process's events waiting to be committed on one database."""

    def __init__(self, write: Writer) -> None:
        self._write = write
        self._lock = threading.Lock()
        self._queue: list[_Waiting] = []
        self._writing = False

    def commit(self, connection: Connection, row: Row) -> None:
        """Commit ``row`` (on ``connection``, an autocommit one, or on another caller's)."""
        waiting = _Waiting(row)
        with self._lock:
            self._queue.append(waiting)
            leads = not self._writing
            self._writing = True
        if not leads:
            waiting.done.wait()
            if waiting.outcome == "committed":
                return
            if waiting.outcome == "alone":
                self._write(connection, [row])
                return
        self._lead(connection)

    def _lead(self, connection: Connection) -> None:
        # The leader's own event is first in the batch it takes: it queued
        # before it was made leader, and nobody else takes from the queue.
        with self._lock:
            batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
        mine, others = batch[0], batch[1:]
        written = False
        try:
            self._write(connection, [waiting.row for waiting in batch])
            written = True
        except Exception:
            if not others:
                raise
        finally:
            # Told "committed" only after the commit; on any failure each
            # writes its own event, and the queue goes on.
            self._settle(others, "committed" if written else "alone")
            self._hand_over()
        if not written:
            self._write(connection, [mine.row])

    @staticmethod
    def _settle(batch: list[_Waiting], outcome: str) -> None:
        for waiting in batch:
            waiting.outcome = outcome
            waiting.done.set()

    def _hand_over(self) -> None:
        with self._lock:
            if not self._queue:
                self._writing = False
                return
            successor = self._queue[0]
        successor.outcome = "lead"
        successor.done.set()


_GROUPS: weakref.WeakKeyDictionary[Engine, GroupCommit] = weakref.WeakKeyDictionary()
_GROUPS_LOCK: Final = threading.Lock()


def group_for(engine: Engine, write: Writer) -> GroupCommit:
    """The process's group for ``engine``'s database: events of one database only go together."""
    group = _GROUPS.get(engine)
    if group is None:
        with _GROUPS_LOCK:
            group = _GROUPS.setdefault(engine, GroupCommit(write))
    return group


def is_autocommit(connection: Connection) -> bool:
    """Whether each statement on ``connection`` commits as it runs (read from the driver)."""
    raw = connection.connection.dbapi_connection
    # psycopg says so itself; Python's sqlite3 is in autocommit when it
    # opens no transaction of its own (isolation_level None).
    return getattr(raw, "autocommit", False) is True or getattr(raw, "isolation_level", "") is None
