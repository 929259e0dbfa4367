"""Telling every gateway process that the database changed, through the database.

A completion recorded by one instance must wake the long-polls held by every
other instance sharing the database, so the signal cannot live in a process.

- PostgreSQL: a transaction that ends an elicitation runs ``pg_notify``;
  PostgreSQL delivers it to every listening connection when, and only when,
  that transaction commits.
- SQLite: instances sharing the file are on one host; ``PRAGMA data_version``
  changes whenever another connection commits, so a listener polls that
  single integer (no table is read) every few milliseconds.

Listeners say only "something may have changed"; the reader then asks the
database what did, so a lost or spurious signal costs a query, never a result.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Final, Protocol

from sqlalchemy import Engine, event, text
from sqlalchemy.orm import Session, SessionTransaction

CHANNEL: Final = "gateway_changes"
SQLITE_POLL_SECONDS: Final = 0.02


def announce(session: Session, topic: str) -> None:
    """Signal listeners, once the session's transaction commits, that ``topic`` changed."""
    if session.get_bind().dialect.name == "postgresql":
        # Sent just before the commit, once per topic however many changes
        # the transaction made: one round trip, not one per change.
        session.info.setdefault(_TOPICS, set()).add(topic)
    # SQLite: the commit itself bumps data_version, which listeners watch.


_TOPICS: Final = "gateway.changed_topics"
_NOTIFY: Final = text("SELECT pg_notify(:channel, :topic)")


@event.listens_for(Session, "before_commit")
def _notify(session: Session) -> None:
    for topic in sorted(session.info.pop(_TOPICS, ())):
        session.execute(_NOTIFY, {"channel": CHANNEL, "topic": topic})


@event.listens_for(Session, "after_transaction_end")
def _forget(session: Session, transaction: SessionTransaction) -> None:
    # Rolled back or closed: nothing changed, nobody is told.
    if transaction.parent is None:
        session.info.pop(_TOPICS, None)


class Listener(Protocol):
    def wait(self, timeout: float) -> bool:
        """Block until a change may have committed (True) or ``timeout`` passes (False)."""
        ...

    def close(self) -> None:
        ...


class PostgresListener:
    """LISTEN on the channel, on a connection of its own."""

    def __init__(self, engine: Engine) -> None:
        import psycopg

        url = engine.url.set(drivername="postgresql")
        self._connection = psycopg.connect(url.render_as_string(hide_password=False),
                                           autocommit=True)
        self._connection.execute(f"LISTEN {CHANNEL}")

    def wait(self, timeout: float) -> bool:
        notices = self._connection.notifies(timeout=timeout, stop_after=1)
        return any(True for _ in notices)

    def close(self) -> None:
        self._connection.close()


class SQLiteListener:
    """Polls ``PRAGMA data_version`` on a connection of its own."""

    def __init__(self, engine: Engine) -> None:
        database = engine.url.database or ""
        self._connection = sqlite3.connect(database, isolation_level=None,
                                           check_same_thread=False)
        self._version = self._read()

    def _read(self) -> int:
        version: int = self._connection.execute("PRAGMA data_version").fetchone()[0]
        return version

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            current = self._read()
            if current != self._version:
                self._version = current
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(SQLITE_POLL_SECONDS, remaining))

    def close(self) -> None:
        self._connection.close()


def open_listener(engine: Engine) -> Listener:
    """A listener for the engine's database."""
    if engine.dialect.name == "postgresql":
        return PostgresListener(engine)
    return SQLiteListener(engine)
